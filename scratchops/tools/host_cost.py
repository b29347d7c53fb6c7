"""What a call costs the host: the host time per call of each public operator beside its torch
counterpart (for a fused operator, the torch ops it replaces) and of each problem's ModelNew
beside KernelBench's Model (`scratchops bench`'s table), and the batch-1 latency of each
problem by two timers (`scratchops run`'s batch-1 rows; docs/call-path.md, "Timing a call at
batch 1").

Inputs are tiny and the host time is the CPU's alone: Python, the dispatcher, argument
checks, allocation and launches, timed in short rounds that never wait for the GPU, torch's
call and ours taking turns (timing.host_us_per_call). Beside it, each call's time in a loop,
which is the GPU's where the GPU is the slower side (a tiny convolution's k-loop runs its
latency, not its work). Under torch.no_grad, as inference runs; the operators with TF32 off,
each ModelNew in both settings of BATCH1_SETTINGS (under torch's defaults P31's convolution
takes the TF32 path, whose input copy is one launch more above a small input).
"""

from __future__ import annotations

import argparse
import contextlib
import functools

import torch
import torch.nn.functional as F

import scratchops

from ..problems import PROBLEMS, build_pair
from .report import format_table
from .timing import host_us_per_call, tf32_disabled, time_synchronized_in_turns


# The batch-1 timers (time_synchronized): KernelBench's, whose queued L2 flush hides up to its
# own GPU time of a call's host time, and the one that counts the host time in full. A key of
# batch1_latency's result is "<eager|ModelNew> <setting><suffix>".
BATCH1_TIMERS = (("", False), (", host in full", True))
BATCH1_SETTINGS = ("TF32 off", "defaults")


def _pairs() -> list[tuple[str, object, object]]:
    """(name, torch call, scratchops call) on tiny CUDA inputs."""
    def r(*shape):
        return torch.rand(shape, device="cuda")

    x, w, b = r(1, 8, 16, 16), r(16, 8, 3, 3), r(16)
    y, s = r(1, 16, 16, 16), r(16)
    s3 = s.view(16, 1, 1)
    limit = torch.tensor(0.5, device="cuda")
    a, m = r(32, 64), r(64, 48)
    return [
        ("conv2d", lambda: F.conv2d(x, w, b), lambda: scratchops.conv2d(x, w, b)),
        ("conv2d im2col_gemm", lambda: F.conv2d(x, w, b),
         lambda: scratchops.conv2d(x, w, b, algorithm="im2col_gemm")),
        ("gemm", lambda: torch.addmm(b.new_zeros(32, 1), a, m),
         lambda: scratchops.gemm(a, m)),
        ("max_pool2d", lambda: F.max_pool2d(y, 4), lambda: scratchops.max_pool2d(y, 4)),
        ("clamp", lambda: torch.clamp(y, 0.0, 1.0), lambda: scratchops.clamp(y, 0.0, 1.0)),
        ("group_norm", lambda: F.group_norm(y, 4, s, b), lambda: scratchops.group_norm(y, 4, s, b)),
        ("scale", lambda: y * s3, lambda: scratchops.scale(y, s3)),
        ("min_add_mul", lambda: (torch.min(y, limit) + s3) * 2.0,
         lambda: scratchops.min_add_mul(y, 0.5, s3, 2.0)),
        ("max_pool2d_clamp", lambda: torch.clamp(F.max_pool2d(y, 4), 0.0, 1.0),
         lambda: scratchops.max_pool2d_clamp(y, 4, min=0.0, max=1.0)),
        ("group_norm_scale", lambda: F.group_norm(y, 4, s, b) * s3,
         lambda: scratchops.group_norm_scale(y, 4, s, b, s3)),
        ("im2col", lambda: F.unfold(x, 3), lambda: scratchops.im2col(x, 3)),
        ("conv2d_min_add_mul", lambda: (torch.min(F.conv2d(x, w, b), limit) + s3) * 2.0,
         lambda: scratchops.conv2d_min_add_mul(x, w, b, 0.5, s3, 2.0)),
        ("conv2d_group_norm_pool_clamp",
         lambda: torch.clamp(F.max_pool2d(F.group_norm(F.conv2d(x, w, b), 4, s, b) * s3, 4),
                             0.0, 1.0),
         lambda: scratchops.conv2d_group_norm_pool_clamp(x, w, b, 4, s, b, s3)),
    ]


def _row(call: str, theirs, ours) -> dict:
    (torch_us, torch_loop_us), (scratchops_us, scratchops_loop_us) = \
        host_us_per_call(theirs, ours)
    return {"call": call, "torch_us": torch_us, "scratchops_us": scratchops_us,
            "torch_loop_us": torch_loop_us, "scratchops_loop_us": scratchops_loop_us}


def switches(label: str):
    """The switches of one of BATCH1_SETTINGS: TF32 off, or torch's defaults as found."""
    return tf32_disabled() if label == "TF32 off" else contextlib.nullcontext()


def measure() -> list[dict]:
    """One row per operator and per problem: host microseconds per call, torch and ours, and
    each one's microseconds per call in a loop (the slower of host and GPU)."""
    rows = []
    with torch.no_grad():
        with tf32_disabled():
            for name, theirs, ours in _pairs():
                rows.append(_row(name, theirs, ours))
        for key, module in PROBLEMS.items():
            variant = next(iter(module.VARIANTS))  # the default
            model, new = build_pair(module, variant, seed=0)
            x = torch.rand(1, module.in_channels, 16, 16, device="cuda")
            for setting in BATCH1_SETTINGS:
                with switches(setting):
                    rows.append(_row(f"{key} ModelNew[{variant}] vs Model, {setting}",
                                     lambda: model(x), lambda: new(x)))
    return rows


def table(rows: list[dict]) -> str:
    columns = [("host us per call", "<"), ("torch", ">"), ("scratchops", ">"), ("ratio", ">"),
               ("loop: torch", ">"), ("scratchops", ">")]
    return format_table(columns, [[r["call"], f"{r['torch_us']:.1f}", f"{r['scratchops_us']:.1f}",
                                   f"{r['scratchops_us'] / r['torch_us']:.2f}",
                                   f"{r['torch_loop_us']:.1f}", f"{r['scratchops_loop_us']:.1f}"]
                                  for r in rows])


def batch1_latency(module, args: argparse.Namespace) -> dict:
    """Batch-1 forward latency of torch eager and ModelNew's default variant, under torch's
    default switches and with TF32 off, synchronised after each call, by both timers of
    BATCH1_TIMERS: at batch 1 the host's time per call is most of a call's latency. Eager's
    calls and ModelNew's take turns (time_synchronized_in_turns), so that a slow spell of the
    host or the GPU falls on both."""
    model, new = build_pair(module, next(iter(module.VARIANTS)), args.seed)
    x = torch.rand(1, module.in_channels, module.height, module.width, device="cuda")
    times = {}
    for suffix, host_in_full in BATCH1_TIMERS:
        for label in BATCH1_SETTINGS:
            with switches(label):
                eager, ours = time_synchronized_in_turns(
                    [functools.partial(model, x), functools.partial(new, x)],
                    repeats=10 * args.repeats, host_in_full=host_in_full)
            times[f"eager {label}{suffix}"] = eager.median_ms
            times[f"ModelNew {label}{suffix}"] = ours.median_ms
    return times


def batch1_summary_lines(key: str, b1: dict) -> list[str]:
    """One line a timer of batch1_latency's result: eager, ModelNew and the ratio, per setting."""
    lines = []
    for suffix, _ in BATCH1_TIMERS if b1 else ():
        timer = suffix.lstrip(", ") or "KernelBench's timer"
        lines.append(f"  {key} b1 (sync ms, {timer})  " + "  ".join(
            f"{setting}: eager {b1[f'eager {setting}{suffix}']:.4f} ModelNew "
            f"{b1[f'ModelNew {setting}{suffix}']:.4f} "
            f"(x{b1[f'eager {setting}{suffix}'] / b1[f'ModelNew {setting}{suffix}']:.2f})"
            for setting in BATCH1_SETTINGS))
    return lines
