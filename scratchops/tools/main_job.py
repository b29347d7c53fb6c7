"""`scratchops run`, the main job: each problem's Model and every ModelNew variant built with
the same parameters, ModelNew checked against torch in fp32 (TF32 off) and float64, and
torch eager (TF32 off and torch's defaults), torch.compile and each variant timed side by
side; medians with the L2 cache flushed before each run. In float16 and bfloat16 (--dtype),
the models and the input moved with .to(dtype) as KernelBench's precision argument moves
them, each ModelNew is checked against torch eager in that dtype at KernelBench's half
tolerance, and timed beside torch eager and torch.compile in that dtype."""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import functools
import json
import sys
import time
from collections.abc import Callable

import torch

import scratchops

from ..problems import PROBLEMS, build_pair
from .host_cost import batch1_latency, batch1_summary_lines
from .report import (ATOL, DTYPES, HALF_FLOAT64_FACTOR, HALF_TOL, compare, dims, envelope,
                     first_line, fmt, format_table, half_float64_rule, tolerance)
from .train import training_step
from .timing import (DEFAULT_WARMUP, environment, tf32_disabled, tf32_settings, time_cuda,
                     time_synchronized)

PROBLEM_KEYS = ("p85", "p31")  # the keys of scratchops.problems.PROBLEMS, in run order
# The short names of report.DTYPES in the labels.
SHORT = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def _status(message: str) -> None:
    print(f"scratchops run: {message}", file=sys.stderr, flush=True)


@dataclasses.dataclass
class Implementation:
    """One way of computing a problem's forward pass; `fn` is None when it is unavailable."""

    key: str
    label: str
    fn: Callable[[torch.Tensor], torch.Tensor] | None
    is_scratchops: bool = False
    tf32_off: bool = True  # False: run under the TF32 settings this process started with
    # (as KernelBench runs; a scratchops entry is then checked against torch eager under the
    # same settings, as KernelBench checks it)
    note: str = ""
    compile_s: float | None = None


def _compiled(problem: str, model: torch.nn.Module, x: torch.Tensor,
              skip: bool) -> Implementation:
    """torch.compile(model), compiled now by a first call whose time is the compile time."""
    short = SHORT[x.dtype]
    key, label = f"torch_compile_{short}", f"compile {short}"
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
        return Implementation(key, label, None, note=f"unavailable: {first_line(exc)}")
    return Implementation(key, label, compiled, compile_s=compile_s,
                          note=f"torch.compile, TF32 off; compiled in {compile_s:.1f} s")


def _correctness(out: torch.Tensor, ref32: torch.Tensor, ref64: torch.Tensor) -> dict:
    """out against torch (fp32, TF32 off, or torch in out's half dtype: the "fp32" fields) and
    float64: allclose at KernelBench's tolerance for out's dtype; in a half dtype the float64
    check is report.half_float64_rule (an error within a factor of torch's own)."""
    tol = tolerance(out.dtype)
    ok32, err32, note32 = compare(out, ref32, tol)
    if out.dtype == torch.float32:
        ok64, err64, note64 = compare(out.double(), ref64, tol)
    else:
        ok64, err64, note64 = half_float64_rule(out, ref32, ref64)
        note64 = "" if ok32 else note64
    return {"max_abs_err_vs_fp32": err32, "allclose_vs_fp32": ok32,
            "max_abs_err_vs_fp64": err64, "allclose_vs_fp64": ok64,
            "note": "; ".join(dict.fromkeys(n for n in (note32, note64) if n))}


def passes(entry: dict, half: bool) -> bool:
    """A scratchops entry's verdict. TF32 off: allclose to torch fp32 and to float64; under
    torch's defaults: allclose to torch eager under the same switches (KernelBench's check;
    TF32 is not within report.ATOL of float64). In a half dtype: allclose to torch in that
    dtype (KernelBench's check) or, where a rounding tie splits the two, as accurate as torch
    against float64 (report.half_float64_rule)."""
    c = entry["correctness"]
    if half:
        return c["allclose_vs_fp32"] or c["allclose_vs_fp64"]
    return c["allclose_vs_fp32"] and (c["allclose_vs_fp64"] or not entry["tf32_off"])


def _tf32_note(settings: dict) -> str:
    state = {True: "on", False: "off"}
    return (f"torch eager, TF32 as this process found it: cuDNN TF32 "
            f"{state[settings['cudnn_allow_tf32']]}, matmul TF32 "
            f"{state[settings['cuda_matmul_allow_tf32']]}")


def measure_problem(key: str, module, shape: tuple[int, ...], args: argparse.Namespace,
                    default_tf32: dict, dtype: torch.dtype = torch.float32) -> dict:
    """Check and time every implementation of one problem in `dtype`: entries by key."""
    _status(f"{key}: building {module.NAME} at input {dims(shape)}, {dtype}")
    model = None
    variants = {}
    for label in module.VARIANTS:
        model, variants[label] = build_pair(module, label, args.seed)
        variants[label] = variants[label].to(dtype)
    model = model.to(dtype)
    generator = torch.Generator(device="cuda").manual_seed(args.seed)
    x = torch.rand(shape, device="cuda", generator=generator).to(dtype)
    if dtype != torch.float32:
        return _measure(key, _half_implementations(key, model, variants, x, args),
                        model(x), copy.deepcopy(model).double()(x.double()), x, args)

    _status(f"{key}: computing the fp32 (TF32 off), torch-defaults and float64 references")
    with tf32_disabled():
        ref32 = model(x)
    ref_default = model(x)  # torch eager under the switches this process started with
    ref64 = copy.deepcopy(model).double()(x.double())
    default_label = next(iter(variants))

    impls = [
        Implementation("torch_eager_fp32", "eager fp32", model, note="torch eager, TF32 off"),
        Implementation("torch_eager_default", "eager default", model, tf32_off=False,
                       note=_tf32_note(default_tf32)),
        _compiled(key, model, x, args.no_compile),
        *(Implementation(f"modelnew_{label}", f"ModelNew[{label}]", new, is_scratchops=True)
          for label, new in variants.items()),
        Implementation(f"modelnew_{default_label}_defaults", f"ModelNew[{default_label}] dflt",
                       variants[default_label], is_scratchops=True, tf32_off=False,
                       note="under torch's default switches, checked against eager default "
                            "as KernelBench checks"),
    ]
    return _measure(key, impls, ref32, ref64, x, args, ref_default)


def _half_implementations(key: str, model, variants: dict, x: torch.Tensor,
                          args: argparse.Namespace) -> list[Implementation]:
    """In a half dtype: torch eager and torch.compile in it, and each ModelNew variant."""
    short = SHORT[x.dtype]
    return [Implementation(f"torch_eager_{short}", f"eager {short}", model,
                           note=f"torch eager in {x.dtype}"),
            _compiled(key, model, x, args.no_compile),
            *(Implementation(f"modelnew_{label}_{short}", f"ModelNew[{label}] {short}", new,
                             is_scratchops=True)
              for label, new in variants.items())]


def _measure(key: str, impls: list[Implementation], ref32: torch.Tensor, ref64: torch.Tensor,
             x: torch.Tensor, args: argparse.Namespace, ref_default=None) -> dict:
    """Each implementation checked (against ref32: torch fp32 with TF32 off, or torch in x's
    half dtype; TF32-default rows against ref_default) and timed both ways."""
    entries = {}
    for impl in impls:
        entry = {"label": impl.label, "kind": "scratchops" if impl.is_scratchops else "torch",
                 "note": impl.note, "compile_s": impl.compile_s, "correctness": None,
                 "timing": None}
        if impl.fn is not None:
            _status(f"{key}: checking and timing {impl.label}")
            with tf32_disabled() if impl.tf32_off else contextlib.nullcontext():
                entry["correctness"] = _correctness(
                    impl.fn(x), ref32 if impl.tf32_off or not impl.is_scratchops else ref_default,
                    ref64)
                entry["tf32_off"] = impl.tf32_off
                entry["timing"] = time_cuda(functools.partial(impl.fn, x),
                                            repeats=args.repeats).as_dict()
                entry["timing_sync"] = time_synchronized(functools.partial(impl.fn, x),
                                                         repeats=args.repeats).as_dict()
        entries[impl.key] = entry
    return entries


def run_problem(key: str, module, args: argparse.Namespace, default_tf32: dict,
                dtype: torch.dtype = torch.float32) -> dict:
    """Check and time one problem in `dtype`; prints its table and returns its JSON entry."""
    batch = args.batch or module.batch_size
    shape = (batch, module.in_channels, module.height, module.width)
    entries = measure_problem(key, module, shape, args, default_tf32, dtype)
    torch.cuda.empty_cache()  # the models and tensors died with measure_problem's frame

    speedups = {}
    for ours_key, ours in entries.items():
        if ours["kind"] == "scratchops" and ours["timing"]:
            speedups[ours_key] = {
                torch_key: (t["timing"]["median_ms"] / ours["timing"]["median_ms"]
                            if t["timing"] else None)
                for torch_key, t in entries.items() if t["kind"] == "torch"}
    half = dtype != torch.float32
    ok = all(passes(e, half) for e in entries.values() if e["kind"] == "scratchops")
    result = {"name": module.NAME, "batch": batch, "input_shape": list(shape),
              "dtype": str(dtype).removeprefix("torch."),
              "implementations": entries, "speedups": speedups, "ok": ok,
              "batch1_sync": {} if half else batch1_latency(module, args),
              "training_step": training_step(module, shape, args, _status, dtype)}
    print(problem_table(key, result))
    return result


def problem_table(key: str, result: dict) -> str:
    entries = result["implementations"]
    columns = [("implementation", "<"), ("max|err| torch", ">"), ("allclose", "<"),
               ("max|err| fp64", ">"), ("allclose", "<"), ("median ms", ">"), ("p10", ">"),
               ("p90", ">"), ("sync ms", ">"), ("note", "<")]
    rows = []
    for e in entries.values():
        c, t = e["correctness"] or {}, e["timing"] or {}
        note = "; ".join(n for n in (e["note"], c.get("note", "")) if n)
        rows.append([e["label"], fmt(c.get("max_abs_err_vs_fp32"), ".2e"),
                     fmt(c.get("allclose_vs_fp32"), ""),
                     fmt(c.get("max_abs_err_vs_fp64"), ".2e"),
                     fmt(c.get("allclose_vs_fp64"), ""),
                     fmt(t.get("median_ms"), ".3f"), fmt(t.get("p10_ms"), ".3f"),
                     fmt(t.get("p90_ms"), ".3f"),
                     fmt((e.get("timing_sync") or {}).get("median_ms"), ".3f"), note])
    half = result["dtype"] != "float32"
    reference = (f"torch eager in {result['dtype']}" if half else
                 "fp32, TF32 off; for 'dflt' rows torch eager under its default switches")
    fp64_rule = f" (fp64: an error within {HALF_FLOAT64_FACTOR}x eager's)" if half else ""
    lines = [f"\n== {key}: {result['name']}, input {dims(result['input_shape'])}, "
             f"{result['dtype']} ==",
             f"errors: max |output - torch| ({reference}) and max |output - float64 reference|"
             f"; allclose at atol = rtol = {HALF_TOL if half else ATOL:g}{fp64_rule}; "
             f"median ms: GPU time, calls queued; sync ms: KernelBench's timer, "
             f"synchronised after each call (its queued L2 flush hides up to the flush's "
             f"GPU time of a call's host time)",
             format_table(columns, rows)]
    if result["batch1_sync"]:
        lines += ["", "batch 1 (ms, synchronised after each call; KernelBench's timer, and "
                  "'host in full': the flush waited for, so the call's host time counts in "
                  "full): " + "  ".join(f"{label} {ms:.4f}"
                                        for label, ms in result["batch1_sync"].items())]
    step = result.get("training_step")
    for switches, t in (("TF32 off", step), ("torch's defaults", (step or {}).get("defaults"))):
        if t:
            lines += ["", f"training step (forward + backward, {result['dtype']}, {switches}; "
                      "GPU ms): " + "  ".join(f"{label} {ms:.3f}" for label, ms in t["ms"].items())
                      + f"; ModelNew's gradients vs eager's: max error "
                      f"{t['max_relative_grad_err_vs_eager']:.2e} of each gradient's largest value"]
    torch_keys = [k for k, e in entries.items() if e["kind"] == "torch"]
    if result["speedups"]:
        columns = [("speedup (torch ms / ours)", "<")]
        columns += [(f"vs {entries[k]['label']}", ">") for k in torch_keys]
        rows = [[entries[k]["label"], *(fmt(s[t], ".2f") for t in torch_keys)]
                for k, s in result["speedups"].items()]
        lines += ["", format_table(columns, rows)]
    return "\n".join(lines)


def summary_lines(results: dict, env: dict, repeats: int) -> list[str]:
    lines = [f"summary: {env['gpu']}, torch {env['torch']} (CUDA {env['cuda']}), tensor cores "
             f"on {env['tensor_core_engine']}, median of {repeats} runs, L2 flushed; xN = torch "
             f"ms / ModelNew ms (>1: ModelNew faster)"]
    for key, result in results.items():
        entries = result["implementations"]
        for ours_key, ratios in result["speedups"].items():
            ours = entries[ours_key]
            c = ours["correctness"]
            vs = "  ".join(("n/a" if r is None else f"x{r:.2f}") + f" vs {entries[t]['label']}"
                           for t, r in ratios.items())
            verdict = f"allclose {passes(ours, False)}"
            if result["dtype"] != "float32":
                verdict = (f"allclose {c['allclose_vs_fp32']}, as accurate as torch "
                           f"{c['allclose_vs_fp64']}")
            lines.append(f"  {key} b{result['batch']} {ours['label']:<22} "
                         f"{ours['timing']['median_ms']:9.3f} ms  sync "
                         f"{ours['timing_sync']['median_ms']:8.3f} ms  {verdict}  {vs}")
        lines += batch1_summary_lines(key, result["batch1_sync"])
        step = result.get("training_step")
        for switches, t in (("", step), (" dflt", (step or {}).get("defaults"))):
            if not t:
                continue
            ms = t["ms"]
            lines.append(f"  {key} b{result['batch']} training step{switches} (ms)  " +
                         "  ".join(f"{label} {v:.3f}" for label, v in ms.items()) +
                         "  ModelNew " + "  ".join(f"x{ms[label] / ms['ModelNew']:.2f} vs {label}"
                                                   for label in ms if label != "ModelNew"))
    ok = all(r["ok"] for r in results.values())
    lines.append(f"all ModelNew outputs allclose (atol = rtol = {ATOL:g}) to torch fp32 and "
                 f"float64 with TF32 off, and to torch eager under torch's defaults; in fp16 "
                 f"and bf16 (atol = rtol = {HALF_TOL:g}) to torch eager in that dtype or, "
                 f"where not, within {HALF_FLOAT64_FACTOR}x of its error against float64: {ok}")
    return lines


def run_main_job(args: argparse.Namespace) -> int:
    """`scratchops run`: every problem's tables, the summary, the JSON file; the exit status."""
    default_tf32 = tf32_settings()  # as this process found them: torch's defaults
    scratchops.load()

    keys = PROBLEM_KEYS if args.problem == "all" else (args.problem,)
    dtypes = list(DTYPES) if args.dtype == "all" else [args.dtype]
    results = {}
    with torch.no_grad():  # inference, as KernelBench times it
        env = environment()
        for name in dtypes:
            dtype = DTYPES[name]
            for key in keys:  # float32's keys as they were; "p31_bf16" and so on
                label = key if dtype == torch.float32 else f"{key}_{SHORT[dtype]}"
                results[label] = run_problem(key, PROBLEMS[key], args, default_tf32, dtype)
    ok = all(r["ok"] for r in results.values())
    if args.json is not None:
        report = envelope("run", env,
                          {"problems": list(keys), "batch": args.batch, "dtypes": dtypes,
                           "seed": args.seed, "repeats": args.repeats,
                           "warmup": DEFAULT_WARMUP, "compile": not args.no_compile,
                           "flush_l2": True, "torch_default_tf32": default_tf32},
                          problems=results, ok=ok)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    print()
    print("\n".join(summary_lines(results, env, args.repeats)))
    if args.json is not None:
        print(f"wrote {args.json}")
    return 0 if ok else 1
