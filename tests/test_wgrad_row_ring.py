"""The convolution's weight gradient v4 (cuda/conv_weight_grad_row_ring.cuh): the fp32 weight
gradient on the wgmma engine with A's rows read from a ring of input rows that each consumer
warpgroup loads and splits once, in shared memory, instead of gathered and split by every
thread for every tap.

It serves float (3xTF32, and TF32 where torch allows it) with stride 1 and output rows of whole
k-blocks: out_w rounded up to 8 a multiple of 32 (applies()). The shapes below reach each edge
of it: rows of 32, 64, 96 and 128 slots, slices that cross images and a last slice cut short,
padding on both sides, dilation (a window of 5 input rows), 1 x 1 and 5 x 5 kernels, one input
channel, batch 1, a tile whose second warpgroup has no taps (it multiplies nothing), more than
128 output channels (two column tiles), and Inf / NaN in x (the k-blocks' second form). Each is
held to torch's gradient and a float64 reference, with dW poisoned first; the profiler shows
that v4 ran; two calls give the same bits."""

import math

import pytest
import torch

import scratchops
from helpers import TENSOR_CORES, launches, poison_next, rand
from test_autograd import assert_grad_matches

pytestmark = pytest.mark.skipif(
    not TENSOR_CORES or torch.cuda.get_device_capability() < (9, 0),
    reason="v4 runs on the wgmma engine (an sm_90 GPU)")

KERNEL = "wgrad_ring_kernel"
VERSION = scratchops.versions.GEMM_TENSOR_CORE_VERSION
BUDGET = scratchops.versions.TENSOR_CORE_GRAD_WORKSPACE_BYTES

# x's shape, w's shape, padding, dilation
CASES = [
    ((2, 3, 30, 34), (5, 3, 3, 3), (0, 0), (1, 1)),        # 32-slot rows, 2 images a slice
    ((3, 64, 20, 66), (128, 64, 3, 3), (0, 0), (1, 1)),    # 64 slots; 5 tiles, the last half
    ((4, 20, 13, 96), (40, 20, 3, 3), (1, 1), (1, 1)),     # padded, 96 slots; 180 taps
    ((1, 1, 9, 130), (1, 1, 3, 3), (0, 0), (1, 1)),        # one channel, one image, 128 slots
    ((2, 6, 17, 64), (7, 6, 3, 3), (2, 1), (2, 1)),        # dil_h 2: a window of 5 rows
    ((3, 4, 12, 64), (9, 4, 5, 5), (2, 2), (1, 1)),        # 5 x 5, 64 slots
    ((2, 40, 7, 32), (16, 40, 1, 1), (0, 0), (1, 1)),      # 1 x 1: 64 channels a warpgroup
    ((2, 8, 11, 62), (200, 8, 3, 3), (0, 1), (1, 2)),      # 200 columns; dil_w 2, 62 slots
]
IDS = ["rows-32", "p31-channels", "padded-96", "one-channel", "dilated-h", "5x5", "1x1",
       "two-column-tiles"]


def weight_grad(dy, x, w_shape, padding, dilation):
    poison_next(*w_shape)
    return torch.ops.scratchops._conv2d_weight_grad(dy, x, list(w_shape), [1, 1], list(padding),
                                                    list(dilation), BUDGET, VERSION)


def make(case):
    x_shape, w_shape, padding, dilation = case
    x = rand(*x_shape)
    out_h = x_shape[2] + 2 * padding[0] - dilation[0] * (w_shape[2] - 1)
    out_w = x_shape[3] + 2 * padding[1] - dilation[1] * (w_shape[3] - 1)
    assert math.ceil(out_w / 8) * 8 % 32 == 0, "a shape v4 takes: rows of whole k-blocks"
    return x, rand(x_shape[0], w_shape[0], out_h, out_w)


def torch_weight_grad(x, w_shape, dy, padding, dilation):
    return torch.nn.grad.conv2d_weight(x, w_shape, dy, 1, padding, dilation)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_matches_torch_and_float64(case):
    _, w_shape, padding, dilation = case
    x, dy = make(case)
    counts = launches(lambda: weight_grad(dy, x, w_shape, padding, dilation))
    assert any(KERNEL in name for name in counts), sorted(counts)
    ours = weight_grad(dy, x, w_shape, padding, dilation)
    ref = torch_weight_grad(x, w_shape, dy, padding, dilation)
    ref64 = torch_weight_grad(x.double(), w_shape, dy.double(), padding, dilation)
    assert_grad_matches(ours, ref, ref64, "dweight")
    assert torch.equal(ours, weight_grad(dy, x, w_shape, padding, dilation))  # the same bits


@pytest.mark.parametrize("case", [CASES[1], CASES[2]], ids=[IDS[1], IDS[2]])
def test_tf32_where_torch_allows_it(case):
    # The TF32 mode (one product, x rounded to nearest when stored): within TF32's error of
    # torch's own gradient under the same switch.
    _, w_shape, padding, dilation = case
    x, dy = make(case)
    before = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = True
    try:
        counts = launches(lambda: weight_grad(dy, x, w_shape, padding, dilation))
        ours = weight_grad(dy, x, w_shape, padding, dilation)
        theirs = torch_weight_grad(x, w_shape, dy, padding, dilation)
    finally:
        torch.backends.cudnn.allow_tf32 = before
    assert any(KERNEL in name for name in counts), sorted(counts)
    exact = torch_weight_grad(x.double(), w_shape, dy.double(), padding, dilation)
    scale = exact.abs().max().item()
    torch.testing.assert_close(ours, theirs, atol=4e-3 * scale, rtol=0)
    assert (ours.double() - exact).abs().max().item() > 3e-5 * scale  # (TF32, not 3xTF32)


@pytest.mark.parametrize("tf32", [False, True], ids=["3xtf32", "tf32"])
@pytest.mark.parametrize("case", [CASES[7], CASES[2]], ids=[IDS[7], IDS[2]])
def test_inf_and_nan_in_x_follow_torch(case, tf32):
    # Inf and NaN in x (and in dy): the rows that hold them take the k-blocks' second form (cross
    # parts made, padding slots zeroed). In the first shape (60 pixels in 64 slots, pad_w 1,
    # dil_w 2) x's last column is read by slot 58 through tap j = 2 and by the padding slots 60
    # and 62 through j = 1 and 0, where dy is 0: its Inf must reach the first taps' dW alone.
    # dW's NaN and Inf where float64's are (torch's fp32 gradient gave a NaN for an Inf there:
    # its algorithm's own), the finite values as close to torch's as the finite case's.
    x_shape, w_shape, padding, dilation = case
    x, dy = make(case)
    x[0, 0, 1, 2] = math.inf
    x[-1, -1, -2, -1] = -math.inf
    x[0, -1, x_shape[2] // 2, x_shape[3] // 2] = math.nan
    dy[0, 0, 0, 3] = math.inf
    before = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = tf32
    try:
        ours = weight_grad(dy, x, w_shape, padding, dilation)
        ref = torch_weight_grad(x, w_shape, dy, padding, dilation)
    finally:
        torch.backends.cudnn.allow_tf32 = before
    ref64 = torch_weight_grad(x.double(), w_shape, dy.double(), padding, dilation)
    assert torch.equal(ours.isnan(), ref64.isnan())
    assert torch.equal(ours.isinf(), ref64.isinf())
    assert torch.equal(ours[ours.isinf()].double(), ref64[ref64.isinf()])
    assert ours.isnan().any() and ours.isinf().any() and ours.isfinite().any()
    finite = ours.isfinite() & ref.isfinite()
    scale = ref[finite].abs().max().item()
    torch.testing.assert_close(ours[finite], ref[finite], rtol=0,
                               atol=(4e-3 if tf32 else 1e-4) * scale)
