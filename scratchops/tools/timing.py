"""GPU timing, the measured ceilings, and the TF32 switch shared by `scratchops run` and `bench`.

Every number scratchops reports comes from `time_cuda`: CUDA events around each call, with
the L2 cache flushed before each timed call so that no run profits from data a previous run
left in L2 (at P85/P31 sizes the tensors dwarf L2 anyway; at small sizes they would not).
The ceilings (`measure_copy_bandwidth`, `measure_gemm_tflops`) are measured on the GPU at
hand, not taken from a datasheet, so "% of ceiling" compares with what this GPU really does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import platform
import time
from collections.abc import Callable, Sequence

import torch

DEFAULT_WARMUP = 3
DEFAULT_REPEATS = 20


@dataclasses.dataclass(frozen=True)
class Timing:
    """Summary of n timed calls, in milliseconds (p10/p90: 10th and 90th percentiles)."""

    median_ms: float
    min_ms: float
    max_ms: float
    p10_ms: float
    p90_ms: float
    n: int

    @classmethod
    def from_samples(cls, samples_ms: Sequence[float]) -> Timing:
        if not samples_ms:
            raise ValueError("no timing samples")
        ordered = sorted(float(s) for s in samples_ms)
        return cls(median_ms=_percentile(ordered, 50), min_ms=ordered[0], max_ms=ordered[-1],
                   p10_ms=_percentile(ordered, 10), p90_ms=_percentile(ordered, 90),
                   n=len(ordered))

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _percentile(ordered: Sequence[float], q: float) -> float:
    """q-th percentile of sorted samples, interpolating linearly between neighbours."""
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


# One flush buffer per device, allocated on first use and kept: allocating it before every
# timed call would itself cost time and churn the caching allocator.
_flush_buffers: dict[int, torch.Tensor] = {}


def _l2_flush_buffer(device: torch.device) -> torch.Tensor:
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _flush_buffers:
        l2_bytes = torch.cuda.get_device_properties(index).L2_cache_size
        # Writing twice the L2 size evicts every line a timed call could otherwise reuse.
        _flush_buffers[index] = torch.empty(2 * l2_bytes, dtype=torch.uint8,
                                            device=torch.device("cuda", index))
    return _flush_buffers[index]


def time_cuda(fn: Callable[[], object], *, warmup: int = DEFAULT_WARMUP,
              repeats: int = DEFAULT_REPEATS, flush_l2: bool = True) -> Timing:
    """Time `fn()` on the current CUDA device and stream: `warmup` untimed calls, then
    `repeats` calls each bracketed by CUDA events, with L2 flushed before each one.

    The timed calls are queued back to back and synchronised once at the end, so the times
    are GPU execution times; host-side launch overhead shows only when it exceeds them.
    """
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive int, got {repeats!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be a non-negative int, got {warmup!r}")
    device = torch.device("cuda", torch.cuda.current_device())
    flush = _l2_flush_buffer(device) if flush_l2 else None
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize(device)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(repeats)]
    for start, end in events:
        if flush is not None:
            flush.zero_()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize(device)
    return Timing.from_samples([start.elapsed_time(end) for start, end in events])


def time_synchronized(fn: Callable[[], object], *, warmup: int = DEFAULT_WARMUP,
                      repeats: int = DEFAULT_REPEATS, flush_l2: bool = True,
                      host_in_full: bool = False) -> Timing:
    """Time `fn()` with CUDA events around each call and a synchronisation after each one.

    host_in_full=False is KernelBench's timer (its `time_execution_with_cuda_event`): the L2
    flush is queued and the start event recorded behind it, so the call's launches are
    queued while the flush still runs, and up to the flush's GPU time of the call's host
    time (Python, dispatch, launches) is hidden from the interval; only host time beyond it
    counts. host_in_full=True waits for the flush before the start event, so the call starts
    on an idle GPU and its whole host time is inside the interval: the latency a caller who
    waits for each result sees."""
    return time_synchronized_in_turns([fn], warmup=warmup, repeats=repeats, flush_l2=flush_l2,
                                      host_in_full=host_in_full)[0]


def time_synchronized_in_turns(fns: Sequence[Callable[[], object]], *,
                               warmup: int = DEFAULT_WARMUP, repeats: int = DEFAULT_REPEATS,
                               flush_l2: bool = True, host_in_full: bool = False) -> list[Timing]:
    """time_synchronized of each of `fns`, the calls taking turns: round r times every
    function once, starting at function r % len(fns), so that whatever changes over a run
    (the host's speed, the GPU's clocks) falls on all of them alike and none always follows
    the same one. A Timing per function, in the order given."""
    device = torch.device("cuda", torch.cuda.current_device())
    flush = _l2_flush_buffer(device) if flush_l2 else None
    for fn in fns:
        for _ in range(warmup):
            fn()
    torch.cuda.synchronize(device)
    samples: list[list[float]] = [[] for _ in fns]
    for r in range(repeats):
        for i in range(len(fns)):
            which = (r + i) % len(fns)
            if flush is not None:
                flush.zero_()
                if host_in_full:
                    torch.cuda.synchronize(device)
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fns[which]()
            end.record()
            torch.cuda.synchronize(device)
            samples[which].append(start.elapsed_time(end))
    return [Timing.from_samples(s) for s in samples]


def host_us_per_call(*fns: Callable[[], object], calls: int = 100,
                     rounds: int = 30) -> list[tuple[float, float]]:
    """(host µs, loop µs) of one call of each of `fns`, measured side by side.

    host: the CPU time of queueing a call, timed over rounds of `calls` calls that start on an
    idle GPU and stay well inside the launch queue, so that the host never waits for the GPU
    (rounds of thousands would time the GPU instead wherever it is the slower side); the
    fastest of `rounds` rounds, after a warm-up (other work on a shared host only adds time).
    The functions take turns round by round, so a slow spell of the host falls on all of
    them alike. loop: a call's share of a round of calls in a loop, between events on the
    GPU: the pace of the slower side, so above `host` exactly when the GPU's work for the call
    takes longer than the host's."""
    for fn in fns:
        for _ in range(calls):
            fn()
    torch.cuda.synchronize()
    per_round: list[list[float]] = [[] for _ in fns]
    for _ in range(rounds):
        for fn, times in zip(fns, per_round):
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            times.append((time.perf_counter() - start) / calls * 1e6)
            torch.cuda.synchronize()
    results = []
    for fn, times in zip(fns, per_round):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        results.append((min(times), begin.elapsed_time(end) / calls * 1e3))
    return results


@contextlib.contextmanager
def tf32_disabled():
    """Run the body with TF32 off for cuBLAS matmuls and cuDNN convolutions, then restore.

    fp32 results that must match scratchops' fp32 kernels within report.ATOL need true fp32
    arithmetic; TF32 keeps only 10 mantissa bits. The matmul setting is restored through
    torch's float32 matmul precision, which `allow_tf32` is a view of ('highest' = off).
    """
    matmul_precision = torch.get_float32_matmul_precision()
    cudnn_tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(matmul_precision)
        torch.backends.cudnn.allow_tf32 = cudnn_tf32


def tf32_settings() -> dict:
    """The TF32 switches in effect now (recorded next to results that depend on them)."""
    return {"cuda_matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32}


@dataclasses.dataclass(frozen=True)
class Ceiling:
    """A measured hardware ceiling: `value` in `unit`, from `timing` of the `what` workload."""

    value: float
    unit: str
    what: str
    timing: Timing

    def as_dict(self) -> dict:
        return {"value": self.value, "unit": self.unit, "what": self.what,
                "timing": self.timing.as_dict()}


def measure_copy_bandwidth(nbytes: int = 2**30, *, repeats: int = DEFAULT_REPEATS) -> Ceiling:
    """Device-to-device copy bandwidth in GB/s, counting the bytes read plus those written.

    A plain copy is the best a memory-bound kernel that reads and writes its data once can
    hope for, so it is the ceiling the memory-bound kernels are measured against.
    """
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").fill_(1)
    dst = torch.empty_like(src)
    timing = time_cuda(functools.partial(dst.copy_, src), repeats=repeats)
    del src, dst
    torch.cuda.empty_cache()
    gbps = 2 * nbytes / (timing.median_ms * 1e-3) / 1e9
    return Ceiling(gbps, "GB/s", f"dst.copy_(src), {nbytes / 2**30:g} GiB", timing)


def measure_gemm_tflops(dtype: torch.dtype = torch.float32, n: int = 8192, *,
                        repeats: int = DEFAULT_REPEATS) -> Ceiling:
    """torch.matmul of two n x n matrices of `dtype` (cuBLAS; fp32 with TF32 off: SGEMM), in
    TFLOP/s: the compute-bound kernels' ceiling in that dtype.

    The operands are random and never zero (uniform in [0.5, 1.5)): GPUs draw less power,
    and so may clock higher, when multiplying zeros, which would inflate the ceiling.
    """
    a = torch.rand(n, n, device="cuda").add_(0.5).to(dtype)
    b = torch.rand(n, n, device="cuda").add_(0.5).to(dtype)
    c = torch.empty(n, n, device="cuda", dtype=dtype)
    with tf32_disabled():
        timing = time_cuda(functools.partial(torch.matmul, a, b, out=c), repeats=repeats)
    del a, b, c
    torch.cuda.empty_cache()
    tflops = 2 * n**3 / (timing.median_ms * 1e-3) / 1e12
    what = "fp32 TF32 off" if dtype == torch.float32 else str(dtype).removeprefix("torch.")
    return Ceiling(tflops, "TFLOP/s", f"torch.matmul {what}, {n}^3", timing)


def environment() -> dict:
    """GPU and software versions, recorded with every result file."""
    import scratchops

    index = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    return {
        "gpu": props.name,
        "compute_capability": f"{props.major}.{props.minor}",
        "sm_count": props.multi_processor_count,
        "memory_gib": round(props.total_memory / 2**30, 1),
        "l2_cache_bytes": props.L2_cache_size,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "scratchops": scratchops.__version__,
        # the engine of the tensor-core kernels here (scratchops/tensor_cores.py)
        "tensor_core_engine": scratchops.tensor_core_engine(index),
        "python": platform.python_version(),
    }
