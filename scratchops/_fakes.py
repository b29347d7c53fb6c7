"""Fake (meta) implementations of the operators: each checks its arguments with the
scratchops._validate function its public wrapper uses and returns an empty tensor of the
output's shape. scratchops._library registers them; torch.compile, opcheck, FakeTensorMode
and meta tensors run them instead of a kernel."""

from __future__ import annotations

import torch

from . import _validate


def _fake(name: str):
    check = getattr(_validate, f"{name}_args")

    def fake(*args):
        _, shape = check(*args)
        return args[0].new_empty(shape)

    fake.__name__ = name
    return fake


im2col = _fake("im2col")
gemm = _fake("gemm")
conv2d = _fake("conv2d")
conv2d_min_add_mul = _fake("conv2d_min_add_mul")
conv2d_group_norm_pool_clamp = _fake("conv2d_group_norm_pool_clamp")
group_norm = _fake("group_norm")
scale = _fake("scale")
min_add_mul = _fake("min_add_mul")
max_pool2d_clamp = _fake("max_pool2d_clamp")
clamp = _fake("clamp")


# The private forward operators that keep what their backward needs
# (scratchops._library.KEEPING_SCHEMAS): the public operator's output and the kept tensor.
def _conv2d_min_add_mul_keeping(*args):
    _, shape = _validate.conv2d_min_add_mul_args(*args)
    return args[0].new_empty(shape), args[0].new_empty(shape, dtype=torch.uint8)


def _conv2d_group_norm_pool_clamp_keeping(*args):
    checked, shape = _validate.conv2d_group_norm_pool_clamp_args(*args)
    x, num_groups = checked[0], checked[3]
    return (x.new_empty(shape), x.new_empty(shape, dtype=torch.float32),
            x.new_empty((x.shape[0], num_groups, 2), dtype=torch.float32))


# The private backward operators (scratchops._library.BACKWARD_SCHEMAS): only scratchops'
# backward formulas call them, with tensors their forward checked, so the fakes give the shape.
def _col2im(grad, input_size, kernel_size, dilation, padding, stride):
    channels = grad.shape[1] // (kernel_size[0] * kernel_size[1])
    return grad.new_empty((grad.shape[0], channels, *input_size))


def _conv2d_input_grad(grad, weight, input_size, stride, padding, dilation, workspace_bytes,
                       gemm_version):
    return grad.new_empty(input_size)


def _conv2d_weight_grad(grad, input, weight_size, stride, padding, dilation, workspace_bytes,
                        gemm_version):
    return grad.new_empty(weight_size)


def _conv2d_grads(grad, input, weight, stride, padding, dilation, workspace_bytes, gemm_version):
    return grad.new_empty(input.shape), grad.new_empty(weight.shape)


def _channel_sums(input, other, factor):
    return input.new_empty((input.shape[1],))


def _transpose(input):
    return input.new_empty((*input.shape[:-2], input.shape[-1], input.shape[-2]))


def _batch_sum(input):
    return input.new_empty(input.shape[1:])


def _group_norm_backward(grad, input, num_groups, weight, bias, scale, eps):
    def param(p):
        return input.new_empty(p.shape if p is not None else (0,))

    return input.new_empty(input.shape), param(weight), param(bias), param(scale)


def _max_pool2d_clamp_backward(grad, input, kernel_size, stride, padding, min, max):
    return input.new_empty(input.shape)


def _clamp_backward(grad, input, min, max):
    return input.new_empty(input.shape)


def _min_add_mul_backward(grad, input, constant, factor):
    return input.new_empty(input.shape)


def _min_add_mul_backward_kept(grad, halves, factor):
    return (grad.new_empty(grad.shape), grad.new_empty((grad.shape[1],)),
            grad.new_empty((grad.shape[1],)))


def _conv2d_min_add_mul_grads_kept(grad, halves, input, weight, factor, stride, padding,
                                   dilation, workspace_bytes, gemm_version):
    channels = (grad.shape[1],)
    return (grad.new_empty(input.shape), grad.new_empty(weight.shape), grad.new_empty(channels),
            grad.new_empty(channels))


def _conv2d_group_norm_pool_clamp_backward_kept(grad, input, weight, conv_bias, num_groups,
                                                gn_weight, gn_bias, scale, extremes, stats, min,
                                                max):
    cout = weight.shape[0]
    return (input.new_empty(input.shape), input.new_empty(weight.shape), input.new_empty((cout,)),
            input.new_empty((3, cout)))
