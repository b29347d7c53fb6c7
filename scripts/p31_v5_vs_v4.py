"""P31's one kernel in 16 bits on the implicit-GEMM conv's v5 (cuda/conv_implicit_row_ring.cuh)
against v4 and its channels-last copy, in one process on one GPU.

v5 needs its input's address on 16 bytes (the copy engine's tensor map), so the same values one
element into their storage run v4: the two differ only in how A's rows reach shared memory,
and their outputs must be the same bits.

    python3 scripts/p31_v5_vs_v4.py time        # KernelBench size, bf16 and fp16: GPU time
                                                # (L2 flushed, median of 50) and each kernel
    python3 scripts/p31_v5_vs_v4.py bits [N]    # N draws of two shapes: v5 == v4 bit for bit
"""

import sys

import torch
from torch.profiler import ProfilerActivity, profile

import scratchops
from scratchops.tools.timing import time_cuda


def one_element_in(x):
    """x's values one element into a new storage: v4 runs on them."""
    shifted = torch.empty(x.numel() + 1, dtype=x.dtype, device=x.device)[1:].view(x.shape)
    return shifted.copy_(x)


def inputs(x_shape, dtype, weight_scale=1 / 24):
    def r(*shape):
        return (torch.rand(shape, device="cuda") * 2 - 1).to(dtype)
    cout = 128
    return r(*x_shape), r(cout, x_shape[1], 3, 3) * weight_scale, r(cout), r(cout, 1, 1)


def p31(x, w, cb, b):
    return scratchops.conv2d_min_add_mul(x, w, cb, 0.5, b, 2.0)


def time_both():
    torch.manual_seed(0)
    for dtype in (torch.bfloat16, torch.float16):
        x, w, cb, b = inputs((128, 64, 128, 128), dtype)
        x4 = one_element_in(x)
        v5, v4 = (lambda: p31(x, w, cb, b)), (lambda: p31(x4, w, cb, b))
        print(f"{dtype}: v5 and v4 the same bits: {torch.equal(v5(), v4())}")
        for name, fn in (("v5", v5), ("v4 + copy", v4)) * 2:  # in turns, twice
            print(f"  {name:10s} median {time_cuda(fn, warmup=5, repeats=50).median_ms:.4f} ms")
        for name, fn in (("v5", v5), ("v4 + copy", v4)):
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    fn()
                torch.cuda.synchronize()
            for e in prof.key_averages():
                if e.device_time > 0:
                    print(f"  {name:10s} {e.key[:72]:72s} x{e.count} {e.device_time / 1e3:.4f} ms")
    return 0


def bits(draws):
    rows = 8 * torch.cuda.get_device_properties(0).multi_processor_count  # v5's minimum
    differing = 0
    for draw in range(draws):
        for x_shape in ((rows + 3, 64, 3, 16), (80, 64, 16, 128)):
            x, w, cb, b = inputs(x_shape, torch.bfloat16, weight_scale=1.0)
            n = int((p31(x, w, cb, b) != p31(one_element_in(x), w, cb, b)).sum())
            print(f"draw {draw} {x_shape}: {n} outputs differ")
            differing += n > 0
    print(f"draws with a difference: {differing}")
    return 1 if differing else 0


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "time"
    sys.exit(time_both() if mode == "time" else bits(int(sys.argv[2]) if len(sys.argv) > 2 else 5))
