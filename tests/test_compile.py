"""torch.compile(ModelNew, fullgraph=True) for both problems and every variant: no graph
break, results as in eager mode.

On a CPU the models run on the meta device: Dynamo traces the whole forward (validation code
and the opaque custom operators) with the "eager" and "aot_eager" backends, which is where a
graph break or an untraceable check would show. On a GPU the default backend (Inductor)
compiles them and the results are compared with eager ModelNew and with Model.
"""

import pytest
import torch

from helpers import ATOL, RTOL, model_cases, skip_unless_runnable
from scratchops.problems import PROBLEMS, build_pair

CASES = model_cases()
DEFAULT_CASES = [("p85", "one_pass"), ("p31", "one_kernel")]


def build(name, label, device, seed=5):
    module = PROBLEMS[name]
    model, model_new = build_pair(module, label, seed, device)
    # A small batch and an odd spatial size (20 x 19): edges and remainders are exercised.
    x = torch.rand(2, module.get_inputs()[0].shape[1], 20, 19)
    return model, model_new, x.to(device)


def assert_no_graph_break(model_new, x):
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(model_new)(x)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


# --------------------------------------------------------------------------- CPU (meta)
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("name,label", CASES)
def test_fullgraph_traces_on_meta(name, label, dynamic, backend):
    model, model_new, x = build(name, label, "meta")
    torch._dynamo.reset()
    compiled = torch.compile(model_new, fullgraph=True, dynamic=dynamic, backend=backend)
    with torch.no_grad():
        assert compiled(x).shape == model(x).shape
    assert_no_graph_break(model_new, x)


@pytest.mark.parametrize("name,label", CASES)
def test_fullgraph_with_grad_enabled_traces_forward_and_backward(name, label):
    # Parameters require grad and grad mode is on: AOTAutograd traces the backward formulas
    # (scratchops._backward) too, every gradient of the right shape.
    model, model_new, x = build(name, label, "meta")
    torch._dynamo.reset()
    y = torch.compile(model_new, fullgraph=True, backend="aot_eager")(x.requires_grad_())
    assert y.requires_grad and y.shape == model(x).shape
    y.sum().backward()
    assert x.grad.shape == x.shape
    assert all(p.grad is not None and p.grad.shape == p.shape for p in model_new.parameters())


# -------------------------------------------------------------------------------- GPU
def compiled_on_gpu(name, label):
    """(Model, ModelNew, x, torch.compile(ModelNew, fullgraph=True)) on the GPU, or a skip."""
    skip_unless_runnable("cuda", case=(name, label))
    model, model_new, x = build(name, label, "cuda")
    torch._dynamo.reset()
    return model, model_new, x, torch.compile(model_new, fullgraph=True)


@pytest.mark.parametrize("name,label", CASES)
def test_fullgraph_matches_eager_and_model(name, label):
    model, model_new, x, compiled = compiled_on_gpu(name, label)
    with torch.no_grad():
        out, eager, ref = compiled(x), model_new(x), model(x)
        out_again = compiled(x)  # the second call runs the compiled code as it stands
    torch.testing.assert_close(out, eager, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(out_again, eager, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=RTOL)
    assert_no_graph_break(model_new, x)


@pytest.mark.parametrize("name,label", CASES)
def test_compiled_training_step_matches_eager(name, label):
    # The training step (forward, loss, backward) under torch.compile(fullgraph=True) gives the
    # gradients the eager ModelNew gives.
    _, model_new, x, _ = compiled_on_gpu(name, label)
    model_new.train()

    def step(x):
        return (model_new(x) ** 2).mean()

    def grads(fn):
        model_new.zero_grad(set_to_none=True)
        xi = x.clone().requires_grad_()
        loss = fn(xi)
        loss.backward()
        return [loss.detach(), xi.grad] + [p.grad for p in model_new.parameters()]

    eager = grads(step)
    torch._dynamo.reset()
    compiled = grads(torch.compile(step, fullgraph=True))
    for e, c in zip(eager, compiled):
        torch.testing.assert_close(c, e, rtol=1e-4, atol=1e-4 * e.abs().max().item() + 1e-12)
