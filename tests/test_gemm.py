"""scratchops.gemm, every version, against torch.matmul (fp32) and float64."""

import pytest
import torch

import scratchops
from helpers import (ATOL, RTOL, assert_matches, poison_next, rand, requires_gpu,
                     skip_unless_gemm_version_runs)

pytestmark = requires_gpu
VERSIONS = sorted(scratchops.GEMM_VERSIONS)


@pytest.fixture(autouse=True)
def _runnable(request):
    if "version" in request.fixturenames:
        skip_unless_gemm_version_runs(request.getfixturevalue("version"))

# (M, N, K): unit sizes, sizes off every tile multiple (32, 64, 128, 8), P85's and P31's
# per-image convolution shapes.
SHAPES = [(1, 1, 1), (1, 7, 3), (5, 1, 9), (33, 65, 17), (64, 15876, 72), (127, 129, 130),
          (128, 128, 128), (200, 300, 77), (257, 1000, 513), (3, 5000, 2), (128, 1234, 576)]


def reference(a, b, bias):
    ref32 = a @ b
    ref64 = a.double() @ b.double()
    if bias is not None:
        ref32 = ref32 + bias[:, None]
        ref64 = ref64 + bias.double()[:, None]
    return ref32, ref64


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_gemm_2d(version, with_bias, m, n, k):
    a, b = rand(m, k), rand(k, n)
    bias = rand(m) if with_bias else None
    poison_next(m, n)
    out = scratchops.gemm(a, b, bias, version=version)
    assert_matches(out, *reference(a, b, bias))


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("layout", ["both", "shared_a", "shared_b"])
@pytest.mark.parametrize("batch,m,n,k", [(1, 3, 4, 5), (3, 33, 65, 17), (7, 130, 70, 9)])
def test_gemm_batched(version, layout, batch, m, n, k):
    a = rand(m, k) if layout == "shared_a" else rand(batch, m, k)
    b = rand(k, n) if layout == "shared_b" else rand(batch, k, n)
    bias = rand(m)
    poison_next(batch, m, n)
    out = scratchops.gemm(a, b, bias, version=version)
    assert out.shape == (batch, m, n)
    assert_matches(out, *reference(a, b, bias))


@pytest.mark.parametrize("version", VERSIONS)
def test_gemm_more_rows_than_one_grid(version):
    # More row tiles than gridDim.y allows (65535 x 128 rows for v3, x 32 for v1 and v2):
    # the launcher must split the rows over several launches.
    m = 65535 * 128 + 77
    a, b, bias = rand(m, 2), rand(2, 3), rand(m)
    poison_next(m, 3)
    assert_matches(scratchops.gemm(a, b, bias, version=version), *reference(a, b, bias))


@pytest.mark.parametrize("version", VERSIONS)
def test_gemm_larger_batch_than_one_grid(version):
    # More batch entries than gridDim.z allows (65535).
    batch = 70_001
    a, b = rand(batch, 2, 3), rand(batch, 3, 2)
    poison_next(batch, 2, 2)
    assert_matches(scratchops.gemm(a, b, version=version), *reference(a, b, None))


def test_gemm_default_version_is_chosen_for_the_shape():
    assert scratchops.DEFAULT_GEMM_VERSION is None  # binding.cpp picks v4 or v9


@pytest.mark.parametrize("m", [255, 256])
def test_gemm_default_picks_the_version_by_rows(m):
    # The default runs v4 below GEMM_TENSOR_CORE_MIN_ROWS rows of A and v9 (on the tensor
    # cores, where the GPU has them) from there on; either way the product is right.
    a, b = rand(m, 40), rand(2, 40, 30)
    poison_next(2, m, 30)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        out = scratchops.gemm(a, b)
        torch.cuda.synchronize()
    names = " ".join(e.name for e in prof.events()
                     if e.device_type == torch.autograd.DeviceType.CUDA)
    tensor_cores = torch.cuda.get_device_capability() >= (8, 0)
    if m >= scratchops.versions.GEMM_TENSOR_CORE_MIN_ROWS and tensor_cores:
        assert "pack_b_kernel" in names and "gemm_pipelined_kernel" not in names, names
    else:
        assert "gemm_pipelined_kernel" in names and "pack_b_kernel" not in names, names
    assert_matches(out, *reference(a, b, None))


TENSOR_CORE_VERSIONS = [v for v in VERSIONS
                        if v >= scratchops.versions.GEMM_FIRST_TENSOR_CORE_VERSION]


@pytest.mark.parametrize("version", TENSOR_CORE_VERSIONS)
def test_tensor_core_versions_give_inf_and_nan_as_fp32(version):
    # Inf and NaN in A and in B: B's cross tiles then travel with every stage (each version's
    # copy path: cp.async stages, the bulk-copy ring, the producer warpgroup).
    a, b = rand(70, 40, low=0.0), rand(40, 90, low=0.1)
    a[3, 5], a[10, 7], a[20, 1] = float("inf"), float("-inf"), float("nan")
    b[2, 30], b[9, 60] = float("inf"), float("nan")
    a[40, 0] = 3.4028e38  # rounds to Inf in TF32 if split naively
    poison_next(70, 90)
    out, ref = scratchops.gemm(a, b, version=version), a @ b
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=RTOL, equal_nan=True)


@pytest.mark.parametrize("version", TENSOR_CORE_VERSIONS)
def test_tensor_core_versions_are_deterministic_over_many_k_blocks(version):
    a, b = rand(300, 1029), rand(1029, 190)  # 33 k-blocks, a partial last one
    out = scratchops.gemm(a, b, version=version)
    assert torch.equal(out, scratchops.gemm(a, b, version=version))
    assert_matches(out, *reference(a, b, None))
