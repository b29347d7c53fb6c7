// hopper.cuh — thin wrappers over the instructions the tensor-core kernels use: predicated
// loads, mbarriers, the bulk copy engine, register reallocation and wgmma (the last two need
// sm_90a), with the TF32 split (tf32_split.cuh). Each wrapper is one PTX instruction or a
// short fixed sequence, so the kernels read as the algorithm. PTX ISA: "mbarrier",
// "cp.async.bulk", "setmaxnreg", "wgmma.mma_async" and "Matrix Descriptor Format".
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_runtime.h>

#include "element.cuh"
#include "tf32_split.cuh"

namespace scratchops {

// The shared memory a CTA can opt into on sm_90 (cudaDevAttrMaxSharedMemoryPerBlockOptin on an
// H100 or H200): static and dynamic together, so a kernel with static shared memory may ask
// that much less.
constexpr int kSm90SmemOptinBytes = 227 * 1024;

// ---------------------------------------------------------------------- predicated loads
// A load that happens only when `valid` and gives 0 otherwise, without a branch (the
// compiler turns `valid ? __ldg(p) : 0` into a branch around every load).
__device__ __forceinline__ float load_or_zero(const float* p, bool valid) {
    float v;
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %2, 0;\nmov.b32 %0, 0;\n"
        "@p ld.global.nc.f32 %0, [%1];\n}\n"
        : "=f"(v)
        : "l"(p), "r"(static_cast<int>(valid)));
    return v;
}
__device__ __forceinline__ float2 load2_or_zero(const float* p, bool valid) {
    float2 v;
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %3, 0;\nmov.b32 %0, 0;\nmov.b32 %1, 0;\n"
        "@p ld.global.nc.v2.f32 {%0, %1}, [%2];\n}\n"
        : "=f"(v.x), "=f"(v.y)
        : "l"(p), "r"(static_cast<int>(valid)));
    return v;
}

// The same for the half types, widened to float: one 2-byte load, or one 4-byte load of a
// pair (p 4-byte aligned).
template <class T>
__device__ __forceinline__ T half_from_bits(unsigned short bits) {
    return *reinterpret_cast<const T*>(&bits);
}
// (The _bits forms keep the value's 16 bits as they are: the native fp16 / bf16 products take
// them in pairs, unwidened.)
template <class T, class = std::enable_if_t<is_half_type<T>()>>
__device__ __forceinline__ unsigned short load_bits_or_zero(const T* p, bool valid) {
    unsigned short v;
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %2, 0;\nmov.b16 %0, 0;\n"
        "@p ld.global.nc.b16 %0, [%1];\n}\n"
        : "=h"(v)
        : "l"(p), "r"(static_cast<int>(valid)));
    return v;
}
template <class T, class = std::enable_if_t<is_half_type<T>()>>
__device__ __forceinline__ float load_or_zero(const T* p, bool valid) {
    return to_float(half_from_bits<T>(load_bits_or_zero(p, valid)));
}
template <class T, class = std::enable_if_t<is_half_type<T>()>>
__device__ __forceinline__ float2 load2_or_zero(const T* p, bool valid) {
    uint32_t v;
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %2, 0;\nmov.b32 %0, 0;\n"
        "@p ld.global.nc.b32 %0, [%1];\n}\n"
        : "=r"(v)
        : "l"(p), "r"(static_cast<int>(valid)));
    return make_float2(to_float(half_from_bits<T>(static_cast<unsigned short>(v & 0xffffu))),
                       to_float(half_from_bits<T>(static_cast<unsigned short>(v >> 16))));
}

// A plain load, ordered after the preceding asm volatile statements: used to refill a
// register only after its previous value has been consumed, so that the compiler neither
// hoists the load above that use nor copies the loaded value into the loop-carried register
// (which would wait for the load at once, defeating the prefetch).
__device__ __forceinline__ float load_ordered(const float* p) {
    float v;
    asm volatile("ld.global.nc.f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
}
template <class T, class = std::enable_if_t<is_half_type<T>()>>
__device__ __forceinline__ unsigned short load_bits_ordered(const T* p) {
    unsigned short v;
    asm volatile("ld.global.nc.b16 %0, [%1];" : "=h"(v) : "l"(p));
    return v;
}
template <class T, class = std::enable_if_t<is_half_type<T>()>>
__device__ __forceinline__ float load_ordered(const T* p) {
    return to_float(half_from_bits<T>(load_bits_ordered(p)));
}

// ---------------------------------------------------------------------------- shared memory
__device__ __forceinline__ uint32_t smem_address(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ldmatrix (sm_75+): four 8 x 8 matrices of 16-bit values loaded as they lie. Lane 8 j + i
// gives the address (16-byte aligned) of matrix j's row i, 8 consecutive values; register j
// receives this thread's two values of matrix j, at its row lane / 4 and columns 2 (lane % 4)
// and + 1 (the layout stmatrix_x4_trans stores from).
__device__ __forceinline__ void ldmatrix_x4(uint32_t address, uint32_t (&r)[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address)
                 : "memory");
}

// stmatrix (sm_90): four 8 x 8 matrices of 16-bit values stored transposed (.trans). Register
// j holds this thread's two values of matrix j, at its row lane / 4 and columns 2 (lane % 4)
// and + 1 (the layout of an mma accumulator), and lane 8 j + i gives the address (16-byte
// aligned) of matrix j's column i, which lands there as 8 consecutive values: a tile of
// pixels x channels leaves as channels x pixels, each channel's 8 pixels one 16-byte row.
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t address, const uint32_t (&r)[4]) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};"
                 ::"r"(address), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3]) : "memory");
}

// cp.async (sm_80+): a kBytes-byte copy (4 or 16; both addresses aligned to it) from global
// to shared memory that holds no register while in flight, carrying an L2 cache policy
// (l2_evict_first); when !valid it reads nothing (source size 0) and writes zeros. 16-byte
// copies bypass L1 (.cg: only that size may). The thread waits for its own copies with
// cp_async_wait_all (other threads' copies need a barrier as well).
template <int kBytes>
__device__ __forceinline__ void cp_async_or_zero(void* dst, const float* src, bool valid,
                                                 uint64_t l2_policy) {
    static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "4-, 8- or 16-byte copies");
    const uint32_t to = smem_address(dst), size = valid ? kBytes : 0;
    if constexpr (kBytes == 16)
        asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;"
                     ::"r"(to), "l"(src), "r"(size), "l"(l2_policy) : "memory");
    else if constexpr (kBytes == 8)
        asm volatile("cp.async.ca.shared.global.L2::cache_hint [%0], [%1], 8, %2, %3;"
                     ::"r"(to), "l"(src), "r"(size), "l"(l2_policy) : "memory");
    else
        asm volatile("cp.async.ca.shared.global.L2::cache_hint [%0], [%1], 4, %2, %3;"
                     ::"r"(to), "l"(src), "r"(size), "l"(l2_policy) : "memory");
}
// An L2 cache policy (createpolicy, sm_80+) under which the lines an access brings into L2 are
// the first evicted: for data read once (or again soon), not to push out a later kernel's.
__device__ __forceinline__ uint64_t l2_evict_first() {
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    return policy;
}
// ... and the opposite, lines kept in L2 before others: data every CTA reads (packed B).
__device__ __forceinline__ uint64_t l2_evict_last() {
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
    return policy;
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;" ::: "memory");
}
__device__ __forceinline__ void cp_async_wait_all() {
    asm volatile("cp.async.wait_group 0;" ::: "memory");
}

// ------------------------------------------------------------------------------- mbarriers
// An mbarrier completes a phase when `count` arrivals have happened and every byte announced
// with expect_tx has landed; waiters poll the parity of the phase they wait for.
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_address(bar)), "r"(count)
                 : "memory");
}

// Make the initialised barriers visible to the async proxy (the bulk copy engine).
__device__ __forceinline__ void fence_barrier_init() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
    [[maybe_unused]] uint64_t state;
    asm volatile("mbarrier.arrive.shared::cta.b64 %0, [%1];"
                 : "=l"(state)
                 : "r"(smem_address(bar))
                 : "memory");
}

// One arrival that also announces `bytes` still to come from the copy engine.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
    [[maybe_unused]] uint64_t state;
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 %0, [%1], %2;"
                 : "=l"(state)
                 : "r"(smem_address(bar)), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ bool mbarrier_try_wait(uint64_t* bar, uint32_t parity) {
    uint32_t done;
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(smem_address(bar)), "r"(parity)
        : "memory");
    return done != 0;
}

__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
    while (!mbarrier_try_wait(bar, parity)) {
    }
}

// --------------------------------------------------------------------------- bulk copy
// Copy `bytes` (a multiple of 16, both addresses 16-byte aligned) from global to shared
// memory with the copy engine; completion is counted on `bar` (complete_tx).
__device__ __forceinline__ void bulk_copy_to_shared(void* dst, const void* src, uint32_t bytes,
                                                    uint64_t* bar) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
        ::"r"(smem_address(dst)), "l"(src), "r"(bytes), "r"(smem_address(bar))
        : "memory");
}

// -------------------------------------------------------------------------------- wgmma
// Shared-memory matrix descriptor of a K-major tile in the 128-byte swizzle layout: rows of
// 128 bytes (32 TF32 values along K), 8-row groups of 1024 bytes (stride byte offset), the
// 16-byte chunk c of row r stored at chunk position c ^ (r % 8). The tile must start on a
// 1024-byte boundary; `address` may point 32*j bytes into it to select k-step j (of 8 TF32).
__device__ __forceinline__ uint64_t make_smem_desc_sw128(uint32_t address) {
    uint64_t desc = 0;
    desc |= static_cast<uint64_t>((address & 0x3FFFF) >> 4);  // start address, 16-byte units
    desc |= static_cast<uint64_t>(1) << 16;                   // leading byte offset (unused)
    desc |= static_cast<uint64_t>(1024 >> 4) << 32;           // stride byte offset: 8 rows
    desc |= static_cast<uint64_t>(1) << 62;                   // layout: 128-byte swizzle
    return desc;
}
// The same for an MN-major tile of 16-bit values (wgmma's imm-trans 1): each k a row of 64 M
// (or N) values, 128 bytes, swizzled as above, 8-row groups of k 1024 bytes apart (stride byte
// offset); M or N past 64 continues `mn_block_bytes` further (leading byte offset), the next
// 64 values' rows. k-step j (of 16) starts 16 rows, 2048 bytes, in.
__device__ __forceinline__ uint64_t make_smem_desc_sw128_mn(uint32_t address,
                                                           uint32_t mn_block_bytes) {
    uint64_t desc = 0;
    desc |= static_cast<uint64_t>((address & 0x3FFFF) >> 4);
    desc |= static_cast<uint64_t>((mn_block_bytes & 0x3FFFF) >> 4) << 16;
    desc |= static_cast<uint64_t>(1024 >> 4) << 32;
    desc |= static_cast<uint64_t>(1) << 62;
    return desc;
}

// Move registers between warpgroups (sm_90a): the producer warpgroup gives up most of its
// registers so the two consumer warpgroups can hold their accumulators.
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N));
}

// Shared memory written by ordinary stores and read next by wgmma (the async proxy): each
// writing thread fences before the barrier that publishes the data.
__device__ __forceinline__ void fence_proxy_async_shared() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
// The same for global memory read next by the copy engine (a bulk copy, a tensor-map load):
// the writers fence before the barrier that publishes the data, the reader after it.
__device__ __forceinline__ void fence_proxy_async_global() {
    asm volatile("fence.proxy.async.global;" ::: "memory");
}

// A barrier among `threads` threads (a multiple of 32) that name the same id (1 to 15; 0 is
// __syncthreads'): one warpgroup's threads, without stopping the other warpgroups.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
// The same barrier, returning whether `pred` holds in all `threads` threads (bar.red.and).
__device__ __forceinline__ bool named_barrier_sync_and(int id, int threads, bool pred) {
    uint32_t all;
    asm volatile(
        "{\n .reg .pred p, q;\n setp.ne.u32 p, %1, 0;\n"
        " bar.red.and.pred q, %2, %3, p;\n selp.u32 %0, 1, 0, q;\n}"
        : "=r"(all)
        : "r"(static_cast<uint32_t>(pred)), "r"(id), "r"(threads)
        : "memory");
    return all != 0;
}

__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// A copy of v in a register of its own (an asm volatile mov, which the compiler keeps). A
// plain copy of a loaded value into an A fragment is folded away, so the wgmma reads the
// loaded register itself; when the next load refills that register while the wgmma is in
// flight, ptxas serialises every wgmma of the kernel (its warning C7513; seen in the 16-bit
// fragments of wgmma_resident_b.cuh; tests/test_sass.py checks the convolutions for it).
__device__ __forceinline__ uint32_t kept_copy(uint32_t v) {
    uint32_t copy;
    asm volatile("mov.b32 %0, %1;" : "=r"(copy) : "r"(v));
    return copy;
}

// Register fences for wgmma operands. wgmma reads its A registers and reads/writes its
// accumulators asynchronously, between issue and wgmma_wait; the compiler does not know
// that and may move an ordinary read or write of those registers across the wait (seen: a
// copy of two accumulators hoisted above the final wait, which read stale values). An empty
// asm that "modifies" each register pins every use to its side of the surrounding waits.
template <int N>
__device__ __forceinline__ void pin_registers(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i]));
}
template <int N>
__device__ __forceinline__ void pin_registers(uint32_t (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i]));
}

}  // namespace scratchops
