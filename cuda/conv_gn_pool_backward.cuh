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
// A tile is kOwnRows x kOwnCols input pixels (rows r0.., cols c0.., r0 and c0 multiples of
// the pooling window). Its dx needs dy at rows r0 - (kh-1) .. r0 + kOwnRows - 1 (and columns
// alike); those above r0 belong to the pooling windows of the row above, whose maxima need
// all of those windows' y. So y is computed on the region of whole windows from r0 - kPool,
// c0 - kPool: kRegionRows x kRegionCols conv outputs (which covers kernels up to kPool + 1).
// The dy positions the tile owns (rows r0.., columns c0.., inside the conv output) are each
// owned by exactly one tile: the weight and bias gradients sum those only.
//
// Shared memory (floats):
//   dy      [region position][kVec]: y, then dy, of a position's 64 channels side by side (a
//           float4 holds 4 channels); a region row holds kRegionPitch positions and a position
//           kVec = 64 + 4 floats, so that neighbouring rows and neighbouring positions fall
//           in different banks for the 16-byte loads below;
//   x       [ci][row][col] of the input under the region, zero outside the image (plane
//           stride = 4 mod 32: the 8 input channels of a warp's lanes in different banks);
//   w       [ci][tap][c], the weights once per block (plane stride = 4 mod 32 likewise);
//   routed  [c][window of the region] the gradient each window routes, from the first kernel;
//   coefs   [c][kCoefs] the (sample, channel) constants of the first kernel.
// Threads: fused_threads below, one block an SM (170 or 206 KB of shared memory), a
// persistent grid whose block b takes tiles b, b + grid, ... and keeps its weight and bias
// gradient sums in registers until its last tile.
#pragma once

#include "common.cuh"

namespace scratchops {
namespace conv_gn_pool_backward {

constexpr int kPool = 4;                                   // P85's pooling window and stride
constexpr int kMaxChannels = 64, kMaxInputChannels = 8;    // what the fused kernel covers
constexpr int kOwnRows = 8, kOwnCols = 32;                 // a tile of input pixels
constexpr int kRegionRows = kOwnRows + kPool, kRegionCols = kOwnCols + kPool;
constexpr int kRegionPitch = kRegionCols + 1, kVec = kMaxChannels + 4;
constexpr int kRegionWindowRows = kRegionRows / kPool, kRegionWindowCols = kRegionCols / kPool;
constexpr int kRegionWindows = kRegionWindowRows * kRegionWindowCols;  // 3 x 9
constexpr int kOwnWindows = kOwnRows / kPool * (kOwnCols / kPool);        // 2 x 8
constexpr int kQuads = kMaxChannels / 4;                                  // float4s of channels
// The (sample, channel) constants the first kernel writes: the group's mean and 1/std, gamma,
// beta and scale (for the window maxima), dy = kDsFactor * ds - kConstant - xhat * kXhatFactor.
enum Coef { kMean, kRstd, kGamma, kBeta, kScale, kDsFactor, kConstant, kXhatFactor, kCoefs };
// The grid: a fixed number of blocks (not the GPU's multiprocessors), so that the weight
// gradient's partial sums, and so its bits, depend on the shape alone.
constexpr int kBlocks = 256;
// The fused kernel's threads: 512 (16 warps, 128 registers a thread) for kernels up to 3 x 3;
// 256 for those up to 5 x 5, whose weight-gradient sums (4 channels x 25 taps a thread) need
// more registers. One block fits an SM either way (its shared memory), so the block's warps
// are all the SM has to hide latency with (ncu: shared-memory loads stalled 8 warps most).
__host__ __device__ constexpr int fused_threads(int max_k) { return max_k <= 3 ? 512 : 256; }
// The weight gradient's row splits (add_weight_grad): a block's partial sums per split.
__host__ __device__ constexpr int weight_splits(int max_k) { return fused_threads(max_k) / 128; }

__host__ __device__ constexpr int round_to_bank4(int floats) { return (floats + 31) / 32 * 32 + 4; }
template <int kMaxK>
struct Smem {
    static constexpr int kXRows = kRegionRows + kMaxK - 1, kXCols = kRegionCols + kMaxK - 1;
    static constexpr int kXPlane = round_to_bank4(kXRows * kXCols);
    static constexpr int kWPlane = kMaxK * kMaxK * kMaxChannels + 4;
    static constexpr int kDy = kRegionRows * kRegionPitch * kVec, kX = kMaxInputChannels * kXPlane;
    static constexpr int kW = kMaxInputChannels * kWPlane, kRouted = kMaxChannels * kRegionWindows;
    static constexpr int kCoef = kMaxChannels * kCoefs, kSums = kMaxChannels * kOwnWindows;
    static constexpr int kBias = kMaxChannels;
    static constexpr int kFloats = kDy + kX + kW + kRouted + kCoef + kSums + kBias;
};

template <class T>
struct FusedArgs {
    const T* x;          // (N, Cin, H, W)
    const T* weight;     // (Cout, Cin, kh, kw)
    const T* conv_bias;  // (Cout) or nullptr
    const float* coefs;  // [n][c][kCoefs]
    const float* routed; // [n][c][pool_h][pool_w]
    T* dx;               // (N, Cin, H, W)
    float* weight_partials;  // [block][split][Cout][Cin][kh][kw]
    float* bias_partials;    // [block][Cout]
    int cin, cout, height, width, kh, kw, out_h, out_w, pool_h, pool_w;
    int bands, col_blocks, tiles;  // tiles = N * bands * col_blocks
};

// A tile's place and the block's shared arrays (see the top).
template <int kMaxK>
struct TileView {
    float *dy, *xs, *ws, *routed, *coef, *window_sums, *bias;
    int n, r0, c0, region_r, region_c;  // region_*: the region's first conv output row, column
    long long image;                   // the sample's first input element
    __device__ explicit TileView(float* smem) {
        using S = Smem<kMaxK>;
        dy = smem;
        xs = dy + S::kDy;
        ws = xs + S::kX;
        routed = ws + S::kW;
        coef = routed + S::kRouted;
        window_sums = coef + S::kCoef;
        bias = window_sums + S::kSums;
    }
    __device__ float4 weights(int ci, int tap, int quad) const {  // w[4 quad ..][ci][tap]
        return reinterpret_cast<const float4*>(ws + ci * Smem<kMaxK>::kWPlane +
                                               tap * kMaxChannels)[quad];
    }
    __device__ float* at(int row, int col) const {  // region position (row, col)'s channels
        return dy + (row * kRegionPitch + col) * kVec;
    }
};

// The weights as [ci][tap][c] (tap = i * kMaxK + j; zero where c, ci or the tap is past the
// call's), and the conv bias, once a block.
template <class T, int kMaxK>
__device__ void load_weights(const FusedArgs<T>& a, const TileView<kMaxK>& v) {
    constexpr int kTaps = kMaxK * kMaxK;
    for (int i = threadIdx.x; i < kMaxInputChannels * kTaps * kMaxChannels; i += blockDim.x) {
        const int c = i % kMaxChannels, tap = i / kMaxChannels % kTaps;
        const int ci = i / (kMaxChannels * kTaps), r = tap / kMaxK, s = tap % kMaxK;
        const bool real = c < a.cout && ci < a.cin && r < a.kh && s < a.kw;
        v.ws[ci * Smem<kMaxK>::kWPlane + tap * kMaxChannels + c] =
            real ? to_float(a.weight[((c * a.cin + ci) * a.kh + r) * a.kw + s]) : 0.0f;
    }
    for (int c = threadIdx.x; c < kMaxChannels; c += blockDim.x)
        v.bias[c] = value_or(a.conv_bias, c, c < a.cout, 0.0f);
}

// (0) The input under the region (zero outside the image), the region windows' routed
// gradients (zero outside the pooling output) and the sample's constants.
template <class T, int kMaxK>
__device__ void load_tile(const FusedArgs<T>& a, const TileView<kMaxK>& v) {
    using S = Smem<kMaxK>;
    for (int i = threadIdx.x; i < a.cin * S::kXRows * S::kXCols; i += blockDim.x) {
        const int ci = i / (S::kXRows * S::kXCols), rc = i % (S::kXRows * S::kXCols);
        const int row = v.region_r + rc / S::kXCols, col = v.region_c + rc % S::kXCols;
        const bool inside = row >= 0 && row < a.height && col >= 0 && col < a.width;
        v.xs[ci * S::kXPlane + rc] =
            inside ? to_float(a.x[v.image + (static_cast<long long>(ci) * a.height + row) *
                                                a.width + col])
                   : 0.0f;
    }
    for (int i = threadIdx.x; i < kMaxChannels * kRegionWindows; i += blockDim.x) {
        const int c = i / kRegionWindows, w = i % kRegionWindows;
        const int wr = v.r0 / kPool - 1 + w / kRegionWindowCols;
        const int wc = v.c0 / kPool - 1 + w % kRegionWindowCols;
        const bool real = c < a.cout && wr >= 0 && wr < a.pool_h && wc >= 0 && wc < a.pool_w;
        v.routed[i] = real ? a.routed[((static_cast<long long>(v.n) * a.cout + c) * a.pool_h +
                                       wr) * a.pool_w + wc]
                           : 0.0f;
    }
    for (int i = threadIdx.x; i < kMaxChannels * kCoefs; i += blockDim.x)
        v.coef[i] = i / kCoefs < a.cout
                        ? a.coefs[static_cast<long long>(v.n) * a.cout * kCoefs + i]
                        : 0.0f;
}

// (1) y over the region: a task is 4 channels x 9 neighbouring columns of one region row
// (16 quads x 4 runs x 12 rows = 768 tasks; lanes: 16 quads x 2 runs; 2 channels a task read
// twice the shared memory a product, the kernel's limit). y = bias + the sum over (ci, i, j) of
// w * x, added in that order with one rounding a product (fmaf), as conv_gn_pool v1 adds them.
template <class T, int kMaxK>
__device__ void compute_y(const FusedArgs<T>& a, const TileView<kMaxK>& v) {
    using S = Smem<kMaxK>;
    for (int task = threadIdx.x; task < kQuads * 4 * kRegionRows; task += blockDim.x) {
        const int quad = task % kQuads, run = task / kQuads % 4, row = task / (4 * kQuads);
        float acc[4][9];
#pragma unroll
        for (int q = 0; q < 4; ++q)
#pragma unroll
            for (int m = 0; m < 9; ++m) acc[q][m] = 0.0f;
        for (int ci = 0; ci < a.cin; ++ci) {
#pragma unroll
            for (int i = 0; i < kMaxK; ++i) {
                if (i >= a.kh) break;
                float xr[9 + kMaxK - 1];
                const float* src = v.xs + ci * S::kXPlane + (row + i) * S::kXCols + 9 * run;
#pragma unroll
                for (int m = 0; m < 9 + kMaxK - 1; ++m) xr[m] = src[m];
#pragma unroll
                for (int j = 0; j < kMaxK; ++j) {
                    if (j >= a.kw) break;
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
#pragma unroll
        for (int m = 0; m < 9; ++m)  // (rounded as torch's conv2d rounds it: element.cuh)
            reinterpret_cast<float4*>(v.at(row, 9 * run + m))[quad] =
                float4{rounded<T>(plus_bias<T>(acc[0][m], b.x)),
                       rounded<T>(plus_bias<T>(acc[1][m], b.y)),
                       rounded<T>(plus_bias<T>(acc[2][m], b.z)),
                       rounded<T>(plus_bias<T>(acc[3][m], b.w))};
    }
}

// (2) dy in place of y, a (channel, region window) a task, lanes on consecutive channels. In
// a pooling window the routed gradient goes where torch's max_pool2d records the maximum of
// group_norm(y) * scale (pool_clamp_backward.cu's rule: the first greater value in row-major
// order, or the last NaN); every position of the conv output also gets group norm's
// -k1 - xhat * k2; positions outside it get 0. The sums of each owned window's dy, for the
// conv bias's gradient.
template <class T, int kMaxK>
__device__ void form_dy(const FusedArgs<T>& a, const TileView<kMaxK>& v) {
    for (int task = threadIdx.x; task < kMaxChannels * kRegionWindows; task += blockDim.x) {
        const int c = task % kMaxChannels, w = task / kMaxChannels;
        const int wr = w / kRegionWindowCols, wc = w % kRegionWindowCols;
        const float* k = v.coef + c * kCoefs;
        const int pool_row = v.r0 / kPool - 1 + wr, pool_col = v.c0 / kPool - 1 + wc;
        const bool pooled =
            pool_row >= 0 && pool_row < a.pool_h && pool_col >= 0 && pool_col < a.pool_w;
        float* base = v.at(kPool * wr, kPool * wc) + c;
        int chosen = -1;
        if (pooled) {
            float best = -INFINITY;
            chosen = 0;
#pragma unroll
            for (int e = 0; e < kPool * kPool; ++e) {
                const float s = rounded<T>(normed_scaled<T>(
                    base[((e / kPool) * kRegionPitch + e % kPool) * kVec], k[kMean], k[kRstd],
                    k[kGamma], k[kBeta], k[kScale]));
                if (s > best || s != s) {
                    best = s;
                    chosen = e;
                }
            }
        }
        const float ds = v.routed[c * kRegionWindows + w];
        float sum = 0.0f;
#pragma unroll
        for (int e = 0; e < kPool * kPool; ++e) {
            const int row = v.region_r + kPool * wr + e / kPool;
            const int col = v.region_c + kPool * wc + e % kPool;
            float* y = base + ((e / kPool) * kRegionPitch + e % kPool) * kVec;
            const float xhat = (*y - k[kMean]) * k[kRstd];
            const float d =
                (e == chosen ? k[kDsFactor] * ds : 0.0f) - k[kConstant] - xhat * k[kXhatFactor];
            const bool real = row >= 0 && row < a.out_h && col >= 0 && col < a.out_w && c < a.cout;
            *y = real ? d : 0.0f;
            sum += real ? d : 0.0f;
        }
        if (wr >= 1 && wc >= 1)  // a window the tile owns
            v.window_sums[c * kOwnWindows + (wr - 1) * (kOwnCols / kPool) + wc - 1] = sum;
    }
}

// (3) The weight gradient: thread (quad, ci, split) adds dy[4 quad + q][p] * x[ci][p + tap]
// over the owned positions p of its split of the rows (weight_splits of them), 8 columns at a
// time (a warp's lanes: 16 quads x 2 input channels).
template <class T, int kMaxK>
__device__ void add_weight_grad(const FusedArgs<T>& a, const TileView<kMaxK>& v,
                                float (&dw)[4][kMaxK * kMaxK]) {
    using S = Smem<kMaxK>;
    constexpr int kRowsEach = kOwnRows / weight_splits(kMaxK);
    const int quad = threadIdx.x % kQuads, ci = threadIdx.x / kQuads % kMaxInputChannels;
    const int split = threadIdx.x / 128;
    if (ci >= a.cin) return;
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
                if (i >= a.kh) break;
                float xr[8 + kMaxK - 1];
                const float* src = v.xs + ci * S::kXPlane + (row + i) * S::kXCols + kPool + 8 * run;
#pragma unroll
                for (int m = 0; m < 8 + kMaxK - 1; ++m) xr[m] = src[m];
#pragma unroll
                for (int j = 0; j < kMaxK; ++j) {
                    if (j >= a.kw) break;
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
// dy[kPool + row - i][kPool + col + m - j][c] * w[c][ci][i][j] (region coordinates), kPixels
// neighbouring columns a thread. A warp's lanes: 4 rows x 8 input channels (the 4 rows' dy
// fall in different banks); its warp index picks the row group and the columns.
template <class T, int kMaxK>
__device__ void input_grad(const FusedArgs<T>& a, const TileView<kMaxK>& v) {
    constexpr int kPixels = kOwnRows * kOwnCols * kMaxInputChannels / fused_threads(kMaxK);
    const int ci = threadIdx.x % kMaxInputChannels, warp = threadIdx.x / 32;
    const int row = warp % 2 * 4 + threadIdx.x / 8 % 4, col = warp / 2 * kPixels;
    if (ci >= a.cin) return;
    float acc[kPixels];
#pragma unroll
    for (int m = 0; m < kPixels; ++m) acc[m] = 0.0f;
#pragma unroll 2
    for (int quad = 0; quad < kQuads; ++quad) {
#pragma unroll
        for (int i = 0; i < kMaxK; ++i) {
            if (i >= a.kh) break;
            float4 d[kPixels + kMaxK - 1];  // d[m]: dy at region column kPool + col - (kMaxK - 1) + m
            const float* src = v.at(row + kPool - i, col + kPool - (kMaxK - 1));
#pragma unroll
            for (int m = 0; m < kPixels + kMaxK - 1; ++m)
                d[m] = reinterpret_cast<const float4*>(src + m * kVec)[quad];
#pragma unroll
            for (int j = 0; j < kMaxK; ++j) {
                if (j >= a.kw) break;
                const float4 w = v.weights(ci, i * kMaxK + j, quad);
#pragma unroll
                for (int m = 0; m < kPixels; ++m) {
                    const float4 g = d[m + kMaxK - 1 - j];
                    acc[m] = fmaf(g.x, w.x, acc[m]);
                    acc[m] = fmaf(g.y, w.y, acc[m]);
                    acc[m] = fmaf(g.z, w.z, acc[m]);
                    acc[m] = fmaf(g.w, w.w, acc[m]);
                }
            }
        }
    }
    const int out_row = v.r0 + row;
    if (out_row >= a.height) return;
    T* out = a.dx + v.image + (static_cast<long long>(ci) * a.height + out_row) * a.width;
#pragma unroll
    for (int m = 0; m < kPixels; ++m)
        if (v.c0 + col + m < a.width) out[v.c0 + col + m] = from_float<T>(acc[m]);
}

template <class T, int kMaxK>
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
    for (int tile = blockIdx.x; tile < a.tiles; tile += gridDim.x) {
        const int per_image = a.bands * a.col_blocks;
        v.n = tile / per_image;
        v.r0 = kOwnRows * (tile % per_image / a.col_blocks);
        v.c0 = kOwnCols * (tile % a.col_blocks);
        v.region_r = v.r0 - kPool;
        v.region_c = v.c0 - kPool;
        v.image = static_cast<long long>(v.n) * a.cin * a.height * a.width;
        __syncthreads();  // the previous tile's readers are done
        load_tile(a, v);
        __syncthreads();
        compute_y(a, v);
        __syncthreads();
        form_dy(a, v);
        __syncthreads();
        if (threadIdx.x < kMaxChannels)
            for (int w = 0; w < kOwnWindows; ++w)
                dbias += v.window_sums[threadIdx.x * kOwnWindows + w];
        add_weight_grad(a, v, dw);
        input_grad(a, v);
    }

    // The block's partial sums, for the ordered sum over blocks (batch_sum_launch).
    const int quad = threadIdx.x % kQuads, ci = threadIdx.x / kQuads % kMaxInputChannels;
    if (ci < a.cin) {
        float* out = a.weight_partials +
                     (static_cast<long long>(blockIdx.x) * weight_splits(kMaxK) + threadIdx.x / 128) *
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
