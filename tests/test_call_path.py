"""The call path: results never stale, the direct path refusing exactly what the validator
refuses, torch's TF32 switches followed on both sides of the rule, and KernelBench's own
protocol under torch's defaults. (Host cost is a benchmark: `scratchops bench`.)"""

import copy
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import scratchops
from helpers import (TENSOR_CORES, assert_matches, rand, requires_gpu,
                     skip_unless_gemm_version_runs)
from scratchops import _validate, versions
from scratchops.problems import PROBLEMS, build_pair
from scratchops.tools.report import ATOL, RTOL

REPO = Path(__file__).resolve().parent.parent
requires_tensor_cores = pytest.mark.skipif(not TENSOR_CORES,
                                           reason="the default variants need an sm_80+ GPU")
DEFAULTS = {"p85": "one_pass", "p31": "one_kernel"}


def test_tf32_rule_and_one_pass_limits_match_the_cpp_ones():
    launchers = (REPO / "cuda" / "launchers.h").read_text()
    assert int(re.search(r"kTf32MinReduction = (\d+);", launchers).group(1)) == \
        versions.TF32_MIN_REDUCTION
    binding = (REPO / "scratchops" / "csrc" / "binding.cpp").read_text()
    limits = re.search(r"kOnePassMaxChannels = (\d+), kOnePassPool = (\d+);", binding)
    assert (int(limits.group(1)), int(limits.group(2))) == \
        (_validate.ONE_PASS_MAX_CHANNELS, _validate.ONE_PASS_POOL)


# ------------------------------------------------------------------------- never stale
def _new_weights(model):
    return torch.randn_like(model.conv.weight) * model.conv.weight.abs().mean()


UPDATES = {
    "data_copy": lambda m, w: m.conv.weight.data.copy_(w),
    "data_mul": lambda m, w: m.conv.weight.data.mul_(-1.5),
    "data_assign": lambda m, w: setattr(m.conv.weight, "data", w.clone()),
    "no_grad_inplace": lambda m, w: m.conv.weight.copy_(w),
    "load_state_dict": lambda m, w: m.load_state_dict(
        {**m.state_dict(), "conv.weight": w}),
}


def _warm_pair(name, seed):
    """(Model, default ModelNew, input) after one forward of ModelNew: whatever a cache would
    keep from that forward exists before the weights change."""
    module = PROBLEMS[name]
    model, new = build_pair(module, DEFAULTS[name], seed=seed)
    x = rand(2, module.in_channels, 20, 24, low=0.0)
    with torch.no_grad():
        new(x)
    return model, new, x


@requires_gpu
@requires_tensor_cores
@pytest.mark.parametrize("update", sorted(UPDATES))
@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_results_follow_weight_updates(name, update):
    model, new, x = _warm_pair(name, seed=1)
    with torch.no_grad():
        w = _new_weights(model)
        UPDATES[update](model, w)
        UPDATES[update](new, w)
        assert_matches(new(x), model(x), model.double()(x.double()))


@requires_gpu
@requires_tensor_cores
@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_results_follow_an_optimizer_step_and_functional_call(name):
    model, new, x = _warm_pair(name, seed=2)
    for m in (model, new):  # the same step on both: a gradient we choose, SGD
        opt = torch.optim.SGD(m.parameters(), lr=0.5)
        for p in m.parameters():
            p.grad = torch.full_like(p, 0.25)
        opt.step()
    with torch.no_grad():
        other = {k: v * 1.5 for k, v in model.state_dict().items()}
        ours = torch.func.functional_call(new, other, (x,))
        ref = torch.func.functional_call(model, other, (x,))
        assert_matches(new(x), model(x), copy.deepcopy(model).double()(x.double()))
        assert_matches(ours, ref, torch.func.functional_call(
            model.double(), {k: v.double() for k, v in other.items()}, (x.double(),)))


@requires_gpu
@requires_tensor_cores
@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_cuda_graph_replay_reads_the_weights_as_they_are(name):
    module = PROBLEMS[name]
    model, new = build_pair(module, DEFAULTS[name], seed=3)
    x = rand(2, module.in_channels, 20, 24, low=0.0)
    with torch.no_grad():
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            new(x)  # warm-up outside the capture (the kernels are installed, built)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = new(x)
        w = _new_weights(model)
        model.conv.weight.copy_(w)
        new.conv.weight.copy_(w)
        graph.replay()
        torch.cuda.synchronize()
        assert_matches(out, model(x), model.double()(x.double()))


# ------------------------------------------------- the direct path refuses what is invalid
def _cases(d):
    """Calls with invalid arguments, on device d, each hitting a different check."""
    def r(*shape):
        return torch.rand(shape, device=d)

    x, w = r(2, 4, 9, 9), r(6, 4, 3, 3)
    return {
        "stride bool": lambda: scratchops.conv2d(x, w, stride=True),
        "padding too large": lambda: scratchops.conv2d(x, w, padding=70000),
        "bias shape": lambda: scratchops.conv2d(x, w, r(1, 6)),
        "weight channels": lambda: scratchops.conv2d(x, r(6, 3, 3, 3)),
        "kernel too large": lambda: scratchops.conv2d(x, r(6, 4, 10, 3)),
        "zero channels": lambda: scratchops.conv2d(r(2, 0, 9, 9), r(6, 0, 3, 3)),
        "float64": lambda: scratchops.conv2d(x.double(), w.double()),
        "non-contiguous": lambda: scratchops.conv2d(x.transpose(2, 3), w),
        "gemm_version 5": lambda: scratchops.conv2d(x, w, algorithm="im2col_gemm",
                                                    gemm_version=5),
        "workspace 0": lambda: scratchops.conv2d(x, w, workspace_bytes=0),
        "p31 bias (C, 1)": lambda: scratchops.conv2d_min_add_mul(x, w, None, 0.5, r(6, 1), 2.0),
        "p31 bias count": lambda: scratchops.conv2d_min_add_mul(x, w, None, 0.5, r(5), 2.0),
        "p85 groups": lambda: scratchops.conv2d_group_norm_pool_clamp(x, w, None, 4),
        "p85 gn_weight (C,1,1)": lambda: scratchops.conv2d_group_norm_pool_clamp(
            x, w, None, 3, r(6, 1, 1)),
        "p85 eps": lambda: scratchops.conv2d_group_norm_pool_clamp(x, w, None, 3, eps=-1.0),
        "p85 eps nan": lambda: scratchops.conv2d_group_norm_pool_clamp(x, w, None, 3,
                                                                       eps=float("nan")),
        "p85 small": lambda: scratchops.conv2d_group_norm_pool_clamp(r(1, 4, 5, 5), w, None, 3),
        "p85 channels": lambda: scratchops.conv2d_group_norm_pool_clamp(x, r(72, 4, 3, 3), None,
                                                                        8),
        "p85 version": lambda: scratchops.conv2d_group_norm_pool_clamp(x, w, None, 3, version=4),
        "group_norm groups": lambda: scratchops.group_norm(x, 3),
        "group_norm version": lambda: scratchops.group_norm(x, 2, version=3),
        "group_norm weight shape": lambda: scratchops.group_norm(x, 2, r(4, 1, 1)),
        "scale (C, 1) on 4-D": lambda: scratchops.scale(x, r(4, 1)),
        "scale (1, C)": lambda: scratchops.scale(x, r(1, 4)),
        "min_add_mul bias": lambda: scratchops.min_add_mul(x, 0.5, r(5), 2.0),
        "pool padding": lambda: scratchops.max_pool2d(x, 2, padding=2),
        "pool stride 0": lambda: scratchops.max_pool2d(x, 2, stride=0),
        "pool version": lambda: scratchops.max_pool2d(x, 2, version=0),
        "pool empty": lambda: scratchops.max_pool2d(r(1, 0, 4, 4), 2),
        "im2col version": lambda: scratchops.im2col(x, 3, version=3),
        "im2col window": lambda: scratchops.im2col(x, 10),
        "gemm inner": lambda: scratchops.gemm(r(3, 4), r(5, 6)),
        "gemm bias": lambda: scratchops.gemm(r(3, 4), r(4, 6), r(4)),
        "gemm batch": lambda: scratchops.gemm(r(2, 3, 4), r(3, 4, 6)),
        "gemm version": lambda: scratchops.gemm(r(3, 4), r(4, 6), version=10),
        "clamp float64": lambda: scratchops.clamp(x.double(), 0.0, 1.0),
        "clamp no bounds": lambda: scratchops.clamp(x, None, None),
    }


def _error(call):
    with pytest.raises(Exception) as info:
        call()
    return type(info.value), str(info.value)


@requires_gpu
@pytest.mark.parametrize("case", sorted(_cases("meta")))
def test_direct_path_refuses_what_the_validator_refuses(case):
    # On meta tensors the call goes through the fake, which is the validator itself; on the
    # GPU through binding.cpp's checks first. Both must end in the validator's error.
    assert _error(_cases("cuda")[case]) == _error(_cases("meta")[case])


@requires_gpu
def test_direct_path_names_a_tensor_on_another_device():
    x = rand(2, 4, 5, 5)
    for call in (lambda: scratchops.scale(x, x[0, :, 0, 0].cpu()),
                 lambda: scratchops.clamp(x.cpu(), 0.0, 1.0)):
        with pytest.raises(ValueError, match="must be a CUDA tensor|is on cpu"):
            call()


@requires_gpu
@requires_tensor_cores
@pytest.mark.parametrize("call", [
    lambda r: scratchops.conv2d(r(1, 3, 9, 9), r(5, 3, 3, 3), None, [1], "same", [1]),
    lambda r: scratchops.conv2d(r(3, 9, 9), r(5, 3, 3, 3), r(5), torch.tensor(2)),
    lambda r: scratchops.max_pool2d(r(3, 9, 9), 3, [], 1),
    lambda r: scratchops.clamp(r(5, 7), torch.tensor(0.25), None),
    lambda r: scratchops.min_add_mul(r(2, 3, 4, 5), True, r(3), 2),
])
def test_arguments_the_direct_path_does_not_take_still_work(call):
    # (normalised by the validator, then run: the same as torch's counterpart on the meta
    # device gives the shape)
    out = call(lambda *shape: torch.rand(shape, device="cuda"))
    meta = call(lambda *shape: torch.rand(shape, device="meta"))
    assert out.shape == meta.shape and torch.isfinite(out).all()


# ------------------------------------- the direct path keeps what the dispatcher gives
def _clamp01(t):
    return scratchops.clamp(t, 0.0, 1.0)


@requires_gpu
def test_direct_path_is_the_extensions_call_once_installed():
    from scratchops import _library

    _clamp01(rand(3))
    assert _library.cuda_kernels_installed
    # (a pybind11 function of binding.cpp, where before installation it is a Python one)
    assert type(_library.KERNELS.clamp).__name__ == "builtin_function_or_method"


@requires_gpu
def test_direct_path_is_seen_by_dispatch_modes_and_the_profiler():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.append(str(func))
            return func(*args, **(kwargs or {}))

    x = rand(2, 3, 8, 8)
    with torch.no_grad(), Record() as mode:
        _clamp01(x)
    assert "scratchops.clamp.default" in mode.seen
    with torch.no_grad(), torch.profiler.profile() as profile:
        _clamp01(x)
    assert any(event.name == "scratchops::clamp" for event in profile.events())


@requires_gpu
def test_direct_path_honours_torch_function_and_tensor_flags():
    x = rand(4, 5) * 2 - 0.5
    # A negative view (a flag, not data) is materialised by the dispatcher before the kernel.
    assert torch.equal(_clamp01(torch._neg_view(x)), torch.clamp(-x, 0.0, 1.0))

    class Logged(torch.Tensor):
        calls = 0

        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            cls.calls += 1
            return super().__torch_function__(func, types, args, kwargs or {})

    with torch.no_grad():
        out = _clamp01(x.as_subclass(Logged))
    assert Logged.calls > 0 and torch.equal(out.as_subclass(torch.Tensor), torch.clamp(x, 0, 1))
    batched = torch.vmap(_clamp01)(x)
    assert torch.equal(batched, torch.clamp(x, 0.0, 1.0))


# ------------------------------------------------------------------------------ TF32
def _tf32(on: bool):
    torch.backends.cudnn.allow_tf32 = on
    torch.backends.cuda.matmul.allow_tf32 = on


@requires_gpu
@requires_tensor_cores
@pytest.mark.parametrize("algorithm", ["implicit_gemm", "im2col_gemm"])
@pytest.mark.parametrize("cin,k", [(64, 3), (8, 3), (16, 3), (15, 3), (128, 1), (4, 7)])
def test_conv2d_follows_the_tf32_switch_on_both_sides_of_the_rule(cin, k, algorithm):
    x = rand(2, cin, 30, 33, low=0.0)
    w = rand(48, cin, k, k) / (cin * k * k) ** 0.5
    b = rand(48)
    ref64 = F.conv2d(x.double(), w.double(), b.double())
    uses = versions.conv2d_uses_tf32(cin, k, k, True)
    try:
        _tf32(True)
        ours = scratchops.conv2d(x, w, b, algorithm=algorithm)
        theirs = F.conv2d(x, w, b)
    finally:
        _tf32(False)
    fp32 = scratchops.conv2d(x, w, b, algorithm=algorithm)
    err, err_fp32 = (ours.double() - ref64).abs().max(), (fp32.double() - ref64).abs().max()
    if uses:  # TF32's error, far above fp32's
        assert err > 20 * err_fp32, (err, err_fp32)
    else:  # the switch allows TF32, the rule keeps fp32: the same result as with TF32 off
        assert torch.equal(ours, fp32) or algorithm == "im2col_gemm" and err <= 2 * err_fp32
    # Against what torch computed under the same switch (where the rule and cuDNN agree).
    torch_err = (theirs.double() - ref64).abs().max()
    if (torch_err > 20 * err_fp32) == uses:
        torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=RTOL)


@requires_gpu
@pytest.mark.parametrize("version", sorted(scratchops.GEMM_VERSIONS))
def test_gemm_follows_the_matmul_switch(version):
    skip_unless_gemm_version_runs(version)
    a, b = rand(3, 70, 300), rand(300, 45)
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        ours = scratchops.gemm(a, b, version=version)
        theirs = a @ b
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False
    # cuBLAS rounds ties differently (seen on an H100: up to 4.9e-4 apart at K = 300), so
    # the check is TF32's accuracy: within 2x of torch's TF32 error, far above fp32's.
    fp32 = scratchops.gemm(a, b, version=version)
    ref64 = a.double() @ b.double()
    err = (ours.double() - ref64).abs().max()
    assert err <= 2 * (theirs.double() - ref64).abs().max()
    assert err > 20 * (fp32.double() - ref64).abs().max()


# ---------------------------------------------------- KernelBench's protocol, its defaults
@requires_gpu
@requires_tensor_cores
@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_kernelbench_protocol_passes_under_torch_defaults(name):
    # eval_kernel_against_ref: Model and ModelNew after one seed, fresh inputs each trial,
    # torch.allclose at 1e-4, and torch's TF32 switches as a fresh process has them.
    module = PROBLEMS[name]
    _tf32(False)
    torch.backends.cudnn.allow_tf32 = True  # torch's defaults: cuDNN TF32 on, matmul off
    try:
        model, new = build_pair(module, DEFAULTS[name], seed=42, load_state=False)
        with torch.no_grad():
            for trial in range(3):
                torch.manual_seed(trial)
                x = torch.rand(8, module.in_channels, module.height, module.width,
                               device="cuda")
                assert torch.allclose(new(x), model(x), atol=ATOL, rtol=RTOL), trial
    finally:
        _tf32(False)
