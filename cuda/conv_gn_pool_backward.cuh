// conv_gn_pool_backward.cuh — P85's backward by recomputation, the fused kernel (see
// conv_gn_pool_backward.cu for the derivation and the kernel that runs before it).
//
// What it does, per tile of the input: the convolution output y of a region around the tile
// is computed again (never read from memory: the forward never wrote it), the dense gradient
// dy = k_ds * ds - k1 - xhat * k2 formed from it in shared memory (ds: a window's routed
// gradient at the element the window's maximum comes from, found again from y), and dy goes
// straight into the weight gradient (dW += dy x im2col(x), per-block partial sums), the conv
// bias gradient (sums of dy) and the input gradient (dx = dy convolved with the flipped
// weights). Neither y nor dy reaches global memory.
//
// The tile, its region and the shared arrays: conv_gn_pool_backward_tile.cuh. Per tile the
// kernel runs the phases below, (1) to (4), between barriers; the next tile's copies (0)
// start after (3) and land during (4).
#pragma once

#include "conv_gn_pool_backward_tile.cuh"

namespace scratchops {
namespace conv_gn_pool_backward {

// (1) y over the region: a task is 4 channels x 9 neighbouring columns of one region row
// (16 quads x 4 runs x 12 rows = 768 tasks; 2 channels a task read twice the shared memory a
// product, the kernel's limit). A warp's lanes: 4 runs x 2 rows x 4 quads, so that a float4 of
// weights serves 8 lanes (ncu: 2 wavefronts a load, where 16 quads x 2 runs took 4) and the
// 8 lanes' inputs fall in 8 banks (runs 9 floats apart, rows kXCols: 38 or 40). y = bias + the sum
// over (ci, i, j) of w * x, added in that order with one rounding a product (fmaf), as
// conv_gn_pool v1 adds them.
template <class T, int kMaxK, bool kFull>
__device__ void compute_y(const FusedArgs<T>& a, const TileView<kMaxK>& v) {
    using S = Smem<kMaxK>;
    const Extent e = extent_of<kMaxK, kFull>(a);
    static_assert(kRegionRows % 2 == 0, "tasks pair the region's rows");
    for (int task = threadIdx.x; task < kQuads * 4 * kRegionRows; task += blockDim.x) {
        const int run = task % 4, quad = task / 8 % kQuads;
        const int row = task / (8 * kQuads) * 2 + task / 4 % 2;
        float acc[4][9];
#pragma unroll
        for (int q = 0; q < 4; ++q)
#pragma unroll
            for (int m = 0; m < 9; ++m) acc[q][m] = 0.0f;
        for (int ci = 0; ci < e.cin; ++ci) {
#pragma unroll
            for (int i = 0; i < kMaxK; ++i) {
                if (i >= e.kh) break;
                float xr[9 + kMaxK - 1];
                const float* src = v.xs + ci * S::kXPlane + (row + i) * S::kXCols + 9 * run;
#pragma unroll
                for (int m = 0; m < 9 + kMaxK - 1; ++m) xr[m] = src[m];
#pragma unroll
                for (int j = 0; j < kMaxK; ++j) {
                    if (j >= e.kw) break;
                    const float4 w = v.weights(ci, i * kMaxK + j, quad);
#pragma unroll
                    for (int m = 0; m < 9; ++m) {
                        acc[0][m] = fmaf(w.x, xr[m + j], acc[0][m]);
                        acc[1][m] = fmaf(w.y, xr[m + j], acc[1][m]);
                        acc[2][m] = fmaf(w.z, xr[m + j], acc[2][m]);
                        acc[3][m] = fmaf(w.w, xr[m + j], acc[3][m]);
                    }
                }
            }
        }
        const float4 b = reinterpret_cast<const float4*>(v.bias)[quad];
        // Rounded as torch's conv2d rounds it; in 16 bits a channel pair an instruction
        // (element.cuh's plus_bias_pair).
        if constexpr (is_half_type<T>()) {
            using Ops = PairOf<T>;
            const auto b01 = Ops::rounded_pair(b.x, b.y), b23 = Ops::rounded_pair(b.z, b.w);
#pragma unroll
            for (int m = 0; m < 9; ++m) {
                const float2 y01 = Ops::widened(plus_bias_pair<T>(acc[0][m], acc[1][m], b01));
                const float2 y23 = Ops::widened(plus_bias_pair<T>(acc[2][m], acc[3][m], b23));
                reinterpret_cast<float4*>(v.at(row, 9 * run + m))[quad] =
                    float4{y01.x, y01.y, y23.x, y23.y};
            }
        } else {
#pragma unroll
            for (int m = 0; m < 9; ++m)
                reinterpret_cast<float4*>(v.at(row, 9 * run + m))[quad] =
                    float4{acc[0][m] + b.x, acc[1][m] + b.y, acc[2][m] + b.z, acc[3][m] + b.w};
        }
    }
}

// (2) dy in place of y, a (channel, region window) a task, lanes on consecutive channels. In
// a pooling window the routed gradient goes where torch's max_pool2d records the maximum of
// group_norm(y) * scale (pool_clamp_backward.cu's rule: the first greater value in row-major
// order, or the last NaN); every position of the conv output also gets group norm's
// -k1 - xhat * k2; positions outside it get 0. The sums of each owned window's dy, for the
// conv bias's gradient. The channel's constants and the window's 16 values are read once into
// registers (the compiler cannot keep them there itself: y is written through a pointer into
// the same shared memory).
template <class T, int kMaxK>
__device__ void form_dy(const FusedArgs<T>& a, const TileView<kMaxK>& v) {
    for (int task = threadIdx.x; task < kMaxChannels * kRegionWindows; task += blockDim.x) {
        const int c = task % kMaxChannels, w = task / kMaxChannels;
        const int wr = w / kRegionWindowCols, wc = w % kRegionWindowCols;
        float k[kCoefs];
#pragma unroll
        for (int i = 0; i < kCoefs; ++i) k[i] = v.coef[i * kMaxChannels + c];
        const int pool_row = v.r0 / kPool - 1 + wr, pool_col = v.c0 / kPool - 1 + wc;
        const bool pooled =
            pool_row >= 0 && pool_row < a.pool_h && pool_col >= 0 && pool_col < a.pool_w;
        float* base = v.at(kPool * wr, kPool * wc) + c;
        float y[kPool * kPool];  // y[e]: the window's element e, row-major
#pragma unroll
        for (int e = 0; e < kPool * kPool; ++e)
            y[e] = base[((e / kPool) * kRegionPitch + e % kPool) * kVec];
        int chosen = -1;
        if (pooled) {
            float best = -INFINITY;
            chosen = 0;
#pragma unroll
            for (int e = 0; e < kPool * kPool; e += 2) {
                const float2 s = normed_scaled_rounded_pair<T>(
                    y[e], y[e + 1], k[kMean], k[kRstd], k[kGamma], k[kBeta], k[kScale]);
                if (s.x > best || s.x != s.x) {
                    best = s.x;
                    chosen = e;
                }
                if (s.y > best || s.y != s.y) {
                    best = s.y;
                    chosen = e + 1;
                }
            }
        }
        const float ds = v.routed[c * kRegionWindows + w];
        float sum = 0.0f;
#pragma unroll
        for (int e = 0; e < kPool * kPool; ++e) {
            const int row = v.region_r + kPool * wr + e / kPool;
            const int col = v.region_c + kPool * wc + e % kPool;
            const float xhat = (y[e] - k[kMean]) * k[kRstd];
            const float d =
                (e == chosen ? k[kDsFactor] * ds : 0.0f) - k[kConstant] - xhat * k[kXhatFactor];
            const bool real = row >= 0 && row < a.out_h && col >= 0 && col < a.out_w && c < a.cout;
            base[((e / kPool) * kRegionPitch + e % kPool) * kVec] = real ? d : 0.0f;
            sum += real ? d : 0.0f;
        }
        if (wr >= 1 && wc >= 1)  // a window the tile owns
            v.window_sums[((wr - 1) * (kOwnCols / kPool) + wc - 1) * kMaxChannels + c] = sum;
    }
}

// (3) The weight gradient: thread (ci, quad, split) adds dy[4 quad + q][p] * x[ci][p + tap]
// over the owned positions p of its split of the rows (weight_splits of them), 8 columns at a
// time. A warp's lanes: 8 input channels x 4 quads, so that each quarter-warp reads one
// float4 of dy (two quarters a wavefront, see (4)) and the 8 channels' inputs fall in
// different banks (planes 4 mod 32 apart).
struct WeightGradThread {
    int ci = threadIdx.x % kMaxInputChannels, quad = threadIdx.x / kMaxInputChannels % kQuads;
    int split = threadIdx.x / (kMaxInputChannels * kQuads);
};
template <class T, int kMaxK, bool kFull>
__device__ void add_weight_grad(const FusedArgs<T>& a, const TileView<kMaxK>& v,
                                float (&dw)[4][kMaxK * kMaxK]) {
    using S = Smem<kMaxK>;
    const Extent e = extent_of<kMaxK, kFull>(a);
    constexpr int kRowsEach = kOwnRows / weight_splits(kMaxK);
    const WeightGradThread me;
    const int quad = me.quad, ci = me.ci, split = me.split;
    if (ci >= e.cin) return;
    for (int rr = 0; rr < kRowsEach; ++rr) {
        const int row = kPool + kRowsEach * split + rr;  // region row
#pragma unroll 2
        for (int run = 0; run < kOwnCols / 8; ++run) {
            float4 d[8];
#pragma unroll
            for (int m = 0; m < 8; ++m)
                d[m] = reinterpret_cast<const float4*>(v.at(row, kPool + 8 * run + m))[quad];
#pragma unroll
            for (int i = 0; i < kMaxK; ++i) {
                if (i >= e.kh) break;
                float xr[8 + kMaxK - 1];
                const float* src = v.xs + ci * S::kXPlane + (row + i) * S::kXCols + kPool + 8 * run;
#pragma unroll
                for (int m = 0; m < 8 + kMaxK - 1; ++m) xr[m] = src[m];
#pragma unroll
                for (int j = 0; j < kMaxK; ++j) {
                    if (j >= e.kw) break;
#pragma unroll
                    for (int m = 0; m < 8; ++m) {
                        dw[0][i * kMaxK + j] = fmaf(d[m].x, xr[m + j], dw[0][i * kMaxK + j]);
                        dw[1][i * kMaxK + j] = fmaf(d[m].y, xr[m + j], dw[1][i * kMaxK + j]);
                        dw[2][i * kMaxK + j] = fmaf(d[m].z, xr[m + j], dw[2][i * kMaxK + j]);
                        dw[3][i * kMaxK + j] = fmaf(d[m].w, xr[m + j], dw[3][i * kMaxK + j]);
                    }
                }
            }
        }
    }
}

// (4) The input gradient: dx[ci][r0 + row][c0 + col + m] = the sum over (c, i, j) of
// dy[kPool + row - i][kPool + col + m - j][c] * w[c][ci][i][j] (region coordinates).
// A thread takes 2 input channels x kInputPixels neighbouring columns of one row, over a
// quarter of the channel quads (quads split, split + 4, ...); the four quarters' sums meet by
// shuffles. Per loaded float4 of dy that is 8 products a column, where one input channel a
// thread made 4. The lanes follow how a 16-byte shared load is served (ncu, H200): a
// quarter-warp (8 lanes) a wavefront, or two quarters in one where each reads one address.
// So a quarter is the 8 rows of one quarter of the quads (lane = row + 8 split): dy's 8
// float4s sit 37 x 68 floats = 20 banks apart, 8 disjoint groups of 4 banks, one wavefront;
// the weights are one address a quarter, 4 in all, two wavefronts. The warp index picks the
// channel pair and the columns.
constexpr int kInputPixels = 8, kInputSplit = 4;
template <class T, int kMaxK, bool kFull>
__device__ void input_grad(const FusedArgs<T>& a, const TileView<kMaxK>& v) {
    const Extent e = extent_of<kMaxK, kFull>(a);
    constexpr int kPairs = kMaxInputChannels / 2;
    constexpr int kGroups = kPairs * (kOwnCols / kInputPixels);  // (channel pair, columns)
    constexpr int kWarps = fused_threads(kMaxK) / 32;
    static_assert(kOwnRows * kInputSplit == 32 && kQuads % kInputSplit == 0,
                  "the lanes: a tile's rows x the quarters of the quads");
    static_assert(kGroups % kWarps == 0, "the groups (channel pair, columns) share the warps");
    const int lane = threadIdx.x % 32;
    const int row = lane % kOwnRows, split = lane / kOwnRows;
    for (int group = threadIdx.x / 32; group < kGroups; group += kWarps) {
        const int ci0 = 2 * (group % kPairs), col = group / kPairs * kInputPixels;
        if (ci0 >= e.cin) continue;  // (the whole warp: no lane is left out of the shuffles)
        float acc[2][kInputPixels];
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int m = 0; m < kInputPixels; ++m) acc[h][m] = 0.0f;
#pragma unroll 1
        for (int quad = split; quad < kQuads; quad += kInputSplit) {
#pragma unroll
            for (int i = 0; i < kMaxK; ++i) {
                if (i >= e.kh) break;
                float4 w[kMaxK][2];
#pragma unroll
                for (int j = 0; j < kMaxK; ++j)
#pragma unroll
                    for (int h = 0; h < 2; ++h) w[j][h] = v.weights(ci0 + h, i * kMaxK + j, quad);
                // position p: dy at region column kPool + col - (kMaxK - 1) + p, which column
                // m = p - (kMaxK - 1 - j) takes through tap j
                const float* src = v.at(row + kPool - i, col + kPool - (kMaxK - 1));
#pragma unroll
                for (int p = 0; p < kInputPixels + kMaxK - 1; ++p) {
                    const float4 g = reinterpret_cast<const float4*>(src + p * kVec)[quad];
#pragma unroll
                    for (int j = 0; j < kMaxK; ++j) {
                        const int m = p - (kMaxK - 1 - j);
                        if (m < 0 || m >= kInputPixels || j >= e.kw) continue;
#pragma unroll
                        for (int h = 0; h < 2; ++h) {
                            acc[h][m] = fmaf(g.x, w[j][h].x, acc[h][m]);
                            acc[h][m] = fmaf(g.y, w[j][h].y, acc[h][m]);
                            acc[h][m] = fmaf(g.z, w[j][h].z, acc[h][m]);
                            acc[h][m] = fmaf(g.w, w[j][h].w, acc[h][m]);
                        }
                    }
                }
            }
        }
        // The quarters' sums: (s0 + s1) + (s2 + s3) in every lane of the four (lanes 8 and
        // 16 apart; the adds commute, so each lane holds the same bits); the 8 lanes of
        // quarter `split` then store their rows' columns 2 split and 2 split + 1.
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int m = 0; m < kInputPixels; ++m) {
                acc[h][m] += __shfl_xor_sync(0xffffffffu, acc[h][m], kOwnRows);
                acc[h][m] += __shfl_xor_sync(0xffffffffu, acc[h][m], 2 * kOwnRows);
            }
        const int out_row = v.r0 + row;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            if (ci0 + h >= e.cin || out_row >= a.height) continue;
            T* out = a.dx + v.image +
                     (static_cast<long long>(ci0 + h) * a.height + out_row) * a.width;
#pragma unroll
            for (int m = 0; m < kInputPixels; ++m)
                if (m / 2 == split && v.c0 + col + m < a.width)
                    out[v.c0 + col + m] = from_float<T>(acc[h][m]);
        }
    }
}

template <class T, int kMaxK, bool kFull>
__global__ void __launch_bounds__(fused_threads(kMaxK), 1) fused_backward_kernel(FusedArgs<T> a) {
    extern __shared__ __align__(16) float smem[];
    TileView<kMaxK> v(smem);
    load_weights(a, v);
    // The block's sums: dW[4 quad + q][ci][tap] of add_weight_grad's thread, and the conv
    // bias gradient of channel threadIdx.x.
    float dw[4][kMaxK * kMaxK];
#pragma unroll
    for (int q = 0; q < 4; ++q)
#pragma unroll
        for (int t = 0; t < kMaxK * kMaxK; ++t) dw[q][t] = 0.0f;
    float dbias = 0.0f;
    // Per tile: [its copies landed] y | dy | weight and bias gradients [next copies start]
    // input gradient. Each barrier frees what the phase before it read: dy for the next y,
    // y for dy, the input, routed values and constants for the next tile's copies.
    const uint64_t policy = l2_evict_first();
    if (blockIdx.x < a.tiles) {
        v.place(blockIdx.x, a);
        load_tile<T, kMaxK, kFull>(a, v, policy);
    }
    for (int tile = blockIdx.x; tile < a.tiles; tile += gridDim.x) {
        cp_async_wait_all();
        widen_tile<T, kMaxK, kFull>(a, v);
        __syncthreads();  // the tile's copies have landed; the previous dy's readers are done
        compute_y<T, kMaxK, kFull>(a, v);
        __syncthreads();
        form_dy(a, v);
        __syncthreads();
        if (threadIdx.x < kMaxChannels)
            for (int w = 0; w < kOwnWindows; ++w)
                dbias += v.window_sums[w * kMaxChannels + threadIdx.x];
        add_weight_grad<T, kMaxK, kFull>(a, v, dw);
        __syncthreads();  // the input, routed values and constants are free
        if (tile + gridDim.x < a.tiles) {
            TileView<kMaxK> next = v;
            next.place(tile + gridDim.x, a);
            load_tile<T, kMaxK, kFull>(a, next, policy);
        }
        input_grad<T, kMaxK, kFull>(a, v);
        v.place(tile + gridDim.x, a);
    }

    // The block's partial sums, for the ordered sum over blocks (batch_sum_launch).
    const WeightGradThread me;
    const int quad = me.quad, ci = me.ci;
    if (ci < a.cin) {
        float* out = a.weight_partials +
                     (static_cast<long long>(blockIdx.x) * weight_splits(kMaxK) + me.split) *
                         a.cout * a.cin * a.kh * a.kw;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int c = 4 * quad + q;
#pragma unroll
            for (int t = 0; t < kMaxK * kMaxK; ++t)
                if (c < a.cout && t / kMaxK < a.kh && t % kMaxK < a.kw)
                    out[((c * a.cin + ci) * a.kh + t / kMaxK) * a.kw + t % kMaxK] = dw[q][t];
        }
    }
    if (threadIdx.x < a.cout)
        a.bias_partials[static_cast<long long>(blockIdx.x) * a.cout + threadIdx.x] = dbias;
}

}  // namespace conv_gn_pool_backward
}  // namespace scratchops
