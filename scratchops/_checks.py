"""The building blocks of argument validation: tensor checks and scalar coercion.

scratchops._validate composes these into one `<op>_args` function per operator. Everything
here runs on any device, meta and fake tensors included. The device check (`check_cuda`) is
separate because fake tensors may stand on any device.

Errors: TypeError for a wrong Python type or dtype (a bool, string, float or None where an
int is expected included), ValueError for a wrong rank, shape, layout or value. What torch
accepts is accepted: numpy and 0-dim torch integers, one-element lists for pairs, numbers as
Python or numpy scalars or 0-dim tensors.
"""

from __future__ import annotations

import numbers
import operator
from collections.abc import Sequence

import torch

INT32_MAX = 2**31 - 1
# Kernel geometry (kernel size, stride, padding, dilation) is capped so that index arithmetic
# such as oh*stride + kh*dilation stays far inside 32 bits (binding.cpp: kMaxGeometry).
GEOMETRY_MAX = 65535
# The element types every operator takes (cuda/element.cuh), all of a call's tensors one of
# them: arithmetic in float32, the result rounded once to the inputs' dtype.
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_tensor(t, name: str, ndims: Sequence[int], nonzero: Sequence[int] = ()) -> None:
    """A contiguous tensor of one of DTYPES and of the ranks `ndims`, 32-bit indexable, whose
    dimensions `nonzero` (indices) are not 0 (where torch's counterpart refuses them)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in DTYPES:
        raise TypeError(f"{name} must be float32, float16 or bfloat16, got {t.dtype} "
                        "(scratchops kernels cover these three)")
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


def check_output_size(shape, what: str) -> None:
    """An output of this shape is 32-bit indexable."""
    numel = 1
    for s in shape:
        numel *= s
    if numel > INT32_MAX:
        raise ValueError(f"{what} would have {numel} elements; scratchops kernels index with "
                         f"32-bit integers (at most {INT32_MAX})")


def check_same_dtype(**tensors) -> None:
    """Every given tensor (None skipped) has the first one's dtype: an operator computes in
    one element type and does not convert its arguments silently."""
    dtype = None
    for name, t in tensors.items():
        if t is None:
            continue
        if dtype is None:
            dtype, first = t.dtype, name
        elif t.dtype != dtype:
            raise TypeError(f"{name} is {t.dtype} but {first} is {dtype}: a scratchops "
                            f"operator takes tensors of one dtype (convert with .to({dtype}))")


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


def window_output_hw(x: torch.Tensor, kernel: tuple[int, int], stride: tuple[int, int],
                     padding: tuple[int, int], dilation: tuple[int, int], what: str):
    """(out_h, out_w) of a window (convolution, im2col, pooling) sliding over x's last two
    dimensions; a ValueError where the output would be empty or overflow 32 bits."""
    sizes = []
    for i, axis in enumerate(("height", "width")):
        size = x.shape[i - 2]
        padded = size + 2 * padding[i]
        span = dilation[i] * (kernel[i] - 1) + 1
        if padded > INT32_MAX:
            raise ValueError(f"{what}: padded input {axis} {padded} overflows 32-bit indexing")
        if padded < span:
            raise ValueError(
                f"{what}: the kernel spans {span} along the {axis} (kernel {kernel[i]}, "
                f"dilation {dilation[i]}) but the padded input {axis} is only {padded} "
                f"(input {size}, padding {padding[i]}): the output would be empty")
        sizes.append((padded - span) // stride[i] + 1)
    return sizes[0], sizes[1]
