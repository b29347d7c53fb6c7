"""The public operators, with torch.nn.functional's names and signatures where torch has them.

Each function calls the registered operator torch.ops.scratchops.<name> (scratchops._library),
which runs a CUDA kernel on the current stream of the input's device. Inputs must be float32,
float16 or bfloat16 (all of one dtype), contiguous and on one CUDA device (or the meta device / fake tensors, for tracing); nothing is
copied or converted silently.

Two ways to the operator, one set of rules:
  direct   When no gradient is wanted, the call is not being traced by torch.compile and no
           __torch_function__ applies (`_direct`), and the arguments are plain Python ints,
           floats and tuples of ints (`_ints`, `_numbers`), the function calls
           _library.KERNELS.<name>: once the CUDA kernels are installed, binding.cpp's direct
           call, which converts the arguments in C++ and calls the operator through the C++
           dispatcher below autograd; binding.cpp's kernel checks the arguments cheaply and
           launches. Host cost: less than torch's own operators' (no torch.ops parsing).
  checked  Otherwise, and whenever the direct call refuses its arguments, the function asks
           scratchops._validate (the same check the operator's fake runs), which raises the
           clear error for bad arguments or normalises good ones (numpy and 0-dim integers,
           a one-element list, 'same' padding, an unbatched input, ...), then calls the
           operator through the dispatcher, autograd included. There a fused operator whose
           backward needs more than its inputs runs its keeping form when a gradient is
           wanted (`_keeps_for_backward`), which returns that too.
So every error message comes from the validator, and binding.cpp refuses what it refuses
(tests/test_call_path.py holds the two to each other on the GPU).
"""

from __future__ import annotations

import torch
from torch._C import _any_requires_grad, _has_torch_function, is_grad_enabled
from torch.compiler import is_compiling

from . import _library, _validate
from ._library import KERNELS, OPS
from .versions import (CONV2D_ALGORITHMS, DEFAULT_CONV2D_ALGORITHM, DEFAULT_CONV_GN_POOL_VERSION,
                       DEFAULT_CONV_WORKSPACE_BYTES, DEFAULT_GEMM_VERSION,
                       DEFAULT_GROUP_NORM_VERSION,
                       DEFAULT_IM2COL_GEMM_VERSION, DEFAULT_IM2COL_VERSION,
                       DEFAULT_MAX_POOL2D_VERSION)

_INF = float("inf")
# Whatever the direct call may raise for arguments it refuses (the schema's parser raises
# RuntimeError, binding.cpp ValueError, a device without a kernel NotImplementedError): the
# checked path then says what is wrong, or runs the call with normalised arguments.
_REFUSED = (RuntimeError, ValueError, TypeError, NotImplementedError)


def _direct(x, *tensors) -> bool:
    """Whether this call may go straight to the kernel: eager (torch.compile traces the
    checked path), no gradient wanted, and no __torch_function__ to honour (a tensor subclass
    or a TorchFunctionMode: torch.ops handles those on the checked path). On a CUDA tensor,
    the compiled kernels are installed first (when they cannot be, the checked path raises
    the argument error or says why)."""
    if (is_compiling() or (is_grad_enabled() and _any_requires_grad(x, *tensors))
            or _has_torch_function((x, *tensors))):
        return False
    if not _library.cuda_kernels_installed and isinstance(x, torch.Tensor) and x.is_cuda:
        try:
            _library.install_cuda_kernels()
        except RuntimeError:
            return False
    return True


def _keeps_for_backward(*tensors) -> bool:
    """Whether a fused operator should run its keeping form (scratchops._library's
    KEEPING_SCHEMAS), which also keeps what its backward needs: when a gradient is wanted, and
    outside autocast (where the operator runs as the chain of its parts, each under its own
    policy, and each keeps its own)."""
    return (torch.is_grad_enabled() and not torch.is_autocast_enabled("cuda")
            and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors))


def _ints(*values) -> bool:
    """Each value a plain int or a tuple or list of them (not a bool, numpy integer or tensor,
    which the schema's parser would take as ints where the validator refuses some)."""
    for v in values:
        kind = type(v)
        if kind is int:
            continue
        if kind is not tuple and kind is not list:
            return False
        for e in v:  # (a loop: all() over a generator costs more than the rest of the call)
            if type(e) is not int:
                return False
    return True


def _numbers(*values) -> bool:
    """Each value a plain int or float."""
    for v in values:
        if type(v) is not float and type(v) is not int:
            return False
    return True


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
    if _direct(input) and _ints(kernel_size, dilation, padding, stride, version):
        try:
            return KERNELS.im2col(input, kernel_size, dilation, padding, stride,
                           version)
        except _REFUSED:
            pass
    x, unbatched = _batched(input, "input")
    args, _ = _validate.im2col_args(x, kernel_size, dilation, padding, stride, version)
    _validate.check_cuda(input=x)
    return _unbatched(OPS.im2col(*args), unbatched)


def gemm(a, b, bias=None, *, version: int | None = DEFAULT_GEMM_VERSION):
    """a @ b, plus bias[m] on every row m of the result when bias (shape (M,)) is given.

    Shapes: (M, K) @ (K, N) -> (M, N); (B, M, K) @ (B, K, N) -> (B, M, N); a 2-D operand
    with a 3-D one is shared across the batch. `version` picks the kernel (GEMM_VERSIONS:
    1-4 on the CUDA cores; 5-9 fp32-accurate on the tensor cores, one idea a version: 5
    mma.sync on an sm_80+ GPU, 6-8 wgmma steps on an sm_90 GPU, 9 the persistent wgmma
    kernel on the engine scratchops.tensor_core_path picks, v5's mma.sync off sm_90). The
    default, None, takes the faster for the shape: 9 where the GPU has tensor cores and A
    has at least GEMM_TENSOR_CORE_MIN_ROWS rows (the tensor-core versions pack B at every
    call, which pays off only when enough rows reuse it), 4 otherwise. Follows
    torch's matmul TF32 switch as torch.matmul does: where it allows TF32
    (torch.backends.cuda.matmul.allow_tf32, or set_float32_matmul_precision "high" or
    "medium"), the operands are rounded to TF32 and their products summed in fp32.
    """
    if _direct(a, b, bias) and (version is None or _ints(version)):
        try:
            return KERNELS.gemm(a, b, bias, version)
        except _REFUSED:
            pass
    args, _ = _validate.gemm_args(a, b, bias, version)
    _validate.check_cuda(a=a, b=b, bias=bias)
    return OPS.gemm(*args)


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, *,
           algorithm: str = DEFAULT_CONV2D_ALGORITHM,
           workspace_bytes: int = DEFAULT_CONV_WORKSPACE_BYTES,
           gemm_version: int = DEFAULT_IM2COL_GEMM_VERSION):
    """2-D convolution as F.conv2d (groups=1).

    algorithm="implicit_gemm" (default): an implicit GEMM on the tensor cores, fp32-accurate
    (3xTF32), for sm_80+ GPUs (the engine: scratchops.tensor_core_path).
    algorithm="im2col_gemm": im2col + gemm
    (`gemm_version`, IM2COL_GEMM_VERSIONS) with the column matrix built in chunks of at most
    `workspace_bytes`, on any GPU. padding may be an int, a pair, 'valid' or 'same' (stride 1,
    odd kernel span). Follows torch's cuDNN TF32 switch as F.conv2d does, by the rule of
    versions.conv2d_uses_tf32 (where cuDNN would compute in TF32, so does scratchops).
    """
    if (_direct(input, weight, bias) and _ints(stride, padding, dilation, groups,
                                               workspace_bytes, gemm_version)
            and groups == 1 and type(algorithm) is str and algorithm in CONV2D_ALGORITHMS):
        try:
            return KERNELS.conv2d(input, weight, bias, stride, padding, dilation,
                           CONV2D_ALGORITHMS[algorithm], workspace_bytes, gemm_version)
        except _REFUSED:
            pass
    x, unbatched = _batched(input, "input")
    args, _ = _validate.conv2d_args(x, weight, bias, stride, padding, dilation,
                                    _validate.conv2d_algorithm(algorithm), workspace_bytes,
                                    gemm_version, groups=groups)
    _validate.check_cuda(input=x, weight=weight, bias=bias)
    return _unbatched(OPS.conv2d(*args), unbatched)


def conv2d_min_add_mul(input, weight, conv_bias, constant, bias, factor, stride=1, padding=0,
                       dilation=1):
    """(torch.min(F.conv2d(input, weight, conv_bias, stride, padding, dilation), constant) +
    bias) * factor, in one kernel on the tensor cores (P31; sm_80+ GPUs). bias: one value per
    output channel, (Cout,) or (Cout, 1, 1). The convolution follows torch's TF32 switch as
    conv2d does."""
    if (_direct(input, weight, conv_bias, bias) and _ints(stride, padding, dilation)
            and _numbers(constant, factor)):
        try:
            return KERNELS.conv2d_min_add_mul(input, weight, conv_bias, stride,
                           padding, dilation, constant, bias, factor)
        except _REFUSED:
            pass
    x, unbatched = _batched(input, "input")
    args, _ = _validate.conv2d_min_add_mul_args(x, weight, conv_bias, stride, padding, dilation,
                                                constant, bias, factor)
    _validate.check_cuda(input=x, weight=weight, conv_bias=conv_bias, bias=bias)
    if _keeps_for_backward(x, weight, conv_bias, bias):
        return _unbatched(OPS._conv2d_min_add_mul_keeping(*args)[0], unbatched)
    return _unbatched(OPS.conv2d_min_add_mul(*args), unbatched)


def conv2d_group_norm_pool_clamp(input, weight, conv_bias, num_groups, gn_weight=None,
                                 gn_bias=None, scale=None, eps=1e-5, min=0.0, max=1.0, *,
                                 version: int = DEFAULT_CONV_GN_POOL_VERSION):
    """torch.clamp(F.max_pool2d(F.group_norm(F.conv2d(input, weight, conv_bias), num_groups,
    gn_weight, gn_bias, eps) * scale, 4), min, max) in one pass over the input (P85): the
    convolution's output is never written. Covers up to 64 output channels and a
    conv output of at least 4 x 4 (NotImplementedError / ValueError otherwise). The
    convolution follows torch's TF32 switch as conv2d does. `version` picks the kernels
    (CONV_GN_POOL_VERSIONS: 1 on the CUDA cores of any GPU, 2 and 3 on the tensor cores;
    3, the default, runs version 2 where it does not cover the call)."""
    if (_direct(input, weight, conv_bias, gn_weight, gn_bias, scale) and _ints(num_groups, version)
            and _numbers(eps, min, max)):
        try:
            return KERNELS.conv2d_group_norm_pool_clamp(input, weight, conv_bias,
                           num_groups, gn_weight, gn_bias, scale, eps, min, max, version)
        except _REFUSED:
            pass
    x, unbatched = _batched(input, "input")
    args, _ = _validate.conv2d_group_norm_pool_clamp_args(
        x, weight, conv_bias, num_groups, gn_weight, gn_bias, scale, eps, min, max, version)
    _validate.check_cuda(input=x, weight=weight, conv_bias=conv_bias, gn_weight=gn_weight,
                         gn_bias=gn_bias, scale=scale)
    if (_keeps_for_backward(x, weight, conv_bias, gn_weight, gn_bias, scale)
            and _validate.fused_backward_covers(weight)):
        return _unbatched(OPS._conv2d_group_norm_pool_clamp_keeping(*args)[0], unbatched)
    return _unbatched(OPS.conv2d_group_norm_pool_clamp(*args), unbatched)


def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5, *,
               version: int = DEFAULT_GROUP_NORM_VERSION):
    """Group normalisation of an (N, C, *) tensor, as F.group_norm (per-sample statistics).

    weight and bias: (C,) or None. `version` picks the kernel (GROUP_NORM_VERSIONS).
    """
    return _group_norm(input, num_groups, weight, bias, None, eps, version)


def group_norm_scale(input, num_groups, weight, bias, scale, eps=1e-5, *,
                     version: int = DEFAULT_GROUP_NORM_VERSION):
    """group_norm(input, num_groups, weight, bias, eps) * scale in one pass over the data
    after the statistics (P85's GroupNorm followed by its per-channel scale)."""
    return _group_norm(input, num_groups, weight, bias, scale, eps, version, needs_scale=True)


def _group_norm(input, num_groups, weight, bias, scale, eps, version, needs_scale=False):
    if (_direct(input, weight, bias, scale) and _ints(num_groups, version) and _numbers(eps)
            and not (needs_scale and scale is None)):
        try:
            return KERNELS.group_norm(input, num_groups, weight, bias, scale, eps,
                           version)
        except _REFUSED:
            pass
    args, _ = _validate.group_norm_args(input, num_groups, weight, bias, scale, eps, version,
                                        needs_scale=needs_scale)
    _validate.check_cuda(input=input, weight=weight, bias=bias, scale=scale)
    return OPS.group_norm(*args)


def scale(input, scale):
    """input * scale with one value per channel: scale of shape (C,) or (C, 1, ..., 1)."""
    if _direct(input, scale):
        try:
            return KERNELS.scale(input, scale)
        except _REFUSED:
            pass
    args, _ = _validate.scale_args(input, scale)
    _validate.check_cuda(input=input, scale=scale)
    return OPS.scale(*args)


def _max_pool2d_clamp(input, kernel_size, stride, padding, lo, hi, version, **torch_defaults):
    x, unbatched = _batched(input, "input")
    args, _ = _validate.max_pool2d_clamp_args(x, kernel_size, stride, padding, lo, hi, version,
                                              **torch_defaults)
    _validate.check_cuda(input=x)
    return _unbatched(OPS.max_pool2d_clamp(*args), unbatched)


def _max_pool2d_clamp_direct(input, kernel_size, stride, padding, lo, hi, version):
    """The direct call of max_pool2d and max_pool2d_clamp, or None where it does not apply."""
    if _direct(input) and _ints(kernel_size, padding, version) and _numbers(lo, hi) and (
            stride is None or _ints(stride)):
        try:
            return KERNELS.max_pool2d_clamp(input, kernel_size,
                           kernel_size if stride is None else stride, padding, lo, hi, version)
        except _REFUSED:
            pass
    return None


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False, *, version: int = DEFAULT_MAX_POOL2D_VERSION):
    """2-D max pooling of (N, C, H, W) or (C, H, W), as F.max_pool2d (floor mode, -inf
    padding, NaN propagating). dilation, ceil_mode and return_indices keep their defaults.
    `version` picks the kernel (MAX_POOL2D_VERSIONS)."""
    if type(dilation) is int and dilation == 1 and ceil_mode is False and return_indices is False:
        y = _max_pool2d_clamp_direct(input, kernel_size, stride, padding, -_INF, _INF, version)
        if y is not None:
            return y
    return _max_pool2d_clamp(input, kernel_size, stride, padding, -_INF, _INF, version,
                             dilation=dilation, ceil_mode=ceil_mode,
                             return_indices=return_indices)


def clamp(input, min=None, max=None):
    """min(max(input, min), max) elementwise, as torch.clamp with number bounds (NaN stays
    NaN; min > max gives max everywhere)."""
    if (min is not None or max is not None) and _direct(input):
        lo, hi = -_INF if min is None else min, _INF if max is None else max
        if _numbers(lo, hi):
            try:
                return KERNELS.clamp(input, lo, hi)
            except _REFUSED:
                pass
    args, _ = _validate.clamp_args(input, min, max)
    _validate.check_cuda(input=input)
    return OPS.clamp(*args)


def max_pool2d_clamp(input, kernel_size, stride=None, padding=0, min=None, max=None, *,
                     version: int = DEFAULT_MAX_POOL2D_VERSION):
    """clamp(max_pool2d(input, kernel_size, stride, padding), min, max) in one kernel
    (`version`: MAX_POOL2D_VERSIONS)."""
    if min is not None or max is not None:  # (else the validator says one is needed)
        y = _max_pool2d_clamp_direct(input, kernel_size, stride, padding,
                                     -_INF if min is None else min, _INF if max is None else max,
                                     version)
        if y is not None:
            return y
    lo, hi = _validate.clamp_bounds(min, max)
    return _max_pool2d_clamp(input, kernel_size, stride, padding, lo, hi, version)


def min_add_mul(input, constant, bias, factor):
    """(torch.min(input, constant) + bias) * factor in one pass (P31's epilogue); bias holds
    one value per channel, shape (C,) or (C, 1, ..., 1). NaN propagates through the min."""
    if _direct(input, bias) and _numbers(constant, factor):
        try:
            return KERNELS.min_add_mul(input, constant, bias, factor)
        except _REFUSED:
            pass
    args, _ = _validate.min_add_mul_args(input, constant, bias, factor)
    _validate.check_cuda(input=input, bias=bias)
    return OPS.min_add_mul(*args)
