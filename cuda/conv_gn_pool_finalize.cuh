// conv_gn_pool_finalize.cuh — P85's one pass, the second kernel of every version (see
// conv_gn_pool.cuh): the tiles' statistics merged per group, the window extremes mapped.
#pragma once

#include "conv_gn_pool.cuh"

namespace scratchops {
namespace conv_gn_pool {

constexpr int kFinalizeThreads = 256;

struct FinalizeShape {
    int channels_per_group, out_h, out_w, windows;  // windows = pool_h * pool_w
    FastDiv by_windows;                              // a window's channel: i / windows
};

template <class T>
__global__ void __launch_bounds__(kFinalizeThreads)
    finalize_kernel(const float* __restrict__ tile_stats, const float* __restrict__ extremes,
                    const T* __restrict__ gamma, const T* __restrict__ beta,
                    const T* __restrict__ scale, T* __restrict__ y,
                    float* __restrict__ kept_stats, int cout, int groups,
                    BandPixels bands, FinalizeShape shape, float eps, float lo, float hi) {
    const int n = blockIdx.x, group = blockIdx.y, cpg = shape.channels_per_group;
    // The group's channels' windows are contiguous (channel-major, [n][channel][window]): one
    // flat, coalesced sweep, in rounds of kLoadsInFlight loads a thread issues before using
    // any (two rounds at P85's size: 4 channels x 961 windows / 256 threads; 16 a round
    // would need 80 registers a thread, and fewer blocks would fit). The first round's loads
    // are issued here, so that they are in flight during the merge below.
    constexpr int kLoadsInFlight = 8;
    const int group_windows = cpg * shape.windows;
    const long long first = (static_cast<long long>(n) * cout + group * cpg) * shape.windows;
    float extreme[kLoadsInFlight];
    auto load_round = [&](int start) {
#pragma unroll
        for (int k = 0; k < kLoadsInFlight; ++k) {
            const int i = start + k * kFinalizeThreads;
            extreme[k] = i < group_windows ? extremes[first + i] : 0.0f;
        }
    };
    load_round(threadIdx.x);

    // The tiles' moments as sums about a shift K, the group's first tile's mean (the
    // shifted-data formulas: no division per merge, and K lies within the group's spread, so
    // the sums stay small on data with a large mean): each tile's c (mean - K) and
    // m2 + c (mean - K)^2, added by each thread over tiles tid, tid + T, ... in order, then
    // in a fixed tree (lanes xor 16 .. 1 within each warp, then across the warps alike).
    const float* group_stats = stats_at(tile_stats, bands, groups, n, group, 0);
    const float shift = group_stats[0];
    float count = 0.0f, sum = 0.0f, sum_sq = 0.0f;
    for (int tile = threadIdx.x; tile < bands.tiles_per_image; tile += kFinalizeThreads) {
        const int band = bands.by_col_blocks.div(tile), col_block = tile - band * bands.col_blocks;
        const float c = static_cast<float>(min(kPool, shape.out_h - kPool * band) *
                                           min(bands.cols, shape.out_w - bands.cols * col_block) *
                                           cpg);
        const float2 s = *reinterpret_cast<const float2*>(group_stats + 2 * tile);
        const float d = s.x - shift;
        count += c;
        sum += c * d;
        sum_sq += s.y + c * d * d;
    }
    // The group's channel parameters {gamma, beta, scale}, once, for the sweep below (one
    // 16-byte shared load a window there), published by the merge's __syncthreads.
    __shared__ float4 channel_params[kBN];  // cpg <= cout <= kBN
    for (int c = threadIdx.x; c < cpg; c += kFinalizeThreads) {
        const int co = group * cpg + c;
        channel_params[c] = make_float4(value_or(gamma, co, true, 1.0f),
                                        value_or(beta, co, true, 0.0f),
                                        value_or(scale, co, true, 1.0f), 0.0f);
    }
    constexpr int kWarps = kFinalizeThreads / 32;
    __shared__ float per_warp[3][kWarps];
    count = warp_xor_reduce<1, 32>(count, Sum{});
    sum = warp_xor_reduce<1, 32>(sum, Sum{});
    sum_sq = warp_xor_reduce<1, 32>(sum_sq, Sum{});
    if (threadIdx.x % 32 == 0) {
        per_warp[0][threadIdx.x / 32] = count;
        per_warp[1][threadIdx.x / 32] = sum;
        per_warp[2][threadIdx.x / 32] = sum_sq;
    }
    __syncthreads();
    const int lane = threadIdx.x % 32;
    count = lane < kWarps ? per_warp[0][lane] : 0.0f;
    sum = lane < kWarps ? per_warp[1][lane] : 0.0f;
    sum_sq = lane < kWarps ? per_warp[2][lane] : 0.0f;
    // Every warp alike: lane 0 of each holds the group's sums.
    count = warp_xor_reduce<1, kWarps>(count, Sum{});
    sum = warp_xor_reduce<1, kWarps>(sum, Sum{});
    sum_sq = warp_xor_reduce<1, kWarps>(sum_sq, Sum{});
    count = __shfl_sync(0xffffffffu, count, 0);
    sum = __shfl_sync(0xffffffffu, sum, 0);
    sum_sq = __shfl_sync(0xffffffffu, sum_sq, 0);
    const float offset = sum / count;
    const float group_mean = shift + offset;
    const float variance = fmaxf((sum_sq - sum * offset) / count, 0.0f);  // biased, as torch
    const float rstd = 1.0f / sqrtf(variance + eps);
    if (kept_stats != nullptr && threadIdx.x == 0) {  // {mean, 1/std}, kept for the backward
        kept_stats[2 * (n * groups + group)] = group_mean;
        kept_stats[2 * (n * groups + group) + 1] = rstd;
    }

    // Each window's extreme through its channel's affine map, then the clamp.
    for (int start = threadIdx.x; start < group_windows;
         start += kLoadsInFlight * kFinalizeThreads) {
        if (start != threadIdx.x) load_round(start);
#pragma unroll
        for (int k = 0; k < kLoadsInFlight; ++k) {
            const int i = start + k * kFinalizeThreads;
            if (i >= group_windows) break;
            const float4 gbs = channel_params[shape.by_windows.div(i)];
            // (The group norm's result rounded to T before the scale, as torch's group_norm
            // then * scale: element.cuh.)
            const float v = normed_scaled<T>(extreme[k], group_mean, rstd, gbs.x, gbs.y, gbs.z);
            y[first + i] = from_float<T>(nan_min(nan_max(v, lo), hi));
        }
    }
}

}  // namespace conv_gn_pool
}  // namespace scratchops
