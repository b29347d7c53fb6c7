"""torch.library.opcheck on every registered operator: schema, fake (meta) kernel, and
behaviour under torch.compile's ahead-of-time dispatch with dynamic shapes."""

import pytest
import torch

import scratchops
from helpers import rand, requires_gpu

pytestmark = requires_gpu


def samples():
    inf = float("inf")
    return {
        "im2col": (rand(2, 3, 9, 8), [3, 2], [1, 1], [1, 0], [2, 1], 2),
        "gemm": (rand(2, 33, 17), rand(2, 17, 45), rand(33), 3),
        "conv2d": (rand(2, 3, 11, 10), rand(4, 3, 3, 3), rand(4), [1, 1], [1, 1], [1, 1], 0,
                   scratchops.DEFAULT_CONV_WORKSPACE_BYTES, 3),
        "conv2d_pack_weight": (rand(70, 5, 3, 2),),
        "conv2d_min_add_mul": (rand(2, 5, 9, 8), rand(70, 5, 3, 3), rand(70), [1, 1], [1, 1],
                               [1, 1], 0.25, rand(70), 2.0, None),
        "conv2d_group_norm_pool_clamp": (rand(2, 3, 11, 10), rand(8, 3, 3, 3), rand(8), 4,
                                         rand(8), rand(8), rand(8, 1, 1), 1e-5, -0.5, 0.5, None),
        "group_norm": (rand(2, 6, 5, 7), 3, rand(6), rand(6), rand(6, 1, 1), 1e-5),
        "scale": (rand(2, 6, 5, 7), rand(6, 1, 1)),
        "min_add_mul": (rand(2, 6, 5, 7), 0.5, rand(6, 1, 1), 2.0),
        "max_pool2d_clamp": (rand(2, 3, 9, 10), [3, 3], [2, 2], [1, 1], -inf, inf),
        "clamp": (rand(3, 5, 7), 0.0, 1.0),
    }


OPERATORS = ["clamp", "conv2d", "conv2d_group_norm_pool_clamp", "conv2d_min_add_mul",
             "conv2d_pack_weight", "gemm", "group_norm", "im2col", "max_pool2d_clamp",
             "min_add_mul", "scale"]
TENSOR_CORE_OPERATORS = {"conv2d_group_norm_pool_clamp", "conv2d_min_add_mul",
                         "conv2d_pack_weight"}


@pytest.mark.parametrize("name", OPERATORS)
def test_opcheck(name):
    if name in TENSOR_CORE_OPERATORS and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("runs on the tensor cores of an sm_90 GPU")
    scratchops.load()
    op = getattr(torch.ops.scratchops, name).default
    torch.library.opcheck(op, samples()[name])


def test_poison_reaches_next_allocation():
    # The helpers' poisoning is what makes "every element written" checkable: show that the
    # allocator hands the NaN block to the next allocation of that size.
    from helpers import poison_next
    poison_next(1000, 37)
    assert torch.isnan(torch.empty(1000, 37, device="cuda")).all()


def test_kernels_run_on_the_current_stream():
    a_old, a_new, b = rand(256, 300), rand(256, 300), rand(300, 200)
    a = a_old.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)  # hold the side stream for tens of milliseconds
        a.copy_(a_new)                  # queued behind the sleep
        out = scratchops.gemm(a, b)
    side.synchronize()
    # On the side stream the GEMM waits for the copy and sees a_new; launched on any other
    # stream it would run at once, on a_old.
    torch.testing.assert_close(out, a_new @ b, atol=1e-4, rtol=1e-4)
