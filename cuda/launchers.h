// launchers.h — the host-side entry points of every kernel file in cuda/.
//
// Pure CUDA C++ (no torch headers), so each cuda/*.cu compiles alone with nvcc
// and the one binding file (scratchops/csrc/binding.cpp) calls these with raw
// pointers, sizes and the current torch stream.
//
// The contract every launcher trusts (binding.cpp checks it before calling; the launchers
// do not check it again):
//   * row-major / NCHW-contiguous buffers on the current device, every tensor argument of one
//     element type T: float, __half or __nv_bfloat16 (element.cuh: arithmetic in float, the
//     result rounded to T once, as it is stored); each launcher is a template instantiated
//     for those three;
//   * every size is an int: each buffer holds fewer than 2^31 elements, so 32-bit element
//     offsets inside one buffer are safe;
//   * the output is not empty: every size is >= 1 (gemm's K may be 0), as the caller
//     launches nothing for an empty output;
//   * the launcher returns the cudaError_t of its launches (cudaGetLastError after each
//     one), never exits or prints; cudaErrorInvalidValue for an unknown version, or for
//     what a launcher below says it refuses.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace scratchops {

// ------------------------------------------------------------------------- half precision
// The tensor-core engines have two ways of multiplying floats: 3xTF32 (fp32-accurate) and the
// one-product TF32 mode. Every fp16 and bf16 value is a TF32 value (TF32 keeps fp16's 10
// mantissa bits and bf16's 8 exponent bits), so on half operands the one-product mode is
// exact in each product and sums in fp32: what a native fp16 / bf16 tensor-core product with
// fp32 accumulation computes. It is the half types' only mode; `tf32` (torch's TF32 switch)
// chooses between the two for float alone.
template <class T>
constexpr bool tensor_cores_single_product(bool tf32) {
    return tf32 || !std::is_same<T, float>::value;
}

// ------------------------------------------------------------ the tensor-core engines
// The fp32-accurate tensor-core kernels (gemm v5-v9, the implicit-GEMM convolutions, P85 in one
// pass) run on one of two engines, the same product from the same packed operands:
//   kWgmma    Hopper's warpgroup MMA with a bulk-copy ring and warp specialisation
//             (tf32x3.cuh): an sm_90 GPU and an sm_90a build;
//   kMmaSync  the warp-level mma.sync (mma_sync_3xtf32.cuh): any sm_80 or later GPU.
// binding.cpp picks the faster one the device has, unless the user forced one.
enum class TensorCorePath : int { kWgmma = 0, kMmaSync = 1 };

// Whether the implicit-GEMM convolutions (conv_implicit.cu, P85's one pass v2) multiply T
// natively, fp16 / bf16 wgmma at twice the TF32 rate: the half types on the wgmma engine. The
// products are the single product's (exact, summed in fp32), in another order. The packed
// weights differ with it, so conv2d_implicit_pack takes the engine its launch will use.
template <class T>
constexpr bool tensor_cores_native16(TensorCorePath engine) {
    return !std::is_same<T, float>::value && engine == TensorCorePath::kWgmma;
}

// ---------------------------------------------------------------- gemm.cu
// C[b] = A[b] @ B[b] (+ bias[m] on every row m), for b in [0, batch). Batch strides are in
// elements (64-bit: the batch as a whole may exceed 2^31 elements only through the pointer
// arithmetic here).
template <class T = float>
struct GemmArgs {
    const T* A;     // M x K, leading dimension lda, batch stride stride_a (0: one A for all)
    const T* B;     // K x N, leading dimension ldb, batch stride stride_b (0: one B for all)
    const T* bias;  // M values, or nullptr
    T* C;           // M x N, leading dimension ldc, batch stride stride_c
    int M, N, K, lda, ldb, ldc;
    long long stride_a, stride_b, stride_c;
    int batch;
    // TF32: products of operands rounded to TF32 (to nearest), summed in fp32, as cuBLAS
    // computes an fp32 matmul when torch allows TF32; false: fp32 products (v5-v9: 3xTF32).
    // float only: the half types' products are exact in fp32 on every version (v5-v9:
    // tensor_cores_single_product).
    bool tf32 = false;
    TensorCorePath engine = TensorCorePath::kWgmma;  // v9's engine
};
// version: 1 = naive, 2 = shared-memory tiles, 3 = register-blocked, 4 = pipelined, then on
// the tensor cores (3xTF32): 5 = mma.sync (sm_80+), 6 = wgmma, 7 = bulk-copy ring, 8 = warp-
// specialised (6-8: sm_90a), 9 = persistent (on args.engine: v5's kernel on mma.sync); see
// the table at the top of gemm.cu. kGemmTensorCoreVersion is scratchops/versions.py's number
// for v9, the default tensor-core version and the last; the k...Versions counts below are
// each operator's last version (tests/test_library.py holds them equal to versions.py's).
constexpr int kGemmFirstTensorCoreVersion = 5;
constexpr int kGemmTensorCoreVersion = 9;
// The versions that run on wgmma whatever the engine setting: an sm_90 GPU only.
constexpr bool gemm_version_needs_wgmma(int version) {
    return version > kGemmFirstTensorCoreVersion && version < kGemmTensorCoreVersion;
}
// No version given: v9 where the device has tensor cores and A has at least
// kGemmTensorCoreMinRows rows, v4 otherwise. The tensor-core versions pack B at every call
// (12 bytes written a value, then read back), which pays for itself only when enough rows of
// A reuse B (docs/notes.md, "gemm v5 on the convolutions' GEMM shapes", v5 there being today's v9).
constexpr int kGemmTensorCoreMinRows = 256;
// The workspace a version needs (16-byte aligned): v5-v9 pack B into shared-memory tiles;
// with a batched B (stride_b != 0) they pack a chunk of entries at a time, so the workspace is
// every entry's packed B or `budget` bytes, whichever is smaller, but never less than one
// entry's. v1-v4 need one only for TF32 (args.tf32): A and B rounded to TF32
// (tf32_round_launch).
template <class T>
long long gemm_workspace_bytes(int version, const GemmArgs<T>& args, long long budget);
template <class T>
cudaError_t gemm_launch(int version, const GemmArgs<T>& args, void* workspace,
                        long long workspace_bytes, cudaStream_t stream);

// --------------------------------------------------------- conv_im2col.cu
// Column matrix for a chunk of a convolution's output pixels, as
// torch.nn.functional.unfold lays it out:
//   cols[b][k][q] = x[b][c][oh*stride_h - pad_h + kh*dil_h][ow*stride_w - pad_w + kw*dil_w]
// with k = (c*kernel_h + kh)*kernel_w + kw, output pixel p = oh*out_w + ow and
// q = p - pixel_begin for p in [pixel_begin, pixel_begin + pixel_count);
// 0 where the tap falls in the padding. x points at the first image of the
// chunk (batch images of C x H x W); cols holds batch x (C*kh*kw) x pixel_count.
struct Conv2dGeometry {
    int channels, height, width;      // input image
    int kernel_h, kernel_w;
    int stride_h, stride_w;
    int pad_h, pad_w;
    int dil_h, dil_w;
    int out_h, out_w;                 // output image (caller computes and checks > 0)
};
// version: 1 = one thread per element, 2 = one block per row (see conv_im2col.cu).
constexpr int kIm2colVersions = 2;
// Returns cudaErrorInvalidValue for a chunk of 2^31 or more elements.
template <class T>
cudaError_t im2col_launch(int version, const T* x, T* cols, int batch,
                          const Conv2dGeometry& g, int pixel_begin, int pixel_count,
                          cudaStream_t stream);
// y = conv2d(x, weight) + bias as im2col + gemm (versions 1-4) over chunks of the batch, or of
// one image's output pixels, whose columns fit a workspace of conv2d_im2col_workspace_elements
// elements of T (computed from the budget workspace_bytes; never less than one column of
// C*kh*kw). conv2d's im2col path uses im2col v2. tf32 (float only): the columns and weights
// rounded to TF32 before the GEMM (the weights' rounded copy takes out_channels * C*kh*kw more
// workspace elements).
template <class T>
long long conv2d_im2col_workspace_elements(int batch, int out_channels, const Conv2dGeometry& g,
                                           long long workspace_bytes, bool tf32);
template <class T>
cudaError_t conv2d_im2col_launch(const T* x, const T* weight, const T* bias, T* y, int batch,
                                 int out_channels, const Conv2dGeometry& g, int gemm_version,
                                 bool tf32, T* workspace, long long workspace_elements,
                                 cudaStream_t stream);

// --------------------------------------------------------------- tf32_round.cu
// y[i] = x[i] rounded to TF32 (to nearest, ties away from zero), for i < n; y may be x.
cudaError_t tf32_round_launch(const float* x, float* y, long long n, cudaStream_t stream);

// ----------------------------------------------------------------- conv_implicit.cu
// y = conv2d(x, weight) + bias as an implicit GEMM on the tensor cores (3xTF32), then an
// optional elementwise tail: kMinAddMul (P31) gives y = (min(y, constant) + bias[co]) * factor.
// x: batch images of g.channels x g.height x g.width; y: batch x out_channels x out_h x out_w.
// The weights are first packed (conv2d_implicit_pack into a buffer of
// conv2d_implicit_packed_bytes, 16-byte aligned, the same size for every T and engine) for
// the engine that launches (above: tensor_cores_native16 packs another layout); a packed
// buffer serves any number of launches while the weights do not change.
// halves (kMinAddMul, may be nullptr): where given, the store also writes, a byte an output in
// y's layout, min_gradient_halves (common.cuh) of its rounded conv + bias against the constant.
template <class T = float>
struct ConvTail {
    enum Kind { kNone = 0, kMinAddMul = 1 };
    int kind;
    float constant;
    const T* bias;  // kMinAddMul: one value per output channel
    float factor;
    uint8_t* halves = nullptr;
};
// tf32: one TF32 product per fp32 product (A and B rounded to nearest), as cuDNN computes
// when torch allows TF32 (conv2d_uses_tf32 says when scratchops follows it); the half types:
// tensor_cores_single_product, natively where tensor_cores_native16.
// Staged A (conv_implicit.cu's v4): where conv2d_implicit_stages_a holds (the wgmma engine, a
// single-product mode, stride 1, Cin of at least a k-block whose row of values is a multiple
// of 16 bytes), the caller may pack with staged = true and give the launch a workspace of
// conv2d_implicit_channels_last_bytes (16-byte aligned) for a channels-last copy of x; the
// copy engine then stages A in shared memory. Otherwise staged = false and nullptr. x may be
// nullptr where that workspace holds the copy already (the launch then makes none). Where
// conv2d_implicit_reads_input_rows, v5 makes A's rows from x itself: the workspace may be 0
// bytes (but given), and no copy is left there; keep_channels_last (the caller reads the copy
// afterwards) rules v5 out, so that v4 makes it.
template <class T>
bool conv2d_implicit_stages_a(const Conv2dGeometry& g, bool tf32, TensorCorePath engine);
template <class T>
long long conv2d_implicit_channels_last_bytes(int batch, const Conv2dGeometry& g);
template <class T>
bool conv2d_implicit_reads_input_rows(const T* x, int batch, int out_channels,
                                      const Conv2dGeometry& g);
long long conv2d_implicit_packed_bytes(const Conv2dGeometry& g, int out_channels);
template <class T>
cudaError_t conv2d_implicit_pack(const T* weight, int out_channels, const Conv2dGeometry& g,
                                 TensorCorePath engine, bool staged, void* packed,
                                 cudaStream_t stream);
// group_k_blocks: let long reductions keep several k-blocks in one partial sum (5% faster on
// P31's forward, a little less accurate: conv_implicit.cu); false: one k-block a partial sum
// (the input gradient of conv_backward.cu, whose error the tests hold to 4x torch's).
// weight: nullptr where `packed` holds the weights packed already (conv2d_implicit_pack, the
// same staged or not as the launch); given, the launch packs them into `packed` (a workspace
// of conv2d_implicit_packed_bytes) itself, so that nothing packed outlives the call: on the
// wgmma engine inside the convolution's own kernel (v1, v2 and v4: its persistent grid packs,
// meets at a grid barrier, then multiplies; a cooperative launch), elsewhere (v3, mma.sync,
// a GPU that cannot hold the whole grid at once) with the packing kernel first.
template <class T>
cudaError_t conv2d_implicit_launch(const T* x, const void* packed, const T* bias, T* y,
                                   int batch, int out_channels, const Conv2dGeometry& g,
                                   const ConvTail<T>& tail, bool tf32, TensorCorePath engine,
                                   cudaStream_t stream, bool group_k_blocks = true,
                                   void* channels_last = nullptr, const T* weight = nullptr,
                                   bool keep_channels_last = false);
// Whether a convolution whose torch counterpart may use TF32 (torch.backends.cudnn.allow_tf32)
// computes in TF32: cuDNN chooses per shape, and the rule that agrees with it best over the
// measured shapes (docs/tf32.md) is a reduction of at least kTf32MinReduction = Cin*kh*kw.
constexpr int kTf32MinReduction = 128;
inline bool conv2d_uses_tf32(const Conv2dGeometry& g) {
    return static_cast<long long>(g.channels) * g.kernel_h * g.kernel_w >= kTf32MinReduction;
}

// ------------------------------------------------------------------ conv_gn_pool.cu
// P85 in one pass: y = clamp(max_pool2d(group_norm(conv2d(x) + conv_bias) * scale, 4), lo, hi),
// the convolution's output never written (the derivation is at the top of the file). y is
// batch x out_channels x (out_h / 4) x (out_w / 4). Where conv_gn_pool_reads_packed says so,
// the weights are packed as for conv2d_implicit_launch (conv2d_implicit_pack). Covers
// out_channels <= 64 (divisible by groups), out_h and out_w >= 4; returns
// cudaErrorInvalidValue otherwise. workspace:
// conv_gn_pool_workspace_bytes (statistics, and window extremes unless kept), 16-byte aligned.
template <class T = float>
struct GnPoolArgs {
    const T* conv_bias;  // (Cout) or nullptr
    const T* gamma;      // group norm weight (Cout) or nullptr
    const T* beta;       // group norm bias (Cout) or nullptr
    const T* scale;      // (Cout) or nullptr
    int groups;
    float eps, lo, hi;
    // What the backward by recomputation keeps (conv_gn_pool_backward.cu), or nullptr: each
    // window's extreme (batch x Cout x out_h/4 x out_w/4) and each (sample, group)'s {mean,
    // 1/std}; the extremes otherwise go to the workspace.
    float* kept_extremes = nullptr;
    float* kept_stats = nullptr;
};
long long conv_gn_pool_workspace_bytes(int batch, int out_channels, const Conv2dGeometry& g,
                                       int groups, bool extremes_kept);
// version: 1 = a direct convolution on the CUDA cores (any GPU; reads `weight`, the
// (Cout, Cin, kh, kw) tensor), 2 = the implicit GEMM on `engine` with statistics and extremes
// in its epilogue, 3 = a kernel of its own where it covers the call (the wgmma engine,
// Cin <= 8, at most 12 taps; float with !tf32, or a half type), version 2 elsewhere (see
// conv_gn_pool.cuh). tf32 and engine: the convolution's, as conv2d_implicit_launch's.
constexpr int kConvGnPoolVersions = 3;
constexpr int kConvGnPoolCudaCoreVersion = 1;
// Whether that call reads the packed weights (`packed`): version 2, and version 3 where its
// own kernel does not cover the call. Versions 1 and 3's kernel read `weight` itself, and
// `packed` may then be nullptr: a call without a packing kernel before it.
template <class T>
bool conv_gn_pool_reads_packed(int version, const Conv2dGeometry& g, int out_channels,
                               bool tf32, TensorCorePath engine);
template <class T>
cudaError_t conv_gn_pool_launch(int version, const T* x, const T* weight, const void* packed,
                                const GnPoolArgs<T>& args, T* y, int batch, int out_channels,
                                const Conv2dGeometry& g,
                                bool tf32, TensorCorePath engine, void* workspace,
                                cudaStream_t stream);

// ------------------------------------------------------------------ groupnorm.cu
// y = group_norm(x) over an (batch, channels, plane_size) tensor with `groups` groups
// (channels % groups == 0), then times scale[c]. gamma, beta, scale may each be nullptr
// (1, 0, 1). stats is a workspace of 2 * batch * groups floats (mean, 1/std per group).
// version: 1 = two-pass statistics, 2 = Welford (see groupnorm.cu).
constexpr int kGroupNormVersions = 2;
template <class T>
cudaError_t group_norm_launch(int version, const T* x, T* y, const T* gamma, const T* beta,
                              const T* scale, float* stats, int batch,
                              int channels, int plane_size, int groups, float eps,
                              cudaStream_t stream);

// The statistics alone (mean, 1/std per (n, g) into stats), as group_norm_launch's default
// version computes them: the backward normalises with the forward's own numbers.
template <class T>
cudaError_t group_norm_stats_launch(const T* x, float* stats, int batch, int channels,
                                    int plane_size, int groups, float eps, cudaStream_t stream);

// ---------------------------------------------------------------- channelwise.cu
// Over an (batch, channels, plane_size) tensor: y = x * scale[c].
template <class T>
cudaError_t scale_launch(const T* x, const T* scale, T* y, int batch, int channels,
                         int plane_size, cudaStream_t stream);
// y = (min(x, constant) + bias[c]) * factor, NaN propagating through the min.
template <class T>
cudaError_t min_add_mul_launch(const T* x, float constant, const T* bias, float factor,
                               T* y, int batch, int channels, int plane_size,
                               cudaStream_t stream);

// ----------------------------------------------------------------- pool_clamp.cu
struct PoolGeometry {
    int height, width;  // input plane
    int kernel_h, kernel_w;
    int stride_h, stride_w;
    int pad_h, pad_w;   // a window wholly in the padding gives -inf (torch refuses such)
    int out_h, out_w;
};
// y = clamp(max_pool2d(x), lo, hi) over `planes` = N*C planes; lo = -inf, hi = +inf for a
// plain max pool. version: 1 = a grid shaped like the output, 2 = a flat grid (see
// pool_clamp.cu).
constexpr int kMaxPool2dVersions = 2;
template <class T>
cudaError_t max_pool2d_clamp_launch(int version, const T* x, T* y, int planes,
                                    const PoolGeometry& g, float lo, float hi,
                                    cudaStream_t stream);
// y = min(max(x, lo), hi) over n contiguous elements.
template <class T>
cudaError_t clamp_launch(const T* x, T* y, int n, float lo, float hi,
                         cudaStream_t stream);

}  // namespace scratchops

// The backward launchers (one kernel file per forward file).
#include "launchers_backward.h"
