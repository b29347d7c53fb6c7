"""A ModelNew variant at KernelBench size, run a few times, for a profiler (ncu) to look at.

    ncu --kernel-name regex:tf32x3 --launch-skip 2 --launch-count 1 \
        python3 scripts/profile_driver.py p85 one_pass
Warm-up calls first (the build, the packed weights), then `calls` more forwards.
"""

import sys

import torch

from scratchops.problems import PROBLEMS, build_pair


def main(problem: str = "p85", variant: str | None = None, calls: str = "3") -> int:
    module = PROBLEMS[problem]
    variant = variant or next(iter(module.VARIANTS))
    _, model_new = build_pair(module, variant, seed=0)
    torch.manual_seed(1)
    x = module.get_inputs()[0].cuda()
    with torch.no_grad():
        for _ in range(int(calls)):
            model_new(x)
    torch.cuda.synchronize()
    print(f"profile_driver: {problem} {variant} ran {calls} forwards at {tuple(x.shape)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
