"""The gradients of both ModelNews at KernelBench's image size against torch fp32 and float64.

At this size a few of the backward's discrete choices (P85: which element of a 4 x 4 window
is its maximum, whether the clamp passes it; P31: whether the convolution's value is below
0.5) fall differently in any two fp32 computations, torch's and ours, and each differs from
float64 there; the largest element error of a gradient then measures those choices, not the
arithmetic. This prints, for every gradient, the largest error of torch fp32 and of ModelNew
against float64 (relative to the gradient's largest value) and the share of elements off by
more than 1e-3 of it. Usage: python3 scripts/grad_probe.py [BATCH]
"""

import sys

import torch

from scratchops.problems import PROBLEMS, build_pair
from scratchops.tools.timing import tf32_disabled


def grads(model, x, g):
    model.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_()
    model(x).backward(g)
    return [x.grad] + [p.grad for p in model.parameters()]


def main(batch):
    for key, module in PROBLEMS.items():
        model, new = build_pair(module, next(iter(module.VARIANTS)), seed=0)
        model64 = module.Model(*module.get_init_inputs()).double().cuda()
        model64.load_state_dict(model.state_dict())
        x = torch.rand(batch, module.in_channels, module.height, module.width, device="cuda")
        with torch.no_grad():
            g = torch.rand_like(model(x))
        ref64 = grads(model64, x.double(), g.double())
        names = ["input"] + [n for n, _ in model.named_parameters()]
        for name, t, o, r in zip(names, grads(model, x, g), grads(new, x, g), ref64):
            scale = r.abs().max().item()
            et = (t.double() - r).abs()
            eo = (o.double() - r).abs()
            print(f"{key} b{batch} {name:18s} max err vs float64 / max|grad|: torch "
                  f"{et.max().item() / scale:.2e}  ModelNew {eo.max().item() / scale:.2e}; "
                  f"elements off by > 1e-3 of it: torch {(et > 1e-3 * scale).float().mean().item():.2e}"
                  f"  ModelNew {(eo > 1e-3 * scale).float().mean().item():.2e}")


if __name__ == "__main__":
    with tf32_disabled():
        main(int(sys.argv[1]) if len(sys.argv) > 1 else 16)
