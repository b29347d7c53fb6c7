"""Host time per call: each public operator beside its torch counterpart (for a fused
operator, the torch ops it replaces), and each problem's ModelNew beside KernelBench's Model.

Inputs are tiny and the host time is the CPU's alone: Python, the dispatcher, argument
checks, allocation and launches, timed in short rounds that never wait for the GPU, torch's
call and ours taking turns (timing.host_us_per_call). Beside it, each call's time in a loop,
which is the GPU's where the GPU is the slower side (a tiny convolution's k-loop runs its
latency, not its work). Under torch.no_grad, as inference runs; TF32 off (either way the
same host work).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import scratchops

from ..problems import PROBLEMS, build_pair
from .report import format_table
from .timing import host_us_per_call


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


def measure() -> list[dict]:
    """One row per operator and per problem: host microseconds per call, torch and ours, and
    each one's microseconds per call in a loop (the slower of host and GPU)."""
    rows = []
    with torch.no_grad():
        for name, theirs, ours in _pairs():
            rows.append(_row(name, theirs, ours))
        for key, module in PROBLEMS.items():
            variant = next(iter(module.VARIANTS))  # the default
            model, new = build_pair(module, variant, seed=0)
            x = torch.rand(1, module.in_channels, 16, 16, device="cuda")
            rows.append(_row(f"{key} ModelNew[{variant}] vs Model", lambda: model(x),
                             lambda: new(x)))
    return rows


def table(rows: list[dict]) -> str:
    columns = [("host us per call", "<"), ("torch", ">"), ("scratchops", ">"), ("ratio", ">"),
               ("loop: torch", ">"), ("scratchops", ">")]
    return format_table(columns, [[r["call"], f"{r['torch_us']:.1f}", f"{r['scratchops_us']:.1f}",
                                   f"{r['scratchops_us'] / r['torch_us']:.2f}",
                                   f"{r['torch_loop_us']:.1f}", f"{r['scratchops_loop_us']:.1f}"]
                                  for r in rows])
