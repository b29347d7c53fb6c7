// conv_gn_pool_v3_halo.cuh — P85's one pass, v3 (conv_gn_pool_v3.cuh): the shared-memory
// layout of its warpgroups, and the data movement before the products: the weights re-laid
// into shared memory once, and per tile the input halo copied from global memory one tile
// ahead and split into TF32 parts (float; the half types keep T).
#pragma once

#include "conv_gn_pool.cuh"

namespace scratchops {
namespace conv_gn_pool {

// Warpgroups a CTA: three for float, whose 3xTF32 tiles hold 168 registers a thread (384
// threads fill the register file); four for the half types, about 120 (512 threads fit, and a
// fourth warp a scheduler hides more of the latencies of the epilogue's shared-memory loads
// and dependent arithmetic, on which the three warps' issue waited: docs/notes.md).
template <class T>
__host__ __device__ constexpr int v3_warpgroups() {
    return is_half_type<T>() ? 4 : 3;
}
template <class T>
__host__ __device__ constexpr int v3_threads() {
    return kWarpgroupThreads * v3_warpgroups<T>();
}
constexpr int kV3MaxKBlocks = 3;
enum : int {
    kV3MaxTaps = 4 * kV3MaxKBlocks,  // a k-block holds 4 taps of 8 channels
};
constexpr int kHaloPixels = 128;  // halo_h x raw_pitch at most
constexpr int kHaloItems = kHaloPixels * 4;  // (pixel, channels q and q + 4) items of a halo
constexpr int kWideCopies = kHaloPixels * 8 / 4;  // 16-byte copies of a halo at most
// Items a thread copies and splits (an enum: unused without sm_90a).
enum : int { kHaloIters = kHaloItems / kWarpgroupThreads };
constexpr int kHaloPixelBytes = 32;  // 8 channels, channel-last (see halo_offset)
// The half types' 16-bit halo: 8 channels of T a pixel, each item's pair one 4-byte word at
// half the float halo's offset (split_halo). Their weights: k-blocks of 8 taps (one 128-byte
// row of T a tap's 8 channels apiece), so at most 2 for v3's 12 taps (relay_weights_16).
constexpr int kHaloHalfPixelBytes = kHaloPixelBytes / 2;
enum : int { kV3HalfKBlockTaps = 8 };
constexpr int kV3HalfMaxKBlocks = (kV3MaxTaps + kV3HalfKBlockTaps - 1) / kV3HalfKBlockTaps;
constexpr int kV3HalfKBlockBytes = kBN * 128;
constexpr int kHaloArrayBytes = kHaloPixels * kHaloPixelBytes;
constexpr int kTilePitch = kPool * kWideBandCols + 4;  // floats per channel row of the staged tile

struct V3Shape {
    int halo_h, halo_w, taps;
    // The unsplit halo's row pitch (halo_w rounded up to 4 floats), and whether its rows are
    // copied 16 bytes at a time (wide: stride_w 1, and width and pad_w multiples of 4, so
    // that a tile's input rows start 16-byte aligned and each 4-float chunk lies wholly
    // inside or wholly outside the image) or a float at a time.
    int raw_pitch, wide;
    // log2 of the channels a group, where that is 0 to 3: the group then lies in the lanes of
    // one (channel, window) pair of the epilogue and is merged by shuffles (see (5)); -1 for
    // other group sizes, merged in shared memory. (A kernel parameter: no register held.)
    int group_shift;
    // Halo pixels from a row's tap 0 to tap j = (r, s): r * dil_h * halo_w + s * dil_w.
    int tap_offset[kV3MaxTaps];
};

// Shared memory: the weights (1024-aligned), then per warpgroup a WarpgroupSmem, then the
// halo plan every warpgroup reads. (The half types' halo takes the first 2 KB of `halo`.)
struct WarpgroupSmem {
    uint8_t halo[3 * kHaloArrayBytes];  // big, small, cross
    float staged[kBN * kTilePitch];     // the tile as [channel][pixel]
    float ch_count[kBN], ch_mean[kBN], ch_m2[kBN];
    // The next tile's halo, unsplit: [channel][hr][raw_pitch] values of the input's type T
    // (the half types use the first half of it).
    float raw[8 * kHaloPixels];
    template <class T>
    __device__ T* raw_of() { return reinterpret_cast<T*>(raw); }
};
static_assert(sizeof(WarpgroupSmem) % 16 == 0, "16-byte aligned arrays");

// The weights' k-blocks, each a stage of big, small and cross tiles (3xTF32 alone).
using V3WeightStage = tc::BStage<kBN, false>;

// The weights' bytes (the half types: relay_weights_16's k-blocks), then all of shared memory.
template <class T>
__host__ __device__ inline int v3_weight_bytes(int num_kb) {
    return is_half_type<T>() ? kV3HalfMaxKBlocks * kV3HalfKBlockBytes
                             : num_kb * V3WeightStage::kStageBytes;
}
template <class T>
__host__ __device__ inline int v3_smem_bytes(int num_kb) {
    return tc::kAlignSlack + v3_weight_bytes<T>(num_kb) +
           v3_warpgroups<T>() * static_cast<int>(sizeof(WarpgroupSmem)) +
           (kHaloItems + kWideCopies) * static_cast<int>(sizeof(int4));
}

// Byte offset of channels (q, q + 4) of halo pixel p: channel-last, the pair a wgmma k-step
// gives one thread (logical columns t and t + 4) side by side, so a k-step's address is a
// plain sum. No bank conflicts either way: a k-step's 8-byte loads (half a warp: 4 pixels
// g = 0..3 one column apart at stride 1, q = 0..3) start at banks 8 g + 2 q, and the split's
// 8-byte stores (half a warp: 4 consecutive pixels, q = 0..3, see halo_plan) likewise; each
// half-warp covers the 32 banks once. (A pitch of 40 bytes, tried first, conflicts 2-way.)
__device__ __forceinline__ int halo_offset(int p, int q) { return p * kHaloPixelBytes + q * 8; }

__device__ __forceinline__ void warpgroup_sync(int warpgroup) {  // its threads only
    named_barrier_sync(1 + warpgroup, kWarpgroupThreads);
}
// The same barrier, returning whether `pred` holds in all the warpgroup's threads.
__device__ __forceinline__ bool warpgroup_sync_and(int warpgroup, bool pred) {
    return named_barrier_sync_and(1 + warpgroup, kWarpgroupThreads, pred);
}

// A thread of the v3 kernel: its place in the CTA, its warpgroup and the mma fragments.
struct V3Thread {
    int tid, warpgroup, wtid;  // wtid: the thread within its warpgroup
    int warp, lane, quad_row, quad_col;
    __device__ explicit V3Thread(int t)
        : tid(t), warpgroup(t / kWarpgroupThreads), wtid(t % kWarpgroupThreads),
          warp(t % kWarpgroupThreads / 32), lane(t % 32),
          quad_row(t % 32 / 4), quad_col(t % 4) {}
};

// The weights once, from the (Cout, Cin, kh, kw) weight tensor itself, in the layout of the
// packed B (tf32x3.cuh: k-block kb's big, small and cross tiles, 128-byte swizzled rows) but
// in the natural k order: logical column L of k-block kb holds k = 32 kb + L = 8 tap +
// channel, so that k-step j is tap j's 8 channels (the packing interleaves 4 taps a k-step,
// for v2's gather: 9 k-steps for a 3 x 3 kernel instead of 12). No packing kernel runs before
// this one, so nothing derived from the weights outlives the call, and a call is one launch
// fewer.
// Each value is split as pack_b splits B (split_tf32: big to nearest, the remainder to
// nearest). Channel n is negated where its extremes are minima
// (see "epilogue" in conv_gn_pool_v3.cuh): its conv outputs come out as sign * x, exactly
// (the split of -w is the split of w negated, cvt.rna being symmetric, and negating every
// part of every product negates the sum, rounding included). Returns whether this thread met
// a non-finite weight (then B's cross tile is needed: see tf32x3.cuh).
// The half types multiply natively (k16 wgmmas, 16-bit operands, relay_weights_16 below): their
// weights are not split, and their layout is 16-bit.
template <class T>
__device__ __forceinline__ bool relay_weights_16(uint8_t* weights, const T* w, const Params<T>& p,
                                                 const Conv2dGeometry& g, int cout, int tid);
template <class T>
__device__ __forceinline__ bool relay_weights(uint8_t* weights, const T* w,
                                              const tc::PackedB& layout, const Params<T>& p,
                                              const Conv2dGeometry& g, int cout, int tid) {
    if constexpr (is_half_type<T>()) return relay_weights_16(weights, w, p, g, cout, tid);
    bool nonfinite = false;
    const int taps = g.kernel_h * g.kernel_w;
    const int values = layout.num_kb * kBN * tc::kBlockK;  // [kb][row n][column L]
    // Unrolled so that a thread's global loads are in flight together (run once per CTA,
    // but a loop of dependent loads took ~5% of the kernel's time in ncu's samples).
#pragma unroll 4
    for (int i = tid; i < values; i += v3_threads<T>()) {
        const int column = i % tc::kBlockK, n = (i / tc::kBlockK) % kBN;
        const int kb = i / (tc::kBlockK * kBN);
        const int k = tc::kBlockK * kb + column, tap = k / 8, c = k % 8;
        const float value =
            n < cout && c < g.channels && tap < taps
                ? extreme_sign(p, cout, n) * to_float(w[(n * g.channels + c) * taps + tap])
                : 0.0f;
        const Tf32Split parts = split_tf32(value);
        nonfinite = nonfinite || parts.cross != parts.big;
        uint8_t* tile = weights + 3 * kb * V3WeightStage::kTileBytes + tc::packed_offset(n, column);
        *reinterpret_cast<uint32_t*>(tile) = parts.big;
        *reinterpret_cast<uint32_t*>(tile + V3WeightStage::kTileBytes) = parts.small;
        *reinterpret_cast<uint32_t*>(tile + 2 * V3WeightStage::kTileBytes) = parts.cross;
    }
    fence_proxy_async_shared();  // the weights are read by wgmma (the async proxy)
    return nonfinite;
}

// The 16-bit layout (the half types' native products, tile_products_16): k-block kb of 8 taps
// (a 128-byte row of 64 values of T, swizzled as pack_b's 16-bit B: tc::packed_offset<T>),
// k-step i of the tile taps 2 i and 2 i + 1, position L = 8 (tap % 8) + 2 (c % 4) + c / 4 of
// channel c: a tap's channels in the order q, q + 4 (q = 0..3), the order of the 16-bit halo's
// words (split_halo), so that a thread's A register is one 4-byte load. The wgmma sums over k
// in any order, so the permutation, the same in both operands, changes nothing but the order
// of the exact products' additions. Taps past the kernel's (an odd count's last k-step) are 0.
// A half value is exact in the products, so nothing is split; an Inf or NaN multiplies as in
// torch's fp32 arithmetic (no cross tile: returns false).
template <class T>
__device__ __forceinline__ bool relay_weights_16(uint8_t* weights, const T* w, const Params<T>& p,
                                                 const Conv2dGeometry& g, int cout, int tid) {
    const int taps = g.kernel_h * g.kernel_w;
    const int values = kV3HalfMaxKBlocks * kBN * kV3HalfKBlockTaps * 8;  // [kb][row n][L]
#pragma unroll 4
    for (int i = tid; i < values; i += v3_threads<T>()) {
        const int L = i % (8 * kV3HalfKBlockTaps), n = i / (8 * kV3HalfKBlockTaps) % kBN;
        const int kb = i / (8 * kV3HalfKBlockTaps * kBN);
        const int tap = kV3HalfKBlockTaps * kb + L / 8, pos = L % 8, c = pos / 2 + 4 * (pos % 2);
        const float value =
            n < cout && c < g.channels && tap < taps
                ? extreme_sign(p, cout, n) * to_float(w[(n * g.channels + c) * taps + tap])
                : 0.0f;
        *reinterpret_cast<T*>(weights + kb * kV3HalfKBlockBytes + tc::packed_offset<T>(n, L)) =
            from_float<T>(value);  // (exact: sign * w is a value of T)
    }
    fence_proxy_async_shared();  // the weights are read by wgmma (the async proxy)
    return false;
}

// Halo item i = wtid + 128 it = 4 pixel + q, pixel = hr * halo_w + hc: channels q and q + 4
// of halo pixel (hr, hc), the pair a k-step's A register holds, so a thread splits both and
// stores each part as one 8-byte pair (the half types: the pair of T as one 4-byte word).
// The copies from global memory write the unsplit halo as [channel][hr][raw_pitch] (raw):
// wide, 4 values of one channel's row at a time (item j = (channel c, hr, chunk k), from
// column 4 k); otherwise a value at a time, by the thread that splits it (channels q and
// q + 4 of its items). One warpgroup writes the decoding once, the same for every tile and
// every warpgroup:
//   halo_plan[i] = {input offset of (hr, hc) from the tile's first input pixel (-1: past
//                   the halo), raw index of (q, hr, hc), byte offset in the split halo
//                   arrays (-1: past the halo), hr << 16 | hc}
//   wide_plan[j] = {input offset of (c, hr, 4 k) (-1: channel c >= Cin, zeros), raw index
//                   (-1: past the halo, no copy), -, hr << 16 | 4 k}
__device__ __forceinline__ void write_halo_plan(int4* halo_plan, int4* wide_plan,
                                                const V3Shape& shape, const Conv2dGeometry& g,
                                                int wtid) {
    const int halo_pixels = shape.halo_h * shape.halo_w;
    const int plane = g.height * g.width;
    const int raw_channel = shape.halo_h * shape.raw_pitch;  // floats of one channel in raw
#pragma unroll
    for (int it = 0; it < kHaloIters; ++it) {
        const int i = wtid + kWarpgroupThreads * it;
        const int pixel = i / 4, q = i % 4;
        const bool in_halo = pixel < halo_pixels;
        const int hr = pixel / shape.halo_w, hc = pixel - hr * shape.halo_w;
        halo_plan[i] = make_int4(in_halo ? hr * g.width + hc : -1,
                                 (q * shape.halo_h + hr) * shape.raw_pitch + hc,
                                 in_halo ? halo_offset(pixel, q) : -1, hr << 16 | hc);
    }
    const int chunks = shape.raw_pitch / 4;
    for (int j = wtid; j < kWideCopies; j += kWarpgroupThreads) {
        const int c = j / (shape.halo_h * chunks), rest = j % (shape.halo_h * chunks);
        const int hr = rest / chunks, col = 4 * (rest % chunks);
        wide_plan[j] = make_int4(c < g.channels ? c * plane + hr * g.width + col : -1,
                                 c < 8 ? c * raw_channel + hr * shape.raw_pitch + col : -1, 0,
                                 hr << 16 | col);
    }
}

// Starts the copies of `tile`'s input halo into raw (cp.async, committed as one group): wide,
// 4 values of T (16 or 8 bytes); otherwise a value at a time, by cp.async for float and by a
// plain load and store for the half types (cp.async copies 4 bytes at least), which the
// thread that later splits the value makes itself, so no barrier orders it.
template <class T>
__device__ __forceinline__ void fetch_halo(int tile, const T* x, T* raw,
                                           const int4* halo_plan, const int4* wide_plan,
                                           const V3Shape& shape, const Conv2dGeometry& g,
                                           const BandPixels& bands, int wtid) {
    int n, band, col_block;
    bands.tile(tile, n, band, col_block);
    const int plane = g.height * g.width;
    const int raw_channel = shape.halo_h * shape.raw_pitch;
    const int ih0 = kPool * band * g.stride_h - g.pad_h;
    const int iw0 = kWideBandCols * col_block * g.stride_w - g.pad_w;
    const T* origin = x + static_cast<long long>(n) * g.channels * plane;
    const int origin_offset = ih0 * g.width + iw0;  // may be negative (padding)
    // The input is read by this tile and its neighbours (in the same round of tiles), then
    // never again: evict-first in L2, so that the window extremes, which the finalize reads
    // right after this kernel, stay there rather than the input.
    const uint64_t input_policy = l2_evict_first();
    auto inside = [&](int hr_hc) {
        return static_cast<unsigned>(ih0 + (hr_hc >> 16)) < static_cast<unsigned>(g.height) &&
               static_cast<unsigned>(iw0 + (hr_hc & 0xffff)) < static_cast<unsigned>(g.width);
    };
    // (A copy of 0 bytes reads nothing and writes zeros; its address is the sample's first
    // value.)
    if (shape.wide) {
#pragma unroll
        for (int it = 0; it < kWideCopies / kWarpgroupThreads; ++it) {
            const int4 plan = wide_plan[wtid + kWarpgroupThreads * it];
            if (plan.y < 0) continue;
            const bool valid = plan.x >= 0 && inside(plan.w);
            cp_async_or_zero<4 * sizeof(T)>(
                &raw[plan.y],
                reinterpret_cast<const float*>(valid ? origin + (origin_offset + plan.x) : origin),
                valid, input_policy);
        }
    } else {
        const int q = wtid % 4;  // (the same for each of the thread's items)
#pragma unroll
        for (int it = 0; it < kHaloIters; ++it) {
            const int4 plan = halo_plan[wtid + kWarpgroupThreads * it];
            if (plan.x < 0) continue;  // past the halo
            const bool in = inside(plan.w);
            const bool has_q = in && q < g.channels, has_q4 = in && q + 4 < g.channels;
            if constexpr (is_half_type<T>()) {
                const T zero = from_float<T>(0.0f);
                raw[plan.y] = has_q ? origin[origin_offset + q * plane + plan.x] : zero;
                raw[plan.y + 4 * raw_channel] =
                    has_q4 ? origin[origin_offset + (q + 4) * plane + plan.x] : zero;
            } else {
                cp_async_or_zero<4>(&raw[plan.y],
                                    has_q ? origin + (origin_offset + q * plane + plan.x) : origin,
                                    has_q, input_policy);
                cp_async_or_zero<4>(
                    &raw[plan.y + 4 * raw_channel],
                    has_q4 ? origin + (origin_offset + (q + 4) * plane + plan.x) : origin, has_q4,
                    input_policy);
            }
        }
    }
    cp_async_commit();
}

// The landed halo (raw, of type T) split into TF32 big / small / cross, channel-last; returns
// whether every value this thread split is finite (its cross part is then its big part). The
// half types multiply natively (tile_products_16): their halo is T itself, channels q and
// q + 4 of a pixel one 4-byte word at half the float offset (16 bytes a pixel), nothing split
// (and the return, which nothing then reads, is true).
template <class T>
__device__ __forceinline__ bool split_halo(WarpgroupSmem& my, const int4* halo_plan,
                                           int raw_channel, int wtid) {
    const T* raw = my.raw_of<T>();
    bool finite = true;
#pragma unroll
    for (int it = 0; it < kHaloIters; ++it) {
        const int at = halo_plan[wtid + kWarpgroupThreads * it].z;
        if (at >= 0) {
            const int from = halo_plan[wtid + kWarpgroupThreads * it].y;
            if constexpr (is_half_type<T>()) {  // channels q and q + 4 of T: one 16-bit pair
                const auto* bits = reinterpret_cast<const uint16_t*>(raw);
                *reinterpret_cast<uint32_t*>(my.halo + at / 2) =
                    bits[from] | static_cast<uint32_t>(bits[from + 4 * raw_channel]) << 16;
                continue;
            }
            const Tf32Split lo = split_tf32_truncated(to_float(raw[from]));
            const Tf32Split hi = split_tf32_truncated(to_float(raw[from + 4 * raw_channel]));
            *reinterpret_cast<uint2*>(my.halo + at) = make_uint2(lo.big, hi.big);
            finite = finite && lo.cross == lo.big && hi.cross == hi.big;
            *reinterpret_cast<uint2*>(my.halo + kHaloArrayBytes + at) =
                make_uint2(lo.small, hi.small);
            *reinterpret_cast<uint2*>(my.halo + 2 * kHaloArrayBytes + at) =
                make_uint2(lo.cross, hi.cross);
        }
    }
    return finite;
}

}  // namespace conv_gn_pool
}  // namespace scratchops
