"""Fake (meta) implementations of the operators: each checks its arguments with the
scratchops._validate function its public wrapper uses and returns an empty tensor of the
output's shape. scratchops._library registers them; torch.compile, opcheck, FakeTensorMode
and meta tensors run them instead of a kernel."""

from __future__ import annotations

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
