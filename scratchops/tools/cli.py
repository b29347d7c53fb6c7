"""The `scratchops` command (also `python -m scratchops`).

  scratchops run     the two KernelBench problems: each ModelNew variant checked against
                     torch (fp32 and float64) and timed beside torch eager and torch.compile
  scratchops bench   microbenchmarks of every kernel against its torch counterpart and the
                     measured ceilings (scratchops.tools.bench), written as JSON and PNG plots
  scratchops train   both ModelNews trained beside torch's Models (forward and backward on
                     scratchops kernels): step times and both loss curves (scratchops.tools.train)
  scratchops ddp     both ModelNews trained under DistributedDataParallel, one process a GPU
                     (torchrun), checked against a one-GPU run (scratchops.tools.ddp)
  scratchops sass    a kernel file's machine code counted by kind of instruction, per kernel
                     (scratchops.tools.sass): no GPU needed

Exit status: 0 on success, 1 when a scratchops result is not allclose to torch's, 2 for a
usage error or when no CUDA GPU (or no nvcc) is available. The last lines printed are a
short summary, because remote runs often keep only the tail of the output.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

import scratchops

from . import bench, ddp, main_job, sass, train
from .main_job import PROBLEM_KEYS
from .options import positive_int
from .report import DTYPES
from .timing import DEFAULT_REPEATS


# ---------------------------------------------------------------------------- parsing
def _kernel_name(text: str) -> str:
    # A type check rather than `choices`: argparse checks an empty nargs="*" list against
    # `choices` too, and would reject `scratchops bench` with no kernel named.
    if text not in bench.KERNELS:
        raise argparse.ArgumentTypeError(
            f"unknown kernel {text!r} (choose from {', '.join(bench.KERNELS)})")
    return text


def _kernel_file(text: str) -> Path:
    from .._build import cuda_dir

    for candidate in (Path(text), cuda_dir() / text):
        if candidate.is_file() and candidate.suffix == ".cu":
            return candidate
    raise argparse.ArgumentTypeError(
        f"no kernel file {text!r} (a .cu path, or one of "
        f"{', '.join(sorted(p.name for p in cuda_dir().glob('*.cu')))})")


def _tensor_core_path_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tensor-core-path", choices=scratchops.TENSOR_CORE_PATHS,
                        default=scratchops.versions.DEFAULT_TENSOR_CORE_PATH,
                        help="the tensor-core engine: auto (the best this GPU has), or force "
                             "wgmma (sm_90) or mma_sync (sm_80+) (default: %(default)s)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scratchops",
        description="Hand-written CUDA kernels for KernelBench P85 and P31, checked and "
                    "timed against PyTorch. Needs a CUDA GPU.")
    commands = parser.add_subparsers(dest="command", required=True,
                                     metavar="{run,bench,train,ddp,sass}")

    run = commands.add_parser(
        "run", help="check and time the two KernelBench problems against torch",
        description="Build each problem's Model and every ModelNew variant with the same "
                    "parameters, check ModelNew against torch in fp32 (TF32 off) and float64, "
                    "and time torch eager (TF32 off and torch's defaults), torch.compile and "
                    "each ModelNew variant; medians with the L2 cache flushed before each run.")
    run.add_argument("--problem", choices=(*PROBLEM_KEYS, "all"), default="all",
                     help="which problem (default: all)")
    run.add_argument("--batch", type=positive_int, metavar="N",
                     help="batch size (default: KernelBench's, 128)")
    run.add_argument("--dtype", choices=(*DTYPES, "all"), default="all",
                     help="the dtype the models and input run in, as KernelBench's precision "
                          "argument casts them (default: all three)")
    run.add_argument("--json", type=Path, metavar="PATH",
                     help="also write every result to this JSON file")
    run.add_argument("--no-compile", action="store_true",
                     help="skip torch.compile (it takes a minute or so per problem)")
    run.add_argument("--repeats", type=positive_int, default=DEFAULT_REPEATS, metavar="N",
                     help=f"timed runs per implementation (default: {DEFAULT_REPEATS}; "
                          "use at least 20 for numbers you report)")
    run.add_argument("--seed", type=int, default=0,
                     help="seed for parameters and input (default: 0)")
    _tensor_core_path_option(run)
    run.set_defaults(handler=cmd_run)

    bench_parser = commands.add_parser(
        "bench", help="microbenchmark every kernel against torch and the measured ceilings",
        description="Time each scratchops kernel beside its torch counterpart over a size "
                    "sweep (each KERNEL_backward: its gradients beside torch's autograd), in "
                    "each dtype, against the copy bandwidth and torch's GEMM throughput in "
                    "that dtype measured in the same run; write DIR/bench.json, "
                    "DIR/gemm[_DTYPE].png and DIR/memory_bound[_DTYPE].png.")
    bench_parser.add_argument("kernels", nargs="*", type=_kernel_name, metavar="KERNEL",
                              help=f"kernels to run (default: all): {', '.join(bench.KERNELS)}")
    bench_parser.add_argument("--dtype", choices=(*DTYPES, "all"), default="all",
                              help="the dtype of the inputs, torch's counterpart and the "
                                   "kernels (default: all three, one sweep each)")
    bench_parser.add_argument("--quick", action="store_true",
                              help=f"a tiny sweep with {bench.QUICK_REPEATS} repeats "
                                   "(a smoke test, not numbers to report)")
    bench_parser.add_argument("--repeats", type=positive_int, metavar="N",
                              help=f"timed runs per measurement (default: {DEFAULT_REPEATS}, "
                                   f"or {bench.QUICK_REPEATS} with --quick)")
    bench_parser.add_argument("--seed", type=int, default=0,
                              help="seed of every workload's inputs (default: 0)")
    bench_parser.add_argument("--out", type=Path, default=Path("bench_out"), metavar="DIR",
                              help="output directory (default: bench_out)")
    _tensor_core_path_option(bench_parser)
    bench_parser.set_defaults(handler=cmd_bench)

    train_parser = commands.add_parser(
        "train", help="train both ModelNews beside torch's Models and compare the loss curves",
        description="Train each problem's Model and ModelNew from the same parameters on a fixed "
                    "synthetic task (a teacher model's outputs on a fixed batch; MSE; SGD with "
                    "momentum), TF32 off; print each one's step time and the loss curves' "
                    "largest difference; write DIR/train.json and DIR/loss_curves.png.")
    train_parser.add_argument("--problem", choices=(*PROBLEM_KEYS, "all"), default="all",
                              help="which problem (default: all)")
    train_parser.add_argument("--steps", type=positive_int, default=train.DEFAULT_STEPS,
                              metavar="N", help="training steps (default: %(default)s)")
    train_parser.add_argument("--batch", type=positive_int, default=train.DEFAULT_BATCH,
                              metavar="N", help="batch size, at KernelBench's image size "
                                                "(default: %(default)s)")
    train_parser.add_argument("--seed", type=int, default=0,
                              help="seed for parameters, teacher and input (default: 0)")
    train_parser.add_argument("--out", type=Path, default=Path("train_out"), metavar="DIR",
                              help="output directory (default: train_out)")
    _tensor_core_path_option(train_parser)
    train_parser.set_defaults(handler=cmd_train)

    ddp_parser = commands.add_parser(
        "ddp", help="train both ModelNews under DDP on several GPUs (starts torchrun)",
        description="Start torchrun with one process per GPU; each trains torch's Model and "
                    "ModelNew under DistributedDataParallel on its shard of a fixed global "
                    "batch; rank 0 checks the parameters against a one-GPU run of the same "
                    "steps and prints each model's step time and samples/s.")
    ddp_parser.add_argument("--nproc-per-node", type=positive_int, metavar="N",
                            default=max(1, torch.cuda.device_count()),
                            help="processes (ranks), one per GPU (default: the GPUs here)")
    ddp.add_arguments(ddp_parser)
    ddp_parser.set_defaults(handler=cmd_ddp)

    sass_parser = commands.add_parser(
        "sass", help="count a kernel file's SASS instructions by kind (no GPU needed)",
        description="Compile one file of cuda/ for one architecture with nvcc and count its "
                    "machine code (cuobjdump -sass) per kernel: FFMA, HMMA (mma.sync), HGMMA "
                    "(wgmma), loads, stores, barriers, ...")
    sass_parser.add_argument("file", type=_kernel_file, metavar="FILE",
                             help="a kernel file, by path or by its name in cuda/ "
                                  "(e.g. gemm.cu)")
    sass_parser.add_argument("--arch", choices=sass.ARCHITECTURES, default="90a",
                             help="the architecture, sm_<ARCH> (default: %(default)s)")
    sass_parser.add_argument("--kernel", metavar="REGEX",
                             help="only kernels whose name matches REGEX")
    sass_parser.set_defaults(handler=cmd_sass)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.handler(args)


def _gpu_missing(command: str) -> bool:
    """Print one line saying why there is no usable GPU, if there is none."""
    reason = scratchops.why_unavailable()
    if reason is not None:
        print(f"scratchops {command}: needs a CUDA GPU: {reason}", file=sys.stderr)
    return reason is not None


# ---------------------------------------------------------------------------- bench
def cmd_bench(args: argparse.Namespace) -> int:
    if _gpu_missing("bench"):
        return 2
    scratchops.set_tensor_core_path(args.tensor_core_path)
    kernels = list(dict.fromkeys(args.kernels)) or list(bench.KERNELS)
    repeats = args.repeats or (bench.QUICK_REPEATS if args.quick else DEFAULT_REPEATS)
    dtypes = list(DTYPES) if args.dtype == "all" else [args.dtype]
    return bench.run_bench(kernels, quick=args.quick, repeats=repeats, out_dir=args.out,
                           dtypes=dtypes, seed=args.seed)


def cmd_train(args: argparse.Namespace) -> int:
    if _gpu_missing("train"):
        return 2
    scratchops.set_tensor_core_path(args.tensor_core_path)
    return train.run_train(args)


def cmd_ddp(args: argparse.Namespace) -> int:
    try:
        command = ddp.launch_command(args)
    except ValueError as error:  # an option that breaks a rule of the ranks: on any machine
        print(f"scratchops ddp: {error}", file=sys.stderr)
        return 2
    if _gpu_missing("ddp"):
        return 2
    return ddp.launch(command, args)


def cmd_sass(args: argparse.Namespace) -> int:
    reason = sass.why_unavailable()
    if reason is not None:
        print(f"scratchops sass: {reason}", file=sys.stderr)
        return 2
    try:
        rows = sass.instruction_mix(args.file, args.arch)
    except subprocess.CalledProcessError as failed:  # nvcc's or cuobjdump's own message
        print(f"scratchops sass: {Path(failed.cmd[0]).name} failed:\n{failed.stderr}",
              file=sys.stderr)
        return 1
    print(f"{args.file.name} for sm_{args.arch}: SASS instructions per kernel")
    print(sass.table(rows, args.kernel))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    if _gpu_missing("run"):
        return 2
    scratchops.set_tensor_core_path(args.tensor_core_path)
    return main_job.run_main_job(args)
