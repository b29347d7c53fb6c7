"""scratchops: hand-written CUDA kernels for two KernelBench models, next to torch's own.

Public operators mirror torch.nn.functional (names and signatures); each runs a kernel from
cuda/*.cu through the registered operator torch.ops.scratchops.<name>. Importing never
needs a GPU; the first kernel call compiles the kernels (once) and needs a CUDA GPU, a
CUDA build of PyTorch and nvcc.
"""

from ._build import why_unavailable
from .ops import (
    DEFAULT_CONV_WORKSPACE_BYTES,
    DEFAULT_GEMM_VERSION,
    GEMM_VERSIONS,
    DEFAULT_IM2COL_VERSION,
    IM2COL_VERSIONS,
    clamp,
    conv2d,
    gemm,
    group_norm,
    group_norm_scale,
    im2col,
    max_pool2d,
    max_pool2d_clamp,
    min_add_mul,
    scale,
)

__version__ = "0.1.0"


def is_available() -> bool:
    """True when the kernels can be built and run here (CUDA GPU, CUDA torch, nvcc)."""
    return why_unavailable() is None


def load() -> None:
    """Compile (first time only) and load the kernels now, instead of on the first call."""
    from . import _build

    _build.load()


__all__ = [
    "DEFAULT_CONV_WORKSPACE_BYTES",
    "DEFAULT_GEMM_VERSION",
    "GEMM_VERSIONS",
    "DEFAULT_IM2COL_VERSION",
    "IM2COL_VERSIONS",
    "clamp",
    "conv2d",
    "gemm",
    "group_norm",
    "group_norm_scale",
    "im2col",
    "max_pool2d",
    "max_pool2d_clamp",
    "min_add_mul",
    "scale",
    "is_available",
    "load",
    "why_unavailable",
]
