// gemm_common.cuh — what every GEMM version shares (gemm.cu lists the versions):
// the grid's limits and a batch entry's pointer.
#pragma once

#include <cuda_runtime.h>

#include "common.cuh"
#include "launchers.h"

namespace scratchops {
namespace {

// (gemm_launch splits the rows and the batch into pieces of at most kMaxGridYZ blocks,
// common.cuh, so each version's launcher may assume they fit.)

// Pointer to batch entry blockIdx.z of a strided batch (64-bit: the batch as a whole may
// span more than 2^31 floats).
template <typename T>
__device__ __forceinline__ T* batch_entry(T* base, long long stride) {
    return base + static_cast<long long>(blockIdx.z) * stride;
}

}  // namespace
}  // namespace scratchops
