// conv_weight_grad_row_ring.cuh — the weight gradient v4 (conv_backward.cu): v2's product
// (conv_weight_grad_implicit.cuh) in fp32 on the wgmma engine, with A's rows read from a ring
// of input rows that each consumer warpgroup loads and splits once, in shared memory.
//
// Why. In v2 every consumer thread gathers its 16 values of A a k-block from the NCHW input
// (predicated loads, each row's address worked out again a k-block) and splits them into
// their TF32 parts, and every value of x goes through that kernel_h x kernel_w times, once for
// each tap it serves: a third of the kernel's instructions at P31's size (docs/notes.md, "The
// weight gradient's partial sums in fours": ncu by source line). Here a value is loaded and
// split once a tile, and a thread's A of a k-step is 8 shared loads.
//
// The product is v2's: row k of A is tap (c, i, j), k = (c*kh + i)*kw + j, and a k-block is 32
// slots of one output row (n, oh) of the slice (row_len, a multiple of 32 here: applies());
// A(k, slot ow) = x[n][c][oh - pad_h + i*dil_h][ow - pad_w + j*dil_w].
//
// The ring. A warpgroup's 64 rows are taps of at most `max_channels` channels. Its ring holds,
// for those channels, the input rows one output row reads (its `window`, (kh - 1) dil_h + 1
// rows) and one more: input row ih of the current image lives in slot (ih + pad_h) % slots,
// as a ring row of `ring_width` columns, column p holding x[n][c][ih][p - pad_w] (0 outside
// the input), so tap (c, i, j) of output row oh, slot ow, is column ow + j*dil_w of channel c
// in slot (oh + i*dil_h) % slots. Each value is stored twice, in two planes: its big TF32 part
// and its small one (tf32_split.cuh's truncating split; the TF32 mode: the value rounded to
// nearest, in the big plane alone).
//
// The walk. A CTA's tile is 16 output rows (a slice) x 128 taps, as in v2. At the tile's first
// row, and at each image's first, the warpgroup loads its whole window. Then, during each
// output row, its threads load the one input row the next output row adds (coalesced loads
// into registers, 16 a thread at most) and store it split into the free slot at the row's end;
// one warpgroup barrier between two output rows orders both the stores before the next row's
// reads and the last row's reads before the next stores. The B side is v2's: the producer
// warpgroup's thread 0 copies each k-block's packed dy into a ring of kStages stages.
//
// Non-finite x. The cross terms take the big part where x is finite and 0 where it is not
// (tf32x3.cuh). The barrier that publishes a ring row tells the warpgroup whether all of its
// values were finite (bar.red.and); while the rows an output row reads are, the big part is
// the cross part and the padding slots (ow >= out_w, where B is 0) need no zeroing. Otherwise
// the k-blocks take a second form that makes both.
//
// Bank conflicts. A warp's 32 lanes read rows g = lane / 4 (8 consecutive taps) at columns
// 8 (lane % 4) + e. The column groups fall in distinct banks (8 floats apart); the taps do too
// where each tap's row start is a distinct bank mod 8: with dil 1, the channel pitch is padded
// to T = kh*kw mod 8 and the slot pitch to kw mod 8, so tap k starts k (mod 8) banks in (until
// the slot index wraps round the ring).
#pragma once

#include <cstdint>

#include "conv_implicit.cuh"
#include "tf32x3.cuh"

namespace scratchops {
namespace wgrad_ring {

constexpr int kBN = 128;          // Cout columns of a tile (conv_weight_grad_implicit's kTcBN)
constexpr int kWarpgroupRows = 64;  // taps of a consumer warpgroup (tf32x3.cuh, MB = 1)
constexpr int kBM = tf32x3::kConsumerWarpgroups * kWarpgroupRows;  // taps of a tile
constexpr int kBlockK = 32;       // slots of a k-block (a TF32 k-block)
constexpr int kFillValues = 16;   // a thread's values of one ring row at most
constexpr int kStages = 3;        // B's stages (3 x 48 KiB in 3xTF32) beside the two rings
constexpr int kMaxSlots = 32;     // the ring's slots: bits of the non-finite mask
// The dynamic shared memory a launch may ask: what remains of the opt-in limit beside the
// kernel's static stage barriers.
constexpr int kMaxSmemBytes = kSm90SmemOptinBytes - 1024;

// The geometry the kernel walks, worked out on the host (geometry()).
struct RingGeometry {
    const float* x;
    int channels, height, width, kernel_h, kernel_w, pad_h, pad_w, dil_h, dil_w;
    int out_h, out_w, taps;
    int rows_per_slice, total_rows, first_entry, kblocks_a_row;  // the slices (v2's Slices)
    int window, slots, ring_width;  // input rows an output row reads; the ring's rows; columns
    int max_channels;               // channels a warpgroup's 64 taps touch, at most
    int channel_pitch, slot_pitch;  // floats (padded: see "bank conflicts" at the top)
    int plane_floats;               // a plane: slots * slot_pitch, then a zero row
    FastDiv by_taps, by_kernel_w, by_out_h, by_ring_width, by_slots;
    __host__ __device__ int ring_floats() const { return 2 * plane_floats; }  // a warpgroup's
};

inline int pad_to_residue(int n, int residue) {  // the least m >= n with m = residue (mod 8)
    return n + ((residue - n) % 8 + 8) % 8;
}

// The most channels the taps of one consumer warpgroup (kWarpgroupRows from a multiple of it)
// touch.
inline int max_channels_a_warpgroup(int taps, int taps_a_channel) {
    int most = 0;
    for (int first = 0; first < taps; first += kWarpgroupRows) {
        const int last = (first + kWarpgroupRows < taps ? first + kWarpgroupRows : taps) - 1;
        const int count = last / taps_a_channel - first / taps_a_channel + 1;
        most = count > most ? count : most;
    }
    return most;
}

inline RingGeometry geometry(const float* x, const Conv2dGeometry& g, int row_len,
                             int rows_per_slice, int total_rows, int first_entry) {
    RingGeometry r{};
    r.x = x;
    r.channels = g.channels, r.height = g.height, r.width = g.width;
    r.kernel_h = g.kernel_h, r.kernel_w = g.kernel_w, r.pad_h = g.pad_h, r.pad_w = g.pad_w;
    r.dil_h = g.dil_h, r.dil_w = g.dil_w, r.out_h = g.out_h, r.out_w = g.out_w;
    const int taps_a_channel = g.kernel_h * g.kernel_w;
    r.taps = g.channels * taps_a_channel;
    r.rows_per_slice = rows_per_slice, r.total_rows = total_rows, r.first_entry = first_entry;
    r.kblocks_a_row = row_len / kBlockK;
    r.window = (g.kernel_h - 1) * g.dil_h + 1;
    r.slots = r.window + 1;
    r.ring_width = row_len + (g.kernel_w - 1) * g.dil_w;
    r.max_channels = max_channels_a_warpgroup(r.taps, taps_a_channel);
    r.channel_pitch = pad_to_residue(r.ring_width, taps_a_channel % 8);
    r.slot_pitch = pad_to_residue(r.max_channels * r.channel_pitch, g.kernel_w % 8);
    r.plane_floats = r.slots * r.slot_pitch + r.channel_pitch;
    r.by_taps = FastDiv(static_cast<uint32_t>(taps_a_channel));
    r.by_kernel_w = FastDiv(static_cast<uint32_t>(g.kernel_w));
    r.by_out_h = FastDiv(static_cast<uint32_t>(g.out_h));
    r.by_ring_width = FastDiv(static_cast<uint32_t>(r.ring_width));
    r.by_slots = FastDiv(static_cast<uint32_t>(r.slots));
    return r;
}

template <bool kTf32>
using BConfig = tf32x3::Config<kBN, 1, kStages, kTf32>;

template <bool kTf32>
int smem_bytes(const RingGeometry& r) {
    return BConfig<kTf32>::kSmemBytes +
           tf32x3::kConsumerWarpgroups * r.ring_floats() * static_cast<int>(sizeof(float));
}

// Whether v4 takes the product (float on the wgmma engine, conv_weight_grad_implicit's
// product()): stride 1, output rows of whole k-blocks, a thread's share of a ring row within
// kFillValues, and both rings beside B's stages in shared memory.
inline bool applies(const Conv2dGeometry& g, int row_len, TensorCorePath engine, bool tf32) {
    // (The window and a ring row's width bounded first, in 64 bits: geometry()'s int sums
    // then cannot wrap.)
    const long long window = (g.kernel_h - 1) * static_cast<long long>(g.dil_h) + 1;
    const long long ring_width = row_len + (g.kernel_w - 1) * static_cast<long long>(g.dil_w);
    if (engine != TensorCorePath::kWgmma || g.stride_h != 1 || g.stride_w != 1 ||
        g.out_h <= 0 || row_len <= 0 || row_len % kBlockK != 0 || window + 1 > kMaxSlots ||
        ring_width > kFillValues * kWarpgroupThreads)
        return false;
    const RingGeometry r = geometry(nullptr, g, row_len, 1, 1, 0);
    if (r.max_channels * r.ring_width > kFillValues * kWarpgroupThreads) return false;
    return (tf32 ? smem_bytes<true>(r) : smem_bytes<false>(r)) <= kMaxSmemBytes;
}

// A consumer thread's two rows (h = 0, 1: tile rows g and g + 8 of its warp) in a tile: where
// each starts in its channel's ring rows, or none (a tap past the last: those rows of dW are
// never stored, so they read the zero row).
struct ThreadRows {
    int column[2];    // channel_pitch * (c - first channel) + j*dil_w + 8t; -1 for none
    int row_step[2];  // i*dil_h: the slot is (oh + row_step) % slots
    // Where each row's values of output row oh start in the big plane (slot0: oh % slots;
    // the zero row for a row past the last output row or the last tap).
    __device__ __forceinline__ void starts(const RingGeometry& r, int slot0, bool real_row,
                                           int zero_row, int lane, int (&at)[2]) const {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int slot = slot0 + row_step[h] < r.slots ? slot0 + row_step[h]
                                                           : slot0 + row_step[h] - r.slots;
            at[h] = real_row && column[h] >= 0 ? slot * r.slot_pitch + column[h]
                                               : zero_row + 8 * (lane % 4);
        }
    }
};

// The warpgroup's channels in the tile whose taps start at `first_tap`.
struct WarpgroupChannels {
    int first, count;  // count 0: every row is past the last tap
};

__device__ __forceinline__ WarpgroupChannels channels_of(const RingGeometry& r, int first_tap) {
    if (first_tap >= r.taps) return {0, 0};
    const int last_tap = min(first_tap + kWarpgroupRows, r.taps) - 1;
    const int first = r.by_taps.div(first_tap);
    return {first, r.by_taps.div(last_tap) - first + 1};
}

__device__ __forceinline__ ThreadRows thread_rows(const RingGeometry& r, int first_tap,
                                                  const WarpgroupChannels& ch, int warp,
                                                  int lane) {
    ThreadRows rows;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int k = first_tap + warp * 16 + lane / 4 + 8 * h;
        const int c = r.by_taps.div(k), tap = k - c * r.kernel_h * r.kernel_w;
        const int i = r.by_kernel_w.div(tap), j = tap - i * r.kernel_w;
        const bool real = k < r.taps;
        rows.column[h] = real ? (c - ch.first) * r.channel_pitch + j * r.dil_w + 8 * (lane % 4)
                              : -1;
        rows.row_step[h] = real ? i * r.dil_h : 0;
    }
    return rows;
}

// One ring row in flight: a thread's values f = wtid + 128 m of the warpgroup's channels'
// input row ih (channel f / ring_width, column f % ring_width), loaded into registers.
__device__ __forceinline__ void load_ring_row(const RingGeometry& r, int n, int ih,
                                              const WarpgroupChannels& ch, int wtid,
                                              float (&v)[kFillValues]) {
    const int count = ch.count * r.ring_width;
    const bool row_inside = ih >= 0 && ih < r.height;
    const float* plane = r.x + (n * r.channels + ch.first) * r.height * r.width +
                         (row_inside ? ih : 0) * r.width;  // (channel ch.first, row ih)
#pragma unroll
    for (int m = 0; m < kFillValues; ++m) {
        const int f = wtid + m * kWarpgroupThreads;
        if (f >= count) break;  // (store_ring_row stops at the same value)
        const int c = r.by_ring_width.div(f), iw = f - c * r.ring_width - r.pad_w;
        v[m] = load_or_zero(plane + c * r.height * r.width + iw,
                            row_inside && iw >= 0 && iw < r.width);
    }
}

// The values stored split into ring slot `slot` (kTf32: rounded to nearest, the big plane
// alone); whether all the thread's were finite.
template <bool kTf32>
__device__ __forceinline__ bool store_ring_row(const RingGeometry& r, float* ring, int slot,
                                               const WarpgroupChannels& ch, int wtid,
                                               const float (&v)[kFillValues]) {
    const int count = ch.count * r.ring_width;
    bool finite = true;
#pragma unroll
    for (int m = 0; m < kFillValues; ++m) {
        const int f = wtid + m * kWarpgroupThreads;
        if (f >= count) break;
        const int c = r.by_ring_width.div(f);
        float* at = ring + slot * r.slot_pitch + c * r.channel_pitch + (f - c * r.ring_width);
        finite = finite && finite_value(v[m]);
        if constexpr (kTf32) {
            at[0] = __uint_as_float(tf32_nearest(v[m]));
        } else {
            const Tf32Split parts = split_tf32_truncated(v[m]);
            at[0] = __uint_as_float(parts.big);
            at[r.plane_floats] = __uint_as_float(parts.small);
        }
    }
    return finite;
}

}  // namespace wgrad_ring
}  // namespace scratchops
