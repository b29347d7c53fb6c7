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
def test_fullgraph_with_grad_enabled_runs_the_forward_and_refuses_the_backward(name, label):
    # Parameters require grad and grad mode is on (no torch.no_grad): AOTAutograd traces the
    # backward too; the compiled forward still runs, and its backward raises as in eager.
    model, model_new, x = build(name, label, "meta")
    torch._dynamo.reset()
    y = torch.compile(model_new, fullgraph=True, backend="aot_eager")(x.requires_grad_())
    assert y.requires_grad and y.shape == model(x).shape
    with pytest.raises(NotImplementedError, match=r"^scratchops\.\w+: backward is not implemented"):
        y.sum().backward()


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


@pytest.mark.parametrize("name,label", DEFAULT_CASES)
def test_fullgraph_with_grad_enabled_on_the_gpu(name, label):
    _, model_new, x, compiled = compiled_on_gpu(name, label)
    y = compiled(x)
    assert y.requires_grad
    with torch.no_grad():
        torch.testing.assert_close(y.detach(), model_new(x), atol=ATOL, rtol=RTOL)
    with pytest.raises(NotImplementedError, match=r"^scratchops\.\w+: backward is not implemented"):
        y.sum().backward()
    assert all(p.grad is None for p in model_new.parameters())
