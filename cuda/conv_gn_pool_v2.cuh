// conv_gn_pool_v2.cuh — P85's one pass, v2 (see conv_gn_pool.cuh): a convolution kernel of
// its own on the wgmma engine's instructions, for Cin <= 8.
#pragma once

#include "conv_gn_pool.cuh"

namespace scratchops {
namespace conv_gn_pool {

// One CTA per SM (persistent), 384 threads = three warpgroups that work apart: each takes its
// own tiles of 4 output rows x 16 columns (64 GEMM rows, one m64 wgmma) and synchronises
// only its own 128 threads (named barriers), so one warpgroup's epilogue runs while the
// others' wgmmas keep the tensor cores busy (three, not two: the kernel is bound by latency,
// and 168 registers a thread still fit). Shared: the weights; per warpgroup: the rest.
//   weights  the packed B (all k-blocks: big, small, cross) copied into shared memory once,
//            re-laid so that k-step j is tap j's 8 channels (the packing interleaves 4 taps
//            per k-step, for v1's gather): 9 k-steps for a 3 x 3 kernel instead of 12.
//   halo     per tile, the input patch its outputs read (HR x HC pixels x 8 channels),
//            copied from global memory one tile ahead (cp.async, no registers held; 16 bytes
//            of a row at a time where the rows are 16-byte aligned, as at P85's size), split
//            once into TF32 big / small / cross and stored channel-last. v1 split every im2col
//            value (each input value 9 times for a 3 x 3 kernel) and gathered it with its own
//            load; here a thread's A registers are two-value shared loads.
//   mma      both operands' products in two accumulators: the cross terms in one, big * big
//            in the other, added once at the end (the cross terms never meet the large
//            running sum inside the tensor cores' truncating accumulation).
//   epilogue the tile goes through shared memory as [channel][pixel]; a thread then owns one
//            (channel, pooling window) at a time: four 16-byte loads and the window's extreme;
//            the channel's mean and centred sum of squares over the tile, in two passes whose
//            sums join the 4 windows' lanes (shuffles); Chan merges join the channels of a
//            group (shuffles where the group lies in one warp's lanes). gamma * scale's sign is
//            folded into the weights and the conv bias added only to the results, so the
//            16 values of a window take no operation before their max and moments.
// Covered: Cin <= 8 (the packed K is then 8 values a tap), at most 12 taps (3 k-blocks) and
// a halo of at most kHaloPixels pixels; conv_gn_pool_launch runs v1 otherwise.
constexpr int kV2Warpgroups = 3;
constexpr int kV2Threads = 128 * kV2Warpgroups;
constexpr int kV2MaxKBlocks = 3;
enum : int {
    kV2MaxTaps = 4 * kV2MaxKBlocks,                // a k-block holds 4 taps of 8 channels
    kV2Windows = kV2BandCols / kPool,              // pooling windows of a tile
    kWindowPairs = kBN * kV2Windows,               // (channel, window) pairs of a tile
};
constexpr int kHaloPixels = 128;  // halo_h x raw_pitch at most
constexpr int kHaloItems = kHaloPixels * 4;  // (pixel, channels q and q + 4) items of a halo
constexpr int kWideCopies = kHaloPixels * 8 / 4;  // 16-byte copies of a halo at most
enum : int { kHaloIters = kHaloItems / 128 };  // items a thread copies and splits (an enum:
                                               // unused without sm_90a)
constexpr int kHaloPixelBytes = 32;  // 8 channels, channel-last (see halo_offset)
constexpr int kHaloArrayBytes = kHaloPixels * kHaloPixelBytes;
constexpr int kTilePitch = kPool * kV2BandCols + 4;  // floats per channel row of the staged tile

struct V2Shape {
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
    int tap_offset[kV2MaxTaps];
};

// Shared memory: the weights (1024-aligned), then per warpgroup a WarpgroupSmem, then the
// halo plan both warpgroups read.
struct WarpgroupSmem {
    uint8_t halo[3 * kHaloArrayBytes];  // big, small, cross
    float staged[kBN * kTilePitch];     // the tile as [channel][pixel]
    float ch_count[kBN], ch_mean[kBN], ch_m2[kBN];
    float raw[8 * kHaloPixels];         // the next tile's halo, unsplit: [channel][hr][raw_pitch]
};
static_assert(sizeof(WarpgroupSmem) % 16 == 0, "16-byte aligned arrays");

__host__ __device__ inline int v2_smem_bytes(int num_kb) {
    return 1024 + num_kb * 3 * kBN * 128 + kV2Warpgroups * static_cast<int>(sizeof(WarpgroupSmem)) +
           (kHaloItems + kWideCopies) * static_cast<int>(sizeof(int4));
}

// Byte offset of channels (q, q + 4) of halo pixel p: channel-last, the pair a wgmma k-step
// gives one thread (logical columns t and t + 4) side by side, so a k-step's address is a
// plain sum. No bank conflicts either way: a k-step's 8-byte loads (half a warp: 4 pixels
// g = 0..3 one column apart at stride 1, q = 0..3) start at banks 8 g + 2 q, and the split's
// 8-byte stores (half a warp: 4 consecutive pixels, q = 0..3, see halo_plan) likewise; each
// half-warp covers the 32 banks once. (A pitch of 40 bytes, tried first, conflicts 2-way.)
__device__ __forceinline__ int halo_offset(int p, int q) { return p * kHaloPixelBytes + q * 8; }

__device__ __forceinline__ void warpgroup_sync(int warpgroup) {  // its 128 threads only
    asm volatile("bar.sync %0, 128;" ::"r"(1 + warpgroup) : "memory");
}
// The same barrier, returning whether `pred` holds in all 128 threads.
__device__ __forceinline__ bool warpgroup_sync_and(int warpgroup, bool pred) {
    uint32_t all;
    asm volatile(
        "{\n .reg .pred p, q;\n setp.ne.u32 p, %1, 0;\n"
        " bar.red.and.pred q, %2, 128, p;\n selp.u32 %0, 1, 0, q;\n}"
        : "=r"(all)
        : "r"(static_cast<uint32_t>(pred)), "r"(1 + warpgroup)
        : "memory");
    return all != 0;
}

__global__ void __launch_bounds__(kV2Threads, 1)
    conv_gn_pool_v2_kernel(const float* __restrict__ x, const uint8_t* __restrict__ packed,
                           tc::PackedB layout, Params p, ConvGeometryFast f, BandPixels bands,
                           V2Shape shape) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using Mma = WgmmaTf32Rs<kBN>;
    constexpr int kAcc = kBN / 2;
    const Conv2dGeometry& g = f.g;
    extern __shared__ uint8_t smem_raw[];
    const uint32_t raw_addr = smem_address(smem_raw);
    uint8_t* weights = smem_raw + (((raw_addr + 1023) & ~1023u) - raw_addr);
    const int num_kb = layout.num_kb;
    WarpgroupSmem* wg_smem = reinterpret_cast<WarpgroupSmem*>(weights + num_kb * 3 * kBN * 128);
    // [kHaloItems]: where each halo item comes from and goes; [kWideCopies]: the same for the
    // 16-byte copies (below).
    int4* halo_plan = reinterpret_cast<int4*>(wg_smem + kV2Warpgroups);
    int4* wide_plan = halo_plan + kHaloItems;

    const int tid = threadIdx.x;
    const int warpgroup = tid / 128, wtid = tid % 128;  // wtid: the thread within its warpgroup
    const int warp = wtid / 32, lane = tid % 32;
    const int quad_row = lane / 4, quad_col = lane % 4;
    WarpgroupSmem& my = wg_smem[warpgroup];

    // The packed weights once, re-laid: the packing puts k = 32 kb + physical_k(L) at logical
    // column L of k-block kb (tf32x3.cuh); here logical column L holds k = 32 kb + L, so that
    // k-step j is tap j (k = 8 tap + channel). Same k-block, same 128-byte swizzle.
    {
        const int values = num_kb * 3 * kBN * tc::kBlockK;  // [kb][part][row n][column L]
        // Unrolled so that a thread's global loads are in flight together (run once per CTA,
        // but a loop of dependent loads took ~5% of the kernel's time in ncu's samples).
#pragma unroll 8
        for (int i = tid; i < values; i += kV2Threads) {
            const int column = i % tc::kBlockK, n = (i / tc::kBlockK) % kBN;
            const int tile = i / (tc::kBlockK * kBN);  // = 3 kb + part
            const uint8_t* from = packed + tile * kBN * 128;
            // Channel n negated where its extremes are minima (see "epilogue" above): its
            // conv outputs come out as sign * x, exactly (negating every part of every
            // product negates the sum, rounding included).
            const uint32_t sign_bit = extreme_sign(p, f.cout, n) < 0.0f ? 0x80000000u : 0u;
            *reinterpret_cast<uint32_t*>(weights + tile * kBN * 128 +
                                         tc::packed_offset(n, tc::physical_k(column))) =
                *reinterpret_cast<const uint32_t*>(from + tc::packed_offset(n, column)) ^
                sign_bit;
        }
        fence_proxy_async_shared();  // the weights are read by wgmma (the async proxy)
    }
    // Halo item i = wtid + 128 it = 4 pixel + q, pixel = hr * halo_w + hc: channels q and
    // q + 4 of halo pixel (hr, hc), the pair a k-step's A register holds, so a thread splits
    // both and stores each part as one 8-byte pair. The copies from global memory write the
    // unsplit halo as [channel][hr][raw_pitch] (raw): wide, 4 floats of one channel's row at a
    // time (item j = (channel c, hr, chunk k), 16 bytes from column 4 k); otherwise a float at
    // a time, by the thread that splits it (channels q and q + 4 of its items). Warpgroup 0
    // writes the decoding once, the same for every tile and every warpgroup:
    //   halo_plan[i] = {input offset of (hr, hc) from the tile's first input pixel (-1: past
    //                   the halo), raw index of (q, hr, hc), byte offset in the split halo
    //                   arrays (-1: past the halo), hr << 16 | hc}
    //   wide_plan[j] = {input offset of (c, hr, 4 k) (-1: channel c >= Cin, zeros), raw index
    //                   (-1: past the halo, no copy), -, hr << 16 | 4 k}
    const int halo_pixels = shape.halo_h * shape.halo_w;
    const int plane = g.height * g.width;
    const int raw_channel = shape.halo_h * shape.raw_pitch;  // floats of one channel in raw
    if (warpgroup == 0) {
#pragma unroll
        for (int it = 0; it < kHaloIters; ++it) {
            const int i = wtid + 128 * it;
            const int pixel = i / 4, q = i % 4;
            const bool in_halo = pixel < halo_pixels;
            const int hr = pixel / shape.halo_w, hc = pixel - hr * shape.halo_w;
            halo_plan[i] = make_int4(in_halo ? hr * g.width + hc : -1,
                                     (q * shape.halo_h + hr) * shape.raw_pitch + hc,
                                     in_halo ? halo_offset(pixel, q) : -1, hr << 16 | hc);
        }
        const int chunks = shape.raw_pitch / 4;
        for (int j = wtid; j < kWideCopies; j += 128) {
            const int c = j / (shape.halo_h * chunks), rest = j % (shape.halo_h * chunks);
            const int hr = rest / chunks, col = 4 * (rest % chunks);
            wide_plan[j] = make_int4(c < g.channels ? c * plane + hr * g.width + col : -1,
                                     c < 8 ? c * raw_channel + hr * shape.raw_pitch + col : -1, 0,
                                     hr << 16 | col);
        }
    }
    // B's cross tiles only where some weight is not finite (see tf32x3.cuh). This barrier
    // also publishes the weights and the plan.
    const bool b_cross_tile = tc::b_has_nonfinite(packed, layout);

    // This thread's two tile rows (h = 0, 1): band row `warp`, column quad_row + 8h; their
    // halo pixel for tap 0 (tap (r, s) adds r * dil_h * halo_w + s * dil_w).
    int row_pixel[2];
#pragma unroll
    for (int h = 0; h < 2; ++h)
        row_pixel[h] = warp * g.stride_h * shape.halo_w + (quad_row + 8 * h) * g.stride_w;
    // The epilogue's (channel, window) pairs of this thread (see (5)).
    float pair_bias[kWindowPairs / 128], pair_sign[kWindowPairs / 128];
    const int pair_window = lane / 8;
    auto pair_channel = [&](int j) { return 8 * (4 * j + warp) + lane % 8; };
#pragma unroll
    for (int j = 0; j < kWindowPairs / 128; ++j) {
        const int co = pair_channel(j);
        pair_bias[j] = p.conv_bias != nullptr && co < f.cout ? p.conv_bias[co] : 0.0f;
        pair_sign[j] = extreme_sign(p, f.cout, co);
    }

    const uint64_t desc0 = make_smem_desc_sw128(smem_address(weights));

    const int total_tiles = f.batch * bands.tiles_per_image;
    const int first = kV2Warpgroups * static_cast<int>(blockIdx.x) + warpgroup;
    const int step = kV2Warpgroups * static_cast<int>(gridDim.x);
    auto fetch_halo = [&](int tile) {
        int n, band, col_block;
        bands.tile(tile, n, band, col_block);
        const int ih0 = kPool * band * g.stride_h - g.pad_h;
        const int iw0 = kV2BandCols * col_block * g.stride_w - g.pad_w;
        const float* origin = x + static_cast<long long>(n) * g.channels * plane;
        const int origin_offset = ih0 * g.width + iw0;  // may be negative (padding)
        // The input is read by this tile and its neighbours (in the same round of tiles),
        // then never again: evict-first in L2, so that the window extremes, which the
        // finalize reads right after this kernel, stay there rather than the input.
        const uint64_t input_policy = l2_evict_first();
        auto inside = [&](int hr_hc) {
            return static_cast<unsigned>(ih0 + (hr_hc >> 16)) < static_cast<unsigned>(g.height) &&
                   static_cast<unsigned>(iw0 + (hr_hc & 0xffff)) < static_cast<unsigned>(g.width);
        };
        // (A copy of 0 bytes reads nothing and writes zeros; its address is the sample's first
        // value.)
        if (shape.wide) {
#pragma unroll
            for (int it = 0; it < kWideCopies / 128; ++it) {
                const int4 plan = wide_plan[wtid + 128 * it];
                if (plan.y < 0) continue;
                const bool valid = plan.x >= 0 && inside(plan.w);
                cp_async_or_zero<16>(&my.raw[plan.y],
                                     valid ? origin + (origin_offset + plan.x) : origin, valid,
                                     input_policy);
            }
        } else {
            const int q = wtid % 4;  // (the same for each of the thread's items)
#pragma unroll
            for (int it = 0; it < kHaloIters; ++it) {
                const int4 plan = halo_plan[wtid + 128 * it];
                if (plan.x < 0) continue;  // past the halo
                const bool in = inside(plan.w);
                const bool has_q = in && q < g.channels, has_q4 = in && q + 4 < g.channels;
                cp_async_or_zero<4>(&my.raw[plan.y],
                                    has_q ? origin + (origin_offset + q * plane + plan.x) : origin,
                                    has_q, input_policy);
                cp_async_or_zero<4>(
                    &my.raw[plan.y + 4 * raw_channel],
                    has_q4 ? origin + (origin_offset + (q + 4) * plane + plan.x) : origin, has_q4,
                    input_policy);
            }
        }
        cp_async_commit();
    };
    if (first < total_tiles) fetch_halo(first);
    cp_async_wait_all();  // (the later tiles' copies are waited for before (4)'s barrier)
    warpgroup_sync(warpgroup);

    for (int tile = first; tile < total_tiles; tile += step) {
        // (1) This tile's halo into shared memory, split. The previous tile's reads of the
        // halo ended before its epilogue's barriers, and its copies of raw too (see (4)).
        bool finite = true;  // every value this thread split is finite (cross == big)
#pragma unroll
        for (int it = 0; it < kHaloIters; ++it) {
            const int at = halo_plan[wtid + 128 * it].z;
            if (at >= 0) {
                const int from = halo_plan[wtid + 128 * it].y;
                const Tf32Split lo = split_tf32_truncated(my.raw[from]);
                const Tf32Split hi = split_tf32_truncated(my.raw[from + 4 * raw_channel]);
                finite = finite && lo.cross == lo.big && hi.cross == hi.big;
                *reinterpret_cast<uint2*>(my.halo + at) = make_uint2(lo.big, hi.big);
                *reinterpret_cast<uint2*>(my.halo + kHaloArrayBytes + at) =
                    make_uint2(lo.small, hi.small);
                *reinterpret_cast<uint2*>(my.halo + 2 * kHaloArrayBytes + at) =
                    make_uint2(lo.cross, hi.cross);
            }
        }
        const bool finite_tile = warpgroup_sync_and(warpgroup, finite);
        // (2) The next tile's halo, in flight during this tile's work.
        if (tile + step < total_tiles) fetch_halo(tile + step);

        // (3) The products, one k-step a tap: the thread's A registers are channels
        // quad_col and quad_col + 4 of tap j at its two rows' pixels, then 3 wgmmas. In a
        // tile of finite values (all but those with an Inf or NaN input) and finite weights,
        // the cross parts are the big parts, so a tap needs two parts of A, B's big tile
        // serves its cross terms, and tap j + 1's registers are loaded before tap j's wgmmas
        // are issued (three buffers): the loads' latency hides behind the wait for tap j - 1,
        // instead of stalling the next wgmma. Other tiles load all three parts of a tap just
        // before its wgmmas and wait for them, one tap at a time.
        float acc_big[kAcc], acc_cross[kAcc];
        const int row_at[2] = {halo_offset(row_pixel[0], quad_col),
                               halo_offset(row_pixel[1], quad_col)};
        auto products = [&](auto finite_values) {
            constexpr bool kFinite = decltype(finite_values)::value;
            constexpr int kParts = kFinite ? 2 : 3;  // big, small (, cross)
            constexpr int kBuffers = kFinite ? 3 : 1;
            uint32_t a[kBuffers][kParts][4];  // [buffer][part][wgmma register]
            auto load_tap = [&](int j, uint32_t (&buf)[kParts][4]) {
                const int tap_at = shape.tap_offset[j] * kHaloPixelBytes;
#pragma unroll
                for (int h = 0; h < 2; ++h)
#pragma unroll
                    for (int part = 0; part < kParts; ++part) {
                        const uint2 v = *reinterpret_cast<const uint2*>(
                            my.halo + part * kHaloArrayBytes + row_at[h] + tap_at);
                        buf[part][h] = v.x;      // channel t: logical column t
                        buf[part][2 + h] = v.y;  // channel t + 4: column t + 4
                    }
            };
            if (kFinite) load_tap(0, a[0]);
#pragma unroll
            for (int j = 0; j < kV2MaxTaps; ++j) {
                if (j < shape.taps) {
                    uint32_t (&buf)[kParts][4] = a[j % kBuffers];
                    if (!kFinite) load_tap(j, buf);
                    // Buffer (j + 1) % 3 last held tap j - 2, done since step j - 1's wait.
                    if (kFinite && j + 1 < shape.taps) load_tap(j + 1, a[(j + 1) % kBuffers]);
                    // k-block j / 4's tiles, k-step j % 4 (32 bytes, 2 in the descriptor's
                    // 16-byte units): compile-time offsets from the first tile's descriptor.
                    constexpr int kTile = kBN * 128 / 16;
                    const uint64_t desc_big = desc0 + ((j / 4) * 3 * kTile + 2 * (j % 4));
                    const uint64_t desc_small = desc_big + kTile;
                    const uint64_t desc_cross =
                        !kFinite && b_cross_tile ? desc_big + 2 * kTile : desc_big;
#pragma unroll
                    for (int part = 0; part < kParts; ++part) pin_registers(buf[part]);
                    pin_registers(acc_big);
                    pin_registers(acc_cross);
                    wgmma_fence();
                    const int accumulate = j > 0;  // tap 0 starts both afresh
                    Mma::mma(acc_cross, buf[1], desc_cross, accumulate);
                    Mma::mma(acc_cross, buf[kFinite ? 0 : 2], desc_small, 1);
                    Mma::mma(acc_big, buf[0], desc_big, accumulate);
                    wgmma_commit();
                    if (kFinite) {
                        wgmma_wait<1>();  // tap j - 1's wgmmas are done: its buffer is free
#pragma unroll
                        for (int part = 0; part < kParts; ++part)
                            pin_registers(a[(j + 2) % kBuffers][part]);
                    } else {
                        wgmma_wait<0>();
#pragma unroll
                        for (int part = 0; part < kParts; ++part) pin_registers(buf[part]);
                    }
                }
            }
            wgmma_wait<0>();
#pragma unroll
            for (int b = 0; b < kBuffers; ++b)
#pragma unroll
                for (int part = 0; part < kParts; ++part) pin_registers(a[b][part]);
            pin_registers(acc_big);
            pin_registers(acc_cross);
        };
        if (finite_tile && !b_cross_tile)
            products(std::true_type{});
        else
            products(std::false_type{});

        // (4) The tile through shared memory as [channel][pixel]: element 4 nb + 2h + j of the
        // accumulators is (pixel 16 warp + quad_row + 8h, channel 8 nb + 2 quad_col + j).
#pragma unroll
        for (int i = 0; i < kAcc; ++i) {
            const int co = 8 * (i / 4) + 2 * quad_col + i % 2;
            const int pixel = 16 * warp + quad_row + 8 * ((i / 2) % 2);
            my.staged[co * kTilePitch + pixel] = acc_big[i] + acc_cross[i];
        }
        // The next tile's copies of (2) have landed, and after this barrier every thread may
        // read every thread's (the 16-byte copies are not split by the thread that made them).
        cp_async_wait_all();
        warpgroup_sync(warpgroup);

        // (5) Per (channel, window) pair: the window's extreme, and the channel's moments over
        // the tile (its 4 windows' lanes sum together, two passes). Pair j of lane l in warp w:
        // channel 8 (4 j + w) + l % 8, window l / 8, so the 8 lanes of a 16-byte load phase
        // read 8 channels' rows (pitch 68 floats: banks 4 c apart, no conflict), and the
        // windows of a channel are lanes xor 8, 16, its neighbour channels lanes xor 1, 2, 4.
        // The staged values are sign * x without the bias (the bias moves neither the
        // extremes' order nor the spread): extreme = sign * max + bias and mean = sign * mean'
        // + bias, one rounding each, as if the bias had been added first. A whole tile (all but
        // the last band and column block) takes the path with no masks and no division; the
        // branch is uniform across the warpgroup, so the shuffles inside it see every lane.
        // (Until this step, moments went per window and Chan merges joined the 4 windows: more
        // instructions for no accuracy gain, the centring being exact either way.)
        int n, band, col_block;
        bands.tile(tile, n, band, col_block);
        const int rows_here = min(kPool, g.out_h - kPool * band);
        const int cols_here = min(kV2BandCols, g.out_w - kV2BandCols * col_block);
        // Group 0's place; group g's is g runs of the image's tiles further (see stats_at).
        float* tile_group_stats =
            stats_at(p.tile_stats, bands, p.groups, n, 0, tile - n * bands.tiles_per_image);
        const int w = pair_window;
        const bool groups_in_lanes = shape.group_shift >= 0;
        auto window_pairs = [&](auto whole_tile) {
            constexpr bool kWhole = decltype(whole_tile)::value;
#pragma unroll
            for (int j = 0; j < kWindowPairs / 128; ++j) {
                const int co = pair_channel(j);
                float v[kPool][kPool];
#pragma unroll
                for (int r = 0; r < kPool; ++r) {
                    const float4 row4 = *reinterpret_cast<const float4*>(
                        my.staged + co * kTilePitch + r * kV2BandCols + kPool * w);
                    v[r][0] = row4.x, v[r][1] = row4.y, v[r][2] = row4.z, v[r][3] = row4.w;
                }
                // Pooling windows lie whole inside the conv output, so an extreme is over all
                // 16 values (the edge tiles' partial windows are not stored). A plain fmaxf
                // drops NaN, which is harmless here: a NaN (or an Inf) conv value makes its
                // group's mean or variance NaN, and so every output of the group, as in torch.
                float row_max[kPool];
#pragma unroll
                for (int r = 0; r < kPool; ++r)
                    row_max[r] = fmaxf(fmaxf(v[r][0], v[r][1]), fmaxf(v[r][2], v[r][3]));
                const float extreme = fmaxf(fmaxf(row_max[0], row_max[1]),
                                            fmaxf(row_max[2], row_max[3]));
                const int wc = kV2Windows * col_block + w;
                if (co < f.cout && band < p.pool_h && wc < p.pool_w)
                    p.extremes[((static_cast<long long>(n) * f.cout + co) * p.pool_h + band) *
                                   p.pool_w + wc] = fmaf(pair_sign[j], extreme, pair_bias[j]);
                // The channel's moments over the tile, in two passes over the registers of its
                // 4 windows' lanes (xor 8, 16): the sum, then the squares centred on the mean.
                // (Both sums reach the 4 lanes in the same order: identical moments in each.)
                const int cols = kWhole ? kPool : max(0, min(kPool, cols_here - kPool * w));
                auto in_window = [&](int r, int c) {
                    return kWhole || (r < rows_here && c < cols);
                };
                float row_sum[kPool];
#pragma unroll
                for (int r = 0; r < kPool; ++r) {
                    row_sum[r] = in_window(r, 0) ? v[r][0] : 0.0f;
#pragma unroll
                    for (int c = 1; c < kPool; ++c)
                        row_sum[r] += in_window(r, c) ? v[r][c] : 0.0f;
                }
                auto sum_over_windows = [](float x) {  // lanes xor 8, 16
                    return warp_xor_reduce<8, 8 * kV2Windows>(x, Sum{});
                };
                const float sum =
                    sum_over_windows((row_sum[0] + row_sum[1]) + (row_sum[2] + row_sum[3]));
                Moments m;
                m.count = kWhole ? kPool * kV2BandCols : static_cast<float>(rows_here * cols_here);
                m.mean = kWhole ? sum * (1.0f / (kPool * kV2BandCols)) : sum / m.count;
                float row_m2[kPool];
#pragma unroll
                for (int r = 0; r < kPool; ++r) {
                    const float d0 = v[r][0] - m.mean;
                    row_m2[r] = in_window(r, 0) ? d0 * d0 : 0.0f;
#pragma unroll
                    for (int c = 1; c < kPool; ++c) {
                        const float d = v[r][c] - m.mean;
                        row_m2[r] += in_window(r, c) ? d * d : 0.0f;
                    }
                }
                m.m2 = sum_over_windows((row_m2[0] + row_m2[1]) + (row_m2[2] + row_m2[3]));
                m.mean = fmaf(pair_sign[j], m.mean, pair_bias[j]);  // channel co's moments
                if (groups_in_lanes) {
                    // The channels of a tile have equal counts: shares of 1/2 exactly.
#pragma unroll
                    for (int d = 1; d < 8; d *= 2)
                        if (d < (1 << shape.group_shift)) m = merged<true>(m, shfl_xor(m, d));
                    const int group = co >> shape.group_shift;
                    if (w == 0 && co == group << shape.group_shift && co < f.cout) {
                        float* out = tile_group_stats + 2 * group * bands.tiles_per_image;
                        out[0] = m.mean;
                        out[1] = m.m2;
                    }
                } else if (w == 0) {
                    my.ch_count[co] = m.count;
                    my.ch_mean[co] = m.mean;
                    my.ch_m2[co] = m.m2;
                }
            }
        };
        if (rows_here == kPool && cols_here == kV2BandCols)
            window_pairs(std::true_type{});
        else
            window_pairs(std::false_type{});
        if (!groups_in_lanes) {  // (6) other groups: their channels merged in order
            warpgroup_sync(warpgroup);
            if (wtid < p.groups) {
                const int cpg = f.cout / p.groups;
                Moments m{0.0f, 0.0f, 0.0f};
                for (int co = wtid * cpg; co < (wtid + 1) * cpg; ++co)
                    m = merged(m, Moments{my.ch_count[co], my.ch_mean[co], my.ch_m2[co]});
                float* out = tile_group_stats + 2 * wtid * bands.tiles_per_image;
                out[0] = m.mean;
                out[1] = m.m2;
            }
        }
        // The staged tile and the channel statistics are rewritten only after the next
        // tile's first barrier (after the split), which every thread of the warpgroup reaches
        // after (5) and (6).
    }
#else
    __trap();  // built without sm_90a: the Python layer refuses these kernels there
#endif
}
}  // namespace conv_gn_pool
}  // namespace scratchops
