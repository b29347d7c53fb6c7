"""KernelBench level 2, problem 85: Conv2d -> GroupNorm -> x * scale -> MaxPool2d -> clamp.

`Model` is KernelBench's reference as it defines it; `ModelNew` holds the same parameters
(same names, shapes, and initialisation drawn in the same order, so one seed builds equal
models and state_dicts load across) and runs its forward on scratchops kernels only.
"""

import torch
import torch.nn as nn

import scratchops
from scratchops._validate import ONE_PASS_MAX_CHANNELS, ONE_PASS_POOL

from .members import member

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
    """Model's forward on scratchops kernels only. Subclassing Model keeps the constructor,
    the parameter names and shapes and the order of their random initialisation identical,
    so one seed builds equal models.

    variant="one_pass" (default): conv2d_group_norm_pool_clamp, one pass over the input on the
        tensor cores (sm_80+ GPUs): the convolution's epilogue writes group statistics and
        pooling-window extremes instead of its output, and a finalize kernel writes the
        result: two kernels a forward on an sm_90 GPU, whose pass reads the weights
        straight from the weight tensor; three on the mma.sync engine, which packs them first
        (every call: nothing is kept between forwards).
        The rule: it is used when the max pool is 4 x 4 (stride 4, no padding), the
        convolution has at most 64 output channels and its output is at least 4 x 4;
        otherwise this variant runs the "fused" chain.
    variant="fused": conv2d (implicit GEMM, tensor cores) -> group_norm_scale ->
        max_pool2d_clamp, three stages. sm_80+ GPUs.
    variant="unfused": every op on its own, conv2d (im2col + gemm, default gemm_version) ->
        group_norm -> scale -> max_pool2d -> clamp: the educational chain, any GPU.
    """

    def __init__(self, *init_inputs, variant="one_pass"):
        super().__init__(*init_inputs)
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {sorted(VARIANTS)}, got {variant!r}")
        self.variant = variant

    def one_pass_covers(self, x, conv=None, pool=None) -> bool:
        """The rule above, for input x (and a convolution of stride 1, no padding or
        dilation, as the one-pass operator computes); conv and pool: self.conv and
        self.maxpool where the caller has them."""
        conv = member(self, "conv") if conv is None else conv
        pool = member(self, "maxpool") if pool is None else pool
        window = pool.kernel_size
        return ((window == ONE_PASS_POOL or window == (ONE_PASS_POOL, ONE_PASS_POOL))
                and (pool.stride is None or pool.stride == window) and pool.padding == 0
                and pool.dilation == 1 and not pool.ceil_mode
                and conv.stride == (1, 1) and conv.padding == (0, 0) and conv.dilation == (1, 1)
                and conv.out_channels <= ONE_PASS_MAX_CHANNELS
                and x.shape[-2] - conv.kernel_size[0] + 1 >= ONE_PASS_POOL
                and x.shape[-1] - conv.kernel_size[1] + 1 >= ONE_PASS_POOL)

    def forward(self, x):
        # (member(m, n): m.n, a microsecond cheaper a lookup; members.py says why)
        conv, gn, pool = member(self, "conv"), member(self, "group_norm"), member(self, "maxpool")
        weight, conv_bias = member(conv, "weight"), member(conv, "bias")
        gn_weight, gn_bias, scale = member(gn, "weight"), member(gn, "bias"), member(self, "scale")
        if self.variant == "one_pass" and self.one_pass_covers(x, conv, pool):
            return scratchops.conv2d_group_norm_pool_clamp(
                x, weight, conv_bias, gn.num_groups, gn_weight, gn_bias, scale, gn.eps,
                self.clamp_min, self.clamp_max)
        if self.variant in ("one_pass", "fused"):
            x = scratchops.conv2d(x, weight, conv_bias, conv.stride, conv.padding,
                                  conv.dilation, algorithm="implicit_gemm")
            x = scratchops.group_norm_scale(x, gn.num_groups, gn_weight, gn_bias, scale, gn.eps)
            return scratchops.max_pool2d_clamp(x, pool.kernel_size, pool.stride, pool.padding,
                                               self.clamp_min, self.clamp_max)
        x = scratchops.conv2d(x, weight, conv_bias, conv.stride, conv.padding, conv.dilation,
                              algorithm="im2col_gemm")
        x = scratchops.group_norm(x, gn.num_groups, gn_weight, gn_bias, gn.eps)
        x = scratchops.scale(x, scale)
        x = scratchops.max_pool2d(x, pool.kernel_size, pool.stride, pool.padding)
        return scratchops.clamp(x, self.clamp_min, self.clamp_max)


# ModelNew constructor options, by label (used by the tests and `scratchops run`).
VARIANTS = {"one_pass": {"variant": "one_pass"}, "fused": {"variant": "fused"},
            "unfused": {"variant": "unfused"}}

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
