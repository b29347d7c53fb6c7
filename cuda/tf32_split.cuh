// tf32_split.cuh — the TF32 split of the fp32-accurate tensor-core products (3xTF32): each
// fp32 value as two TF32 values, big + small, and what the cross terms use for a non-finite
// one. Included by hopper.cuh, with the instructions the tensor-core kernels use. PTX ISA: "cvt".
#pragma once

#include <cstdint>
#include <cstring>

#include <cuda_runtime.h>

namespace scratchops {

// ------------------------------------------------------------------------ TF32 split (3xTF32)
// x = big + small, both TF32 (fp32 with the low 13 mantissa bits zero), in two flavours (and
// split_tf32_short, split_tf32 where the rare cases are known absent: below):
//   split_tf32           big = x rounded to the nearest TF32 (cvt.rna; a finite x that would
//                        round up to Inf, |x| near FLT_MAX, is truncated instead): small is at
//                        most half a TF32 ulp, of either sign.
//   split_tf32_truncated big = x truncated (cvt.rz: one instruction, never overflows): small
//                        is up to a whole ulp, with x's sign. Two instructions fewer, for the
//                        hot loops that split every value they read.
// small = the remainder x - big (exact in fp32) rounded to nearest TF32 (add half a TF32 ulp
// to the bits, then clear the low 13). big*b_big + big*b_small + small*b_big then carries about
// 21 to 22 mantissa bits of each product; the dropped small*b_small is below 2^-20 of it. Its
// sign is random when at least one side is split to nearest; with both truncated it has the
// sign of a*b and, over positive data, adds up: seen on the GPU as an error several times
// cuBLAS SGEMM's at K = 13. So the operand split once (the packed B) uses split_tf32.
// Non-finite x: big = x (Inf and NaN travel in the big part) and small = 0; `cross` is the big
// part to use in the cross terms, 0 for a non-finite x: Inf * (another operand's small part,
// possibly 0) would be NaN where fp32 gives Inf. So the cross terms are always finite and the
// big * big term alone carries Inf and NaN, as fp32 arithmetic would.
struct Tf32Split {
    uint32_t big, small, cross;
};

// Whether a float (or a TF32) is finite, from its bits (Inf and NaN: exponent all ones) or value.
__host__ __device__ __forceinline__ bool finite_bits(uint32_t bits) {
    return (bits & 0x7f800000u) != 0x7f800000u;
}
__device__ __forceinline__ bool finite_value(float x) {
    return fabsf(x) <= __uint_as_float(0x7f7fffffu);  // (FLT_MAX)
}

// A finite float's bits rounded to the nearest TF32, ties away from zero: half a TF32 ulp
// added to the magnitude, the low 13 bits cleared (what cvt.rna does, also on sm_90's SASS).
__host__ __device__ __forceinline__ uint32_t tf32_round_bits(uint32_t bits) {
    return (bits + 0x1000u) & 0xffffe000u;
}

__device__ __forceinline__ Tf32Split tf32_parts(float x, uint32_t big) {
    const bool finite = finite_value(x);
    const uint32_t small = tf32_round_bits(__float_as_uint(x - __uint_as_float(big)));
    return {big, finite ? small : 0u, finite ? big : 0u};
}

__device__ __forceinline__ uint32_t tf32_truncated(float x) {
    uint32_t big;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm("cvt.rz.tf32.f32 %0, %1;" : "=r"(big) : "f"(x));
#else  // the tensor-core kernels are sm_90a only; truncate by masking, a NaN stays a NaN
    big = x != x ? __float_as_uint(x) : __float_as_uint(x) & 0xffffe000u;
#endif
    return big;
}

__device__ __forceinline__ Tf32Split split_tf32_truncated(float x) {
    return tf32_parts(x, tf32_truncated(x));
}

// x rounded to the nearest TF32, ties away from zero (cvt.rna, sm_80+): how cuDNN and cuBLAS
// round fp32 operands when torch allows TF32, so the one-product TF32 mode rounds A and B with
// it. A finite x that would round up to Inf (|x| within half a TF32 ulp of FLT_MAX) is
// truncated instead; Inf and NaN stay themselves.
__host__ __device__ __forceinline__ uint32_t tf32_nearest(float x) {
    uint32_t bits;
    memcpy(&bits, &x, 4);
    const bool finite = finite_bits(bits);
    uint32_t nearest;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(nearest) : "f"(x));
#else
    nearest = finite ? tf32_round_bits(bits) : bits;
#endif
    const bool overflow = finite && (nearest & 0x7fffffffu) == 0x7f800000u;
    return overflow ? bits & 0xffffe000u : nearest;
}

__device__ __forceinline__ Tf32Split split_tf32(float x) { return tf32_parts(x, tf32_nearest(x)); }

// split_tf32's big and small parts of an x whose magnitude's bits are below kShortSplitBelow
// (finite, and rounding cannot carry it to Inf, so cross is big), without its tests of the
// rare cases: five instructions where split_tf32 takes about fifteen.
constexpr uint32_t kShortSplitBelow = 0x7f7ff000u;
__device__ __forceinline__ void split_tf32_short(float x, uint32_t& big, uint32_t& small) {
    big = tf32_round_bits(__float_as_uint(x));
    small = tf32_round_bits(__float_as_uint(x - __uint_as_float(big)));
}

}  // namespace scratchops
