// gemm_v1_naive.cuh — GEMM v1: one thread per element of C (gemm.cu's table).
#pragma once

#include "gemm_common.cuh"

namespace scratchops {
namespace {

template <class T>
__global__ void gemm_naive_kernel(const T* __restrict__ A, const T* __restrict__ B,
                                  const T* __restrict__ bias, T* __restrict__ C, int M, int N,
                                  int K, int lda, int ldb, int ldc, long long stride_a,
                                  long long stride_b, long long stride_c) {
    A = batch_entry(A, stride_a);
    B = batch_entry(B, stride_b);
    C = batch_entry(C, stride_c);
    const int col = blockIdx.x * blockDim.x + threadIdx.x;
    const int row = blockIdx.y * blockDim.y + threadIdx.y;
    if (row >= M || col >= N) return;
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) acc += to_float(A[row * lda + k]) * to_float(B[k * ldb + col]);
    if (bias != nullptr) acc = plus_bias<T>(acc, to_float(bias[row]));
    C[row * ldc + col] = from_float<T>(acc);
}

constexpr int kNaiveBlock = 32;  // 32x32 threads, one output each

template <class T>
cudaError_t launch_v1_naive(const GemmArgs<T>& a, cudaStream_t stream) {
    const dim3 block(kNaiveBlock, kNaiveBlock);
    const dim3 grid((a.N + kNaiveBlock - 1) / kNaiveBlock, (a.M + kNaiveBlock - 1) / kNaiveBlock,
                    a.batch);
    gemm_naive_kernel<<<grid, block, 0, stream>>>(a.A, a.B, a.bias, a.C, a.M, a.N, a.K, a.lda,
                                                  a.ldb, a.ldc, a.stride_a, a.stride_b,
                                                  a.stride_c);
    return cudaGetLastError();
}

}  // namespace
}  // namespace scratchops
