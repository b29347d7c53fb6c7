// common.cuh — small device helpers shared by the kernel files: limits, NaN-propagating
// extremes, warp reductions and the moments of a set of values.
#pragma once

#include <atomic>
#include <cstdint>
#include <math.h>
#include <utility>

#include <cuda_runtime.h>

#include "element.cuh"

namespace scratchops {

// ------------------------------------------------------------------------------ limits
// gridDim.y and gridDim.z are at most 65535: launchers split larger counts into pieces.
constexpr int kMaxGridYZ = 65535;
// The most elements a buffer indexed with 32-bit offsets holds, and the most blocks of a
// grid's x dimension (launchers.h: each buffer has fewer than 2^31 elements).
constexpr long long kMaxInt32Count = 0x7fffffffLL;
// Bytes rounded up to a multiple of 16: each piece of a workspace starts 16-byte aligned (the
// tensor cores' packing and the vector loads and stores move 16 bytes at a time).
constexpr long long align16(long long bytes) { return (bytes + 15) / 16 * 16; }

// Maximum and minimum that return NaN when either side is NaN, as torch.maximum,
// torch.minimum, torch.clamp and max_pool2d do (fmaxf/fminf would drop the NaN). sm_80 has
// them as single instructions (max.NaN / min.NaN); the comparisons and a select otherwise.
__device__ __forceinline__ float nan_max(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
#else
    return (a != a || b != b) ? __int_as_float(0x7fc00000) : fmaxf(a, b);
#endif
}
__device__ __forceinline__ float nan_min(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    float r;
    asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
#else
    return (a != a || b != b) ? __int_as_float(0x7fc00000) : fminf(a, b);
#endif
}

// torch.minimum's gradient rule for min(v, c), as the input v's share of the output's gradient,
// in halves: 2 (all of it) where v < c, 1 where v == c (a tie splits the gradient between the
// two sides), 0 where v > c; a NaN v takes it all (neither comparison holds). One byte a value
// is what P31's forward keeps for its backward (ConvTail::halves, launchers.h).
__host__ __device__ __forceinline__ uint8_t min_gradient_halves(float v, float c) {
    return v > c ? 0 : v == c ? 1 : 2;
}
// The min's gradient from a value's share in halves: dy * factor, rounded to T as torch's
// operator in T leaves it, times halves / 2 (0, a half or all of it; exact but where a half
// is subnormal): what every form of the rule writes
// (channelwise_backward.cu, min_add_mul_backward_channels_last.cu) and what the weight
// gradient's packing computes in their place (conv_weight_grad_implicit.cuh's DyColumns).
template <class T>
__device__ __forceinline__ T min_rule_from_halves(float dy, float factor, uint32_t halves) {
    return from_float<T>(rounded<T>(dy * factor) * (0.5f * static_cast<float>(halves)));
}
// The same rule on a pair of 16-bit values (__half2, __nv_bfloat162) against a pair of limits,
// as two bytes (the low value's in the low byte): 2 - 2 (v > c) - (v == c) each, from the paired
// compares' masks (0xffff a true half; a NaN compares false, as above).
template <class V>
__device__ __forceinline__ uint16_t min_gradient_halves_pair(V v, V c) {
    const uint32_t greater = __hgt2_mask(v, c) & 0x00010001u;  // bit 0: low value, 16: high
    const uint32_t equal = __heq2_mask(v, c) & 0x00010001u;
    const uint32_t g = (greater | (greater >> 8)) & 0x0101u;  // bit 16 -> bit 8: byte 1
    const uint32_t e = (equal | (equal >> 8)) & 0x0101u;
    return static_cast<uint16_t>(0x0202u - 2 * g - e);
}

// A warpgroup: four consecutive warps, the unit a wgmma works in; the tensor-core kernels lay
// their threads out in warpgroups on every engine.
constexpr int kWarpgroupThreads = 128;

// ------------------------------------------------------------------- warp reductions
// A butterfly over a warp's lanes: for d = kFirst, 2 kFirst, ... < kEnd (powers of two),
// each lane combines its value with that of lane (lane xor d). Each lane ends with the
// combination over the lanes that differ from it only in those bits of the lane index:
// <1, 32> is the whole warp; <4, 32> the 8 lanes that share lane % 4 (an mma.sync fragment's
// column); <8, 32> the 4 lanes that share lane % 8. All 32 lanes must take part.
__device__ __forceinline__ float shfl_xor(float v, int d) {
    return __shfl_xor_sync(0xffffffffu, v, d);
}
template <int kFirst, int kEnd, class T, class Combine>
__device__ __forceinline__ T warp_xor_reduce(T value, Combine combine) {
#pragma unroll
    for (int d = kFirst; d < kEnd; d *= 2) value = combine(value, shfl_xor(value, d));
    return value;
}
struct Sum {
    __device__ float operator()(float a, float b) const { return a + b; }
};
struct NanMax {
    __device__ float operator()(float a, float b) const { return nan_max(a, b); }
};

// Two sums reduced together (a statistic and its companion: sum and sum of squares, or the
// sums of dy and dy * x of a backward).
struct Sums {
    float a, b;
};
__device__ __forceinline__ Sums warp_sum(Sums v) {  // every lane ends with the warp's sums
    return {warp_xor_reduce<1, 32>(v.a, Sum{}), warp_xor_reduce<1, 32>(v.b, Sum{})};
}
// The sums of v over a block of kThreads threads (a multiple of 32, at most 1024), returned to
// every thread: across each warp, then across the warps. The order of the additions depends
// only on the thread layout, so a result is the same bits at every run. Every thread of the
// block must call it; it may be called again right after (the barrier on entry keeps a call's
// partial sums from overwriting those the previous call is still reading).
template <int kThreads>
__device__ __forceinline__ Sums block_sum(Sums v) {
    constexpr int kWarpCount = kThreads / 32;
    __shared__ Sums warp_sums[kWarpCount];
    v = warp_sum(v);
    __syncthreads();
    if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
    __syncthreads();
    const int lane = threadIdx.x % 32;
    return warp_sum(lane < kWarpCount ? warp_sums[lane] : Sums{0.0f, 0.0f});
}

// Whether clamp(v, lo, hi) passes v's gradient, as torch's clamp backward decides: where
// lo <= v <= hi (a value at a bound included; NaN never). An infinite bound stands for no bound
// (scratchops' clamp takes an absent bound as -inf / +inf), so max_pool2d, a clamp to
// (-inf, +inf), passes every gradient, NaN's included, as torch's max_pool2d does.
__device__ __forceinline__ bool clamp_passes_gradient(float v, float lo, float hi) {
    return (lo == -INFINITY || v >= lo) && (hi == INFINITY || v <= hi);
}

// P85's group norm and scale of one conv output v, as its one pass maps a window's extreme
// and its backward maps every output again: the group norm's result rounded to T before the
// scale multiplies it (torch's group_norm(x) * scale, element.cuh), in float. One expression,
// so that the two compute the same bits.
__device__ __forceinline__ float normed_unrounded(float v, float mean, float rstd, float gamma,
                                                  float beta) {
    return (v - mean) * rstd * gamma + beta;
}
template <class T>
__device__ __forceinline__ float normed(float v, float mean, float rstd, float gamma, float beta) {
    return rounded<T>(normed_unrounded(v, mean, rstd, gamma, beta));
}
template <class T>
__device__ __forceinline__ float normed_scaled(float v, float mean, float rstd, float gamma,
                                               float beta, float scale) {
    return normed<T>(v, mean, rstd, gamma, beta) * scale;
}
// rounded<T>(normed_scaled<T>(v)) of two values, as the forward's output holds them before
// its clamp; in 16 bits a pair an instruction: the normed pair rounded by one cvt, then one
// multiply of pairs. Its one rounding gives the bits of rounding the float product: that
// product of two values of T is exact, except below float's normal range (bf16), where its
// at most 16 significant bits leave the two roundings no tie to split differently.
template <class T>
__device__ __forceinline__ float2 normed_scaled_rounded_pair(float v0, float v1, float mean,
                                                             float rstd, float gamma, float beta,
                                                             float scale) {
    if constexpr (is_half_type<T>()) {
        using Ops = PairOf<T>;
        const auto normed_pair = Ops::rounded_pair(normed_unrounded(v0, mean, rstd, gamma, beta),
                                                   normed_unrounded(v1, mean, rstd, gamma, beta));
        return Ops::widened(__hmul2_rn(normed_pair, Ops::rounded_pair(scale, scale)));
    } else {
        return make_float2(rounded<T>(normed_scaled<T>(v0, mean, rstd, gamma, beta, scale)),
                           rounded<T>(normed_scaled<T>(v1, mean, rstd, gamma, beta, scale)));
    }
}

// ----------------------------------------------------------------------------- moments
// Count, mean and centred sum of squares (m2) of a set of values: what group norm's
// statistics are made of, merged without the cancellation of sum-of-squares formulas.
struct Moments {
    float count, mean, m2;
};
// Welford: the moments after one more value v.
__device__ __forceinline__ void add_value(Moments& m, float v) {
    m.count += 1.0f;
    const float delta = v - m.mean;
    m.mean += delta / m.count;
    m.m2 += delta * (v - m.mean);
}
// Chan et al.: the moments of the union of two disjoint sets a and b, exact in the mean's
// centring (no cancellation when |mean| >> std). kEqualCounts: a and b hold as many values
// (whole pooling windows, say), so b's share of the union is 1/2 exactly, with no division.
template <bool kEqualCounts = false>
__device__ __forceinline__ Moments merged(const Moments& a, const Moments& b) {
    if (!kEqualCounts && b.count == 0.0f) return a;
    const float total = a.count + b.count;
    const float delta = b.mean - a.mean;
    const float share = kEqualCounts ? 0.5f : b.count / total;
    return {total, a.mean + delta * share, a.m2 + (b.m2 + delta * delta * a.count * share)};
}
__device__ __forceinline__ Moments shfl_xor(const Moments& m, int d) {
    return {shfl_xor(m.count, d), shfl_xor(m.mean, d), shfl_xor(m.m2, d)};
}
template <bool kEqualCounts = false>
struct Merge {
    __device__ Moments operator()(const Moments& a, const Moments& b) const {
        return merged<kEqualCounts>(a, b);
    }
};

// Per-plane kernel: for every plane (n, c) of an (N, C, S) tensor of T (S = the product of
// the spatial sizes), one block computes the plane's constants once with op.prepare(n, c) and
// then writes y[i] = op.apply(x[i], constants) for every element i of the plane. op works in
// float (apply(float, constants) -> float): x[i] is widened as it is read and the result
// rounded to T once, as it is stored (element.cuh). Four elements per access (load4/store4)
// when `vectorized` (S % 4 == 0 and both pointers vector_aligned<T>, so every plane starts
// on such a boundary). Grid: one block per plane (N*C < 2^31).
template <class T, typename Op>
__global__ void per_plane_kernel(const T* __restrict__ x, T* __restrict__ y, int channels,
                                 int plane_size, bool vectorized, Op op) {
    const int plane = blockIdx.x;  // = n * channels + c
    const auto constants = op.prepare(plane / channels, plane % channels);
    const int offset = plane * plane_size;  // < N*C*S < 2^31
    if (vectorized) {
        const auto* x4 = reinterpret_cast<const FourElements<T>*>(x + offset);
        auto* y4 = reinterpret_cast<FourElements<T>*>(y + offset);
        for (int i = threadIdx.x; i < plane_size / 4; i += blockDim.x) {
            float4 v = load4(x4[i].e);
            v.x = op.apply(v.x, constants);
            v.y = op.apply(v.y, constants);
            v.z = op.apply(v.z, constants);
            v.w = op.apply(v.w, constants);
            store4(y4[i].e, v);
        }
    } else {
        for (int i = threadIdx.x; i < plane_size; i += blockDim.x)
            y[offset + i] = from_float<T>(op.apply(to_float(x[offset + i]), constants));
    }
}

constexpr int kPerPlaneThreads = 256;

template <class T, typename Op>
cudaError_t launch_per_plane(const T* x, T* y, int batch, int channels, int plane_size, Op op,
                             cudaStream_t stream) {
    const int planes = batch * channels;
    const bool vectorized = plane_size % 4 == 0 && vector_aligned<T>(x) && vector_aligned<T>(y);
    per_plane_kernel<<<planes, kPerPlaneThreads, 0, stream>>>(x, y, channels, plane_size,
                                                              vectorized, op);
    return cudaGetLastError();
}

// --------------------------------------------------------------------- NCHW positions
// Element e of a stack of planes of height x width, in memory order: e = (plane * height +
// row) * width + col. (The backward kernels' one-thread-per-element decode.)
struct PlanePosition {
    int plane, row, col;
};
__device__ __forceinline__ PlanePosition plane_position(int e, int height, int width) {
    return {e / (width * height), (e / width) % height, e % width};
}

// ------------------------------------------------------------------ per-device settings
// Launch-time settings that stay with a kernel or a device (a kernel's dynamic shared-memory
// limit, the number of multiprocessors) are read or made once per device: the runtime calls
// cost host time at every launch otherwise. Devices 0..63 are remembered; others pay the call.
constexpr int kRememberedDevices = 64;

inline int current_device() {
    int device = 0;
    return cudaGetDevice(&device) == cudaSuccess ? device : 0;
}

// set() on the current device unless it succeeded there before: `done` is the caller's
// static (one per kernel), a bit per device.
template <typename Set>
cudaError_t once_per_device(std::atomic<unsigned long long>& done, Set&& set) {
    const int device = current_device();
    const unsigned long long bit = device < kRememberedDevices ? 1ull << device : 0;
    if (bit != 0 && (done.load(std::memory_order_acquire) & bit)) return cudaSuccess;
    const cudaError_t err = set();
    if (err == cudaSuccess) done.fetch_or(bit, std::memory_order_release);
    return err;
}

// A kernel's dynamic shared-memory limit raised to `bytes` (the runtime's default is 48 KB),
// once per device: `done` is the caller's static, one per kernel.
template <class Kernel>
cudaError_t allow_dynamic_smem(std::atomic<unsigned long long>& done, Kernel kernel, int bytes) {
    return once_per_device(done, [&] {
        return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    });
}

// Multiprocessors of the current device (a persistent grid's size).
inline int sm_count() {
    static std::atomic<int> counts[kRememberedDevices];  // 0: not read yet
    const int device = current_device();
    int count = device < kRememberedDevices ? counts[device].load(std::memory_order_relaxed) : 0;
    if (count > 0) return count;
    if (cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
        count <= 0)
        return 1;
    if (device < kRememberedDevices) counts[device].store(count, std::memory_order_relaxed);
    return count;
}

// -------------------------------------------------------------- kernels side by side
// Programmatic dependent launch (sm_90): a kernel launched by launch_beside_previous may start
// once every CTA of the kernel before it on the stream has run let_next_kernel_start (or
// exited), and runs on whatever multiprocessors that kernel leaves free. It must not touch
// what that kernel reads or writes, and it ends with wait_for_previous_kernel, so that its
// completion, which the next kernel on the stream waits for, implies the earlier kernel's
// too. Both instructions exist from sm_90 on, so the caller launches beside only where both
// kernels were built for it (the wgmma engine's kernels: sm_90a).
__device__ __forceinline__ void let_next_kernel_start() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void wait_for_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
template <class... Params, class... Args>
cudaError_t launch_beside_previous(void (*kernel)(Params...), int blocks, int threads,
                                   cudaStream_t stream, Args&&... args) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(blocks);
    config.blockDim = dim3(threads);
    config.stream = stream;
    cudaLaunchAttribute attribute;
    attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute.val.programmaticStreamSerializationAllowed = 1;
    config.attrs = &attribute;
    config.numAttrs = 1;
    return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

// ------------------------------------------------------------------------ fast division
// n / d for 0 <= n < 2^31 and a divisor d >= 1 fixed for a launch, as a multiply-high and a
// shift (Granlund-Montgomery): with l = ceil(log2 d) and m = ceil(2^(32+l) / d) - 2^32,
// n / d = (umulhi(m, n) + n) >> l. Set up on the host, where dividing is cheap.
struct FastDiv {
    uint32_t divisor, multiplier, shift;
    FastDiv() = default;
    explicit FastDiv(uint32_t d) : divisor(d), multiplier(0), shift(0) {
        while ((1ull << shift) < d) ++shift;
        multiplier = static_cast<uint32_t>(((1ull << (32 + shift)) + d - 1) / d - (1ull << 32));
    }
    __device__ __forceinline__ int div(int n) const {
        const uint32_t hi = __umulhi(multiplier, static_cast<uint32_t>(n));
        return static_cast<int>((hi + static_cast<uint32_t>(n)) >> shift);
    }
};

}  // namespace scratchops
