// gemm_v4_pipelined.cuh — GEMM v4: v3's tiles with the next k-step loaded while this one
// multiplies (gemm.cu's table).
#pragma once

#include "gemm_v3_register_tiles.cuh"

namespace scratchops {
namespace {

// Block tile 128 x 128, k-step 8, 256 threads, each an 8x8 patch as in v3 (tx = tid % 16,
// ty = tid / 16; rows ty*4 + i and 64 + ty*4 + i, columns likewise with tx). Loads: thread t
// fetches A row t / 2, k (t % 2) * 4 .. + 3 and B row t / 32, columns (t % 32) * 4 .. + 3:
// one 4-element load each when in range and aligned, else four predicated scalars (0
// outside), widened to float in registers: the tiles hold float whatever the element type.
constexpr int kPipeBM = 128, kPipeBN = 128, kPipeBK = 8, kPipeThreads = 256;

template <class T>
__global__ void __launch_bounds__(kPipeThreads)
    gemm_pipelined_kernel(const T* __restrict__ A, const T* __restrict__ B,
                          const T* __restrict__ bias, T* __restrict__ C, int M, int N, int K,
                          int lda, int ldb, int ldc, long long stride_a, long long stride_b,
                          long long stride_c, bool a_vec4, bool b_vec4) {
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
        // (A's row r holds K - k values from k on; B's row kb, N - c from column c.)
        const int r = row0 + a_row, k = k0 + a_k;
        a_next = load4_or_zero(A + r * lda + k, r < M ? K - k : 0, a_vec4);
        const int kb = k0 + b_k, c = col0 + b_col;
        b_next = load4_or_zero(B + kb * ldb + c, kb < K ? N - c : 0, b_vec4);
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
        const float row_bias = bias != nullptr ? to_float(bias[row]) : 0.0f;
#pragma unroll
        for (int j = 0; j < kRegPatch; ++j) {
            const int col = col0 + (j < 4 ? tx * 4 + j : 64 + tx * 4 + (j - 4));
            if (col < N) C[row * ldc + col] = from_float<T>(plus_bias<T>(acc[i][j], row_bias));
        }
    }
}

template <class T>
cudaError_t launch_v4_pipelined(const GemmArgs<T>& a, cudaStream_t stream) {
    // 4-element loads need lda (ldb) and the batch stride in multiples of 4 elements and a
    // base aligned to 4 elements (vector_aligned).
    const bool a_vec4 = a.lda % 4 == 0 && a.stride_a % 4 == 0 && vector_aligned<T>(a.A);
    const bool b_vec4 = a.ldb % 4 == 0 && a.stride_b % 4 == 0 && vector_aligned<T>(a.B);
    const dim3 grid((a.N + kPipeBN - 1) / kPipeBN, (a.M + kPipeBM - 1) / kPipeBM, a.batch);
    gemm_pipelined_kernel<<<grid, kPipeThreads, 0, stream>>>(a.A, a.B, a.bias, a.C, a.M, a.N,
                                                             a.K, a.lda, a.ldb, a.ldc,
                                                             a.stride_a, a.stride_b, a.stride_c,
                                                             a_vec4, b_vec4);
    return cudaGetLastError();
}

}  // namespace
}  // namespace scratchops
