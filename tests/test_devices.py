"""Two GPUs: every operator, forward and backward, runs on its tensors' device and on that
device's current stream, whatever the current device is; a ModelNew moved from one GPU to the
other computes right there, in a process whose first call is on the second GPU too (the
settings kept per device, such as a kernel's shared-memory limit, are made for each device).
These skip on a machine with fewer than two GPUs; `scratchops ddp` trains under DDP on them."""

import subprocess
import sys

import pytest
import torch

from helpers import OPERATOR_SAMPLES, assert_matches, model_cases, rand, skip_unless_runnable
from scratchops.problems import PROBLEMS, build_pair
from test_autograd import leaves, requiring_grad

pytestmark = pytest.mark.skipif(
    torch.cuda.device_count() < 2,
    reason="needs two CUDA GPUs; scripts/gpu_check.sh runs these on a machine of two")
SECOND = torch.device("cuda", 1)
SLEEP_CYCLES = 200_000_000  # ~0.1 s on a GPU at 2 GHz: far longer than a launch takes


def forward_and_gradients(name, args, out_grad):
    y = getattr(torch.ops.scratchops, name)(*args)
    return (y, *torch.autograd.grad(y, leaves(args), out_grad))


@pytest.mark.parametrize("name", sorted(OPERATOR_SAMPLES))
def test_operator_runs_on_its_devices_current_stream_while_another_device_is_current(name):
    skip_unless_runnable(operator=name)
    args = requiring_grad(OPERATOR_SAMPLES[name](SECOND))
    with torch.cuda.device(SECOND):  # the plain call: device 1 current, its default stream
        y = getattr(torch.ops.scratchops, name)(*args)
        out_grad = torch.rand_like(y)
        expected = forward_and_gradients(name, args, out_grad)
    values = [a.detach().clone() for a in leaves(args)]
    with torch.no_grad():
        for a in leaves(args):  # stale inputs: what a kernel on the wrong stream would read
            a.fill_(7.0)
    torch.cuda.synchronize(SECOND)
    # Device 0 current, a side stream current on device 1. On the side stream: a sleep, then
    # the real inputs written. A kernel launched anywhere but that stream starts before the
    # write and reads the stale 7s.
    side = torch.cuda.Stream(device=SECOND)
    previous = torch.cuda.current_stream(SECOND)
    with torch.cuda.device(0):
        torch.cuda.set_stream(side)  # (this makes device 1 current: device 0 again below)
        try:
            with torch.cuda.device(SECOND):
                torch.cuda._sleep(SLEEP_CYCLES)
            torch.cuda.set_device(0)
            assert torch.cuda.current_device() == 0 and torch.cuda.current_stream(SECOND) == side
            with torch.no_grad():
                for a, v in zip(leaves(args), values):
                    a.copy_(v)  # on device 1's current stream: the side stream, after the sleep
            got = forward_and_gradients(name, args, out_grad)
            assert torch.cuda.current_device() == 0
        finally:
            torch.cuda.set_stream(previous)
            torch.cuda.set_device(0)
    torch.cuda.synchronize(SECOND)
    for g, e in zip(got, expected):
        assert g.device == SECOND
        assert torch.equal(g, e)  # the kernels are deterministic: bitwise the plain call's


@pytest.mark.parametrize("name,label", model_cases())
def test_model_new_moved_to_the_second_gpu_matches_torch_there(name, label):
    skip_unless_runnable(case=(name, label))
    module = PROBLEMS[name]
    model, new = build_pair(module, label, seed=5)  # on cuda:0
    x = rand(2, module.in_channels, 21, 19)
    new(x)  # computed on cuda:0 first
    model, new, x = model.to(SECOND), new.to(SECOND), x.to(SECOND)
    with torch.cuda.device(0):
        out = new(x)
        assert out.device == SECOND
        assert_matches(out, model(x), model.double()(x.double()))


FIRST_CALL_ON_THE_SECOND_GPU = """
import torch
from scratchops.problems import PROBLEMS, build_pair
from scratchops.tools.timing import tf32_disabled
with tf32_disabled():
    for module in PROBLEMS.values():
        model, new = build_pair(module, next(iter(module.VARIANTS)), 0, device="cuda:1")
        x = torch.rand(2, module.in_channels, 21, 19, device="cuda:1")
        assert torch.cuda.current_device() == 0
        torch.testing.assert_close(new(x), model(x), atol=1e-4, rtol=1e-4)
print("ok")
"""


def test_first_call_of_a_process_on_the_second_gpu():
    skip_unless_runnable(case=("p31", "one_kernel"))
    done = subprocess.run([sys.executable, "-c", FIRST_CALL_ON_THE_SECOND_GPU],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
