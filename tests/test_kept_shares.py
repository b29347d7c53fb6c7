"""P31's backward from what its forward kept: scratchops.conv2d_min_add_mul, when a gradient
is wanted, runs the keeping operator torch.ops.scratchops._conv2d_min_add_mul_keeping, whose
store also writes each output's share of the min's gradient (a byte, in halves); the backward
reads those bytes instead of computing the convolution again. Held here to the operator that
keeps nothing (its backward recomputes the convolution): the same output, shares equal to the
min's rule applied to the convolution's own output, and bitwise the same gradients."""

import pytest
import torch

import scratchops
from helpers import ENGINES, NO_TENSOR_CORES_REASON, rand, skip_unless_runnable
from scratchops.versions import (CONV2D_ALGORITHMS, DEFAULT_CONV_WORKSPACE_BYTES,
                                 DEFAULT_IM2COL_GEMM_VERSION)

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
