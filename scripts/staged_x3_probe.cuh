// staged_x3_probe.cuh — the kernel of staged_x3_probe.cu (its driver; the top of that file
// says what the prototype is and how to build it): the planes pass, the rings' barriers, the
// producer's copies and the consumers' three products a k-step.
#pragma once

#include <cstdint>

#include "conv_implicit_staged_a_launch.cuh"

namespace scratchops {
namespace staged_x3 {

using staged_a::a_descriptor;
using staged_a::kHaloRows;
using staged_a::kRowBytes;
using staged_a::kStoreChannels;
using staged_a::Walk;
constexpr int kConsumers = 2, kThreads = 384, kBN = 128, kGroup = 9;
constexpr int kBTileBytes = kBN * kRowBytes;   // one TF32 tile
constexpr int kBStageBytes = 2 * kBTileBytes;  // big, small
constexpr int kStoreStride = 64 + 4;           // a consumer stores 64 rows
constexpr int kStoreStageBytes = (kStoreChannels * kStoreStride * 4 + 15) / 16 * 16;
constexpr int kStoreBytes = kStoreStageBytes + 8 * kBN;
template <bool kShared, int kAStages = 2, int kBStages = kShared ? 3 : 2>
struct Cfg {
    static constexpr int kTileRows = kShared ? 128 : 64;
    static constexpr int kRings = kShared ? 1 : kConsumers;
    static constexpr int kPlaneBytes = (kTileRows + kHaloRows) * kRowBytes;  // 1024-aligned
    static constexpr int kAStageBytes = 2 * kPlaneBytes;                      // big, small
    static constexpr int kAS = kAStages, kBS = kBStages;
    static constexpr int kRingBytes = kAS * kAStageBytes + kBS * kBStageBytes;
    static constexpr int kSmemBytes =
        kRings * kRingBytes + kConsumers * kStoreBytes + tc::kAlignSlack;
    static_assert(kSmemBytes <= staged_a::kMaxSmemBytes, "the rings fit");
};

struct Params {
    CUtensorMap a_map;  // (C, W, H, 2N): images n, then their small planes at N + n
    const uint8_t* packed_b;
    tc::PackedB b_layout;
    Walk walk;
    int images;
};

// The pass: tile (64 channels x 64 pixels) of an image into both planes.
__global__ void __launch_bounds__(256) planes_kernel(const float* x, float* planes, int images,
                                                     int channels, int pixels) {
    __shared__ float tile[kVecTile][kVecTile + 1];
    const int tiles_p = (pixels + kVecTile - 1) / kVecTile;
    const int per_image = (channels + kVecTile - 1) / kVecTile * tiles_p;
    const long long image_floats = static_cast<long long>(channels) * pixels;
    for (long long t = blockIdx.x; t < static_cast<long long>(per_image) * images;
         t += gridDim.x) {
        const int image = static_cast<int>(t / per_image), ti = static_cast<int>(t % per_image);
        const int c0 = ti / tiles_p * kVecTile, p0 = ti % tiles_p * kVecTile;
        channels_last_tile_load(x, channels, pixels, c0, p0, image, tile, threadIdx.x,
                                blockDim.x);
        __syncthreads();
        channels_last_tile_store<float, true>(tile, planes + image * image_floats, channels,
                                              pixels, c0, p0, threadIdx.x, blockDim.x);
        channels_last_tile_store<float, true, true>(
            tile, planes + (images + image) * image_floats, channels, pixels, c0, p0,
            threadIdx.x, blockDim.x);
        __syncthreads();
    }
}

// The rings' barriers: a stage is empty once each warp that reads it (4 a ring of its own, 8
// a shared one) has released it.
template <class C>
struct Barriers {
    uint64_t a_full[C::kRings][C::kAS], a_empty[C::kRings][C::kAS];
    uint64_t b_full[C::kRings][C::kBS], b_empty[C::kRings][C::kBS];
    __device__ void init() {
        const int readers = 4 * kConsumers / C::kRings;
        for (int c = 0; c < C::kRings; ++c) {
            for (int i = 0; i < C::kAS; ++i) {
                mbarrier_init(&a_full[c][i], 1);
                mbarrier_init(&a_empty[c][i], readers);
            }
            for (int i = 0; i < C::kBS; ++i) {
                mbarrier_init(&b_full[c][i], 1);
                mbarrier_init(&b_empty[c][i], readers);
            }
        }
        fence_barrier_init();
    }
};

// Ring c's tiles: a CTA's in turn (shared), or consumer c's (its own).
template <bool kShared>
__device__ __forceinline__ int first_tile(int c) {
    return kShared ? blockIdx.x : blockIdx.x * kConsumers + c;
}
template <bool kShared>
__device__ __forceinline__ int tile_step() {
    return kShared ? gridDim.x : gridDim.x * kConsumers;
}

template <bool kShared, class C>
__device__ void fill_rings(const Params& p, uint8_t* rings, Barriers<C>& bars, int c) {
    constexpr int kAS = C::kAS, kBS = C::kBS, kAStageBytes = C::kAStageBytes;
    const Walk& w = p.walk;
    uint8_t* a_ring = rings + c * C::kRingBytes;
    uint8_t* b_ring = a_ring + kAS * kAStageBytes;
    int a_j = 0, b_j = 0;
    for (int t = first_tile<kShared>(c); t < w.tiles; t += tile_step<kShared>()) {
        int n, oh, ow0, nt;
        w.tile(t, C::kTileRows, n, oh, ow0, nt);
        const uint8_t* b_tile = p.packed_b + static_cast<long long>(nt) * w.num_kb *
                                                 p.b_layout.stage_bytes();
        for (int l = 0; l < w.a_loads; ++l, ++a_j) {
            int r, g, cb;
            w.box(l, r, g, cb);
            const int as = a_j % kAS;
            if (a_j >= kAS) mbarrier_wait(&bars.a_empty[c][as], ((a_j / kAS) - 1) & 1);
            mbarrier_arrive_expect_tx(&bars.a_full[c][as], 2 * w.box_bytes);
            const int col = ow0 + g * w.taps_a * w.dil_w - w.pad_w;
            const int row = oh + r * w.dil_h - w.pad_h;
            uint8_t* dst = a_ring + as * kAStageBytes;
            tma_load_4d(dst, &p.a_map, cb * tc::kBlockK, col, row, n, &bars.a_full[c][as]);
            tma_load_4d(dst + C::kPlaneBytes, &p.a_map, cb * tc::kBlockK, col, row, p.images + n,
                        &bars.a_full[c][as]);
            for (int i = 0; i < w.taps_a; ++i, ++b_j) {
                const int bs = b_j % kBS;
                if (b_j >= kBS) mbarrier_wait(&bars.b_empty[c][bs], ((b_j / kBS) - 1) & 1);
                mbarrier_arrive_expect_tx(&bars.b_full[c][bs], kBStageBytes);
                bulk_copy_to_shared(b_ring + bs * kBStageBytes,
                                    b_tile + w.kblock(r, g, cb, i) * p.b_layout.stage_bytes(),
                                    kBStageBytes, &bars.b_full[c][bs]);
            }
        }
    }
}

template <bool kShared, class C, class Epilogue>
__global__ void __launch_bounds__(kThreads, 1)
    staged_x3_kernel(const __grid_constant__ Params p, const Epilogue epilogue) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int kAS = C::kAS, kBS = C::kBS, kAStageBytes = C::kAStageBytes;
    extern __shared__ uint8_t smem_raw[];
    __shared__ Barriers<C> bars;
    uint8_t* rings = tc::align_1024(smem_raw);
    const Walk& w = p.walk;
    const int role = threadIdx.x / kWarpgroupThreads;
    if (threadIdx.x == 0) bars.init();
    __syncthreads();
    if (role == 0) {
        setmaxnreg_dec<staged_a::kProducerRegisters>();
        const int c = threadIdx.x / 32;
        if (c < C::kRings && threadIdx.x % 32 == 0) fill_rings<kShared, C>(p, rings, bars, c);
        return;
    }
    setmaxnreg_inc<staged_a::kConsumerRegisters>();
    const int c = role - 1, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    const int ring = kShared ? 0 : c;
    const int half_rows = kShared ? 64 * c : 0;  // (this consumer's rows of the tile)
    const tc::TileCoords me{0, 0, 0, 0, warp, lane};
    const uint32_t a_ring = smem_address(rings) + ring * C::kRingBytes;
    const uint32_t b_ring = a_ring + kAS * kAStageBytes;
    uint8_t* store_area = rings + C::kRings * C::kRingBytes + c * kStoreBytes;
    float* column_params = reinterpret_cast<float*>(store_area + kStoreStageBytes);
    float total[1][kBN / 2], part[1][kBN / 2];
    tc::set_zero(part);
    int prev_a = -1, prev_b = -1, a_j = 0, b_j = 0;
    auto release_prev = [&] {
        if (lane == 0 && prev_b >= 0) mbarrier_arrive(&bars.b_empty[ring][prev_b]);
        if (lane == 0 && prev_a >= 0) mbarrier_arrive(&bars.a_empty[ring][prev_a]);
    };
    const int me_in_group = warp * 32 + lane;
    for (int t = first_tile<kShared>(c); t < w.tiles; t += tile_step<kShared>()) {
        int n, oh, ow0, nt;
        w.tile(t, C::kTileRows, n, oh, ow0, nt);
        float add = 0.0f, add2 = 0.0f;
        if (me_in_group < kBN) epilogue.channel_params(nt * kBN + me_in_group, add, add2);
        tc::set_zero(total);
        // The tile's k-blocks in groups of kGroup, each group drained at its end (a drain in a
        // branch of the k-block loop made ptxas serialise every wgmma: C7518); k-block kb is
        // tap i of box l (kb = l taps_a + i), whose A stage is waited for at its first tap.
        int as = 0;
        uint32_t a_big_base = 0;
        for (int kb0 = 0; kb0 < w.num_kb; kb0 += kGroup) {
            const int kb_end = kb0 + kGroup < w.num_kb ? kb0 + kGroup : w.num_kb;
            for (int kb = kb0; kb < kb_end; ++kb, ++b_j) {
                const int i = kb % w.taps_a;
                if (i == 0) {
                    as = a_j % kAS;
                    mbarrier_wait(&bars.a_full[ring][as], (a_j / kAS) & 1);
                    a_big_base = a_ring + as * kAStageBytes + half_rows * kRowBytes;
                }
                const int bs = b_j % kBS;
                mbarrier_wait(&bars.b_full[ring][bs], (b_j / kBS) & 1);
                const uint32_t b_address = b_ring + bs * kBStageBytes;
                const uint64_t b_big = make_smem_desc_sw128(b_address);
                const uint64_t b_small = make_smem_desc_sw128(b_address + kBTileBytes);
                const uint64_t a_big = a_descriptor(a_big_base + i * w.dil_w * kRowBytes);
                const uint64_t a_small =
                    a_descriptor(a_big_base + C::kPlaneBytes + i * w.dil_w * kRowBytes);
                pin_registers(part[0]);
                wgmma_fence();
#pragma unroll
                for (int s = 0; s < 4; ++s) {
                    WgmmaTf32Ss<kBN>::mma(part[0], a_small + 2 * s, b_big + 2 * s,
                                          kb > kb0 || s > 0);
                    WgmmaTf32Ss<kBN>::mma(part[0], a_big + 2 * s, b_small + 2 * s, 1);
                    WgmmaTf32Ss<kBN>::mma(part[0], a_big + 2 * s, b_big + 2 * s, 1);
                }
                wgmma_commit();
                wgmma_wait<1>();
                release_prev();
                prev_b = bs;
                prev_a = i == w.taps_a - 1 ? as : -1;
                if (i == w.taps_a - 1) ++a_j;
            }
            wgmma_wait<0>();  // the group's partial sum joins the total
            pin_registers(part[0]);
#pragma unroll
            for (int v = 0; v < kBN / 2; ++v) total[0][v] += part[0][v];
        }
        release_prev();
        prev_a = prev_b = -1;
        const int first = ow0 + half_rows;  // (past the row's end: nothing to store)
        tc::TileCoords at = me.at(n, (n * w.out_h + oh) * w.out_w + first, nt * kBN);
        at.rows = w.out_w - first < 64 ? w.out_w - first : 64;
        if (at.rows <= 0) continue;
        if (me_in_group < kBN) {
            column_params[me_in_group] = add;
            column_params[kBN + me_in_group] = add2;
        }
        named_barrier_sync(1 + c, kWarpgroupThreads);
        epilogue.template store_staged<kBN, 1, kStoreChannels, kStoreStride>(
            total, at, reinterpret_cast<float*>(store_area), column_params, 1 + c);
    }
#else
    __trap();  // (wgmma and setmaxnreg need sm_90a: build as staged_x3_probe.cu says)
#endif
}

}  // namespace staged_x3
}  // namespace scratchops
