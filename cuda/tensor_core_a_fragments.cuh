// tensor_core_a_fragments.cuh — A's side of both tensor-core engines (tf32x3.cuh on wgmma,
// mma_sync_3xtf32.cuh on mma.sync): a thread's values of a k-block fetched through the
// loader one k-block ahead (fetch_kblock), the rows of one tile for the kernels that take one
// tile a CTA (TileARows), and the register fragments of each k-step made of those values
// (a_fragments): split into 3xTF32 parts, rounded to TF32, or, for the native 16-bit
// products, the values' own bits in pairs. The layouts and the k map: tensor_core_operands.cuh.
#pragma once

#include <cstdint>

#include "hopper.cuh"
#include "tensor_core_operands.cuh"

namespace scratchops {
namespace tc {

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

// The same for a native 16-bit loader: the thread's 16 values of each row as 8 pairs of bits
// (pair p: physical k 16t + 2p, + 1).
template <int MB, class ALoader>
__device__ __forceinline__ void fetch_kblock(const ALoader& loader,
                                             const typename ALoader::KPtr (&next)[MB][2],
                                             uint32_t (&raw)[MB][2][8]) {
#pragma unroll
    for (int mb = 0; mb < MB; ++mb)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int p = 0; p < 8; ++p) raw[mb][h][p] = loader.fetch_pair(next[mb][h], 2 * p);
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

// The native 16-bit fragments of k-step s (wgmma engine): rows g and g + 8 (h = 0, 1) take
// physical 16t + 4s, + 1 (pair 2s, register h) and 16t + 4s + 2, + 3 (pair 2s + 1, register
// 2 + h), as they were loaded; then refilled from the next k-block as above. (big alone: one
// product; small and cross are unused.)
template <bool kTf32, int MB, class ALoader, class Written>
__device__ __forceinline__ void a_fragments(uint32_t (&raw)[MB][2][8], const ALoader& loader,
                                            const typename ALoader::KPtr (&next)[MB][2], int s,
                                            uint32_t (&big)[MB][4], uint32_t (&)[MB][4],
                                            uint32_t (&)[MB][4], Written written) {
    static_assert(kTf32, "the 16-bit products are single products");
#pragma unroll
    for (int mb = 0; mb < MB; ++mb)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            // (Copies of their own: see kept_copy.)
            big[mb][h] = kept_copy(raw[mb][h][2 * s]);
            big[mb][2 + h] = kept_copy(raw[mb][h][2 * s + 1]);
            written(mb);
            raw[mb][h][2 * s] = loader.fetch_pair(next[mb][h], 4 * s);
            raw[mb][h][2 * s + 1] = loader.fetch_pair(next[mb][h], 4 * s + 2);
        }
}

}  // namespace tc
}  // namespace scratchops
