"""P31's float gradients at KernelBench's size, TF32 off, for a profiler: first the weight
gradient operator alone on the min's gradient (its packing reads that gradient), then the four
gradients at once from the kept shares (min_add_mul_conv_grads_launch: P31's rows are whole
k-blocks, so one pass over dy and the shares writes both gradients' operands,
min_add_mul_operands.cuh). Each runs once a chunk of the weight gradient's slices (four at the
default budget), so

    ncu --set full --kernel-name regex:pack_b_kernel --launch-skip 3 --launch-count 1 \
        python3 scripts/p31_grads_driver.py

profiles the last packing of the operator alone, and regex:operands_kernel --launch-count 1
the first one pass of the four at once.
"""

import sys

import torch

import scratchops
from scratchops.versions import (CONV2D_ALGORITHMS, DEFAULT_CONV_WORKSPACE_BYTES,
                                 DEFAULT_IM2COL_GEMM_VERSION, GEMM_TENSOR_CORE_VERSION,
                                 TENSOR_CORE_GRAD_WORKSPACE_BYTES)
from scratchops.tools.timing import tf32_disabled


def main() -> int:
    ops = torch.ops.scratchops
    scratchops.load()
    torch.manual_seed(0)
    x = torch.rand(128, 64, 128, 128, device="cuda") - 0.5
    w = (torch.rand(128, 64, 3, 3, device="cuda") - 0.5) / 24
    cb, b = torch.rand(128, device="cuda"), torch.rand(128, device="cuda")
    dy = torch.rand(128, 128, 126, 126, device="cuda") - 0.5
    window = ([1, 1], [0, 0], [1, 1])
    with torch.no_grad(), tf32_disabled():
        _, halves = ops._conv2d_min_add_mul_keeping(x, w, cb, *window, 0.5, b, 2.0)
        conv = ops.conv2d(x, w, cb, *window, CONV2D_ALGORITHMS["implicit_gemm"],
                          DEFAULT_CONV_WORKSPACE_BYTES, DEFAULT_IM2COL_GEMM_VERSION)
        conv_grad = ops._min_add_mul_backward(dy, conv, 0.5, 2.0)
        apart = ops._conv2d_weight_grad(conv_grad, x, list(w.shape), *window,
                                        TENSOR_CORE_GRAD_WORKSPACE_BYTES,
                                        GEMM_TENSOR_CORE_VERSION)
        torch.cuda.synchronize()
        held = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        together = ops._conv2d_min_add_mul_grads_kept(dy, halves, x, w, 2.0, *window,
                                                      TENSOR_CORE_GRAD_WORKSPACE_BYTES,
                                                      GEMM_TENSOR_CORE_VERSION)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - held
    print(f"p31_grads_driver: the four at once's peak above what was held: {peak / 1e9:.3f} GB"
          f" (dy {dy.numel() * 4 / 1e9:.3f} GB)")
    same = torch.equal(apart, together[1])
    print(f"p31_grads_driver: the weight gradient alone and at once bit for bit: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
