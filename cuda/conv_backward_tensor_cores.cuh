// conv_backward_tensor_cores.cuh — the convolution gradients on the tensor cores (the versions
// and their reasons are listed at the top of conv_backward.cu): the input gradient v2, a
// convolution of dy on the implicit GEMM, and its v4, the roles swapped (3xTF32:
// conv_input_grad_swapped.cuh, its launch in conv_input_grad_swapped_launch.cuh), the weight
// gradient v2, an implicit GEMM in ordered slices (conv_weight_grad_implicit.cuh), and its
// v3, both operands staged by the copy engine (conv_weight_grad_staged.cuh, its launch in
// conv_weight_grad_staged_launch.cuh), the two at once with dy's copy shared
// (conv2d_grads_shared_launch). Included by conv_backward.cu after the helpers every version
// shares (GradShape, aligned_elements, the flipped weights' geometry and workspace); P31's four
// at once in float run these gradients from conv_grads_min_add_mul.cuh.
#pragma once

#include <type_traits>

#include "conv_input_grad_swapped_launch.cuh"
#include "conv_weight_grad_implicit.cuh"
#include "conv_weight_grad_staged_launch.cuh"
#include "min_add_mul_operands.cuh"

namespace scratchops {
namespace {

// Input gradient v3 (conv_backward.cu's list): v2 on the implicit GEMM's v4 (conv_implicit.cu:
// A staged by the copy engine from a channels-last copy, here of dy) where
// conv2d_implicit_stages_a holds for the flipped convolution (a single-product mode on the
// wgmma engine: the half types, TF32 where tf32; v4 does not multiply 3xTF32): the images of
// dy whose channels-last copy the workspace holds after Wf and its packing, at most the batch,
// which then runs in chunks of that many images; 0 where v4 does not apply or not one image
// fits (v1-v3 then read dy as it is). The workspace's size (conv2d_grad_workspace_elements)
// and the launch both ask this, with the same answer: an image's copy is a multiple of 16
// bytes (v4's channel rows are), so rounding the copy's bytes up adds no room for another.
template <class T>
int staged_dy_images(int batch, int out_channels, const Conv2dGeometry& g, TensorCorePath engine,
                     bool tf32, long long workspace_bytes) {
    const Conv2dGeometry flipped_g = input_grad_geometry(g, out_channels);
    const long long per_image = conv2d_implicit_channels_last_bytes<T>(1, flipped_g);
    if (batch <= 0 || per_image <= 0 || !conv2d_implicit_stages_a<T>(flipped_g, tf32, engine))
        return 0;
    const FlippedWeights f = flipped_weights<T>(out_channels, g);
    const long long left =
        workspace_bytes - (f.flipped + f.packed) * static_cast<long long>(sizeof(T));
    long long images = left > 0 ? left / per_image : 0;
    images = images < kMaxGridYZ ? images : kMaxGridYZ;  // (channels_last_launch's grid)
    return images < batch ? static_cast<int>(images) : batch;
}

// Input gradient v2: dx = conv2d(dy, Wf, padding dil*(k-1) - pad) on the tensor cores, in
// chunks of staged_dy_images images where v4 stages dy (workspace_bytes: the workspace's size);
// tf32: the forward's TF32 mode (conv2d_implicit_launch's tf32). dy nullptr: v4 stages the
// whole batch in one chunk and dy's channels-last copy is in the workspace already.
// keep_dy_copy: the caller reads dy's copy from the workspace afterwards, so v4 makes it
// (conv2d_implicit_launch's keep_channels_last; v5 would make none). In float's 3xTF32 on the
// wgmma engine the input gradient v4 runs instead (the roles swapped: swapped::launch), where
// swapped::applies and one image's parts fit the workspace.
template <class T>
cudaError_t input_grad_as_convolution(const T* dy, const T* weight, T* dx, int batch,
                                      int out_channels, const Conv2dGeometry& g,
                                      TensorCorePath engine, bool tf32, T* workspace,
                                      long long workspace_bytes, cudaStream_t stream,
                                      bool keep_dy_copy = false) {
    if constexpr (std::is_same_v<T, float>)  // the input gradient v4
        if (dy != nullptr && swapped::applies(out_channels, g, engine, tf32) &&
            swapped::chunk_images(batch, out_channels, g, workspace_bytes) > 0)
            return swapped::launch(dy, weight, dx, batch, out_channels, g, workspace,
                                   workspace_bytes, stream);
    const Conv2dGeometry flipped_g = input_grad_geometry(g, out_channels);
    const FlippedWeights f = flipped_weights<T>(out_channels, g);
    T* flipped = workspace;
    const int total = g.channels * out_channels * g.kernel_h * g.kernel_w;
    flip_weights_kernel<T><<<(total + kFlipThreads - 1) / kFlipThreads, kFlipThreads, 0,
                             stream>>>(weight, flipped, total, out_channels, g.channels,
                                       g.kernel_h, g.kernel_w);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    // (the convolution packs the flipped weights into `packed` itself: conv2d_implicit_launch)
    void* packed = workspace + f.flipped;
    const ConvTail<T> none{ConvTail<T>::kNone, 0.0f, nullptr, 1.0f};
    const int staged =
        staged_dy_images<T>(batch, out_channels, g, engine, tf32, workspace_bytes);
    if (dy == nullptr && staged != batch) return cudaErrorInvalidValue;
    if (staged == 0)
        return conv2d_implicit_launch<T>(dy, packed, nullptr, dx, batch, g.channels, flipped_g,
                                         none, tf32, engine, stream,
                                         /*group_k_blocks=*/false, nullptr, flipped);
    const long long dy_image = static_cast<long long>(out_channels) * g.out_h * g.out_w;
    const long long dx_image = static_cast<long long>(g.channels) * g.height * g.width;
    void* channels_last = workspace + f.flipped + f.packed;
    for (int n0 = 0; n0 < batch && err == cudaSuccess; n0 += staged) {
        const int count = batch - n0 < staged ? batch - n0 : staged;
        const T* chunk = dy == nullptr ? nullptr : dy + n0 * dy_image;
        err = conv2d_implicit_launch<T>(chunk, packed, nullptr, dx + n0 * dx_image,
                                        count, g.channels, flipped_g, none, tf32, engine,
                                        stream, /*group_k_blocks=*/false, channels_last,
                                        flipped, keep_dy_copy);
    }
    return err;
}

// Weight gradient v3 (conv_weight_grad_staged.cuh) runs where both copies can be boxes of
// the copy engine and its wgmma can read them: 16-bit products on the wgmma engine, stride 1,
// a kernel row of at most kMaxTaps taps whose x box fits its ring's halo, channel rows of
// whole 16 bytes (the tensor maps' strides), at least one 64-channel block on each side, and
// a column for every tap's cut map (edge_first_col).
template <class T>
bool weight_grad_stages_operands(int out_channels, const Conv2dGeometry& g,
                                 TensorCorePath engine) {
    using namespace wgrad_staged;
    return tensor_cores_native16<T>(engine) && g.stride_h == 1 && g.stride_w == 1 &&
           g.kernel_w <= kMaxTaps && (g.kernel_w - 1) * g.dil_w <= kHaloRows &&
           g.channels >= kChannelBlock && out_channels >= kChannelBlock &&
           (g.channels * sizeof(T)) % 16 == 0 && (out_channels * sizeof(T)) % 16 == 0 &&
           edge_first_col(g) >= 1;
}
// Its workspace: the float accumulator dWᵀ and the edge flags, then a chunk: its images' two
// copies and its slices' partial dWᵀ (float).
struct StagedWeightGrad {
    long long fixed, per_image, entry;  // bytes: the fixed part, an image's copies, a partial
    int images;                         // images a chunk (0: v2 runs)
    long long chunk_bytes(const Conv2dGeometry& g, int n) const {
        return n * per_image +
               align16(wgrad_staged::slicing(g, n, kStagedWeightGradSlice).slices * entry);
    }
};
template <class T>
StagedWeightGrad staged_weight_grad(int batch, int out_channels, const Conv2dGeometry& g,
                                    TensorCorePath engine, long long workspace_bytes) {
    StagedWeightGrad s{};
    if (batch <= 0 || !weight_grad_stages_operands<T>(out_channels, g, engine)) return s;
    s.entry = grad_shape(g).taps * out_channels * static_cast<long long>(sizeof(float));
    s.fixed = align16(s.entry) +
              align16(wgrad_staged::kEdgeFlagBlocks * static_cast<long long>(sizeof(int)));
    // (both copies' images are whole 16-byte rows: the channel counts above)
    s.per_image = (static_cast<long long>(g.channels) * g.height * g.width +
                   static_cast<long long>(out_channels) * g.out_h * g.out_w) * sizeof(T);
    const long long left = workspace_bytes - s.fixed;
    // The most images whose chunk fits (chunk_bytes grows with them: a binary search) below
    // what the copies alone allow, the batch and channels_last_launch's grid.
    long long lo = 0, hi = left > 0 ? left / s.per_image : 0;
    hi = hi < batch ? hi : batch;
    hi = hi < kMaxGridYZ ? hi : kMaxGridYZ;
    while (lo < hi) {
        const long long mid = (lo + hi + 1) / 2;
        if (s.chunk_bytes(g, static_cast<int>(mid)) <= left) lo = mid; else hi = mid - 1;
    }
    s.images = static_cast<int>(lo);
    return s;
}

// Weight gradient v3: per chunk of images, x and dy made channels-last, the staged product's
// slices stored and added in order into the accumulator; then dW = the accumulator transposed,
// rounded to T. The bits depend on the chunk's size (the slices restart at each chunk), which
// the budget fixes. dy_channels_last: dy's copy made already (the whole batch, one chunk:
// conv2d_grads_shared_launch), which the workspace then does not hold.
template <class T>
cudaError_t weight_grad_staged(const T* dy, const T* x, T* dweight, int batch, int out_channels,
                               const Conv2dGeometry& g, const StagedWeightGrad& s,
                               void* workspace, cudaStream_t stream,
                               const T* dy_channels_last = nullptr) {
    const int taps = static_cast<int>(grad_shape(g).taps);
    const int kc = taps * out_channels;
    auto* base = static_cast<uint8_t*>(workspace);
    auto* accumulator = reinterpret_cast<float*>(base);
    auto* edge_flags = reinterpret_cast<int*>(base + align16(s.entry));
    T* x_cl = reinterpret_cast<T*>(base + s.fixed);
    const long long x_image = static_cast<long long>(g.channels) * g.height * g.width;
    const long long dy_image = static_cast<long long>(out_channels) * g.out_h * g.out_w;
    const bool made = dy_channels_last != nullptr;
    T* dy_cl = made ? const_cast<T*>(dy_channels_last) : x_cl + s.images * x_image;
    auto* partials = reinterpret_cast<float*>(x_cl + s.images * (x_image + (made ? 0 : dy_image)));
    cudaError_t err = cudaSuccess;
    for (int n0 = 0; n0 < batch && err == cudaSuccess; n0 += s.images) {
        const int count = batch - n0 < s.images ? batch - n0 : s.images;
        err = channels_last_launch<T>(x + n0 * x_image, x_cl, count, g.channels,
                                      g.height * g.width, false, stream);
        if (err == cudaSuccess && !made)
            err = channels_last_launch<T>(dy + n0 * dy_image, dy_cl, count, out_channels,
                                          g.out_h * g.out_w, false, stream);
        if (err == cudaSuccess)
            err = wgrad_staged::launch<T>(dy_cl, x_cl, edge_flags, partials, count,
                                          out_channels, g, kStagedWeightGradSlice, stream);
        if (err == cudaSuccess)  // accumulator += partial[0] + partial[1] + ..., in order
            err = batch_sum_launch<float, float>(
                partials, n0 == 0 ? nullptr : accumulator, accumulator,
                wgrad_staged::slicing(g, count, kStagedWeightGradSlice).slices, kc, stream);
    }
    if (err != cudaSuccess) return err;
    return transpose_launch<float, T>(accumulator, dweight, 1, taps, out_channels, stream);
}

// Weight gradient v2's workspace: the float accumulator dWᵀ (K x Cout), then a chunk of
// entries (conv_wgrad::chunk_bytes) as large as `budget` bytes hold, at least one.
inline long long weight_grad_fixed_bytes(int out_channels, const Conv2dGeometry& g) {
    return align16(grad_shape(g).taps * out_channels *
                               static_cast<long long>(sizeof(float)));
}
template <class Op>
long long weight_grad_bytes(int batch, int out_channels, const Conv2dGeometry& g,
                            long long budget) {
    const conv_wgrad::Slices s = conv_wgrad::slices_of<Op>(batch, g, kWeightGradSlice);
    const int taps = static_cast<int>(grad_shape(g).taps);
    const long long fixed = weight_grad_fixed_bytes(out_channels, g);
    const int entries = conv_wgrad::chunk_entries(s, taps, out_channels, budget - fixed);
    return fixed + conv_wgrad::chunk_bytes(s, taps, out_channels, entries).total();
}
// What the call needs: v3's chunk where one image's fits the budget or v2's smallest
// workspace (v3 may then take the larger of the two), else what either product type of v2 needs
// (the call's engine picks one: tensor_cores_native16). The launch, given exactly this, takes
// the same version with the same chunk: staged_weight_grad of it gives the same images.
template <class T>
long long weight_grad_workspace_bytes(int batch, int out_channels, const Conv2dGeometry& g,
                                      TensorCorePath engine, long long budget) {
    const long long as_float = weight_grad_bytes<float>(batch, out_channels, g, budget);
    const long long as_t = weight_grad_bytes<T>(batch, out_channels, g, budget);
    const long long v2 = as_float > as_t ? as_float : as_t;
    const StagedWeightGrad staged =
        staged_weight_grad<T>(batch, out_channels, g, engine, budget > v2 ? budget : v2);
    return staged.images > 0 ? staged.fixed + staged.chunk_bytes(g, staged.images) : v2;
}

// Weight gradient v2: the implicit GEMM over chunks of slices, each chunk's partial dWᵀ added
// to the accumulator in slice order, then dW = the accumulator transposed, rounded to T.
// fp32: 3xTF32, or TF32 single products where tf32; fp16 / bf16: their native products on
// wgmma, else TF32 single products (exact on their values). halves (float only): the
// gradient taken is the min's of dy, computed by the packing (DyColumns), or, where
// `operands` is given (float's 3xTF32, min_rule_operands::applies), by the min's one pass,
// which also writes the input gradient's parts and the bias sums' partials there.
template <class T>
cudaError_t weight_grad_implicit(const T* dy, const T* x, T* dweight, int batch,
                                 int out_channels, const Conv2dGeometry& g,
                                 TensorCorePath engine, bool tf32, void* workspace,
                                 long long workspace_bytes, cudaStream_t stream,
                                 const uint8_t* halves = nullptr, float factor = 1.0f,
                                 const min_rule_operands::Outputs* operands = nullptr) {
    if constexpr (!std::is_same_v<T, float>) {
        if (halves != nullptr) return cudaErrorInvalidValue;
        const StagedWeightGrad staged =
            staged_weight_grad<T>(batch, out_channels, g, engine, workspace_bytes);
        if (staged.images > 0)
            return weight_grad_staged(dy, x, dweight, batch, out_channels, g, staged, workspace,
                                      stream);
    }
    const int taps = static_cast<int>(grad_shape(g).taps);
    const int kc = taps * out_channels;
    const long long fixed = weight_grad_fixed_bytes(out_channels, g);
    float* accumulator = static_cast<float*>(workspace);
    uint8_t* chunk = static_cast<uint8_t*>(workspace) + fixed;
    auto go = [&](auto kTf32, auto op) {
        constexpr bool kT = decltype(kTf32)::value;
        using Op = decltype(op);
        const conv_wgrad::Slices s = conv_wgrad::slices_of<Op>(batch, g, kWeightGradSlice);
        const bool b_packed = operands != nullptr;  // (by the min's one pass)
        const conv_wgrad::ChunkBuffers buffers = conv_wgrad::chunk_buffers<kT, Op>(
            s, taps, out_channels, g, engine, workspace_bytes - fixed, b_packed);
        const int per_chunk = buffers.entries;
        const long long packed_bytes =
            conv_wgrad::chunk_bytes(s, taps, out_channels, per_chunk).packed;
        auto packed_of = [&](int c) { return chunk + (c % buffers.count) * buffers.stride; };
        auto partials_of = [&](int c) {
            return reinterpret_cast<float*>(packed_of(c) + packed_bytes);
        };
        auto entries_from = [&](int e0) {  // (a chunk's, from entry e0)
            return s.count - e0 < per_chunk ? s.count - e0 : per_chunk;
        };
        // The min's one pass for chunk c (entries from e0): beside the product before it
        // (chunk c's unit counter), or in turn; with two buffers it zeroes chunk c + 1's.
        auto one_pass = [&](int c, int e0, bool beside) {
            cudaError_t err = cudaErrorInvalidValue;  // (float's 3xTF32 alone)
            if constexpr (std::is_same_v<T, float>)  // (apart: T is no lambda parameter)
                if constexpr (std::is_same_v<Op, float> && !kT) {
                    int* counters = buffers.count == 2
                                        ? reinterpret_cast<int*>(chunk + 2 * buffers.stride)
                                        : nullptr;
                    err = min_rule_operands::launch(
                        dy, halves, factor, *operands, out_channels, g, s, e0, entries_from(e0),
                        packed_of(c), stream, beside ? counters + c % 2 : nullptr,
                        counters != nullptr ? counters + (c + 1) % 2 : nullptr);
                }
            return err;
        };
        cudaError_t err = cudaSuccess;
        if (s.count == 0)  // an empty batch: dW = 0 (a sum of no partials)
            err = batch_sum_launch<float, float>(nullptr, nullptr, accumulator, 0, kc, stream);
        if (b_packed && s.count > 0) err = one_pass(0, 0, false);
        for (int c = 0, e0 = 0; e0 < s.count && err == cudaSuccess; ++c, e0 += per_chunk) {
            const int entries = entries_from(e0);
            const bool next = b_packed && e0 + per_chunk < s.count;
            // (With two buffers the next chunk's pass runs beside this chunk's product.)
            const int free_sms = next && buffers.count == 2 ? buffers.free_sms : 0;
            err = conv_wgrad::product<kT, Op>(dy, x, out_channels, g, s, e0, entries, engine,
                                              packed_of(c), partials_of(c), stream, halves,
                                              factor, b_packed, free_sms);
            if (err == cudaSuccess && next) err = one_pass(c + 1, e0 + per_chunk, free_sms > 0);
            if (err == cudaSuccess)  // accumulator += partial[0] + partial[1] + ..., in order
                err = batch_sum_launch<float, float>(partials_of(c),
                                                     e0 == 0 ? nullptr : accumulator,
                                                     accumulator, entries, kc, stream);
        }
        return err;
    };
    cudaError_t err;
    if constexpr (std::is_same_v<T, float>)
        err = tf32 ? go(std::true_type{}, float{}) : go(std::false_type{}, float{});
    else
        err = tensor_cores_native16<T>(engine) ? go(std::true_type{}, T{})
                                               : go(std::true_type{}, float{});
    if (err != cudaSuccess) return err;
    return transpose_launch<float, T>(accumulator, dweight, 1, taps, out_channels, stream);
}

}  // namespace

// Both gradients at once, dy's channels-last copy shared (launchers_backward.h): the input
// gradient v3 in one chunk, its workspace [Wf, packed Wf, dy's copy], then the weight gradient
// v3 in one chunk reading that copy, its workspace after it without a copy of dy.
template <class T>
long long conv2d_grads_shared_bytes(int batch, int out_channels, const Conv2dGeometry& g,
                                    int gemm_version, TensorCorePath engine, long long budget) {
    if constexpr (std::is_same_v<T, float>) {
        return 0;  // (3xTF32 stages neither; TF32's weight gradient is v2's)
    } else {
        if (batch <= 0 || !on_tensor_cores(gemm_version) || !input_grad_is_a_convolution(g) ||
            staged_dy_images<T>(batch, out_channels, g, engine, false, budget) != batch)
            return 0;
        const StagedWeightGrad w = staged_weight_grad<T>(batch, out_channels, g, engine, budget);
        if (w.images != batch) return 0;
        // [Wf, packed Wf, dy's copy] then the weight gradient's workspace less its copy of
        // dy: the weight gradient's chunk counts dy's copy, once for both.
        const FlippedWeights f = flipped_weights<T>(out_channels, g);
        const long long bytes = (f.flipped + f.packed) * static_cast<long long>(sizeof(T)) +
                                w.fixed + w.chunk_bytes(g, batch);
        return bytes <= budget ? bytes : 0;
    }
}

template <class T>
long long conv2d_grads_shared_dy_offset(int out_channels, const Conv2dGeometry& g) {
    const FlippedWeights f = flipped_weights<T>(out_channels, g);
    return (f.flipped + f.packed) * static_cast<long long>(sizeof(T));
}

template <class T>
cudaError_t conv2d_grads_shared_launch(const T* dy, const T* x, const T* weight, T* dx, T* dw,
                                       int batch, int out_channels, const Conv2dGeometry& g,
                                       TensorCorePath engine, long long budget, void* workspace,
                                       cudaStream_t stream, bool dy_copied) {
    if constexpr (std::is_same_v<T, float>) {
        return cudaErrorInvalidValue;
    } else {
        const long long dy_offset = conv2d_grads_shared_dy_offset<T>(out_channels, g);
        const long long input_part =
            dy_offset +
            conv2d_implicit_channels_last_bytes<T>(batch, input_grad_geometry(g, out_channels));
        const StagedWeightGrad w = staged_weight_grad<T>(batch, out_channels, g, engine, budget);
        if (w.images != batch) return cudaErrorInvalidValue;
        cudaError_t err = input_grad_as_convolution(dy_copied ? nullptr : dy, weight, dx, batch,
                                                    out_channels, g, engine, false,
                                                    static_cast<T*>(workspace), input_part, stream,
                                                    /*keep_dy_copy=*/true);
        if (err != cudaSuccess) return err;
        const auto* dy_copy =
            reinterpret_cast<const T*>(static_cast<const uint8_t*>(workspace) + dy_offset);
        return weight_grad_staged(dy, x, dw, batch, out_channels, g, w,
                                  static_cast<uint8_t*>(workspace) + input_part, stream, dy_copy);
    }
}

}  // namespace scratchops
