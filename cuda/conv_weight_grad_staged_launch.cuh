// conv_weight_grad_staged_launch.cuh — the host side of the weight gradient v3
// (conv_weight_grad_staged.cuh): the slicing of the chunk's output rows, the pass that looks
// for non-finite values at x's right edge, the copies described to the copy engine (tensor
// maps), the walk filled in, the persistent grid launched.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

#include <cuda_runtime.h>

#include "conv_weight_grad_staged.cuh"

namespace scratchops {
namespace wgrad_staged {

// Block b's flag: whether x's channels-last copy x_cl (rows (n, h) of W pixels of C channels)
// has a non-finite value in its columns first_col .. W - 1, in the rows its warps take: warp
// v of the pass's takes rows v, v + warps, ..., kEdgeFlagRows of them loaded before any is
// checked. In the copy a row's last columns are one run of (W - first_col) C values.
constexpr int kEdgeFlagRows = 4;
template <class T>
__global__ void __launch_bounds__(kEdgeFlagThreads) edge_flags_kernel(
    const T* __restrict__ x_cl, int* __restrict__ flags, int rows, int width, int channels,
    int first_col) {
    constexpr int kWarps = kEdgeFlagBlocks * kEdgeFlagThreads / 32;
    const int run = (width - first_col) * channels;
    const int warp = blockIdx.x * (kEdgeFlagThreads / 32) + threadIdx.x / 32;
    bool found = false;
    for (int row0 = warp; row0 < rows; row0 += kWarps * kEdgeFlagRows)
        for (int i = threadIdx.x % 32; i < run; i += 32) {
            float v[kEdgeFlagRows];
#pragma unroll
            for (int k = 0; k < kEdgeFlagRows; ++k) {
                const long long row = row0 + static_cast<long long>(k) * kWarps;
                v[k] = row < rows ? to_float(x_cl[(row * width + first_col) * channels + i])
                                  : 0.0f;
            }
#pragma unroll
            for (int k = 0; k < kEdgeFlagRows; ++k)
                found |= !(fabsf(v[k]) <= 3.402823466e38f);  // Inf or NaN
        }
    found = __syncthreads_or(found);
    if (threadIdx.x == 0) flags[blockIdx.x] = found ? 1 : 0;
}

// The slicing of `images` images' output rows (see the top).
struct Slicing {
    int segs, rows_per_slice, rows, slices;
};
inline Slicing slicing(const Conv2dGeometry& g, int images, int slice_slots) {
    Slicing s;
    s.segs = (g.out_w + kPixels - 1) / kPixels;
    s.rows_per_slice = slice_slots / (s.segs * kPixels) > 1 ? slice_slots / (s.segs * kPixels) : 1;
    s.rows = images * g.out_h;
    s.slices = (s.rows + s.rows_per_slice - 1) / s.rows_per_slice;
    return s;
}
inline int column_tiles(int out_channels, const Conv2dGeometry& g) {
    return g.kernel_h * ((g.channels + kChannelBlock - 1) / kChannelBlock) *
           ((out_channels + kOutTile - 1) / kOutTile);
}
// One instantiation's launch, its shared-memory size set once a device (each instantiation is
// a kernel of its own, with its own attribute).
template <int kTaps, class T>
cudaError_t launch_kernel(const Params& params, int ctas, cudaStream_t stream) {
    static std::atomic<unsigned long long> smem_set_on;  // devices (common.cuh)
    const cudaError_t err =
        allow_dynamic_smem(smem_set_on, staged_wgrad_kernel<kTaps, T>, kSmemBytes);
    if (err != cudaSuccess) return err;
    staged_wgrad_kernel<kTaps, T><<<ctas, kThreads, kSmemBytes, stream>>>(params);
    return cudaGetLastError();
}

// The first column a tap reads as a slot past OW (the top: col = ow + s dil_w - pad_w); a
// partial k-block splits only where x has a non-finite value from there on. Where it is
// below 1 a tap's cut tensor map would have no column: the launch refuses (v2 runs).
inline int edge_first_col(const Conv2dGeometry& g) { return g.out_w - g.pad_w; }

// One chunk of `images` images: dy_cl (images, OH, OW, Cout) and x_cl (images, H, W, C)
// channels-last, their products stored as the slices' entries of `partials` (slicing(...)
// .slices of them); edge_flags: kEdgeFlagBlocks ints for the flags' pass.
// cudaErrorInvalidValue where the tensor maps cannot describe the copies or the indices pass
// 32 bits.
template <class T>
cudaError_t launch(const T* dy_cl, const T* x_cl, int* edge_flags, float* partials, int images,
                   int out_channels, const Conv2dGeometry& g, int slice_slots,
                   cudaStream_t stream) {
    static_assert(sizeof(T) == 2, "MN-major operands are 16-bit");
    Params params;
    Walk& w = params.walk;
    const Slicing s = slicing(g, images, slice_slots);
    const long long kblocks = static_cast<long long>(s.rows) * s.segs;
    const long long units = static_cast<long long>(column_tiles(out_channels, g)) * s.slices;
    if (kblocks + s.rows_per_slice * s.segs > kMaxInt32Count || units > kMaxInt32Count ||
        static_cast<long long>(images) * g.height > kMaxInt32Count ||
        g.kernel_w > kMaxTaps || g.kernel_w < 1)
        return cudaErrorInvalidValue;
    const int box_rows = kPixels + (g.kernel_w - 1) * g.dil_w;
    if (box_rows * kRowBytes > kXBytes || edge_first_col(g) < 1) return cudaErrorInvalidValue;
    constexpr uint64_t kBytes = sizeof(T);
    const uint64_t x_dims[4] = {static_cast<uint64_t>(g.channels), static_cast<uint64_t>(g.width),
                                static_cast<uint64_t>(g.height), static_cast<uint64_t>(images)};
    const uint64_t dy_dims[4] = {static_cast<uint64_t>(out_channels),
                                 static_cast<uint64_t>(g.out_w), static_cast<uint64_t>(g.out_h),
                                 static_cast<uint64_t>(images)};
    auto strides = [](const uint64_t (&d)[4]) {
        return std::array<uint64_t, 3>{d[0] * kBytes, d[0] * d[1] * kBytes,
                                       d[0] * d[1] * d[2] * kBytes};
    };
    const auto xs = strides(x_dims), ds = strides(dy_dims);
    const uint64_t x_strides[3] = {xs[0], xs[1], xs[2]}, dy_strides[3] = {ds[0], ds[1], ds[2]};
    const uint32_t x_box[4] = {kChannelBlock, static_cast<uint32_t>(box_rows), 1, 1};
    const uint32_t dy_box[4] = {kChannelBlock, kPixels, 1, 1};
    cudaError_t err = make_tensor_map_4d(&params.x_map, x_cl, 2, x_dims, x_strides, x_box);
    if (err == cudaSuccess)
        err = make_tensor_map_4d(&params.dy_map, dy_cl, 2, dy_dims, dy_strides, dy_box);
    const uint32_t tap_box[4] = {kChannelBlock, kPixels, 1, 1};
    for (int s = 0; s < g.kernel_w && err == cudaSuccess; ++s) {
        const int cut = edge_first_col(g) + s * g.dil_w;  // >= 1: checked above
        uint64_t tap_dims[4] = {x_dims[0], x_dims[1], x_dims[2], x_dims[3]};
        tap_dims[1] = static_cast<uint64_t>(cut < g.width ? cut : g.width);
        err = make_tensor_map_4d(&params.x_tap_map[s], x_cl, 2, tap_dims, x_strides, tap_box);
    }
    if (err != cudaSuccess) return err;
    w.g = g;
    w.out_channels = out_channels;
    w.segs = s.segs;
    w.rows = s.rows;
    w.rows_per_slice = s.rows_per_slice;
    w.slices = s.slices;
    w.units = static_cast<int>(units);
    w.column_tiles = column_tiles(out_channels, g);
    w.cblocks = (g.channels + kChannelBlock - 1) / kChannelBlock;
    w.co_tiles = (out_channels + kOutTile - 1) / kOutTile;
    w.x_box_bytes = box_rows * kRowBytes;
    w.last_partial = g.out_w % kPixels != 0;
    if (w.last_partial && edge_first_col(g) < g.width) {
        edge_flags_kernel<T><<<kEdgeFlagBlocks, kEdgeFlagThreads, 0, stream>>>(
            x_cl, edge_flags, images * g.height, g.width, g.channels, edge_first_col(g));
        err = cudaGetLastError();
        if (err != cudaSuccess) return err;
    } else {
        w.last_partial = false;  // (no column past them: every slot past OW reads zeros)
    }
    params.edge_flags = edge_flags;
    params.partials = partials;
    const long long workers = (units + kConsumers - 1) / kConsumers;
    const int ctas = workers < sm_count() ? static_cast<int>(workers) : sm_count();
    if (ctas == 0) return cudaSuccess;
    switch (g.kernel_w) {
        case 1: return launch_kernel<1, T>(params, ctas, stream);
        case 2: return launch_kernel<2, T>(params, ctas, stream);
        default: return launch_kernel<3, T>(params, ctas, stream);
    }
}

}  // namespace wgrad_staged
}  // namespace scratchops
