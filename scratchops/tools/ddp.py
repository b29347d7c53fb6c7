"""`scratchops ddp`: both ModelNews trained under DistributedDataParallel, one process a GPU.

`scratchops ddp --nproc-per-node N` starts torchrun, which starts N processes (ranks) of this
module (`python -m torch.distributed.run --standalone --nproc-per-node N -m
scratchops.tools.ddp ...`; torchrun can start it the same way by hand). Each rank:

1. takes its GPU (cuda:LOCAL_RANK; with --share-gpu every rank takes cuda:0, which only gloo
   allows: NCCL refuses two ranks on one GPU) and joins the process group;
2. for each problem, for torch's Model and for ModelNew (its default variant) in turn, builds
   the model from the same seed on every rank, wraps it in DDP and trains it on the fixed
   synthetic task of `scratchops train` (a teacher Model's outputs on a fixed global batch,
   MSE, SGD with momentum, TF32 off), each rank on its contiguous shard of the global batch;
   DDP averages the gradients over the ranks in its all-reduce, so every rank takes the step
   of the whole global batch;
3. after the steps, checks that the parameters are bitwise equal on every rank, and rank 0
   trains the same model without DDP on the whole global batch on its GPU for the same steps
   (the one-GPU run) and checks that DDP's parameters equal those within PARAMETER_RTOL of
   each parameter's largest magnitude (the two runs add the same per-sample gradients in a
   different order, so only rounding separates them).

Rank 0 prints one row per model: the DDP step time (median over the steps after the first
few, synchronised after each step as a user's loop runs), samples/s of the global batch, the
one-GPU run's step time, the parameters' difference from it and the cross-rank verdict; with
--json PATH it writes them. The exit status is 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from ..problems import PROBLEMS, build_pair
from .main_job import PROBLEM_KEYS
from .options import positive_int
from .report import RTOL
from .timing import tf32_disabled
from .train import (WARM_STEPS, max_relative_difference, median_step_ms, sgd_steps,
                    synthetic_task)

BACKENDS = ("nccl", "gloo")
DEFAULT_STEPS = 20
DEFAULT_BATCH = 32  # the global batch, at KernelBench's image size
# DDP's parameters against the one-GPU run's, relative to each parameter's largest magnitude:
# KernelBench's fp32 tolerance. The two runs differ by rounding alone, far below it; a rank
# that trained on the wrong shard, a gradient averaged wrongly or a kernel on the wrong device
# or stream is off by far more.
PARAMETER_RTOL = RTOL


# ---------------------------------------------------------------------- arguments, launching
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every rank reads (and `scratchops ddp` passes on to them)."""
    parser.add_argument("--problem", choices=(*PROBLEM_KEYS, "all"), default="all",
                        help="which problem (default: all)")
    parser.add_argument("--backend", choices=BACKENDS, default="nccl",
                        help="the process group's backend (default: %(default)s)")
    parser.add_argument("--share-gpu", action="store_true",
                        help="every rank on cuda:0 (gloo only): DDP's arithmetic checked on "
                             "a machine of one GPU")
    parser.add_argument("--steps", type=positive_int, default=DEFAULT_STEPS, metavar="N",
                        help=f"training steps, more than {WARM_STEPS} (default: %(default)s)")
    parser.add_argument("--batch", type=positive_int, default=DEFAULT_BATCH, metavar="N",
                        help="the global batch, split evenly over the ranks "
                             "(default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed for parameters, teacher and input (default: 0)")
    parser.add_argument("--json", type=Path, metavar="PATH",
                        help="rank 0 writes every result to this JSON file")


def check_arguments(args: argparse.Namespace, world_size: int) -> None:
    """The rules the launcher and every rank share; ValueError says which one is broken."""
    if args.share_gpu and args.backend != "gloo":
        raise ValueError("--share-gpu needs --backend gloo (NCCL refuses two ranks on one GPU)")
    if args.steps <= WARM_STEPS:
        raise ValueError(f"--steps must be more than {WARM_STEPS} (the untimed warm-up steps)")
    if args.batch % world_size:
        raise ValueError(f"the global batch {args.batch} does not split evenly over "
                         f"{world_size} ranks")


def launch_command(args: argparse.Namespace) -> list[str]:
    """torchrun's command line for `scratchops ddp`: this module on args.nproc_per_node ranks,
    with every option passed on as given."""
    check_arguments(args, args.nproc_per_node)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={args.nproc_per_node}", "-m", __name__,
               f"--problem={args.problem}", f"--backend={args.backend}",
               f"--steps={args.steps}", f"--batch={args.batch}", f"--seed={args.seed}"]
    if args.share_gpu:
        command.append("--share-gpu")
    if args.json is not None:
        command.append(f"--json={args.json}")
    return command


def launch(command: list[str], args: argparse.Namespace) -> int:
    """`scratchops ddp`: run torchrun's `command` and return its exit status."""
    if not args.share_gpu and args.nproc_per_node > torch.cuda.device_count():
        print(f"scratchops ddp: {args.nproc_per_node} ranks need {args.nproc_per_node} GPUs, "
              f"this machine has {torch.cuda.device_count()} (--backend gloo --share-gpu puts "
              "every rank on one GPU)", file=sys.stderr)
        return 2
    print("[ddp] " + " ".join(command), file=sys.stderr, flush=True)
    return subprocess.run(command, check=False).returncode


# ---------------------------------------------------------------------------- one rank
def rank_device(local_rank: int, share_gpu: bool) -> torch.device:
    """The GPU of a rank: its own (cuda:LOCAL_RANK), or cuda:0 for all with --share-gpu."""
    if share_gpu:
        return torch.device("cuda", 0)
    if local_rank >= torch.cuda.device_count():
        raise ValueError(f"local rank {local_rank} has no GPU of its own: this machine has "
                         f"{torch.cuda.device_count()} (--backend gloo --share-gpu puts every "
                         "rank on one GPU)")
    return torch.device("cuda", local_rank)


def flat_parameters(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def equal_on_every_rank(flat: torch.Tensor, backend: str) -> bool:
    """Whether every rank holds bitwise the same `flat` (gathered where the backend reduces:
    on the GPU for NCCL, on the host for gloo)."""
    mine = flat if backend == "nccl" else flat.cpu()
    gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, mine)
    return all(torch.equal(g, gathered[0]) for g in gathered)


def train_one(key: str, implementation: str, args: argparse.Namespace, device: torch.device,
              rank: int, world_size: int) -> dict | None:
    """Train one model under DDP, check it, and (rank 0) return its row."""
    from torch.nn.parallel import DistributedDataParallel

    module = PROBLEMS[key]
    variant = next(iter(module.VARIANTS))

    def fresh():
        model, model_new = build_pair(module, variant, args.seed, device=str(device))
        return (model if implementation == "torch" else model_new).train()

    x, target = synthetic_task(module, args.batch, args.seed, device)
    shard = slice(rank * args.batch // world_size, (rank + 1) * args.batch // world_size)
    ddp = DistributedDataParallel(fresh(), device_ids=[device.index])
    _, times = sgd_steps(ddp, key, x[shard], target[shard], args.steps)
    bitwise = equal_on_every_rank(flat_parameters(ddp.module), args.backend)
    row = None
    if rank == 0:
        one_gpu = fresh()
        _, one_gpu_times = sgd_steps(one_gpu, key, x, target, args.steps)
        step_ms = median_step_ms(times)
        row = {"problem": key, "model": implementation,
               "variant": variant if implementation == "scratchops" else None,
               "world_size": world_size, "backend": args.backend, "share_gpu": args.share_gpu,
               "global_batch": args.batch, "steps": args.steps, "step_ms": step_ms,
               "samples_per_s": args.batch / step_ms * 1e3,
               "one_gpu_step_ms": median_step_ms(one_gpu_times),
               "max_relative_difference_vs_one_gpu":
                   max_relative_difference(ddp.module.parameters(), one_gpu.parameters()),
               "bitwise_equal_across_ranks": bitwise}
        row["ok"] = bitwise and row["max_relative_difference_vs_one_gpu"] <= PARAMETER_RTOL
    dist.barrier()  # the other ranks wait for rank 0's one-GPU run
    return row


def format_row(r: dict) -> str:
    return (f"{r['problem']:<4} {r['model']:<10} {r['world_size']} rank(s) {r['backend']:<4} "
            f"step {r['step_ms']:8.3f} ms {r['samples_per_s']:9.0f} samples/s | one GPU, no "
            f"DDP: {r['one_gpu_step_ms']:8.3f} ms | params vs one GPU "
            f"{r['max_relative_difference_vs_one_gpu']:.1e} | ranks bitwise equal: "
            f"{'yes' if r['bitwise_equal_across_ranks'] else 'NO'}"
            + ("" if r["ok"] else "  FAILED"))


def worker(argv: list[str] | None = None) -> int:
    """One rank, as torchrun starts it (RANK, WORLD_SIZE, LOCAL_RANK in the environment)."""
    parser = argparse.ArgumentParser(prog="python -m scratchops.tools.ddp",
                                     description="One rank of `scratchops ddp` (under torchrun).")
    add_arguments(parser)
    args = parser.parse_args(argv)
    if "LOCAL_RANK" not in os.environ:
        parser.error("run under torchrun, which sets RANK, WORLD_SIZE and LOCAL_RANK "
                     "(`scratchops ddp` starts it)")
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    try:
        check_arguments(args, world_size)
        device = rank_device(int(os.environ["LOCAL_RANK"]), args.share_gpu)
    except ValueError as error:
        parser.error(str(error))
    torch.cuda.set_device(device)
    dist.init_process_group(args.backend)
    rows = []
    try:
        with tf32_disabled():
            for key in PROBLEMS if args.problem == "all" else [args.problem]:
                for implementation in ("torch", "scratchops"):
                    row = train_one(key, implementation, args, device, rank, world_size)
                    if row is not None:
                        rows.append(row)
                        print(format_row(row), flush=True)
    finally:
        dist.destroy_process_group()
    if rank != 0:
        return 0
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1))
    failed = [r for r in rows if not r["ok"]]
    print(f"[ddp] {len(rows)} models trained on {world_size} rank(s): "
          + (f"{len(failed)} FAILED a check" if failed else
             f"parameters equal across ranks and within {PARAMETER_RTOL:g} of the one-GPU run"),
          flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(worker())
