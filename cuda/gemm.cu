// gemm.cu — fp32 GEMM: C = A @ B (+ a bias per row of C), row-major, strided-batched.
//
// Versions, one idea each, simplest first (the progression of siboehm/SGEMM_CUDA):
//   v1 naive           one thread per element of C, every operand from global memory
//   v2 shared_tiles    tiles of A and B staged in shared memory, each loaded once per block
//   v3 register_tiles  an 8x8 patch of C per thread, in registers, fed by float4 shared loads
//   v4 pipelined       the next k-step's tiles loaded while the current ones multiply
//   v5 tensor_cores    fp32-accurate products on Hopper's tensor cores (3xTF32, sm_90a wgmma)
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
//                      global memory (16-byte loads where aligned) into registers while the
//                      current ones are multiplied, then stored to the other of two shared
//                      buffers: the loads' latency hides behind 512 multiply-adds a thread,
//                      and one barrier per k-step instead of two.
//   v5 tensor_cores    fp32-accurate on Hopper's tensor cores (sm_90a wgmma, 3xTF32): each
//                      fp32 operand is split into two TF32 parts and each product is carried
//                      by three TF32 products; B is packed once per call into the exact
//                      shared-memory tiles, A goes from global memory straight to registers.
//                      The engine and its reasons are in tf32x3.cuh. Needs a workspace for
//                      the packed B (gemm_workspace_bytes) and an sm_90 GPU.
//
// TF32 (GemmArgs::tf32, when torch allows TF32 for matmuls): v5 runs the engine's one-product
// TF32 mode; v1-v4 multiply copies of A and B rounded to TF32 (tf32_round.cu) in fp32.
//
// Every version handles any M, N, K >= 1 (edges are zero-filled on load and masked on
// store) and any leading dimensions, and fuses the optional per-row bias into the store.
// Index math is 32-bit inside one matrix (the caller guarantees each matrix holds fewer
// than 2^31 elements); the batch offset is 64-bit.

#include "common.cuh"
#include "launchers.h"
#include "tensor_core_launch.cuh"
#include "tf32x3.cuh"

namespace scratchops {
namespace {

// Grid limits: gridDim.y and gridDim.z are at most 65535. gemm_launch splits the rows and
// the batch into pieces that fit, so each version's launcher may assume they do.
constexpr int kMaxGridYZ = 65535;

// Pointer to batch entry blockIdx.z of a strided batch (64-bit: the batch as a whole may
// span more than 2^31 floats).
template <typename T>
__device__ __forceinline__ T* batch_entry(T* base, long long stride) {
    return base + static_cast<long long>(blockIdx.z) * stride;
}

// ------------------------------------------------------------------------------ v1: naive
__global__ void gemm_naive_kernel(const float* __restrict__ A, const float* __restrict__ B,
                                  const float* __restrict__ bias, float* __restrict__ C, int M,
                                  int N, int K, int lda, int ldb, int ldc, long long stride_a,
                                  long long stride_b, long long stride_c) {
    A = batch_entry(A, stride_a);
    B = batch_entry(B, stride_b);
    C = batch_entry(C, stride_c);
    const int col = blockIdx.x * blockDim.x + threadIdx.x;
    const int row = blockIdx.y * blockDim.y + threadIdx.y;
    if (row >= M || col >= N) return;
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) acc += A[row * lda + k] * B[k * ldb + col];
    if (bias != nullptr) acc += bias[row];
    C[row * ldc + col] = acc;
}

constexpr int kNaiveBlock = 32;  // 32x32 threads, one output each

cudaError_t launch_v1_naive(const GemmArgs& a, cudaStream_t stream) {
    const dim3 block(kNaiveBlock, kNaiveBlock);
    const dim3 grid((a.N + kNaiveBlock - 1) / kNaiveBlock, (a.M + kNaiveBlock - 1) / kNaiveBlock,
                    a.batch);
    gemm_naive_kernel<<<grid, block, 0, stream>>>(a.A, a.B, a.bias, a.C, a.M, a.N, a.K, a.lda,
                                                  a.ldb, a.ldc, a.stride_a, a.stride_b,
                                                  a.stride_c);
    return cudaGetLastError();
}

// ---------------------------------------------------------------------- v2: shared tiles
constexpr int kTile = 32;

__global__ void gemm_shared_tiles_kernel(const float* __restrict__ A,
                                         const float* __restrict__ B,
                                         const float* __restrict__ bias, float* __restrict__ C,
                                         int M, int N, int K, int lda, int ldb, int ldc,
                                         long long stride_a, long long stride_b,
                                         long long stride_c) {
    A = batch_entry(A, stride_a);
    B = batch_entry(B, stride_b);
    C = batch_entry(C, stride_c);
    __shared__ float A_tile[kTile][kTile];  // A_tile[r][k] = A[row0 + r][k0 + k]
    __shared__ float B_tile[kTile][kTile];  // B_tile[k][c] = B[k0 + k][col0 + c]
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int row = blockIdx.y * kTile + ty;
    const int col = blockIdx.x * kTile + tx;
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += kTile) {
        // Thread (ty, tx) loads one element of each tile; out-of-range elements are 0 so
        // they add nothing. Consecutive tx read consecutive addresses: coalesced.
        A_tile[ty][tx] = (row < M && k0 + tx < K) ? A[row * lda + k0 + tx] : 0.0f;
        B_tile[ty][tx] = (k0 + ty < K && col < N) ? B[(k0 + ty) * ldb + col] : 0.0f;
        __syncthreads();
        // A_tile[ty][k] is one address for the whole warp (broadcast); B_tile[k][tx] is 32
        // consecutive words (32 banks): no bank conflicts.
#pragma unroll
        for (int k = 0; k < kTile; ++k) acc += A_tile[ty][k] * B_tile[k][tx];
        __syncthreads();  // the next step overwrites the tiles
    }
    if (row < M && col < N) C[row * ldc + col] = acc + (bias != nullptr ? bias[row] : 0.0f);
}

cudaError_t launch_v2_shared_tiles(const GemmArgs& a, cudaStream_t stream) {
    const dim3 block(kTile, kTile);
    const dim3 grid((a.N + kTile - 1) / kTile, (a.M + kTile - 1) / kTile, a.batch);
    gemm_shared_tiles_kernel<<<grid, block, 0, stream>>>(a.A, a.B, a.bias, a.C, a.M, a.N, a.K,
                                                         a.lda, a.ldb, a.ldc, a.stride_a,
                                                         a.stride_b, a.stride_c);
    return cudaGetLastError();
}

// -------------------------------------------------------------------- v3: register tiles
// Block tile BM x BN, k-step BK; each thread owns an 8x8 patch of C split into four 4x4
// quarters: rows {ty*4 + i} and {BM/2 + ty*4 + i}, columns {tx*4 + j} and {BN/2 + tx*4 + j}
// (i, j < 4). Splitting into halves makes the 16 threads of a row of the thread grid read
// 16 consecutive float4 of B_tile (no bank conflicts) instead of float4s 32 bytes apart.
constexpr int kRegBK = 8;
constexpr int kRegPatch = 8;  // 8x8 outputs per thread

template <int BM, int BN>
struct RegTileConfig {
    static constexpr int kThreadsN = BN / kRegPatch;
    static constexpr int kThreadsM = BM / kRegPatch;
    static constexpr int kThreads = kThreadsN * kThreadsM;
    // A_tile rows are padded by 4 floats: the transposing store A_tile[k][r] from 8
    // consecutive k of one row r then hits 8 different banks, and rows stay 16-byte aligned.
    static constexpr int kAStride = BM + 4;
    static_assert(BM * kRegBK % kThreads == 0 && kRegBK * BN % kThreads == 0,
                  "tile loads must split evenly over the threads");
};

template <int BM, int BN>
__global__ void __launch_bounds__(RegTileConfig<BM, BN>::kThreads)
    gemm_register_tiles_kernel(const float* __restrict__ A, const float* __restrict__ B,
                               const float* __restrict__ bias, float* __restrict__ C, int M,
                               int N, int K, int lda, int ldb, int ldc, long long stride_a,
                               long long stride_b, long long stride_c) {
    using Cfg = RegTileConfig<BM, BN>;
    A = batch_entry(A, stride_a);
    B = batch_entry(B, stride_b);
    C = batch_entry(C, stride_c);
    __shared__ __align__(16) float A_tile[kRegBK][Cfg::kAStride];  // [k][r] = A[row0+r][k0+k]
    __shared__ __align__(16) float B_tile[kRegBK][BN];             // [k][c] = B[k0+k][col0+c]

    const int tid = threadIdx.x;
    const int tx = tid % Cfg::kThreadsN;
    const int ty = tid / Cfg::kThreadsN;
    const int row0 = blockIdx.y * BM;
    const int col0 = blockIdx.x * BN;

    float acc[kRegPatch][kRegPatch] = {};
    float a_frag[kRegPatch], b_frag[kRegPatch];

    for (int k0 = 0; k0 < K; k0 += kRegBK) {
        // A tile, BM x BK: element e -> (r, k) = (e / BK, e % BK). A warp reads 4 rows x 8
        // consecutive k (four 32-byte segments) and stores them transposed.
#pragma unroll
        for (int i = 0; i < BM * kRegBK / Cfg::kThreads; ++i) {
            const int e = tid + i * Cfg::kThreads;
            const int r = e / kRegBK, k = e % kRegBK;
            const int gr = row0 + r, gk = k0 + k;
            A_tile[k][r] = (gr < M && gk < K) ? A[gr * lda + gk] : 0.0f;
        }
        // B tile, BK x BN: element e -> (k, c) = (e / BN, e % BN); a warp reads 32
        // consecutive columns of one row: coalesced.
#pragma unroll
        for (int i = 0; i < kRegBK * BN / Cfg::kThreads; ++i) {
            const int e = tid + i * Cfg::kThreads;
            const int k = e / BN, c = e % BN;
            const int gk = k0 + k, gc = col0 + c;
            B_tile[k][c] = (gk < K && gc < N) ? B[gk * ldb + gc] : 0.0f;
        }
        __syncthreads();

#pragma unroll
        for (int k = 0; k < kRegBK; ++k) {
            const float4 a_lo = *reinterpret_cast<const float4*>(&A_tile[k][ty * 4]);
            const float4 a_hi = *reinterpret_cast<const float4*>(&A_tile[k][BM / 2 + ty * 4]);
            const float4 b_lo = *reinterpret_cast<const float4*>(&B_tile[k][tx * 4]);
            const float4 b_hi = *reinterpret_cast<const float4*>(&B_tile[k][BN / 2 + tx * 4]);
            a_frag[0] = a_lo.x; a_frag[1] = a_lo.y; a_frag[2] = a_lo.z; a_frag[3] = a_lo.w;
            a_frag[4] = a_hi.x; a_frag[5] = a_hi.y; a_frag[6] = a_hi.z; a_frag[7] = a_hi.w;
            b_frag[0] = b_lo.x; b_frag[1] = b_lo.y; b_frag[2] = b_lo.z; b_frag[3] = b_lo.w;
            b_frag[4] = b_hi.x; b_frag[5] = b_hi.y; b_frag[6] = b_hi.z; b_frag[7] = b_hi.w;
#pragma unroll
            for (int i = 0; i < kRegPatch; ++i)
#pragma unroll
                for (int j = 0; j < kRegPatch; ++j) acc[i][j] += a_frag[i] * b_frag[j];
        }
        __syncthreads();  // the next step overwrites the tiles
    }

    // Store: patch row i is C row row0 + (i < 4 ? ty*4 + i : BM/2 + ty*4 + i - 4), patch
    // column j likewise with tx and BN. Rows and columns past M and N are masked.
#pragma unroll
    for (int i = 0; i < kRegPatch; ++i) {
        const int row = row0 + (i < 4 ? ty * 4 + i : BM / 2 + ty * 4 + (i - 4));
        if (row >= M) continue;
        const float row_bias = bias != nullptr ? bias[row] : 0.0f;
#pragma unroll
        for (int j = 0; j < kRegPatch; ++j) {
            const int col = col0 + (j < 4 ? tx * 4 + j : BN / 2 + tx * 4 + (j - 4));
            if (col < N) C[row * ldc + col] = acc[i][j] + row_bias;
        }
    }
}

template <int BM, int BN>
cudaError_t launch_register_tiles(const GemmArgs& a, cudaStream_t stream) {
    const dim3 grid((a.N + BN - 1) / BN, (a.M + BM - 1) / BM, a.batch);
    gemm_register_tiles_kernel<BM, BN><<<grid, RegTileConfig<BM, BN>::kThreads, 0, stream>>>(
        a.A, a.B, a.bias, a.C, a.M, a.N, a.K, a.lda, a.ldb, a.ldc, a.stride_a, a.stride_b,
        a.stride_c);
    return cudaGetLastError();
}

cudaError_t launch_v3_register_tiles(const GemmArgs& a, cudaStream_t stream) {
    // A 64-row block for short problems; the full 128-row block otherwise.
    return a.M <= 64 ? launch_register_tiles<64, 128>(a, stream)
                     : launch_register_tiles<128, 128>(a, stream);
}

// ----------------------------------------------------------------------- v4: pipelined
// Block tile 128 x 128, k-step 8, 256 threads, each an 8x8 patch as in v3 (tx = tid % 16,
// ty = tid / 16; rows ty*4 + i and 64 + ty*4 + i, columns likewise with tx). Loads: thread t
// fetches A row t / 2, k (t % 2) * 4 .. + 3 and B row t / 32, columns (t % 32) * 4 .. + 3:
// one float4 each when in range and aligned, else four predicated scalars (0 outside).
constexpr int kPipeBM = 128, kPipeBN = 128, kPipeBK = 8, kPipeThreads = 256;

__global__ void __launch_bounds__(kPipeThreads)
    gemm_pipelined_kernel(const float* __restrict__ A, const float* __restrict__ B,
                          const float* __restrict__ bias, float* __restrict__ C, int M, int N,
                          int K, int lda, int ldb, int ldc, long long stride_a,
                          long long stride_b, long long stride_c, bool a_vec4, bool b_vec4) {
    A = batch_entry(A, stride_a);
    B = batch_entry(B, stride_b);
    C = batch_entry(C, stride_c);
    // A_tile[buf][k][r] = A[row0 + r][k0 + k] (transposed, rows padded by 4 floats: the four
    // transposing stores of a warp land in 32 different banks); B_tile[buf][k][c].
    __shared__ __align__(16) float A_tile[2][kPipeBK][kPipeBM + 4];
    __shared__ __align__(16) float B_tile[2][kPipeBK][kPipeBN];
    const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    const int row0 = blockIdx.y * kPipeBM, col0 = blockIdx.x * kPipeBN;
    const int a_row = tid / 2, a_k = (tid % 2) * 4;   // this thread's A load
    const int b_k = tid / 32, b_col = (tid % 32) * 4;  // and B load

    float4 a_next, b_next;
    auto fetch = [&](int k0) {
        const int r = row0 + a_row, k = k0 + a_k;
        if (a_vec4 && r < M && k + 3 < K) {
            a_next = *reinterpret_cast<const float4*>(A + r * lda + k);
        } else {
            a_next.x = r < M && k < K ? A[r * lda + k] : 0.0f;
            a_next.y = r < M && k + 1 < K ? A[r * lda + k + 1] : 0.0f;
            a_next.z = r < M && k + 2 < K ? A[r * lda + k + 2] : 0.0f;
            a_next.w = r < M && k + 3 < K ? A[r * lda + k + 3] : 0.0f;
        }
        const int kb = k0 + b_k, c = col0 + b_col;
        if (b_vec4 && kb < K && c + 3 < N) {
            b_next = *reinterpret_cast<const float4*>(B + kb * ldb + c);
        } else {
            b_next.x = kb < K && c < N ? B[kb * ldb + c] : 0.0f;
            b_next.y = kb < K && c + 1 < N ? B[kb * ldb + c + 1] : 0.0f;
            b_next.z = kb < K && c + 2 < N ? B[kb * ldb + c + 2] : 0.0f;
            b_next.w = kb < K && c + 3 < N ? B[kb * ldb + c + 3] : 0.0f;
        }
    };
    auto stash = [&](int buf) {
        A_tile[buf][a_k + 0][a_row] = a_next.x;
        A_tile[buf][a_k + 1][a_row] = a_next.y;
        A_tile[buf][a_k + 2][a_row] = a_next.z;
        A_tile[buf][a_k + 3][a_row] = a_next.w;
        *reinterpret_cast<float4*>(&B_tile[buf][b_k][b_col]) = b_next;
    };

    float acc[kRegPatch][kRegPatch] = {};
    fetch(0);
    stash(0);
    __syncthreads();
    int buf = 0;
    for (int k0 = 0; k0 < K; k0 += kPipeBK) {
        const bool more = k0 + kPipeBK < K;
        if (more) fetch(k0 + kPipeBK);  // in flight while this step multiplies
#pragma unroll
        for (int k = 0; k < kPipeBK; ++k) {
            const float4 a_lo = *reinterpret_cast<const float4*>(&A_tile[buf][k][ty * 4]);
            const float4 a_hi = *reinterpret_cast<const float4*>(&A_tile[buf][k][64 + ty * 4]);
            const float4 b_lo = *reinterpret_cast<const float4*>(&B_tile[buf][k][tx * 4]);
            const float4 b_hi = *reinterpret_cast<const float4*>(&B_tile[buf][k][64 + tx * 4]);
            const float a[kRegPatch] = {a_lo.x, a_lo.y, a_lo.z, a_lo.w,
                                        a_hi.x, a_hi.y, a_hi.z, a_hi.w};
            const float b[kRegPatch] = {b_lo.x, b_lo.y, b_lo.z, b_lo.w,
                                        b_hi.x, b_hi.y, b_hi.z, b_hi.w};
#pragma unroll
            for (int i = 0; i < kRegPatch; ++i)
#pragma unroll
                for (int j = 0; j < kRegPatch; ++j) acc[i][j] += a[i] * b[j];
        }
        // The other buffer was last read in the previous step, before its closing barrier.
        if (more) stash(buf ^ 1);
        __syncthreads();
        buf ^= 1;
    }

#pragma unroll
    for (int i = 0; i < kRegPatch; ++i) {
        const int row = row0 + (i < 4 ? ty * 4 + i : 64 + ty * 4 + (i - 4));
        if (row >= M) continue;
        const float row_bias = bias != nullptr ? bias[row] : 0.0f;
#pragma unroll
        for (int j = 0; j < kRegPatch; ++j) {
            const int col = col0 + (j < 4 ? tx * 4 + j : 64 + tx * 4 + (j - 4));
            if (col < N) C[row * ldc + col] = acc[i][j] + row_bias;
        }
    }
}

cudaError_t launch_v4_pipelined(const GemmArgs& a, cudaStream_t stream) {
    // 16-byte loads need lda (ldb) and the batch stride in multiples of 4 floats and a
    // 16-byte aligned base.
    const bool a_vec4 = a.lda % 4 == 0 && a.stride_a % 4 == 0 && aligned16(a.A);
    const bool b_vec4 = a.ldb % 4 == 0 && a.stride_b % 4 == 0 && aligned16(a.B);
    const dim3 grid((a.N + kPipeBN - 1) / kPipeBN, (a.M + kPipeBM - 1) / kPipeBM, a.batch);
    gemm_pipelined_kernel<<<grid, kPipeThreads, 0, stream>>>(a.A, a.B, a.bias, a.C, a.M, a.N,
                                                             a.K, a.lda, a.ldb, a.ldc,
                                                             a.stride_a, a.stride_b, a.stride_c,
                                                             a_vec4, b_vec4);
    return cudaGetLastError();
}

// Rows of C that one launch of a version may cover (gridDim.y <= 65535 row tiles).
int max_rows_per_launch(int version) {
    const int tile_rows = version == 1 ? kNaiveBlock : version == 2 ? kTile : 128;
    return kMaxGridYZ * tile_rows;
}

}  // namespace

// -------------------------------------------------------------- v5: tensor cores (3xTF32)
// (A named namespace: in a build without sm_90a the kernel using these is empty, and unused
// members of an unnamed namespace would draw warnings.)
namespace gemm_v5 {

// A's rows for the tensor-core engine: row m of batch entry b is a + b * stride_a + m * lda.
struct RowMajorRows {
    const float* a;
    int m, k, lda;
    long long stride_a;
    bool pairs_aligned;  // lda even and a 8-byte aligned: a pair of values is one 8-byte load
    struct Row {
        long long offset;  // of row m's first value; -1 past the last row
    };
    struct KBlock {
        int k0, count;  // the thread's first k, and how many of its 8 exist
    };
    struct KPtr {
        int offset;  // of the thread's first value, from a
        int count;   // how many of its 8 values exist (0: none)
    };
    __device__ Row row(int batch, int r) const {
        return {r < m ? batch * stride_a + static_cast<long long>(r) * lda : -1};
    }
    __device__ KBlock kblock(int kb, int t) const {
        const int k0 = kb * tc::kBlockK + 8 * t;
        return {k0, min(8, k - k0)};
    }
    __device__ KPtr none() const { return {0, 0}; }
    __device__ KPtr kptr(const Row& r, const KBlock& b) const {
        // Offsets fit in 32 bits: A holds fewer than 2^31 elements (the caller checks).
        return {r.offset < 0 ? 0 : static_cast<int>(r.offset) + b.k0, r.offset < 0 ? 0 : b.count};
    }
    __device__ float2 fetch2(const KPtr& p, int e) const {
        const float* q = a + p.offset + e;
        if (pairs_aligned) {  // one 8-byte load, or at an odd K's end the first value alone
            const float2 pair = load2_or_zero(q, p.count >= e + 2);
            const float last = load_or_zero(q, p.count == e + 1);
            return p.count >= e + 2 ? pair : make_float2(last, 0.0f);
        }
        return make_float2(load_or_zero(q, e < p.count), load_or_zero(q + 1, e + 1 < p.count));
    }
};

// B (K x N row-major, batch stride stride_b) as the engine's N x K matrix B(entry, n, k).
struct RowMajorB {
    const float* b;
    int n, k, ldb;
    long long stride_b;
    __device__ float operator()(int entry, int col, int row) const {
        return col < n && row < k ? b[entry * stride_b + static_cast<long long>(row) * ldb + col]
                                  : 0.0f;
    }
};

// C = A @ B + bias[row], row-major with leading dimension ldc.
struct RowMajorStore {
    float* c;
    const float* bias;  // may be nullptr
    int m, n, ldc;
    long long stride_c;
    bool pairs_aligned;
    struct Prepared {};
    __device__ Prepared prepare(const tc::TileCoords&) const { return {}; }
    template <int BN, int MB>
    __device__ void store(const float (&acc)[MB][BN / 2], const tc::TileCoords& tc,
                          const Prepared&) const {
        const int t = tc.lane % 4;
#pragma unroll
        for (int mb = 0; mb < MB; ++mb)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = tc.m0 + tc.warpgroup * 64 * MB + mb * 64 + tc.warp * 16 +
                              tc.lane / 4 + 8 * h;
                if (r >= m) continue;
                const float row_bias = bias != nullptr ? bias[r] : 0.0f;
                float* out = c + tc.batch * stride_c + static_cast<long long>(r) * ldc;
#pragma unroll
                for (int nb = 0; nb < BN / 8; ++nb) {
                    const int col = tc.n0 + 8 * nb + 2 * t;
                    const float v0 = acc[mb][4 * nb + 2 * h] + row_bias;
                    const float v1 = acc[mb][4 * nb + 2 * h + 1] + row_bias;
                    if (pairs_aligned && col + 1 < n) {
                        *reinterpret_cast<float2*>(out + col) = make_float2(v0, v1);
                    } else {
                        if (col < n) out[col] = v0;
                        if (col + 1 < n) out[col + 1] = v1;
                    }
                }
            }
    }
};

constexpr int kTcBN = 128, kTcMB = 1, kTcStages = 4;

inline tc::PackedB tc_layout(int n, int k, int entries) {
    return tc::packed_b_layout(kTcBN, n, k, entries);
}

}  // namespace gemm_v5

namespace {

// v5: the product on the tensor cores, a chunk of batch entries at a time when B is batched
// and the workspace does not hold every entry's packed B.
cudaError_t launch_v5_tensor_cores(const GemmArgs& g, void* workspace, long long workspace_bytes,
                                   cudaStream_t stream) {
    using namespace gemm_v5;
    const bool b_shared = g.stride_b == 0;
    // Batch entries per launch: all of them, or (a batched B) as many as the workspace holds.
    const long long per_entry = tc_layout(g.N, g.K, 1).tiles_bytes();
    const long long room = workspace_bytes - tc_layout(g.N, g.K, 0).bytes();  // minus the flags
    const int chunk = b_shared ? g.batch
                               : static_cast<int>(room / per_entry < g.batch ? room / per_entry
                                                                             : g.batch);
    if (chunk <= 0) return cudaErrorInvalidValue;  // the workspace holds not even one B
    auto* packed = static_cast<uint8_t*>(workspace);
    const bool a_pairs = g.lda % 2 == 0 && g.stride_a % 2 == 0 &&
                         reinterpret_cast<uintptr_t>(g.A) % 8 == 0;
    const bool c_pairs = g.ldc % 2 == 0 && g.stride_c % 2 == 0 &&
                         reinterpret_cast<uintptr_t>(g.C) % 8 == 0;
    for (int b0 = 0; b0 < g.batch; b0 += chunk) {
        const int count = g.batch - b0 < chunk ? g.batch - b0 : chunk;
        const tc::PackedB layout = tc_layout(g.N, g.K, b_shared ? 1 : count);
        cudaError_t err = tc::pack_b<kTcBN>(
            RowMajorB{g.B + b0 * g.stride_b, g.N, g.K, g.ldb, g.stride_b}, packed, layout,
            stream);
        if (err != cudaSuccess) return err;
        const RowMajorRows rows{g.A + b0 * g.stride_a, g.M, g.K, g.lda, g.stride_a, a_pairs};
        const RowMajorStore store{g.C + b0 * g.stride_c, g.bias, g.M, g.N, g.ldc, g.stride_c,
                                  c_pairs};
        err = g.tf32 ? tensor_core_launch<kTcBN, kTcMB, kTcStages, 1, true>(
                           g.engine, rows, store, packed, layout, g.M, count, b_shared, stream)
                     : tensor_core_launch<kTcBN, kTcMB, kTcStages, 1, false>(
                           g.engine, rows, store, packed, layout, g.M, count, b_shared, stream);
        if (err != cudaSuccess) return err;
    }
    return cudaSuccess;
}

// v5 with K = 0 is the bias alone, which v1 writes.
bool uses_tensor_cores(int version, const GemmArgs& g) {
    return version == kGemmTensorCoreVersion && g.K > 0;
}

// The elements a strided batch of rows x cols matrices spans from its first (ld: leading
// dimension; batch_stride 0: one matrix for every entry).
long long span(int rows, int cols, int ld, long long batch_stride, int batch) {
    if (rows == 0 || cols == 0) return 0;
    return (batch_stride != 0 ? (batch - 1) * batch_stride : 0) +
           static_cast<long long>(rows - 1) * ld + cols;
}

// TF32 on the CUDA cores (v1-v4): the operands rounded to TF32 into the workspace, A's span
// first, then B's (16-byte aligned), multiplied as usual.
struct RoundedOperands {
    long long a_floats, b_offset, b_floats;  // B's copy starts b_offset floats in
    explicit RoundedOperands(const GemmArgs& g)
        : a_floats(span(g.M, g.K, g.lda, g.stride_a, g.batch)),
          b_offset((a_floats + 3) / 4 * 4),
          b_floats(span(g.K, g.N, g.ldb, g.stride_b, g.batch)) {}
    long long bytes() const { return 4 * (b_offset + b_floats); }
};

}  // namespace

long long gemm_workspace_bytes(int version, const GemmArgs& g, long long budget) {
    if (!uses_tensor_cores(version, g)) return g.tf32 ? RoundedOperands(g).bytes() : 0;
    using gemm_v5::tc_layout;
    const long long all = tc_layout(g.N, g.K, g.stride_b == 0 ? 1 : g.batch).bytes();
    const long long one = tc_layout(g.N, g.K, 1).bytes();
    return all <= budget ? all : (one > budget ? one : budget);
}

cudaError_t gemm_launch(int version, const GemmArgs& g, void* workspace,
                        long long workspace_bytes, cudaStream_t stream) {
    if (uses_tensor_cores(version, g))
        return launch_v5_tensor_cores(g, workspace, workspace_bytes, stream);
    if (version == kGemmTensorCoreVersion) version = 1;
    if (g.tf32) {
        const RoundedOperands r(g);
        if (workspace_bytes < r.bytes()) return cudaErrorInvalidValue;
        GemmArgs rounded = g;
        auto* a = static_cast<float*>(workspace);
        rounded.A = a;
        rounded.B = a + r.b_offset;
        rounded.tf32 = false;
        cudaError_t err = tf32_round_launch(g.A, a, r.a_floats, stream);
        if (err == cudaSuccess) err = tf32_round_launch(g.B, a + r.b_offset, r.b_floats, stream);
        return err != cudaSuccess ? err : gemm_launch(version, rounded, nullptr, 0, stream);
    }
    // v3 picks a 64-row tile only for M <= 64, where one launch covers every row anyway,
    // so the 128-row bound of max_rows_per_launch is safe for it.
    const int rows_per_launch = max_rows_per_launch(version);
    for (int b0 = 0; b0 < g.batch; b0 += kMaxGridYZ) {
        for (int m0 = 0; m0 < g.M; m0 += rows_per_launch) {
            GemmArgs a = g;  // the rows [m0, m0 + rows_per_launch) of entries [b0, b0 + 65535)
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

}  // namespace scratchops
