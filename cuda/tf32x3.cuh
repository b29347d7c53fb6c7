// tf32x3.cuh — the engine of the fp32-accurate tensor-core kernels (gemm v5, implicit-GEMM
// convolution): D (M x N) = A (M x K) @ B^T, with B given N x K ("K-major"), on Hopper's
// wgmma (sm_90a), each fp32 product carried by three TF32 products ("3xTF32").
//
// The parts, one idea each:
//   split     x = big + small, both TF32 (hopper.cuh: B to nearest once, in pack_b; A
//             truncated, in the hot loop: split_tf32_truncated). a*b is then
//             a_small*b_big + a_big*b_small + a_big*b_big (the cross terms first, with the
//             "cross" big parts that are 0 for a non-finite value, so Inf and NaN come out as
//             fp32 gives them); the dropped a_small*b_small is ~2^-22 relative.
//   B packed  Once per launch, B is packed as shared memory wants it (tensor_core_operands.cuh);
//             one bulk copy (the copy engine, no thread work) then moves a k-block's B in.
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
// The same product on mma.sync, for GPUs without wgmma (sm_80 to sm_89): mma_sync_3xtf32.cuh,
// which takes the same operands and epilogues.
//
// Layouts, the packed B and the loader and epilogue interfaces: tensor_core_operands.cuh.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "common.cuh"
#include "hopper.cuh"
#include "tensor_core_operands.cuh"
#include "wgmma_tf32.cuh"

namespace scratchops {
namespace tf32x3 {

using namespace tc;  // the operands both engines share

constexpr int kConsumerWarpgroups = 2;
constexpr int kThreads = 128 * (1 + kConsumerWarpgroups);  // warpgroup 0 produces
constexpr int kProducerRegisters = 24;
constexpr int kConsumerRegisters = 240;
static_assert(128 * kProducerRegisters + 128 * kConsumerWarpgroups * kConsumerRegisters <= 65536,
              "the register file holds 64K 32-bit registers");
template <int BN, int MB, int STAGES, bool kTf32 = false>
struct Config {
    static constexpr int kBM = kConsumerWarpgroups * 64 * MB;  // rows of a tile
    static constexpr int kTileBytes = BN * 128;
    // A shared-memory stage: big, small and cross tiles; the TF32 mode's, the big one alone.
    static constexpr int kStageBytes = (kTf32 ? 1 : 3) * kTileBytes;
    static constexpr int kSmemBytes = STAGES * kStageBytes + 1024;  // + alignment slack
    static_assert(kSmemBytes <= 227 * 1024, "stages must fit in shared memory");
};

template <int BN, int MB, int STAGES, int kGroup, bool kTf32, class ALoader, class Epilogue>
__global__ void __launch_bounds__(kThreads, 1)
    tf32x3_kernel(const ALoader loader, const Epilogue epilogue, const uint8_t* packed_b,
                  const PackedB layout, const TileGrid grid) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using Cfg = Config<BN, MB, STAGES, kTf32>;
    using Mma = WgmmaTf32Rs<BN>;
    constexpr int kAcc = BN / 2;

    extern __shared__ uint8_t smem_raw[];
    __shared__ uint64_t full_bar[STAGES], empty_bar[STAGES];
    // Stage tiles start on a 1024-byte boundary (the swizzle pattern repeats every 1024 bytes).
    const uint32_t raw_addr = smem_address(smem_raw);
    uint8_t* stages = smem_raw + (((raw_addr + 1023) & ~1023u) - raw_addr);
    const uint32_t stages_addr = smem_address(stages);

    const int total_tiles = grid.batch * grid.m_tiles * grid.n_tiles;
    const int my_tiles = static_cast<int>(blockIdx.x) < total_tiles
                             ? (total_tiles - 1 - static_cast<int>(blockIdx.x)) / gridDim.x + 1
                             : 0;
    const int num_kb = layout.num_kb;
    const int total_iters = my_tiles * num_kb;

    if (threadIdx.x == 0) {
        for (int i = 0; i < STAGES; ++i) {
            mbarrier_init(&full_bar[i], 1);
            mbarrier_init(&empty_bar[i], 4 * kConsumerWarpgroups);  // one arrival a warp
        }
        fence_barrier_init();
    }
    // B's cross tiles are loaded and used only when some B value is not finite; otherwise
    // the big tiles serve the cross terms too.
    const bool b_cross_tile = b_has_nonfinite(packed_b, layout);
    // (The TF32 mode reads the big tiles alone: B rounded to nearest.)
    const uint32_t copy_bytes = (kTf32 ? 1 : b_cross_tile ? 3 : 2) * Cfg::kTileBytes;

    if (threadIdx.x < 128) {
        // Producer: thread 0 loads iteration jj's B tiles into stage jj % STAGES once the
        // consumers have released that stage's previous use (iteration jj - STAGES).
        setmaxnreg_dec<kProducerRegisters>();
        if (threadIdx.x == 0) {
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
                    stages + stage * Cfg::kStageBytes,
                    packed_b + ((static_cast<long long>(entry) * grid.n_tiles + nt) * num_kb + kb) *
                                   layout.stage_bytes(),
                    copy_bytes, &full_bar[stage]);
            }
        }
        return;
    }
    setmaxnreg_inc<kConsumerRegisters>();

    const int warpgroup = threadIdx.x / 128 - 1;
    const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    const int quad_col = lane % 4;
    const TileCoords me{0, 0, 0, warpgroup, warp, lane};  // this thread's place in a tile

    const typename Epilogue::Prepared prepared =
        epilogue.prepare(me);

    // total: the tile's result so far, summed with fp32 adds. part: one k-block's products,
    // summed by the tensor cores (see "partial sums" at the top). The TF32 mode sums the
    // whole tile on the tensor cores, as cuDNN and cuBLAS do: its wgmmas accumulate straight
    // into the total, and part (unused) takes no registers.
    float total[MB][kAcc], part[MB][kAcc];
    float(&acc)[MB][kAcc] = kTf32 ? total : part;
    const int group = kTf32 ? num_kb : kGroup;  // k-blocks between drains
#pragma unroll
    for (int mb = 0; mb < MB; ++mb)
#pragma unroll
        for (int i = 0; i < kAcc; ++i) total[mb][i] = 0.0f;

    typename ALoader::Row rows[MB][2];  // row states of the tile of the next fetch
    float raw[MB][2][8];  // the thread's 8 values of each row for the k-block being consumed
    typename ALoader::KPtr next[MB][2];  // where the next k-block's values are
    uint32_t a_big[2][MB][4], a_small[2][MB][4], a_cross[2][MB][4];  // k-step s: buffer s % 2

    // next[] for the iterations 0, 1, 2, ... in turn (rows[] first, when one starts a tile).
    int next_tile = 0, next_kb = -1, fetched = 0;
    auto point_next = [&]() {
#pragma unroll
        for (int mb = 0; mb < MB; ++mb)
#pragma unroll
            for (int h = 0; h < 2; ++h) next[mb][h] = loader.none();
        if (fetched++ >= total_iters) return;
        if (++next_kb == num_kb) {
            next_kb = 0;
            ++next_tile;
        }
        if (next_kb == 0) {
            int b, mt, nt;
            grid.locate(blockIdx.x + next_tile * gridDim.x, b, mt, nt);
#pragma unroll
            for (int mb = 0; mb < MB; ++mb)
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    rows[mb][h] = loader.row(b, mt * Cfg::kBM + me.tile_row<MB>(mb, h));
        }
        const typename ALoader::KBlock blk = loader.kblock(next_kb, quad_col);
#pragma unroll
        for (int mb = 0; mb < MB; ++mb)
#pragma unroll
            for (int h = 0; h < 2; ++h) next[mb][h] = loader.kptr(rows[mb][h], blk);
    };

    point_next();  // iteration 0
    fetch_kblock(loader, next, raw);
    point_next();  // iteration 1

    // One k-block (iteration j; fresh: the first of its group): wait for its B stage, its 4
    // k-steps (split A, 3 wgmmas each), then point the A loads two iterations ahead.
    auto run_kblock = [&](int j, bool fresh) {
        const int stage = j % STAGES;
        mbarrier_wait(&full_bar[stage], (j / STAGES) & 1);
        const uint32_t big_addr = stages_addr + stage * Cfg::kStageBytes;
        const uint64_t desc_big0 = make_smem_desc_sw128(big_addr);
        const uint64_t desc_small0 = make_smem_desc_sw128(big_addr + Cfg::kTileBytes);
        const uint64_t desc_cross0 =
            b_cross_tile ? make_smem_desc_sw128(big_addr + 2 * Cfg::kTileBytes) : desc_big0;

#pragma unroll
        for (int s = 0; s < 4; ++s) {
            const int buf = s & 1;
#pragma unroll
            for (int mb = 0; mb < MB; ++mb)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    // a0/a1 (rows g, g + 8): logical column 8s + t = physical 8t + 2s;
                    // a2/a3: logical column 8s + t + 4 = physical 8t + 2s + 1.
                    if (kTf32) {  // one product: A rounded to nearest, as cuDNN rounds it
                        a_big[buf][mb][h] = tf32_nearest(raw[mb][h][2 * s]);
                        a_big[buf][mb][2 + h] = tf32_nearest(raw[mb][h][2 * s + 1]);
                    } else {
                        const Tf32Split lo = split_tf32_truncated(raw[mb][h][2 * s]);
                        const Tf32Split hi = split_tf32_truncated(raw[mb][h][2 * s + 1]);
                        a_big[buf][mb][h] = lo.big;
                        a_small[buf][mb][h] = lo.small;
                        a_cross[buf][mb][h] = lo.cross;
                        a_big[buf][mb][2 + h] = hi.big;
                        a_small[buf][mb][2 + h] = hi.small;
                        a_cross[buf][mb][2 + h] = hi.cross;
                        pin_registers(a_small[buf][mb]);
                        pin_registers(a_cross[buf][mb]);
                    }
                    pin_registers(a_big[buf][mb]);
                    // Refill the two values just consumed with the next k-block's: each load
                    // is in flight for a whole k-block before its value is used.
                    const float2 v = loader.fetch2(next[mb][h], 2 * s);
                    raw[mb][h][2 * s] = v.x;
                    raw[mb][h][2 * s + 1] = v.y;
                }
            // k-step s starts 32 * s bytes into the tile rows: + 2 * s in 16-byte units.
            const uint64_t desc_big = desc_big0 + 2 * s;
            const uint64_t desc_small = desc_small0 + 2 * s;
            const uint64_t desc_cross = desc_cross0 + 2 * s;
#pragma unroll
            for (int mb = 0; mb < MB; ++mb) pin_registers(acc[mb]);
            wgmma_fence();
            // Cross terms first, the big one last; the first k-step of a group starts
            // the partial sum afresh. (TF32 mode: the big product alone.)
            if (!kTf32) {
#pragma unroll
                for (int mb = 0; mb < MB; ++mb)
                    Mma::mma(acc[mb], a_small[buf][mb], desc_cross, s > 0 || !fresh);
#pragma unroll
                for (int mb = 0; mb < MB; ++mb)
                    Mma::mma(acc[mb], a_cross[buf][mb], desc_small, 1);
            }
#pragma unroll
            for (int mb = 0; mb < MB; ++mb)
                Mma::mma(acc[mb], a_big[buf][mb], desc_big, kTf32 ? (s > 0 || !fresh) : 1);
            wgmma_commit();
            wgmma_wait<1>();  // the previous step's wgmmas are done: its registers are free
#pragma unroll
            for (int mb = 0; mb < MB; ++mb) {
                pin_registers(a_big[buf ^ 1][mb]);
                if (!kTf32) {
                    pin_registers(a_small[buf ^ 1][mb]);
                    pin_registers(a_cross[buf ^ 1][mb]);
                }
            }
        }
        point_next();  // integer work while the last wgmmas run
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
                pin_registers(a_big[1][mb]);
                if (!kTf32) {
                    pin_registers(a_small[1][mb]);
                    pin_registers(a_cross[1][mb]);
                }
            }
            if (lane == 0) mbarrier_arrive(&empty_bar[(j - 1) % STAGES]);
            if (!kTf32) {
#pragma unroll
                for (int mb = 0; mb < MB; ++mb)
#pragma unroll
                    for (int i = 0; i < kAcc; ++i) total[mb][i] += part[mb][i];
            }
        }
        // The tile is done: store it, start the next afresh.
        int b, mt, nt;
        grid.locate(blockIdx.x + tile_i * gridDim.x, b, mt, nt);
        epilogue.template store<BN, MB>(
            total, TileCoords{b, mt * Cfg::kBM, nt * BN, warpgroup, warp, lane}, prepared);
        if (!kTf32) {  // (the TF32 mode's first wgmma of a tile overwrites the total)
#pragma unroll
            for (int mb = 0; mb < MB; ++mb)
#pragma unroll
                for (int i = 0; i < kAcc; ++i) total[mb][i] = 0.0f;
        }
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
template <int BN, int MB, int STAGES, int kGroup = 1, bool kTf32 = false, class ALoader,
          class Epilogue>
cudaError_t launch(const ALoader& loader, const Epilogue& epilogue, const uint8_t* packed,
                   const PackedB& layout, int m_rows, int batch, bool b_shared,
                   cudaStream_t stream) {
    using Cfg = Config<BN, MB, STAGES, kTf32>;
    auto kernel = tf32x3_kernel<BN, MB, STAGES, kGroup, kTf32, ALoader, Epilogue>;
    static std::atomic<unsigned long long> smem_set_on;  // devices (common.cuh)
    TileGrid grid;
    int tiles = 0;
    const cudaError_t err = prepare_launch(smem_set_on, kernel, Cfg::kSmemBytes, m_rows, Cfg::kBM,
                                           layout, batch, b_shared, grid, tiles);
    if (err != cudaSuccess || tiles == 0) return err;
    const int ctas = tiles < sm_count() ? tiles : sm_count();
    kernel<<<ctas, kThreads, Cfg::kSmemBytes, stream>>>(loader, epilogue, packed, layout, grid);
    return cudaGetLastError();
}

}  // namespace tf32x3
}  // namespace scratchops
