// pool_clamp.cu — 2-D max pooling and clamping, alone or fused (P85's MaxPool2d -> clamp).
//
//   max_pool2d_clamp: y[n,c,oh,ow] = clamp(max over the window of x, lo, hi), with the window
//       rows oh*stride_h - pad_h + [0, kernel_h) and columns likewise; taps in the padding
//       are skipped (torch pads with -inf). floor mode, dilation 1. Plain max_pool2d is this
//       kernel with lo = -inf and hi = +inf (the clamp then changes nothing, NaN included).
//   clamp: y = min(max(x, lo), hi) elementwise over any contiguous tensor, as torch.clamp
//       (so lo > hi gives hi everywhere).
// NaN propagates as in torch: a window holding a NaN gives NaN, and clamp(NaN) is NaN.
// Element types: float, fp16 and bf16 (element.cuh). Comparisons are in float whatever the
// type (each value widened as it is read) and the result is rounded to the element type once,
// as it is stored; the maximum of a window is one of its values, so only a clamp to a bound
// that the type cannot hold rounds.
//
// Versions of the max pool, one idea each (both give each thread one output and share the
// window loop; they differ in how threads map onto the output):
//   v1 output_grid  a thread grid shaped like the output: (column, row, plane) = (x, y, z)
//   v2 flat         (default) a 1-D grid over the output in memory order, position decoded
// clamp has one version: one thread per four elements.
//
// How each works:
//   v1 output_grid  The grid has the output's shape: x along a row, y down the rows, z over
//                   the (n, c) planes, in 16 x 16 blocks. Nothing to decode, but a warp covers
//                   two half-rows (two store segments, not one), the threads past a row's end
//                   idle when the output width is not a multiple of 16 (P85's pooled rows are
//                   31 wide), and gridDim.y and gridDim.z stop at 65535, so rows and planes
//                   are walked with grid-stride loops.
//   v2 flat         A 1-D grid over the output in NCHW order: a warp's 32 stores are
//                   one contiguous run whatever the width, only the last block has idle
//                   threads and no grid limit applies; the price is decoding (n*C + c, oh, ow)
//                   from the index with a division and two remainders. A warp's loads walk a
//                   few input rows at the pool's stride (cache lines reused across the
//                   kernel_w taps through L1).
//   clamp           One thread per four elements (one load and one store of 4 elements each,
//                   16 bytes for float and 8 for the half types, when the pointers are aligned
//                   to that), the last n % 4 elements by the first threads.

#include <math.h>

#include "common.cuh"
#include "launchers.h"

namespace scratchops {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float clamp_nan(float v, float lo, float hi) {
    return nan_min(nan_max(v, lo), hi);
}

// The clamped maximum of the window of output (oh, ow) in the input plane `src`.
template <class T>
__device__ __forceinline__ float window_max(const T* src, const PoolGeometry& g, int oh, int ow,
                                            float lo, float hi) {
    const int h0 = oh * g.stride_h - g.pad_h, w0 = ow * g.stride_w - g.pad_w;
    float m = -INFINITY;
    for (int i = 0; i < g.kernel_h; ++i) {
        const int ih = h0 + i;
        if (ih < 0 || ih >= g.height) continue;
        for (int j = 0; j < g.kernel_w; ++j) {
            const int iw = w0 + j;
            if (iw >= 0 && iw < g.width) m = nan_max(m, to_float(src[ih * g.width + iw]));
        }
    }
    return clamp_nan(m, lo, hi);
}

// ------------------------------------------------------------------ v1: output grid
constexpr int kBlockSide = 16;  // 16 x 16 threads per block

// Thread (ow, oh) of block (bx, by, bz) handles output column ow = bx*16 + tx, rows oh =
// by*16 + ty + k*gridDim.y*16 and planes bz + k*gridDim.z. (Unsigned counters: a step past
// the last row or plane may pass 2^31 - 1.)
template <class T>
__global__ void max_pool2d_clamp_grid_kernel(const T* __restrict__ x, T* __restrict__ y,
                                             int planes, PoolGeometry g, float lo, float hi) {
    const unsigned ow = blockIdx.x * kBlockSide + threadIdx.x;
    if (ow >= static_cast<unsigned>(g.out_w)) return;
    for (unsigned p = blockIdx.z; p < static_cast<unsigned>(planes); p += gridDim.z) {
        const int plane = static_cast<int>(p);
        const T* src = x + plane * g.height * g.width;  // < numel(x) < 2^31
        for (unsigned oh = blockIdx.y * kBlockSide + threadIdx.y;
             oh < static_cast<unsigned>(g.out_h);
             oh += gridDim.y * kBlockSide) {
            const int e = (plane * g.out_h + static_cast<int>(oh)) * g.out_w + static_cast<int>(ow);
            y[e] = from_float<T>(
                window_max(src, g, static_cast<int>(oh), static_cast<int>(ow), lo, hi));
        }
    }
}

// ------------------------------------------------------------------------- v2: flat
// Element e of y, in NCHW order: ow = e % out_w, oh = (e / out_w) % out_h, and
// plane = e / (out_h * out_w) = n * C + c, whose input plane starts at plane * H * W.
template <class T>
__global__ void max_pool2d_clamp_kernel(const T* __restrict__ x, T* __restrict__ y, int total,
                                        PoolGeometry g, float lo, float hi) {
    // Unsigned: the last block may pass 2^31 - 1 when total is close to it.
    const unsigned index = blockIdx.x * kThreads + threadIdx.x;
    if (index >= static_cast<unsigned>(total)) return;
    const int e = static_cast<int>(index);
    const int ow = e % g.out_w;
    const int oh = (e / g.out_w) % g.out_h;
    const int plane = e / (g.out_w * g.out_h);
    const T* src = x + plane * g.height * g.width;  // < numel(x)
    y[e] = from_float<T>(window_max(src, g, oh, ow, lo, hi));
}

// ------------------------------------------------------------------------------ clamp
// x[i] clamped, rounded to T.
template <class T>
__device__ __forceinline__ T clamped(const T* __restrict__ x, unsigned i, float lo, float hi) {
    return from_float<T>(clamp_nan(to_float(x[i]), lo, hi));
}

template <class T>
__global__ void clamp_kernel(const T* __restrict__ x, T* __restrict__ y, int n, bool vectorized,
                             float lo, float hi) {
    // Unsigned: the last block may pass 2^31 - 1 when n is close to it.
    const unsigned t = blockIdx.x * kThreads + threadIdx.x;
    if (!vectorized) {
        if (t < static_cast<unsigned>(n)) y[t] = clamped(x, t, lo, hi);
        return;
    }
    const unsigned n4 = n / 4;
    if (t < n4) {
        float4 v = load4(reinterpret_cast<const FourElements<T>*>(x)[t].e);
        v.x = clamp_nan(v.x, lo, hi);
        v.y = clamp_nan(v.y, lo, hi);
        v.z = clamp_nan(v.z, lo, hi);
        v.w = clamp_nan(v.w, lo, hi);
        store4(reinterpret_cast<FourElements<T>*>(y)[t].e, v);
    }
    if (t < n % 4u) y[4 * n4 + t] = clamped(x, 4 * n4 + t, lo, hi);  // the tail
}

}  // namespace

template <class T>
cudaError_t max_pool2d_clamp_launch(int version, const T* x, T* y, int planes,
                                    const PoolGeometry& g, float lo, float hi,
                                    cudaStream_t stream) {
    const int total = planes * g.out_h * g.out_w;  // the elements of y, < 2^31
    if (version == 1) {
        const int col_blocks = (g.out_w - 1) / kBlockSide + 1;
        const int row_blocks = (g.out_h - 1) / kBlockSide + 1;
        const dim3 grid(col_blocks, row_blocks < kMaxGridYZ ? row_blocks : kMaxGridYZ,
                        planes < kMaxGridYZ ? planes : kMaxGridYZ);
        max_pool2d_clamp_grid_kernel<T><<<grid, dim3(kBlockSide, kBlockSide), 0, stream>>>(
            x, y, planes, g, lo, hi);
    } else if (version == 2) {
        max_pool2d_clamp_kernel<T><<<(total - 1) / kThreads + 1, kThreads, 0, stream>>>(
            x, y, total, g, lo, hi);
    } else {
        return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

template <class T>
cudaError_t clamp_launch(const T* x, T* y, int n, float lo, float hi, cudaStream_t stream) {
    const bool vectorized = vector_aligned<T>(x) && vector_aligned<T>(y);
    const int threads_needed = vectorized ? (n / 4 > n % 4 ? n / 4 : n % 4) : n;
    const int blocks = (threads_needed - 1) / kThreads + 1;  // (n + kThreads - 1 may overflow)
    clamp_kernel<T><<<blocks, kThreads, 0, stream>>>(x, y, n, vectorized, lo, hi);
    return cudaGetLastError();
}

#define X(T)                                                                                     \
    template cudaError_t max_pool2d_clamp_launch<T>(int, const T*, T*, int, const PoolGeometry&, \
                                                    float, float, cudaStream_t);                 \
    template cudaError_t clamp_launch<T>(const T*, T*, int, float, float, cudaStream_t);
SCRATCHOPS_FOR_EACH_ELEMENT(X)
#undef X

}  // namespace scratchops
