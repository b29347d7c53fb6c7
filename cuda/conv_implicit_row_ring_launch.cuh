// conv_implicit_row_ring_launch.cuh — the host side of the implicit-GEMM convolution's v5
// (conv_implicit_row_ring.cuh): whether it serves a convolution, the NCHW input described to
// the copy engine (its tensor map), the walk filled in, the persistent grid launched.
#pragma once

#include <atomic>
#include <cstdint>

#include <cuda_runtime.h>

#include "conv_implicit_row_ring.cuh"
#include "launchers.h"

namespace scratchops {
namespace row_ring {

// Whether v5 serves this convolution (the file's head: the shape; layout: v4's packing; x:
// the input, whose address the tensor map needs 16-byte aligned; nullptr where the caller's
// channels-last copy holds it already, which v4 reads).
template <int BN, class Op>
bool applies(const void* x, const Conv2dGeometry& g, int batch, const tc::PackedB& layout) {
    return tc::Operand<Op>::kNative16 && x != nullptr && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
           layout.n_tiles == 1 && g.stride_h == 1 &&
           g.stride_w == 1 && g.dil_h == 1 && g.channels <= tc::Operand<Op>::kBlockK &&
           g.channels > (kFillers - 1) * kChunkChannels &&  // (ChunkCursor)
           g.kernel_h <= kMaxKernelH && (g.kernel_w - 1) * g.dil_w <= kHaloRows &&
           g.width % 8 == 0 && g.width + 2 * g.pad_w <= kSlotRows &&
           smem_bytes<BN, Op>(g.kernel_h + 1, layout.num_kb) <= kMaxSmemBytes &&
           static_cast<long long>(batch) * g.out_h >= static_cast<long long>(kMinRowsPerCta) *
                                                          sm_count() &&
           static_cast<long long>(batch) * g.out_h * g.out_w <= kMaxInt32Count;
}

// One launch where applies(): x the NCHW input (16-byte aligned), packed and layout as v4's
// (b_source: the weights, packed by this launch where present).
template <int BN, class Op, class Epilogue, class BSource>
cudaError_t launch(const Op* x, const Conv2dGeometry& g, int batch, const uint8_t* packed,
                   const tc::PackedB& layout, const Epilogue& epilogue, cudaStream_t stream,
                   const BSource& b_source) {
    auto kernel = row_ring_kernel<BN, Op, Epilogue, BSource>;
    static std::atomic<unsigned long long> smem_set_on;  // devices (common.cuh)
    cudaError_t err = allow_dynamic_smem(smem_set_on, kernel, kMaxSmemBytes);
    if (err != cudaSuccess) return err;
    RingParams params;
    const uint64_t dims[4] = {static_cast<uint64_t>(g.width), static_cast<uint64_t>(g.height),
                              static_cast<uint64_t>(g.channels), static_cast<uint64_t>(batch)};
    const uint64_t strides[3] = {dims[0] * 2, dims[0] * dims[1] * 2,
                                 dims[0] * dims[1] * dims[2] * 2};
    const uint32_t box[4] = {kBoxPixels, 1, kChunkChannels, 1};
    err = make_tensor_map_4d(&params.x_map, x, 2, dims, strides, box);
    if (err != cudaSuccess) return err;
    params.packed_b = packed;
    params.b_layout = layout;
    // (the fields in RingWalk's order)
    params.walk = RingWalk{batch * g.out_h, g.out_h, g.out_w, g.height, g.width, g.kernel_h,
                           g.kernel_w, g.dil_w, g.pad_h, g.pad_w,
                           (g.channels + kChunkChannels - 1) / kChunkChannels, g.kernel_h + 1,
                           layout.num_kb};
    const RingWalk& w = params.walk;
    const int ctas = w.rows < sm_count() ? w.rows : sm_count();
    return tc::launch_packing_b<BN, Op, true>(
        b_source, packed, layout, ctas, true, stream, [&](bool pack_inside, int grid_ctas) {
            return tc::launch_cooperative(pack_inside, kernel, grid_ctas, kThreads,
                                          smem_bytes<BN, Op>(w.slots, w.num_kb), stream, params,
                                          epilogue, b_source, pack_inside);
        });
}

}  // namespace row_ring
}  // namespace scratchops
