"""Backward: every operator's gradients and both ModelNews' against torch and float64.

Each gradient is compared, on fresh random inputs with a random output gradient (not y.sum()'s
ones), with torch's fp32 gradient of the same function (TF32 off: conftest.py) and with a float64
reference (the same torch function on float64 copies):
  * allclose to torch fp32 at rtol 1e-4 and atol 1e-4 times the gradient's largest magnitude
    (GRAD_RTOL: a gradient such as a weight's sums over the batch and the plane, so its
    magnitude, not 1, sets the scale);
  * its largest error against float64 at most 4x torch fp32's, plus four fp32 ulps of the
    gradient's largest magnitude (ULPS: where torch's error is below an ulp, as in a pooling's
    gather or a short chain, ours must be within those four ulps);
  * NaN fails unless torch gives NaN in the same place.
Every gradient the kernel writes is poisoned first (helpers.poison_next on the input's size).

The CPU tests run on the meta device: every gradient gets the right shape, and a double
backward raises naming the operator.
"""

import math

import pytest
import torch
import torch.nn.functional as F

import scratchops
from helpers import (ENGINES, NO_TENSOR_CORES_REASON, OPERATOR_SAMPLES, model_cases, poison_next,
                     rand, skip_unless_runnable)
from scratchops.problems import PROBLEMS, build_pair

MODEL_CASES = model_cases()
GRAD_RTOL = 1e-4  # rtol, and atol as a share of the gradient's largest magnitude
# The float64 rule's smallest allowance: 4 fp32 ulps of the gradient's largest magnitude. Where
# torch's own error is below one ulp (a short chain: 3.7e-8 in one draw of P85's weight
# gradient), "4x torch's" would ask for less than the rounding of the result itself.
ULPS = 4 * 2.0 ** -23
HALF_DTYPES = [torch.float16, torch.bfloat16]
HALF_GRAD_TOL = 2 ** -6  # fp16 / bf16: KernelBench's 1e-2 in steps of the half types' precision


def requiring_grad(args):
    """args with every float tensor made a leaf that requires grad."""
    return tuple(a.detach().requires_grad_() if isinstance(a, torch.Tensor) and
                 a.is_floating_point() else a for a in args)


def leaves(args):
    return [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]


def gradients(fn, args, out_grad):
    """The gradients of (fn(*args) * out_grad).sum() with respect to every leaf of args."""
    y = fn(*args)
    return torch.autograd.grad(y, leaves(args), out_grad)


def as_dtype(args, dtype):
    return tuple(a.detach().to(dtype).requires_grad_(a.requires_grad)
                 if isinstance(a, torch.Tensor) else a for a in args)


def assert_grad_matches(ours, ref32, ref64, what, floor=0.0):
    """The two rules at the top; `floor`: an absolute error every rule allows (a model's
    gradient that is 0 in exact arithmetic, such as a convolution bias's under a group norm of
    one channel a group, is rounding noise of the gradients it is summed from)."""
    scale = ref64.abs().max().item() if ref64.numel() else 0.0
    torch.testing.assert_close(ours, ref32, rtol=GRAD_RTOL, atol=GRAD_RTOL * scale + floor + 1e-30,
                               msg=lambda m: f"{what}: {m}")
    if ours.numel() == 0:
        return
    err = (ours.double() - ref64).abs().max().item()
    err_torch = (ref32.double() - ref64).abs().max().item()
    assert err <= 4 * err_torch + ULPS * scale + floor, (what, err, err_torch)


def check_against_torch(ours_fn, torch_fn, args, out_shape_fn=None):
    """ours_fn and torch_fn on the same leaves; every gradient compared (see the top)."""
    args = requiring_grad(args)
    with torch.no_grad():
        y = torch_fn(*args)
    out_grad = rand(*y.shape)
    ref32 = gradients(torch_fn, args, out_grad)
    args64 = as_dtype(args, torch.float64)
    ref64 = gradients(torch_fn, args64, out_grad.double())
    for a in leaves(args):
        poison_next(*a.shape)
    ours = gradients(ours_fn, args, out_grad)
    for i, (o, r32, r64) in enumerate(zip(ours, ref32, ref64)):
        assert o.shape == r32.shape and o.dtype == r32.dtype
        assert_grad_matches(o, r32, r64, f"gradient {i}")


# ------------------------------------------------------------ torch's function of each operator
def torch_min_add_mul(x, constant, bias, factor):
    return (torch.min(x, torch.tensor(constant, device=x.device, dtype=x.dtype)) + bias) * factor


def torch_clamp(x, lo, hi):
    """torch.clamp with an infinite bound as no bound (scratchops' convention), x itself
    for neither."""
    lo, hi = None if lo == -math.inf else lo, None if hi == math.inf else hi
    return x if lo is None and hi is None else torch.clamp(x, lo, hi)


def torch_conv_gn_pool_clamp(x, w, cb, groups, gw, gb, scale, eps, lo, hi):
    y = F.group_norm(F.conv2d(x, w, cb), groups, gw, gb, eps) * scale
    return torch.clamp(F.max_pool2d(y, 4), lo, hi)


# The fused operators choose on an intermediate value: P31's min (is the convolution's value
# below, at or above the constant?), P85's pooling (which element is the window's largest?) and
# clamp (is it inside the bounds?). In a half type, rounding that value moves it by a step or
# two, and where float64's choice has less margin than that, torch's half result and ours each
# may choose otherwise, by their own roundings (torch's bf16 group norm rounds differently from
# float-then-round: docs/notes.md, "Half precision"); a flip sends a whole gradient value
# elsewhere, so on that draw neither half result bounds the other. The half tests therefore
# give such outputs no gradient: settled() below is True where float64's choice holds by more
# than SETTLE_STEPS steps of the half type (eps, the type's relative step) of the values it is
# made on, so the float64 rule holds on every draw; the fp32 tests keep every choice.
SETTLE_STEPS = 4


def min_settled(y, constant, eps):
    """Per element of y (float64): whether min(y, constant) chooses the same in the half type."""
    return (y - constant).abs() > SETTLE_STEPS * eps * y.abs()


def pool_settled(conv, normed, gamma_scale, groups, pool, lo, hi, eps):
    """Per window of max_pool2d(normed, pool) clamped to [lo, hi] (float64 values): whether the
    half type chooses the same largest element and the same side of each bound. normed =
    group_norm(conv) * scale; an element's margin counts its own size and the convolution's
    share of it, |gamma * scale| * |conv| / sigma (a step of conv, normalised)."""
    n, c, h, w = conv.shape
    sigma = (conv.reshape(n, groups, -1).var(-1, unbiased=False) + 1e-5).sqrt()
    sigma = sigma.repeat_interleave(c // groups, 1)[..., None, None]
    margin = SETTLE_STEPS * eps * (normed.abs() + gamma_scale.abs() * conv.abs() / sigma)
    rows, cols = h // pool * pool, w // pool * pool

    def windows(t):  # (n, c, rows / pool, cols / pool, pool * pool)
        t = t[..., :rows, :cols].reshape(n, c, rows // pool, pool, cols // pool, pool)
        return t.permute(0, 1, 2, 4, 3, 5).reshape(n, c, rows // pool, cols // pool, pool * pool)

    top, where = windows(normed).topk(2, dim=-1)
    top_margin = windows(margin).gather(-1, where)
    largest, room = top[..., 0], top_margin[..., 0]
    return ((largest - top[..., 1] > room + top_margin[..., 1])
            & ((largest - lo).abs() > room) & ((largest - hi).abs() > room))


def settled_out_grad(out_grad, keep):
    """out_grad with no gradient where a choice is not settled (see SETTLE_STEPS); most of the
    outputs keep theirs, so the test still tests."""
    assert keep.shape == out_grad.shape and keep.float().mean() >= 0.25, keep.float().mean()
    return out_grad * keep


# (name, scratchops call, torch call, argument builder) over shapes that are not multiples of
# any tile: odd sizes, batch 1, one channel, strides, padding, dilation.
def _cases():
    inf = math.inf
    cases = []

    def add(name, ours, ref, build, settled=None):
        # settled: for the operators that choose, settled() of their float64 arguments
        cases.append(pytest.param(ours, ref, build, settled, id=f"{name}-{len(cases)}"))

    for shape, k, d, p, s in [((2, 3, 9, 8), (3, 2), (1, 1), (1, 0), (2, 1)),
                              ((1, 1, 7, 5), (2, 2), (2, 1), (0, 1), (1, 2))]:
        add("im2col", lambda x, k=k, d=d, p=p, s=s: scratchops.im2col(x, k, d, p, s),
            lambda x, k=k, d=d, p=p, s=s: F.unfold(x, k, d, p, s), lambda shape=shape: (rand(*shape),))
    for a_shape, b_shape, bias, version in [((33, 17), (17, 45), True, 4), ((2, 33, 17), (2, 17, 45), True, 3),
                                            ((5, 7), (3, 7, 4), True, 4), ((3, 5, 7), (7, 4), False, 4),
                                            ((300, 40), (40, 33), True, None), ((1, 1), (1, 1), True, 1)]:
        def build(a_shape=a_shape, b_shape=b_shape, bias=bias):
            return (rand(*a_shape), rand(*b_shape), rand(a_shape[-2]) if bias else None)

        def ref(a, b, c):
            y = a @ b
            return y if c is None else y + c[:, None]
        add("gemm", lambda a, b, c, v=version: scratchops.gemm(a, b, c, version=v), ref, build)
    for x_shape, w_shape, stride, padding, dilation, algorithm in [
            ((2, 3, 11, 10), (4, 3, 3, 3), 1, 1, 1, "im2col_gemm"),
            ((2, 3, 11, 10), (5, 3, 3, 2), 2, (1, 0), 1, "implicit_gemm"),
            ((1, 1, 9, 7), (1, 1, 3, 3), 1, 0, 2, "im2col_gemm"),
            ((3, 2, 13, 12), (6, 2, 5, 5), (3, 2), 2, 1, "implicit_gemm"),
            ((2, 5, 8, 9), (7, 5, 1, 1), 1, 0, 1, "im2col_gemm"),
            # stride 1 after the implicit GEMM: the input gradient a convolution on the tensor
            # cores (channels not a multiple of 8 each way; 16 of them), then padding past
            # dil*(k-1), which keeps the chain; the weight gradient in slices of pixels
            ((2, 5, 10, 9), (70, 5, 3, 3), 1, (1, 2), (2, 1), "implicit_gemm"),
            ((3, 16, 12, 11), (16, 16, 3, 3), 1, 0, 1, "implicit_gemm"),
            ((1, 9, 6, 7), (3, 9, 1, 1), 1, 1, 1, "implicit_gemm"),
            ((5, 3, 41, 40), (8, 3, 3, 3), 1, 0, 1, "implicit_gemm")]:
        add("conv2d",
            lambda x, w, b, s=stride, p=padding, d=dilation, a=algorithm:
                scratchops.conv2d(x, w, b, s, p, d, algorithm=a),
            lambda x, w, b, s=stride, p=padding, d=dilation: F.conv2d(x, w, b, s, p, d),
            lambda xs=x_shape, ws=w_shape: (rand(*xs), rand(*ws), rand(ws[0])))
    add("conv2d_min_add_mul",
        lambda x, w, cb, b: scratchops.conv2d_min_add_mul(x, w, cb, 0.25, b, -2.0, padding=1),
        lambda x, w, cb, b: torch_min_add_mul(F.conv2d(x, w, cb, padding=1), 0.25, b, -2.0),
        lambda: (rand(2, 5, 9, 8), rand(70, 5, 3, 3), rand(70), rand(70, 1, 1)),
        lambda x, w, cb, b, eps: min_settled(F.conv2d(x, w, cb, padding=1), 0.25, eps))

    def gn_pool_settled(x, w, cb, gw, gb, s, eps):
        conv = F.conv2d(x, w, cb)
        return pool_settled(conv, F.group_norm(conv, 4, gw, gb, 1e-5) * s,
                            gw.view(1, -1, 1, 1) * s.view(1, -1, 1, 1), 4, 4, -0.5, 0.5, eps)

    for version in (1, 2, 3):
        add("conv2d_group_norm_pool_clamp",
            lambda x, w, cb, gw, gb, s, v=version: scratchops.conv2d_group_norm_pool_clamp(
                x, w, cb, 4, gw, gb, s, 1e-5, -0.5, 0.5, version=v),
            lambda x, w, cb, gw, gb, s: torch_conv_gn_pool_clamp(x, w, cb, 4, gw, gb, s, 1e-5,
                                                                 -0.5, 0.5),
            lambda: (rand(2, 3, 14, 15), rand(8, 3, 3, 3), rand(8), rand(8), rand(8),
                     rand(8, 1, 1)),
            gn_pool_settled)
    for shape, groups in [((2, 6, 5, 7), 3), ((1, 4, 3), 1), ((3, 8, 2, 3, 2), 8)]:
        add("group_norm_scale",
            lambda x, w, b, s, g=groups: scratchops.group_norm_scale(x, g, w, b, s),
            lambda x, w, b, s, g=groups: F.group_norm(x, g, w, b) * s,
            lambda shape=shape: (rand(*shape), rand(shape[1]), rand(shape[1]),
                                 rand(shape[1], *[1] * (len(shape) - 2))))
        add("group_norm", lambda x, w, b, g=groups: scratchops.group_norm(x, g, w, b),
            lambda x, w, b, g=groups: F.group_norm(x, g, w, b),
            lambda shape=shape: (rand(*shape), rand(shape[1]), rand(shape[1])))
    add("group_norm_no_affine", lambda x: scratchops.group_norm(x, 2),
        lambda x: F.group_norm(x, 2), lambda: (rand(2, 4, 6, 5, low=50.0, high=52.0),))
    add("scale", scratchops.scale, lambda x, s: x * s, lambda: (rand(2, 6, 5, 7), rand(6, 1, 1)))
    add("min_add_mul", lambda x, b: scratchops.min_add_mul(x, 0.5, b, 3.0),
        lambda x, b: torch_min_add_mul(x, 0.5, b, 3.0), lambda: (rand(2, 6, 5, 7), rand(6, 1, 1)))
    # (Bounds the half types hold exactly: a float64 reference compares with the bound itself,
    # torch's half operators with it rounded to the type; test_half_bounds_round_as_torch.)
    for k, s, p, lo, hi in [(3, 2, 1, -inf, inf), (4, None, 0, 0.0, 1.0), (2, 1, 0, -0.375, inf),
                            ((3, 2), (1, 3), (1, 0), -inf, 0.125)]:
        add("max_pool2d_clamp",
            lambda x, k=k, s=s, p=p, lo=lo, hi=hi: scratchops.max_pool2d_clamp(x, k, s, p, lo, hi),
            lambda x, k=k, s=s, p=p, lo=lo, hi=hi: torch_clamp(F.max_pool2d(x, k, s, p), lo, hi),
            lambda: (rand(2, 3, 11, 10),))
    add("max_pool2d", lambda x: scratchops.max_pool2d(x, 3), lambda x: F.max_pool2d(x, 3),
        lambda: (rand(1, 1, 10, 9),))
    for lo, hi in [(-0.5, 0.5), (0.0, inf), (-inf, 0.125), (0.5, -0.5)]:
        add("clamp", lambda x, lo=lo, hi=hi: scratchops.clamp(x, lo, hi),
            lambda x, lo=lo, hi=hi: torch_clamp(x, lo, hi), lambda: (rand(3, 5, 7),))
    return cases


@pytest.mark.parametrize("ours,ref,build,settled", _cases())
def test_gradients_match_torch_and_float64(ours, ref, build, settled):
    skip_unless_runnable("cuda", operator="conv2d_group_norm_pool_clamp")
    check_against_torch(ours, ref, build())


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("ours,ref,build,settled", _cases())
def test_half_gradients_match_torch(ours, ref, build, settled, dtype):
    # In fp16 / bf16 against float64 within 4x torch's own half error plus two steps of the
    # gradient's magnitude, and against torch in the same dtype at KernelBench's 1e-2 scaled to
    # the gradient's magnitude (steps of 2^-6 of it). The fused operators, which choose on an
    # intermediate result, get no output gradient where a half rounding can flip the choice
    # (SETTLE_STEPS), and are not held to torch's half gradient element by element: torch's
    # bf16 group norm leaves P85's intermediate a step away from ours on many elements.
    skip_unless_runnable("cuda", operator="conv2d_group_norm_pool_clamp")
    args = requiring_grad(as_dtype(build(), dtype))
    with torch.no_grad():
        out_grad = rand(*ref(*args).shape, dtype=dtype)
        if settled is not None:
            out_grad = settled_out_grad(
                out_grad, settled(*as_dtype(args, torch.float64), torch.finfo(dtype).eps))
    ref_half = gradients(ref, args, out_grad)
    ref64 = gradients(ref, as_dtype(args, torch.float64), out_grad.double())
    ours_half = gradients(ours, args, out_grad)
    for o, r, r64 in zip(ours_half, ref_half, ref64):
        assert o.dtype == dtype and o.shape == r.shape
        if not o.numel():
            continue
        scale = r64.abs().max().item()
        err = (o.double() - r64).abs().max().item()
        err_torch = (r.double() - r64).abs().max().item()
        assert err <= 4 * err_torch + 2 * HALF_GRAD_TOL * scale, (err, err_torch)
        # Where torch's own half result is outside the tolerance of float64 (group norm on
        # large-mean data), the allclose is against float64 rounded to the dtype instead.
        if settled is not None:
            continue
        expected = r if err_torch <= HALF_GRAD_TOL * scale else r64.to(dtype)
        torch.testing.assert_close(o.float(), expected.float(), rtol=HALF_GRAD_TOL,
                                   atol=HALF_GRAD_TOL * scale + 1e-30)


@pytest.mark.parametrize("engine", ENGINES or ["none"])
@pytest.mark.parametrize("dtype", [torch.float32, *HALF_DTYPES])
@pytest.mark.parametrize("workspace_bytes", [1, scratchops.versions.TENSOR_CORE_GRAD_WORKSPACE_BYTES])
@pytest.mark.parametrize("x_shape,w_shape,stride,padding,dilation", [
    ((5, 6, 61, 60), (7, 6, 3, 3), (1, 1), (0, 0), (1, 1)),
    ((7, 5, 37, 45), (9, 5, 3, 5), (2, 3), (2, 1), (1, 2)),
    ((4, 3, 130, 130), (8, 3, 3, 3), (1, 1), (0, 0), (1, 1))])
def test_tensor_core_weight_gradient_over_chunks_and_slices(x_shape, w_shape, stride, padding,
                                                            dilation, workspace_bytes, dtype,
                                                            engine):
    # The weight gradient on the tensor cores (conv_backward.cu v2, the implicit GEMM in
    # slices of output rows), on each engine, against torch's weight gradient and float64: in
    # chunks of one slice (a workspace too small for more) and in one chunk. The first shape
    # has 10 slices of 32 rows, each row 58 pixels in 64 slots; the second strides, pads
    # (reading left of the input's edge) and dilates, with 14 pixels a row in 16 slots and
    # 2 slices, the second shorter. The third is the shortest reduction whose 3xTF32 partial
    # sums (float's) hold several k-blocks (conv_weight_grad_implicit.cuh's kPartialGroupFrom:
    # 512 rows of 128 slots).
    skip_unless_runnable("cuda", operator="conv2d_group_norm_pool_clamp")
    if engine == "none":
        pytest.skip(NO_TENSOR_CORES_REASON)
    x = rand(*x_shape, dtype=dtype)
    with torch.no_grad():
        out_shape = F.conv2d(x.float(), torch.zeros(w_shape, device="cuda"), None, stride,
                             padding, dilation).shape
    dy = rand(*out_shape, dtype=dtype)
    poison_next(*w_shape, dtype=dtype)
    with scratchops.tensor_core_path(engine):
        ours = torch.ops.scratchops._conv2d_weight_grad(
            dy, x, list(w_shape), list(stride), list(padding), list(dilation), workspace_bytes,
            scratchops.versions.GEMM_TENSOR_CORE_VERSION)
    ref = torch.nn.grad.conv2d_weight(x, w_shape, dy, stride, padding, dilation)
    ref64 = torch.nn.grad.conv2d_weight(x.double(), w_shape, dy.double(), stride, padding,
                                        dilation)
    if dtype == torch.float32:
        assert_grad_matches(ours, ref, ref64, "dweight")
    else:
        scale = ref64.abs().max().item()
        err = (ours.double() - ref64).abs().max().item()
        assert err <= 4 * (ref.double() - ref64).abs().max().item() + 2 * HALF_GRAD_TOL * scale


@pytest.mark.parametrize("engine", ENGINES or ["none"])
@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_half_weight_gradient_reads_dy_in_pairs_or_alone(dtype, engine):
    # The 16-bit weight gradient's packing of dy reads two pixels of a row with one 4-byte load
    # where they are an aligned pair, otherwise one at a time: rows of 23 pixels (the pairs'
    # parity alternates with the row's, each row's last pixel alone) and dy one element into its
    # storage (every row's parity the other way, so each pair is read with one load in one
    # tensor and value by value in the other) give the same bits, within the half rule of
    # torch. (On mma.sync the weight gradient multiplies TF32, whose packing asks no pairs.)
    skip_unless_runnable("cuda", operator="conv2d_group_norm_pool_clamp")
    if engine == "none":
        pytest.skip(NO_TENSOR_CORES_REASON)
    x, w_shape = rand(3, 6, 21, 26, dtype=dtype), (5, 6, 3, 4)
    dy = rand(3, 5, 19, 23, dtype=dtype)
    shifted = torch.empty(dy.numel() + 1, dtype=dtype, device="cuda")[1:].view(dy.shape)
    shifted.copy_(dy)

    def ours(d):
        with scratchops.tensor_core_path(engine):
            return torch.ops.scratchops._conv2d_weight_grad(
                d, x, list(w_shape), [1, 1], [0, 0], [1, 1],
                scratchops.versions.TENSOR_CORE_GRAD_WORKSPACE_BYTES,
                scratchops.versions.GEMM_TENSOR_CORE_VERSION)
    out = ours(dy)
    assert torch.equal(ours(shifted), out)
    ref = torch.nn.grad.conv2d_weight(x, w_shape, dy)
    ref64 = torch.nn.grad.conv2d_weight(x.double(), w_shape, dy.double())
    scale = ref64.abs().max().item()
    err = (out.double() - ref64).abs().max().item()
    assert err <= 4 * (ref.double() - ref64).abs().max().item() + 2 * HALF_GRAD_TOL * scale


@pytest.mark.parametrize("with_other", [False, True])
@pytest.mark.parametrize("shape", [(11, 100, 7, 5), (3, 600, 2, 2), (1, 1, 1, 1), (130, 3, 9, 1)])
def test_channel_sums_over_ranges_of_images(shape, with_other):
    # Every bias-like gradient's per-channel sums (channelwise_backward.cu v2): batch 11 over
    # 100 channels makes 4 ranges of images, the last one shorter; 600 channels one range;
    # 130 images over 3 channels 130 ranges of one image. Against torch and float64.
    skip_unless_runnable("cuda", operator="conv2d_group_norm_pool_clamp")
    a, b = rand(*shape, low=-1.0), rand(*shape, low=-1.0)
    poison_next(shape[1])
    ours = torch.ops.scratchops._channel_sums(a, b if with_other else None, -1.5)
    product = a * b if with_other else a
    ref = -1.5 * product.sum(dim=(0, 2, 3))
    ref64 = -1.5 * (a.double() * b.double() if with_other else a.double()).sum(dim=(0, 2, 3))
    assert_grad_matches(ours, ref, ref64, "channel sums")


# ----------------------------------------------------------------- behaviour of the gradients
def test_max_pool_ties_go_where_torch_sends_them():
    # Integer-valued inputs: many equal maxima in a window; overlapping windows add up.
    skip_unless_runnable("cuda")
    x = torch.randint(0, 3, (2, 3, 12, 11), device="cuda").float().requires_grad_()
    for k, s, p in [(4, 4, 0), (3, 1, 1), (2, 1, 0)]:
        g = rand(*F.max_pool2d(x, k, s, p).shape)
        (ref,) = torch.autograd.grad(F.max_pool2d(x, k, s, p), x, g)
        (ours,) = torch.autograd.grad(scratchops.max_pool2d(x, k, s, p), x, g)
        assert torch.equal(ours, ref), (k, s, p)


def test_nan_and_inf_gradients_follow_torch():
    skip_unless_runnable("cuda")
    x = rand(2, 3, 8, 8)
    x[0, 0, 1, 1] = x[0, 0, 2, 3] = float("nan")  # two NaNs in one window: the last wins
    x[1, 2, 5, 5] = float("inf")
    x[0, 1, :4, :4] = 0.25  # a whole window of ties
    x = x.requires_grad_()
    for ours, ref in [
            (lambda t: scratchops.max_pool2d(t, 4), lambda t: F.max_pool2d(t, 4)),
            (lambda t: scratchops.max_pool2d_clamp(t, 4, min=0.0, max=1.0),
             lambda t: torch.clamp(F.max_pool2d(t, 4), 0.0, 1.0)),
            (lambda t: scratchops.clamp(t, -0.5, 0.5), lambda t: torch.clamp(t, -0.5, 0.5)),
            (lambda t: scratchops.min_add_mul(t, 0.25, torch.ones(3, 1, 1, device="cuda"), 2.0),
             lambda t: torch_min_add_mul(t, 0.25, torch.ones(3, 1, 1, device="cuda"), 2.0))]:
        y = ref(x)
        g = rand(*y.shape)
        (expected,) = torch.autograd.grad(y, x, g)
        (got,) = torch.autograd.grad(ours(x), x, g)
        torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_half_bounds_round_as_torch(dtype):
    # torch compares a half tensor with the bound rounded to the type: in bf16 -0.3 is
    # -0.30078125, and an element holding exactly that passes its gradient.
    skip_unless_runnable("cuda")
    lo, hi = -0.3, 0.3
    values = [torch.tensor(v, dtype=dtype).item() for v in (lo, hi)]
    x = torch.tensor(values + [0.0, -0.9, 0.9], dtype=dtype, device="cuda")
    x = x.view(1, 1, 1, 5).requires_grad_()
    for ours, ref in [(lambda t: scratchops.clamp(t, lo, hi), lambda t: torch.clamp(t, lo, hi)),
                      (lambda t: scratchops.max_pool2d_clamp(t, 1, min=lo, max=hi),
                       lambda t: torch.clamp(F.max_pool2d(t, 1), lo, hi))]:
        (expected,) = torch.autograd.grad(ref(x).sum(), x)
        (got,) = torch.autograd.grad(ours(x).sum(), x)
        assert got.flatten().tolist() == expected.flatten().tolist() == [1, 1, 1, 0, 0]


@pytest.mark.parametrize("algorithm", ["im2col_gemm", "implicit_gemm"])
def test_an_empty_batch_gives_zero_weight_and_bias_gradients(algorithm):
    # As torch's: the weight and bias gradients sum over no images.
    skip_unless_runnable("cuda", operator="conv2d_min_add_mul" if algorithm == "implicit_gemm"
                         else None)
    x, w, b = (t.requires_grad_() for t in (rand(0, 3, 7, 6), rand(5, 3, 3, 2), rand(5)))
    y = scratchops.conv2d(x, w, b, padding=1, algorithm=algorithm)
    dx, dw, db = torch.autograd.grad(y, (x, w, b), torch.ones_like(y))
    assert dx.shape == x.shape and y.shape == (0, 5, 7, 7)
    assert torch.equal(dw, torch.zeros_like(w)) and torch.equal(db, torch.zeros_like(b))


def test_min_tie_splits_the_gradient_as_torch_minimum():
    skip_unless_runnable("cuda")
    x = torch.tensor([0.25, 0.5, 0.75, float("nan")], device="cuda").view(1, 4, 1, 1)
    x = x.requires_grad_()
    bias = torch.zeros(4, 1, 1, device="cuda")
    (got,) = torch.autograd.grad(scratchops.min_add_mul(x, 0.5, bias, 2.0).sum(), x)
    (expected,) = torch.autograd.grad(torch_min_add_mul(x, 0.5, bias, 2.0).sum(), x)
    assert got.flatten().tolist()[:3] == expected.flatten().tolist()[:3] == [2.0, 1.0, 0.0]
    assert got.flatten()[3].item() == expected.flatten()[3].item() == 2.0


def test_gradient_of_an_expanded_output_gradient():
    # y.sum() hands the backward an expanded (stride 0) gradient: it is made contiguous.
    skip_unless_runnable("cuda")
    x, w = rand(2, 3, 9, 9).requires_grad_(), rand(4, 3, 3, 3).requires_grad_()
    scratchops.conv2d(x, w, algorithm="im2col_gemm").sum().backward()
    x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    F.conv2d(x2, w2).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad, rtol=GRAD_RTOL, atol=1e-5)
    torch.testing.assert_close(w.grad, w2.grad, rtol=GRAD_RTOL, atol=1e-4)


# --------------------------------------------------------------------------- both ModelNews
def model_grads(model, x, out_grad):
    model.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_()
    model(x).backward(out_grad)
    return [x.grad] + [p.grad for p in model.parameters()]


def check_model(name, label, init, shape, seed=3, tweak=None):
    module = PROBLEMS[name]
    model, model_new = build_pair(module, label, seed, "cuda", init=init)
    if tweak is not None:
        tweak(model)
        model_new.load_state_dict(model.state_dict())
    model.train(), model_new.train()
    x = rand(*shape, low=0.0, high=1.0)
    with torch.no_grad():
        out_grad = rand(*model(x).shape)
    ref32 = model_grads(model, x, out_grad)
    model64 = module.Model(*init).double().cuda()
    model64.load_state_dict(model.state_dict())
    ref64 = model_grads(model64, x.double(), out_grad.double())
    ours = model_grads(model_new, x, out_grad)
    names = ["input"] + [n for n, _ in model.named_parameters()]
    # About 8 fp32 ulps of the model's largest gradient (see assert_grad_matches).
    floor = 1e-6 * max(r.abs().max().item() for r in ref64)
    for n, o, r32, r64 in zip(names, ours, ref32, ref64):
        assert o is not None, n
        assert_grad_matches(o, r32, r64, f"{name}/{label} {n}", floor)


@pytest.mark.parametrize("name,label", MODEL_CASES)
def test_model_new_gradients_match_model(name, label):
    skip_unless_runnable("cuda", case=(name, label))
    module = PROBLEMS[name]
    check_model(name, label, module.get_init_inputs(), (2, module.in_channels, 20, 19))


def _negate_scale(model):
    with torch.no_grad():
        if hasattr(model, "scale"):
            model.scale.mul_(-1.5)
            model.group_norm.weight.uniform_(-1.0, 1.0)


# Random constructors: odd sizes, pools that do not divide, negative gamma * scale and factor.
RANDOM_MODELS = [
    ("p85", [3, 12, 3, 4, (12, 1, 1), 3, -0.2, 0.7], (1, 3, 17, 13)),
    ("p85", [1, 4, 5, 2, (4, 1, 1), 4, 0.0, 1.0], (3, 1, 14, 11)),
    ("p85", [5, 6, 3, 6, (6, 1, 1), 5, -1.0, 1.0], (2, 5, 24, 21)),
    ("p31", [3, 5, 3, -0.1, (5, 1, 1), -1.5], (1, 3, 9, 12)),
    ("p31", [1, 1, 5, 0.2, (1, 1, 1), 3.0], (2, 1, 7, 8)),
]


@pytest.mark.parametrize("name,init,shape", RANDOM_MODELS)
@pytest.mark.parametrize("variant", [0, 1, 2])
def test_random_models_gradients_match(name, init, shape, variant):
    label = list(PROBLEMS[name].VARIANTS)[variant]
    skip_unless_runnable("cuda", case=(name, label))
    check_model(name, label, init, shape, tweak=_negate_scale)


def model_settled(model64, x, eps):
    """settled() of KernelBench's Model of either problem (float64) at input x."""
    conv = model64.conv(x)
    if not hasattr(model64, "group_norm"):  # P31
        return min_settled(conv, model64.constant_value, eps)
    gn = model64.group_norm
    pool = model64.maxpool.kernel_size
    return pool_settled(conv, gn(conv) * model64.scale,
                        gn.weight.view(1, -1, 1, 1) * model64.scale.view(1, -1, 1, 1),
                        gn.num_groups, pool if isinstance(pool, int) else pool[0],
                        model64.clamp_min, model64.clamp_max, eps)


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("name,label", MODEL_CASES)
def test_half_model_new_gradients(name, label, dtype):
    # Against float64, within 4x torch's own error in the dtype plus two steps of the gradient's
    # magnitude; P31 also allclose to torch in the dtype at those two steps. No output gradient
    # where a half rounding can flip the model's choice (SETTLE_STEPS). P85 is not compared with
    # torch element by element in half: torch's bf16 group norm leaves the pooled values a step
    # away from ours on many elements.
    skip_unless_runnable("cuda", case=(name, label))
    module = PROBLEMS[name]
    model, model_new = build_pair(module, label, 3, "cuda")
    model64 = module.Model(*module.get_init_inputs()).double().cuda()
    model64.load_state_dict(model.state_dict())
    model, model_new = model.to(dtype).train(), model_new.to(dtype).train()
    x = rand(2, module.in_channels, 20, 19, low=0.0, high=1.0, dtype=dtype)
    with torch.no_grad():
        out_grad = settled_out_grad(rand(*model(x).shape, dtype=dtype),
                                    model_settled(model64, x.double(), torch.finfo(dtype).eps))
    ref = model_grads(model, x, out_grad)
    ref64 = model_grads(model64, x.double(), out_grad.double())
    for r, o, r64 in zip(ref, model_grads(model_new, x, out_grad), ref64):
        assert o.dtype == dtype
        scale = r64.abs().max().item()
        err = (o.double() - r64).abs().max().item()
        err_torch = (r.double() - r64).abs().max().item()
        assert err <= 4 * err_torch + 2 * HALF_GRAD_TOL * scale, (err, err_torch)
        if name == "p31":
            torch.testing.assert_close(o.float(), r.float(), rtol=HALF_GRAD_TOL,
                                       atol=2 * HALF_GRAD_TOL * scale)


@pytest.mark.parametrize("name,label", MODEL_CASES)
def test_partial_requires_grad_and_accumulation(name, label):
    skip_unless_runnable("cuda", case=(name, label))
    module = PROBLEMS[name]
    model, model_new = build_pair(module, label, 4, "cuda")
    x = rand(2, module.in_channels, 16, 17, low=0.0, high=1.0)
    for m in (model, model_new):  # a frozen convolution
        m.conv.weight.requires_grad_(False)
        m.conv.bias.requires_grad_(False)
    with torch.no_grad():
        g = rand(*model(x).shape)
    got, expected = [], []
    for m, out in ((model_new, got), (model, expected)):
        xi = x.clone().requires_grad_()
        for _ in range(2):  # two backward passes accumulate
            m(xi).backward(g)
        out += [xi.grad] + [p.grad for p in m.parameters()]
        assert m.conv.weight.grad is None and m.conv.bias.grad is None
    for o, e in zip(got, expected):
        assert (o is None) == (e is None)
        if o is not None:
            scale = e.abs().max().item()
            torch.testing.assert_close(o, e, rtol=GRAD_RTOL, atol=GRAD_RTOL * scale)
    # The input alone: no parameter gets a gradient
    _, model_new = build_pair(module, label, 4, "cuda")
    model_new.requires_grad_(False)
    xi, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
    model_new(xi).backward(g)
    model.requires_grad_(False)
    model(xr).backward(g)
    assert all(p.grad is None for p in model_new.parameters())
    torch.testing.assert_close(xi.grad, xr.grad, rtol=GRAD_RTOL,
                               atol=GRAD_RTOL * xr.grad.abs().max().item())


@pytest.mark.parametrize("name,label", MODEL_CASES)
def test_gradients_are_bitwise_deterministic(name, label):
    skip_unless_runnable("cuda", case=(name, label))
    module = PROBLEMS[name]
    _, model_new = build_pair(module, label, 6, "cuda")
    x = rand(4, module.in_channels, 40, 37, low=0.0, high=1.0)
    with torch.no_grad():
        g = rand(*model_new(x).shape)
    first = model_grads(model_new, x, g)
    for _ in range(2):
        again = model_grads(model_new, x, g)
        assert all(torch.equal(a, b) for a, b in zip(first, again))


# --------------------------------------------------------------------- double backward, meta
@pytest.mark.parametrize("device", ["meta", "cuda"])
@pytest.mark.parametrize("name", sorted(OPERATOR_SAMPLES))
def test_every_operator_has_gradients_of_the_right_shape(name, device):
    skip_unless_runnable(device, operator=name)
    args = requiring_grad(OPERATOR_SAMPLES[name](device))
    y = getattr(torch.ops.scratchops, name)(*args)
    grads = torch.autograd.grad(y, leaves(args), torch.ones_like(y))
    for a, g in zip(leaves(args), grads):
        assert g.shape == a.shape and g.dtype == a.dtype and g.device == a.device


@pytest.mark.parametrize("device", ["meta", "cuda"])
@pytest.mark.parametrize("name", sorted(OPERATOR_SAMPLES))
def test_double_backward_raises_naming_the_operator(name, device):
    skip_unless_runnable(device, operator=name)
    args = requiring_grad(OPERATOR_SAMPLES[name](device))
    y = getattr(torch.ops.scratchops, name)(*args)
    grads = torch.autograd.grad((y * y).sum(), leaves(args), create_graph=True)
    connected = [g for g in grads if g.requires_grad]
    assert connected  # (each operator's backward reads a saved input that requires grad)
    with pytest.raises(NotImplementedError,
                       match=rf"^scratchops\.{name} \(its backward's step _\w+\): double "
                             "backward is not implemented"):
        torch.autograd.grad(sum(g.sum() for g in connected), leaves(args))


@pytest.mark.parametrize("device", ["meta", "cuda"])
@pytest.mark.parametrize("grad_off", [torch.no_grad, torch.inference_mode])
@pytest.mark.parametrize("name", sorted(OPERATOR_SAMPLES))
def test_without_grad_nothing_changes(name, grad_off, device):
    skip_unless_runnable(device, operator=name)
    args = requiring_grad(OPERATOR_SAMPLES[name](device))
    with grad_off():
        y = getattr(torch.ops.scratchops, name)(*args)
    assert not y.requires_grad


@pytest.mark.parametrize("name,label", MODEL_CASES)
def test_model_new_backward_fills_every_gradient_on_meta(name, label):
    module = PROBLEMS[name]
    model_new = module.ModelNew(*module.get_init_inputs(), **module.VARIANTS[label]).to("meta")
    x = torch.rand(2, module.in_channels, 20, 19, device="meta", requires_grad=True)
    model_new(x).sum().backward()
    assert x.grad.shape == x.shape
    assert all(p.grad is not None and p.grad.shape == p.shape for p in model_new.parameters())
