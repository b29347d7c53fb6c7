"""The fp32 input gradient v4 (cuda/conv_input_grad_swapped.cuh): 3xTF32 on the wgmma engine
with the GEMM's roles swapped, the flipped weights as M (split in registers), 128 pixels of a
dx row as N (dy made channels-last and split once into its two TF32 parts, staged by the copy
engine). It runs where swapped::applies holds (TF32 off, stride 1, dy's channels at least 32
and a multiple of 4, a kernel row's taps within 8 extra box rows, dx rows at least 64 wide)
and one image's parts fit the workspace; otherwise v2 runs.

The shapes reach each edge of it: dx rows shorter and longer than a tile (two column tiles),
dx channels past a 64-row tile (two row tiles, the second partial), dy's channels past a
32-channel block, 1 x 1, 3 x 5 and 5 x 5 kernels, padding, dilation 2 (its 8 extra rows),
batch 1, a single dx channel, and more tiles than the grid's consumers (each walks several,
its next tile's weights loaded during the last k-block of this one). Each against torch's fp32 input gradient and float64 (test_autograd's
rules), with the profiler naming the kernel that ran; chunks of images give the bits of one
chunk; non-finite values in dy and in the weights give the NaN and Inf that float64 does."""

import pytest
import torch

import scratchops
from helpers import HOPPER, launches, poison_next, rand
from test_autograd import assert_grad_matches

pytestmark = pytest.mark.skipif(
    not HOPPER, reason="v4 needs the wgmma engine and the copy engine's tensor maps (sm_90)")

KERNEL = "swapped_kernel"
BUDGET = scratchops.versions.TENSOR_CORE_GRAD_WORKSPACE_BYTES
VERSION = scratchops.versions.GEMM_TENSOR_CORE_VERSION

# x_shape (dx's), w_shape, padding, dilation
CASES = [
    ((2, 64, 20, 130), (128, 64, 3, 3), 1, 1),   # P31's channels; a row of two column tiles
    ((1, 3, 9, 70), (32, 3, 3, 3), 0, 1),        # batch 1, 3 channels; a row of 70 in a tile
    ((3, 70, 11, 64), (36, 70, 5, 5), 2, 2),     # 5 x 5 dilated (8 extra rows); 36 = 32 + 4
    ((2, 64, 5, 200), (64, 64, 1, 1), 0, 1),     # 1 x 1
    ((2, 130, 7, 67), (96, 130, 3, 3), 1, 1),    # three 64-row tiles, the last of 2 channels
    ((1, 1, 3, 129), (32, 1, 3, 3), 2, 1),       # one channel; the padding past the image
    ((4, 130, 40, 128), (64, 130, 3, 5), 1, 1),  # 480 tiles: consumers walk several, 3 x 5
]
IDS = ["p31-channels", "batch1-cin3", "5x5-dilated", "1x1", "cin130", "cin1", "many-tiles-3x5"]


def input_grad(dy, w, x_shape, padding, dilation, budget=BUDGET):
    return torch.ops.scratchops._conv2d_input_grad(
        dy, w, list(x_shape), [1, 1], [padding] * 2, [dilation] * 2, budget, VERSION)


def draw(x_shape, w_shape, padding, dilation):
    w = rand(*w_shape) / (w_shape[1] * w_shape[2] * w_shape[3]) ** 0.5
    x = rand(*x_shape)
    with torch.no_grad():
        dy = rand(*torch.nn.functional.conv2d(x, w, None, 1, padding, dilation).shape)
    return dy, w


@pytest.mark.parametrize("x_shape,w_shape,padding,dilation", CASES, ids=IDS)
def test_against_torch_and_float64(x_shape, w_shape, padding, dilation):
    dy, w = draw(x_shape, w_shape, padding, dilation)
    ref32 = torch.nn.grad.conv2d_input(x_shape, w, dy, 1, padding, dilation)
    ref64 = torch.nn.grad.conv2d_input(x_shape, w.double(), dy.double(), 1, padding, dilation)
    call = lambda: input_grad(dy, w, x_shape, padding, dilation)  # noqa: E731
    poison_next(*x_shape)
    out = call()
    assert_grad_matches(out, ref32, ref64, "dx")
    assert sum(n for name, n in launches(call).items() if KERNEL in name) == 1
    assert torch.equal(out, call()), "the same bits every run"


def test_v2_where_not_one_image_fits_and_chunks_give_one_chunks_bits():
    """A budget below one image's two parts runs v2 (no v4 kernel, the same accuracy); a budget
    of two images runs batch 5 as 2, 2 and 1, with the bits of the whole batch in one."""
    x_shape, w_shape = (5, 64, 9, 100), (64, 64, 3, 3)
    dy, w = draw(x_shape, w_shape, 1, 1)
    ref32 = torch.nn.grad.conv2d_input(x_shape, w, dy, 1, 1)
    ref64 = torch.nn.grad.conv2d_input(x_shape, w.double(), dy.double(), 1, 1)
    weights_bytes = 9 * 2 * 4 * 128 * 4 * 4  # (the packed weights: 18 k-blocks of 4 k-steps)
    two_images = weights_bytes + 2 * 2 * dy[0].numel() * 4
    runs = {}
    for name, budget, kernels in (("one-chunk", BUDGET, 1), ("chunks", two_images, 3),
                                  ("v2", 1, 0)):
        call = lambda budget=budget: input_grad(dy, w, x_shape, 1, 1, budget)  # noqa: E731
        poison_next(*x_shape)
        runs[name] = call()
        assert_grad_matches(runs[name], ref32, ref64, name)
        assert sum(n for k, n in launches(call).items() if KERNEL in k) == kernels, name
    assert torch.equal(runs["chunks"], runs["one-chunk"])


def test_inf_and_nan_as_float64():
    """Inf, -Inf, NaN and a finite value that rounds up to Inf as a TF32 in dy, an Inf weight
    and a weight that is a TF32 value exactly (its small part 0: see the file's top): NaN and
    +-Inf exactly where float64 has them, the finite values within 1e-5 of the largest.
    The reference is the product v2 and v4 compute: the flipped convolution of dy zero-padded,
    whose padded taps multiply 0 by the Inf weight (NaN, as the forward's padded product does).
    torch's own input gradient, a col2im of the weights times dy, leaves those taps out and is
    finite there (docs/notes.md, "The input gradient with the roles swapped")."""
    x_shape, w_shape = (2, 64, 12, 100), (64, 64, 3, 3)
    dy, w = draw(x_shape, w_shape, 1, 1)
    near_max = torch.tensor(0x7F7FF123, dtype=torch.int32).view(torch.float32).item()
    flat = dy.view(-1)
    flat[5], flat[flat.numel() // 5], flat[-3] = float("inf"), float("-inf"), float("nan")
    flat[flat.numel() // 2], flat[flat.numel() // 3] = near_max, -near_max
    w.view(-1)[w.numel() // 2], w.view(-1)[1] = float("inf"), 0.5
    flipped = w.double().flip(2, 3).transpose(0, 1)  # Wf[c][k][i][j] = W[k][c][2 - i][2 - j]
    padded = torch.nn.functional.pad(dy.double(), (1, 1, 1, 1))  # (dil (k - 1) - pad = 1)
    ref64 = torch.nn.functional.conv2d(padded, flipped)
    poison_next(*x_shape)
    out = input_grad(dy, w, x_shape, 1, 1)
    assert torch.equal(out.isnan(), ref64.isnan())
    assert torch.equal(out.isposinf(), ref64.isposinf())
    assert torch.equal(out.isneginf(), ref64.isneginf())
    finite = ref64.isfinite() & (ref64.abs() < 1e30)  # (away from the near-FLT_MAX values)
    scale = ref64[finite].abs().max().item()
    err = (out.double() - ref64)[finite].abs().max().item()
    assert err <= 1e-5 * scale, err
