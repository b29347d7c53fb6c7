// channels_last.cuh — an NCHW input made channels-last (N, H, W, C), one tile at a time: each
// image's C x HW matrix transposed through shared memory with 16-byte accesses on both sides
// (transpose.cu's v1 moves one element a thread, and in 16 bits only 64 bytes a warp: half the
// copy rate). Its own kernel (transpose.cu's channels_last_launch) or the implicit-GEMM
// convolution v4's grid before its first tile (conv_implicit_staged_a.cuh) moves the tiles;
// P31's min rule (min_add_mul_backward_channels_last.cu) fills tiles with its gradient and
// stores them with the store half.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "element.cuh"
#include "hopper.cuh"

namespace scratchops {

// One tile of image `image`'s C x P matrix (channels x pixels) moved to P x C: tile
// `tile_index` = (channel block, pixel block) of kVecTile channels x kVecTile pixels, by
// `threads` threads (this one `thread`) through shared memory `tile`, kVec = 16 / sizeof(T)
// elements a 16-byte vector. Reads: vector v of the tile is kVec pixels of channel row
// v / kVecsRow, so a warp reads whole runs of a channel's pixels; writes: a pixel's kVec
// consecutive channels, read down a column of the tile (rows padded by one element, fewer
// bank conflicts). Vectors that leave the matrix or would be misaligned (P or C not a
// multiple of kVec) go element by element.
constexpr int kVecTile = 64;
// Element i of a 16-byte vector of T, and a vector made of elements (constant i only: the
// vector stays in registers; an array view of it went to the stack).
template <class T>
__device__ __forceinline__ T vector_element(const uint4& v, int i) {
    const uint32_t word = i / (4 / static_cast<int>(sizeof(T))) == 0   ? v.x
                          : i / (4 / static_cast<int>(sizeof(T))) == 1 ? v.y
                          : i / (4 / static_cast<int>(sizeof(T))) == 2 ? v.z
                                                                        : v.w;
    if constexpr (sizeof(T) == 4) {
        return __uint_as_float(word);
    } else {
        const unsigned short bits = static_cast<unsigned short>(i % 2 ? word >> 16 : word);
        return half_from_bits<T>(bits);
    }
}
template <class T>
__device__ __forceinline__ uint32_t element_bits(T v) {
    if constexpr (sizeof(T) == 4) {
        return __float_as_uint(v);
    } else {
        return *reinterpret_cast<const unsigned short*>(&v);
    }
}
// The tile's store half: tile[r][col] (channel c0 + r, pixel p0 + col, filled by the caller)
// written to image `dst` (P x C) as 16-byte vectors of a pixel's kVec consecutive channels,
// read down a column of the tile. Every thread of the `threads` calls it after a barrier that
// follows the tile's fill. In the TF32 mode (kTf32Nearest) each value is rounded to the
// nearest TF32 on the way; with kSmallPart (float, kTf32Nearest too) each value's small part
// is written instead, what is left of it after that rounding (split_tf32's small: 0 for Inf
// and NaN), so that two stores of one tile write a 3xTF32 operand's two parts.
template <class T, bool kTf32Nearest, bool kSmallPart = false>
__device__ __forceinline__ void channels_last_tile_store(const T (*tile)[kVecTile + 1],
                                                         T* __restrict__ dst, int channels,
                                                         int pixels, int c0, int p0, int thread,
                                                         int threads) {
    constexpr int kVec = 16 / static_cast<int>(sizeof(T));
    constexpr int kVecsRow = kVecTile / kVec;  // vectors in a tile row
    // (channels % kVec == 0 where v4 runs; other counts go element by element)
    const bool aligned_out = channels % kVec == 0;
    for (int v = thread; v < kVecTile * kVecsRow; v += threads) {
        const int r = v / kVecsRow, col = v % kVecsRow * kVec;  // pixel p0 + r, channel c0 + col
        const int p = p0 + r, c = c0 + col;
        if (p >= pixels) continue;
        uint32_t words[4] = {0u, 0u, 0u, 0u};
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
            T value = tile[col + i][r];
            static_assert(!kSmallPart || (kTf32Nearest && sizeof(T) == 4), "float's parts");
            if constexpr (kSmallPart) {
                value = __uint_as_float(split_tf32(value).small);
            } else if constexpr (kTf32Nearest) {
                value = __uint_as_float(tf32_nearest(value));
            }
            words[i / (kVec / 4)] |= element_bits(value) << (16 * (i % (kVec / 4)));
        }
        const uint4 chunk = make_uint4(words[0], words[1], words[2], words[3]);
        T* out = dst + static_cast<long long>(p) * channels + c;
        if (aligned_out && c + kVec <= channels) {
            *reinterpret_cast<uint4*>(out) = chunk;
        } else {
            for (int i = 0; i < kVec && c + i < channels; ++i)
                out[i] = vector_element<T>(chunk, i);
        }
    }
}

// The tile's load half: tile[r][col] = channel c0 + r, pixel p0 + col of image `image` of x
// (C x P), read as 16-byte vectors where aligned; the caller puts a barrier after it.
template <class T>
__device__ __forceinline__ void channels_last_tile_load(const T* __restrict__ x, int channels,
                                                        int pixels, int c0, int p0, int image,
                                                        T (*tile)[kVecTile + 1], int thread,
                                                        int threads) {
    constexpr int kVec = 16 / static_cast<int>(sizeof(T));
    constexpr int kVecsRow = kVecTile / kVec;  // vectors in a tile row
    const T* src = x + static_cast<long long>(channels) * pixels * image;
    // (16-byte loads need x itself 16-byte aligned too: a contiguous view may start anywhere)
    const bool aligned = pixels % kVec == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
    for (int v = thread; v < kVecTile * kVecsRow; v += threads) {
        const int r = v / kVecsRow, col = v % kVecsRow * kVec;  // channel c0 + r, pixel p0 + col
        const int c = c0 + r, p = p0 + col;
        if (c >= channels) continue;
        if (aligned && p + kVec <= pixels) {
            const uint4 chunk =
                *reinterpret_cast<const uint4*>(src + static_cast<long long>(c) * pixels + p);
#pragma unroll
            for (int i = 0; i < kVec; ++i) tile[r][col + i] = vector_element<T>(chunk, i);
        } else {
            for (int i = 0; i < kVec && p + i < pixels; ++i)
                tile[r][col + i] = src[static_cast<long long>(c) * pixels + p + i];
        }
    }
}

// Both halves: tile `tile_index` = (channel block, pixel block) of image `image`. Every thread
// of the `threads` calls it (a barrier between the tile's reads and its writes); a caller that
// reuses `tile` for another tile puts a barrier between the two calls.
template <class T, bool kTf32Nearest>
__device__ __forceinline__ void channels_last_tile(const T* __restrict__ x, T* __restrict__ y,
                                                   int channels, int pixels, int tiles_p,
                                                   int tile_index, int image,
                                                   T (*tile)[kVecTile + 1], int thread,
                                                   int threads) {
    const int c0 = tile_index / tiles_p * kVecTile, p0 = tile_index % tiles_p * kVecTile;
    channels_last_tile_load(x, channels, pixels, c0, p0, image, tile, thread, threads);
    __syncthreads();
    channels_last_tile_store<T, kTf32Nearest>(tile, y + static_cast<long long>(channels) *
                                                            pixels * image,
                                              channels, pixels, c0, p0, thread, threads);
}

}  // namespace scratchops
