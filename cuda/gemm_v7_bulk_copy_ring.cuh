// gemm_v7_bulk_copy_ring.cuh — GEMM v7: v6 with B brought in by the copy engine, several
// k-blocks ahead, through a ring of STAGES shared-memory stages guarded by mbarriers (sm_90a).
//
// The one idea: in v6 every thread issued 16-byte cp.async copies of B (a k-block's 36 KB
// is 9 copies a thread) one k-block ahead. Here one thread hands each k-block's B tiles to
// the copy engine as a single bulk copy (cp.async.bulk: no thread work per byte), STAGES - 1
// k-blocks ahead, and the stage's "full" mbarrier counts its bytes in: a consumer waits on
// the barrier's phase instead of on its own copies plus a CTA barrier. The ring's stage
// kb % STAGES is refilled with k-block kb + STAGES - 1 once every thread is done with k-block
// kb - 1, which held it: the __syncthreads at the top of k-block kb says so (v8 replaces it
// with "empty" mbarriers and a producer warpgroup of its own). The copy engine writes through
// the async proxy, as wgmma reads: no proxy fence.
#pragma once

#include <atomic>
#include <cstdint>

#include <cuda_runtime.h>

#include "gemm_v6_wgmma.cuh"

namespace scratchops {
namespace gemm_v7 {

using tc::PackedB;
using tc::TileCoords;
using tc::TileGrid;
using gemm_v6::kThreads;

template <int BN, int MB, int STAGES, bool kTf32>
struct Config : tc::BStage<BN, kTf32> {
    static constexpr int kBM = gemm_v6::kWarpgroups * 64 * MB;
    static constexpr int kSmemBytes = tc::BStage<BN, kTf32>::ring_bytes(STAGES);
    static_assert(kSmemBytes <= kSm90SmemOptinBytes, "stages must fit in shared memory");
};

template <int BN, int MB, int STAGES, bool kTf32, class ALoader, class Epilogue>
__global__ void __launch_bounds__(kThreads, 1)
    bulk_copy_ring_kernel(const ALoader loader, const Epilogue epilogue, const uint8_t* packed_b,
                          const PackedB layout, const TileGrid grid) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using Cfg = Config<BN, MB, STAGES, kTf32>;
    constexpr int kAcc = BN / 2;
    extern __shared__ uint8_t smem_raw[];
    __shared__ uint64_t full_bar[STAGES];
    uint8_t* stages = tc::align_1024(smem_raw);

    int b, mt, nt;
    grid.locate(blockIdx.x, b, mt, nt);
    const int num_kb = layout.num_kb;
    const TileCoords me = TileCoords::of_thread(threadIdx.x);
    if (threadIdx.x == 0) {
        for (int i = 0; i < STAGES; ++i) mbarrier_init(&full_bar[i], 1);
        fence_barrier_init();
    }
    // (This barrier also publishes the initialised mbarriers.)
    const bool b_cross_tile = tc::b_has_nonfinite(packed_b, layout);
    const uint32_t copy_bytes = tc::stage_copy_bytes<kTf32>(b_cross_tile, Cfg::kTileBytes);
    const uint8_t* b_tiles = tc::tile_b(packed_b, layout, grid, b, nt);
    auto copy_stage = [&](int kb) {  // thread 0: k-block kb's B tiles into stage kb % STAGES
        const int stage = kb % STAGES;
        mbarrier_arrive_expect_tx(&full_bar[stage], copy_bytes);
        bulk_copy_to_shared(stages + stage * Cfg::kStageBytes, b_tiles + kb * layout.stage_bytes(),
                            copy_bytes, &full_bar[stage]);
    };
    if (threadIdx.x == 0)
        for (int kb = 0; kb < STAGES - 1 && kb < num_kb; ++kb) copy_stage(kb);

    tc::TileARows<MB, Cfg::kBM, ALoader> a_rows(loader, me, b, mt);
    auto point_at = [&](int kb) { a_rows.point_at(loader, kb, num_kb, me.lane % 4); };
    float raw[MB][2][8];
    a_rows.start(loader, raw, num_kb, me.lane % 4);

    float total[MB][kAcc], part[MB][kAcc];
    float(&acc)[MB][kAcc] = kTf32 ? total : part;
    tc::set_zero(total);
    for (int kb = 0; kb < num_kb; ++kb) {
        __syncthreads();  // every thread is done with k-block kb - 1: its stage may refill
        if (threadIdx.x == 0 && kb + STAGES - 1 < num_kb) copy_stage(kb + STAGES - 1);
        const int stage = kb % STAGES;
        mbarrier_wait(&full_bar[stage], (kb / STAGES) & 1);  // k-block kb's bytes are in
        const tf32x3::StageDescriptors<Cfg::kTileBytes> desc(
            smem_address(stages + stage * Cfg::kStageBytes), b_cross_tile);
        gemm_v6::kblock_wgmmas_one_by_one<BN, kTf32>(acc, raw, loader, a_rows.next, desc,
                                                     kTf32 && kb > 0);
        point_at(kb + 2);
        if (!kTf32) tc::add_to(total, part);
    }
    epilogue.template store<BN, MB>(total, me.at(b, mt * Cfg::kBM, nt * BN), epilogue.prepare(me));
#else
    __trap();  // built without sm_90a: gemm refuses v7 on other GPUs
#endif
}

// tf32x3::launch's contract, one CTA a tile.
template <int BN, int MB, int STAGES, bool kTf32, class ALoader, class Epilogue>
cudaError_t launch(const ALoader& loader, const Epilogue& epilogue, const uint8_t* packed,
                   const PackedB& layout, int m_rows, int batch, bool b_shared,
                   cudaStream_t stream) {
    using Cfg = Config<BN, MB, STAGES, kTf32>;
    static std::atomic<unsigned long long> smem_set_on;  // devices (common.cuh)
    return tc::launch_tile_per_cta(
        smem_set_on, bulk_copy_ring_kernel<BN, MB, STAGES, kTf32, ALoader, Epilogue>,
        Cfg::kSmemBytes, Cfg::kBM, kThreads, loader, epilogue, packed, layout, m_rows, batch,
        b_shared, stream);
}

}  // namespace gemm_v7
}  // namespace scratchops
