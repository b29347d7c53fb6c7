// launchers_backward.h — the host-side entry points of the backward kernel files in cuda/:
// the gradients, one kernel file per forward file (each file's header derives its formulas).
// The contract of launchers.h holds here too. dy is the gradient of the forward's output, dx
// of its input; every buffer is of T unless said. Deterministic: no float atomics; each sum
// has a fixed order.
#pragma once

#include "launchers.h"

namespace scratchops {

// ---------------------------------------------------------------- transpose.cu
// y[b] = x[b]ᵀ for `batch` rows x cols matrices (In float and Out T: an accumulator rounded);
// y[i] = carry[i] (0 when carry is nullptr; carry may be y) + x[0][i] + ... + x[batch-1][i] for
// i < n, in that order, in float. Each matrix and n below 2^31 elements.
template <class In, class Out>
cudaError_t transpose_launch(const In* x, Out* y, int batch, int rows, int cols,
                             cudaStream_t stream);
template <class In, class Out>
cudaError_t batch_sum_launch(const In* x, const float* carry, Out* y, int batch, int n,
                             cudaStream_t stream);
// y (batch, pixels, channels) = x (batch, channels, pixels) transposed per image: an NCHW
// tensor made channels-last; tf32_nearest (float): each value rounded to the nearest TF32.
template <class T>
cudaError_t channels_last_launch(const T* x, T* y, int batch, int channels, int pixels,
                                 bool tf32_nearest, cudaStream_t stream);

// ---------------------------------------------------------------- conv_backward.cu
// col2im: the gradient of im2col (conv_im2col.cu), dx (batch x C x H x W) from the columns'
// gradient (batch x C*kh*kw x out_h*out_w), each element the sum of its taps' entries.
template <class T>
cudaError_t col2im_launch(const T* cols, T* dx, int batch, const Conv2dGeometry& g,
                          cudaStream_t stream);
// A convolution's input gradient (dx, the input's shape) and weight gradient (dweight,
// out_channels x C x kh x kw) from dy (batch x out_channels x out_h x out_w), over chunks of
// whole images: gemm_version 1-4 through im2col, col2im and that CUDA-core GEMM (v1 of
// conv_backward.cu, fp32); kGemmTensorCoreVersion on the tensor cores of `engine`: the input
// gradient as a convolution (stride 1; v1 otherwise; v3 with dy staged channels-last where
// the engine and the budget allow), the weight gradient in ordered slices on gemm v9 (v2 of
// conv_backward.cu), in float fp32-accurate (3xTF32) or, where tf32, one TF32 product per fp32
// product as the forward's TF32 mode (the caller sets it where torch allows TF32 and
// conv2d_grad_uses_tf32 holds), in the half types their single-product mode. The workspace
// holds conv2d_grad_workspace_elements elements of T (weight: for the weight gradient),
// 16-byte aligned: what the budget workspace_bytes allows, but at least one image's chunk. The
// caller checks that one image's columns (C*kh*kw x out_h*out_w) hold fewer than 2^31
// elements.
template <class T>
long long conv2d_grad_workspace_elements(bool weight, int batch, int out_channels,
                                         const Conv2dGeometry& g, int gemm_version,
                                         TensorCorePath engine, bool tf32,
                                         long long workspace_bytes);
template <class T>
cudaError_t conv2d_input_grad_launch(const T* dy, const T* weight, T* dx, int batch,
                                     int out_channels, const Conv2dGeometry& g, int gemm_version,
                                     TensorCorePath engine, bool tf32, T* workspace,
                                     long long workspace_elements, cudaStream_t stream);
template <class T>
cudaError_t conv2d_weight_grad_launch(const T* dy, const T* x, T* dweight, int batch,
                                      int out_channels, const Conv2dGeometry& g, int gemm_version,
                                      TensorCorePath engine, bool tf32, T* workspace,
                                      long long workspace_elements, cudaStream_t stream);
// Both gradients of a convolution at once, dy's channels-last copy made once for both
// (conv_backward_tensor_cores.cuh): where the input gradient v3 and the weight gradient v3
// each run the whole batch in one chunk and together fit the budget,
// conv2d_grads_shared_bytes is the workspace they take (16-byte aligned), else 0 (the caller
// then runs the two launches above, each as if alone: the same bits either way). The half
// types on the tensor cores only. dy_copied: dy's channels-last copy is already in the
// workspace, at conv2d_grads_shared_dy_offset bytes (min_add_mul_backward_kept_channels_last
// wrote it there), and dy is not read.
template <class T>
long long conv2d_grads_shared_bytes(int batch, int out_channels, const Conv2dGeometry& g,
                                    int gemm_version, TensorCorePath engine, long long budget);
template <class T>
cudaError_t conv2d_grads_shared_launch(const T* dy, const T* x, const T* weight, T* dx, T* dw,
                                       int batch, int out_channels, const Conv2dGeometry& g,
                                       TensorCorePath engine, long long budget, void* workspace,
                                       cudaStream_t stream, bool dy_copied = false);
template <class T>
long long conv2d_grads_shared_dy_offset(int out_channels, const Conv2dGeometry& g);
// P31's four gradients in float from the shares its forward kept (ConvTail::halves), fp32-
// accurate (3xTF32: tf32 false for both gradients) on the wgmma engine, with the min's rule
// dx_conv = dy * factor * halves / 2 applied inside both gradients' passes over dy, so that
// no pass writes dx_conv: one pass writes its two TF32 parts for the input gradient v4 and the
// weight gradient's packed B together where output rows are whole k-blocks
// (min_add_mul_operands.cuh), else the rule's pass writes the parts
// (min_add_mul_backward_kept_split_launch) and the weight gradient v2's packing computes the
// rule again. dx, dw as conv2d's input and weight gradients of dx_conv, bias_grad and
// conv_bias_grad as min_add_mul_backward_kept_channels_last_launch's sums (each form adds
// them in an order of its own). Where it applies (and the budget holds one of the two parts
// with v4's packed weights, and one image's two parts with them: conv_grads_min_add_mul.cuh),
// min_add_mul_conv_grads_bytes is the workspace (16-byte aligned) it takes: twice dy's bytes
// and a little, with the weight gradient's workspace at the budget beside them (one pass) or
// over them where that is more (two passes); else 0.
long long min_add_mul_conv_grads_bytes(int batch, int out_channels, const Conv2dGeometry& g,
                                       TensorCorePath engine, bool tf32, long long budget);
cudaError_t min_add_mul_conv_grads_launch(const float* dy, const uint8_t* halves, const float* x,
                                          const float* weight, float factor, float* dx,
                                          float* dw, float* bias_grad, float* conv_bias_grad,
                                          int batch, int out_channels, const Conv2dGeometry& g,
                                          TensorCorePath engine, long long budget,
                                          void* workspace, cudaStream_t stream);
// Whether a convolution's gradient on the tensor cores computes in TF32 where torch allows it:
// the forward's rule (conv2d_uses_tf32, launchers.h) on the gradient's own reduction, dy's
// Cout*kh*kw for the input gradient (a convolution of dy) and the batch's output pixels for the
// weight gradient.
inline bool conv2d_grad_uses_tf32(bool weight, int batch, int out_channels,
                                  const Conv2dGeometry& g) {
    const long long reduction = weight ? static_cast<long long>(batch) * g.out_h * g.out_w
                                       : static_cast<long long>(out_channels) * g.kernel_h *
                                             g.kernel_w;
    return reduction >= kTf32MinReduction;
}

// ------------------------------------------------------------ channelwise_backward.cu
// out[c] = factor * sum over n, s of a[n][c][s] * b[n][c][s] (b nullptr: of a), over an
// (batch, channels, plane_size) layout: the gradient of a per-channel bias (b absent) or scale.
// The workspace holds channel_sums_workspace_bytes (the partial sums of ranges of images).
long long channel_sums_workspace_bytes(int batch, int channels);
template <class T>
cudaError_t channel_sums_launch(const T* a, const T* b, float factor, T* out, int batch,
                                int channels, int plane_size, float* workspace,
                                cudaStream_t stream);
// The input gradient of min_add_mul over n elements: dy * factor where x < constant, half of
// it where x == constant, 0 where x > constant (torch.minimum's rule; NaN passes it).
template <class T>
cudaError_t min_add_mul_backward_launch(const T* dy, const T* x, T* dx, int n, float constant,
                                        float factor, cudaStream_t stream);
// The same from the shares kept (ConvTail::halves), dx = dy * factor * halves / 2, with P31's
// bias gradients on the way: bias_grad[c] = factor * (dy's sum over channel c), conv_bias_grad
// [c] = dx's, as channel_sums_launch sums. workspace: 2 * channel_sums_workspace_bytes.
template <class T>
cudaError_t min_add_mul_backward_kept_launch(const T* dy, const uint8_t* halves, T* dx,
                                             T* bias_grad, T* conv_bias_grad, int batch,
                                             int channels, int plane_size, float factor,
                                             float* workspace, cudaStream_t stream);
// The same with dx written channels-last, (N, H, W, C) for N x C planes of `pixels` (the copy
// of dy that conv2d_grads_shared_launch reads; 16-byte aligned, its rows stored as 16-byte
// vectors where C is a multiple of them), and the two sums in an order of their own
// (deterministic, fixed by the shape). workspace: ..._channels_last_workspace_bytes.
long long min_add_mul_backward_kept_channels_last_workspace_bytes(int batch, int channels,
                                                                 int pixels);
template <class T>
cudaError_t min_add_mul_backward_kept_channels_last_launch(const T* dy, const uint8_t* halves,
                                                           T* dx_channels_last, T* bias_grad,
                                                           T* conv_bias_grad, int batch,
                                                           int channels, int pixels, float factor,
                                                           float* workspace, cudaStream_t stream);
// float's form for the input gradient v4 (conv_input_grad_swapped.cuh): dx written as its two
// TF32 parts, big (split_tf32's, rounded to nearest) and small, each channels-last as above.
cudaError_t min_add_mul_backward_kept_split_launch(const float* dy, const uint8_t* halves,
                                                   float* big, float* small, float* bias_grad,
                                                   float* conv_bias_grad, int batch,
                                                   int channels, int pixels, float factor,
                                                   float* workspace, cudaStream_t stream);
// The two sums finished from partials in another pass's order, partial[c * pieces + piece]
// (float; min_add_mul_operands.cuh's): each channel's partials added in piece order, in
// double, bias_grad[c] = factor * dy's, conv_bias_grad[c] = dx's.
cudaError_t min_add_mul_kept_sums_finish_launch(const float* dy_partial,
                                                const float* dx_partial, float factor,
                                                float* bias_grad, float* conv_bias_grad,
                                                int channels, long long pieces,
                                                cudaStream_t stream);

// --------------------------------------------------------------- groupnorm_backward.cu
// dx of y = group_norm(x) * scale (gamma, beta, scale nullptr when absent), and the gradients
// of the parameters whose pointer is given (dgamma, dbeta, dscale: C values each, or nullptr).
// workspace: group_norm_backward_workspace_bytes, 16-byte aligned.
long long group_norm_backward_workspace_bytes(int batch, int channels, int groups);
template <class T>
cudaError_t group_norm_backward_launch(const T* dy, const T* x, const T* gamma, const T* beta,
                                       const T* scale, T* dx, T* dgamma, T* dbeta, T* dscale,
                                       void* workspace, int batch, int channels, int plane_size,
                                       int groups, float eps, cudaStream_t stream);

// -------------------------------------------------------------- pool_clamp_backward.cu
// dx of y = clamp(max_pool2d(x), lo, hi) over `planes` planes (dy: planes x out_h x out_w);
// workspace: max_pool2d_clamp_backward_workspace_bytes (each window's choice), 16-byte aligned.
long long max_pool2d_clamp_backward_workspace_bytes(int planes, const PoolGeometry& g);
template <class T>
cudaError_t max_pool2d_clamp_backward_launch(const T* dy, const T* x, T* dx, int planes,
                                             const PoolGeometry& g, float lo, float hi,
                                             void* workspace, cudaStream_t stream);
// dx of y = clamp(x, lo, hi) over n elements: dy where lo <= x <= hi (an infinite bound: no
// bound), 0 elsewhere.
template <class T>
cudaError_t clamp_backward_launch(const T* dy, const T* x, T* dx, int n, float lo, float hi,
                                  cudaStream_t stream);

// ------------------------------------------------------------- conv_gn_pool_backward.cu
// The gradients of P85's one pass (conv_gn_pool_launch, stride 1, no padding) from what its
// forward kept (GnPoolArgs::kept_extremes, kept_stats): dx; dweight; dconv_bias (nullptr:
// not wanted); dparams (3 x Cout: group norm's weight, its bias, the scale), computing the
// convolution's output again tile by tile instead of reading it. Covers what
// conv_gn_pool_backward_covers says for the current device (the shape, and the fused block's
// shared memory on that GPU; cudaErrorInvalidValue otherwise); batch may be 0 (the
// parameters' gradients are then zeros). workspace: conv_gn_pool_backward_workspace_bytes.
bool conv_gn_pool_backward_covers(int out_channels, const Conv2dGeometry& g, int device);
long long conv_gn_pool_backward_workspace_bytes(int batch, int out_channels,
                                                const Conv2dGeometry& g);
template <class T>
cudaError_t conv_gn_pool_backward_launch(const T* dout, const T* x, const T* weight,
                                         const GnPoolArgs<T>& args, const float* extremes,
                                         const float* group_stats, T* dx, T* dweight,
                                         T* dconv_bias, T* dparams, int batch, int out_channels,
                                         const Conv2dGeometry& g, void* workspace,
                                         cudaStream_t stream);

}  // namespace scratchops
