"""The backward formulas of the public operators (scratchops._library registers them with
torch.library.register_autograd).

Each operator has a `setup_<name>(ctx, inputs, output)`, which keeps what its backward needs,
and a `backward_<name>(ctx, grad)`, which returns one gradient per input of the operator's
schema (None for the non-tensor arguments and for inputs that need none). A formula calls
scratchops kernels only: the public operators, and the private operators
torch.ops.scratchops._<name> (schemas in _library.BACKWARD_SCHEMAS, kernels in cuda/*_backward.cu
and cuda/transpose.cu, whose headers derive each formula). The only torch work in a backward is
view metadata (a bias gradient (C,) viewed as the bias's (C, 1, 1)) and, when the incoming
gradient is not contiguous (y.sum()'s), torch's copy that makes it so.

What each backward computes:
  im2col           col2im, its transpose.
  gemm             dA = dC Bᵀ, dB = Aᵀ dC (the transposed operand written out, then the same
                   gemm, version and TF32 switch included, as torch's matmul backward); an
                   operand shared across the batch gets the batch's sum; the bias dC's sums.
  conv2d           the im2col + GEMM chain transposed (cuda/conv_backward.cu), on the im2col
                   forward's CUDA-core GEMM (fp32 under every switch); after a tensor-core
                   forward on the tensor cores, fp32-accurate or TF32 as the forward
                   (docs/tf32.md): dX a convolution of dY, dW an implicit GEMM in ordered
                   slices, in 16 bits both staged from channels-last copies (dY's made once
                   for both); the bias's by per-channel sums.
  group_norm       one kernel for dx and one for the parameters (cuda/groupnorm_backward.cu),
                   the scale of group_norm_scale included.
  scale            dx = dy * scale (the scale kernel itself); dscale = per-channel sums of dy * x.
  min_add_mul      torch.minimum's rule, then per-channel sums for the bias.
  conv2d_min_add_mul  the min's rule from the shares its forward kept (the keeping operator,
                   scratchops._library.KEEPING_SCHEMAS, which scratchops.conv2d_min_add_mul
                   runs when a gradient is wanted), or from the convolution computed again
                   (torch.ops.scratchops.conv2d_min_add_mul keeps nothing); then conv2d's
                   gradients. Kept shares with dX and dW wanted: the rule writes its gradient
                   channels-last, where conv2d's gradients read their copy of dY.
  max_pool2d_clamp the clamp's rule at the window's maximum, then the pool's gather to the
                   element torch's max_pool2d would have recorded (cuda/pool_clamp_backward.cu).
  clamp            dy where lo <= x <= hi.
  conv2d_group_norm_pool_clamp  from what its keeping form kept (each window's extreme,
                   each group's statistics), one fused kernel that computes the convolution
                   again tile by tile and feeds the gradient it forms straight into dX, dW and
                   the biases' (the convolution's output and its gradient never written); or,
                   after the public operator (which keeps nothing) and where the fused kernel
                   does not cover the call, through its parts, their outputs computed again.
"""

from __future__ import annotations

import torch

from . import _build
from ._validate import ONE_PASS_POOL
from .versions import (CONV2D_ALGORITHMS, CONV_GN_POOL_CUDA_CORE_VERSION,
                       DEFAULT_CONV_WORKSPACE_BYTES, DEFAULT_GROUP_NORM_VERSION,
                       DEFAULT_IM2COL_GEMM_VERSION, GEMM_TENSOR_CORE_VERSION,
                       TENSOR_CORE_GRAD_WORKSPACE_BYTES)

OPS = torch.ops.scratchops
IMPLICIT_GEMM = CONV2D_ALGORITHMS["implicit_gemm"]


def _contiguous(grad):
    return grad if grad.is_contiguous() else grad.contiguous()


def _per_channel(sums, param):
    """A per-channel gradient (C,) in its parameter's shape ((C,) or (C, 1, ..., 1))."""
    return sums.view(param.shape)


def _conv_grads(grad, x, weight, bias_given, stride, padding, dilation, algorithm,
                workspace_bytes, gemm_version, needs_x=None, needs_weight=None, needs_bias=None):
    """(dx, dweight, dbias) of conv2d(x, weight, bias) given the output's gradient, None where
    not needed: the im2col algorithm's on gemm_version's GEMM, else on the tensor cores."""
    if algorithm == CONV2D_ALGORITHMS["implicit_gemm"]:
        workspace_bytes, gemm_version = TENSOR_CORE_GRAD_WORKSPACE_BYTES, GEMM_TENSOR_CORE_VERSION
    dx = dw = db = None
    if needs_x and needs_weight:  # (both at once: dy made channels-last once where it can)
        dx, dw = OPS._conv2d_grads(grad, x, weight, stride, padding, dilation, workspace_bytes,
                                   gemm_version)
    elif needs_x:
        dx = OPS._conv2d_input_grad(grad, weight, list(x.shape), stride, padding, dilation,
                                    workspace_bytes, gemm_version)
    elif needs_weight:
        dw = OPS._conv2d_weight_grad(grad, x, list(weight.shape), stride, padding, dilation,
                                     workspace_bytes, gemm_version)
    if needs_bias and bias_given:
        db = OPS._channel_sums(grad, None, 1.0)
    return dx, dw, db


# --------------------------------------------------------------------------------- im2col
def setup_im2col(ctx, inputs, output):
    x, ctx.kernel_size, ctx.dilation, ctx.padding, ctx.stride, _ = inputs
    ctx.input_hw = list(x.shape[2:])


def backward_im2col(ctx, grad):
    return (OPS._col2im(_contiguous(grad), ctx.input_hw, ctx.kernel_size, ctx.dilation,
                        ctx.padding, ctx.stride) if ctx.needs_input_grad[0] else None,
            None, None, None, None, None)


# ----------------------------------------------------------------------------------- gemm
def setup_gemm(ctx, inputs, output):
    a, b, bias, ctx.version = inputs
    ctx.save_for_backward(a, b)
    ctx.bias_given = bias is not None


def backward_gemm(ctx, grad):
    a, b = ctx.saved_tensors
    grad = _contiguous(grad)
    da = db = dbias = None
    if ctx.needs_input_grad[0]:  # dA = dC Bᵀ, summed over the batch when A was shared
        da = OPS.gemm(grad, OPS._transpose(b), None, ctx.version)
        if a.dim() == 2 and da.dim() == 3:
            da = OPS._batch_sum(da)
    if ctx.needs_input_grad[1]:  # dB = Aᵀ dC, likewise
        db = OPS.gemm(OPS._transpose(a), grad, None, ctx.version)
        if b.dim() == 2 and db.dim() == 3:
            db = OPS._batch_sum(db)
    if ctx.bias_given and ctx.needs_input_grad[2]:  # dbias[m]: dC's row m over batch and columns
        dbias = OPS._channel_sums(grad if grad.dim() == 3 else grad.unsqueeze(0), None, 1.0)
    return da, db, dbias, None


# --------------------------------------------------------------------------------- conv2d
def setup_conv2d(ctx, inputs, output):
    (x, weight, bias, ctx.stride, ctx.padding, ctx.dilation, ctx.algorithm, ctx.workspace_bytes,
     ctx.gemm_version) = inputs
    ctx.save_for_backward(x, weight, bias)


def backward_conv2d(ctx, grad):
    x, weight, bias = ctx.saved_tensors
    needs = ctx.needs_input_grad
    dx, dw, db = _conv_grads(_contiguous(grad), x, weight, bias is not None, ctx.stride,
                             ctx.padding, ctx.dilation, ctx.algorithm, ctx.workspace_bytes,
                             ctx.gemm_version, needs[0], needs[1], needs[2])
    return dx, dw, None if db is None else _per_channel(db, bias), None, None, None, None, None, None


# -------------------------------------------------------------- P31: conv2d_min_add_mul
# Two ways to the min's rule: the public operator keeps nothing, so its backward computes the
# convolution's output again; the keeping operator (what scratchops.conv2d_min_add_mul calls
# when a gradient is wanted) kept each output's share in halves, which the backward reads.
def setup_conv2d_min_add_mul(ctx, inputs, output):
    (x, weight, conv_bias, ctx.stride, ctx.padding, ctx.dilation, ctx.constant, bias,
     ctx.factor) = inputs
    ctx.save_for_backward(x, weight, conv_bias, bias)


def backward_conv2d_min_add_mul(ctx, grad):
    x, weight, conv_bias, bias = ctx.saved_tensors

    def min_rule(grad):  # the convolution's output again, then the min's rule
        y = OPS.conv2d(x, weight, conv_bias, ctx.stride, ctx.padding, ctx.dilation,
                       IMPLICIT_GEMM, DEFAULT_CONV_WORKSPACE_BYTES, DEFAULT_IM2COL_GEMM_VERSION)
        return OPS._min_add_mul_backward(grad, y, ctx.constant, ctx.factor), None, None

    return _conv2d_min_add_mul_grads(ctx, grad, x, weight, conv_bias, bias, min_rule)


def setup__conv2d_min_add_mul_keeping(ctx, inputs, output):
    (x, weight, conv_bias, ctx.stride, ctx.padding, ctx.dilation, ctx.constant, bias,
     ctx.factor) = inputs
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)  # (no zeros made for the shares' gradient)
    ctx.save_for_backward(x, weight, conv_bias, bias, output[1])


def backward__conv2d_min_add_mul_keeping(ctx, grad, _halves_grad):
    x, weight, conv_bias, bias, halves = ctx.saved_tensors
    if grad is None:
        return (None,) * 9
    if ctx.needs_input_grad[0] and ctx.needs_input_grad[1]:  # all four at once (binding.cpp)
        grads = OPS._conv2d_min_add_mul_grads_kept(
            _contiguous(grad), halves, x, weight, ctx.factor, ctx.stride, ctx.padding,
            ctx.dilation, TENSOR_CORE_GRAD_WORKSPACE_BYTES, GEMM_TENSOR_CORE_VERSION)
        return _min_add_mul_results(ctx, conv_bias, bias, *grads)
    return _conv2d_min_add_mul_grads(
        ctx, grad, x, weight, conv_bias, bias,
        lambda grad: OPS._min_add_mul_backward_kept(grad, halves, ctx.factor))


def _conv2d_min_add_mul_grads(ctx, grad, x, weight, conv_bias, bias, min_rule):
    """The gradients of conv2d_min_add_mul's inputs. min_rule(grad): the convolution output's
    gradient, and the two bias gradients (conv_bias's and bias's, as (C,)) where it finds them
    on the way, else None."""
    needs = ctx.needs_input_grad
    grad = _contiguous(grad)
    conv_grad = dcb = dbias = None
    if needs[0] or needs[1] or needs[2]:
        conv_grad, dcb, dbias = min_rule(grad)
    dx, dw, _ = _conv_grads(conv_grad, x, weight, False, ctx.stride, ctx.padding, ctx.dilation,
                            IMPLICIT_GEMM, DEFAULT_CONV_WORKSPACE_BYTES,
                            DEFAULT_IM2COL_GEMM_VERSION, needs[0], needs[1], False)
    if needs[2] and conv_bias is not None and dcb is None:
        dcb = OPS._channel_sums(conv_grad, None, 1.0)
    if needs[7] and dbias is None:
        dbias = OPS._channel_sums(grad, None, ctx.factor)
    return _min_add_mul_results(ctx, conv_bias, bias, dx, dw, dcb, dbias)


def _min_add_mul_results(ctx, conv_bias, bias, dx, dw, dcb, dbias):
    """The nine gradients from the four found (the two bias gradients as (C,))."""
    needs = ctx.needs_input_grad
    dcb = _per_channel(dcb, conv_bias) if needs[2] and conv_bias is not None else None
    return (dx, dw, dcb, None, None, None, None,
            _per_channel(dbias, bias) if needs[7] else None, None)


# --------------------------------------------------- P85: conv2d_group_norm_pool_clamp
def _gn_pool_args(ctx, inputs):
    """Keeps the scalar arguments; returns the six tensors, x to scale."""
    (x, weight, conv_bias, ctx.num_groups, gn_weight, gn_bias, scale, ctx.eps, ctx.min, ctx.max,
     version) = inputs
    # Version 1 runs on the CUDA cores of any GPU: so does its recomputed convolution.
    ctx.algorithm = CONV2D_ALGORITHMS[
        "im2col_gemm" if version == CONV_GN_POOL_CUDA_CORE_VERSION else "implicit_gemm"]
    return x, weight, conv_bias, gn_weight, gn_bias, scale


def setup_conv2d_group_norm_pool_clamp(ctx, inputs, output):
    ctx.save_for_backward(*_gn_pool_args(ctx, inputs))


def backward_conv2d_group_norm_pool_clamp(ctx, grad):
    return _gn_pool_grads_recomputed(ctx, grad, *ctx.saved_tensors)


def _gn_pool_grads_recomputed(ctx, grad, x, weight, conv_bias, gn_weight, gn_bias, scale):
    needs = ctx.needs_input_grad
    one, zero, window = [1, 1], [0, 0], [ONE_PASS_POOL, ONE_PASS_POOL]
    # The parts' outputs again: the convolution, then group norm with its scale.
    conv = OPS.conv2d(x, weight, conv_bias, one, zero, one, ctx.algorithm,
                      DEFAULT_CONV_WORKSPACE_BYTES, DEFAULT_IM2COL_GEMM_VERSION)
    normed = OPS.group_norm(conv, ctx.num_groups, gn_weight, gn_bias, scale, ctx.eps,
                            DEFAULT_GROUP_NORM_VERSION)
    pooled_grad = OPS._max_pool2d_clamp_backward(_contiguous(grad), normed, window, window, zero,
                                                 ctx.min, ctx.max)
    conv_grad, dgw, dgb, dscale = OPS._group_norm_backward(pooled_grad, conv, ctx.num_groups,
                                                           gn_weight, gn_bias, scale, ctx.eps)
    dx, dw, dcb = _conv_grads(conv_grad, x, weight, conv_bias is not None, one, zero, one,
                              ctx.algorithm, DEFAULT_CONV_WORKSPACE_BYTES,
                              DEFAULT_IM2COL_GEMM_VERSION, needs[0], needs[1], needs[2])
    return (dx, dw, None if dcb is None else _per_channel(dcb, conv_bias), None,
            dgw if needs[4] else None, dgb if needs[5] else None,
            dscale if needs[6] else None, None, None, None, None)


# P85's keeping form (scratchops.conv2d_group_norm_pool_clamp's when a gradient is wanted and
# the fused backward covers the shape): one fused kernel (cuda/conv_gn_pool_backward.cu) on a
# GPU that lends its block the shared memory; on others (sm_80-89) through the parts.
def setup__conv2d_group_norm_pool_clamp_keeping(ctx, inputs, output):
    ctx.mark_non_differentiable(output[1], output[2])
    ctx.set_materialize_grads(False)  # (no zeros made for the kept tensors' gradients)
    ctx.save_for_backward(*_gn_pool_args(ctx, inputs), output[1], output[2])


def _fused_backward_runs(x, weight) -> bool:
    """Whether the fused kernel runs on x's GPU (binding.cpp asks its shared memory)."""
    if x.device.type != "cuda":
        return True
    cout, cin, kh, kw = (int(n) for n in weight.shape)
    return _build.direct_calls().conv_gn_pool_backward_runs(cin, cout, kh, kw, x.device.index)


def backward__conv2d_group_norm_pool_clamp_keeping(ctx, grad, _extremes_grad, _stats_grad):
    *tensors, extremes, stats = ctx.saved_tensors
    x, weight, conv_bias, gn_weight, gn_bias, scale = tensors
    if grad is None:
        return (None,) * 11
    if not _fused_backward_runs(x, weight):
        return _gn_pool_grads_recomputed(ctx, grad, *tensors)
    needs = ctx.needs_input_grad
    dx, dw, dcb, dparams = OPS._conv2d_group_norm_pool_clamp_backward_kept(
        _contiguous(grad), x, weight, conv_bias, ctx.num_groups, gn_weight, gn_bias, scale,
        extremes, stats, ctx.min, ctx.max)
    return (dx if needs[0] else None, dw if needs[1] else None,
            _per_channel(dcb, conv_bias) if needs[2] and conv_bias is not None else None, None,
            dparams[0] if needs[4] else None, dparams[1] if needs[5] else None,
            _per_channel(dparams[2], scale) if needs[6] else None, None, None, None, None)


# ----------------------------------------------------------------------------- group_norm
def setup_group_norm(ctx, inputs, output):
    x, ctx.num_groups, weight, bias, scale, ctx.eps, _ = inputs
    ctx.save_for_backward(x, weight, bias, scale)


def backward_group_norm(ctx, grad):
    x, weight, bias, scale = ctx.saved_tensors
    needs = ctx.needs_input_grad
    dx, dw, db, ds = OPS._group_norm_backward(_contiguous(grad), x, ctx.num_groups, weight, bias,
                                              scale, ctx.eps)
    return (dx if needs[0] else None, None, dw if needs[2] else None, db if needs[3] else None,
            ds if needs[4] else None, None, None)


# ---------------------------------------------------------------------------------- scale
def setup_scale(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def backward_scale(ctx, grad):
    x, scale = ctx.saved_tensors
    grad = _contiguous(grad)
    dx = OPS.scale(grad, scale) if ctx.needs_input_grad[0] else None
    ds = (_per_channel(OPS._channel_sums(grad, x, 1.0), scale) if ctx.needs_input_grad[1]
          else None)
    return dx, ds


# ---------------------------------------------------------------------------- min_add_mul
def setup_min_add_mul(ctx, inputs, output):
    x, ctx.constant, bias, ctx.factor = inputs
    ctx.save_for_backward(x, bias)


def backward_min_add_mul(ctx, grad):
    x, bias = ctx.saved_tensors
    grad = _contiguous(grad)
    dx = (OPS._min_add_mul_backward(grad, x, ctx.constant, ctx.factor)
          if ctx.needs_input_grad[0] else None)
    dbias = (_per_channel(OPS._channel_sums(grad, None, ctx.factor), bias)
             if ctx.needs_input_grad[2] else None)
    return dx, None, dbias, None


# ------------------------------------------------------------------- max_pool2d_clamp, clamp
def setup_max_pool2d_clamp(ctx, inputs, output):
    x, ctx.kernel_size, ctx.stride, ctx.padding, ctx.min, ctx.max, _ = inputs
    ctx.save_for_backward(x)


def backward_max_pool2d_clamp(ctx, grad):
    (x,) = ctx.saved_tensors
    dx = OPS._max_pool2d_clamp_backward(_contiguous(grad), x, ctx.kernel_size, ctx.stride,
                                        ctx.padding, ctx.min, ctx.max)
    return dx, None, None, None, None, None, None


def setup_clamp(ctx, inputs, output):
    x, ctx.min, ctx.max = inputs
    ctx.save_for_backward(x)


def backward_clamp(ctx, grad):
    (x,) = ctx.saved_tensors
    return OPS._clamp_backward(_contiguous(grad), x, ctx.min, ctx.max), None, None
