// gemm_v6_wgmma.cuh — GEMM v6: v5's kernel (mma_sync_3xtf32.cuh) with Hopper's wgmma in
// place of mma.sync (sm_90a), and nothing else changed.
//
// The one idea: a warpgroup's wgmma multiplies its 64 x 8 A fragment rows by a whole 8 x BN
// slab of B in one instruction, reading B from shared memory itself (a descriptor of the
// packed, 128-byte-swizzled tile; tensor_core_operands.cuh) instead of each warp loading B
// fragments into registers for 16 x 8 x 8 mma.syncs. A still comes from registers, split as
// in v5 (tc::a_fragments). Kept from v5: two shared-memory stages filled by cp.async from all
// threads, a __syncthreads between k-blocks, one tile a CTA, and each k-step's wgmmas waited
// for before the next k-step's (wgmma is asynchronous: v8 lets them run on). cp.async writes
// through the generic proxy and wgmma reads through the async one, so a proxy fence
// separates the two.
#pragma once

#include <atomic>
#include <cstdint>

#include <cuda_runtime.h>

#include "tf32x3.cuh"

namespace scratchops {
namespace gemm_v6 {

using tc::PackedB;
using tc::TileCoords;
using tc::TileGrid;

constexpr int kWarpgroups = 2;  // consumers only, laid out as tf32x3's (TileCoords)
constexpr int kThreads = kWarpgroupThreads * kWarpgroups;
constexpr int kStages = 2;

template <int BN, int MB, bool kTf32>
struct Config : tc::BStage<BN, kTf32> {
    static constexpr int kBM = kWarpgroups * 64 * MB;
    static constexpr int kSmemBytes = tc::BStage<BN, kTf32>::ring_bytes(kStages);
};

// One k-block's 4 k-steps on wgmma, each waited for before the next: A's fragments split
// from raw (and raw refilled from next), then the k-step's wgmmas against the stage's tiles
// (desc). carry_on: the first k-step adds to acc instead of starting it afresh.
template <int BN, bool kTf32, int MB, class ALoader>
__device__ __forceinline__ void kblock_wgmmas_one_by_one(
    float (&acc)[MB][BN / 2], float (&raw)[MB][2][8], const ALoader& loader,
    const typename ALoader::KPtr (&next)[MB][2],
    const tf32x3::StageDescriptors<BN * 128>& desc, bool carry_on) {
    uint32_t a_big[MB][4], a_small[MB][4], a_cross[MB][4];
#pragma unroll
    for (int s = 0; s < 4; ++s) {
        tc::a_fragments<kTf32>(raw, loader, next, s, a_big, a_small, a_cross, [](int) {});
        tf32x3::kstep_wgmmas<BN, kTf32>(acc, a_big, a_small, a_cross, desc.big + 2 * s,
                                        desc.small + 2 * s, desc.cross + 2 * s,
                                        s > 0 || carry_on);
        wgmma_wait<0>();
#pragma unroll
        for (int mb = 0; mb < MB; ++mb) {
            pin_registers(acc[mb]);
            tf32x3::pin_a<kTf32>(a_big[mb], a_small[mb], a_cross[mb]);
        }
    }
}

template <int BN, int MB, bool kTf32, class ALoader, class Epilogue>
__global__ void __launch_bounds__(kThreads, 1)
    wgmma_kernel(const ALoader loader, const Epilogue epilogue, const uint8_t* packed_b,
                 const PackedB layout, const TileGrid grid) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using Cfg = Config<BN, MB, kTf32>;
    constexpr int kAcc = BN / 2;
    extern __shared__ uint8_t smem_raw[];
    uint8_t* stages = tc::align_1024(smem_raw);

    int b, mt, nt;
    grid.locate(blockIdx.x, b, mt, nt);
    const int num_kb = layout.num_kb;
    const TileCoords me = TileCoords::of_thread(threadIdx.x);

    const bool b_cross_tile = tc::b_has_nonfinite(packed_b, layout);
    const tc::CpAsyncStages<kStages, Cfg::kStageBytes, kThreads> b_stages{
        stages, tc::tile_b(packed_b, layout, grid, b, nt), layout.stage_bytes(),
        tc::stage_copy_bytes<kTf32>(b_cross_tile, Cfg::kTileBytes), l2_evict_last()};

    tc::TileARows<MB, Cfg::kBM, ALoader> a_rows(loader, me, b, mt);
    auto point_at = [&](int kb) { a_rows.point_at(loader, kb, num_kb, me.lane % 4); };
    float raw[MB][2][8];
    a_rows.start(loader, raw, num_kb, me.lane % 4);
    b_stages.copy(0);

    float total[MB][kAcc], part[MB][kAcc];
    float(&acc)[MB][kAcc] = kTf32 ? total : part;
    tc::set_zero(total);
    for (int kb = 0; kb < num_kb; ++kb) {
        cp_async_wait_all();         // this thread's copies of k-block kb
        fence_proxy_async_shared();  // ... visible to wgmma's proxy
        __syncthreads();             // everyone's; and k-block kb - 1's stage is free again
        if (kb + 1 < num_kb) b_stages.copy(kb + 1);
        const tf32x3::StageDescriptors<Cfg::kTileBytes> desc(
            smem_address(stages + (kb % kStages) * Cfg::kStageBytes), b_cross_tile);
        // One k-block a partial sum (3xTF32); the TF32 mode sums the tile in the total.
        kblock_wgmmas_one_by_one<BN, kTf32>(acc, raw, loader, a_rows.next, desc, kTf32 && kb > 0);
        point_at(kb + 2);
        if (!kTf32) tc::add_to(total, part);
    }
    epilogue.template store<BN, MB>(total, me.at(b, mt * Cfg::kBM, nt * BN), epilogue.prepare(me));
#else
    __trap();  // built without sm_90a: the caller refuses this version on other GPUs
#endif
}

// tf32x3::launch's contract, one CTA a tile.
template <int BN, int MB, bool kTf32, class ALoader, class Epilogue>
cudaError_t launch(const ALoader& loader, const Epilogue& epilogue, const uint8_t* packed,
                   const PackedB& layout, int m_rows, int batch, bool b_shared,
                   cudaStream_t stream) {
    using Cfg = Config<BN, MB, kTf32>;
    static std::atomic<unsigned long long> smem_set_on;  // devices (common.cuh)
    return tc::launch_tile_per_cta(smem_set_on, wgmma_kernel<BN, MB, kTf32, ALoader, Epilogue>,
                                   Cfg::kSmemBytes, Cfg::kBM, kThreads, loader, epilogue, packed,
                                   layout, m_rows, batch, b_shared, stream);
}

}  // namespace gemm_v6
}  // namespace scratchops
