"""scratchops: hand-written CUDA kernels for two KernelBench models, next to torch's own.

Public operators mirror torch.nn.functional (names and signatures); each runs a kernel from
cuda/*.cu through the registered operator torch.ops.scratchops.<name>, which exists (with
its fake implementation) on any machine. Importing never needs a GPU; the first kernel call
compiles the kernels (once) and needs a CUDA GPU, a CUDA build of PyTorch and nvcc.
"""

from ._build import why_unavailable
from .ops import (
    clamp,
    conv2d,
    conv2d_group_norm_pool_clamp,
    conv2d_min_add_mul,
    gemm,
    group_norm,
    group_norm_scale,
    im2col,
    max_pool2d,
    max_pool2d_clamp,
    min_add_mul,
    scale,
)
from .tensor_cores import (
    get_tensor_core_path,
    set_tensor_core_path,
    tensor_core_engine,
    tensor_core_path,
)
from .versions import (
    CONV2D_ALGORITHMS,
    CONV_GN_POOL_VERSIONS,
    DEFAULT_CONV2D_ALGORITHM,
    DEFAULT_CONV_GN_POOL_VERSION,
    DEFAULT_CONV_WORKSPACE_BYTES,
    DEFAULT_GEMM_VERSION,
    DEFAULT_GROUP_NORM_VERSION,
    DEFAULT_IM2COL_GEMM_VERSION,
    DEFAULT_IM2COL_VERSION,
    DEFAULT_MAX_POOL2D_VERSION,
    GEMM_VERSIONS,
    GROUP_NORM_VERSIONS,
    IM2COL_GEMM_VERSIONS,
    IM2COL_VERSIONS,
    MAX_POOL2D_VERSIONS,
    TENSOR_CORE_PATHS,
)

__version__ = "0.2.0"


def is_available() -> bool:
    """True when the kernels can be built and run here (CUDA GPU, CUDA torch, nvcc)."""
    return why_unavailable() is None


def load() -> None:
    """Compile (first time only) and load the kernels now, instead of on the first call."""
    from . import _build

    _build.load()


__all__ = [
    "CONV2D_ALGORITHMS",
    "CONV_GN_POOL_VERSIONS",
    "DEFAULT_CONV2D_ALGORITHM",
    "DEFAULT_CONV_GN_POOL_VERSION",
    "DEFAULT_CONV_WORKSPACE_BYTES",
    "DEFAULT_GEMM_VERSION",
    "DEFAULT_GROUP_NORM_VERSION",
    "DEFAULT_IM2COL_GEMM_VERSION",
    "DEFAULT_IM2COL_VERSION",
    "DEFAULT_MAX_POOL2D_VERSION",
    "GEMM_VERSIONS",
    "GROUP_NORM_VERSIONS",
    "IM2COL_GEMM_VERSIONS",
    "IM2COL_VERSIONS",
    "MAX_POOL2D_VERSIONS",
    "TENSOR_CORE_PATHS",
    "clamp",
    "conv2d",
    "conv2d_group_norm_pool_clamp",
    "conv2d_min_add_mul",
    "gemm",
    "group_norm",
    "group_norm_scale",
    "im2col",
    "max_pool2d",
    "max_pool2d_clamp",
    "min_add_mul",
    "scale",
    "get_tensor_core_path",
    "set_tensor_core_path",
    "tensor_core_engine",
    "tensor_core_path",
    "is_available",
    "load",
    "why_unavailable",
]
