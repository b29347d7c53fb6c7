"""The implicit-GEMM convolution's v4 (cuda/conv_implicit_staged_a.cuh): A staged in shared
memory by the copy engine from a channels-last copy of the input. It runs where
conv2d_implicit_stages_a holds: the wgmma engine, a single-product mode (TF32 under torch's
switch and the TF32 rule, fp16, bf16), stride 1, Cin of at least one 128-byte k-block (32 in
TF32, 64 in 16 bits) with a channel row a multiple of 16 bytes.

The shapes reach each edge of it: output rows shorter and longer than a tile, channels past the
last whole k-block (read as zeros), padding and dilation (taps outside the image), two column
tiles, batch 1, 1x1 and 5x5 kernels, P31's tail, and both tile sizes (128 pixels, or 64 where
that shortens the slowest consumer's walk enough: small_tiles), and odd rows in even planes
(a tile starting at an even pixel, its last pixel stored alone). The TF32 results are held to the
arithmetic v4 claims: operands rounded to the nearest TF32, products summed in fp32. Against
float64 on the rounded operands they are then within 2e-5 (the tensor cores' fp32 sums, a
truncation per k-step of 8 at most: 225 steps at K = 1800); an operand truncated instead of
rounded puts them about 1e-4 away even at K = 128. The profiler shows that v4 ran.

The input gradient of a 16-bit convolution is itself a convolution of dy, and runs on v4 too
(conv_backward.cu's input gradient v3); its weight gradient stages both of its operands, x and
dy, the same way (the weight gradient v3): the last tests."""

import math
import re

import pytest
import torch
import torch.nn.functional as F

import scratchops
from helpers import TENSOR_CORES, launches, poison_next, rand, tf32_nearest
from test_half import assert_half_matches

pytestmark = pytest.mark.skipif(
    not TENSOR_CORES or torch.cuda.get_device_capability() < (9, 0),
    reason="v4 needs the wgmma engine and the copy engine's tensor maps (an sm_90 GPU)")

KERNEL = "staged_a_kernel"

# x_shape, w_shape, padding, dilation
CASES = [
    ((1, 64, 9, 7), (16, 64, 3, 3), 0, 1),        # a row shorter than a tile
    ((2, 64, 20, 130), (128, 64, 3, 3), 1, 1),    # a row longer than a tile
    ((2, 72, 11, 13), (200, 72, 5, 5), 2, 1),     # channels past a whole block; 2 column tiles
    ((1, 128, 6, 200), (33, 128, 1, 1), 0, 1),    # 1x1
    ((3, 128, 5, 5), (128, 128, 3, 3), 1, 3),     # dilation: most taps outside the image
    ((8, 64, 34, 130), (96, 64, 3, 3), 0, 1),     # 128-pixel tiles (small_tiles says no)
    ((2, 64, 12, 67), (40, 64, 3, 3), 0, 1),      # odd rows (65 pixels) in even planes (650)
    ((1, 40, 17, 33), (70, 40, 3, 3), 2, 2),      # TF32 only (Cin < 64: half runs v2)
]
IDS = ["short-row", "long-row", "partial-block-2-tiles", "1x1", "dilated", "wide-tiles",
       "odd-rows-even-planes", "cin40"]


def kernels_ran(call):
    """The names of the CUDA kernels `call` launched."""
    return list(launches(call))


def ran_v4(call):
    """Whether `call` launched v4's kernel."""
    return any(KERNEL in name for name in kernels_ran(call))


def tile_pixels_ran(call):
    """The tile sizes (pixels of an output row) of the v4 kernels that `call` launched:
    staged_a_kernel<BN, MB, ...> tiles 64 MB pixels."""
    return {64 * int(m.group(1)) for name in launches(call)
            if (m := re.search(KERNEL + r"<\d+, (\d+),", name))}


@pytest.fixture
def tf32_allowed():
    before = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = True
    yield
    torch.backends.cudnn.allow_tf32 = before


@pytest.mark.parametrize("x_shape,w_shape,padding,dilation", CASES, ids=IDS)
def test_tf32_rounds_to_nearest_and_sums_in_fp32(tf32_allowed, x_shape, w_shape, padding,
                                                 dilation):
    x = rand(*x_shape, low=0.0)
    w = rand(*w_shape) / (w_shape[1] * w_shape[2] * w_shape[3]) ** 0.5
    b = rand(w_shape[0])
    ref64 = F.conv2d(tf32_nearest(x).double(), tf32_nearest(w).double(), b.double(), 1,
                     padding, dilation)
    poison_next(*ref64.shape)
    call = lambda: scratchops.conv2d(x, w, b, 1, padding, dilation)  # noqa: E731
    out = call()
    torch.testing.assert_close(out.double(), ref64, atol=2e-5, rtol=2e-5)
    assert ran_v4(call)
    # and torch's own result under the same switch (cuDNN's TF32) within KernelBench's 1e-4
    torch.testing.assert_close(out, F.conv2d(x, w, b, 1, padding, dilation), atol=1e-4,
                               rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("x_shape,w_shape,padding,dilation", CASES[:-1], ids=IDS[:-1])
def test_half(dtype, x_shape, w_shape, padding, dilation):
    x = rand(*x_shape, low=0.0, dtype=dtype)
    w = (rand(*w_shape) / (w_shape[1] * w_shape[2] * w_shape[3]) ** 0.5).to(dtype)
    b = rand(w_shape[0], dtype=dtype)
    ref = F.conv2d(x, w, b, 1, padding, dilation)
    ref64 = F.conv2d(x.double(), w.double(), b.double(), 1, padding, dilation)
    poison_next(*ref.shape, dtype=dtype)
    call = lambda: scratchops.conv2d(x, w, b, 1, padding, dilation)  # noqa: E731
    assert_half_matches(call(), ref, ref64)
    assert ran_v4(call)


@pytest.mark.parametrize("x_shape", [(2, 64, 21, 140), (8, 64, 34, 130)],
                         ids=["64-pixel-tiles", "128-pixel-tiles"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16],
                         ids=["tf32", "fp16", "bf16"])
def test_p31_tail_and_nan(tf32_allowed, dtype, x_shape):
    x = rand(*x_shape, low=0.0, dtype=dtype)
    w = (rand(72, 64, 3, 3) / 24).to(dtype)
    cb, bias = rand(72, dtype=dtype), rand(72, 1, 1, dtype=dtype)
    x[1, 5, 7, 100] = float("nan")
    x[0, 0, 0, 0] = float("inf")
    call = lambda: scratchops.conv2d_min_add_mul(x, w, cb, 0.5, bias, 2.0)  # noqa: E731
    half = torch.tensor(0.5, dtype=dtype, device="cuda")
    ref = (torch.min(F.conv2d(x, w, cb), half) + bias) * 2.0
    poison_next(*ref.shape, dtype=dtype)
    out = call()
    assert torch.equal(torch.isnan(out), torch.isnan(ref))
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out, ref, atol=tol, rtol=tol, equal_nan=True)
    assert ran_v4(call)


# v4's channels-last copy of the input: made by v4's own grid up to kChannelsLastInsideBytes
# (8 MB: conv_implicit_staged_a_launch.cuh), by the copy kernel first above it; the same arithmetic either way.
# And an input whose data starts off a 16-byte boundary (a contiguous view one element into its
# storage), which the copy must read element by element, never as misaligned 16-byte vectors.
@pytest.mark.parametrize("x_shape,copy_kernel", [((1, 64, 40, 40), False),
                                                 ((3, 64, 128, 128), True)],
                         ids=["copy-by-the-grid", "copy-by-its-kernel"])
@pytest.mark.parametrize("offset", [0, 1], ids=["aligned", "one-element-in"])
def test_channels_last_copy_by_the_grid_or_its_kernel(tf32_allowed, x_shape, copy_kernel, offset):
    x = rand(math.prod(x_shape) + offset, low=0.0)[offset:].view(x_shape)
    w, b = rand(40, 64, 3, 3) / 24, rand(40)
    ref64 = F.conv2d(tf32_nearest(x).double(), tf32_nearest(w).double(), b.double(), 1, 1)
    call = lambda: scratchops.conv2d(x, w, b, 1, 1)  # noqa: E731
    poison_next(*ref64.shape)
    torch.testing.assert_close(call().double(), ref64, atol=2e-5, rtol=2e-5)
    kernels = kernels_ran(call)
    assert any(KERNEL in name for name in kernels)
    assert any("channels_last_kernel" in name for name in kernels) == copy_kernel, kernels


def expected_tile_pixels(x_shape, w_shape, padding, dilation):
    """The tile small_tiles (conv_implicit_staged_a_launch.cuh) picks on this GPU, worked out
    here as an oracle: 64 pixels where the slowest consumer's walk is at least a quarter
    shorter in 64-pixel tiles than in 128-pixel ones."""
    n, _, h, w = x_shape
    cout, _, kh, kw = w_shape
    out_h = h + 2 * padding - dilation * (kh - 1)
    out_w = w + 2 * padding - dilation * (kw - 1)
    slots = 2 * torch.cuda.get_device_properties(0).multi_processor_count
    n_tiles = -(-cout // (64 if cout <= 64 else 128))

    def slowest_walk(pixels):
        tiles = n * out_h * -(-out_w // pixels) * n_tiles
        return -(-tiles // slots) * pixels
    return 64 if 4 * slowest_walk(64) <= 3 * slowest_walk(128) else 128


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["tf32", "bf16"])
def test_tile_size_fills_the_gpu(tf32_allowed, dtype):
    """The tile small_tiles picks, on the wide-tiles case (128 pixels on a GPU of 132
    multiprocessors: 256 tiles of 128, 512 of 64, the slowest walk 128 pixels either way) and
    the long-row case (64: 80 tiles of 128 or 120 of 64, one each)."""
    for case in (CASES[IDS.index("wide-tiles")], CASES[IDS.index("long-row")]):
        x_shape, w_shape, padding, dilation = case
        x = rand(*x_shape, low=0.0, dtype=dtype)
        w = (rand(*w_shape) / 24).to(dtype)
        call = lambda: scratchops.conv2d(x, w, None, 1, padding, dilation)  # noqa: E731
        assert tile_pixels_ran(call) == {expected_tile_pixels(*case)}


def test_not_staged_where_the_rule_says_no(tf32_allowed):
    """Stride 2, and fp32 with TF32 off (3xTF32), run the other versions, still right."""
    x, w = rand(1, 64, 20, 20, low=0.0), rand(16, 64, 3, 3) / 24
    strided = lambda: scratchops.conv2d(x, w, None, 2)  # noqa: E731
    assert not ran_v4(strided)
    torch.testing.assert_close(strided(), F.conv2d(x, w, None, 2), atol=1e-4, rtol=1e-4)
    torch.backends.cudnn.allow_tf32 = False
    assert not ran_v4(lambda: scratchops.conv2d(x, w))


def v4_launches(call):
    """How many of v4's kernels `call` launched."""
    return sum(n for name, n in launches(call).items() if KERNEL in name)


# x_shape, w_shape, padding, dilation of a convolution whose input gradient runs on v4 in 16 bits
# (conv_backward.cu's input gradient v3: a convolution of dy, its channels the reduction)
INPUT_GRAD_CASES = [
    ((5, 16, 40, 150), (64, 16, 3, 3), 0, 1),   # dx rows of 150: two tiles, the second partial
    ((3, 8, 17, 33), (136, 8, 3, 3), 1, 2),     # dy's channels past a whole block; dilated
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("x_shape,w_shape,padding,dilation", INPUT_GRAD_CASES,
                         ids=["two-tiles-a-row", "partial-block-dilated"])
def test_half_input_gradient_stages_dy(dtype, x_shape, w_shape, padding, dilation):
    """The input gradient in 16 bits with dy staged channels-last: the batch in one chunk
    where the workspace holds dy's copy, in chunks of two images where it holds two (the
    first case: the fixed part, Wf and its packing, is under 1 MB and an image of dy is
    720 KB), and v2 (no v4 kernel) where it holds not one image. Each against torch's input
    gradient in the dtype and float64; the chunks give the bits of one chunk."""
    x = rand(*x_shape, dtype=dtype)
    w = (rand(*w_shape) / math.prod(w_shape[1:]) ** 0.5).to(dtype)
    with torch.no_grad():
        dy = rand(*F.conv2d(x, w, None, 1, padding, dilation).shape, dtype=dtype)
    ref = torch.nn.grad.conv2d_input(x_shape, w, dy, 1, padding, dilation)
    ref64 = torch.nn.grad.conv2d_input(x_shape, w.double(), dy.double(), 1, padding, dilation)
    per_image = dy[0].numel() * dy.element_size()
    budgets = {"one-chunk": (scratchops.versions.TENSOR_CORE_GRAD_WORKSPACE_BYTES, 1),
               "not-staged": (1, 0)}
    if x_shape[0] == 5:
        budgets["chunks"] = (2**20 + 2 * per_image, 3)  # images 2, 2 and 1
    outs = {}
    for name, (budget, launches) in budgets.items():
        call = lambda budget=budget: torch.ops.scratchops._conv2d_input_grad(  # noqa: E731
            dy, w, list(x_shape), [1, 1], [padding] * 2, [dilation] * 2, budget,
            scratchops.versions.GEMM_TENSOR_CORE_VERSION)
        poison_next(*x_shape, dtype=dtype)
        outs[name] = call()
        assert_half_matches(outs[name], ref, ref64)
        assert v4_launches(call) == launches, name
    if "chunks" in outs:
        assert torch.equal(outs["chunks"], outs["one-chunk"])


# x_shape, w_shape, padding, dilation of a convolution whose weight gradient runs on v3 in 16 bits
# (conv_backward.cu's weight gradient v3: x and dy both staged channels-last, MN-major operands)
WEIGHT_GRAD_CASES = [
    ((2, 64, 20, 130), (128, 64, 3, 3), 0, 1),   # P31's channels; rows of 128: two whole blocks
    ((3, 96, 17, 70), (72, 96, 3, 3), 1, 2),     # channels past a block on both sides; dilated
    ((3, 64, 96, 200), (64, 64, 1, 1), 0, 1),    # 1x1, Cout 64 (dy's second box all outside)
    ((2, 128, 9, 33), (136, 128, 3, 2), 1, 1),   # a 3 x 2 kernel; two output-channel tiles
    ((1, 64, 7, 9), (128, 64, 3, 3), 0, 1),      # batch 1, a 7-pixel row in a 64-pixel block
    ((2, 64, 12, 40), (96, 64, 2, 2), 1, 3),     # a 2 x 2 kernel, dilation 3
]
WEIGHT_GRAD_KERNEL = "staged_wgrad_kernel"


def weight_grad_launches(call):
    """How many of the weight gradient v3's kernels `call` launched."""
    return sum(n for name, n in launches(call).items() if WEIGHT_GRAD_KERNEL in name)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("x_shape,w_shape,padding,dilation", WEIGHT_GRAD_CASES,
                         ids=["p31-channels", "partial-blocks-dilated", "1x1-cout64", "3x2",
                              "batch1-short-row", "2x2-dilated"])
def test_half_weight_gradient_stages_both_operands(dtype, x_shape, w_shape, padding, dilation):
    """The weight gradient in 16 bits with x and dy staged channels-last (v3): against torch's
    weight gradient in the dtype and float64, poisoned output, the same bits twice, one launch;
    and for the 1x1 case in chunks of two images (two launches): an image's two copies take
    4.9 MB and its slices' partials 96 KB (6 of 64 x 64 floats), the accumulator and the flags
    17 KB, so two images and 1 MB hold two and not three (and more than v2's smallest
    workspace, about 3 MB, which v3 would otherwise take instead)."""
    x = rand(*x_shape, dtype=dtype)
    with torch.no_grad():
        out_shape = F.conv2d(x, torch.zeros(w_shape, device="cuda", dtype=dtype), None, 1,
                             padding, dilation).shape
    dy = rand(*out_shape, dtype=dtype)
    ref = torch.nn.grad.conv2d_weight(x, w_shape, dy, 1, padding, dilation)
    ref64 = torch.nn.grad.conv2d_weight(x.double(), w_shape, dy.double(), 1, padding, dilation)
    per_image = (x[0].numel() + dy[0].numel()) * x.element_size()
    budgets = {"one-chunk": (scratchops.versions.TENSOR_CORE_GRAD_WORKSPACE_BYTES, 1)}
    if w_shape[2:] == (1, 1):
        budgets["chunks"] = (2 * per_image + 2**20, 2)
    for name, (budget, expected_launches) in budgets.items():
        call = lambda budget=budget: torch.ops.scratchops._conv2d_weight_grad(  # noqa: E731
            dy, x, list(w_shape), [1, 1], [padding] * 2, [dilation] * 2, budget,
            scratchops.versions.GEMM_TENSOR_CORE_VERSION)
        poison_next(*w_shape, dtype=dtype)
        out = call()
        assert_half_matches(out, ref, ref64)
        assert torch.equal(call(), out), name
        assert weight_grad_launches(call) == expected_launches, name


def test_half_weight_gradient_v3_over_the_copy_grid_limit():
    """More images than the channels-last copy's grid takes at once (65,535): chunks of at
    most that many (two launches), not an error."""
    x = rand(70_000, 64, 1, 1, dtype=torch.bfloat16)
    dy = rand(70_000, 64, 1, 1, dtype=torch.bfloat16)
    call = lambda: torch.ops.scratchops._conv2d_weight_grad(  # noqa: E731
        dy, x, [64, 64, 1, 1], [1, 1], [0, 0], [1, 1],
        scratchops.versions.TENSOR_CORE_GRAD_WORKSPACE_BYTES,
        scratchops.versions.GEMM_TENSOR_CORE_VERSION)
    ref = torch.nn.grad.conv2d_weight(x, (64, 64, 1, 1), dy)
    ref64 = torch.nn.grad.conv2d_weight(x.double(), (64, 64, 1, 1), dy.double())
    assert_half_matches(call(), ref, ref64)
    assert weight_grad_launches(call) == 2


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("x_shape,w_shape,stride,padding", [
    ((2, 64, 20, 130), (128, 64, 3, 3), 2, 0),   # strided
    ((2, 64, 20, 40), (128, 64, 5, 5), 1, 2),    # 5 taps a kernel row
    ((2, 40, 20, 40), (128, 40, 3, 3), 1, 1),    # 40 input channels: less than a block
    ((1, 64, 3, 1), (64, 64, 3, 3), 1, 1),       # one output column: tap 0 cut to no column
], ids=["strided", "5x5", "cin40", "wide-padding"])
def test_half_weight_gradient_v2_where_v3_does_not_apply(dtype, x_shape, w_shape, stride,
                                                         padding):
    """Where the weight gradient v3's rule says no, v2 runs (no v3 kernel) and is right."""
    x = rand(*x_shape, dtype=dtype)
    with torch.no_grad():
        out_shape = F.conv2d(x, torch.zeros(w_shape, device="cuda", dtype=dtype), None, stride,
                             padding).shape
    dy = rand(*out_shape, dtype=dtype)
    call = lambda: torch.ops.scratchops._conv2d_weight_grad(  # noqa: E731
        dy, x, list(w_shape), [stride] * 2, [padding] * 2, [1, 1],
        scratchops.versions.TENSOR_CORE_GRAD_WORKSPACE_BYTES,
        scratchops.versions.GEMM_TENSOR_CORE_VERSION)
    ref = torch.nn.grad.conv2d_weight(x, w_shape, dy, stride, padding)
    ref64 = torch.nn.grad.conv2d_weight(x.double(), w_shape, dy.double(), stride, padding)
    assert_half_matches(call(), ref, ref64)
    assert weight_grad_launches(call) == 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("inf_column", [10, 19], ids=["inside", "edge"])
def test_half_weight_gradient_v3_nan_and_inf(dtype, inf_column):
    """A NaN in dy and an Inf in x reach the weight gradient as they reach float64's: every tap
    of the NaN's output channel, and the Inf's input channel at the taps that read it. Rows of
    18 output pixels leave 46 slots of a 64-pixel block past the row; x's last two columns are
    real for the kernel's right taps and slots past the row for the others, which then must
    not multiply them ("edge": the partial blocks split a stage a tap)."""
    x = rand(2, 64, 12, 20, dtype=dtype)
    w_shape = (128, 64, 3, 3)
    dy = rand(2, 128, 10, 18, dtype=dtype)
    dy[1, 5, 4, 7] = float("nan")
    x[1, 20, 3, inf_column] = float("inf")
    ours = torch.ops.scratchops._conv2d_weight_grad(
        dy, x, list(w_shape), [1, 1], [0, 0], [1, 1],
        scratchops.versions.TENSOR_CORE_GRAD_WORKSPACE_BYTES,
        scratchops.versions.GEMM_TENSOR_CORE_VERSION)
    ref = torch.nn.grad.conv2d_weight(x, w_shape, dy)
    ref64 = torch.nn.grad.conv2d_weight(x.double(), w_shape, dy.double())
    assert ref64.isnan().any() and ref64.isinf().any()
    assert torch.equal(ours.isnan(), ref64.isnan())
    assert torch.equal(ours.isinf(), ref64.isinf())
    finite = ref64.isfinite()
    torch.testing.assert_close(ours[finite].float(), ref[finite].float(), atol=1e-2, rtol=2e-2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_half_gradients_together_make_dy_channels_last_once(dtype):
    """_conv2d_grads (both gradients at once, what conv2d's backward calls when it wants both)
    gives the bits of the two operators apart, and where the input gradient v3 and the weight
    gradient v3 each take the whole batch within the budget, makes dy's channels-last copy
    once: one copy kernel fewer than the two apart. With a budget too small for either (1
    byte), it runs them apart: the same copies."""
    x = rand(3, 64, 40, 150, dtype=dtype)
    w = (rand(128, 64, 3, 3) / 24).to(dtype)
    dy = rand(3, 128, 38, 148, dtype=dtype)
    tail = ([1, 1], [0, 0], [1, 1])
    version = scratchops.versions.GEMM_TENSOR_CORE_VERSION

    def together(budget):
        return torch.ops.scratchops._conv2d_grads(dy, x, w, *tail, budget, version)

    def apart(budget):
        return (torch.ops.scratchops._conv2d_input_grad(dy, w, list(x.shape), *tail, budget,
                                                        version),
                torch.ops.scratchops._conv2d_weight_grad(dy, x, list(w.shape), *tail, budget,
                                                         version))

    def copies(call):
        return sum(n for name, n in launches(call).items() if "channels_last_kernel" in name)

    for budget, fewer in ((scratchops.versions.TENSOR_CORE_GRAD_WORKSPACE_BYTES, 1), (1, 0)):
        both, alone = together(budget), apart(budget)
        assert torch.equal(both[0], alone[0]) and torch.equal(both[1], alone[1]), budget
        assert copies(lambda: together(budget)) == copies(lambda: apart(budget)) - fewer, budget
    ref64 = torch.nn.grad.conv2d_weight(x.double(), w.shape, dy.double())
    assert_half_matches(both[1], torch.nn.grad.conv2d_weight(x, w.shape, dy), ref64)
