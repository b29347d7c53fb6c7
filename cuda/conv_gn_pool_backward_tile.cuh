// conv_gn_pool_backward_tile.cuh — the tile of P85's fused backward kernel
// (conv_gn_pool_backward.cuh): its geometry, its shared arrays and the loads that fill them.
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
//   coefs   [kCoefs][c] the (sample, channel) constants of the first kernel (a warp's lanes,
//           on consecutive channels, read consecutive words of each);
//   window_sums [owned window][c] each owned window's sum of dy, for the conv bias;
//   bias    [c] the conv bias;
//   raw     [ci][row][col / 2] the half types' input as copied, two values a word.
// Threads: fused_threads below, one block an SM (174.5 or 211.2 KiB of shared memory), a
// persistent grid whose block b takes tiles b, b + grid, ... and keeps its weight and bias
// gradient sums in registers until its last tile.
#pragma once

#include <type_traits>

#include "common.cuh"
#include "hopper.cuh"

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
// The weight gradient's row splits (add_weight_grad: a thread an input channel and quad of a
// split): a block's partial sums per split.
__host__ __device__ constexpr int weight_splits(int max_k) {
    return fused_threads(max_k) / (kMaxInputChannels * kQuads);
}

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
    // The half types' input as copied, two values a word, before it is widened into x.
    static constexpr int kRawWords = kMaxInputChannels * kXRows * kXCols / 2;
    static_assert(kXCols % 2 == 0, "a row of the input under the region is whole pairs");
    static constexpr int kFloats = kDy + kX + kW + kRouted + kCoef + kSums + kBias + kRawWords;
};

template <class T>
struct FusedArgs {
    const T* x;          // (N, Cin, H, W)
    const T* weight;     // (Cout, Cin, kh, kw)
    const T* conv_bias;  // (Cout) or nullptr
    const float* coefs;  // [n][kCoefs][c]
    const float* routed; // [n][c][pool_h][pool_w]
    T* dx;               // (N, Cin, H, W)
    float* weight_partials;  // [block][split][Cout][Cin][kh][kw]
    float* bias_partials;    // [block][Cout]
    int cin, cout, height, width, kh, kw, out_h, out_w, pool_h, pool_w;
    int bands, col_blocks, tiles;  // tiles = N * bands * col_blocks
    // The half types: the input's rows start on 4-byte boundaries (an even width and x on a
    // 4-byte boundary), so that it is copied in pairs (load_tile); otherwise loaded.
    bool x_in_pairs;
};

// The call's input channels and kernel size as the phases see them. The kernel's instantiation
// for the full shape (kFull: kMaxInputChannels input channels and a kMaxK x kMaxK kernel, as
// P85's) has them as constants, so that the loops over them unroll whole and test no bounds
// (ncu: those tests were 5 % of the kernel's stall samples); the other takes the call's.
struct Extent {
    int cin, kh, kw;
};
template <int kMaxK, bool kFull, class T>
__device__ __forceinline__ Extent extent_of(const FusedArgs<T>& a) {
    return kFull ? Extent{kMaxInputChannels, kMaxK, kMaxK} : Extent{a.cin, a.kh, a.kw};
}

// A tile's place and the block's shared arrays (see the top).
template <int kMaxK>
struct TileView {
    float *dy, *xs, *ws, *routed, *coef, *window_sums, *bias;
    uint32_t* raw;
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
        raw = reinterpret_cast<uint32_t*>(bias + S::kBias);
    }
    template <class Args>
    __device__ void place(int tile, const Args& a) {  // tile = (n, band, column block)
        const int per_image = a.bands * a.col_blocks;
        n = tile / per_image;
        r0 = kOwnRows * (tile % per_image / a.col_blocks);
        c0 = kOwnCols * (tile % a.col_blocks);
        region_r = r0 - kPool;
        region_c = c0 - kPool;
        image = static_cast<long long>(n) * a.cin * a.height * a.width;
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
// gradients (zero outside the pooling output) and the sample's constants, by copies that hold
// no register while in flight (cp.async). The kernel starts a tile's copies while the tile
// before computes its input gradient, and waits for them after. cp.async copies 4 bytes at
// least, so the half types' input is copied in pairs into raw, where its rows start on 4-byte
// boundaries, and widened into x by the thread that copied it (widen_tile); otherwise loaded.
// Element rc = (row, col) of the region's input, row and col from region_r, region_c: a pair
// (col even: region_c = c0 - kPool and kXCols are even) is wholly inside or outside an image
// of even width.
template <class T, int kMaxK>
__device__ __forceinline__ long long input_offset(const FusedArgs<T>& a, const TileView<kMaxK>& v,
                                                  int ci, int rc, bool& inside) {
    using S = Smem<kMaxK>;
    const int row = v.region_r + rc / S::kXCols, col = v.region_c + rc % S::kXCols;
    inside = row >= 0 && row < a.height && col >= 0 && col < a.width;
    return inside ? v.image + (static_cast<long long>(ci) * a.height + row) * a.width + col : 0;
}
// Word i of raw: the pair of channel ci's region plane from element rc (even).
template <int kMaxK>
__device__ __forceinline__ void raw_pair(int i, int& ci, int& rc) {
    constexpr int kPairs = Smem<kMaxK>::kXRows * Smem<kMaxK>::kXCols / 2;
    ci = i / kPairs;
    rc = 2 * (i % kPairs);
}
template <class T, int kMaxK, bool kFull>
__device__ void load_tile(const FusedArgs<T>& a, const TileView<kMaxK>& v, uint64_t policy) {
    using S = Smem<kMaxK>;
    constexpr int kPlane = S::kXRows * S::kXCols;
    const int cin = extent_of<kMaxK, kFull>(a).cin;
    bool inside;
    if (std::is_same_v<T, float> || !a.x_in_pairs) {
        for (int i = threadIdx.x; i < cin * kPlane; i += blockDim.x) {
            const int ci = i / kPlane, rc = i % kPlane;
            const T* src = a.x + input_offset(a, v, ci, rc, inside);
            if constexpr (std::is_same_v<T, float>)
                cp_async_or_zero<4>(&v.xs[ci * S::kXPlane + rc], src, inside, policy);
            else
                v.xs[ci * S::kXPlane + rc] = inside ? to_float(*src) : 0.0f;
        }
    } else {
        for (int i = threadIdx.x; i < cin * kPlane / 2; i += blockDim.x) {
            int ci, rc;
            raw_pair<kMaxK>(i, ci, rc);
            const T* src = a.x + input_offset(a, v, ci, rc, inside);
            cp_async_or_zero<4>(&v.raw[i], reinterpret_cast<const float*>(src), inside, policy);
        }
    }
    for (int i = threadIdx.x; i < kMaxChannels * kRegionWindows; i += blockDim.x) {
        const int c = i / kRegionWindows, w = i % kRegionWindows;
        const int wr = v.r0 / kPool - 1 + w / kRegionWindowCols;
        const int wc = v.c0 / kPool - 1 + w % kRegionWindowCols;
        const bool real = c < a.cout && wr >= 0 && wr < a.pool_h && wc >= 0 && wc < a.pool_w;
        cp_async_or_zero<4>(&v.routed[i],
                            a.routed + (real ? ((static_cast<long long>(v.n) * a.cout + c) *
                                                    a.pool_h + wr) * a.pool_w + wc
                                             : 0),
                            real, policy);
    }
    for (int i = threadIdx.x; i < kMaxChannels * kCoefs; i += blockDim.x) {
        const int k = i / kMaxChannels, c = i % kMaxChannels;
        cp_async_or_zero<4>(
            &v.coef[i],
            a.coefs + (c < a.cout ? (static_cast<long long>(v.n) * kCoefs + k) * a.cout + c : 0),
            c < a.cout, policy);
    }
    cp_async_commit();
}

// The half types' input copied in pairs: widened into x by each thread that copied a pair,
// once its copies have landed (so no barrier between).
template <class T, int kMaxK, bool kFull>
__device__ void widen_tile(const FusedArgs<T>& a, const TileView<kMaxK>& v) {
    if constexpr (!std::is_same_v<T, float>) {
        using S = Smem<kMaxK>;
        constexpr int kPlane = S::kXRows * S::kXCols;
        const int cin = extent_of<kMaxK, kFull>(a).cin;
        if (!a.x_in_pairs) return;
        for (int i = threadIdx.x; i < cin * kPlane / 2; i += blockDim.x) {
            int ci, rc;
            raw_pair<kMaxK>(i, ci, rc);
            const T* pair = reinterpret_cast<const T*>(&v.raw[i]);
            v.xs[ci * S::kXPlane + rc] = to_float(pair[0]);
            v.xs[ci * S::kXPlane + rc + 1] = to_float(pair[1]);
        }
    }
}

}  // namespace conv_gn_pool_backward
}  // namespace scratchops
