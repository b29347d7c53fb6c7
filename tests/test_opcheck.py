"""torch.library.opcheck on every registered operator: schema, fake (meta) kernel, and
behaviour under torch.compile's ahead-of-time dispatch with dynamic shapes."""

import pytest
import torch

import scratchops
from helpers import ATOL, OPERATOR_SAMPLES, RTOL, rand, requires_gpu, skip_unless_runnable

pytestmark = requires_gpu


@pytest.mark.parametrize("name", sorted(OPERATOR_SAMPLES))
def test_opcheck(name):
    skip_unless_runnable(operator=name)
    scratchops.load()
    op = getattr(torch.ops.scratchops, name).default
    torch.library.opcheck(op, OPERATOR_SAMPLES[name]("cuda"))


@pytest.mark.parametrize("name", sorted(OPERATOR_SAMPLES))
def test_opcheck_with_gradients(name):
    # Every float tensor requires grad: opcheck also checks the autograd registration and the
    # backward under AOTAutograd's dispatch.
    skip_unless_runnable(operator=name)
    scratchops.load()
    op = getattr(torch.ops.scratchops, name).default
    args = tuple(a.requires_grad_() if isinstance(a, torch.Tensor) else a
                 for a in OPERATOR_SAMPLES[name]("cuda"))
    torch.library.opcheck(op, args)


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
    torch.testing.assert_close(out, a_new @ b, atol=ATOL, rtol=RTOL)
