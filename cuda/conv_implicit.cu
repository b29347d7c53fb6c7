// conv_implicit.cu — 2-D convolution as an implicit GEMM on the tensor cores, fp32-accurate
// (3xTF32, the engine in tf32x3.cuh), with the bias and an optional elementwise tail fused
// into the store.
//
// The GEMM: row m = output pixel (n, oh, ow) of M = N * OH * OW, column = output channel,
// k = tap * cin_pad + ci with tap = r * S + s and cin_pad = Cin rounded up to 8 (so a thread's
// 8 consecutive k, see tf32x3.cuh, are 8 channels of one tap). A[m][k] is the input value
// under tap (r, s) of pixel m in channel ci, read straight from the NCHW input: the im2col
// matrix of conv_im2col.cu is never written. B = the weights, packed at every call: on the
// wgmma engine by the convolution's own grid before its first tile (pack_b.cuh's
// pack_b_in_grid), so that a call is one launch (v4 too where its grid also makes the input's
// channels-last copy: conv_implicit_staged_a_launch.cuh's kChannelsLastInsideBytes);
// elsewhere by pack_b's kernel first. The store, + bias or P31's tail, is conv_store.cuh's.
//
// Versions (conv2d's algorithm="implicit_gemm"; conv_im2col.cu + gemm.cu stay the
// educational "im2col_gemm" path):
//   v1 implicit GEMM, 3xTF32 wgmma: a row's 8 values of a k-block are 8 channels at one tap,
//      loaded with the channel plane (H * W) as stride; with Cin a multiple of 8 they are all
//      present or all absent (padding, past the last tap), and absent ones come from a zero
//      page with stride 0, unpredicated. Epilogues: + bias, or P31's
//      (min(conv + bias, c) + bias2[co]) * factor in the same store. With tf32, the engine's
//      one-product TF32 mode (what cuDNN computes when torch allows TF32).
//   v2 native fp16 / bf16 products (the half types on the wgmma engine: tensor_cores_native16
//      in launchers.h): the engine's 16-bit mode, k16 wgmmas at twice the TF32 rate, the
//      weights packed as 16-bit values (64 a k-block), a thread's 16 channels of a tap loaded
//      as pairs of bits; no conversion of A at all. Same tile shapes and epilogues.
//   v3 (16-bit, where all of the packed weights fit in shared memory: one column tile, e.g.
//      P31's 147 KB in bf16) the weights stay resident in each CTA, and three consumer
//      warpgroups walk their own 64-row tiles out of step, one's epilogue under another's
//      wgmmas (wgmma_resident_b.cuh); elsewhere v2's ring.
//   v4 A staged in shared memory by the copy engine (conv_implicit_staged_a.cuh): x is first
//      made channels-last (one pass, by its own kernel or, for a small input, by v4's grid
//      before its first tile; in TF32 rounded to nearest on the way), so that a
//      k-block of A (kTileRows pixels of an output row at one tap) is one box of it, and both
//      wgmma operands are read from shared memory; no thread loads A at all. The single-
//      product modes (TF32, fp16, bf16) with stride 1 where the caller gives the workspace
//      (conv2d_implicit_stages_a); B's k-blocks are whole taps, in the natural k order.
//   v5 v4 without the copy (conv_implicit_row_ring.cuh; 16-bit, where row_ring::applies, e.g.
//      P31): each CTA makes v4's channels-last A rows itself, from NCHW rows that the copy
//      engine stages and its producer warps transpose (ldmatrix / stmatrix) into a ring of
//      input rows, walking consecutive output rows so that each input row is made once. The
//      same products in the same order and the same store as v4: the same bits.
// Element types: float, fp16 and bf16 input, weights and output (element.cuh); a half input
// on the mma.sync engine runs the one-product TF32 mode, exact on half operands
// (tensor_cores_single_product, launchers.h).
#include <type_traits>

#include "conv_implicit.cuh"
#include "conv_implicit_row_ring_launch.cuh"
#include "conv_implicit_staged_a_launch.cuh"
#include "conv_store.cuh"
#include "tensor_core_launch.cuh"
#include "wgmma_resident_b.cuh"

namespace scratchops {
namespace {

using conv_tc::ConvGeometryFast;
using conv_tc::ConvStore;
using conv_tc::Im2colRows;

// Tile shapes: Cout <= 64 (P85): 64 columns x 128 rows; wider (P31): 128 x 128.
constexpr int kNarrowBN = 64, kNarrowMB = 1, kNarrowStages = 8;
constexpr int kWideBN = 128, kWideMB = 1, kWideStages = 4;
// K-blocks a partial sum holds (tf32x3.cuh): P31's 18 k-blocks drain the wgmma pipeline
// twice a tile instead of 18 times (5% faster); all 18 in one partial sum went past the
// tests' 4x of torch fp32. Only long reductions group: fp32's own error grows with K, and on
// short ones a 9-k-block partial sum is several times fp32's (scripts/accuracy_probe.py, 40
// draws a shape: up to 5.7x at K = 80 and 5.5x at K = 297, at most 3.1x at K = 576 and 1.6x
// at K = 1750), so fewer than kGroupFrom k-blocks drain at every k-block.
constexpr int kGroup = 9, kGroupFrom = 18;
// v3's consumer warpgroups a CTA (wgmma_resident_b.cuh), each on its own 64-row tiles: with 2,
// P31 bf16 took 2.013 ms against the ring kernel's 1.854, with 3 1.555 (H100, one call; the
// register limit of 384 threads, 168, holds the 160 the kernel needs).
constexpr int kResidentWarpgroups = 3;

int tile_width(int out_channels) { return out_channels <= kNarrowBN ? kNarrowBN : kWideBN; }

// v4's channel blocks a tap: Cin in k-blocks of Op (the channels past Cin read as zeros).
template <class Op>
int staged_cblocks(const Conv2dGeometry& g) {
    constexpr int kBlock = tc::Operand<Op>::kBlockK;
    return (g.channels + kBlock - 1) / kBlock;
}
// v4's packed weights: a k-block is channel block cb of one tap (k = tap * cblocks * kBlockK
// + c), in the natural k order.
template <class Op>
tc::PackedB staged_layout(const Conv2dGeometry& g, int out_channels, int bn) {
    const int k = g.kernel_h * g.kernel_w * staged_cblocks<Op>(g) * tc::Operand<Op>::kBlockK;
    return tc::packed_b_layout<Op>(bn, out_channels, k, 1);
}
// The weights as staged_layout's B (weight may be nullptr: a source not present).
template <class Op, class T>
conv_tc::ConvWeights<T> staged_source(const T* weight, int out_channels,
                                      const Conv2dGeometry& g) {
    return {weight,     out_channels, g.channels, staged_cblocks<Op>(g) * tc::Operand<Op>::kBlockK,
            g.kernel_h, g.kernel_w};
}
template <int BN, class Op, class T>
cudaError_t pack_staged(const T* weight, int out_channels, const Conv2dGeometry& g,
                        void* packed, cudaStream_t stream) {
    return tc::pack_b<BN, Op, true>(staged_source<Op>(weight, out_channels, g),
                                    static_cast<uint8_t*>(packed),
                                    staged_layout<Op>(g, out_channels, BN), stream);
}

// Op: the operand type multiplied (float: TF32, one product or three; T: natively in 16 bits).
// weight: packed into `packed` by this launch where given (see conv2d_implicit_launch).
template <int BN, int MB, int STAGES, bool kTf32, class Op, class T>
cudaError_t run(const T* x, const uint8_t* packed, const T* bias, T* y, int batch,
                int out_channels, const Conv2dGeometry& g, const ConvTail<T>& tail,
                bool group_k_blocks, TensorCorePath engine, void* channels_last,
                bool keep_channels_last, const T* weight, cudaStream_t stream) {
    const ConvGeometryFast f = conv_tc::fast_geometry<Op>(g, batch, out_channels);
    const ConvStore<T> store{y, bias, tail, f};
    const int m = batch * g.out_h * g.out_w;
    const tc::PackedB layout = conv_tc::weight_layout<Op>(g, out_channels, BN);
    const conv_tc::ConvWeights<T> source = conv_tc::weight_source<Op>(weight, out_channels, g);
    auto go = [&](auto loader) {
        if constexpr (tc::Operand<Op>::kNative16)  // v3: B resident, where it fits
            if (resident_b::fits<BN>(layout))  // (its kernel packs nothing: packed first)
                return tc::launch_packing_b<BN, Op, false>(
                    source, packed, layout, 0, false, stream, [&](bool, int) {
                        return resident_b::launch<BN, kResidentWarpgroups, Op>(
                            loader, store, packed, layout, m, stream);
                    });
        // (Single products sum a whole tile in the tensor cores: no groups to choose.)
        if constexpr (!kTf32)
            if (group_k_blocks && layout.num_kb >= kGroupFrom)
                return tensor_core_launch<BN, MB, STAGES, kGroup, kTf32, Op>(
                    engine, loader, store, packed, layout, m, 1, true, stream, source);
        return tensor_core_launch<BN, MB, STAGES, 1, kTf32, Op>(
            engine, loader, store, packed, layout, m, 1, true, stream, source);
    };
    if (channels_last != nullptr) {  // v4: the single-product modes, multiplying T itself
        if constexpr (kTf32 && std::is_same_v<Op, T>) {
            const tc::PackedB staged = staged_layout<Op>(g, out_channels, BN);
            if constexpr (tc::Operand<Op>::kNative16)  // v5 where it serves the shape
                if (!keep_channels_last && row_ring::applies<BN, Op>(x, g, batch, staged))
                    return row_ring::launch<BN, Op>(x, g, batch, packed, staged, store, stream,
                                                    staged_source<Op>(weight, out_channels, g));
            const staged_a::ChannelsLastCopy copy{x, channels_last, g.channels,
                                                  g.height * g.width, batch};
            return staged_a::launch<BN, Op>(
                copy, g, batch, packed, staged, staged_cblocks<Op>(g), store, stream,
                staged_source<Op>(weight, out_channels, g));
        }
        return cudaErrorInvalidValue;
    }
    using Pixels = conv_tc::LinearPixels;
    return g.channels % tc::Operand<Op>::kThreadK == 0
               ? go(Im2colRows<true, Pixels, T, Op>{x, f})
               : go(Im2colRows<false, Pixels, T, Op>{x, f});
}

}  // namespace

template <class T>
bool conv2d_implicit_stages_a(const Conv2dGeometry& g, bool tf32, TensorCorePath engine) {
    constexpr int kBlock = std::is_same_v<T, float> ? tc::kBlockK : tc::Operand<T>::kBlockK;
    return engine == TensorCorePath::kWgmma && tensor_cores_single_product<T>(tf32) &&
           g.stride_h == 1 && g.stride_w == 1 && g.channels >= kBlock &&
           (g.channels * sizeof(T)) % 16 == 0;  // the tensor map's strides
}

template <class T>
long long conv2d_implicit_channels_last_bytes(int batch, const Conv2dGeometry& g) {
    return static_cast<long long>(batch) * g.channels * g.height * g.width * sizeof(T);
}

template <class T>
bool conv2d_implicit_reads_input_rows(const T* x, int batch, int out_channels,
                                      const Conv2dGeometry& g) {
    if constexpr (tc::Operand<T>::kNative16) {  // (T on the wgmma engine: conv2d_implicit_stages_a)
        const int bn = tile_width(out_channels);
        const tc::PackedB staged = staged_layout<T>(g, out_channels, bn);
        return bn == kNarrowBN ? row_ring::applies<kNarrowBN, T>(x, g, batch, staged)
                               : row_ring::applies<kWideBN, T>(x, g, batch, staged);
    }
    return false;
}

// The largest of the layouts: the TF32 packing with K rounded to whole k-blocks of 32 a tap
// (v4's) holds v1-v3's (K rounded to 8) and every 16-bit one (packed_b_layout).
long long conv2d_implicit_packed_bytes(const Conv2dGeometry& g, int out_channels) {
    return staged_layout<float>(g, out_channels, tile_width(out_channels)).bytes();
}

template <class T>
cudaError_t conv2d_implicit_pack(const T* weight, int out_channels, const Conv2dGeometry& g,
                                 TensorCorePath engine, bool staged, void* packed,
                                 cudaStream_t stream) {
    auto go = [&](auto op) {
        using Op = decltype(op);
        if (staged)
            return tile_width(out_channels) == kNarrowBN
                       ? pack_staged<kNarrowBN, Op>(weight, out_channels, g, packed, stream)
                       : pack_staged<kWideBN, Op>(weight, out_channels, g, packed, stream);
        return tile_width(out_channels) == kNarrowBN
                   ? conv_tc::pack_weights<kNarrowBN, Op>(weight, out_channels, g, packed, stream)
                   : conv_tc::pack_weights<kWideBN, Op>(weight, out_channels, g, packed, stream);
    };
    return tensor_cores_native16<T>(engine) ? go(T{}) : go(float{});
}

template <class T>
cudaError_t conv2d_implicit_launch(const T* x, const void* packed, const T* bias, T* y,
                                   int batch, int out_channels, const Conv2dGeometry& g,
                                   const ConvTail<T>& tail, bool tf32, TensorCorePath engine,
                                   cudaStream_t stream, bool group_k_blocks,
                                   void* channels_last, const T* weight,
                                   bool keep_channels_last) {
    if (batch <= 0 || out_channels <= 0 || g.out_h <= 0 || g.out_w <= 0) return cudaSuccess;
    if (channels_last != nullptr && !conv2d_implicit_stages_a<T>(g, tf32, engine))
        return cudaErrorInvalidValue;
    const auto* p = static_cast<const uint8_t*>(packed);
    auto go = [&](auto kTf32, auto op) {
        constexpr bool kT = decltype(kTf32)::value;
        using Op = decltype(op);
        if (tile_width(out_channels) == kNarrowBN)
            return run<kNarrowBN, kNarrowMB, kNarrowStages, kT, Op>(
                x, p, bias, y, batch, out_channels, g, tail, group_k_blocks, engine,
                channels_last, keep_channels_last, weight, stream);
        return run<kWideBN, kWideMB, kWideStages, kT, Op>(
            x, p, bias, y, batch, out_channels, g, tail, group_k_blocks, engine, channels_last,
            keep_channels_last, weight, stream);
    };
    // (The half types have the single-product modes alone: their 3xTF32 kernels are never
    // built.)
    if constexpr (std::is_same_v<T, float>) {
        if (!tensor_cores_single_product<T>(tf32)) return go(std::false_type{}, float{});
    } else {
        if (tensor_cores_native16<T>(engine)) return go(std::true_type{}, T{});
    }
    return go(std::true_type{}, float{});
}

#define X(T)                                                                                 \
    template bool conv2d_implicit_stages_a<T>(const Conv2dGeometry&, bool, TensorCorePath);  \
    template long long conv2d_implicit_channels_last_bytes<T>(int, const Conv2dGeometry&);   \
    template bool conv2d_implicit_reads_input_rows<T>(const T*, int, int,                    \
                                                      const Conv2dGeometry&);                \
    template cudaError_t conv2d_implicit_pack<T>(const T*, int, const Conv2dGeometry&,       \
                                                 TensorCorePath, bool, void*, cudaStream_t); \
    template cudaError_t conv2d_implicit_launch<T>(const T*, const void*, const T*, T*, int,  \
                                                   int, const Conv2dGeometry&,               \
                                                   const ConvTail<T>&, bool, TensorCorePath, \
                                                   cudaStream_t, bool, void*, const T*,      \
                                                   bool);
SCRATCHOPS_FOR_EACH_ELEMENT(X)
#undef X

}  // namespace scratchops
