"""scratchops.im2col and scratchops.conv2d against F.unfold / F.conv2d and float64."""

import pytest
import torch
import torch.nn.functional as F

import scratchops
from helpers import assert_matches, poison_next, rand, requires_gpu

pytestmark = requires_gpu
VERSIONS = sorted(scratchops.IM2COL_GEMM_VERSIONS)  # the im2col + gemm path

# (input shape, weight shape, stride, padding, dilation)
CASES = [
    ((1, 1, 5, 5), (1, 1, 3, 3), 1, 0, 1),                 # batch 1, one channel
    ((2, 3, 17, 19), (5, 3, 3, 3), 2, 1, 1),               # odd sizes, stride 2, padding
    ((3, 4, 15, 13), (6, 4, 3, 3), 1, 2, 2),               # dilation 2
    ((3, 8, 9, 7), (4, 8, 2, 5), (2, 1), (1, 2), (1, 2)),  # everything asymmetric
    ((2, 7, 11, 11), (9, 7, 1, 1), 1, 0, 1),               # 1x1 convolution
    ((2, 3, 4, 4), (2, 3, 4, 4), 1, 0, 1),                 # kernel covers the whole input
    ((1, 2, 1, 1), (3, 2, 3, 3), 1, 1, 1),                 # 1x1 image, all but one tap padding
]


def conv_reference(x, w, b, stride, padding, dilation):
    ref32 = F.conv2d(x, w, b, stride, padding, dilation)
    ref64 = F.conv2d(x.double(), w.double(), None if b is None else b.double(), stride,
                     padding, dilation)
    return ref32, ref64


@pytest.mark.parametrize("version", sorted(scratchops.IM2COL_VERSIONS))
@pytest.mark.parametrize("x_shape,w_shape,stride,padding,dilation", CASES + [
    ((2, 3, 40, 300), (1, 3, 3, 3), 1, 1, 1),  # rows longer than a block (256 pixels)
    ((1, 2, 600, 1), (1, 2, 3, 1), 1, 1, 1),   # out_w = 1: the pixel step is all carry
])
def test_im2col_matches_unfold(version, x_shape, w_shape, stride, padding, dilation):
    x = rand(*x_shape)
    kernel = w_shape[2:]
    ref = F.unfold(x, kernel, dilation, padding, stride)
    poison_next(*ref.shape)
    out = scratchops.im2col(x, kernel, dilation, padding, stride, version=version)
    # A pure copy: exactly equal, NaN-free.
    assert out.shape == ref.shape
    torch.testing.assert_close(out, ref, atol=0, rtol=0)


def test_im2col_unbatched():
    x = rand(3, 10, 9)
    torch.testing.assert_close(scratchops.im2col(x, (3, 2), padding=1, stride=2),
                               F.unfold(x, (3, 2), padding=1, stride=2), atol=0, rtol=0)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("x_shape,w_shape,stride,padding,dilation", CASES)
def test_conv2d(version, with_bias, x_shape, w_shape, stride, padding, dilation):
    x, w = rand(*x_shape), rand(*w_shape)
    b = rand(w_shape[0]) if with_bias else None
    ref32, ref64 = conv_reference(x, w, b, stride, padding, dilation)
    poison_next(*ref32.shape)
    out = scratchops.conv2d(x, w, b, stride, padding, dilation, algorithm="im2col_gemm",
                            gemm_version=version)
    assert_matches(out, ref32, ref64)


@pytest.mark.parametrize("workspace_bytes", [
    1,                    # less than one column: one output pixel per chunk
    4 * 27 * 50,          # 50 pixels of one image per chunk (not a divisor of 225)
    4 * 27 * 225 * 2,     # two whole images per chunk (5 images: a short last chunk)
])
def test_conv2d_chunked_workspace(workspace_bytes):
    # K = 3*3*3 = 27 taps, P = 15*15 = 225 output pixels per image.
    x, w, b = rand(5, 3, 17, 17), rand(4, 3, 3, 3), rand(4)
    ref32, ref64 = conv_reference(x, w, b, 1, 0, 1)
    poison_next(*ref32.shape)
    out = scratchops.conv2d(x, w, b, algorithm="im2col_gemm", workspace_bytes=workspace_bytes)
    assert_matches(out, ref32, ref64)


def test_conv2d_unbatched_and_same_padding():
    x, w, b = rand(3, 12, 13), rand(5, 3, 3, 5), rand(5)
    out = scratchops.conv2d(x, w, b, padding="same")
    assert out.shape == (5, 12, 13)
    assert_matches(out, F.conv2d(x, w, b, padding="same"),
                   F.conv2d(x.double(), w.double(), b.double(), padding="same"))


# The two KernelBench convolutions at full size, one float64 reference per problem shared
# by every GEMM version.
@pytest.fixture(scope="module", params=["p85", "p31"])
def kernelbench_conv(request):
    torch.manual_seed(1234 if request.param == "p85" else 4321)
    x_shape, cout = {"p85": ((128, 8, 128, 128), 64), "p31": ((128, 64, 128, 128), 128)}[request.param]
    conv = torch.nn.Conv2d(x_shape[1], cout, 3).cuda()
    x = torch.rand(x_shape, device="cuda")
    with torch.no_grad():
        ref32 = conv(x)
        ref64 = F.conv2d(x.double(), conv.weight.double(), conv.bias.double())
    return x, conv.weight.detach(), conv.bias.detach(), ref32, ref64


@pytest.mark.parametrize("algorithm", [f"im2col_gemm v{v}" for v in VERSIONS] + ["implicit_gemm"])
def test_conv2d_kernelbench_size(kernelbench_conv, algorithm):
    x, w, b, ref32, ref64 = kernelbench_conv
    poison_next(*ref32.shape)
    if algorithm == "implicit_gemm":
        if torch.cuda.get_device_capability() < (8, 0):
            pytest.skip("the implicit GEMM runs on sm_80+ GPUs")
        out = scratchops.conv2d(x, w, b, algorithm="implicit_gemm")
    else:
        out = scratchops.conv2d(x, w, b, algorithm="im2col_gemm",
                                gemm_version=int(algorithm.split("v")[-1]))
    assert_matches(out, ref32, ref64)
