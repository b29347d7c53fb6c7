// tma.cuh — the tensor memory accelerator (TMA, sm_90): a box of a tensor copied into shared
// memory by the copy engine, described by a tensor map that the host writes once per launch.
//
// Why a tensor map and not the plain bulk copy (hopper.cuh's bulk_copy_to_shared): a box is
// many rows, possibly far apart in memory; the engine places them in the 128-byte swizzle
// layout that wgmma reads (the 16-byte chunk c of row r at chunk position c ^ (r % 8)), and
// fills every element whose coordinate lies outside the tensor with zeros: a negative
// coordinate or one past the end is how a convolution's padding reads as zeros.
//
// The tensor map (CUtensorMap, 128 bytes) is made on the host by the driver's
// cuTensorMapEncodeTiled, reached through the runtime (cudaGetDriverEntryPointByVersion) so
// that nothing links libcuda; it travels to the kernel as a __grid_constant__ parameter, and
// the copy instruction names its address. PTX ISA: "cp.async.bulk.tensor", "Tensor Map";
// CUDA driver API: cuTensorMapEncodeTiled.
#pragma once

#include <cstdint>

#include <cuda.h>
#include <cuda_runtime.h>

#include "hopper.cuh"

namespace scratchops {

// A 4-D tensor of `element_bytes`-byte elements, dims[0] the contiguous one, strides in bytes
// of dims 1..3 (multiples of 16), read in boxes of box[0] x ... x box[3] elements placed in
// the 128-byte swizzle layout (box[0] * element_bytes must be 128: one swizzled row), zeros
// outside the tensor. cudaErrorInvalidValue where the driver refuses the description.
inline cudaError_t make_tensor_map_4d(CUtensorMap* map, const void* base, int element_bytes,
                                      const uint64_t (&dims)[4], const uint64_t (&strides)[3],
                                      const uint32_t (&box)[4]) {
    using Encode = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
    static Encode encode = nullptr;  // looked up once (the same function on every device)
    if (encode == nullptr) {
        void* fn = nullptr;
        cudaDriverEntryPointQueryResult found;
        const cudaError_t err = cudaGetDriverEntryPointByVersion(
            "cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found);
        if (err != cudaSuccess) return err;
        if (found != cudaDriverEntryPointSuccess || fn == nullptr) return cudaErrorNotSupported;
        encode = reinterpret_cast<Encode>(fn);
    }
    // (The copy moves bits: any element type of the right width will do.)
    const CUtensorMapDataType type = element_bytes == 4   ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                                     : element_bytes == 2 ? CU_TENSOR_MAP_DATA_TYPE_UINT16
                                                          : CU_TENSOR_MAP_DATA_TYPE_UINT8;
    const cuuint32_t unit_strides[4] = {1, 1, 1, 1};
    const CUresult r = encode(map, type, 4, const_cast<void*>(base), dims, strides, box,
                              unit_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                              CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);  // (NONE: zeros)
    return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

// The box of `map` whose first element is at coordinates (c0, c1, c2, c3) (dims[0] first; any
// of them may be negative or past the end, but the box's address must be a multiple of 16
// bytes, so c0 times the element's bytes a multiple of 16: PTX ISA, tensor tiled mode,
// "Bounding Box"; otherwise the copy dies with an illegal instruction)
// copied to dst (1024-byte aligned for the swizzle);
// its bytes, the whole box's whatever lies outside, count on `bar` (complete_tx).
__device__ __forceinline__ void tma_load_4d(void* dst, const CUtensorMap* map, int c0, int c1,
                                            int c2, int c3, uint64_t* bar) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3, %4, %5}], [%6];"
        ::"r"(smem_address(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1),
          "r"(c2), "r"(c3), "r"(smem_address(bar))
        : "memory");
}

// The same box of `map` brought into L2 only (no shared memory, no barrier): a later
// tma_load_4d of it then waits on L2 instead of DRAM.
__device__ __forceinline__ void tma_prefetch_4d(const CUtensorMap* map, int c0, int c1, int c2,
                                                int c3) {
    asm volatile("cp.async.bulk.prefetch.tensor.4d.L2.global.tile [%0, {%1, %2, %3, %4}];"
                 ::"l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
                 : "memory");
}

}  // namespace scratchops
