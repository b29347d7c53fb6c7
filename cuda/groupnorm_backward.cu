// groupnorm_backward.cu — the gradients of group normalisation followed by a per-channel scale
// (groupnorm.cu): y = (x̂ * gamma[c] + beta[c]) * scale[c], x̂ = (x - mean) * rstd over each
// group of sample n (M = (C/G) * S elements), rstd = 1 / sqrt(var + eps), var biased.
//
// The derivation. Write w[c] = gamma[c] * scale[c] and g = dy * w[c], the gradient reaching x̂.
// x̂ depends on x directly and through the group's mean and rstd:
//   d mean / d x_i = 1/M,   d rstd / d x_i = -rstd^3 (x_i - mean) / M   (eps included),
// so, summing over the group's elements j,
//   dx_i = rstd * g_i - rstd/M * sum_j g_j - (x_i - mean) rstd^3 / M * sum_j g_j (x_j - mean)
//        = rstd * (g_i - (sum_j g_j + x̂_i * sum_j g_j x̂_j) / M).
// Both sums split by channel: with S1[n,c] = sum over the plane of dy and S2[n,c] = sum of
// dy * x̂, sum_j g_j = sum over the group's c of w[c] S1[n,c], and sum_j g_j x̂_j likewise
// with S2. The parameters' gradients are sums over the batch of the same S1 and S2:
//   dgamma[c] = scale[c] * sum_n S2[n,c],   dbeta[c] = scale[c] * sum_n S1[n,c],
//   dscale[c] = gamma[c] * sum_n S2[n,c] + beta[c] * sum_n S1[n,c]
// (absent parameters: gamma and scale 1, beta 0).
//
// The passes: (1) the group's mean and rstd, by the forward's own statistics kernel
// (groupnorm.cu, Welford), so the backward normalises with the very numbers the forward used;
// (2) one block per (n, g): each channel's S1 and S2 (block sums, kept for (3)), then the
// group's two sums and dx for every element of the group; (3) one thread per channel adds
// S1 and S2 over the batch in order and writes the parameters' gradients. No atomics: every
// sum has a fixed order, so the gradients are the same bits at every run.
//
// Element types: float, fp16 and bf16 (element.cuh): statistics and sums in float, dx and the
// parameters' gradients rounded to the type once.
//
// Versions, one idea each (one version here):
//   v1 block_per_group  the three passes above; x is read three times (statistics, sums, dx)
//                       and dy twice

#include "common.cuh"
#include "launchers.h"

namespace scratchops {
namespace {

constexpr int kGroupThreads = 512;
constexpr int kParamThreads = 128;

template <class T>
struct Params {
    const T* gamma;  // nullptr: 1
    const T* beta;   // nullptr: 0
    const T* scale;  // nullptr: 1
    __device__ float weight(int c) const {  // w[c] = gamma[c] * scale[c]
        return value_or(gamma, c, true, 1.0f) * value_or(scale, c, true, 1.0f);
    }
};

// Block (n, g) = blockIdx.x: the group's channels c = g*Cg .. g*Cg + Cg - 1 are the planes
// blockIdx.x * Cg + k (k < Cg) of the (N*C, S) layout, which are contiguous. Writes
// sums[2 * (n*C + c)] = S1, sums[2 * (n*C + c) + 1] = S2, and dx for the group.
template <class T>
__global__ void __launch_bounds__(kGroupThreads)
    group_norm_backward_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                               const float* __restrict__ stats, Params<T> p, T* __restrict__ dx,
                               float* __restrict__ sums, int channels, int plane_size,
                               int channels_per_group) {
    const int groups = channels / channels_per_group;
    const int group = blockIdx.x;                           // n * G + g
    const int first_channel = (group % groups) * channels_per_group;
    const int first_plane = group * channels_per_group;     // n * C + first_channel
    const float mean = stats[2 * group], rstd = stats[2 * group + 1];
    float sum_g = 0.0f, sum_g_xhat = 0.0f;  // sum_j g_j and sum_j g_j x̂_j (every thread)
    for (int k = 0; k < channels_per_group; ++k) {
        const int offset = (first_plane + k) * plane_size;  // < numel < 2^31
        Sums s = {0.0f, 0.0f};
        for (int i = threadIdx.x; i < plane_size; i += kGroupThreads) {
            const float d = to_float(dy[offset + i]);
            s.a += d;
            s.b += d * ((to_float(x[offset + i]) - mean) * rstd);
        }
        s = block_sum<kGroupThreads>(s);
        if (threadIdx.x == 0) {
            sums[2 * (first_plane + k)] = s.a;
            sums[2 * (first_plane + k) + 1] = s.b;
        }
        const float w = p.weight(first_channel + k);
        sum_g += w * s.a;
        sum_g_xhat += w * s.b;
    }
    const float inv_m = 1.0f / (static_cast<float>(channels_per_group) * plane_size);
    for (int k = 0; k < channels_per_group; ++k) {
        const int offset = (first_plane + k) * plane_size;
        const float w = p.weight(first_channel + k);
        for (int i = threadIdx.x; i < plane_size; i += kGroupThreads) {
            const float xhat = (to_float(x[offset + i]) - mean) * rstd;
            const float g = to_float(dy[offset + i]) * w;
            dx[offset + i] = from_float<T>(rstd * (g - (sum_g + xhat * sum_g_xhat) * inv_m));
        }
    }
}

// Channel c = blockIdx.x * 128 + threadIdx.x: S1 and S2 summed over n = 0 .. batch-1 in order.
template <class T>
__global__ void group_norm_param_grads_kernel(const float* __restrict__ sums, Params<T> p,
                                              T* dgamma, T* dbeta, T* dscale, int batch,
                                              int channels) {
    const int c = blockIdx.x * kParamThreads + threadIdx.x;
    if (c >= channels) return;
    float s1 = 0.0f, s2 = 0.0f;
    for (int n = 0; n < batch; ++n) {
        s1 += sums[2 * (n * channels + c)];
        s2 += sums[2 * (n * channels + c) + 1];
    }
    const float scale = value_or(p.scale, c, true, 1.0f);
    if (dgamma != nullptr) dgamma[c] = from_float<T>(scale * s2);
    if (dbeta != nullptr) dbeta[c] = from_float<T>(scale * s1);
    if (dscale != nullptr)
        dscale[c] = from_float<T>(value_or(p.gamma, c, true, 1.0f) * s2 +
                                  value_or(p.beta, c, true, 0.0f) * s1);
}

}  // namespace

long long group_norm_backward_workspace_bytes(int batch, int channels, int groups) {
    return (2LL * batch * groups + 2LL * batch * channels) * static_cast<long long>(sizeof(float));
}

template <class T>
cudaError_t group_norm_backward_launch(const T* dy, const T* x, const T* gamma, const T* beta,
                                       const T* scale, T* dx, T* dgamma, T* dbeta, T* dscale,
                                       void* workspace, int batch, int channels, int plane_size,
                                       int groups, float eps, cudaStream_t stream) {
    float* stats = static_cast<float*>(workspace);  // mean, rstd per (n, g)
    float* sums = stats + 2LL * batch * groups;      // S1, S2 per (n, c)
    const Params<T> p{gamma, beta, scale};
    if (batch > 0) {  // (an empty batch: no dx to write, and parameter gradients of 0)
        cudaError_t err = group_norm_stats_launch(x, stats, batch, channels, plane_size, groups,
                                                  eps, stream);
        if (err != cudaSuccess) return err;
        group_norm_backward_kernel<T><<<batch * groups, kGroupThreads, 0, stream>>>(
            dy, x, stats, p, dx, sums, channels, plane_size, channels / groups);
        err = cudaGetLastError();
        if (err != cudaSuccess) return err;
    }
    if (dgamma == nullptr && dbeta == nullptr && dscale == nullptr) return cudaSuccess;
    group_norm_param_grads_kernel<T><<<(channels + kParamThreads - 1) / kParamThreads,
                                       kParamThreads, 0, stream>>>(sums, p, dgamma, dbeta,
                                                                   dscale, batch, channels);
    return cudaGetLastError();
}

#define X(T)                                                                                   \
    template cudaError_t group_norm_backward_launch<T>(const T*, const T*, const T*, const T*, \
                                                       const T*, T*, T*, T*, T*, void*, int,   \
                                                       int, int, int, float, cudaStream_t);
SCRATCHOPS_FOR_EACH_ELEMENT(X)
#undef X

}  // namespace scratchops
