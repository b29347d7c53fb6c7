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

// Four consecutive floats from p of which the first `count` exist (the rest read as 0): one
// 16-byte load when all four exist and `aligned` (the caller's check that p is 16-byte
// aligned), one guarded load each otherwise.
__device__ __forceinline__ float4 load4_or_zero(const float* p, int count, bool aligned) {
    if (aligned && count >= 4) return *reinterpret_cast<const float4*>(p);
    return make_float4(count > 0 ? p[0] : 0.0f, count > 1 ? p[1] : 0.0f,
                       count > 2 ? p[2] : 0.0f, count > 3 ? p[3] : 0.0f);
}

}  // namespace
}  // namespace scratchops
