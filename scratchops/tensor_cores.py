"""Which engine runs the fp32-accurate tensor-core operators (gemm version 9, conv2d's
implicit GEMM, conv2d_min_add_mul, conv2d_group_norm_pool_clamp and the ModelNew variants on
them).

Two engines compute the same product from the same packed operands (cuda/launchers.h):
  "wgmma"     Hopper's warpgroup MMA, a bulk-copy ring and warp specialisation
              (cuda/tf32x3.cuh): an sm_90 GPU (H100, H200);
  "mma_sync"  the warp-level mma.sync (cuda/mma_sync_3xtf32.cuh): any sm_80 or later GPU
              (A100, RTX 30/40, L4, L40, and sm_90 too).
"auto" (the default) takes the faster one the GPU has: wgmma on sm_90, mma_sync elsewhere.
Forcing one is how an H100 tests the sm_80 path. The setting is process-wide and read at each
call, like torch's TF32 switches; it lives in the compiled extension, so setting it builds and
loads the kernels first.
"""

from __future__ import annotations

import contextlib

import torch

from . import _build
from .versions import DEFAULT_TENSOR_CORE_PATH, TENSOR_CORE_PATHS


def set_tensor_core_path(path: str) -> None:
    """Run the tensor-core operators on `path`: "auto", "wgmma" or "mma_sync" (see above). A
    forced engine the GPU lacks makes those calls raise, naming it."""
    if path not in TENSOR_CORE_PATHS:
        raise ValueError(f"the tensor-core path must be one of {list(TENSOR_CORE_PATHS)}, "
                         f"got {path!r}")
    _build.ops().set_tensor_core_path(path)


def get_tensor_core_path() -> str:
    """The current setting ("auto" unless set_tensor_core_path changed it)."""
    return _build.ops().get_tensor_core_path() if _build.loaded() else DEFAULT_TENSOR_CORE_PATH


@contextlib.contextmanager
def tensor_core_path(path: str):
    """set_tensor_core_path(path) for the body of a with statement, then the setting before."""
    before = get_tensor_core_path()
    set_tensor_core_path(path)
    try:
        yield
    finally:
        set_tensor_core_path(before)


def tensor_core_engine(device=None) -> str:
    """The engine a tensor-core call on `device` (default: the current CUDA device) runs on
    under the current setting: "wgmma", "mma_sync", or "none" where it cannot run."""
    index = None if device is None else torch.device(device).index
    return _build.ops().tensor_core_engine(torch.cuda.current_device() if index is None
                                           else index)
