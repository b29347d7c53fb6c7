"""ModelNew against KernelBench's Model for both problems: every variant at full KernelBench
size, the kernels it launches, P85's one-pass rule. (torch.compile: test_compile.py;
backward: test_autograd.py.)"""

import copy

import pytest
import torch

import scratchops

from helpers import (HAS_GPU, TENSOR_CORE_VARIANTS, TENSOR_CORES, assert_matches, model_cases,
                     requires_gpu, skip_unless_runnable)
from scratchops.problems import PROBLEMS, build_pair

CASES = model_cases()


def randomize_parameters(model, seed):
    """Every parameter redrawn (γ, β and scale included, negative values too), so the
    comparison covers more than the default ones and zeros."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            spread = max(1.0, p.abs().max().item())
            p.copy_((torch.rand(p.shape, generator=g) * 2 - 1) * spread)


@pytest.fixture(scope="module", params=list(PROBLEMS))
def kernelbench_input(request):
    module = PROBLEMS[request.param]
    torch.manual_seed(99)
    return request.param, module.get_inputs()[0].cuda()


@requires_gpu
@pytest.mark.parametrize("label", ["same_seed", "state_dict"])
def test_model_new_matches_model(kernelbench_input, label):
    name, x = kernelbench_input
    module = PROBLEMS[name]
    for variant in module.VARIANTS:
        if (name, variant) in TENSOR_CORE_VARIANTS and not TENSOR_CORES:
            continue
        model, model_new = build_pair(module, variant, seed=7, load_state=False)
        if label == "state_dict":
            randomize_parameters(model, seed=11)
            model_new.load_state_dict(model.state_dict())
        # same_seed: built after the same seed, nothing copied (KernelBench's evaluation).
        with torch.no_grad():
            ref32 = model(x)
            ref64 = copy.deepcopy(model).double()(x.double())
            out = model_new(x)
        max_err = (out - ref32).abs().max().item()
        print(f"{name} {variant} {label}: max |ModelNew - Model| = {max_err:.3e}, "
              f"max |ModelNew - float64| = {(out.double() - ref64).abs().max().item():.3e}")
        assert_matches(out, ref32, ref64)


@requires_gpu
@pytest.mark.parametrize("name,label", CASES)
def test_model_new_launches_only_scratchops_kernels(name, label):
    skip_unless_runnable(case=(name, label))
    module = PROBLEMS[name]
    _, model_new = build_pair(module, label, seed=3)
    x = torch.rand(2, *module.get_inputs()[0].shape[1:], device="cuda")
    with torch.no_grad():
        model_new(x)  # builds and warms up outside the recording
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            model_new(x)
            torch.cuda.synchronize()
    device_events = [e.name for e in prof.events()
                     if e.device_type == torch.autograd.DeviceType.CUDA]
    assert device_events, "the profiler recorded no GPU activity at all"
    foreign = [e for e in device_events if "scratchops" not in e]
    assert not foreign, f"ModelNew ran GPU work that is not a scratchops kernel: {foreign}"
    # The default variants (TF32 off here), the weights' packing included where there is one
    # (every call): on the wgmma engine P31 in one kernel (its grid packs the weights, then
    # convolves) and P85 in two (its one pass reads the weights itself, then the finalize);
    # on mma.sync each with a packing kernel first.
    packing_kernel = 0 if scratchops.tensor_core_engine() == "wgmma" else 1
    expected = {("p31", "one_kernel"): 1 + packing_kernel,
                ("p85", "one_pass"): 2 + packing_kernel}.get((name, label))
    if expected is not None:
        assert len(device_events) == expected, device_events


@pytest.mark.skipif(HAS_GPU, reason="checks the CPU-only path")
def test_model_new_without_gpu_says_why():
    module = PROBLEMS["p31"]
    model_new = module.ModelNew(*module.get_init_inputs())
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        model_new(torch.rand(1, 64, 8, 8))


@requires_gpu
@pytest.mark.parametrize("hw,pool,cout,covered", [((20, 19), 4, 64, True), ((20, 19), 2, 64, False),
                                                  ((20, 19), 4, 72, False),
                                                  ((6, 9), 4, 64, True)])
def test_p85_one_pass_rule_both_sides(hw, pool, cout, covered):
    # One pass where the rule says so, the fused chain elsewhere: both match Model.
    if not TENSOR_CORES:
        pytest.skip("the one-pass variant runs on the tensor cores of an sm_80+ GPU")
    module = PROBLEMS["p85"]
    init = [8, cout, 3, 16 if cout % 16 == 0 else 8, (cout, 1, 1), pool, -0.3, 0.8]
    model, model_new = build_pair(module, "one_pass", seed=2, init=init)
    randomize_parameters(model, seed=3)
    model_new.load_state_dict(model.state_dict())
    x = torch.rand(2, 8, *hw, device="cuda")
    assert model_new.one_pass_covers(x) == covered
    with torch.no_grad():
        assert_matches(model_new(x), model(x), copy.deepcopy(model).double()(x.double()))


def test_member_is_getattr():
    """members.member (ModelNew's lookups of its parameters and submodules) returns what
    getattr returns: a parameter, a bias of None, a submodule, a buffer, a parametrized weight
    (a property, its parameter moved away), a plain tensor put where a parameter was, and the
    tensors torch.func.functional_call swaps in, where a forward reads them."""
    import torch.nn.utils.parametrize as parametrize
    from scratchops.problems.members import member

    class Negate(torch.nn.Module):
        def forward(self, w):
            return -w

    model = PROBLEMS["p31"].ModelNew(*PROBLEMS["p31"].get_init_inputs())
    model.register_buffer("counts", torch.arange(3))
    conv = model.conv
    assert member(model, "conv") is conv and member(model, "counts") is model.counts
    assert member(conv, "weight") is conv.weight and member(model, "bias") is model.bias
    no_bias = torch.nn.Conv2d(3, 4, 3, bias=False)
    assert member(no_bias, "bias") is None
    parametrize.register_parametrization(conv, "weight", Negate())
    assert torch.equal(member(conv, "weight"), conv.weight)
    assert torch.equal(member(conv, "weight"), -conv.parametrizations.weight.original)
    del no_bias.weight
    no_bias.weight = torch.ones(4, 3, 3, 3)
    assert member(no_bias, "weight") is no_bias.weight

    swapped = torch.full_like(model.bias, 7.0)
    seen = []
    forward = type(model).forward

    def spy(self, x):
        seen.append(member(self, "bias"))
        return x
    type(model).forward = spy
    try:
        torch.func.functional_call(model, {"bias": swapped}, (torch.zeros(1),))
    finally:
        type(model).forward = forward
    assert seen[0] is swapped
