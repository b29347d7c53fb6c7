"""P85's backward by recomputation: scratchops.conv2d_group_norm_pool_clamp, when a gradient is
wanted and the fused backward covers the call (at most 8 input channels, kernels up to 5 x 5),
runs the keeping operator torch.ops.scratchops._conv2d_group_norm_pool_clamp_keeping, whose
forward also keeps each pooling window's extreme of the convolution and each (sample, group)'s
mean and 1/std; its backward (cuda/conv_gn_pool_backward.cu) computes the convolution again
tile by tile and forms the gradient in shared memory, without the convolution's output or its
gradient in memory. Held here to torch and float64 (test_autograd's rules) on shapes that cross
its tiles (8 x 32 input pixels, a region one pooling window wider up and left), to what the
forward must keep, and to the call path's choice."""

import pytest
import torch
import torch.nn.functional as F

import scratchops
from helpers import HOPPER, rand, skip_unless_runnable
from test_autograd import (HALF_DTYPES, as_dtype, check_against_torch, gradients, requiring_grad,
                           torch_conv_gn_pool_clamp)

OPS = torch.ops.scratchops
LO, HI, EPS = -0.5, 0.5, 1e-5
# (x shape, weight shape, groups): odd sizes; batch 1 with one input channel and 6 output
# channels (a partial quad of channels); P85's 8 -> 64 channels on 37 x 70 (5 bands of rows, 3
# of columns, the last ones partial); 5 x 5, 1 x 1 and a 2 x 4 kernel. The kernel's
# instantiations for the full shape (8 input channels, a whole 3 x 3 or 5 x 5 kernel) run
# P85's channels and the 8 -> 12 5 x 5; the others the rest.
SHAPES = [((2, 3, 14, 15), (8, 3, 3, 3), 4), ((1, 1, 9, 7), (6, 1, 3, 3), 3),
          ((2, 8, 37, 70), (64, 8, 3, 3), 16), ((3, 2, 21, 40), (12, 2, 5, 5), 4),
          ((2, 8, 21, 38), (12, 8, 5, 5), 4),
          ((2, 4, 19, 33), (10, 4, 1, 1), 5), ((1, 5, 23, 17), (4, 5, 2, 4), 2)]


def _args(x_shape, w_shape, groups, low=-1.0, high=1.0):
    cout = w_shape[0]
    scale = rand(cout, 1, 1)
    scale[0] = -abs(scale[0].item()) - 0.1  # a channel whose windows take their minimum
    return (rand(*x_shape, low=low, high=high), rand(*w_shape), rand(cout), rand(cout),
            rand(cout), scale)


def _ours(groups, version=scratchops.versions.DEFAULT_CONV_GN_POOL_VERSION):
    def run(x, w, cb, gw, gb, s):
        return scratchops.conv2d_group_norm_pool_clamp(x, w, cb, groups, gw, gb, s, EPS, LO, HI,
                                                       version=version)
    return run


def _torch(groups):
    return lambda x, w, cb, gw, gb, s: torch_conv_gn_pool_clamp(x, w, cb, groups, gw, gb, s, EPS,
                                                                LO, HI)


@pytest.mark.parametrize("version", [1, 2, 3])
@pytest.mark.parametrize("x_shape,w_shape,groups", SHAPES)
def test_fused_backward_matches_torch_and_float64(x_shape, w_shape, groups, version):
    skip_unless_runnable("cuda", operator=None if version == 1 else "conv2d_group_norm_pool_clamp")
    args = requiring_grad(_args(x_shape, w_shape, groups))
    assert "keeping" in type(_ours(groups, version)(*args).grad_fn).__name__
    check_against_torch(_ours(groups, version), _torch(groups), args)


def test_fused_backward_on_data_with_a_large_mean():
    # The convolution's output far from 0 against its spread: group norm's gradient is formed
    # from (y - mean) * rstd, as torch forms it, not from y and the mean apart.
    skip_unless_runnable("cuda", operator="conv2d_group_norm_pool_clamp")
    check_against_torch(_ours(4), _torch(4), _args((2, 3, 14, 15), (8, 3, 3, 3), 4, 50.0, 51.0))


def test_kept_extremes_and_statistics_are_the_convolutions():
    skip_unless_runnable("cuda", operator="conv2d_group_norm_pool_clamp")
    x, w, cb, gw, gb, s = _args((2, 8, 37, 70), (64, 8, 3, 3), 16)
    out, extremes, stats = OPS._conv2d_group_norm_pool_clamp_keeping(x, w, cb, 16, gw, gb, s, EPS,
                                                                     LO, HI, 3)
    assert torch.equal(out, OPS.conv2d_group_norm_pool_clamp(x, w, cb, 16, gw, gb, s, EPS, LO, HI,
                                                             3))
    conv = F.conv2d(x.double(), w.double(), cb.double())
    groups = conv.view(2, 16, -1)
    mean, var = groups.mean(-1), groups.var(-1, unbiased=False)
    assert stats.dtype == torch.float32 and stats.shape == (2, 16, 2)
    torch.testing.assert_close(stats[..., 0].double(), mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(stats[..., 1].double(), (var + EPS).rsqrt(), rtol=1e-4, atol=0)
    sign = torch.where(gw.double() * s.double().view(-1) < 0, -1.0, 1.0).view(1, -1, 1, 1)
    expected = F.max_pool2d(conv * sign, 4) * sign  # the minimum where gamma * scale < 0
    assert extremes.dtype == torch.float32 and extremes.shape == out.shape
    torch.testing.assert_close(extremes.double(), expected, rtol=1e-5, atol=1e-5)


def test_gradients_are_bitwise_deterministic_over_many_tiles_a_block():
    # 8 x 9 x 4 = 288 tiles: more than the fused kernel's 256 blocks, so blocks sum two tiles.
    skip_unless_runnable("cuda", operator="conv2d_group_norm_pool_clamp")
    args = requiring_grad(_args((8, 8, 66, 100), (64, 8, 3, 3), 16))
    out_grad = rand(8, 64, 16, 24)
    first = gradients(_ours(16), args, out_grad)
    second = gradients(_ours(16), args, out_grad)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("w_shape", [(64, 8, 3, 3), (12, 8, 5, 5), (12, 3, 3, 3), (8, 2, 2, 4)])
def test_half_input_copied_in_pairs_or_loaded_gives_the_same_gradients(dtype, w_shape):
    # In fp16 / bf16 the fused kernel copies the input two values at a time where its rows start
    # on 4-byte boundaries, and loads it a value at a time otherwise: the same input one value
    # into its storage (2 bytes off) takes the loads. Both must give the same bits (the loads'
    # path is held to torch and float64 in test_autograd's half-gradient test, whose width is
    # odd).
    skip_unless_runnable("cuda", operator="conv2d_group_norm_pool_clamp")
    x_shape = (2, w_shape[1], 37, 70)  # an even width; partial tiles both ways; the full
    # shape's instantiations (8 input channels, a whole 3 x 3 or 5 x 5 kernel) and the others
    x, *params = as_dtype(_args(x_shape, w_shape, 4), dtype)
    storage = torch.empty(x.numel() + 1, device="cuda", dtype=dtype)
    off_by_one = storage[1:].view(x_shape).copy_(x)
    assert off_by_one.data_ptr() % 4 == 2 and x.data_ptr() % 4 == 0
    out_grad = rand(2, w_shape[0], (37 - w_shape[2] + 1) // 4, (70 - w_shape[3] + 1) // 4,
                    dtype=dtype)
    copied = gradients(_ours(4), requiring_grad([x, *params]), out_grad)
    loaded = gradients(_ours(4), requiring_grad([off_by_one, *params]), out_grad)
    for a, b in zip(copied, loaded):
        assert a.dtype == dtype and torch.equal(a, b)


def test_nan_reaches_the_gradients_as_in_torch():
    skip_unless_runnable("cuda", operator="conv2d_group_norm_pool_clamp")
    args = list(_args((2, 3, 14, 15), (8, 3, 3, 3), 4))
    args[0][1, 2, 5, 6] = float("nan")
    args = requiring_grad(args)
    out_grad = rand(2, 8, 3, 3)
    expected = gradients(_torch(4), args, out_grad)
    for got, ref in zip(gradients(_ours(4), args, out_grad), expected):
        assert torch.equal(got.isnan(), ref.isnan())
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4 * ref.nan_to_num().abs().max(),
                                   equal_nan=True)


@pytest.mark.parametrize("x_shape,w_shape", [((1, 9, 12, 12), (4, 9, 3, 3)),
                                             ((1, 2, 16, 16), (4, 2, 7, 7))])
def test_calls_the_fused_backward_does_not_cover_recompute(x_shape, w_shape):
    # Nine input channels, a 7 x 7 kernel: the public operator (which keeps nothing) and its
    # backward through the parts.
    skip_unless_runnable("cuda", operator="conv2d_group_norm_pool_clamp")
    args = requiring_grad(_args(x_shape, w_shape, 2))
    assert "keeping" not in type(_ours(2)(*args).grad_fn).__name__
    check_against_torch(_ours(2), _torch(2), args)


def test_the_fused_kernel_runs_where_the_gpu_lends_its_shared_memory():
    # 174.5 KiB (3 x 3) or 211.2 KiB (5 x 5) a block: an H100 or H200 lends it, an A100 or an
    # sm_86 / sm_89 GPU does not; the shape's rule holds everywhere.
    skip_unless_runnable("cuda", operator="conv2d_group_norm_pool_clamp")
    x = rand(1, 8, 12, 12)
    for w_shape, covered in (((64, 8, 3, 3), HOPPER), ((64, 8, 5, 5), HOPPER),
                             ((4, 9, 3, 3), False), ((4, 2, 7, 7), False)):
        assert scratchops._backward._fused_backward_runs(x, rand(*w_shape)) == covered, w_shape


def test_where_the_fused_kernel_does_not_run_the_kept_backward_recomputes(monkeypatch):
    # As on an sm_80-89 GPU: the keeping form's backward goes through the parts.
    skip_unless_runnable("cuda", operator="conv2d_group_norm_pool_clamp")
    calls = []
    recomputed = scratchops._backward._gn_pool_grads_recomputed
    monkeypatch.setattr(scratchops._backward, "_fused_backward_runs", lambda x, w: False)
    monkeypatch.setattr(scratchops._backward, "_gn_pool_grads_recomputed",
                        lambda *args: calls.append(1) or recomputed(*args))
    args = requiring_grad(_args((2, 3, 14, 15), (8, 3, 3, 3), 4))
    assert "keeping" in type(_ours(4)(*args).grad_fn).__name__
    check_against_torch(_ours(4), _torch(4), args)
    assert calls


def test_an_empty_batch_gets_zero_parameter_gradients():
    skip_unless_runnable("cuda", operator="conv2d_group_norm_pool_clamp")
    args = requiring_grad(_args((0, 3, 14, 15), (8, 3, 3, 3), 4))
    y = _ours(4)(*args)
    assert y.shape == (0, 8, 3, 3) and "keeping" in type(y.grad_fn).__name__
    grads = torch.autograd.grad(y, args, torch.ones_like(y))
    assert grads[0].shape == args[0].shape
    for g, a in zip(grads[1:], args[1:]):
        assert g.shape == a.shape and torch.equal(g, torch.zeros_like(g))


def test_keeping_operator_passes_opcheck():
    skip_unless_runnable("cuda", operator="conv2d_group_norm_pool_clamp")
    scratchops.load()
    x, w, cb, gw, gb, s = _args((2, 3, 14, 15), (8, 3, 3, 3), 4)
    args = (x, w, cb, 4, gw, gb, s, EPS, LO, HI, 3)
    torch.library.opcheck(OPS._conv2d_group_norm_pool_clamp_keeping.default, args)
    torch.library.opcheck(OPS._conv2d_group_norm_pool_clamp_keeping.default,
                          tuple(a.requires_grad_() if isinstance(a, torch.Tensor) else a
                                for a in args))


def test_kept_backward_refuses_what_the_forward_did_not_keep():
    skip_unless_runnable("cuda", operator="conv2d_group_norm_pool_clamp")
    scratchops.load()
    x, w, cb, gw, gb, s = _args((2, 3, 14, 15), (8, 3, 3, 3), 4)
    grad, stats = rand(2, 8, 3, 3), rand(2, 4, 2)
    for extremes in (rand(2, 8, 3, 3, dtype=torch.float16), rand(2, 8, 3, 4)):
        with pytest.raises(ValueError, match="extremes must be what the forward kept"):
            OPS._conv2d_group_norm_pool_clamp_backward_kept(grad, x, w, cb, 4, gw, gb, s,
                                                            extremes, stats, LO, HI)
