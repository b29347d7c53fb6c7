"""The plots of `scratchops bench` (bench.py writes them): gemm[_DTYPE].png, each GEMM and
convolution version's TFLOP/s per shape beside torch and the measured GEMM ceiling, and
memory_bound[_DTYPE].png, each memory-bound kernel's GB/s against the bytes it moves beside
torch and the copy ceiling. Each takes the rows of one dtype (bench._row's dicts)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from .timing import Ceiling
from .workloads import BACKWARD_SUFFIX, COMPUTE_BOUND, MEMORY_BOUND


def _series(rows: Sequence[dict]) -> dict[str, list[dict]]:
    """version -> its rows that have a rate (skipped and failed rows have none)."""
    series: dict[str, list[dict]] = {}
    for r in rows:
        if r["rate"] is not None:
            series.setdefault(r["version"], []).append(r)
    return series


def _with_backward(kernels: Sequence[str]) -> list[str]:
    return [*kernels, *(k + BACKWARD_SUFFIX for k in kernels)]


def compute_bound(rows: Sequence[dict], ceiling: Ceiling, path: Path) -> bool:
    """gemm (and conv2d) TFLOP/s per shape, each GEMM version beside torch, the GEMM line (the
    rows of one dtype)."""
    from matplotlib.figure import Figure

    kernels = [k for k in _with_backward(COMPUTE_BOUND) if any(r["kernel"] == k for r in rows)]
    if not kernels:
        return False
    fig = Figure(figsize=(6.5 * len(kernels), 5), layout="constrained")
    for ax, kernel in zip(fig.subplots(1, len(kernels), squeeze=False)[0], kernels):
        krows = sorted((r for r in rows if r["kernel"] == kernel), key=lambda r: r["flop"])
        shapes = list(dict.fromkeys(r["shape"] for r in krows))
        x = {s: i for i, s in enumerate(shapes)}
        for version, points in _series(krows).items():
            ax.plot([x[r["shape"]] for r in points], [r["rate"] for r in points], "o-",
                    label=f"scratchops {version}")
        torch_rates = {r["shape"]: r["torch_rate"] for r in krows}
        ax.plot([x[s] for s in torch_rates], list(torch_rates.values()), "ks--",
                label="torch (cuBLAS / cuDNN)")
        ax.axhline(ceiling.value, color="tab:red", linestyle=":",
                   label=f"measured GEMM ceiling {ceiling.value:.1f}")
        ax.set_xticks(range(len(shapes)), shapes, rotation=30, ha="right", fontsize=7)
        ax.set_ylabel(f"TFLOP/s ({krows[0]['dtype']}, TF32 off)")
        ax.set_title(kernel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.savefig(path, dpi=120)
    return True


def memory_bound(rows: Sequence[dict], ceiling: Ceiling, path: Path) -> bool:
    """GB/s against bytes moved, one panel per memory-bound kernel, with the copy ceiling (the
    rows of one dtype)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullFormatter, StrMethodFormatter

    kernels = [k for k in _with_backward(MEMORY_BOUND) if any(r["kernel"] == k for r in rows)]
    if not kernels:
        return False
    ncols = min(4, len(kernels))
    nrows = math.ceil(len(kernels) / ncols)
    fig = Figure(figsize=(4 * ncols, 3.4 * nrows), layout="constrained")
    axes = list(fig.subplots(nrows, ncols, squeeze=False).flat)
    for ax, kernel in zip(axes, kernels):
        krows = sorted((r for r in rows if r["kernel"] == kernel), key=lambda r: r["bytes"])
        for version, points in _series(krows).items():
            ax.plot([r["bytes"] / 1e6 for r in points], [r["rate"] for r in points], "o-",
                    label=version)
        ax.plot([r["bytes"] / 1e6 for r in krows], [r["torch_rate"] for r in krows], "ks--",
                label="torch")
        ax.axhline(ceiling.value, color="tab:red", linestyle=":",
                   label=f"copy ceiling {ceiling.value:.0f}")
        ax.set_xscale("log")
        # Decades only, as plain numbers (1, 10, 100 MB): minor labels would overlap.
        ax.xaxis.set_major_formatter(StrMethodFormatter("{x:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_ylim(bottom=0)
        ax.set_xlabel("MB moved (inputs read once + output written once)", fontsize=7)
        ax.set_ylabel("GB/s")
        ax.set_title(f"{kernel} {krows[0]['dtype']}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in axes[len(kernels):]:  # the unused panels of the last row
        ax.set_visible(False)
    fig.savefig(path, dpi=120)
    return True
