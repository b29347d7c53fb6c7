"""The numbered kernel versions and algorithms, defined once (the kernel files' headers
describe each; the CLI, the benchmarks, the fakes and the tests read these tables)."""

# GEMM versions (cuda/gemm.cu). 5 runs on the tensor cores of an sm_90 GPU (H100, H200).
GEMM_VERSIONS = {1: "naive", 2: "shared_tiles", 3: "register_tiles", 4: "pipelined",
                 5: "tensor_cores_3xtf32"}
GEMM_TENSOR_CORE_VERSION = 5
DEFAULT_GEMM_VERSION = GEMM_TENSOR_CORE_VERSION
# The versions conv2d's im2col + gemm path can use (v5 belongs to the implicit GEMM instead).
IM2COL_GEMM_VERSIONS = {v: name for v, name in GEMM_VERSIONS.items()
                        if v != GEMM_TENSOR_CORE_VERSION}
DEFAULT_IM2COL_GEMM_VERSION = 4
# im2col versions (cuda/conv_im2col.cu); conv2d's im2col path uses v2.
IM2COL_VERSIONS = {1: "per_element", 2: "per_row"}
DEFAULT_IM2COL_VERSION = 2
# group norm versions (cuda/groupnorm.cu): how the statistics are computed.
GROUP_NORM_VERSIONS = {1: "two_pass", 2: "welford"}
DEFAULT_GROUP_NORM_VERSION = 2
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
