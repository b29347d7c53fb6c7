// conv_weight_grad_staged.cuh — the weight gradient v3 (conv_backward.cu's list): both
// operands staged in shared memory by the copy engine from channels-last copies of x and dy,
// in 16 bits on wgmma (sm_90a), stride 1. Included by conv_backward_tensor_cores.cuh.
//
// Why. v2 (conv_weight_grad_implicit.cuh) gathers x into registers a tap at a time and packs
// dy in a pass of its own: P31 in bf16 spent 1.64 ms in its GEMM and 0.59 in the packing, where
// cuDNN's weight gradient takes 0.41 (docs/notes.md). The reduction runs over output pixels,
// and in 16 bits wgmma reads either operand MN-major (imm-trans): with x and dy channels-last,
// one pixel's 64 channels are one 128-byte row, so 64 pixels of an output row are a k-block of
// either operand as they stand, one box of the 4-D tensor each (tma.cuh). Nothing is gathered
// by the threads and nothing is packed.
//
// The product. With stride 1,
//   dW[co][c][r][s] = sum over output pixels (n, oh, ow) of
//                     dy[n][co][oh][ow] * x[n][c][oh + r dil_h - pad_h][ow + s dil_w - pad_w].
// A column tile is a kernel row r, a block cb of 64 input channels and a tile ct of 128 output
// channels; for each tap s < kernel_w (kTaps = kernel_w <= 3) it sums
//   D_s (64 c x 128 co) += A_s (c x pixels) B (pixels x co)
// with A_s MN-major (row k: pixel k's 64 channels of x at tap s) and B MN-major (row k: pixel
// k's output channels of dy, two 64-channel boxes kDyBoxBytes apart). A k-block is 64 output
// pixels (n, oh, ow0 + i), i < 64, ow0 a multiple of 64. dy's boxes {64 co, 64 pixels} sit at
// (ct 128 + h 64, ow0, oh, n), h = 0, 1; x's box {64 c, 64 + (kernel_w - 1) dil_w pixels} at
// (cb 64, ow0 - pad_w, oh + r dil_h - pad_h, n) serves every tap, tap s's A starting s dil_w
// rows in (the swizzle is a function of the address: conv_implicit_staged_a.cuh's
// a_descriptor). Pixels past OW read as zeros in dy, taps in the padding as zeros in x, and
// channels past C or Cout as zeros in both: the copy engine's bounds.
//
// The slots past OW. A row's last k-block is partial where OW is not a multiple of 64, and its
// slots past OW multiply dy's zeros by x's columns there, which are real columns for a tap s
// of a smaller shift (col = ow + s dil_w - pad_w). Zero times a finite value is zero, but
// zero times Inf or NaN is NaN, where torch's gradient has no such product. So a pass before
// the product (edge_flags_kernel) asks whether x has a non-finite value in the columns some
// tap reads as a slot past OW (col >= OW - pad_w); where it has, each partial k-block is split
// into kernel_w stages, one a tap, whose x box comes from that tap's own tensor map, cut at the
// last column a real slot of the tap reads (OW + s dil_w - pad_w), so its slots past OW read
// zeros. Finite data, the common case, keeps one box a k-block.
//
// The order of the sums (deterministic, no atomics), as v2's: the chunk's output rows n OH + oh
// are cut into slices of rows_per_slice rows (slice_slots slots), each summed by the tensor
// cores from zero and stored as its own entry of the partials (K x Cout floats, dWᵀ's shape);
// a unit of work is a slice of a column tile, which writes that tile's rows of the slice's
// entry. batch_sum then adds the entries in slice order. The consumers take units u = q,
// q + consumers, ... (u: column tile u % column_tiles of slice u / column_tiles, so that
// neighbouring consumers read the same rows of dy); which consumer takes a unit changes no
// bit. (A running sum a consumer, read, added to and written back after each slice, took
// 0.81 ms of P31's bf16 weight gradient where these stores take 0.43: each read waited a
// round trip to L2 while the tensor cores ran the other consumer's products alone;
// docs/notes.md.)
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_runtime.h>

#include "conv_implicit_staged_a.cuh"
#include "wgmma_half.cuh"

namespace scratchops {
namespace wgrad_staged {

using staged_a::kConsumers;  // consumer warpgroups a CTA, each with its own ring
using staged_a::kConsumerRegisters;
using staged_a::kHaloRows;
using staged_a::kProducerRegisters;
using staged_a::kRowBytes;  // one pixel's 64 channels of a box
using staged_a::kThreads;

constexpr int kPixels = 64;        // output pixels a k-block
constexpr int kChannelBlock = 64;  // input channels a column tile: wgmma's M
constexpr int kOutTile = 128;      // output channels a column tile: wgmma's N
constexpr int kMaxTaps = 3;        // taps of a kernel row a column tile sums (kernel_w)
constexpr int kXBytes = (kPixels + kHaloRows) * kRowBytes;  // x's box, room for its later taps
constexpr int kDyBoxBytes = kPixels * kRowBytes;             // dy's box of 64 output channels
constexpr int kStageBytes = kXBytes + 2 * kDyBoxBytes;
constexpr int kStages = 4;  // a consumer's ring
constexpr int kSmemBytes = kConsumers * kStages * kStageBytes + tc::kAlignSlack;
static_assert(kXBytes % 1024 == 0 && kDyBoxBytes % 1024 == 0,
              "every box starts on the swizzle's 1024-byte period");
static_assert(kSmemBytes <= staged_a::kMaxSmemBytes, "the rings must fit in shared memory");
// Blocks of edge_flags_kernel, each writing its own flag (no flag to clear first); the product
// kernel's threads read one each.
constexpr int kEdgeFlagBlocks = 128, kEdgeFlagThreads = 256;
static_assert(kEdgeFlagBlocks <= kThreads, "a thread a flag");

template <int S>
using Tap = std::integral_constant<int, S>;  // a tap known when compiling

// The walk over units, their slices' k-blocks and each k-block's pixels (host-filled).
struct Walk {
    Conv2dGeometry g;
    int out_channels;
    int segs;                          // k-blocks an output row, OW / 64 rounded up
    int rows, rows_per_slice, slices;  // the chunk's output rows (images x OH), a slice's rows
    int units, column_tiles, cblocks, co_tiles;  // units: slices x column tiles
    int x_box_bytes;
    bool last_partial;  // a row's last k-block has slots past OW (OW not a multiple of 64)
    // Whether k-block kb (first column ow0) runs a stage a tap: x has a non-finite value that
    // its slots past OW would multiply (edge_nonfinite: the flags of edge_flags_kernel).
    __device__ int stages_of(int ow0, bool edge_nonfinite) const {
        return edge_nonfinite && ow0 + kPixels > g.out_w ? g.kernel_w : 1;
    }
    // Unit u's slice sl and column tile (kernel row r, channel block cb, output tile ct).
    __device__ void unit(int u, int& sl, int& r, int& cb, int& ct) const {
        const int t = u % column_tiles;
        sl = u / column_tiles;
        ct = t % co_tiles;
        const int rest = t / co_tiles;
        cb = rest % cblocks;
        r = rest / cblocks;
    }
    // Slice sl's k-blocks: [first, end), k-block kb = row * segs + ow0 / 64.
    __device__ void slice(int sl, int& first, int& end) const {
        const int last_row = (sl + 1) * rows_per_slice;
        first = sl * rows_per_slice * segs;
        end = (last_row < rows ? last_row : rows) * segs;
    }
    // K-block kb: image n, output row oh, its first output column ow0.
    __device__ void kblock(int kb, int& n, int& oh, int& ow0) const {
        const int row = kb / segs;
        ow0 = (kb - row * segs) * kPixels;
        n = row / g.out_h;
        oh = row - n * g.out_h;
    }
};

// The kernel's parameters, a __grid_constant__ parameter (the tensor maps must live in the
// parameter space).
struct Params {
    CUtensorMap x_map, dy_map;  // the channels-last copies (C, W, H, N) and (Cout, OW, OH, N)
    // x's copy as tap s reads it in a split k-block: columns past OW + s dil_w - pad_w cut off.
    CUtensorMap x_tap_map[kMaxTaps];
    const int* edge_flags;      // kEdgeFlagBlocks flags of edge_flags_kernel (last_partial)
    float* partials;            // slices x K x Cout floats, K = C kh kw, row (c kh + r) kw + s
    Walk walk;
};

struct Barriers {
    uint64_t full[kConsumers][kStages], empty[kConsumers][kStages];
    __device__ void init() {
        for (int c = 0; c < kConsumers; ++c)
            for (int i = 0; i < kStages; ++i) {
                mbarrier_init(&full[c][i], 1);
                mbarrier_init(&empty[c][i], 4);  // each warp of the consumer releases it
            }
        fence_barrier_init();
    }
};

// Lane 0 of the producer's warp c fills consumer c's ring (consumer q's units' k-blocks, in
// the order the consumer multiplies them): x's box and dy's two, each stage once the consumer
// has released its previous use.
__device__ inline void fill_ring(const Params& params, uint8_t* ring, Barriers& bars, int c,
                                 int q, int consumers, bool edge_nonfinite) {
    const Walk& w = params.walk;
    int j = 0;
    for (int u = q; u < w.units; u += consumers) {
        int sl, r, cb, ct;
        w.unit(u, sl, r, cb, ct);
        int first, end;
        w.slice(sl, first, end);
        for (int kb = first; kb < end; ++kb) {
            int n, oh, ow0;
            w.kblock(kb, n, oh, ow0);
            const int stages = w.stages_of(ow0, edge_nonfinite);
            for (int t = 0; t < stages; ++t, ++j) {  // (stage t of a split k-block: tap t)
                const int stage = j % kStages;
                if (j >= kStages) mbarrier_wait(&bars.empty[c][stage], ((j / kStages) - 1) & 1);
                uint64_t* full = &bars.full[c][stage];
                uint8_t* at = ring + stage * kStageBytes;
                const int ih = oh + r * w.g.dil_h - w.g.pad_h;
                if (stages == 1) {
                    mbarrier_arrive_expect_tx(full, w.x_box_bytes + 2 * kDyBoxBytes);
                    tma_load_4d(at, &params.x_map, cb * kChannelBlock, ow0 - w.g.pad_w, ih, n,
                                full);
                } else {
                    mbarrier_arrive_expect_tx(full, kPixels * kRowBytes + 2 * kDyBoxBytes);
                    tma_load_4d(at, &params.x_tap_map[t], cb * kChannelBlock,
                                ow0 + t * w.g.dil_w - w.g.pad_w, ih, n, full);
                }
                for (int h = 0; h < 2; ++h)
                    tma_load_4d(at + kXBytes + h * kDyBoxBytes, &params.dy_map,
                                ct * kOutTile + h * kChannelBlock, ow0, oh, n, full);
            }
        }
    }
}

// A unit's sums stored as its column tile's rows of entry sl. Accumulator acc[s][4 nb + 2 h + e]
// is D_s's row warp 16 + lane / 4 + 8 h (input channel cb 64 + that), column 8 nb + 2 (lane % 4)
// + e (output channel ct 128 + that): tensor_core_operands.cuh's layout. Cout is a multiple of
// 8, so a pair is whole.
template <int kTaps>
__device__ void store_sums(const float (&acc)[kTaps][kOutTile / 2], const Params& params, int sl,
                           int r, int cb, int ct, int warp, int lane) {
    const Walk& w = params.walk;
    const long long taps = static_cast<long long>(w.g.channels) * w.g.kernel_h * w.g.kernel_w;
    float* entry = params.partials + sl * taps * w.out_channels;
#pragma unroll
    for (int s = 0; s < kTaps; ++s)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int c = cb * kChannelBlock + warp * 16 + lane / 4 + 8 * h;
            if (c >= w.g.channels) continue;
            float* row = entry + ((c * w.g.kernel_h + r) * w.g.kernel_w + s) *
                                     static_cast<long long>(w.out_channels);
#pragma unroll
            for (int nb = 0; nb < kOutTile / 8; ++nb) {
                const int col = ct * kOutTile + 8 * nb + 2 * (lane % 4);
                if (col < w.out_channels)
                    *reinterpret_cast<float2*>(row + col) =
                        make_float2(acc[s][4 * nb + 2 * h], acc[s][4 * nb + 2 * h + 1]);
            }
        }
}

template <int kTaps, class T>
__global__ void __launch_bounds__(kThreads, 1)
    staged_wgrad_kernel(const __grid_constant__ Params params) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ uint8_t smem_raw[];
    __shared__ Barriers bars;
    uint8_t* rings = tc::align_1024(smem_raw);
    const Walk& w = params.walk;
    const int role = static_cast<int>(threadIdx.x) / kWarpgroupThreads;  // 0: the producer
    if (threadIdx.x == 0) bars.init();
    const bool edge_nonfinite = __syncthreads_or(
        w.last_partial && threadIdx.x < kEdgeFlagBlocks && params.edge_flags[threadIdx.x] != 0);

    if (role == 0) {
        setmaxnreg_dec<kProducerRegisters>();
        const int c = static_cast<int>(threadIdx.x) / 32;
        const int q = static_cast<int>(blockIdx.x) * kConsumers + c;
        if (c >= kConsumers || threadIdx.x % 32 != 0) return;
        fill_ring(params, rings + c * kStages * kStageBytes, bars, c, q,
                  static_cast<int>(gridDim.x) * kConsumers, edge_nonfinite);
        return;
    }

    setmaxnreg_inc<kConsumerRegisters>();
    const int c = role - 1;
    const int q = static_cast<int>(blockIdx.x) * kConsumers + c;
    const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    const uint32_t ring = smem_address(rings) + c * kStages * kStageBytes;
    float acc[kTaps][kOutTile / 2];
    tc::set_zero(acc);  // (a slice's first wgmma overwrites it; zeroed so none reads garbage)
    int j = 0, prev = -1;  // prev: the stage of the k-block before, released once it is done
    for (int u = q; u < w.units; u += static_cast<int>(gridDim.x) * kConsumers) {
        int sl, r, cb, ct;
        w.unit(u, sl, r, cb, ct);
        int first, end;
        w.slice(sl, first, end);
        // One stage's wgmmas: taps [s0, s1), tap s's x rows `shift` s further; k-step i:
        // pixels 16 i .. 16 i + 15 of the k-block, 16 rows (2048 bytes) in.
        auto multiply = [&](auto s0, auto s1, int shift, bool accumulate) {
            const int stage = j % kStages;
            mbarrier_wait(&bars.full[c][stage], (j / kStages) & 1);
            const uint32_t x_rows = ring + stage * kStageBytes;
            const uint32_t dy_rows = x_rows + kXBytes;
#pragma unroll
            for (int s = 0; s < kTaps; ++s) pin_registers(acc[s]);
            wgmma_fence();
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int s = decltype(s0)::value; s < decltype(s1)::value; ++s)
                    WgmmaHalfSsMn<kOutTile, T>::mma(
                        acc[s],
                        make_smem_desc_sw128_mn(x_rows + (s * shift + 16 * i) * kRowBytes,
                                                kXBytes),
                        make_smem_desc_sw128_mn(dy_rows + 16 * i * kRowBytes, kDyBoxBytes),
                        accumulate || i > 0);
            wgmma_commit();
            wgmma_wait<1>();  // the stage before is done: free it
            if (lane == 0 && prev >= 0) mbarrier_arrive(&bars.empty[c][prev]);
            prev = stage;
            ++j;
        };
        for (int kb = first; kb < end; ++kb) {
            int n, oh, ow0;
            w.kblock(kb, n, oh, ow0);
            if (w.stages_of(ow0, edge_nonfinite) == 1) {
                multiply(Tap<0>{}, Tap<kTaps>{}, w.g.dil_w, kb > first);
            } else {  // a stage a tap, each box its tap's own (shift 0)
                static_assert(kMaxTaps == 3, "a stage for each tap below");
                multiply(Tap<0>{}, Tap<1>{}, 0, kb > first);
                if constexpr (kTaps > 1) multiply(Tap<1>{}, Tap<2>{}, 0, kb > first);
                if constexpr (kTaps > 2) multiply(Tap<2>{}, Tap<3>{}, 0, kb > first);
            }
        }
        wgmma_wait<0>();
#pragma unroll
        for (int s = 0; s < kTaps; ++s) pin_registers(acc[s]);
        if (lane == 0 && prev >= 0) mbarrier_arrive(&bars.empty[c][prev]);
        prev = -1;
        store_sums<kTaps>(acc, params, sl, r, cb, ct, warp, lane);
    }
#else
    // Built without sm_90a: the launch is for the wgmma engine alone; reaching here would be a
    // bug: fail loudly.
    __trap();
#endif
}

}  // namespace wgrad_staged
}  // namespace scratchops
