// conv_store.cuh — the implicit-GEMM convolution's store (conv_implicit.cu): a tile of
// accumulators to y (N, Cout, OH, OW) as conv + bias, or with P31's tail
// (min(conv + bias, c) + bias2[co]) * factor, rounded where the torch operators it replaces
// round (element.cuh); with the tail, where the caller asks (ConvTail::halves), each output's
// share of the min's gradient beside it, for the backward. Two stores:
//   store         v1-v3's: each thread writes its own accumulators straight to y, a value at a
//                 time, wherever the tile's rows fall (any pixel order, any tile).
//   store_staged  v4's (conv_implicit_staged_a.cuh), for a tile that is a stretch of one
//                 output row: 16 channels at a time through shared memory, so that a warp
//                 writes consecutive pixels of one channel; in 16 bits the values are
//                 finished two an instruction and transposed by stmatrix on the way.
#pragma once

#include <cstring>
#include <type_traits>

#include "conv_implicit.cuh"
#include "hopper.cuh"

namespace scratchops {
namespace conv_tc {  // (named: in a build without sm_90a the kernel using it is empty)

// The store: y (N, Cout, OH, OW) = conv + bias, or P31's tail, rounded once to T.
template <class T>
struct ConvStore {
    T* y;
    const T* bias;  // may be nullptr
    ConvTail<T> tail;
    ConvGeometryFast f;
    struct Prepared {};
    __device__ Prepared prepare(const TileCoords&) const { return {}; }
    template <int BN, int MB>
    __device__ void store(const float (&acc)[MB][BN / 2], const TileCoords& tc,
                          const Prepared&) const {
        const int pixels = f.g.out_h * f.g.out_w;
        const int t = tc.lane % 4;
#pragma unroll
        for (int mb = 0; mb < MB; ++mb) {
            const int row = tc.m0 + tc.template tile_row<MB>(mb, 0);
            T* out[2];
            uint8_t* kept[2];  // (the tail's halves at the same offsets, where it keeps them)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int m = row + 8 * h;
                const int n = f.by_pixels.div(m), p = m - n * pixels;
                const bool exists = m < f.batch * pixels && m - tc.m0 < tc.rows;
                out[h] = exists ? y + n * f.cout * pixels + p : nullptr;
                kept[h] = exists && keeps_halves() ? tail.halves + n * f.cout * pixels + p
                                                   : nullptr;
            }
            // Columns in groups of up to 4 blocks of 8: a group's parameters are loaded
            // together, then used for both rows.
            constexpr int kGroup = BN / 8 < 4 ? BN / 8 : 4;
#pragma unroll
            for (int nb0 = 0; nb0 < BN / 8; nb0 += kGroup) {
                float add[2 * kGroup], add2[2 * kGroup];
#pragma unroll
                for (int i = 0; i < 2 * kGroup; ++i) {
                    const int co = tc.n0 + 8 * (nb0 + i / 2) + 2 * t + i % 2;
                    add[i] = bias != nullptr && co < f.cout ? to_float(bias[co]) : 0.0f;
                    add2[i] = tail.kind == ConvTail<T>::kMinAddMul && co < f.cout
                                  ? to_float(tail.bias[co])
                                  : 0.0f;
                }
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    if (out[h] == nullptr) continue;
#pragma unroll
                    for (int i = 0; i < 2 * kGroup; ++i) {
                        const int co = tc.n0 + 8 * (nb0 + i / 2) + 2 * t + i % 2;
                        const float v =
                            finish(acc[mb][4 * (nb0 + i / 2) + 2 * h + i % 2], add[i], add2[i]);
                        if (co < f.cout) out[h][co * pixels] = from_float<T>(v);
                        if (kept[h] != nullptr && co < f.cout)
                            kept[h][co * pixels] =
                                halves_of(acc[mb][4 * (nb0 + i / 2) + 2 * h + i % 2], add[i],
                                          rounded<T>(tail.constant));
                    }
                }
            }
        }
    }

    // An output value from its accumulator, the bias (add) and the tail's bias (add2); kTail:
    // P31's tail, limit = its constant rounded to T.
    template <bool kTail>
    __device__ __forceinline__ float finish_as(float acc, float add, float add2,
                                               float limit) const {
        const float v = plus_bias<T>(acc, add);
        // (The tail rounds as torch's min and add do in T: element.cuh.)
        return kTail ? rounded<T>(nan_min(rounded<T>(v), limit) + add2) * tail.factor : v;
    }
    __device__ __forceinline__ float finish(float acc, float add, float add2) const {
        return tail.kind == ConvTail<T>::kMinAddMul
                   ? finish_as<true>(acc, add, add2, rounded<T>(tail.constant))
                   : finish_as<false>(acc, add, add2, 0.0f);
    }

    // Whether the store also keeps the min's gradient shares (ConvTail::halves), and the byte
    // it keeps of an output: min_gradient_halves (common.cuh) of the rounded conv + bias against
    // limit (the constant rounded to T), the values finish_as compares.
    __device__ __forceinline__ bool keeps_halves() const {
        return tail.kind == ConvTail<T>::kMinAddMul && tail.halves != nullptr;
    }
    __device__ __forceinline__ uint8_t halves_of(float acc, float add, float limit) const {
        return min_gradient_halves(rounded<T>(plus_bias<T>(acc, add)), limit);
    }

    // Output channel co's bias and tail bias (add, add2 of finish), 0 past the last channel.
    __device__ __forceinline__ void channel_params(int co, float& add, float& add2) const {
        add = bias != nullptr && co < f.cout ? to_float(bias[co]) : 0.0f;
        add2 = tail.kind == ConvTail<T>::kMinAddMul && co < f.cout ? to_float(tail.bias[co]) : 0.0f;
    }

    // v4's store (conv_implicit_staged_a.cuh), for a tile that is tc.rows pixels of one output
    // row of image tc.batch from pixel tc.m0 (linear), by one warpgroup (tc.warpgroup 0):
    // kChannels = 16 output channels at a time go through `stage` (shared memory, kChannels
    // rows of kStride values of T), written there from the accumulators and read back by
    // whole channel rows, so that a warp stores consecutive pixels of one channel (128 or 256
    // bytes an instruction where the row starts at an even element) instead of 16 or 32 bytes
    // of each of four channels. `barrier`: a named barrier of the warpgroup's 128 threads.
    // (params: the tile's columns' channel_params in shared memory, add[BN] then add2[BN],
    // loaded while the tile's products ran (v4) or once a CTA (v5): a global load here would
    // wait behind the stores before it, chunk after chunk.)
    // In 16 bits the values are finished in pairs (PairOf: a pair an instruction, bit for bit
    // what finish computes) and written by stmatrix, transposed on the way; in float one by
    // one. Its first form, a value at a time through rounded<T>, took 33 instructions a value
    // and was what limited v4 (docs/notes.md).
    template <int BN, int MB, int kChannels, int kStride>
    __device__ void store_staged(const float (&acc)[MB][BN / 2], const TileCoords& tc, T* stage,
                                 const float* params, int barrier) const {
        // (The tail decided once a tile, not once a value: each branch is a kernel of its own.
        // A factor that is a value of T multiplies pairs exactly; another goes through float.
        // Keeping the halves is a branch of its own too: inference computes none.)
        const bool keep = keeps_halves();
        if (tail.kind != ConvTail<T>::kMinAddMul)
            store_staged_as<false, true, false, BN, MB, kChannels, kStride>(acc, tc, stage,
                                                                            params, barrier);
        else if (!is_half_type<T>() || rounded<T>(tail.factor) == tail.factor)
            keep ? store_staged_as<true, true, true, BN, MB, kChannels, kStride>(
                       acc, tc, stage, params, barrier)
                 : store_staged_as<true, true, false, BN, MB, kChannels, kStride>(
                       acc, tc, stage, params, barrier);
        else
            keep ? store_staged_as<true, false, true, BN, MB, kChannels, kStride>(
                       acc, tc, stage, params, barrier)
                 : store_staged_as<true, false, false, BN, MB, kChannels, kStride>(
                       acc, tc, stage, params, barrier);
    }
    // kKeep: the chunk's halves after its values, through the same stage as bytes (in 16 bits
    // found by stage_pairs beside the values, in float by stage_halves), then stored as whole
    // channel rows too. (Stored straight from the accumulators, a warp's byte stores fell in
    // four runs of 8 bytes, a quarter of a sector each.)
    template <bool kTail, bool kFactorInT, bool kKeep, int BN, int MB, int kChannels,
              int kStride>
    __device__ void store_staged_as(const float (&acc)[MB][BN / 2], const TileCoords& tc,
                                    T* stage, const float* params, int barrier) const {
        static_assert(kChannels == 16, "a chunk: two column blocks of 8, one stmatrix x4");
        static_assert(kStride % (16 / sizeof(T)) == 0, "stmatrix's rows: 16-byte aligned");
        constexpr int kHalvesStride = 64 * MB + 4;  // (stage_halves says why)
        static_assert(kChannels * kHalvesStride <= kChannels * kStride * sizeof(T),
                      "the halves' bytes fit in the values' stage");
#pragma unroll
        for (int chunk = 0; chunk < BN / kChannels; ++chunk) {
            uint16_t kept[MB][4];  // (16-bit T, kKeep: stage_pairs' halves of the chunk)
            if constexpr (is_half_type<T>())
                stage_pairs<kTail, kFactorInT, kKeep, BN, MB, kStride>(acc, tc, chunk, stage,
                                                                       params, kept);
            else
                stage_values<kTail, BN, MB, kStride>(acc, tc, chunk, stage, params);
            named_barrier_sync(barrier, kWarpgroupThreads);
            store_stage<MB, kChannels, kStride>(tc, tc.n0 + chunk * kChannels, stage, y);
            named_barrier_sync(barrier, kWarpgroupThreads);  // (the stage is rewritten next)
            if constexpr (kKeep) {
                auto* bytes = reinterpret_cast<uint8_t*>(stage);
                if constexpr (is_half_type<T>())
                    stage_kept_pairs<MB, kHalvesStride>(tc, kept, bytes);
                else
                    stage_halves<BN, MB, kHalvesStride>(acc, tc, chunk, bytes, params);
                named_barrier_sync(barrier, kWarpgroupThreads);
                store_stage<MB, kChannels, kHalvesStride>(tc, tc.n0 + chunk * kChannels, bytes,
                                                          tail.halves);
                named_barrier_sync(barrier, kWarpgroupThreads);
            }
        }
    }

    // Tile columns col and col + 1 (col even) of a row of parameters in shared memory.
    static __device__ __forceinline__ float2 column_pair(const float* row, int col) {
        return *reinterpret_cast<const float2*>(row + col);
    }
    // Chunk `chunk`'s columns (column blocks 2 chunk and 2 chunk + 1) of the accumulators into
    // the stage, finished in pairs: register j of the stmatrix of row block mb is the thread's
    // pair (columns 8 nb + 2 t, + 1 at row lane / 4 + 8 h) of column block nb = 2 chunk + j / 2,
    // half h = j % 2; lane 8 j + i addresses stage row (channel) 8 (j / 2) + i from pixel
    // mb 64 + warp 16 + 8 h, where matrix j's column i, 8 pixels of that channel, lands.
    // kKeep: kept[mb][jj] = the pair's halves (min_gradient_halves_pair of the rounded conv +
    // bias, before the tail), the bytes of channels 8 b + 2 t and + 1 at that pixel.
    template <bool kTail, bool kFactorInT, bool kKeep, int BN, int MB, int kStride>
    __device__ void stage_pairs(const float (&acc)[MB][BN / 2], const TileCoords& tc, int chunk,
                                T* stage, const float* params, uint16_t (&kept)[MB][4]) const {
        using Ops = PairOf<T>;
        using V = typename Ops::type;
        const int t = tc.lane % 4, j = tc.lane / 8, i = tc.lane % 8;
        const float limit = kTail ? rounded<T>(tail.constant) : 0.0f;
        const V limits = Ops::rounded_pair(limit, limit);
        const V factors = Ops::rounded_pair(tail.factor, tail.factor);
        V add[2], add2[2];  // column block 2 chunk + b's pair of parameters (values of T)
#pragma unroll
        for (int b = 0; b < 2; ++b) {
            const float2 p = column_pair(params, 8 * (2 * chunk + b) + 2 * t);
            const float2 p2 = column_pair(params + BN, 8 * (2 * chunk + b) + 2 * t);
            add[b] = Ops::rounded_pair(p.x, p.y);
            add2[b] = Ops::rounded_pair(p2.x, p2.y);
        }
        const uint32_t to = smem_address(stage + (8 * (j / 2) + i) * kStride + tc.warp * 16 +
                                         8 * (j % 2));
#pragma unroll
        for (int mb = 0; mb < MB; ++mb) {
            uint32_t r[4];
#pragma unroll
            for (int jj = 0; jj < 4; ++jj) {
                const int b = jj / 2, nb = 2 * chunk + b, h = jj % 2;
                V v = plus_bias_pair<T>(acc[mb][4 * nb + 2 * h], acc[mb][4 * nb + 2 * h + 1],
                                        add[b]);  // torch's conv2d: the product rounded, + bias
                if constexpr (kKeep) kept[mb][jj] = min_gradient_halves_pair(v, limits);
                if constexpr (kTail) {     // min(v, c) + bias2, rounded, times the factor
                    v = __hadd2_rn(__hmin2_nan(v, limits), add2[b]);
                    if constexpr (kFactorInT) {
                        v = __hmul2_rn(v, factors);
                    } else {
                        const float2 w = Ops::widened(v);
                        v = Ops::rounded_pair(w.x * tail.factor, w.y * tail.factor);
                    }
                }
                r[jj] = pair_bits(v);
            }
            stmatrix_x4_trans(to + mb * 64 * static_cast<int>(sizeof(T)), r);
        }
    }
    // The same for float, a value at a time: stage row 8 b + 2 t + c (channel), pixel
    // tile_row(mb, h); with kStride = 4 (mod 16) a store's 32 lanes (t 0-3, lane / 4 0-7)
    // fall in 32 banks (8 t + lane / 4).
    template <bool kTail, int BN, int MB, int kStride>
    __device__ void stage_values(const float (&acc)[MB][BN / 2], const TileCoords& tc,
                                 int chunk, T* stage, const float* params) const {
        const float limit = kTail ? rounded<T>(tail.constant) : 0.0f;
        const int t = tc.lane % 4;
        float2 adds[2], adds2[2];  // (all of the chunk's first: each load's latency once)
#pragma unroll
        for (int b = 0; b < 2; ++b) {
            adds[b] = column_pair(params, 8 * (2 * chunk + b) + 2 * t);
            adds2[b] = column_pair(params + BN, 8 * (2 * chunk + b) + 2 * t);
        }
#pragma unroll
        for (int b = 0; b < 2; ++b) {
            const int nb = 2 * chunk + b;
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const int col = 8 * b + 2 * t + c;
                const float add = c == 0 ? adds[b].x : adds[b].y;
                const float add2 = c == 0 ? adds2[b].x : adds2[b].y;
#pragma unroll
                for (int mb = 0; mb < MB; ++mb)
#pragma unroll
                    for (int h = 0; h < 2; ++h)
                        stage[col * kStride + tc.template tile_row<MB>(mb, h)] = from_float<T>(
                            finish_as<kTail>(acc[mb][4 * nb + 2 * h + c], add, add2, limit));
            }
        }
    }
    // Chunk `chunk`'s halves (float: a value at a time) into the stage as bytes, tile column
    // col = 8 nb + 2 t + c (nb = 2 chunk + b) in stage row 8 b + 2 t + c, pixel
    // tile_row(mb, h); store_stage then writes whole channel rows of them, as of the values.
    // kHalvesStride = 4 (mod 8) bytes: a store's four runs of 8 bytes (t 0-3, lane / 4 0-7)
    // fall in eight different banks.
    template <int BN, int MB, int kHalvesStride>
    __device__ void stage_halves(const float (&acc)[MB][BN / 2], const TileCoords& tc, int chunk,
                                 uint8_t* stage, const float* params) const {
        const int t = tc.lane % 4;
        const float limit = rounded<T>(tail.constant);
#pragma unroll
        for (int b = 0; b < 2; ++b)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const int nb = 2 * chunk + b, col = 8 * nb + 2 * t + c;
                uint8_t* row = stage + (8 * b + 2 * t + c) * kHalvesStride;
#pragma unroll
                for (int mb = 0; mb < MB; ++mb)
#pragma unroll
                    for (int h = 0; h < 2; ++h)
                        row[tc.template tile_row<MB>(mb, h)] =
                            halves_of(acc[mb][4 * nb + 2 * h + c], params[col], limit);
            }
    }
    // The same from stage_pairs' kept pairs (16-bit T): pair jj of row block mb holds the bytes
    // of stage rows 8 b + 2 t and + 1 (b = jj / 2) at pixel tile_row(mb, jj % 2).
    template <int MB, int kHalvesStride>
    __device__ void stage_kept_pairs(const TileCoords& tc, const uint16_t (&kept)[MB][4],
                                     uint8_t* stage) const {
        const int t = tc.lane % 4;
#pragma unroll
        for (int mb = 0; mb < MB; ++mb)
#pragma unroll
            for (int jj = 0; jj < 4; ++jj) {
                uint8_t* at = stage + (8 * (jj / 2) + 2 * t) * kHalvesStride +
                              tc.template tile_row<MB>(mb, jj % 2);
                at[0] = static_cast<uint8_t>(kept[mb][jj]);
                at[kHalvesStride] = static_cast<uint8_t>(kept[mb][jj] >> 8);
            }
    }
    // The stage's channels co0 .. co0 + kChannels - 1 to `dest` (y, or the halves: E is T or
    // their byte), laid out as y: warp w stores rows w, w + 4, ... of it, each tc.rows pixels
    // from dest's (n, co, p0), where the row's pixels start at an even element two a lane (a
    // pair's bits: one access), otherwise one. Every access of a store is predicated, not
    // branched around: a warp's stores differ only at a row's end.
    template <int MB, int kChannels, int kStride, class E>
    __device__ void store_stage(const TileCoords& tc, int co0, const E* stage, E* dest) const {
        constexpr int kRowsAWarp = kChannels / 4, kPixels = 64 * MB;
        const int pixels = f.g.out_h * f.g.out_w;
        // Output channel co's pixels of the tile start at dest + (n Cout + co) pixels + p0.
        const long long p0 = tc.m0 - static_cast<long long>(tc.batch) * pixels;
        const int first = co0 + tc.warp;  // this warp's first channel, then every 4th
        E* to = dest + (static_cast<long long>(tc.batch) * f.cout + first) * pixels + p0;
        const long long next_row = 4LL * pixels;
        const E* from = stage + tc.warp * kStride;
        if ((tc.m0 % 2 == 0) && (pixels % 2 == 0)) {
            using Bits = std::conditional_t<  // a pair
                sizeof(E) == 4, uint2, std::conditional_t<sizeof(E) == 2, uint32_t, uint16_t>>;
            using LowBits = std::conditional_t<
                sizeof(E) == 4, uint32_t, std::conditional_t<sizeof(E) == 2, uint16_t, uint8_t>>;
            Bits v[kRowsAWarp][kPixels / 64];
#pragma unroll
            for (int row = 0; row < kRowsAWarp; ++row)
#pragma unroll
                for (int k = 0; k < kPixels / 64; ++k)
                    v[row][k] = *reinterpret_cast<const Bits*>(from + 4 * row * kStride +
                                                               2 * tc.lane + 64 * k);
#pragma unroll
            for (int row = 0; row < kRowsAWarp; ++row, to += next_row) {
                const bool exists = first + 4 * row < f.cout;
#pragma unroll
                for (int k = 0; k < kPixels / 64; ++k) {
                    const int p = 2 * tc.lane + 64 * k;
                    if (exists && p + 1 < tc.rows) store_pair_bits(to + p, v[row][k]);
                    // (A row of an odd number of pixels: its last alone, the next not ours.)
                    if (exists && p + 1 == tc.rows) {
                        LowBits low;
                        memcpy(&low, &v[row][k], sizeof(low));
                        *reinterpret_cast<LowBits*>(to + p) = low;
                    }
                }
            }
        } else {
            E v[kRowsAWarp][kPixels / 32];
#pragma unroll
            for (int row = 0; row < kRowsAWarp; ++row)
#pragma unroll
                for (int k = 0; k < kPixels / 32; ++k)
                    v[row][k] = from[4 * row * kStride + tc.lane + 32 * k];
#pragma unroll
            for (int row = 0; row < kRowsAWarp; ++row, to += next_row) {
                const bool exists = first + 4 * row < f.cout;
#pragma unroll
                for (int k = 0; k < kPixels / 32; ++k)
                    if (exists && tc.lane + 32 * k < tc.rows) to[tc.lane + 32 * k] = v[row][k];
            }
        }
    }
};

}  // namespace conv_tc

}  // namespace scratchops
