// conv_implicit.cuh — the parts shared by the implicit-GEMM convolutions (conv_implicit.cu,
// conv_gn_pool.cu): geometry with fast divisions, A's rows read from the NCHW input (the
// im2col matrix, never written), the weights as the engine's B, and the packed layout.
// The GEMM: row m = an output pixel (n, oh, ow) in a pixel order, column = output channel,
// k = tap * cin_pad + ci with tap = r * S + s and cin_pad = Cin rounded up to 8, so that a
// thread's 8 consecutive k (tf32x3.cuh) are 8 channels at one tap. The input and weights are
// of the element type T (element.cuh), widened to float as they are read. Multiplied natively
// in fp16 / bf16 (Op = T, a 16-bit type: tensor_core_operands.cuh's Operand), a thread's k of
// a k-block are 16 channels at one tap, so cin_pad is Cin rounded up to 16, and the values
// keep their 16 bits.
#pragma once

#include <type_traits>

#include "launchers.h"
#include "pack_b.cuh"

namespace scratchops {
namespace conv_tc {

using tc::TileCoords;

// Absent values are read from here (stride 0) instead of being predicated one by one: zero bits,
// +0 in every element type. (Unused in a build without sm_90a, where the kernels are empty.)
__device__ __attribute__((unused)) const uint32_t kZeroPage[1] = {0u};

struct ConvGeometryFast {
    Conv2dGeometry g;
    int batch, cout, cin_pad;  // cin_pad: Cin rounded up to Operand<Op>::kThreadK
    FastDiv by_pixels, by_out_w, by_cin_pad, by_s;
};

// Pixel orders: which output pixel (n, oh, ow) is GEMM row m (false: no pixel).
// Linear: m = (n * OH + oh) * OW + ow, the order of an NCHW output plane.
struct LinearPixels {
    __device__ bool pixel(const ConvGeometryFast& f, int m, int& n, int& oh, int& ow) const {
        const int pixels = f.g.out_h * f.g.out_w;
        if (m >= f.batch * pixels) return false;
        n = f.by_pixels.div(m);
        const int p = m - n * pixels;
        oh = f.by_out_w.div(p);
        ow = p - oh * f.g.out_w;
        return true;
    }
};

// A's rows (see the top), in the pixel order Pixels, from an input of element type T, for
// products of Op (float: TF32; T itself for the native 16-bit products).
// kFullBlocks: Cin % Operand<Op>::kThreadK == 0.
template <bool kFullBlocks, class Pixels = LinearPixels, class T = float, class Op = float>
struct Im2colRows {
    static constexpr int kThreadK = tc::Operand<Op>::kThreadK;  // a thread's k of a k-block
    static_assert(!tc::Operand<Op>::kNative16 || std::is_same_v<Op, T>,
                  "native 16-bit products multiply the input's own type");
    const T* x;
    ConvGeometryFast f;
    Pixels pixels;
    struct Row {
        int offset;    // offset of x[n][0][ih0][iw0] (may lie outside the image)
        int ih0, iw0;  // ih0 = kNoRow past the last row: no tap is ever inside
    };
    enum : int { kNoRow = -(1 << 30) };
    struct KBlock {
        int delta;   // (c0 * H + r * dil_h) * W + s * dil_w
        int dh, dw;  // r * dil_h, s * dil_w
        int count;   // channels present from c0 (0 past the last tap)
    };
    // The thread's kThreadK values of a row and k-block: value e at q[e * stride], those with
    // e < count present. Absent rows point at the zero page with stride 0, so that a full
    // block's loads need no predicate, and each load's address is one multiply-add (the
    // pointer and the stride are worked out once a k-block, not once a value).
    struct KPtr {
        const T* q;
        int stride, count;
    };
    __device__ Row row(int /*batch*/, int m) const {
        const Conv2dGeometry& g = f.g;
        int n, oh, ow;
        if (!pixels.pixel(f, m, n, oh, ow)) return {0, kNoRow, 0};
        const int ih0 = oh * g.stride_h - g.pad_h, iw0 = ow * g.stride_w - g.pad_w;
        return {(n * g.channels * g.height + ih0) * g.width + iw0, ih0, iw0};
    }
    __device__ KBlock kblock(int kb, int t) const {
        const Conv2dGeometry& g = f.g;
        const int k0 = kb * tc::Operand<Op>::kBlockK + kThreadK * t;
        const int tap = f.by_cin_pad.div(k0), c0 = k0 - tap * f.cin_pad;
        const int r = f.by_s.div(tap), s = tap - r * g.kernel_w;
        const int dh = r * g.dil_h, dw = s * g.dil_w;
        const int count = tap < g.kernel_h * g.kernel_w ? min(kThreadK, g.channels - c0) : 0;
        return {(c0 * g.height + dh) * g.width + dw, dh, dw, count};
    }
    __device__ KPtr none() const { return {reinterpret_cast<const T*>(kZeroPage), 0, 0}; }
    __device__ KPtr kptr(const Row& row, const KBlock& b) const {
        const int ih = row.ih0 + b.dh, iw = row.iw0 + b.dw;
        const bool inside = ih >= 0 && ih < f.g.height && iw >= 0 && iw < f.g.width;
        if (!inside || b.count <= 0) return none();
        return {x + (row.offset + b.delta), f.g.height * f.g.width, b.count};
    }
    __device__ float2 fetch2(const KPtr& p, int e) const {
        // (64-bit: a value past count may lie beyond 2^31 elements; its load is predicated off)
        const T* q = p.q + static_cast<long long>(p.stride) * e;
        if (kFullBlocks) return make_float2(load_ordered(q), load_ordered(q + p.stride));
        return make_float2(load_or_zero(q, e < p.count),
                           load_or_zero(q + p.stride, e + 1 < p.count));
    }
    // The native 16-bit products' form of fetch2: the two values' bits, e in the low half.
    __device__ uint32_t fetch_pair(const KPtr& p, int e) const {
        const T* q = p.q + static_cast<long long>(p.stride) * e;
        const uint32_t lo = kFullBlocks ? load_bits_ordered(q) : load_bits_or_zero(q, e < p.count);
        const uint32_t hi = kFullBlocks ? load_bits_ordered(q + p.stride)
                                        : load_bits_or_zero(q + p.stride, e + 1 < p.count);
        return lo | hi << 16;
    }
};

// B: weight (Cout, Cin, R, S) as the N x K matrix B(co, k), 0 outside. A source a launch
// packs itself (pack_b.cuh's pack_b_in_grid) where w is given.
template <class T>
struct ConvWeights {
    static constexpr bool kPacks = true;
    const T* w;
    int cout, cin, cin_pad, kernel_h, kernel_w;
    __host__ __device__ bool present() const { return w != nullptr; }
    __device__ float operator()(int /*entry*/, int co, int k) const {
        const int tap = k / cin_pad, ci = k - tap * cin_pad;
        if (co >= cout || ci >= cin || tap >= kernel_h * kernel_w) return 0.0f;
        return to_float(
            w[((co * cin + ci) * kernel_h + tap / kernel_w) * kernel_w + tap % kernel_w]);
    }
};

// Cin rounded up to a thread's k of a k-block (see the top).
template <class Op>
int padded_channels(const Conv2dGeometry& g) {
    constexpr int kThreadK = tc::Operand<Op>::kThreadK;
    return (g.channels + kThreadK - 1) / kThreadK * kThreadK;
}

template <class Op = float>
ConvGeometryFast fast_geometry(const Conv2dGeometry& g, int batch, int out_channels) {
    ConvGeometryFast f;
    f.g = g;
    f.batch = batch;
    f.cout = out_channels;
    f.cin_pad = padded_channels<Op>(g);
    f.by_pixels = FastDiv(static_cast<uint32_t>(g.out_h * g.out_w));
    f.by_out_w = FastDiv(static_cast<uint32_t>(g.out_w));
    f.by_cin_pad = FastDiv(static_cast<uint32_t>(f.cin_pad));
    f.by_s = FastDiv(static_cast<uint32_t>(g.kernel_w));
    return f;
}

// The packed weights for tiles of bn output channels, for products of Op. (The 16-bit
// packing fits in the bytes of the float one: packed_b_layout.)
template <class Op = float>
tc::PackedB weight_layout(const Conv2dGeometry& g, int out_channels, int bn) {
    const int k = g.kernel_h * g.kernel_w * padded_channels<Op>(g);
    return tc::packed_b_layout<Op>(bn, out_channels, k, 1);
}

// The weights as weight_layout's B (weight may be nullptr: a source not present).
template <class Op = float, class T>
ConvWeights<T> weight_source(const T* weight, int out_channels, const Conv2dGeometry& g) {
    return {weight, out_channels, g.channels, padded_channels<Op>(g), g.kernel_h, g.kernel_w};
}

template <int BN, class Op = float, class T>
cudaError_t pack_weights(const T* weight, int out_channels, const Conv2dGeometry& g,
                         void* packed, cudaStream_t stream) {
    return tc::pack_b<BN, Op>(weight_source<Op>(weight, out_channels, g),
                              static_cast<uint8_t*>(packed),
                              weight_layout<Op>(g, out_channels, BN), stream);
}

}  // namespace conv_tc
}  // namespace scratchops
