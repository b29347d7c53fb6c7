"""Where the host time of a P31 ModelNew call goes, layer by layer, in one process (the
timer of `scratchops bench`'s host-cost table: timing.host_us_per_call, the calls taking
turns): ModelNew's forward, the public function it calls, binding.cpp's direct call below it
(pybind11, the dispatcher, the checks, two allocations, the output and the workspace of the
weights the convolution's kernel packs, and one launch), and beside them reference calls: torch.empty_like (one
allocation), scratchops.tensor_core_engine (a pybind11 call that launches nothing),
scratchops.scale (a public operator of one allocation and one launch), torch's own ops and
KernelBench's Model. Tiny inputs, no gradient, TF32 off.
Usage: python3 scripts/host_breakdown.py
"""

import torch
import torch.nn.functional as F

import scratchops
from scratchops import _library
from scratchops.problems import PROBLEMS, build_pair
from scratchops.tools.timing import host_us_per_call, tf32_disabled


def main() -> None:
    with torch.no_grad(), tf32_disabled():
        model, new = build_pair(PROBLEMS["p31"], "one_kernel", seed=0)
        x = torch.rand(1, 64, 16, 16, device="cuda")
        w, cb, b = new.conv.weight, new.conv.bias, new.bias
        y, s = torch.rand(1, 16, 16, 16, device="cuda"), torch.rand(16, device="cuda")
        one, zero = (1, 1), (0, 0)
        scratchops.scale(y, s)  # (installs the compiled kernels: _library.KERNELS below)
        calls = {
            "Model (KernelBench, 4 torch ops)": lambda: model(x),
            "ModelNew[one_kernel]": lambda: new(x),
            "scratchops.conv2d_min_add_mul": lambda: scratchops.conv2d_min_add_mul(
                x, w, cb, 0.5, b, 2.0, one, zero, one),
            "KERNELS.conv2d_min_add_mul (direct)": lambda: _library.KERNELS.conv2d_min_add_mul(
                x, w, cb, one, zero, one, 0.5, b, 2.0),
            "torch F.conv2d": lambda: F.conv2d(x, w, cb),
            "scratchops.conv2d": lambda: scratchops.conv2d(x, w, cb),
            "scratchops.scale": lambda: scratchops.scale(y, s),
            "torch y * s": lambda: y * s.view(16, 1, 1),
            "torch.empty_like": lambda: torch.empty_like(y),
            "scratchops.tensor_core_engine": scratchops.tensor_core_engine,
        }
        results = host_us_per_call(*calls.values())
    print(f"{'host us per call':38s} {'host':>6s} {'loop':>6s}")
    for name, (host_us, loop_us) in zip(calls, results):
        print(f"{name:38s} {host_us:6.1f} {loop_us:6.1f}")


if __name__ == "__main__":
    main()
