// gemm.cu — GEMM: C = A @ B (+ a bias per row of C), row-major, strided-batched.
//
// Element types: float, fp16 and bf16 (element.cuh), one type for A, B, bias and C. The
// arithmetic and the accumulation are in float whatever the type: operands are widened as
// they are read (v2-v4 stage float tiles in shared memory; v5-v9 pack B as float TF32 parts,
// the same bytes for every type), and C is rounded to its type once, as it is stored.
//
// Versions, one idea each, simplest first (the progression of siboehm/SGEMM_CUDA, then of
// ThunderKittens' educational H100 kernels), each in its own file: gemm_v1_naive.cuh ..
// gemm_v4_pipelined.cuh on the CUDA cores (what they share: gemm_common.cuh), v5 to v9 on the
// tensor cores (gemm_tensor_cores.cuh lists their files); this file holds the dispatch:
// workspaces, TF32 rounding, grid-sized pieces, the launch.
//   v1 naive             one thread per element of C, every operand from global memory
//   v2 shared_tiles      tiles of A and B staged in shared memory, each loaded once per block
//   v3 register_tiles    an 8x8 patch of C per thread, in registers, fed by float4 shared loads
//   v4 pipelined         the next k-step's tiles loaded while the current ones multiply
//   v5 mma_sync          the tensor cores (mma.sync, sm_80+), fp32-accurate by the 3xTF32 split
//   v6 wgmma             Hopper's warpgroup product, B read from shared memory by the tensor
//                        cores (sm_90a, as v7 to v9)
//   v7 bulk_copy_ring    B by the copy engine into a ring of stages guarded by mbarriers
//   v8 warp_specialised  a producer warpgroup feeds the ring, two consumer warpgroups let
//                        their wgmmas run on across k-steps; registers moved to the consumers
//   v9 persistent        one CTA per multiprocessor walks the tiles, its loads running into
//                        the next tile (the default on the tensor cores)
//
// How each works:
//   v1 naive           One thread per element of C reads its row of A and its column of B
//                      straight from global memory: two loads per multiply-add. threadIdx.x
//                      runs along N, so a warp's B loads and C stores are coalesced and its
//                      A loads are one broadcast address.
//   v2 shared_tiles    A 32x32 block stages a 32x32 tile of A and of B in shared memory per
//                      step of k, so each global element is loaded once per block instead of
//                      once per thread: 32x fewer global loads. Still one output per thread,
//                      so each multiply-add costs two shared-memory loads.
//   v3 register_tiles  Each thread computes an 8x8 patch of C held in registers, from 8 values
//                      of A and 8 of B per k: 64 multiply-adds per 4 float4 shared loads. A is
//                      stored transposed (k-major, padded) in shared memory so that a thread's
//                      8 rows of A are contiguous like its 8 columns of B. The block tile is
//                      128x128 (256 threads), or 64x128 (128 threads) when M <= 64, so a
//                      64-row problem such as P85's convolution does not waste half a block.
//   v4 pipelined       v3's tiles and thread patches, with the next k-step's tiles loaded from
//                      global memory (4-element loads where aligned) into registers while the
//                      current ones are multiplied, then stored to the other of two shared
//                      buffers: the loads' latency hides behind 512 multiply-adds a thread,
//                      and one barrier per k-step instead of two.
//   v5 to v9           fp32-accurate on the tensor cores (3xTF32): each fp32 operand is split
//                      into two TF32 parts and each product is carried by three TF32
//                      products; B is packed once per call into the exact shared-memory
//                      tiles, A goes from global memory straight to registers. The engines and
//                      their reasons: tf32x3.cuh (wgmma) and mma_sync_3xtf32.cuh; each step's
//                      idea at the top of its file. They need a workspace for the packed B
//                      (gemm_workspace_bytes); v5 an sm_80+ GPU, v6 to v8 an sm_90 one; v9
//                      runs on the engine the call names (v5's kernel on mma.sync).

// TF32 (GemmArgs::tf32, when torch allows TF32 for matmuls; float only): v5-v9 run the
// engines' one-product TF32 mode; v1-v4 multiply copies of A and B rounded to TF32
// (tf32_round.cu) in fp32. The half types need neither: every fp16 and bf16 value is a TF32
// value, so v1-v4's fp32 products of them are exact, and v5-v9 always take the one-product
// mode (launchers.h, tensor_cores_single_product).
//
// Every version handles any M, N, K >= 1 (edges are zero-filled on load and masked on
// store) and any leading dimensions, and fuses the optional per-row bias into the store.
// Index math is 32-bit inside one matrix (the caller guarantees each matrix holds fewer
// than 2^31 elements); the batch offset is 64-bit.


#include <type_traits>

#include "gemm_common.cuh"
#include "gemm_v1_naive.cuh"
#include "gemm_v2_shared_tiles.cuh"
#include "gemm_v3_register_tiles.cuh"
#include "gemm_v4_pipelined.cuh"
#include "gemm_tensor_cores.cuh"
#include "launchers.h"

namespace scratchops {
namespace {

int max_rows_per_launch(int version) {
    const int tile_rows = version == 1 ? kNaiveBlock : version == 2 ? kTile : 128;
    return kMaxGridYZ * tile_rows;
}

// The tensor-core versions; with K = 0 the product is the bias alone, which v1 writes.
template <class T>
bool uses_tensor_cores(int version, const GemmArgs<T>& g) {
    return version >= kGemmFirstTensorCoreVersion && g.K > 0;
}

// The elements a strided batch of rows x cols matrices spans from its first (ld: leading
// dimension; batch_stride 0: one matrix for every entry).
long long span(int rows, int cols, int ld, long long batch_stride, int batch) {
    if (rows == 0 || cols == 0) return 0;
    return (batch_stride != 0 ? (batch - 1) * batch_stride : 0) +
           static_cast<long long>(rows - 1) * ld + cols;
}

// TF32 on the CUDA cores (v1-v4, float only): the operands rounded to TF32 into the
// workspace, A's span first, then B's (16-byte aligned), multiplied as usual.
struct RoundedOperands {
    long long a_floats, b_offset, b_floats;  // B's copy starts b_offset floats in
    explicit RoundedOperands(const GemmArgs<float>& g)
        : a_floats(span(g.M, g.K, g.lda, g.stride_a, g.batch)),
          b_offset((a_floats + 3) / 4 * 4),
          b_floats(span(g.K, g.N, g.ldb, g.stride_b, g.batch)) {}
    long long bytes() const { return 4 * (b_offset + b_floats); }
};

// v1-v4 on copies of A and B rounded to TF32 in the workspace (RoundedOperands).
cudaError_t launch_rounded_to_tf32(int version, const GemmArgs<float>& g, void* workspace,
                                   long long workspace_bytes, cudaStream_t stream) {
    const RoundedOperands r(g);
    if (workspace_bytes < r.bytes()) return cudaErrorInvalidValue;
    GemmArgs<float> rounded = g;
    auto* a = static_cast<float*>(workspace);
    rounded.A = a;
    rounded.B = a + r.b_offset;
    rounded.tf32 = false;
    cudaError_t err = tf32_round_launch(g.A, a, r.a_floats, stream);
    if (err == cudaSuccess) err = tf32_round_launch(g.B, a + r.b_offset, r.b_floats, stream);
    return err != cudaSuccess ? err : gemm_launch(version, rounded, nullptr, 0, stream);
}

}  // namespace

template <class T>
long long gemm_workspace_bytes(int version, const GemmArgs<T>& g, long long budget) {
    if (!uses_tensor_cores(version, g)) {
        if constexpr (std::is_same_v<T, float>)
            return g.tf32 ? RoundedOperands(g).bytes() : 0;
        else
            return 0;  // (tf32 is float's alone: the half types' products are exact)
    }
    using gemm_tc::tc_layout;
    const long long all = tc_layout(g.N, g.K, g.stride_b == 0 ? 1 : g.batch).bytes();
    const long long one = tc_layout(g.N, g.K, 1).bytes();
    return all <= budget ? all : (one > budget ? one : budget);
}

template <class T>
cudaError_t gemm_launch(int version, const GemmArgs<T>& g, void* workspace,
                        long long workspace_bytes, cudaStream_t stream) {
    if (uses_tensor_cores(version, g))
        return launch_tensor_cores(version, g, workspace, workspace_bytes, stream);
    if (version >= kGemmFirstTensorCoreVersion) version = 1;
    if constexpr (std::is_same_v<T, float>) {
        if (g.tf32) return launch_rounded_to_tf32(version, g, workspace, workspace_bytes, stream);
    }
    // v3 picks a 64-row tile only for M <= 64, where one launch covers every row anyway,
    // so the 128-row bound of max_rows_per_launch is safe for it.
    const int rows_per_launch = max_rows_per_launch(version);
    for (int b0 = 0; b0 < g.batch; b0 += kMaxGridYZ) {
        for (int m0 = 0; m0 < g.M; m0 += rows_per_launch) {
            GemmArgs<T> a = g;  // the rows [m0, m0 + rows_per_launch) of entries [b0, b0 + 65535)
            a.A = g.A + b0 * g.stride_a + static_cast<long long>(m0) * g.lda;
            a.B = g.B + b0 * g.stride_b;
            a.bias = g.bias != nullptr ? g.bias + m0 : nullptr;
            a.C = g.C + b0 * g.stride_c + static_cast<long long>(m0) * g.ldc;
            a.M = g.M - m0 < rows_per_launch ? g.M - m0 : rows_per_launch;
            a.batch = g.batch - b0 < kMaxGridYZ ? g.batch - b0 : kMaxGridYZ;
            cudaError_t err = cudaErrorInvalidValue;  // an unknown version
            switch (version) {
                case 1: err = launch_v1_naive(a, stream); break;
                case 2: err = launch_v2_shared_tiles(a, stream); break;
                case 3: err = launch_v3_register_tiles(a, stream); break;
                case 4: err = launch_v4_pipelined(a, stream); break;
            }
            if (err != cudaSuccess) return err;
        }
    }
    return cudaSuccess;
}

#define X(T)                                                                                  \
    template long long gemm_workspace_bytes<T>(int, const GemmArgs<T>&, long long);          \
    template cudaError_t gemm_launch<T>(int, const GemmArgs<T>&, void*, long long, cudaStream_t);
SCRATCHOPS_FOR_EACH_ELEMENT(X)
#undef X

}  // namespace scratchops
