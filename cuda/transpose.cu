// transpose.cu — the two data movements the backward passes are built from: a batched matrix
// transpose, and the sum of a batch of matrices.
//
//   transpose:  y[b][c][r] = x[b][r][c]  (each of `batch` rows x cols matrices, row-major)
//   batch_sum:  y[i] = carry[i] + sum over b = 0, 1, ..., batch-1 of x[b][i]
//
// Why the backward needs them. The GEMMs here multiply row-major A (M x K) by row-major B
// (K x N). A matrix product's gradients multiply by the other operand transposed (dA = dC Bᵀ,
// dB = Aᵀ dC), so the backward writes the transposed operand out first and calls the same
// GEMM. When the forward shared one operand across a batch, its gradient is the sum of the
// batch's gradients: batch_sum adds them in a fixed order, b = 0 first, so the result is the
// same bits at every run (no atomics, whose order would change with the schedule).
//
// Element types: float, fp16 and bf16 in and out (element.cuh); transpose may also widen or
// round (float in, the element type out: a float accumulator written as the gradient), and
// batch_sum adds in float and may write float (an accumulator carried across chunks).
//
// The forward uses transpose once: channels_last, an NCHW input as (N, H, W, C) for the
// implicit-GEMM convolution v4 (conv_implicit_staged_a.cuh), each image's C x HW matrix
// transposed; in the TF32 mode each value is rounded to the nearest TF32 on the way, as
// cuDNN rounds its operands (wgmma would truncate).
//
// Versions, one idea each (one version each here):
//   transpose v1 tiled  a 32 x 32 tile through shared memory, so that both the reads of x and
//                       the writes of y are whole rows (coalesced); the tile's rows are 33
//                       wide so that reading a column of it touches 32 different banks
//   batch_sum v1 column one thread per element i, walking the batch in order: coalesced across
//                       i, the order of the additions fixed
//   channels_last       transpose with 16-byte accesses on both sides (v1 moves one element
//                       a thread, and in 16 bits only 64 bytes a warp: half the copy rate);
//                       its tile in channels_last.cuh, which v4's kernel also runs itself

#include "channels_last.cuh"
#include "common.cuh"
#include "hopper.cuh"
#include "launchers.h"

namespace scratchops {
namespace {

constexpr int kTile = 32;         // a transpose tile is kTile x kTile elements
constexpr int kTileRowsStep = 8;  // the block is kTile x kTileRowsStep threads
constexpr int kSumThreads = 256;

// Block (tile_index, b0) moves tile (tile_r, tile_c) = divmod(tile_index, tiles_c) of matrices
// b0, b0 + gridDim.y, ... . Thread (tx, ty) reads x rows r = tile_r*32 + ty + 8j, column
// c = tile_c*32 + tx (a warp: one row segment), stores it at tile[r % 32][c % 32], and after the
// barrier writes y row c' = tile_c*32 + ty + 8j, column r' = tile_r*32 + tx from tile[tx][ty + 8j]
// (a warp: one row segment of y). Offsets inside one matrix are below 2^31 (the caller's
// matrices hold fewer elements); the matrix offset is 64-bit.
template <class In, class Out>
__global__ void transpose_kernel(const In* __restrict__ x, Out* __restrict__ y, int batch,
                                 int rows, int cols, int tiles_c) {
    __shared__ float tile[kTile][kTile + 1];
    const int tile_r = blockIdx.x / tiles_c, tile_c = blockIdx.x % tiles_c;
    const long long matrix = static_cast<long long>(rows) * cols;
    for (int b = blockIdx.y; b < batch; b += gridDim.y) {
        const In* src = x + b * matrix;
        Out* dst = y + b * matrix;
        const int c = tile_c * kTile + threadIdx.x;
        for (int j = threadIdx.y; j < kTile; j += kTileRowsStep) {
            const int r = tile_r * kTile + j;
            if (r < rows && c < cols) tile[j][threadIdx.x] = to_float(src[r * cols + c]);
        }
        __syncthreads();
        const int r_out = tile_r * kTile + threadIdx.x;  // y's column: x's row
        for (int j = threadIdx.y; j < kTile; j += kTileRowsStep) {
            const int c_out = tile_c * kTile + j;         // y's row: x's column
            if (r_out < rows && c_out < cols)
                dst[c_out * rows + r_out] = from_float<Out>(tile[threadIdx.x][j]);
        }
        __syncthreads();  // (the tile is refilled for the next matrix)
    }
}

// Element i = blockIdx.x * 256 + threadIdx.x (n < 2^31, unsigned against the last block's
// overflow): y[i] = carry[i] (0 without one) + x[0][i] + x[1][i] + ..., in that order.
template <class In, class Out>
__global__ void batch_sum_kernel(const In* __restrict__ x, const float* carry, Out* y, int batch,
                                 int n) {
    const unsigned index = blockIdx.x * kSumThreads + threadIdx.x;
    if (index >= static_cast<unsigned>(n)) return;
    const int i = static_cast<int>(index);
    float sum = carry != nullptr ? carry[i] : 0.0f;
    for (int b = 0; b < batch; ++b) sum += to_float(x[static_cast<long long>(b) * n + i]);
    y[i] = from_float<Out>(sum);
}

// channels_last (channels_last.cuh): image blockIdx.y's tile blockIdx.x, a block of
// kVecThreads threads.
constexpr int kVecThreads = 256;
template <class T, bool kTf32Nearest>
__global__ void channels_last_kernel(const T* __restrict__ x, T* __restrict__ y, int channels,
                                     int pixels, int tiles_p) {
    __shared__ T tile[kVecTile][kVecTile + 1];
    channels_last_tile<T, kTf32Nearest>(x, y, channels, pixels, tiles_p, blockIdx.x, blockIdx.y,
                                         tile, threadIdx.x, kVecThreads);
}

}  // namespace

template <class In, class Out>
cudaError_t transpose_launch(const In* x, Out* y, int batch, int rows, int cols,
                             cudaStream_t stream) {
    const long long tiles_r = (rows + kTile - 1) / kTile, tiles_c = (cols + kTile - 1) / kTile;
    if (tiles_r * tiles_c > kMaxInt32Count) return cudaErrorInvalidValue;
    const dim3 grid(static_cast<unsigned>(tiles_r * tiles_c), batch < kMaxGridYZ ? batch : kMaxGridYZ);
    transpose_kernel<In, Out><<<grid, dim3(kTile, kTileRowsStep), 0, stream>>>(
        x, y, batch, rows, cols, static_cast<int>(tiles_c));
    return cudaGetLastError();
}

template <class T>
cudaError_t channels_last_launch(const T* x, T* y, int batch, int channels, int pixels,
                                 bool tf32_nearest, cudaStream_t stream) {
    const long long tiles_c = (channels + kVecTile - 1) / kVecTile;
    const long long tiles_p = (pixels + kVecTile - 1) / kVecTile;
    if (tiles_c * tiles_p > kMaxInt32Count || batch > kMaxGridYZ) return cudaErrorInvalidValue;
    if (batch <= 0 || tiles_c * tiles_p == 0) return cudaSuccess;
    const dim3 grid(static_cast<unsigned>(tiles_c * tiles_p), static_cast<unsigned>(batch));
    if constexpr (std::is_same_v<T, float>) {
        if (tf32_nearest) {
            channels_last_kernel<T, true><<<grid, kVecThreads, 0, stream>>>(
                x, y, channels, pixels, static_cast<int>(tiles_p));
            return cudaGetLastError();
        }
    }
    channels_last_kernel<T, false><<<grid, kVecThreads, 0, stream>>>(x, y, channels, pixels,
                                                                     static_cast<int>(tiles_p));
    return cudaGetLastError();
}

template <class In, class Out>
cudaError_t batch_sum_launch(const In* x, const float* carry, Out* y, int batch, int n,
                             cudaStream_t stream) {
    const int blocks = static_cast<int>((static_cast<long long>(n) + kSumThreads - 1) / kSumThreads);
    batch_sum_kernel<In, Out><<<blocks, kSumThreads, 0, stream>>>(x, carry, y, batch, n);
    return cudaGetLastError();
}

#define X(T)                                                                               \
    template cudaError_t transpose_launch<T, T>(const T*, T*, int, int, int, cudaStream_t); \
    template cudaError_t batch_sum_launch<T, T>(const T*, const float*, T*, int, int,       \
                                                cudaStream_t);                              \
    template cudaError_t channels_last_launch<T>(const T*, T*, int, int, int, bool,         \
                                                 cudaStream_t);
SCRATCHOPS_FOR_EACH_ELEMENT(X)
#undef X
// A float accumulator rounded into the half types' gradients (transposed, or summed over a
// batch of partial sums), and half partial sums added into a float accumulator (float to
// float is instantiated above).
#define X(T)                                                                                    \
    template cudaError_t transpose_launch<float, T>(const float*, T*, int, int, int,             \
                                                    cudaStream_t);                               \
    template cudaError_t batch_sum_launch<T, float>(const T*, const float*, float*, int, int,    \
                                                    cudaStream_t);                               \
    template cudaError_t batch_sum_launch<float, T>(const float*, const float*, T*, int, int,    \
                                                    cudaStream_t);
X(__half)
X(__nv_bfloat16)
#undef X

}  // namespace scratchops
