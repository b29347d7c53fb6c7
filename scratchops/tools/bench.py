"""Microbenchmarks (`scratchops bench`): each scratchops kernel beside its torch counterpart.

Every row times one scratchops kernel (one GEMM version, for gemm and conv2d) on one shape,
with the torch counterpart on the same inputs, and checks once that both agree (allclose
within report.ATOL and RTOL): timing a wrong kernel would be worthless. Throughput is reported
against ceilings measured in the same run on the same GPU:

* compute-bound kernels (gemm, conv2d): TFLOP/s (2 FLOP per multiply-add) and % of torch's
  GEMM in the row's dtype (fp32: SGEMM with TF32 off);
* memory-bound kernels (im2col and the P85/P31 epilogue ops): GB/s on the minimum traffic,
  each input tensor read once and each output written once, and % of a device copy.

Each dtype asked for (--dtype) runs the whole sweep: the inputs in that dtype, torch's
counterpart in it, allclose at KernelBench's tolerance for it (report.tolerance). The backward
rows (`<kernel>_backward`, bench_backward.py) time the gradients beside torch's autograd.
torch runs with TF32 off throughout, so in fp32 both sides do true fp32 arithmetic.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from . import bench_backward, bench_plots, host_cost
from .report import (DTYPES, Progress, compare, envelope, first_line, fmt, format_table,
                     half_float64_rule)
from .timing import (DEFAULT_WARMUP, Ceiling, Timing, environment, measure_copy_bandwidth,
                     measure_gemm_tflops, tf32_disabled, time_cuda)
from .workloads import KERNELS, NAIVE_MAX_FLOP, QUICK_REPEATS, Workload, plan

__all__ = ["DTYPES", "KERNELS", "QUICK_REPEATS", "plan", "run_bench"]


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


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


def _row(w: Workload, dtype: torch.dtype, version: str, work: float, ceiling: Ceiling,
         torch_ms: float, timing: Timing | None = None, ok: bool | None = None,
         max_err: float | None = None,
         note: str = "", err64: tuple[float | None, float | None] = (None, None)) -> dict:
    """One result row; without `timing` (skipped or failed) the timing fields are None.
    err64: (this version's, torch's) max |error| against the float64 reference, for the
    compute-bound kernels."""
    unit = ceiling.unit
    ms = None if timing is None else timing.median_ms
    rate, torch_rate = _rate(work, ms, unit), _rate(work, torch_ms, unit)
    return {
        "kernel": w.kernel, "dtype": _dtype_name(dtype), "version": version, "shape": w.shape,
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
        "max_err_f64": err64[0], "torch_max_err_f64": err64[1],
        "note": "; ".join(n for n in (w.note, note) if n),
    }


def run_workload(w: Workload, dtype: torch.dtype, ceilings: dict[str, Ceiling], repeats: int,
                 progress: Progress) -> list[dict]:
    """Time torch and every version of `w` in `dtype`; one row per version (ceilings: "copy"
    and "gemm" in that dtype). Frees the GPU memory."""
    if w.backward:
        with torch.enable_grad():
            rows = bench_backward.measure(w, dtype, ceilings, repeats,
                                          functools.partial(_version_rows, progress=progress))
    else:
        with torch.inference_mode():
            rows = _measure(w, dtype, ceilings, repeats, progress)
    # The inputs and outputs died with _measure's frame; hand their blocks back to the
    # driver so the next (possibly larger) shape starts from an empty cache.
    torch.cuda.empty_cache()
    return rows


def _measure(w: Workload, dtype: torch.dtype, ceilings: dict[str, Ceiling], repeats: int,
             progress: Progress) -> list[dict]:
    inputs = {name: t.to(dtype) for name, t in w.make_inputs().items()}
    expected = w.reference(**inputs)
    # The compute-bound kernels' accuracy: each output's (and torch's) error against the same
    # computation in float64.
    # (In fp16 / bf16 every row's, for the check below.)
    expected64 = (w.reference(**{k: v.double() for k, v in inputs.items()})
                  if w.flop is not None or dtype != torch.float32 else None)

    def err64(out):
        if expected64 is None or w.flop is None:
            return None
        return (out.double() - expected64).abs().max().item()

    def check(out):
        """allclose to torch's; in fp16 / bf16, failing that, as accurate as torch's against
        float64 (report.half_float64_rule), as `scratchops run` checks."""
        ok, max_err, note = compare(out, expected)
        if not ok and max_err is not None and dtype != torch.float32:
            ok, _, note = half_float64_rule(out, expected, expected64)
        return ok, max_err, note

    torch_err64 = err64(expected)
    torch_ms = time_cuda(functools.partial(w.reference, **inputs), repeats=repeats).median_ms
    work = w.flop if w.flop is not None else _bytes_moved(inputs, expected)

    def measure_version(fn) -> tuple:
        call = functools.partial(fn, **inputs)
        out = call()
        ok, max_err, note = check(out)
        errors = (err64(out), torch_err64)
        del out
        return time_cuda(call, repeats=repeats), ok, max_err, note, errors

    return _version_rows(w, dtype, work, ceilings, torch_ms, measure_version, progress)


def _version_rows(w: Workload, dtype: torch.dtype, work: float, ceilings: dict[str, Ceiling],
                  torch_ms: float, measure_version: Callable[[Callable], tuple],
                  progress: Progress) -> list[dict]:
    """One row per version of workload `w`, forward or backward alike, after torch's (timed in
    torch_ms), its rate against ceilings["gemm"] (FLOP) or ["copy"] (bytes).
    measure_version(fn) checks and times one version's function, returning (timing, ok,
    max_err, note, errors); a version that raises becomes a row that says so, and the sweep
    goes on to the others."""
    ceiling = ceilings["gemm" if w.flop is not None else "copy"]
    label = f"{w.kernel} {w.shape} {_dtype_name(dtype)}"
    progress.step(f"{label} torch")
    rows = []
    for version, fn in w.versions.items():
        if version in w.skip:
            rows.append(_row(w, dtype, version, work, ceiling, torch_ms, note=w.skip[version]))
        else:
            try:
                timing, ok, max_err, note, errors = measure_version(fn)
            except Exception as exc:  # noqa: BLE001 (any failure is reported in the row)
                rows.append(_row(w, dtype, version, work, ceiling, torch_ms, ok=False,
                                 note=f"error: {first_line(exc)}"))
            else:
                rows.append(_row(w, dtype, version, work, ceiling, torch_ms, timing, ok,
                                 max_err, note, errors))
        progress.step(f"{label} {version}")
    return rows


def rows_table(rows: Sequence[dict]) -> str:
    columns = [("kernel", "<"), ("dtype", "<"), ("version", "<"), ("shape", "<"), ("ms", ">"),
               ("torch ms", ">"), ("ratio", ">"), ("rate", ">"), ("unit", "<"),
               ("%ceil", ">"), ("torch %ceil", ">"), ("err f64", ">"), ("torch err", ">"),
               ("ok", "<"), ("note", "<")]
    body = [[r["kernel"], r["dtype"], r["version"], r["shape"], fmt(r["ms"], ".4f"),
             fmt(r["torch_ms"], ".4f"), fmt(r["ratio"], ".2f"), fmt(r["rate"], ".1f"),
             r["unit"], fmt(r["pct_of_ceiling"], ".0f"), fmt(r["torch_pct_of_ceiling"], ".0f"),
             fmt(r.get("max_err_f64"), ".1e"), fmt(r.get("torch_max_err_f64"), ".1e"),
             fmt(r["ok"], ""), r["note"]] for r in rows]
    return format_table(columns, body)


def summary_lines(rows: Sequence[dict], ceilings: dict[str, Ceiling], gpu: str) -> list[str]:
    """Per kernel, dtype and version, the largest shape measured: rate, % of ceiling, vs
    torch."""
    gemms = ", ".join(f"{name.removeprefix('gemm_')} {c.value:.1f}" for name, c in
                      ceilings.items() if name.startswith("gemm_"))
    lines = [f"ceilings on {gpu}: copy {ceilings['copy'].value:.0f} GB/s (read + written); "
             f"torch GEMM TFLOP/s (fp32: TF32 off) {gemms}"]
    largest: dict[tuple[str, str, str], dict] = {}
    for r in rows:
        if r["ms"] is not None:
            key = (r["kernel"], r["dtype"], r["version"])
            size = r["flop"] or r["bytes"]
            if key not in largest or size >= (largest[key]["flop"] or largest[key]["bytes"]):
                largest[key] = r
    for (kernel, dtype, version), r in largest.items():
        verdict = "" if r["ok"] else "  NOT ALLCLOSE"
        lines.append(f"  {kernel:<37} {dtype:<8} {version:<17} {r['shape']:<26} "
                     f"{fmt(r['rate'], '8.1f')} "
                     f"{r['unit']:<7} {fmt(r['pct_of_ceiling'], '4.0f')}% of ceiling  "
                     f"x{fmt(r['ratio'], '.2f')} vs torch{verdict}")
    return lines


# ------------------------------------------------------------------------------ entry
def run_bench(kernels: Sequence[str], *, quick: bool, repeats: int, out_dir: Path,
              dtypes: Sequence[str] = ("float32",), seed: int = 0) -> int:
    """Run the sweep in each of `dtypes` (names of DTYPES), write bench.json and the plots
    under out_dir, print the tables. Each workload's random inputs are drawn after
    torch.manual_seed(seed), so a row is the same in every run and in any selection of
    kernels.

    Returns 0 when every scratchops output matched torch, 1 otherwise. Needs a CUDA GPU and
    the built kernels (the caller checks and loads).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    with tf32_disabled():
        env = environment()
        print(f"scratchops bench on {env['gpu']}: measuring the ceilings...", file=sys.stderr,
              flush=True)
        ceilings = {"copy": measure_copy_bandwidth(repeats=repeats)}
        for name in dtypes:
            ceilings[f"gemm_{name}"] = measure_gemm_tflops(DTYPES[name], repeats=repeats)
        workloads = plan(kernels, quick)
        progress = Progress(len(dtypes) * sum(1 + len(w.versions) for w in workloads))
        rows = []
        for name in dtypes:
            in_dtype = {"copy": ceilings["copy"], "gemm": ceilings[f"gemm_{name}"]}
            for w in workloads:
                torch.manual_seed(seed)
                rows.extend(run_workload(w, DTYPES[name], in_dtype, repeats, progress))
        progress.close()
    print("scratchops bench: host time per call...", file=sys.stderr, flush=True)
    with tf32_disabled():
        host_rows = host_cost.measure()

    result = envelope("bench", env,
                      {"kernels": list(kernels), "dtypes": list(dtypes), "quick": quick,
                       "repeats": repeats, "seed": seed, "warmup": DEFAULT_WARMUP,
                       "flush_l2": True, "tf32": False, "naive_max_flop": NAIVE_MAX_FLOP},
                      ceilings={name: c.as_dict() for name, c in ceilings.items()}, rows=rows,
                      host_cost=host_rows)
    json_path = out_dir / "bench.json"
    json_path.write_text(json.dumps(result, indent=1) + "\n")
    written = [json_path]
    for name in dtypes:
        suffix = "" if name == "float32" else f"_{name}"
        of_dtype = [r for r in rows if r["dtype"] == name]
        for stem, plot, ceiling in (("gemm", bench_plots.compute_bound, ceilings[f"gemm_{name}"]),
                                    ("memory_bound", bench_plots.memory_bound, ceilings["copy"])):
            path = out_dir / f"{stem}{suffix}.png"
            if plot(of_dtype, ceiling, path):
                written.append(path)

    print(rows_table(rows))
    print()
    print("ratio = torch ms / scratchops ms (>1: scratchops faster); %ceil: of the measured "
          "copy bandwidth (GB/s) or torch's GEMM in the row's dtype (TFLOP/s); median of "
          f"{repeats}, L2 flushed, TF32 off")
    print("\n".join(summary_lines(rows, ceilings, env["gpu"])))
    print()
    print(host_cost.table(host_rows))
    print("host us per call: tiny inputs, the CPU time of queueing one call (fastest of 30 "
          "rounds of 100 that never wait for the GPU); ratio = scratchops / torch (<1: "
          "cheaper); loop: us per call in a loop (events), the GPU's pace where it is slower")
    timed = sum(r["ms"] is not None for r in rows)
    skipped = sum(r["ok"] is None for r in rows)
    wrong = [f"{r['kernel']}/{r['dtype']}/{r['version']} {r['shape']}" for r in rows
             if r["ok"] is False]
    print(f"{len(rows)} rows: {timed} timed, {skipped} skipped, {len(wrong)} wrong or "
          f"failing{': ' + ', '.join(wrong) if wrong else ''}")
    print("wrote " + ", ".join(str(p) for p in written))
    return 1 if wrong else 0
