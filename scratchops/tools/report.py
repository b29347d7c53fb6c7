"""What `scratchops run` and `scratchops bench` share to report results: the tolerance (defined
once: the one that decides is the one printed), the comparison with torch, table and number
formatting, the JSON envelope and a progress bar."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from datetime import datetime, timezone

import torch

# KernelBench's tolerance: allclose(atol, rtol) against torch fp32.
ATOL = RTOL = 1e-4
# KernelBench's tolerance in fp16 and bf16 (atol = rtol), against torch in the same dtype.
HALF_TOL = 1e-2
# fp16 / bf16: torch's own result in the dtype is KernelBench's reference, yet two correct
# half implementations of a chain can differ by more than HALF_TOL: where a convolution's sum
# lies next to a rounding tie, a sum in another order rounds to the neighbouring half value,
# the chain's next rounding can double that step, and a cancellation (P31: + bias) leaves the
# two steps against a near-zero result (P31 in bf16: a few of its 260 million outputs, fewer
# than the float64 result rounded once has: docs/notes.md, "Half precision"). It passes
# when its largest error against float64 is within this factor of torch's own half result's.
HALF_FLOAT64_FACTOR = 2
# The dtypes `run --dtype` and `bench --dtype` cover, by name, in run order.
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def tolerance(dtype: torch.dtype) -> float:
    """KernelBench's atol = rtol for results in `dtype`."""
    return ATOL if dtype == torch.float32 else HALF_TOL


def compare(out: torch.Tensor, expected: torch.Tensor,
            tol: float | None = None) -> tuple[bool, float | None, str]:
    """(allclose at atol = rtol = tol (default: KernelBench's for out's dtype), max |out -
    expected| or None when not finite, a note) for one output."""
    if out.shape != expected.shape or out.dtype != expected.dtype:
        return False, None, (f"output {tuple(out.shape)} {out.dtype} differs from torch's "
                             f"{tuple(expected.shape)} {expected.dtype}")
    max_err = (out.float() - expected.float()).abs().max().item()
    tol = tolerance(out.dtype) if tol is None else tol
    ok = torch.allclose(out, expected, atol=tol, rtol=tol)
    if not math.isfinite(max_err):
        return False, None, "output has NaN or Inf"
    return ok, max_err, ""


def half_float64_rule(out: torch.Tensor, expected: torch.Tensor,
                      exact: torch.Tensor) -> tuple[bool, float, str]:
    """For an fp16 / bf16 `out` against torch's `expected` in the same dtype and the float64
    result `exact`: (max |out - exact| <= HALF_FLOAT64_FACTOR x max |expected - exact|, that
    error, a note saying how many elements are outside KernelBench's tolerance of torch's and
    both errors). NaN where float64 has none fails."""
    tol = tolerance(out.dtype)
    outside = (~torch.isclose(out, expected, atol=tol, rtol=tol, equal_nan=True)).sum().item()
    ours = (out.double() - exact).abs().max().item()
    torch_error = (expected.double() - exact).abs().max().item()
    ok = ours <= HALF_FLOAT64_FACTOR * torch_error
    note = (f"{outside} of {out.numel()} elements not allclose to torch's; max error against "
            f"float64 {ours:.2e}, torch's {torch_error:.2e}: "
            + ("within" if ok else "more than") + f" {HALF_FLOAT64_FACTOR}x")
    return ok, ours, note


def compare_gradient(out: torch.Tensor, expected: torch.Tensor) -> tuple[bool, float | None, str]:
    """compare() for a gradient: allclose at rtol = tol and atol = tol times the larger of 1
    and the expected gradient's largest magnitude (tol: KernelBench's for out's dtype). A
    gradient such as a weight's sums over the batch and the plane, so its small entries are
    differences of entries as large as that sum: an absolute tolerance that does not grow
    with it would hold them to a precision no sum in that dtype has."""
    ok, max_err, note = compare(out, expected)
    if not ok and max_err is not None:
        tol = tolerance(out.dtype)
        scale = max(1.0, expected.float().abs().max().item())
        ok = torch.allclose(out.float(), expected.float(), rtol=tol, atol=tol * scale)
    return ok, max_err, note


def first_line(exc: BaseException) -> str:
    """'ExceptionType: first line of its message', short enough for a table cell."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def dims(shape: Sequence[int]) -> str:
    """(128, 64, 126, 126) -> '128x64x126x126'."""
    return "x".join(str(s) for s in shape)


def format_table(columns: Sequence[tuple[str, str]], rows: Sequence[Sequence[str]]) -> str:
    """Plain-text table; `columns` are (header, '<' or '>') for left or right alignment."""
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, (h, _) in enumerate(columns)]
    lines = ["  ".join(f"{h:{a}{w}}" for (h, a), w in zip(columns, widths)).rstrip()]
    for row in rows:
        lines.append("  ".join(f"{c:{a}{w}}" for c, (_, a), w in zip(row, columns, widths))
                     .rstrip())
    return "\n".join(lines)


def fmt(value, spec: str) -> str:
    """`value` formatted with `spec`, or '-' for a missing value."""
    return "-" if value is None else format(value, spec)


def envelope(command: str, environment: dict, settings: dict, **body) -> dict:
    """The JSON document of a run: the command, when, the machine, the settings, the results."""
    return {"command": command,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "environment": environment, "settings": {**settings, "atol": ATOL, "rtol": RTOL},
            **body}


class Progress:
    """A dependency-free progress bar on stderr.

    On a terminal it redraws one line; otherwise (a log, a remote run that keeps only the
    tail of the output) it prints a line per tenth of the work, so the log stays short.
    """

    def __init__(self, total: int, stream=None, width: int = 30):
        self.total, self.done, self.width = max(total, 1), 0, width
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty()
        self.started = time.monotonic()
        self._last_tenth = 0

    def step(self, label: str) -> None:
        self.done += 1
        filled = self.width * self.done // self.total
        elapsed = time.monotonic() - self.started
        line = (f"[{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total} "
                f"{elapsed:5.0f}s {label}")
        if self.tty:
            self.stream.write("\r\033[K" + line)
        else:
            tenth = 10 * self.done // self.total
            if tenth == self._last_tenth and self.done != self.total:
                return
            self._last_tenth = tenth
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
