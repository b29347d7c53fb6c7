// wgmma_resident_b.cuh — the wgmma engine's 16-bit mode with the whole packed B resident in
// shared memory (conv_implicit.cu v3).
//
// Where B is one column tile whose 16-bit k-blocks fit in shared memory (P31: 128 output
// channels x K = 576, 147 KB in bf16), each CTA copies it in once, with one bulk copy a
// k-block on one mbarrier, and keeps it. There is then no producer and no ring: kWarpgroups
// consumer warpgroups each walk their own tiles of 64 rows (tiles first, first + step, ...),
// and fall out of step with each other, so that one warpgroup's epilogue (a tile's stores,
// P31's tail and its roundings) runs while another issues wgmmas. In tf32x3.cuh's kernel both
// consumer warpgroups share each tile and its B stages, so they store at the same time and the
// tensor cores wait for both; and every tile streams all of B from L2 again.
// Shared with tf32x3.cuh: the A loads and fragments (ANext, tensor_core_a_fragments.cuh), a
// k-step's wgmmas (kstep_wgmmas), the descriptors and the epilogue interface. The float modes'
// B does not fit (3xTF32: three tiles a k-block; P31's TF32 B alone is 295 KB).
#pragma once

#include <atomic>
#include <cstdint>

#include <cuda_runtime.h>

#include "tf32x3.cuh"

namespace scratchops {
namespace resident_b {

using namespace tc;

constexpr int kTileRows = 64;  // a warpgroup's tile: one 64-row block of A and of the result
// The dynamic shared memory a launch may ask: all a CTA can opt into, less 1 KB for the
// kernel's static shared memory (the mbarrier), which counts against the same limit.
constexpr int kMaxSmemBytes = kSm90SmemOptinBytes - 1024;

// Dynamic shared memory for num_kb k-blocks of B's BN rows: the tiles, from a 1024-byte
// boundary (align_1024).
template <int BN>
constexpr int smem_bytes(int num_kb) {
    return num_kb * BN * 128 + kAlignSlack;
}

// Whether a packed B (16-bit, pack_b<BN, Op>) can stay resident: one column tile, one entry,
// every k-block within shared memory.
template <int BN>
bool fits(const PackedB& layout) {
    return layout.n_tiles == 1 && layout.entries == 1 &&
           static_cast<long long>(layout.num_kb) * BN * 128 + kAlignSlack <= kMaxSmemBytes;
}

template <int BN, int kWarpgroups, class Op, class ALoader, class Epilogue>
__global__ void __launch_bounds__(kWarpgroupThreads* kWarpgroups, 1)
    resident_b_kernel(const ALoader loader, const Epilogue epilogue, const uint8_t* packed_b,
                      const PackedB layout, const TileGrid grid) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    static_assert(Operand<Op>::kNative16, "B resident: the 16-bit products alone");
    constexpr int kTileBytes = BN * 128;  // one k-block of B (pack_b's first tile of a stage)
    extern __shared__ uint8_t smem_raw[];
    __shared__ uint64_t b_ready;
    uint8_t* b_tiles = align_1024(smem_raw);
    const uint32_t b_address = smem_address(b_tiles);
    const int num_kb = layout.num_kb;
    if (threadIdx.x == 0) {
        mbarrier_init(&b_ready, 1);
        fence_barrier_init();
        mbarrier_arrive_expect_tx(&b_ready, static_cast<uint32_t>(num_kb * kTileBytes));
        for (int kb = 0; kb < num_kb; ++kb)
            bulk_copy_to_shared(b_tiles + kb * kTileBytes, packed_b + kb * layout.stage_bytes(),
                                kTileBytes, &b_ready);
    }
    __syncthreads();  // every thread sees the initialised barrier before it waits on it

    const int warpgroup = threadIdx.x / kWarpgroupThreads;
    const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    const TileCoords me{0, 0, 0, 0, warp, lane};  // each warpgroup is alone in its tile
    // This warpgroup's tiles: first, first + step, ... (warpgroups of neighbouring CTAs take
    // neighbouring tiles, so a wave of tiles reads neighbouring input rows).
    const int first = static_cast<int>(blockIdx.x) * kWarpgroups + warpgroup;
    const int step = static_cast<int>(gridDim.x) * kWarpgroups;
    const int total_tiles = grid.batch * grid.m_tiles * grid.n_tiles;
    const int my_tiles = first < total_tiles ? (total_tiles - 1 - first) / step + 1 : 0;
    const typename Epilogue::Prepared prepared = epilogue.prepare(me);

    // The tile's accumulators: each tile's first wgmma overwrites them (accumulate = 0); zeroed
    // once, so that no wgmma ever reads undefined registers.
    float acc[1][BN / 2];
    set_zero(acc);
    uint32_t raw[1][2][8];    // the thread's 16 values of each row for the k-block consumed
    uint32_t frag[2][1][4];   // k-step s's A fragment: buffer s % 2
    tf32x3::ANext<1, kTileRows, ALoader> a_next;
    auto point_next = [&] {
        a_next.advance(loader, grid, me, num_kb, my_tiles * num_kb, first, step);
    };
    point_next();  // iteration 0
    fetch_kblock(loader, a_next.next, raw);
    point_next();  // iteration 1
    mbarrier_wait(&b_ready, 0);

    for (int tile_i = 0; tile_i < my_tiles; ++tile_i) {
        for (int kb = 0; kb < num_kb; ++kb) {
            const uint64_t desc = make_smem_desc_sw128(b_address + kb * kTileBytes);
#pragma unroll
            for (int s = 0; s < 4; ++s) {
                const int buf = s & 1;
                // (The 16-bit fragments are one part: frag[buf] stands for all three.)
                a_fragments<true>(raw, loader, a_next.next, s, frag[buf], frag[buf], frag[buf],
                                  [&](int mb) { pin_registers(frag[buf][mb]); });
                // k-step s starts 32 * s bytes into the tile rows: + 2 * s in 16-byte units.
                tf32x3::kstep_wgmmas<BN, true, Op>(acc, frag[buf], frag[buf], frag[buf],
                                                   desc + 2 * s, desc + 2 * s, desc + 2 * s,
                                                   kb > 0 || s > 0);
                wgmma_wait<1>();  // the previous k-step's wgmma is done: its registers are free
                pin_registers(frag[buf ^ 1][0]);
            }
            point_next();  // integer work while the last wgmma runs
            tf32x3::drain_kblock(frag[1]);  // (see there: the loop's head must not see it run)
        }
        wgmma_wait<0>();
        pin_registers(acc[0]);
        pin_registers(frag[1][0]);
        int b, mt, nt;
        grid.locate(first + tile_i * step, b, mt, nt);
        epilogue.template store<BN, 1>(acc, me.at(b, mt * kTileRows, nt * BN), prepared);
    }
#else
    // Built without sm_90a: the caller (conv_implicit.cu) launches this on the wgmma engine
    // alone; reaching here would be a bug: fail loudly.
    __trap();
#endif
}

// One launch over m_rows rows (after fits<BN>(layout)): a CTA an SM at most, kWarpgroups tiles
// a CTA at a time.
template <int BN, int kWarpgroups, class Op, class ALoader, class Epilogue>
cudaError_t launch(const ALoader& loader, const Epilogue& epilogue, const uint8_t* packed,
                   const PackedB& layout, int m_rows, cudaStream_t stream) {
    auto kernel = resident_b_kernel<BN, kWarpgroups, Op, ALoader, Epilogue>;
    static std::atomic<unsigned long long> smem_set_on;  // devices (common.cuh)
    TileGrid grid;
    int tiles = 0;
    // (The limit set once is the most any launch asks.)
    const cudaError_t err = prepare_launch(smem_set_on, kernel, kMaxSmemBytes, m_rows, kTileRows,
                                           layout, 1, true, grid, tiles);
    if (err != cudaSuccess || tiles == 0) return err;
    const int groups = (tiles + kWarpgroups - 1) / kWarpgroups;
    const int ctas = groups < sm_count() ? groups : sm_count();
    kernel<<<ctas, kWarpgroupThreads * kWarpgroups, smem_bytes<BN>(layout.num_kb), stream>>>(
        loader, epilogue, packed, layout, grid);
    return cudaGetLastError();
}

}  // namespace resident_b
}  // namespace scratchops
