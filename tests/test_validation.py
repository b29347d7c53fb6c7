"""Argument validation: every bad input gets a clear Python error before any kernel runs.

These run on the CPU (CI has no GPU): the checks look at dtype, rank, shape, layout and
sizes first, and at the device last, so CPU tensors reach every check. Sizes too large for
32-bit indexing are shown with meta tensors (no memory behind them).
"""

import numpy as np
import pytest
import torch

import scratchops
from scratchops.problems import PROBLEMS, build_pair


def t(*shape, dtype=torch.float32, device="cpu"):
    return torch.rand(shape, dtype=dtype) if device == "cpu" else torch.empty(shape, dtype=dtype,
                                                                             device=device)


X = t(2, 3, 8, 8)
W = t(4, 3, 3, 3)

CASES = [
    # (call, exception, message fragment)
    (lambda: scratchops.conv2d(X, W), ValueError, "must be a CUDA tensor"),
    (lambda: scratchops.conv2d(X.double(), W), TypeError, "input must be float32, float16 or bf"),
    (lambda: scratchops.conv2d(X, W.half()), TypeError, "weight is torch.float16 but input is "),
    (lambda: scratchops.conv2d(X.bfloat16(), W.half()), TypeError, "weight is torch.float16 but"),
    (lambda: scratchops.gemm(t(3, 4).half(), t(4, 5)), TypeError, "b is torch.float32 but a is"),
    (lambda: scratchops.group_norm(X.half(), 1, t(3)), TypeError, "weight is torch.float32 but"),
    (lambda: scratchops.clamp(X.int(), 0, 1), TypeError, "input must be float32, float16 or"),
    (lambda: scratchops.conv2d([1.0], W), TypeError, "input must be a torch.Tensor"),
    (lambda: scratchops.conv2d(t(3, 8), W), ValueError, "input must be 3-D or 4-D"),
    (lambda: scratchops.conv2d(X, t(4, 3, 3)), ValueError, "weight must be 4-D"),
    (lambda: scratchops.conv2d(X, t(4, 2, 3, 3)), ValueError, "expects 2 input channels"),
    (lambda: scratchops.conv2d(X, W, t(5)), ValueError, "bias must have one value per output"),
    (lambda: scratchops.conv2d(X, W, groups=3), NotImplementedError, "groups=1 only"),
    (lambda: scratchops.conv2d(X, W, stride=0), ValueError, "stride must be in [1, 65535]"),
    (lambda: scratchops.conv2d(X, W, padding=-1), ValueError, "padding must be in [0, 65535]"),
    (lambda: scratchops.conv2d(X, W, dilation=(1, 2, 3)), TypeError, "pair of ints"),
    (lambda: scratchops.conv2d(X, W, stride=1.5), TypeError, "int or a pair of ints"),
    (lambda: scratchops.conv2d(X, W, padding="full"), ValueError, "'valid' or 'same'"),
    (lambda: scratchops.conv2d(X, W, stride=2, padding="same"), ValueError, "strided"),
    (lambda: scratchops.conv2d(X, t(4, 3, 2, 2), padding="same"), NotImplementedError,
     "asymmetric"),
    (lambda: scratchops.conv2d(X, t(4, 3, 9, 3)), ValueError, "output would be empty"),
    (lambda: scratchops.conv2d(X, W, dilation=5), ValueError, "output would be empty"),
    (lambda: scratchops.conv2d(t(2, 0, 8, 8), t(4, 0, 3, 3)), ValueError, "input has 0 channels"),
    (lambda: scratchops.conv2d(X, W, algorithm=1), TypeError, "algorithm must be a string"),
    (lambda: scratchops.min_add_mul(X, t(1), t(3, 1, 1), 2.0), TypeError,
     "constant must be a real number, got a tensor of shape (1,)"),
    (lambda: scratchops.conv2d(X, t(0, 3, 3, 3)), ValueError, "zero-size dimension"),
    (lambda: scratchops.im2col(t(2, 0, 8, 8), 3), ValueError, "zero-size dimension"),
    (lambda: scratchops.max_pool2d(t(2, 3, 0, 8), 2), ValueError, "zero-size dimension"),
    (lambda: scratchops.conv2d(X.transpose(2, 3), W), ValueError, "must be contiguous"),
    (lambda: scratchops.conv2d(X.to(memory_format=torch.channels_last), W), ValueError,
     "must be contiguous"),
    (lambda: scratchops.conv2d(X, W, workspace_bytes=0), ValueError, "workspace_bytes"),
    (lambda: scratchops.conv2d(X, W, gemm_version=7), ValueError, "gemm_version must be one of"),
    (lambda: scratchops.conv2d(X, W, gemm_version=5), ValueError, "gemm_version must be one of"),
    (lambda: scratchops.conv2d(X, W, algorithm="fft"), ValueError, "algorithm must be one of"),
    (lambda: scratchops.conv2d(X, W, gemm_version="2"), TypeError, "gemm_version must be an int"),
    (lambda: scratchops.conv2d(X, W, workspace_bytes=1.5), TypeError, "workspace_bytes must be an int"),
    (lambda: scratchops.conv2d(X, W, groups=True), TypeError, "groups must be an int"),
    (lambda: scratchops.gemm(t(3, 4), t(4, 5), version=True), TypeError, "version must be an int"),
    (lambda: scratchops.group_norm(X, 2.0), TypeError, "num_groups must be an int"),
    (lambda: scratchops.max_pool2d(X, 2.0), TypeError, "kernel_size must be an int"),
    (lambda: scratchops.conv2d_min_add_mul(X, W, None, 0.5, t(5), 2.0), ValueError,
     "bias must have shape"),
    (lambda: scratchops.conv2d_group_norm_pool_clamp(t(2, 3, 20, 20), t(72, 3, 3, 3), None, 8),
     NotImplementedError, "at most 64 output channels"),
    (lambda: scratchops.conv2d_group_norm_pool_clamp(X, W, None, 3), ValueError,
     "must divide the number of channels"),
    (lambda: scratchops.conv2d_group_norm_pool_clamp(t(2, 3, 5, 5), W, None, 2), ValueError,
     "smaller than the 4 x 4 pooling window"),
    (lambda: scratchops.im2col(X, 9), ValueError, "output would be empty"),
    (lambda: scratchops.im2col(X, 0), ValueError, "kernel_size must be in [1, 65535]"),
    (lambda: scratchops.im2col(X, True), TypeError, "int or a pair of ints"),
    (lambda: scratchops.im2col(X, 3, version=3), ValueError, "version must be one of"),
    (lambda: scratchops.gemm(t(3, 4), t(5, 6)), ValueError, "inner dimensions differ"),
    (lambda: scratchops.gemm(t(2, 3, 4), t(3, 4, 6)), ValueError, "batch sizes differ"),
    (lambda: scratchops.gemm(t(3), t(3, 4)), ValueError, "a must be 2-D or 3-D"),
    (lambda: scratchops.gemm(t(3, 4), t(4, 5), t(4)), ValueError, "one value per row"),
    (lambda: scratchops.gemm(t(3, 4), t(4, 5), version=0), ValueError, "version must be one of"),
    (lambda: scratchops.gemm(t(3, 4), t(5, 4).t()), ValueError, "b must be contiguous"),
    (lambda: scratchops.group_norm(X, 2), ValueError, "must divide the number of channels"),
    (lambda: scratchops.group_norm(X, 0), ValueError, "num_groups must be a positive int"),
    (lambda: scratchops.group_norm(X, 3, t(3, 1, 1)), ValueError, "weight must have shape (3,)"),
    (lambda: scratchops.group_norm(X, 3, eps=-1.0), ValueError, "eps must be non-negative"),
    (lambda: scratchops.group_norm(t(5), 1), ValueError, "input must be"),
    (lambda: scratchops.group_norm(X, 3, version=3), ValueError, "version must be one of"),
    (lambda: scratchops.group_norm_scale(X, 3, None, None, t(3), version="1"), TypeError,
     "version must be an int"),
    (lambda: scratchops.group_norm_scale(X, 3, None, None, t(4, 1, 1)), ValueError,
     "scale must have shape (3,) or (3, 1, 1)"),
    (lambda: scratchops.group_norm_scale(X, 3, None, None, None), ValueError, "needs a scale"),
    (lambda: scratchops.scale(X, t(3, 1)), ValueError, "scale must have shape"),
    (lambda: scratchops.scale(X, t(3, 1, 1).double()), TypeError, "scale must be float32, float"),
    (lambda: scratchops.max_pool2d(X, 9), ValueError, "output would be empty"),
    (lambda: scratchops.max_pool2d(X, 2, padding=2), ValueError, "at most half the kernel"),
    (lambda: scratchops.max_pool2d(X, 2, dilation=2), NotImplementedError, "dilation=1"),
    (lambda: scratchops.max_pool2d(X, 2, ceil_mode=True), NotImplementedError, "ceil_mode"),
    (lambda: scratchops.max_pool2d(X, 2, version=0), ValueError, "version must be one of"),
    (lambda: scratchops.max_pool2d_clamp(X, 2, min=0.0, version=2.0), TypeError,
     "version must be an int"),
    (lambda: scratchops.max_pool2d(X, 2, return_indices=True), NotImplementedError, "indices"),
    (lambda: scratchops.clamp(X), ValueError, "at least one of min and max"),
    (lambda: scratchops.clamp(X, "0"), TypeError, "min must be a real number"),
    (lambda: scratchops.max_pool2d_clamp(X, 4), ValueError, "at least one of min and max"),
    (lambda: scratchops.min_add_mul(X, 0.5, t(3, 1), 2.0), ValueError, "bias must have shape"),
    (lambda: scratchops.min_add_mul(X, None, t(3, 1, 1), 2.0), TypeError, "constant must be"),
]


@pytest.mark.parametrize("call", [
    # Integer-like scalars torch takes: numpy and 0-dim torch integers.
    lambda: scratchops.max_pool2d(t(1, 3, 8, 8, device="meta"), np.int64(2)),
    lambda: scratchops.im2col(t(1, 3, 8, 8, device="meta"), np.int32(3)),
    lambda: scratchops.max_pool2d(t(1, 3, 8, 8, device="meta"), torch.tensor(2)),
    lambda: scratchops.group_norm(t(1, 4, 3, 3, device="meta"), np.int64(2), eps=np.float32(1e-5)),
    lambda: scratchops.gemm(t(3, 4, device="meta"), t(4, 5, device="meta"), version=np.int64(3)),
])
def test_integer_like_scalars_are_accepted(call):
    call()


@pytest.mark.parametrize("call,error,message", CASES,
                         ids=[f"{i}-{c[2][:30]}" for i, c in enumerate(CASES)])
def test_bad_input_gets_a_clear_error(call, error, message):
    with pytest.raises(error) as info:
        call()
    assert message in str(info.value), str(info.value)


def test_device_check_names_the_offending_tensor():
    from scratchops import _validate
    with pytest.raises(ValueError, match="bias must be a CUDA tensor, got one on cpu"):
        _validate.check_cuda(input=None, bias=t(4))


@pytest.mark.parametrize("call", [
    lambda: scratchops.conv2d(t(2**16, 1, 2**8, 2**7 + 2, device="meta"), t(1, 1, 3, 3, device="meta")),
    lambda: scratchops.gemm(t(2**16, 2**15 + 1, device="meta"), t(2**15 + 1, 1, device="meta")),
    lambda: scratchops.gemm(t(2**16, 4, device="meta"), t(4, 2**15, device="meta")),
    lambda: scratchops.im2col(t(256, 64, 128, 128, device="meta"), 3),
    lambda: scratchops.clamp(t(2**31, device="meta"), 0.0, 1.0),
])
def test_sizes_beyond_32_bit_indexing_are_refused(call):
    with pytest.raises(ValueError, match="32-bit"):
        call()


def test_problem_constructors_match_kernelbench():
    p85, p31 = PROBLEMS["p85"], PROBLEMS["p31"]
    assert p85.get_init_inputs() == [8, 64, 3, 16, (64, 1, 1), 4, 0.0, 1.0]
    assert p31.get_init_inputs() == [64, 128, 3, 0.5, (128, 1, 1), 2.0]
    assert [x.shape for x in p85.get_inputs()] == [torch.Size([128, 8, 128, 128])]
    assert [x.shape for x in p31.get_inputs()] == [torch.Size([128, 64, 128, 128])]
    for module in (p85, p31):
        for variant in module.VARIANTS:
            # (the seed alone must make the parameters equal, as KernelBench builds them)
            model, model_new = build_pair(module, variant, seed=0, device="cpu", load_state=False)
            ref, new = model.state_dict(), model_new.state_dict()
            assert list(ref) == list(new)
            assert all(torch.equal(ref[k], new[k]) for k in ref)


def test_model_reference_runs_on_cpu():
    # The torch reference itself is plain torch: it runs anywhere (here on a small batch).
    module = PROBLEMS["p85"]
    torch.manual_seed(0)
    y = module.Model(*module.get_init_inputs())(torch.rand(1, 8, 20, 20))
    assert y.shape == (1, 64, 4, 4) and 0.0 <= y.min() and y.max() <= 1.0
