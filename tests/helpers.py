"""Shared test helpers: GPU skip marker, fresh random inputs, output poisoning, comparisons."""

import math

import pytest
import torch

HAS_GPU = torch.cuda.is_available()
requires_gpu = pytest.mark.skipif(
    not HAS_GPU, reason="needs a CUDA GPU (none here); scripts/gpu_check.sh runs these on one")

ATOL = RTOL = 1e-4


def rand(*shape, low=-1.0, high=1.0, device="cuda"):
    """Fresh uniform random float32 values (the global generator moves on every call)."""
    return torch.empty(shape, device=device).uniform_(low, high)


def poison_next(*shape):
    """Leave a NaN-filled block of this many floats in torch's caching allocator, so that the
    next allocation of that size (the kernel's output) starts as NaN and an element the
    kernel fails to write makes the comparison fail. test_poison_reaches_next_allocation
    checks that the allocator hands this block back."""
    block = torch.full((math.prod(shape),), float("nan"), device="cuda")
    del block


def assert_matches(out, ref32, ref64, *, atol=ATOL, rtol=RTOL, equal_nan=False):
    """out against torch's fp32 result and a float64 reference; NaN fails unless equal_nan
    (for inputs where torch itself defines NaN results, and then in the same places)."""
    assert out.dtype == torch.float32 and out.shape == ref32.shape == ref64.shape, \
        (out.dtype, out.shape, ref32.shape, ref64.shape)
    torch.testing.assert_close(out, ref32, atol=atol, rtol=rtol, equal_nan=equal_nan)
    torch.testing.assert_close(out.double(), ref64, atol=atol, rtol=rtol, equal_nan=equal_nan)
