"""Autograd is honest: .backward() through any scratchops operator raises NotImplementedError
naming the operator (the kernels are forward-only for now); it never returns with missing or
zero gradients. Without grad (torch.no_grad, inference_mode, nothing requiring grad) nothing
changes.

The CPU tests run the operators on the meta device, where the backward raises as on the GPU;
the GPU tests run them, and both ModelNews, on real CUDA tensors.
"""

import re

import pytest
import torch

import scratchops
from helpers import OPERATOR_SAMPLES, model_cases, skip_unless_runnable
from scratchops.problems import PROBLEMS

MODEL_CASES = model_cases()
DIFFERENTIABLE = sorted(OPERATOR_SAMPLES)  # every operator's output is a float tensor


def raises_backward_error(name=r"\w+"):
    return pytest.raises(NotImplementedError,
                         match=rf"^scratchops\.{name}: backward is not implemented")


def requiring_grad(args):
    """args with every float tensor made a leaf that requires grad."""
    return tuple(a.detach().requires_grad_() if isinstance(a, torch.Tensor) and
                 a.is_floating_point() else a for a in args)


def build_model_new(name, label, device):
    module = PROBLEMS[name]
    model_new = module.ModelNew(*module.get_init_inputs(), **module.VARIANTS[label])
    x = torch.rand(2, module.get_inputs()[0].shape[1], 20, 19)
    return model_new.to(device), x.to(device)


# ------------------------------------------------------------------- every operator alone
@pytest.mark.parametrize("device", ["meta", "cuda"])
@pytest.mark.parametrize("name", DIFFERENTIABLE)
def test_backward_through_each_operator_raises_naming_it(name, device):
    skip_unless_runnable(device, operator=name)
    args = requiring_grad(OPERATOR_SAMPLES[name](device))
    y = getattr(torch.ops.scratchops, name)(*args)
    assert y.requires_grad
    with raises_backward_error(name):
        y.sum().backward()
    assert all(a.grad is None for a in args if isinstance(a, torch.Tensor))


@pytest.mark.parametrize("device", ["meta", "cuda"])
@pytest.mark.parametrize("name", DIFFERENTIABLE)
def test_autograd_grad_raises_too_for_one_input(name, device):
    # Only the first tensor requires grad: its gradient is refused as well.
    skip_unless_runnable(device, operator=name)
    args = OPERATOR_SAMPLES[name](device)
    x = args[0].detach().requires_grad_()
    y = getattr(torch.ops.scratchops, name)(x, *args[1:])
    with raises_backward_error(name):
        torch.autograd.grad(y.sum(), x)


@pytest.mark.parametrize("device", ["meta", "cuda"])
@pytest.mark.parametrize("call,op", [
    (lambda r: scratchops.group_norm_scale(r(2, 6, 5, 7), 3, r(6), r(6), r(6, 1, 1)),
     "group_norm"),
    (lambda r: scratchops.max_pool2d(r(2, 3, 9, 10), 2), "max_pool2d_clamp"),
    (lambda r: scratchops.im2col(r(3, 9, 8), 3), "im2col"),  # unbatched: a view on top
    (lambda r: scratchops.conv2d(r(3, 9, 8), r(4, 3, 3, 3), algorithm="im2col_gemm"), "conv2d"),
])
def test_backward_through_public_functions_names_the_operator_they_call(call, op, device):
    skip_unless_runnable(device)

    def r(*shape):
        return torch.rand(shape).to(device).requires_grad_()

    with raises_backward_error(op):
        call(r).sum().backward()


@pytest.mark.parametrize("device", ["meta", "cuda"])
@pytest.mark.parametrize("grad_off", [torch.no_grad, torch.inference_mode])
@pytest.mark.parametrize("name", DIFFERENTIABLE)
def test_without_grad_nothing_changes(name, grad_off, device):
    skip_unless_runnable(device, operator=name)
    args = requiring_grad(OPERATOR_SAMPLES[name](device))
    with grad_off():
        y = getattr(torch.ops.scratchops, name)(*args)
    assert not y.requires_grad


def test_the_error_names_the_operator_and_what_to_do():
    x = torch.rand(3, 4, device="meta", requires_grad=True)
    with pytest.raises(NotImplementedError) as info:
        scratchops.clamp(x, 0.0, 1.0).sum().backward()
    message = str(info.value)
    assert message.startswith("scratchops.clamp: backward is not implemented")
    assert re.search(r"torch\.no_grad\(\)|inference_mode", message)


# ------------------------------------------------------------------------ both ModelNews
@pytest.mark.parametrize("device", ["meta", "cuda"])
@pytest.mark.parametrize("name,label", MODEL_CASES)
def test_backward_through_model_new_raises(name, label, device):
    # Input and every parameter require grad (parameters do by default).
    skip_unless_runnable(device, case=(name, label))
    model_new, x = build_model_new(name, label, device)
    x.requires_grad_()
    assert all(p.requires_grad for p in model_new.parameters())
    y = model_new(x)
    assert y.requires_grad
    with raises_backward_error():
        y.sum().backward()
    assert x.grad is None
    assert all(p.grad is None for p in model_new.parameters())


@pytest.mark.parametrize("device", ["meta", "cuda"])
@pytest.mark.parametrize("name,label", MODEL_CASES)
def test_backward_raises_when_only_the_parameters_require_grad(name, label, device):
    skip_unless_runnable(device, case=(name, label))
    model_new, x = build_model_new(name, label, device)
    with raises_backward_error():
        model_new(x).sum().backward()
