"""`scratchops train`: both ModelNews trained beside torch's Models, step by step.

For each problem, Model (torch) and ModelNew (scratchops, its default variant, forward and
backward on scratchops kernels) start from the same parameters and learn the same fixed
synthetic task: reproduce, on a fixed batch of inputs, the outputs of a teacher (a Model with
other random parameters), by mean squared error and SGD with momentum (torch's loss and
optimizer for both: the comparison is of the models' kernels). TF32 is off, so both compute in
fp32. Each step (zero_grad, forward, loss, backward, optimizer step) is timed on the GPU and
synchronised, as a user's loop runs it. Printed: the step times, the losses at a few steps and
the largest relative difference between the two loss curves; plotted (when matplotlib is
installed): both curves of both problems in one PNG.

training_step() is `scratchops run`'s training-step row: one step's GPU time at the run's input
shape beside torch eager and torch.compile.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from ..problems import PROBLEMS, build_pair
from .timing import tf32_disabled, time_cuda

DEFAULT_STEPS = 300
DEFAULT_BATCH = 16
DEFAULT_LR = {"p85": 0.05, "p31": 0.01}  # both converge smoothly over a few hundred steps
MOMENTUM = 0.9


WARM_STEPS = 3  # the first steps build, tune and allocate: left out of the median step time


def synthetic_task(module, batch: int, seed: int, device="cuda"):
    """The fixed synthetic task on `device`: a batch of inputs and a teacher Model's outputs on
    it (a teacher with other random parameters than the models that learn; the same on every
    device and process: one seed, one generator algorithm on every GPU)."""
    torch.manual_seed(seed + 1)
    teacher = module.Model(*module.get_init_inputs()).to(device)
    generator = torch.Generator(device=device).manual_seed(seed)
    x = torch.rand(batch, module.in_channels, module.height, module.width, device=device,
                   generator=generator)
    with torch.no_grad():
        return x, teacher(x)


def sgd_steps(model: torch.nn.Module, key: str, x: torch.Tensor, target: torch.Tensor,
              steps: int) -> tuple[list[float], list[float]]:
    """`steps` steps of SGD with momentum on problem `key`'s MSE to `target`, as a user's loop
    runs them (zero_grad, forward, loss, backward, optimizer step): each step's loss and its
    GPU ms (CUDA events on the current stream of x's device, synchronised after the step).
    `model` may be wrapped (DistributedDataParallel)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=DEFAULT_LR[key], momentum=MOMENTUM)
    losses, times = [], []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(steps):
        start.record()
        optimizer.zero_grad(set_to_none=True)
        loss = F.mse_loss(model(x), target)
        loss.backward()
        optimizer.step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
        losses.append(loss.item())
    return losses, times


def median_step_ms(times: list[float]) -> float:
    """The median step time after the WARM_STEPS first steps (all steps if there are no more)."""
    warm = sorted(times[min(WARM_STEPS, len(times) - 1):])
    return warm[len(warm) // 2]


def max_relative_difference(ours, reference) -> float:
    """max over paired tensors of max |a - b| / max |b|: each tensor's error on its own scale."""
    return max(((a - b).float().abs().max() / b.float().abs().max().clamp_min(1e-30)).item()
               for a, b in zip(ours, reference))


def train_pair(key: str, steps: int, batch: int, seed: int) -> dict:
    """Train Model and ModelNew of problem `key` side by side: their losses and step times."""
    module = PROBLEMS[key]
    model, model_new = build_pair(module, next(iter(module.VARIANTS)), seed)
    x, target = synthetic_task(module, batch, seed)
    result = {}
    for name, m in (("torch", model), ("scratchops", model_new)):
        losses, times = sgd_steps(m.train(), key, x, target, steps)
        result[name] = {"losses": losses, "step_ms": median_step_ms(times)}
    ref, new = result["torch"]["losses"], result["scratchops"]["losses"]
    result["max_relative_difference"] = max(abs(a - b) / abs(a) for a, b in zip(ref, new))
    result["speedup"] = result["torch"]["step_ms"] / result["scratchops"]["step_ms"]
    return result


def training_step(module, shape: tuple[int, ...], args: argparse.Namespace, status,
                  dtype: torch.dtype = torch.float32) -> dict:
    """The training step at the run's input shape in `dtype` (models and input moved to it, as
    `run` moves them), TF32 off: forward, then backward with a fixed output gradient (the
    gradients of the input and of every parameter), GPU ms (median, L2 flushed) of torch
    eager, torch.compile (of the model; its backward compiled by AOTAutograd) and ModelNew's
    default variant; and ModelNew's largest gradient error against eager's in that dtype,
    relative to each gradient's largest magnitude. In float32 the same again under the
    switches this process started with ("defaults": torch's, where TF32 may compute the
    convolutions and their gradients). For `scratchops run` (its --seed, --repeats and
    --no-compile); status(message) reports progress."""
    model, new = build_pair(module, next(iter(module.VARIANTS)), args.seed)
    model, new = model.to(dtype).train(), new.to(dtype).train()
    generator = torch.Generator(device="cuda").manual_seed(args.seed)
    x = torch.rand(shape, device="cuda", generator=generator).to(dtype).requires_grad_()
    impls = {"eager": model, "ModelNew": new}
    if not args.no_compile:
        torch._dynamo.reset()
        impls["compile"] = torch.compile(model)

    def step(m):
        def run():
            x.grad = None
            m.zero_grad(set_to_none=True)
            m(x).backward(out_grad)
        return run

    def grads(m):
        step(m)()
        return [x.grad.clone()] + [p.grad.clone() for p in m.parameters()]

    def measured(switches: str) -> dict:
        status(f"training step in {dtype}, {switches}: {', '.join(impls)}")
        times = {k: time_cuda(step(m), repeats=args.repeats).median_ms for k, m in impls.items()}
        return {"ms": times, "max_relative_grad_err_vs_eager": max_relative_difference(
            grads(new), grads(model))}

    with torch.enable_grad():
        with tf32_disabled():
            with torch.no_grad():
                out_grad = torch.rand(model(x).shape, device="cuda",
                                      generator=generator).to(dtype)
            result = measured("TF32 off")
        if dtype == torch.float32:
            result["defaults"] = measured("torch's defaults")
    return result


def summary(key: str, r: dict, steps: int) -> list[str]:
    marks = sorted({0, steps // 10, steps // 2, steps - 1})
    lines = [f"{key}: step time torch eager {r['torch']['step_ms']:.3f} ms, ModelNew "
             f"{r['scratchops']['step_ms']:.3f} ms (x{r['speedup']:.2f}); loss curves differ by "
             f"at most {r['max_relative_difference']:.2e} (relative)"]
    for i in marks:
        lines.append(f"  step {i + 1:4d}: loss torch {r['torch']['losses'][i]:.6e}  "
                     f"scratchops {r['scratchops']['losses'][i]:.6e}")
    return lines


def plot(results: dict, path: Path) -> bool:
    """Both loss curves of each problem in one PNG; False when matplotlib is missing."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return False
    figure = Figure(figsize=(6 * len(results), 4))
    for i, (key, r) in enumerate(results.items()):
        axes = figure.add_subplot(1, len(results), i + 1)
        for name, style in (("torch", "-"), ("scratchops", "--")):
            axes.plot(range(1, len(r[name]["losses"]) + 1), r[name]["losses"], style,
                      label=f"{name} ({r[name]['step_ms']:.2f} ms/step)")
        axes.set_yscale("log")
        axes.set_xlabel("step")
        axes.set_ylabel("MSE loss")
        axes.set_title(f"{key}: {PROBLEMS[key].NAME}", fontsize=9)
        axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    return True


def run_train(args: argparse.Namespace) -> int:
    keys = list(PROBLEMS) if args.problem == "all" else [args.problem]
    results, lines = {}, []
    with tf32_disabled():
        for key in keys:
            print(f"[train] {key}: {args.steps} steps of batch {args.batch}", flush=True)
            results[key] = train_pair(key, args.steps, args.batch, args.seed)
            lines += summary(key, results[key], args.steps)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "train.json").write_text(json.dumps(results))
    plotted = plot(results, args.out / "loss_curves.png")
    print("\n".join(lines))
    print(f"written: {args.out / 'train.json'}"
          + (f", {args.out / 'loss_curves.png'}" if plotted else " (no matplotlib: no plot)"))
    return 0
