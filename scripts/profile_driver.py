"""A ModelNew variant at KernelBench size, run `calls` times (default 3), for a profiler.

    ncu --set full --kernel-name regex:conv_gn_pool_v2 --launch-skip 1 --launch-count 1 \
        python3 scripts/profile_driver.py p85 one_pass
The first forward builds the kernels; every forward packs the weights (pack_b_kernel) before
the main kernel; --launch-skip 1 profiles the second call of the kernel. P31's kernel:
regex:tf32x3_kernel with `p31`. torch's default switches hold, as for KernelBench: P31's
convolution runs in TF32, P85's in fp32 (docs/tf32.md); pass `fp32` last for TF32 off, or
`bf16` / `fp16` for the model and input in that dtype (as KernelBench's precision casts them).
"""

import contextlib
import sys

import torch

from scratchops.problems import PROBLEMS, build_pair
from scratchops.tools.timing import tf32_disabled


def main(problem: str = "p85", variant: str | None = None, calls: str = "3",
         precision: str = "defaults") -> int:
    module = PROBLEMS[problem]
    variant = variant or next(iter(module.VARIANTS))
    _, model_new = build_pair(module, variant, seed=0)
    torch.manual_seed(1)
    x = module.get_inputs()[0].cuda()
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    if half is not None:
        model_new, x = model_new.to(half), x.to(half)
    with torch.no_grad(), tf32_disabled() if precision == "fp32" else contextlib.nullcontext():
        for _ in range(int(calls)):
            model_new(x)
    torch.cuda.synchronize()
    print(f"profile_driver: {problem} {variant} ran {calls} forwards at {tuple(x.shape)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
