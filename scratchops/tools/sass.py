"""`scratchops sass`: a kernel file's machine code (SASS) counted by kind of instruction, per
kernel, without a GPU.

nvcc compiles one file of cuda/ to a cubin for one architecture; cuobjdump (CUDA's binary
utilities, installed from pip with scratchops: the nvidia-cuda-cuobjdump and
nvidia-cuda-nvdisasm wheels) prints its SASS; each instruction is counted under the first
group below whose opcodes it starts with. What the counts show: which units a version keeps
busy (FFMA on the CUDA cores, HMMA for mma.sync, HGMMA for wgmma), how many loads and stores
feed them, and how much synchronisation it pays (barriers, mbarriers).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

# Column -> the SASS opcodes counted in it (by the opcode's name before its first '.').
GROUPS = {
    "FFMA": ("FFMA",),                      # fp32 fused multiply-add, CUDA cores
    "FMUL/FADD": ("FMUL", "FADD"),
    "HMMA": ("HMMA",),                      # mma.sync: a warp's tensor-core product
    "HGMMA": ("HGMMA",),                    # wgmma: a warpgroup's tensor-core product
    "LDG": ("LDG",),                        # global loads
    "LDS": ("LDS", "LDSM"),                 # shared-memory loads (LDSM: ldmatrix)
    "STS": ("STS",),
    "STG": ("STG",),
    "async copy": ("LDGSTS", "UBLKCP", "UTMALDG", "UTMASTG"),  # cp.async, bulk copies
    "BAR": ("BAR",),                        # __syncthreads and named barriers
    "mbarrier": ("SYNCS",),                 # mbarrier arrive / wait
}
ARCHITECTURES = ("80", "86", "89", "90a")
_INSTRUCTION = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)")
_FUNCTION = re.compile(r"^\s+Function : (\S+)")
# Where pip puts the binaries: site-packages/nvidia/cu<major>/bin.
_PIP_BIN_GLOB = "cu*/bin"


def binutils_dir() -> Path | None:
    """The folder holding cuobjdump and nvdisasm from the pip wheels, or None."""
    try:
        import nvidia
    except ImportError:
        return None
    for root in getattr(nvidia, "__path__", []):
        for folder in sorted(Path(root).glob(_PIP_BIN_GLOB), reverse=True):
            if (folder / "cuobjdump").exists() and (folder / "nvdisasm").exists():
                return folder
    return None


def why_unavailable() -> str | None:
    """Why SASS cannot be read here, or None when it can."""
    from .._build import _nvcc_path

    if _nvcc_path() is None:
        return "nvcc was not found: install the CUDA toolkit and put nvcc on PATH"
    if binutils_dir() is None and shutil.which("cuobjdump") is None:
        return ("cuobjdump was not found: `python3 -m pip install nvidia-cuda-cuobjdump "
                "nvidia-cuda-nvdisasm` (scratchops' install does this)")
    return None


def compile_cubin(source: Path, arch: str, out_dir: Path) -> Path:
    """nvcc's cubin of one kernel file for sm_<arch> (flags as the extension's build)."""
    from .._build import _nvcc_path, cuda_dir

    cubin = out_dir / f"{source.stem}.sm_{arch}.cubin"
    subprocess.run([_nvcc_path(), "-cubin", "-O3", "-std=c++17", f"-arch=sm_{arch}",
                    f"-I{cuda_dir()}", "-o", str(cubin), str(source)],
                   check=True, capture_output=True, text=True)
    return cubin


def serialised_wgmma(source: Path, arch: str = "90a") -> list[str]:
    """ptxas's notes that it serialised a kernel's wgmmas, one line per kernel of the file:
    every "wgmma.mma_async instructions are serialized" note, whatever its reason (C7513: a
    register a wgmma reads is written while the wgmma may still be running; C7514: an
    ordinary instruction reads a wgmma's accumulators inside its pipeline stage; C7520: a
    wgmma in a path ptxas cannot prove uniform). Each makes every wgmma wait for the one
    before. Some are info-level notes, printed only with ptxas -v."""
    from .._build import _nvcc_path, cuda_dir

    with tempfile.TemporaryDirectory() as folder:
        done = subprocess.run([_nvcc_path(), "-cubin", "-O3", "-std=c++17", f"-arch=sm_{arch}",
                               "-Xptxas=-v", f"-I{cuda_dir()}", "-o",
                               str(Path(folder) / "k.cubin"), str(source)],
                              check=True, capture_output=True, text=True)
    return [line for line in (done.stdout + done.stderr).splitlines()
            if "wgmma.mma_async instructions are serialized" in line]


def disassemble(cubin: Path) -> str:
    """cuobjdump -sass of the cubin (the pip wheels' binaries first, then PATH)."""
    folder = binutils_dir()
    env = dict(os.environ)
    if folder is not None:
        env["PATH"] = f"{folder}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(["cuobjdump", "-sass", str(cubin)], check=True, capture_output=True,
                          text=True, env=env).stdout


def count_instructions(sass: str) -> dict[str, Counter]:
    """Per kernel (its mangled name): opcode -> how many times it appears."""
    kernels: dict[str, Counter] = {}
    current = None
    for line in sass.splitlines():
        function = _FUNCTION.match(line)
        if function:
            current = kernels.setdefault(function.group(1), Counter())
            continue
        instruction = _INSTRUCTION.match(line)
        if instruction and current is not None:
            current[instruction.group(1)] += 1
    return kernels


def grouped(opcodes: Counter) -> dict[str, int]:
    """The counts of GROUPS, and 'all' instructions (NOPs left out: padding)."""
    row = {group: sum(opcodes[name] for name in names) for group, names in GROUPS.items()}
    row["all"] = sum(count for name, count in opcodes.items() if name != "NOP")
    return row


def readable_name(mangled: str) -> str:
    """A kernel's name and its integer / bool template arguments from its Itanium mangling,
    e.g. tf32x3_kernel<128, 1, 4, 1, false> (type arguments left out)."""
    prefix = "_ZN" if mangled.startswith("_ZN") else "_Z"
    position, name = len(prefix), None
    # Walk the length-prefixed identifiers (namespaces, then the kernel): the kernel's is the
    # last one before its template arguments (I...E) or its parameter types.
    while (digits := re.match(r"\d+", mangled[position:])) is not None:
        start = position + len(digits.group(0))
        position = start + int(digits.group(0))
        name = mangled[start:position]
    if name is None:
        return mangled
    if not mangled.startswith("I", position):
        return name
    values = [v if kind == "i" else ("true" if v == "1" else "false")
              for kind, v in re.findall(r"L([ib])(\d+)E", mangled[position:])]
    return f"{name}<{', '.join(values)}>" if values else name


def instruction_mix(source: Path, arch: str = "90a") -> list[dict]:
    """One row per kernel of the file: its readable name and grouped counts."""
    with tempfile.TemporaryDirectory() as folder:
        sass = disassemble(compile_cubin(source, arch, Path(folder)))
    return [{"kernel": readable_name(mangled), **grouped(opcodes)}
            for mangled, opcodes in count_instructions(sass).items()]


def table(rows: list[dict], kernel_filter: str | None = None) -> str:
    from .report import format_table

    if kernel_filter:
        rows = [r for r in rows if re.search(kernel_filter, r["kernel"])]
    groups = [*GROUPS, "all"]
    columns = [("kernel", "<"), *[(g, ">") for g in groups]]
    return format_table(columns, [[r["kernel"], *[str(r[g]) for g in groups]] for r in rows])
