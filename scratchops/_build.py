"""Build and load the CUDA kernels on first use.

The kernels (``cuda/*.cu``) and the binding (``scratchops/csrc/binding.cpp``) are compiled
with ``torch.utils.cpp_extension.load`` (ninja) into a cache directory, once per torch
version, CUDA version and GPU architecture; later loads reuse the built library and ninja
rebuilds only what changed. Importing scratchops never builds: the first kernel call does,
through ``ops()``, whose fast path is one module-level read (no lock, no work the first call
needed), so it can sit on every operator's call path.

The sources are read from the checkout's ``cuda/`` (an editable install) or from the copy a
regular install packs into ``scratchops/_cuda`` (setup.py's build step).

Environment:
  TORCH_CUDA_ARCH_LIST     architectures to build for, e.g. "9.0" (default: the GPUs present);
                           9.0 is built as sm_90a, for the wgmma tensor-core engine
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
BINDING = PACKAGE_DIR / "csrc" / "binding.cpp"
EXTENSION_NAME = "scratchops_kernels"
# The README's install commands (tests/test_readme.py keeps them equal).
INSTALL_HINT = ("install a CUDA build of PyTorch (`python3 -m pip install torch`, or the command "
                "for your CUDA version from https://pytorch.org/get-started/locally/), then "
                "`python3 -m pip install -e .` in the root of the scratchops checkout")


def cuda_dir() -> Path:
    """The kernel sources: the installed package's copy (a regular install) or else the
    checkout's cuda/ (an editable install, or the source tree itself)."""
    packaged = PACKAGE_DIR / "_cuda"
    return packaged if (packaged / "launchers.h").exists() else PACKAGE_DIR.parent / "cuda"


def kernel_sources() -> list[Path]:
    """Every compiled source, in a stable order (the binding first)."""
    return [BINDING, *sorted(cuda_dir().glob("*.cu"))]


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
                f"need a CUDA build of PyTorch and a CUDA GPU ({INSTALL_HINT})")
    if not torch.cuda.is_available():
        return "no CUDA device is visible (torch.cuda.is_available() is False)"
    if not (cuda_dir() / "launchers.h").exists() or not BINDING.exists():
        return f"the kernel sources are missing ({cuda_dir()}); {INSTALL_HINT}"
    if _nvcc_path() is None:
        return "nvcc was not found: install the CUDA toolkit and put nvcc on PATH or set CUDA_HOME"
    return None


def architectures() -> list[str]:
    """Compute capabilities to build for, as '80', '90a', ...: TORCH_CUDA_ARCH_LIST or the
    GPUs present. 9.0 becomes 90a: the wgmma tensor-core engine uses sm_90a's wgmma and
    setmaxnreg (its code exists only in an sm_90a build; the mma.sync engine runs on sm_80+)."""
    listed = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if listed:
        names = listed.replace(";", " ").replace("+PTX", "").split()
    else:
        names = sorted({"{}.{}".format(*torch.cuda.get_device_capability(i))
                        for i in range(torch.cuda.device_count())})
    return sorted({name.replace(".", "").rstrip("a") + ("a" if name.startswith("9.0") else "")
                   for name in names})


def build_directory() -> Path:
    if os.environ.get("SCRATCHOPS_BUILD_DIR"):
        return Path(os.environ["SCRATCHOPS_BUILD_DIR"])
    tag = f"torch{torch.__version__}-cuda{torch.version.cuda}-sm{'-'.join(architectures())}"
    return Path.home() / ".cache" / "scratchops" / tag.replace("+", "_")


def _needs_compile(build_dir: Path) -> bool:
    library = build_dir / f"{EXTENSION_NAME}.so"
    if not library.exists():
        return True
    built = library.stat().st_mtime
    sources = [*kernel_sources(), *cuda_dir().glob("*.h"), *cuda_dir().glob("*.cuh")]
    return any(source.stat().st_mtime > built for source in sources)


_lock = threading.Lock()
_ops = None  # torch.ops.scratchops_cuda once the extension is loaded
_module = None  # the extension as a Python module: the direct calls (binding.cpp's end)


def ops():
    """The loaded CUDA operators (torch.ops.scratchops_cuda), building them on first use.

    The fast path reads one module global; the lock and the build happen only while it is
    still None.
    """
    loaded = _ops
    return loaded if loaded is not None else _load()


def _load():
    global _ops, _module
    with _lock:
        if _ops is not None:
            return _ops
        reason = why_unavailable()
        if reason is not None:
            raise RuntimeError(f"scratchops cannot run its CUDA kernels: {reason}")
        from torch.utils import cpp_extension

        build_dir = build_directory()
        build_dir.mkdir(parents=True, exist_ok=True)
        if _needs_compile(build_dir):
            print(f"scratchops: compiling the CUDA kernels for sm_{', sm_'.join(architectures())} "
                  f"into {build_dir} (first use; this takes a few minutes)...", file=sys.stderr,
                  flush=True)
        # Explicit -gencode flags (torch adds none of its own when these are given).
        gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in architectures()]
        module = cpp_extension.load(
            name=EXTENSION_NAME,
            sources=[str(s) for s in kernel_sources()],
            extra_include_paths=[str(cuda_dir())],
            extra_cflags=["-O3", "-std=c++17"],
            # -lineinfo lets compute-sanitizer and ncu point at source lines; no fast-math:
            # the kernels must match torch's fp32 results within report.ATOL.
            extra_cuda_cflags=["-O3", "-lineinfo", "-std=c++17", *gencode],
            build_directory=str(build_dir),
            is_python_module=True,
            verbose=os.environ.get("SCRATCHOPS_VERBOSE_BUILD") == "1",
        )
        _module = module
        _ops = torch.ops.scratchops_cuda
        return _ops


def direct_calls():
    """The extension's Python module, one function per public operator that calls it
    through the C++ dispatcher below autograd (binding.cpp), and the question P85's backward
    asks (conv_gn_pool_backward_runs), building it on first use."""
    ops()
    return _module


def loaded() -> bool:
    """Whether the extension is loaded (without loading it)."""
    return _ops is not None


def load() -> None:
    """Compile (first time only) and load the kernels now, or raise RuntimeError saying why
    they cannot run here."""
    ops()
