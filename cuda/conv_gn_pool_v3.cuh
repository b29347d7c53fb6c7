// conv_gn_pool_v3.cuh — P85's one pass, v3 (see conv_gn_pool.cuh): a convolution kernel of
// its own on the wgmma engine's instructions, for Cin <= 8. Its shared-memory layout and
// data movement are in conv_gn_pool_v3_halo.cuh, its epilogue in
// conv_gn_pool_v3_epilogue.cuh; here the products and the kernel's loop over tiles.
#pragma once

#include "conv_gn_pool_v3_epilogue.cuh"

namespace scratchops {
namespace conv_gn_pool {

// One CTA per SM (persistent), warpgroups that work apart (three for float, four for the half
// types: v3_warpgroups): each takes its own tiles of 4 output rows x 16 columns (64 GEMM
// rows, one m64 wgmma) and synchronises only its own 128 threads (named barriers), so one
// warpgroup's epilogue runs while the others' wgmmas keep the tensor cores busy (more than
// two: the kernel is bound by latency, and as many as the registers allow). Shared: the
// weights; per warpgroup: the rest.
//   weights  B's big, small and cross parts (all k-blocks) written into shared memory once
//            by each CTA, straight from the weight tensor (relay_weights: no packing kernel
//            before this one), laid so that k-step j is tap j's 8 channels: 9 k-steps for a
//            3 x 3 kernel instead of the packing's 12 (it interleaves 4 taps a k-step). The
//            half types: B in T itself, two taps a k16 step, 5 for a 3 x 3 kernel
//            (relay_weights_16).
//   halo     per tile, the input patch its outputs read (HR x HC pixels x 8 channels),
//            copied from global memory one tile ahead (cp.async, no registers held; 16 bytes
//            of a row at a time where the rows are 16-byte aligned, as at P85's size), split
//            once into TF32 big / small / cross (float; the half types keep T) and stored
//            channel-last. v2 split every im2col value (each input value 9 times for a 3 x 3
//            kernel) and gathered it with its own load; here a thread's A registers are
//            two-value shared loads.
//   mma      float: both operands' products in two accumulators: the cross terms in one,
//            big * big in the other, added once at the end (the cross terms never meet the
//            large running sum inside the tensor cores' truncating accumulation). The half
//            types: native 16-bit products, two taps a k16 wgmma (tile_products_16).
//   epilogue the tile goes through shared memory as [channel][pixel]; a thread then owns one
//            (channel, pooling window) at a time: four 16-byte loads and the window's extreme;
//            the channel's mean and centred sum of squares over the tile, in two passes whose
//            sums join the 4 windows' lanes (shuffles); Chan merges join the channels of a
//            group (shuffles where the group lies in one warp's lanes). gamma * scale's sign is
//            folded into the weights and the conv bias added only to the results, so the
//            16 values of a window take no operation before their max and moments.
// Covered: Cin <= 8 (B's K is then 8 values a tap), at most 12 taps (3 k-blocks) and
// a halo of at most kHaloPixels pixels; conv_gn_pool_launch runs v2 otherwise.
// Element types: the input, weights and parameters of type T. The half types' products of two
// values of T are exact, summed in fp32 by the k16 wgmmas; their halo and weights stay T, and
// the staged tile is rounded as torch's conv2d rounds it in T (stage_tile); the finalize
// rounds the rest (conv_gn_pool_finalize.cuh).
// (3) A float tile's products, one k-step a tap: the thread's A registers are channels quad_col
// and quad_col + 4 of tap j at its two rows' pixels (halo byte offsets row_at), then the
// wgmmas of kParts parts of A:
// - 3 (a float tile with an Inf or NaN, or non-finite weights): big, small and cross, three
//   wgmmas, all three parts of a tap loaded just before its wgmmas and waited for, one tap at
//   a time;
// - 2 (a float tile of finite values and finite weights): the cross parts are the big parts,
//   so a tap needs two parts of A and B's big tile serves its cross terms.
// With 2 parts, tap j + 1's registers are loaded before tap j's wgmmas are issued (three
// buffers): the loads' latency hides behind the wait for tap j - 1, instead of stalling the
// next wgmma.
template <int kParts, int kAcc>
__device__ __forceinline__ void tile_products(float (&acc_big)[kAcc], float (&acc_cross)[kAcc],
                                              const uint8_t* halo, const int (&row_at)[2],
                                              const V3Shape& shape, uint64_t desc0,
                                              bool b_cross_tile) {
    using Mma = WgmmaTf32Rs<kBN>;
    static_assert(kParts == 2 || kParts == 3, "the float tiles' two modes");
    constexpr bool kPrefetch = kParts < 3;  // tap j + 1 loaded under tap j's wgmmas
    constexpr int kBuffers = kPrefetch ? 3 : 1;
    uint32_t a[kBuffers][kParts][4];  // [buffer][part][wgmma register]
    auto load_tap = [&](int j, uint32_t (&buf)[kParts][4]) {
        const int tap_at = shape.tap_offset[j] * kHaloPixelBytes;
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int part = 0; part < kParts; ++part) {
                const uint2 v = *reinterpret_cast<const uint2*>(halo + part * kHaloArrayBytes +
                                                                row_at[h] + tap_at);
                buf[part][h] = v.x;      // channel t: logical column t
                buf[part][2 + h] = v.y;  // channel t + 4: column t + 4
            }
    };
    if (kPrefetch) load_tap(0, a[0]);
#pragma unroll
    for (int j = 0; j < kV3MaxTaps; ++j) {
        if (j < shape.taps) {
            uint32_t (&buf)[kParts][4] = a[j % kBuffers];
            if (!kPrefetch) load_tap(j, buf);
            // Buffer (j + 1) % 3 last held tap j - 2, done since step j - 1's wait.
            if (kPrefetch && j + 1 < shape.taps) load_tap(j + 1, a[(j + 1) % kBuffers]);
            // k-block j / 4's tiles, k-step j % 4 (32 bytes, 2 in the descriptor's 16-byte
            // units): compile-time offsets from the first tile's descriptor.
            constexpr int kTile = V3WeightStage::kTileBytes / 16;
            const uint64_t desc_big = desc0 + ((j / 4) * 3 * kTile + 2 * (j % 4));
            const uint64_t desc_small = desc_big + kTile;
            const uint64_t desc_cross =
                kParts == 3 && b_cross_tile ? desc_big + 2 * kTile : desc_big;
#pragma unroll
            for (int part = 0; part < kParts; ++part) pin_registers(buf[part]);
            pin_registers(acc_big);
            pin_registers(acc_cross);
            wgmma_fence();
            const int accumulate = j > 0;  // tap 0 starts both afresh
            Mma::mma(acc_cross, buf[1], desc_cross, accumulate);
            Mma::mma(acc_cross, buf[kParts == 2 ? 0 : 2], desc_small, 1);
            Mma::mma(acc_big, buf[0], desc_big, accumulate);
            wgmma_commit();
            if (kPrefetch) {
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
}

// (3) for the half types: native k16 wgmmas (twice TF32's k8 a wgmma, and 16-bit operands),
// k-step i the taps 2 i and 2 i + 1 (relay_weights_16's layout): a thread's A registers are
// words q of its two rows' 16-bit halo pixels at those taps (the m64n64k16 A fragment: k
// 2q, 2q + 1 of tap 2 i, then of tap 2 i + 1; the word holds channels q and q + 4, the
// permutation relay_weights_16 gives B too), zeros for a tap past the kernel's. Step i + 1's
// registers are loaded before step i's wgmma is issued (three buffers), as tile_products does.
// row_at: the float halo's byte offsets (halved for the 16-bit halo).
template <class T, int kAcc>
__device__ __forceinline__ void tile_products_16(float (&acc)[kAcc], const uint8_t* halo,
                                                 const int (&row_at)[2], const V3Shape& shape,
                                                 uint64_t desc0) {
    using Mma = WgmmaHalfRs<kBN, T>;
    constexpr int kMaxSteps = (kV3MaxTaps + 1) / 2;
    const int steps = (shape.taps + 1) / 2;
    uint32_t a[3][4];  // [buffer][wgmma register]
    auto load_step = [&](int i, uint32_t (&buf)[4]) {
#pragma unroll
        for (int second = 0; second < 2; ++second) {
            const int tap = 2 * i + second;  // (a constant once unrolled: no local copy)
            const int tap_at = shape.tap_offset[tap] * kHaloHalfPixelBytes;
#pragma unroll
            for (int h = 0; h < 2; ++h)
                buf[2 * second + h] =
                    tap < shape.taps
                        ? *reinterpret_cast<const uint32_t*>(halo + row_at[h] / 2 + tap_at)
                        : 0u;
        }
    };
    load_step(0, a[0]);
#pragma unroll
    for (int i = 0; i < kMaxSteps; ++i) {
        if (i < steps) {
            if (i + 1 < kMaxSteps && i + 1 < steps) load_step(i + 1, a[(i + 1) % 3]);
            // k-block i / 4, k-step i % 4 (32 bytes: 2 in the descriptor's 16-byte units).
            const uint64_t desc = desc0 + ((i / 4) * (kV3HalfKBlockBytes / 16) + 2 * (i % 4));
            pin_registers(a[i % 3]);
            pin_registers(acc);
            wgmma_fence();
            Mma::mma(acc, a[i % 3], desc, i > 0);
            wgmma_commit();
            wgmma_wait<1>();  // step i - 1's wgmma is done: its buffer is free
            pin_registers(a[(i + 2) % 3]);
        }
    }
    wgmma_wait<0>();
#pragma unroll
    for (int b = 0; b < 3; ++b) pin_registers(a[b]);
    pin_registers(acc);
}

// Each warpgroup takes tiles first, first + step, ...: per tile (1) split the landed halo,
// (2) start the next tile's copies, (3) the products, (4) the tile staged, (5) and (6) the
// extremes and statistics (the steps' comments say what each synchronises).
template <class T>
__global__ void __launch_bounds__(v3_threads<T>(), 1)
    conv_gn_pool_v3_kernel(const T* __restrict__ x, const T* __restrict__ weight,
                           tc::PackedB layout, Params<T> p,
                           ConvGeometryFast f, BandPixels bands, V3Shape shape) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int kAcc = kBN / 2;
    const Conv2dGeometry& g = f.g;
    extern __shared__ uint8_t smem_raw[];
    uint8_t* weights = tc::align_1024(smem_raw);
    WarpgroupSmem* wg_smem =
        reinterpret_cast<WarpgroupSmem*>(weights + v3_weight_bytes<T>(layout.num_kb));
    // [kHaloItems]: where each halo item comes from and goes; [kWideCopies]: the same for the
    // 16-byte copies (write_halo_plan).
    int4* halo_plan = reinterpret_cast<int4*>(wg_smem + v3_warpgroups<T>());
    int4* wide_plan = halo_plan + kHaloItems;
    const V3Thread t(threadIdx.x);
    WarpgroupSmem& my = wg_smem[t.warpgroup];

    __shared__ uint32_t stage_bias[kBN / 2];  // (the half types' stage_tile)
    write_stage_bias(stage_bias, p, f.cout, t.tid);
    const bool nonfinite = relay_weights(weights, weight, layout, p, g, f.cout, t.tid);
    if (t.warpgroup == 0) write_halo_plan(halo_plan, wide_plan, shape, g, t.wtid);
    // B's cross tiles only where some weight is not finite (see tf32x3.cuh). This barrier
    // also publishes the weights, the plan and stage_bias.
    const bool b_cross_tile = __syncthreads_or(nonfinite) != 0;

    // This thread's two tile rows (h = 0, 1): band row `warp`, column quad_row + 8h; their
    // halo byte offsets for tap 0 (tap (r, s) adds r * dil_h * halo_w + s * dil_w pixels).
    int row_at[2];
#pragma unroll
    for (int h = 0; h < 2; ++h)
        row_at[h] = halo_offset(
            t.warp * g.stride_h * shape.halo_w + (t.quad_row + 8 * h) * g.stride_w, t.quad_col);
    const V3WindowPairs pairs(t, p, f.cout);
    const uint64_t desc0 = make_smem_desc_sw128(smem_address(weights));
    const int raw_channel = shape.halo_h * shape.raw_pitch;  // floats of one channel in raw

    const int total_tiles = f.batch * bands.tiles_per_image;
    const int first = v3_warpgroups<T>() * static_cast<int>(blockIdx.x) + t.warpgroup;
    const int step = v3_warpgroups<T>() * static_cast<int>(gridDim.x);
    auto fetch = [&](int tile) {
        fetch_halo(tile, x, my.raw_of<T>(), halo_plan, wide_plan, shape, g, bands, t.wtid);
    };
    if (first < total_tiles) fetch(first);
    cp_async_wait_all();  // (the later tiles' copies are waited for before (4)'s barrier)
    warpgroup_sync(t.warpgroup);

    for (int tile = first; tile < total_tiles; tile += step) {
        // (1) This tile's halo into shared memory, split. The previous tile's reads of the
        // halo ended before its epilogue's barriers, and its copies of raw too (see (4)).
        const bool finite = split_halo<T>(my, halo_plan, raw_channel, t.wtid);
        const bool finite_tile = warpgroup_sync_and(t.warpgroup, finite);
        // (2) The next tile's halo, in flight during this tile's work.
        if (tile + step < total_tiles) fetch(tile + step);
        // (3)
        float acc_big[kAcc], acc_cross[kAcc];
        if constexpr (is_half_type<T>())
            tile_products_16<T>(acc_big, my.halo, row_at, shape, desc0);
        else if (finite_tile && !b_cross_tile)
            tile_products<2>(acc_big, acc_cross, my.halo, row_at, shape, desc0, b_cross_tile);
        else
            tile_products<3>(acc_big, acc_cross, my.halo, row_at, shape, desc0, b_cross_tile);
        // (4)
        stage_tile<T>(my, acc_big, acc_cross, t, stage_bias);
        // The next tile's copies of (2) have landed, and after this barrier every thread may
        // read every thread's (the 16-byte copies are not split by the thread that made them).
        cp_async_wait_all();
        warpgroup_sync(t.warpgroup);
        // (5) Group 0's place in the statistics; group g's is g runs of the image's tiles
        // further (see stats_at).
        const V3TilePlace at(tile, bands, g);
        float* tile_group_stats =
            stats_at(p.tile_stats, bands, p.groups, at.n, 0, tile - at.n * bands.tiles_per_image);
        if (at.whole())
            window_pairs<true>(my, pairs, at, p, f.cout, tile_group_stats, bands.tiles_per_image,
                               shape.group_shift);
        else
            window_pairs<false>(my, pairs, at, p, f.cout, tile_group_stats,
                                bands.tiles_per_image, shape.group_shift);
        if (shape.group_shift < 0) {  // (6)
            warpgroup_sync(t.warpgroup);
            merge_channels_in_order(my, p.groups, f.cout, tile_group_stats,
                                    bands.tiles_per_image, t.wtid);
        }
        // The staged tile and the channel statistics are rewritten only after the next
        // tile's first barrier (after the split), which every thread of the warpgroup reaches
        // after (5) and (6).
    }
#else
    __trap();  // built without sm_90a: the Python layer refuses these kernels there
#endif
}
}  // namespace conv_gn_pool
}  // namespace scratchops
