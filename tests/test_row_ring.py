"""The implicit-GEMM convolution's v5 (cuda/conv_implicit_row_ring.cuh): v4 without its
channels-last copy. Each CTA turns rows of the NCHW input into v4's channel-last rows in a ring
in shared memory (the copy engine stages 8 channels of a row, a warp transposes them with
ldmatrix / stmatrix), and walks consecutive output rows so that each input row is made once.

It serves fp16 and bf16 on the wgmma engine with stride 1, dil_h 1, Cin = 64 (v4's one k-block
a tap), kernel_h <= 3, (kernel_w - 1) dil_w <= 8, W a multiple of 8 with W + 2 pad_w <= 128, one
column tile of B resident in shared memory beside the ring, and at least 8 output rows a
multiprocessor (applies()); the shapes below are sized from this GPU's multiprocessors to
reach it, and reach each edge of it: a full 128-pixel row,
padding on both sides, odd output sizes, one output row an image (every tile starts an image:
the ring refilled, most loads read by one tile), kernel rows 1 to 3, a dilated 5-wide kernel,
output channels past Cout in the column tile, and rows shared unevenly between CTAs. Each is
held to torch's result in its dtype and a float64 reference, with the output poisoned first;
the profiler shows that v5 ran and that no copy kernel did."""

import math

import pytest
import torch
import torch.nn.functional as F

import scratchops
from helpers import TENSOR_CORES, launches, one_element_in, poison_next, rand
from test_autograd import (HALF_GRAD_TOL, as_dtype, gradients, min_settled, requiring_grad,
                           settled_out_grad, torch_min_add_mul)
from test_half import assert_half_matches

pytestmark = pytest.mark.skipif(
    not TENSOR_CORES or torch.cuda.get_device_capability() < (9, 0),
    reason="v5 needs the wgmma engine and the copy engine's tensor maps (an sm_90 GPU)")

KERNEL = "row_ring_kernel"
MIN_ROWS_PER_CTA = 8  # conv_implicit_row_ring.cuh's kMinRowsPerCta
HALF = [torch.float16, torch.bfloat16]


def batch_for(out_h, extra=1):
    """A batch whose output rows reach v5's minimum on this GPU, plus `extra` images (so that
    CTAs' shares of the rows cross images at different places)."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    return -(-MIN_ROWS_PER_CTA * sms // out_h) + extra


def out_size(size, kernel, padding, dilation):
    return size + 2 * padding - dilation * (kernel - 1)


# (C, H, W), w_shape, padding (h, w), dilation (h, w)
CASES = [
    ((64, 16, 128), (128, 64, 3, 3), (0, 0), (1, 1)),   # P31's rows: 128 pixels, no padding
    ((64, 13, 120), (96, 64, 3, 3), (1, 4), (1, 1)),    # W + 2 pad = 128; 96 of 128 columns
    ((64, 3, 8), (128, 64, 3, 3), (0, 0), (1, 1)),      # one output row an image, W = 8
    ((64, 9, 40), (64, 64, 1, 1), (0, 0), (1, 1)),      # 1 x 1: two slots, 64-column tile
    ((64, 14, 40), (40, 64, 2, 2), (1, 0), (1, 1)),     # kernel_h 2, odd outputs (15 x 39)
    ((64, 11, 32), (64, 64, 3, 5), (2, 3), (1, 2)),     # 5 wide, dil_w 2: (5 - 1) 2 = 8 rows
]
IDS = ["p31-rows", "padded-full-row", "one-row-an-image", "1x1", "2x2-odd", "dilated-5-wide"]


def make(case, dtype):
    (c, h, w), w_shape, padding, dilation = case
    out_h = out_size(h, w_shape[2], padding[0], dilation[0])
    x = rand(batch_for(out_h), c, h, w, low=0.0, dtype=dtype)
    weight = (rand(*w_shape) / math.sqrt(math.prod(w_shape[1:]))).to(dtype)
    return x, weight, rand(w_shape[0], dtype=dtype)


def kernels_of(call):
    return list(launches(call))


@pytest.mark.parametrize("dtype", HALF, ids=["fp16", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_matches_torch_and_float64(dtype, case):
    _, _, padding, dilation = case
    x, w, b = make(case, dtype)
    ref = F.conv2d(x, w, b, 1, padding, dilation)
    ref64 = F.conv2d(x.double(), w.double(), b.double(), 1, padding, dilation)
    call = lambda: scratchops.conv2d(x, w, b, 1, padding, dilation)  # noqa: E731
    poison_next(*ref.shape, dtype=dtype)
    out = call()
    assert_half_matches(out, ref, ref64)
    kernels = kernels_of(call)
    assert any(KERNEL in k for k in kernels), kernels
    assert not any("channels_last" in k for k in kernels), kernels
    assert torch.equal(call(), out)  # the same bits again: no order depends on timing


@pytest.mark.parametrize("dtype", HALF, ids=["fp16", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_bit_for_bit_v4(dtype, case):
    """v5 multiplies the same k-blocks in the same order as v4 and stores through the same
    epilogue: the same bits, on the same values read from an input v5 cannot take (one element
    into its storage: v5's tensor map needs x's address on 16 bytes, so v4 runs)."""
    _, _, padding, dilation = case
    x, w, b = make(case, dtype)
    ours = lambda t: scratchops.conv2d(t, w, b, 1, padding, dilation)  # noqa: E731
    shifted = one_element_in(x)
    kernels = kernels_of(lambda: ours(shifted))
    assert not any(KERNEL in k for k in kernels) and any("staged_a" in k for k in kernels)
    assert any(KERNEL in k for k in kernels_of(lambda: ours(x)))
    assert torch.equal(ours(x), ours(shifted))


@pytest.mark.parametrize("dtype", HALF, ids=["fp16", "bf16"])
def test_p31_tail_nan_inf_and_gradients(dtype):
    """P31's one kernel on v5: NaN and Inf where torch puts them; under autograd (the forward
    then also keeps the min's gradient shares, a byte an output) every gradient within
    test_autograd's half rules of torch's and float64's, and bit for bit v4's."""
    x, w, cb = make(CASES[0], dtype)
    bias = rand(128, 1, 1, dtype=dtype)
    bad = x.clone()
    bad[1, 5, 7, 100] = float("nan")
    bad[0, 0, 0, 0] = float("inf")
    half = torch.tensor(0.5, dtype=dtype, device="cuda")
    ref = (torch.min(F.conv2d(bad, w, cb), half) + bias) * 2.0
    call = lambda: scratchops.conv2d_min_add_mul(bad, w, cb, 0.5, bias, 2.0)  # noqa: E731
    poison_next(*ref.shape, dtype=dtype)
    out = call()
    assert torch.equal(torch.isnan(out), torch.isnan(ref))
    torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2, equal_nan=True)
    assert any(KERNEL in k for k in kernels_of(call))

    ours = lambda *a: scratchops.conv2d_min_add_mul(a[0], a[1], a[2], 0.5, a[3], 2.0)  # noqa
    theirs = lambda *a: torch_min_add_mul(F.conv2d(a[0], a[1], a[2]), 0.5, a[3], 2.0)  # noqa
    args = requiring_grad((x, w, cb, bias))
    args64 = as_dtype(args, torch.float64)
    with torch.no_grad():
        keep = min_settled(F.conv2d(*args64[:3]), 0.5, torch.finfo(dtype).eps)
        out_grad = settled_out_grad(rand(*ref.shape, dtype=dtype), keep)
    mine = gradients(ours, args, out_grad)
    for o, r, r64 in zip(mine, gradients(theirs, args, out_grad),
                         gradients(theirs, args64, out_grad.double())):
        scale = r64.abs().max().item()
        err, err_torch = ((t.double() - r64).abs().max().item() for t in (o, r))
        assert err <= 4 * err_torch + 2 * HALF_GRAD_TOL * scale, (err, err_torch)
    v4_args = requiring_grad((one_element_in(x), w, cb, bias))
    for o, o4 in zip(mine, gradients(ours, v4_args, out_grad)):
        assert torch.equal(o, o4)


def test_few_rows_run_v4():
    """Below v5's output rows a multiprocessor, v4 (with its copy) runs, still right."""
    x, w, b = make(CASES[0], torch.bfloat16)
    x = x[:2]
    call = lambda: scratchops.conv2d(x, w, b)  # noqa: E731
    kernels = kernels_of(call)
    assert not any(KERNEL in k for k in kernels) and any("staged_a" in k for k in kernels)
    assert_half_matches(call(), F.conv2d(x, w, b), F.conv2d(x.double(), w.double(), b.double()))


@pytest.mark.parametrize("dtype", HALF, ids=["fp16", "bf16"])
def test_both_gradients_keep_dys_copy_for_the_weight_gradient(dtype):
    """conv2d's two gradients at once (_conv2d_grads) run the input gradient as a convolution of
    dy on v4 and hand the channels-last copy of dy that v4 made to the weight gradient. Where
    that convolution's shape is one v5 serves (here: dy 64 channels, 56 wide, enough rows), it
    must still run v4, or the weight gradient would read a copy never made: both gradients are
    the bits of the two operators run apart, and the weight gradient within the half rules of
    torch's and float64's."""
    batch = batch_for(56)
    x = rand(batch, 64, 56, 56, dtype=dtype)
    w = (rand(64, 64, 3, 3) / 24).to(dtype)
    dy = rand(batch, 64, 56, 56, dtype=dtype)
    window = ([1, 1], [1, 1], [1, 1])
    version = scratchops.versions.GEMM_TENSOR_CORE_VERSION
    budget = scratchops.versions.TENSOR_CORE_GRAD_WORKSPACE_BYTES
    ops = torch.ops.scratchops
    together = lambda: ops._conv2d_grads(dy, x, w, *window, budget, version)  # noqa: E731
    input_grad = lambda: ops._conv2d_input_grad(  # noqa: E731
        dy, w, list(x.shape), *window, budget, version)
    assert any(KERNEL in k for k in kernels_of(input_grad))  # (a shape v5 serves)
    assert not any(KERNEL in k for k in kernels_of(together))
    dx, dw = together()
    assert torch.equal(dx, input_grad())
    assert torch.equal(dw, ops._conv2d_weight_grad(dy, x, list(w.shape), *window, budget,
                                                   version))
    ref64 = torch.nn.grad.conv2d_weight(x.double(), w.shape, dy.double(), padding=1)
    assert_half_matches(dw, torch.nn.grad.conv2d_weight(x, w.shape, dy, padding=1), ref64)
