"""The public operators, with torch.nn.functional's names and signatures where torch has them.

Each function checks its arguments (scratchops._validate) and calls the registered operator
torch.ops.scratchops.<name> (scratchops._library), which runs a CUDA kernel on the current
stream of the input's device. Inputs must be float32, contiguous and on one CUDA device (or
the meta device / fake tensors, for tracing); nothing is copied or converted silently.
"""

from __future__ import annotations

from . import _validate
from ._library import OPS
from .versions import (CONV2D_ALGORITHMS, DEFAULT_CONV2D_ALGORITHM,
                       DEFAULT_CONV_WORKSPACE_BYTES, DEFAULT_GEMM_VERSION,
                       DEFAULT_IM2COL_GEMM_VERSION, DEFAULT_IM2COL_VERSION, GEMM_VERSIONS,
                       IM2COL_GEMM_VERSIONS, IM2COL_VERSIONS)


def _batched(x, name: str):
    """(x as 4-D, whether it came unbatched) for a (N, C, H, W) or (C, H, W) input."""
    _validate.check_tensor(x, name, (3, 4))
    return (x.unsqueeze(0), True) if x.dim() == 3 else (x, False)


def im2col(input, kernel_size, dilation=1, padding=0, stride=1, *,
           version: int = DEFAULT_IM2COL_VERSION):
    """Sliding local blocks of a (N, C, H, W) or (C, H, W) tensor, as F.unfold.

    Returns (N, C*kh*kw, L), L = out_h*out_w, with row (c*kh + i)*kw + j holding tap (i, j)
    of channel c for every output position. `version` picks the kernel (IM2COL_VERSIONS).
    """
    x, unbatched = _batched(input, "input")
    (kernel_size, dilation, padding, stride), _ = _validate.im2col_args(
        x, kernel_size, dilation, padding, stride)
    version = _validate.check_choice(version, "version", IM2COL_VERSIONS)
    _validate.check_cuda(input=x)
    cols = OPS.im2col(x, list(kernel_size), list(dilation), list(padding), list(stride), version)
    return cols.squeeze(0) if unbatched else cols


def gemm(a, b, bias=None, *, version: int = DEFAULT_GEMM_VERSION):
    """a @ b, plus bias[m] on every row m of the result when bias (shape (M,)) is given.

    Shapes: (M, K) @ (K, N) -> (M, N); (B, M, K) @ (B, K, N) -> (B, M, N); a 2-D operand
    with a 3-D one is shared across the batch. `version` picks the kernel (GEMM_VERSIONS;
    5, the default, is fp32-accurate on the tensor cores and needs an sm_90 GPU).
    """
    _validate.gemm_shape(a, b, bias)
    version = _validate.check_choice(version, "version", GEMM_VERSIONS)
    _validate.check_cuda(a=a, b=b, bias=bias)
    return OPS.gemm(a, b, bias, version)


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, *,
           algorithm: str = DEFAULT_CONV2D_ALGORITHM,
           workspace_bytes: int = DEFAULT_CONV_WORKSPACE_BYTES,
           gemm_version: int = DEFAULT_IM2COL_GEMM_VERSION):
    """2-D convolution as F.conv2d (groups=1).

    algorithm="implicit_gemm" (default): an implicit GEMM on the tensor cores, fp32-accurate
    (3xTF32), for sm_90 GPUs (H100, H200). algorithm="im2col_gemm": im2col + gemm
    (`gemm_version`, 1-3) with the column matrix built in chunks of at most `workspace_bytes`,
    on any GPU. padding may be an int, a pair, 'valid' or 'same' (stride 1, odd kernel span).
    """
    x, unbatched = _batched(input, "input")
    (stride, padding, dilation), _ = _validate.conv2d_args(
        x, weight, bias, stride, padding, dilation, groups)
    if not isinstance(algorithm, str):
        raise TypeError(f"algorithm must be a string, got {algorithm!r}")
    if algorithm not in CONV2D_ALGORITHMS:
        raise ValueError(f"algorithm must be one of {sorted(CONV2D_ALGORITHMS)}, got "
                         f"{algorithm!r}")
    workspace_bytes = _validate.check_positive_int(workspace_bytes, "workspace_bytes")
    gemm_version = _validate.check_choice(gemm_version, "gemm_version", IM2COL_GEMM_VERSIONS)
    _validate.check_cuda(input=x, weight=weight, bias=bias)
    y = OPS.conv2d(x, weight, bias, list(stride), list(padding), list(dilation),
                   CONV2D_ALGORITHMS[algorithm], workspace_bytes, gemm_version)
    return y.squeeze(0) if unbatched else y


def conv2d_pack_weight(weight):
    """conv2d weights (Cout, Cin, kh, kw) packed for the tensor-core kernels (a uint8 tensor
    of opaque layout): pass it as `packed_weight` to skip packing on every call while the
    weights do not change."""
    _validate.pack_weight_args(weight)
    _validate.check_cuda(weight=weight)
    return OPS.conv2d_pack_weight(weight)


def conv2d_min_add_mul(input, weight, conv_bias, constant, bias, factor, stride=1, padding=0,
                       dilation=1, *, packed_weight=None):
    """(torch.min(F.conv2d(input, weight, conv_bias, stride, padding, dilation), constant) +
    bias) * factor, in one kernel on the tensor cores (P31; sm_90 GPUs). bias: one value per
    output channel, (Cout,) or (Cout, 1, 1). packed_weight: conv2d_pack_weight(weight)."""
    x, unbatched = _batched(input, "input")
    (stride, padding, dilation), (constant, factor), _ = _validate.conv2d_min_add_mul_args(
        x, weight, conv_bias, stride, padding, dilation, constant, bias, factor, packed_weight)
    _validate.check_cuda(input=x, weight=weight, conv_bias=conv_bias, bias=bias,
                         packed_weight=packed_weight)
    y = OPS.conv2d_min_add_mul(x, weight, conv_bias, list(stride), list(padding),
                               list(dilation), constant, bias, factor, packed_weight)
    return y.squeeze(0) if unbatched else y


def conv2d_group_norm_pool_clamp(input, weight, conv_bias, num_groups, gn_weight=None,
                                 gn_bias=None, scale=None, eps=1e-5, min=0.0, max=1.0, *,
                                 packed_weight=None):
    """torch.clamp(F.max_pool2d(F.group_norm(F.conv2d(input, weight, conv_bias), num_groups,
    gn_weight, gn_bias, eps) * scale, 4), min, max) in one pass over the input (P85; sm_90
    GPUs): the convolution's output is never written. Covers up to 64 output channels and a
    conv output of at least 4 x 4 (NotImplementedError / ValueError otherwise)."""
    x, unbatched = _batched(input, "input")
    (eps, lo, hi), _ = _validate.conv2d_group_norm_pool_clamp_args(
        x, weight, conv_bias, num_groups, gn_weight, gn_bias, scale, eps, min, max, packed_weight)
    _validate.check_cuda(input=x, weight=weight, conv_bias=conv_bias, gn_weight=gn_weight,
                         gn_bias=gn_bias, scale=scale, packed_weight=packed_weight)
    y = OPS.conv2d_group_norm_pool_clamp(x, weight, conv_bias, _validate.as_int(num_groups, "num_groups"),
                                         gn_weight, gn_bias, scale, eps, lo, hi, packed_weight)
    return y.squeeze(0) if unbatched else y


def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):
    """Group normalisation of an (N, C, *) tensor, as F.group_norm (per-sample statistics).

    weight and bias: (C,) or None.
    """
    eps = _validate.group_norm_args(input, num_groups, weight, bias, None, eps)
    _validate.check_cuda(input=input, weight=weight, bias=bias)
    return OPS.group_norm(input, _validate.as_int(num_groups, "num_groups"), weight, bias, None,
                          eps)


def group_norm_scale(input, num_groups, weight, bias, scale, eps=1e-5):
    """group_norm(input, num_groups, weight, bias, eps) * scale in one pass over the data
    after the statistics (P85's GroupNorm followed by its per-channel scale)."""
    if scale is None:
        raise ValueError("group_norm_scale needs a scale tensor; use group_norm without one")
    eps = _validate.group_norm_args(input, num_groups, weight, bias, scale, eps)
    _validate.check_cuda(input=input, weight=weight, bias=bias, scale=scale)
    return OPS.group_norm(input, _validate.as_int(num_groups, "num_groups"), weight, bias, scale,
                          eps)


def scale(input, scale):
    """input * scale with one value per channel: scale of shape (C,) or (C, 1, ..., 1)."""
    _validate.check_tensor(input, "input", range(2, 9))
    _validate.check_per_channel(scale, "scale", input.shape)
    _validate.check_cuda(input=input, scale=scale)
    return OPS.scale(input, scale)


def _max_pool2d_clamp(input, kernel_size, stride, padding, dilation, ceil_mode, lo, hi):
    x, unbatched = _batched(input, "input")
    (kernel_size, stride, padding), _ = _validate.pool_args(
        x, kernel_size, stride, padding, dilation, ceil_mode)
    _validate.check_cuda(input=x)
    y = OPS.max_pool2d_clamp(x, list(kernel_size), list(stride), list(padding), lo, hi)
    return y.squeeze(0) if unbatched else y


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False):
    """2-D max pooling of (N, C, H, W) or (C, H, W), as F.max_pool2d (floor mode, -inf
    padding, NaN propagating). dilation, ceil_mode and return_indices keep their defaults."""
    if return_indices:
        raise NotImplementedError("scratchops.max_pool2d does not return indices")
    return _max_pool2d_clamp(input, kernel_size, stride, padding, dilation, ceil_mode,
                             float("-inf"), float("inf"))


def clamp(input, min=None, max=None):
    """min(max(input, min), max) elementwise, as torch.clamp with number bounds (NaN stays
    NaN; min > max gives max everywhere)."""
    lo, hi = _validate.clamp_bounds(min, max)
    _validate.check_tensor(input, "input", range(0, 65))
    _validate.check_cuda(input=input)
    return OPS.clamp(input, lo, hi)


def max_pool2d_clamp(input, kernel_size, stride=None, padding=0, min=None, max=None):
    """clamp(max_pool2d(input, kernel_size, stride, padding), min, max) in one kernel."""
    lo, hi = _validate.clamp_bounds(min, max)
    return _max_pool2d_clamp(input, kernel_size, stride, padding, 1, False, lo, hi)


def min_add_mul(input, constant, bias, factor):
    """(torch.min(input, constant) + bias) * factor in one pass (P31's epilogue); bias holds
    one value per channel, shape (C,) or (C, 1, ..., 1). NaN propagates through the min."""
    _validate.check_tensor(input, "input", range(2, 9))
    constant = _validate.as_float(constant, "constant")
    factor = _validate.as_float(factor, "factor")
    _validate.check_per_channel(bias, "bias", input.shape)
    _validate.check_cuda(input=input, bias=bias)
    return OPS.min_add_mul(input, constant, bias, factor)
