// conv_weight_grad_row_ring_launch.cuh — the weight gradient v4's kernel and its launch: the
// tf32x3.cuh engine's roles, stages and partial sums, with each consumer warpgroup's A read
// from its ring of input rows (the ring, its geometry and its rows' loads and stores:
// conv_weight_grad_row_ring.cuh, where the whole scheme is described).
#pragma once

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "conv_weight_grad_row_ring.cuh"

namespace scratchops {
namespace wgrad_ring {

// The thread's A fragments of k-step s from the ring: rows h = 0, 1 start at `at[h]` floats
// into the big plane (their first slot of the k-block, ow0), the small plane plane_floats
// further. Register h takes slot ow0 + 2s and register 2 + h slot ow0 + 2s + 1 (physical k
// 8t + 2s and 8t + 2s + 1: tensor_core_operands.cuh's physical_k, as tf32x3's a_fragments).
// kNonfinite: some value the k-block reads is not finite, so the cross parts are made (0 for
// a non-finite value) and the padding slots (ow >= out_w) read as 0 (0 x Inf is not 0).
template <bool kTf32, bool kNonfinite>
__device__ __forceinline__ void ring_fragments(const float* ring, int plane_floats,
                                               const int (&at)[2], int s, int ow0, int out_w,
                                               uint32_t (&big)[4], uint32_t (&small)[4],
                                               uint32_t (&cross)[4]) {
#pragma unroll
    for (int e = 0; e < 2; ++e)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const float* p = ring + at[h] + 2 * s + e;
            uint32_t b = __float_as_uint(p[0]);
            uint32_t sm = kTf32 ? 0u : __float_as_uint(p[plane_floats]);
            if constexpr (kNonfinite) {
                if (ow0 + 2 * s + e >= out_w) b = sm = 0u;
                cross[2 * e + h] = finite_bits(b) ? b : 0u;
            }
            big[2 * e + h] = b;
            small[2 * e + h] = sm;
        }
}

// A row's k-blocks: all values finite, some not, or no rows of the warpgroup's to multiply.
enum RowForm { kRowFinite, kRowNonfinite, kRowIdle };

// A consumer thread's A fragments, double-buffered by k-step (k-step s: buffer s % 2).
struct RingFragments {
    uint32_t big[2][1][4], small[2][1][4], cross[2][1][4];
};

// K-block j of the CTA (q of its output row, its rows starting at `at`): wait for its B stage,
// then 4 k-steps of fragments from the ring and their wgmmas (as tf32x3's run_kblock).
template <bool kTf32, bool kNonfinite, int kAcc>
__device__ __forceinline__ void ring_kblock(float (&acc)[1][kAcc], RingFragments& a,
                                            const RingGeometry& r, const float* ring,
                                            uint64_t* full_bar, uint32_t stages_addr,
                                            bool b_cross_tile, int j, bool fresh, int q,
                                            const int (&at)[2], int lane) {
    using namespace tf32x3;
    using Cfg = BConfig<kTf32>;
    const int stage = j % kStages;
    mbarrier_wait(&full_bar[stage], (j / kStages) & 1);
    const StageDescriptors<Cfg::kTileBytes> desc(stages_addr + stage * Cfg::kStageBytes,
                                                 b_cross_tile);
    const int from[2] = {at[0] + q * kBlockK, at[1] + q * kBlockK};
    const int ow0 = q * kBlockK + 8 * (lane % 4);
#pragma unroll
    for (int s = 0; s < 4; ++s) {
        const int buf = s & 1;
        ring_fragments<kTf32, kNonfinite>(ring, r.plane_floats, from, s, ow0, r.out_w,
                                          a.big[buf][0], a.small[buf][0], a.cross[buf][0]);
        pin_a<kTf32>(a.big[buf][0], a.small[buf][0], a.cross[buf][0]);
        // k-step s starts 32 * s bytes into the tile rows: + 2 * s in 16-byte units.
        if constexpr (kNonfinite)
            kstep_wgmmas<kBN, kTf32>(acc, a.big[buf], a.small[buf], a.cross[buf],
                                     desc.big + 2 * s, desc.small + 2 * s, desc.cross + 2 * s,
                                     s > 0 || !fresh);
        else  // (every value finite: the big parts are the cross parts)
            kstep_wgmmas<kBN, kTf32>(acc, a.big[buf], a.small[buf], a.big[buf],
                                     desc.big + 2 * s, desc.small + 2 * s, desc.cross + 2 * s,
                                     s > 0 || !fresh);
        wgmma_wait<1>();  // the previous step's wgmmas are done: its registers are free
        pin_a<kTf32>(a.big[buf ^ 1][0], a.small[buf ^ 1][0], a.cross[buf ^ 1][0]);
    }
}

// The consumer warpgroups' part of the kernel: the CTA's tiles (the ring's walk, described in
// conv_weight_grad_row_ring.cuh), each stored through the epilogue.
template <int kGroup, bool kTf32, class Epilogue>
__device__ __forceinline__ void consume_tiles(const RingGeometry& r, const Epilogue& epilogue,
                                              const tc::TileGrid& grid, int my_tiles,
                                              int num_kb, uint8_t* stages, uint64_t* full_bar,
                                              uint64_t* empty_bar, bool b_cross_tile) {
    using namespace tf32x3;
    using Cfg = BConfig<kTf32>;
    constexpr int kAcc = kBN / 2;
    const uint32_t stages_addr = smem_address(stages);
    const int warpgroup = threadIdx.x / kWarpgroupThreads - 1;
    const int wtid = threadIdx.x % kWarpgroupThreads, warp = wtid / 32, lane = wtid % 32;
    const int barrier = 1 + warpgroup;  // named barrier of the warpgroup's threads
    const tc::TileCoords me{0, 0, 0, warpgroup, warp, lane};
    const typename Epilogue::Prepared prepared = epilogue.prepare(me);
    float* ring = reinterpret_cast<float*>(stages + kStages * Cfg::kStageBytes) +
                  warpgroup * r.ring_floats();
    const int zero_row = r.slots * r.slot_pitch;  // (in both planes; ordered by the first fill's
    for (int c = wtid; c < r.channel_pitch; c += kWarpgroupThreads)  // barrier)
        ring[zero_row + c] = ring[r.plane_floats + zero_row + c] = 0.0f;

    // total and part as in tf32x3.cuh ("partial sums"); the TF32 mode sums a tile in total.
    float total[1][kAcc], part[1][kAcc];
    float(&acc)[1][kAcc] = kTf32 ? total : part;
    const int group = kTf32 ? num_kb : kGroup;  // k-blocks between drains
    tc::set_zero(total);
    RingFragments a;
    float pending[kFillValues];  // the next output row's new ring row, in flight

    int j = 0;  // the CTA's k-blocks in order (produce_b_stages's)
    for (int tile_i = 0; tile_i < my_tiles; ++tile_i) {
        int entry, mt, nt;
        grid.locate(blockIdx.x + tile_i * gridDim.x, entry, mt, nt);
        const int first_tap = mt * kBM + warpgroup * kWarpgroupRows;
        const WarpgroupChannels ch = channels_of(r, first_tap);
        const ThreadRows rows = thread_rows(r, first_tap, ch, warp, lane);
        const int row0 = (r.first_entry + entry) * r.rows_per_slice;  // global output row
        uint32_t nonfinite_slots = 0;  // bit s: slot s may hold a value that is not finite
        int kb = 0;
        for (int rr = 0; rr < r.rows_per_slice; ++rr) {
            const int row = row0 + rr;
            const bool real_row = row < r.total_rows;
            int n = 0, oh = 0;
            if (real_row) {
                n = r.by_out_h.div(row);
                oh = row - n * r.out_h;
            }
            const int slot0 = oh - r.by_slots.div(oh) * r.slots;  // input row oh - pad_h's
            if (real_row && (rr == 0 || oh == 0)) {  // the tile's or the image's first row
                bool finite = true;
                for (int w = 0; w < r.window; ++w) {
                    load_ring_row(r, n, oh - r.pad_h + w, ch, wtid, pending);
                    const int slot = slot0 + w < r.slots ? slot0 + w : slot0 + w - r.slots;
                    finite = store_ring_row<kTf32>(r, ring, slot, ch, wtid, pending) && finite;
                }
                nonfinite_slots =
                    named_barrier_sync_and(barrier, kWarpgroupThreads, finite) ? 0u : ~0u;
            }
            // The slot the window leaves out (input row oh - pad_h - 1's), next row's new one.
            const int spare = slot0 + r.window < r.slots ? slot0 + r.window
                                                         : slot0 + r.window - r.slots;
            const bool next_row = real_row && rr + 1 < r.rows_per_slice &&
                                  row + 1 < r.total_rows && oh + 1 < r.out_h;
            if (next_row) load_ring_row(r, n, oh + r.window - r.pad_h, ch, wtid, pending);
            // (Warp-uniform values, which ptxas sees as such only through a shuffle: a wgmma
            // under a branch it takes for divergent serialises every wgmma, warning C7518.)
            const bool nonfinite = __shfl_sync(~0u, (nonfinite_slots & ~(1u << spare)) != 0u, 0);
            const bool idle = __shfl_sync(~0u, ch.count == 0, 0);
            int at[2];
            rows.starts(r, slot0, real_row, zero_row, lane, at);
            // The row's k-blocks, in one of three forms chosen for the whole row: a branch
            // between k-blocks with wgmmas in flight makes ptxas wait for them (C7517).
            auto kblocks = [&](auto form) {
                constexpr int kForm = decltype(form)::value;
                for (int q = 0; q < r.kblocks_a_row; ++q, ++kb, ++j) {
                    const bool fresh = kb % group == 0;
                    if constexpr (kForm == kRowIdle)  // every row past the last tap
                        mbarrier_wait(&full_bar[j % kStages], (j / kStages) & 1);
                    else
                        ring_kblock<kTf32, kForm == kRowNonfinite>(
                            acc, a, r, ring, full_bar, stages_addr, b_cross_tile, j, fresh, q, at,
                            lane);
                    if (!fresh && lane == 0) mbarrier_arrive(&empty_bar[(j - 1) % kStages]);
                    if ((kb + 1) % group == 0 || kb + 1 == num_kb) {  // the group's drain
                        wgmma_wait<0>();
                        pin_registers(acc[0]);
                        pin_a<kTf32>(a.big[1][0], a.small[1][0], a.cross[1][0]);
                        if (lane == 0) mbarrier_arrive(&empty_bar[j % kStages]);
                        if (!kTf32) tc::add_to(total, part);
                    }
                }
                wgmma_wait<0>();  // (a group that goes on into the next row: nothing in flight
                pin_registers(acc[0]);  // across the branch)
            };
            if (idle)
                kblocks(std::integral_constant<int, kRowIdle>{});
            else if (nonfinite)
                kblocks(std::integral_constant<int, kRowNonfinite>{});
            else
                kblocks(std::integral_constant<int, kRowFinite>{});
            // The row's end: the next row's new input row into the spare slot; the barrier
            // orders these stores before its reads, and this row's reads before the next
            // stores (or the next tile's or image's window).
            if (next_row) {
                const bool finite = store_ring_row<kTf32>(r, ring, spare, ch, wtid, pending);
                nonfinite_slots = named_barrier_sync_and(barrier, kWarpgroupThreads, finite)
                                      ? nonfinite_slots & ~(1u << spare)
                                      : nonfinite_slots | 1u << spare;
            } else {
                named_barrier_sync(barrier, kWarpgroupThreads);
            }
        }
        epilogue.template store<kBN, 1>(total, me.at(entry, mt * kBM, nt * kBN), prepared);
        if (!kTf32) tc::set_zero(total);  // (the TF32 mode's first wgmma overwrites it)
    }
}

template <int kGroup, bool kTf32, class Epilogue>
__global__ void __launch_bounds__(tf32x3::kThreads, 1)
    wgrad_ring_kernel(const RingGeometry r, const Epilogue epilogue, const uint8_t* packed_b,
                      const tc::PackedB layout, const tc::TileGrid grid) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using namespace tf32x3;
    using Cfg = BConfig<kTf32>;
    extern __shared__ uint8_t smem_raw[];
    __shared__ uint64_t full_bar[kStages], empty_bar[kStages];
    uint8_t* stages = tc::align_1024(smem_raw);
    const int my_tiles = ctas_tiles(grid);
    const int num_kb = layout.num_kb;
    // (The next chunk's one pass may start on the multiprocessors this grid leaves free.)
    if (threadIdx.x == 0) let_next_kernel_start();
    if (threadIdx.x == 0) init_stage_barriers(full_bar, empty_bar);
    const bool b_cross_tile = tc::b_has_nonfinite(packed_b, layout);
    const uint32_t copy_bytes = tc::stage_copy_bytes<kTf32>(b_cross_tile, Cfg::kTileBytes);
    __syncthreads();  // (the barriers initialised before any thread waits on them)

    if (threadIdx.x < kWarpgroupThreads) {  // the producer warpgroup: B's stages, as tf32x3's
        setmaxnreg_dec<kProducerRegisters>();
        if (threadIdx.x == 0)
            produce_b_stages<Cfg::kStageBytes>(stages, full_bar, empty_bar, packed_b, layout,
                                               grid, my_tiles * num_kb, copy_bytes);
        return;
    }
    setmaxnreg_inc<kConsumerRegisters>();
    consume_tiles<kGroup, kTf32>(r, epilogue, grid, my_tiles, num_kb, stages, full_bar,
                                 empty_bar, b_cross_tile);
#else
    __trap();  // built without sm_90a: applies() asks for the wgmma engine
#endif
}

// Tiles an entry of slices takes in launch's grid (tc::prepare_launch's m_tiles x n_tiles).
inline int tiles_per_entry(int taps, const tc::PackedB& layout) {
    return tc::m_tile_count(taps, kBM) * layout.n_tiles;
}

// The product of `entries` entries of slices (conv_weight_grad_implicit.cuh's product(), its
// packed B and its epilogue) with A from the rings; r from geometry(), where applies(). On
// every multiprocessor, or all but free_sms of them (for a kernel beside it: common.cuh's
// launch_beside_previous).
template <int kGroup, bool kTf32, class Epilogue>
cudaError_t launch(const RingGeometry& r, const Epilogue& epilogue, const uint8_t* packed,
                   const tc::PackedB& layout, int entries, cudaStream_t stream,
                   int free_sms = 0) {
    if (layout.num_kb != r.rows_per_slice * r.kblocks_a_row) return cudaErrorInvalidValue;
    auto kernel = wgrad_ring_kernel<kGroup, kTf32, Epilogue>;
    static std::atomic<unsigned long long> smem_set_on;  // devices (common.cuh)
    tc::TileGrid grid;
    int tiles = 0;
    const cudaError_t err = tc::prepare_launch(smem_set_on, kernel, kMaxSmemBytes, r.taps, kBM,
                                               layout, entries, false, grid, tiles);
    if (err != cudaSuccess || tiles == 0) return err;
    const int sms = sm_count() - free_sms > 0 ? sm_count() - free_sms : 1;
    const int ctas = sms < tiles ? sms : tiles;
    kernel<<<ctas, tf32x3::kThreads, smem_bytes<kTf32>(r), stream>>>(r, epilogue, packed, layout,
                                                                      grid);
    return cudaGetLastError();
}

}  // namespace wgrad_ring
}  // namespace scratchops
