// min_add_mul_operands.cuh — P31's min rule in one pass over dy that writes both convolution
// gradients' operands (conv_backward.cu's "P31's four at once, one pass over dy"). Included by
// conv_backward_tensor_cores.cuh.
//
// The rule's gradient d = dy * factor * halves / 2 (common.cuh: min_rule_from_halves) is what
// both gradients multiply, in two layouts: the input gradient v4 reads it channels-last as its
// two TF32 parts (conv_input_grad_swapped.cuh), the weight gradient v2 / v4 as B packed by
// k-blocks of one output row's slots (pack_b.cuh; conv_weight_grad_implicit.cuh's DyColumns).
// Made apart, each pass reads dy and the shares (1.04 GB and 0.26 GB at P31's size); here one
// pass reads them once, a unit at a time, and writes both, with the two bias gradients' partial
// sums on the way. It runs a chunk of the weight gradient's slices at a time, just before that
// chunk's product, in the place of its packing.
//
// Where it applies (applies): output rows of whole k-blocks (row_len, OW rounded up to 8, a
// multiple of 32), so that no k-block of B spans two output rows, and Cout a multiple of kVec
// (a pixel's channels in the parts' 16-byte vectors).
//
// A unit is (output row r of the chunk, segment s of the row's slots, group of kChannels
// channels): the slots [128 s, 128 s + 128) of that row for those channels, 4 k-blocks at most.
//   fill     warp w loads channels w * 8 .. w * 8 + 7 of the group, lane l the slots l + 32 h
//            (h < 4): a warp's load is 128 consecutive bytes of dy and 32 of the shares,
//            whatever dy's alignment. d is split once (split_tf32, in a short form where it
//            can) into its two TF32 parts in the tile's two planes; 0 past OW, past the
//            batch's last row and past Cout (B's padding). Each lane adds its 4 values of dy
//            and of d per channel, then the warp reduce-scatters the 8 channels' two sums
//            (xor 16, 8, 4: a lane keeps half of what it holds and sends the other half; then
//            xor 2, 1), so that lane 4 i ends with channel i's sums: one partial a unit and
//            channel, at piece r * segments + s of that channel's row of partials.
//   parts    thread (slot, vector) of 128 slots x 8 vectors of 4 channels: a warp stores 4
//            pixels' 128-byte lines of each part.
//   packed   item (channel, k-block, chunk c): the 16-byte chunk c of that channel's row of the
//            k-block's stage, holding slots c, c + 8, c + 16, c + 24 (pack_b.cuh's spaced
//            items), its big and small chunks written where PackItem::chunk_of places them
//            (pack_b's layout, the same split as its scatter): a warp stores 4 channels'
//            128-byte rows of one stage. The cross tiles stay deferred (pack_b's
//            kDeferCross): the product's pack_b_cross writes them after this pass where a value
//            was not finite, from the flags this pass writes (write_nonfinite_flag).
// A block walks units blockIdx.x, + gridDim.x, ... (or, beside the product, claims them), the
// next unit's loads in flight while it stores this one (operands_kernel); the grid is what the
// GPU holds at once, at most the layout's pack_blocks(), so that every flag the product reads
// is written by this launch.
#pragma once

#include <algorithm>

#include "conv_weight_grad_implicit.cuh"
#include "pack_b.cuh"

namespace scratchops {
namespace min_rule_operands {

constexpr int kThreads = 128;
constexpr int kChannels = 32;  // a unit's channels: a pixel's 128-byte line in each part
constexpr int kBlockK = tc::Operand<float>::kBlockK;  // 32 slots a k-block
constexpr int kSegmentSlots = 4 * kBlockK;             // a unit's slots: 4 k-blocks
constexpr int kWarps = kThreads / 32;
constexpr int kChannelsWarp = kChannels / kWarps;  // 8: the fill's channels a warp
constexpr int kVec = 4;                             // channels a 16-byte vector of a part
// The tile's row pitch (a plane's, in 4-byte parts): odd, so that the parts' column reads (4
// pixels x 8 vectors a warp) hit 32 banks; the packed items' reads (4 channels x 8 chunks)
// then meet 2-way on 3 banks.
constexpr int kPitch = kSegmentSlots + 9;
static_assert(kChannelsWarp == 8, "the reduce-scatter's steps (fill) take 8 channels a warp");

// Whether the one pass serves the weight gradient's slices s of dy's Cout channels (see the
// top).
inline bool applies(const conv_wgrad::Slices& s, int out_channels) {
    return s.row_len % kBlockK == 0 && out_channels % kVec == 0;
}
inline int segments(const conv_wgrad::Slices& s) {
    return (s.row_len + kSegmentSlots - 1) / kSegmentSlots;
}
// The partial sums a channel: one a (row, segment) of the batch, in row order.
inline long long pieces(const conv_wgrad::Slices& s) {
    return static_cast<long long>(s.total_rows) * segments(s);
}

// Where the pass writes besides the packed B: the two parts (N, OH*OW, Cout) and the partial
// sums of dy and of d, partial[c * pieces + piece].
struct Outputs {
    float* big;
    float* small;
    float* dy_partial;
    float* dx_partial;
};

struct Params {
    const float* dy;
    const uint8_t* halves;
    float factor;
    Outputs out;
    int cout, out_h, out_w;
    int total_rows, rows_per_slice, first_row, kb_per_row, segments, groups, units;
    long long pieces;
    conv_wgrad::OutputRows rows;
    uint8_t* packed;
    tc::PackedB layout;
    // Units in turn (block b: b, b + gridDim.x, ...), or, beside another kernel, b and then
    // gridDim.x + a count claimed from unit_counter (0 at the launch): blocks that start late,
    // as that kernel frees multiprocessors, take what is left. next_unit_counter (or null):
    // zeroed for the next launch beside (the two alternate, as the chunk buffers do).
    int* unit_counter;
    int* next_unit_counter;
};

// A unit: (output row of the chunk, segment of its slots, group of channels), unit index
// ((row_chunk * segments) + segment) * groups + group.
struct Unit {
    int row_chunk, segment, group;
    int global_row, n, oh;  // (n, oh: 0 past the batch's last row)
    bool real_row;
};
__device__ __forceinline__ Unit unit_of(const Params& p, int unit) {
    Unit u;
    u.group = unit % p.groups;
    const int rest = unit / p.groups;
    u.segment = rest % p.segments;
    u.row_chunk = rest / p.segments;
    u.global_row = p.first_row + u.row_chunk;
    u.real_row = u.global_row < p.total_rows;
    u.n = u.oh = 0;
    if (u.real_row) p.rows.split(u.global_row, u.n, u.oh);
    return u;
}

// A thread's loads of one unit's fill (below): its 8 channels' 4 slots of dy and the shares,
// 0 outside (here() false), issued a unit ahead of their use (see the kernel).
constexpr int kSlotsLane = kSegmentSlots / 32;
__device__ __forceinline__ int lane_slot(int h) {  // the slot of a lane's value h: lane + 32 h
    return static_cast<int>(threadIdx.x % 32) + 32 * h;
}
struct UnitLoads {
    float g[kChannelsWarp][kSlotsLane];
    uint32_t share[kChannelsWarp][kSlotsLane];
};
// Whether the fill's value (channel i of warp `warp`, a slot) is one of dy's.
__device__ __forceinline__ bool here(const Params& p, const Unit& u, int warp, int i, int slot) {
    return u.real_row && u.group * kChannels + warp * kChannelsWarp + i < p.cout &&
           u.segment * kSegmentSlots + slot < p.out_w;
}
// dy's index (and the shares') of the unit's slot 0 in the fill's channel i of warp `warp`.
__device__ __forceinline__ long long dy_index(const Params& p, const Unit& u, int warp, int i) {
    const int co = u.group * kChannels + warp * kChannelsWarp + i;
    return (static_cast<long long>(u.n) * p.cout + co) * p.out_h * p.out_w +
           static_cast<long long>(u.oh) * p.out_w + u.segment * kSegmentSlots;
}
__device__ __forceinline__ void load_unit(const Params& p, const Unit& u, UnitLoads& q) {
    const int warp = threadIdx.x / 32;
#pragma unroll
    for (int i = 0; i < kChannelsWarp; ++i) {
        const long long at = dy_index(p, u, warp, i);
#pragma unroll
        for (int h = 0; h < kSlotsLane; ++h) {
            const bool inside = here(p, u, warp, i, lane_slot(h));
            q.g[i][h] = inside ? p.dy[at + lane_slot(h)] : 0.0f;
            q.share[i][h] = inside ? p.halves[at + lane_slot(h)] : 0u;
        }
    }
}

// The tile a block fills a unit at a time: d's two TF32 parts, each a plane [channel][slot]
// that both stores read (a value split in each store cost a third of the pass's instructions).
struct Tile {
    uint32_t big[kChannels][kPitch];
    uint32_t small[kChannels][kPitch];
};

// One step of fill's reduce-scatter (below) over the first kWidth sums, across lane bit kBit.
// (Its count a template argument: as a loop of halving widths, the compiler kept the sums in
// local memory once the fill's body grew.)
template <int kWidth, int kBit>
__device__ __forceinline__ void reduce_scatter_step(float* sums, int lane) {
    const bool upper = (lane & kBit) != 0;
#pragma unroll
    for (int k = 0; k < kWidth / 2; ++k) {
        const float send = upper ? sums[k] : sums[k + kWidth / 2];
        const float keep = upper ? sums[k + kWidth / 2] : sums[k];
        sums[k] = keep + __shfl_xor_sync(0xffffffffu, send, kBit);
    }
}

// The value of d that fill splits (0 itself outside, B's padding: 0 * an Inf factor is NaN).
__device__ __forceinline__ float rule_value(const Params& p, const Unit& u, const UnitLoads& q,
                                            int warp, int i, int h) {
    return here(p, u, warp, i, lane_slot(h))
               ? min_rule_from_halves<float>(q.g[i][h], p.factor, q.share[i][h])
               : 0.0f;
}

// fill's tile again, each value split by split_tf32 and read again (rare: a value at a time,
// holding few registers); says whether a value was not finite.
__device__ __forceinline__ bool fill_again_in_full(const Params& p, Tile& tile, const Unit& u) {
    const int warp = threadIdx.x / 32;
    bool nonfinite = false;
#pragma unroll 1
    for (int i = 0; i < kChannelsWarp; ++i)
#pragma unroll 1
        for (int h = 0; h < kSlotsLane; ++h) {
            const int slot = lane_slot(h);
            const long long at = dy_index(p, u, warp, i) + slot;  // (0 outside: rule_value)
            const Tf32Split parts = split_tf32(
                here(p, u, warp, i, slot) ? min_rule_from_halves<float>(p.dy[at], p.factor,
                                                                        p.halves[at])
                                          : 0.0f);
            tile.big[warp * kChannelsWarp + i][slot] = parts.big;
            tile.small[warp * kChannelsWarp + i][slot] = parts.small;
            nonfinite |= parts.cross != parts.big;
        }
    return nonfinite;
}

// A unit's fill (see the top) from its loads; returns with the tile filled and the unit's
// partials written, and says whether one of its values of d was not finite (cross != big:
// where the product's deferred cross pass has work, pack_b_cross). Each value is split in
// the short form (tf32_split.cuh's split_tf32_short); where a warp meets one that form does not
// cover (Inf, NaN, or within a TF32 half-ulp of FLT_MAX: rare), it splits its values again
// with split_tf32.
__device__ __forceinline__ bool fill(const Params& p, Tile& tile, const Unit& u,
                                     const UnitLoads& q) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    auto value = [&](int i, int h) { return rule_value(p, u, q, warp, i, h); };
    float sums[2 * kChannelsWarp];  // (channel i's dy sum at 2 i, d's at 2 i + 1)
    uint32_t largest = 0;           // the largest |d|'s bits
#pragma unroll
    for (int i = 0; i < kChannelsWarp; ++i) {
        float dy_sum = 0.0f, d_sum = 0.0f;
#pragma unroll
        for (int h = 0; h < kSlotsLane; ++h) {
            const int slot = lane_slot(h);
            const float d = value(i, h);
            split_tf32_short(d, tile.big[warp * kChannelsWarp + i][slot],
                             tile.small[warp * kChannelsWarp + i][slot]);
            largest = max(largest, __float_as_uint(d) & 0x7fffffffu);
            dy_sum += q.g[i][h];
            d_sum += d;
        }
        sums[2 * i] = dy_sum;
        sums[2 * i + 1] = d_sum;
    }
    // The reduce-scatter: at xor 16, 8, 4 a lane keeps the half of its sums its lane bit picks
    // and adds its partner's; 16 -> 8 -> 4 -> 2 values, channel lane / 4's pair.
    reduce_scatter_step<2 * kChannelsWarp, 16>(sums, lane);
    reduce_scatter_step<kChannelsWarp, 8>(sums, lane);
    reduce_scatter_step<kChannelsWarp / 2, 4>(sums, lane);
#pragma unroll
    for (int bit = 2; bit > 0; bit /= 2) {
        sums[0] += __shfl_xor_sync(0xffffffffu, sums[0], bit);
        sums[1] += __shfl_xor_sync(0xffffffffu, sums[1], bit);
    }
    const int co = u.group * kChannels + warp * kChannelsWarp + lane / 4;
    if (lane % 4 == 0 && u.real_row && co < p.cout) {
        const long long at = co * p.pieces + static_cast<long long>(u.global_row) * p.segments +
                             u.segment;
        p.out.dy_partial[at] = sums[0];
        p.out.dx_partial[at] = sums[1];
    }
    // (Last, where the sums and the loads are dead: earlier it spilled the fill's registers.)
    return __any_sync(0xffffffffu, largest >= kShortSplitBelow) && fill_again_in_full(p, tile, u);
}

// The unit's slots before OW (none where its row is past the batch's last).
__device__ __forceinline__ int unit_slots(const Params& p, const Unit& u) {
    return u.real_row ? min(kSegmentSlots, p.out_w - u.segment * kSegmentSlots) : 0;
}

// The unit's two parts, channels-last (see the top): thread t stores channels 4 (t % 8) ..
// + 3 of slots t / 8, + 16, ... (a warp 4 pixels' 128-byte lines of each part a store).
__device__ __forceinline__ void store_parts(const Params& p, const Tile& tile, const Unit& u) {
    constexpr int kVecs = kChannels / kVec, kSlotStep = kThreads / kVecs;
    const int row = threadIdx.x % kVecs * kVec, co = u.group * kChannels + row;
    if (co >= p.cout) return;
    const int slots = unit_slots(p, u), slot0 = threadIdx.x / kVecs;
    const long long pixel0 = static_cast<long long>(u.n) * p.out_h * p.out_w +
                             static_cast<long long>(u.oh) * p.out_w + u.segment * kSegmentSlots;
    const long long at = (pixel0 + slot0) * p.cout + co;  // (Cout % kVec == 0: aligned)
    const long long step = static_cast<long long>(kSlotStep) * p.cout / kVec;  // in vectors
    uint4* big = reinterpret_cast<uint4*>(p.out.big + at);
    uint4* small = reinterpret_cast<uint4*>(p.out.small + at);
#pragma unroll
    for (int j = 0; j < kSegmentSlots / kSlotStep; ++j) {
        const int slot = slot0 + j * kSlotStep;
        if (slot < slots) {
            big[j * step] = make_uint4(tile.big[row][slot], tile.big[row + 1][slot],
                                       tile.big[row + 2][slot], tile.big[row + 3][slot]);
            small[j * step] = make_uint4(tile.small[row][slot], tile.small[row + 1][slot],
                                         tile.small[row + 2][slot], tile.small[row + 3][slot]);
        }
    }
}

// The unit's items of the packed B (see the top): thread t stores chunk t % 8 of channel rows
// t / 8 and t / 8 + 16 of each of the unit's k-blocks, at the place PackItem's chunk_of gives
// (the packing's own layout), its big and small tiles (the cross tiles stay deferred).
__device__ __forceinline__ void store_packed(const Params& p, const Tile& tile, const Unit& u) {
    using gemm_tc::kTcBN;
    constexpr int kChunks = 8, kRowStep = kThreads / kChunks;
    const int entry = u.row_chunk / p.rows_per_slice;
    const int kb0 = (u.row_chunk - entry * p.rows_per_slice) * p.kb_per_row +
                    u.segment * (kSegmentSlots / kBlockK);
    const int kblocks =
        min(kSegmentSlots / kBlockK, p.kb_per_row - u.segment * (kSegmentSlots / kBlockK));
    const int chunk = threadIdx.x % kChunks;
#pragma unroll
    for (int row = threadIdx.x / kChunks; row < kChannels; row += kRowStep) {
        const int co = u.group * kChannels + row;
        tc::PackItem<float> it;
        it.item = co % kTcBN * kChunks + chunk;
        it.stage = (entry * p.layout.n_tiles + co / kTcBN) * p.layout.num_kb + kb0;
        // (the item's chunks of the unit's first stage; the next k-block's are a stage on)
        uint4* big_chunk = it.chunk_of<kTcBN>(p.packed, p.layout, 0);
        uint4* small_chunk = it.chunk_of<kTcBN>(p.packed, p.layout, 1);
        const long long stage_step = p.layout.stage_bytes() / sizeof(uint4);
#pragma unroll
        for (int kb = 0; kb < kSegmentSlots / kBlockK; ++kb) {
            if (kb < kblocks) {
                const int slot = kb * kBlockK + chunk;
                const uint32_t* big = &tile.big[row][slot];
                const uint32_t* small = &tile.small[row][slot];
                constexpr int s = tc::kSpacing;
                big_chunk[kb * stage_step] = make_uint4(big[0], big[s], big[2 * s], big[3 * s]);
                small_chunk[kb * stage_step] =
                    make_uint4(small[0], small[s], small[2 * s], small[3 * s]);
            }
        }
    }
}

// Each thread issues the next unit's loads once this unit's tile is filled and stores this
// unit while they fly (else the blocks an SM holds kept too few bytes in flight); the loads
// take 64 registers a thread: kBlocksSm blocks an SM at up to 128 registers.
constexpr int kBlocksSm = 4;
__global__ void __launch_bounds__(kThreads, kBlocksSm) operands_kernel(Params p) {
    __shared__ Tile tile;
    __shared__ int claimed[2];  // the next unit claimed, by the iteration's parity (Params)
    if (p.next_unit_counter != nullptr && blockIdx.x == 0 && threadIdx.x == 0)
        *p.next_unit_counter = 0;
    bool nonfinite = false;
    UnitLoads loads;
    if (static_cast<int>(blockIdx.x) < p.units) load_unit(p, unit_of(p, blockIdx.x), loads);
    auto next_unit = [&](int unit, int parity) {
        return p.unit_counter != nullptr ? claimed[parity] : unit + static_cast<int>(gridDim.x);
    };
    for (int unit = blockIdx.x, parity = 0; unit < p.units; parity ^= 1) {
        if (p.unit_counter != nullptr && threadIdx.x == 0)
            claimed[parity] = static_cast<int>(gridDim.x) + atomicAdd(p.unit_counter, 1);
        const Unit u = unit_of(p, unit);
        nonfinite = fill(p, tile, u, loads) || nonfinite;
        __syncthreads();  // (the tile filled, the claim written)
        if (next_unit(unit, parity) < p.units)
            load_unit(p, unit_of(p, next_unit(unit, parity)), loads);
        store_parts(p, tile, u);
        store_packed(p, tile, u);
        __syncthreads();  // (the tile is filled again)
        unit = next_unit(unit, parity);
    }
    tc::write_nonfinite_flag(p.packed, p.layout, __syncthreads_or(nonfinite));
    wait_for_previous_kernel();  // (launched beside the product before it: see launch)
}

// The pass for the chunk of entries [entry0, entry0 + entries) of the slices s: its B packed
// into `packed` (the layout product() reads; product() then runs the deferred cross tiles'
// pass, b_packed) and its rows' parts and partial sums; with unit_counter, beside the kernel
// before it on the stream (launch_beside_previous, common.cuh), its blocks claiming units.
inline cudaError_t launch(const float* dy, const uint8_t* halves, float factor,
                          const Outputs& out, int out_channels, const Conv2dGeometry& g,
                          const conv_wgrad::Slices& s, int entry0, int entries, uint8_t* packed,
                          cudaStream_t stream, int* unit_counter = nullptr,
                          int* next_unit_counter = nullptr) {
    using gemm_tc::kTcBN;
    if (!applies(s, out_channels)) return cudaErrorInvalidValue;
    const tc::PackedB layout =
        tc::packed_b_layout<float>(kTcBN, out_channels, s.slice_len(), entries);
    const conv_wgrad::OutputRows rows{g.out_h, FastDiv(static_cast<uint32_t>(g.out_h))};
    const int groups = layout.n_tiles * kTcBN / kChannels;
    const long long units =
        static_cast<long long>(entries) * s.rows_per_slice * segments(s) * groups;
    if (units > kMaxInt32Count) return cudaErrorInvalidValue;
    const Params p{dy, halves, factor, out, out_channels, g.out_h, g.out_w, s.total_rows,
                   s.rows_per_slice, entry0 * s.rows_per_slice, s.row_len / kBlockK,
                   segments(s), groups, static_cast<int>(units), pieces(s), rows, packed,
                   layout, unit_counter, next_unit_counter};
    // (What the GPU holds at once, at most the layout's flags; at least one.)
    const int blocks = std::min(layout.pack_blocks(), std::max(1, kBlocksSm * sm_count()));
    if (unit_counter != nullptr)
        return launch_beside_previous(operands_kernel, blocks, kThreads, stream, p);
    operands_kernel<<<blocks, kThreads, 0, stream>>>(p);
    return cudaGetLastError();
}

}  // namespace min_rule_operands
}  // namespace scratchops
