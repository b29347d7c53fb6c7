// gemm_common.cuh — what every GEMM version shares (gemm.cu lists the versions):
// the grid's limits, a batch entry's pointer and the guarded 4-element load.
#pragma once

#include <cuda_runtime.h>

#include "common.cuh"
#include "launchers.h"

namespace scratchops {
namespace {

// (gemm_launch splits the rows and the batch into pieces of at most kMaxGridYZ blocks,
// common.cuh, so each version's launcher may assume they fit.)

// Pointer to batch entry blockIdx.z of a strided batch (64-bit: the batch as a whole may
// span more than 2^31 elements).
template <typename T>
__device__ __forceinline__ T* batch_entry(T* base, long long stride) {
    return base + static_cast<long long>(blockIdx.z) * stride;
}

// Four consecutive elements from p, widened to float, of which the first `count` exist (the
// rest read as 0): one load of 4 * sizeof(T) bytes when all four exist and `aligned` (the
// caller's vector_aligned check on p), one guarded load each otherwise.
template <class T>
__device__ __forceinline__ float4 load4_or_zero(const T* p, int count, bool aligned) {
    if (aligned && count >= 4) return load4(p);
    return make_float4(count > 0 ? to_float(p[0]) : 0.0f, count > 1 ? to_float(p[1]) : 0.0f,
                       count > 2 ? to_float(p[2]) : 0.0f, count > 3 ? to_float(p[3]) : 0.0f);
}

}  // namespace
}  // namespace scratchops
