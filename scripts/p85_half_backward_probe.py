"""The `bench --quick` P85 backward row in bf16 over 40 seeds: for each draw, how many
group-norm-and-scale values, pooling choices and clamp choices differ between scratchops and torch,
and whether each gradient passes the bench's rule (bench_backward._check: allclose to torch's, or
within 4x torch's error against float64). Usage: python scripts/p85_half_backward_probe.py"""

import torch
import torch.nn.functional as F

import scratchops
from scratchops.tools import bench_backward
from scratchops.tools.timing import tf32_disabled
from scratchops.tools.workloads import (GROUP_NORM_EPS, P85_CLAMP, P85_GROUPS, P85_POOL,
                                        p85_one_pass_workloads)

DTYPE, SEEDS = torch.bfloat16, 40
w = bench_backward.backward_of(p85_one_pass_workloads(True)[0])
lo, hi = P85_CLAMP


def normed_and_scaled(x, weight, conv_bias, gamma, beta, s, ours):
    """The values the pooling chooses among: torch's chain, or scratchops' conv2d and
    group_norm_scale (what the fused operator's backward recomputes)."""
    if ours:
        return scratchops.group_norm_scale(scratchops.conv2d(x, weight, conv_bias), P85_GROUPS,
                                           gamma, beta, s, GROUP_NORM_EPS)
    return F.group_norm(F.conv2d(x, weight, conv_bias), P85_GROUPS, gamma, beta,
                        GROUP_NORM_EPS) * s


fails = 0
with tf32_disabled():
    for seed in range(SEEDS):
        torch.manual_seed(seed)  # as `scratchops bench --seed` draws a workload's inputs
        inputs = {k: t.to(DTYPE).requires_grad_() for k, t in w.make_inputs().items()}
        leaves = list(inputs.values())
        ref = w.reference(**inputs)
        grad = torch.randn(ref.shape, device="cuda").to(DTYPE)
        expected = torch.autograd.grad(ref, leaves, grad)
        inputs64 = {k: t.detach().double().requires_grad_() for k, t in inputs.items()}
        expected64 = torch.autograd.grad(w.reference(**inputs64), list(inputs64.values()),
                                         grad.double())
        out = w.versions["halo_tiles"](**inputs)
        got = torch.autograd.grad(out, leaves, grad)
        bad = []
        for name, g, e, e64 in zip(inputs, got, expected, expected64):
            if not bench_backward._check([g], [e], [e64])[0]:
                bad.append(f"{name} {(g.double() - e64).abs().max().item():.2e} vs torch "
                           f"{(e.double() - e64).abs().max().item():.2e} (max|g| "
                           f"{e.abs().max().item():.2e})")
        with torch.no_grad():
            args = [t.detach() for t in leaves]
            conv_same = torch.equal(scratchops.conv2d(*args[:3]), F.conv2d(*args[:3]))
            normed_t, normed_o = (normed_and_scaled(*args, ours=o) for o in (False, True))
            (pooled_t, at_t), (pooled_o, at_o) = (
                F.max_pool2d(v, P85_POOL, return_indices=True) for v in (normed_t, normed_o))
            mask_t, mask_o = ((p >= lo) & (p <= hi) for p in (pooled_t, pooled_o))
            at_bounds = ((pooled_t == lo) | (pooled_t == hi)).sum().item()
        print(f"seed {seed}: conv equal {conv_same}; normed differing "
              f"{(normed_o != normed_t).sum().item()}/{normed_t.numel()}; clamp masks differ "
              f"{(mask_t != mask_o).sum().item()}; argmax differ {(at_t != at_o).sum().item()}; "
              f"forward outputs differing {(out != ref).sum().item()}/{out.numel()}; pooled at "
              f"{lo:g} or {hi:g} {at_bounds}; " + ("FAIL " + "; ".join(bad) if bad else "ok"),
              flush=True)
        fails += bool(bad)
print("failing seeds", fails, "of", SEEDS)
