"""The convolution's weight gradient on the tensor cores beside another tree's, in one GPU call.

    python3 scripts/wgrad_ab.py run TAG OUT.pt     (in each tree: PYTHONPATH picks it)
    python3 scripts/p85_ab.py compare A.pt B.pt    (bit for bit)

run: the weight gradient (torch.ops.scratchops._conv2d_weight_grad, the tensor-core version,
the budget the operators use) of P31's shape at batch 128 and of four smaller shapes (odd
sizes, a partial column tile, a non-finite dy in one k-block), in fp32 with TF32 off
(3xTF32) and under cudnn.allow_tf32 (one TF32 product), each saved; and the P31 call's GPU
time (timing.time_cuda: median of 20 calls between CUDA events, L2 flushed before each).
"""
import sys

import torch

import scratchops
from scratchops import versions
from scratchops.tools.timing import tf32_disabled, time_cuda

P31 = ((128, 64, 128, 128), (128, 64, 3, 3))
SHAPES = [P31, ((3, 5, 20, 19), (6, 5, 3, 3)), ((2, 40, 21, 37), (96, 40, 3, 3)),
          ((1, 64, 33, 30), (130, 64, 3, 3)), ((4, 3, 17, 70), (8, 3, 5, 5))]


def weight_grad(x, dy, w_shape):
    return torch.ops.scratchops._conv2d_weight_grad(
        dy, x, list(w_shape), [1, 1], [0, 0], [1, 1],
        versions.TENSOR_CORE_GRAD_WORKSPACE_BYTES, versions.GEMM_TENSOR_CORE_VERSION)


def run(tag, out_path):
    scratchops.load()
    saved = {}
    for mode in ("3xtf32", "tf32"):
        before = torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.allow_tf32 = mode == "tf32"
        try:
            for i, (x_shape, w_shape) in enumerate(SHAPES):
                g = torch.Generator(device="cuda").manual_seed(5 + i)
                x = torch.randn(*x_shape, generator=g, device="cuda")
                out_hw = (x_shape[2] - w_shape[2] + 1, x_shape[3] - w_shape[3] + 1)
                dy = torch.randn(x_shape[0], w_shape[0], *out_hw, generator=g, device="cuda")
                if i == 1:  # a non-finite dy in one k-block
                    dy[1, 2, 5, 7], dy[2, 4, 0, 1] = float("inf"), float("nan")
                saved[f"{mode} {x_shape} {w_shape}"] = weight_grad(x, dy, w_shape)
                if (x_shape, w_shape) == P31:
                    ms = time_cuda(lambda: weight_grad(x, dy, w_shape)).median_ms
                    print(f"== {tag} {mode} P31 weight gradient: {ms:.3f} ms")
        finally:
            torch.backends.cudnn.allow_tf32 = before
    torch.save({k: v.cpu() for k, v in saved.items()}, out_path)


if __name__ == "__main__":
    with tf32_disabled():
        run(sys.argv[2], sys.argv[3])
