"""KernelBench level 2, problem 31: Conv2d -> min(x, constant) -> + bias -> * factor.

`Model` is KernelBench's reference as it defines it; `ModelNew` holds the same parameters
(same names, shapes, and initialisation drawn in the same order, so one seed builds equal
models and state_dicts load across) and runs its forward on scratchops kernels only.
"""

import torch
import torch.nn as nn

import scratchops

from .members import member

NAME = "31_Conv2d_Min_Add_Multiply"


class Model(nn.Module):
    """A convolution, the minimum with a constant, a bias term, and a scaling factor."""

    def __init__(self, in_channels, out_channels, kernel_size, constant_value, bias_shape,
                 scaling_factor):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.constant_value = constant_value
        self.bias = nn.Parameter(torch.randn(bias_shape))
        self.scaling_factor = scaling_factor

    def forward(self, x):
        x = self.conv(x)
        x = torch.min(x, torch.tensor(self.constant_value))
        x = x + self.bias
        x = x * self.scaling_factor
        return x


class ModelNew(Model):
    """Model's forward on scratchops kernels only. Subclassing Model keeps the constructor,
    parameters and initialisation order identical.

    variant="one_kernel" (default): conv2d_min_add_mul, the convolution on the tensor cores
        (fp32-accurate 3xTF32, or TF32 where torch's switch and rule say so) with min,
        + bias and * factor in its store: one kernel per forward, after the weights are
        packed for it (a small kernel, every call: nothing is kept between forwards).
        sm_80+ GPUs.
    variant="chain": conv2d (implicit GEMM, tensor cores) -> min_add_mul. sm_80+ GPUs.
    variant="im2col": conv2d as im2col + gemm (default gemm_version, CUDA cores) ->
        min_add_mul: the educational chain, any GPU.
    """

    def __init__(self, *init_inputs, variant="one_kernel"):
        super().__init__(*init_inputs)
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {sorted(VARIANTS)}, got {variant!r}")
        self.variant = variant

    def forward(self, x):
        conv = member(self, "conv")  # (member(m, n): m.n, a microsecond cheaper)
        weight, conv_bias = member(conv, "weight"), member(conv, "bias")
        bias = member(self, "bias")
        if self.variant == "one_kernel":
            return scratchops.conv2d_min_add_mul(
                x, weight, conv_bias, self.constant_value, bias, self.scaling_factor,
                conv.stride, conv.padding, conv.dilation)
        algorithm = "implicit_gemm" if self.variant == "chain" else "im2col_gemm"
        x = scratchops.conv2d(x, weight, conv_bias, conv.stride, conv.padding, conv.dilation,
                              algorithm=algorithm)
        return scratchops.min_add_mul(x, self.constant_value, bias, self.scaling_factor)


# ModelNew constructor options, by label (used by the tests and `scratchops run`).
VARIANTS = {"one_kernel": {"variant": "one_kernel"}, "chain": {"variant": "chain"},
            "im2col": {"variant": "im2col"}}

batch_size = 128
in_channels = 64
out_channels = 128
height, width = 128, 128
kernel_size = 3
constant_value = 0.5
bias_shape = (out_channels, 1, 1)
scaling_factor = 2.0


def get_inputs():
    return [torch.rand(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, constant_value, bias_shape, scaling_factor]
