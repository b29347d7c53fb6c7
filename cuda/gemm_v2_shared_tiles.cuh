// gemm_v2_shared_tiles.cuh — GEMM v2: 32x32 tiles of A and B staged in shared memory
// (gemm.cu's table).
#pragma once

#include "gemm_common.cuh"

namespace scratchops {
namespace {

constexpr int kTile = 32;

template <class T>
__global__ void gemm_shared_tiles_kernel(const T* __restrict__ A, const T* __restrict__ B,
                                         const T* __restrict__ bias, T* __restrict__ C, int M,
                                         int N, int K, int lda, int ldb, int ldc,
                                         long long stride_a, long long stride_b,
                                         long long stride_c) {
    A = batch_entry(A, stride_a);
    B = batch_entry(B, stride_b);
    C = batch_entry(C, stride_c);
    // The tiles hold float whatever T: widened once as they are staged, not at every use.
    __shared__ float A_tile[kTile][kTile];  // A_tile[r][k] = A[row0 + r][k0 + k]
    __shared__ float B_tile[kTile][kTile];  // B_tile[k][c] = B[k0 + k][col0 + c]
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int row = blockIdx.y * kTile + ty;
    const int col = blockIdx.x * kTile + tx;
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += kTile) {
        // Thread (ty, tx) loads one element of each tile; out-of-range elements are 0 so
        // they add nothing. Consecutive tx read consecutive addresses: coalesced.
        A_tile[ty][tx] = (row < M && k0 + tx < K) ? to_float(A[row * lda + k0 + tx]) : 0.0f;
        B_tile[ty][tx] = (k0 + ty < K && col < N) ? to_float(B[(k0 + ty) * ldb + col]) : 0.0f;
        __syncthreads();
        // A_tile[ty][k] is one address for the whole warp (broadcast); B_tile[k][tx] is 32
        // consecutive words (32 banks): no bank conflicts.
#pragma unroll
        for (int k = 0; k < kTile; ++k) acc += A_tile[ty][k] * B_tile[k][tx];
        __syncthreads();  // the next step overwrites the tiles
    }
    if (row < M && col < N)
        C[row * ldc + col] =
            from_float<T>(plus_bias<T>(acc, bias != nullptr ? to_float(bias[row]) : 0.0f));
}

template <class T>
cudaError_t launch_v2_shared_tiles(const GemmArgs<T>& a, cudaStream_t stream) {
    const dim3 block(kTile, kTile);
    const dim3 grid((a.N + kTile - 1) / kTile, (a.M + kTile - 1) / kTile, a.batch);
    gemm_shared_tiles_kernel<<<grid, block, 0, stream>>>(a.A, a.B, a.bias, a.C, a.M, a.N, a.K,
                                                         a.lda, a.ldb, a.ldc, a.stride_a,
                                                         a.stride_b, a.stride_c);
    return cudaGetLastError();
}

}  // namespace
}  // namespace scratchops
