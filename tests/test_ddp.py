"""`scratchops ddp` (scratchops.tools.ddp): its argument handling on any machine, and on a GPU the
DDP training check itself: two ranks sharing one GPU through gloo, and two ranks on two GPUs
through NCCL where the machine has two. Each run trains both problems' Model and ModelNew under
DistributedDataParallel and exits 1 unless the parameters are bitwise equal on both ranks and
within ddp.PARAMETER_RTOL of a one-GPU run of the same steps over the same global batch."""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import requires_gpu
from scratchops.tools import cli, ddp

REPO = Path(__file__).resolve().parent.parent


def parsed(*argv):
    return cli.build_parser().parse_args(["ddp", *argv])


def test_the_launcher_passes_every_option_on_to_torchrun():
    args = parsed("--nproc-per-node", "2", "--problem", "p31", "--backend", "gloo",
                  "--share-gpu", "--steps", "7", "--batch", "6", "--seed", "4",
                  "--json", "out.json")
    command = ddp.launch_command(args)
    assert command[:6] == [sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node=2", "-m"]
    assert command[6] == "scratchops.tools.ddp"
    worker_args = argparse.ArgumentParser()
    ddp.add_arguments(worker_args)
    again = worker_args.parse_args(command[7:])  # the ranks read back what was given
    assert vars(again) == {k: v for k, v in vars(args).items()
                           if k not in ("command", "handler", "nproc_per_node")}


def test_defaults():
    args = parsed()
    assert (args.problem, args.backend, args.share_gpu, args.steps, args.batch, args.json) == \
        ("all", "nccl", False, ddp.DEFAULT_STEPS, ddp.DEFAULT_BATCH, None)
    assert args.nproc_per_node == max(1, torch.cuda.device_count())


@pytest.mark.parametrize("argv, message", [
    (["--nproc-per-node", "2", "--share-gpu"], "--share-gpu needs --backend gloo"),
    (["--nproc-per-node", "3", "--batch", "32"], "does not split evenly over 3 ranks"),
    (["--steps", "3"], f"--steps must be more than {ddp.WARM_STEPS}"),
])
def test_rules_of_the_ranks_refuse_on_any_machine(argv, message, capsys):
    assert cli.main(["ddp", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["ddp", "--nproc-per-node", "0"], "must be at least 1"),
    (["ddp", "--backend", "mpi"], "invalid choice"),
    (["ddp", "--batch", "x"], "expected a positive integer"),
])
def test_bad_arguments_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_rank_outside_torchrun_says_how_to_start_it():
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    done = subprocess.run([sys.executable, "-m", "scratchops.tools.ddp"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "run under torchrun" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_rank_past_the_gpus_of_the_machine_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match="local rank 1 has no GPU of its own"):
        ddp.rank_device(1, share_gpu=False)
    assert ddp.rank_device(1, share_gpu=True) == torch.device("cuda", 0)


def run_ddp(tmp_path, *argv):
    """`scratchops ddp ARGV` in a subprocess: its exit status, output and JSON rows."""
    out = tmp_path / "ddp.json"
    done = subprocess.run([sys.executable, "-m", "scratchops", "ddp", *argv, "--json", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text())


def check_rows(rows, world_size):
    assert {(r["problem"], r["model"]) for r in rows} == \
        {(p, m) for p in ("p85", "p31") for m in ("torch", "scratchops")}
    for r in rows:
        assert r["world_size"] == world_size and r["ok"] and r["bitwise_equal_across_ranks"]
        assert r["max_relative_difference_vs_one_gpu"] <= ddp.PARAMETER_RTOL


@requires_gpu
def test_two_ranks_sharing_one_gpu_through_gloo_train_as_one_gpu(tmp_path):
    check_rows(run_ddp(tmp_path, "--nproc-per-node", "2", "--backend", "gloo", "--share-gpu",
                       "--steps", "8", "--batch", "4"), 2)


@pytest.mark.skipif(torch.cuda.device_count() < 2,
                    reason="needs two CUDA GPUs; scripts/gpu_check.sh runs it on a machine of two")
def test_two_ranks_on_two_gpus_through_nccl_train_as_one_gpu(tmp_path):
    check_rows(run_ddp(tmp_path, "--nproc-per-node", "2", "--steps", "8", "--batch", "4"), 2)
