"""Fake (meta) implementations of the operators: each checks its arguments with the same
scratchops._validate function the public wrapper uses and returns an empty tensor of the
output's shape. scratchops._library registers them; torch.compile, opcheck, FakeTensorMode
and meta tensors run them instead of a kernel."""

from __future__ import annotations

import torch

from . import _validate
from .versions import CONV2D_ALGORITHMS, GEMM_VERSIONS, IM2COL_VERSIONS


def im2col(input, kernel_size, dilation, padding, stride, version):
    _validate.check_choice(version, "version", IM2COL_VERSIONS)
    _, shape = _validate.im2col_args(input, kernel_size, dilation, padding, stride)
    return input.new_empty(shape)


def gemm(a, b, bias, version):
    _validate.check_choice(version, "version", GEMM_VERSIONS)
    return a.new_empty(_validate.gemm_shape(a, b, bias))


def conv2d(input, weight, bias, stride, padding, dilation, algorithm, workspace_bytes,
           gemm_version):
    _validate.check_choice(algorithm, "algorithm", CONV2D_ALGORITHMS.values())
    _validate.check_positive_int(workspace_bytes, "workspace_bytes")
    _validate.check_choice(gemm_version, "gemm_version", GEMM_VERSIONS)
    _, shape = _validate.conv2d_args(input, weight, bias, stride, padding, dilation, 1)
    return input.new_empty(shape)


def conv2d_pack_weight(weight):
    return weight.new_empty(_validate.pack_weight_args(weight), dtype=torch.uint8)


def conv2d_min_add_mul(input, weight, conv_bias, stride, padding, dilation, constant, bias,
                       factor, packed_weight):
    *_, shape = _validate.conv2d_min_add_mul_args(input, weight, conv_bias, stride, padding,
                                                  dilation, constant, bias, factor, packed_weight)
    return input.new_empty(shape)


def conv2d_group_norm_pool_clamp(input, weight, conv_bias, num_groups, gn_weight, gn_bias, scale,
                                 eps, min, max, packed_weight):
    _, shape = _validate.conv2d_group_norm_pool_clamp_args(
        input, weight, conv_bias, num_groups, gn_weight, gn_bias, scale, eps, min, max,
        packed_weight)
    return input.new_empty(shape)


def group_norm(input, num_groups, weight, bias, scale, eps):
    _validate.group_norm_args(input, num_groups, weight, bias, scale, eps)
    return torch.empty_like(input)


def scale(input, scale):
    _validate.check_tensor(input, "input", range(2, 9))
    _validate.check_per_channel(scale, "scale", input.shape)
    return torch.empty_like(input)


def min_add_mul(input, constant, bias, factor):
    _validate.check_tensor(input, "input", range(2, 9))
    _validate.check_per_channel(bias, "bias", input.shape)
    return torch.empty_like(input)


def max_pool2d_clamp(input, kernel_size, stride, padding, min, max):
    _, shape = _validate.pool_args(input, kernel_size, stride, padding)
    return input.new_empty(shape)


def clamp(input, min, max):
    _validate.check_tensor(input, "input", range(0, 65))
    return torch.empty_like(input)
