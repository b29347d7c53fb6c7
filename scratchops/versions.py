"""The numbered kernel versions and algorithms, defined once (the kernel files' headers
describe each; the CLI, the benchmarks, the fakes and the tests read these tables)."""

# GEMM versions (cuda/gemm.cu): 1-4 on the CUDA cores, 5-9 fp32-accurate on the tensor cores
# (3xTF32): 5 on mma.sync (sm_80+), 6-8 on Hopper's wgmma (sm_90), 9 on the engine
# scratchops.tensor_core_path picks (wgmma on sm_90, v5's mma.sync elsewhere).
GEMM_VERSIONS = {1: "naive", 2: "shared_tiles", 3: "register_tiles", 4: "pipelined",
                 5: "mma_sync", 6: "wgmma", 7: "bulk_copy_ring", 8: "warp_specialised",
                 9: "persistent"}
GEMM_FIRST_TENSOR_CORE_VERSION = 5
GEMM_TENSOR_CORE_VERSION = 9
GEMM_WGMMA_VERSIONS = (6, 7, 8)
# gemm's default, version=None: the faster of v4 and v9 for the shape, v9 where the GPU has
# tensor cores and A has at least GEMM_TENSOR_CORE_MIN_ROWS rows (binding.cpp decides; its
# home is cuda/launchers.h, kGemmTensorCoreMinRows, and tests/test_library.py holds this
# copy equal).
DEFAULT_GEMM_VERSION = None
GEMM_TENSOR_CORE_MIN_ROWS = 256
# The versions conv2d's im2col + gemm path can use: the CUDA-core ones (the tensor cores'
# convolution is the implicit GEMM instead).
IM2COL_GEMM_VERSIONS = {v: name for v, name in GEMM_VERSIONS.items()
                        if v < GEMM_FIRST_TENSOR_CORE_VERSION}
DEFAULT_IM2COL_GEMM_VERSION = 4
# im2col versions (cuda/conv_im2col.cu); conv2d's im2col path uses v2.
IM2COL_VERSIONS = {1: "per_element", 2: "per_row"}
DEFAULT_IM2COL_VERSION = 2
# group norm versions (cuda/groupnorm.cu): how the statistics are computed.
GROUP_NORM_VERSIONS = {1: "two_pass", 2: "welford"}
DEFAULT_GROUP_NORM_VERSION = 2
# P85 in one pass (conv2d_group_norm_pool_clamp, cuda/conv_gn_pool.cuh): 1 = the idea on the
# CUDA cores (a direct convolution whose threads keep statistics and window extremes; any
# GPU); 2 = the implicit-GEMM convolution on either tensor-core engine with an epilogue that
# keeps them; 3 = a kernel of its own that stages each tile's input halo (wgmma engine,
# Cin <= 8, at most 12 taps, TF32 off; where it does not cover the call, version 3 runs
# version 2).
CONV_GN_POOL_VERSIONS = {1: "cuda_cores", 2: "engine_epilogue", 3: "halo_tiles"}
CONV_GN_POOL_CUDA_CORE_VERSION = 1  # (cuda/launchers.h: kConvGnPoolCudaCoreVersion)
DEFAULT_CONV_GN_POOL_VERSION = 3
# max pool versions (cuda/pool_clamp.cu), of max_pool2d and max_pool2d_clamp: how threads map
# onto the output.
MAX_POOL2D_VERSIONS = {1: "output_grid", 2: "flat"}
DEFAULT_MAX_POOL2D_VERSION = 2
# conv2d algorithms: the name a caller passes, the number the operator takes.
CONV2D_ALGORITHMS = {"im2col_gemm": 0, "implicit_gemm": 1}
DEFAULT_CONV2D_ALGORITHM = "implicit_gemm"
# conv2d's im2col path builds its column matrix in chunks of at most this many bytes (P31 at
# full size would need a 4.7 GB column matrix in one piece).
DEFAULT_CONV_WORKSPACE_BYTES = 256 * 2**20
# The backward of a convolution whose forward ran on the tensor cores (the implicit GEMM, P31's
# one kernel, P85's one pass from version 2) runs there too (cuda/conv_backward.cu, v2): its
# weight gradient works over chunks of images in a workspace of at most this many bytes, large
# enough for P31's chunks to give hundreds of tiles to each launch.
TENSOR_CORE_GRAD_WORKSPACE_BYTES = 2**30

# The engines of the tensor-core operators (scratchops/tensor_cores.py): "auto" picks wgmma on an
# sm_90 GPU and mma_sync on other sm_80+ GPUs; the other two force one. (binding.cpp takes these
# names; tests/test_library.py holds the two lists equal.)
TENSOR_CORE_PATHS = ("auto", "wgmma", "mma_sync")
DEFAULT_TENSOR_CORE_PATH = "auto"

# When torch allows TF32 for convolutions (torch.backends.cudnn.allow_tf32, or
# torch.backends.cudnn.conv.fp32_precision = "tf32"), cuDNN still computes some shapes in fp32:
# it picks an algorithm per shape. scratchops follows it with one rule, the simple one that
# agreed best with cuDNN over a grid and a fuzz of shapes (docs/tf32.md): a convolution whose
# reduction Cin * kh * kw is at least TF32_MIN_REDUCTION computes one TF32 product per fp32
# product, the rest fp32-accurate. (Its home is cuda/launchers.h, kTf32MinReduction, where the
# kernels apply it; tests/test_call_path.py holds this copy equal.) gemm follows torch's matmul
# switch (torch.backends.cuda.matmul.allow_tf32, set_float32_matmul_precision) for every shape.
TF32_MIN_REDUCTION = 128


def conv2d_uses_tf32(in_channels: int, kernel_h: int, kernel_w: int, allowed: bool) -> bool:
    """Whether scratchops computes such a convolution in TF32 when torch's switch is
    `allowed` (the rule above)."""
    return allowed and in_channels * kernel_h * kernel_w >= TF32_MIN_REDUCTION
