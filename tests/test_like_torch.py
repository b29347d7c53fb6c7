"""Arguments and empty inputs are handled as torch's counterparts handle them (CPU only).

Each case runs torch's own function on CPU tensors and scratchops on meta tensors of the same
shapes (no kernel runs, so every check is reached without a GPU), then compares:
- int arguments: what torch accepts (Python, numpy and torch integers, a one-element list
  where torch expands it) scratchops accepts, with the same output shape; a float, string or
  None that torch refuses with TypeError is a TypeError here too, and so is a bool (torch
  refuses a Python bool; a bool tensor some of its functions take as 1, others refuse);
- number arguments (eps, clamp bounds): Python and numpy numbers, bools and 0-dim tensors
  accepted as by torch; a string is a TypeError;
- empty inputs: an empty result of torch's shape where torch gives one, a refusal (ValueError,
  scratchops' error for a shape) where torch refuses; the one deliberate difference is
  conv2d with 0 input channels (torch answers with 0 output channels, which is not the
  convolution's shape; scratchops refuses).
"""

import operator

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import scratchops
from helpers import ATOL, RTOL, requires_gpu

X = torch.rand(2, 4, 12, 11)
W = torch.rand(3, 4, 3, 3)


def meta(t):
    return torch.empty(t.shape, device="meta")


def outcome(call):
    """('ok', output shape) or (exception type, message)."""
    try:
        return "ok", tuple(call().shape)
    except Exception as exc:  # noqa: BLE001 (the type is what is compared)
        return type(exc), str(exc)


def both_outcomes(label, values, torch_call, our_call):
    """(value, torch's outcome on X, scratchops' outcome on a meta X, description) per value."""
    for value in values:
        theirs = outcome(lambda: torch_call(X, value))
        ours = outcome(lambda: our_call(meta(X), value))
        yield value, theirs, ours, f"{label} = {value!r}: torch {theirs}, scratchops {ours}"


def is_bool(value) -> bool:
    if isinstance(value, (list, tuple)):
        return any(is_bool(v) for v in value)
    return isinstance(value, bool) or (isinstance(value, torch.Tensor) and
                                       value.dtype == torch.bool)


def int_like(value) -> bool:
    """What operator.index takes, bools aside, or a sequence of such."""
    if isinstance(value, (list, tuple)):
        return all(int_like(v) for v in value)
    if is_bool(value):
        return False
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


def int_values(n):
    return [n, np.int64(n), np.int32(n), torch.tensor(n), [n], (n,), (n, n),
            [np.int64(n), torch.tensor(n)], True, float(n), np.float64(n), str(n),
            torch.tensor(float(n)), torch.tensor(True), (float(n), n), (True, n), None]


# (label, value the argument takes in the call, torch call, scratchops call)
INT_ARGUMENTS = [
    ("max_pool2d kernel_size", 2, lambda x, v: F.max_pool2d(x, v),
     lambda x, v: scratchops.max_pool2d(x, v)),
    ("max_pool2d stride", 2, lambda x, v: F.max_pool2d(x, 3, v),
     lambda x, v: scratchops.max_pool2d(x, 3, v)),
    ("max_pool2d padding", 1, lambda x, v: F.max_pool2d(x, 3, 2, v),
     lambda x, v: scratchops.max_pool2d(x, 3, 2, v)),
    ("im2col kernel_size", 2, lambda x, v: F.unfold(x, v), lambda x, v: scratchops.im2col(x, v)),
    ("im2col dilation", 2, lambda x, v: F.unfold(x, 2, dilation=v),
     lambda x, v: scratchops.im2col(x, 2, dilation=v)),
    ("im2col padding", 1, lambda x, v: F.unfold(x, 2, padding=v),
     lambda x, v: scratchops.im2col(x, 2, padding=v)),
    ("im2col stride", 2, lambda x, v: F.unfold(x, 2, stride=v),
     lambda x, v: scratchops.im2col(x, 2, stride=v)),
    ("conv2d stride", 2, lambda x, v: F.conv2d(x, W, stride=v),
     lambda x, v: scratchops.conv2d(x, meta(W), stride=v)),
    ("conv2d padding", 1, lambda x, v: F.conv2d(x, W, padding=v),
     lambda x, v: scratchops.conv2d(x, meta(W), padding=v)),
    ("conv2d dilation", 2, lambda x, v: F.conv2d(x, W, dilation=v),
     lambda x, v: scratchops.conv2d(x, meta(W), dilation=v)),
    ("conv2d groups", 1, lambda x, v: F.conv2d(x, W, groups=v),
     lambda x, v: scratchops.conv2d(x, meta(W), groups=v)),
    ("group_norm num_groups", 2, lambda x, v: F.group_norm(x, v),
     lambda x, v: scratchops.group_norm(x, v)),
]


@pytest.mark.parametrize("label,n,torch_call,our_call", INT_ARGUMENTS,
                         ids=[case[0] for case in INT_ARGUMENTS])
def test_int_arguments_as_torch(label, n, torch_call, our_call):
    for value, theirs, ours, where in both_outcomes(label, int_values(n), torch_call, our_call):
        if is_bool(value):  # torch refuses a bool (some of its functions take a bool tensor
            # as 1, others refuse it): scratchops refuses both
            assert ours[0] is TypeError, where
        elif theirs[0] == "ok":
            assert ours == theirs, where
        elif not int_like(value):  # (torch refuses some integers scratchops takes: F.unfold
            # iterates its argument, so a 0-dim tensor or a list of one fails there)
            expected = TypeError if theirs[0] is TypeError else (TypeError, ValueError)
            assert ours[0] != "ok" and issubclass(ours[0], expected), where


def number_values(x):
    return [x, 1, True, np.float32(x), np.float64(x), np.int64(1), torch.tensor(x),
            torch.tensor(1), str(x)]


NUMBER_ARGUMENTS = [
    ("group_norm eps", 1e-5, lambda x, v: F.group_norm(x, 2, eps=v),
     lambda x, v: scratchops.group_norm(x, 2, eps=v)),
    ("clamp min", 0.25, lambda x, v: torch.clamp(x, v), lambda x, v: scratchops.clamp(x, v)),
    ("clamp max", 0.75, lambda x, v: torch.clamp(x, None, v),
     lambda x, v: scratchops.clamp(x, None, v)),
]


@pytest.mark.parametrize("label,x,torch_call,our_call", NUMBER_ARGUMENTS,
                         ids=[case[0] for case in NUMBER_ARGUMENTS])
def test_number_arguments_as_torch(label, x, torch_call, our_call):
    for _, theirs, ours, where in both_outcomes(label, number_values(x), torch_call, our_call):
        if theirs[0] == "ok":
            assert ours == theirs, where
        else:
            assert ours[0] is TypeError and theirs[0] is TypeError, where


def test_number_arguments_refuse_tensors_of_more_than_one_value():
    # torch.clamp would broadcast a tensor bound; scratchops.clamp takes numbers (README).
    with pytest.raises(TypeError, match="min must be a real number, got a tensor"):
        scratchops.clamp(meta(X), torch.tensor([0.5]))


# ------------------------------------------------------------------------------ empties
def r(*shape):
    return torch.rand(shape)


EMPTY_SHAPES = [(0, 3, 8, 8), (2, 0, 8, 8), (2, 3, 0, 8), (2, 3, 8, 0)]
# (label, torch call, scratchops call, argument tensors (CPU; scratchops gets meta copies))
EMPTY_CASES = [
    case for shape in EMPTY_SHAPES for case in [
        (f"unfold {shape}", lambda x: F.unfold(x, 3), lambda x: scratchops.im2col(x, 3),
         [r(*shape)]),
        (f"max_pool2d {shape}", lambda x: F.max_pool2d(x, 2, padding=1),
         lambda x: scratchops.max_pool2d(x, 2, padding=1), [r(*shape)]),
        (f"conv2d {shape}", lambda x, w: F.conv2d(x, w, padding=1),
         lambda x, w: scratchops.conv2d(x, w, padding=1), [r(*shape), r(4, shape[1], 3, 3)]),
        (f"conv2d_min_add_mul {shape}",
         lambda x, w, b: (torch.min(F.conv2d(x, w), torch.tensor(0.5)) + b) * 2.0,
         lambda x, w, b: scratchops.conv2d_min_add_mul(x, w, None, 0.5, b, 2.0),
         [r(*shape), r(4, shape[1], 3, 3), r(4, 1, 1)]),
        (f"group_norm {shape}", lambda x: F.group_norm(x, 1),
         lambda x: scratchops.group_norm(x, 1), [r(*shape)]),
        (f"scale {shape}", lambda x, s: x * s, scratchops.scale, [r(*shape), r(shape[1], 1, 1)]),
        (f"min_add_mul {shape}", lambda x, b: (torch.min(x, torch.tensor(0.5)) + b) * 2.0,
         lambda x, b: scratchops.min_add_mul(x, 0.5, b, 2.0), [r(*shape), r(shape[1], 1, 1)]),
        (f"clamp {shape}", lambda x: torch.clamp(x, 0.0, 1.0),
         lambda x: scratchops.clamp(x, 0.0, 1.0), [r(*shape)]),
    ]
] + [
    (f"gemm {a} @ {b}", torch.matmul, scratchops.gemm, [r(*a), r(*b)])
    for a, b in [((0, 4), (4, 5)), ((3, 0), (0, 5)), ((3, 4), (4, 0)), ((0, 3, 4), (4, 5)),
                 ((0, 3, 4), (0, 4, 5)), ((2, 0, 4), (2, 4, 5)), ((2, 3, 4), (0, 4, 5))]
] + [
    ("conv2d weight (0, 3, 3, 3)", F.conv2d, scratchops.conv2d, [r(2, 3, 8, 8), r(0, 3, 3, 3)]),
    ("conv2d weight (4, 3, 0, 3)", F.conv2d, scratchops.conv2d, [r(2, 3, 8, 8), r(4, 3, 0, 3)]),
    ("conv2d unbatched (3, 0, 8)", F.conv2d, scratchops.conv2d, [r(3, 0, 8), r(4, 3, 3, 3)]),
    ("max_pool2d unbatched (0, 8, 8)", lambda x: F.max_pool2d(x, 2),
     lambda x: scratchops.max_pool2d(x, 2), [r(0, 8, 8)]),
    ("unfold unbatched (3, 0, 8)", lambda x: F.unfold(x, 2), lambda x: scratchops.im2col(x, 2),
     [r(3, 0, 8)]),
    ("group_norm (0, 4)", lambda x: F.group_norm(x, 2), lambda x: scratchops.group_norm(x, 2),
     [r(0, 4)]),
    ("clamp 0-dim", lambda x: torch.clamp(x, 0.0, 1.0), lambda x: scratchops.clamp(x, 0.0, 1.0),
     [torch.tensor(0.5)]),
    ("P85 one pass, batch 0", lambda x, w: torch.clamp(F.max_pool2d(F.group_norm(
        F.conv2d(x, w), 2), 4), 0.0, 1.0),
     lambda x, w: scratchops.conv2d_group_norm_pool_clamp(x, w, None, 2),
     [r(0, 3, 10, 10), r(4, 3, 3, 3)]),
]
DELIBERATE = {"conv2d (2, 0, 8, 8)", "conv2d_min_add_mul (2, 0, 8, 8)"}  # 0 input channels


@pytest.mark.parametrize("label,torch_call,our_call,tensors", EMPTY_CASES,
                         ids=[case[0] for case in EMPTY_CASES])
def test_empty_inputs_as_torch(label, torch_call, our_call, tensors):
    theirs = outcome(lambda: torch_call(*tensors))
    ours = outcome(lambda: our_call(*[meta(t) for t in tensors]))
    where = f"torch {theirs}, scratchops {ours}"
    if label in DELIBERATE:  # (torch's odd result even breaks P31's reference)
        assert ours[0] is ValueError and "0 channels" in ours[1], where
    elif theirs[0] == "ok":
        assert ours == theirs, where
    else:
        assert ours[0] is ValueError, where


# The cases where torch gives a result: on the GPU scratchops gives the same values, and
# launches nothing when the result is empty.
GPU_CASES = [case for case in EMPTY_CASES
             if case[0] not in DELIBERATE and outcome(lambda: case[1](*case[3]))[0] == "ok"]


@requires_gpu
@pytest.mark.parametrize("label,torch_call,our_call,tensors", GPU_CASES,
                         ids=[case[0] for case in GPU_CASES])
def test_empty_inputs_on_the_gpu(label, torch_call, our_call, tensors):
    expected = torch_call(*tensors)
    inputs = [t.cuda() for t in tensors]
    scratchops.load()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        out = our_call(*inputs)
        torch.cuda.synchronize()
    torch.testing.assert_close(out.cpu(), expected, atol=ATOL, rtol=RTOL)
    if out.numel() == 0:
        launched = [e.name for e in prof.events()
                    if e.device_type == torch.autograd.DeviceType.CUDA]
        assert not launched, launched
