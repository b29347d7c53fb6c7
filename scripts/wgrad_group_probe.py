"""The fp32 weight gradient's partial sums of several k-blocks against the tests' rule, by the
reduction's length: conv_weight_grad_implicit.cuh groups kPartialGroup k-blocks a partial sum
from kPartialGroupFrom slots on, and a partial sum a k-block below. Per shape and data
(uniform in [-1, 1] as the tests draw, and in [0, 1], where the truncation's bias does not
cancel), over fresh draws: the largest of err / (4 x torch fp32's err + 4 ulps of the
largest |dW|), both against float64, as tests/test_autograd.py's assert_grad_matches counts
it (a value at most 1 passes).

    python3 scripts/wgrad_group_probe.py [draws]
"""

import sys
from pathlib import Path

import torch

import scratchops
from scratchops.tools.timing import tf32_disabled
from scratchops.versions import GEMM_TENSOR_CORE_VERSION, TENSOR_CORE_GRAD_WORKSPACE_BYTES

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_autograd import ULPS  # noqa: E402

# (batch, channels, out channels): 3 x 3 kernels on 130 x 130 inputs, 128 rows of 128 slots an
# image: 2 images below kPartialGroupFrom (as it was written), 4 at it, then longer. On the
# engine the GPU picks by default (wgmma on sm_90).
SHAPES = [(2, 3, 8), (4, 3, 8), (16, 3, 8), (128, 3, 8), (4, 64, 128)]


def ratio(x, dy, w_shape):
    ours = torch.ops.scratchops._conv2d_weight_grad(
        dy, x, list(w_shape), [1, 1], [0, 0], [1, 1], TENSOR_CORE_GRAD_WORKSPACE_BYTES,
        GEMM_TENSOR_CORE_VERSION)
    ref = torch.nn.grad.conv2d_weight(x, w_shape, dy)
    ref64 = torch.nn.grad.conv2d_weight(x.double(), w_shape, dy.double())
    err = (ours.double() - ref64).abs().max().item()
    err_torch = (ref.double() - ref64).abs().max().item()
    return err / (4 * err_torch + ULPS * ref64.abs().max().item()), err, err_torch


def main(draws: str = "5") -> int:
    scratchops.load()
    torch.manual_seed(0)
    for batch, channels, out_channels in SHAPES:
        for low in (-1.0, 0.0):
            results = []
            for _ in range(int(draws)):
                x = torch.empty(batch, channels, 130, 130, device="cuda").uniform_(low, 1.0)
                dy = torch.empty(batch, out_channels, 128, 128, device="cuda").uniform_(low, 1.0)
                with tf32_disabled():
                    results.append(ratio(x, dy, (out_channels, channels, 3, 3)))
            worst = max(results)
            print(f"slots {batch * 128 * 128:>9,}  C {channels:>2} K {out_channels:>3}  data "
                  f"[{low:g}, 1]: worst ratio {worst[0]:.2f} (err {worst[1]:.2e}, torch "
                  f"{worst[2]:.2e}), median {sorted(r[0] for r in results)[len(results) // 2]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
