"""The benchmark plan of `scratchops bench`: for every kernel, a size sweep up to the two
problems' full-size tensors, each shape with its inputs, its torch counterpart and the
scratchops versions to time beside it (bench.py runs them). Each kernel's backward,
`<kernel>_backward`, runs on the same shapes: the gradients of every input of the forward,
given a random output gradient, beside torch's autograd on its counterpart (bench_backward.py
times them)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

import scratchops

from ..problems import PROBLEMS
from .bench_backward import BACKWARD_SUFFIX, backward_of
from .report import dims

# Names usable as `scratchops bench KERNEL ...`; each is also the scratchops function name.
COMPUTE_BOUND = ("gemm", "conv2d", "conv2d_min_add_mul", "conv2d_group_norm_pool_clamp")
MEMORY_BOUND = ("im2col", "group_norm", "scale", "group_norm_scale", "max_pool2d", "clamp",
                "max_pool2d_clamp", "min_add_mul")
FORWARD_KERNELS = ("gemm", "im2col", "conv2d", "conv2d_min_add_mul",
                   "conv2d_group_norm_pool_clamp", *MEMORY_BOUND[1:])
KERNELS = (*FORWARD_KERNELS, *(k + BACKWARD_SUFFIX for k in FORWARD_KERNELS))

QUICK_REPEATS = 5
# The naive GEMM (one thread per output, every operand from global memory: the slowest
# version by far, docs/notes.md) is timed only up to this many FLOP, so that its rows do not
# dominate the sweep: every square GEMM and the batch-8 problem shapes run, the full-size P31
# convolution (3e11 FLOP) gets a skipped row instead.
NAIVE_GEMM_VERSION = 1
NAIVE_MAX_FLOP = 2e11

# The sweeps end at the two problems' full-size tensors: their parameters come from the
# problem modules (KernelBench's values), not from a second copy here.
_P85, _P31 = PROBLEMS["p85"], PROBLEMS["p31"]
BATCH = _P85.batch_size
P85_IN, P85_OUT, P85_GROUPS = _P85.in_channels, _P85.out_channels, _P85.num_groups
P85_POOL, P85_CLAMP = _P85.maxpool_kernel_size, (_P85.clamp_min, _P85.clamp_max)
P31_IN, P31_OUT = _P31.in_channels, _P31.out_channels
P31_CONSTANT, P31_FACTOR = _P31.constant_value, _P31.scaling_factor
# torch's side of P31's minimum as KernelBench's Model writes it: torch.min with a 0-dim tensor
# (torch.minimum's gradient rule, half the gradient to each side of a tie).
P31_LIMIT = torch.tensor(P31_CONSTANT)
IMAGE, KERNEL_SIZE = _P85.height, _P85.kernel_size
assert (_P31.batch_size, _P31.height, _P31.kernel_size) == (BATCH, IMAGE, KERNEL_SIZE)
CONV_OUT = IMAGE - KERNEL_SIZE + 1  # 126: a 3x3 convolution without padding
GROUP_NORM_EPS = 1e-5


@dataclasses.dataclass
class Workload:
    """One shape of one kernel: how to make its inputs, the torch counterpart, our versions.

    `make_inputs` allocates the GPU tensors only when the workload runs, so a plan can be
    listed (and tested) without a GPU. `reference` and every entry of `versions` are called
    with the inputs as keyword arguments.
    """

    kernel: str
    shape: str
    make_inputs: Callable[[], dict]
    reference: Callable[..., torch.Tensor]
    versions: dict[str, Callable[..., torch.Tensor]]
    flop: float | None = None  # compute-bound; memory-bound rows count bytes instead
    note: str = ""
    skip: dict[str, str] = dataclasses.field(default_factory=dict)  # version -> why not run
    # A backward row: the forwards above build the graph, and what is timed is the gradient of
    # every input given an output gradient (`flop` then counts the backward's GEMMs).
    backward: bool = False


def _rand(*shape) -> torch.Tensor:
    # Compute-bound operands are uniform in [0, 1), like KernelBench's inputs: with no
    # cancellation the fp32 rounding of two summation orders stays well inside the
    # relative tolerance (report.RTOL), even for K = 4096.
    return torch.rand(shape, device="cuda")


def _randn(*shape) -> torch.Tensor:
    return torch.randn(shape, device="cuda")


def _randn_inputs(**shapes) -> Callable[[], dict]:
    """A make_inputs returning a standard-normal tensor of each named shape."""
    return lambda: {name: _randn(*shape) for name, shape in shapes.items()}


# --------------------------------------------------------------------------- workloads
def _gemm(a, b, bias, *, version):
    return scratchops.gemm(a, b, bias, version=version)


def _torch_gemm(a, b, bias):
    if b.dim() == 2:
        return torch.addmm(bias[:, None], a, b)
    return torch.baddbmm(bias[:, None], a.expand(b.shape[0], -1, -1), b)


def _versions(call, table: dict[int, str]) -> dict[str, Callable[..., torch.Tensor]]:
    """Every version of a kernel's version table as a `call(..., version=v)`, by name."""
    return {name: functools.partial(call, version=v) for v, name in table.items()}


def _gemm_versions(flop: float, call, table=None) -> tuple[dict, dict]:
    """Every GEMM version (of `table`, default all) as a `call(version=v)` partial, and
    which are skipped at `flop`."""
    table = scratchops.GEMM_VERSIONS if table is None else table
    versions = _versions(call, table)
    skip = {}
    if flop > NAIVE_MAX_FLOP and NAIVE_GEMM_VERSION in table:
        skip[table[NAIVE_GEMM_VERSION]] = (
            f"skipped: the naive GEMM is not timed above {NAIVE_MAX_FLOP:.0e} FLOP")
    if torch.cuda.is_available() and torch.cuda.get_device_capability() != (9, 0):
        for v in scratchops.versions.GEMM_WGMMA_VERSIONS:
            if v in table:
                skip[table[v]] = "skipped: runs on wgmma, an sm_90 GPU's"
    return versions, skip


def _gemm_workload(m: int, n: int, k: int, batch: int | None, note: str = "") -> Workload:
    """(M, K) @ (K, N) + bias, or with a batch of B matrices sharing the 2-D `a`."""
    b_shape = (k, n) if batch is None else (batch, k, n)
    flop = 2.0 * (batch or 1) * m * n * k
    versions, skip = _gemm_versions(flop, _gemm)
    shape = f"{m}x{n}x{k}" + ("" if batch is None else f" b{batch}")
    return Workload("gemm", shape,
                    lambda: {"a": _rand(m, k), "b": _rand(*b_shape), "bias": _rand(m)},
                    _torch_gemm, versions, flop=flop, note=note, skip=skip)


def gemm_workloads(quick: bool) -> list[Workload]:
    squares = (128, 256) if quick else (256, 512, 1024, 2048, 4096)
    work = [_gemm_workload(s, s, s, None) for s in squares]
    # The convolution GEMMs of the two problems, per image (M = out channels, K = in
    # channels x 3 x 3, N = 126 x 126 output pixels), a batch of images sharing the weights.
    batch = 2 if quick else 8
    work.append(_gemm_workload(P85_OUT, CONV_OUT**2, P85_IN * KERNEL_SIZE**2, batch,
                               "P85 conv GEMM"))
    if not quick:
        work.append(_gemm_workload(P31_OUT, CONV_OUT**2, P31_IN * KERNEL_SIZE**2, batch,
                                   "P31 conv GEMM"))
    return work


def _conv2d(input, weight, bias, *, version):  # noqa: A002 (F.conv2d's argument names)
    return scratchops.conv2d(input, weight, bias, algorithm="im2col_gemm", gemm_version=version)


def _conv2d_implicit(input, weight, bias):  # noqa: A002
    return scratchops.conv2d(input, weight, bias, algorithm="implicit_gemm")


def _conv2d_workload(batch: int, c_in: int, c_out: int, size: int, note: str = "") -> Workload:
    out = size - KERNEL_SIZE + 1
    flop = 2.0 * batch * c_out * c_in * KERNEL_SIZE**2 * out * out
    versions, skip = _gemm_versions(flop, _conv2d, scratchops.IM2COL_GEMM_VERSIONS)
    versions = {f"im2col+{name}": fn for name, fn in versions.items()}
    skip = {f"im2col+{name}": why for name, why in skip.items()}
    versions["implicit_gemm"] = _conv2d_implicit
    return Workload(
        "conv2d", f"{dims((batch, c_in, size, size))} -> {c_out} k{KERNEL_SIZE}",
        lambda: {"input": _rand(batch, c_in, size, size),
                 "weight": _rand(c_out, c_in, KERNEL_SIZE, KERNEL_SIZE) - 0.5,
                 "bias": _rand(c_out)},
        F.conv2d, versions, flop=flop, note=note, skip=skip)


def conv2d_workloads(quick: bool) -> list[Workload]:
    if quick:
        return [_conv2d_workload(2, P85_IN, P85_OUT, 32), _conv2d_workload(2, P31_IN, P31_OUT, 32)]
    return [_conv2d_workload(8, P85_IN, P85_OUT, IMAGE),
            _conv2d_workload(BATCH, P85_IN, P85_OUT, IMAGE, "P85 full size"),
            _conv2d_workload(8, P31_IN, P31_OUT, IMAGE),
            _conv2d_workload(BATCH, P31_IN, P31_OUT, IMAGE, "P31 full size")]


def p31_fused_workloads(quick: bool) -> list[Workload]:
    """P31 in one kernel against torch's four operators (fp32)."""
    batches = (2,) if quick else (8, BATCH)
    size = 32 if quick else IMAGE
    out = size - KERNEL_SIZE + 1
    work = []
    for n in batches:
        flop = 2.0 * n * P31_OUT * P31_IN * KERNEL_SIZE**2 * out * out
        work.append(Workload(
            "conv2d_min_add_mul", f"{dims((n, P31_IN, size, size))} -> {P31_OUT} k{KERNEL_SIZE}",
            lambda n=n: {"input": _rand(n, P31_IN, size, size),
                         "weight": _rand(P31_OUT, P31_IN, KERNEL_SIZE, KERNEL_SIZE) - 0.5,
                         "conv_bias": _rand(P31_OUT), "bias": _randn(P31_OUT, 1, 1)},
            lambda input, weight, conv_bias, bias: (torch.min(
                F.conv2d(input, weight, conv_bias), P31_LIMIT) + bias) * P31_FACTOR,
            {"one_kernel": lambda input, weight, conv_bias, bias: scratchops.conv2d_min_add_mul(
                input, weight, conv_bias, P31_CONSTANT, bias, P31_FACTOR)},
            flop=flop, note="P31 full size" if n == BATCH else ""))
    return work


def p85_one_pass_workloads(quick: bool) -> list[Workload]:
    """P85 in one pass against torch's five operators (fp32)."""
    batches = (2,) if quick else (8, BATCH)
    size = 32 if quick else IMAGE
    out = size - KERNEL_SIZE + 1
    groups, pool, (lo, hi), eps = P85_GROUPS, P85_POOL, P85_CLAMP, GROUP_NORM_EPS
    work = []
    for n in batches:
        flop = 2.0 * n * P85_OUT * P85_IN * KERNEL_SIZE**2 * out * out
        work.append(Workload(
            "conv2d_group_norm_pool_clamp",
            f"{dims((n, P85_IN, size, size))} -> {P85_OUT} k{KERNEL_SIZE}",
            lambda n=n: {"input": _rand(n, P85_IN, size, size),
                         "weight": _rand(P85_OUT, P85_IN, KERNEL_SIZE, KERNEL_SIZE) - 0.5,
                         "conv_bias": _rand(P85_OUT), "gamma": _randn(P85_OUT),
                         "beta": _randn(P85_OUT), "s": _randn(P85_OUT, 1, 1)},
            lambda input, weight, conv_bias, gamma, beta, s: torch.clamp(F.max_pool2d(
                F.group_norm(F.conv2d(input, weight, conv_bias), groups, gamma, beta, eps) * s,
                pool), lo, hi),
            _versions(lambda input, weight, conv_bias, gamma, beta, s, version:
                      scratchops.conv2d_group_norm_pool_clamp(input, weight, conv_bias, groups,
                                                              gamma, beta, s, eps, lo, hi,
                                                              version=version),
                      scratchops.CONV_GN_POOL_VERSIONS),
            flop=flop, note="P85 full size" if n == BATCH else ""))
    return work


def _memory_workload(kernel: str, shape: Sequence[int], make_inputs, reference, ours,
                     note: str = "", table: dict[int, str] | None = None) -> Workload:
    """ours: the scratchops function, taking `version=` when the kernel has a version table
    (then one row per version)."""
    versions = {"scratchops": ours} if table is None else _versions(ours, table)
    return Workload(kernel, dims(shape), make_inputs, reference, versions, note=note)


def im2col_workloads(quick: bool) -> list[Workload]:
    if quick:
        shapes = [(2, P85_IN, 32, 32), (2, P31_IN, 32, 32)]
    else:
        # P85's full batch; P31's full one would be a 4.7 GB column matrix (scratchops.conv2d
        # builds it in chunks), so a few images.
        shapes = [(8, P85_IN, IMAGE, IMAGE), (BATCH, P85_IN, IMAGE, IMAGE),
                  (2, P31_IN, IMAGE, IMAGE), (8, P31_IN, IMAGE, IMAGE)]
    versions = _versions(_im2col, scratchops.IM2COL_VERSIONS)
    return [Workload("im2col", dims(s), _randn_inputs(x=s), lambda x: F.unfold(x, KERNEL_SIZE),
                     versions, note=f"k{KERNEL_SIZE}") for s in shapes]


def _im2col(x, *, version):
    return scratchops.im2col(x, KERNEL_SIZE, version=version)


def _activation_shapes(channels: int, quick: bool) -> list[tuple[int, ...]]:
    """From ~4 MB (one image) up to the full-size convolution output of the problems."""
    if quick:
        return [(1, channels, 32, 32), (2, channels, 64, 64)]
    return [(n, channels, CONV_OUT, CONV_OUT) for n in (1, 8, 32, BATCH)]


def p85_workloads(kernel: str, quick: bool) -> list[Workload]:
    """The P85 epilogue ops, on activations shaped like P85's convolution output."""
    groups, pool, (lo, hi), eps = P85_GROUPS, P85_POOL, P85_CLAMP, GROUP_NORM_EPS
    gn_versions, pool_versions = scratchops.GROUP_NORM_VERSIONS, scratchops.MAX_POOL2D_VERSIONS
    # kernel -> (its parameters, torch's version, ours, ours' version table or None)
    ops = {
        "group_norm": (
            ("weight", "bias"),
            lambda x, weight, bias: F.group_norm(x, groups, weight, bias, eps),
            lambda x, weight, bias, version: scratchops.group_norm(
                x, groups, weight, bias, eps=eps, version=version), gn_versions),
        "scale": (("s",), lambda x, s: x * s, lambda x, s: scratchops.scale(x, s), None),
        "group_norm_scale": (
            ("weight", "bias", "s"),
            lambda x, weight, bias, s: F.group_norm(x, groups, weight, bias, eps) * s,
            lambda x, weight, bias, s, version: scratchops.group_norm_scale(
                x, groups, weight, bias, s, eps=eps, version=version), gn_versions),
        "max_pool2d": ((), lambda x: F.max_pool2d(x, pool),
                       lambda x, version: scratchops.max_pool2d(x, pool, version=version),
                       pool_versions),
        "clamp": ((), lambda x: torch.clamp(x, lo, hi), lambda x: scratchops.clamp(x, lo, hi),
                  None),
        "max_pool2d_clamp": ((), lambda x: torch.clamp(F.max_pool2d(x, pool), lo, hi),
                             lambda x, version: scratchops.max_pool2d_clamp(
                                 x, pool, min=lo, max=hi, version=version), pool_versions),
    }
    names, reference, ours, table = ops[kernel]
    note = f"k{pool}" if "pool" in kernel else ""
    # weight and bias are per channel (C,), the scale is (C, 1, 1) as in P85.
    param_shapes = {"weight": (P85_OUT,), "bias": (P85_OUT,), "s": (P85_OUT, 1, 1)}
    return [_memory_workload(kernel, s,
                             _randn_inputs(x=s, **{n: param_shapes[n] for n in names}),
                             reference, ours, note, table)
            for s in _activation_shapes(P85_OUT, quick)]


def min_add_mul_workloads(quick: bool) -> list[Workload]:
    """P31's epilogue, min(x, constant) + bias, times factor, on P31's convolution output."""
    constant, factor = P31_CONSTANT, P31_FACTOR
    return [_memory_workload(
        "min_add_mul", s, _randn_inputs(x=s, bias=(P31_OUT, 1, 1)),
        lambda x, bias: (torch.min(x, P31_LIMIT) + bias) * factor,
        lambda x, bias: scratchops.min_add_mul(x, constant, bias, factor))
        for s in _activation_shapes(P31_OUT, quick)]


def plan(kernels: Sequence[str], quick: bool) -> list[Workload]:
    """The workloads of the given kernels, in KERNELS order, each kernel's smallest first."""
    forward = [k for k in FORWARD_KERNELS if k in kernels]
    backward = [k for k in FORWARD_KERNELS if k + BACKWARD_SUFFIX in kernels]
    return _forward_plan(forward, quick) + [backward_of(w) for w in _forward_plan(backward, quick)]


def _forward_plan(kernels: Sequence[str], quick: bool) -> list[Workload]:
    builders = {"gemm": gemm_workloads, "im2col": im2col_workloads,
                "conv2d": conv2d_workloads, "min_add_mul": min_add_mul_workloads,
                "conv2d_min_add_mul": p31_fused_workloads,
                "conv2d_group_norm_pool_clamp": p85_one_pass_workloads}
    workloads = []
    for kernel in FORWARD_KERNELS:
        if kernel in builders and kernel in kernels:
            workloads.extend(builders[kernel](quick))
        elif kernel in kernels:  # the P85 epilogue ops
            workloads.extend(p85_workloads(kernel, quick))
    return workloads


