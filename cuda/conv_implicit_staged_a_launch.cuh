// conv_implicit_staged_a_launch.cuh — the host side of the implicit-GEMM convolution's v4
// (conv_implicit_staged_a.cuh): the tile's size chosen, the channels-last input described to
// the copy engine (its tensor map), the walk over tiles filled in, the persistent grid
// launched.
#pragma once

#include <atomic>
#include <cstdint>

#include <cuda_runtime.h>

#include "conv_implicit_staged_a.cuh"
#include "launchers.h"

namespace scratchops {
namespace staged_a {

// Tiles of `tile_rows` pixels an output row, and of the whole launch (times the column tiles).
inline int row_tiles(const Conv2dGeometry& g, int tile_rows) {
    return (g.out_w + tile_rows - 1) / tile_rows;
}
inline long long tile_count(const Conv2dGeometry& g, int batch, int n_tiles, int tile_rows) {
    return static_cast<long long>(batch) * g.out_h * row_tiles(g, tile_rows) * n_tiles;
}

// The input's channels-last copy is made by the kernel's own grid, before its grid barrier,
// where it is at most this many bytes (and the grid packs the weights), and by its own kernel
// (transpose.cu) first where it is larger. Inside, the copy costs no launch and no gap between
// two kernels (at batch 1 P31's copy kernel took 3.6 us and the gap after it about 5 us:
// docs/notes.md), but one CTA a multiprocessor moves it a tile at a time: a 16 KB tile, a
// load round trip then a store, about 2 us, so 132 CTAs move some 1 MB a microsecond against
// the copy kernel's 2.9 TB/s. The two break even near 8 MB (x / 1 MB a us = x / 2.9 MB a us
// + 5 us): P31's input at batch 2 in fp32, 4 in 16 bits.
constexpr long long kChannelsLastInsideBytes = 8ll << 20;

template <int BN, int MB, bool kResidentB, class Op, class Epilogue, class BSource>
cudaError_t launch_as(const ChannelsLastCopy& copy, const Conv2dGeometry& g, int batch,
                      const uint8_t* packed, const PackedB& layout, int cblocks,
                      const Epilogue& epilogue, const BSource& b_source, cudaStream_t stream) {
    using Cfg = Config<BN, MB, kResidentB, Op>;
    auto kernel = staged_a_kernel<BN, MB, kResidentB, Op, Epilogue, BSource>;
    static std::atomic<unsigned long long> smem_set_on;  // devices (common.cuh)
    cudaError_t err = allow_dynamic_smem(smem_set_on, kernel, kMaxSmemBytes);
    if (err != cudaSuccess) return err;
    Params params;
    Walk& w = params.walk;
    w.taps_a = (g.kernel_w - 1) * g.dil_w <= kHaloRows ? g.kernel_w : 1;
    const int box_rows = Cfg::kTileRows + (w.taps_a - 1) * g.dil_w;
    constexpr uint64_t kBytes = sizeof(Op);  // (float: TF32 values, rounded by the copy)
    const uint64_t dims[4] = {static_cast<uint64_t>(g.channels), static_cast<uint64_t>(g.width),
                              static_cast<uint64_t>(g.height), static_cast<uint64_t>(batch)};
    const uint64_t strides[3] = {dims[0] * kBytes, dims[0] * dims[1] * kBytes,
                                 dims[0] * dims[1] * dims[2] * kBytes};
    const uint32_t box[4] = {static_cast<uint32_t>(tc::Operand<Op>::kBlockK),
                             static_cast<uint32_t>(box_rows), 1, 1};
    err = make_tensor_map_4d(&params.a_map, copy.y, static_cast<int>(kBytes), dims,
                             strides, box);
    if (err != cudaSuccess) return err;
    w.batch = batch;
    w.out_h = g.out_h;
    w.out_w = g.out_w;
    w.row_tiles = row_tiles(g, Cfg::kTileRows);
    w.n_tiles = layout.n_tiles;
    w.cblocks = cblocks;
    w.num_kb = layout.num_kb;
    w.kernel_w = g.kernel_w;
    w.dil_h = g.dil_h;
    w.dil_w = g.dil_w;
    w.pad_h = g.pad_h;
    w.pad_w = g.pad_w;
    w.groups = g.kernel_w / w.taps_a;
    w.a_loads = g.kernel_h * w.groups * cblocks;
    w.box_bytes = box_rows * kRowBytes;
    const long long tiles = tile_count(g, batch, layout.n_tiles, Cfg::kTileRows);
    if (tiles > kMaxInt32Count) return cudaErrorInvalidValue;
    w.tiles = static_cast<int>(tiles);
    if (tiles == 0) return cudaSuccess;
    params.packed_b = packed;
    params.b_layout = layout;
    params.copy = copy;
    const long long workers = (tiles + kConsumers - 1) / kConsumers;
    const int ctas = workers < sm_count() ? static_cast<int>(workers) : sm_count();
    const long long copy_bytes =
        static_cast<long long>(copy.batch) * copy.channels * copy.pixels * sizeof(Op);
    return tc::launch_packing_b<BN, Op, true>(
        b_source, packed, layout, ctas, true, stream, [&](bool pack_inside, int grid_ctas) {
            // The copy by the grid where it packs and the copy is small, else its kernel first
            // (neither where it is made already).
            const bool to_make = copy.x != nullptr;
            params.copy.by_grid = to_make && pack_inside && copy_bytes <= kChannelsLastInsideBytes;
            if (to_make && !params.copy.by_grid) {
                const cudaError_t copied = channels_last_launch<Op>(
                    static_cast<const Op*>(copy.x), static_cast<Op*>(copy.y), copy.batch,
                    copy.channels, copy.pixels, std::is_same_v<Op, float>, stream);
                if (copied != cudaSuccess) return copied;
            }
            return tc::launch_cooperative(pack_inside, kernel, grid_ctas, kThreads,
                                          Cfg::smem_bytes(layout.num_kb), stream, params,
                                          epilogue, b_source, pack_inside);
        });
}

template <int BN, int MB, class Op, class Epilogue, class BSource>
cudaError_t launch_rows(const ChannelsLastCopy& copy, const Conv2dGeometry& g, int batch,
                        const uint8_t* packed, const PackedB& layout, int cblocks,
                        const Epilogue& epilogue, const BSource& b_source,
                        cudaStream_t stream) {
    if constexpr (tc::Operand<Op>::kNative16)  // (TF32's B is twice as large: never resident)
        if (layout.n_tiles == 1 &&
            Config<BN, MB, true, Op>::smem_bytes(layout.num_kb) <= kMaxSmemBytes)
            return launch_as<BN, MB, true, Op>(copy, g, batch, packed, layout,
                                               cblocks, epilogue, b_source, stream);
    return launch_as<BN, MB, false, Op>(copy, g, batch, packed, layout, cblocks,
                                        epilogue, b_source, stream);
}

// Whether 64-pixel tiles (MB 1) beat 128-pixel ones (MB 2): a consumer walks every
// (kConsumers x SMs)-th tile, so the slowest walks ceil(tiles / (kConsumers SMs)) tiles. A
// 64-pixel tile costs more a pixel (8 halo rows on 64, and its store's fixed cost a tile:
// docs/notes.md, "Three consumers on 64-pixel tiles"), so it is taken only where it shortens
// the slowest walk by a quarter or more: at batch 1, P31's 126 output rows are 126 tiles of
// 128 pixels, 63 CTAs on 132 multiprocessors (the slowest walk 128 pixels), or 252 of 64, 126
// CTAs (64 pixels); at batch 128 16,128 or 32,256 tiles, walks of 7,936 and 7,872 pixels, so
// 128. Rows of at most 64 pixels always take 64 (a 128-pixel tile would be half padding).
inline bool small_tiles(const Conv2dGeometry& g, int batch, int n_tiles) {
    const long long slots = static_cast<long long>(kConsumers) * sm_count();
    auto slowest_walk = [&](int tile_rows) {
        return (tile_count(g, batch, n_tiles, tile_rows) + slots - 1) / slots * tile_rows;
    };
    return 4 * slowest_walk(64) <= 3 * slowest_walk(128);
}

// One launch: copy.y receives the (batch, H, W, Cin) copy of the NCHW input copy.x (elements
// of Op's width; by the kernel's grid or by its own kernel first: kChannelsLastInsideBytes),
// packed the weights by pack_b<BN, Op, true> with k-blocks of whole taps (cblocks a tap), or,
// where b_source.present(), the workspace the launch packs them into itself (inside the
// kernel: a cooperative launch, every multiprocessor packing; with pack_b's kernel first
// where the GPU cannot hold that grid at once). Returns cudaErrorInvalidValue where the tensor
// map cannot describe the copy (its strides are not multiples of 16 bytes) or there are 2^31
// tiles or more. The tile: 128 pixels of an output row, or 64 where small_tiles says.
template <int BN, class Op, class Epilogue, class BSource = tc::PackedAlready>
cudaError_t launch(const ChannelsLastCopy& copy, const Conv2dGeometry& g, int batch,
                   const uint8_t* packed, const PackedB& layout, int cblocks,
                   const Epilogue& epilogue, cudaStream_t stream,
                   const BSource& b_source = BSource{}) {
    static_assert(Config<BN, 1, false, Op>::kTileRows == 64 &&
                  Config<BN, 2, false, Op>::kTileRows == 128, "small_tiles' tile sizes");
    if (small_tiles(g, batch, layout.n_tiles))
        return launch_rows<BN, 1, Op>(copy, g, batch, packed, layout, cblocks,
                                      epilogue, b_source, stream);
    return launch_rows<BN, 2, Op>(copy, g, batch, packed, layout, cblocks, epilogue,
                                  b_source, stream);
}

}  // namespace staged_a
}  // namespace scratchops
