// tensor_core_operands.cuh — what both tensor-core engines (tf32x3.cuh on wgmma,
// mma_sync_3xtf32.cuh on mma.sync) take and give: the k-block, B packed once per launch as
// shared memory wants it, the A loaders' and epilogues' interfaces, the tile grid, and the
// preparation of a launch.
//
// B packed: once per launch, pack_b writes B's big, small and cross parts (the 3xTF32 split:
// tf32x3.cuh) as the exact bytes shared memory wants: per (tile of BN rows, k-block of 32),
// three BN x 128-byte tiles in the 128-byte swizzle layout, which an engine copies into
// shared memory as they are.
//
// Layouts (PTX ISA "Asynchronous Warpgroup Level Matrix Shared Memory Layout" and "Register
// Fragments"): in a 64-row block, warp q of a warpgroup owns rows 16q .. 16q + 15; lane
// (g = lane / 4, t = lane % 4) holds A rows g and g + 8 and, of the accumulators, element
// 4 * nb + 2h + c at (row g + 8h, column 8 nb + 2t + c). The A registers of k-step j hold
// logical columns 8j + t (a0, a1) and 8j + t + 4 (a2, a3); physical_k() maps logical to
// physical k so that thread t needs exactly the 8 consecutive physical k [8t, 8t + 8) of a
// k-block. B's packing applies the same map.
//
// Interfaces the engines' kernels are instantiated with:
//   ALoader: Row row(int batch, int m); KBlock kblock(int kb, int t);
//            KPtr kptr(Row, KBlock): where the thread's 8 values of a row and k-block are,
//            in the loader's own form (computed once a k-block, so that fetch2 is cheap);
//            KPtr none(): a KPtr of no values; float2 fetch2(KPtr, int e): values e, e + 1
//            (0 where absent)   (see gemm.cu, conv_implicit.cuh)
//   Epilogue: Prepared prepare(TileCoords with the thread's place only) once per thread
//            (per-thread constants, e.g. its columns' parameters), then
//            void store(const float (&acc)[MB][BN / 2], TileCoords, const Prepared&) for one
//            tile's accumulators of this thread.
//   Source (for pack_b): float operator()(int entry, int n, int k), 0 outside B.
#pragma once

#include <atomic>
#include <cstdint>

#include <cuda_runtime.h>

#include "common.cuh"
#include "hopper.cuh"

namespace scratchops {
namespace tc {

constexpr int kBlockK = 32;  // TF32 values per k-block: one 128-byte swizzled row
// pack_b runs at most this many blocks (PackedB::pack_blocks: fewer for a small B); each
// writes one "B has a non-finite value" flag, which the main kernel ORs together
// (b_has_nonfinite), so no flag needs clearing before a launch.
constexpr int kPackBlocks = 1024;

// Logical column L (0..31) of a k-block, as wgmma sees it, holds physical k = physical_k(L):
// thread t of a quad needs physical [8t, 8t + 8), in k-step j as (8t + 2j, 8t + 2j + 1).
__host__ __device__ constexpr int physical_k(int L) {
    return 8 * (L % 4) + 2 * (L / 8) + (L % 8) / 4;
}

// Byte offset of logical column L of row n inside one packed tile (128-byte swizzle: the
// 16-byte chunk c of row n sits at chunk position c ^ (n % 8)).
__host__ __device__ constexpr int packed_offset(int n, int L) {
    return n * 128 + (((L / 4) ^ (n % 8)) * 16) + (L % 4) * 4;
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
    // pack_b's blocks (a block a stage, kPackBlocks at most): fixed by the layout, so the
    // packing and the main kernel agree on how many flags there are.
    __host__ __device__ int pack_blocks() const {
        return stages() < kPackBlocks ? (stages() > 0 ? stages() : 1) : kPackBlocks;
    }
};

inline PackedB packed_b_layout(int bn, int n, int k, int entries) {
    return {bn, (k + kBlockK - 1) / kBlockK, (n + bn - 1) / bn, entries};
}

// A block a stage at a time (stage = (entry * n_tiles + tile) * num_kb + kb, its position in
// three divisions once), its threads over the stage's work items (16-byte chunk c, row n):
// the chunk holds logical columns 4c .. 4c + 3 of row n, written to each of the three tiles.
template <int BN, class Source>
__global__ void pack_b_kernel(Source src, uint8_t* packed, PackedB layout) {
    bool nonfinite = false;
    for (int stage = blockIdx.x; stage < layout.stages(); stage += gridDim.x) {
        const int kb = stage % layout.num_kb;
        const int tile = (stage / layout.num_kb) % layout.n_tiles;
        const int entry = stage / (layout.num_kb * layout.n_tiles);
        uint8_t* tiles = packed + stage * layout.stage_bytes();
        // Consecutive threads take consecutive chunks (c fastest): a warp stores 4 whole
        // 128-byte rows of each tile (with n fastest, each store touched 32 rows, 16 bytes
        // apiece, and packing a large B ran at a fifth of the copy rate).
        for (int item = threadIdx.x; item < 8 * BN; item += blockDim.x) {
            const int c = item % 8, n = item / 8;
            uint32_t big[4], small[4], cross[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const Tf32Split p = split_tf32(
                    src(entry, tile * BN + n, kb * kBlockK + physical_k(4 * c + j)));
                big[j] = p.big;
                small[j] = p.small;
                cross[j] = p.cross;
                nonfinite = nonfinite || p.cross != p.big;
            }
            const int offset = packed_offset(n, 4 * c);
            *reinterpret_cast<uint4*>(tiles + offset) = make_uint4(big[0], big[1], big[2], big[3]);
            *reinterpret_cast<uint4*>(tiles + BN * 128 + offset) =
                make_uint4(small[0], small[1], small[2], small[3]);
            *reinterpret_cast<uint4*>(tiles + 2 * BN * 128 + offset) =
                make_uint4(cross[0], cross[1], cross[2], cross[3]);
        }
    }
    const int block_nonfinite = __syncthreads_or(nonfinite);
    if (threadIdx.x == 0)
        reinterpret_cast<int*>(packed + layout.tiles_bytes())[blockIdx.x] = block_nonfinite;
}

template <int BN, class Source>
cudaError_t pack_b(const Source& src, uint8_t* packed, const PackedB& layout,
                   cudaStream_t stream) {
    // Always layout.pack_blocks() blocks, so that every flag the main kernel reads is written.
    constexpr int kPackThreads = 256;
    pack_b_kernel<BN><<<layout.pack_blocks(), kPackThreads, 0, stream>>>(src, packed, layout);
    return cudaGetLastError();
}

// Whether pack_b met a non-finite value in B: its blocks' flags ORed, by every thread of the
// calling CTA together (a block-wide barrier, which also orders what came before it).
__device__ __forceinline__ bool b_has_nonfinite(const uint8_t* packed, const PackedB& layout) {
    const int* flags = reinterpret_cast<const int*>(packed + layout.tiles_bytes());
    bool any = false;
    for (int i = threadIdx.x; i < layout.pack_blocks(); i += blockDim.x) any = any || flags[i];
    return __syncthreads_or(any) != 0;
}

// Where one tile sits, for the epilogue: batch entry, first row, first column.
struct TileCoords {
    int batch, m0, n0;
    int warpgroup, warp, lane;  // this thread within the consumers
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

// The thread's 8 values of each of its rows (mb, h) for the k-block next[][] points at.
template <int MB, class ALoader>
__device__ __forceinline__ void fetch_kblock(const ALoader& loader,
                                             const typename ALoader::KPtr (&next)[MB][2],
                                             float (&raw)[MB][2][8]) {
#pragma unroll
    for (int mb = 0; mb < MB; ++mb)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int e = 0; e < 8; e += 2) {
                const float2 v = loader.fetch2(next[mb][h], e);
                raw[mb][h][e] = v.x;
                raw[mb][h][e + 1] = v.y;
            }
}

// A's rows of one tile, for the kernels that take one tile a CTA (mma_sync, gemm v6 and v7):
// each row's state, and where the thread's values of a k-block are (point_at; past the last
// k-block, nowhere).
template <int MB, int kBM, class ALoader>
struct TileARows {
    typename ALoader::Row rows[MB][2];
    typename ALoader::KPtr next[MB][2];
    __device__ __forceinline__ TileARows(const ALoader& loader, const TileCoords& me, int batch,
                                         int mt) {
#pragma unroll
        for (int mb = 0; mb < MB; ++mb)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                rows[mb][h] = loader.row(batch, mt * kBM + me.tile_row<MB>(mb, h));
    }
    __device__ __forceinline__ void point_at(const ALoader& loader, int kb, int num_kb,
                                             int quad_col) {
        const typename ALoader::KBlock blk = loader.kblock(kb, quad_col);
#pragma unroll
        for (int mb = 0; mb < MB; ++mb)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                next[mb][h] = kb < num_kb ? loader.kptr(rows[mb][h], blk) : loader.none();
    }
    // The pipeline's start: k-block 0's values into raw, the loads pointed at k-block 1.
    __device__ __forceinline__ void start(const ALoader& loader, float (&raw)[MB][2][8],
                                          int num_kb, int quad_col) {
        point_at(loader, 0, num_kb, quad_col);
        fetch_kblock(loader, next, raw);
        point_at(loader, 1, num_kb, quad_col);
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

// A's register fragments of k-step s (of 4) of the k-block in raw[][][], both engines: rows
// g and g + 8 (h = 0, 1) take logical column 8s + t (physical 8t + 2s, registers a0 / a1) and
// 8s + t + 4 (physical 8t + 2s + 1, a2 / a3). 3xTF32: each value split into big, small and
// cross parts; the TF32 mode: rounded to nearest, as cuDNN rounds it, into big alone. Then
// the two values consumed are refilled with the next k-block's (next[][]), so each load is in
// flight for a whole k-block before its value is used. written(mb) runs once the row pair's
// registers hold their values (the wgmma engine pins them there; see pin_registers).
template <bool kTf32, int MB, class ALoader, class Written>
__device__ __forceinline__ void a_fragments(float (&raw)[MB][2][8], const ALoader& loader,
                                            const typename ALoader::KPtr (&next)[MB][2], int s,
                                            uint32_t (&big)[MB][4], uint32_t (&small)[MB][4],
                                            uint32_t (&cross)[MB][4], Written written) {
#pragma unroll
    for (int mb = 0; mb < MB; ++mb)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            if (kTf32) {
                big[mb][h] = tf32_nearest(raw[mb][h][2 * s]);
                big[mb][2 + h] = tf32_nearest(raw[mb][h][2 * s + 1]);
            } else {
                const Tf32Split lo = split_tf32_truncated(raw[mb][h][2 * s]);
                const Tf32Split hi = split_tf32_truncated(raw[mb][h][2 * s + 1]);
                big[mb][h] = lo.big;
                small[mb][h] = lo.small;
                cross[mb][h] = lo.cross;
                big[mb][2 + h] = hi.big;
                small[mb][2 + h] = hi.small;
                cross[mb][2 + h] = hi.cross;
            }
            written(mb);
            const float2 v = loader.fetch2(next[mb][h], 2 * s);
            raw[mb][h][2 * s] = v.x;
            raw[mb][h][2 * s + 1] = v.y;
        }
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
    const cudaError_t err = once_per_device(done, [&] {
        return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    smem_bytes);
    });
    if (err != cudaSuccess) return err;
    grid = TileGrid{(m_rows + bm - 1) / bm, layout.n_tiles, batch, b_shared};
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
