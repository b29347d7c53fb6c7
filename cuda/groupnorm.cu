// groupnorm.cu — group normalisation (torch.nn.functional.group_norm), optionally followed
// by a per-channel scale in the same pass (P85's GroupNorm -> x * scale).
//
// y[n,c,s] = ((x[n,c,s] - mean[n,g]) * rstd[n,g] * gamma[c] + beta[c]) * scale[c],
// g = c / (C/G), with mean and the biased variance taken over the (C/G)*S elements of group g
// of sample n, which are contiguous in NCHW memory. Statistics are per sample, never across
// the batch.
//
// Element types: float, fp16 and bf16 for x, y, gamma, beta and scale (element.cuh). The
// arithmetic is in float whatever the type: every value is widened as it is read, the
// statistics (the `stats` workspace, sums, Welford states) are float throughout, and each
// output is rounded to the element type once, as it is stored.
//
// Versions, one idea each (they differ in the statistics, then apply them the same way):
//   v1 two_pass  the mean in one read of the group, the variance of the deviations in another
//   v2 welford   (default) mean and variance together in one read (Welford's update)
//
// How each works:
//   v1 two_pass  One block per (n, g) reads its group to sum it: the mean. A second read sums
//                the squared deviations from that mean: the variance, computed without the
//                cancellation of E[x^2] - E[x]^2, which loses the variance's digits in fp32
//                when |mean| >> std. The same read sums the deviations themselves, 0 in exact
//                arithmetic; what they sum to instead is the mean's rounding error, which
//                corrects the mean and the variance (the corrected two-pass algorithm of
//                Chan, Golub and LeVeque). x is read three times: mean, variance, apply.
//   v2 welford   Mean and variance in one read: each thread keeps a Welford state
//                (count, mean, M2) over its elements, also free of that cancellation; the
//                states are merged with Chan's formula across the warp (shuffles) and then
//                across the warps (shared memory). Four elements per load when aligned
//                (16 bytes for float, 8 for the half types). x is read twice: statistics,
//                apply.
// Apply (both): one block per plane (n, c) folds mean, rstd, gamma, beta and scale into two
// constants and streams the plane, four elements per access: y = (x - mean) * a + b,
// a = rstd*gamma*scale, b = beta*scale. (x - mean first, not x*a + (b - mean*a), keeps the
// cancellation exact when |mean| >> std.)

#include "common.cuh"
#include "launchers.h"

namespace scratchops {
namespace {

constexpr int kStatsThreads = 512;
constexpr int kWarps = kStatsThreads / 32;

// ---------------------------------------------------------------------- v1: two passes
// (Sums and block_sum: common.cuh.)

// Pass 1: block (n, g) = blockIdx.x sums x[blockIdx.x * group_size, +group_size) and writes
// stats[2*blockIdx.x] = its mean.
template <class T>
__global__ void __launch_bounds__(kStatsThreads)
    group_mean_kernel(const T* __restrict__ x, float* __restrict__ stats, int group_size) {
    const T* group = x + blockIdx.x * group_size;  // < numel < 2^31
    Sums s = {0.0f, 0.0f};
    for (int i = threadIdx.x; i < group_size; i += kStatsThreads) s.a += to_float(group[i]);
    s = block_sum<kStatsThreads>(s);
    if (threadIdx.x == 0) stats[2 * blockIdx.x] = s.a / static_cast<float>(group_size);
}

// Pass 2: with d = x - mean (pass 1's mean), the sums of d^2 and of d. The exact mean is
// mean + sum(d)/n and the sum of squared deviations from it sum(d^2) - sum(d)^2/n. Writes the
// corrected mean and stats[2*blockIdx.x + 1] = 1/sqrt(var + eps).
template <class T>
__global__ void __launch_bounds__(kStatsThreads)
    group_variance_kernel(const T* __restrict__ x, float* __restrict__ stats, int group_size,
                          float eps) {
    const T* group = x + blockIdx.x * group_size;
    const float mean = stats[2 * blockIdx.x];  // (read by every thread before thread 0 writes)
    Sums s = {0.0f, 0.0f};
    for (int i = threadIdx.x; i < group_size; i += kStatsThreads) {
        const float d = to_float(group[i]) - mean;
        s.a += d * d;
        s.b += d;
    }
    s = block_sum<kStatsThreads>(s);
    if (threadIdx.x == 0) {
        const float n = static_cast<float>(group_size), correction = s.b / n;
        const float variance = fmaxf((s.a - s.b * correction) / n, 0.0f);  // biased, as torch
        stats[2 * blockIdx.x] = mean + correction;
        stats[2 * blockIdx.x + 1] = 1.0f / sqrtf(variance + eps);
    }
}

// ------------------------------------------------------------------------- v2: Welford
// (Moments, add_value (Welford's update) and merged (Chan's merge): common.cuh.)

// Block (n, g) = blockIdx.x reads x[blockIdx.x * group_size, +group_size) and writes
// stats[2*blockIdx.x] = mean, stats[2*blockIdx.x + 1] = 1/sqrt(var + eps).
template <class T>
__global__ void __launch_bounds__(kStatsThreads)
    group_stats_kernel(const T* __restrict__ x, float* __restrict__ stats, int group_size,
                       bool vectorized, float eps) {
    const T* group = x + blockIdx.x * group_size;  // < numel < 2^31
    Moments w = {0.0f, 0.0f, 0.0f};
    if (vectorized) {  // group_size % 4 == 0 and x vector_aligned<T>
        const auto* group4 = reinterpret_cast<const FourElements<T>*>(group);
        for (int i = threadIdx.x; i < group_size / 4; i += kStatsThreads) {
            const float4 v = load4(group4[i].e);
            add_value(w, v.x);
            add_value(w, v.y);
            add_value(w, v.z);
            add_value(w, v.w);
        }
    } else {
        for (int i = threadIdx.x; i < group_size; i += kStatsThreads)
            add_value(w, to_float(group[i]));
    }

    __shared__ Moments warp_states[kWarps];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    w = warp_xor_reduce<1, 32>(w, Merge<>{});
    if (lane == 0) warp_states[warp] = w;
    __syncthreads();
    if (warp == 0) {
        w = lane < kWarps ? warp_states[lane] : Moments{0.0f, 0.0f, 0.0f};
        w = warp_xor_reduce<1, 32>(w, Merge<>{});
        if (lane == 0) {
            const float variance = fmaxf(w.m2 / w.count, 0.0f);  // biased, as torch
            stats[2 * blockIdx.x] = w.mean;
            stats[2 * blockIdx.x + 1] = 1.0f / sqrtf(variance + eps);
        }
    }
}

// Apply: per plane (n, c), y = (x - mean) * a + b (see the top of the file).
template <class T>
struct GroupNormApply {
    const float* stats;
    const T* gamma;  // nullptr: 1
    const T* beta;   // nullptr: 0
    const T* scale;  // nullptr: 1
    int groups, channels_per_group;

    // In float the scale folds into a and b. The half types round the group norm's result to T
    // before the scale multiplies it, as torch's group_norm(x) * scale does (element.cuh:
    // rounded), so their scale stays apart.
    struct Constants {
        float mean, a, b, scale;
    };
    __device__ Constants prepare(int n, int c) const {
        const int group = n * groups + c / channels_per_group;
        const float mean = stats[2 * group], rstd = stats[2 * group + 1];
        const float s = scale != nullptr ? to_float(scale[c]) : 1.0f;
        const float g = gamma != nullptr ? to_float(gamma[c]) : 1.0f;
        const float b = beta != nullptr ? to_float(beta[c]) : 0.0f;
        if (is_half_type<T>()) return {mean, rstd * g, b, s};
        return {mean, rstd * g * s, b * s, 1.0f};
    }
    __device__ float apply(float v, const Constants& k) const {
        if (is_half_type<T>()) return rounded<T>((v - k.mean) * k.a + k.b) * k.scale;
        return (v - k.mean) * k.a + k.b;
    }
};

// The statistics of the `blocks` = batch * groups groups into stats (mean, 1/std each).
template <class T>
cudaError_t launch_v1_two_pass(const T* x, float* stats, int blocks, int group_size, float eps,
                               cudaStream_t stream) {
    group_mean_kernel<T><<<blocks, kStatsThreads, 0, stream>>>(x, stats, group_size);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    group_variance_kernel<T><<<blocks, kStatsThreads, 0, stream>>>(x, stats, group_size, eps);
    return cudaGetLastError();
}

template <class T>
cudaError_t launch_v2_welford(const T* x, float* stats, int blocks, int group_size, float eps,
                              cudaStream_t stream) {
    const bool vectorized = group_size % 4 == 0 && vector_aligned<T>(x);
    group_stats_kernel<T><<<blocks, kStatsThreads, 0, stream>>>(x, stats, group_size,
                                                                vectorized, eps);
    return cudaGetLastError();
}

}  // namespace

template <class T>
cudaError_t group_norm_launch(int version, const T* x, T* y, const T* gamma, const T* beta,
                              const T* scale, float* stats, int batch, int channels,
                              int plane_size, int groups, float eps, cudaStream_t stream) {
    const int channels_per_group = channels / groups;
    const int group_size = channels_per_group * plane_size;
    cudaError_t err = cudaErrorInvalidValue;  // an unknown version
    if (version == 1) err = launch_v1_two_pass(x, stats, batch * groups, group_size, eps, stream);
    if (version == 2) err = launch_v2_welford(x, stats, batch * groups, group_size, eps, stream);
    if (err != cudaSuccess) return err;
    const GroupNormApply<T> op{stats, gamma, beta, scale, groups, channels_per_group};
    return launch_per_plane(x, y, batch, channels, plane_size, op, stream);
}

template <class T>
cudaError_t group_norm_stats_launch(const T* x, float* stats, int batch, int channels,
                                    int plane_size, int groups, float eps, cudaStream_t stream) {
    return launch_v2_welford(x, stats, batch * groups, channels / groups * plane_size, eps,
                             stream);
}

#define X(T)                                                                                   \
    template cudaError_t group_norm_stats_launch<T>(const T*, float*, int, int, int, int, float, \
                                                    cudaStream_t);                             \
    template cudaError_t group_norm_launch<T>(int, const T*, T*, const T*, const T*, const T*, \
                                              float*, int, int, int, int, float, cudaStream_t);
SCRATCHOPS_FOR_EACH_ELEMENT(X)
#undef X

}  // namespace scratchops
