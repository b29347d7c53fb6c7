// tensor_core_operands.cuh — what both tensor-core engines (tf32x3.cuh on wgmma,
// mma_sync_3xtf32.cuh on mma.sync) take and give: the k-block, B packed once per launch as
// shared memory wants it, the A loaders' and epilogues' interfaces, the tile grid, and the
// preparation of a launch.
//
// B packed: once per launch, pack_b (pack_b.cuh) writes B's big, small and cross parts (the
// 3xTF32 split: tf32x3.cuh) as the exact bytes shared memory wants: per (tile of BN rows,
// k-block of 32), three BN x 128-byte tiles in the 128-byte swizzle layout, which an engine
// copies into shared memory as they are (the cross tile only where B has a non-finite value,
// so pack_b may leave it to a second pass that writes it only then: its kDeferCross).
// Multiplied natively in fp16 / bf16 (Operand below), a k-block is 64 values of the 16-bit
// type and only its first tile is written: one product, no split.
// A's side, the values each thread loads and the register fragments it makes of them:
// tensor_core_a_fragments.cuh.
//
// Layouts (PTX ISA "Asynchronous Warpgroup Level Matrix Shared Memory Layout" and "Register
// Fragments"): in a 64-row block, warp q of a warpgroup owns rows 16q .. 16q + 15; lane
// (g = lane / 4, t = lane % 4) holds A rows g and g + 8 and, of the accumulators, element
// 4 * nb + 2h + c at (row g + 8h, column 8 nb + 2t + c). The A registers of k-step j hold
// logical columns 8j + t (a0, a1) and 8j + t + 4 (a2, a3); physical_k() maps logical to
// physical k so that thread t needs exactly the 8 consecutive physical k [8t, 8t + 8) of a
// k-block. B's packing applies the same map. In fp16 / bf16 (k16 wgmma, two values a
// register, the lower k in the low half) the registers of k-step j hold logical columns
// 16j + 2t, + 1 (a0 row g, a1 row g + 8) and 16j + 2t + 8, + 9 (a2, a3), and the map gives
// thread t the 16 consecutive physical k [16t, 16t + 16).
//
// Interfaces the engines' kernels are instantiated with:
//   ALoader: Row row(int batch, int m); KBlock kblock(int kb, int t);
//            KPtr kptr(Row, KBlock): where the thread's 8 values of a row and k-block are,
//            in the loader's own form (computed once a k-block, so that fetch2 is cheap);
//            KPtr none(): a KPtr of no values; float2 fetch2(KPtr, int e): values e, e + 1
//            (0 where absent)   (see gemm.cu, conv_implicit.cuh). A loader for the native
//            16-bit products (Operand<Op>::kNative16: conv_implicit.cuh's Im2colRows) gives
//            its thread 16 values a k-block, and uint32_t fetch_pair(KPtr, int e): values
//            e, e + 1 as their bits, e in the low half.
//   Epilogue: Prepared prepare(TileCoords with the thread's place only) once per thread
//            (per-thread constants, e.g. its columns' parameters), then
//            void store(const float (&acc)[MB][BN / 2], TileCoords, const Prepared&) for one
//            tile's accumulators of this thread.
//   Source (for pack_b.cuh): float operator()(int entry, int n, int k), 0 outside B; and
//            bool present() with kPacks (a source a launch may pack itself: PackedAlready).
#pragma once

#include <atomic>
#include <cstdint>

#include <cuda_runtime.h>

#include "common.cuh"
#include "hopper.cuh"

namespace scratchops {
namespace tc {

constexpr int kBlockK = 32;  // TF32 values per k-block: one 128-byte swizzled row

// The operand type the tensor cores multiply: float (TF32 products: three, or one in the TF32
// mode) or a 16-bit type, __half or __nv_bfloat16, multiplied natively (wgmma_half.cuh). A
// k-block is one 128-byte row of B either way; a thread of a quad loads kThreadK consecutive
// physical k of it.
template <class Op>
struct Operand {
    static constexpr bool kNative16 = sizeof(Op) == 2;
    static constexpr int kBlockK = 128 / static_cast<int>(sizeof(Op));  // 32 or 64
    static constexpr int kThreadK = kBlockK / 4;                         // 8 or 16
};
// pack_b runs at most this many blocks (PackedB::pack_blocks: fewer for a small B); each
// writes one "B has a non-finite value" flag, which the main kernel ORs together
// (b_has_nonfinite), so no flag needs clearing before a launch.
constexpr int kPackBlocks = 1024;
constexpr int kPackThreads = 256;  // a block's threads: a slice of a stage's work items

// Logical column L of a k-block, as wgmma sees it, holds physical k = physical_k(L).
// TF32 (L < 32): thread t = L % 4 of a quad needs physical [8t, 8t + 8), in k-step j = L / 8
// as (8t + 2j, 8t + 2j + 1). 16-bit (L < 64): thread t = (L % 8) / 2 needs [16t, 16t + 16), in
// k-step j = L / 16 as 16t + 4j + (0, 1) (register h) and + (2, 3) (register 2 + h).
template <class Op = float>
__host__ __device__ constexpr int physical_k(int L) {
    if constexpr (Operand<Op>::kNative16)
        return 16 * ((L % 8) / 2) + 4 * (L / 16) + 2 * ((L % 16) / 8) + L % 2;
    else
        return 8 * (L % 4) + 2 * (L / 8) + (L % 8) / 4;
}

// Where both operands come from shared memory (A staged there too: conv_implicit_staged_a.cuh),
// wgmma reads A's and B's rows in the same order, so no thread needs its k together and
// column L is physical k = L itself: packed_k chooses between the two.
template <class Op, bool kNaturalK>
__host__ __device__ constexpr int packed_k(int L) {
    return kNaturalK ? L : physical_k<Op>(L);
}

// Byte offset of logical column L of row n inside one packed tile (128-byte swizzle: the
// 16-byte chunk c of row n sits at chunk position c ^ (n % 8)); column L's bytes start at
// L * sizeof(Op) in the unswizzled row.
template <class Op = float>
__host__ __device__ constexpr int packed_offset(int n, int L) {
    constexpr int kBytes = static_cast<int>(sizeof(Op));
    return n * 128 + ((((L * kBytes) / 16) ^ (n % 8)) * 16) + (L * kBytes) % 16;
}

// Packed B of `entries` matrices (one, or one per batch entry): per (entry, tile of BN rows,
// k-block), a stage of three BN x 128-byte tiles (big, small, cross), then kPackBlocks flags.
struct PackedB {
    int bn, num_kb, n_tiles, entries;
    __host__ __device__ long long stage_bytes() const { return 3LL * bn * 128; }
    __host__ __device__ long long tiles_bytes() const {
        return static_cast<long long>(entries) * n_tiles * num_kb * stage_bytes();
    }
    __host__ __device__ long long bytes() const { return tiles_bytes() + kPackBlocks * 4; }
    __host__ __device__ int stages() const { return entries * n_tiles * num_kb; }
    // pack_b's work: a stage's 8 bn items (below) in slices of kPackThreads, a slice a block
    // at a time. (A block a stage left P31's 18 stages to 18 blocks: 6.3 us, its gathers'
    // latency, before a batch-1 convolution of 30 us.)
    __host__ __device__ int slices() const { return (8 * bn + kPackThreads - 1) / kPackThreads; }
    __host__ __device__ int units() const { return stages() * slices(); }
    // pack_b's blocks (a block a slice, kPackBlocks at most): fixed by the layout, so the
    // packing and the main kernel agree on how many flags there are.
    __host__ __device__ int pack_blocks() const {
        return units() < kPackBlocks ? (units() > 0 ? units() : 1) : kPackBlocks;
    }
};

// (The 16-bit packing has a third as many tiles a stage in use and at most as many k-blocks, as
// its K counts in blocks of 64: its bytes fit in the TF32 packing's of the same K rounded to
// 8, which is what a caller allocates.)
template <class Op = float>
PackedB packed_b_layout(int bn, int n, int k, int entries) {
    constexpr int kBlock = Operand<Op>::kBlockK;
    return {bn, (k + kBlock - 1) / kBlock, (n + bn - 1) / bn, entries};
}

// Where one tile sits, for the epilogue: batch entry, first row, first column.
struct TileCoords {
    int batch, m0, n0;
    int warpgroup, warp, lane;  // this thread within the consumers
    // The tile's rows from m0 that exist (an epilogue stores none past them): all but in a
    // tile that ends before its 64 x MB rows, where the next rows of the pixel order are
    // another tile's (conv_implicit_staged_a.cuh: a tile is a stretch of one output row).
    int rows = 1 << 30;
    // The row, inside a tile of 2 x 64 x MB rows, of this thread's accumulators (and A rows)
    // of 64-row block mb, half h (the layout above): written once for both engines and
    // every epilogue.
    template <int MB>
    __device__ int tile_row(int mb, int h) const {
        return warpgroup * 64 * MB + mb * 64 + warp * 16 + lane / 4 + 8 * h;
    }
    // The same thread placed in the tile of batch entry b at rows m0.., columns n0.. (what an
    // epilogue stores).
    __device__ TileCoords at(int b, int tile_m0, int tile_n0) const {
        return {b, tile_m0, tile_n0, warpgroup, warp, lane};
    }
    // Thread t of warpgroups laid out from thread 0 (no producer warpgroup before them).
    __device__ static TileCoords of_thread(int t) {
        return {0, 0, 0, t / kWarpgroupThreads, t / 32 % 4, t % 32};
    }
};

// Tile t (of batch * m_tiles * n_tiles) covers batch entry t / (m_tiles * n_tiles), rows
// [mt * BM, + BM) and columns [nt * BN, + BN) with mt, nt the rest's quotient and remainder
// by n_tiles.
// The row tiles of bm rows that m_rows rows take (the last one partial).
inline int m_tile_count(int m_rows, int bm) { return (m_rows + bm - 1) / bm; }

struct TileGrid {
    int m_tiles, n_tiles, batch;
    bool b_shared;  // one packed B for every batch entry
    __device__ void locate(int t, int& b, int& mt, int& nt) const {
        const int per_entry = m_tiles * n_tiles;
        b = t / per_entry;
        const int rest = t - b * per_entry;
        mt = rest / n_tiles;
        nt = rest - mt * n_tiles;
    }
};

// The first 1024-byte boundary at or after p in shared memory: swizzled tiles start there (the
// 128-byte swizzle's pattern repeats every 1024 bytes). Kernels ask for kAlignSlack bytes more.
constexpr int kAlignSlack = 1024;
__device__ __forceinline__ uint8_t* align_1024(uint8_t* p) {
    const uint32_t address = smem_address(p);
    return p + (((address + 1023) & ~1023u) - address);
}

// B's k-block in shared memory, as pack_b lays it out and every engine's kernel stages it: a
// tile of BN rows of 128 bytes; a stage of big, small and cross tiles (the TF32 mode: the big
// one alone); a ring of `stages` stages starting at a 1024-byte boundary (align_1024).
template <int BN, bool kTf32>
struct BStage {
    static constexpr int kTileBytes = BN * 128;
    static constexpr int kStageBytes = (kTf32 ? 1 : 3) * kTileBytes;
    static constexpr int ring_bytes(int stages) { return stages * kStageBytes + kAlignSlack; }
};

// The bytes of a k-block's B a stage receives: the big tile alone in the TF32 mode (B rounded
// to nearest); big and small in 3xTF32, and the cross tile too where some B value is not
// finite (b_has_nonfinite; otherwise the big tile serves the cross terms).
template <bool kTf32>
__host__ __device__ __forceinline__ int stage_copy_bytes(bool b_cross_tile, int tile_bytes) {
    return (kTf32 ? 1 : b_cross_tile ? 3 : 2) * tile_bytes;
}

// The packed B k-blocks of the tile in column block nt of batch entry b: k-block kb's tiles
// start kb * layout.stage_bytes() bytes further.
__device__ __forceinline__ const uint8_t* tile_b(const uint8_t* packed_b, const PackedB& layout,
                                                 const TileGrid& grid, int b, int nt) {
    return packed_b + (static_cast<long long>(grid.b_shared ? 0 : b) * grid.n_tiles + nt) *
                          layout.num_kb * layout.stage_bytes();
}

// `bytes` (a multiple of 16) from global to shared memory in 16-byte cp.async copies spread
// over the CTA's `threads` threads, committed as one group; kept in L2 (other CTAs read the
// same packed B).
__device__ __forceinline__ void copy_to_shared(uint8_t* to, const uint8_t* from, int bytes,
                                               int threads, uint64_t policy) {
    for (int c = 16 * static_cast<int>(threadIdx.x); c < bytes; c += 16 * threads)
        cp_async_or_zero<16>(to + c, reinterpret_cast<const float*>(from + c), true, policy);
    cp_async_commit();
}

// B's k-blocks of one tile copied into a ring of kStages stages by every thread with cp.async
// (mma_sync, gemm v6): copy(kb) puts k-block kb's tiles into stage kb % kStages.
template <int kStages, int kStageBytes, int kThreads>
struct CpAsyncStages {
    uint8_t* stages;
    const uint8_t* b_tiles;  // tile_b
    long long kblock_stride;  // layout.stage_bytes()
    int copy_bytes;          // stage_copy_bytes
    uint64_t policy;         // kept in L2: other CTAs read the same packed B
    __device__ __forceinline__ void copy(int kb) const {
        copy_to_shared(stages + (kb % kStages) * kStageBytes, b_tiles + kb * kblock_stride,
                       copy_bytes, kThreads, policy);
    }
};

// The accumulators of a tile, [MB][kAcc]: zeroed, and a partial sum added into the total
// with fp32 adds (both engines' "partial sums", tf32x3.cuh).
template <int MB, int N>
__device__ __forceinline__ void set_zero(float (&acc)[MB][N]) {
#pragma unroll
    for (int mb = 0; mb < MB; ++mb)
#pragma unroll
        for (int i = 0; i < N; ++i) acc[mb][i] = 0.0f;
}
template <int MB, int N>
__device__ __forceinline__ void add_to(float (&total)[MB][N], const float (&part)[MB][N]) {
#pragma unroll
    for (int mb = 0; mb < MB; ++mb)
#pragma unroll
        for (int i = 0; i < N; ++i) total[mb][i] += part[mb][i];
}

// What a launch of either engine does first: the kernel's dynamic shared-memory limit set
// (once per device; `done` is the caller's static, one per kernel), and the grid of tiles
// of BM rows and layout.bn columns over m_rows rows and `batch` entries. tiles = 0: nothing
// to launch; more than 2^31 - 1 tiles: cudaErrorInvalidValue.
template <class Kernel>
cudaError_t prepare_launch(std::atomic<unsigned long long>& done, Kernel kernel, int smem_bytes,
                           int m_rows, int bm, const PackedB& layout, int batch, bool b_shared,
                           TileGrid& grid, int& tiles) {
    tiles = 0;
    const cudaError_t err = allow_dynamic_smem(done, kernel, smem_bytes);
    if (err != cudaSuccess) return err;
    grid = TileGrid{m_tile_count(m_rows, bm), layout.n_tiles, batch, b_shared};
    const long long count = static_cast<long long>(grid.m_tiles) * grid.n_tiles * batch;
    if (count > kMaxInt32Count) return cudaErrorInvalidValue;
    tiles = count > 0 ? static_cast<int>(count) : 0;
    return cudaSuccess;
}

// The launch of a kernel that takes one tile a CTA (mma_sync, gemm v6 and v7), after
// prepare_launch: `threads` a CTA, smem_bytes of dynamic shared memory.
template <class Kernel, class ALoader, class Epilogue>
cudaError_t launch_tile_per_cta(std::atomic<unsigned long long>& smem_set_on, Kernel kernel,
                                int smem_bytes, int bm, int threads, const ALoader& loader,
                                const Epilogue& epilogue, const uint8_t* packed,
                                const PackedB& layout, int m_rows, int batch, bool b_shared,
                                cudaStream_t stream) {
    TileGrid grid;
    int tiles = 0;
    const cudaError_t err = prepare_launch(smem_set_on, kernel, smem_bytes, m_rows, bm, layout,
                                           batch, b_shared, grid, tiles);
    if (err != cudaSuccess || tiles == 0) return err;
    kernel<<<tiles, threads, smem_bytes, stream>>>(loader, epilogue, packed, layout, grid);
    return cudaGetLastError();
}

}  // namespace tc
}  // namespace scratchops
