// pool_clamp_backward.cu — the input gradients of max pooling and clamping (pool_clamp.cu).
//
//   max_pool2d_clamp_backward: y = clamp(max_pool2d(x), lo, hi). The clamp passes dy where the
//       window's maximum lies within [lo, hi] (common.cuh: clamp_passes_gradient, torch's
//       rule), and the pool hands it to the window's maximum: to the first maximum in the
//       window's row-major order (a later equal value does not replace it), or to the last NaN
//       where the window holds one, exactly as torch's max_pool2d records its index. An input
//       element gets the sum of what every window that chose it hands it; the others get 0.
//   clamp_backward: dx = dy where clamp_passes_gradient(x), 0 elsewhere.
// The bounds are compared in the element type, rounded to it, as torch compares a half tensor
// with a number (x >= min: the number cast to the tensor's type): in bf16, -0.3 is -0.30078125,
// and a value equal to that rounded bound passes its gradient.
//
// Deterministic, no atomics: the pool's backward is a gather. Pass 1 gives each window (one
// thread each) its chosen element's position and the gradient the clamp lets through, into a
// workspace; pass 2 gives each input element (one thread each) the sum over the windows that
// cover it of what they route to it, in window order. With torch's 4 x 4, stride-4 windows of
// P85 an element is in at most one window; overlapping windows (stride < kernel) add up.
//
// Element types: float, fp16 and bf16 (element.cuh): comparisons and sums in float, dx rounded
// to the type once.
//
// Versions, one idea each (one version each here):
//   max_pool2d_clamp_backward v1 gather  the two passes above, one thread per window, then one
//                                        per input element
//   clamp_backward v1                    one thread per element

#include "common.cuh"
#include "launchers.h"

namespace scratchops {
namespace {

constexpr int kThreads = 256;

// Window e (of planes x out_h x out_w, NCHW order): the position (ih * W + iw, in its plane) of
// the element its maximum is taken from, scanning the window's rows and columns inside the
// input in order (taps in the padding are skipped, as the forward's -inf padding never wins),
// and dy[e] if the clamp passes the maximum's gradient, else 0.
template <class T>
__global__ void window_choice_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                     int* __restrict__ chosen, float* __restrict__ routed,
                                     int total, PoolGeometry g, float lo, float hi) {
    const unsigned index = blockIdx.x * kThreads + threadIdx.x;
    if (index >= static_cast<unsigned>(total)) return;
    const int e = static_cast<int>(index);
    const PlanePosition out = plane_position(e, g.out_h, g.out_w);
    const int oh = out.row, ow = out.col;
    const T* src = x + out.plane * g.height * g.width;  // < numel(x)
    const int h0 = max(oh * g.stride_h - g.pad_h, 0), w0 = max(ow * g.stride_w - g.pad_w, 0);
    const int h1 = min(oh * g.stride_h - g.pad_h + g.kernel_h, g.height);
    const int w1 = min(ow * g.stride_w - g.pad_w + g.kernel_w, g.width);
    float best = -INFINITY;
    int where = h0 * g.width + w0;  // (every window holds at least one input element)
    for (int ih = h0; ih < h1; ++ih)
        for (int iw = w0; iw < w1; ++iw) {
            const float v = to_float(src[ih * g.width + iw]);
            if (v > best || v != v) {  // torch's test: a greater value, or any NaN
                best = v;
                where = ih * g.width + iw;
            }
        }
    chosen[e] = where;
    routed[e] = clamp_passes_gradient(best, rounded<T>(lo), rounded<T>(hi)) ? to_float(dy[e])
                                                                             : 0.0f;
}

// Input element e = (plane * H + h) * W + w: the windows (oh, ow) covering (h, w) are those
// with oh*stride_h - pad_h <= h < oh*stride_h - pad_h + kernel_h, i.e. oh from
// ceil((h + pad_h - kernel_h + 1) / stride_h) (at least 0) through floor((h + pad_h) /
// stride_h) (below out_h); columns likewise. Sums routed[] of those that chose (h, w).
template <class T>
__global__ void window_gather_kernel(const int* __restrict__ chosen,
                                     const float* __restrict__ routed, T* __restrict__ dx,
                                     int total, PoolGeometry g) {
    const unsigned index = blockIdx.x * kThreads + threadIdx.x;
    if (index >= static_cast<unsigned>(total)) return;
    const int e = static_cast<int>(index);
    const PlanePosition in = plane_position(e, g.height, g.width);
    const int h = in.row, w = in.col, plane = in.plane;
    const int oh0 = h + g.pad_h < g.kernel_h ? 0 : (h + g.pad_h - g.kernel_h) / g.stride_h + 1;
    const int ow0 = w + g.pad_w < g.kernel_w ? 0 : (w + g.pad_w - g.kernel_w) / g.stride_w + 1;
    const int oh1 = min((h + g.pad_h) / g.stride_h + 1, g.out_h);
    const int ow1 = min((w + g.pad_w) / g.stride_w + 1, g.out_w);
    const int self = h * g.width + w;
    const int windows = plane * g.out_h * g.out_w;  // the plane's first window
    float sum = 0.0f;
    for (int oh = oh0; oh < oh1; ++oh)
        for (int ow = ow0; ow < ow1; ++ow) {
            const int window = windows + oh * g.out_w + ow;
            if (chosen[window] == self) sum += routed[window];
        }
    dx[e] = from_float<T>(sum);
}

template <class T>
__global__ void clamp_backward_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                      T* __restrict__ dx, int n, float lo, float hi) {
    const unsigned index = blockIdx.x * kThreads + threadIdx.x;
    if (index >= static_cast<unsigned>(n)) return;
    const int i = static_cast<int>(index);
    dx[i] = clamp_passes_gradient(to_float(x[i]), rounded<T>(lo), rounded<T>(hi))
                ? dy[i]
                : from_float<T>(0.0f);
}

int blocks_for(long long n) { return static_cast<int>((n + kThreads - 1) / kThreads); }

}  // namespace

long long max_pool2d_clamp_backward_workspace_bytes(int planes, const PoolGeometry& g) {
    const long long windows = static_cast<long long>(planes) * g.out_h * g.out_w;
    return windows * static_cast<long long>(sizeof(int) + sizeof(float));
}

template <class T>
cudaError_t max_pool2d_clamp_backward_launch(const T* dy, const T* x, T* dx, int planes,
                                             const PoolGeometry& g, float lo, float hi,
                                             void* workspace, cudaStream_t stream) {
    const long long windows = static_cast<long long>(planes) * g.out_h * g.out_w;
    const long long inputs = static_cast<long long>(planes) * g.height * g.width;
    int* chosen = static_cast<int*>(workspace);
    float* routed = reinterpret_cast<float*>(chosen + windows);
    window_choice_kernel<T><<<blocks_for(windows), kThreads, 0, stream>>>(
        dy, x, chosen, routed, static_cast<int>(windows), g, lo, hi);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    window_gather_kernel<T><<<blocks_for(inputs), kThreads, 0, stream>>>(
        chosen, routed, dx, static_cast<int>(inputs), g);
    return cudaGetLastError();
}

template <class T>
cudaError_t clamp_backward_launch(const T* dy, const T* x, T* dx, int n, float lo, float hi,
                                  cudaStream_t stream) {
    clamp_backward_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(dy, x, dx, n, lo, hi);
    return cudaGetLastError();
}

#define X(T)                                                                                 \
    template cudaError_t max_pool2d_clamp_backward_launch<T>(                                \
        const T*, const T*, T*, int, const PoolGeometry&, float, float, void*, cudaStream_t); \
    template cudaError_t clamp_backward_launch<T>(const T*, const T*, T*, int, float, float, \
                                                  cudaStream_t);
SCRATCHOPS_FOR_EACH_ELEMENT(X)
#undef X

}  // namespace scratchops
