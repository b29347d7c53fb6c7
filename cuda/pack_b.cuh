// pack_b.cuh — B packed for the tensor cores (the layout: tensor_core_operands.cuh): by its
// own kernel before the main one (pack_b), or by the main kernel's own persistent grid as its
// first act (pack_b_in_grid, launched by launch_packing_b: one launch instead of two), and the
// flags through which the main kernel learns whether B holds a non-finite value
// (b_has_nonfinite).
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include "common.cuh"
#include "hopper.cuh"
#include "tensor_core_operands.cuh"

namespace scratchops {
namespace tc {

// A Source that can also give two consecutive k at once (src.pair(entry, n, k), k even), and
// whether an item's values j and j + 1 (j even) are consecutive k in the packed order, so
// that gather may ask for them as pairs: in 16 bits in either order (physical_k keeps a
// register's two k together), in TF32 only in the natural one.
template <class S, class = void>
struct PairSource : std::false_type {};
template <class S>
struct PairSource<S, std::void_t<decltype(&S::pair)>> : std::true_type {};
template <class Op, bool kNaturalK>
__host__ __device__ constexpr bool pairs_consecutive() {
    for (int L = 0; L < Operand<Op>::kBlockK; L += 2)
        if (packed_k<Op, kNaturalK>(L + 1) != packed_k<Op, kNaturalK>(L) + 1 ||
            packed_k<Op, kNaturalK>(L) % 2 != 0)
            return false;
    return true;
}

// A Source that can also give four k spaced kSpacing apart at once (src.spaced(entry, n, k,
// values): k, k + 8, k + 16, k + 24), and whether an item's four values are such k in the
// packed order: in TF32's physical order (physical_k: thread t of a quad reads [8t, 8t + 8)),
// item chunk c of a row holds k = c, c + 8, c + 16, c + 24 of its k-block. One address a
// chunk instead of four (the weight gradient's dy: an output row's pixel found by two
// divisions by invariants, then the three others at fixed offsets in the same row).
constexpr int kSpacing = 8;
template <class S, class = void>
struct SpacedSource : std::false_type {};
template <class S>
struct SpacedSource<S, std::void_t<decltype(&S::spaced)>> : std::true_type {};
template <class Op, bool kNaturalK>
__host__ __device__ constexpr bool items_spaced() {
    bool spaced = !Operand<Op>::kNative16;  // (a 16-bit item holds 8 values)
    for (int c = 0; c < 8; ++c)
        for (int j = 0; j < 4; ++j)
            spaced = spaced && packed_k<Op, kNaturalK>(4 * c + j) ==
                                   packed_k<Op, kNaturalK>(4 * c) + kSpacing * j;
    return spaced;
}

// A stage's place, found by multiplications (FastDiv, made on the host once a launch): stage
// = (entry * n_tiles + tile) * num_kb + kb (PackedB).
struct StagePlaces {
    FastDiv by_num_kb, by_n_tiles;
    // (An empty layout has no stage to place: its divisors are taken as 1, FastDiv's least.)
    explicit StagePlaces(const PackedB& layout)
        : by_num_kb(static_cast<uint32_t>(layout.num_kb > 0 ? layout.num_kb : 1)),
          by_n_tiles(static_cast<uint32_t>(layout.n_tiles > 0 ? layout.n_tiles : 1)) {}
};

// One work item of a stage (stage = (entry * n_tiles + tile) * num_kb + kb, item < 8 BN): the
// 16-byte chunk c = item % 8 of row n = item / 8, which holds logical columns 4c .. 4c + 3 of
// row n, written to each of the three tiles (to the first two where pack_b defers the cross
// tiles: scatter_cross writes the third); in 16-bit, logical columns 8c .. 8c + 7, written
// to the first tile alone. Consecutive items are consecutive chunks (c fastest): a warp stores
// 4 whole 128-byte rows of each tile (with n fastest, each store touched 32 rows, 16 bytes
// apiece, and packing a large B ran at a fifth of the copy rate). In two halves, so that a
// thread can have several items' loads in flight before it stores any (pack_b_in_grid):
// gather reads the item's values, scatter splits and stores them and says whether one was
// not finite (3xTF32 alone: see b_has_nonfinite).
template <class Op>
struct PackItem {
    static constexpr int kValues = Operand<Op>::kNative16 ? 8 : 4;
    float values[kValues];
    int stage, item;

    template <int BN, bool kNaturalK, class Source>
    __device__ __forceinline__ void gather(const Source& src, const PackedB& layout) {
        gather_at<BN, kNaturalK>(src, stage / (layout.num_kb * layout.n_tiles),
                                 (stage / layout.num_kb) % layout.n_tiles,
                                 stage % layout.num_kb);
    }
    template <int BN, bool kNaturalK, class Source>
    __device__ __forceinline__ void gather(const Source& src, const StagePlaces& places) {
        const int entry_tile = places.by_num_kb.div(stage);
        const int entry = places.by_n_tiles.div(entry_tile);
        gather_at<BN, kNaturalK>(src, entry, entry_tile - entry * places.by_n_tiles.divisor,
                                 stage - entry_tile * places.by_num_kb.divisor);
    }
    template <int BN, bool kNaturalK, class Source>
    __device__ __forceinline__ void gather_at(const Source& src, int entry, int tile, int kb) {
        const int c = item % 8, n = item / 8;
        auto k_of = [&](int j) {
            return kb * Operand<Op>::kBlockK + packed_k<Op, kNaturalK>(kValues * c + j);
        };
        if constexpr (SpacedSource<Source>::value && items_spaced<Op, kNaturalK>()) {
            src.spaced(entry, tile * BN + n, k_of(0), values);
        } else if constexpr (PairSource<Source>::value && pairs_consecutive<Op, kNaturalK>()) {
#pragma unroll
            for (int j = 0; j < kValues; j += 2) {  // (k_of(j + 1) = k_of(j) + 1)
                const float2 v = src.pair(entry, tile * BN + n, k_of(j));
                values[j] = v.x;
                values[j + 1] = v.y;
            }
        } else {
#pragma unroll
            for (int j = 0; j < kValues; ++j) values[j] = src(entry, tile * BN + n, k_of(j));
        }
    }

    // kCross: the cross tile too (pack_b with its cross tiles deferred stores them apart:
    // scatter_cross); kSmall: the small tile (not for the one-product TF32 mode: pack_b).
    template <int BN, bool kCross = true, bool kSmall = true>
    __device__ __forceinline__ bool scatter(uint8_t* packed, const PackedB& layout) const {
        if constexpr (Operand<Op>::kNative16) {  // exact: Source widened an Op value
            uint4 chunk;
            Op* halves = reinterpret_cast<Op*>(&chunk);
#pragma unroll
            for (int j = 0; j < 8; ++j) halves[j] = from_float<Op>(values[j]);
            *reinterpret_cast<uint4*>(packed + stage * layout.stage_bytes() +
                                      packed_offset<Op>(item / 8, 8 * (item % 8))) = chunk;
            return false;
        } else {
            uint32_t big[4], small[4], cross[4];
            bool nonfinite = false;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const Tf32Split p = split_tf32(values[j]);
                big[j] = p.big;
                small[j] = p.small;
                cross[j] = p.cross;
                nonfinite = nonfinite || p.cross != p.big;
            }
            *chunk_of<BN>(packed, layout, 0) = make_uint4(big[0], big[1], big[2], big[3]);
            if constexpr (kSmall)
                *chunk_of<BN>(packed, layout, 1) =
                    make_uint4(small[0], small[1], small[2], small[3]);
            if constexpr (kCross)
                *chunk_of<BN>(packed, layout, 2) =
                    make_uint4(cross[0], cross[1], cross[2], cross[3]);
            return nonfinite;
        }
    }

    // The item's chunk of the cross tile alone (3xTF32: Op float).
    template <int BN>
    __device__ __forceinline__ void scatter_cross(uint8_t* packed, const PackedB& layout) const {
        uint32_t cross[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) cross[j] = split_tf32(values[j]).cross;
        *chunk_of<BN>(packed, layout, 2) = make_uint4(cross[0], cross[1], cross[2], cross[3]);
    }

    // The item's 16-byte chunk of tile `tile` (0 big, 1 small, 2 cross) of its stage, in the
    // TF32 split's layout.
    template <int BN>
    __device__ __forceinline__ uint4* chunk_of(uint8_t* packed, const PackedB& layout,
                                               int tile) const {
        return reinterpret_cast<uint4*>(packed + stage * layout.stage_bytes() + tile * BN * 128 +
                                        packed_offset(item / 8, 4 * (item % 8)));
    }
};

// A packing kernel's share of the work, a block a slice of a stage at a time: units
// blockIdx.x, + gridDim.x, ... of layout.units(), thread threadIdx.x's item of each, gathered
// from src and handed to use().
// (layout.slices() for layout.bn == BN, which pack_b checks: a constant, so that a unit's
// stage and slice cost a shift, not a division.)
template <int BN, class Op, bool kNaturalK, class Source, class Use>
__device__ __forceinline__ void for_each_block_item(const Source& src, const PackedB& layout,
                                                    const StagePlaces& places, Use use) {
    constexpr int kSlices = (8 * BN + kPackThreads - 1) / kPackThreads;
    for (int unit = blockIdx.x; unit < layout.units(); unit += gridDim.x) {
        PackItem<Op> it;
        it.stage = unit / kSlices;
        it.item = unit % kSlices * kPackThreads + static_cast<int>(threadIdx.x);
        if (it.item >= 8 * BN) continue;
        it.template gather<BN, kNaturalK>(src, places);
        use(it);
    }
}

// A CTA's "B holds a non-finite value" flag (cta_nonfinite, the same in every thread: a
// __syncthreads_or's result), written by thread 0 to every flag slot f = blockIdx.x (mod
// gridDim.x) of the pack_blocks() that b_has_nonfinite ORs: with a grid of at most
// pack_blocks() CTAs every slot is written and every CTA's flag reaches one (pack_b_kernel's
// grid is pack_blocks(): a slot each).
__device__ __forceinline__ void write_nonfinite_flag(uint8_t* packed, const PackedB& layout,
                                                     int cta_nonfinite) {
    int* flags = reinterpret_cast<int*>(packed + layout.tiles_bytes());
    if (threadIdx.x == 0)
        for (int f = blockIdx.x; f < layout.pack_blocks(); f += gridDim.x) flags[f] = cta_nonfinite;
}

// The packing kernel. kCross: the cross tiles too (see pack_b's kDeferCross); kSmall: the
// small tiles (see pack_b's kOneProduct). At most 32 registers a thread, so that an SM of 2,048
// threads (sm_80, sm_90) holds eight blocks: the packing is bound by its loads in flight, and
// at 33-40 registers (the allocation's unit is 8) six fit, 75 % of the threads. (A register
// cap, not __launch_bounds__'s eight blocks an SM, which sm_86 and sm_89, 1,536 threads an
// SM, cannot hold: ptxas refuses it there. __maxnreg__ came with CUDA 12.4; an older nvcc
// builds the packing without the cap: the same results, at fewer blocks an SM.)
#if __CUDACC_VER_MAJOR__ > 12 || (__CUDACC_VER_MAJOR__ == 12 && __CUDACC_VER_MINOR__ >= 4)
#define SCRATCHOPS_PACK_REGISTER_CAP __maxnreg__(32)
#else
#define SCRATCHOPS_PACK_REGISTER_CAP
#endif
template <int BN, class Op, bool kNaturalK, bool kCross, bool kSmall, class Source>
__global__ void SCRATCHOPS_PACK_REGISTER_CAP
    pack_b_kernel(Source src, uint8_t* packed, PackedB layout, StagePlaces places) {
    bool nonfinite = false;
    for_each_block_item<BN, Op, kNaturalK>(src, layout, places, [&](const PackItem<Op>& it) {
        nonfinite = it.template scatter<BN, kCross, kSmall>(packed, layout) || nonfinite;
    });
    write_nonfinite_flag(packed, layout, __syncthreads_or(nonfinite));
}

// Whether pack_b met a non-finite value in B: its blocks' flags ORed, by every thread of the
// calling CTA together (a block-wide barrier, which also orders what came before it).
__device__ __forceinline__ bool b_has_nonfinite(const uint8_t* packed, const PackedB& layout) {
    const int* flags = reinterpret_cast<const int*>(packed + layout.tiles_bytes());
    bool any = false;
    for (int i = threadIdx.x; i < layout.pack_blocks(); i += blockDim.x) any = any || flags[i];
    return __syncthreads_or(any) != 0;
}

// The deferred cross tiles' pass (pack_b's kDeferCross), after pack_b_kernel: where some block
// of that pass met a non-finite value (its flags), every stage's cross tile, the same units as
// that pass; otherwise nothing (the kernels then copy and read no cross tile).
template <int BN, bool kNaturalK, class Source>
__global__ void pack_b_cross_kernel(Source src, uint8_t* packed, PackedB layout,
                                    StagePlaces places) {
    if (!b_has_nonfinite(packed, layout)) return;
    for_each_block_item<BN, float, kNaturalK>(src, layout, places, [&](const PackItem<float>& it) {
        it.template scatter_cross<BN>(packed, layout);
    });
}

// Where B comes from in a launch: packed before it (PackedAlready, pack_b's output), or a
// Source (such as conv_implicit.cuh's ConvWeights) that the launch packs itself where
// present() (see pack_b_in_grid).
struct PackedAlready {
    static constexpr bool kPacks = false;
    __host__ __device__ bool present() const { return false; }
    __device__ float operator()(int, int, int) const { return 0.0f; }
};

// pack_b's work done by a persistent kernel's own grid, as its first act (one launch instead of
// two, and no gap between them): items i = blockIdx.x blockDim.x + threadIdx.x, + gridDim.x
// blockDim.x, ... of all stages' 8 BN items, kPackInGridItems of a thread's at a time with
// their loads in flight together; each CTA's "B has a non-finite value" flag written by
// write_nonfinite_flag (the launch keeps the grid within kPackBlocks CTAs, and with blocks of
// at least kPackThreads threads a CTA past the last slot has no item); then the whole grid
// meets: the kernel must be
// launched cooperatively (all its CTAs resident at once: launch_packing_b), or the grid
// barrier never opens. The fences: the copy engine (the async proxy) reads what these
// ordinary stores wrote, so each writer fences before the barrier and each reader after it.
constexpr int kPackInGridItems = 4;
template <int BN, class Op, bool kNaturalK, class Source>
__device__ __forceinline__ void pack_b_in_grid(const Source& src, uint8_t* packed,
                                               const PackedB& layout) {
    const long long items = static_cast<long long>(layout.stages()) * 8 * BN;
    const long long step = static_cast<long long>(gridDim.x) * blockDim.x;
    bool nonfinite = false;
    for (long long first = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
         first < items; first += kPackInGridItems * step) {
        PackItem<Op> its[kPackInGridItems];
#pragma unroll
        for (int u = 0; u < kPackInGridItems; ++u) {
            const long long i = first + u * step;
            its[u].stage = static_cast<int>(i / (8 * BN));
            its[u].item = static_cast<int>(i % (8 * BN));
            if (i < items) its[u].template gather<BN, kNaturalK>(src, layout);
        }
#pragma unroll
        for (int u = 0; u < kPackInGridItems; ++u)
            if (first + u * step < items)
                nonfinite = its[u].template scatter<BN>(packed, layout) || nonfinite;
    }
    write_nonfinite_flag(packed, layout, __syncthreads_or(nonfinite));
    fence_proxy_async_global();
    cooperative_groups::this_grid().sync();
    fence_proxy_async_global();
}

// A persistent kernel's first act where its launch told it to pack B (pack_inside: a
// cooperative launch, launch_packing_b) from a source that can be packed (Source::kPacks):
// pack_b_in_grid into `packed`, the launch's own workspace (written by this launch alone).
template <int BN, class Op, bool kNaturalK, class Source>
__device__ __forceinline__ void pack_b_if_told(const Source& src, bool pack_inside,
                                               const uint8_t* packed, const PackedB& layout) {
    if constexpr (Source::kPacks)
        if (pack_inside)
            pack_b_in_grid<BN, Op, kNaturalK>(src, const_cast<uint8_t*>(packed), layout);
}

// The deferred cross tiles' pass (pack_b_cross_kernel) of a B whose big and small tiles and
// flags are written: by pack_b's first kernel (kDeferCross), or by a pass of its own in
// pack_b's layout (min_add_mul_operands.cuh).
template <int BN, bool kNaturalK, class Source>
cudaError_t pack_b_cross(const Source& src, uint8_t* packed, const PackedB& layout,
                         cudaStream_t stream) {
    pack_b_cross_kernel<BN, kNaturalK><<<layout.pack_blocks(), kPackThreads, 0, stream>>>(
        src, packed, layout, StagePlaces(layout));
    return cudaGetLastError();
}

// Op: the operand type the engine multiplies (Operand), float for the TF32 split; kNaturalK:
// the k order of a kernel that stages A in shared memory (packed_k). kDeferCross (Op float:
// the TF32 split's layout): the cross tiles, which the kernels read only where B has a
// non-finite value (and the one-product TF32 mode never), written by a second pass that
// returns at once where B has none: a large B (the weight gradient's dy, 1 GB at P31's size)
// then writes two tiles of three; for a small B the second launch costs more than the tile
// it saves. kOneProduct (Op float): B for the one-product TF32 mode, which reads the big tile
// alone (stage_copy_bytes): neither the small tile nor the cross one is written (half the
// bytes of the weight gradient's dy in TF32).
template <int BN, class Op = float, bool kNaturalK = false, bool kDeferCross = false,
          bool kOneProduct = false, class Source>
cudaError_t pack_b(const Source& src, uint8_t* packed, const PackedB& layout,
                   cudaStream_t stream) {
    constexpr bool kBigOnly = kOneProduct && !Operand<Op>::kNative16;
    constexpr bool kDefer = kDeferCross && !Operand<Op>::kNative16 && !kBigOnly;
    if (layout.bn != BN) return cudaErrorInvalidValue;  // (for_each_block_item's slices)
    const StagePlaces places(layout);
    // Always layout.pack_blocks() blocks, so that every flag the main kernel reads is written.
    pack_b_kernel<BN, Op, kNaturalK, !kDefer && !kBigOnly, !kBigOnly>
        <<<layout.pack_blocks(), kPackThreads, 0, stream>>>(src, packed, layout, places);
    cudaError_t err = cudaGetLastError();
    if constexpr (kDefer)
        if (err == cudaSuccess) err = pack_b_cross<BN, kNaturalK>(src, packed, layout, stream);
    return err;
}

// The launch of a persistent kernel that reads B packed, where B comes from `src` (see
// PackedAlready): launch(pack_inside, grid) launches the kernel on `grid` CTAs, cooperatively
// where pack_inside (launch_cooperative), telling it whether to pack B itself. With src
// present: cooperatively on every multiprocessor (also where there are fewer tiles: CTAs past
// the last tile pack and leave; a 1 x 64 x 16 x 16 input's 2 CTAs packing P31's weights took
// 64 us a call, against 33 for the packing kernel and the convolution), the kernel packing;
// where the GPU cannot hold that grid at once (fewer multiprocessors lent to this process
// than the device has, say: cudaErrorCooperativeLaunchTooLarge, a launch error, not sticky),
// or where the kernel never packs (may_pack_inside false: one CTA a tile, or a kernel without
// the prologue), pack_b's kernel first and an ordinary launch of `ctas` (launch may ignore
// both arguments then). A cooperative launch's host cost is an ordinary one's (on an H200: 3.3 us
// each, 132 CTAs of 384 threads).
template <int BN, class Op, bool kNaturalK, class Source, class Launch>
cudaError_t launch_packing_b(const Source& src, const uint8_t* packed, const PackedB& layout,
                             int ctas, bool may_pack_inside, cudaStream_t stream,
                             Launch&& launch) {
    // (pack_b_in_grid's flag slots: at most kPackBlocks CTAs)
    if (src.present() && may_pack_inside && sm_count() <= kPackBlocks) {
        const cudaError_t err = launch(true, sm_count());
        if (err != cudaErrorCooperativeLaunchTooLarge) return err;
        (void)cudaGetLastError();
    }
    if (src.present()) {  // (the call's own workspace: this launch alone writes it)
        const cudaError_t err =
            pack_b<BN, Op, kNaturalK>(src, const_cast<uint8_t*>(packed), layout, stream);
        if (err != cudaSuccess) return err;
    }
    return launch(false, ctas);
}

// A kernel's launch on `ctas` CTAs, cooperative (every CTA resident at once, so that a grid
// barrier can open: pack_b_in_grid) or ordinary.
template <class... Params, class... Args>
cudaError_t launch_cooperative(bool cooperative, void (*kernel)(Params...), int ctas,
                               int threads, int smem_bytes, cudaStream_t stream,
                               Args&&... args) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(ctas);
    config.blockDim = dim3(threads);
    config.dynamicSmemBytes = smem_bytes;
    config.stream = stream;
    cudaLaunchAttribute attribute;
    attribute.id = cudaLaunchAttributeCooperative;
    attribute.val.cooperative = 1;
    config.attrs = &attribute;
    config.numAttrs = cooperative ? 1 : 0;
    return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace tc
}  // namespace scratchops
