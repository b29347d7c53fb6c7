"""The command line (scratchops.tools.cli), the sweep plan (scratchops.tools.workloads), the reporting
helpers (scratchops.tools.report) and the timing helpers.

Everything but the last test runs on a CPU: argument errors, the one-line no-GPU message
(real on a machine without a usable GPU, nothing is faked), the bench plan, the pure helpers.
The last test runs `scratchops run` and `scratchops bench --quick` end to end on a GPU.
"""

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import scratchops
from helpers import requires_gpu
from scratchops.tools import cli, main_job, report, workloads
from scratchops.tools.timing import Timing, tf32_disabled, time_cuda

REPO = Path(__file__).resolve().parent.parent
NO_GPU_REASON = scratchops.why_unavailable()
requires_no_gpu = pytest.mark.skipif(
    NO_GPU_REASON is None, reason="a usable GPU is present: the command would really run")


# ------------------------------------------------------------------------ argument handling
@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["bench", "--help"]])
def test_help_in_a_subprocess(argv):
    done = subprocess.run([sys.executable, "-m", "scratchops", *argv], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: scratchops")
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("argv, message", [
    ([], "required"),
    (["frobnicate"], "invalid choice"),
    (["run", "--problem", "p99"], "invalid choice"),
    (["run", "--batch", "0"], "must be at least 1"),
    (["run", "--batch", "-1"], "must be at least 1"),
    (["run", "--batch", "abc"], "expected a positive integer"),
    (["run", "--repeats", "0"], "must be at least 1"),
    (["run", "--dtype", "float64"], "invalid choice"),
    (["run", "--seed", "x"], "invalid int"),
    (["bench", "nosuchkernel"], "unknown kernel 'nosuchkernel'"),
    (["bench", "gemm", "--repeats", "-3"], "must be at least 1"),
])
def test_bad_arguments_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err and message in err


def test_defaults():
    args = cli.build_parser().parse_args(["run"])
    assert (args.problem, args.batch, args.repeats, args.seed, args.no_compile,
            args.json) == ("all", None, 20, 0, False, None)
    args = cli.build_parser().parse_args(["bench"])
    assert (args.kernels, args.quick, args.repeats, args.seed, args.out) == (
        [], False, None, 0, Path("bench_out"))
    args = cli.build_parser().parse_args(["bench", "clamp", "gemm", "--quick"])
    assert args.kernels == ["clamp", "gemm"] and args.quick


@requires_no_gpu
@pytest.mark.parametrize("argv", [["run"], ["run", "--problem", "p31", "--no-compile"],
                                  ["bench"], ["bench", "--quick", "gemm"]])
def test_without_gpu_one_line_and_exit_code_2(argv, capsys, tmp_path):
    assert cli.main([*argv, *(["--out", str(tmp_path)] if argv[0] == "bench" else [])]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"scratchops {argv[0]}: needs a CUDA GPU: {NO_GPU_REASON}\n"
    assert list(tmp_path.iterdir()) == []  # nothing written


@requires_no_gpu
def test_without_gpu_in_a_subprocess_no_traceback():
    done = subprocess.run([sys.executable, "-m", "scratchops", "run"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.startswith("scratchops run: needs a CUDA GPU: ")
    assert done.stderr.count("\n") == 1


# ------------------------------------------------------------------------- the bench plan
def test_plan_covers_every_kernel_and_the_kernelbench_shapes():
    rows = workloads.plan(workloads.KERNELS, quick=False)
    assert {w.kernel for w in rows} == set(workloads.KERNELS)
    shapes = {(w.kernel, w.shape) for w in rows}
    # The full-size convolutions and the intermediate tensors of both problems.
    assert ("conv2d", "128x8x128x128 -> 64 k3") in shapes
    assert ("conv2d", "128x64x128x128 -> 128 k3") in shapes
    for kernel in ("group_norm", "scale", "group_norm_scale", "max_pool2d", "clamp",
                   "max_pool2d_clamp"):
        assert (kernel, "128x64x126x126") in shapes
    assert ("min_add_mul", "128x128x126x126") in shapes
    assert ("gemm", "64x15876x72 b8") in shapes and ("gemm", "128x15876x576 b8") in shapes


def test_plan_compute_bound_rows_run_every_gemm_version_and_cap_only_the_naive_one():
    naive = scratchops.GEMM_VERSIONS[workloads.NAIVE_GEMM_VERSION]
    gemm, conv = workloads.plan(["gemm"], quick=False), workloads.plan(["conv2d"], quick=False)
    conv_versions = [f"im2col+{n}" for n in scratchops.IM2COL_GEMM_VERSIONS.values()]
    for w in gemm + conv:
        expected = (list(scratchops.GEMM_VERSIONS.values())
                    if w.kernel == "gemm" else conv_versions + ["implicit_gemm"])
        assert list(w.versions) == expected
        capped = naive if w.kernel == "gemm" else f"im2col+{naive}"
        assert set(w.skip) == ({capped} if w.flop > workloads.NAIVE_MAX_FLOP else set())
        assert all(reason.startswith("skipped:") for reason in w.skip.values())
    assert any(w.skip for w in gemm + conv) and any(not w.skip for w in gemm + conv)
    p31_full = next(w for w in conv if w.shape == "128x64x128x128 -> 128 k3")
    assert p31_full.flop == 2 * 128 * 128 * 64 * 3 * 3 * 126 * 126
    assert f"im2col+{naive}" in p31_full.skip


def test_plan_has_a_backward_row_for_every_forward_row():
    forward = workloads.plan(workloads.FORWARD_KERNELS, quick=False)
    backward = workloads.plan([k + "_backward" for k in workloads.FORWARD_KERNELS], quick=False)
    assert not any(w.backward for w in forward) and all(w.backward for w in backward)
    assert [(w.kernel + "_backward", w.shape, list(w.versions)) for w in forward] == [
        (w.kernel, w.shape, list(w.versions)) for w in backward]
    for f, b in zip(forward, backward):  # two GEMMs of the forward's size, or bytes
        assert b.flop == (None if f.flop is None else 2 * f.flop)


def test_backward_rows_of_the_fused_convolutions_put_their_inputs_on_a_grid():
    # (on the CPU: the workload's tensors are made on "cuda", so build them by hand here)
    import scratchops.tools.bench_backward as bb

    inputs = {"input": torch.rand(2, 3, 5, 5), "weight": torch.rand(4, 3, 3, 3) - 0.5,
              "conv_bias": torch.rand(4), "bias": torch.randn(4, 1, 1)}
    grid = bb._on_a_grid(lambda: dict(inputs))
    assert torch.equal(grid["input"] * 4, torch.round(grid["input"] * 4))
    assert torch.equal(grid["weight"] * 8, torch.round(grid["weight"] * 8))
    # P31: the convolution's output is a multiple of 1/32 plus 1/64, never the constant 0.5.
    out = F.conv2d(grid["input"].double(), grid["weight"].double(), grid["conv_bias"].double())
    assert torch.equal(((out - 1 / 64) * 32).round(), (out - 1 / 64) * 32)


def test_plan_filters_and_quick_is_small():
    assert {w.kernel for w in workloads.plan(["clamp", "gemm"], quick=True)} == {"clamp", "gemm"}
    quick = workloads.plan(workloads.KERNELS, quick=True)
    assert {w.kernel for w in quick} == set(workloads.KERNELS)
    assert all(not w.skip for w in quick)
    assert all(w.flop < 1e10 for w in quick if w.flop is not None)
    assert len(quick) < len(workloads.plan(workloads.KERNELS, quick=False))


# -------------------------------------------------------------------------- pure helpers
def test_timing_summary():
    t = Timing.from_samples([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (t.median_ms, t.min_ms, t.max_ms, t.n) == (3.0, 1.0, 5.0, 5)
    assert t.p10_ms == pytest.approx(1.4) and t.p90_ms == pytest.approx(4.6)
    assert Timing.from_samples([2.5]).as_dict() == {
        "median_ms": 2.5, "min_ms": 2.5, "max_ms": 2.5, "p10_ms": 2.5, "p90_ms": 2.5, "n": 1}
    with pytest.raises(ValueError, match="no timing samples"):
        Timing.from_samples([])


@pytest.mark.parametrize("kwargs", [{"repeats": 0}, {"repeats": True}, {"warmup": -1}])
def test_time_cuda_rejects_bad_counts_before_touching_the_gpu(kwargs):
    with pytest.raises(ValueError):
        time_cuda(lambda: None, **kwargs)


def test_tf32_disabled_restores_the_settings_even_after_an_error():
    before = (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32)
    for matmul, cudnn in [("high", True), ("highest", False)]:
        torch.set_float32_matmul_precision(matmul)
        torch.backends.cudnn.allow_tf32 = cudnn
        try:
            with pytest.raises(RuntimeError), tf32_disabled():
                assert not torch.backends.cuda.matmul.allow_tf32
                assert not torch.backends.cudnn.allow_tf32
                raise RuntimeError("boom")
            assert torch.get_float32_matmul_precision() == matmul
            assert torch.backends.cudnn.allow_tf32 is cudnn
        finally:
            torch.set_float32_matmul_precision(before[0])
            torch.backends.cudnn.allow_tf32 = before[1]


def test_half_float64_rule():
    exact = torch.tensor([0.0, 0.5, -2.0, 3.0], dtype=torch.float64)
    torch_half = torch.tensor([0.0078, 0.5, -2.0, 3.0], dtype=torch.bfloat16)  # torch's error
    ok, error, note = report.half_float64_rule(torch_half, torch_half, exact)
    assert ok and note.startswith("0 of 4 elements")
    # Outside 1e-2 of torch's in one element, yet no further from float64 than torch's: passes.
    ours = torch.tensor([-0.0078, 0.5, -2.0, 3.0], dtype=torch.bfloat16)
    assert not torch.allclose(ours, torch_half, atol=report.HALF_TOL, rtol=report.HALF_TOL)
    ok, error, note = report.half_float64_rule(ours, torch_half, exact)
    assert ok and error == pytest.approx(0.0078, rel=1e-2) and note.startswith("1 of 4 elements")
    # Further than HALF_FLOAT64_FACTOR x torch's own error from float64, or NaN: fails.
    far = torch.tensor([0.0078 * (report.HALF_FLOAT64_FACTOR + 1), 0.5, -2.0, 3.0],
                       dtype=torch.bfloat16)
    assert not report.half_float64_rule(far, torch_half, exact)[0]
    nan = torch.tensor([0.0, float("nan"), -2.0, 3.0], dtype=torch.bfloat16)
    assert not report.half_float64_rule(nan, torch_half, exact)[0]


@pytest.mark.parametrize("correctness, tf32_off, half, verdict", [
    ((True, True), True, False, True), ((True, False), True, False, False),
    ((True, False), False, False, True), ((False, True), True, False, False),
    ((False, True), True, True, True), ((True, False), True, True, True),
    ((False, False), True, True, False)])
def test_run_verdict(correctness, tf32_off, half, verdict):
    entry = {"correctness": {"allclose_vs_fp32": correctness[0],
                             "allclose_vs_fp64": correctness[1]}, "tf32_off": tf32_off}
    assert main_job.passes(entry, half) is verdict


def test_format_table_aligns_columns():
    text = report.format_table([("name", "<"), ("ms", ">")], [["a", "1.5"], ["long", "10.25"]])
    assert text.splitlines() == ["name     ms", "a       1.5", "long  10.25"]
    assert report.fmt(None, ".2f") == "-" and report.fmt(1.234, ".2f") == "1.23"


def test_progress_in_a_log_prints_about_ten_lines():
    stream = io.StringIO()
    progress = report.Progress(95, stream=stream)
    for i in range(95):
        progress.step(f"item {i}")
    progress.close()
    lines = stream.getvalue().splitlines()
    assert 9 <= len(lines) <= 11
    assert lines[-1].startswith("[" + "#" * 30 + "] 95/95") and "\r" not in stream.getvalue()


# --------------------------------------------------------------------------- on a GPU
@requires_gpu
def test_run_and_bench_quick_end_to_end(tmp_path, capsys):
    run_json = tmp_path / "run.json"
    assert cli.main(["run", "--batch", "4", "--no-compile", "--repeats", "5", "--dtype",
                     "float32", "--json", str(run_json)]) == 0
    assert "all ModelNew outputs allclose" in capsys.readouterr().out.splitlines()[-2]
    result = json.loads(run_json.read_text())
    assert result["ok"] is True and set(result["problems"]) == {"p85", "p31"}
    for problem in result["problems"].values():
        assert problem["batch"] == 4
        entries = problem["implementations"]
        assert entries["torch_compile_fp32"]["note"] == "skipped (--no-compile)"
        ours = [e for e in entries.values() if e["kind"] == "scratchops"]
        assert ours
        for e in ours:
            assert e["correctness"]["allclose_vs_fp32"] is True
            assert e["correctness"]["allclose_vs_fp64"] is True
        for e in entries.values():
            if e["timing"] is not None:
                assert e["timing"]["n"] == 5 and e["timing"]["median_ms"] > 0
        assert all(all(r > 0 for r in ratios.values() if r is not None)
                   for ratios in problem["speedups"].values())

    # A half dtype: each problem under its own key, checked against torch in that dtype.
    assert cli.main(["run", "--batch", "4", "--no-compile", "--repeats", "5", "--dtype",
                     "float16", "--json", str(run_json)]) == 0
    result = json.loads(run_json.read_text())
    assert result["ok"] is True and set(result["problems"]) == {"p85_fp16", "p31_fp16"}
    for problem in result["problems"].values():
        assert problem["dtype"] == "float16"
        ours = [e for e in problem["implementations"].values() if e["kind"] == "scratchops"]
        assert ours and all(e["correctness"]["allclose_vs_fp32"] for e in ours)

    out_dir = tmp_path / "bench"
    assert cli.main(["bench", "--quick", "--out", str(out_dir)]) == 0
    for name in ("bench.json", "gemm.png", "memory_bound.png"):
        assert (out_dir / name).stat().st_size > 0
    data = json.loads((out_dir / "bench.json").read_text())
    assert data["ceilings"]["copy"]["value"] > 0
    assert all(data["ceilings"][f"gemm_{d}"]["value"] > 0 for d in report.DTYPES)
    assert {r["kernel"] for r in data["rows"]} == set(workloads.KERNELS)
    assert {r["dtype"] for r in data["rows"]} == set(report.DTYPES)
    for r in data["rows"]:
        assert r["ok"] is True, r
        assert r["ms"] > 0 and r["torch_ms"] > 0 and r["rate"] > 0, r
