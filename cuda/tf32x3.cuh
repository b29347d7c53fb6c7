// tf32x3.cuh — the engine of the fp32-accurate tensor-core kernels (gemm v8, v9, implicit-GEMM
// convolution): D (M x N) = A (M x K) @ B^T, with B given N x K ("K-major"), on Hopper's
// wgmma (sm_90a), each fp32 product carried by three TF32 products ("3xTF32").
//
// The parts, one idea each:
//   split     x = big + small, both TF32 (tf32_split.cuh: B to nearest once, in pack_b; A
//             truncated, in the hot loop: split_tf32_truncated). a*b is then
//             a_small*b_big + a_big*b_small + a_big*b_big (the cross terms first, with the
//             "cross" big parts that are 0 for a non-finite value, so Inf and NaN come out as
//             fp32 gives them); the dropped a_small*b_small is ~2^-22 relative.
//   B packed  Once per launch, B is packed as shared memory wants it (pack_b.cuh):
//             by pack_b's kernel before the launch, or by the kernel's own grid as its first
//             act (pack_b_in_grid: every CTA packs a share, the grid meets at a barrier; one
//             launch instead of two); one bulk copy (the copy engine, no thread work) then
//             moves a k-block's B in.
//   A gathered Each consumer thread loads its own rows of A straight from global memory into
//             registers (a row-major matrix, or an NCHW input read as its im2col rows: no
//             column matrix ever exists), one k-block ahead, splits them there, and feeds
//             them to wgmma as its register operand. Nothing of A touches shared memory, which
//             keeps shared-memory traffic to B's reads (64 bytes a cycle at full rate) and the
//             copy engine's writes.
//   partial sums The tensor cores accumulate with truncation; summed over a long K (4096) its
//             bias grew to 8x cuBLAS SGEMM's error. So the 12 products of each k-block (or of
//             each group of kGroup k-blocks) go to a fresh partial sum, added to the running
//             total with an ordinary fp32 add (round to nearest) once the group is done.
//   roles     One producer warpgroup (a single thread issues the bulk copies into a ring of
//             STAGES stages, guarded by full/empty mbarriers) and two consumer warpgroups of 64
//             x MB rows each; setmaxnreg moves registers from the producer to the consumers.
//   persistent One CTA per SM walks tiles blockIdx.x, + gridDim.x, ...; its k-blocks form one
//             sequence, so loads for the next tile overlap the current one.
//   TF32 mode (kTf32: torch allows TF32 and the operator's rule says so) One product instead
//             of three: A rounded to nearest in the hot loop (tf32_nearest), B's big tile
//             alone copied and multiplied, the whole tile summed in the tensor cores (no
//             partial sums). What cuDNN and cuBLAS compute then.
//   16-bit mode (Op = __half or __nv_bfloat16: Operand<Op>::kNative16, with kTf32) The half
//             types multiplied natively, at twice the TF32 rate: a k-block is 64 values, B's
//             tile holds them as they are (pack_b<BN, Op>), a thread loads its 16 values of a
//             row as 8 pairs of bits, and each k-step is one m64nNk16 wgmma
//             (wgmma_half.cuh) with fp32 accumulation; the rest as in the TF32 mode.
// The same product on mma.sync, for GPUs without wgmma (sm_80 to sm_89): mma_sync_3xtf32.cuh,
// which takes the same operands and epilogues.
//
// Layouts, the packed B and the loader and epilogue interfaces: tensor_core_operands.cuh; A's
// fragments: tensor_core_a_fragments.cuh.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_runtime.h>

#include "common.cuh"
#include "hopper.cuh"
#include "tensor_core_a_fragments.cuh"
#include "pack_b.cuh"
#include "wgmma_half.cuh"
#include "wgmma_tf32.cuh"

namespace scratchops {
namespace tf32x3 {

using namespace tc;  // the operands both engines share

constexpr int kConsumerWarpgroups = 2;
constexpr int kThreads = kWarpgroupThreads * (1 + kConsumerWarpgroups);  // warpgroup 0 produces
static_assert(kThreads >= kPackThreads, "pack_b_in_grid's flag slots: see pack_b.cuh");
// setmaxnreg moves registers between warpgroups only within those the launch gave the CTA:
// kThreads threads at most 64K / kThreads registers each, in steps of 8 (168 here). A split
// that asks for more than that total does not fail: its setmaxnreg.inc waits for ever (a
// hang found the hard way, docs/notes.md), so the bound is checked here, not the whole 64K.
constexpr int kLaunchRegisters = 65536 / kThreads / 8 * 8;
constexpr bool register_split_fits(int producer, int consumer) {
    return kWarpgroupThreads * (producer + kConsumerWarpgroups * consumer) <=
           kLaunchRegisters * kThreads;
}
constexpr int kProducerRegisters = 24;
constexpr int kConsumerRegisters = 240;
static_assert(register_split_fits(kProducerRegisters, kConsumerRegisters),
              "the split fits in the launch's registers");
template <int BN, int MB, int STAGES, bool kTf32 = false>
struct Config : BStage<BN, kTf32> {
    static constexpr int kBM = kConsumerWarpgroups * 64 * MB;  // rows of a tile
    static constexpr int kSmemBytes = BStage<BN, kTf32>::ring_bytes(STAGES);
    static_assert(kSmemBytes <= kSm90SmemOptinBytes, "stages must fit in shared memory");
};

// The tiles this CTA takes: blockIdx.x, + gridDim.x, ... (persistent).
__device__ __forceinline__ int ctas_tiles(const TileGrid& grid) {
    const int total_tiles = grid.batch * grid.m_tiles * grid.n_tiles;
    const int cta = static_cast<int>(blockIdx.x);
    return cta < total_tiles ? (total_tiles - 1 - cta) / gridDim.x + 1 : 0;  // (unsigned /)
}

// The ring's mbarriers: a stage is full once the producer's copy lands (one arrival and its
// bytes), empty once every consumer warp has released it (one arrival a warp).
template <int STAGES>
__device__ __forceinline__ void init_stage_barriers(uint64_t (&full_bar)[STAGES],
                                                    uint64_t (&empty_bar)[STAGES]) {
    for (int i = 0; i < STAGES; ++i) {
        mbarrier_init(&full_bar[i], 1);
        mbarrier_init(&empty_bar[i], 4 * kConsumerWarpgroups);
    }
    fence_barrier_init();
}

// wgmma's descriptors of a stage's big, small and cross tiles of B (the big tile serves the
// cross terms where B is finite: see b_has_nonfinite).
template <int kTileBytes>
struct StageDescriptors {
    uint64_t big, small, cross;
    __device__ __forceinline__ StageDescriptors(uint32_t stage_addr, bool b_cross_tile)
        : big(make_smem_desc_sw128(stage_addr)),
          small(make_smem_desc_sw128(stage_addr + kTileBytes)),
          cross(b_cross_tile ? make_smem_desc_sw128(stage_addr + 2 * kTileBytes) : big) {}
};

// An A fragment's registers held where they are (see pin_registers): the big part, and in
// 3xTF32 the small and cross parts.
template <bool kTf32>
__device__ __forceinline__ void pin_a(uint32_t (&big)[4], uint32_t (&small)[4],
                                      uint32_t (&cross)[4]) {
    if (!kTf32) {
        pin_registers(small);
        pin_registers(cross);
    }
    pin_registers(big);
}

// The producer warpgroup's thread 0: iteration jj's B tiles (the CTA's tiles' k-blocks in
// order) copied into stage jj % STAGES, once the consumers have released that stage's
// previous use (iteration jj - STAGES).
template <int kStageBytes, int STAGES>
__device__ __forceinline__ void produce_b_stages(uint8_t* stages, uint64_t (&full_bar)[STAGES],
                                                 uint64_t (&empty_bar)[STAGES],
                                                 const uint8_t* packed_b, const PackedB& layout,
                                                 const TileGrid& grid, int total_iters,
                                                 uint32_t copy_bytes) {
    const int num_kb = layout.num_kb;
    int kb = -1, tile_i = 0;
    for (int jj = 0; jj < total_iters; ++jj) {
        if (++kb == num_kb) {
            kb = 0;
            ++tile_i;
        }
        int b, mt, nt;
        grid.locate(blockIdx.x + tile_i * gridDim.x, b, mt, nt);
        const int entry = grid.b_shared ? 0 : b;
        const int stage = jj % STAGES;
        if (jj >= STAGES) mbarrier_wait(&empty_bar[stage], ((jj / STAGES) - 1) & 1);
        mbarrier_arrive_expect_tx(&full_bar[stage], copy_bytes);
        bulk_copy_to_shared(
            stages + stage * kStageBytes,
            packed_b + ((static_cast<long long>(entry) * grid.n_tiles + nt) * num_kb + kb) *
                           layout.stage_bytes(),
            copy_bytes, &full_bar[stage]);
    }
}

// One k-step's wgmmas for the MB row blocks, committed as one group: the cross terms first,
// the big product last (the TF32 and 16-bit modes: the big product alone); accumulate = 0
// starts the sum afresh (the first k-step of a group).
template <int BN, bool kTf32, class Op = float, int MB>
__device__ __forceinline__ void kstep_wgmmas(float (&acc)[MB][BN / 2], uint32_t (&a_big)[MB][4],
                                             uint32_t (&a_small)[MB][4],
                                             uint32_t (&a_cross)[MB][4], uint64_t desc_big,
                                             uint64_t desc_small, uint64_t desc_cross,
                                             int accumulate) {
    using Mma = std::conditional_t<Operand<Op>::kNative16, WgmmaHalfRs<BN, Op>, WgmmaTf32Rs<BN>>;
#pragma unroll
    for (int mb = 0; mb < MB; ++mb) pin_registers(acc[mb]);
    wgmma_fence();
    if (!kTf32) {
#pragma unroll
        for (int mb = 0; mb < MB; ++mb) Mma::mma(acc[mb], a_small[mb], desc_cross, accumulate);
#pragma unroll
        for (int mb = 0; mb < MB; ++mb) Mma::mma(acc[mb], a_cross[mb], desc_small, 1);
    }
#pragma unroll
    for (int mb = 0; mb < MB; ++mb) Mma::mma(acc[mb], a_big[mb], desc_big, kTf32 ? accumulate : 1);
    wgmma_commit();
}

// The end of a k-block in the 16-bit mode: its last wgmma waited for, its A registers pinned
// to this side of the wait. Otherwise that wgmma is still running when the loop comes round,
// and ptxas moves the next k-block's copies of loaded pairs into its A registers above the
// wait that retires it (seen in the SASS: a MOV into an in-flight HGMMA's register at the
// loop's head, with no warning; the results had NaNs in a few rows of one run in ten).
// tests/test_sass.py checks every wgmma kernel's SASS for such writes.
template <int MB>
__device__ __forceinline__ void drain_kblock(uint32_t (&last)[MB][4]) {
    wgmma_wait<0>();
#pragma unroll
    for (int mb = 0; mb < MB; ++mb) pin_registers(last[mb]);
}

// Where a consumer thread's A loads go next: the k-blocks of its tiles first, first + step,
// first + 2 step, ... in turn (iterations 0, 1, 2, ...; here a CTA's: blockIdx.x, +
// gridDim.x), each tile's rows looked up when its first k-block comes; past the last
// iteration, nowhere (loader.none()).
template <int MB, int kBM, class ALoader>
struct ANext {
    typename ALoader::Row rows[MB][2];   // row states of the tile of the next fetch
    typename ALoader::KPtr next[MB][2];  // where the next k-block's values are
    int tile = 0, kb = -1, pointed = 0;
    __device__ __forceinline__ void advance(const ALoader& loader, const TileGrid& grid,
                                            const TileCoords& me, int num_kb, int total_iters,
                                            int first, int step) {
#pragma unroll
        for (int mb = 0; mb < MB; ++mb)
#pragma unroll
            for (int h = 0; h < 2; ++h) next[mb][h] = loader.none();
        if (pointed++ >= total_iters) return;
        if (++kb == num_kb) {
            kb = 0;
            ++tile;
        }
        if (kb == 0) {
            int b, mt, nt;
            grid.locate(first + tile * step, b, mt, nt);
#pragma unroll
            for (int mb = 0; mb < MB; ++mb)
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    rows[mb][h] = loader.row(b, mt * kBM + me.tile_row<MB>(mb, h));
        }
        const typename ALoader::KBlock blk = loader.kblock(kb, me.lane % 4);
#pragma unroll
        for (int mb = 0; mb < MB; ++mb)
#pragma unroll
            for (int h = 0; h < 2; ++h) next[mb][h] = loader.kptr(rows[mb][h], blk);
    }
};

// pack_inside: the grid packs B from b_source into packed_b first (pack_b_in_grid; the launch
// is then cooperative). Otherwise packed_b holds B packed already.
template <int BN, int MB, int STAGES, int kGroup, bool kTf32, class Op, class ALoader,
          class Epilogue, class BSource>
__global__ void __launch_bounds__(kThreads, 1)
    tf32x3_kernel(const ALoader loader, const Epilogue epilogue, const uint8_t* packed_b,
                  const PackedB layout, const TileGrid grid, const BSource b_source,
                  const bool pack_inside) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using Cfg = Config<BN, MB, STAGES, kTf32>;
    constexpr int kAcc = BN / 2;
    static_assert(kTf32 || !Operand<Op>::kNative16, "the 16-bit products are single products");
    pack_b_if_told<BN, Op, false>(b_source, pack_inside, packed_b, layout);

    extern __shared__ uint8_t smem_raw[];
    __shared__ uint64_t full_bar[STAGES], empty_bar[STAGES];
    uint8_t* stages = align_1024(smem_raw);
    const uint32_t stages_addr = smem_address(stages);

    const int my_tiles = ctas_tiles(grid);
    const int num_kb = layout.num_kb;
    const int total_iters = my_tiles * num_kb;
    if (threadIdx.x == 0) init_stage_barriers(full_bar, empty_bar);
    const bool b_cross_tile = b_has_nonfinite(packed_b, layout);
    const uint32_t copy_bytes = stage_copy_bytes<kTf32>(b_cross_tile, Cfg::kTileBytes);

    if (threadIdx.x < kWarpgroupThreads) {  // the producer warpgroup
        setmaxnreg_dec<kProducerRegisters>();
        if (threadIdx.x == 0)
            produce_b_stages<Cfg::kStageBytes>(stages, full_bar, empty_bar, packed_b, layout,
                                               grid, total_iters, copy_bytes);
        return;
    }
    setmaxnreg_inc<kConsumerRegisters>();

    const int warpgroup = threadIdx.x / kWarpgroupThreads - 1;
    const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    const TileCoords me{0, 0, 0, warpgroup, warp, lane};  // this thread's place in a tile

    const typename Epilogue::Prepared prepared = epilogue.prepare(me);

    // total: the tile's result so far, summed with fp32 adds. part: one k-block's products,
    // summed by the tensor cores (see "partial sums" at the top). The TF32 mode sums the
    // whole tile on the tensor cores, as cuDNN and cuBLAS do: its wgmmas accumulate straight
    // into the total, and part (unused) takes no registers.
    float total[MB][kAcc], part[MB][kAcc];
    float(&acc)[MB][kAcc] = kTf32 ? total : part;
    const int group = kTf32 ? num_kb : kGroup;  // k-blocks between drains
    set_zero(total);

    // The thread's values of each row for the k-block being consumed: 8 floats, or 16 halves
    // in 8 pairs (16-bit mode).
    std::conditional_t<Operand<Op>::kNative16, uint32_t, float> raw[MB][2][8];
    uint32_t a_big[2][MB][4], a_small[2][MB][4], a_cross[2][MB][4];  // k-step s: buffer s % 2
    ANext<MB, Cfg::kBM, ALoader> a_next;  // where the next k-block's values are
    auto point_next = [&] {
        a_next.advance(loader, grid, me, num_kb, total_iters, blockIdx.x, gridDim.x);
    };

    point_next();  // iteration 0
    fetch_kblock(loader, a_next.next, raw);
    point_next();  // iteration 1

    // One k-block (iteration j; fresh: the first of its group): wait for its B stage, its 4
    // k-steps (split A, 3 wgmmas each), then point the A loads two iterations ahead.
    auto run_kblock = [&](int j, bool fresh) {
        const int stage = j % STAGES;
        mbarrier_wait(&full_bar[stage], (j / STAGES) & 1);
        const StageDescriptors<Cfg::kTileBytes> desc(stages_addr + stage * Cfg::kStageBytes,
                                                     b_cross_tile);

#pragma unroll
        for (int s = 0; s < 4; ++s) {
            const int buf = s & 1;
            tc::a_fragments<kTf32>(raw, loader, a_next.next, s, a_big[buf], a_small[buf],
                                   a_cross[buf], [&](int mb) {
                                       pin_a<kTf32>(a_big[buf][mb], a_small[buf][mb],
                                                    a_cross[buf][mb]);
                                   });
            // k-step s starts 32 * s bytes into the tile rows: + 2 * s in 16-byte units.
            kstep_wgmmas<BN, kTf32, Op>(acc, a_big[buf], a_small[buf], a_cross[buf],
                                    desc.big + 2 * s, desc.small + 2 * s, desc.cross + 2 * s,
                                    s > 0 || !fresh);
            wgmma_wait<1>();  // the previous step's wgmmas are done: its registers are free
#pragma unroll
            for (int mb = 0; mb < MB; ++mb)
                pin_a<kTf32>(a_big[buf ^ 1][mb], a_small[buf ^ 1][mb], a_cross[buf ^ 1][mb]);
        }
        point_next();  // integer work while the last wgmmas run
        if constexpr (Operand<Op>::kNative16) drain_kblock(a_big[1]);
    };

    // Per tile, its k-blocks in groups of `group`: within a group the wgmmas run on from one
    // k-block into the next (a k-block's first wgmma_wait<1> sees the previous k-block's
    // last wgmmas done, and that stage goes back to the producer); a group ends with one
    // drain, after which its partial sum joins the total with fp32 adds (the TF32 mode: one
    // group a tile, summed in the total already).
    int j = 0;
    for (int tile_i = 0; tile_i < my_tiles; ++tile_i) {
        for (int kb0 = 0; kb0 < num_kb; kb0 += group) {
            const int kb_end = kb0 + group < num_kb ? kb0 + group : num_kb;
            for (int kb = kb0; kb < kb_end; ++kb, ++j) {
                run_kblock(j, kb == kb0);
                if (kb > kb0 && lane == 0) mbarrier_arrive(&empty_bar[(j - 1) % STAGES]);
            }
            wgmma_wait<0>();
#pragma unroll
            for (int mb = 0; mb < MB; ++mb) {
                pin_registers(acc[mb]);
                pin_a<kTf32>(a_big[1][mb], a_small[1][mb], a_cross[1][mb]);
            }
            if (lane == 0) mbarrier_arrive(&empty_bar[(j - 1) % STAGES]);
            if (!kTf32) add_to(total, part);
        }
        // The tile is done: store it, start the next afresh.
        int b, mt, nt;
        grid.locate(blockIdx.x + tile_i * gridDim.x, b, mt, nt);
        epilogue.template store<BN, MB>(total, me.at(b, mt * Cfg::kBM, nt * BN), prepared);
        if (!kTf32) set_zero(total);  // (the TF32 mode's first wgmma overwrites it)
    }
#else
    // Built without sm_90a (wgmma, setmaxnreg). The Python layer builds sm_90 GPUs with
    // sm_90a and refuses these kernels on others; reaching here would be a bug: fail loudly.
    __trap();
#endif
}

// kGroup: the k-blocks whose products the tensor cores sum into one partial sum before an
// fp32 add joins it to the total (see "partial sums" at the top): 1 drains the wgmma
// pipeline at every k-block; more drain less often, each partial sum then holding 12 kGroup
// truncating accumulations. kTf32: one TF32 product per fp32 product (A and B rounded to
// nearest) instead of three: what torch's convolutions and matmuls compute when TF32 is
// allowed, a third of the tensor-core work.
// persistent = false: one CTA a tile instead of one a multiprocessor (gemm v8: the kernel as
// it is without persistence; its tile loop then runs once). Op: the operand type multiplied
// (Operand: float, or a 16-bit type natively, with kTf32, a loader giving fetch_pair and B
// packed by pack_b<BN, Op>). b_source: where b_source.present(), the launch packs B from it
// into `packed` (a workspace of layout.bytes()) itself: inside the kernel, a cooperative
// launch, on a persistent grid; where the GPU cannot hold that grid at once, or without
// persistence, with pack_b's kernel first.
template <int BN, int MB, int STAGES, int kGroup = 1, bool kTf32 = false, class Op = float,
          class ALoader, class Epilogue, class BSource = PackedAlready>
cudaError_t launch(const ALoader& loader, const Epilogue& epilogue, const uint8_t* packed,
                   const PackedB& layout, int m_rows, int batch, bool b_shared,
                   cudaStream_t stream, bool persistent = true,
                   const BSource& b_source = BSource{}) {
    using Cfg = Config<BN, MB, STAGES, kTf32>;
    auto kernel = tf32x3_kernel<BN, MB, STAGES, kGroup, kTf32, Op, ALoader, Epilogue, BSource>;
    static std::atomic<unsigned long long> smem_set_on;  // devices (common.cuh)
    TileGrid grid;
    int tiles = 0;
    cudaError_t err = prepare_launch(smem_set_on, kernel, Cfg::kSmemBytes, m_rows, Cfg::kBM,
                                     layout, batch, b_shared, grid, tiles);
    if (err != cudaSuccess || tiles == 0) return err;
    const int ctas = persistent && sm_count() < tiles ? sm_count() : tiles;
    return launch_packing_b<BN, Op, false>(
        b_source, packed, layout, ctas, persistent, stream, [&](bool pack_inside, int grid_ctas) {
            return launch_cooperative(pack_inside, kernel, grid_ctas, kThreads, Cfg::kSmemBytes,
                                      stream, loader, epilogue, packed, layout, grid, b_source,
                                      pack_inside);
        });
}

}  // namespace tf32x3
}  // namespace scratchops
