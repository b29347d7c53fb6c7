"""Repeated implicit-GEMM convolutions at P31's shape with every output poisoned first: counts the
calls that leave NaN in their output (an output some thread did not write, or wrote from a wrong
register). The probe that found a wgmma register hazard of the 16-bit kernels (docs/notes.md,
"B resident"). Usage: python3 scripts/poisoned_output_probe.py [CALLS] [float16|bfloat16]
"""

import sys

import torch
import torch.nn.functional as F

import scratchops


def main(calls: str = "400", dtype_name: str = "float16") -> int:
    dtype = getattr(torch, dtype_name)
    torch.manual_seed(0)
    weight = (torch.rand(128, 64, 3, 3, device="cuda") / 24 - 1 / 48).to(dtype)
    bias = (torch.rand(128, device="cuda") - 0.5).to(dtype)
    bad = 0
    for call in range(int(calls)):
        x = torch.rand(4, 64, 128, 128, device="cuda", dtype=dtype)
        # The caching allocator hands this block to the convolution's output next.
        poison = torch.full((4, 128, 126, 126), float("nan"), device="cuda", dtype=dtype)
        del poison
        y = scratchops.conv2d(x, weight, bias)
        nan = y.isnan()
        if nan.any():
            where = nan.nonzero()
            print(f"call {call}: {nan.sum().item()} NaN outputs, first at {where[0].tolist()}, "
                  f"last at {where[-1].tolist()}; torch's: "
                  f"{F.conv2d(x, weight, bias).isnan().sum().item()}", flush=True)
            bad += 1
    print(f"poisoned_output_probe: {bad} of {calls} calls left NaN in their output")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
