"""Shared test helpers: GPU skip marker, fresh random inputs, output poisoning, comparisons."""

import math

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from scratchops.tools.report import ATOL, RTOL  # KernelBench's tolerance, defined once

HAS_GPU = torch.cuda.is_available()
NO_GPU_REASON = "needs a CUDA GPU (none here); scripts/gpu_check.sh runs these on one"
requires_gpu = pytest.mark.skipif(not HAS_GPU, reason=NO_GPU_REASON)
HOPPER = HAS_GPU and torch.cuda.get_device_capability() == (9, 0)
# The tensor-core operators run on sm_80 and later GPUs, on each engine the GPU has
# (scratchops/tensor_cores.py): an sm_90 GPU tests both.
TENSOR_CORES = HAS_GPU and torch.cuda.get_device_capability() >= (8, 0)
ENGINES = ["wgmma", "mma_sync"] if HOPPER else ["mma_sync"] if TENSOR_CORES else []
NO_TENSOR_CORES_REASON = "needs an sm_80 or later GPU; scripts/gpu_check.sh runs these on one"

# What runs on the tensor cores only: these operators and ModelNew variants.
TENSOR_CORE_OPERATORS = {"conv2d_group_norm_pool_clamp", "conv2d_min_add_mul"}
TENSOR_CORE_VARIANTS = {("p85", "one_pass"), ("p85", "fused"), ("p31", "one_kernel"),
                        ("p31", "chain")}


def model_cases():
    """(problem, variant label) for every ModelNew variant of both problems."""
    from scratchops.problems import PROBLEMS
    return [(name, label) for name, module in PROBLEMS.items() for label in module.VARIANTS]


def skip_unless_runnable(device="cuda", *, operator=None, case=None):
    """Skip a test on `device` where it cannot run: no GPU, or a tensor-core operator or
    ModelNew variant on a GPU before sm_80. Meta tensors run anywhere."""
    if device != "cuda":
        return
    if not HAS_GPU:
        pytest.skip(NO_GPU_REASON)
    if not TENSOR_CORES and (operator in TENSOR_CORE_OPERATORS or case in TENSOR_CORE_VARIANTS):
        pytest.skip(NO_TENSOR_CORES_REASON)


def skip_unless_gemm_version_runs(version):
    """Skip a GEMM version this GPU has no kernel for: v5-v9 need the tensor cores (sm_80+),
    v6-v8 Hopper's wgmma (sm_90)."""
    from scratchops import versions

    if version >= versions.GEMM_FIRST_TENSOR_CORE_VERSION and not TENSOR_CORES:
        pytest.skip(NO_TENSOR_CORES_REASON)
    if version in versions.GEMM_WGMMA_VERSIONS and not HOPPER:
        pytest.skip("runs on wgmma: needs an sm_90 GPU; scripts/gpu_check.sh runs these on one")


def launches(call):
    """The CUDA kernels `call` launched: name -> how many times."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    return {e.key: e.count for e in prof.key_averages()}


def rand(*shape, low=-1.0, high=1.0, device="cuda", dtype=torch.float32):
    """Fresh uniform random values (the global generator moves on every call)."""
    return torch.empty(shape, device=device, dtype=dtype).uniform_(low, high)


def one_element_in(t):
    """t's values in a new storage one element in: a tensor whose data starts off 16 bytes,
    which no allocation gives (the paths that need aligned data must refuse it)."""
    return torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)[1:].view(t.shape).copy_(t)


def tf32_nearest(t):
    """float32 rounded to the nearest TF32, ties away from zero (what cvt.rna gives)."""
    bits = t.contiguous().view(torch.int32)
    return ((bits + 0x1000) & -0x2000).view(torch.float32)


def poison_next(*shape, dtype=torch.float32):
    """Leave a NaN-filled block of this many elements of `dtype` in torch's caching allocator,
    so that the next allocation of that size (the kernel's output) starts as NaN and an element
    the kernel fails to write makes the comparison fail. test_poison_reaches_next_allocation
    checks that the allocator hands this block back."""
    block = torch.full((math.prod(shape),), float("nan"), device="cuda", dtype=dtype)
    del block


def assert_matches(out, ref32, ref64, *, atol=ATOL, rtol=RTOL, equal_nan=False):
    """out against torch's fp32 result and a float64 reference; NaN fails unless equal_nan
    (for inputs where torch itself defines NaN results, and then in the same places)."""
    assert out.dtype == torch.float32 and out.shape == ref32.shape == ref64.shape, \
        (out.dtype, out.shape, ref32.shape, ref64.shape)
    torch.testing.assert_close(out, ref32, atol=atol, rtol=rtol, equal_nan=equal_nan)
    torch.testing.assert_close(out.double(), ref64, atol=atol, rtol=rtol, equal_nan=equal_nan)


def _operator_samples():
    """One argument tuple per registered operator, as (device -> args): small shapes that
    exercise padding, stride, bias and per-channel parameters."""
    inf = float("inf")
    workspace = 256 * 2**20

    def sample(build):
        return lambda device: build(lambda *shape: rand(*shape, device=device))

    return {
        "im2col": sample(lambda r: (r(2, 3, 9, 8), [3, 2], [1, 1], [1, 0], [2, 1], 2)),
        "gemm": sample(lambda r: (r(2, 33, 17), r(2, 17, 45), r(33), 3)),
        "conv2d": sample(lambda r: (r(2, 3, 11, 10), r(4, 3, 3, 3), r(4), [1, 1], [1, 1], [1, 1],
                                    0, workspace, 3)),
        "conv2d_min_add_mul": sample(lambda r: (r(2, 5, 9, 8), r(70, 5, 3, 3), r(70), [1, 1],
                                                [1, 1], [1, 1], 0.25, r(70), 2.0)),
        "conv2d_group_norm_pool_clamp": sample(
            lambda r: (r(2, 3, 11, 10), r(8, 3, 3, 3), r(8), 4, r(8), r(8), r(8, 1, 1), 1e-5,
                       -0.5, 0.5, 2)),
        "group_norm": sample(lambda r: (r(2, 6, 5, 7), 3, r(6), r(6), r(6, 1, 1), 1e-5, 2)),
        "scale": sample(lambda r: (r(2, 6, 5, 7), r(6, 1, 1))),
        "min_add_mul": sample(lambda r: (r(2, 6, 5, 7), 0.5, r(6, 1, 1), 2.0)),
        "max_pool2d_clamp": sample(lambda r: (r(2, 3, 9, 10), [3, 3], [2, 2], [1, 1], -inf, inf,
                                              2)),
        "clamp": sample(lambda r: (r(3, 5, 7), 0.0, 1.0)),
    }


# name -> (device -> argument tuple) for torch.ops.scratchops.<name>, every operator once.
OPERATOR_SAMPLES = _operator_samples()
