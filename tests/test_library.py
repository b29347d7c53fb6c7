"""The operator library: on any machine, every operator and its fake are registered at import
and ModelNew traces on the meta device and under FakeTensorMode; on a GPU, the built CUDA side
implements the same schemas. (Backward: test_autograd.py; torch.compile: test_compile.py.)"""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import scratchops
from helpers import model_cases, requires_gpu
from scratchops import _build, _library
from scratchops.problems import PROBLEMS, build_pair

REPO = Path(__file__).resolve().parent.parent
CASES = model_cases()


def test_every_public_operator_is_registered():
    # (in a fresh process: what the import registers, whatever else has run)
    result = subprocess.run(
        [sys.executable, "-c", "import torch, scratchops; print(' '.join(n.split('::')[1] for n "
         "in torch._C._dispatch_get_all_op_names() if n.startswith('scratchops::')))"],
        capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr
    registered = set(result.stdout.split())
    # (and the private operators of the backward formulas, and the double backward's error:
    # test_autograd.py)
    assert registered == (set(_library.SCHEMAS) | set(_library.BACKWARD_SCHEMAS)
                          | set(_library.KEEPING_SCHEMAS) | {"_backward_not_implemented"})


@requires_gpu
def test_binding_implements_each_schema_with_its_types():
    # binding.cpp registers each CUDA implementation under the schema inferred from its C++
    # signature; the public operator passes its arguments on in order, so the types must agree.
    def types(op):
        schema = op.default._schema
        return [str(a.type) for a in schema.arguments], [str(r.type) for r in schema.returns]

    cuda = _build.ops()
    names = {n.split("::")[1] for n in torch._C._dispatch_get_all_op_names()
             if n.startswith("scratchops_cuda::")} - {"register_public_kernels",
                                                     "set_tensor_core_path",
                                                     "get_tensor_core_path",
                                                     "tensor_core_engine"}
    assert names == (set(_library.SCHEMAS) | set(_library.BACKWARD_SCHEMAS)
                     | set(_library.KEEPING_SCHEMAS))
    for name in names:
        assert types(getattr(cuda, name)) == types(getattr(torch.ops.scratchops, name)), name


def test_launchers_h_routes_the_tensor_core_gemm_version_of_versions_py():
    # versions.py defines the numbers; binding.cpp needs to know which are gemm's tensor-core
    # versions (the first, the default one, and the wgmma steps between them).
    text = (REPO / "cuda" / "launchers.h").read_text()
    number = re.search(r"constexpr int kGemmTensorCoreVersion = (\d+);", text).group(1)
    assert int(number) == scratchops.versions.GEMM_TENSOR_CORE_VERSION == \
        max(scratchops.GEMM_VERSIONS)
    first = re.search(r"constexpr int kGemmFirstTensorCoreVersion = (\d+);", text).group(1)
    assert int(first) == scratchops.versions.GEMM_FIRST_TENSOR_CORE_VERSION
    # (launchers.h: the wgmma versions lie strictly between the first and the default)
    assert scratchops.versions.GEMM_WGMMA_VERSIONS == tuple(
        range(int(first) + 1, int(number)))
    cuda_core = re.search(r"constexpr int kConvGnPoolCudaCoreVersion = (\d+);", text).group(1)
    assert int(cuda_core) == scratchops.versions.CONV_GN_POOL_CUDA_CORE_VERSION
    assert scratchops.CONV_GN_POOL_VERSIONS[int(cuda_core)] == "cuda_cores"
    rows = re.search(r"constexpr int kGemmTensorCoreMinRows = (\d+);", text).group(1)
    assert int(rows) == scratchops.versions.GEMM_TENSOR_CORE_MIN_ROWS
    # and each operator's last version, which binding.cpp refuses beyond
    for name, table in (("kIm2colVersions", scratchops.IM2COL_VERSIONS),
                        ("kConvGnPoolVersions", scratchops.CONV_GN_POOL_VERSIONS),
                        ("kGroupNormVersions", scratchops.GROUP_NORM_VERSIONS),
                        ("kMaxPool2dVersions", scratchops.MAX_POOL2D_VERSIONS)):
        last = re.search(rf"constexpr int {name} = (\d+);", text).group(1)
        assert sorted(table) == list(range(1, int(last) + 1)), name


@pytest.mark.parametrize("name,label", CASES)
def test_model_new_traces_on_the_meta_device(name, label):
    module = PROBLEMS[name]
    model, model_new = build_pair(module, label, seed=0, device="cpu")
    x = torch.empty(2, *module.get_inputs()[0].shape[1:2], 20, 19, device="meta")
    assert model_new.to("meta")(x).shape == model.to("meta")(x).shape


@pytest.mark.parametrize("name,label", CASES)
def test_model_new_traces_under_fake_tensor_mode(name, label):
    from torch._subclasses.fake_tensor import FakeTensorMode
    module = PROBLEMS[name]
    model, model_new = build_pair(module, label, seed=0, device="cpu")
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        model_new, model = model_new.to("meta"), model.to("meta")
        x = mode.from_tensor(torch.empty(2, *module.get_inputs()[0].shape[1:2], 20, 19,
                                         device="meta"))
        assert model_new(x).shape == model(x).shape


@pytest.mark.parametrize("name,label", CASES)
def test_model_new_traces_on_fake_cuda_tensors(name, label):
    # What torch.compile sees on a GPU: fake tensors on the CUDA device. A CPU-only torch can
    # make them (no CUDA call happens); grad stays off, as autograd would need a CUDA guard.
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    module = PROBLEMS[name]
    model, model_new = build_pair(module, label, seed=0, device="cpu")
    mode = FakeTensorMode()

    def fake_cuda(t):
        return FakeTensor(mode, t.detach().to("meta"), torch.device("cuda"))

    model, model_new = model._apply(fake_cuda), model_new._apply(fake_cuda)
    x = fake_cuda(torch.empty(2, *module.get_inputs()[0].shape[1:2], 20, 19))
    with mode, torch.no_grad():
        y, ref = model_new(x), model(x)
    assert y.device.type == "cuda" and y.shape == ref.shape


def test_binding_takes_the_tensor_core_paths_of_versions_py():
    binding = (REPO / "scratchops" / "csrc" / "binding.cpp").read_text()
    table = re.search(r"kPathNames\[\] = \{(.*?)\};", binding, re.S).group(1)
    assert tuple(re.findall(r'\{"(\w+)"', table)) == scratchops.TENSOR_CORE_PATHS
    assert scratchops.get_tensor_core_path() == "auto"  # the default, without loading anything
    with pytest.raises(ValueError, match="one of"):
        scratchops.set_tensor_core_path("tensor_cores")


@requires_gpu
def test_a_forced_tensor_core_path_holds_and_is_restored():
    for path in scratchops.TENSOR_CORE_PATHS:
        with scratchops.tensor_core_path(path):
            assert scratchops.get_tensor_core_path() == path
        assert scratchops.get_tensor_core_path() == "auto"
    hopper = torch.cuda.get_device_capability() == (9, 0)
    with scratchops.tensor_core_path("mma_sync"):
        assert scratchops.tensor_core_engine() == "mma_sync"
    assert scratchops.tensor_core_engine() == ("wgmma" if hopper else "mma_sync")
    with pytest.raises(ValueError, match="one of"):  # binding.cpp's own check
        _build.ops().set_tensor_core_path("tensor_cores")
