"""Build and load the CUDA kernels on first use.

The kernels (``cuda/*.cu``) and the binding (``scratchops/csrc/binding.cpp``) are compiled
with ``torch.utils.cpp_extension.load`` (ninja) into a cache directory, once per torch
version, CUDA version and GPU architecture; later imports reuse the built library and ninja
rebuilds only what changed. ``import scratchops`` never builds: the first kernel call does.

Environment:
  TORCH_CUDA_ARCH_LIST     architectures to build for (default: the GPUs present, e.g. 9.0)
  SCRATCHOPS_BUILD_DIR     where the build lives (default ~/.cache/scratchops/<tag>)
  SCRATCHOPS_VERBOSE_BUILD=1   show the compiler's output
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
from pathlib import Path

import torch

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_DIR = PACKAGE_DIR.parent
CUDA_DIR = REPO_DIR / "cuda"
BINDING = PACKAGE_DIR / "csrc" / "binding.cpp"
EXTENSION_NAME = "scratchops_kernels"

_lock = threading.Lock()
_loaded = False


def kernel_sources() -> list[Path]:
    """Every kernel file, in a stable order (the binding first)."""
    return [BINDING, *sorted(CUDA_DIR.glob("*.cu"))]


def _nvcc_path() -> str | None:
    from torch.utils import cpp_extension

    if cpp_extension.CUDA_HOME:
        candidate = Path(cpp_extension.CUDA_HOME) / "bin" / "nvcc"
        if candidate.exists():
            return str(candidate)
    return shutil.which("nvcc")


def why_unavailable() -> str | None:
    """Why the kernels cannot run here, or None when they can."""
    if torch.version.cuda is None:
        return (f"this PyTorch ({torch.__version__}) is a CPU-only build; scratchops kernels "
                "need a CUDA build of PyTorch and a CUDA GPU")
    if not torch.cuda.is_available():
        return "no CUDA device is visible (torch.cuda.is_available() is False)"
    if not CUDA_DIR.is_dir() or not BINDING.exists():
        return (f"the kernel sources are missing ({CUDA_DIR}); install scratchops from a "
                "checkout with `pip install --no-deps --no-build-isolation -e .`")
    if _nvcc_path() is None:
        return ("nvcc was not found: install the CUDA toolkit and put nvcc on PATH "
                "or set CUDA_HOME")
    return None


def _arch_tag() -> str:
    arch_list = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if arch_list:
        return "arch" + "-".join(arch_list.replace(";", " ").replace("+", "").split())
    capabilities = sorted({torch.cuda.get_device_capability(i)
                           for i in range(torch.cuda.device_count())})
    return "sm" + "-".join(f"{major}{minor}" for major, minor in capabilities)


def build_directory() -> Path:
    if os.environ.get("SCRATCHOPS_BUILD_DIR"):
        return Path(os.environ["SCRATCHOPS_BUILD_DIR"])
    tag = f"torch{torch.__version__}-cuda{torch.version.cuda}-{_arch_tag()}"
    return Path.home() / ".cache" / "scratchops" / tag.replace("+", "_")


def _needs_compile(build_dir: Path) -> bool:
    library = build_dir / f"{EXTENSION_NAME}.so"
    if not library.exists():
        return True
    built = library.stat().st_mtime
    sources = [*kernel_sources(), CUDA_DIR / "launchers.h"]
    return any(source.stat().st_mtime > built for source in sources)


def load() -> None:
    """Compile (first use only) and load the kernels, or raise RuntimeError saying why not."""
    global _loaded
    with _lock:
        if _loaded:
            return
        reason = why_unavailable()
        if reason is not None:
            raise RuntimeError(f"scratchops cannot run its CUDA kernels: {reason}")
        from torch.utils import cpp_extension

        build_dir = build_directory()
        build_dir.mkdir(parents=True, exist_ok=True)
        if _needs_compile(build_dir):
            print(f"scratchops: compiling the CUDA kernels for {_arch_tag()} into {build_dir} "
                  "(first use; this takes a minute or two)...", file=sys.stderr, flush=True)
        cpp_extension.load(
            name=EXTENSION_NAME,
            sources=[str(s) for s in kernel_sources()],
            extra_include_paths=[str(CUDA_DIR)],
            extra_cflags=["-O3", "-std=c++17"],
            # -lineinfo lets compute-sanitizer and ncu point at source lines; no fast-math:
            # the kernels must match torch's fp32 results within 1e-4.
            extra_cuda_cflags=["-O3", "-lineinfo", "-std=c++17"],
            build_directory=str(build_dir),
            is_python_module=False,
            verbose=os.environ.get("SCRATCHOPS_VERBOSE_BUILD") == "1",
        )
        from . import ops

        ops.register_fakes()
        _loaded = True
