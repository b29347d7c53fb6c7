// conv_backward.cu — the gradients of a 2-D convolution, as the transpose of its im2col + GEMM
// form (conv_im2col.cu), and col2im, the transpose of im2col.
//
// The forward, per image n: cols[n] = im2col(x[n]) (K x P, K = C*kh*kw taps, P = out_h*out_w
// pixels) and y[n] = W (Cout x K) @ cols[n] + bias. Differentiating each step:
//   input gradient   dcols[n] = Wᵀ (K x Cout) @ dy[n] (Cout x P); dx[n] = col2im(dcols[n]):
//                    every input element is the sum of the column entries im2col copied it to
//                    (one per tap whose window covers it), so col2im gathers them back;
//   weight gradient  dW = sum over n of dy[n] (Cout x P) @ cols[n]ᵀ (P x K): a GEMM whose
//                    reduction runs over every output pixel of the batch. Computed here as its
//                    transpose, dWᵀ (K x Cout) = sum over n of cols[n] (K x P) @ dy[n]ᵀ
//                    (P x Cout), so that the transposed operand is dy (P x Cout per image),
//                    smaller than cols (P x K) when K > Cout, as in P31 (576 > 128);
//   bias gradient    db[co] = sum of dy[n][co][p] over n and p (channelwise_backward.cu).
// Both gradients run over chunks of whole images whose matrices fit a workspace (the columns of
// P31's batch would take 4.7 GB), like the forward's im2col path.
//
// Deterministic: no atomics. col2im sums each input element's taps in a fixed order; the
// weight gradient writes one partial product per image and adds them in image order
// (transpose.cu: batch_sum) into a float accumulator, rounded to the element type at the end.
//
// Element types: float, fp16 and bf16 (element.cuh): the GEMMs (gemm.cu, the CUDA-core versions
// 1-4, fp32 arithmetic whatever torch's TF32 switches say) and col2im add in float; each
// result is rounded to the element type when stored (the per-image weight partials too).
//
// Versions, one idea each:
//   col2im v1 gather   one thread per input element, reading the column entries of the taps
//                      that cover it: the transpose of im2col's scatter-free copy, with no
//                      write conflicts and so no atomics
//   input / weight     the chains above over chunks of images, on the CUDA-core GEMM the
//   gradient v1 chain  forward's im2col path uses (its version a parameter)
//   input gradient     (gemm_version = kGemmTensorCoreVersion) with stride 1 the input
//   v2 convolution     gradient is itself a convolution: dx[n][c][h][w] = sum over co, i, j
//                      of dy[n][co][h + pad - i*dil][w + pad - j*dil] W[co][c][i][j]; with
//                      i' = kh-1-i that is a correlation of dy, padded by dil*(kh-1) - pad,
//                      with Wf[c][co][i'][j'] = W[co][c][kh-1-i'][kw-1-j'] (flipped,
//                      channels swapped): the forward's implicit GEMM on the tensor cores
//                      (conv_implicit.cu, 3xTF32), and neither dcols nor col2im's pass.
//                      Strided convolutions (and padding past dil*(k-1)) keep v1.
//                      In float, where torch allows TF32 and the gradient's own reduction is
//                      at least 128 (binding.cpp: conv_grad_tf32), the tensor-core gradients
//                      (input gradient v2 / v3, weight gradient v2) take the forward's TF32
//                      mode: one TF32 product per fp32 product, as cuDNN's gradients mostly
//                      then compute (docs/tf32.md, "Gradients").
//   input gradient     (single products on the wgmma engine: the half types, TF32) v2 on the
//                      implicit GEMM's v4:
//   v3 dy staged       dy made channels-last, so that the copy engine stages each k-block
//                      of A in shared memory and no thread gathers A; v2's kernel loaded
//                      every value of dy from its channel plane once a tap. The copy takes
//                      the workspace, so the batch runs in chunks of the images whose copy
//                      the budget holds (v2 where not one does).
//   weight gradient    (gemm_version = kGemmTensorCoreVersion) v1's product on the tensor
//   v2 implicit,       cores, with neither of v1's written operands: A's rows are the taps of
//   in slices          x read straight from NCHW (the forward's implicit GEMM with the roles
//                      of pixels and taps swapped), B is packed straight from dy, and the half
//                      types multiply natively on wgmma. Its reduction runs over every output
//                      pixel of the batch, but its output is only K x Cout (5 tiles of 128 x
//                      128 for P31): one tile per multiprocessor would leave most of them
//                      idle. So the reduction is cut into slices of kWeightGradSlice slots,
//                      each slice one entry of a batched product with its own partial dWᵀ, and
//                      the partials are added in slice order: many tiles per launch, a fixed
//                      order of sums (deterministic), no atomics (conv_weight_grad_implicit.cuh).
//   weight gradient    (16-bit products on the wgmma engine, stride 1) v2's slices with both
//   v3 both operands   operands staged by the copy engine: x and dy made channels-last, each
//   staged             k-block of 64 output pixels is a box of each, which wgmma reads
//                      MN-major (a pixel's channels one row); no thread gathers x and no pass
//                      packs dy (conv_weight_grad_staged.cuh). v2's gather and packing took
//                      2.2 ms of P31's bf16 step, v3 takes 0.43 plus the copies' 0.46.
//   weight gradient    (float on the wgmma engine, stride 1, output rows of whole k-blocks)
//   v4 A from a ring   v2 with each consumer warpgroup's A read from a ring of x's input rows
//                      in shared memory, loaded and split once a tile instead of gathered and
//                      split by every thread once a tap (conv_weight_grad_row_ring.cuh; P31:
//                      the GEMM 4.07 -> 3.16 ms, the same bits as v2).
//   input gradient     (3xTF32 on the wgmma engine, float) v2 with the GEMM's roles swapped:
//   v4 roles swapped   M = dx's channels (the flipped weights, split in registers), N = 128
//                      pixels of a dx row (dy made channels-last and split once into its two
//                      TF32 parts, staged by the copy engine): v2's M = pixels, N = dx's 64
//                      channels fed each split dy value to half the products the forward's
//                      feed, once a tap (conv_input_grad_swapped.cuh; P31: 5.07 -> 3.86 ms).
//   both at once       where the input gradient v3 and the weight gradient v3 each take the
//   (dy copied once)   whole batch, dy's channels-last copy is made once for both
//                      (conv2d_grads_shared_launch; 0.32 ms of P31's bf16 step), with the
//                      same bits as the two apart.
//   P31's four at     (float, 3xTF32) the min's rule applied inside both gradients' passes
//   once, the rule     over dy: its pass writes v4's two TF32 parts, the weight gradient's
//   inside             packing computes the rule itself, and no pass writes the rule's
//                      gradient (min_add_mul_conv_grads_launch; P31's step 13.637 -> 13.052
//                      ms, the weight gradient's workspace over the dead parts: docs/notes.md).
//   P31's four at     (float, output rows of whole k-blocks) one pass over dy and the shares
//   once, one pass     writes both operands, the input gradient v4's two parts and the weight
//   over dy            gradient's packed B, a chunk of slices at a time before that chunk's
//                      product, where the two passes above each read them
//                      (min_add_mul_operands.cuh; conv_grads_min_add_mul.cuh runs both forms).
//   ... beside the     (sm_90, the weight gradient v4) each chunk's pass runs beside the
//   product            previous chunk's product, on multiprocessors that product leaves free
//                      (conv_weight_grad_implicit.cuh's chunk_buffers; the step 11.54 -> 11.06).

#include "common.cuh"
#include "launchers.h"

namespace scratchops {
namespace {

constexpr int kCol2imThreads = 256;
constexpr int kChainIm2colVersion = 2;  // the row version, as the forward's im2col path
constexpr int kFlipThreads = 256;
// The CUDA-core GEMM of a strided convolution's input gradient asked for on the tensor cores
// (v1 there): the pipelined one, conv2d's im2col default.
constexpr int kChainGemmVersion = 4;
// Reduction slots per ordered partial sum of the weight gradient v2: long enough that a slice's
// tile spends its time in the product (64 k-blocks of 32), short enough that P31 gives a
// thousand slices (five tiles each).
constexpr int kWeightGradSlice = 2048;
// The same for the weight gradient v3, twice as long: its products are 16-bit ones, exact in
// fp32, and at half the slices P31's batch and its partials fit one chunk of the 1 GiB budget
// (its two copies take 788 MB in bf16, 1,008 partials of 295 KB 297 MB more; 504 take 149).
constexpr int kStagedWeightGradSlice = 2 * kWeightGradSlice;

long long round_up4(long long n) { return (n + 3) / 4 * 4; }
// Elements of T in a piece of `bytes` bytes rounded up to 16 (every piece stays 16-byte
// aligned: the tensor cores' packing stores 16 bytes at a time).
template <class T>
long long aligned_elements(long long bytes) {
    return align16(bytes) / static_cast<long long>(sizeof(T));
}

bool on_tensor_cores(int gemm_version) { return gemm_version == kGemmTensorCoreVersion; }

// Input gradient v2: whether it is a convolution (stride 1, padding at most dil*(k-1)), and
// that convolution's geometry: dy's planes (out_channels of them) in, x's size out.
bool input_grad_is_a_convolution(const Conv2dGeometry& g) {
    return g.stride_h == 1 && g.stride_w == 1 && g.pad_h <= g.dil_h * (g.kernel_h - 1) &&
           g.pad_w <= g.dil_w * (g.kernel_w - 1);
}
Conv2dGeometry input_grad_geometry(const Conv2dGeometry& g, int out_channels) {
    return {out_channels, g.out_h, g.out_w, g.kernel_h, g.kernel_w, 1, 1,
            g.dil_h * (g.kernel_h - 1) - g.pad_h, g.dil_w * (g.kernel_w - 1) - g.pad_w,
            g.dil_h, g.dil_w, g.height, g.width};
}

// Wf[c][co][i][j] = W[co][c][kh-1-i][kw-1-j]: element e of Wf (C x Cout x kh x kw),
// e = ((c*Cout + co)*kh + i)*kw + j, reads W[((co*C + c)*kh + kh-1-i)*kw + kw-1-j].
template <class T>
__global__ void flip_weights_kernel(const T* __restrict__ w, T* __restrict__ flipped, int total,
                                    int out_channels, int channels, int kernel_h, int kernel_w) {
    const unsigned index = blockIdx.x * kFlipThreads + threadIdx.x;
    if (index >= static_cast<unsigned>(total)) return;
    const int e = static_cast<int>(index);
    const int j = e % kernel_w, i = (e / kernel_w) % kernel_h;
    const int co = (e / (kernel_w * kernel_h)) % out_channels;
    const int c = e / (kernel_w * kernel_h * out_channels);
    flipped[e] = w[((co * channels + c) * kernel_h + kernel_h - 1 - i) * kernel_w + kernel_w - 1 - j];
}

// Input gradient v2's workspace: Wf, then its packing for the implicit GEMM.
struct FlippedWeights {
    long long flipped, packed;  // elements of T
};
template <class T>
FlippedWeights flipped_weights(int out_channels, const Conv2dGeometry& g) {
    const long long taps = static_cast<long long>(g.channels) * out_channels * g.kernel_h *
                           g.kernel_w;
    return {aligned_elements<T>(taps * static_cast<long long>(sizeof(T))),
            aligned_elements<T>(conv2d_implicit_packed_bytes(input_grad_geometry(g, out_channels),
                                                             g.channels))};
}

// Element e of dx (a chunk of images of C x H x W), e = ((b*C + c)*H + h)*W + w, sums
// cols[b][k][oh*out_w + ow] over the taps k = (c*kernel_h + i)*kernel_w + j whose window puts
// tap (i, j) on (h, w): oh*stride_h - pad_h + i*dil_h = h, i.e. oh = (h + pad_h - i*dil_h) /
// stride_h where that divides exactly and lands in [0, out_h); ow likewise. Taps in i, then j
// order, in float. Offsets: the chunk's cols and dx hold fewer than 2^31 elements.
template <class T>
__global__ void col2im_kernel(const T* __restrict__ cols, T* __restrict__ dx, int total,
                              Conv2dGeometry g) {
    const unsigned index = blockIdx.x * kCol2imThreads + threadIdx.x;
    if (index >= static_cast<unsigned>(total)) return;
    const int e = static_cast<int>(index);
    const PlanePosition in = plane_position(e, g.height, g.width);
    const int h = in.row, w = in.col, bc = in.plane;  // bc = b * C + c
    const int pixels = g.out_h * g.out_w;
    // Row (b*C + c)*kh*kw + i*kw + j of the chunk's columns = (b*K + k) with k's channel c.
    const T* taps = cols + bc * g.kernel_h * g.kernel_w * pixels;
    float sum = 0.0f;
    for (int i = 0; i < g.kernel_h; ++i) {
        const int th = h + g.pad_h - i * g.dil_h;  // = oh * stride_h for the window's row oh
        if (th < 0 || th % g.stride_h != 0) continue;
        const int oh = th / g.stride_h;
        if (oh >= g.out_h) continue;
        for (int j = 0; j < g.kernel_w; ++j) {
            const int tw = w + g.pad_w - j * g.dil_w;
            if (tw < 0 || tw % g.stride_w != 0) continue;
            const int ow = tw / g.stride_w;
            if (ow >= g.out_w) continue;
            sum += to_float(taps[(i * g.kernel_w + j) * pixels + oh * g.out_w + ow]);
        }
    }
    dx[e] = from_float<T>(sum);
}

// The sizes both gradients' chunks are made of.
struct GradShape {
    long long taps, pixels;  // K = C*kh*kw, P = out_h*out_w
};
GradShape grad_shape(const Conv2dGeometry& g) {
    return {static_cast<long long>(g.channels) * g.kernel_h * g.kernel_w,
            static_cast<long long>(g.out_h) * g.out_w};
}

// Workspace elements (of T) that stay for the whole call, and those each image of a chunk adds:
//   input gradient:  Wᵀ (K x Cout); per image its columns' gradient (K x P);
//   weight gradient: the float accumulator dWᵀ (K x Cout floats); per image its columns
//                    (K x P), dy[n]ᵀ (P x Cout) and its partial dWᵀ (K x Cout).
// Every piece starts 4-element aligned.
struct GradWorkspace {
    long long fixed, per_image;
};
template <class T>
GradWorkspace grad_workspace(bool weight, int out_channels, const Conv2dGeometry& g) {
    const GradShape s = grad_shape(g);
    const long long kc = s.taps * out_channels;
    if (!weight) return {round_up4(kc), round_up4(s.taps * s.pixels)};
    const long long accumulator = round_up4((kc * sizeof(float) + sizeof(T) - 1) / sizeof(T));
    return {accumulator, round_up4(s.taps * s.pixels) + round_up4(s.pixels * out_channels) +
                             round_up4(kc)};
}

// Images per chunk: as many as the budget holds, at least one, at most the batch, and few
// enough that a chunk's columns stay below 2^31 elements (32-bit offsets in the kernels).
long long chunk_images(int batch, const GradShape& s, long long per_image, long long available) {
    long long images = available / per_image;
    const long long int32_limit = kMaxInt32Count / (s.taps * s.pixels);
    images = images < int32_limit ? images : int32_limit;
    images = images < batch ? images : batch;
    return images > 1 ? images : 1;
}

}  // namespace
}  // namespace scratchops

// v2: the tensor-core paths, and P31's four gradients at once on them.
#include "conv_backward_tensor_cores.cuh"
#include "conv_grads_min_add_mul.cuh"

namespace scratchops {

template <class T>
cudaError_t col2im_launch(const T* cols, T* dx, int batch, const Conv2dGeometry& g,
                          cudaStream_t stream) {
    const long long total = static_cast<long long>(batch) * g.channels * g.height * g.width;
    if (total > kMaxInt32Count) return cudaErrorInvalidValue;
    const int blocks = static_cast<int>((total + kCol2imThreads - 1) / kCol2imThreads);
    col2im_kernel<T><<<blocks, kCol2imThreads, 0, stream>>>(cols, dx, static_cast<int>(total), g);
    return cudaGetLastError();
}

template <class T>
long long conv2d_grad_workspace_elements(bool weight, int batch, int out_channels,
                                         const Conv2dGeometry& g, int gemm_version,
                                         TensorCorePath engine, bool tf32,
                                         long long workspace_bytes) {
    const long long budget = workspace_bytes / static_cast<long long>(sizeof(T));
    if (on_tensor_cores(gemm_version) && !weight && input_grad_is_a_convolution(g)) {
        if (std::is_same_v<T, float> && swapped::applies(out_channels, g, engine, tf32)) {
            const int images = swapped::chunk_images(batch, out_channels, g, workspace_bytes);
            const swapped::Workspace ws = swapped::workspace_floats(out_channels, g);
            if (images > 0) return ws.packed + images * ws.per_image;
        }
        const FlippedWeights f = flipped_weights<T>(out_channels, g);
        const int staged =
            staged_dy_images<T>(batch, out_channels, g, engine, tf32, workspace_bytes);
        return f.flipped + f.packed +
               aligned_elements<T>(conv2d_implicit_channels_last_bytes<T>(
                   staged, input_grad_geometry(g, out_channels)));
    }
    if (on_tensor_cores(gemm_version) && weight)
        return aligned_elements<T>(
            weight_grad_workspace_bytes<T>(batch, out_channels, g, engine, workspace_bytes));
    const GradWorkspace w = grad_workspace<T>(weight, out_channels, g);
    const long long images = chunk_images(batch, grad_shape(g), w.per_image, budget - w.fixed);
    return w.fixed + images * w.per_image;
}

template <class T>
cudaError_t conv2d_input_grad_launch(const T* dy, const T* weight, T* dx, int batch,
                                     int out_channels, const Conv2dGeometry& g, int gemm_version,
                                     TensorCorePath engine, bool tf32, T* workspace,
                                     long long workspace_elements, cudaStream_t stream) {
    if (on_tensor_cores(gemm_version) && input_grad_is_a_convolution(g))
        return input_grad_as_convolution(dy, weight, dx, batch, out_channels, g, engine, tf32,
                                         workspace,
                                         workspace_elements * static_cast<long long>(sizeof(T)),
                                         stream);
    if (on_tensor_cores(gemm_version)) gemm_version = kChainGemmVersion;
    const GradShape s = grad_shape(g);
    const GradWorkspace w = grad_workspace<T>(false, out_channels, g);
    const long long images = chunk_images(batch, s, w.per_image, workspace_elements - w.fixed);
    T* weight_t = workspace;          // Wᵀ: K x Cout
    T* dcols = workspace + w.fixed;  // a chunk's column gradients: images x K x P
    cudaError_t err = transpose_launch<T, T>(weight, weight_t, 1, out_channels,
                                             static_cast<int>(s.taps), stream);
    if (err != cudaSuccess) return err;
    const long long image_elements = static_cast<long long>(g.channels) * g.height * g.width;
    for (long long n0 = 0; n0 < batch; n0 += images) {
        const int count = static_cast<int>(batch - n0 < images ? batch - n0 : images);
        // dcols[b] (K x P) = Wᵀ (K x Cout, shared) @ dy[n0 + b] (Cout x P)
        const GemmArgs<T> gemm{weight_t, dy + n0 * out_channels * s.pixels, nullptr, dcols,
                               static_cast<int>(s.taps), static_cast<int>(s.pixels), out_channels,
                               /*lda=*/out_channels, /*ldb=*/static_cast<int>(s.pixels),
                               /*ldc=*/static_cast<int>(s.pixels), /*stride_a=*/0,
                               /*stride_b=*/out_channels * s.pixels,
                               /*stride_c=*/s.taps * s.pixels, count};
        err = gemm_launch(gemm_version, gemm, nullptr, 0, stream);
        if (err != cudaSuccess) return err;
        err = col2im_launch(dcols, dx + n0 * image_elements, count, g, stream);
        if (err != cudaSuccess) return err;
    }
    return cudaSuccess;
}

template <class T>
cudaError_t conv2d_weight_grad_launch(const T* dy, const T* x, T* dweight, int batch,
                                      int out_channels, const Conv2dGeometry& g, int gemm_version,
                                      TensorCorePath engine, bool tf32, T* workspace,
                                      long long workspace_elements, cudaStream_t stream) {
    if (on_tensor_cores(gemm_version))
        return weight_grad_implicit(dy, x, dweight, batch, out_channels, g, engine, tf32,
                                    workspace,
                                    workspace_elements * static_cast<long long>(sizeof(T)),
                                    stream);
    const GradShape s = grad_shape(g);
    const GradWorkspace w = grad_workspace<T>(true, out_channels, g);
    const long long images = chunk_images(batch, s, w.per_image, workspace_elements - w.fixed);
    const long long kc = s.taps * out_channels;
    float* accumulator = reinterpret_cast<float*>(workspace);  // dWᵀ: K x Cout
    T* cols = workspace + w.fixed;                              // images x K x P
    T* dy_t = cols + round_up4(images * s.taps * s.pixels);     // images x P x Cout
    T* partial = dy_t + round_up4(images * s.pixels * out_channels);  // images x K x Cout
    const long long image_elements = static_cast<long long>(g.channels) * g.height * g.width;
    if (batch == 0) {  // an empty batch: dW = 0 (a sum of no partials)
        const cudaError_t err = batch_sum_launch<T, float>(partial, nullptr, accumulator, 0,
                                                           static_cast<int>(kc), stream);
        if (err != cudaSuccess) return err;
    }
    for (long long n0 = 0; n0 < batch; n0 += images) {
        const int count = static_cast<int>(batch - n0 < images ? batch - n0 : images);
        cudaError_t err = im2col_launch(kChainIm2colVersion, x + n0 * image_elements, cols, count,
                                        g, 0, static_cast<int>(s.pixels), stream);
        if (err != cudaSuccess) return err;
        err = transpose_launch<T, T>(dy + n0 * out_channels * s.pixels, dy_t, count, out_channels,
                                     static_cast<int>(s.pixels), stream);
        if (err != cudaSuccess) return err;
        // partial[b] (K x Cout) = cols[b] (K x P) @ dy[n0 + b]ᵀ (P x Cout)
        const GemmArgs<T> gemm{cols, dy_t, nullptr, partial, static_cast<int>(s.taps),
                               out_channels, static_cast<int>(s.pixels),
                               /*lda=*/static_cast<int>(s.pixels), /*ldb=*/out_channels,
                               /*ldc=*/out_channels, /*stride_a=*/s.taps * s.pixels,
                               /*stride_b=*/s.pixels * out_channels, /*stride_c=*/kc, count};
        err = gemm_launch(gemm_version, gemm, nullptr, 0, stream);
        if (err != cudaSuccess) return err;
        // accumulator += partial[0] + partial[1] + ... (the first chunk starts it from 0)
        err = batch_sum_launch<T, float>(partial, n0 == 0 ? nullptr : accumulator, accumulator,
                                         count, static_cast<int>(kc), stream);
        if (err != cudaSuccess) return err;
    }
    // dW (Cout x K) = the accumulated dWᵀ (K x Cout), transposed and rounded to T
    return transpose_launch<float, T>(accumulator, dweight, 1, static_cast<int>(s.taps),
                                      out_channels, stream);
}

#define X(T)                                                                                  \
    template long long conv2d_grads_shared_bytes<T>(int, int, const Conv2dGeometry&, int,    \
                                                    TensorCorePath, long long);               \
    template long long conv2d_grads_shared_dy_offset<T>(int, const Conv2dGeometry&);         \
    template cudaError_t conv2d_grads_shared_launch<T>(const T*, const T*, const T*, T*, T*,  \
                                                       int, int, const Conv2dGeometry&,       \
                                                       TensorCorePath, long long, void*,      \
                                                       cudaStream_t, bool);                   \
    template cudaError_t col2im_launch<T>(const T*, T*, int, const Conv2dGeometry&,           \
                                          cudaStream_t);                                      \
    template long long conv2d_grad_workspace_elements<T>(bool, int, int, const Conv2dGeometry&, \
                                                         int, TensorCorePath, bool,           \
                                                         long long);                          \
    template cudaError_t conv2d_input_grad_launch<T>(const T*, const T*, T*, int, int,        \
                                                     const Conv2dGeometry&, int,              \
                                                     TensorCorePath, bool, T*, long long,     \
                                                     cudaStream_t);                           \
    template cudaError_t conv2d_weight_grad_launch<T>(const T*, const T*, T*, int, int,       \
                                                      const Conv2dGeometry&, int,             \
                                                      TensorCorePath, bool, T*, long long,    \
                                                      cudaStream_t);
SCRATCHOPS_FOR_EACH_ELEMENT(X)
#undef X

}  // namespace scratchops
