// conv_gn_pool.cu — P85 in one pass over its input: conv2d -> group norm -> x * scale ->
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
// Versions:
//   v1 two kernels. (1) The implicit-GEMM convolution (tf32x3.cuh, conv_implicit.cuh) on
//      tiles of 4 output rows x 32 columns (one band of pooling windows), whose epilogue,
//      instead of storing the tile, writes (a) per (sample, tile, group) the tile's mean and
//      sum of squared deviations (two passes over the values in registers: exact centering,
//      no cancellation when |mean| >> std), and (b) per (sample, channel, window) the max or
//      the min of the conv values. (2) A finalize kernel, one block per (sample, group),
//      merges the tiles' statistics in a fixed order (as sums about one tile's mean, the
//      shifted-data formulas: deterministic, no atomics, no division per merge), then maps
//      each window's extreme through the affine map and clamps.
//   v2 the same two kernels and the same workspace, with a convolution kernel of its own for
//      Cin <= 8 (P85's 8): the input halo of a tile staged and split once in shared memory
//      instead of every im2col value gathered and split, one k-step a tap instead of the
//      packing's padded 4-taps-a-k-step order, and three warpgroups on separate 4 x 16 tiles
//      so that one's epilogue overlaps the others' wgmmas (see "v2" below).
//      conv_gn_pool_launch runs v2 where it covers the shape on the wgmma engine, v1
//      elsewhere (v1 runs on either tensor-core engine: tensor_core_launch.cuh).
//   Memory traffic (P85 at batch 128): the input once (67 MB, plus cache re-reads), the
//   extremes written and read once (32 MB each), the output (32 MB), the statistics (1 MB).
#include <type_traits>

#include "conv_implicit.cuh"
#include "tensor_core_launch.cuh"

namespace scratchops {
namespace conv_gn_pool {

using conv_tc::ConvGeometryFast;
using tf32x3::TileCoords;

constexpr int kPool = 4;                       // pooling window and stride (P85's MaxPool2d(4))
constexpr int kBandCols = 32;                  // a tile: kPool rows x 32 columns = 128 GEMM rows
constexpr int kTileRows = kPool * kBandCols;   // = 2 warpgroups x 64
constexpr int kV2BandCols = 16;                // v2's tile: kPool rows x 16 columns = 64 rows
enum : int { kWindowsPerTile = kBandCols / kPool };  // (an enum: unused without sm_90a)
constexpr int kBN = 64, kMB = 1, kStages = 8;  // every output channel in one tile
static_assert(kTileRows == tf32x3::kConsumerWarpgroups * 64 * kMB, "a tile is one band");

// Tile order: tile = (n * bands + band) * col_blocks + col_block; GEMM row m of the tile
// kTileRows * tile + i is output pixel (4 * band + i / 32, 32 * col_block + i % 32).
struct BandPixels {
    int tiles_per_image, col_blocks, cols;  // cols: a tile's columns (v1 kBandCols, v2 kV2BandCols)
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

struct Params {
    const float* conv_bias;  // (Cout) or nullptr
    const float* gamma;      // group norm weight (Cout) or nullptr (1)
    const float* scale;      // (Cout) or nullptr (1)
    float* tile_stats;       // [n][group][tile of the image]{mean, m2}
    float* extremes;         // [n][channel][pool_h][pool_w]
    int groups, pool_h, pool_w;
};

// Count, mean and centred sum of squares (m2) of a set of values.
struct Moments {
    float count, mean, m2;
};
// Chan et al.: the moments of the union of a and b, exact in the mean's centring (no
// cancellation when |mean| >> std). kEqualCounts: a and b hold as many values (whole pooling
// windows), so b's share of the union is 1/2 exactly, with no division.
template <bool kEqualCounts = false>
__device__ __forceinline__ Moments merged(const Moments& a, const Moments& b) {
    if (!kEqualCounts && b.count == 0.0f) return a;
    const float total = a.count + b.count;
    const float delta = b.mean - a.mean;
    const float share = kEqualCounts ? 0.5f : b.count / total;
    return {total, a.mean + delta * share, a.m2 + (b.m2 + delta * delta * a.count * share)};
}

// Window extremes are maxima of sign * x, sign = -1 where gamma * scale < 0 (a minimum:
// min x = -max(-x)), so one max serves both, with no branch.
__device__ __forceinline__ float extreme_sign(const Params& p, int cout, int co) {
    const float gam = p.gamma != nullptr && co < cout ? p.gamma[co] : 1.0f;
    const float sc = p.scale != nullptr && co < cout ? p.scale[co] : 1.0f;
    return gam * sc < 0.0f ? -1.0f : 1.0f;
}

__device__ __forceinline__ void consumers_sync() {  // the 256 consumer threads only
    asm volatile("bar.sync 1, %0;" ::"n"(128 * tf32x3::kConsumerWarpgroups) : "memory");
}

// The epilogue: statistics and window extremes of one tile (see the top).
struct StatsAndExtremes {
    Params p;
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
            prep.bias[i] = p.conv_bias != nullptr && co < f.cout ? p.conv_bias[co] : 0.0f;
            prep.sign[i] = extreme_sign(p, f.cout, co);
        }
        prep.combine_sign = extreme_sign(p, f.cout, (32 * (4 * tc.warpgroup + tc.warp) + tc.lane) % kBN);
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
        for (int i = 0; i < BN / 2; ++i) v[i] = acc[0][i] + prep.bias[2 * (i / 4) + i % 2];
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
                    float s = (valid[0] ? term(v[4 * nb + j], co) : 0.0f) +
                              (valid[1] ? term(v[4 * nb + 2 + j], co) : 0.0f);
                    s += __shfl_xor_sync(0xffffffffu, s, 4);
                    s += __shfl_xor_sync(0xffffffffu, s, 8);
                    s += __shfl_xor_sync(0xffffffffu, s, 16);
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
            float e = prep.sign[2 * (i / 4) + i % 2] * v[i];
            e = nan_max(e, __shfl_xor_sync(0xffffffffu, e, 4));
            e = nan_max(e, __shfl_xor_sync(0xffffffffu, e, 8));
            const int nb = i / 4, h = (i / 2) % 2, j = i % 2;
            if (g % 4 == 0)
                extreme[row][4 * (tc.warp % 2) + 2 * h + g / 4][8 * nb + 2 * t + j] = e;
        }
        consumers_sync();
        for (int i = cthread; i < kWindowsPerTile * kBN; i += 128 * tf32x3::kConsumerWarpgroups) {
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
constexpr int kFinalizeThreads = 256;

struct FinalizeShape {
    int channels_per_group, out_h, out_w, windows;  // windows = pool_h * pool_w
    FastDiv by_windows;                              // a window's channel: i / windows
};

__global__ void __launch_bounds__(kFinalizeThreads)
    finalize_kernel(const float* __restrict__ tile_stats, const float* __restrict__ extremes,
                    const float* __restrict__ gamma, const float* __restrict__ beta,
                    const float* __restrict__ scale, float* __restrict__ y, int cout, int groups,
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
        channel_params[c] = make_float4(gamma != nullptr ? gamma[co] : 1.0f,
                                        beta != nullptr ? beta[co] : 0.0f,
                                        scale != nullptr ? scale[co] : 1.0f, 0.0f);
    }
    auto add_lanes = [&](int lanes) {
        for (int d = lanes / 2; d > 0; d /= 2) {
            count += __shfl_xor_sync(0xffffffffu, count, d);
            sum += __shfl_xor_sync(0xffffffffu, sum, d);
            sum_sq += __shfl_xor_sync(0xffffffffu, sum_sq, d);
        }
    };
    constexpr int kWarps = kFinalizeThreads / 32;
    __shared__ float per_warp[3][kWarps];
    add_lanes(32);
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
    add_lanes(kWarps);  // every warp alike: lane 0 of each holds the group's sums
    count = __shfl_sync(0xffffffffu, count, 0);
    sum = __shfl_sync(0xffffffffu, sum, 0);
    sum_sq = __shfl_sync(0xffffffffu, sum_sq, 0);
    const float offset = sum / count;
    const float group_mean = shift + offset;
    const float variance = fmaxf((sum_sq - sum * offset) / count, 0.0f);  // biased, as torch
    const float rstd = 1.0f / sqrtf(variance + eps);

    // Each window's extreme through its channel's affine map, then the clamp.
    for (int start = threadIdx.x; start < group_windows;
         start += kLoadsInFlight * kFinalizeThreads) {
        if (start != threadIdx.x) load_round(start);
#pragma unroll
        for (int k = 0; k < kLoadsInFlight; ++k) {
            const int i = start + k * kFinalizeThreads;
            if (i >= group_windows) break;
            const float4 gbs = channel_params[shape.by_windows.div(i)];
            const float v = ((extreme[k] - group_mean) * rstd * gbs.x + gbs.y) * gbs.z;
            y[first + i] = nan_min(nan_max(v, lo), hi);
        }
    }
}

// ---------------------------------------------------------------------------------- v2
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
                           tf32x3::PackedB layout, Params p, ConvGeometryFast f, BandPixels bands,
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
        const int values = num_kb * 3 * kBN * tf32x3::kBlockK;  // [kb][part][row n][column L]
        // Unrolled so that a thread's global loads are in flight together (run once per CTA,
        // but a loop of dependent loads took ~5% of the kernel's time in ncu's samples).
#pragma unroll 8
        for (int i = tid; i < values; i += kV2Threads) {
            const int column = i % tf32x3::kBlockK, n = (i / tf32x3::kBlockK) % kBN;
            const int tile = i / (tf32x3::kBlockK * kBN);  // = 3 kb + part
            const uint8_t* from = packed + tile * kBN * 128;
            // Channel n negated where its extremes are minima (see "epilogue" above): its
            // conv outputs come out as sign * x, exactly (negating every part of every
            // product negates the sum, rounding included).
            const uint32_t sign_bit = extreme_sign(p, f.cout, n) < 0.0f ? 0x80000000u : 0u;
            *reinterpret_cast<uint32_t*>(weights + tile * kBN * 128 +
                                         tf32x3::packed_offset(n, tf32x3::physical_k(column))) =
                *reinterpret_cast<const uint32_t*>(from + tf32x3::packed_offset(n, column)) ^
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
    const int* flags = reinterpret_cast<const int*>(packed + layout.tiles_bytes());
    const bool b_cross_tile =
        __syncthreads_or(tid < tf32x3::kPackBlocks && flags[tid]) != 0;

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
                auto sum_over_windows = [](float x) {
#pragma unroll
                    for (int d = 8; d < 8 * kV2Windows; d *= 2)
                        x += __shfl_xor_sync(0xffffffffu, x, d);
                    return x;
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
                auto merge_lanes = [&](int d, auto equal_counts) {
                    const Moments other{__shfl_xor_sync(0xffffffffu, m.count, d),
                                        __shfl_xor_sync(0xffffffffu, m.mean, d),
                                        __shfl_xor_sync(0xffffffffu, m.m2, d)};
                    m = merged<decltype(equal_counts)::value>(m, other);
                };
                m.mean = fmaf(pair_sign[j], m.mean, pair_bias[j]);  // channel co's moments
                if (groups_in_lanes) {
                    // The channels of a tile have equal counts: shares of 1/2 exactly.
#pragma unroll
                    for (int d = 1; d < 8; d *= 2)
                        if (d < (1 << shape.group_shift)) merge_lanes(d, std::true_type{});
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

BandPixels band_pixels(const Conv2dGeometry& g, int cols) {
    BandPixels b;
    const int bands = (g.out_h + kPool - 1) / kPool;
    b.cols = cols;
    b.col_blocks = (g.out_w + cols - 1) / cols;
    b.tiles_per_image = bands * b.col_blocks;
    b.by_tiles = FastDiv(static_cast<uint32_t>(b.tiles_per_image));
    b.by_col_blocks = FastDiv(static_cast<uint32_t>(b.col_blocks));
    return b;
}

// Room for the statistics of the narrower tiles (v2's), which v1's wider ones also fit in.
long long stats_floats(int batch, const Conv2dGeometry& g, int groups) {
    return static_cast<long long>(batch) * band_pixels(g, kV2BandCols).tiles_per_image * groups * 2;
}

}  // namespace conv_gn_pool

long long conv_gn_pool_workspace_bytes(int batch, int out_channels, const Conv2dGeometry& g,
                                       int groups) {
    using namespace conv_gn_pool;
    const long long extremes =
        static_cast<long long>(batch) * out_channels * (g.out_h / kPool) * (g.out_w / kPool);
    return 4 * (stats_floats(batch, g, groups) + extremes);
}

cudaError_t conv_gn_pool_launch(const float* x, const void* packed, const GnPoolArgs& a, float* y,
                                int batch, int out_channels, const Conv2dGeometry& g, bool tf32,
                                TensorCorePath engine, void* workspace, cudaStream_t stream) {
    using namespace conv_gn_pool;
    if (batch <= 0) return cudaSuccess;
    if (out_channels <= 0 || out_channels > kBN || a.groups <= 0 ||
        out_channels % a.groups != 0 || g.out_h < kPool || g.out_w < kPool)
        return cudaErrorInvalidValue;  // the caller picks the three-stage chain for these
    const ConvGeometryFast f = conv_tc::fast_geometry(g, batch, out_channels);
    const BandPixels bands = band_pixels(g, kBandCols);
    const BandPixels v2_bands = band_pixels(g, kV2BandCols);
    auto* stats = static_cast<float*>(workspace);
    float* extremes = stats + stats_floats(batch, g, a.groups);
    const Params params{a.conv_bias, a.gamma, a.scale, stats, extremes, a.groups, g.out_h / kPool,
                        g.out_w / kPool};
    const tf32x3::PackedB layout = conv_tc::weight_layout(g, out_channels, kBN);
    const long long rows = static_cast<long long>(batch) * bands.tiles_per_image * kTileRows;
    if (rows > 0x7fffffffLL) return cudaErrorInvalidValue;
    const auto* p = static_cast<const uint8_t*>(packed);
    cudaError_t err = cudaSuccess;
    BandPixels finalize_bands = bands;  // the tiles whose statistics the finalize merges
    V2Shape shape{(kPool - 1) * g.stride_h + (g.kernel_h - 1) * g.dil_h + 1,
                  (kV2BandCols - 1) * g.stride_w + (g.kernel_w - 1) * g.dil_w + 1,
                  g.kernel_h * g.kernel_w, 0, 0, -1, {}};
    shape.raw_pitch = (shape.halo_w + 3) / 4 * 4;
    shape.wide = g.stride_w == 1 && g.width % 4 == 0 && g.pad_w % 4 == 0 &&
                 reinterpret_cast<uintptr_t>(x) % 16 == 0;
    const int cpg = out_channels / a.groups;
    for (int shift = 0; shift <= 3; ++shift)
        if (cpg == 1 << shift) shape.group_shift = shift;
    for (int j = 0; j < kV2MaxTaps && j < shape.taps; ++j)
        shape.tap_offset[j] =
            (j / g.kernel_w) * g.dil_h * shape.halo_w + (j % g.kernel_w) * g.dil_w;
    // (v2 computes fp32-accurate products only; the reductions it covers, at most 96 long, are
    // below the TF32 rule's kTf32MinReduction anyway.)
    if (engine == TensorCorePath::kWgmma && !tf32 && g.channels <= 8 &&
        layout.num_kb <= kV2MaxKBlocks &&
        shape.halo_h * shape.raw_pitch <= kHaloPixels) {
        const int smem = v2_smem_bytes(layout.num_kb);
        // The limit, once per device: the most any launch asks (common.cuh).
        static std::atomic<unsigned long long> smem_set_on;
        err = once_per_device(smem_set_on, [] {
            return cudaFuncSetAttribute(conv_gn_pool_v2_kernel,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        v2_smem_bytes(kV2MaxKBlocks));
        });
        if (err != cudaSuccess) return err;
        const long long tiles = static_cast<long long>(batch) * v2_bands.tiles_per_image;
        // A CTA's warpgroups take a tile each.
        const long long groups_of_tiles = (tiles + kV2Warpgroups - 1) / kV2Warpgroups;
        const int ctas = static_cast<int>(
            groups_of_tiles < sm_count() ? groups_of_tiles : sm_count());
        conv_gn_pool_v2_kernel<<<ctas, kV2Threads, smem, stream>>>(x, p, layout, params, f,
                                                                   v2_bands, shape);
        finalize_bands = v2_bands;
        err = cudaGetLastError();
    } else {
        const StatsAndExtremes epilogue{params, f, bands};
        auto v1 = [&](auto kTf32) {
            constexpr bool kT = decltype(kTf32)::value;
            return g.channels % 8 == 0
                       ? tensor_core_launch<kBN, kMB, kStages, 1, kT>(
                             engine, conv_tc::Im2colRows<true, BandPixels>{x, f, bands},
                             epilogue, p, layout, static_cast<int>(rows), 1, true, stream)
                       : tensor_core_launch<kBN, kMB, kStages, 1, kT>(
                             engine, conv_tc::Im2colRows<false, BandPixels>{x, f, bands},
                             epilogue, p, layout, static_cast<int>(rows), 1, true, stream);
        };
        err = tf32 ? v1(std::true_type{}) : v1(std::false_type{});
    }
    if (err != cudaSuccess) return err;
    const int windows = (g.out_h / kPool) * (g.out_w / kPool);
    const FinalizeShape finalize_shape{out_channels / a.groups, g.out_h, g.out_w, windows,
                                       FastDiv(static_cast<uint32_t>(windows))};
    // (a.groups <= out_channels <= kBN: within the grid's y limit.)
    finalize_kernel<<<dim3(batch, a.groups), kFinalizeThreads, 0, stream>>>(
        stats, extremes, a.gamma, a.beta, a.scale, y, out_channels, a.groups, finalize_bands,
        finalize_shape, a.eps, a.lo, a.hi);
    return cudaGetLastError();
}

}  // namespace scratchops
