"""The tensor-core kernels (sm_80+): gemm v9 (on either engine), the implicit-GEMM conv2d and the fused P31 and
P85 operators, against torch fp32 (TF32 off) and float64, on every engine the GPU has (an
sm_90 GPU runs each test on wgmma and again on mma.sync: the `engine` fixture).

Accuracy rule (KernelBench's): allclose(atol = rtol = 1e-4) against torch fp32, and the error
against float64 within 4x of torch fp32's own.
"""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import scratchops
from helpers import (ATOL, ENGINES, NO_TENSOR_CORES_REASON, RTOL, TENSOR_CORE_VARIANTS,
                     TENSOR_CORES, assert_matches, poison_next, rand, tf32_nearest)
from scratchops.problems import PROBLEMS, build_pair

pytestmark = pytest.mark.skipif(not TENSOR_CORES, reason=NO_TENSOR_CORES_REASON)


@pytest.fixture(autouse=True, params=ENGINES or ["none"])
def engine(request):
    """Every test here once on each tensor-core engine the GPU has, forced."""
    if not ENGINES:
        pytest.skip(NO_TENSOR_CORES_REASON)
    with scratchops.tensor_core_path(request.param):
        assert scratchops.tensor_core_engine() == request.param
        yield request.param


def max_err(out, ref64):
    return (out.double() - ref64).abs().max().item()


def assert_fp32_accurate(out, ref32, ref64, *, within_4x=True, magnitude64=None):
    """allclose to torch fp32 and float64, and (within_4x) no worse than 4x torch fp32's own
    error, counted as at least one fp32 ulp of the computation's scale (error_floor). 3xTF32
    drops a term of up to ~2^-21 of each product that fp32 keeps, so on a very short dot
    product normalised over very few values it can be several times further from float64
    than fp32 (seen: the one-window P85 case below, 9 products and 16 values, 8.2e-7 against
    torch's 1.5e-7, about 7 ulps of its outputs); those cases are checked for allclose only."""
    assert_matches(out, ref32, ref64)
    if within_4x:
        assert max_err(out, ref64) <= 4 * error_floor(ref32, ref64, magnitude64)


def error_floor(ref32, ref64, magnitude64=None):
    """torch fp32's error against float64, counted as at least one fp32 ulp of the largest
    output, or of the largest sum of magnitudes (magnitude64: |a| @ |b| + |bias| for a GEMM)
    when given: an output that cancels to near 0 keeps the rounding errors of its terms, so
    its own ulp is no unit (seen: a 1x1x1 GEMM whose bias cancelled the product to 0.03,
    3xTF32 4.8 of those ulps off). The unit of the 4x rule (scripts/accuracy_probe.py reports
    ratios to it)."""
    scale = ref64.abs().max().item()
    if magnitude64 is not None:
        scale = max(scale, magnitude64.max().item())
    return max(max_err(ref32, ref64), torch.finfo(torch.float32).eps * scale)


# ------------------------------- gemm's tensor-core version on each engine (test_gemm: v5-v9)
TC = scratchops.versions.GEMM_TENSOR_CORE_VERSION


@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (5, 7, 3), (31, 67, 13), (127, 131, 137),
                                   (64, 15876, 72), (128, 1234, 576), (257, 1000, 513),
                                   (1031, 509, 1021)])
def test_gemm_tensor_cores_against_fp32_and_float64(m, n, k):
    a, b, bias = rand(m, k), rand(k, n), rand(m)
    poison_next(m, n)
    out = scratchops.gemm(a, b, bias, version=TC)
    ref32 = a @ b + bias[:, None]
    ref64 = a.double() @ b.double() + bias.double()[:, None]
    magnitude64 = a.double().abs() @ b.double().abs() + bias.double().abs()[:, None]
    assert_fp32_accurate(out, ref32, ref64, magnitude64=magnitude64)


def test_gemm_tensor_cores_4096_more_accurate_than_sgemm():
    a, b = rand(4096, 4096, low=0.0), rand(4096, 4096, low=0.0)
    out = scratchops.gemm(a, b, version=TC)
    ref64 = a.double() @ b.double()
    assert torch.allclose(out, a @ b, atol=ATOL, rtol=RTOL)
    assert max_err(out, ref64) <= 4 * max_err(a @ b, ref64)


def test_gemm_tensor_cores_inf_and_nan_as_fp32():
    a, b = rand(70, 40, low=0.0), rand(40, 90, low=0.1)
    a[3, 5], a[10, 7], a[20, 1] = float("inf"), float("-inf"), float("nan")
    b[2, 30], b[9, 60] = float("inf"), float("nan")
    a[40, 0] = 3.4028e38  # rounds to Inf in TF32 if split naively
    out, ref = scratchops.gemm(a, b, version=TC), a @ b
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=RTOL, equal_nan=True)


def test_gemm_tensor_cores_is_deterministic():
    a, b = rand(300, 257), rand(257, 190)
    assert torch.equal(scratchops.gemm(a, b, version=TC), scratchops.gemm(a, b, version=TC))


# ------------------------------------------------------------------ implicit-GEMM conv2d
CONV_CASES = [
    ((1, 1, 5, 5), (1, 1, 3, 3), 1, 0, 1),
    ((2, 3, 17, 19), (5, 3, 3, 3), 2, 1, 1),
    ((3, 2, 15, 13), (6, 2, 3, 3), 1, 2, 2),
    ((3, 8, 9, 7), (4, 8, 2, 5), (2, 1), (1, 2), (1, 2)),
    ((2, 7, 11, 11), (9, 7, 1, 1), 1, 0, 1),
    ((1, 2, 1, 1), (3, 2, 3, 3), 1, 1, 1),
    ((2, 70, 20, 19), (130, 70, 5, 5), 1, 2, 1),
    ((1, 33, 31, 29), (200, 33, 3, 3), 1, 1, 1),
    ((2, 64, 37, 41), (128, 64, 3, 3), 1, 0, 1),
    ((2, 8, 33, 35), (64, 8, 3, 3), 1, 0, 1),
]


def conv_inputs(x_shape, w_shape):
    """Fresh input in [0, 1), weights scaled by 1/sqrt(fan-in) and a bias in [-1, 1)."""
    x = rand(*x_shape, low=0.0)
    w = rand(*w_shape) / (w_shape[1] * w_shape[2] * w_shape[3]) ** 0.5
    return x, w, rand(w_shape[0])


@pytest.mark.parametrize("x_shape,w_shape,stride,padding,dilation", CONV_CASES)
def test_conv2d_implicit_gemm(x_shape, w_shape, stride, padding, dilation):
    x, w, b = conv_inputs(x_shape, w_shape)
    ref32 = F.conv2d(x, w, b, stride, padding, dilation)
    ref64 = F.conv2d(x.double(), w.double(), b.double(), stride, padding, dilation)
    poison_next(*ref32.shape)
    out = scratchops.conv2d(x, w, b, stride, padding, dilation, algorithm="implicit_gemm")
    assert_fp32_accurate(out, ref32, ref64)


def test_conv2d_implicit_gemm_nan_and_inf_input():
    x, w, b = rand(2, 8, 20, 19, low=0.0), rand(16, 8, 3, 3), rand(16)
    x[0, 3, 5, 7], x[1, 0, 0, 0] = float("nan"), float("inf")
    torch.testing.assert_close(scratchops.conv2d(x, w, b), F.conv2d(x, w, b), atol=ATOL,
                               rtol=RTOL, equal_nan=True)


# The weights are packed inside the convolution's kernel (its whole grid packs, then meets):
# a non-finite weight must reach every CTA's "B has a non-finite value" test, wherever it
# sits: a B of a few stages (most CTAs pack nothing), one of 72 packing units, and one of 288
# (more flag slots than multiprocessors: a CTA writes several).
@pytest.mark.parametrize("x_shape,cout", [((1, 8, 9, 9), 16), ((6, 64, 40, 40), 128),
                                          ((2, 128, 12, 12), 256)])
@pytest.mark.parametrize("where", ["first", "last"])
def test_conv2d_implicit_gemm_nonfinite_weights(x_shape, cout, where):
    x, w, b = conv_inputs(x_shape, (cout, x_shape[1], 3, 3))
    at = (0, 0, 0, 0) if where == "first" else (cout - 1, x_shape[1] - 1, 2, 2)
    w[at] = float("inf")
    w[(at[0], at[1], 1, 1)] = float("nan") if where == "last" else -float("inf")
    out = scratchops.conv2d(x, w, b, algorithm="implicit_gemm")
    torch.testing.assert_close(out, F.conv2d(x, w, b), atol=ATOL, rtol=RTOL, equal_nan=True)
    assert not torch.isfinite(out[:, at[0]]).any()
    assert torch.isfinite(out[:, :at[0]]).all() and torch.isfinite(out[:, at[0] + 1:]).all()


# The weight gradient packs dy as B with its cross tiles deferred (pack_b's kDeferCross: a
# second pass writes them only where the first met a non-finite value). A non-finite dy, in
# the first slice of the reduction or the last (4 here, of 85 rows but the last), must bring
# them in: dW is Inf and NaN where torch's is, allclose elsewhere. The x values under the Inf
# are 0.5, whose small TF32 part is 0: had the kernels used the big tile for the cross terms
# (the flag not seen), 0 x Inf would make row 1 NaN. In one chunk of slices, and in a chunk a
# slice (the flags of each chunk's packing are its own).
@pytest.mark.parametrize("workspace_bytes",
                         [1, scratchops.versions.TENSOR_CORE_GRAD_WORKSPACE_BYTES])
@pytest.mark.parametrize("where", ["first", "last"])
def test_weight_gradient_of_a_nonfinite_output_gradient(where, workspace_bytes):
    x, w_shape = rand(16, 5, 20, 19), (6, 5, 3, 3)
    dy = rand(16, 6, 18, 17)
    n, oh, ow = (0, 2, 3) if where == "first" else (15, 17, 16)
    dy[n, 1, oh, ow] = float("inf")
    dy[n, 4, oh, ow] = float("nan")
    x[n, :, oh:oh + 3, ow:ow + 3] = 0.5
    poison_next(*w_shape)
    ours = torch.ops.scratchops._conv2d_weight_grad(
        dy, x, list(w_shape), [1, 1], [0, 0], [1, 1], workspace_bytes,
        scratchops.versions.GEMM_TENSOR_CORE_VERSION)
    ref = torch.nn.grad.conv2d_weight(x, w_shape, dy)
    assert torch.isinf(ours[1]).all() and torch.isnan(ours[4]).all()
    scale = ref[torch.isfinite(ref)].abs().max().item()
    torch.testing.assert_close(ours, ref, atol=ATOL * scale, rtol=RTOL, equal_nan=True)


# Where torch allows TF32 for convolutions, the fp32 gradients on the tensor cores compute one
# TF32 product per fp32 product, as the forward does (conv2d_grad_uses_tf32: the forward's rule
# on each gradient's own reduction, dy's 96 x 9 for dx, the batch's 1330 output pixels for dW):
# within the fp32 sums' error of float64 on the operands rounded to the nearest TF32 (truncated
# operands would be about 1e-4 away), and within TF32's error of torch's own gradients under
# the same switch. With the switch off, fp32-accurate (3xTF32) again.
def test_gradients_in_tf32_where_torch_allows_it():
    x, w, dy = rand(2, 40, 21, 37), rand(96, 40, 3, 3) / 360 ** 0.5, rand(2, 96, 19, 35)
    ops, budget = torch.ops.scratchops, scratchops.versions.TENSOR_CORE_GRAD_WORKSPACE_BYTES
    version = scratchops.versions.GEMM_TENSOR_CORE_VERSION

    def ours():
        poison_next(*x.shape)
        dx = ops._conv2d_input_grad(dy, w, list(x.shape), [1, 1], [0, 0], [1, 1], budget,
                                    version)
        poison_next(*w.shape)
        return dx, ops._conv2d_weight_grad(dy, x, list(w.shape), [1, 1], [0, 0], [1, 1],
                                           budget, version)

    def torchs(x, w, dy):
        return (torch.nn.grad.conv2d_input(x.shape, w, dy),
                torch.nn.grad.conv2d_weight(x, w.shape, dy))

    before = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = True
    try:
        tf32, torch_tf32 = ours(), torchs(x, w, dy)
    finally:
        torch.backends.cudnn.allow_tf32 = before
    fp32 = ours()
    rounded64 = torchs(*(tf32_nearest(t).double() for t in (x, w, dy)))
    exact64 = torchs(x.double(), w.double(), dy.double())
    for name, ours_tf32, theirs, rounded, exact, ours_fp32 in zip(
            ("dx", "dW"), tf32, torch_tf32, rounded64, exact64, fp32):
        scale = exact.abs().max().item()
        torch.testing.assert_close(ours_tf32.double(), rounded, atol=3e-5 * scale, rtol=0,
                                   msg=name)
        torch.testing.assert_close(ours_tf32, theirs, atol=4e-3 * scale, rtol=0, msg=name)
        assert (ours_fp32.double() - exact).abs().max().item() <= 1e-5 * scale, name
        assert (ours_tf32.double() - exact).abs().max().item() > 3e-5 * scale, name


# The rule's other side and the path: with the switch on, an input gradient whose reduction is
# under 128 (dy's 8 channels x 3 x 3 = 72) stays fp32-accurate (3xTF32), while its weight
# gradient (the batch's 1330 output pixels) is TF32; and on wgmma a TF32 input gradient runs on
# v4, dy staged (one launch of its kernel: the batch in one chunk).
def test_gradients_tf32_rule_and_path(engine):
    from test_staged_a import v4_launches
    x, w8, dy8 = rand(2, 40, 21, 37), rand(8, 40, 3, 3) / 360 ** 0.5, rand(2, 8, 19, 35)
    w96, dy96 = rand(96, 40, 3, 3) / 360 ** 0.5, rand(2, 96, 19, 35)
    ops, budget = torch.ops.scratchops, scratchops.versions.TENSOR_CORE_GRAD_WORKSPACE_BYTES
    version = scratchops.versions.GEMM_TENSOR_CORE_VERSION
    dx_of = lambda dy, w: ops._conv2d_input_grad(  # noqa: E731
        dy, w, list(x.shape), [1, 1], [0, 0], [1, 1], budget, version)
    before = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = True
    try:
        dx = dx_of(dy8, w8)
        dw = ops._conv2d_weight_grad(dy8, x, list(w8.shape), [1, 1], [0, 0], [1, 1], budget,
                                     version)
        staged = v4_launches(lambda: dx_of(dy96, w96)) if engine == "wgmma" else 1
    finally:
        torch.backends.cudnn.allow_tf32 = before
    exact_dx = torch.nn.grad.conv2d_input(x.shape, w8.double(), dy8.double())
    exact_dw = torch.nn.grad.conv2d_weight(x.double(), w8.shape, dy8.double())
    assert max_err(dx, exact_dx) <= 1e-5 * exact_dx.abs().max().item()
    # (TF32-sized on both engines: its dy packed as big tiles alone, pack_b's kOneProduct)
    assert 3e-5 < max_err(dw, exact_dw) / exact_dw.abs().max().item() <= 4e-3
    assert staged == 1


# ------------------------------------------------------------------- P31 in one kernel
def p31_reference(x, w, cb, constant, bias, factor):
    ref32 = (torch.min(F.conv2d(x, w, cb), torch.tensor(constant)) + bias) * factor
    ref64 = (torch.clamp_max(F.conv2d(x.double(), w.double(), cb.double()), constant)
             + bias.double()) * factor
    return ref32, ref64


@pytest.mark.parametrize("x_shape,cout", [((1, 64, 20, 23), 128), ((2, 3, 9, 9), 5),
                                          ((3, 16, 17, 11), 72)])
def test_conv2d_min_add_mul(x_shape, cout):
    x, w = rand(*x_shape, low=0.0), rand(cout, x_shape[1], 3, 3) / (9 * x_shape[1]) ** 0.5
    cb, bias = rand(cout), rand(cout, 1, 1)
    ref32, ref64 = p31_reference(x, w, cb, 0.1, bias, 2.0)
    poison_next(*ref32.shape)
    out = scratchops.conv2d_min_add_mul(x, w, cb, 0.1, bias, 2.0)
    assert_fp32_accurate(out, ref32, ref64)
    # (the weights are packed every call: a second call computes the same)
    assert torch.equal(scratchops.conv2d_min_add_mul(x, w, cb, 0.1, bias, 2.0), out)


def test_conv2d_min_add_mul_propagates_nan():
    x, w, cb, bias = rand(1, 8, 10, 10), rand(16, 8, 3, 3), rand(16), rand(16)
    x[0, 2, 4, 4] = float("nan")
    out = scratchops.conv2d_min_add_mul(x, w, cb, 0.5, bias, 2.0)
    ref32, _ = p31_reference(x, w, cb, 0.5, bias[:, None, None], 2.0)
    torch.testing.assert_close(out, ref32, atol=ATOL, rtol=RTOL, equal_nan=True)
    assert torch.isnan(out).any()


# -------------------------------------------------------------------- P85 in one pass
def p85_model(cin, cout, groups, lo, hi, k=3):
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(cin, cout, k)
            self.group_norm = nn.GroupNorm(groups, cout)
            self.scale = nn.Parameter(torch.randn(cout, 1, 1))
            self.maxpool = nn.MaxPool2d(4)

        def forward(self, x):
            x = self.group_norm(self.conv(x)) * self.scale
            return torch.clamp(self.maxpool(x), lo, hi)
    return Model().cuda()


def one_pass(m, x, lo, hi, version=scratchops.DEFAULT_CONV_GN_POOL_VERSION):
    gn = m.group_norm
    return scratchops.conv2d_group_norm_pool_clamp(x, m.conv.weight, m.conv.bias, gn.num_groups,
                                                   gn.weight, gn.bias, m.scale, gn.eps, lo, hi,
                                                   version=version)


# Version 3 runs its halo kernel where it covers the call (the wgmma engine, Cin <= 8, at most
# 12 taps), version 2 elsewhere; version 2 always runs the engine's epilogue, version 1 the
# CUDA-core kernel.
@pytest.mark.parametrize("version", sorted(scratchops.CONV_GN_POOL_VERSIONS))
@pytest.mark.parametrize("n,cin,cout,hw,groups,lo,hi,mean,k,bias", [
    (2, 8, 64, (128, 128), 16, 0.0, 1.0, 0.0, 3, 0.0),
    (3, 3, 20, (21, 19), 5, -1.0, 0.7, 0.0, 3, 0.0),
    (1, 8, 64, (37, 70), 8, -2.0, 2.0, 0.0, 3, 0.0),
    (2, 16, 48, (16, 16), 4, 0.0, 1.0, 0.0, 3, 0.0),
    (2, 8, 64, (40, 40), 16, -10.0, 10.0, 1000.0, 3, 0.0),  # large mean, small variance
    # A conv bias far outside the conv's spread (at -10, torch fp32 itself is 1.1e-4 from float64).
    (2, 8, 64, (40, 40), 16, -10.0, 10.0, 0.0, 3, -3.0),
    (1, 1, 1, (6, 6), 1, -5.0, 5.0, 0.0, 3, 0.0),
    (2, 5, 24, (23, 18), 6, -1.0, 1.0, 0.0, 1, 0.0),
    (1, 7, 33, (19, 25), 3, -1.0, 1.0, 0.0, 2, 0.0),
    (1, 4, 32, (19, 25), 8, -1.0, 1.0, 0.0, 5, 0.0),  # 25 taps: v3 runs v2
    (1, 8, 64, (131, 9), 16, -1.0, 1.0, 0.0, 3, 0.0),
    (1, 6, 64, (21, 30), 2, -1.0, 1.0, 0.0, 3, 0.0),  # 32 channels a group
    # Width a multiple of 4 (16-byte halo copies), Cin < 8, a last column block half outside.
    (2, 3, 16, (20, 36), 4, -1.0, 1.0, 0.0, 3, 0.0),
])
def test_conv2d_group_norm_pool_clamp(n, cin, cout, hw, groups, lo, hi, mean, k, bias, version):
    torch.manual_seed(n * 1000 + cout)
    m = p85_model(cin, cout, groups, lo, hi, k)
    with torch.no_grad():
        for p in (m.group_norm.weight, m.group_norm.bias, m.scale):
            p.copy_(torch.randn_like(p))  # negative gamma * scale included
        m.conv.bias.add_(bias)
        x = rand(n, cin, *hw, low=0.0) + mean
        ref32, ref64 = m(x), copy.deepcopy(m).double()(x.double())
        poison_next(*ref32.shape)
        out = one_pass(m, x, lo, hi, version)
    # One window of 16 values from 9-product dot products: allclose only (see above).
    assert_fp32_accurate(out, ref32, ref64, within_4x=hw != (6, 6))
    assert torch.equal(out, one_pass(m, x, lo, hi, version))  # deterministic


def test_conv2d_group_norm_pool_clamp_copies_alike_aligned_or_not():
    # An input 16-byte aligned with a width a multiple of 4 is copied 16 bytes at a time, one
    # 4 bytes past such an address a float at a time: the same values either way, bit for bit.
    m = p85_model(8, 64, 16, 0.0, 1.0)
    x = rand(2, 8, 40, 44, low=0.0)
    shifted = torch.empty(1 + x.numel(), device=x.device)[1:].view(x.shape)
    shifted.copy_(x)
    assert shifted.data_ptr() % 16 != 0 and shifted.is_contiguous()
    with torch.no_grad():
        assert torch.equal(one_pass(m, shifted, 0.0, 1.0), one_pass(m, x, 0.0, 1.0))


@pytest.mark.parametrize("version", sorted(scratchops.CONV_GN_POOL_VERSIONS))
@pytest.mark.parametrize("inf_weight", [False, True])
def test_conv2d_group_norm_pool_clamp_nan_input(version, inf_weight):
    """A NaN input poisons what it poisons in torch's chain (its sample's group), and an
    infinite weight its channel's group in every sample (v3 splits the weights itself, and
    the cross parts of a non-finite weight must be 0); the rest stays allclose."""
    m = p85_model(8, 64, 16, 0.0, 1.0)
    x = rand(2, 8, 30, 30, low=0.0)
    x[0, 2, 10, 10] = float("nan")
    with torch.no_grad():
        if inf_weight:
            m.conv.weight[13, 1, 1, 1] = float("inf")
        ref = m(x)
        poison_next(*ref.shape)
        out = one_pass(m, x, 0.0, 1.0, version)
    assert torch.equal(out.isnan(), ref.isnan()) and ref.isnan().any()
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=RTOL, equal_nan=True)


# ------------------------------------------------------------- TF32 and the ModelNews
def test_tf32_mode_matches_torch_under_the_switch():
    # P31's layer (Cin * 9 >= the TF32 rule's 128): with TF32 allowed, one TF32 product as
    # cuDNN computes, on either engine; TF32's error is far above fp32's.
    x, w, b = rand(2, 64, 21, 19, low=0.0), rand(72, 64, 3, 3) / 24, rand(72)
    bias2 = rand(72, 1, 1)
    ref64 = F.conv2d(x.double(), w.double(), b.double())
    fp32 = scratchops.conv2d(x, w, b)
    try:
        torch.backends.cudnn.allow_tf32 = True
        ours, theirs = scratchops.conv2d(x, w, b), F.conv2d(x, w, b)
        fused = scratchops.conv2d_min_add_mul(x, w, b, 0.5, bias2, 2.0)
    finally:
        torch.backends.cudnn.allow_tf32 = False
    assert max_err(ours, ref64) > 20 * max_err(fp32, ref64)
    torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(fused, (torch.clamp(theirs, max=0.5) + bias2) * 2.0, atol=ATOL,
                               rtol=RTOL)


@pytest.mark.parametrize("name,variant", sorted(TENSOR_CORE_VARIANTS))
def test_model_new_tensor_core_variants_at_kernelbench_size(name, variant):
    module = PROBLEMS[name]
    model, model_new = build_pair(module, variant, seed=5)
    torch.manual_seed(6)
    x = module.get_inputs()[0].cuda()
    with torch.no_grad():
        ref32 = model(x)
        ref64 = copy.deepcopy(model).double()(x.double())
        poison_next(*ref32.shape)
        out = model_new(x)
    assert_matches(out, ref32, ref64)
