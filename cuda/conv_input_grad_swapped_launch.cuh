// conv_input_grad_swapped_launch.cuh — the host side of the input gradient v4
// (conv_input_grad_swapped.cuh): where it applies, its workspace, the weights packed, dy split
// into its channels-last parts a chunk of images at a time, the tensor maps and the persistent
// grid.
#pragma once

#include <atomic>
#include <cstdint>

#include <cuda_runtime.h>

#include "conv_input_grad_swapped.cuh"
#include "launchers.h"

namespace scratchops {
namespace swapped {

// Whether v4 serves the input gradient of a stride-1 convolution g with out_channels outputs
// (the caller checks that it is a convolution of dy: input_grad_is_a_convolution): 3xTF32 on
// the wgmma engine; dy's channels at least a k-block and a whole number of 16-byte runs (the
// tensor map's strides); a kernel row's taps within one box; dx rows at least half a tile
// wide (narrower rows would leave most of each wgmma's columns empty).
inline bool applies(int out_channels, const Conv2dGeometry& g, TensorCorePath engine, bool tf32) {
    return engine == TensorCorePath::kWgmma && !tf32 && out_channels >= kBlockK &&
           out_channels % 4 == 0 && (g.kernel_w - 1) * g.dil_w <= kHaloCols &&
           g.width >= kTileCols / 2;
}

// The workspace in floats: the packed weights, then dy's two parts for a chunk of images.
struct Workspace {
    long long packed, per_image;
};
inline Workspace workspace_floats(int out_channels, const Conv2dGeometry& g) {
    const long long cblocks = (out_channels + kBlockK - 1) / kBlockK;
    const long long m_tiles = (g.channels + kTileRows - 1) / kTileRows;
    const long long packed =
        m_tiles * g.kernel_h * g.kernel_w * cblocks * kKSteps * kFragmentFloats;
    return {(packed + 3) / 4 * 4,  // (the parts stay 16-byte aligned)
            2ll * out_channels * g.out_h * g.out_w};
}
// Images a chunk: as many as the workspace holds after the weights, at most the batch and
// the split kernel's grid; 0 where not one fits, or where the packed weights are past the
// packing kernel's 32-bit index.
inline int chunk_images(int batch, int out_channels, const Conv2dGeometry& g,
                        long long workspace_bytes) {
    const Workspace ws = workspace_floats(out_channels, g);
    if (ws.packed > kMaxInt32Count) return 0;
    const long long left = workspace_bytes / 4 - ws.packed;
    long long images = left > 0 && ws.per_image > 0 ? left / ws.per_image : 0;
    images = images < kMaxGridYZ ? images : kMaxGridYZ;
    return images < batch ? static_cast<int>(images) : batch;
}

// The tiles of `images` images (the walk's: Walk::tile), as a long long: the launch refuses
// more than an int holds.
inline long long tiles(const Conv2dGeometry& g, int images) {
    return static_cast<long long>(g.height) * ((g.width + kTileCols - 1) / kTileCols) *
           ((g.channels + kTileRows - 1) / kTileRows) * images;
}

// The launch's fixed part: the kernel's shared memory allowed, the walk but its tiles, and
// the flipped weights packed into `packed` (workspace_floats' packed floats).
inline cudaError_t prepare(Params& params, const float* weight, int out_channels,
                           const Conv2dGeometry& g, float* packed, cudaStream_t stream) {
    static std::atomic<unsigned long long> smem_set_on;  // devices (common.cuh)
    const cudaError_t err = allow_dynamic_smem(smem_set_on, swapped_kernel, kSmemBytes);
    if (err != cudaSuccess) return err;
    Walk& w = params.walk;
    w.out_h = g.height;
    w.out_w = g.width;
    w.channels = g.channels;
    w.col_tiles = (g.width + kTileCols - 1) / kTileCols;
    w.m_tiles = (g.channels + kTileRows - 1) / kTileRows;
    w.cblocks = (out_channels + kBlockK - 1) / kBlockK;
    w.kernel_h = g.kernel_h;
    w.kernel_w = g.kernel_w;
    w.dil_h = g.dil_h;
    w.dil_w = g.dil_w;
    w.pad_h = g.dil_h * (g.kernel_h - 1) - g.pad_h;  // the flipped convolution's padding
    w.pad_w = g.dil_w * (g.kernel_w - 1) - g.pad_w;
    w.kblocks = g.kernel_h * g.kernel_w * w.cblocks;
    w.box_bytes = (kTileCols + (g.kernel_w - 1) * g.dil_w) * kRowBytes;
    const Workspace ws = workspace_floats(out_channels, g);
    const int packed_total = static_cast<int>(ws.packed / 4 * 4);
    constexpr int kPackThreadsBlock = 256;
    pack_weights_kernel<<<(packed_total + kPackThreadsBlock - 1) / kPackThreadsBlock,
                          kPackThreadsBlock, 0, stream>>>(weight, packed, packed_total,
                                                          g.channels, out_channels, g.kernel_h,
                                                          g.kernel_w, w.cblocks);
    params.packed_a = reinterpret_cast<const float4*>(packed);
    return cudaGetLastError();
}

// dx of `count` images (its first image's) from dy's two parts of those images, channels-last
// (count x out_h x out_w x out_channels floats each): the tensor maps and the persistent grid.
inline cudaError_t run_on_parts(Params& params, const float* big, const float* small,
                                float* dx, int count, int out_channels, const Conv2dGeometry& g,
                                cudaStream_t stream) {
    Walk& w = params.walk;
    const long long count_tiles = tiles(g, count);
    if (count_tiles > kMaxInt32Count) return cudaErrorInvalidValue;
    const uint64_t dims[4] = {static_cast<uint64_t>(out_channels), static_cast<uint64_t>(g.out_w),
                              static_cast<uint64_t>(g.out_h), static_cast<uint64_t>(count)};
    const uint64_t strides[3] = {dims[0] * 4, dims[0] * dims[1] * 4,
                                 dims[0] * dims[1] * dims[2] * 4};
    const uint32_t box[4] = {kBlockK, static_cast<uint32_t>(w.box_bytes / kRowBytes), 1, 1};
    cudaError_t err = make_tensor_map_4d(&params.big_map, big, 4, dims, strides, box);
    if (err == cudaSuccess)
        err = make_tensor_map_4d(&params.small_map, small, 4, dims, strides, box);
    if (err != cudaSuccess) return err;
    params.dx = dx;
    w.tiles = static_cast<int>(count_tiles);
    const int workers = (w.tiles + kConsumers - 1) / kConsumers;
    const int ctas = workers < sm_count() ? workers : sm_count();
    swapped_kernel<<<ctas, kThreads, kSmemBytes, stream>>>(params);
    return cudaGetLastError();
}

// dx (batch x C x H x W) = the input gradient of the convolution g (out_channels outputs) for
// dy (batch x out_channels x out_h x out_w), in chunks of chunk_images images; where applies()
// and a chunk of at least one image fits `workspace` (workspace_bytes, 16-byte aligned).
inline cudaError_t launch(const float* dy, const float* weight, float* dx, int batch,
                          int out_channels, const Conv2dGeometry& g, float* workspace,
                          long long workspace_bytes, cudaStream_t stream) {
    const int images = chunk_images(batch, out_channels, g, workspace_bytes);
    if (images <= 0) return cudaErrorInvalidValue;
    Params params;
    cudaError_t err = prepare(params, weight, out_channels, g, workspace, stream);
    const Workspace ws = workspace_floats(out_channels, g);
    const long long pixels = static_cast<long long>(g.out_h) * g.out_w;
    const int tiles_p = static_cast<int>((pixels + kVecTile - 1) / kVecTile);
    const int tiles_c = (out_channels + kVecTile - 1) / kVecTile;
    float* big = workspace + ws.packed;
    for (int n0 = 0; n0 < batch && err == cudaSuccess; n0 += images) {
        const int count = batch - n0 < images ? batch - n0 : images;
        float* small = big + static_cast<long long>(count) * ws.per_image / 2;
        split_channels_last_kernel<<<dim3(tiles_c * tiles_p, count), kSplitThreads, 0, stream>>>(
            dy + n0 * static_cast<long long>(out_channels) * pixels, big, small, out_channels,
            static_cast<int>(pixels), tiles_p);
        err = cudaGetLastError();
        if (err == cudaSuccess)
            err = run_on_parts(params, big, small,
                               dx + n0 * static_cast<long long>(g.channels) * g.height * g.width,
                               count, out_channels, g, stream);
    }
    return err;
}

}  // namespace swapped
}  // namespace scratchops
