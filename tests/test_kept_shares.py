"""P31's backward from what its forward kept: scratchops.conv2d_min_add_mul, when a gradient
is wanted, runs the keeping operator torch.ops.scratchops._conv2d_min_add_mul_keeping, whose
store also writes each output's share of the min's gradient (a byte, in halves); the backward
reads those bytes instead of computing the convolution again. Held here to the operator that
keeps nothing (its backward recomputes the convolution): the same output, shares equal to the
min's rule applied to the convolution's own output, and bitwise the same gradients (but the
two bias sums of the four-at-once forms, added in their channels-last pass's order)."""

import pytest
import torch

import scratchops
from helpers import ENGINES, HOPPER, NO_TENSOR_CORES_REASON, launches, rand, skip_unless_runnable
from scratchops.versions import (CONV2D_ALGORITHMS, DEFAULT_CONV_WORKSPACE_BYTES,
                                 DEFAULT_IM2COL_GEMM_VERSION, TENSOR_CORE_GRAD_WORKSPACE_BYTES)

OPS = torch.ops.scratchops
# (x shape, weight shape, padding): channels not a multiple of any tile, batch 1 with a single
# input channel, odd sizes, and two shapes with 64 input channels, which v4 (A staged by the
# copy engine) takes in its single-product modes (TF32 and the half types): 130 output
# channels (a second column tile 2 wide) and 70 (one tile, partly past the last channel).
SHAPES = [((2, 5, 9, 8), (70, 5, 3, 3), 1), ((1, 1, 7, 5), (3, 1, 3, 3), 0),
          ((3, 64, 12, 11), (130, 64, 3, 3), 1), ((2, 64, 17, 19), (70, 64, 3, 3), 0)]
# (dtype, TF32 allowed): fp32 fp32-accurate, fp32 under torch's TF32 switch, the half types.
MODES = [(torch.float32, False), (torch.float32, True),
         (torch.float16, False), (torch.bfloat16, False)]


def _inputs(x_shape, w_shape, dtype, kind):
    """x, weight, conv_bias, bias. "ties": small integers, so that the convolution is exact in
    every mode and many outputs equal the constant 1; "random": uniform values and a NaN."""
    if kind == "ties":
        def ints(*shape, low=-2, high=3):
            return torch.randint(low, high, shape, device="cuda").to(dtype)
        return ints(*x_shape), ints(*w_shape, low=-1, high=2), ints(w_shape[0]), ints(w_shape[0])
    x = rand(*x_shape, dtype=dtype)
    x.view(-1)[x.numel() // 3] = float("nan")
    return x, rand(*w_shape, dtype=dtype), rand(w_shape[0], dtype=dtype), rand(w_shape[0],
                                                                                dtype=dtype)


def _tf32(on):
    torch.backends.cudnn.allow_tf32 = on
    torch.backends.cuda.matmul.allow_tf32 = on


@pytest.fixture(params=MODES, ids=lambda m: f"{str(m[0])[6:]}{'-tf32' if m[1] else ''}")
def mode(request):
    dtype, tf32 = request.param
    _tf32(tf32)
    yield dtype
    _tf32(False)


@pytest.mark.parametrize("kind", ["ties", "random"])
@pytest.mark.parametrize("x_shape,w_shape,padding", SHAPES)
@pytest.mark.parametrize("engine", ENGINES or ["none"])
def test_kept_shares_are_the_min_rule_of_the_convolution(engine, x_shape, w_shape, padding,
                                                         kind, mode):
    skip_unless_runnable("cuda", operator="conv2d_min_add_mul")
    if engine == "none":
        pytest.skip(NO_TENSOR_CORES_REASON)
    constant = 1.0 if kind == "ties" else 0.25
    x, w, cb, b = _inputs(x_shape, w_shape, mode, kind)
    window = ([1, 1], [padding, padding], [1, 1])
    with scratchops.tensor_core_path(engine):
        conv = OPS.conv2d(x, w, cb, *window, CONV2D_ALGORITHMS["implicit_gemm"],
                          DEFAULT_CONV_WORKSPACE_BYTES, DEFAULT_IM2COL_GEMM_VERSION)
        # A block of 255s where the shares will be, so that a byte the store skips shows: in a
        # pool of its own, a block for the output, then the 255s, both freed; the operator
        # allocates its output, then the shares, in the same order.
        pool = torch.cuda.MemPool()
        with torch.cuda.use_mem_pool(pool):
            first = torch.empty(conv.shape, dtype=mode, device="cuda")
            poison = torch.full(conv.shape, 255, dtype=torch.uint8, device="cuda")
            poisoned = poison.data_ptr()
            del first, poison
            out, halves = OPS._conv2d_min_add_mul_keeping(x, w, cb, *window, constant, b, 2.0)
        assert halves.data_ptr() == poisoned
        plain = OPS.conv2d_min_add_mul(x, w, cb, *window, constant, b, 2.0)
    assert torch.equal(out.nan_to_num(7.0), plain.nan_to_num(7.0))
    limit = torch.tensor(constant, dtype=mode).item()  # (the forward compares in the dtype)
    expected = torch.where(conv > limit, 0, torch.where(conv == limit, 1, 2)).to(torch.uint8)
    assert halves.dtype == torch.uint8 and halves.shape == conv.shape
    assert torch.equal(halves, expected)
    if kind == "ties":
        assert (halves == 1).any() and (halves == 0).any() and (halves == 2).any()


@pytest.mark.parametrize("x_shape,w_shape,padding", SHAPES)
def test_gradients_from_kept_shares_equal_those_recomputed(x_shape, w_shape, padding, mode):
    skip_unless_runnable("cuda", operator="conv2d_min_add_mul")
    leaves = [t.requires_grad_() for t in _inputs(x_shape, w_shape, mode, "ties")]
    dy = rand(x_shape[0], w_shape[0], x_shape[2] - 2 + 2 * padding,
              x_shape[3] - 2 + 2 * padding, dtype=mode)
    kept = scratchops.conv2d_min_add_mul(leaves[0], leaves[1], leaves[2], 1.0, leaves[3], 2.0,
                                         padding=padding)
    assert "_conv2d_min_add_mul_keeping" in type(kept.grad_fn).__name__
    recomputed = OPS.conv2d_min_add_mul(leaves[0], leaves[1], leaves[2], [1, 1],
                                        [padding, padding], [1, 1], 1.0, leaves[3], 2.0)
    assert "_conv2d_min_add_mul_keeping" not in type(recomputed.grad_fn).__name__
    assert torch.equal(kept, recomputed)
    for a, b in zip(torch.autograd.grad(kept, leaves, dy),
                    torch.autograd.grad(recomputed, leaves, dy)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("wanted", ["bias", "input", "weight and bias"])
def test_some_gradients_without_a_conv_bias(wanted):
    # No conv bias, and only some inputs wanting a gradient: the same gradients either way.
    skip_unless_runnable("cuda", operator="conv2d_min_add_mul")
    x, w, _, b = _inputs((2, 5, 9, 8), (70, 5, 3, 3), torch.float32, "ties")
    leaves = [t.requires_grad_() for t, name in ((x, "input"), (w, "weight"), (b, "bias"))
              if name in wanted]
    dy = rand(2, 70, 7, 6)
    kept = scratchops.conv2d_min_add_mul(x, w, None, 1.0, b, 2.0)
    recomputed = OPS.conv2d_min_add_mul(x, w, None, [1, 1], [0, 0], [1, 1], 1.0, b, 2.0)
    for a, b in zip(torch.autograd.grad(kept, leaves, dy),
                    torch.autograd.grad(recomputed, leaves, dy)):
        assert torch.equal(a, b)


def test_an_empty_batch_keeps_nothing_and_gets_zero_bias_gradients():
    skip_unless_runnable("cuda", operator="conv2d_min_add_mul")
    x, w, cb, b = (rand(0, 3, 6, 5), rand(4, 3, 3, 3), rand(4), rand(4))
    leaves = [t.requires_grad_() for t in (x, w, cb, b)]
    y = scratchops.conv2d_min_add_mul(x, w, cb, 0.25, b, 2.0)
    assert y.shape == (0, 4, 4, 3)
    grads = torch.autograd.grad(y, leaves, torch.ones_like(y))
    assert grads[0].shape == x.shape
    for g in grads[1:]:
        assert torch.equal(g, torch.zeros_like(g))


def test_only_a_wanted_gradient_outside_autocast_keeps():
    skip_unless_runnable("cuda", operator="conv2d_min_add_mul")
    x, w, cb, b = (rand(1, 3, 6, 5), rand(4, 3, 3, 3).requires_grad_(), rand(4), rand(4))

    def grad_fn_name():
        y = scratchops.conv2d_min_add_mul(x, w, cb, 0.25, b, 2.0)
        return type(y.grad_fn).__name__ if y.grad_fn is not None else None

    assert "_conv2d_min_add_mul_keeping" in grad_fn_name()
    with torch.no_grad():
        assert grad_fn_name() is None
    with torch.autocast("cuda", torch.bfloat16):  # (the chain of its parts: min_add_mul last)
        assert "min_add_mul" in grad_fn_name() and "keeping" not in grad_fn_name()


def test_keeping_operator_passes_opcheck():
    skip_unless_runnable("cuda", operator="conv2d_min_add_mul")
    scratchops.load()
    args = (rand(2, 5, 9, 8), rand(70, 5, 3, 3), rand(70), [1, 1], [1, 1], [1, 1], 0.25,
            rand(70), 2.0)
    torch.library.opcheck(OPS._conv2d_min_add_mul_keeping.default, args)
    torch.library.opcheck(OPS._conv2d_min_add_mul_keeping.default,
                          tuple(a.requires_grad_() if isinstance(a, torch.Tensor) else a
                                for a in args))


def test_kept_backward_refuses_shares_that_do_not_fit():
    skip_unless_runnable("cuda")
    scratchops.load()
    grad = rand(2, 3, 4, 4)
    for halves in (torch.ones(2, 3, 4, 4, device="cuda"),  # not bytes
                   torch.ones(2, 3, 4, 5, dtype=torch.uint8, device="cuda")):  # not grad's shape
        with pytest.raises(ValueError, match="halves must be"):
            OPS._min_add_mul_backward_kept(grad, halves, 2.0)


# (x shape, weight shape, padding) where conv2d's two gradients share dy's channels-last copy
# in the half types (the wgmma engine, 64 or more channels on both sides in rows of whole 16
# bytes, stride 1): 72 output channels (a block of 64 and 8 past it) on 460 output pixels
# (whole quads of 4: the rule's vector loads), 64 on 165 (an odd count: value by value), and
# 128 on 8,192 pixels (two pieces of tiles an image) at batch 1.
SHARED_SHAPES = [((2, 64, 20, 23), (72, 64, 3, 3), 1), ((3, 64, 13, 17), (64, 64, 3, 3), 0),
                 ((1, 64, 66, 130), (128, 64, 3, 3), 0)]


def _rule_gradient(dy, x, w, cb, window):
    """The min's gradient (constant 1, factor 2) from the convolution computed again."""
    with torch.no_grad():
        conv = OPS.conv2d(x, w, cb, *window, CONV2D_ALGORITHMS["implicit_gemm"],
                          DEFAULT_CONV_WORKSPACE_BYTES, DEFAULT_IM2COL_GEMM_VERSION)
        return OPS._min_add_mul_backward(dy, conv, 1.0, 2.0)


def _sums_close(ours, terms, dtype):
    """ours: per-channel sums of terms (N, C, H, W) rounded to dtype, held to the float64 sums:
    one rounding to dtype, plus float's error on the sum of the magnitudes; NaN where a term
    is."""
    ref = terms.double().sum((0, 2, 3))
    magnitude = terms.double().abs().sum((0, 2, 3))
    eps = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11, torch.float32: 2.0 ** -24}[dtype]
    assert torch.equal(ours.isnan(), ref.isnan())
    assert torch.equal(ours.isinf() & (ours > 0), ref.isinf() & (ref > 0))
    assert torch.equal(ours.isinf() & (ours < 0), ref.isinf() & (ref < 0))
    finite = ref.isfinite()
    error = (ours.double() - ref)[finite].abs()
    assert (error <= eps * ref[finite].abs() + 1e-6 * magnitude[finite]).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("x_shape,w_shape,padding", SHARED_SHAPES)
def test_half_gradients_at_once_write_the_rule_channels_last(x_shape, w_shape, padding, dtype):
    """With dx and dW wanted, the keeping operator's backward runs the four gradients at once
    (_conv2d_min_add_mul_grads_kept). Where conv2d's gradients share dy's channels-last copy,
    the min's rule writes its gradient there (min_add_mul_backward v4) and no copy kernel
    makes it: x's copy is the one left. dx and dW have the bits of the public operator's
    backward (which computes the convolution again and runs the operators apart); the two
    bias gradients, added in v4's order, are held to the float64 sums. dy holds a NaN and an
    Inf. With a budget of 1 byte the operator runs the parts apart."""
    skip_unless_runnable("cuda", operator="conv2d_min_add_mul")
    if not HOPPER:
        pytest.skip("the shared copy needs the wgmma engine and tensor maps (an sm_90 GPU)")
    x, w, cb, b = _inputs(x_shape, w_shape, dtype, "ties")
    leaves = [t.requires_grad_() for t in (x, w, cb, b)]
    window = ([1, 1], [padding, padding], [1, 1])
    dy = rand(x_shape[0], w_shape[0], x_shape[2] - 2 + 2 * padding,
              x_shape[3] - 2 + 2 * padding, dtype=dtype)
    dy.view(-1)[7], dy.view(-1)[-5] = float("nan"), float("inf")
    kept = scratchops.conv2d_min_add_mul(x, w, cb, 1.0, b, 2.0, padding=padding)
    calls = launches(lambda: torch.autograd.grad(kept, leaves, dy, retain_graph=True))
    assert sum(n for name, n in calls.items() if "kept_channels_last_kernel<" in name) == 1
    assert sum(n for name, n in calls.items() if "::channels_last_kernel<" in name) == 1
    ours = torch.autograd.grad(kept, leaves, dy)
    recomputed = OPS.conv2d_min_add_mul(x, w, cb, *window, 1.0, b, 2.0)
    theirs = torch.autograd.grad(recomputed, leaves, dy)
    for a, b_ in zip(ours[:2], theirs[:2]):
        torch.testing.assert_close(a, b_, rtol=0, atol=0, equal_nan=True)
    conv_grad = _rule_gradient(dy, x, w, cb, window)
    assert conv_grad.isnan().any() and conv_grad.isfinite().any()
    _sums_close(ours[2], conv_grad, dtype)
    _sums_close(ours[3], 2.0 * dy.double(), dtype)
    _, halves = OPS._conv2d_min_add_mul_keeping(x, w, cb, *window, 1.0, b, 2.0)
    args = (dy, halves, x.detach(), w.detach(), 2.0, *window)
    version = scratchops.versions.GEMM_TENSOR_CORE_VERSION
    at_once = OPS._conv2d_min_add_mul_grads_kept(*args, TENSOR_CORE_GRAD_WORKSPACE_BYTES, version)
    apart = OPS._conv2d_min_add_mul_grads_kept(*args, 1, version)
    for a, b_ in zip(at_once, ours):
        torch.testing.assert_close(a, b_, rtol=0, atol=0, equal_nan=True)
    # dy and the shares one element into their storage: loaded value by value, the same bits
    shifted = [torch.empty(t.numel() + 1, dtype=t.dtype, device="cuda")[1:].view(t.shape)
               for t in (dy, halves)]
    for t, source in zip(shifted, (dy, halves)):
        t.copy_(source)
    moved = OPS._conv2d_min_add_mul_grads_kept(*shifted, *args[2:],
                                               TENSOR_CORE_GRAD_WORKSPACE_BYTES, version)
    for a, b_ in zip(moved, at_once):
        torch.testing.assert_close(a, b_, rtol=0, atol=0, equal_nan=True)
    # (apart at 1 byte: v2's sums, channel_sums' bits; dx and dW on the versions that need no
    # workspace, so only close to the staged ones)
    for a, b_ in zip(apart, theirs):
        scale = b_.float().nan_to_num(0.0, 0.0, 0.0).abs().max().item()
        exact = a.dim() == 1
        torch.testing.assert_close(a.view(-1), b_.view(-1), rtol=0 if exact else 2e-2,
                                   atol=0 if exact else 1e-2 * scale, equal_nan=True)
    finite_dy = dy.nan_to_num(0.0, 0.0, 0.0)  # (opcheck compares results without equal_nan)
    torch.library.opcheck(OPS._conv2d_min_add_mul_grads_kept.default,
                          (finite_dy, *args[1:], TENSOR_CORE_GRAD_WORKSPACE_BYTES, version))
    with pytest.raises(ValueError, match="halves must be"):
        OPS._conv2d_min_add_mul_grads_kept(dy, halves[:, :-1].contiguous(), *args[2:],
                                           TENSOR_CORE_GRAD_WORKSPACE_BYTES, version)


# (x shape, weight shape, padding) where float's four gradients take their fused form (TF32
# off, the wgmma engine, dy's channels at least 32 and a multiple of 4, dx rows at least 64
# wide): P31's channels on 68-pixel rows, batch 1 with 3 input channels and 36 output
# channels (a k-block and 4 past it), 70 input channels (a second dx tile, 6 wide) with 130-
# pixel rows, and a 1 x 1 kernel. The last five have output rows of whole k-blocks (OW
# rounded up to 8 a multiple of 32), where one pass writes both gradients' operands
# (min_add_mul_operands.cuh): 126-pixel rows as P31's (two slots of B's padding a row, and
# the slice's rows past the batch's last), 96-pixel rows (a segment of 3 k-blocks), 250-pixel
# rows (two segments) with 36 output channels (B's rows past them zero), 132 output channels
# (a second tile of B) on 64-pixel rows, and 125-pixel rows (an odd width: each row of dy
# starts at an odd element) with 40 output channels.
FLOAT_FUSED_SHAPES = [((2, 64, 9, 70), (128, 64, 3, 3), 0), ((1, 3, 7, 67), (36, 3, 3, 3), 1),
                      ((2, 70, 5, 130), (64, 70, 3, 3), 1), ((2, 16, 4, 64), (32, 16, 1, 1), 0),
                      ((2, 64, 6, 128), (128, 64, 3, 3), 0), ((3, 16, 5, 96), (32, 16, 1, 1), 0),
                      ((1, 8, 4, 250), (36, 8, 3, 3), 1), ((1, 8, 4, 66), (132, 8, 3, 3), 0),
                      ((1, 8, 5, 125), (40, 8, 3, 3), 1)]
ONE_PASS = "min_rule_operands::operands_kernel"


def _one_pass(x_shape, w_shape, padding):
    """Whether the four at once take the one pass: output rows of whole k-blocks."""
    out_w = x_shape[3] - w_shape[3] + 1 + 2 * padding
    return (out_w + 7) // 8 * 8 % 32 == 0


@pytest.mark.parametrize("x_shape,w_shape,padding", FLOAT_FUSED_SHAPES)
def test_float_gradients_at_once_apply_the_rule_inside_both_passes(x_shape, w_shape, padding):
    """fp32 with TF32 off: the four gradients at once apply the min's rule inside both
    gradients' passes over dy (min_add_mul_conv_grads_launch): the rule's pass writes dy's two
    TF32 parts for the input gradient v4 (its own split pass does not run) and the weight
    gradient's packing computes the rule from dy and the shares; or, on output rows of whole
    k-blocks, one pass writes both the parts and the weight gradient's packed B, and neither
    the rule's pass nor a packing of dy runs. No pass writes the rule's gradient. dx and dW
    have the bits of the operator that keeps nothing (its backward
    recomputes the convolution and runs the rule and the two gradients apart), with a NaN and
    an Inf in dy; with finite values they are within 1e-5 of float64 relative to the largest
    value; the two bias sums within float's rounding of the float64 sums (added in the
    channels-last pass's order, so not always channel_sums' bits)."""
    skip_unless_runnable("cuda", operator="conv2d_min_add_mul")
    if not HOPPER:
        pytest.skip("the input gradient v4 needs the wgmma engine and tensor maps (an sm_90 GPU)")
    _tf32(False)
    x, w, cb, b = _inputs(x_shape, w_shape, torch.float32, "ties")
    leaves = [t.requires_grad_() for t in (x, w, cb, b)]
    window = ([1, 1], [padding, padding], [1, 1])
    out_hw = (x_shape[2] - w_shape[2] + 1 + 2 * padding, x_shape[3] - w_shape[3] + 1 + 2 * padding)
    dy = rand(x_shape[0], w_shape[0], *out_hw)
    kept = scratchops.conv2d_min_add_mul(x, w, cb, 1.0, b, 2.0, padding=padding)
    calls = launches(lambda: torch.autograd.grad(kept, leaves, dy, retain_graph=True))
    split_rule = "kept_channels_last_kernel<float, true>"
    one_pass = _one_pass(x_shape, w_shape, padding)
    assert sum(n for name, n in calls.items() if split_rule in name) == (0 if one_pass else 1)
    assert sum(n for name, n in calls.items() if ONE_PASS in name) == (1 if one_pass else 0)
    assert not any("split_channels_last_kernel" in name or "kept_kernel<" in name
                   for name in calls)
    assert not one_pass or not any("pack_b_kernel" in name for name in calls)
    assert sum(n for name, n in calls.items() if "swapped_kernel" in name) == 1
    recomputed = OPS.conv2d_min_add_mul(x, w, cb, *window, 1.0, b, 2.0)
    for values in ("finite", "nonfinite"):
        if values == "nonfinite":
            dy.view(-1)[7], dy.view(-1)[-5] = float("nan"), float("inf")
        ours = torch.autograd.grad(kept, leaves, dy, retain_graph=True)
        theirs = torch.autograd.grad(recomputed, leaves, dy, retain_graph=True)
        for a, b_ in zip(ours[:2], theirs[:2]):
            torch.testing.assert_close(a, b_, rtol=0, atol=0, equal_nan=True)
        conv_grad = _rule_gradient(dy, x, w, cb, window)
        _sums_close(ours[2], conv_grad, torch.float32)
        _sums_close(ours[3], 2.0 * dy.double(), torch.float32)
        if values == "finite":  # dx and dW against float64 (torch's conv2d in float64)
            x64, w64 = (t.detach().double().requires_grad_() for t in (x, w))
            y64 = torch.nn.functional.conv2d(x64, w64, padding=padding)
            references = torch.autograd.grad(y64, (x64, w64), conv_grad.double())
            for a, ref in zip(ours[:2], references):
                scale = ref.abs().max().item()
                assert (a.double() - ref).abs().max().item() <= 1e-5 * scale
    finite_dy = dy.nan_to_num(0.0, 0.0, 0.0)  # (opcheck compares results without equal_nan)
    _, halves = OPS._conv2d_min_add_mul_keeping(x, w, cb, *window, 1.0, b, 2.0)
    args = (finite_dy, halves, x.detach(), w.detach(), 2.0, *window)
    version = scratchops.versions.GEMM_TENSOR_CORE_VERSION
    torch.library.opcheck(OPS._conv2d_min_add_mul_grads_kept.default,
                          (*args, TENSOR_CORE_GRAD_WORKSPACE_BYTES, version))
    # A budget that dy's bytes do not fit: the parts apart (the rule's own pass, then the two
    # gradients as the operators alone run them), the same gradients within 1e-5 of the
    # largest.
    at_once = OPS._conv2d_min_add_mul_grads_kept(*args, TENSOR_CORE_GRAD_WORKSPACE_BYTES, version)
    calls = launches(lambda: OPS._conv2d_min_add_mul_grads_kept(*args, 1, version))
    assert not any(split_rule in name or ONE_PASS in name for name in calls)
    for a, b_ in zip(OPS._conv2d_min_add_mul_grads_kept(*args, 1, version), at_once):
        scale = b_.abs().max().item()
        torch.testing.assert_close(a, b_, rtol=0, atol=1e-5 * scale)


# (batch, budget in MiB, passes): a slice's packed B is 3.1 MB. At batch 2 (36 output rows, 16 a
# slice: 3 slices, the last 12 rows past the batch's) 4 MiB holds one slice: a chunk a slice,
# one buffer. At batch 6 (7 slices) 16 MiB holds 5 slices, or two buffers of 2: 4 chunks. At
# batch 20 (23 slices) 64 MiB holds 21, or two buffers of 10: 3 chunks, the second's 640 units
# more than the blocks a GPU holds at once, so that its blocks claim units (an H200 holds 528).
ONE_PASS_CHUNKS = [(2, 4, 3), (6, 16, 4), (20, 64, 3)]


@pytest.mark.parametrize("batch,budget_mib,passes", ONE_PASS_CHUNKS)
@pytest.mark.parametrize("kind", ["ties", "random"])
def test_one_pass_over_dy_runs_a_chunk_of_slices_at_a_time(kind, batch, budget_mib, passes):
    """A budget that holds a few slices of the weight gradient a chunk: the one pass runs once
    a chunk, before that chunk's product (one chunk buffer), or, where two buffers fit, beside
    the product of the chunk before it into the other buffer, and writes every row's parts
    before the input gradient reads them. dx and dW have the bits of the operator that keeps
    nothing, with an Inf and a NaN in dy; the sums as above."""
    skip_unless_runnable("cuda", operator="conv2d_min_add_mul")
    if not HOPPER:
        pytest.skip("the input gradient v4 needs the wgmma engine and tensor maps (an sm_90 GPU)")
    _tf32(False)
    x, w, cb, b = _inputs((batch, 16, 20, 128), (32, 16, 3, 3), torch.float32, kind)
    window = ([1, 1], [0, 0], [1, 1])
    dy = rand(batch, 32, 18, 126)
    dy.view(-1)[11], dy.view(-1)[-300] = float("inf"), float("nan")
    _, halves = OPS._conv2d_min_add_mul_keeping(x, w, cb, *window, 1.0, b, 2.0)
    budget, version = budget_mib * 2**20, scratchops.versions.GEMM_TENSOR_CORE_VERSION
    args = (dy, halves, x, w, 2.0, *window, budget, version)
    calls = launches(lambda: OPS._conv2d_min_add_mul_grads_kept(*args))
    assert sum(n for name, n in calls.items() if ONE_PASS in name) == passes
    ours = OPS._conv2d_min_add_mul_grads_kept(*args)
    conv_grad = OPS._min_add_mul_backward_kept(dy, halves, 2.0)[0]
    theirs = OPS._conv2d_grads(conv_grad, x, w, *window, TENSOR_CORE_GRAD_WORKSPACE_BYTES,
                               version)
    for a, b_ in zip(ours[:2], theirs):
        torch.testing.assert_close(a, b_, rtol=0, atol=0, equal_nan=True)
    _sums_close(ours[2], conv_grad, torch.float32)
    _sums_close(ours[3], 2.0 * dy.double(), torch.float32)


def test_one_pass_beside_the_product_replays_in_a_cuda_graph():
    """The pass beside the product (two chunk buffers; its blocks claim units from counters
    that each pass zeroes for the next) captured in a CUDA graph and replayed twice on new
    values of dy: the four gradients have the bits of the call made without the graph."""
    skip_unless_runnable("cuda", operator="conv2d_min_add_mul")
    if not HOPPER:
        pytest.skip("the input gradient v4 needs the wgmma engine and tensor maps (an sm_90 GPU)")
    _tf32(False)
    batch, budget_mib, _ = ONE_PASS_CHUNKS[1]  # (the chunks beside the products)
    x, w, cb, b = _inputs((batch, 16, 20, 128), (32, 16, 3, 3), torch.float32, "ties")
    window = ([1, 1], [0, 0], [1, 1])
    dy = rand(batch, 32, 18, 126)
    _, halves = OPS._conv2d_min_add_mul_keeping(x, w, cb, *window, 1.0, b, 2.0)
    args = (dy, halves, x, w, 2.0, *window, budget_mib * 2**20,
            scratchops.versions.GEMM_TENSOR_CORE_VERSION)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        OPS._conv2d_min_add_mul_grads_kept(*args)  # (warm-up outside the capture)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = OPS._conv2d_min_add_mul_grads_kept(*args)
    for _ in range(2):
        dy.copy_(rand(*dy.shape))
        graph.replay()
        torch.cuda.synchronize()
        for a, b_ in zip(captured, OPS._conv2d_min_add_mul_grads_kept(*args)):
            assert a.isfinite().all()
            torch.testing.assert_close(a, b_, rtol=0, atol=0)


def test_float_gradients_at_once_follow_the_input_gradient_apart_at_batch_1():
    """At batch 1 a budget can hold one of dy's two parts beside v4's packed weights but not
    one image's two parts, where the input gradient alone runs v2, not v4. The four at once
    then run apart too, so that dx's bits do not depend on which form ran."""
    skip_unless_runnable("cuda", operator="conv2d_min_add_mul")
    if not HOPPER:
        pytest.skip("the input gradient v4 needs the wgmma engine and tensor maps (an sm_90 GPU)")
    _tf32(False)
    x, w, cb, b = _inputs((1, 16, 4, 64), (32, 16, 1, 1), torch.float32, "random")
    window = ([1, 1], [0, 0], [1, 1])
    dy = rand(1, 32, 4, 64)
    _, halves = OPS._conv2d_min_add_mul_keeping(x, w, cb, *window, 0.25, b, 2.0)
    # (a part: 32 x 256 floats, 32 KB; v4's packed weights 8 KB; an image's two parts 64 KB)
    budget, version = 56 * 1024, scratchops.versions.GEMM_TENSOR_CORE_VERSION
    args = (dy, halves, x, w, 2.0, *window, budget, version)
    calls = launches(lambda: OPS._conv2d_min_add_mul_grads_kept(*args))
    assert not any("kept_channels_last_kernel<float, true>" in name for name in calls)
    ours = OPS._conv2d_min_add_mul_grads_kept(*args)
    conv_grad = OPS._min_add_mul_backward_kept(dy, halves, 2.0)[0]
    alone = OPS._conv2d_input_grad(conv_grad, w, list(x.shape), *window, budget, version)
    torch.testing.assert_close(ours[0], alone, rtol=0, atol=0, equal_nan=True)
