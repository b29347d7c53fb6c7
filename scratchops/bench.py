"""Microbenchmarks (`scratchops bench`): each scratchops kernel beside its torch counterpart.

Every row times one scratchops kernel (one GEMM version, for gemm and conv2d) on one shape,
with the torch counterpart on the same inputs, and checks once that both agree (allclose,
atol = rtol = 1e-4): timing a wrong kernel would be worthless. Throughput is reported
against ceilings measured in the same run on the same GPU:

* compute-bound kernels (gemm, conv2d): TFLOP/s (2 FLOP per multiply-add) and % of torch's
  fp32 SGEMM with TF32 off;
* memory-bound kernels (im2col and the P85/P31 epilogue ops): GB/s on the minimum traffic,
  each input tensor read once and each output written once, and % of a device copy.

torch runs with TF32 off throughout, so both sides do true fp32 arithmetic.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F

import scratchops

from .problems import PROBLEMS
from .timing import (DEFAULT_WARMUP, Ceiling, Timing, environment, measure_copy_bandwidth,
                     measure_sgemm_tflops, tf32_disabled, time_cuda)

# Names usable as `scratchops bench KERNEL ...`; each is also the scratchops function name.
COMPUTE_BOUND = ("gemm", "conv2d", "conv2d_min_add_mul", "conv2d_group_norm_pool_clamp")
MEMORY_BOUND = ("im2col", "group_norm", "scale", "group_norm_scale", "max_pool2d", "clamp",
                "max_pool2d_clamp", "min_add_mul")
KERNELS = ("gemm", "im2col", "conv2d", "conv2d_min_add_mul", "conv2d_group_norm_pool_clamp",
           *MEMORY_BOUND[1:])

QUICK_REPEATS = 5
ATOL = RTOL = 1e-4
# The naive GEMM (one thread per output, every operand from global memory; a few TFLOP/s)
# is timed only up to this many FLOP, which keeps each of its rows to about a second: every
# square GEMM and the batch-8 problem shapes run, the full-size P31 convolution (3e11 FLOP)
# gets a skipped row instead.
NAIVE_GEMM_VERSION = 1
NAIVE_MAX_FLOP = 2e11

# The sweeps end at the two problems' full-size tensors: their parameters come from the
# problem modules (KernelBench's values), not from a second copy here.
_P85, _P31 = PROBLEMS["p85"], PROBLEMS["p31"]
BATCH = _P85.batch_size
P85_IN, P85_OUT, P85_GROUPS = _P85.in_channels, _P85.out_channels, _P85.num_groups
P85_POOL, P85_CLAMP = _P85.maxpool_kernel_size, (_P85.clamp_min, _P85.clamp_max)
P31_IN, P31_OUT = _P31.in_channels, _P31.out_channels
P31_CONSTANT, P31_FACTOR = _P31.constant_value, _P31.scaling_factor
IMAGE, KERNEL_SIZE = _P85.height, _P85.kernel_size
assert (_P31.batch_size, _P31.height, _P31.kernel_size) == (BATCH, IMAGE, KERNEL_SIZE)
CONV_OUT = IMAGE - KERNEL_SIZE + 1  # 126: a 3x3 convolution without padding
GROUP_NORM_EPS = 1e-5


@dataclasses.dataclass
class Workload:
    """One shape of one kernel: how to make its inputs, the torch counterpart, our versions.

    `make_inputs` allocates the GPU tensors only when the workload runs, so a plan can be
    listed (and tested) without a GPU. `reference` and every entry of `versions` are called
    with the inputs as keyword arguments.
    """

    kernel: str
    shape: str
    make_inputs: Callable[[], dict]
    reference: Callable[..., torch.Tensor]
    versions: dict[str, Callable[..., torch.Tensor]]
    flop: float | None = None  # compute-bound; memory-bound rows count bytes instead
    note: str = ""
    skip: dict[str, str] = dataclasses.field(default_factory=dict)  # version -> why not run


def _rand(*shape) -> torch.Tensor:
    # Compute-bound operands are uniform in [0, 1), like KernelBench's inputs: with no
    # cancellation the fp32 rounding of two summation orders stays well inside 1e-4
    # relative, even for K = 4096.
    return torch.rand(shape, device="cuda")


def _randn(*shape) -> torch.Tensor:
    return torch.randn(shape, device="cuda")


def _randn_inputs(**shapes) -> Callable[[], dict]:
    """A make_inputs returning a standard-normal tensor of each named shape."""
    return lambda: {name: _randn(*shape) for name, shape in shapes.items()}


def dims(shape: Sequence[int]) -> str:
    """(128, 64, 126, 126) -> '128x64x126x126'."""
    return "x".join(str(s) for s in shape)


# --------------------------------------------------------------------------- workloads
def _gemm(a, b, bias, *, version):
    return scratchops.gemm(a, b, bias, version=version)


def _torch_gemm(a, b, bias):
    if b.dim() == 2:
        return torch.addmm(bias[:, None], a, b)
    return torch.baddbmm(bias[:, None], a.expand(b.shape[0], -1, -1), b)


def _gemm_versions(flop: float, call, table=None) -> tuple[dict, dict]:
    """Every GEMM version (of `table`, default all) as a `call(version=v)` partial, and
    which are skipped at `flop`."""
    table = scratchops.GEMM_VERSIONS if table is None else table
    versions = {name: functools.partial(call, version=v) for v, name in table.items()}
    skip = {}
    if flop > NAIVE_MAX_FLOP and NAIVE_GEMM_VERSION in table:
        skip[table[NAIVE_GEMM_VERSION]] = (
            f"skipped: the naive GEMM is not timed above {NAIVE_MAX_FLOP:.0e} FLOP")
    return versions, skip


def _gemm_workload(m: int, n: int, k: int, batch: int | None, note: str = "") -> Workload:
    """(M, K) @ (K, N) + bias, or with a batch of B matrices sharing the 2-D `a`."""
    b_shape = (k, n) if batch is None else (batch, k, n)
    flop = 2.0 * (batch or 1) * m * n * k
    versions, skip = _gemm_versions(flop, _gemm)
    shape = f"{m}x{n}x{k}" + ("" if batch is None else f" b{batch}")
    return Workload("gemm", shape,
                    lambda: {"a": _rand(m, k), "b": _rand(*b_shape), "bias": _rand(m)},
                    _torch_gemm, versions, flop=flop, note=note, skip=skip)


def gemm_workloads(quick: bool) -> list[Workload]:
    squares = (128, 256) if quick else (256, 512, 1024, 2048, 4096)
    work = [_gemm_workload(s, s, s, None) for s in squares]
    # The convolution GEMMs of the two problems, per image (M = out channels, K = in
    # channels x 3 x 3, N = 126 x 126 output pixels), a batch of images sharing the weights.
    batch = 2 if quick else 8
    work.append(_gemm_workload(P85_OUT, CONV_OUT**2, P85_IN * KERNEL_SIZE**2, batch,
                               "P85 conv GEMM"))
    if not quick:
        work.append(_gemm_workload(P31_OUT, CONV_OUT**2, P31_IN * KERNEL_SIZE**2, batch,
                                   "P31 conv GEMM"))
    return work


def _conv2d(input, weight, bias, *, version):  # noqa: A002 (F.conv2d's argument names)
    return scratchops.conv2d(input, weight, bias, algorithm="im2col_gemm", gemm_version=version)


def _conv2d_implicit(input, weight, bias):  # noqa: A002
    return scratchops.conv2d(input, weight, bias, algorithm="implicit_gemm")


def _conv2d_workload(batch: int, c_in: int, c_out: int, size: int, note: str = "") -> Workload:
    out = size - KERNEL_SIZE + 1
    flop = 2.0 * batch * c_out * c_in * KERNEL_SIZE**2 * out * out
    versions, skip = _gemm_versions(flop, _conv2d, scratchops.IM2COL_GEMM_VERSIONS)
    versions = {f"im2col+{name}": fn for name, fn in versions.items()}
    skip = {f"im2col+{name}": why for name, why in skip.items()}
    versions["implicit_gemm"] = _conv2d_implicit
    return Workload(
        "conv2d", f"{dims((batch, c_in, size, size))} -> {c_out} k{KERNEL_SIZE}",
        lambda: {"input": _rand(batch, c_in, size, size),
                 "weight": _rand(c_out, c_in, KERNEL_SIZE, KERNEL_SIZE) - 0.5,
                 "bias": _rand(c_out)},
        F.conv2d, versions, flop=flop, note=note, skip=skip)


def conv2d_workloads(quick: bool) -> list[Workload]:
    if quick:
        return [_conv2d_workload(2, P85_IN, P85_OUT, 32), _conv2d_workload(2, P31_IN, P31_OUT, 32)]
    return [_conv2d_workload(8, P85_IN, P85_OUT, IMAGE),
            _conv2d_workload(BATCH, P85_IN, P85_OUT, IMAGE, "P85 full size"),
            _conv2d_workload(8, P31_IN, P31_OUT, IMAGE),
            _conv2d_workload(BATCH, P31_IN, P31_OUT, IMAGE, "P31 full size")]


def p31_fused_workloads(quick: bool) -> list[Workload]:
    """P31 in one kernel against torch's four operators (fp32)."""
    batches = (2,) if quick else (8, BATCH)
    size = 32 if quick else IMAGE
    out = size - KERNEL_SIZE + 1
    work = []
    for n in batches:
        flop = 2.0 * n * P31_OUT * P31_IN * KERNEL_SIZE**2 * out * out
        work.append(Workload(
            "conv2d_min_add_mul", f"{dims((n, P31_IN, size, size))} -> {P31_OUT} k{KERNEL_SIZE}",
            lambda n=n: {"input": _rand(n, P31_IN, size, size),
                         "weight": _rand(P31_OUT, P31_IN, KERNEL_SIZE, KERNEL_SIZE) - 0.5,
                         "conv_bias": _rand(P31_OUT), "bias": _randn(P31_OUT, 1, 1)},
            lambda input, weight, conv_bias, bias: (torch.clamp_max(
                F.conv2d(input, weight, conv_bias), P31_CONSTANT) + bias) * P31_FACTOR,
            {"one_kernel": lambda input, weight, conv_bias, bias: scratchops.conv2d_min_add_mul(
                input, weight, conv_bias, P31_CONSTANT, bias, P31_FACTOR)},
            flop=flop, note="P31 full size" if n == BATCH else ""))
    return work


def p85_one_pass_workloads(quick: bool) -> list[Workload]:
    """P85 in one pass against torch's five operators (fp32)."""
    batches = (2,) if quick else (8, BATCH)
    size = 32 if quick else IMAGE
    out = size - KERNEL_SIZE + 1
    groups, pool, (lo, hi), eps = P85_GROUPS, P85_POOL, P85_CLAMP, GROUP_NORM_EPS
    work = []
    for n in batches:
        flop = 2.0 * n * P85_OUT * P85_IN * KERNEL_SIZE**2 * out * out
        work.append(Workload(
            "conv2d_group_norm_pool_clamp",
            f"{dims((n, P85_IN, size, size))} -> {P85_OUT} k{KERNEL_SIZE}",
            lambda n=n: {"input": _rand(n, P85_IN, size, size),
                         "weight": _rand(P85_OUT, P85_IN, KERNEL_SIZE, KERNEL_SIZE) - 0.5,
                         "conv_bias": _rand(P85_OUT), "gamma": _randn(P85_OUT),
                         "beta": _randn(P85_OUT), "s": _randn(P85_OUT, 1, 1)},
            lambda input, weight, conv_bias, gamma, beta, s: torch.clamp(F.max_pool2d(
                F.group_norm(F.conv2d(input, weight, conv_bias), groups, gamma, beta, eps) * s,
                pool), lo, hi),
            {"one_pass": lambda input, weight, conv_bias, gamma, beta, s:
                scratchops.conv2d_group_norm_pool_clamp(input, weight, conv_bias, groups, gamma,
                                                        beta, s, eps, lo, hi)},
            flop=flop, note="P85 full size" if n == BATCH else ""))
    return work


def _memory_workload(kernel: str, shape: Sequence[int], make_inputs, reference, ours,
                     note: str = "") -> Workload:
    return Workload(kernel, dims(shape), make_inputs, reference, {"scratchops": ours},
                    note=note)


def im2col_workloads(quick: bool) -> list[Workload]:
    if quick:
        shapes = [(2, P85_IN, 32, 32), (2, P31_IN, 32, 32)]
    else:
        # P85's full batch; P31's full one would be a 4.7 GB column matrix (scratchops.conv2d
        # builds it in chunks), so a few images.
        shapes = [(8, P85_IN, IMAGE, IMAGE), (BATCH, P85_IN, IMAGE, IMAGE),
                  (2, P31_IN, IMAGE, IMAGE), (8, P31_IN, IMAGE, IMAGE)]
    versions = {name: functools.partial(_im2col, version=v)
                for v, name in scratchops.IM2COL_VERSIONS.items()}
    return [Workload("im2col", dims(s), _randn_inputs(x=s), lambda x: F.unfold(x, KERNEL_SIZE),
                     versions, note=f"k{KERNEL_SIZE}") for s in shapes]


def _im2col(x, *, version):
    return scratchops.im2col(x, KERNEL_SIZE, version=version)


def _activation_shapes(channels: int, quick: bool) -> list[tuple[int, ...]]:
    """From ~4 MB (one image) up to the full-size convolution output of the problems."""
    if quick:
        return [(1, channels, 32, 32), (2, channels, 64, 64)]
    return [(n, channels, CONV_OUT, CONV_OUT) for n in (1, 8, 32, BATCH)]


def p85_workloads(kernel: str, quick: bool) -> list[Workload]:
    """The P85 epilogue ops, on activations shaped like P85's convolution output."""
    groups, pool, (lo, hi), eps = P85_GROUPS, P85_POOL, P85_CLAMP, GROUP_NORM_EPS
    ops = {
        "group_norm": (
            ("weight", "bias"),
            lambda x, weight, bias: F.group_norm(x, groups, weight, bias, eps),
            lambda x, weight, bias: scratchops.group_norm(x, groups, weight, bias, eps=eps)),
        "scale": (("s",), lambda x, s: x * s, lambda x, s: scratchops.scale(x, s)),
        "group_norm_scale": (
            ("weight", "bias", "s"),
            lambda x, weight, bias, s: F.group_norm(x, groups, weight, bias, eps) * s,
            lambda x, weight, bias, s: scratchops.group_norm_scale(x, groups, weight, bias, s,
                                                                   eps=eps)),
        "max_pool2d": ((), lambda x: F.max_pool2d(x, pool),
                       lambda x: scratchops.max_pool2d(x, pool)),
        "clamp": ((), lambda x: torch.clamp(x, lo, hi), lambda x: scratchops.clamp(x, lo, hi)),
        "max_pool2d_clamp": ((), lambda x: torch.clamp(F.max_pool2d(x, pool), lo, hi),
                             lambda x: scratchops.max_pool2d_clamp(x, pool, min=lo, max=hi)),
    }
    names, reference, ours = ops[kernel]
    note = f"k{pool}" if "pool" in kernel else ""
    # weight and bias are per channel (C,), the scale is (C, 1, 1) as in P85.
    param_shapes = {"weight": (P85_OUT,), "bias": (P85_OUT,), "s": (P85_OUT, 1, 1)}
    return [_memory_workload(kernel, s,
                             _randn_inputs(x=s, **{n: param_shapes[n] for n in names}),
                             reference, ours, note)
            for s in _activation_shapes(P85_OUT, quick)]


def min_add_mul_workloads(quick: bool) -> list[Workload]:
    """P31's epilogue, min(x, constant) + bias, times factor, on P31's convolution output."""
    constant, factor = P31_CONSTANT, P31_FACTOR
    return [_memory_workload(
        "min_add_mul", s, _randn_inputs(x=s, bias=(P31_OUT, 1, 1)),
        lambda x, bias: (torch.clamp_max(x, constant) + bias) * factor,
        lambda x, bias: scratchops.min_add_mul(x, constant, bias, factor))
        for s in _activation_shapes(P31_OUT, quick)]


def plan(kernels: Sequence[str], quick: bool) -> list[Workload]:
    """The workloads of the given kernels, in KERNELS order, each kernel's smallest first."""
    builders = {"gemm": gemm_workloads, "im2col": im2col_workloads,
                "conv2d": conv2d_workloads, "min_add_mul": min_add_mul_workloads,
                "conv2d_min_add_mul": p31_fused_workloads,
                "conv2d_group_norm_pool_clamp": p85_one_pass_workloads}
    workloads = []
    for kernel in KERNELS:
        if kernel in builders and kernel in kernels:
            workloads.extend(builders[kernel](quick))
        elif kernel in kernels:  # the P85 epilogue ops
            workloads.extend(p85_workloads(kernel, quick))
    return workloads


# ------------------------------------------------------------------------- reporting
class Progress:
    """A dependency-free progress bar on stderr.

    On a terminal it redraws one line; otherwise (a log, a remote run that keeps only the
    tail of the output) it prints a line per tenth of the work, so the log stays short.
    """

    def __init__(self, total: int, stream=None, width: int = 30):
        self.total, self.done, self.width = max(total, 1), 0, width
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty()
        self.started = time.monotonic()
        self._last_tenth = 0

    def step(self, label: str) -> None:
        self.done += 1
        filled = self.width * self.done // self.total
        elapsed = time.monotonic() - self.started
        line = (f"[{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total} "
                f"{elapsed:5.0f}s {label}")
        if self.tty:
            self.stream.write("\r\033[K" + line)
        else:
            tenth = 10 * self.done // self.total
            if tenth == self._last_tenth and self.done != self.total:
                return
            self._last_tenth = tenth
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def format_table(columns: Sequence[tuple[str, str]], rows: Sequence[Sequence[str]]) -> str:
    """Plain-text table; `columns` are (header, '<' or '>') for left or right alignment."""
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, (h, _) in enumerate(columns)]
    lines = ["  ".join(f"{h:{a}{w}}" for (h, a), w in zip(columns, widths)).rstrip()]
    for row in rows:
        lines.append("  ".join(f"{c:{a}{w}}" for c, (_, a), w in zip(row, columns, widths))
                     .rstrip())
    return "\n".join(lines)


def fmt(value, spec: str) -> str:
    """`value` formatted with `spec`, or '-' for a missing value."""
    return "-" if value is None else format(value, spec)


# ---------------------------------------------------------------------------- running
def compare(out: torch.Tensor, expected: torch.Tensor) -> tuple[bool, float | None, str]:
    """(allclose, max |out - expected| or None when not finite, a note) for one output."""
    if out.shape != expected.shape or out.dtype != expected.dtype:
        return False, None, (f"output {tuple(out.shape)} {out.dtype} differs from torch's "
                             f"{tuple(expected.shape)} {expected.dtype}")
    max_err = (out - expected).abs().max().item()
    ok = torch.allclose(out, expected, atol=ATOL, rtol=RTOL)
    if not math.isfinite(max_err):
        return False, None, "output has NaN or Inf"
    return ok, max_err, ""


def _bytes_moved(inputs: dict, output: torch.Tensor) -> int:
    """Minimum traffic: every input tensor read once, the output written once."""
    return sum(t.nbytes for t in inputs.values() if isinstance(t, torch.Tensor)) + output.nbytes


def _rate(work: float, ms: float | None, unit: str) -> float | None:
    """work (FLOP or bytes) per second in `unit`; None without a (nonzero) time."""
    if not ms:
        return None
    return work / (ms * 1e-3) / (1e12 if unit == "TFLOP/s" else 1e9)


def _percent(rate: float | None, ceiling: Ceiling) -> float | None:
    return None if rate is None else 100 * rate / ceiling.value


def _row(w: Workload, version: str, work: float, ceiling: Ceiling, torch_ms: float,
         timing: Timing | None = None, ok: bool | None = None, max_err: float | None = None,
         note: str = "") -> dict:
    """One result row; without `timing` (skipped or failed) the timing fields are None."""
    unit = ceiling.unit
    ms = None if timing is None else timing.median_ms
    rate, torch_rate = _rate(work, ms, unit), _rate(work, torch_ms, unit)
    return {
        "kernel": w.kernel, "version": version, "shape": w.shape,
        "ms": ms,
        "p10_ms": None if timing is None else timing.p10_ms,
        "p90_ms": None if timing is None else timing.p90_ms,
        "n": None if timing is None else timing.n,
        "torch_ms": torch_ms,
        "ratio": torch_ms / ms if ms else None,
        "unit": unit, "rate": rate, "torch_rate": torch_rate,
        "pct_of_ceiling": _percent(rate, ceiling),
        "torch_pct_of_ceiling": _percent(torch_rate, ceiling),
        "flop": w.flop, "bytes": None if w.flop else work,
        "ok": ok, "max_abs_err": max_err,
        "note": "; ".join(n for n in (w.note, note) if n),
    }


def first_line(exc: BaseException) -> str:
    """'ExceptionType: first line of its message', short enough for a table cell."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def run_workload(w: Workload, ceilings: dict[str, Ceiling], repeats: int,
                 progress: Progress) -> list[dict]:
    """Time torch and every version of `w`; one row per version. Frees the GPU memory."""
    rows = _measure(w, ceilings, repeats, progress)
    # The inputs and outputs died with _measure's frame; hand their blocks back to the
    # driver so the next (possibly larger) shape starts from an empty cache.
    torch.cuda.empty_cache()
    return rows


def _measure(w: Workload, ceilings: dict[str, Ceiling], repeats: int,
             progress: Progress) -> list[dict]:
    inputs = w.make_inputs()
    expected = w.reference(**inputs)
    torch_ms = time_cuda(functools.partial(w.reference, **inputs), repeats=repeats).median_ms
    work = w.flop if w.flop is not None else _bytes_moved(inputs, expected)
    ceiling = ceilings["sgemm" if w.flop is not None else "copy"]
    progress.step(f"{w.kernel} {w.shape} torch")
    rows = []
    for version, fn in w.versions.items():
        if version in w.skip:
            rows.append(_row(w, version, work, ceiling, torch_ms, note=w.skip[version]))
        else:
            call = functools.partial(fn, **inputs)
            # A failing kernel becomes a row that says so; the sweep goes on to the others.
            try:
                ok, max_err, note = compare(call(), expected)
                timing = time_cuda(call, repeats=repeats)
            except Exception as exc:  # noqa: BLE001 (any failure is reported in the row)
                rows.append(_row(w, version, work, ceiling, torch_ms, ok=False,
                                 note=f"error: {first_line(exc)}"))
            else:
                rows.append(_row(w, version, work, ceiling, torch_ms, timing, ok, max_err,
                                 note))
        progress.step(f"{w.kernel} {w.shape} {version}")
    return rows


def rows_table(rows: Sequence[dict]) -> str:
    columns = [("kernel", "<"), ("version", "<"), ("shape", "<"), ("ms", ">"),
               ("torch ms", ">"), ("ratio", ">"), ("rate", ">"), ("unit", "<"),
               ("%ceil", ">"), ("torch %ceil", ">"), ("ok", "<"), ("note", "<")]
    body = [[r["kernel"], r["version"], r["shape"], fmt(r["ms"], ".4f"),
             fmt(r["torch_ms"], ".4f"), fmt(r["ratio"], ".2f"), fmt(r["rate"], ".1f"),
             r["unit"], fmt(r["pct_of_ceiling"], ".0f"), fmt(r["torch_pct_of_ceiling"], ".0f"),
             fmt(r["ok"], ""), r["note"]] for r in rows]
    return format_table(columns, body)


def summary_lines(rows: Sequence[dict], ceilings: dict[str, Ceiling], gpu: str) -> list[str]:
    """Per kernel and version, the largest shape measured: rate, % of ceiling, vs torch."""
    lines = [f"ceilings on {gpu}: copy {ceilings['copy'].value:.0f} GB/s (read + written), "
             f"SGEMM TF32 off {ceilings['sgemm'].value:.1f} TFLOP/s"]
    largest: dict[tuple[str, str], dict] = {}
    for r in rows:
        if r["ms"] is not None:
            key = (r["kernel"], r["version"])
            size = r["flop"] or r["bytes"]
            if key not in largest or size >= (largest[key]["flop"] or largest[key]["bytes"]):
                largest[key] = r
    for (kernel, version), r in largest.items():
        verdict = "" if r["ok"] else "  NOT ALLCLOSE"
        lines.append(f"  {kernel:<17} {version:<15} {r['shape']:<26} {fmt(r['rate'], '8.1f')} "
                     f"{r['unit']:<7} {fmt(r['pct_of_ceiling'], '4.0f')}% of ceiling  "
                     f"x{fmt(r['ratio'], '.2f')} vs torch{verdict}")
    return lines


# ---------------------------------------------------------------------------- plotting
def _series(rows: Sequence[dict]) -> dict[str, list[dict]]:
    """version -> its rows that have a rate (skipped and failed rows have none)."""
    series: dict[str, list[dict]] = {}
    for r in rows:
        if r["rate"] is not None:
            series.setdefault(r["version"], []).append(r)
    return series


def plot_compute_bound(rows: Sequence[dict], ceiling: Ceiling, path: Path) -> bool:
    """gemm (and conv2d) TFLOP/s per shape, each GEMM version beside torch, the SGEMM line."""
    from matplotlib.figure import Figure

    kernels = [k for k in COMPUTE_BOUND if any(r["kernel"] == k for r in rows)]
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
                   label=f"measured SGEMM ceiling {ceiling.value:.1f}")
        ax.set_xticks(range(len(shapes)), shapes, rotation=30, ha="right", fontsize=7)
        ax.set_ylabel("TFLOP/s (fp32, TF32 off)")
        ax.set_title(kernel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.savefig(path, dpi=120)
    return True


def plot_memory_bound(rows: Sequence[dict], ceiling: Ceiling, path: Path) -> bool:
    """GB/s against bytes moved, one panel per memory-bound kernel, with the copy ceiling."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullFormatter, StrMethodFormatter

    kernels = [k for k in MEMORY_BOUND if any(r["kernel"] == k for r in rows)]
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
        ax.set_title(kernel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in axes[len(kernels):]:  # the unused panels of the last row
        ax.set_visible(False)
    fig.savefig(path, dpi=120)
    return True


# ------------------------------------------------------------------------------ entry
def run_bench(kernels: Sequence[str], *, quick: bool, repeats: int, out_dir: Path) -> int:
    """Run the sweep, write bench.json and the plots under out_dir, print the tables.

    Returns 0 when every scratchops output matched torch, 1 otherwise. Needs a CUDA GPU and
    the built kernels (the caller checks and loads).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    with torch.inference_mode(), tf32_disabled():
        env = environment()
        print(f"scratchops bench on {env['gpu']}: measuring the ceilings...", file=sys.stderr,
              flush=True)
        ceilings = {"copy": measure_copy_bandwidth(repeats=repeats),
                    "sgemm": measure_sgemm_tflops(repeats=repeats)}
        workloads = plan(kernels, quick)
        progress = Progress(sum(1 + len(w.versions) for w in workloads))
        rows = []
        for w in workloads:
            rows.extend(run_workload(w, ceilings, repeats, progress))
        progress.close()

    result = {
        "command": "bench",
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "environment": env,
        "settings": {"kernels": list(kernels), "quick": quick,
                     "repeats": repeats, "warmup": DEFAULT_WARMUP, "flush_l2": True,
                     "tf32": False, "atol": ATOL, "rtol": RTOL,
                     "naive_max_flop": NAIVE_MAX_FLOP},
        "ceilings": {name: c.as_dict() for name, c in ceilings.items()},
        "rows": rows,
    }
    json_path = out_dir / "bench.json"
    json_path.write_text(json.dumps(result, indent=1) + "\n")
    written = [json_path]
    for name, plot, ceiling in (("gemm.png", plot_compute_bound, ceilings["sgemm"]),
                                ("memory_bound.png", plot_memory_bound, ceilings["copy"])):
        if plot(rows, ceiling, out_dir / name):
            written.append(out_dir / name)

    print(rows_table(rows))
    print()
    print("ratio = torch ms / scratchops ms (>1: scratchops faster); %ceil: of the measured "
          "copy bandwidth (GB/s) or SGEMM (TFLOP/s); median of "
          f"{repeats}, L2 flushed, TF32 off")
    print("\n".join(summary_lines(rows, ceilings, env["gpu"])))
    timed = sum(r["ms"] is not None for r in rows)
    skipped = sum(r["ok"] is None for r in rows)
    wrong = [f"{r['kernel']}/{r['version']} {r['shape']}" for r in rows if r["ok"] is False]
    print(f"{len(rows)} rows: {timed} timed, {skipped} skipped, {len(wrong)} wrong or "
          f"failing{': ' + ', '.join(wrong) if wrong else ''}")
    print("wrote " + ", ".join(str(p) for p in written))
    return 1 if wrong else 0
