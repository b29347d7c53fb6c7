// conv_gn_pool_v1.cuh — P85's one pass, v1 (see conv_gn_pool.cuh): the idea on the CUDA
// cores, for any GPU, in one kernel a learner can read at a sitting; the finalize kernel
// (conv_gn_pool_finalize.cuh) then maps the extremes.
//
// One block per tile: kPool conv output rows x kWideBandCols columns of one sample, every
// output channel. Thread t = kWindows * co + w owns channel co and the tile's pooling window w
// (4 x 4 conv outputs, columns kPool * w ..): the 64 channels x 4 windows of a tile are the
// block's 256 threads, and a channel's 4 windows are 4 neighbouring lanes of one warp.
// Each thread:
//   (1) computes its 16 conv outputs by a direct convolution (every tap of every input
//       channel: the input from global memory, where the L1 cache serves the neighbours'
//       overlapping reads; weight and bias added in fp32, as torch's direct algorithm);
//   (2) writes its window's max, or its min where gamma * scale < 0 (the derivation at the
//       top of conv_gn_pool.cuh), when the window is one of the pooling output's;
//   (3) keeps the count, mean and centred sum of squares of its outputs inside the conv
//       output (the tile's bottom and right edges can be partial), merged over the channel's
//       4 lanes (Chan, shuffles), then over the group's channels in order, into the tile's
//       statistics for the finalize.
// TF32 allowed (the operator's rule): both operands rounded to TF32 before each fp32
// product, as a TF32 convolution computes.
#pragma once

#include "conv_gn_pool.cuh"

namespace scratchops {
namespace conv_gn_pool {

constexpr int kV1Threads = kWideTilePairs;  // one per (channel, pooling window)

template <bool kTf32>
__device__ __forceinline__ float operand(float v) {
    return kTf32 ? __uint_as_float(tf32_nearest(v)) : v;
}

template <bool kTf32, class T>
__global__ void __launch_bounds__(kV1Threads)
    conv_gn_pool_v1_kernel(const T* __restrict__ x, const T* __restrict__ weight,
                           Params<T> p, Conv2dGeometry g, int cout, BandPixels bands) {
    const int tile = blockIdx.x;
    int n, band, col_block;
    bands.tile(tile, n, band, col_block);
    const int co = threadIdx.x / kWideTileWindows, w = threadIdx.x % kWideTileWindows;
    const int oh0 = kPool * band, ow0 = kWideBandCols * col_block + kPool * w;
    // The outputs of this window inside the conv output: rows x cols of the 4 x 4.
    const int rows = min(kPool, g.out_h - oh0), cols = max(0, min(kPool, g.out_w - ow0));

    // (1) v[i][j] = conv output (co, oh0 + i, ow0 + j), bias included.
    float v[kPool][kPool];
    const float bias = value_or(p.conv_bias, co, co < cout, 0.0f);
#pragma unroll
    for (int i = 0; i < kPool; ++i)
#pragma unroll
        for (int j = 0; j < kPool; ++j) v[i][j] = 0.0f;
    if (co < cout) {
        const long long plane = static_cast<long long>(g.height) * g.width;
        for (int ci = 0; ci < g.channels; ++ci) {
            const T* in = x + (static_cast<long long>(n) * g.channels + ci) * plane;
            for (int r = 0; r < g.kernel_h; ++r)
                for (int s = 0; s < g.kernel_w; ++s) {
                    const float wv = operand<kTf32>(
                        to_float(weight[((co * g.channels + ci) * g.kernel_h + r) * g.kernel_w + s]));
#pragma unroll
                    for (int i = 0; i < kPool; ++i) {
                        const int ih = (oh0 + i) * g.stride_h - g.pad_h + r * g.dil_h;
#pragma unroll
                        for (int j = 0; j < kPool; ++j) {
                            const int iw = (ow0 + j) * g.stride_w - g.pad_w + s * g.dil_w;
                            const bool inside = static_cast<unsigned>(ih) < unsigned(g.height) &&
                                                static_cast<unsigned>(iw) < unsigned(g.width);
                            if (inside && i < rows && j < cols)
                                v[i][j] = fmaf(wv, operand<kTf32>(to_float(in[ih * g.width + iw])), v[i][j]);
                        }
                    }
                }
        }
    }
#pragma unroll
    for (int i = 0; i < kPool; ++i)
#pragma unroll
        for (int j = 0; j < kPool; ++j)  // (rounded as torch's conv2d rounds it: element.cuh)
            v[i][j] = rounded<T>(plus_bias<T>(v[i][j], bias));

    // (2) The window's extreme: pooling windows lie whole inside the conv output.
    const int window_col = kWideTileWindows * col_block + w;
    if (co < cout && band < p.pool_h && window_col < p.pool_w) {
        const bool minimum = extreme_sign(p, cout, co) < 0.0f;
        float e = v[0][0];
#pragma unroll
        for (int i = 0; i < kPool; ++i)
#pragma unroll
            for (int j = 0; j < kPool; ++j) e = minimum ? nan_min(e, v[i][j]) : nan_max(e, v[i][j]);
        p.extremes[((static_cast<long long>(n) * cout + co) * p.pool_h + band) * p.pool_w +
                   window_col] = e;
    }

    // (3) Moments of the outputs inside the conv output: the sum, then the squares centred on
    // the mean (two passes over the registers), merged over the channel's 4 windows.
    Moments m{static_cast<float>(rows * cols), 0.0f, 0.0f};
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kPool; ++i)
#pragma unroll
        for (int j = 0; j < kPool; ++j) sum += i < rows && j < cols ? v[i][j] : 0.0f;
    m.mean = m.count > 0.0f ? sum / m.count : 0.0f;
#pragma unroll
    for (int i = 0; i < kPool; ++i)
#pragma unroll
        for (int j = 0; j < kPool; ++j) {
            const float d = v[i][j] - m.mean;
            m.m2 += i < rows && j < cols ? d * d : 0.0f;
        }
    // Lanes xor 1, 2: the channel's windows.
    m = warp_xor_reduce<1, kWideTileWindows>(m, Merge<>{});

    // The group's channels in order, by one thread a group.
    __shared__ Moments channel[kBN];
    if (w == 0) channel[co] = m;
    __syncthreads();
    const int group = threadIdx.x;
    if (group < p.groups) {
        const int cpg = cout / p.groups;
        Moments total{0.0f, 0.0f, 0.0f};
        for (int c = group * cpg; c < (group + 1) * cpg; ++c) total = merged(total, channel[c]);
        float* out = stats_at(p.tile_stats, bands, p.groups, n, group,
                              tile - n * bands.tiles_per_image);
        out[0] = total.mean;
        out[1] = total.m2;
    }
}

// v1's launch: one block a tile (at most 2^31 - 1 of them: the caller checks).
template <bool kTf32, class T>
cudaError_t launch_v1(const T* x, const T* weight, const Params<T>& p,
                      const Conv2dGeometry& g, int batch, int cout, const BandPixels& bands,
                      cudaStream_t stream) {
    const long long tiles = static_cast<long long>(batch) * bands.tiles_per_image;
    conv_gn_pool_v1_kernel<kTf32, T><<<static_cast<unsigned>(tiles), kV1Threads, 0, stream>>>(
        x, weight, p, g, cout, bands);
    return cudaGetLastError();
}

}  // namespace conv_gn_pool
}  // namespace scratchops
