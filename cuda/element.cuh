// element.cuh — the element types every operator takes, and the one way each is read and
// written: float (fp32), __half (fp16) and __nv_bfloat16 (bf16). Arithmetic always happens
// in float, as torch's own kernels do for the half types: a value is widened when it is
// loaded (exact: every fp16 and bf16 value is a float) and rounded to nearest once, when the
// result is stored. Statistics, sums and accumulators stay float throughout.
//
// The three are instantiated for every launcher (SCRATCHOPS_FOR_EACH_ELEMENT, at the end of
// each .cu file); launchers.h names the pointers' types.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace scratchops {

// Widening to float, exact for every type.
__host__ __device__ __forceinline__ float to_float(float v) { return v; }
__host__ __device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__host__ __device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

// Rounding a float result to the element type: to nearest, ties to even (as torch rounds).
template <class T>
__host__ __device__ __forceinline__ T from_float(float v);
template <>
__host__ __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__host__ __device__ __forceinline__ __half from_float<__half>(float v) {
    return __float2half_rn(v);
}
template <>
__host__ __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}

// values[i] widened where it is given (values not nullptr, `present`), `absent` otherwise: how
// the kernels read an optional per-channel parameter.
template <class T>
__device__ __forceinline__ float value_or(const T* values, int i, bool present, float absent) {
    return values != nullptr && present ? to_float(values[i]) : absent;
}

// v as a torch operator computing in T leaves it: rounded to T, widened back (float: v itself).
// A fused kernel rounds where the torch operators it fuses would each round their result (P31's
// convolution, min and add; group norm, then the scale), so that it computes what the chain of
// torch operators computes in T, as KernelBench compares it; every other step stays in float.
template <class T>
__device__ __forceinline__ float rounded(float v) {
    return to_float(from_float<T>(v));
}
// bf16: the same rounding done on the bits (to nearest, ties to even: add 0x7fff and the lowest
// kept bit, clear the low 16), in integer instructions at the full rate. The compiler turned
// the conversion pair into F2F instructions, which ran at a fraction of it: 4 a value in P31's
// epilogue, where ncu found v4 waiting on them (docs/notes.md). A NaN stays itself (its low
// bits could carry it to Inf); Inf and the values past bf16's largest round as cvt.rn does.
template <>
__device__ __forceinline__ float rounded<__nv_bfloat16>(float v) {
    const uint32_t bits = __float_as_uint(v);
    const uint32_t nearest = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;
    return v != v ? v : __uint_as_float(nearest);
}

// A product (a GEMM's or a convolution's sum) plus a bias, as torch adds the bias in T: the
// product rounded to T first (torch's conv2d adds its bias to cuDNN's rounded result; a @ b +
// bias is two operators), the sum rounded by its store.
template <class T>
__device__ __forceinline__ float plus_bias(float product, float bias) {
    return rounded<T>(product) + bias;
}

// Two values of a 16-bit T in one 32-bit register (__half2, __nv_bfloat162), for the paired
// instructions (sm_80+: cvt.rn to a pair, add, min, mul of pairs), each rounding its result
// to T once. A torch operator on T computes in float and rounds once; the two agree bit for
// bit wherever the float result is exact (a product of two T values: 2 x 11 bits fit in
// float's 24) or double rounding is innocuous (a sum: float's 24 bits hold 2 p + 2 for T's p
// = 11 or 8 bits, Figueroa's condition), so an epilogue of adds, mins and exact products may
// run two values an instruction. rounded_pair(lo, hi) rounds two floats as from_float does;
// widened(v) is to_float of each.
template <class T>
struct PairOf;
template <>
struct PairOf<__half> {
    using type = __half2;
    static __device__ __forceinline__ type rounded_pair(float lo, float hi) {
        return __floats2half2_rn(lo, hi);
    }
    static __device__ __forceinline__ float2 widened(type v) { return __half22float2(v); }
};
template <>
struct PairOf<__nv_bfloat16> {
    using type = __nv_bfloat162;
    static __device__ __forceinline__ type rounded_pair(float lo, float hi) {
        return __floats2bfloat162_rn(lo, hi);
    }
    static __device__ __forceinline__ float2 widened(type v) { return __bfloat1622float2(v); }
};
// plus_bias then rounded to T (torch's conv2d in T), for two products at once: the pair
// rounded by one cvt, then the bias pair (values of T) added by one add of pairs. The same
// bits as the value-at-a-time form wherever it is finite (the float sum of two values of T
// rounds once correctly: Figueroa's condition); a NaN stays a NaN.
template <class T>
__device__ __forceinline__ typename PairOf<T>::type plus_bias_pair(
    float lo, float hi, const typename PairOf<T>::type& bias) {
    return __hadd2_rn(PairOf<T>::rounded_pair(lo, hi), bias);
}
// A pair's 32 bits (lo in the low half, as it sits in memory).
template <class V>
__device__ __forceinline__ uint32_t pair_bits(V v) {
    static_assert(sizeof(V) == 4, "two 16-bit values");
    uint32_t bits;
    memcpy(&bits, &v, 4);
    return bits;
}

// Whether T is one of the 16-bit types.
template <class T>
__host__ __device__ constexpr bool is_half_type() { return sizeof(T) == 2; }

// A pair's bits (uint2: two floats; uint32_t: two 16-bit values; uint16_t: two bytes) stored
// to global memory as one access, p aligned to its size. (The 8-byte store is spelled out:
// left to itself, the compiler split some of v4's into two 4-byte stores, each touching as
// many sectors.)
__device__ __forceinline__ void store_pair_bits(void* p, uint2 v) {
    asm volatile("st.global.v2.b32 [%0], {%1, %2};" ::"l"(p), "r"(v.x), "r"(v.y) : "memory");
}
__device__ __forceinline__ void store_pair_bits(void* p, uint32_t v) {
    *static_cast<uint32_t*>(p) = v;
}
__device__ __forceinline__ void store_pair_bits(void* p, uint16_t v) {  // (two bytes)
    *static_cast<uint16_t*>(p) = v;
}

// Four consecutive elements as one load or store of 4 * sizeof(T) bytes (16 for float, 8 for
// the half types): p must be aligned to that (vector_aligned, checked by the launchers).
template <class T>
inline bool vector_aligned(const void* p) {
    return reinterpret_cast<std::uintptr_t>(p) % (4 * sizeof(T)) == 0;
}
__device__ __forceinline__ float4 load4(const float* p) {
    return *reinterpret_cast<const float4*>(p);
}
template <class T>
__device__ __forceinline__ float4 load4(const T* p) {
    const uint2 bits = *reinterpret_cast<const uint2*>(p);  // 4 halves: 8 bytes
    const T* h = reinterpret_cast<const T*>(&bits);
    return make_float4(to_float(h[0]), to_float(h[1]), to_float(h[2]), to_float(h[3]));
}
__device__ __forceinline__ void store4(float* p, float4 v) {
    *reinterpret_cast<float4*>(p) = v;
}
template <class T>
__device__ __forceinline__ void store4(T* p, float4 v) {
    uint2 bits;
    T* h = reinterpret_cast<T*>(&bits);
    h[0] = from_float<T>(v.x);
    h[1] = from_float<T>(v.y);
    h[2] = from_float<T>(v.z);
    h[3] = from_float<T>(v.w);
    *reinterpret_cast<uint2*>(p) = bits;
}

// Two consecutive elements as one store of 2 * sizeof(T) bytes (p aligned to that).
template <class T>
__device__ __forceinline__ void store2(T* p, float v0, float v1) {
    if constexpr (std::is_same_v<T, float>) {
        *reinterpret_cast<float2*>(p) = make_float2(v0, v1);
    } else {
        uint32_t bits;
        T* h = reinterpret_cast<T*>(&bits);
        h[0] = from_float<T>(v0);
        h[1] = from_float<T>(v1);
        *reinterpret_cast<uint32_t*>(p) = bits;
    }
}

// Four consecutive elements of T, aligned as load4/store4 need them: the unit that the
// vectorised loops index in. (x4[i] with x4 a pointer to these, not x + 4 * i, keeps the loop's
// address a fixed stride from a base computed once: the compiler folds x + offset + 4 * i
// into one 64-bit product per iteration otherwise.)
template <class T>
struct alignas(4 * sizeof(T)) FourElements {
    T e[4];
};

}  // namespace scratchops

// X(T) once for each element type: the explicit instantiations of a file's launchers.
#define SCRATCHOPS_FOR_EACH_ELEMENT(X) X(float) X(__half) X(__nv_bfloat16)
