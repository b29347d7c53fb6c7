"""The public operators, with torch.nn.functional's names and signatures where torch has them.

Each function checks its arguments (scratchops._validate, the same check the operator's fake
runs) and calls the registered operator torch.ops.scratchops.<name> (scratchops._library),
which runs a CUDA kernel on the current stream of the input's device. Inputs must be float32,
contiguous and on one CUDA device (or the meta device / fake tensors, for tracing); nothing is
copied or converted silently.
"""

from __future__ import annotations

from . import _validate
from ._library import OPS
from .versions import (DEFAULT_CONV2D_ALGORITHM, DEFAULT_CONV_WORKSPACE_BYTES,
                       DEFAULT_GEMM_VERSION, DEFAULT_GROUP_NORM_VERSION,
                       DEFAULT_IM2COL_GEMM_VERSION, DEFAULT_IM2COL_VERSION,
                       DEFAULT_MAX_POOL2D_VERSION)


def _batched(x, name: str):
    """(x as 4-D, whether it came unbatched) for a (N, C, H, W) or (C, H, W) input."""
    _validate.check_tensor(x, name, (3, 4))
    return (x.unsqueeze(0), True) if x.dim() == 3 else (x, False)


def _unbatched(y, unbatched: bool):
    return y.squeeze(0) if unbatched else y


def im2col(input, kernel_size, dilation=1, padding=0, stride=1, *,
           version: int = DEFAULT_IM2COL_VERSION):
    """Sliding local blocks of a (N, C, H, W) or (C, H, W) tensor, as F.unfold.

    Returns (N, C*kh*kw, L), L = out_h*out_w, with row (c*kh + i)*kw + j holding tap (i, j)
    of channel c for every output position. `version` picks the kernel (IM2COL_VERSIONS).
    """
    x, unbatched = _batched(input, "input")
    args, _ = _validate.im2col_args(x, kernel_size, dilation, padding, stride, version)
    _validate.check_cuda(input=x)
    return _unbatched(OPS.im2col(*args), unbatched)


def gemm(a, b, bias=None, *, version: int = DEFAULT_GEMM_VERSION):
    """a @ b, plus bias[m] on every row m of the result when bias (shape (M,)) is given.

    Shapes: (M, K) @ (K, N) -> (M, N); (B, M, K) @ (B, K, N) -> (B, M, N); a 2-D operand
    with a 3-D one is shared across the batch. `version` picks the kernel (GEMM_VERSIONS;
    5, the default, is fp32-accurate on the tensor cores and needs an sm_90 GPU).
    """
    args, _ = _validate.gemm_args(a, b, bias, version)
    _validate.check_cuda(a=a, b=b, bias=bias)
    return OPS.gemm(*args)


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, *,
           algorithm: str = DEFAULT_CONV2D_ALGORITHM,
           workspace_bytes: int = DEFAULT_CONV_WORKSPACE_BYTES,
           gemm_version: int = DEFAULT_IM2COL_GEMM_VERSION):
    """2-D convolution as F.conv2d (groups=1).

    algorithm="implicit_gemm" (default): an implicit GEMM on the tensor cores, fp32-accurate
    (3xTF32), for sm_90 GPUs (H100, H200). algorithm="im2col_gemm": im2col + gemm
    (`gemm_version`, IM2COL_GEMM_VERSIONS) with the column matrix built in chunks of at most
    `workspace_bytes`, on any GPU. padding may be an int, a pair, 'valid' or 'same' (stride 1,
    odd kernel span).
    """
    x, unbatched = _batched(input, "input")
    args, _ = _validate.conv2d_args(x, weight, bias, stride, padding, dilation,
                                    _validate.conv2d_algorithm(algorithm), workspace_bytes,
                                    gemm_version, groups=groups)
    _validate.check_cuda(input=x, weight=weight, bias=bias)
    return _unbatched(OPS.conv2d(*args), unbatched)


def conv2d_pack_weight(weight):
    """conv2d weights (Cout, Cin, kh, kw) packed for the tensor-core kernels (a uint8 tensor
    of opaque layout): pass it as `packed_weight` to skip packing on every call while the
    weights do not change."""
    args, _ = _validate.conv2d_pack_weight_args(weight)
    _validate.check_cuda(weight=weight)
    return OPS.conv2d_pack_weight(*args)


def conv2d_min_add_mul(input, weight, conv_bias, constant, bias, factor, stride=1, padding=0,
                       dilation=1, *, packed_weight=None):
    """(torch.min(F.conv2d(input, weight, conv_bias, stride, padding, dilation), constant) +
    bias) * factor, in one kernel on the tensor cores (P31; sm_90 GPUs). bias: one value per
    output channel, (Cout,) or (Cout, 1, 1). packed_weight: conv2d_pack_weight(weight)."""
    x, unbatched = _batched(input, "input")
    args, _ = _validate.conv2d_min_add_mul_args(x, weight, conv_bias, stride, padding, dilation,
                                                constant, bias, factor, packed_weight)
    _validate.check_cuda(input=x, weight=weight, conv_bias=conv_bias, bias=bias,
                         packed_weight=packed_weight)
    return _unbatched(OPS.conv2d_min_add_mul(*args), unbatched)


def conv2d_group_norm_pool_clamp(input, weight, conv_bias, num_groups, gn_weight=None,
                                 gn_bias=None, scale=None, eps=1e-5, min=0.0, max=1.0, *,
                                 packed_weight=None):
    """torch.clamp(F.max_pool2d(F.group_norm(F.conv2d(input, weight, conv_bias), num_groups,
    gn_weight, gn_bias, eps) * scale, 4), min, max) in one pass over the input (P85; sm_90
    GPUs): the convolution's output is never written. Covers up to 64 output channels and a
    conv output of at least 4 x 4 (NotImplementedError / ValueError otherwise)."""
    x, unbatched = _batched(input, "input")
    args, _ = _validate.conv2d_group_norm_pool_clamp_args(
        x, weight, conv_bias, num_groups, gn_weight, gn_bias, scale, eps, min, max, packed_weight)
    _validate.check_cuda(input=x, weight=weight, conv_bias=conv_bias, gn_weight=gn_weight,
                         gn_bias=gn_bias, scale=scale, packed_weight=packed_weight)
    return _unbatched(OPS.conv2d_group_norm_pool_clamp(*args), unbatched)


def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5, *,
               version: int = DEFAULT_GROUP_NORM_VERSION):
    """Group normalisation of an (N, C, *) tensor, as F.group_norm (per-sample statistics).

    weight and bias: (C,) or None. `version` picks the kernel (GROUP_NORM_VERSIONS).
    """
    args, _ = _validate.group_norm_args(input, num_groups, weight, bias, None, eps, version)
    _validate.check_cuda(input=input, weight=weight, bias=bias)
    return OPS.group_norm(*args)


def group_norm_scale(input, num_groups, weight, bias, scale, eps=1e-5, *,
                     version: int = DEFAULT_GROUP_NORM_VERSION):
    """group_norm(input, num_groups, weight, bias, eps) * scale in one pass over the data
    after the statistics (P85's GroupNorm followed by its per-channel scale)."""
    args, _ = _validate.group_norm_args(input, num_groups, weight, bias, scale, eps, version,
                                        needs_scale=True)
    _validate.check_cuda(input=input, weight=weight, bias=bias, scale=scale)
    return OPS.group_norm(*args)


def scale(input, scale):
    """input * scale with one value per channel: scale of shape (C,) or (C, 1, ..., 1)."""
    args, _ = _validate.scale_args(input, scale)
    _validate.check_cuda(input=input, scale=scale)
    return OPS.scale(*args)


def _max_pool2d_clamp(input, kernel_size, stride, padding, lo, hi, version, **torch_defaults):
    x, unbatched = _batched(input, "input")
    args, _ = _validate.max_pool2d_clamp_args(x, kernel_size, stride, padding, lo, hi, version,
                                              **torch_defaults)
    _validate.check_cuda(input=x)
    return _unbatched(OPS.max_pool2d_clamp(*args), unbatched)


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False, *, version: int = DEFAULT_MAX_POOL2D_VERSION):
    """2-D max pooling of (N, C, H, W) or (C, H, W), as F.max_pool2d (floor mode, -inf
    padding, NaN propagating). dilation, ceil_mode and return_indices keep their defaults.
    `version` picks the kernel (MAX_POOL2D_VERSIONS)."""
    return _max_pool2d_clamp(input, kernel_size, stride, padding, float("-inf"), float("inf"),
                             version, dilation=dilation, ceil_mode=ceil_mode,
                             return_indices=return_indices)


def clamp(input, min=None, max=None):
    """min(max(input, min), max) elementwise, as torch.clamp with number bounds (NaN stays
    NaN; min > max gives max everywhere)."""
    args, _ = _validate.clamp_args(input, min, max)
    _validate.check_cuda(input=input)
    return OPS.clamp(*args)


def max_pool2d_clamp(input, kernel_size, stride=None, padding=0, min=None, max=None, *,
                     version: int = DEFAULT_MAX_POOL2D_VERSION):
    """clamp(max_pool2d(input, kernel_size, stride, padding), min, max) in one kernel
    (`version`: MAX_POOL2D_VERSIONS)."""
    lo, hi = _validate.clamp_bounds(min, max)
    return _max_pool2d_clamp(input, kernel_size, stride, padding, lo, hi, version)


def min_add_mul(input, constant, bias, factor):
    """(torch.min(input, constant) + bias) * factor in one pass (P31's epilogue); bias holds
    one value per channel, shape (C,) or (C, 1, ..., 1). NaN propagates through the min."""
    args, _ = _validate.min_add_mul_args(input, constant, bias, factor)
    _validate.check_cuda(input=input, bias=bias)
    return OPS.min_add_mul(*args)
