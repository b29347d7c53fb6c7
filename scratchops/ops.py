"""The public operators, with torch.nn.functional's names and signatures.

Each function validates its arguments (scratchops._validate), builds the kernels on first
use (scratchops._build), and calls the registered operator torch.ops.scratchops.<name>,
which runs the CUDA kernel on the current stream of the input's device. Inputs must be
float32, contiguous and on one CUDA device; nothing is copied or converted silently.

The fake (meta) implementations at the bottom let torch.compile, torch.library.opcheck and
FakeTensor tracing know each output's shape without running a kernel.
"""

from __future__ import annotations

import torch

from . import _build, _validate

# GEMM versions, numbered as in the table at the top of cuda/gemm.cu.
GEMM_VERSIONS = {1: "naive", 2: "shared_tiles", 3: "register_tiles"}
DEFAULT_GEMM_VERSION = 3
# im2col versions, numbered as at the top of cuda/conv_im2col.cu; conv2d uses the default.
IM2COL_VERSIONS = {1: "per_element", 2: "per_row"}
DEFAULT_IM2COL_VERSION = 2
# conv2d builds its im2col columns in chunks of at most this many bytes (P31 at full size
# would need a 4.7 GB column matrix in one piece).
DEFAULT_CONV_WORKSPACE_BYTES = 256 * 2**20


def _kernels():
    _build.load()
    return torch.ops.scratchops


def _unbatched(x, name: str) -> bool:
    """True for an unbatched (C, H, W) input, which runs as a batch of one."""
    _validate.check_tensor(x, name, (3, 4))
    return x.dim() == 3


def im2col(input, kernel_size, dilation=1, padding=0, stride=1, *,
           version: int = DEFAULT_IM2COL_VERSION):
    """Sliding local blocks of a (N, C, H, W) or (C, H, W) tensor, as F.unfold.

    Returns (N, C*kh*kw, L), L = out_h*out_w, with row (c*kh + i)*kw + j holding tap (i, j)
    of channel c for every output position. `version` picks the kernel (IM2COL_VERSIONS).
    """
    unbatched = _unbatched(input, "input")
    x = input.unsqueeze(0) if unbatched else input
    (kernel_size, dilation, padding, stride), _ = _validate.im2col_args(
        x, kernel_size, dilation, padding, stride)
    _validate.check_choice(version, "version", IM2COL_VERSIONS)
    _validate.check_cuda(input=x)
    cols = _kernels().im2col(x, list(kernel_size), list(dilation), list(padding), list(stride),
                             version)
    return cols.squeeze(0) if unbatched else cols


def gemm(a, b, bias=None, *, version: int = DEFAULT_GEMM_VERSION):
    """a @ b, plus bias[m] on every row m of the result when bias (shape (M,)) is given.

    Shapes: (M, K) @ (K, N) -> (M, N); (B, M, K) @ (B, K, N) -> (B, M, N); a 2-D operand
    with a 3-D one is shared across the batch. `version` picks the kernel (GEMM_VERSIONS).
    """
    _validate.gemm_shape(a, b, bias)
    _validate.check_choice(version, "version", GEMM_VERSIONS)
    _validate.check_cuda(a=a, b=b, bias=bias)
    return _kernels().gemm(a, b, bias, version)


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, *,
           workspace_bytes: int = DEFAULT_CONV_WORKSPACE_BYTES,
           gemm_version: int = DEFAULT_GEMM_VERSION):
    """2-D convolution as F.conv2d (groups=1), computed as im2col + gemm.

    The column matrix is built in chunks of at most `workspace_bytes` (whole images where
    they fit, else slices of one image's output pixels; never less than one column).
    padding may be an int, a pair, 'valid', or 'same' (stride 1, odd kernel span).
    """
    unbatched = _unbatched(input, "input")
    x = input.unsqueeze(0) if unbatched else input
    (stride, padding, dilation), _ = _validate.conv2d_args(
        x, weight, bias, stride, padding, dilation, groups)
    _validate.check_positive_int(workspace_bytes, "workspace_bytes")
    _validate.check_choice(gemm_version, "gemm_version", GEMM_VERSIONS)
    _validate.check_cuda(input=x, weight=weight, bias=bias)
    y = _kernels().conv2d(x, weight, bias, list(stride), list(padding), list(dilation),
                          workspace_bytes, gemm_version)
    return y.squeeze(0) if unbatched else y


def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):
    """Group normalisation of an (N, C, *) tensor, as F.group_norm (per-sample statistics).

    weight and bias: (C,) or None.
    """
    eps = _validate.group_norm_args(input, num_groups, weight, bias, None, eps)
    _validate.check_cuda(input=input, weight=weight, bias=bias)
    return _kernels().group_norm(input, num_groups, weight, bias, None, eps)


def scale(input, scale):
    """input * scale with one value per channel: scale of shape (C,) or (C, 1, ..., 1)."""
    _validate.check_tensor(input, "input", range(2, 9))
    _validate.check_per_channel(scale, "scale", input)
    _validate.check_cuda(input=input, scale=scale)
    return _kernels().scale(input, scale)


def group_norm_scale(input, num_groups, weight, bias, scale, eps=1e-5):
    """group_norm(input, num_groups, weight, bias, eps) * scale in one pass over the data
    after the statistics (P85's GroupNorm followed by its per-channel scale)."""
    if scale is None:
        raise ValueError("group_norm_scale needs a scale tensor; use group_norm without one")
    eps = _validate.group_norm_args(input, num_groups, weight, bias, scale, eps)
    _validate.check_cuda(input=input, weight=weight, bias=bias, scale=scale)
    return _kernels().group_norm(input, num_groups, weight, bias, scale, eps)


def _max_pool2d_clamp(input, kernel_size, stride, padding, dilation, ceil_mode, lo, hi):
    unbatched = _unbatched(input, "input")
    x = input.unsqueeze(0) if unbatched else input
    (kernel_size, stride, padding), _ = _validate.pool_args(
        x, kernel_size, stride, padding, dilation, ceil_mode)
    _validate.check_cuda(input=x)
    y = _kernels().max_pool2d_clamp(x, list(kernel_size), list(stride), list(padding), lo, hi)
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
    return _kernels().clamp(input, lo, hi)


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
    _validate.check_per_channel(bias, "bias", input)
    _validate.check_cuda(input=input, bias=bias)
    return _kernels().min_add_mul(input, constant, bias, factor)


# ------------------------------------------------------------------ fake implementations
def register_fakes() -> None:
    """Register the fake kernels; called once, right after the library is loaded."""

    @torch.library.register_fake("scratchops::im2col")
    def _im2col_fake(input, kernel_size, dilation, padding, stride, version):
        _validate.check_choice(version, "version", IM2COL_VERSIONS)
        _, shape = _validate.im2col_args(input, kernel_size, dilation, padding, stride)
        return input.new_empty(shape)

    @torch.library.register_fake("scratchops::gemm")
    def _gemm_fake(a, b, bias, version):
        _validate.check_choice(version, "version", GEMM_VERSIONS)
        return a.new_empty(_validate.gemm_shape(a, b, bias))

    @torch.library.register_fake("scratchops::conv2d")
    def _conv2d_fake(input, weight, bias, stride, padding, dilation, workspace_bytes,
                     gemm_version):
        _validate.check_positive_int(workspace_bytes, "workspace_bytes")
        _validate.check_choice(gemm_version, "gemm_version", GEMM_VERSIONS)
        _, shape = _validate.conv2d_args(input, weight, bias, stride, padding, dilation, 1)
        return input.new_empty(shape)

    @torch.library.register_fake("scratchops::group_norm")
    def _group_norm_fake(input, num_groups, weight, bias, scale, eps):
        _validate.group_norm_args(input, num_groups, weight, bias, scale, eps)
        return torch.empty_like(input)

    @torch.library.register_fake("scratchops::scale")
    def _scale_fake(input, scale):
        _validate.check_tensor(input, "input", range(2, 9))
        _validate.check_per_channel(scale, "scale", input)
        return torch.empty_like(input)

    @torch.library.register_fake("scratchops::min_add_mul")
    def _min_add_mul_fake(input, constant, bias, factor):
        _validate.check_tensor(input, "input", range(2, 9))
        _validate.check_per_channel(bias, "bias", input)
        return torch.empty_like(input)

    @torch.library.register_fake("scratchops::max_pool2d_clamp")
    def _max_pool2d_clamp_fake(input, kernel_size, stride, padding, min, max):
        _, shape = _validate.pool_args(input, kernel_size, stride, padding)
        return input.new_empty(shape)

    @torch.library.register_fake("scratchops::clamp")
    def _clamp_fake(input, min, max):
        _validate.check_tensor(input, "input", range(0, 65))
        return torch.empty_like(input)
