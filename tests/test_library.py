"""The operator library on any machine (no GPU needed): every operator and its fake are
registered at import, ModelNew traces on the meta device and under FakeTensorMode, backward
through any operator raises a clear error, and the CUDA side defines the same schemas."""

import re
from pathlib import Path

import pytest
import torch

import scratchops
from scratchops import _library
from scratchops.problems import PROBLEMS

REPO = Path(__file__).resolve().parent.parent
CASES = [(name, label) for name, module in PROBLEMS.items() for label in module.VARIANTS]


def test_every_public_operator_is_registered():
    registered = {name for name in dir(torch.ops.scratchops)
                  if isinstance(getattr(torch.ops.scratchops, name, None),
                                torch._ops.OpOverloadPacket)}
    assert registered == set(_library.SCHEMAS)


def test_binding_defines_the_same_schemas():
    text = (REPO / "scratchops" / "csrc" / "binding.cpp").read_text()
    defs = re.findall(r'm\.def\(((?:"[^"]*"\s*)+)\)', text)
    cuda = {}
    for d in defs:
        schema = "".join(re.findall(r'"([^"]*)"', d))
        name = schema.split("(", 1)[0]
        cuda[name] = schema[len(name):]
    assert cuda == _library.SCHEMAS


def build(module, label):
    torch.manual_seed(0)
    model = module.Model(*module.get_init_inputs())
    torch.manual_seed(0)
    return model, module.ModelNew(*module.get_init_inputs(), **module.VARIANTS[label])


@pytest.mark.parametrize("name,label", CASES)
def test_model_new_traces_on_the_meta_device(name, label):
    module = PROBLEMS[name]
    model, model_new = build(module, label)
    x = torch.empty(2, *module.get_inputs()[0].shape[1:2], 20, 19, device="meta")
    assert model_new.to("meta")(x).shape == model.to("meta")(x).shape


@pytest.mark.parametrize("name,label", CASES)
def test_model_new_traces_under_fake_tensor_mode(name, label):
    from torch._subclasses.fake_tensor import FakeTensorMode
    module = PROBLEMS[name]
    model, model_new = build(module, label)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        model_new, model = model_new.to("meta"), model.to("meta")
        x = mode.from_tensor(torch.empty(2, *module.get_inputs()[0].shape[1:2], 20, 19,
                                         device="meta"))
        assert model_new(x).shape == model(x).shape


@pytest.mark.parametrize("name,label", CASES)
def test_backward_through_model_new_raises(name, label):
    module = PROBLEMS[name]
    _, model_new = build(module, label)
    model_new = model_new.to("meta")
    x = torch.empty(2, *module.get_inputs()[0].shape[1:2], 20, 19, device="meta",
                    requires_grad=True)
    y = model_new(x)
    assert y.requires_grad
    with pytest.raises(NotImplementedError, match=r"scratchops\.\w+: backward is not implemented"):
        y.sum().backward()
