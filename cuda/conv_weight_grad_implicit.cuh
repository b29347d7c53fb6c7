// conv_weight_grad_implicit.cuh — the weight gradient as an implicit GEMM on the tensor cores
// (conv_backward.cu's weight gradient v2; the versions and their reasons are listed there):
// the product of v2, with neither of its written operands. Included by conv_backward.cu.
//
// The product, as v2's: dWᵀ (K x Cout) = sum over the batch's output pixels of
// im2col(x) (K x pixels) @ dyᵀ (pixels x Cout), K = C*kh*kw taps, row k = (c*kh + i)*kw + j.
// Its reduction runs over every output pixel of the batch, its output is small (P31: 576 x 128,
// five 128-row tiles), so the reduction is cut into slices, one batched-GEMM entry each with its
// own partial dWᵀ, and the partials are added in slice order (deterministic, no atomics).
//
// The reduction's layout: output row (n, oh) of the batch, global row index n*OH + oh, takes
// `row_len` slots: OW rounded up to a thread's k of a k-block (tensor_core_operands.cuh:
// Operand<Op>::kThreadK, 8 or 16), slot ow < OW the pixel (n, oh, ow), the rest zero. So a
// thread's kThreadK consecutive k of a k-block (tf32x3.cuh) are consecutive pixels of one
// output row: for tap (c, i, j), x[n][c][oh*sh - ph + i*dh][(ow0 + e)*sw - pw + j*dw] for
// e = 0 .. kThreadK-1, values sw apart in memory, read straight from the NCHW input. A slice is
// `rows_per_slice` consecutive global rows (kWeightGradSlice slots, or one row where a row is
// longer), so its entry e starts at global row e * rows_per_slice and may cross images.
//   A (WeightGradRows)  row k = a tap of the input, read as just said: no column matrix.
//   B (DyColumns)       B(entry, co, k) = dy[n][co][oh][ow] for slot k of the entry, packed by
//                       pack_b straight from the NCHW gradient: no transposed copy of dy; its
//                       cross tiles only where dy has a non-finite value (kDeferCross), and
//                       in the one-product TF32 mode its big tiles alone (kOneProduct).
//   partials            each entry's dWᵀ in float (a half-type partial would round each
//                       slice's sum before the sum of slices), added in entry order by
//                       batch_sum into a float accumulator, transposed to dW at the end.
#pragma once

#include <type_traits>

#include "conv_implicit.cuh"
#include "conv_weight_grad_row_ring_launch.cuh"
#include "gemm_tensor_cores.cuh"
#include "tensor_core_launch.cuh"

namespace scratchops {
namespace conv_wgrad {

// The reduction's slices for products of Op (see the top).
struct Slices {
    int row_len;         // slots an output row takes: OW rounded up to Operand<Op>::kThreadK
    int rows_per_slice;  // global output rows a slice (entry) takes
    int total_rows;      // batch * OH
    int count;           // entries
    int slice_len() const { return row_len * rows_per_slice; }  // the GEMM's K
};
template <class Op>
Slices slices_of(int batch, const Conv2dGeometry& g, int slice_slots) {
    constexpr int kThreadK = tc::Operand<Op>::kThreadK;
    Slices s;
    s.row_len = (g.out_w + kThreadK - 1) / kThreadK * kThreadK;
    s.rows_per_slice = slice_slots / s.row_len > 1 ? slice_slots / s.row_len : 1;
    s.total_rows = batch * g.out_h;
    s.count = (s.total_rows + s.rows_per_slice - 1) / s.rows_per_slice;
    return s;
}

// Global output row `row` (n*OH + oh) as (n, oh).
struct OutputRows {
    int out_h;
    FastDiv by_out_h;
    __device__ void split(int row, int& n, int& oh) const {
        n = by_out_h.div(row);
        oh = row - n * out_h;
    }
};

// A: row k = tap (c, i, j) of x, reduction slots as at the top. Loaded as the engines load
// every A (tensor_core_a_fragments.cuh): row(entry, k) once a tile, kblock(kb, t) once a
// k-block, kptr(row, kblock) once a row and k-block, then fetch2 / fetch_pair a pair at a time.
template <class T, class Op>
struct WeightGradRows {
    static constexpr int kThreadK = tc::Operand<Op>::kThreadK;
    static_assert(!tc::Operand<Op>::kNative16 || std::is_same_v<Op, T>,
                  "native 16-bit products multiply the input's own type");
    const T* x;
    Conv2dGeometry g;
    Slices s;
    OutputRows rows;
    int first_entry;  // the launch's entry 0 is this entry of the slices (a chunk's first)
    FastDiv by_taps, by_kernel_w, by_row_len;  // kh*kw, kw, row_len
    enum : int { kNoRow = -(1 << 30) };
    struct Row {
        int channel_offset;  // c * H * W
        int dh, dw;          // i*dil_h - pad_h, j*dil_w - pad_w: the tap's shift in the input
        int first_row;       // the entry's first global output row; kNoRow past the last tap
    };
    struct KBlock {
        int row;    // output row within the slice
        int ow0;    // the thread's first output column
        int count;  // its slots that are pixels (ow < OW) in a row of the slice: 0..kThreadK
    };
    // Value e at q[e * stride] where first <= e < end, zero elsewhere (the columns left of
    // the input's edge, and right of it or past OW).
    struct KPtr {
        const T* q;
        int stride, first, end;
    };
    __device__ Row row(int entry, int k) const {
        if (k >= g.channels * g.kernel_h * g.kernel_w) return {0, 0, 0, kNoRow};
        const int c = by_taps.div(k), tap = k - c * g.kernel_h * g.kernel_w;
        const int i = by_kernel_w.div(tap), j = tap - i * g.kernel_w;
        return {c * g.height * g.width, i * g.dil_h - g.pad_h, j * g.dil_w - g.pad_w,
                (first_entry + entry) * s.rows_per_slice};
    }
    __device__ KBlock kblock(int kb, int t) const {
        const int k0 = kb * tc::Operand<Op>::kBlockK + kThreadK * t;
        const int row = by_row_len.div(k0), ow0 = k0 - row * s.row_len;
        const int left = g.out_w - ow0;
        return {row, ow0, row < s.rows_per_slice ? (left < kThreadK ? left : kThreadK) : 0};
    }
    __device__ KPtr none() const {
        return {reinterpret_cast<const T*>(conv_tc::kZeroPage), 0, 0, 0};
    }
    __device__ KPtr kptr(const Row& r, const KBlock& b) const {
        const int global_row = r.first_row + b.row;
        if (r.first_row == kNoRow || b.count <= 0 || global_row >= s.total_rows) return none();
        int n, oh;
        rows.split(global_row, n, oh);
        const int ih = oh * g.stride_h + r.dh;
        if (ih < 0 || ih >= g.height) return none();
        // Columns iw(e) = iw0 + e*sw: inside the input for first <= e < last.
        // (Stride 1, the common case, without integer divisions: this runs once a row and
        // k-block.)
        const int iw0 = b.ow0 * g.stride_w + r.dw;
        int first, last;
        if (g.stride_w == 1) {
            first = iw0 >= 0 ? 0 : -iw0;
            last = g.width - iw0;
        } else {
            first = iw0 >= 0 ? 0 : (-iw0 + g.stride_w - 1) / g.stride_w;
            last = iw0 < g.width ? (g.width - 1 - iw0) / g.stride_w + 1 : 0;
        }
        const int end = last < b.count ? last : b.count;
        if (first >= end) return none();
        // (The offset of e = 0 may lie left of the row, or before x itself; only e >= first
        // is ever read.)
        return {x + ((n * g.channels * g.height + ih) * g.width + iw0) + r.channel_offset,
                g.stride_w, first, end};
    }
    __device__ float2 fetch2(const KPtr& p, int e) const {
        const T* q = p.q + p.stride * e;
        return make_float2(load_or_zero(q, e >= p.first && e < p.end),
                           load_or_zero(q + p.stride, e + 1 >= p.first && e + 1 < p.end));
    }
    // The native 16-bit products' form of fetch2: the two values' bits, e in the low half.
    __device__ uint32_t fetch_pair(const KPtr& p, int e) const {
        const T* q = p.q + p.stride * e;
        const uint32_t lo = load_bits_or_zero(q, e >= p.first && e < p.end);
        const uint32_t hi = load_bits_or_zero(q + p.stride, e + 1 >= p.first && e + 1 < p.end);
        return lo | hi << 16;
    }
};

// B: dy (N, Cout, OH, OW) as the engine's N x K matrix of each entry, B(entry, co, k) the
// gradient at slot k of the entry's slice (0 for a padding slot, past the last row, or past
// Cout). pack_b's warps read 32 consecutive k of a row of B: consecutive pixels of dy. With
// kMinRule, B is the min's gradient instead, computed from dy and `halves` (P31's shares, dy's
// shape) as the min's own pass computes it (min_rule_from_halves), so that the packing reads
// what that pass would otherwise write and this one read again. (A type of its own: a
// run-time test took 10 more registers a thread, and the plain packing's occupancy with them.)
template <class T, bool kMinRule = false>
struct DyColumns {
    const T* dy;
    int cout, out_w;
    Slices s;
    OutputRows rows;
    int first_entry;  // as WeightGradRows's
    FastDiv by_row_len;  // s.row_len
    const uint8_t* halves;  // (kMinRule) the shares
    float factor;           // (kMinRule) the min's factor
    __device__ float gradient(const T* p) const {
        if constexpr (kMinRule)
            return to_float(min_rule_from_halves<T>(to_float(*p), factor, halves[p - dy]));
        return to_float(*p);
    }
    // Where slot k of the entry's output rows lies in dy: nullptr in the padding (channels
    // past cout, slots past OW or past the last row), with `left` of the row's pixels from it.
    __device__ const T* at(int entry, int co, int k, int& left) const {
        const int row = by_row_len.div(k), ow = k - row * s.row_len;
        const int global_row = (first_entry + entry) * s.rows_per_slice + row;
        left = out_w - ow;
        if (co >= cout || row >= s.rows_per_slice || ow >= out_w || global_row >= s.total_rows)
            return nullptr;
        int n, oh;
        rows.split(global_row, n, oh);
        return dy + ((n * cout + co) * rows.out_h + oh) * out_w + ow;
    }
    __device__ float operator()(int entry, int co, int k) const {
        int left;
        const T* p = at(entry, co, k, left);
        return p != nullptr ? gradient(p) : 0.0f;
    }
    // Slots k + tc::kSpacing j, j < 4 (pack_b's spaced items): where the four lie in one row of
    // slots, one address (the pixels are kSpacing apart in dy's row; a slot from OW on is 0),
    // else slot by slot.
    __device__ void spaced(int entry, int co, int k, float (&values)[4]) const {
        const int ow = k - by_row_len.div(k) * s.row_len;
        if (ow + 3 * tc::kSpacing >= s.row_len) {  // (the four cross a row's end)
#pragma unroll
            for (int j = 0; j < 4; ++j) values[j] = (*this)(entry, co, k + tc::kSpacing * j);
            return;
        }
        int left;
        const T* p = at(entry, co, k, left);
#pragma unroll
        for (int j = 0; j < 4; ++j)
            values[j] = p != nullptr && tc::kSpacing * j < left ? gradient(p + tc::kSpacing * j)
                                                                : 0.0f;
    }
    // Slots k and k + 1 (k even: with row_len even, one output row) together, one 4-byte
    // load where the pair is a whole aligned pair of 16-bit values (PackItem::gather's pairs).
    __device__ float2 pair(int entry, int co, int k) const {
        int left;
        const T* p = at(entry, co, k, left);
        if (p == nullptr) return make_float2(0.0f, 0.0f);
        if (left < 2) return make_float2(gradient(p), 0.0f);  // the row's last pixel
        if constexpr (is_half_type<T>())
            if (!kMinRule && reinterpret_cast<std::uintptr_t>(p) % 4 == 0)
                return PairOf<T>::widened(*reinterpret_cast<const typename PairOf<T>::type*>(p));
        return make_float2(gradient(p), gradient(p + 1));
    }
};

// The packed B of `entries` entries (the TF32 layout, which holds the 16-bit one: see
// packed_b_layout) and their float partials, each piece 16-byte aligned.
struct ChunkBytes {
    long long packed, partials;
    long long total() const { return packed + partials; }
};
inline ChunkBytes chunk_bytes(const Slices& s, int taps, int out_channels, int entries) {
    using namespace gemm_tc;
    return {align16(tc_layout(out_channels, s.slice_len(), entries).bytes()),
            align16(static_cast<long long>(entries) * taps * out_channels * sizeof(float))};
}
// Entries a chunk: as many as `available` bytes hold (at least one), at most every entry, and
// few enough that the partials stay below 2^31 elements (batch_sum's offsets).
inline int chunk_entries(const Slices& s, int taps, int out_channels, long long available) {
    const long long per_entry = chunk_bytes(s, taps, out_channels, 1).total();
    long long entries = available / per_entry;
    const long long int32_limit = kMaxInt32Count / (static_cast<long long>(taps) * out_channels);
    entries = entries < int32_limit ? entries : int32_limit;
    entries = entries < s.count ? entries : s.count;
    while (entries > 1 && chunk_bytes(s, taps, out_channels, static_cast<int>(entries)).total() >
                              available)
        --entries;  // (the layout's flags and the alignment: at most a step or two)
    return entries > 1 ? static_cast<int>(entries) : 1;
}

// Where the min's one pass writes the packed B (weight_grad_implicit's `operands`) and the
// product is v4 (wgrad_ring, sm_90), the pass of chunk c + 1 runs beside the product of chunk
// c, into the other of two chunk buffers: the product's grid leaves pass_sms()
// multiprocessors free, the pass (launched beside it: launch_beside_previous, common.cuh)
// starts there, and its blocks claim units from a counter, so that those that start as the
// product's CTAs end take what is left. The product is held by its instructions and the
// pass by its traffic, so the pass on 24 of an H200's 132 multiprocessors keeps up with the
// product on the other 108 (P31: 612 us for the pass of 151 entries beside the product's
// 604; in turn the pass took 559 us and the product 978 for 311 entries; with 16 and 20 the
// pass ended after the product, with 28 the step was longer: docs/notes.md, "The one pass
// beside the weight gradient's product"); other GPUs leave the same share. A chunk holds as many whole rounds of the
// product's grid as fit (its persistent CTAs take tiles in turn: a partial last round leaves
// CTAs idle), where an entry's tiles are at most a round.
constexpr int kOnePassSmsOf132 = 24;
inline int pass_sms() { return sm_count() * kOnePassSmsOf132 / 132; }
struct ChunkBuffers {
    int count;         // 1, or 2 (the pass beside the product)
    int entries;       // a chunk's entries
    long long stride;  // bytes from one buffer to the next; the passes' two unit counters
                       // after the second buffer (count 2)
    int free_sms;      // multiprocessors the product leaves to the pass beside it (count 2)
};
template <bool kTf32, class Op>
ChunkBuffers chunk_buffers(const Slices& s, int taps, int out_channels,
                           const Conv2dGeometry& g, TensorCorePath engine, long long available,
                           bool b_packed) {
    const int one = chunk_entries(s, taps, out_channels, available);
    const ChunkBuffers in_turn{1, one, chunk_bytes(s, taps, out_channels, one).total(), 0};
    if (!std::is_same_v<Op, float> || kTf32 || !b_packed || one >= s.count || pass_sms() < 1 ||
        !wgrad_ring::applies(g, s.row_len, engine, kTf32))
        return in_turn;
    int half = chunk_entries(s, taps, out_channels, available / 2);
    const long long ctas = sm_count() - pass_sms();
    const int tiles = wgrad_ring::tiles_per_entry(
        taps, tc::packed_b_layout<float>(gemm_tc::kTcBN, out_channels, s.slice_len(), 1));
    const long long rounds = static_cast<long long>(half) * tiles / ctas;  // whole ones
    if (rounds > 0 && tiles <= ctas) half = static_cast<int>(rounds * ctas / tiles);
    const long long stride = chunk_bytes(s, taps, out_channels, half).total();
    const long long counters = 16;  // (the two passes' unit counters, 16-byte aligned)
    return half > 0 && 2 * stride + counters <= available
               ? ChunkBuffers{2, half, stride, pass_sms()}
               : in_turn;
}

// k-blocks whose products one partial sum of the 3xTF32 mode holds before an fp32 add joins it
// to the total (tf32x3.cuh, "partial sums"; mma_sync_3xtf32.cuh likewise), on reductions of at
// least kPartialGroupFrom slots. At 1 the 64 adds a thread run every k-block, and on wgmma the
// pipeline drains there: 9 % of the kernel's instructions at P31's size, where 4 took it from
// 5.41 to 5.14 ms (docs/notes.md, "The weight gradient's partial sums in fours"). A partial sum
// of 4 k-blocks takes 48 truncating accumulations: about 1e-6 of the largest |dW| whatever the
// reduction's length, while fp32's own error grows with that length: torch's was 1.2e-7 of it
// on a reduction of 480 slots (4 k-blocks failed the tests' 4x of that) and 1.8e-5 on P31's
// 2 M. So the short reductions keep a partial sum a k-block, as the forward's do
// (conv_implicit.cu's kGroupFrom).
constexpr int kPartialGroup = 4;
constexpr long long kPartialGroupFrom = 1 << 16;

// One chunk of entries [entry0, entry0 + entries): packing, then the product into the chunk's
// partials, for products of Op (kTf32: a single product, as every 16-bit mode is); B the
// min's gradient of dy where halves (DyColumns); b_packed: B's big and small tiles and flags
// are in `packed` already (the min's one pass, min_add_mul_operands.cuh, wrote them), so only
// the deferred cross tiles' pass runs; free_sms: the v4 kernel leaves that many
// multiprocessors to the kernel launched beside it (wgrad_ring::launch).
template <bool kTf32, class Op, class T>
cudaError_t product(const T* dy, const T* x, int out_channels, const Conv2dGeometry& g,
                    const Slices& s, int entry0, int entries, TensorCorePath engine,
                    uint8_t* packed, float* partials, cudaStream_t stream,
                    const uint8_t* halves, float factor, bool b_packed = false,
                    int free_sms = 0) {
    using namespace gemm_tc;
    const int taps = g.channels * g.kernel_h * g.kernel_w;
    const OutputRows rows{g.out_h, FastDiv(static_cast<uint32_t>(g.out_h))};
    const tc::PackedB layout = tc::packed_b_layout<Op>(kTcBN, out_channels, s.slice_len(),
                                                        entries);
    const FastDiv by_row_len(static_cast<uint32_t>(s.row_len));
    auto pack = [&](auto min_rule) {
        const DyColumns<T, decltype(min_rule)::value> source{
            dy, out_channels, g.out_w, s, rows, entry0, by_row_len, halves, factor};
        if constexpr (std::is_same_v<Op, float> && !kTf32)  // (3xTF32's deferred tiles)
            if (b_packed) return tc::pack_b_cross<kTcBN, false>(source, packed, layout, stream);
        return tc::pack_b<kTcBN, Op, false, /*kDeferCross=*/true, kTf32>(source, packed, layout,
                                                                        stream);
    };
    cudaError_t err = cudaErrorInvalidValue;  // (the rule: float's 3xTF32 alone takes it)
    if (halves == nullptr)
        err = pack(std::false_type{});
    else if constexpr (std::is_same_v<T, float> && !kTf32)
        err = pack(std::true_type{});
    if (err != cudaSuccess) return err;
    const WeightGradRows<T, Op> loader{
        x, g, s, rows, entry0,
        FastDiv(static_cast<uint32_t>(g.kernel_h * g.kernel_w)),
        FastDiv(static_cast<uint32_t>(g.kernel_w)), FastDiv(static_cast<uint32_t>(s.row_len))};
    const long long partial_elements = static_cast<long long>(taps) * out_channels;
    const RowMajorStore<float> store{
        partials, nullptr, taps, out_channels, out_channels, partial_elements,
        pair_accesses_fit(partials, out_channels, partial_elements)};
    auto launch = [&](auto group) {
        constexpr int kGroup = decltype(group)::value;
        if constexpr (std::is_same_v<T, float> && std::is_same_v<Op, float>)  // v4
            if (wgrad_ring::applies(g, s.row_len, engine, kTf32))
                return wgrad_ring::launch<kGroup, kTf32>(
                    wgrad_ring::geometry(x, g, s.row_len, s.rows_per_slice, s.total_rows, entry0),
                    store, packed, layout, entries, stream, free_sms);
        return tensor_core_launch<kTcBN, kTcMB, kTcStages, kGroup, kTf32, Op>(
            engine, loader, store, packed, layout, taps, entries, /*b_shared=*/false, stream);
    };
    // (The single-product modes sum a whole tile on the tensor cores: no group to choose.)
    if constexpr (!kTf32)
        if (static_cast<long long>(s.total_rows) * s.row_len >= kPartialGroupFrom)
            return launch(std::integral_constant<int, kPartialGroup>{});
    return launch(std::integral_constant<int, 1>{});
}

}  // namespace conv_wgrad
}  // namespace scratchops
