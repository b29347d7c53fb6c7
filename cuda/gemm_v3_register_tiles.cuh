// gemm_v3_register_tiles.cuh — GEMM v3: an 8x8 patch of C a thread, in registers (gemm.cu's
// table).
#pragma once

#include "gemm_common.cuh"

namespace scratchops {
namespace {

// Block tile BM x BN, k-step BK; each thread owns an 8x8 patch of C split into four 4x4
// quarters: rows {ty*4 + i} and {BM/2 + ty*4 + i}, columns {tx*4 + j} and {BN/2 + tx*4 + j}
// (i, j < 4). Splitting into halves makes the 16 threads of a row of the thread grid read
// 16 consecutive float4 of B_tile (no bank conflicts) instead of float4s 32 bytes apart. The
// tiles hold float whatever the element type: widened once as they are staged.
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

template <int BM, int BN, class T>
__global__ void __launch_bounds__(RegTileConfig<BM, BN>::kThreads)
    gemm_register_tiles_kernel(const T* __restrict__ A, const T* __restrict__ B,
                               const T* __restrict__ bias, T* __restrict__ C, int M, int N,
                               int K, int lda, int ldb, int ldc, long long stride_a,
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
            A_tile[k][r] = (gr < M && gk < K) ? to_float(A[gr * lda + gk]) : 0.0f;
        }
        // B tile, BK x BN: element e -> (k, c) = (e / BN, e % BN); a warp reads 32
        // consecutive columns of one row: coalesced.
#pragma unroll
        for (int i = 0; i < kRegBK * BN / Cfg::kThreads; ++i) {
            const int e = tid + i * Cfg::kThreads;
            const int k = e / BN, c = e % BN;
            const int gk = k0 + k, gc = col0 + c;
            B_tile[k][c] = (gk < K && gc < N) ? to_float(B[gk * ldb + gc]) : 0.0f;
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
        const float row_bias = bias != nullptr ? to_float(bias[row]) : 0.0f;
#pragma unroll
        for (int j = 0; j < kRegPatch; ++j) {
            const int col = col0 + (j < 4 ? tx * 4 + j : BN / 2 + tx * 4 + (j - 4));
            if (col < N) C[row * ldc + col] = from_float<T>(plus_bias<T>(acc[i][j], row_bias));
        }
    }
}

template <int BM, int BN, class T>
cudaError_t launch_register_tiles(const GemmArgs<T>& a, cudaStream_t stream) {
    const dim3 grid((a.N + BN - 1) / BN, (a.M + BM - 1) / BM, a.batch);
    gemm_register_tiles_kernel<BM, BN><<<grid, RegTileConfig<BM, BN>::kThreads, 0, stream>>>(
        a.A, a.B, a.bias, a.C, a.M, a.N, a.K, a.lda, a.ldb, a.ldc, a.stride_a, a.stride_b,
        a.stride_c);
    return cudaGetLastError();
}

template <class T>
cudaError_t launch_v3_register_tiles(const GemmArgs<T>& a, cudaStream_t stream) {
    // A 64-row block for short problems; the full 128-row block otherwise.
    return a.M <= 64 ? launch_register_tiles<64, 128>(a, stream)
                     : launch_register_tiles<128, 128>(a, stream);
}

}  // namespace
}  // namespace scratchops
