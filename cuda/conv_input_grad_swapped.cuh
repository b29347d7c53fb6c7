// conv_input_grad_swapped.cuh — the input gradient v4 (conv_backward.cu's list): fp32-accurate
// (3xTF32, TF32 off) on the wgmma engine with the GEMM's roles swapped, stride 1.
//
// Why. v2 runs dx = conv2d(dy, Wf) as the forward's implicit GEMM: M = dx's pixels, N = dx's
// channels, which for P31 is 64, so each dy value a thread loads and splits feeds 64 columns
// where the forward's feed 128, and the tensor pipe waits behind twice the forward's
// instructions a product (docs/notes.md, "What limits the fp32 input gradient"). Here M is
// dx's channels (the flipped weights, 64 rows a tile) and N is 128 pixels of one dx row:
//   A  the flipped weights, packed once in the order the consumers read them (one 16-byte
//      load a thread a k-step: its wgmma register fragment), split in registers;
//   B  dy made channels-last and split once into its two TF32 parts (split_channels_last:
//      two arrays, big and small), each k-block's rows a box of a 4-D tensor that the copy
//      engine stages in the 128-byte swizzle (tma.cuh), zeros where a tap falls in the
//      padding, as the forward's v4 stages its A: one box of 128 + (kw - 1) dil rows serves a
//      kernel row's kw taps, tap s starting s dil rows in.
// Each value of dy is then split once, not once a tap, and a wgmma is 64 x 128 x 8.
//
// The products of a k-step, small terms first: a_cross b_small + a_small' b_big + a_big b_big.
// B has no cross part (the big part with Inf and NaN zeroed), so the term that needs one takes
// a_small' instead: A is truncated (its small part has A's sign), and where that small part is
// 0 a value 2^-30 of A's with A's sign stands in (weights_small). An Inf in b_big then meets a
// nonzero factor of the big product's sign, never 0 * Inf, and the sum is the Inf or NaN that
// fp32 gives; the stand-in adds at most 2^-30 of |a b| to a finite product. Two kinds of tiny
// weight still meet an Inf in dy as NaN where fp32 gives Inf: a TF32 value exactly below 2^-96
// (no stand-in), and a subnormal below 2^-136, whose big part truncates to 0.
//
// Partial sums as tf32x3.cuh's: each k-block's 12 products summed by the tensor cores, added
// to the total in fp32 (the backward's accuracy rule). Roles as the forward's v4: a producer
// warpgroup whose lane 0 of warp c fills consumer c's ring, two consumer warpgroups that walk
// their own tiles (out of step, so one's drain and stores run under the other's wgmmas).
// The store goes from the accumulators to dx's NCHW rows (a quad's 8 pixels of a channel are
// one 32-byte sector).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "channels_last.cuh"
#include "tma.cuh"
#include "wgmma_resident_b.cuh"

namespace scratchops {
namespace swapped {

constexpr int kConsumers = tf32x3::kConsumerWarpgroups;
constexpr int kThreads = tf32x3::kThreads;  // warpgroup 0 produces
constexpr int kProducerRegisters = 40, kConsumerRegisters = 232;
static_assert(tf32x3::register_split_fits(kProducerRegisters, kConsumerRegisters),
              "the split fits in the launch's registers (tf32x3.cuh)");
constexpr int kTileRows = 64;    // dx channels a tile (wgmma M)
constexpr int kTileCols = 128;   // pixels of one dx row a tile (wgmma N)
constexpr int kBlockK = 32;      // dy channels a k-block: one 128-byte swizzled row a pixel
constexpr int kRowBytes = 128;
constexpr int kHaloCols = 8;     // box rows past the tile's for a kernel row's later taps
constexpr int kPartBytes = (kTileCols + kHaloCols) * kRowBytes;  // one part's box, 17 KB
constexpr int kStageBytes = 2 * kPartBytes;                       // big, then small
constexpr int kStages = 3;                                        // a consumer's ring
constexpr int kSmemBytes = kConsumers * kStages * kStageBytes + tc::kAlignSlack;
static_assert(kPartBytes % 1024 == 0, "each box starts on the swizzle's 1024-byte period");
static_assert(kSmemBytes <= resident_b::kMaxSmemBytes, "the rings fit in shared memory");
constexpr int kKSteps = kBlockK / 8;
// The packed weights: for each dx channel tile mt and k-block q of the consumers' order
// (q = (r cblocks + cb) kernel_w + s: kernel row r, channel block cb, tap s), each k-step's
// fragments, a float4 a thread: 128 x 4 floats a k-step.
constexpr int kFragmentFloats = kWarpgroupThreads * 4;

// The walk (host-filled). Tile t = ((n out_h + oh) col_tiles + ct) m_tiles + mt: dx channels
// 64 mt .., pixels (n, oh, 128 ct ..). The flipped convolution reads dy at (oh + r dil_h -
// pad_h, ow + s dil_w - pad_w).
struct Walk {
    int out_h, out_w, channels;  // dx's
    int col_tiles, m_tiles, tiles;
    int cblocks, kernel_h, kernel_w, dil_h, dil_w, pad_h, pad_w;
    int kblocks;    // kernel_h kernel_w cblocks
    int box_bytes;  // one part's box
    __device__ void tile(int t, int& n, int& oh, int& ow0, int& mt) const {
        mt = t % m_tiles;
        const int rest = t / m_tiles;
        ow0 = rest % col_tiles * kTileCols;
        oh = rest / col_tiles % out_h;
        n = rest / col_tiles / out_h;
    }
};

struct Params {
    CUtensorMap big_map, small_map;  // dy's parts, channels-last
    const float4* packed_a;
    float* dx;
    Walk walk;
};

// A's small part for the b_big product (see the top): the truncated split's small part, or
// where that is 0, 2^-30 of the value with its sign (0 for values below 2^-96, and for 0).
__device__ __forceinline__ uint32_t weights_small(const Tf32Split& parts, float value) {
    const uint32_t bits = __float_as_uint(value), exponent = (bits >> 23) & 0xffu;
    const uint32_t stand_in = exponent > 30 ? (bits & 0x80000000u) | ((exponent - 30) << 23) : 0u;
    return (parts.small & 0x7fffffffu) != 0 ? parts.small : stand_in;
}

// One k-step's fragments from the thread's float4 (a0 .. a3: rows g, g + 8, columns t, t + 4).
__device__ __forceinline__ void weight_fragments(const float4& v, uint32_t (&big)[1][4],
                                                 uint32_t (&small)[1][4],
                                                 uint32_t (&cross)[1][4]) {
    const float values[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const Tf32Split parts = split_tf32_truncated(values[i]);
        big[0][i] = parts.big;
        cross[0][i] = parts.cross;
        small[0][i] = weights_small(parts, values[i]);
    }
}

struct Barriers {
    uint64_t full[kConsumers][kStages], empty[kConsumers][kStages];
    __device__ void init() {
        for (int c = 0; c < kConsumers; ++c)
            for (int i = 0; i < kStages; ++i) {
                mbarrier_init(&full[c][i], 1);
                mbarrier_init(&empty[c][i], 4);  // each of the consumer's warps
            }
        fence_barrier_init();
    }
};

// Lane 0 of the producer's warp c: consumer c's ring, both parts of each box.
__device__ __forceinline__ void fill_ring(const Params& params, uint8_t* ring, Barriers& bars,
                                          int c) {
    const Walk& w = params.walk;
    const int step = static_cast<int>(gridDim.x) * kConsumers;
    int j = 0;
    for (int t = static_cast<int>(blockIdx.x) * kConsumers + c; t < w.tiles; t += step) {
        int n, oh, ow0, mt;
        w.tile(t, n, oh, ow0, mt);
        for (int r = 0; r < w.kernel_h; ++r)
            for (int cb = 0; cb < w.cblocks; ++cb, ++j) {
                const int stage = j % kStages;
                if (j >= kStages) mbarrier_wait(&bars.empty[c][stage], ((j / kStages) - 1) & 1);
                uint64_t* full = &bars.full[c][stage];
                mbarrier_arrive_expect_tx(full, 2 * w.box_bytes);
                uint8_t* dst = ring + stage * kStageBytes;
                const int x0 = ow0 - w.pad_w, y0 = oh + r * w.dil_h - w.pad_h;
                tma_load_4d(dst, &params.big_map, cb * kBlockK, x0, y0, n, full);
                tma_load_4d(dst + kPartBytes, &params.small_map, cb * kBlockK, x0, y0, n, full);
            }
    }
}

// The tile's total to dx (NCHW): accumulator 4 nb + 2 h + e is channel 64 mt + 16 warp +
// lane / 4 + 8 h, pixel ow0 + 8 nb + 2 (lane % 4) + e of row (n, oh).
__device__ __forceinline__ void store_tile(const float (&total)[1][kTileCols / 2],
                                           const Walk& w, float* dx, int n, int oh, int ow0,
                                           int mt, int warp, int lane) {
    const bool pairs = w.out_w % 2 == 0;  // (every pair then starts 8-byte aligned)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int channel = mt * kTileRows + warp * 16 + lane / 4 + 8 * h;
        if (channel >= w.channels) continue;
        float* row = dx + ((static_cast<long long>(n) * w.channels + channel) * w.out_h + oh) *
                              w.out_w;
#pragma unroll
        for (int nb = 0; nb < kTileCols / 8; ++nb) {
            const int ow = ow0 + 8 * nb + 2 * (lane % 4);
            const float v0 = total[0][4 * nb + 2 * h], v1 = total[0][4 * nb + 2 * h + 1];
            if (pairs && ow + 1 < w.out_w) {
                *reinterpret_cast<float2*>(row + ow) = make_float2(v0, v1);
            } else {
                if (ow < w.out_w) row[ow] = v0;
                if (ow + 1 < w.out_w) row[ow + 1] = v1;
            }
        }
    }
}

__global__ void __launch_bounds__(kThreads, 1)
    swapped_kernel(const __grid_constant__ Params params) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ uint8_t smem_raw[];
    __shared__ Barriers bars;
    uint8_t* rings = tc::align_1024(smem_raw);
    const Walk& w = params.walk;
    const int role = static_cast<int>(threadIdx.x) / kWarpgroupThreads;  // 0: the producer
    const int step = static_cast<int>(gridDim.x) * kConsumers;
    if (threadIdx.x == 0) bars.init();
    __syncthreads();
    if (role == 0) {
        setmaxnreg_dec<kProducerRegisters>();
        const int c = static_cast<int>(threadIdx.x) / 32;
        if (c >= kConsumers || threadIdx.x % 32 != 0) return;
        fill_ring(params, rings + c * kStages * kStageBytes, bars, c);
        return;
    }
    setmaxnreg_inc<kConsumerRegisters>();
    const int c = role - 1;
    const int me = static_cast<int>(threadIdx.x) % kWarpgroupThreads;
    const int warp = me / 32, lane = me % 32;
    const uint32_t ring = smem_address(rings) + c * kStages * kStageBytes;

    float total[1][kTileCols / 2], part[1][kTileCols / 2];
    tc::set_zero(part);
    uint32_t a_big[2][1][4], a_small[2][1][4], a_cross[2][1][4];  // k-step s: buffer s % 2
    // The thread's fragments of the k-block being consumed, refilled with the next one's as
    // each k-step takes its own (the loads a k-block ahead, as tf32x3.cuh's A).
    float4 raw[kKSteps];
    const int first = static_cast<int>(blockIdx.x) * kConsumers + c;
    auto fragments_of = [&](int t, int q) {
        const int mt = t % w.m_tiles;  // (t past the last tile: a valid, unused tile's)
        return params.packed_a + (static_cast<long long>(mt) * w.kblocks + q) * kKSteps *
                                     kWarpgroupThreads + me;
    };
    {
        const float4* a = fragments_of(first, 0);
#pragma unroll
        for (int s = 0; s < kKSteps; ++s) raw[s] = __ldg(a + s * kWarpgroupThreads);
    }
    int j = 0;
    for (int t = first; t < w.tiles; t += step) {
        int n, oh, ow0, mt;
        w.tile(t, n, oh, ow0, mt);
        tc::set_zero(total);
        int q = 0;
        for (int r = 0; r < w.kernel_h; ++r)
            for (int cb = 0; cb < w.cblocks; ++cb, ++j) {
                const int stage = j % kStages;
                mbarrier_wait(&bars.full[c][stage], (j / kStages) & 1);
                const uint32_t big = ring + stage * kStageBytes;
                for (int s = 0; s < w.kernel_w; ++s, ++q) {
                    // Tap s's rows start s dil_w rows into the box; k-step ks 32 ks bytes
                    // into every row (+ 2 ks in 16-byte units).
                    const uint32_t rows = s * w.dil_w * kRowBytes;
                    const uint64_t desc_big = make_smem_desc_sw128(big + rows);
                    const uint64_t desc_small = make_smem_desc_sw128(big + kPartBytes + rows);
                    const float4* next =
                        q + 1 < w.kblocks ? fragments_of(t, q + 1) : fragments_of(t + step, 0);
#pragma unroll
                    for (int ks = 0; ks < kKSteps; ++ks) {
                        const int buf = ks & 1;
                        weight_fragments(raw[ks], a_big[buf], a_small[buf], a_cross[buf]);
                        pin_registers(a_big[buf][0]);
                        pin_registers(a_small[buf][0]);
                        pin_registers(a_cross[buf][0]);
                        raw[ks] = __ldg(next + ks * kWarpgroupThreads);
                        // (the cross slot takes b_big with a_small': see the top)
                        tf32x3::kstep_wgmmas<kTileCols, false>(
                            part, a_big[buf], a_small[buf], a_cross[buf], desc_big + 2 * ks,
                            desc_small + 2 * ks, desc_big + 2 * ks, ks > 0);
                        wgmma_wait<1>();  // the previous k-step's registers are free
                        pin_registers(a_big[buf ^ 1][0]);
                        pin_registers(a_small[buf ^ 1][0]);
                        pin_registers(a_cross[buf ^ 1][0]);
                    }
                    wgmma_wait<0>();  // the k-block's partial sum is complete
                    pin_registers(part[0]);
                    pin_registers(a_big[1][0]);
                    pin_registers(a_small[1][0]);
                    pin_registers(a_cross[1][0]);
                    tc::add_to(total, part);
                }
                if (lane == 0) mbarrier_arrive(&bars.empty[c][stage]);  // the box is read
            }
        store_tile(total, w, params.dx, n, oh, ow0, mt, warp, lane);
    }
#else
    __trap();  // built without sm_90a: the launch refuses these GPUs; reaching here is a bug
#endif
}

// The flipped weights in the consumers' order (see kFragmentFloats): float f of thread
// (warp, lane)'s k-step ks of k-block q and tile mt is Wf[m][co][r][s] = W[co][m][kh-1-r]
// [kw-1-s], m = 64 mt + 16 warp + lane / 4 + 8 (f % 2), co = 32 cb + 8 ks + lane % 4 +
// 4 (f / 2), 0 past C or Cout.
__global__ void pack_weights_kernel(const float* __restrict__ weight, float* __restrict__ packed,
                                    int total, int channels, int out_channels, int kernel_h,
                                    int kernel_w, int cblocks) {
    const int i = static_cast<int>(blockIdx.x) * blockDim.x + static_cast<int>(threadIdx.x);
    if (i >= total) return;
    const int f = i % 4, me = i / 4 % kWarpgroupThreads, ks = i / kFragmentFloats % kKSteps;
    const int kblocks = kernel_h * kernel_w * cblocks;
    const int q = i / (kFragmentFloats * kKSteps) % kblocks;
    const int mt = i / (kFragmentFloats * kKSteps * kblocks);
    const int s = q % kernel_w, cb = q / kernel_w % cblocks, r = q / kernel_w / cblocks;
    const int warp = me / 32, lane = me % 32;
    const int m = mt * kTileRows + warp * 16 + lane / 4 + 8 * (f % 2);
    const int co = cb * kBlockK + ks * 8 + lane % 4 + 4 * (f / 2);
    packed[i] = m < channels && co < out_channels
                    ? weight[((static_cast<long long>(co) * channels + m) * kernel_h + kernel_h -
                              1 - r) * kernel_w + kernel_w - 1 - s]
                    : 0.0f;
}

// dy (images x Cout x P) to its two parts, channels-last (images x P x Cout): split_tf32's big
// and small, one 64 x 64 tile a block (channels_last.cuh), image blockIdx.y.
constexpr int kSplitThreads = 256;
__global__ void split_channels_last_kernel(const float* __restrict__ dy, float* __restrict__ big,
                                           float* __restrict__ small, int channels, int pixels,
                                           int tiles_p) {
    __shared__ float tile[kVecTile][kVecTile + 1];
    const int c0 = static_cast<int>(blockIdx.x) / tiles_p * kVecTile;
    const int p0 = static_cast<int>(blockIdx.x) % tiles_p * kVecTile;
    channels_last_tile_load(dy, channels, pixels, c0, p0, static_cast<int>(blockIdx.y), tile,
                            static_cast<int>(threadIdx.x), kSplitThreads);
    __syncthreads();
    const long long offset = static_cast<long long>(blockIdx.y) * channels * pixels;
    channels_last_tile_store<float, true>(tile, big + offset, channels, pixels, c0, p0,
                                          static_cast<int>(threadIdx.x), kSplitThreads);
    channels_last_tile_store<float, true, true>(tile, small + offset, channels, pixels, c0, p0,
                                                static_cast<int>(threadIdx.x), kSplitThreads);
}

}  // namespace swapped
}  // namespace scratchops
