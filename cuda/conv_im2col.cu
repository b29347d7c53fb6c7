// conv_im2col.cu — the column matrix of a 2-D convolution (torch.nn.functional.unfold).
//
// Convolution as a matrix product: with K = C*kh*kw taps per output pixel and P = out_h*out_w
// output pixels, y[n] (Cout x P) = weight (Cout x K) @ cols[n] (K x P) + bias. This file
// builds cols; gemm.cu multiplies. conv2d_im2col_launch runs the two over chunks of the batch
// (or of one image's pixels) so that cols stays inside a bounded workspace.
//
// Element types: float, fp16 and bf16 (element.cuh). im2col copies elements of x's own type
// (no arithmetic); the GEMM widens them to float, accumulates in float and rounds y once.
//
// Versions, one idea each:
//   v1 per_element  one thread per element of cols, its position decoded from its index
//   v2 per_row      (default) one block per row of cols, decoded once; pixels walked by a step
//
// How each works:
//   v1 One thread per element of cols, in cols' own order, so the stores (the larger side:
//      every input element is written kh*kw times) are fully coalesced; the loads of a
//      warp walk one input row at the convolution's stride and mostly hit in L1/L2. Each
//      element decodes (b, c, kh, kw, oh, ow) from its index: six integer divisions by
//      run-time values, about 150 integer instructions per one-element store, so v1 is bound
//      by index arithmetic (docs/notes.md has the measured rate).
//   v2 One block per row (b, k) of cols: the block decodes (b, c, kh, kw) once, and each
//      thread walks its output pixels with (oh, ow) advanced by a precomputed step instead
//      of divided out per element, leaving a multiply-add, a bounds test, a load and a
//      store per element. Same access pattern as v1. conv2d's im2col path uses v2.

#include <type_traits>

#include "common.cuh"
#include "launchers.h"

namespace scratchops {
namespace {

constexpr int kIm2colThreads = 256;
constexpr int kConvIm2colVersion = 2;  // conv2d's im2col path uses the row version

// Tap k of the K = C*kernel_h*kernel_w rows of one image's columns, as F.unfold orders them:
// k = (c * kernel_h + kh) * kernel_w + kw.
struct Tap {
    int c, kh, kw;
};
__device__ __forceinline__ Tap decode_tap(int k, const Conv2dGeometry& g) {
    return {k / (g.kernel_w * g.kernel_h), (k / g.kernel_w) % g.kernel_h, k % g.kernel_w};
}

// Element e of cols (chunk of `batch` images and pixel_count output pixels) is
//   e = (b * K + k) * pixel_count + q,
// with k = (c * kernel_h + kh) * kernel_w + kw the tap and p = pixel_begin + q = oh * out_w + ow
// the output pixel. It reads x[b][c][ih][iw] with ih = oh*stride_h - pad_h + kh*dil_h and
// iw = ow*stride_w - pad_w + kw*dil_w, or 0 when (ih, iw) falls in the zero padding.
template <class T>
__global__ void im2col_kernel(const T* __restrict__ x, T* __restrict__ cols, int total,
                              Conv2dGeometry g, int pixel_begin, int pixel_count) {
    // Unsigned: the last block may pass 2^31 - 1 when total is close to it.
    const unsigned index = blockIdx.x * kIm2colThreads + threadIdx.x;
    if (index >= static_cast<unsigned>(total)) return;
    const int e = static_cast<int>(index);
    const int taps = g.channels * g.kernel_h * g.kernel_w;  // K
    const int q = e % pixel_count;
    const int bk = e / pixel_count;
    const int k = bk % taps;
    const int b = bk / taps;

    const int p = pixel_begin + q;
    const int oh = p / g.out_w, ow = p % g.out_w;
    const Tap t = decode_tap(k, g);

    const int ih = oh * g.stride_h - g.pad_h + t.kh * g.dil_h;
    const int iw = ow * g.stride_w - g.pad_w + t.kw * g.dil_w;
    const bool inside = ih >= 0 && ih < g.height && iw >= 0 && iw < g.width;
    cols[e] = inside ? x[((b * g.channels + t.c) * g.height + ih) * g.width + iw]
                     : from_float<T>(0.0f);
}

// Block r = blockIdx.x = b * K + k writes the row of image b and tap k,
// cols[r * pixel_count + q] for q in [0, pixel_count) (image b's own K x pixel_count matrix at
// b * K * pixel_count): thread t takes
// q = t, t + T, t + 2T, ... (T = blockDim.x), i.e. output pixels p = pixel_begin + q. Its
// (oh, ow) starts at divmod(pixel_begin + t, out_w) and moves by the constant step
// divmod(T, out_w) with one carry, never dividing again.
template <class T>
__global__ void im2col_rows_kernel(const T* __restrict__ x, T* __restrict__ cols,
                                   Conv2dGeometry g, int pixel_begin, int pixel_count) {
    const int row = blockIdx.x;
    const int taps = g.channels * g.kernel_h * g.kernel_w;  // K
    const int b = row / taps, k = row % taps;
    const Tap t = decode_tap(k, g);
    const T* plane = x + (b * g.channels + t.c) * g.height * g.width;  // < numel(x)
    T* out = cols + row * pixel_count;                                   // < numel(cols)
    // Input coordinates of output pixel (oh, ow) for this tap: ih = oh*stride_h + ih_offset.
    const int ih_offset = t.kh * g.dil_h - g.pad_h, iw_offset = t.kw * g.dil_w - g.pad_w;

    const int p0 = pixel_begin + threadIdx.x;
    int oh = p0 / g.out_w, ow = p0 % g.out_w;
    const int step_h = blockDim.x / g.out_w, step_w = blockDim.x % g.out_w;
    for (int q = threadIdx.x; q < pixel_count; q += blockDim.x) {
        const int ih = oh * g.stride_h + ih_offset;
        const int iw = ow * g.stride_w + iw_offset;
        const bool inside = ih >= 0 && ih < g.height && iw >= 0 && iw < g.width;
        out[q] = inside ? plane[ih * g.width + iw] : from_float<T>(0.0f);
        oh += step_h;
        ow += step_w;
        if (ow >= g.out_w) {  // step_w < out_w, so one carry suffices
            ow -= g.out_w;
            ++oh;
        }
    }
}

// Elements of the column chunk. im2col_launch refuses chunks of 2^31 or more, so both
// versions' 32-bit element offsets are safe.
long long cols_elements(int batch, const Conv2dGeometry& g, int pixel_count) {
    return static_cast<long long>(batch) * g.channels * g.kernel_h * g.kernel_w * pixel_count;
}

template <class T>
cudaError_t launch_v1_per_element(const T* x, T* cols, int batch, const Conv2dGeometry& g,
                                  int pixel_begin, int pixel_count, cudaStream_t stream) {
    const long long total = cols_elements(batch, g, pixel_count);
    const int blocks = static_cast<int>((total + kIm2colThreads - 1) / kIm2colThreads);
    im2col_kernel<<<blocks, kIm2colThreads, 0, stream>>>(x, cols, static_cast<int>(total), g,
                                                          pixel_begin, pixel_count);
    return cudaGetLastError();
}

template <class T>
cudaError_t launch_v2_rows(const T* x, T* cols, int batch, const Conv2dGeometry& g,
                           int pixel_begin, int pixel_count, cudaStream_t stream) {
    const int taps = g.channels * g.kernel_h * g.kernel_w;
    const int rows = batch * taps;  // < 2^31 (cols fits)
    im2col_rows_kernel<<<rows, kIm2colThreads, 0, stream>>>(x, cols, g, pixel_begin,
                                                             pixel_count);
    return cudaGetLastError();
}

// Chunk sizes for a workspace of `workspace_elements` elements (at least one column of K
// taps): as many whole images as fit, or, when one image's columns do not fit, that image's
// output pixels in slices.
struct Chunking {
    long long images, pixels;  // per chunk
};
Chunking chunking(int batch, const Conv2dGeometry& g, long long workspace_elements) {
    const long long taps = static_cast<long long>(g.channels) * g.kernel_h * g.kernel_w;
    const long long pixels = static_cast<long long>(g.out_h) * g.out_w;
    workspace_elements = workspace_elements > taps ? workspace_elements : taps;
    if (taps * pixels <= workspace_elements) {
        const long long fit = workspace_elements / (taps * pixels);
        return {fit < batch ? fit : batch, pixels};
    }
    return {1, workspace_elements / taps};
}

// Whether the columns and weights are rounded to TF32 before the GEMM: torch's TF32 switch,
// for float alone (the half types' products are exact in fp32).
template <class T>
constexpr bool rounds_to_tf32(bool tf32) {
    return tf32 && std::is_same_v<T, float>;
}

}  // namespace

// The columns' elements, then (TF32) the rounded weights' elements, 4-aligned.
template <class T>
long long conv2d_im2col_workspace_elements(int batch, int out_channels, const Conv2dGeometry& g,
                                           long long workspace_bytes, bool tf32) {
    const Chunking c = chunking(batch, g, workspace_bytes / static_cast<long long>(sizeof(T)));
    const long long taps = static_cast<long long>(g.channels) * g.kernel_h * g.kernel_w;
    const long long columns = (c.images * taps * c.pixels + 3) / 4 * 4;
    return columns + (rounds_to_tf32<T>(tf32) ? out_channels * taps : 0);
}

// y[n] = weight (Cout x K) @ cols[n] (K x P) + bias, chunk by chunk; the GEMM of a pixel slice
// writes a column slice of y[n] (leading dimension P).
template <class T>
cudaError_t conv2d_im2col_launch(const T* x, const T* weight, const T* bias, T* y, int batch,
                                 int out_channels, const Conv2dGeometry& g, int gemm_version,
                                 bool tf32, T* workspace, long long workspace_elements,
                                 cudaStream_t stream) {
    const long long taps = static_cast<long long>(g.channels) * g.kernel_h * g.kernel_w;
    const long long pixels = static_cast<long long>(g.out_h) * g.out_w;
    if constexpr (std::is_same_v<T, float>) {  // TF32 is float's alone (rounds_to_tf32)
        if (tf32) {  // the weights rounded to TF32 at the workspace's end; the columns in place
            workspace_elements -= out_channels * taps;
            float* rounded = workspace + workspace_elements;
            cudaError_t err = tf32_round_launch(weight, rounded, out_channels * taps, stream);
            if (err != cudaSuccess) return err;
            weight = rounded;
            workspace_elements = workspace_elements / 4 * 4;
        }
    }
    const Chunking c = chunking(batch, g, workspace_elements);
    const long long image_elements = static_cast<long long>(g.channels) * g.height * g.width;
    for (long long n0 = 0; n0 < batch; n0 += c.images) {
        const long long images = batch - n0 < c.images ? batch - n0 : c.images;
        for (long long p0 = 0; p0 < pixels; p0 += c.pixels) {
            const long long count = pixels - p0 < c.pixels ? pixels - p0 : c.pixels;
            cudaError_t err = im2col_launch(kConvIm2colVersion, x + n0 * image_elements,
                                            workspace, static_cast<int>(images), g,
                                            static_cast<int>(p0), static_cast<int>(count), stream);
            if (err != cudaSuccess) return err;
            if constexpr (std::is_same_v<T, float>) {
                if (tf32)
                    err = tf32_round_launch(workspace, workspace, images * taps * count, stream);
                if (err != cudaSuccess) return err;
            }
            const int k = static_cast<int>(taps), columns = static_cast<int>(count);
            const GemmArgs<T> gemm{weight, workspace, bias, y + n0 * out_channels * pixels + p0,
                                   out_channels, columns, k, /*lda=*/k, /*ldb=*/columns,
                                   /*ldc=*/static_cast<int>(pixels), /*stride_a=*/0,
                                   /*stride_b=*/taps * count, /*stride_c=*/out_channels * pixels,
                                   static_cast<int>(images)};
            err = gemm_launch(gemm_version, gemm, nullptr, 0, stream);
            if (err != cudaSuccess) return err;
        }
    }
    return cudaSuccess;
}

template <class T>
cudaError_t im2col_launch(int version, const T* x, T* cols, int batch, const Conv2dGeometry& g,
                          int pixel_begin, int pixel_count, cudaStream_t stream) {
    // Kept although the binding checks its output's size: conv2d_im2col_launch's chunks are
    // sized by a caller's workspace budget, which may allow more than 2^31 elements.
    if (cols_elements(batch, g, pixel_count) > kMaxInt32Count) return cudaErrorInvalidValue;
    switch (version) {
        case 1: return launch_v1_per_element(x, cols, batch, g, pixel_begin, pixel_count, stream);
        case 2: return launch_v2_rows(x, cols, batch, g, pixel_begin, pixel_count, stream);
        default: return cudaErrorInvalidValue;
    }
}

#define X(T)                                                                                  \
    template cudaError_t im2col_launch<T>(int, const T*, T*, int, const Conv2dGeometry&, int, \
                                          int, cudaStream_t);                                 \
    template long long conv2d_im2col_workspace_elements<T>(int, int, const Conv2dGeometry&,   \
                                                           long long, bool);                  \
    template cudaError_t conv2d_im2col_launch<T>(const T*, const T*, const T*, T*, int, int,  \
                                                 const Conv2dGeometry&, int, bool, T*,        \
                                                 long long, cudaStream_t);
SCRATCHOPS_FOR_EACH_ELEMENT(X)
#undef X

}  // namespace scratchops
