// conv_backward_tensor_cores.cuh — conv_backward.cu's v2, the convolution gradients on the
// tensor cores (the versions and their reasons are listed at the top of conv_backward.cu): the
// input gradient as a convolution of dy on the implicit GEMM, the weight gradient in ordered
// slices on gemm v9. Included by conv_backward.cu after the helpers both versions share
// (GradShape, aligned_elements, the flipped weights' geometry and workspace).
#pragma once

namespace scratchops {
namespace {

// Weight gradient v2, one chunk of `images` images: its pixels padded to whole slices, and its
// workspace after the float accumulator: the columns side by side (K x padded), dyᵀ
// (padded x Cout), one partial dWᵀ (K x Cout) per slice, and gemm v9's packing of dyᵀ.
struct SlicedChunk {
    long long padded;
    int slices;
    long long cols, dy_t, partials, pack;  // elements of T, each piece 16-byte aligned
    long long elements() const { return cols + dy_t + partials + pack; }
};
// The batched GEMM of one chunk: entry e = slice e, partial[e] (K x Cout) = cols[:, slice e]
// (K x kWeightGradSlice, rows `padded` apart) @ dyᵀ[slice e] (kWeightGradSlice x Cout).
template <class T>
GemmArgs<T> slice_gemm(const T* cols, const T* dy_t, T* partials, const GradShape& s,
                       int out_channels, long long padded, int slices, TensorCorePath engine) {
    GemmArgs<T> gemm{cols, dy_t, nullptr, partials, static_cast<int>(s.taps), out_channels,
                     kWeightGradSlice, /*lda=*/static_cast<int>(padded), /*ldb=*/out_channels,
                     /*ldc=*/out_channels, /*stride_a=*/kWeightGradSlice,
                     /*stride_b=*/static_cast<long long>(kWeightGradSlice) * out_channels,
                     /*stride_c=*/s.taps * out_channels, slices};
    gemm.engine = engine;
    return gemm;
}
template <class T>
SlicedChunk sliced_chunk(long long images, int out_channels, const Conv2dGeometry& g) {
    const GradShape s = grad_shape(g);
    SlicedChunk c{};
    c.slices = static_cast<int>((images * s.pixels + kWeightGradSlice - 1) / kWeightGradSlice);
    c.padded = static_cast<long long>(c.slices) * kWeightGradSlice;
    const long long bytes = sizeof(T);
    c.cols = aligned_elements<T>(s.taps * c.padded * bytes);
    c.dy_t = aligned_elements<T>(c.padded * out_channels * bytes);
    c.partials = aligned_elements<T>(c.slices * s.taps * out_channels * bytes);
    const GemmArgs<T> gemm = slice_gemm<T>(nullptr, nullptr, nullptr, s, out_channels, c.padded,
                                           c.slices, TensorCorePath::kWgmma);
    c.pack = aligned_elements<T>(
        gemm_workspace_bytes<T>(kGemmTensorCoreVersion, gemm, 1LL << 62));
    return c;
}
// Whether a chunk of `images` fits `available` elements and 32-bit offsets (the columns,
// dyᵀ and the partials each below 2^31 elements).
template <class T>
bool sliced_chunk_fits(long long images, int out_channels, const Conv2dGeometry& g,
                       long long available) {
    const GradShape s = grad_shape(g);
    const SlicedChunk c = sliced_chunk<T>(images, out_channels, g);
    return c.elements() <= available && s.taps * c.padded <= kMaxInt32Count &&
           c.padded * out_channels <= kMaxInt32Count &&
           c.slices * s.taps * out_channels <= kMaxInt32Count;
}
// The most images (at least one) whose chunk fits: a binary search, the size growing with
// the images.
template <class T>
long long sliced_images(int batch, int out_channels, const Conv2dGeometry& g,
                        long long available) {
    long long lo = 1, hi = batch > 1 ? batch : 1;
    while (lo < hi) {
        const long long mid = (lo + hi + 1) / 2;
        if (sliced_chunk_fits<T>(mid, out_channels, g, available)) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}
template <class T>
long long weight_grad_fixed(int out_channels, const Conv2dGeometry& g) {  // the accumulator
    return aligned_elements<T>(grad_shape(g).taps * out_channels *
                               static_cast<long long>(sizeof(float)));
}

// Input gradient v2: dx = conv2d(dy, Wf, padding dil*(k-1) - pad) on the tensor cores.
template <class T>
cudaError_t input_grad_as_convolution(const T* dy, const T* weight, T* dx, int batch,
                                      int out_channels, const Conv2dGeometry& g,
                                      TensorCorePath engine, T* workspace, cudaStream_t stream) {
    const Conv2dGeometry flipped_g = input_grad_geometry(g, out_channels);
    const FlippedWeights f = flipped_weights<T>(out_channels, g);
    T* flipped = workspace;
    const int total = g.channels * out_channels * g.kernel_h * g.kernel_w;
    flip_weights_kernel<T><<<(total + kFlipThreads - 1) / kFlipThreads, kFlipThreads, 0,
                             stream>>>(weight, flipped, total, out_channels, g.channels,
                                       g.kernel_h, g.kernel_w);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    void* packed = workspace + f.flipped;
    err = conv2d_implicit_pack<T>(flipped, g.channels, flipped_g, engine, /*staged=*/false,
                                  packed, stream);
    if (err != cudaSuccess) return err;
    return conv2d_implicit_launch<T>(dy, packed, nullptr, dx, batch, g.channels, flipped_g,
                                     ConvTail<T>{ConvTail<T>::kNone, 0.0f, nullptr, 1.0f},
                                     /*tf32=*/false, engine, stream,
                                     /*group_k_blocks=*/false);
}

// Weight gradient v2: over chunks of images, the columns side by side, dyᵀ, one partial dWᵀ
// per slice of kWeightGradSlice pixels (gemm v9), the partials added in slice order.
template <class T>
cudaError_t weight_grad_sliced(const T* dy, const T* x, T* dweight, int batch, int out_channels,
                               const Conv2dGeometry& g, TensorCorePath engine, T* workspace,
                               long long workspace_elements, cudaStream_t stream) {
    const GradShape s = grad_shape(g);
    const long long kc = s.taps * out_channels;
    const long long fixed = weight_grad_fixed<T>(out_channels, g);
    const long long images = sliced_images<T>(batch, out_channels, g, workspace_elements - fixed);
    float* accumulator = reinterpret_cast<float*>(workspace);
    const long long image_elements = static_cast<long long>(g.channels) * g.height * g.width;
    cudaError_t err = cudaSuccess;
    if (batch == 0)  // an empty batch: dW = 0 (a sum of no partials)
        err = batch_sum_launch<T, float>(nullptr, nullptr, accumulator, 0, static_cast<int>(kc),
                                         stream);
    for (long long n0 = 0; n0 < batch && err == cudaSuccess; n0 += images) {
        const int count = static_cast<int>(batch - n0 < images ? batch - n0 : images);
        const SlicedChunk c = sliced_chunk<T>(count, out_channels, g);
        T* cols = workspace + fixed;
        T* dy_t = cols + c.cols;
        T* partials = dy_t + c.dy_t;
        T* pack = partials + c.partials;
        const long long pixels = count * s.pixels;
        // The padding past the chunk's pixels is zero in both operands (0 * anything left in
        // the workspace could be NaN).
        err = cudaMemset2DAsync(cols + pixels, c.padded * sizeof(T), 0,
                                (c.padded - pixels) * sizeof(T), s.taps, stream);
        if (err == cudaSuccess)
            err = cudaMemsetAsync(dy_t + pixels * out_channels, 0,
                                  (c.padded - pixels) * out_channels * sizeof(T), stream);
        if (err == cudaSuccess)
            err = im2col_side_by_side_launch(x + n0 * image_elements, cols, count, g, c.padded,
                                             stream);
        if (err == cudaSuccess)  // dyᵀ: image b's P x Cout block at rows b*P
            err = transpose_launch<T, T>(dy + n0 * out_channels * s.pixels, dy_t, count,
                                         out_channels, static_cast<int>(s.pixels), stream);
        if (err == cudaSuccess)
            err = gemm_launch(kGemmTensorCoreVersion,
                              slice_gemm<T>(cols, dy_t, partials, s, out_channels, c.padded,
                                            c.slices, engine),
                              pack, c.pack * static_cast<long long>(sizeof(T)), stream);
        if (err == cudaSuccess)  // accumulator += partial[0] + partial[1] + ..., in order
            err = batch_sum_launch<T, float>(partials, n0 == 0 ? nullptr : accumulator,
                                             accumulator, c.slices, static_cast<int>(kc), stream);
    }
    if (err != cudaSuccess) return err;
    return transpose_launch<float, T>(accumulator, dweight, 1, static_cast<int>(s.taps),
                                      out_channels, stream);
}

}  // namespace
}  // namespace scratchops
