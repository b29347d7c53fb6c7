"""What a CPU machine can check of the build: every kernel file compiles alone with nvcc
for the target architectures, the GEMM kernels do not spill, the binding compiles against
torch's headers, and the package imports and explains itself without a GPU."""

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch

import scratchops
from scratchops import _build

REPO = Path(__file__).resolve().parent.parent
CUDA_FILES = sorted((REPO / "cuda").glob("*.cu"))
ARCHS = ("80", "86", "89", "90a")  # every GPU the kernels serve: A100, RTX 30, RTX 40 / L4, H100
NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not installed here")


def test_every_kernel_file_is_listed():
    names = {p.name for p in CUDA_FILES}
    assert {"gemm.cu", "conv_im2col.cu", "groupnorm.cu", "pool_clamp.cu",
            "channelwise.cu"} <= names
    assert [p.resolve() for p in _build.kernel_sources()[1:]] == CUDA_FILES


@needs_nvcc
@pytest.mark.parametrize("source", CUDA_FILES, ids=lambda p: p.name)
def test_kernel_file_compiles_alone(source, tmp_path):
    gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in ARCHS]
    result = subprocess.run(
        [NVCC, "-c", str(source), "-o", str(tmp_path / "k.o"), "-std=c++17", "-O3",
         "-Xptxas", "-v", "-Werror", "all-warnings", *gencode],
        capture_output=True, text=True, cwd=source.parent)
    report = result.stdout + result.stderr
    assert result.returncode == 0, report
    for arch in ARCHS:
        assert f"for 'sm_{arch}'" in report, f"no sm_{arch} code built:\n{report}"
    # No kernel may use local memory: a stack frame or spills mean registers overflowed or
    # a register array was indexed at run time.
    frames = re.findall(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                        report)
    assert frames, report
    assert all(f == ("0", "0", "0") for f in frames), report


@needs_nvcc
def test_binding_compiles_against_torch_headers(tmp_path):
    """A syntax-and-types check of scratchops/csrc/binding.cpp (linking needs a CUDA build
    of torch, which CI does not have). The CPU wheel lacks one generated header of c10's CUDA
    part; a stand-in with its one macro is supplied when it is missing."""
    from torch.utils import cpp_extension
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler here")
    cuda_include = Path(NVCC).resolve().parent.parent / "include"
    if not (cuda_include / "cuda_runtime.h").exists():
        cuda_include = Path(os.path.realpath(subprocess.run(
            ["sh", "-c", f"grep -o '/[^ ]*/bin/nvcc' {NVCC} || echo {NVCC}"],
            capture_output=True, text=True).stdout.strip())).parent.parent / "include"
    macros = tmp_path / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h"
    macros.parent.mkdir(parents=True)
    macros.write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
    # (the binding is also a Python module: Python's headers and the module's name)
    python_include = sysconfig.get_paths()["include"]
    if not (Path(python_include) / "Python.h").exists():
        pytest.skip(f"Python's headers are not installed here ({python_include})")
    includes = [f"-isystem{p}" for p in [*cpp_extension.include_paths(), python_include]]
    result = subprocess.run(
        [cxx, "-fsyntax-only", "-std=c++17", "-Wall", "-Wextra", "-Werror", *includes,
         f"-DTORCH_EXTENSION_NAME={_build.EXTENSION_NAME}",
         f"-isystem{tmp_path}", f"-isystem{cuda_include}", f"-I{REPO / 'cuda'}",
         str(_build.BINDING)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-5000:]


def test_import_works_without_a_gpu():
    result = subprocess.run([sys.executable, "-c", "import scratchops; print(scratchops.__all__)"],
                            capture_output=True, text=True, cwd=REPO,
                            env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert result.returncode == 0, result.stderr
    assert "conv2d" in result.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_kernel_call_without_gpu_says_what_is_missing():
    assert not scratchops.is_available()
    reason = scratchops.why_unavailable()
    assert "CPU-only build" in reason or "no CUDA device" in reason
    with pytest.raises(RuntimeError, match="scratchops cannot run its CUDA kernels: " + re.escape(reason)):
        scratchops.load()


def test_the_placeholder_path_takes_no_lock_once_loaded(monkeypatch):
    # Until the compiled kernels are installed, each operator's placeholder CUDA kernel
    # reaches the extension through _build.ops(): once loaded, one module-level read; the
    # lock and the build belong to the first call only.
    from types import SimpleNamespace

    from scratchops import _library

    class NoLock:
        def __enter__(self):
            raise AssertionError("the per-call path took the build lock")

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(_build, "_lock", NoLock())
    monkeypatch.setattr(_build, "_ops", SimpleNamespace(clamp=lambda *args: ("ran", args)))
    assert _library._placeholder_cuda_kernel("clamp")("x", 0.0, 1.0) == ("ran", ("x", 0.0, 1.0))

    monkeypatch.setattr(_build, "_ops", None)  # not loaded yet: the first call builds
    with pytest.raises(AssertionError, match="took the build lock"):
        _library._placeholder_cuda_kernel("clamp")("x", 0.0, 1.0)
