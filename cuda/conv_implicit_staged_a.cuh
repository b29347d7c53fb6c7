// conv_implicit_staged_a.cuh — implicit-GEMM convolution v4 (conv_implicit.cu): A staged in
// shared memory by the copy engine from a channels-last copy of the input, both wgmma
// operands read from shared memory (sm_90a; the single-product modes TF32, fp16 and bf16;
// stride 1).
//
// Why. v1-v3 gather A from the NCHW input into registers, a thread's values of a tap one
// channel plane apart; the profile of P31 in bf16 shows them waited on (tensor pipe 20 %,
// long_scoreboard first). In a channels-last copy (N, H, W, C) a pixel's channels at a tap
// are one run, so a k-block of A is a box of the 4-D tensor that the tensor memory
// accelerator (tma.cuh) moves in one instruction, swizzled for wgmma, zeros wherever the tap
// falls in the padding. The copy is one pass over the input; in TF32 it also rounds each
// value to the nearest TF32 (wgmma would truncate).
//
// The GEMM. A tile is kTileRows = 64 MB output pixels of one output row (n, oh, ow0 ..; MB 2,
// or 1 where that fills the GPU better: conv_implicit_staged_a_launch.cuh's launch); those
// past the row's end are computed from zeros and not stored (TileCoords::rows). Row i
// of A's k-block (tap (r, s), channel block cb) is x[n][oh + r dil_h - pad_h]
// [ow0 + i + s dil_w - pad_w][cb kBlockK + c], c < kBlockK: with stride 1, the box
// {kBlockK, kTileRows, 1, 1} at (cb kBlockK, ow0 + s dil_w - pad_w, oh + r dil_h - pad_h, n),
// one 128-byte swizzled row a pixel like B's. B: the weights packed with k = tap cblocks
// kBlockK + c (channels past Cin zero in both: the box reads past the tensor as zeros), in
// the natural k order (packed_k): the tensor cores read both operands' rows in one order.
//
// One box, several taps. Taps s of one kernel row read one input row shifted by s dil_w, so a
// box of kTileRows + (kernel_w - 1) dil_w rows serves them all (where that is within
// kHaloRows more rows; otherwise a box a tap), tap s's A starting s dil_w rows in.
// B resident. Where one column tile of the packed B fits beside the A rings (P31 in 16 bits:
// 147 KB), each CTA loads it once (as wgmma_resident_b.cuh does) and only A moves.
// Both because the first v4 moved 32 KB from L2 per 128 x 128 x 64 bf16 products, 64 bytes a
// cycle an SM at the tensor rate, twice what L2 gives (ncu: L2 62 %, tensor pipe 27 %).
//
// Roles. One producer warpgroup and kConsumers consumer warpgroups. Consumer c walks its own
// tiles (blockIdx.x kConsumers + c, then + gridDim.x kConsumers) through its own rings, fed
// by lane 0 of the producer's warp c, so one consumer's epilogue runs under another's
// wgmmas. The epilogue (ConvStore::store_staged) sends a tile out 16 channels at a time
// through shared memory; it, not the products, is what limits v4 (docs/notes.md: P31 in
// bf16 0.38 ms of products alone against 1.10 ms with the stores).
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_runtime.h>

#include "channels_last.cuh"
#include "tma.cuh"
#include "wgmma_resident_b.cuh"

namespace scratchops {
namespace staged_a {

using tc::PackedB;
using tc::TileCoords;

constexpr int kConsumers = tf32x3::kConsumerWarpgroups;  // (its register split: setmaxnreg)
constexpr int kThreads = tf32x3::kThreads;                // warpgroup 0 produces
// The register split (setmaxnreg): the producer's ring loops spilled in tf32x3.cuh's 24; the
// consumers' 128 accumulators and the epilogue fit in 232.
constexpr int kProducerRegisters = 40, kConsumerRegisters = 232;
static_assert(tf32x3::register_split_fits(kProducerRegisters, kConsumerRegisters),
              "the split fits in the launch's registers (tf32x3.cuh)");
constexpr int kRowBytes = 128;  // a swizzled row: one pixel's (or output channel's) k-block
constexpr int kHaloRows = 8;    // rows an A box may have past its tile's, for its later taps
using resident_b::kMaxSmemBytes;  // (the dynamic shared memory a launch may ask)

// The store (conv_store.cuh's ConvStore::store_staged): kStoreChannels output channels at a
// time through a consumer's own stage of that many rows of the tile's pixels, each row padded
// by 16 bytes: stmatrix's 16-byte rows of 8 channels then fall in 8 different groups of 4
// banks, and float's scalar stores (rows 4 words (mod 16) apart) in 32 different banks.
constexpr int kStoreChannels = 16;

template <int BN, int MB, bool kResidentB, class T>
struct Config {
    static constexpr int kTileRows = 64 * MB;
    static constexpr int kAStageBytes = (kTileRows + kHaloRows) * kRowBytes;  // x 1024
    static constexpr int kBBytes = BN * kRowBytes;  // pack_b's first tile of a k-block
    static constexpr int kAStages = 2, kBStages = 4;  // a consumer's rings
    static constexpr int kStoreStride = kTileRows + 16 / static_cast<int>(sizeof(T));
    static constexpr int kStoreStageBytes =
        (kStoreChannels * kStoreStride * static_cast<int>(sizeof(T)) + 15) / 16 * 16;
    static constexpr int kColumnParamBytes = 8 * BN;  // the tile's columns' add[BN], add2[BN]
    static constexpr int kStoreBytes = kStoreStageBytes + kColumnParamBytes;  // stage, params
    static constexpr int kRingBytes =  // (a multiple of 1024: the boxes stay aligned)
        kAStages * kAStageBytes + (kResidentB ? 0 : kBStages * kBBytes);
    // All of it, from a 1024-byte boundary: the consumers' rings, B's num_kb k-blocks where
    // resident, the consumers' store stages.
    static constexpr int smem_bytes(int num_kb) {
        return kConsumers * (kRingBytes + kStoreBytes) + (kResidentB ? num_kb * kBBytes : 0) +
               tc::kAlignSlack;
    }
    static_assert(smem_bytes(0) <= kMaxSmemBytes, "the rings must fit in shared memory");
};

// The walk over tiles and k-blocks (host-filled). Tile t: column tile nt = t % n_tiles, then
// row stretch rt, output row oh and image n from t / n_tiles = (n out_h + oh) row_tiles + rt.
// A tile's A boxes l = 0 .. a_loads - 1: l = (r groups + g) cblocks + cb with kernel row r,
// tap group g (groups = kernel_w / taps_a) and channel block cb; box l serves taps
// s = g taps_a + i, i < taps_a, each one k-block: packed B's (r kernel_w + s) cblocks + cb.
struct Walk {
    int batch, out_h, out_w, row_tiles, n_tiles, tiles;
    int cblocks, num_kb, kernel_w, dil_h, dil_w, pad_h, pad_w;
    int taps_a, groups, a_loads, box_bytes;
    __device__ void tile(int t, int tile_rows, int& n, int& oh, int& ow0, int& nt) const {
        nt = t % n_tiles;
        const int rest = t / n_tiles, rt = rest % row_tiles, row = rest / row_tiles;
        oh = row % out_h;
        n = row / out_h;
        ow0 = rt * tile_rows;
    }
    __device__ void box(int l, int& r, int& g, int& cb) const {
        cb = l % cblocks;
        const int rg = l / cblocks;
        g = rg % groups;
        r = rg / groups;
    }
    __device__ int kblock(int r, int g, int cb, int i) const {
        return (r * kernel_w + g * taps_a + i) * cblocks + cb;
    }
};

// The input's channels-last copy: the NCHW input x, its channels, pixels a channel plane and
// images, the copy y (a_map's base), and whether the kernel's grid makes it before its first
// tile (by_grid: see copy_channels_last; set by the launch) or its own kernel did.
struct ChannelsLastCopy {
    const void* x = nullptr;  // nullptr: y holds the copy already
    void* y = nullptr;
    int channels = 0, pixels = 0, batch = 0;
    bool by_grid = false;
};

// The kernel's parameters, a __grid_constant__ parameter: a_map (the channels-last input's
// tensor map) must live in the parameter space.
struct Params {
    CUtensorMap a_map;
    const uint8_t* packed_b;
    PackedB b_layout;  // (b_layout.stage_bytes(): one k-block of the packed B)
    Walk walk;
    ChannelsLastCopy copy;
};

// The channels-last copy made by the grid (channels_last.cuh's tiles: tile t of all images'
// tiles by CTA t mod gridDim.x, through the start of the CTA's dynamic shared memory, free
// before the first tile), T's values as the copy kernel writes them (TF32 rounded to
// nearest in float). A grid barrier must follow before any CTA's copy engine reads it
// (pack_b_in_grid's, with its proxy fences).
template <class T>
__device__ __forceinline__ void copy_channels_last(const ChannelsLastCopy& copy, uint8_t* smem) {
    auto* tile = reinterpret_cast<T(*)[kVecTile + 1]>(smem);
    const int tiles_p = (copy.pixels + kVecTile - 1) / kVecTile;
    const int per_image = (copy.channels + kVecTile - 1) / kVecTile * tiles_p;
    const long long tiles = static_cast<long long>(per_image) * copy.batch;
    for (long long t = blockIdx.x; t < tiles; t += gridDim.x) {
        channels_last_tile<T, std::is_same_v<T, float>>(
            static_cast<const T*>(copy.x), static_cast<T*>(copy.y), copy.channels, copy.pixels,
            tiles_p, static_cast<int>(t % per_image), static_cast<int>(t / per_image), tile,
            threadIdx.x, blockDim.x);
        __syncthreads();  // (the tile is refilled for the next one)
    }
    // (the rings' copies, the async proxy, overwrite the tile's bytes next)
    fence_proxy_async_shared();
}

// A's descriptor for rows starting at `address`, a whole number of 128-byte rows past a
// 1024-byte boundary (tap i's rows i dil_w into its box): the 128-byte swizzle is a function
// of the shared-memory address (chunk bits 4-6 XOR row bits 7-9), for the copy engine that
// wrote the box and for wgmma alike, so the descriptor is the usual one with base offset 0.
// (Measured: with bits 49-51 set to the row's phase, every test case failed.)
__device__ __forceinline__ uint64_t a_descriptor(uint32_t address) {
    return make_smem_desc_sw128(address);
}

template <int BN, class Op>
using Mma = std::conditional_t<tc::Operand<Op>::kNative16, WgmmaHalfSs<BN, Op>, WgmmaTf32Ss<BN>>;

// The rings' mbarriers: a stage is full once its copy has landed (one arrival and its bytes),
// empty once each of the consumer's 4 warps has released it; b_ready: the resident B landed.
template <int kAS, int kBS>
struct Barriers {
    uint64_t a_full[kConsumers][kAS], a_empty[kConsumers][kAS];
    uint64_t b_full[kConsumers][kBS], b_empty[kConsumers][kBS], b_ready;
    __device__ void init() {
        for (int c = 0; c < kConsumers; ++c) {
            for (int i = 0; i < kAS; ++i) {
                mbarrier_init(&a_full[c][i], 1);
                mbarrier_init(&a_empty[c][i], 4);
            }
            for (int i = 0; i < kBS; ++i) {
                mbarrier_init(&b_full[c][i], 1);
                mbarrier_init(&b_empty[c][i], 4);
            }
        }
        mbarrier_init(&b_ready, 1);
        fence_barrier_init();
    }
};

// The producer's lane 0 of warp c: consumer c's rings filled (and, by warp 0, the resident B).
template <class Cfg, bool kResidentB, class Op, class Bars>
__device__ void fill_rings(const Params& params, uint8_t* rings, uint8_t* b_resident, Bars& bars,
                           int c) {
    constexpr int kAS = Cfg::kAStages, kBS = Cfg::kBStages;
    const Walk& walk = params.walk;
    const int step = static_cast<int>(gridDim.x) * kConsumers;
    if (kResidentB && c == 0) {  // all of B once (one column tile), on one barrier
        mbarrier_arrive_expect_tx(&bars.b_ready, walk.num_kb * Cfg::kBBytes);
        for (int kb = 0; kb < walk.num_kb; ++kb)
            bulk_copy_to_shared(b_resident + kb * Cfg::kBBytes,
                                params.packed_b + kb * params.b_layout.stage_bytes(), Cfg::kBBytes,
                                &bars.b_ready);
    }
    // Lane 0 of warp c fills consumer c's rings: each A box, then (unless B is resident)
    // the B k-blocks of its taps, each stage once the consumer has released its previous
    // use.
    uint8_t* a_ring = rings + c * Cfg::kRingBytes;
    uint8_t* b_ring = a_ring + kAS * Cfg::kAStageBytes;
    int a_j = 0, b_j = 0;
    for (int t = static_cast<int>(blockIdx.x) * kConsumers + c; t < walk.tiles; t += step) {
        int n, oh, ow0, nt;
        walk.tile(t, Cfg::kTileRows, n, oh, ow0, nt);
        const uint8_t* b_tile =
            params.packed_b +
            static_cast<long long>(nt) * walk.num_kb * params.b_layout.stage_bytes();
        for (int l = 0; l < walk.a_loads; ++l, ++a_j) {
            int r, g, cb;
            walk.box(l, r, g, cb);
            const int a_stage = a_j % kAS;
            if (a_j >= kAS) mbarrier_wait(&bars.a_empty[c][a_stage], ((a_j / kAS) - 1) & 1);
            mbarrier_arrive_expect_tx(&bars.a_full[c][a_stage], walk.box_bytes);
            tma_load_4d(a_ring + a_stage * Cfg::kAStageBytes, &params.a_map,
                        cb * tc::Operand<Op>::kBlockK,
                        ow0 + g * walk.taps_a * walk.dil_w - walk.pad_w,
                        oh + r * walk.dil_h - walk.pad_h, n, &bars.a_full[c][a_stage]);
            if constexpr (!kResidentB) {
                for (int i = 0; i < walk.taps_a; ++i, ++b_j) {
                    const int b_stage = b_j % kBS;
                    if (b_j >= kBS)
                        mbarrier_wait(&bars.b_empty[c][b_stage], ((b_j / kBS) - 1) & 1);
                    mbarrier_arrive_expect_tx(&bars.b_full[c][b_stage], Cfg::kBBytes);
                    bulk_copy_to_shared(b_ring + b_stage * Cfg::kBBytes,
                                        b_tile + walk.kblock(r, g, cb, i) *
                                                     params.b_layout.stage_bytes(),
                                        Cfg::kBBytes, &bars.b_full[c][b_stage]);
                }
            }
        }
    }
}

// pack_inside: the grid packs B from b_source into params.packed_b first (tc::pack_b_in_grid,
// a cooperative launch), and makes the input's channels-last copy where params.copy.by_grid;
// otherwise params.packed_b holds B packed already and the copy is made.
template <int BN, int MB, bool kResidentB, class Op, class Epilogue, class BSource>
__global__ void __launch_bounds__(kThreads, 1)
    staged_a_kernel(const __grid_constant__ Params params, const Epilogue epilogue,
                    const BSource b_source, const bool pack_inside) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using Cfg = Config<BN, MB, kResidentB, Op>;
    constexpr int kAS = Cfg::kAStages, kBS = Cfg::kBStages;
    extern __shared__ uint8_t smem_raw[];
    if constexpr (BSource::kPacks)  // (the copy is published by pack_b_if_told's barrier)
        if (pack_inside && params.copy.by_grid) copy_channels_last<Op>(params.copy, smem_raw);
    tc::pack_b_if_told<BN, Op, true>(b_source, pack_inside, params.packed_b, params.b_layout);
    __shared__ Barriers<kAS, kBS> bars;
    uint8_t* rings = tc::align_1024(smem_raw);
    uint8_t* b_resident = rings + kConsumers * Cfg::kRingBytes;  // (kResidentB)
    const Walk& walk = params.walk;
    const int role = static_cast<int>(threadIdx.x) / kWarpgroupThreads;  // 0: the producer
    const int step = static_cast<int>(gridDim.x) * kConsumers;
    if (threadIdx.x == 0) bars.init();
    __syncthreads();

    if (role == 0) {
        setmaxnreg_dec<kProducerRegisters>();
        const int c = static_cast<int>(threadIdx.x) / 32;
        if (c >= kConsumers || threadIdx.x % 32 != 0) return;
        fill_rings<Cfg, kResidentB, Op>(params, rings, b_resident, bars, c);
        return;
    }

    setmaxnreg_inc<kConsumerRegisters>();
    const int c = role - 1;
    const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    const TileCoords me{0, 0, 0, 0, warp, lane};  // (warpgroup 0: the tile is this one's)
    const uint32_t a_ring = smem_address(rings) + c * Cfg::kRingBytes;
    const uint32_t b_ring = a_ring + kAS * Cfg::kAStageBytes;
    if (kResidentB) mbarrier_wait(&bars.b_ready, 0);
    float acc[MB][BN / 2];
    tc::set_zero(acc);  // (every tile's first wgmma overwrites it; zeroed so none reads garbage)
    // The stages of the k-block before the current one, released once its wgmmas are done
    // (-1: none; its A stage only after the last tap of its box).
    int prev_a = -1, prev_b = -1;
    auto release_prev = [&] {
        if (lane == 0 && prev_b >= 0) mbarrier_arrive(&bars.b_empty[c][prev_b]);
        if (lane == 0 && prev_a >= 0) mbarrier_arrive(&bars.a_empty[c][prev_a]);
    };
    int a_j = 0, b_j = 0;
    const int me_in_group = warp * 32 + lane;
    for (int t = static_cast<int>(blockIdx.x) * kConsumers + c; t < walk.tiles; t += step) {
        int n, oh, ow0, nt;
        walk.tile(t, Cfg::kTileRows, n, oh, ow0, nt);
        // The epilogue's parameters of column me_in_group, loaded now and used after the
        // products (ConvStore::store_staged says why).
        float add = 0.0f, add2 = 0.0f;
        if (me_in_group < BN) epilogue.channel_params(nt * BN + me_in_group, add, add2);
        int kstep = 0;
        for (int l = 0; l < walk.a_loads; ++l, ++a_j) {
            int r, g, cb;
            walk.box(l, r, g, cb);
            const int a_stage = a_j % kAS;
            mbarrier_wait(&bars.a_full[c][a_stage], (a_j / kAS) & 1);
            const uint32_t a_address = a_ring + a_stage * Cfg::kAStageBytes;
            for (int i = 0; i < walk.taps_a; ++i, ++kstep) {
                uint32_t b_address;
                int b_stage = -1;
                if (kResidentB) {
                    b_address = smem_address(b_resident) + walk.kblock(r, g, cb, i) * Cfg::kBBytes;
                } else {
                    b_stage = b_j % kBS;
                    mbarrier_wait(&bars.b_full[c][b_stage], (b_j / kBS) & 1);
                    b_address = b_ring + b_stage * Cfg::kBBytes;
                    ++b_j;
                }
                const uint64_t b_desc = make_smem_desc_sw128(b_address);
#pragma unroll
                for (int mb = 0; mb < MB; ++mb) pin_registers(acc[mb]);
                wgmma_fence();
                // Tap i's A starts i dil_w rows into the box, row block mb 64 rows further;
                // k-step s 32 s bytes into every row (+ 2 s in 16-byte units).
#pragma unroll
                for (int s = 0; s < 4; ++s)
#pragma unroll
                    for (int mb = 0; mb < MB; ++mb)
                        Mma<BN, Op>::mma(
                            acc[mb],
                            a_descriptor(a_address + (i * walk.dil_w + mb * 64) * kRowBytes) +
                                2 * s,
                            b_desc + 2 * s, kstep > 0 || s > 0);
                wgmma_commit();
                wgmma_wait<1>();  // the previous k-block's wgmmas are done: free its stages
                release_prev();
                prev_b = b_stage;
                prev_a = i == walk.taps_a - 1 ? a_stage : -1;
            }
        }
        wgmma_wait<0>();
#pragma unroll
        for (int mb = 0; mb < MB; ++mb) pin_registers(acc[mb]);
        release_prev();
        prev_a = prev_b = -1;
        // The pixel order is linear: the epilogue's row m0 + i is pixel (n, oh, ow0 + i), for
        // the rows left in the output row.
        TileCoords at = me.at(n, (n * walk.out_h + oh) * walk.out_w + ow0, nt * BN);
        at.rows = walk.out_w - ow0 < Cfg::kTileRows ? walk.out_w - ow0 : Cfg::kTileRows;
        uint8_t* store_area =
            b_resident + (kResidentB ? walk.num_kb * Cfg::kBBytes : 0) + c * Cfg::kStoreBytes;
        float* column_params = reinterpret_cast<float*>(store_area + Cfg::kStoreStageBytes);
        if (me_in_group < BN) {
            column_params[me_in_group] = add;
            column_params[BN + me_in_group] = add2;
        }
        named_barrier_sync(1 + c, kWarpgroupThreads);
        epilogue.template store_staged<BN, MB, kStoreChannels, Cfg::kStoreStride>(
            acc, at, reinterpret_cast<Op*>(store_area), column_params, 1 + c);
    }
#else
    // Built without sm_90a: conv_implicit.cu launches this on the wgmma engine alone;
    // reaching here would be a bug: fail loudly.
    __trap();
#endif
}

}  // namespace staged_a
}  // namespace scratchops
