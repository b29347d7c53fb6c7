"""scratchops.group_norm, scale and group_norm_scale against torch and float64."""

import pytest
import torch
import torch.nn.functional as F

import scratchops
from helpers import assert_matches, poison_next, rand, requires_gpu

pytestmark = requires_gpu
VERSIONS = sorted(scratchops.GROUP_NORM_VERSIONS)

# (input shape, groups): P85's shape, one channel per group, a single group, batch 1,
# a 1x1 plane, one channel in batch 1 (torch refuses a lone value, so 3 of them), odd planes
# (scalar path: group sizes not a multiple of 4), 2-D and 5-D.
GN_CASES = [((2, 64, 126, 126), 16), ((3, 6, 7, 5), 6), ((3, 6, 7, 5), 1), ((1, 4, 9, 9), 2),
            ((2, 4, 1, 1), 2), ((2, 3, 5, 3), 3), ((4, 6), 2), ((2, 4, 3, 5, 7), 2),
            ((1, 1, 3, 1), 1), ((2, 8, 33, 31), 4)]


def gn_reference(x, groups, weight, bias, scale, eps=1e-5):
    ref32 = F.group_norm(x, groups, weight, bias, eps)
    ref64 = F.group_norm(x.double(), groups, None if weight is None else weight.double(),
                         None if bias is None else bias.double(), eps)
    if scale is not None:
        ref32, ref64 = ref32 * scale, ref64 * scale.double()
    return ref32, ref64


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("affine", [False, True])
@pytest.mark.parametrize("shape,groups", GN_CASES)
def test_group_norm(shape, groups, affine, version):
    x = rand(*shape, low=-2.0, high=3.0)
    c = shape[1]
    weight, bias = (rand(c, low=-2, high=2), rand(c)) if affine else (None, None)
    poison_next(*shape)
    out = scratchops.group_norm(x, groups, weight, bias, eps=1e-5, version=version)
    assert_matches(out, *gn_reference(x, groups, weight, bias, None))


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("scale_shape", ["c11", "c"])
@pytest.mark.parametrize("shape,groups", GN_CASES[:6])
def test_group_norm_scale(shape, groups, scale_shape, version):
    x = rand(*shape)
    c = shape[1]
    weight, bias = rand(c, low=-2, high=2), rand(c)
    s = rand(c, low=-2, high=2)  # negative scales too
    if scale_shape == "c11":
        s = s.reshape(c, *([1] * (len(shape) - 2)))
        ref = gn_reference(x, groups, weight, bias, s)
    else:  # (C,) means per channel: the reference broadcasts it explicitly
        ref = gn_reference(x, groups, weight, bias, s.reshape(c, *([1] * (len(shape) - 2))))
    poison_next(*shape)
    assert_matches(scratchops.group_norm_scale(x, groups, weight, bias, s, version=version), *ref)


@pytest.mark.parametrize("version", VERSIONS)
def test_group_norm_large_mean_keeps_precision(version):
    # |mean| / std = 100: E[x^2] - E[x]^2 in fp32 would lose about 4 of its 7 digits.
    x = 100.0 + rand(2, 8, 63, 63)
    assert_matches(scratchops.group_norm(x, 4, version=version),
                   *gn_reference(x, 4, None, None, None))


@pytest.mark.parametrize("version", VERSIONS)
def test_group_norm_statistics_are_per_sample(version):
    x, weight, bias = rand(4, 8, 10, 10), rand(8), rand(8)
    x[2] *= 50.0  # a sample with a very different spread must not change the others
    whole = scratchops.group_norm(x, 4, weight, bias, version=version)
    one_by_one = torch.cat([scratchops.group_norm(x[i:i + 1].contiguous(), 4, weight, bias,
                                                  version=version) for i in range(4)])
    torch.testing.assert_close(whole, one_by_one, atol=0, rtol=0)


@pytest.mark.parametrize("version", VERSIONS)
def test_group_norm_unaligned_input(version):
    # A contiguous view starting one float into its storage: the float4 path must not run.
    base = rand(2 * 8 * 6 * 6 + 1)
    x = base[1:].view(2, 8, 6, 6)
    assert x.data_ptr() % 16 != 0
    assert_matches(scratchops.group_norm(x, 2, version=version),
                   *gn_reference(x, 2, None, None, None))


@pytest.mark.parametrize("version", VERSIONS)
def test_group_norm_nan_poisons_its_group_only(version):
    x = rand(2, 4, 6, 6)
    x[1, 2, 3, 3] = float("nan")
    out = scratchops.group_norm(x, 2, version=version)
    ref32, ref64 = gn_reference(x, 2, None, None, None)
    assert torch.isnan(out[1, 2:]).all() and not torch.isnan(out[0]).any()
    assert_matches(out, ref32, ref64, equal_nan=True)


@pytest.mark.parametrize("shape,scale_shape", [((2, 5, 7, 9), (5, 1, 1)), ((2, 5, 7, 9), (5,)),
                                               ((3, 4), (4,)), ((1, 3, 8, 8), (3, 1, 1)),
                                               ((2, 64, 126, 126), (64, 1, 1))])
def test_scale(shape, scale_shape):
    x, s = rand(*shape), rand(*scale_shape, low=-3, high=3)
    per_channel = s.reshape(shape[1], *([1] * (len(shape) - 2)))
    poison_next(*shape)
    out = scratchops.scale(x, s)
    assert_matches(out, x * per_channel, x.double() * per_channel.double())


def test_scale_propagates_nan_and_inf():
    x, s = rand(2, 3, 4, 4), rand(3, 1, 1)
    x[0, 0, 0, 0], x[1, 2, 3, 3], x[1, 1, 0, 2] = float("nan"), float("inf"), float("-inf")
    assert_matches(scratchops.scale(x, s), x * s, x.double() * s.double(), equal_nan=True)
