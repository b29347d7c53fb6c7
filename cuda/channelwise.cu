// channelwise.cu — elementwise ops with one parameter per channel of an (N, C, *) tensor.
//
//   scale:        y = x * s[c]                         (P85's x * self.scale)
//   min_add_mul:  y = (min(x, constant) + bias[c]) * factor   (P31's epilogue, one pass)
//
// Versions:
//   v1 the per-plane kernel of common.cuh: one block per plane (n, c) reads its channel's
//      parameter once and streams the plane with float4 accesses when aligned.
//
// P31's epilogue is a separate pass rather than part of the GEMM's store: the GEMM stays one
// generic kernel for every convolution, and this pass costs one read and one write of the
// convolution output (about 1 GB at KernelBench size), a few percent of the convolution's
// time. Fusing it into the GEMM epilogue belongs to the fused fast path.

#include "common.cuh"
#include "launchers.h"

namespace scratchops {
namespace {

struct ScaleOp {
    const float* scale;
    __device__ float prepare(int /*n*/, int c) const { return scale[c]; }
    __device__ float apply(float v, float s) const { return v * s; }
};

struct MinAddMulOp {
    float constant, factor;
    const float* bias;
    __device__ float prepare(int /*n*/, int c) const { return bias[c]; }
    // nan_min: torch.min(x, tensor(c)) propagates NaN from either side.
    __device__ float apply(float v, float b) const { return (nan_min(v, constant) + b) * factor; }
};

}  // namespace

cudaError_t scale_launch(const float* x, const float* scale, float* y, int batch, int channels,
                         int plane_size, cudaStream_t stream) {
    return launch_per_plane(x, y, batch, channels, plane_size, ScaleOp{scale}, stream);
}

cudaError_t min_add_mul_launch(const float* x, float constant, const float* bias, float factor,
                               float* y, int batch, int channels, int plane_size,
                               cudaStream_t stream) {
    return launch_per_plane(x, y, batch, channels, plane_size,
                            MinAddMulOp{constant, factor, bias}, stream);
}

}  // namespace scratchops
