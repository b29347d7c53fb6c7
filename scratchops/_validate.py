"""One argument check per operator, shared by the public functions (scratchops.ops) and the
fake kernels (scratchops._fakes), so that tracing rejects exactly what a call rejects.

`<op>_args` takes the arguments of torch.ops.scratchops.<op> in its schema's order
(scratchops._library), as a caller may give them (an int as a numpy or 0-dim torch integer,
a pair as one int, ...), checks them and returns `(args, shape)`: the arguments normalised
for the operator (ints, floats, lists for int[2]) and the output's shape. A public function
first does what only it does (an unbatched (C, H, W) input viewed as a batch of one,
conv2d's algorithm given by name, clamp bounds that may be None), then calls its `<op>_args`,
then checks the device (`check_cuda`, last: fake tensors may stand on any device).

Every tensor argument of a call has one dtype (float32, float16 or bfloat16: check_same_dtype,
after each tensor's own check). Errors: those of scratchops._checks (TypeError for a wrong type or
dtype, ValueError for a wrong rank,
shape, layout, value or a size beyond 32-bit indexing) and NotImplementedError for a torch
feature scratchops does not cover. Empty tensors behave as torch's counterparts: an empty
result of the right shape where torch gives one, a ValueError where torch refuses (and for
conv2d's 0 input channels, where torch's result has the wrong shape).
tests/test_like_torch.py compares each with torch.
"""

from __future__ import annotations

from collections.abc import Sequence

from ._checks import (GEOMETRY_MAX, as_float, as_int, as_pair, check_choice,
                      check_cuda, check_output_size, check_per_channel, check_positive_int,
                      check_same_dtype, check_tensor, window_output_hw)
from .versions import (CONV2D_ALGORITHMS, CONV_GN_POOL_VERSIONS, GEMM_VERSIONS,
                       GROUP_NORM_VERSIONS, IM2COL_GEMM_VERSIONS, IM2COL_VERSIONS,
                       MAX_POOL2D_VERSIONS)

__all__ = ["check_cuda", "check_tensor"]  # (re-exported for scratchops.ops)


# ------------------------------------------------------------------------- GEMM, im2col
def im2col_args(x, kernel_size, dilation, padding, stride, version):
    check_tensor(x, "input", (4,), nonzero=(1, 2, 3))  # F.unfold allows only a 0 batch
    kernel_size = as_pair(kernel_size, "kernel_size", 1)
    dilation = as_pair(dilation, "dilation", 1)
    padding = as_pair(padding, "padding", 0)
    stride = as_pair(stride, "stride", 1)
    out_h, out_w = window_output_hw(x, kernel_size, stride, padding, dilation, "im2col")
    shape = (x.shape[0], x.shape[1] * kernel_size[0] * kernel_size[1], out_h * out_w)
    check_output_size(shape, "the im2col output")
    version = check_choice(version, "version", IM2COL_VERSIONS)
    return (x, list(kernel_size), list(dilation), list(padding), list(stride), version), shape


def gemm_args(a, b, bias, version):
    check_tensor(a, "a", (2, 3))
    check_tensor(b, "b", (2, 3))
    if a.dim() == 3 and b.dim() == 3 and a.shape[0] != b.shape[0]:
        raise ValueError(f"gemm batch sizes differ: a is {tuple(a.shape)}, b is {tuple(b.shape)}")
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"gemm inner dimensions differ: a is {tuple(a.shape)} (K = "
                         f"{a.shape[-1]}), b is {tuple(b.shape)} (K = {b.shape[-2]})")
    m, n = a.shape[-2], b.shape[-1]
    if bias is not None:
        check_tensor(bias, "bias", (1,))
        if bias.shape[0] != m:
            raise ValueError(f"gemm bias must have one value per row of the output "
                             f"(M = {m}), got shape {tuple(bias.shape)}")
    check_same_dtype(a=a, b=b, bias=bias)
    if a.dim() == 2 and b.dim() == 2:
        shape = (m, n)
    else:
        shape = (a.shape[0] if a.dim() == 3 else b.shape[0], m, n)
    check_output_size(shape, "the gemm output")
    if version is not None:  # None: binding.cpp picks for the shape (versions.py)
        version = check_choice(version, "version", GEMM_VERSIONS)
    return (a, b, bias, version), shape


# ------------------------------------------------------------------------------- conv2d
def conv2d_padding(padding, kernel: tuple[int, int], stride: tuple[int, int],
                   dilation: tuple[int, int]) -> tuple[int, int]:
    """Numeric padding from an int, a pair, 'valid' or 'same' (as F.conv2d accepts)."""
    if isinstance(padding, str):
        if padding == "valid":
            return (0, 0)
        if padding == "same":
            if stride != (1, 1):
                raise ValueError("padding='same' is not supported for strided convolutions "
                                 "(as in torch.nn.functional.conv2d)")
            totals = [d * (k - 1) for k, d in zip(kernel, dilation)]
            if any(t % 2 for t in totals):
                raise NotImplementedError(
                    "padding='same' with an even (dilated) kernel span needs asymmetric "
                    "padding, which scratchops.conv2d does not support; pad explicitly")
            return (totals[0] // 2, totals[1] // 2)
        raise ValueError(f"padding must be an int, a pair of ints, 'valid' or 'same', "
                         f"got {padding!r}")
    return as_pair(padding, "padding", 0)


def conv2d_geometry(x, weight, bias, stride, padding, dilation, groups=1):
    """The convolution part shared by conv2d and the fused operators: normalised
    (stride, padding, dilation) and the output shape for 4-D x."""
    # F.conv2d refuses 0 output channels and an empty spatial input. 0 input channels give it
    # a result with 0 output channels, not the convolution's shape: scratchops refuses them.
    check_tensor(x, "input", (4,), nonzero=(2, 3))
    if x.shape[1] == 0:
        raise ValueError(f"input has 0 channels (shape {tuple(x.shape)}): scratchops.conv2d "
                         "refuses them (F.conv2d returns a result with 0 output channels, "
                         "not the convolution's shape)")
    check_tensor(weight, "weight", (4,), nonzero=(0, 1, 2, 3))
    groups = as_int(groups, "groups")
    if groups < 1:
        raise ValueError(f"groups must be a positive int, got {groups!r}")
    if groups != 1:
        raise NotImplementedError(f"scratchops.conv2d supports groups=1 only, got {groups}")
    if weight.shape[1] != x.shape[1]:
        raise ValueError(f"weight {tuple(weight.shape)} expects {weight.shape[1]} input "
                         f"channels, input {tuple(x.shape)} has {x.shape[1]}")
    out_channels = weight.shape[0]
    if bias is not None:
        check_tensor(bias, "bias", (1,))
        if bias.shape[0] != out_channels:
            raise ValueError(f"bias must have one value per output channel "
                             f"({out_channels}), got shape {tuple(bias.shape)}")
    check_same_dtype(input=x, weight=weight, bias=bias)
    kernel = (weight.shape[2], weight.shape[3])
    if max(kernel) > GEOMETRY_MAX:
        raise ValueError(f"kernel size {kernel} exceeds {GEOMETRY_MAX}")
    stride = as_pair(stride, "stride", 1)
    dilation = as_pair(dilation, "dilation", 1)
    padding = conv2d_padding(padding, kernel, stride, dilation)
    out_h, out_w = window_output_hw(x, kernel, stride, padding, dilation, "conv2d")
    shape = (x.shape[0], out_channels, out_h, out_w)
    check_output_size(shape, "the conv2d output")
    return [list(stride), list(padding), list(dilation)], shape


def conv2d_algorithm(name) -> int:
    """The operator's number for conv2d's algorithm `name` (CONV2D_ALGORITHMS)."""
    if not isinstance(name, str):
        raise TypeError(f"algorithm must be a string, got {name!r}")
    if name not in CONV2D_ALGORITHMS:
        raise ValueError(f"algorithm must be one of {sorted(CONV2D_ALGORITHMS)}, got {name!r}")
    return CONV2D_ALGORITHMS[name]


def conv2d_args(x, weight, bias, stride, padding, dilation, algorithm, workspace_bytes,
                gemm_version, *, groups=1):
    geometry, shape = conv2d_geometry(x, weight, bias, stride, padding, dilation, groups)
    algorithm = check_choice(algorithm, "algorithm", CONV2D_ALGORITHMS.values())
    workspace_bytes = check_positive_int(workspace_bytes, "workspace_bytes")
    gemm_version = check_choice(gemm_version, "gemm_version", IM2COL_GEMM_VERSIONS)
    return (x, weight, bias, *geometry, algorithm, workspace_bytes, gemm_version), shape


def conv2d_min_add_mul_args(x, weight, conv_bias, stride, padding, dilation, constant, bias,
                            factor):
    geometry, shape = conv2d_geometry(x, weight, conv_bias, stride, padding, dilation)
    check_per_channel(bias, "bias", shape)
    check_same_dtype(input=x, bias=bias)
    return (x, weight, conv_bias, *geometry, as_float(constant, "constant"), bias,
            as_float(factor, "factor")), shape


# The one-pass P85 kernel (cuda/conv_gn_pool.cu) covers these; ModelNew picks it by them.
# (binding.cpp: kOnePassMaxChannels, kOnePassPool; tests/test_call_path.py holds them equal.)
ONE_PASS_MAX_CHANNELS = 64
ONE_PASS_POOL = 4
# What the fused backward by recomputation covers (cuda/conv_gn_pool_backward.cuh: a tile's
# region extends one pooling window up and left, so kernels up to ONE_PASS_POOL + 1).
FUSED_BACKWARD_MAX_INPUT_CHANNELS = 8
FUSED_BACKWARD_MAX_KERNEL = ONE_PASS_POOL + 1


def fused_backward_covers(weight) -> bool:
    """Whether P85's fused backward covers a call with this (Cout, Cin, kh, kw) weight's shape
    (the forward keeps for it then; whether the GPU lends its block the shared memory, the
    backward asks: _backward._fused_backward_runs)."""
    return (weight.shape[1] <= FUSED_BACKWARD_MAX_INPUT_CHANNELS
            and max(weight.shape[2:]) <= FUSED_BACKWARD_MAX_KERNEL)


def conv2d_group_norm_pool_clamp_args(x, weight, conv_bias, num_groups, gn_weight, gn_bias,
                                      scale, eps, min, max, version):
    _, conv_shape = conv2d_geometry(x, weight, conv_bias, 1, 0, 1)
    num_groups, eps = group_norm_params(conv_shape, num_groups, gn_weight, gn_bias, scale, eps)
    check_same_dtype(input=x, gn_weight=gn_weight, gn_bias=gn_bias, scale=scale)
    cout, out_h, out_w = conv_shape[1:]
    if cout > ONE_PASS_MAX_CHANNELS:
        raise NotImplementedError(f"conv2d_group_norm_pool_clamp covers at most "
                                  f"{ONE_PASS_MAX_CHANNELS} output channels, got {cout}")
    if out_h < ONE_PASS_POOL or out_w < ONE_PASS_POOL:
        raise ValueError(f"the convolution output {out_h} x {out_w} is smaller than the "
                         f"{ONE_PASS_POOL} x {ONE_PASS_POOL} pooling window")
    version = check_choice(version, "version", CONV_GN_POOL_VERSIONS)
    args = (x, weight, conv_bias, num_groups, gn_weight, gn_bias, scale, eps,
            as_float(min, "min"), as_float(max, "max"), version)
    return args, (conv_shape[0], cout, out_h // ONE_PASS_POOL, out_w // ONE_PASS_POOL)


# ------------------------------------------------------------- per-channel and pooling ops
def group_norm_params(x_shape, num_groups, weight, bias, scale, eps) -> tuple[int, float]:
    """Group norm's parameters for an input of shape x_shape: (num_groups, eps) normalised."""
    num_groups = as_int(num_groups, "num_groups")
    if num_groups <= 0:
        raise ValueError(f"num_groups must be a positive int, got {num_groups!r}")
    if x_shape[1] % num_groups != 0:
        raise ValueError(f"num_groups ({num_groups}) must divide the number of channels "
                         f"({x_shape[1]})")
    for p, name in ((weight, "weight"), (bias, "bias")):
        if p is not None:
            check_per_channel(p, name, x_shape, exact_1d=True)
    if scale is not None:
        check_per_channel(scale, "scale", x_shape)
    eps = as_float(eps, "eps")
    if not eps >= 0.0:
        raise ValueError(f"eps must be non-negative, got {eps}")
    return num_groups, eps


def group_norm_args(x, num_groups, weight, bias, scale, eps, version, *, needs_scale=False):
    """needs_scale: group_norm_scale's call, where the scale is not optional."""
    if needs_scale and scale is None:
        raise ValueError("group_norm_scale needs a scale tensor; use group_norm without one")
    check_tensor(x, "input", range(2, 9))
    num_groups, eps = group_norm_params(x.shape, num_groups, weight, bias, scale, eps)
    check_same_dtype(input=x, weight=weight, bias=bias, scale=scale)
    version = check_choice(version, "version", GROUP_NORM_VERSIONS)
    return (x, num_groups, weight, bias, scale, eps, version), tuple(x.shape)


def scale_args(x, scale):
    check_tensor(x, "input", range(2, 9))
    check_per_channel(scale, "scale", x.shape)
    check_same_dtype(input=x, scale=scale)
    return (x, scale), tuple(x.shape)


def min_add_mul_args(x, constant, bias, factor):
    check_tensor(x, "input", range(2, 9))
    constant = as_float(constant, "constant")
    factor = as_float(factor, "factor")
    check_per_channel(bias, "bias", x.shape)
    check_same_dtype(input=x, bias=bias)
    return (x, constant, bias, factor), tuple(x.shape)


def max_pool2d_clamp_args(x, kernel_size, stride, padding, min, max, version, *, dilation=1,
                          ceil_mode=False, return_indices=False):
    """dilation, ceil_mode and return_indices: F.max_pool2d's, accepted at their defaults."""
    if return_indices:
        raise NotImplementedError("scratchops.max_pool2d does not return indices")
    check_tensor(x, "input", (4,), nonzero=(1, 2, 3))  # F.max_pool2d allows only a 0 batch
    if as_pair(dilation, "dilation", 1) != (1, 1):
        raise NotImplementedError("scratchops.max_pool2d supports dilation=1 only")
    if ceil_mode:
        raise NotImplementedError("scratchops.max_pool2d supports ceil_mode=False only")
    kernel_size = as_pair(kernel_size, "kernel_size", 1)
    # F.max_pool2d: stride defaults to the kernel size (None or an empty list).
    stride = kernel_size if stride is None or (isinstance(stride, Sequence) and len(stride) == 0) \
        else as_pair(stride, "stride", 1)
    padding = as_pair(padding, "padding", 0)
    if any(2 * p > k for p, k in zip(padding, kernel_size)):
        raise ValueError(f"max_pool2d padding {padding} must be at most half the kernel size "
                         f"{kernel_size} (as in torch)")
    out_h, out_w = window_output_hw(x, kernel_size, stride, padding, (1, 1), "max_pool2d")
    shape = (x.shape[0], x.shape[1], out_h, out_w)
    check_output_size(shape, "the max_pool2d output")
    version = check_choice(version, "version", MAX_POOL2D_VERSIONS)
    args = (x, list(kernel_size), list(stride), list(padding), as_float(min, "min"),
            as_float(max, "max"), version)
    return args, shape


def clamp_bounds(min, max) -> tuple[float, float]:
    """(lo, hi) for clamp: None becomes -inf / +inf; at least one must be given (as torch)."""
    if min is None and max is None:
        raise ValueError("clamp needs at least one of min and max (as torch.clamp)")
    lo = float("-inf") if min is None else as_float(min, "min")
    hi = float("inf") if max is None else as_float(max, "max")
    return lo, hi


def clamp_args(x, min, max):
    lo, hi = clamp_bounds(min, max)
    check_tensor(x, "input", range(0, 65))
    return (x, lo, hi), tuple(x.shape)
