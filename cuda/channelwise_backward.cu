// channelwise_backward.cu — the gradients of the per-channel operators (channelwise.cu) and
// the per-channel sums every bias-like gradient is made of.
//
//   channel_sums:          out[c] = factor * sum over n, s of a[n][c][s] * b[n][c][s]
//                          (b absent: of a alone). The gradient of a per-channel bias added to
//                          y is the sum of dy over the batch and the plane (b absent); that of a
//                          per-channel scale multiplying x is the sum of dy * x.
//   min_add_mul_backward:  the input gradient of y = (min(x, constant) + bias[c]) * factor:
//                          dx = dy * factor where x < constant, half of it where x equals the
//                          constant, 0 where x > constant; NaN's x passes it whole. That is
//                          torch.minimum's rule (a tie splits the gradient between the two
//                          sides), which P31's torch.min(x, tensor(constant)) follows.
// scale's input gradient is scale itself (dx = dy * scale[c]: channelwise.cu's scale_launch).
//
// Element types: float, fp16 and bf16 (element.cuh). In the half types torch computes dy *
// factor in the type (mul's gradient) before the min's rule halves or masks it; so does
// min_add_mul_backward (element.cuh: rounded). The sums are float (double inside each thread,
// below).
//
// Versions, one idea each:
//   channel_sums v1 per_channel  one block per channel walks the batch's planes of it; each
//                                thread keeps a double sum of its elements (a thread adds up to
//                                N*S/256 terms: 8,000 for P31's bias, where a float sum would
//                                lose about 2^-24 * 8,000 of it), then the block adds the
//                                threads' sums (common.cuh: block_sum) in a fixed order. One
//                                block a channel is one a multiprocessor or fewer (P31: 128,
//                                P85: 64, on 132): too few loads in flight, 1.7 TB/s
//   channel_sums v2 split        v1's blocks for ranges of images, kSumBlocks blocks in all
//                                (the number of ranges depends on the shape only, so the sums'
//                                order does not change with the GPU), each writing its partial
//                                sum; then one thread a channel adds its partials in range
//                                order, in double
//   min_add_mul_backward v1     one thread per element, the share found from x
//   min_add_mul_backward v2     the share read from the byte the forward kept, and the
//                               per-channel sums of dy and dx in the same pass, in
//                               channel_sums v2's order (min_add_mul_backward_kept_launch:
//                               P31's backward without its convolution computed again, and
//                               three passes over the output's gradient made one)
//   min_add_mul_backward v3     each thread issues the loads of kLoadsInFlight of its elements
//   in batches                  before it uses any (walk_plane): v2's loop, unrolled by 4 and
//                               with stores between its loads, kept 2 to 4 in flight (SASS) and
//                               ran P31's pass at 2.0 TB/s. The elements and the order of
//                               every sum stay v2's, so the bits do too (channel_sums' loop,
//                               with no store, the compiler unrolls with about a dozen loads
//                               ahead by itself)
//   min_add_mul_backward v4     v2 written channels-last, conv2d's gradients' copy of dy made
//   channels-last               by the same pass: min_add_mul_backward_channels_last.cu

#include "common.cuh"
#include "launchers.h"

namespace scratchops {
namespace {

constexpr int kSumThreads = 256;
constexpr int kElementThreads = 256;

// Blocks of the first pass of channel_sums v2, about: enough to keep every multiprocessor of a
// large GPU busy several times over (132 on an H200).
constexpr int kSumBlocks = 512;
// min_add_mul_backward v3: the loads of T a thread has in flight (walk_plane). At a
// microsecond of load latency one SM's share of HBM's bandwidth needs about 32 KB in flight:
// 8 loads x 4 bytes x the 1,000 threads of about 4 of the 512 blocks. Measured on P31's pass
// (H200, docs/notes.md), 16 did better in float (0.870 -> 0.799 ms; 73 registers, 3 blocks an
// SM) and worse in bf16 (0.604 -> 0.667), so float has 16 and the 16-bit types 8.
template <class T>
constexpr int kLoadsInFlight = sizeof(T) == 4 ? 16 : 8;

// Thread t's elements of a plane, s = t, t + kSumThreads, ...: load(s) for kLoads of them,
// then use(s, value) for each in the same order; so the loads of a batch are in flight
// together, and whatever use() adds up is added in the order of a plain loop over s.
template <int kLoads, class Load, class Use>
__device__ __forceinline__ void walk_plane(int plane_size, Load load, Use use) {
    using Value = decltype(load(0));
    for (int first = threadIdx.x; first < plane_size; first += kSumThreads * kLoads) {
        Value values[kLoads];
#pragma unroll
        for (int u = 0; u < kLoads; ++u) {
            const int s = first + u * kSumThreads;
            if (s < plane_size) values[u] = load(s);
        }
#pragma unroll
        for (int u = 0; u < kLoads; ++u) {
            const int s = first + u * kSumThreads;
            if (s < plane_size) use(s, values[u]);
        }
    }
}

// Block (c, r) = (blockIdx.x, blockIdx.y): planes (n, c) for the images n of range r,
// [r * images, min(batch, (r + 1) * images)), each plane_size long; thread t takes elements
// t, t + 256, ... of each. partial[c * ranges + r] = the block's sum (without factor).
// Offsets (n*C + c)*S + s < numel < 2^31.
template <class T>
__global__ void __launch_bounds__(kSumThreads)
    channel_sums_kernel(const T* __restrict__ a, const T* __restrict__ b,
                        float* __restrict__ partial, int batch, int channels, int plane_size,
                        int images) {
    const int c = blockIdx.x, r = blockIdx.y;
    const int n_end = (r + 1) * images < batch ? (r + 1) * images : batch;
    double sum = 0.0;
    for (int n = r * images; n < n_end; ++n) {
        const int plane = (n * channels + c) * plane_size;
        for (int s = threadIdx.x; s < plane_size; s += kSumThreads) {
            const float v = to_float(a[plane + s]);
            sum += b != nullptr ? static_cast<double>(v) * to_float(b[plane + s]) : v;
        }
    }
    const Sums total = block_sum<kSumThreads>({static_cast<float>(sum), 0.0f});
    if (threadIdx.x == 0) partial[c * gridDim.y + r] = total.a;
}

// out[c] = factor * (partial[c][0] + partial[c][1] + ...), in that order.
template <class T>
__global__ void channel_sums_finish_kernel(const float* __restrict__ partial, float factor,
                                           T* __restrict__ out, int channels, int ranges) {
    const unsigned c = blockIdx.x * kSumThreads + threadIdx.x;
    if (c >= static_cast<unsigned>(channels)) return;
    double sum = 0.0;
    for (int r = 0; r < ranges; ++r) sum += partial[c * ranges + r];
    out[c] = from_float<T>(factor * static_cast<float>(sum));
}

// channel_sums v2's ranges of images: kSumBlocks blocks over the channels, at most one range
// an image, at least one.
struct SumRanges {
    int ranges, images;  // ranges, and images a range
};
SumRanges sum_ranges(int batch, int channels) {
    int ranges = channels > 0 ? kSumBlocks / channels : 1;
    ranges = ranges < batch ? ranges : batch;
    ranges = ranges > 1 ? ranges : 1;
    const int images = (batch + ranges - 1) / ranges;
    return {images > 0 ? (batch + images - 1) / images : 1, images};
}

template <class T>
__global__ void min_add_mul_backward_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                            T* __restrict__ dx, int n, float constant,
                                            float factor) {
    const unsigned index = blockIdx.x * kElementThreads + threadIdx.x;
    if (index >= static_cast<unsigned>(n)) return;
    const int i = static_cast<int>(index);
    const float c = rounded<T>(constant);  // the forward's min compares in T
    dx[i] = min_rule_from_halves<T>(to_float(dy[i]), factor,
                                    min_gradient_halves(to_float(x[i]), c));
}

// v2: the shares the forward kept (in halves: its store computed min_gradient_halves of the
// same rounded values v1 reads from x), so x need not exist; and both bias gradients on the
// way. Laid out as channel_sums v2: block (c, r) walks planes (n, c) of range r's images,
// thread t elements t, t + 256, ... of each, so that its double sums of dy (the bias's
// gradient, before the factor) and of the dx it writes (the conv bias's) are added in
// channel_sums_kernel's order: the same bits as channel_sums of dy and of dx.
template <class T>
__global__ void __launch_bounds__(kSumThreads)
    min_add_mul_backward_kept_kernel(const T* __restrict__ dy, const uint8_t* __restrict__ halves,
                                     T* __restrict__ dx, float* __restrict__ dy_partial,
                                     float* __restrict__ dx_partial, int batch, int channels,
                                     int plane_size, int images, float factor) {
    const int c = blockIdx.x, r = blockIdx.y;
    const int n_end = (r + 1) * images < batch ? (r + 1) * images : batch;
    double dy_sum = 0.0, dx_sum = 0.0;
    for (int n = r * images; n < n_end; ++n) {
        const int plane = (n * channels + c) * plane_size;
        struct Loaded {
            float g;
            int halves;
        };
        walk_plane<kLoadsInFlight<T>>(
            plane_size,
            [&](int s) { return Loaded{to_float(dy[plane + s]), halves[plane + s]}; },
            [&](int s, Loaded v) {
                const T d = min_rule_from_halves<T>(v.g, factor, v.halves);
                dx[plane + s] = d;
                dy_sum += v.g;
                dx_sum += to_float(d);
            });
    }
    const Sums total = block_sum<kSumThreads>({static_cast<float>(dy_sum),
                                               static_cast<float>(dx_sum)});
    if (threadIdx.x == 0) {
        dy_partial[c * gridDim.y + r] = total.a;
        dx_partial[c * gridDim.y + r] = total.b;
    }
}

}  // namespace

long long channel_sums_workspace_bytes(int batch, int channels) {
    return static_cast<long long>(channels) * sum_ranges(batch, channels).ranges * sizeof(float);
}

template <class T>
cudaError_t channel_sums_launch(const T* a, const T* b, float factor, T* out, int batch,
                                int channels, int plane_size, float* workspace,
                                cudaStream_t stream) {
    if (channels <= 0) return cudaSuccess;
    const SumRanges r = sum_ranges(batch, channels);
    channel_sums_kernel<T><<<dim3(channels, r.ranges), kSumThreads, 0, stream>>>(
        a, b, workspace, batch, channels, plane_size, r.images);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    channel_sums_finish_kernel<T><<<(channels + kSumThreads - 1) / kSumThreads, kSumThreads, 0,
                                    stream>>>(workspace, factor, out, channels, r.ranges);
    return cudaGetLastError();
}

template <class T>
cudaError_t min_add_mul_backward_launch(const T* dy, const T* x, T* dx, int n, float constant,
                                        float factor, cudaStream_t stream) {
    const int blocks = static_cast<int>((static_cast<long long>(n) + kElementThreads - 1) /
                                        kElementThreads);
    min_add_mul_backward_kernel<T><<<blocks, kElementThreads, 0, stream>>>(dy, x, dx, n,
                                                                           constant, factor);
    return cudaGetLastError();
}

template <class T>
cudaError_t min_add_mul_backward_kept_launch(const T* dy, const uint8_t* halves, T* dx,
                                             T* bias_grad, T* conv_bias_grad, int batch,
                                             int channels, int plane_size, float factor,
                                             float* workspace, cudaStream_t stream) {
    if (channels <= 0) return cudaSuccess;
    const SumRanges r = sum_ranges(batch, channels);
    float* dx_partial = workspace + static_cast<long long>(channels) * r.ranges;
    min_add_mul_backward_kept_kernel<T><<<dim3(channels, r.ranges), kSumThreads, 0, stream>>>(
        dy, halves, dx, workspace, dx_partial, batch, channels, plane_size, r.images, factor);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    const int blocks = (channels + kSumThreads - 1) / kSumThreads;
    channel_sums_finish_kernel<T><<<blocks, kSumThreads, 0, stream>>>(workspace, factor,
                                                                      bias_grad, channels,
                                                                      r.ranges);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    channel_sums_finish_kernel<T><<<blocks, kSumThreads, 0, stream>>>(dx_partial, 1.0f,
                                                                      conv_bias_grad, channels,
                                                                      r.ranges);
    return cudaGetLastError();
}

#define X(T)                                                                                   \
    template cudaError_t channel_sums_launch<T>(const T*, const T*, float, T*, int, int, int,  \
                                                float*, cudaStream_t);                         \
    template cudaError_t min_add_mul_backward_launch<T>(const T*, const T*, T*, int, float,    \
                                                        float, cudaStream_t);                  \
    template cudaError_t min_add_mul_backward_kept_launch<T>(                                 \
        const T*, const uint8_t*, T*, T*, T*, int, int, int, float, float*, cudaStream_t);
SCRATCHOPS_FOR_EACH_ELEMENT(X)
#undef X

}  // namespace scratchops
