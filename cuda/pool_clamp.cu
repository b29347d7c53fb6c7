// pool_clamp.cu — 2-D max pooling and clamping, alone or fused (P85's MaxPool2d -> clamp).
//
//   max_pool2d_clamp: y[n,c,oh,ow] = clamp(max over the window of x, lo, hi), with the window
//       rows oh*stride_h - pad_h + [0, kernel_h) and columns likewise; taps in the padding
//       are skipped (torch pads with -inf). floor mode, dilation 1. Plain max_pool2d is this
//       kernel with lo = -inf and hi = +inf (the clamp then changes nothing, NaN included).
//   clamp: y = min(max(x, lo), hi) elementwise over any contiguous tensor, as torch.clamp
//       (so lo > hi gives hi everywhere).
// NaN propagates as in torch: a window holding a NaN gives NaN, and clamp(NaN) is NaN.
//
// Versions:
//   v1 max pool: one thread per output element in output order, so stores are coalesced and
//      a warp's loads walk a few input rows at the pool's stride (cache lines reused across
//      the kernel_w taps through L1). clamp: one thread per float4 (16-byte loads and stores
//      when the pointers are aligned), the last n % 4 elements by the first threads.

#include <math.h>

#include "common.cuh"
#include "launchers.h"

namespace scratchops {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float clamp_nan(float v, float lo, float hi) {
    return nan_min(nan_max(v, lo), hi);
}

// Element e of y, in NCHW order: ow = e % out_w, oh = (e / out_w) % out_h, and
// plane = e / (out_h * out_w) = n * C + c, whose input plane starts at plane * H * W.
__global__ void max_pool2d_clamp_kernel(const float* __restrict__ x, float* __restrict__ y,
                                        int total, PoolGeometry g, float lo, float hi) {
    // Unsigned: the last block may pass 2^31 - 1 when total is close to it.
    const unsigned index = blockIdx.x * kThreads + threadIdx.x;
    if (index >= static_cast<unsigned>(total)) return;
    const int e = static_cast<int>(index);
    const int ow = e % g.out_w;
    const int oh = (e / g.out_w) % g.out_h;
    const int plane = e / (g.out_w * g.out_h);
    const float* src = x + plane * g.height * g.width;  // < numel(x) < 2^31
    const int h0 = oh * g.stride_h - g.pad_h, w0 = ow * g.stride_w - g.pad_w;
    float m = -INFINITY;
    for (int i = 0; i < g.kernel_h; ++i) {
        const int ih = h0 + i;
        if (ih < 0 || ih >= g.height) continue;
        for (int j = 0; j < g.kernel_w; ++j) {
            const int iw = w0 + j;
            if (iw >= 0 && iw < g.width) m = nan_max(m, src[ih * g.width + iw]);
        }
    }
    y[e] = clamp_nan(m, lo, hi);
}

__global__ void clamp_kernel(const float* __restrict__ x, float* __restrict__ y, int n,
                             bool vectorized, float lo, float hi) {
    // Unsigned: the last block may pass 2^31 - 1 when n is close to it.
    const unsigned t = blockIdx.x * kThreads + threadIdx.x;
    if (!vectorized) {
        if (t < static_cast<unsigned>(n)) y[t] = clamp_nan(x[t], lo, hi);
        return;
    }
    const unsigned n4 = n / 4;
    if (t < n4) {
        float4 v = reinterpret_cast<const float4*>(x)[t];
        v.x = clamp_nan(v.x, lo, hi);
        v.y = clamp_nan(v.y, lo, hi);
        v.z = clamp_nan(v.z, lo, hi);
        v.w = clamp_nan(v.w, lo, hi);
        reinterpret_cast<float4*>(y)[t] = v;
    }
    if (t < n % 4u) y[4 * n4 + t] = clamp_nan(x[4 * n4 + t], lo, hi);  // the tail
}

}  // namespace

cudaError_t max_pool2d_clamp_launch(const float* x, float* y, int planes, const PoolGeometry& g,
                                    float lo, float hi, cudaStream_t stream) {
    const int total = planes * g.out_h * g.out_w;  // the elements of y, < 2^31
    max_pool2d_clamp_kernel<<<(total - 1) / kThreads + 1, kThreads, 0, stream>>>(
        x, y, total, g, lo, hi);
    return cudaGetLastError();
}

cudaError_t clamp_launch(const float* x, float* y, int n, float lo, float hi,
                         cudaStream_t stream) {
    const bool vectorized = aligned16(x) && aligned16(y);
    const int threads_needed = vectorized ? (n / 4 > n % 4 ? n / 4 : n % 4) : n;
    const int blocks = (threads_needed - 1) / kThreads + 1;  // (n + kThreads - 1 may overflow)
    clamp_kernel<<<blocks, kThreads, 0, stream>>>(x, y, n, vectorized, lo, hi);
    return cudaGetLastError();
}

}  // namespace scratchops
