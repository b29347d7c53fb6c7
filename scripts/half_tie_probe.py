"""P31 in bf16 (or fp16) at KernelBench's size: why ModelNew is not allclose to torch eager
in a few outputs, and that no other rounding scheme does better.

For each seed it counts, over the 260 million outputs:
  * the convolution's sums (no bias) that round to another half value than cuDNN's: ModelNew's
    implicit GEMM (tensor cores), the im2col chain (CUDA cores);
  * the outputs outside KernelBench's 1e-2 of torch eager, for ModelNew (which rounds where
    torch's operators round: cuda/element.cuh), for the float64 result rounded once, and for an
    fp32 convolution (cuDNN, TF32 off) with the tail computed in fp32 and rounded once;
and prints a few of ModelNew's outside outputs with the convolution's value in both and in
float64. Usage: python scripts/half_tie_probe.py [bfloat16|float16] [SEEDS]"""

import sys

import torch
import torch.nn.functional as F

import scratchops
from scratchops.problems import PROBLEMS, build_pair
from scratchops.tools.report import HALF_TOL
from scratchops.tools.timing import tf32_disabled

dtype = getattr(torch, sys.argv[1] if len(sys.argv) > 1 else "bfloat16")
seeds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
module = PROBLEMS["p31"]
model, new = build_pair(module, "one_kernel", 0)
model, new = model.to(dtype), new.to(dtype)
w, cb, b = model.conv.weight, model.conv.bias, model.bias
shape = (module.batch_size, module.in_channels, module.height, module.width)

with tf32_disabled(), torch.no_grad():
    for seed in range(seeds):
        g = torch.Generator(device="cuda").manual_seed(seed)
        x = torch.rand(shape, device="cuda", generator=g).to(dtype)
        ref, ours = model(x), new(x)

        def outside(y):
            return ~torch.isclose(y, ref, atol=HALF_TOL, rtol=HALF_TOL)

        conv_torch = F.conv2d(x, w)
        flips = {"ModelNew's implicit GEMM": scratchops.conv2d(x, w, algorithm="implicit_gemm"),
                 "im2col + gemm": scratchops.conv2d(x, w, algorithm="im2col_gemm")}
        flips = {k: (v != conv_torch).sum().item() for k, v in flips.items()}
        c32 = F.conv2d(x.float(), w.float(), cb.float())
        once32 = ((torch.clamp_max(c32, 0.5) + b.float()) * 2).to(dtype)
        del c32
        c64 = F.conv2d(x.double(), w.double(), cb.double())
        once64 = ((torch.clamp_max(c64, 0.5) + b.double()) * 2).float().to(dtype)
        del c64
        bad = outside(ours)
        print(f"{dtype} seed {seed}: conv sums rounded unlike cuDNN's: "
              + ", ".join(f"{k} {n}" for k, n in flips.items())
              + f" (of {conv_torch.numel()}); outputs outside {HALF_TOL:g} of eager: ModelNew "
              f"{bad.sum().item()}, float64 rounded once {outside(once64).sum().item()}, fp32 "
              f"conv + tail rounded once {outside(once32).sum().item()}", flush=True)
        for i in [tuple(i) for i in bad.nonzero()[:4].tolist()]:
            image, at = x[i[0]:i[0] + 1], (0, *i[1:])
            exact = F.conv2d(image.double(), w.double())[at].item()
            sum_ours = scratchops.conv2d(image, w, algorithm="implicit_gemm")[at].item()
            print(f"   at {i}: ModelNew {ours[i].item():.5f}, eager {ref[i].item():.5f}; conv "
                  f"sum: ModelNew {sum_ours:.6f}, cuDNN {conv_torch[i].item():.6f}, float64 "
                  f"{exact:.7f}; conv bias {cb[i[1]].item():.5f}, bias {b[i[1]].item():.5f}",
                  flush=True)
        del ref, ours, conv_torch, once32, once64, bad
