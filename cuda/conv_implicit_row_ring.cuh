// conv_implicit_row_ring.cuh — implicit-GEMM convolution v5 (conv_implicit.cu): v4 without
// its channels-last copy, for the 16-bit types. Each CTA makes v4's channels-last A rows
// itself, in shared memory, from the NCHW input (sm_90a; fp16 and bf16; stride 1).
//
// Why. v4 (conv_implicit_staged_a.cuh) reads A as boxes of a channels-last copy of x: there a
// pixel's channels are one 128-byte row, so a tap's shift along the output row is a whole row,
// a descriptor offset. The copy is one more pass over x: 0.14-0.17 ms of P31's 0.70 in bf16
// (docs/notes.md). The NCHW input cannot be boxed at a tap's shift (a box starts on 16 bytes, a
// pixel is 2), so here the same rows are made in shared memory, one input row at a time:
//   1. the copy engine brings a chunk, 8 channels x 128 pixels of one input row, into a 2 KB
//      staging buffer: two boxes {64 pixels, 1 row, 8 channels, 1 image} of the input, each 8
//      rows of 128 bytes in the 128-byte swizzle (channel c's 16-byte chunk p at p ^ c);
//   2. a warp reads it as 8 x 8 matrices (ldmatrix: 8 channels x 8 pixels) and stores them
//      transposed (stmatrix .trans: 8 pixels x 8 channels), so that each pixel's 8 channels
//      land as one 16-byte chunk of its 128-byte row, where v4's swizzle puts them;
//   3. once all of an input row's chunks are there, the consumers read its slot as v4 reads a
//      box: tap s of kernel row r of output row oh is the slot of input row oh + r - pad_h,
//      from s dil_w rows in (slot row j holds input pixel j - pad_w).
// A CTA walks consecutive output rows (its share of the batch x out_h rows, a tile each), so
// each input row is made once and read by the kernel_h tiles it serves: the ring holds
// kernel_h + 1 input rows, those of the two consumers' tiles (one output row apart; at an
// image's first tile the two need 2 kernel_h rows, so the second waits for the first's).
//
// The load sequence. A CTA's tile i (output row g0 + i) reads loads first_load(i) + r, r <
// kernel_h: the first tile of an image (or of the CTA) brings kernel_h new input rows, every
// other tile one. Load j lives in slot j % slots, made once the tiles reading load j - slots
// have released it. A slot's empty barrier counts kernel_h tiles' 4 warps; a load that fewer
// tiles read (at an image's or the CTA's last rows) has the missing arrivals made by its
// filler up front (RowCursor::readers).
//
// Roles. Warpgroup 0: warp 0's lane 0 asks for the resident B (one barrier); then its four
// warps fill the ring (a 64-channel row in two rounds of copy latency), chunk k of the load
// sequence by filler k % kFillers through its own staging buffer (read into registers at
// once, so the next chunk's copy flies while this one waits for its slot), and ask L2 for the
// same chunk kPrefetchLoads loads ahead (a load then waits on L2, not DRAM). The two consumer
// warpgroups take the CTA's tiles in turn, and multiply and store as v4 does.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "conv_implicit_staged_a.cuh"
#include "tma.cuh"

namespace scratchops {
namespace row_ring {

using staged_a::kConsumers;
using staged_a::kRowBytes;
using staged_a::kThreads;

constexpr int kSlotRows = 128;                     // a padded input row, one pixel a row
constexpr int kSlotBytes = kSlotRows * kRowBytes;  // 16 KB
constexpr int kMaxKernelH = 3;                     // the ring's slots: kernel_h + 1 <= 4
constexpr int kChunkChannels = 8;                  // a chunk: one 16-byte chunk of a row
constexpr int kBoxPixels = 64;                     // a staging box's 128-byte rows
constexpr int kStageBytes = kChunkChannels * kSlotRows * 2;  // two boxes
constexpr int kFillers = 4;                        // the producer's warps
constexpr int kPrefetchLoads = 3;
// The rows a tile may read past its slot (taps s > 0 of its last pixels, never stored): they
// fall in the next slot or, after the last, in the staging buffers.
constexpr int kHaloRows = staged_a::kHaloRows;
static_assert(kHaloRows * kRowBytes <= kFillers * kStageBytes, "the last slot's overrun");
// A CTA walks at least this many output rows, or v4 serves the shape (the ring's first
// kernel_h rows and the resident B are a CTA's fixed cost).
constexpr int kMinRowsPerCta = 8;

template <int BN, class Op>
using Cfg = staged_a::Config<BN, 2, true, Op>;  // v4's B k-block and store stage, 128-row tiles

// The register split (setmaxnreg): a filler holds a chunk (16 registers) and two cursors
// (ptxas -v: with v4's 40 the kernel spilled, with 56 not); the consumers' code is v4's.
constexpr int kProducerRegisters = 56, kConsumerRegisters = 224;
static_assert(tf32x3::register_split_fits(kProducerRegisters, kConsumerRegisters),
              "the split fits in the launch's registers (tf32x3.cuh)");

// The dynamic shared memory a launch may ask: all a CTA can opt into on sm_90 (v4 keeps 1 KB
// for its static barriers; this kernel declares none: RingShared is in the dynamic area).
constexpr int kMaxSmemBytes = kSm90SmemOptinBytes;

struct RingWalk {
    int rows;  // batch x out_h output rows, one tile each
    int out_h, out_w, height, width, kernel_h, kernel_w, dil_w, pad_h, pad_w;
    int chunks, slots, num_kb;  // chunks: Cin in chunks of 8 channels
    // This CTA's output rows g0 .. g1 - 1: an even share of all (none for a CTA of a packing
    // grid larger than the rows).
    __device__ void cta_rows(int& g0, int& g1) const {
        g0 = static_cast<int>(static_cast<long long>(rows) * blockIdx.x / gridDim.x);
        g1 = static_cast<int>(static_cast<long long>(rows) * (blockIdx.x + 1) / gridDim.x);
    }
    // Tile i's first load (its kernel row 0), the CTA's rows starting at g0: i, plus
    // kernel_h - 1 more for each image the CTA entered after its first.
    __device__ int first_load(int g0, int i) const {
        return i + (kernel_h - 1) * ((g0 + i) / out_h - g0 / out_h);
    }
};

// A place in the load sequence: load j is kernel row r of tile i, the tile that reads it
// first.
struct RowCursor {
    int i = 0, r = 0, j = 0;
    __device__ void next(const RingWalk& w, int g0) {
        ++j;
        if (++r < w.kernel_h) return;
        ++i;
        r = (g0 + i) % w.out_h == 0 ? 0 : w.kernel_h - 1;  // an image's first tile: all new
    }
    // The tiles that read it: i + d for d <= r, while in the CTA's rows and the image.
    __device__ int readers(const RingWalk& w, int g0, int g1) const {
        const int g = g0 + i;
        return 1 + min(r, min(g1 - 1 - g, w.out_h - 1 - g % w.out_h));
    }
    __device__ void coords(const RingWalk& w, int g0, int& n, int& ih) const {
        n = (g0 + i) / w.out_h;
        ih = (g0 + i) % w.out_h + r - w.pad_h;
    }
};

struct RingParams {
    CUtensorMap x_map;  // the NCHW input, boxes {64, 1, 8, 1}
    const uint8_t* packed_b;
    tc::PackedB b_layout;
    RingWalk walk;
};

struct RingBarriers {
    uint64_t slot_full[kMaxKernelH + 1], slot_empty[kMaxKernelH + 1], staged[kFillers];
    uint64_t b_ready;
    __device__ void init(const RingWalk& w) {
        for (int s = 0; s < w.slots; ++s) {
            mbarrier_init(&slot_full[s], w.chunks);  // each chunk's filler
            mbarrier_init(&slot_empty[s], w.kernel_h * 4);  // its readers' 4 warps
        }
        for (int f = 0; f < kFillers; ++f) mbarrier_init(&staged[f], 1);
        mbarrier_init(&b_ready, 1);
        fence_barrier_init();
    }
};

// The CTA's barriers and its output rows (g0, g1: the consumers read them from here at each
// tile; held in registers across the products they were spilled, ptxas -v).
struct RingShared { RingBarriers bars; int row_range[2]; };

// Shared memory from a 1024-byte boundary: the ring, the staging buffers (whole KBs, so the
// next stays aligned), the resident B, the consumers' store stages (v4's, without its column
// parameters), the column parameters (one area a CTA, not v4's one a consumer: applies() asks
// one column tile, so they are the same for every tile), the barriers.
template <int BN, class Op>
struct SmemLayout {
    static constexpr int kColumnParamBytes = Cfg<BN, Op>::kColumnParamBytes;
    static constexpr int kStoreStageBytes = Cfg<BN, Op>::kStoreStageBytes;
    int staging, b_resident, store_stages, column_params, shared, end;  // (the ring at 0)
    __host__ __device__ constexpr SmemLayout(int slots, int num_kb)
        : staging(slots * kSlotBytes),
          b_resident(staging + kFillers * kStageBytes),
          store_stages(b_resident + num_kb * Cfg<BN, Op>::kBBytes),
          column_params(store_stages + kConsumers * kStoreStageBytes),
          shared(column_params + kColumnParamBytes),
          end(shared + static_cast<int>(sizeof(RingShared))) {}
};

template <int BN, class Op>
constexpr int smem_bytes(int slots, int num_kb) {
    return SmemLayout<BN, Op>(slots, num_kb).end + tc::kAlignSlack;
}

// Filler f's place in its chunks of the load sequence: chunk q of load `at`, then every
// kFillers-th chunk (so each filler has a chunk of every load where a load has kFillers chunks
// or more, which applies() asks: a filler's chunks of a load then follow all of its chunks of
// earlier loads, and a full load means that every earlier load is full, which the consumers'
// parity waits need). `ahead`: kPrefetchLoads loads further on, for the L2 prefetch.
struct ChunkCursor {
    RowCursor at, ahead;
    int q;
    __device__ ChunkCursor(const RingWalk& w, int g0, int f) : q(f) {
        for (int k = 0; k < kPrefetchLoads; ++k) ahead.next(w, g0);
    }
    __device__ void next(const RingWalk& w, int g0) {
        for (q += kFillers; q >= w.chunks; q -= w.chunks) {
            at.next(w, g0);
            ahead.next(w, g0);
        }
    }
};

// The copy of `c`'s chunk into the stage (lane 0), with the prefetch of its chunk `ahead`.
__device__ __forceinline__ void stage_chunk(const RingParams& params, const ChunkCursor& c,
                                            uint8_t* stage, uint64_t* staged, int g0, int g1) {
    const RingWalk& w = params.walk;
    int n, ih;
    c.at.coords(w, g0, n, ih);
    mbarrier_arrive_expect_tx(staged, kStageBytes);
    for (int b = 0; b < 2; ++b)
        tma_load_4d(stage + b * kStageBytes / 2, &params.x_map, b * kBoxPixels, ih,
                    c.q * kChunkChannels, n, staged);
    c.ahead.coords(w, g0, n, ih);
    if (g0 + c.ahead.i < g1 && ih >= 0 && ih < w.height)
        for (int b = 0; b < 2; ++b)
            tma_prefetch_4d(&params.x_map, b * kBoxPixels, ih, c.q * kChunkChannels, n);
}

// A staged chunk, 8 channels x 16 groups of 8 pixels (8 groups a box), read as 8 x 8 matrices
// 4 groups (one ldmatrix x4) at a time: lane 8 m + i gives row i of matrix m, channel i of
// group g = 4 b + m (box g / 8, its chunk g % 8, swizzled). Then stored transposed into chunk
// q of the slot's rows pad_w + pixel: lane 8 m + i gives matrix m's column i, pixel 8 g + i.
// Only the input's W / 8 groups; groups past the last are clamped onto it (the same values to
// the same place).
constexpr int kLoadsAChunk = kSlotRows / 32;  // ldmatrix x4s (4 groups of 8 pixels each)
__device__ __forceinline__ int clamped_group(int b, int groups, int lane) {
    return min(4 * b + lane / 8, groups - 1);
}
__device__ __forceinline__ void load_chunk(uint32_t stage, int groups, int lane,
                                           uint32_t (&v)[kLoadsAChunk][4]) {
#pragma unroll
    for (int b = 0; b < kLoadsAChunk; ++b)
        if (4 * b < groups) {
            const int g = clamped_group(b, groups, lane), i = lane % 8;
            ldmatrix_x4(stage + ((g / 8) * kChunkChannels + i) * kRowBytes + ((g % 8) ^ i) * 16,
                        v[b]);
        }
}
__device__ __forceinline__ void store_chunk(uint32_t slot, int q, int groups, int pad_w,
                                            int lane, const uint32_t (&v)[kLoadsAChunk][4]) {
#pragma unroll
    for (int b = 0; b < kLoadsAChunk; ++b)
        if (4 * b < groups) {
            const int row = pad_w + 8 * clamped_group(b, groups, lane) + lane % 8;
            stmatrix_x4_trans(slot + row * kRowBytes + ((q ^ (row % 8)) * 16), v[b]);
        }
}

// Filler f's chunks of the CTA's load sequence (its rows g0 .. g1 - 1). The stage is read
// into registers at once, so the next chunk's copy is in flight while this one waits for its
// slot and is stored.
__device__ void fill_ring(const RingParams& params, uint8_t* ring, uint8_t* staging,
                          RingBarriers& bars, int f, int lane, int g0, int g1) {
    const RingWalk& w = params.walk;
    uint8_t* stage = staging + f * kStageBytes;
    uint64_t* staged = &bars.staged[f];
    ChunkCursor now(w, g0, f), next = now;  // the chunk stored, the chunk copied next
    auto issue_next = [&] {
        if (lane == 0 && g0 + next.at.i < g1) stage_chunk(params, next, stage, staged, g0, g1);
        next.next(w, g0);
    };
    issue_next();
    for (int uses = 0; g0 + now.at.i < g1; ++uses, now.next(w, g0)) {
        mbarrier_wait(staged, uses & 1);
        uint32_t v[kLoadsAChunk][4];
        load_chunk(smem_address(stage), w.width / 8, lane, v);
        fence_proxy_async_shared();  // (the reads before the copy engine's next writes)
        __syncwarp();
        issue_next();
        const int j = now.at.j, slot = j % w.slots;
        if (j >= w.slots) mbarrier_wait(&bars.slot_empty[slot], (j / w.slots - 1) & 1);
        if (now.q == 0 && lane == 0)  // the arrivals of the tiles that will not read it
            for (int a = now.at.readers(w, g0, g1) * 4; a < w.kernel_h * 4; ++a)
                mbarrier_arrive(&bars.slot_empty[slot]);
        store_chunk(smem_address(ring) + slot * kSlotBytes, now.q, w.width / 8, w.pad_w, lane,
                    v);
        fence_proxy_async_shared();  // (wgmma reads the slot through the async proxy)
        __syncwarp();
        if (lane == 0) mbarrier_arrive(&bars.slot_full[slot]);
    }
}

// The CTA's first loads asked of L2 at once, beside fillers 1-3's first copies: without it the
// first tile waits for kernel_h rows of chunks copied kFillers at a time, from DRAM; after
// them the fillers' own prefetches run ahead. (Issued before the weights' packing, it made
// ptxas spill.)
__device__ void prefetch_first_loads(const RingParams& params, int g0, int g1) {
    const RingWalk& w = params.walk;
    RowCursor at;
    for (int k = 0; k < w.kernel_h + kPrefetchLoads && g0 + at.i < g1; ++k, at.next(w, g0)) {
        int n, ih;
        at.coords(w, g0, n, ih);
        if (ih >= 0 && ih < w.height)
            for (int q = 0; q < w.chunks; ++q)
                for (int b = 0; b < 2; ++b)
                    tma_prefetch_4d(&params.x_map, b * kBoxPixels, ih, q * kChunkChannels, n);
    }
}

// pack_inside: the grid packs B from b_source into params.packed_b first (a cooperative
// launch); otherwise params.packed_b holds B packed already.
template <int BN, class Op, class Epilogue, class BSource>
__global__ void __launch_bounds__(kThreads, 1)
    row_ring_kernel(const __grid_constant__ RingParams params, const Epilogue epilogue,
                    const BSource b_source, const bool pack_inside) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using C = Cfg<BN, Op>;
    using Layout = SmemLayout<BN, Op>;
    extern __shared__ uint8_t smem_raw[];
    const RingWalk& w = params.walk;
    tc::pack_b_if_told<BN, Op, true>(b_source, pack_inside, params.packed_b, params.b_layout);
    int g0, g1;
    w.cta_rows(g0, g1);
    if (g0 == g1) return;
    const Layout layout(w.slots, w.num_kb);
    uint8_t* ring = tc::align_1024(smem_raw);
    uint8_t* staging = ring + layout.staging;
    uint8_t* b_resident = ring + layout.b_resident;
    float* column_params = reinterpret_cast<float*>(ring + layout.column_params);
    RingShared& shared = *reinterpret_cast<RingShared*>(ring + layout.shared);
    RingBarriers& bars = shared.bars;
    // The ring zeroed once: the slots' rows outside pad_w .. pad_w + W - 1 (the padding) and
    // their chunks past Cin are never written and must read as zeros (0 x NaN is not 0).
    for (int o = static_cast<int>(threadIdx.x) * 16; o < w.slots * kSlotBytes; o += kThreads * 16)
        *reinterpret_cast<uint4*>(ring + o) = make_uint4(0, 0, 0, 0);
    fence_proxy_async_shared();
    // The columns' parameters, the same for every tile (applies(): one column tile, 0 .. BN - 1).
    for (int col = static_cast<int>(threadIdx.x); col < BN; col += kThreads)
        epilogue.channel_params(col, column_params[col], column_params[BN + col]);
    if (threadIdx.x == 0) {
        bars.init(w);
        shared.row_range[0] = g0;
        shared.row_range[1] = g1;
    }
    __syncthreads();

    const int role = static_cast<int>(threadIdx.x) / kWarpgroupThreads;  // 0: the producer
    const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    if (role == 0) {
        setmaxnreg_dec<kProducerRegisters>();
        if (warp == 0 && lane == 0) {  // the first loads into L2, then all of B once, one barrier
            prefetch_first_loads(params, g0, g1);
            mbarrier_arrive_expect_tx(&bars.b_ready, w.num_kb * C::kBBytes);
            for (int kb = 0; kb < w.num_kb; ++kb)
                bulk_copy_to_shared(b_resident + kb * C::kBBytes,
                                    params.packed_b + kb * params.b_layout.stage_bytes(),
                                    C::kBBytes, &bars.b_ready);
        }
        __syncwarp();
        fill_ring(params, ring, staging, bars, warp, lane, g0, g1);
        return;
    }

    setmaxnreg_inc<kConsumerRegisters>();
    const int c = role - 1;
    const tc::TileCoords me{0, 0, 0, 0, warp, lane};
    const uint32_t ring_address = smem_address(ring);
    mbarrier_wait(&bars.b_ready, 0);
    float acc[2][BN / 2];
    tc::set_zero(acc);  // (every tile's first wgmma overwrites it; zeroed so none reads garbage)
    int prev_slot = -1;  // the slot of the kernel row before, released once its wgmmas are done
    auto release_prev = [&] {
        if (lane == 0 && prev_slot >= 0) mbarrier_arrive(&bars.slot_empty[prev_slot]);
    };
    const int* row_range = shared.row_range;
    for (int g = row_range[0] + c; g < row_range[1]; g += kConsumers) {  // output row g
        const int first = w.first_load(row_range[0], g - row_range[0]);  // (tile g - g0)
        int kstep = 0;
        for (int r = 0; r < w.kernel_h; ++r) {
            const int j = first + r, slot = j % w.slots;
            mbarrier_wait(&bars.slot_full[slot], (j / w.slots) & 1);
            const uint32_t a_address = ring_address + slot * kSlotBytes;
            for (int s = 0; s < w.kernel_w; ++s, ++kstep) {
                const uint64_t b_desc = make_smem_desc_sw128(
                    smem_address(b_resident) + (r * w.kernel_w + s) * C::kBBytes);
#pragma unroll
                for (int mb = 0; mb < 2; ++mb) pin_registers(acc[mb]);
                wgmma_fence();
                // Tap s's A starts s dil_w rows into the slot, row block mb 64 rows further;
                // k-step t 32 t bytes into every row (+ 2 t in 16-byte units).
#pragma unroll
                for (int t = 0; t < 4; ++t)
#pragma unroll
                    for (int mb = 0; mb < 2; ++mb)
                        staged_a::Mma<BN, Op>::mma(
                            acc[mb],
                            staged_a::a_descriptor(a_address +
                                                   (s * w.dil_w + mb * 64) * kRowBytes) +
                                2 * t,
                            b_desc + 2 * t, kstep > 0 || t > 0);
                wgmma_commit();
                wgmma_wait<1>();  // the previous k-block's wgmmas are done: free its slot
                release_prev();
                prev_slot = s == w.kernel_w - 1 ? slot : -1;
            }
        }
        wgmma_wait<0>();
#pragma unroll
        for (int mb = 0; mb < 2; ++mb) pin_registers(acc[mb]);
        release_prev();
        prev_slot = -1;
        // The tile is output row g, image g / out_h, pixels 0 .. out_w - 1 (rows past them
        // not stored). (Worked out here, not before the products: registers.)
        tc::TileCoords at = me.at(g / w.out_h, g * w.out_w, 0);
        at.rows = w.out_w;
        uint8_t* store_stage = ring + layout.store_stages + c * Layout::kStoreStageBytes;
        epilogue.template store_staged<BN, 2, staged_a::kStoreChannels, C::kStoreStride>(
            acc, at, reinterpret_cast<Op*>(store_stage), column_params, 1 + c);
    }
#else
    __trap();  // built without sm_90a: conv_implicit.cu launches it on the wgmma engine alone
#endif
}

}  // namespace row_ring
}  // namespace scratchops
