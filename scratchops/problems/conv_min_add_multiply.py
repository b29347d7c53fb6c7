"""KernelBench level 2, problem 31: Conv2d -> min(x, constant) -> + bias -> * factor.

`Model` is KernelBench's reference as it defines it; `ModelNew` holds the same parameters
(same names, shapes, and initialisation drawn in the same order, so one seed builds equal
models and state_dicts load across) and runs its forward on scratchops kernels only.
"""

import torch
import torch.nn as nn

import scratchops

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
    """Model's forward on scratchops kernels: conv2d (im2col + GEMM, its bias in the GEMM's
    store) -> min_add_mul (the three elementwise ops in one pass). Subclassing Model keeps
    the constructor, parameters and initialisation order identical."""

    def forward(self, x):
        conv = self.conv
        x = scratchops.conv2d(x, conv.weight, conv.bias, conv.stride, conv.padding,
                              conv.dilation)
        return scratchops.min_add_mul(x, self.constant_value, self.bias, self.scaling_factor)


# ModelNew constructor options, by label (used by the tests and `scratchops run`).
VARIANTS = {"default": {}}

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
