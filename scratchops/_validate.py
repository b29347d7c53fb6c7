"""Argument checks shared by the public functions (scratchops.ops) and the fake kernels.

Everything here runs on any device, meta and fake tensors included, so the checks are
testable without a GPU and the fake kernels reject exactly what the real ones reject. The
device check (`check_cuda`) is separate because fake tensors may stand on any device.

Errors: TypeError for a wrong Python type or dtype (a bool, string, float or None where an
int is expected included), ValueError for a wrong rank, shape, layout or value,
NotImplementedError for a torch feature scratchops does not cover. What torch accepts is
accepted: numpy and 0-dim torch integers, one-element lists for pairs, numbers as Python or
numpy scalars or 0-dim tensors. Empty tensors behave as torch's counterparts: an empty result
of the right shape where torch gives one, a ValueError where torch refuses (and for conv2d's
0 input channels, where torch's result has the wrong shape). tests/test_like_torch.py
compares each with torch.
"""

from __future__ import annotations

import numbers
import operator
from collections.abc import Sequence

import torch

INT32_MAX = 2**31 - 1
# Kernel geometry (kernel size, stride, padding, dilation) is capped so that index arithmetic
# such as oh*stride + kh*dilation stays far inside 32 bits.
GEOMETRY_MAX = 65535


def check_tensor(t, name: str, ndims: Sequence[int], nonzero: Sequence[int] = ()) -> None:
    """A float32, contiguous tensor of one of the ranks `ndims`, 32-bit indexable, whose
    dimensions `nonzero` (indices) are not 0 (where torch's counterpart refuses them)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.float32:
        raise TypeError(f"{name} must be float32, got {t.dtype} "
                        "(scratchops kernels are fp32-only for now)")
    if t.dim() not in ndims:
        ranks = " or ".join(f"{n}-D" for n in ndims)
        raise ValueError(f"{name} must be {ranks}, got a {t.dim()}-D tensor "
                         f"of shape {tuple(t.shape)}")
    if any(t.shape[d] == 0 for d in nonzero):
        raise ValueError(f"{name} has a zero-size dimension where torch refuses one (shape "
                         f"{tuple(t.shape)}; dimensions {list(nonzero)} must be non-zero)")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (row-major / NCHW); scratchops does not "
                         f"copy silently: pass {name}.contiguous()")
    if t.numel() > INT32_MAX:
        raise ValueError(f"{name} has {t.numel()} elements; scratchops kernels index with "
                         f"32-bit integers (at most {INT32_MAX})")


def check_output_size(numel, what: str) -> None:
    if numel > INT32_MAX:
        raise ValueError(f"{what} would have {numel} elements; scratchops kernels index with "
                         f"32-bit integers (at most {INT32_MAX})")


def check_cuda(**tensors) -> None:
    """Every given tensor (None skipped) is a CUDA tensor, all on one device. Meta tensors
    pass too: they carry no data and only trace shapes (FakeTensorMode's fake CUDA tensors
    report the CUDA device)."""
    device = None
    for name, t in tensors.items():
        if t is None:
            continue
        if t.device.type not in ("cuda", "meta"):
            raise ValueError(f"{name} must be a CUDA tensor, got one on {t.device} "
                             "(scratchops runs on the GPU only; meta tensors trace shapes)")
        if device is None:
            device, first = t.device, name
        elif t.device != device:
            raise ValueError(f"{name} is on {t.device} but {first} is on {device}")


def as_int(value, name: str) -> int:
    """An integer scalar as an int: Python, numpy or 0-dim torch integers (operator.index);
    a bool (a bool tensor too), float, string or anything else is a TypeError, as in torch."""
    if isinstance(value, bool) or (isinstance(value, torch.Tensor) and (
            value.dim() != 0 or value.is_floating_point() or value.dtype == torch.bool)):
        raise TypeError(f"{name} must be an int, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {value!r}") from None


def as_pair(value, name: str, minimum: int) -> tuple[int, int]:
    """An int or a pair of ints (a sequence of one int counts as that int, as in F.conv2d and
    F.max_pool2d), each >= minimum and <= GEOMETRY_MAX, as a 2-tuple."""
    if isinstance(value, Sequence) and not isinstance(value, str):
        if len(value) not in (1, 2):
            raise TypeError(f"{name} must be an int or a pair of ints, got {value!r}")
        pair = tuple(as_int(v, name) for v in value) * (3 - len(value))
    else:
        try:
            pair = (as_int(value, name),) * 2
        except TypeError:
            raise TypeError(f"{name} must be an int or a pair of ints, got {value!r}") from None
    for v in pair:
        if v < minimum or v > GEOMETRY_MAX:
            raise ValueError(f"{name} must be in [{minimum}, {GEOMETRY_MAX}], got {value!r}")
    return pair


def check_choice(value, name: str, choices) -> int:
    """One of `choices` (ints): TypeError for a non-int, ValueError for another int."""
    value = as_int(value, name)
    if value not in choices:
        raise ValueError(f"{name} must be one of {sorted(choices)}, got {value!r}")
    return value


def check_positive_int(value, name: str) -> int:
    value = as_int(value, name)
    if value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def conv_output_hw(x: torch.Tensor, kernel: tuple[int, int], stride: tuple[int, int],
                   padding: tuple[int, int], dilation: tuple[int, int], what: str):
    """(out_h, out_w) of a convolution window sliding over x's last two dimensions."""
    sizes = []
    for dim, axis in ((-2, "height"), (-1, "width")):
        i = 0 if dim == -2 else 1
        padded = x.shape[dim] + 2 * padding[i]
        span = dilation[i] * (kernel[i] - 1) + 1
        if padded > INT32_MAX:
            raise ValueError(f"{what}: padded input {axis} {padded} overflows 32-bit indexing")
        if padded < span:
            raise ValueError(
                f"{what}: the kernel spans {span} along the {axis} (kernel {kernel[i]}, "
                f"dilation {dilation[i]}) but the padded input {axis} is only {padded} "
                f"(input {x.shape[dim]}, padding {padding[i]}): the output would be empty")
        sizes.append((padded - span) // stride[i] + 1)
    return sizes[0], sizes[1]


# ---------------------------------------------------------------------------- per op
def im2col_args(x, kernel_size, dilation, padding, stride):
    """Normalised (kernel_size, dilation, padding, stride) and the 3-D output shape for 4-D x."""
    check_tensor(x, "input", (4,), nonzero=(1, 2, 3))  # F.unfold allows only a 0 batch
    kernel_size = as_pair(kernel_size, "kernel_size", 1)
    dilation = as_pair(dilation, "dilation", 1)
    padding = as_pair(padding, "padding", 0)
    stride = as_pair(stride, "stride", 1)
    out_h, out_w = conv_output_hw(x, kernel_size, stride, padding, dilation, "im2col")
    shape = (x.shape[0], x.shape[1] * kernel_size[0] * kernel_size[1], out_h * out_w)
    check_output_size(shape[0] * shape[1] * shape[2], "the im2col output")
    return (kernel_size, dilation, padding, stride), shape


def gemm_shape(a, b, bias):
    """Output shape of a @ b (+ bias per row), checking every operand."""
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
    if a.dim() == 2 and b.dim() == 2:
        shape = (m, n)
    else:
        shape = (a.shape[0] if a.dim() == 3 else b.shape[0], m, n)
    numel = 1
    for s in shape:
        numel = numel * s
    check_output_size(numel, "the gemm output")
    return shape


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


def conv2d_args(x, weight, bias, stride, padding, dilation, groups):
    """Normalised (stride, padding, dilation) and the output shape for 4-D x."""
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
    kernel = (weight.shape[2], weight.shape[3])
    if max(kernel) > GEOMETRY_MAX:
        raise ValueError(f"kernel size {kernel} exceeds {GEOMETRY_MAX}")
    stride = as_pair(stride, "stride", 1)
    dilation = as_pair(dilation, "dilation", 1)
    padding = conv2d_padding(padding, kernel, stride, dilation)
    out_h, out_w = conv_output_hw(x, kernel, stride, padding, dilation, "conv2d")
    shape = (x.shape[0], out_channels, out_h, out_w)
    check_output_size(shape[0] * shape[1] * shape[2] * shape[3], "the conv2d output")
    return (stride, padding, dilation), shape


def as_float(value, name: str) -> float:
    """A real number as a float: Python or numpy numbers (bools included) and 0-dim real
    tensors, as torch's number arguments take them; a string, None or anything else is a
    TypeError."""
    if isinstance(value, torch.Tensor):
        if value.dim() != 0 or value.is_complex():
            raise TypeError(f"{name} must be a real number, got a tensor of shape "
                            f"{tuple(value.shape)} and dtype {value.dtype}")
        return float(value)
    if not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    return float(value)


def check_per_channel(p, name: str, x_shape, *, exact_1d: bool = False) -> None:
    """p holds one value per channel of an input of shape (N, C, *): shape (C,), or
    (C, 1, ..., 1) with one trailing 1 per dimension after C, which is how it broadcasts
    against the input channel-wise (a (C, 1) against (N, C, H, W) would broadcast along H
    instead, so it is refused). exact_1d: only (C,) (as F.group_norm's weight and bias)."""
    x_shape = tuple(x_shape)
    channels = x_shape[1]
    check_tensor(p, name, range(1, 9))
    shapes = [(channels,)]
    if not exact_1d and len(x_shape) > 2:
        shapes.append((channels,) + (1,) * (len(x_shape) - 2))
    if tuple(p.shape) not in shapes:
        allowed = " or ".join(str(s) for s in shapes)
        raise ValueError(f"{name} must have shape {allowed} for an input of shape "
                         f"{x_shape}, got {tuple(p.shape)}")


def group_norm_params(x_shape, num_groups, weight, bias, scale, eps) -> float:
    """Checks group norm's parameters for an input of shape x_shape; returns eps as a float."""
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
    return eps


def group_norm_args(x, num_groups, weight, bias, scale, eps) -> float:
    """Checks group norm's arguments; returns eps as a float."""
    check_tensor(x, "input", range(2, 9))
    return group_norm_params(x.shape, num_groups, weight, bias, scale, eps)


def pool_args(x, kernel_size, stride, padding, dilation=1, ceil_mode=False):
    """Normalised (kernel_size, stride, padding) and output shape of a max pool over 4-D x."""
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
    out_h, out_w = conv_output_hw(x, kernel_size, stride, padding, (1, 1), "max_pool2d")
    return (kernel_size, stride, padding), (x.shape[0], x.shape[1], out_h, out_w)


def clamp_bounds(min, max) -> tuple[float, float]:
    """(lo, hi) for clamp: None becomes -inf / +inf; at least one must be given (as torch)."""
    if min is None and max is None:
        raise ValueError("clamp needs at least one of min and max (as torch.clamp)")
    lo = float("-inf") if min is None else as_float(min, "min")
    hi = float("inf") if max is None else as_float(max, "max")
    return lo, hi


# ------------------------------------------------------------ fused tensor-core operators
# The packed weights of the tensor-core convolutions (cuda/conv_implicit.cu, tf32x3.cuh):
# per tile of 64 (Cout <= 64) or 128 output channels and k-block of 32, three tiles of
# tile-width x 128 bytes, then 256 four-byte flags.
def packed_weight_bytes(weight_shape) -> int:
    cout, cin, kh, kw = weight_shape
    width = 64 if cout <= 64 else 128
    k_blocks = -(-(kh * kw * (-(-cin // 8) * 8)) // 32)
    return -(-cout // width) * k_blocks * 3 * width * 128 + 256 * 4


def check_packed_weight(packed, weight) -> None:
    """packed is None or what conv2d_pack_weight(weight) returns."""
    if packed is None:
        return
    if not isinstance(packed, torch.Tensor):
        raise TypeError(f"packed_weight must be a torch.Tensor, got {type(packed).__name__}")
    if packed.dtype != torch.uint8 or tuple(packed.shape) != (packed_weight_bytes(weight.shape),):
        raise ValueError("packed_weight must be conv2d_pack_weight(weight) for this weight "
                         f"(uint8, {packed_weight_bytes(weight.shape)} bytes)")


def pack_weight_args(weight) -> tuple[int]:
    check_tensor(weight, "weight", (4,), nonzero=(0, 1, 2, 3))
    if max(weight.shape[2:]) > GEOMETRY_MAX:
        raise ValueError(f"kernel size {tuple(weight.shape[2:])} exceeds {GEOMETRY_MAX}")
    return (packed_weight_bytes(weight.shape),)


def conv2d_min_add_mul_args(x, weight, conv_bias, stride, padding, dilation, constant, bias,
                            factor, packed_weight):
    """Normalised (stride, padding, dilation), (constant, factor) and the output shape."""
    geometry, shape = conv2d_args(x, weight, conv_bias, stride, padding, dilation, 1)
    check_per_channel(bias, "bias", shape)
    check_packed_weight(packed_weight, weight)
    return geometry, (as_float(constant, "constant"), as_float(factor, "factor")), shape


# The one-pass P85 kernel (cuda/conv_gn_pool.cu) covers these; ModelNew picks it by them.
ONE_PASS_MAX_CHANNELS = 64
ONE_PASS_POOL = 4


def conv2d_group_norm_pool_clamp_args(x, weight, conv_bias, num_groups, gn_weight, gn_bias, scale,
                                      eps, lo, hi, packed_weight):
    """Checks the one-pass P85 operator's arguments; returns (eps, lo, hi) and the output
    shape (N, Cout, OH // 4, OW // 4)."""
    _, conv_shape = conv2d_args(x, weight, conv_bias, 1, 0, 1, 1)
    eps = group_norm_params(conv_shape, num_groups, gn_weight, gn_bias, scale, eps)
    cout, out_h, out_w = conv_shape[1:]
    if cout > ONE_PASS_MAX_CHANNELS:
        raise NotImplementedError(f"conv2d_group_norm_pool_clamp covers at most "
                                  f"{ONE_PASS_MAX_CHANNELS} output channels, got {cout}")
    if out_h < ONE_PASS_POOL or out_w < ONE_PASS_POOL:
        raise ValueError(f"the convolution output {out_h} x {out_w} is smaller than the "
                         f"{ONE_PASS_POOL} x {ONE_PASS_POOL} pooling window")
    check_packed_weight(packed_weight, weight)
    lo, hi = as_float(lo, "min"), as_float(hi, "max")
    return (eps, lo, hi), (conv_shape[0], cout, out_h // ONE_PASS_POOL, out_w // ONE_PASS_POOL)
