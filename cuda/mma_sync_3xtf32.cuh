// mma_sync_3xtf32.cuh — the tensor-core engine for sm_80 and later (A100, RTX 30/40, L4,
// L40; sm_90 too, where tf32x3.cuh's wgmma engine is the faster path): the same product,
// D (M x N) = A (M x K) @ B^T, from the same operands and to the same epilogues, on the warp-
// level mma.sync.m16n8k8 TF32 instruction instead of Hopper's warpgroup wgmma.
//
// What it shares with tf32x3.cuh, unchanged: the 3xTF32 split and its order of products, the
// TF32 mode (one product, A rounded to nearest, the whole tile summed in the tensor cores),
// the partial sums of kGroup k-blocks, the packed B (pack_b's tiles are the shared-memory
// image either engine reads), the A loaders (a thread's 8 consecutive physical k of a row)
// and the epilogues. mma.sync's fragments are the ones a warp of a wgmma warpgroup holds:
//   A (16 x 8, registers): a0 (row g, column t), a1 (row g + 8, t), a2 (g, t + 4),
//     a3 (g + 8, t + 4), lane = 4g + t: wgmma's register A, so the split A is built as there;
//   B (8 x 8): b0 = B(k = t, n = g), b1 = B(t + 4, g): read from the packed tile at logical
//     columns 8s + t and 8s + t + 4 of row n (k-step s), two 4-byte loads a fragment, on 32
//     different banks across the warp (the 128-byte swizzle spreads the rows g);
//   D (16 x 8): d0, d1 (row g, columns 2t, 2t + 1), d2, d3 (row g + 8): accumulator
//     4 * nb + 2h + c of column block nb, as the epilogues expect.
// What differs, one idea each:
//   warps     8 warps, in two groups of 4 laid out as the wgmma engine's two consumer
//             warpgroups: warp q of group w owns rows 64 * MB * w + 64 * mb + 16 q .. + 15 of
//             the tile, so TileCoords mean the same to an epilogue. No producer warps: every
//             thread also copies.
//   B ring    two shared-memory stages filled by cp.async (16 bytes a thread and copy, kept
//             in L2 for the other CTAs): while the warps multiply k-block j from one stage,
//             k-block j + 1 lands in the other; a barrier between k-blocks hands a stage back.
//   one tile  a CTA per tile (no persistent loop): the simplest grid.
// Shared memory: two stages of 1 (TF32 mode) or 3 tiles of BN x 128 bytes, at most 96 KB for
// BN = 128, inside every sm_80+ GPU's per-block limit (99 KB on sm_86 and sm_89).
#pragma once

#include <atomic>
#include <cstdint>

#include <cuda_runtime.h>

#include "common.cuh"
#include "hopper.cuh"
#include "tensor_core_a_fragments.cuh"
#include "pack_b.cuh"

namespace scratchops {
namespace mma_sync {

using tc::PackedB;
using tc::TileCoords;
using tc::TileGrid;

constexpr int kWarpGroups = 2;  // laid out as tf32x3's consumer warpgroups (see the top)
constexpr int kWarps = 4 * kWarpGroups;
constexpr int kThreads = 32 * kWarps;
constexpr int kStages = 2;

template <int BN, int MB, bool kTf32>
struct Config : tc::BStage<BN, kTf32> {  // (cp.async and ldmatrix: no swizzle, no slack)
    static constexpr int kBM = kWarpGroups * 64 * MB;  // rows of a tile
    static constexpr int kSmemBytes = kStages * tc::BStage<BN, kTf32>::kStageBytes;
    static_assert(kSmemBytes <= 96 * 1024, "the stages fit every sm_80+ GPU's block limit");
};

// D += A * B for one 16 x 8 x 8 block (PTX ISA "mma.sync", m16n8k8 .tf32).
__device__ __forceinline__ void mma_tf32(float& d0, float& d1, float& d2, float& d3,
                                         const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

__device__ __forceinline__ uint32_t shared_u32(const uint8_t* p) {
    return *reinterpret_cast<const uint32_t*>(p);
}

// One k-step's products for the MB row blocks, BN / 8 column blocks of 8 each: B's
// fragment values from the stage's tiles (row n = 8 nb + g, logical column 8s + t + 4 half,
// g = lane / 4, t = lane % 4), the cross terms first, as tf32x3.cuh orders them (the TF32
// mode: the big product alone).
template <int BN, bool kTf32, int MB>
__device__ __forceinline__ void kstep_mmas(float (&acc)[MB][BN / 2], const uint32_t (&a_big)[MB][4],
                                           const uint32_t (&a_small)[MB][4],
                                           const uint32_t (&a_cross)[MB][4], const uint8_t* big,
                                           const uint8_t* small, const uint8_t* cross, int s,
                                           int lane) {
#pragma unroll
    for (int nb = 0; nb < BN / 8; ++nb) {
        const int at0 = tc::packed_offset(8 * nb + lane / 4, 8 * s + lane % 4);
        const int at1 = tc::packed_offset(8 * nb + lane / 4, 8 * s + lane % 4 + 4);
        const uint32_t big0 = shared_u32(big + at0), big1 = shared_u32(big + at1);
#pragma unroll
        for (int mb = 0; mb < MB; ++mb) {
            float(&d)[BN / 2] = acc[mb];
            const int i = 4 * nb;
            if (!kTf32) {
                mma_tf32(d[i], d[i + 1], d[i + 2], d[i + 3], a_small[mb], shared_u32(cross + at0),
                         shared_u32(cross + at1));
                mma_tf32(d[i], d[i + 1], d[i + 2], d[i + 3], a_cross[mb], shared_u32(small + at0),
                         shared_u32(small + at1));
            }
            mma_tf32(d[i], d[i + 1], d[i + 2], d[i + 3], a_big[mb], big0, big1);
        }
    }
}

template <int BN, int MB, int kGroup, bool kTf32, class ALoader, class Epilogue>
__global__ void __launch_bounds__(kThreads, 1)
    mma_sync_kernel(const ALoader loader, const Epilogue epilogue, const uint8_t* packed_b,
                    const PackedB layout, const TileGrid grid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    using Cfg = Config<BN, MB, kTf32>;
    constexpr int kAcc = BN / 2;
    extern __shared__ __align__(128) uint8_t stages[];

    int b, mt, nt;
    grid.locate(blockIdx.x, b, mt, nt);
    const int num_kb = layout.num_kb;
    const int warp_group = threadIdx.x / kWarpgroupThreads, warp = (threadIdx.x / 32) % 4;
    const int lane = threadIdx.x % 32, quad_col = lane % 4;

    // As in tf32x3.cuh: B's cross tiles only when some B value is not finite; every thread
    // copies 16 bytes at a time.
    const bool b_cross_tile = tc::b_has_nonfinite(packed_b, layout);
    const tc::CpAsyncStages<kStages, Cfg::kStageBytes, kThreads> b_stages{
        stages, tc::tile_b(packed_b, layout, grid, b, nt), layout.stage_bytes(),
        tc::stage_copy_bytes<kTf32>(b_cross_tile, Cfg::kTileBytes), l2_evict_last()};

    const TileCoords me{0, 0, 0, warp_group, warp, lane};  // this thread's place in the tile
    tc::TileARows<MB, Cfg::kBM, ALoader> a_rows(loader, me, b, mt);
    auto point_at = [&](int kb) { a_rows.point_at(loader, kb, num_kb, quad_col); };
    float raw[MB][2][8];  // the thread's 8 values of each row for the k-block being consumed
    a_rows.start(loader, raw, num_kb, quad_col);
    b_stages.copy(0);

    // total: the tile's sum with fp32 adds; part: one group's products (tf32x3.cuh's
    // "partial sums"); the TF32 mode sums the whole tile into total.
    float total[MB][kAcc], part[MB][kAcc];
    float(&acc)[MB][kAcc] = kTf32 ? total : part;
    tc::set_zero(total);

    const int group = kTf32 ? num_kb : kGroup;
    for (int kb = 0; kb < num_kb; ++kb) {
        cp_async_wait_all();  // this thread's copies of k-block kb
        __syncthreads();      // everyone's; and k-block kb - 1's stage is free again
        if (kb + 1 < num_kb) b_stages.copy(kb + 1);
        if (!kTf32 && kb % group == 0) tc::set_zero(part);
        const uint8_t* big = stages + (kb % kStages) * Cfg::kStageBytes;
        const uint8_t* small = big + Cfg::kTileBytes;
        const uint8_t* cross = b_cross_tile ? big + 2 * Cfg::kTileBytes : big;
#pragma unroll
        for (int s = 0; s < 4; ++s) {
            // A's fragments of k-step s, then the two values consumed refilled.
            uint32_t a_big[MB][4], a_small[MB][4], a_cross[MB][4];
            tc::a_fragments<kTf32>(raw, loader, a_rows.next, s, a_big, a_small, a_cross,
                                   [](int) {});
            kstep_mmas<BN, kTf32>(acc, a_big, a_small, a_cross, big, small, cross, s, lane);
        }
        point_at(kb + 2);
        if (!kTf32 && (kb % group == group - 1 || kb == num_kb - 1)) tc::add_to(total, part);
    }
    const typename Epilogue::Prepared prepared = epilogue.prepare(me);
    epilogue.template store<BN, MB>(total, me.at(b, mt * Cfg::kBM, nt * BN), prepared);
#else
    __trap();  // built for a GPU without mma.sync's TF32 (before sm_80): never launched
#endif
}

// The same contract as tf32x3::launch (STAGES aside: this engine has its own two).
template <int BN, int MB, int kGroup = 1, bool kTf32 = false, class ALoader, class Epilogue>
cudaError_t launch(const ALoader& loader, const Epilogue& epilogue, const uint8_t* packed,
                   const PackedB& layout, int m_rows, int batch, bool b_shared,
                   cudaStream_t stream) {
    using Cfg = Config<BN, MB, kTf32>;
    static std::atomic<unsigned long long> smem_set_on;  // devices (common.cuh)
    return tc::launch_tile_per_cta(smem_set_on,
                                   mma_sync_kernel<BN, MB, kGroup, kTf32, ALoader, Epilogue>,
                                   Cfg::kSmemBytes, Cfg::kBM, kThreads, loader, epilogue, packed,
                                   layout, m_rows, batch, b_shared, stream);
}

}  // namespace mma_sync
}  // namespace scratchops
