// conv_gn_pool.cuh — P85 in one pass over its input: conv2d -> group norm -> x * scale ->
// max_pool2d(4) -> clamp, where the convolution's output never reaches global memory.
//
// Why one pass is possible. Per (sample n, channel c), group norm followed by the scale is
// an affine map y = ((x - mean) * rstd * gamma_c + beta_c) * scale_c of the conv output x,
// with rstd > 0: it is non-decreasing in x when gamma_c * scale_c >= 0 and non-increasing
// otherwise, and so is its fp32 evaluation (each step rounds monotonically). So the max over
// a pooling window of y is the map applied to the window's max of x, or to its min when
// gamma_c * scale_c < 0, and which one is known from the parameters before the convolution
// runs. The statistics need every conv output of the group (the whole plane, also the rows
// and columns no window covers); the pooling needs only one extreme per window.
//
// Versions, one idea each:
//   v1 the idea alone, on the CUDA cores (any GPU): one block per tile of 4 output rows x 16
//      columns, one thread per (channel, pooling window) computing its 16 conv outputs by a
//      direct convolution, then (a) the window's max or min, (b) per (tile, group) the mean
//      and centred sum of squares of the conv values (Chan merges across threads). (2) A
//      finalize kernel, one block per (sample, group), merges the tiles' statistics in a
//      fixed order (as sums about one tile's mean, the shifted-data formulas: deterministic,
//      no atomics, no division per merge), then maps each window's extreme through the
//      affine map and clamps.
//   v2 the convolution on the tensor cores: the implicit-GEMM convolution (tf32x3.cuh,
//      conv_implicit.cuh) on tiles of 4 output rows x 32 columns (one band of pooling
//      windows), whose epilogue, instead of storing the tile, writes v1's (a) and (b) from
//      the accumulators (two passes over the values in registers: exact centring, no
//      cancellation when |mean| >> std); the same finalize. Either tensor-core engine
//      (tensor_core_launch.cuh).
//   v3 v2 with a convolution kernel of its own for Cin <= 8 (P85's 8): the input halo of a
//      tile staged and split once in shared memory instead of every im2col value gathered
//      and split, one k-step a tap instead of the packing's padded 4-taps-a-k-step order,
//      and three warpgroups on separate 4 x 16 tiles so that one's epilogue overlaps the
//      others' wgmmas (see conv_gn_pool_v3.cuh).
//   Selectable (the operator's `version`): version 3, the default, runs v3 where it covers
//   the call on the wgmma engine and v2 elsewhere; versions 1 and 2 always run themselves.
//   Memory traffic (P85 at batch 128): the input once (67 MB, plus cache re-reads), the
//   extremes written and read once (32 MB each), the output (32 MB), the statistics (1 MB).
//
// The files: this header (the derivation above, the tile order and what the versions share),
// conv_gn_pool_v1.cuh (v1's kernel), conv_gn_pool_v2.cuh (v2's epilogue on the tensor-core
// engines), conv_gn_pool_v3.cuh (v3's kernel, with _v3_halo.cuh and _v3_epilogue.cuh),
// conv_gn_pool_finalize.cuh (the finalize kernel all share) and conv_gn_pool.cu (the host
// side: workspace, the choice of version, the launches).
#pragma once

#include "conv_implicit.cuh"
#include "tf32x3.cuh"

namespace scratchops {
namespace conv_gn_pool {

using conv_tc::ConvGeometryFast;
using tc::TileCoords;

constexpr int kPool = 4;                       // pooling window and stride (P85's MaxPool2d(4))
constexpr int kBandCols = 32;                  // a tile: kPool rows x 32 columns = 128 GEMM rows
constexpr int kTileRows = kPool * kBandCols;   // = 2 warpgroups x 64
constexpr int kWideBandCols = 16;              // v1's and v3's tile: kPool rows x 16 columns
constexpr int kWideTileWindows = kWideBandCols / kPool;  // its pooling windows
enum : int { kWindowsPerTile = kBandCols / kPool };  // (an enum: unused without sm_90a)
constexpr int kBN = 64, kMB = 1, kStages = 8;  // every output channel in one tile
// A wide tile's (channel, pooling window) pairs: the unit of work of v1's threads and of v3's
// epilogue.
constexpr int kWideTilePairs = kBN * kWideTileWindows;
static_assert(kTileRows == tf32x3::kConsumerWarpgroups * 64 * kMB, "a tile is one band");

// Tile order: tile = (n * bands + band) * col_blocks + col_block; GEMM row m of the tile
// kTileRows * tile + i is output pixel (4 * band + i / 32, 32 * col_block + i % 32).
struct BandPixels {
    // cols: a tile's columns (v2 kBandCols, v1 and v3 kWideBandCols)
    int tiles_per_image, col_blocks, cols;
    FastDiv by_tiles, by_col_blocks;
    __device__ void tile(int t, int& n, int& band, int& col_block) const {
        n = by_tiles.div(t);
        const int rest = t - n * tiles_per_image;
        band = by_col_blocks.div(rest);
        col_block = rest - band * col_blocks;
    }
    __device__ bool pixel(const ConvGeometryFast& f, int m, int& n, int& oh, int& ow) const {
        int band, col_block;
        tile(m / kTileRows, n, band, col_block);
        const int i = m % kTileRows;
        oh = kPool * band + i / kBandCols;
        ow = kBandCols * col_block + i % kBandCols;
        return n < f.batch && oh < f.g.out_h && ow < f.g.out_w;
    }
};

// Where tile `tile_in_image` of sample n keeps group `group`'s mean and m2: a (sample,
// group)'s tiles side by side, which the finalize reads in one coalesced sweep.
template <class Float>
__device__ __forceinline__ Float* stats_at(Float* tile_stats, const BandPixels& bands, int groups,
                                           int n, int group, int tile_in_image) {
    return tile_stats +
           ((static_cast<long long>(n) * groups + group) * bands.tiles_per_image + tile_in_image) *
               2;
}

// The per-channel parameters, of the operator's element type T.
template <class T = float>
struct Params {
    const T* conv_bias;  // (Cout) or nullptr
    const T* gamma;      // group norm weight (Cout) or nullptr (1)
    const T* scale;      // (Cout) or nullptr (1)
    float* tile_stats;       // [n][group][tile of the image]{mean, m2}
    float* extremes;         // [n][channel][pool_h][pool_w]
    int groups, pool_h, pool_w;
};

// Window extremes are maxima of sign * x, sign = -1 where gamma * scale < 0 (a minimum:
// min x = -max(-x)), so one max serves both, with no branch.
template <class T>
__device__ __forceinline__ float extreme_sign(const Params<T>& p, int cout, int co) {
    const float gam = value_or(p.gamma, co, co < cout, 1.0f);
    const float sc = value_or(p.scale, co, co < cout, 1.0f);
    return gam * sc < 0.0f ? -1.0f : 1.0f;
}

__device__ __forceinline__ void consumers_sync() {  // the 256 consumer threads only
    asm volatile("bar.sync 1, %0;" ::"n"(kWarpgroupThreads * tf32x3::kConsumerWarpgroups)
                 : "memory");
}

// The epilogue: statistics and window extremes of one tile (see the top).

inline BandPixels band_pixels(const Conv2dGeometry& g, int cols) {
    BandPixels b;
    const int bands = (g.out_h + kPool - 1) / kPool;
    b.cols = cols;
    b.col_blocks = (g.out_w + cols - 1) / cols;
    b.tiles_per_image = bands * b.col_blocks;
    b.by_tiles = FastDiv(static_cast<uint32_t>(b.tiles_per_image));
    b.by_col_blocks = FastDiv(static_cast<uint32_t>(b.col_blocks));
    return b;
}

// Room for the statistics of the narrower tiles (v1's and v3's), which v2's wider ones also
// fit in.
inline long long stats_floats(int batch, const Conv2dGeometry& g, int groups) {
    return static_cast<long long>(batch) * band_pixels(g, kWideBandCols).tiles_per_image *
           groups * 2;
}
}  // namespace conv_gn_pool
}  // namespace scratchops
