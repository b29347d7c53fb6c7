"""KernelBench level 2, problem 85: Conv2d -> GroupNorm -> x * scale -> MaxPool2d -> clamp.

`Model` is KernelBench's reference as it defines it; `ModelNew` holds the same parameters
(same names, shapes, and initialisation drawn in the same order, so one seed builds equal
models and state_dicts load across) and runs its forward on scratchops kernels only.
"""

import torch
import torch.nn as nn

import scratchops

NAME = "85_Conv2d_GroupNorm_Scale_MaxPool_Clamp"


class Model(nn.Module):
    """Convolution, group normalization, scaling, max pooling, and clamping."""

    def __init__(self, in_channels, out_channels, kernel_size, num_groups, scale_shape,
                 maxpool_kernel_size, clamp_min, clamp_max):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(num_groups, out_channels)
        self.scale = nn.Parameter(torch.ones(scale_shape))
        self.maxpool = nn.MaxPool2d(kernel_size=maxpool_kernel_size)
        self.clamp_min = clamp_min
        self.clamp_max = clamp_max

    def forward(self, x):
        x = self.conv(x)
        x = self.group_norm(x)
        x = x * self.scale
        x = self.maxpool(x)
        x = torch.clamp(x, self.clamp_min, self.clamp_max)
        return x


class ModelNew(Model):
    """Model's forward on scratchops kernels.

    Subclassing Model keeps the constructor, the parameter names and shapes and the order of
    their random initialisation identical, so one seed builds equal models.
    fused=True (default, the faster chain): conv2d -> group_norm_scale -> max_pool2d_clamp,
    three kernel stages. fused=False: every op on its own, conv2d -> group_norm -> scale ->
    max_pool2d -> clamp, the educational chain.
    """

    def __init__(self, *init_inputs, fused=True):
        super().__init__(*init_inputs)
        self.fused = fused

    def forward(self, x):
        conv, gn, pool = self.conv, self.group_norm, self.maxpool
        x = scratchops.conv2d(x, conv.weight, conv.bias, conv.stride, conv.padding,
                              conv.dilation)
        if self.fused:
            x = scratchops.group_norm_scale(x, gn.num_groups, gn.weight, gn.bias, self.scale,
                                            gn.eps)
            return scratchops.max_pool2d_clamp(x, pool.kernel_size, pool.stride, pool.padding,
                                               self.clamp_min, self.clamp_max)
        x = scratchops.group_norm(x, gn.num_groups, gn.weight, gn.bias, gn.eps)
        x = scratchops.scale(x, self.scale)
        x = scratchops.max_pool2d(x, pool.kernel_size, pool.stride, pool.padding)
        return scratchops.clamp(x, self.clamp_min, self.clamp_max)


# ModelNew constructor options, by label (used by the tests and `scratchops run`).
VARIANTS = {"fused": {"fused": True}, "unfused": {"fused": False}}

batch_size = 128
in_channels = 8
out_channels = 64
height, width = 128, 128
kernel_size = 3
num_groups = 16
scale_shape = (out_channels, 1, 1)
maxpool_kernel_size = 4
clamp_min = 0.0
clamp_max = 1.0


def get_inputs():
    return [torch.rand(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, num_groups, scale_shape,
            maxpool_kernel_size, clamp_min, clamp_max]
