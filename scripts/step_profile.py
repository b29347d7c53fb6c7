"""What one training step is made of: GPU time per kernel of each problem's ModelNew and of
torch eager, forward then backward of a fixed output gradient into the input and every
parameter, at KernelBench's size, TF32 off, from torch.profiler over three steps (after three
to warm up). Usage: python3 scripts/step_profile.py p31,p85 float32,bfloat16 [defaults]
(defaults: under the switches the process started with, torch's, instead of TF32 off).
"""

import collections
import contextlib
import sys

import torch

import scratchops
from scratchops.problems import PROBLEMS, build_pair
from scratchops.tools.timing import tf32_disabled

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
STEPS = 3


def busy_ms(intervals) -> float:
    """The length of the union of (start, end) intervals in microseconds, in ms: the time some
    kernel ran, where kernels that run side by side overlap."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total / 1e3


def kernel_ms(step) -> tuple[dict, float]:
    """Kernel name -> (GPU ms a step, launches a step) over STEPS profiled steps, and the ms a
    step in which some kernel ran."""
    for _ in range(STEPS):
        step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(STEPS):
            step()
        torch.cuda.synchronize()
    totals, counts, intervals = collections.defaultdict(float), collections.Counter(), []
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            totals[e.name] += e.device_time_total / 1e3 / STEPS
            counts[e.name] += 1
            intervals.append((e.time_range.start, e.time_range.end))
    return {k: (v, counts[k] // STEPS) for k, v in totals.items()}, busy_ms(intervals) / STEPS


def main(problems: str, dtypes: str, switches: str = "tf32_off") -> None:
    scratchops.load()
    settings = tf32_disabled if switches == "tf32_off" else contextlib.nullcontext
    suffix = "" if switches == "tf32_off" else " under torch's defaults"
    for key in problems.split(","):
        module = PROBLEMS[key]
        for name in dtypes.split(","):
            dtype = DTYPES[name]
            model, new = build_pair(module, next(iter(module.VARIANTS)), seed=0)
            model, new = model.to(dtype).train(), new.to(dtype).train()
            x = torch.rand(module.batch_size, module.in_channels, module.height, module.width,
                           device="cuda").to(dtype).requires_grad_()
            with torch.no_grad():
                out_grad = torch.rand_like(model(x))
            for label, m in (("ModelNew", new), ("eager", model)):
                def step(m=m):
                    x.grad = None
                    m.zero_grad(set_to_none=True)
                    m(x).backward(out_grad)
                with torch.enable_grad(), settings():
                    rows, busy = kernel_ms(step)
                total = sum(ms for ms, _ in rows.values())
                print(f"== {key} {name} {label}{suffix}: kernels {total:.3f} ms per step, "
                      f"{busy:.3f} ms with some kernel running (less: kernels side by side)")
                for kernel, (ms, n) in sorted(rows.items(), key=lambda kv: -kv[1][0])[:14]:
                    print(f"  {ms:8.3f} ms  x{n:<3d} {kernel[:110]}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "p31,p85",
         sys.argv[2] if len(sys.argv) > 2 else "float32,bfloat16",
         "defaults" if len(sys.argv) > 3 and sys.argv[3] == "defaults" else "tf32_off")
