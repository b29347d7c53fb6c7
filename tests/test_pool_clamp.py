"""scratchops.max_pool2d, clamp, max_pool2d_clamp and min_add_mul against torch and float64."""

import pytest
import torch
import torch.nn.functional as F

import scratchops
from helpers import assert_matches, poison_next, rand, requires_gpu

pytestmark = requires_gpu
POOL_VERSIONS = sorted(scratchops.MAX_POOL2D_VERSIONS)

# (input shape, kernel_size, stride, padding): P85's pool, sizes the pool does not divide,
# padding, asymmetric windows and strides, overlapping windows, batch 1 and one channel.
POOL_CASES = [((2, 64, 126, 126), 4, None, 0), ((2, 3, 17, 19), 4, None, 0),
              ((1, 1, 7, 9), 3, 2, 1), ((2, 4, 10, 11), (3, 2), (1, 2), (1, 1)),
              ((3, 2, 5, 5), 2, 1, 0), ((1, 1, 1, 1), 1, None, 0), ((2, 3, 8, 8), 8, None, 4)]


def with_specials(x):
    """Put NaN, +inf and -inf at a few positions (torch defines all three results)."""
    flat = x.view(-1)
    n = flat.numel()
    flat[n // 3] = float("nan")
    flat[n // 2] = float("inf")
    flat[(2 * n) // 3] = float("-inf")
    return x


@pytest.mark.parametrize("version", POOL_VERSIONS)
@pytest.mark.parametrize("specials", [False, True])
@pytest.mark.parametrize("shape,kernel,stride,padding", POOL_CASES)
def test_max_pool2d(shape, kernel, stride, padding, specials, version):
    x = rand(*shape)
    if specials:
        with_specials(x)
    ref32 = F.max_pool2d(x, kernel, stride, padding)
    ref64 = F.max_pool2d(x.double(), kernel, stride, padding)
    poison_next(*ref32.shape)
    out = scratchops.max_pool2d(x, kernel, stride, padding, version=version)
    assert_matches(out, ref32, ref64, atol=0, rtol=0, equal_nan=specials)


@pytest.mark.parametrize("version", POOL_VERSIONS)
def test_max_pool2d_unbatched(version):
    x = rand(3, 9, 10)
    torch.testing.assert_close(scratchops.max_pool2d(x, 3, 2, 1, version=version),
                               F.max_pool2d(x, 3, 2, 1), atol=0, rtol=0)


@pytest.mark.parametrize("specials", [False, True])
@pytest.mark.parametrize("bounds", [(0.0, 1.0), (-0.5, None), (None, 0.25), (0.5, -0.5)])
@pytest.mark.parametrize("shape", [(1,), (7,), (3, 5, 7), (2, 64, 31, 31), (4, 4, 4, 4)])
def test_clamp(shape, bounds, specials):
    x = rand(*shape, low=-2, high=2)
    if specials:
        with_specials(x)
    lo, hi = bounds
    poison_next(*shape)
    out = scratchops.clamp(x, lo, hi)
    assert_matches(out, torch.clamp(x, lo, hi), torch.clamp(x.double(), lo, hi), atol=0, rtol=0,
                   equal_nan=specials)


def test_clamp_unaligned_and_zero_dim():
    base = rand(1 + 4 * 5 * 3)
    x = base[1:].view(4, 5, 3)  # starts 4 bytes into its storage
    torch.testing.assert_close(scratchops.clamp(x, -0.1, 0.2), torch.clamp(x, -0.1, 0.2),
                               atol=0, rtol=0)
    s = rand(1).reshape(())
    torch.testing.assert_close(scratchops.clamp(s, 0.0, 0.1), torch.clamp(s, 0.0, 0.1),
                               atol=0, rtol=0)


@pytest.mark.parametrize("version", POOL_VERSIONS)
@pytest.mark.parametrize("specials", [False, True])
@pytest.mark.parametrize("shape,kernel,stride,padding", POOL_CASES)
def test_max_pool2d_clamp(shape, kernel, stride, padding, specials, version):
    x = rand(*shape, low=-1.5, high=1.5)
    if specials:
        with_specials(x)
    ref32 = torch.clamp(F.max_pool2d(x, kernel, stride, padding), 0.0, 1.0)
    ref64 = torch.clamp(F.max_pool2d(x.double(), kernel, stride, padding), 0.0, 1.0)
    poison_next(*ref32.shape)
    out = scratchops.max_pool2d_clamp(x, kernel, stride, padding, 0.0, 1.0, version=version)
    assert_matches(out, ref32, ref64, atol=0, rtol=0, equal_nan=specials)


@pytest.mark.parametrize("specials", [False, True])
@pytest.mark.parametrize("shape,bias_shape", [((2, 128, 126, 126), (128, 1, 1)),
                                              ((3, 5, 7, 9), (5, 1, 1)), ((3, 5, 7, 9), (5,)),
                                              ((2, 6), (6,)), ((1, 1, 1, 1), (1, 1, 1))])
def test_min_add_mul(shape, bias_shape, specials):
    x, bias = rand(*shape), rand(*bias_shape, low=-2, high=2)
    if specials:
        with_specials(x)
    b = bias.reshape(shape[1], *([1] * (len(shape) - 2)))
    ref32 = (torch.min(x, torch.tensor(0.5)) + b) * 2.0
    ref64 = (torch.min(x.double(), torch.tensor(0.5, dtype=torch.float64)) + b.double()) * 2.0
    poison_next(*shape)
    out = scratchops.min_add_mul(x, 0.5, bias, 2.0)
    assert_matches(out, ref32, ref64, equal_nan=specials)
