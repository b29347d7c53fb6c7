// channelwise.cu — elementwise ops with one parameter per channel of an (N, C, *) tensor.
//
//   scale:        y = x * s[c]                         (P85's x * self.scale)
//   min_add_mul:  y = (min(x, constant) + bias[c]) * factor   (P31's epilogue, one pass)
//
// Versions, one idea each:
//   v1 per_plane  one block per (n, c) plane: its channel's parameter read once, then streamed
//
// Element types: float, fp16 and bf16 (element.cuh). The arithmetic is in float whatever the
// type: x and the channel's parameter are widened as they are read, the result rounded to the
// element type once, as it is stored.
//
// How it works: the per-plane kernel of common.cuh, four elements per access when aligned.
//
// min_add_mul is P31's epilogue as a pass of its own, one read and one write of the
// convolution output: ModelNew's "chain" and "im2col" variants run it after conv2d; its
// default runs the same arithmetic in the convolution's store instead
// (conv2d_min_add_mul, cuda/conv_implicit.cu), and the convolution output is written once.

#include "common.cuh"
#include "launchers.h"

namespace scratchops {
namespace {

template <class T>
struct ScaleOp {
    const T* scale;
    __device__ float prepare(int /*n*/, int c) const { return to_float(scale[c]); }
    __device__ float apply(float v, float s) const { return v * s; }
};

template <class T>
struct MinAddMulOp {
    float constant, factor;
    const T* bias;
    __device__ float prepare(int /*n*/, int c) const { return to_float(bias[c]); }
    // nan_min: torch.min(x, tensor(c)) propagates NaN from either side. torch rounds c and the
    // sum to T (element.cuh: rounded); the product is the store's one rounding.
    __device__ float apply(float v, float b) const {
        return rounded<T>(nan_min(v, rounded<T>(constant)) + b) * factor;
    }
};

}  // namespace

template <class T>
cudaError_t scale_launch(const T* x, const T* scale, T* y, int batch, int channels,
                         int plane_size, cudaStream_t stream) {
    return launch_per_plane(x, y, batch, channels, plane_size, ScaleOp<T>{scale}, stream);
}

template <class T>
cudaError_t min_add_mul_launch(const T* x, float constant, const T* bias, float factor, T* y,
                               int batch, int channels, int plane_size, cudaStream_t stream) {
    return launch_per_plane(x, y, batch, channels, plane_size,
                            MinAddMulOp<T>{constant, factor, bias}, stream);
}

#define X(T)                                                                                   \
    template cudaError_t scale_launch<T>(const T*, const T*, T*, int, int, int, cudaStream_t); \
    template cudaError_t min_add_mul_launch<T>(const T*, float, const T*, float, T*, int, int, \
                                               int, cudaStream_t);
SCRATCHOPS_FOR_EACH_ELEMENT(X)
#undef X

}  // namespace scratchops
