"""The `scratchops` command (also `python -m scratchops`).

  scratchops run     the two KernelBench problems: each ModelNew variant checked against
                     torch (fp32 and float64) and timed beside torch eager and torch.compile
  scratchops bench   microbenchmarks of every kernel against its torch counterpart and the
                     measured ceilings (scratchops.bench), written as JSON and PNG plots

Exit status: 0 on success, 1 when a scratchops result is not allclose to torch's, 2 for a
usage error or when no CUDA GPU (or no nvcc) is available. The last lines printed are a
short summary, because remote runs often keep only the tail of the output.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import functools
import json
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path

import torch

import scratchops

from . import bench
from .timing import (DEFAULT_REPEATS, DEFAULT_WARMUP, environment, tf32_disabled, tf32_settings,
                     time_cuda)

PROBLEM_KEYS = ("p85", "p31")  # the keys of scratchops.problems.PROBLEMS, in run order
ATOL = RTOL = 1e-4


# ---------------------------------------------------------------------------- parsing
def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _kernel_name(text: str) -> str:
    # A type check rather than `choices`: argparse checks an empty nargs="*" list against
    # `choices` too, and would reject `scratchops bench` with no kernel named.
    if text not in bench.KERNELS:
        raise argparse.ArgumentTypeError(
            f"unknown kernel {text!r} (choose from {', '.join(bench.KERNELS)})")
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scratchops",
        description="Hand-written CUDA kernels for KernelBench P85 and P31, checked and "
                    "timed against PyTorch. Needs a CUDA GPU.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="{run,bench}")

    run = commands.add_parser(
        "run", help="check and time the two KernelBench problems against torch",
        description="Build each problem's Model and every ModelNew variant with the same "
                    "parameters, check ModelNew against torch in fp32 (TF32 off) and float64, "
                    "and time torch eager (TF32 off and torch's defaults), torch.compile and "
                    "each ModelNew variant; medians with the L2 cache flushed before each run.")
    run.add_argument("--problem", choices=(*PROBLEM_KEYS, "all"), default="all",
                     help="which problem (default: all)")
    run.add_argument("--batch", type=_positive_int, metavar="N",
                     help="batch size (default: KernelBench's, 128)")
    run.add_argument("--json", type=Path, metavar="PATH",
                     help="also write every result to this JSON file")
    run.add_argument("--no-compile", action="store_true",
                     help="skip torch.compile (it takes a minute or so per problem)")
    run.add_argument("--repeats", type=_positive_int, default=DEFAULT_REPEATS, metavar="N",
                     help=f"timed runs per implementation (default: {DEFAULT_REPEATS}; "
                          "use at least 20 for numbers you report)")
    run.add_argument("--seed", type=int, default=0,
                     help="seed for parameters and input (default: 0)")
    run.set_defaults(handler=cmd_run)

    bench_parser = commands.add_parser(
        "bench", help="microbenchmark every kernel against torch and the measured ceilings",
        description="Time each scratchops kernel beside its torch counterpart over a size "
                    "sweep, against the copy bandwidth and SGEMM throughput measured in the "
                    "same run; write DIR/bench.json, DIR/gemm.png and DIR/memory_bound.png.")
    bench_parser.add_argument("kernels", nargs="*", type=_kernel_name, metavar="KERNEL",
                              help=f"kernels to run (default: all): {', '.join(bench.KERNELS)}")
    bench_parser.add_argument("--quick", action="store_true",
                              help=f"a tiny sweep with {bench.QUICK_REPEATS} repeats "
                                   "(a smoke test, not numbers to report)")
    bench_parser.add_argument("--repeats", type=_positive_int, metavar="N",
                              help=f"timed runs per measurement (default: {DEFAULT_REPEATS}, "
                                   f"or {bench.QUICK_REPEATS} with --quick)")
    bench_parser.add_argument("--out", type=Path, default=Path("bench_out"), metavar="DIR",
                              help="output directory (default: bench_out)")
    bench_parser.set_defaults(handler=cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.handler(args)


def _gpu_missing(command: str) -> bool:
    """Print one line saying why there is no usable GPU, if there is none."""
    reason = scratchops.why_unavailable()
    if reason is not None:
        print(f"scratchops {command}: needs a CUDA GPU: {reason}", file=sys.stderr)
    return reason is not None


def _status(message: str) -> None:
    print(f"scratchops run: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- bench
def cmd_bench(args: argparse.Namespace) -> int:
    if _gpu_missing("bench"):
        return 2
    scratchops.load()
    kernels = list(dict.fromkeys(args.kernels)) or list(bench.KERNELS)
    repeats = args.repeats or (bench.QUICK_REPEATS if args.quick else DEFAULT_REPEATS)
    return bench.run_bench(kernels, quick=args.quick, repeats=repeats, out_dir=args.out)


# ------------------------------------------------------------------------------ run
@dataclasses.dataclass
class Implementation:
    """One way of computing a problem's forward pass; `fn` is None when it is unavailable."""

    key: str
    label: str
    fn: Callable[[torch.Tensor], torch.Tensor] | None
    is_scratchops: bool = False
    tf32_off: bool = True  # False: run under the TF32 settings this process started with
    note: str = ""
    compile_s: float | None = None


def _compiled(problem: str, model: torch.nn.Module, x: torch.Tensor,
              skip: bool) -> Implementation:
    """torch.compile(model), compiled now by a first call whose time is the compile time."""
    key, label = "torch_compile_fp32", "compile fp32"
    if skip:
        return Implementation(key, label, None, note="skipped (--no-compile)")
    _status(f"{problem}: compiling the model with torch.compile...")
    try:
        compiled = torch.compile(model)
        with tf32_disabled():
            start = time.perf_counter()
            compiled(x)
            torch.cuda.synchronize()
            compile_s = time.perf_counter() - start
    except Exception as exc:  # noqa: BLE001 (torch.compile can fail in many ways; say so)
        return Implementation(key, label, None, note=f"unavailable: {bench.first_line(exc)}")
    return Implementation(key, label, compiled, compile_s=compile_s,
                          note=f"torch.compile, TF32 off; compiled in {compile_s:.1f} s")


def _correctness(out: torch.Tensor, ref32: torch.Tensor, ref64: torch.Tensor) -> dict:
    ok32, err32, note32 = bench.compare(out, ref32)
    ok64, err64, note64 = bench.compare(out.double(), ref64)
    return {"max_abs_err_vs_fp32": err32, "allclose_vs_fp32": ok32,
            "max_abs_err_vs_fp64": err64, "allclose_vs_fp64": ok64,
            "note": "; ".join(dict.fromkeys(n for n in (note32, note64) if n))}


def _tf32_note(settings: dict) -> str:
    state = {True: "on", False: "off"}
    return (f"torch eager, TF32 as this process found it: cuDNN TF32 "
            f"{state[settings['cudnn_allow_tf32']]}, matmul TF32 "
            f"{state[settings['cuda_matmul_allow_tf32']]}")


def measure_problem(key: str, module, shape: tuple[int, ...], args: argparse.Namespace,
                    default_tf32: dict) -> dict:
    """Check and time every implementation of one problem: entries by key."""
    _status(f"{key}: building {module.NAME} at input {bench.dims(shape)}")
    init = module.get_init_inputs()
    # Model and every ModelNew draw their parameters in the same order after the same seed
    # (KernelBench's evaluation); loading Model's state_dict as well (strictly: ModelNew
    # subclasses Model, so the keys must match) makes equal parameters certain.
    torch.manual_seed(args.seed)
    model = module.Model(*init).cuda().eval()
    variants = {}
    for label, kwargs in module.VARIANTS.items():
        torch.manual_seed(args.seed)
        new = module.ModelNew(*init, **kwargs).cuda().eval()
        new.load_state_dict(model.state_dict())
        variants[label] = new
    generator = torch.Generator(device="cuda").manual_seed(args.seed)
    x = torch.rand(shape, device="cuda", generator=generator)

    _status(f"{key}: computing the fp32 (TF32 off) and float64 references")
    with tf32_disabled():
        ref32 = model(x)
    ref64 = copy.deepcopy(model).double()(x.double())

    impls = [
        Implementation("torch_eager_fp32", "eager fp32", model, note="torch eager, TF32 off"),
        Implementation("torch_eager_default", "eager default", model, tf32_off=False,
                       note=_tf32_note(default_tf32)),
        _compiled(key, model, x, args.no_compile),
        *(Implementation(f"modelnew_{label}", f"ModelNew[{label}]", new, is_scratchops=True)
          for label, new in variants.items()),
    ]
    entries = {}
    for impl in impls:
        entry = {"label": impl.label, "kind": "scratchops" if impl.is_scratchops else "torch",
                 "note": impl.note, "compile_s": impl.compile_s, "correctness": None,
                 "timing": None}
        if impl.fn is not None:
            _status(f"{key}: checking and timing {impl.label}")
            with tf32_disabled() if impl.tf32_off else contextlib.nullcontext():
                entry["correctness"] = _correctness(impl.fn(x), ref32, ref64)
                entry["timing"] = time_cuda(functools.partial(impl.fn, x),
                                            repeats=args.repeats).as_dict()
        entries[impl.key] = entry
    return entries


def run_problem(key: str, module, args: argparse.Namespace, default_tf32: dict) -> dict:
    """Check and time one problem; prints its table and returns its JSON entry."""
    batch = args.batch or module.batch_size
    shape = (batch, module.in_channels, module.height, module.width)
    entries = measure_problem(key, module, shape, args, default_tf32)
    torch.cuda.empty_cache()  # the models and tensors died with measure_problem's frame

    speedups = {}
    for ours_key, ours in entries.items():
        if ours["kind"] == "scratchops" and ours["timing"]:
            speedups[ours_key] = {
                torch_key: (t["timing"]["median_ms"] / ours["timing"]["median_ms"]
                            if t["timing"] else None)
                for torch_key, t in entries.items() if t["kind"] == "torch"}
    ok = all(e["correctness"]["allclose_vs_fp32"] and e["correctness"]["allclose_vs_fp64"]
             for e in entries.values() if e["kind"] == "scratchops")
    result = {"name": module.NAME, "batch": batch, "input_shape": list(shape),
              "implementations": entries, "speedups": speedups, "ok": ok}
    print(problem_table(key, result))
    return result


def problem_table(key: str, result: dict) -> str:
    entries = result["implementations"]
    columns = [("implementation", "<"), ("max|err| fp32", ">"), ("allclose", "<"),
               ("max|err| fp64", ">"), ("allclose", "<"), ("median ms", ">"), ("p10", ">"),
               ("p90", ">"), ("note", "<")]
    rows = []
    for e in entries.values():
        c, t = e["correctness"] or {}, e["timing"] or {}
        note = "; ".join(n for n in (e["note"], c.get("note", "")) if n)
        rows.append([e["label"], bench.fmt(c.get("max_abs_err_vs_fp32"), ".2e"),
                     bench.fmt(c.get("allclose_vs_fp32"), ""),
                     bench.fmt(c.get("max_abs_err_vs_fp64"), ".2e"),
                     bench.fmt(c.get("allclose_vs_fp64"), ""),
                     bench.fmt(t.get("median_ms"), ".3f"), bench.fmt(t.get("p10_ms"), ".3f"),
                     bench.fmt(t.get("p90_ms"), ".3f"), note])
    lines = [f"\n== {key}: {result['name']}, input {bench.dims(result['input_shape'])} ==",
             f"errors: max |output - torch fp32 (TF32 off)| and max |output - float64 "
             f"reference|; allclose at atol = rtol = {ATOL:g}",
             bench.format_table(columns, rows)]
    torch_keys = [k for k, e in entries.items() if e["kind"] == "torch"]
    if result["speedups"]:
        columns = [("speedup (torch ms / ours)", "<")]
        columns += [(f"vs {entries[k]['label']}", ">") for k in torch_keys]
        rows = [[entries[k]["label"], *(bench.fmt(s[t], ".2f") for t in torch_keys)]
                for k, s in result["speedups"].items()]
        lines += ["", bench.format_table(columns, rows)]
    return "\n".join(lines)


def summary_lines(results: dict, env: dict, repeats: int) -> list[str]:
    lines = [f"summary: {env['gpu']}, torch {env['torch']} (CUDA {env['cuda']}), median of "
             f"{repeats} runs, L2 flushed; xN = torch ms / ModelNew ms (>1: ModelNew faster)"]
    for key, result in results.items():
        entries = result["implementations"]
        for ours_key, ratios in result["speedups"].items():
            ours = entries[ours_key]
            c = ours["correctness"]
            vs = "  ".join(("n/a" if r is None else f"x{r:.2f}") + f" vs {entries[t]['label']}"
                           for t, r in ratios.items())
            lines.append(f"  {key} b{result['batch']} {ours['label']:<20} "
                         f"{ours['timing']['median_ms']:9.3f} ms  allclose "
                         f"{c['allclose_vs_fp32'] and c['allclose_vs_fp64']}  {vs}")
    ok = all(r["ok"] for r in results.values())
    lines.append(f"all ModelNew outputs allclose to torch fp32 and float64 "
                 f"(atol = rtol = {ATOL:g}): {ok}")
    return lines


def cmd_run(args: argparse.Namespace) -> int:
    if _gpu_missing("run"):
        return 2
    default_tf32 = tf32_settings()  # as this process found them: torch's defaults
    scratchops.load()
    from .problems import PROBLEMS

    keys = PROBLEM_KEYS if args.problem == "all" else (args.problem,)
    results = {}
    # no_grad rather than inference_mode: parameters made under inference_mode have no
    # version counter, so ModelNew could not keep its packed weights between forwards.
    with torch.no_grad():
        env = environment()
        for key in keys:
            results[key] = run_problem(key, PROBLEMS[key], args, default_tf32)
    ok = all(r["ok"] for r in results.values())
    if args.json is not None:
        report = {
            "command": "run",
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "environment": env,
            "settings": {"problems": list(keys), "batch": args.batch, "dtype": "float32",
                         "seed": args.seed, "repeats": args.repeats, "warmup": DEFAULT_WARMUP,
                         "compile": not args.no_compile, "flush_l2": True, "atol": ATOL,
                         "rtol": RTOL, "torch_default_tf32": default_tf32},
            "problems": results,
            "ok": ok,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    print()
    print("\n".join(summary_lines(results, env, args.repeats)))
    if args.json is not None:
        print(f"wrote {args.json}")
    return 0 if ok else 1
