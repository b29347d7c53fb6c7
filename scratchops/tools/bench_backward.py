"""The backward rows of `scratchops bench` (`<kernel>_backward`, workloads.backward_of).

A row times what a training step pays for one operator's backward: the gradients of every
input of the forward, given a random output gradient, through autograd
(torch.autograd.grad(output, inputs, grad)). The forward that builds the graph runs once,
outside the timing, for torch's counterpart and for each scratchops version alike; the graph
is kept (retain_graph) so that each timed call runs the whole backward again. The scratchops
backward runs only scratchops kernels (scratchops/_backward.py); the fused operators' includes
recomputing their forward, which torch's keeps instead.

Each gradient is checked against torch's (report.compare_gradient); the compute-bound rows
also report every gradient's largest error against float64 autograd on the same inputs. Work:
the compute-bound rows count their backward GEMMs' FLOP (workloads.backward_of); the
memory-bound ones the minimum traffic of a backward that reads the output gradient and every
input once and writes every input's gradient once.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import torch

from .report import compare_gradient
from .timing import Ceiling, time_cuda

BACKWARD_SUFFIX = "_backward"


def backward_of(w):
    """The backward of workload `w` (a workloads.Workload; workloads imports this module):
    its shape, inputs and versions. A GEMM's backward is two GEMMs of its size (one per
    operand), a convolution's two (the input's and the weight's gradients), so twice the
    forward's FLOP; the fused convolutions' backward also recomputes their forward, which is
    not counted (torch's keeps it instead). The fused convolutions' inputs are put on a grid
    (_on_a_grid)."""
    make_inputs = w.make_inputs
    if w.kernel in ("conv2d_min_add_mul", "conv2d_group_norm_pool_clamp"):
        make_inputs = functools.partial(_on_a_grid, w.make_inputs)
    return dataclasses.replace(w, kernel=w.kernel + BACKWARD_SUFFIX, make_inputs=make_inputs,
                               backward=True, flop=None if w.flop is None else 2 * w.flop)


def _on_a_grid(make_inputs: Callable[[], dict]) -> dict:
    """The fused convolutions' gradients follow a choice made on the convolution's output: is
    it below P31's constant, which element is a P85 pooling window's maximum. Two results of
    one convolution, torch's and ours, differ in their last bits, and on the hundreds of
    millions of elements of these shapes that flips a few choices, so a few gradient entries
    would differ by a whole gradient value between two correct implementations. With the
    input a multiple of 1/4 and the weights of 1/8 (and the convolution's bias 1/64 off P31's
    grid, so that no output equals the constant), every convolution output is exact in fp32
    and equal on both sides, and the choices are the same."""
    inputs = make_inputs()
    steps = {"input": 4, "weight": 8, "conv_bias": 8}
    for name, step in steps.items():
        inputs[name] = torch.round(inputs[name] * step) / step
    if "bias" in inputs:  # P31
        inputs["conv_bias"] += 1 / 64
    return inputs




def _gradients(output: torch.Tensor, inputs: list[torch.Tensor],
               grad: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return torch.autograd.grad(output, inputs, grad, retain_graph=True)


def _check(grads, expected, expected64) -> tuple[bool, float | None, str]:
    """Every gradient against torch's: all pass, the largest |difference|, the notes. A
    gradient passes when it is allclose to torch's (report.compare_gradient) or, where the
    float64 reference was computed, when its error against float64 is within 4x torch's own
    (the rule tests/test_autograd.py holds the gradients to): at these sizes torch's fp32
    convolution gradients are themselves further than the tolerance from float64 (P31's weight
    gradient), and in fp16 / bf16 a fused operator's gradient follows a choice (which element
    is a window's maximum) made on a result each side rounds in its own way."""
    ok, errors, notes = True, [], []
    for i, (g, e) in enumerate(zip(grads, expected)):
        close, error, note = compare_gradient(g, e)
        if not close and error is not None and expected64 is not None:
            e64 = expected64[i]
            ours64, torch64 = ((t.double() - e64).abs().max().item() for t in (g, e))
            close = ours64 <= 4 * torch64
            note = f"input {i}: judged against float64 ({ours64:.1e}, torch's {torch64:.1e})"
        ok = ok and close
        errors.append(error)
        if note:
            notes.append(note)
    return ok, None if None in errors else max(errors), "; ".join(notes)


def measure(w, dtype: torch.dtype, ceilings: dict[str, Ceiling], repeats: int,
            version_rows: Callable[..., list[dict]]) -> list[dict]:
    """torch's backward and each version's, on workload `w`'s inputs in `dtype`: one row per
    version, made by version_rows(w, dtype, work, ceilings, torch_ms, measure_version)
    (bench._version_rows). Runs with gradients enabled."""
    inputs = {name: t.to(dtype).requires_grad_() for name, t in w.make_inputs().items()}
    leaves = list(inputs.values())
    reference_output = w.reference(**inputs)
    grad = torch.randn(reference_output.shape, device=reference_output.device).to(dtype)
    torch_call = functools.partial(_gradients, reference_output, leaves, grad)
    expected = torch_call()
    expected64 = None
    if w.flop is not None:
        inputs64 = {name: t.detach().double().requires_grad_() for name, t in inputs.items()}
        expected64 = torch.autograd.grad(w.reference(**inputs64), list(inputs64.values()),
                                         grad.double())
        del inputs64

    def err64(grads):
        if expected64 is None:
            return None
        return max((g.double() - e).abs().max().item() for g, e in zip(grads, expected64))

    torch_err64 = err64(expected)
    torch_ms = time_cuda(torch_call, repeats=repeats).median_ms
    work = (w.flop if w.flop is not None
            else grad.nbytes + 2 * sum(t.nbytes for t in leaves))

    def measure_version(forward) -> tuple:
        call = functools.partial(_gradients, forward(**inputs), leaves, grad)
        grads = call()
        ok, max_err, note = _check(grads, expected, expected64)
        errors = (err64(grads), torch_err64)
        del grads
        # (The graph lives in `call` and goes when this returns.)
        return time_cuda(call, repeats=repeats), ok, max_err, note, errors

    return version_rows(w, dtype, work, ceilings, torch_ms, measure_version)
