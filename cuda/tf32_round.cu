// tf32_round.cu — fp32 values rounded to TF32 (10 mantissa bits), to nearest, ties away from
// zero: what cuDNN and cuBLAS do to their fp32 operands when torch allows TF32. The CUDA-core
// paths (gemm v1-v4 and the im2col convolution) follow torch's TF32 switches by multiplying
// operands rounded with this first; their fp32 multiply-adds of TF32 values are then exact
// products, summed in fp32 like the tensor cores' TF32 mode (tf32x3.cuh's kTf32).
#include "hopper.cuh"
#include "launchers.h"

namespace scratchops {
namespace {

constexpr int kRoundThreads = 256;
constexpr int kRoundBlocks = 1024;  // a grid-stride loop: enough blocks to fill any GPU

__global__ void tf32_round_kernel(const float* __restrict__ x, float* __restrict__ y,
                                  long long n) {
    for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<long long>(gridDim.x) * blockDim.x)
        y[i] = __uint_as_float(tf32_nearest(x[i]));
}

}  // namespace

cudaError_t tf32_round_launch(const float* x, float* y, long long n, cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    const long long needed = (n + kRoundThreads - 1) / kRoundThreads;
    const int blocks = static_cast<int>(needed < kRoundBlocks ? needed : kRoundBlocks);
    tf32_round_kernel<<<blocks, kRoundThreads, 0, stream>>>(x, y, n);
    return cudaGetLastError();
}

}  // namespace scratchops
