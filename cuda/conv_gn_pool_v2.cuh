// conv_gn_pool_v2.cuh — P85's one pass, v2 (see conv_gn_pool.cuh): the implicit-GEMM
// convolution on either tensor-core engine, with this epilogue in place of a store.
#pragma once

#include "conv_gn_pool.cuh"

namespace scratchops {
namespace conv_gn_pool {

template <class T>
struct StatsAndExtremes {
    Params<T> p;
    ConvGeometryFast f;
    BandPixels bands;

    // Per thread, once: its 16 channels 8 nb + 2t + j (element 2 nb + j) bias and sign, and the
    // sign of the channel it combines across rows (thread 32 w + lane: channel lane % 64).
    struct Prepared {
        float bias[kBN / 4], sign[kBN / 4];
        float combine_sign;
    };
    __device__ Prepared prepare(const TileCoords& tc) const {
        Prepared prep;
        const int t = tc.lane % 4;
#pragma unroll
        for (int i = 0; i < kBN / 4; ++i) {
            const int co = 8 * (i / 2) + 2 * t + i % 2;
            prep.bias[i] = value_or(p.conv_bias, co, co < f.cout, 0.0f);
            prep.sign[i] = extreme_sign(p, f.cout, co);
        }
        prep.combine_sign =
            extreme_sign(p, f.cout, (32 * (4 * tc.warpgroup + tc.warp) + tc.lane) % kBN);
        return prep;
    }

    template <int BN, int MB>
    __device__ void store(const float (&acc)[MB][BN / 2], const TileCoords& tc,
                          const Prepared& prep) const {
        static_assert(BN == kBN && MB == kMB, "one tile shape");
        __shared__ float partial[8][kBN];  // per consumer warp and channel
        __shared__ float group_mean[kBN];
        __shared__ float extreme[kPool][kWindowsPerTile][kBN];  // [band row][window][channel]
        const int t = tc.lane % 4, g = tc.lane / 4;
        const int cwarp = 4 * tc.warpgroup + tc.warp;  // 0..7
        const int cthread = 32 * cwarp + tc.lane;      // 0..255
        int n, band, col_block;
        bands.tile(tc.m0 / kTileRows, n, band, col_block);
        // This warp's band row and this thread's two columns (h = 0, 1).
        const int row = 2 * tc.warpgroup + tc.warp / 2;
        const int oh = kPool * band + row;
        bool valid[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int ow = kBandCols * col_block + 16 * (tc.warp % 2) + g + 8 * h;
            valid[h] = oh < f.g.out_h && ow < f.g.out_w;
        }
        // The conv values: element 4 nb + 2h + j is (column h, channel 8 nb + 2t + j).
        float v[BN / 2];
#pragma unroll
        for (int i = 0; i < BN / 2; ++i)  // (rounded as torch's conv2d rounds it: element.cuh)
            v[i] = rounded<T>(plus_bias<T>(acc[0][i], prep.bias[2 * (i / 4) + i % 2]));
        const int cpg = f.cout / p.groups;
        const int rows_here = min(kPool, f.g.out_h - kPool * band);
        const int cols_here = min(kBandCols, f.g.out_w - kBandCols * col_block);
        const float count = static_cast<float>(rows_here * cols_here * cpg);

        // Per-channel sums over this tile's valid pixels: a thread's 2 columns, then its warp's
        // 8 lanes g (xor 4, 8, 16), then the 8 warps in a fixed order.
        auto channel_sums_to_partial = [&](auto term) {
#pragma unroll
            for (int nb = 0; nb < BN / 8; ++nb)
#pragma unroll
                for (int j = 0; j < 2; ++j) {
                    const int co = 8 * nb + 2 * t + j;
                    const float s = warp_xor_reduce<4, 32>(
                        (valid[0] ? term(v[4 * nb + j], co) : 0.0f) +
                            (valid[1] ? term(v[4 * nb + 2 + j], co) : 0.0f),
                        Sum{});
                    if (g == 0) partial[cwarp][co] = s;
                }
        };
        auto group_total = [&](int group) {
            float s = 0.0f;
            for (int co = group * cpg; co < (group + 1) * cpg; ++co)
#pragma unroll
                for (int w = 0; w < 8; ++w) s += partial[w][co];
            return s;
        };

        channel_sums_to_partial([](float x, int) { return x; });
        consumers_sync();
        if (cthread < p.groups) group_mean[cthread] = group_total(cthread) / count;
        consumers_sync();
        channel_sums_to_partial([&](float x, int co) {
            const float d = x - group_mean[co / cpg];
            return d * d;
        });
        consumers_sync();
        if (cthread < p.groups) {
            float* out = stats_at(p.tile_stats, bands, p.groups, n, cthread,
                                  tc.m0 / kTileRows - n * bands.tiles_per_image);
            out[0] = group_mean[cthread];
            out[1] = group_total(cthread);
        }

        // Window extremes: over a window's 4 columns, lanes g, g ^ 1, g ^ 2, g ^ 3 (xor 4, 8);
        // then over its 4 rows, which are 4 warps, through shared memory.
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) {
            const float e = warp_xor_reduce<4, 16>(prep.sign[2 * (i / 4) + i % 2] * v[i],
                                                   NanMax{});
            const int nb = i / 4, h = (i / 2) % 2, j = i % 2;
            if (g % 4 == 0)
                extreme[row][4 * (tc.warp % 2) + 2 * h + g / 4][8 * nb + 2 * t + j] = e;
        }
        consumers_sync();
        for (int i = cthread; i < kWindowsPerTile * kBN;
             i += kWarpgroupThreads * tf32x3::kConsumerWarpgroups) {
            const int w = i / kBN, co = i % kBN;  // co = cthread % kBN: prep.combine_sign's
            const int wc = kWindowsPerTile * col_block + w;
            if (co >= f.cout || band >= p.pool_h || wc >= p.pool_w) continue;
            float e = extreme[0][w][co];
#pragma unroll
            for (int r = 1; r < kPool; ++r) e = nan_max(e, extreme[r][w][co]);
            p.extremes[((static_cast<long long>(n) * f.cout + co) * p.pool_h + band) * p.pool_w +
                       wc] = prep.combine_sign * e;
        }
        consumers_sync();  // the shared arrays are free for the next tile
    }
};

// One block per (sample n, group), blockIdx = (n, group): merge the tiles' statistics, then
// write the group's channels' pooled, normalised, scaled and clamped outputs. Its blocks are
// short and many run at once, so the instructions they issue count (docs/notes.md): no
// integer division (FastDiv, a 2-D grid), one shared load of a channel's parameters.
}  // namespace conv_gn_pool
}  // namespace scratchops
