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
struct Config {
    static constexpr int kBM = kWarpgroups * 64 * MB;
    static constexpr int kTileBytes = BN * 128;
    static constexpr int kStageBytes = (kTf32 ? 1 : 3) * kTileBytes;
    static constexpr int kSmemBytes = kStages * kStageBytes + 1024;  // + alignment slack
};

template <int BN, int MB, bool kTf32, class ALoader, class Epilogue>
__global__ void __launch_bounds__(kThreads, 1)
    wgmma_kernel(const ALoader loader, const Epilogue epilogue, const uint8_t* packed_b,
                 const PackedB layout, const TileGrid grid) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using Cfg = Config<BN, MB, kTf32>;
    constexpr int kAcc = BN / 2;
    extern __shared__ uint8_t smem_raw[];
    // Stage tiles start on a 1024-byte boundary (the swizzle pattern repeats every 1024 bytes).
    const uint32_t raw_addr = smem_address(smem_raw);
    uint8_t* stages = smem_raw + (((raw_addr + 1023) & ~1023u) - raw_addr);

    int b, mt, nt;
    grid.locate(blockIdx.x, b, mt, nt);
    const int num_kb = layout.num_kb;
    const TileCoords me{0, 0, 0, static_cast<int>(threadIdx.x) / kWarpgroupThreads,
                        static_cast<int>(threadIdx.x) / 32 % 4, static_cast<int>(threadIdx.x) % 32};

    const bool b_cross_tile = tc::b_has_nonfinite(packed_b, layout);
    const int copy_bytes = (kTf32 ? 1 : b_cross_tile ? 3 : 2) * Cfg::kTileBytes;
    const uint8_t* b_tiles =
        packed_b + (static_cast<long long>(grid.b_shared ? 0 : b) * grid.n_tiles + nt) * num_kb *
                       layout.stage_bytes();
    const uint64_t keep_in_l2 = l2_evict_last();
    auto copy_stage = [&](int kb) {  // k-block kb's B tiles into stage kb % kStages
        uint8_t* to = stages + (kb % kStages) * Cfg::kStageBytes;
        const uint8_t* from = b_tiles + kb * layout.stage_bytes();
        for (int c = 16 * threadIdx.x; c < copy_bytes; c += 16 * kThreads)
            cp_async_or_zero<16>(to + c, reinterpret_cast<const float*>(from + c), true,
                                 keep_in_l2);
        cp_async_commit();
    };

    typename ALoader::Row rows[MB][2];
#pragma unroll
    for (int mb = 0; mb < MB; ++mb)
#pragma unroll
        for (int h = 0; h < 2; ++h)
            rows[mb][h] = loader.row(b, mt * Cfg::kBM + me.tile_row<MB>(mb, h));
    typename ALoader::KPtr next[MB][2];
    auto point_at = [&](int kb) {
        const typename ALoader::KBlock blk = loader.kblock(kb, me.lane % 4);
#pragma unroll
        for (int mb = 0; mb < MB; ++mb)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                next[mb][h] = kb < num_kb ? loader.kptr(rows[mb][h], blk) : loader.none();
    };
    float raw[MB][2][8];
    point_at(0);
    tc::fetch_kblock(loader, next, raw);
    point_at(1);
    copy_stage(0);

    float total[MB][kAcc], part[MB][kAcc];
    float(&acc)[MB][kAcc] = kTf32 ? total : part;
    tc::set_zero(total);
    uint32_t a_big[MB][4], a_small[MB][4], a_cross[MB][4];
    for (int kb = 0; kb < num_kb; ++kb) {
        cp_async_wait_all();         // this thread's copies of k-block kb
        fence_proxy_async_shared();  // ... visible to wgmma's proxy
        __syncthreads();             // everyone's; and k-block kb - 1's stage is free again
        if (kb + 1 < num_kb) copy_stage(kb + 1);
        const tf32x3::StageDescriptors<Cfg::kTileBytes> desc(
            smem_address(stages + (kb % kStages) * Cfg::kStageBytes), b_cross_tile);
#pragma unroll
        for (int s = 0; s < 4; ++s) {
            tc::a_fragments<kTf32>(raw, loader, next, s, a_big, a_small, a_cross, [](int) {});
            // One k-block a partial sum (3xTF32); the TF32 mode sums the tile in the total.
            const int accumulate = s > 0 || (kTf32 && kb > 0);
            tf32x3::kstep_wgmmas<BN, kTf32>(acc, a_big, a_small, a_cross, desc.big + 2 * s,
                                            desc.small + 2 * s, desc.cross + 2 * s, accumulate);
            wgmma_wait<0>();
#pragma unroll
            for (int mb = 0; mb < MB; ++mb) {
                pin_registers(acc[mb]);
                tf32x3::pin_a<kTf32>(a_big[mb], a_small[mb], a_cross[mb]);
            }
        }
        point_at(kb + 2);
        if (!kTf32) tc::add_to(total, part);
    }
    epilogue.template store<BN, MB>(
        total, TileCoords{b, mt * Cfg::kBM, nt * BN, me.warpgroup, me.warp, me.lane},
        epilogue.prepare(me));
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
    auto kernel = wgmma_kernel<BN, MB, kTf32, ALoader, Epilogue>;
    static std::atomic<unsigned long long> smem_set_on;  // devices (common.cuh)
    TileGrid grid;
    int tiles = 0;
    const cudaError_t err = tc::prepare_launch(smem_set_on, kernel, Cfg::kSmemBytes, m_rows,
                                               Cfg::kBM, layout, batch, b_shared, grid, tiles);
    if (err != cudaSuccess || tiles == 0) return err;
    kernel<<<tiles, kThreads, Cfg::kSmemBytes, stream>>>(loader, epilogue, packed, layout, grid);
    return cudaGetLastError();
}

}  // namespace gemm_v6
}  // namespace scratchops
