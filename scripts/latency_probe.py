"""The call-path numbers of the tree it imports, in one process, for an A/B of two trees on
one machine (run it once per tree, in turns: PYTHONPATH=TREE picks the tree, also over an
editable install, SCRATCHOPS_BUILD_DIR=DIR its build; the first line printed names the tree):
  - batch-1 forward of each problem, synchronised after each call, by KernelBench's timer
    and with the call's host time in full, torch eager beside ModelNew's default variant,
    with TF32 off and under torch's defaults (host_cost.batch1_latency, the rows of
    `scratchops run`);
  - host µs per call of each ModelNew beside Model (host_cost's rows);
  - P85's one pass at KernelBench's size in each dtype, GPU time (L2 flushed, median), and
    the kernels one call launches (torch.profiler);
  - with --b1-kernels first: each batch-1 call's kernels on the GPU (torch.profiler, calls
    synchronised one by one): each kernel's mean time, and the span from a call's first
    kernel's start to its last kernel's end, whose excess over the kernels' sum is the gaps
    between them.
Usage: python3 scripts/latency_probe.py [--b1-kernels] [REPEATS]   (default 20, as `scratchops run`)
"""

import argparse
import statistics
import sys

import torch

import scratchops
from scratchops.problems import PROBLEMS, build_pair
from scratchops.tools import host_cost
from scratchops.tools.host_cost import BATCH1_SETTINGS, BATCH1_TIMERS, batch1_latency
from scratchops.tools.timing import time_cuda


def b1_kernels(calls: int = 20) -> None:
    """Each problem's batch-1 forward, eager and ModelNew, in both settings: the kernels of a
    call (mean µs each) and a call's GPU span (first kernel start to last kernel end)."""
    for key, module in PROBLEMS.items():
        model, new = build_pair(module, next(iter(module.VARIANTS)), seed=0)
        x = torch.rand(1, module.in_channels, module.height, module.width, device="cuda")
        for setting in BATCH1_SETTINGS:
            for name, fn in (("eager", model), ("ModelNew", new)):
                with host_cost.switches(setting), torch.no_grad():
                    for _ in range(3):
                        fn(x)
                    torch.cuda.synchronize()
                    with torch.profiler.profile(
                            activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                        for _ in range(calls):
                            fn(x)
                            torch.cuda.synchronize()
                kernels = sorted((e for e in prof.events()
                                  if e.device_type == torch.autograd.DeviceType.CUDA),
                                 key=lambda e: e.time_range.start)
                per_call = len(kernels) // calls
                spans, by_name = [], {}
                for c in range(calls):
                    mine = kernels[c * per_call:(c + 1) * per_call]
                    spans.append(mine[-1].time_range.end - mine[0].time_range.start)
                    for e in mine:
                        by_name.setdefault(e.name.split("(")[0][-50:], []).append(
                            e.time_range.end - e.time_range.start)
                total = sum(statistics.mean(v) for v in by_name.values())
                print(f"{key} b1 {setting:8s} {name:8s} span {statistics.median(spans):6.1f} us"
                      f"  kernels {total:6.1f} us: " + ", ".join(
                          f"{n} {statistics.mean(v):.1f}" for n, v in by_name.items()))


def main() -> None:
    argv = sys.argv[1:]
    if argv and argv[0] == "--b1-kernels":
        argv = argv[1:]
        b1_kernels()
    repeats = int(argv[0]) if argv else 20
    print(f"tree: {scratchops.__file__}")
    args = argparse.Namespace(seed=0, repeats=repeats)
    for key, module in PROBLEMS.items():
        with torch.no_grad():
            b1 = batch1_latency(module, args)
        print(f"{key} b1 sync ms  " + "  ".join(f"{k} {v:.4f}" for k, v in b1.items()))
        print(f"{key} b1 ratios  " + "  ".join(
            f"{s}{suffix} x{b1[f'eager {s}{suffix}'] / b1[f'ModelNew {s}{suffix}']:.2f}"
            for suffix, _ in BATCH1_TIMERS for s in BATCH1_SETTINGS))
    rows = host_cost.measure()
    print(host_cost.table([r for r in rows if "ModelNew" in r["call"]
                           or r["call"] == "conv2d_group_norm_pool_clamp"]))
    module = PROBLEMS["p85"]
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        _, new = build_pair(module, "one_pass", seed=0)
        new = new.to(dtype)
        x = torch.rand(module.batch_size, module.in_channels, module.height, module.width,
                       device="cuda", dtype=dtype)
        with torch.no_grad():
            timing = time_cuda(lambda: new(x), repeats=repeats)
            with torch.profiler.profile(
                    activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                new(x)
                torch.cuda.synchronize()
        kernels = [e.name.split("(")[0][-60:] for e in prof.events()
                   if e.device_type == torch.autograd.DeviceType.CUDA]
        print(f"p85 b128 one_pass {str(dtype)[6:]:9s} {timing.median_ms:.4f} ms "
              f"(p10 {timing.p10_ms:.4f}, p90 {timing.p90_ms:.4f}); kernels: {kernels}")


if __name__ == "__main__":
    main()
