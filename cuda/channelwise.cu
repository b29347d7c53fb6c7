// channelwise.cu — elementwise ops with one parameter per channel of an (N, C, *) tensor.
//
//   scale:        y = x * s[c]                         (P85's x * self.scale)
//   min_add_mul:  y = (min(x, constant) + bias[c]) * factor   (P31's epilogue, one pass)
//
// Versions, one idea each:
//   v1 per_plane  one block per (n, c) plane: its channel's parameter read once, then streamed
//
// How it works: the per-plane kernel of common.cuh, with float4 accesses when aligned.
//
// min_add_mul is P31's epilogue as a pass of its own, one read and one write of the
// convolution output: ModelNew's "chain" and "im2col" variants run it after conv2d; its
// default runs the same arithmetic in the convolution's store instead
// (conv2d_min_add_mul, cuda/conv_implicit.cu), and the convolution output is written once.

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
