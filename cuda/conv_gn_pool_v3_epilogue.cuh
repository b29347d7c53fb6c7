// conv_gn_pool_v3_epilogue.cuh — P85's one pass, v3 (conv_gn_pool_v3.cuh): the epilogue of a
// tile, once its products are in the accumulators: the tile staged in shared memory as
// [channel][pixel], then per (channel, pooling window) the window's extreme and the
// channel's moments over the tile, merged per group.
#pragma once

#include "conv_gn_pool_v3_halo.cuh"

namespace scratchops {
namespace conv_gn_pool {

// Where a tile lies: sample n, pooling band, column block, and the conv output rows and
// columns it holds (fewer than kPool x kWideBandCols at the image's bottom and right edges).
struct V3TilePlace {
    int n, band, col_block, rows_here, cols_here;
    __device__ V3TilePlace(int tile, const BandPixels& bands, const Conv2dGeometry& g) {
        bands.tile(tile, n, band, col_block);
        rows_here = min(kPool, g.out_h - kPool * band);
        cols_here = min(kWideBandCols, g.out_w - kWideBandCols * col_block);
    }
    __device__ bool whole() const { return rows_here == kPool && cols_here == kWideBandCols; }
};

// The epilogue's (channel, window) pairs of a thread: pair j of lane l in warp w is channel
// 8 (4 j + w) + l % 8, window l / 8, so the 8 lanes of a 16-byte load phase read 8 channels'
// rows (pitch 68 floats: banks 4 c apart, no conflict), and the windows of a channel are
// lanes xor 8, 16, its neighbour channels lanes xor 1, 2, 4. Each pair's conv bias and
// extreme sign are read once per CTA. (The half types' staged values hold the bias already,
// rounded as torch rounds it: stage_tile; their pairs add none.)
struct V3WindowPairs {
    static constexpr int kPerThread = kWideTilePairs / kWarpgroupThreads;
    float bias[kPerThread], sign[kPerThread];
    int window, warp, lane;
    __device__ int channel(int j) const { return 8 * (4 * j + warp) + lane % 8; }
    template <class T>
    __device__ V3WindowPairs(const V3Thread& t, const Params<T>& p, int cout)
        : window(t.lane / 8), warp(t.warp), lane(t.lane) {
#pragma unroll
        for (int j = 0; j < kPerThread; ++j) {
            const int co = channel(j);
            bias[j] = is_half_type<T>() ? 0.0f : value_or(p.conv_bias, co, co < cout, 0.0f);
            sign[j] = extreme_sign(p, cout, co);
        }
    }
};

// The half types' sign * conv bias (see stage_tile) of each channel pair co, co + 1, as a pair
// of T (exact: sign * bias is a value of T), written once per CTA into shared memory (in
// registers they pushed the four-warpgroup kernel past its 128 a thread); float's stage adds
// no bias (the pairs of (5) add it) and writes none.
template <class T>
__device__ __forceinline__ void write_stage_bias(uint32_t* bias_pairs, const Params<T>& p,
                                                 int cout, int tid) {
    if constexpr (is_half_type<T>()) {
        const int co = 2 * tid;
        if (co < kBN) {
            const float lo = extreme_sign(p, cout, co) * value_or(p.conv_bias, co, co < cout, 0.0f);
            const float hi =
                extreme_sign(p, cout, co + 1) * value_or(p.conv_bias, co + 1, co + 1 < cout, 0.0f);
            bias_pairs[tid] = pair_bits(PairOf<T>::rounded_pair(lo, hi));
        }
    }
}

// (4) The tile into shared memory as [channel][pixel]: element 4 nb + 2h + j of the
// accumulators is (pixel 16 warp + quad_row + 8h, channel 8 nb + 2 quad_col + j). The half
// types' values are what torch's conv2d gives in T, sign * rounded(rounded(conv) + bias)
// (element.cuh's plus_bias; rounding to nearest commutes with the sign), finished a channel
// pair an instruction (element.cuh's plus_bias_pair, as P31's store). Their products are in
// acc_big alone (tile_products_16; acc_cross is not read). (The value-at-a-time form, two
// roundings in integer instructions, was a third of the kernel's instructions: docs/notes.md.)
template <class T, int kAcc>
__device__ __forceinline__ void stage_tile(WarpgroupSmem& my, const float (&acc_big)[kAcc],
                                           const float (&acc_cross)[kAcc], const V3Thread& t,
                                           const uint32_t* bias_pairs) {
    float* at = my.staged + 2 * t.quad_col * kTilePitch + 16 * t.warp + t.quad_row;
#pragma unroll
    for (int i = 0; i < kAcc; i += 2) {
        const int to_co = 8 * (i / 4) + 2 * t.quad_col;  // channels to_co, to_co + 1
        float* to = at + 8 * (i / 4) * kTilePitch + 8 * ((i / 2) % 2);
        if constexpr (is_half_type<T>()) {
            using Ops = PairOf<T>;
            const float2 v = Ops::widened(plus_bias_pair<T>(
                acc_big[i], acc_big[i + 1],
                reinterpret_cast<const typename Ops::type*>(bias_pairs)[to_co / 2]));
            to[0] = v.x;
            to[kTilePitch] = v.y;
        } else {
            to[0] = acc_big[i] + acc_cross[i];
            to[kTilePitch] = acc_big[i + 1] + acc_cross[i + 1];
        }
    }
}

// (5) Per (channel, window) pair: the window's extreme, and the channel's moments over the
// tile (its 4 windows' lanes sum together, two passes). The staged values are sign * x
// without the bias (the bias moves neither the extremes' order nor the spread): extreme =
// sign * max + bias and mean = sign * mean' + bias, one rounding each, as if the bias had
// been added first. kWhole: a whole tile (all but the last band and column block), with no
// masks and no division; the caller's branch is uniform across the warpgroup, so the
// shuffles inside see every lane. Groups of 1 to 8 channels (group_shift >= 0) are merged
// here by shuffles and written to the tile's statistics; other groups leave each channel's
// moments in my.ch_* for merge_channels_in_order.
// (Moments went per window once, and Chan merges joined the 4 windows: more instructions
// for no accuracy gain, the centring being exact either way.)
template <bool kWhole, class T>
__device__ __forceinline__ void window_pairs(WarpgroupSmem& my, const V3WindowPairs& pairs,
                                             const V3TilePlace& at, const Params<T>& p, int cout,
                                             float* tile_group_stats, int tiles_per_image,
                                             int group_shift) {
    const int w = pairs.window;
#pragma unroll
    for (int j = 0; j < V3WindowPairs::kPerThread; ++j) {
        const int co = pairs.channel(j);
        float v[kPool][kPool];
#pragma unroll
        for (int r = 0; r < kPool; ++r) {
            const float4 row4 = *reinterpret_cast<const float4*>(
                my.staged + co * kTilePitch + r * kWideBandCols + kPool * w);
            v[r][0] = row4.x, v[r][1] = row4.y, v[r][2] = row4.z, v[r][3] = row4.w;
        }
        // Pooling windows lie whole inside the conv output, so an extreme is over all 16
        // values (the edge tiles' partial windows are not stored). A plain fmaxf drops NaN,
        // which is harmless here: a NaN (or an Inf) conv value makes its group's mean or
        // variance NaN, and so every output of the group, as in torch.
        float row_max[kPool];
#pragma unroll
        for (int r = 0; r < kPool; ++r)
            row_max[r] = fmaxf(fmaxf(v[r][0], v[r][1]), fmaxf(v[r][2], v[r][3]));
        const float extreme = fmaxf(fmaxf(row_max[0], row_max[1]), fmaxf(row_max[2], row_max[3]));
        const int wc = kWideTileWindows * at.col_block + w;
        if (co < cout && at.band < p.pool_h && wc < p.pool_w)
            p.extremes[((static_cast<long long>(at.n) * cout + co) * p.pool_h + at.band) *
                           p.pool_w + wc] = fmaf(pairs.sign[j], extreme, pairs.bias[j]);
        // The channel's moments over the tile, in two passes over the registers of its 4
        // windows' lanes (xor 8, 16): the sum, then the squares centred on the mean. (Both
        // sums reach the 4 lanes in the same order: identical moments in each.)
        const int cols = kWhole ? kPool : max(0, min(kPool, at.cols_here - kPool * w));
        auto in_window = [&](int r, int c) { return kWhole || (r < at.rows_here && c < cols); };
        auto sum_over_windows = [](float x) {  // lanes xor 8, 16
            return warp_xor_reduce<8, 8 * kWideTileWindows>(x, Sum{});
        };
        float row_sum[kPool];
#pragma unroll
        for (int r = 0; r < kPool; ++r) {
            row_sum[r] = in_window(r, 0) ? v[r][0] : 0.0f;
#pragma unroll
            for (int c = 1; c < kPool; ++c) row_sum[r] += in_window(r, c) ? v[r][c] : 0.0f;
        }
        const float sum = sum_over_windows((row_sum[0] + row_sum[1]) + (row_sum[2] + row_sum[3]));
        Moments m;
        m.count = kWhole ? kPool * kWideBandCols : static_cast<float>(at.rows_here * at.cols_here);
        m.mean = kWhole ? sum * (1.0f / (kPool * kWideBandCols)) : sum / m.count;
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
        m.mean = fmaf(pairs.sign[j], m.mean, pairs.bias[j]);  // channel co's moments
        if (group_shift >= 0) {
            // The channels of a tile have equal counts: shares of 1/2 exactly.
#pragma unroll
            for (int d = 1; d < 8; d *= 2)
                if (d < (1 << group_shift)) m = merged<true>(m, shfl_xor(m, d));
            const int group = co >> group_shift;
            if (w == 0 && co == group << group_shift && co < cout) {
                float* out = tile_group_stats + 2 * group * tiles_per_image;
                out[0] = m.mean;
                out[1] = m.m2;
            }
        } else if (w == 0) {
            my.ch_count[co] = m.count;
            my.ch_mean[co] = m.mean;
            my.ch_m2[co] = m.m2;
        }
    }
}

// (6) Groups that do not lie in one pair's lanes: their channels' moments merged in order,
// one group a thread (after the warpgroup's barrier that publishes my.ch_*).
__device__ __forceinline__ void merge_channels_in_order(const WarpgroupSmem& my, int groups,
                                                        int cout, float* tile_group_stats,
                                                        int tiles_per_image, int wtid) {
    if (wtid >= groups) return;
    const int cpg = cout / groups;
    Moments m{0.0f, 0.0f, 0.0f};
    for (int co = wtid * cpg; co < (wtid + 1) * cpg; ++co)
        m = merged(m, Moments{my.ch_count[co], my.ch_mean[co], my.ch_m2[co]});
    float* out = tile_group_stats + 2 * wtid * tiles_per_image;
    out[0] = m.mean;
    out[1] = m.m2;
}

}  // namespace conv_gn_pool
}  // namespace scratchops
