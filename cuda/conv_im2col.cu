// conv_im2col.cu — the column matrix of a 2-D convolution (torch.nn.functional.unfold).
//
// Convolution as a matrix product: with K = C*kh*kw taps per output pixel and P = out_h*out_w
// output pixels, y[n] (Cout x P) = weight (Cout x K) @ cols[n] (K x P) + bias. This file
// builds cols; gemm.cu multiplies. The binding runs the two over chunks of the batch (or of
// one image's pixels) so that cols stays inside a bounded workspace.
//
// Versions:
//   v1 one thread per element of cols, in cols' own order, so the stores (the larger side:
//      every input element is written kh*kw times) are fully coalesced; the loads of a
//      warp walk one input row at the convolution's stride and mostly hit in L1/L2.

#include "launchers.h"

namespace scratchops {
namespace {

constexpr int kIm2colThreads = 256;

// Element e of cols (chunk of `batch` images and pixel_count output pixels) is
//   e = (b * K + k) * pixel_count + q,
// with k = (c * kernel_h + kh) * kernel_w + kw the tap and p = pixel_begin + q = oh * out_w + ow
// the output pixel. It reads x[b][c][ih][iw] with ih = oh*stride_h - pad_h + kh*dil_h and
// iw = ow*stride_w - pad_w + kw*dil_w, or 0 when (ih, iw) falls in the zero padding.
__global__ void im2col_kernel(const float* __restrict__ x, float* __restrict__ cols, int total,
                              Conv2dGeometry g, int pixel_begin, int pixel_count) {
    const int e = blockIdx.x * kIm2colThreads + threadIdx.x;
    if (e >= total) return;
    const int taps = g.channels * g.kernel_h * g.kernel_w;  // K
    const int q = e % pixel_count;
    const int bk = e / pixel_count;
    const int k = bk % taps;
    const int b = bk / taps;

    const int p = pixel_begin + q;
    const int oh = p / g.out_w, ow = p % g.out_w;
    const int kw = k % g.kernel_w;
    const int kh = (k / g.kernel_w) % g.kernel_h;
    const int c = k / (g.kernel_w * g.kernel_h);

    const int ih = oh * g.stride_h - g.pad_h + kh * g.dil_h;
    const int iw = ow * g.stride_w - g.pad_w + kw * g.dil_w;
    const bool inside = ih >= 0 && ih < g.height && iw >= 0 && iw < g.width;
    cols[e] = inside ? x[((b * g.channels + c) * g.height + ih) * g.width + iw] : 0.0f;
}

}  // namespace

cudaError_t im2col_launch(const float* x, float* cols, int batch, const Conv2dGeometry& g,
                          int pixel_begin, int pixel_count, cudaStream_t stream) {
    // The caller guarantees batch * K * pixel_count < 2^31 (cols is one buffer).
    const long long total =
        static_cast<long long>(batch) * g.channels * g.kernel_h * g.kernel_w * pixel_count;
    if (total <= 0) return cudaSuccess;
    if (total > 0x7fffffffLL) return cudaErrorInvalidValue;
    const int blocks = static_cast<int>((total + kIm2colThreads - 1) / kIm2colThreads);
    im2col_kernel<<<blocks, kIm2colThreads, 0, stream>>>(x, cols, static_cast<int>(total), g,
                                                          pixel_begin, pixel_count);
    return cudaGetLastError();
}

}  // namespace scratchops
