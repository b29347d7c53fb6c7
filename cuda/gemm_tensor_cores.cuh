// gemm_tensor_cores.cuh — what GEMM v5 to v9 share (fp32-accurate on the tensor cores,
// 3xTF32; gemm.cu's table): the row-major A loader, B as the engines' packed operand, the C
// store, and the launch of each version's kernel:
//   v5 mma_sync          mma_sync_3xtf32.cuh (sm_80+)
//   v6 wgmma             gemm_v6_wgmma.cuh (sm_90a, as are v7 to v9)
//   v7 bulk_copy_ring    gemm_v7_bulk_copy_ring.cuh
//   v8 warp_specialised  tf32x3.cuh, one CTA a tile
//   v9 persistent        tf32x3.cuh, one CTA a multiprocessor: the tensor-core GEMM, on the
//                        engine the call names (GemmArgs::engine: on mma.sync, v5's kernel)
//
// A, B and C are float, fp16 or bf16: A and B are widened to float as they are read (B into
// the packed TF32 parts, the same bytes for every type), C is rounded to its type as it is
// stored. The half types take the one-product mode alone (launchers.h,
// tensor_cores_single_product): exact on their values, a third of 3xTF32's products.
#pragma once

#include <cstdint>
#include <type_traits>

#include "gemm_common.cuh"
#include "gemm_v7_bulk_copy_ring.cuh"
#include "tensor_core_launch.cuh"

namespace scratchops {

// (A named namespace: in a build without sm_90a the kernel using these is empty, and unused
// members of an unnamed namespace would draw warnings.)
namespace gemm_tc {

// A's rows for the tensor-core engine: row m of batch entry b is a + b * stride_a + m * lda.
template <class T>
struct RowMajorRows {
    const T* a;
    int m, k, lda;
    long long stride_a;
    bool pairs_aligned;  // lda even and a aligned to 2 * sizeof(T): a pair of values is one load
    struct Row {
        long long offset;  // of row m's first value; -1 past the last row
    };
    struct KBlock {
        int k0, count;  // the thread's first k, and how many of its 8 exist
    };
    struct KPtr {
        int offset;  // of the thread's first value, from a
        int count;   // how many of its 8 values exist (0: none)
    };
    __device__ Row row(int batch, int r) const {
        return {r < m ? batch * stride_a + static_cast<long long>(r) * lda : -1};
    }
    __device__ KBlock kblock(int kb, int t) const {
        const int k0 = kb * tc::kBlockK + 8 * t;
        return {k0, min(8, k - k0)};
    }
    __device__ KPtr none() const { return {0, 0}; }
    __device__ KPtr kptr(const Row& r, const KBlock& b) const {
        // Offsets fit in 32 bits: A holds fewer than 2^31 elements (the caller checks).
        return {r.offset < 0 ? 0 : static_cast<int>(r.offset) + b.k0, r.offset < 0 ? 0 : b.count};
    }
    // (hopper.cuh's load_or_zero and load2_or_zero widen the half types to float.)
    __device__ float2 fetch2(const KPtr& p, int e) const {
        const T* q = a + p.offset + e;
        if (pairs_aligned) {  // one load of a pair, or at an odd K's end the first value alone
            const float2 pair = load2_or_zero(q, p.count >= e + 2);
            const float last = load_or_zero(q, p.count == e + 1);
            return p.count >= e + 2 ? pair : make_float2(last, 0.0f);
        }
        return make_float2(load_or_zero(q, e < p.count), load_or_zero(q + 1, e + 1 < p.count));
    }
};

// B (K x N row-major, batch stride stride_b) as the engine's N x K matrix B(entry, n, k).
template <class T>
struct RowMajorB {
    const T* b;
    int n, k, ldb;
    long long stride_b;
    __device__ float operator()(int entry, int col, int row) const {
        return col < n && row < k
                   ? to_float(b[entry * stride_b + static_cast<long long>(row) * ldb + col])
                   : 0.0f;
    }
};

// C = A @ B + bias[row], row-major with leading dimension ldc.
template <class T>
struct RowMajorStore {
    T* c;
    const T* bias;  // may be nullptr
    int m, n, ldc;
    long long stride_c;
    bool pairs_aligned;  // as RowMajorRows's, for C
    struct Prepared {};
    __device__ Prepared prepare(const tc::TileCoords&) const { return {}; }
    template <int BN, int MB>
    __device__ void store(const float (&acc)[MB][BN / 2], const tc::TileCoords& tc,
                          const Prepared&) const {
        const int t = tc.lane % 4;
#pragma unroll
        for (int mb = 0; mb < MB; ++mb)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = tc.m0 + tc.template tile_row<MB>(mb, h);
                if (r >= m) continue;
                const float row_bias = bias != nullptr ? to_float(bias[r]) : 0.0f;
                T* out = c + tc.batch * stride_c + static_cast<long long>(r) * ldc;
#pragma unroll
                for (int nb = 0; nb < BN / 8; ++nb) {
                    const int col = tc.n0 + 8 * nb + 2 * t;
                    const float v0 = plus_bias<T>(acc[mb][4 * nb + 2 * h], row_bias);
                    const float v1 = plus_bias<T>(acc[mb][4 * nb + 2 * h + 1], row_bias);
                    if (pairs_aligned && col + 1 < n) {
                        store2(out + col, v0, v1);
                    } else {
                        if (col < n) out[col] = from_float<T>(v0);
                        if (col + 1 < n) out[col + 1] = from_float<T>(v1);
                    }
                }
            }
    }
};

constexpr int kTcBN = 128, kTcMB = 1, kTcStages = 4;

inline tc::PackedB tc_layout(int n, int k, int entries) {
    return tc::packed_b_layout(kTcBN, n, k, entries);
}

}  // namespace gemm_tc

namespace {

// Version `version` (5 to 9) of one chunk of the batch; kTf32: the one-product mode.
template <bool kTf32, class T>
cudaError_t launch_tensor_core_version(int version, TensorCorePath engine,
                                       const gemm_tc::RowMajorRows<T>& rows,
                                       const gemm_tc::RowMajorStore<T>& store,
                                       const uint8_t* packed, const tc::PackedB& layout,
                                       int m_rows, int batch, bool b_shared,
                                       cudaStream_t stream) {
    using namespace gemm_tc;
    switch (version) {
        case 5:
            return mma_sync::launch<kTcBN, kTcMB, 1, kTf32>(rows, store, packed, layout, m_rows,
                                                            batch, b_shared, stream);
        case 6:
            return gemm_v6::launch<kTcBN, kTcMB, kTf32>(rows, store, packed, layout, m_rows,
                                                        batch, b_shared, stream);
        case 7:
            return gemm_v7::launch<kTcBN, kTcMB, kTcStages, kTf32>(rows, store, packed, layout,
                                                                   m_rows, batch, b_shared, stream);
        case 8:
            return tf32x3::launch<kTcBN, kTcMB, kTcStages, 1, kTf32>(
                rows, store, packed, layout, m_rows, batch, b_shared, stream, false);
        case 9:
            return tensor_core_launch<kTcBN, kTcMB, kTcStages, 1, kTf32>(
                engine, rows, store, packed, layout, m_rows, batch, b_shared, stream);
    }
    return cudaErrorInvalidValue;
}

// The mode tensor_cores_single_product picks. The 3xTF32 kernels are compiled for float
// alone: the half types never take them, and each is a large instantiation.
template <class T>
cudaError_t launch_tensor_core_mode(int version, const GemmArgs<T>& g,
                                    const gemm_tc::RowMajorRows<T>& rows,
                                    const gemm_tc::RowMajorStore<T>& store,
                                    const uint8_t* packed, const tc::PackedB& layout, int batch,
                                    cudaStream_t stream) {
    const bool b_shared = g.stride_b == 0;
    if constexpr (std::is_same_v<T, float>) {
        if (!tensor_cores_single_product<T>(g.tf32))
            return launch_tensor_core_version<false>(version, g.engine, rows, store, packed,
                                                     layout, g.M, batch, b_shared, stream);
    }
    return launch_tensor_core_version<true>(version, g.engine, rows, store, packed, layout, g.M,
                                            batch, b_shared, stream);
}

// Whether pairs of consecutive elements of a row-major matrix are aligned for one load or
// store of both (the loader's and the store's pairs_aligned): an even leading dimension and
// batch stride, and a base aligned to a pair.
template <class T>
bool pair_accesses_fit(const T* base, int ld, long long batch_stride) {
    return ld % 2 == 0 && batch_stride % 2 == 0 &&
           reinterpret_cast<uintptr_t>(base) % (2 * sizeof(T)) == 0;
}

// v5 to v9: the product on the tensor cores, a chunk of batch entries at a time when B is
// batched and the workspace does not hold every entry's packed B.
template <class T>
cudaError_t launch_tensor_cores(int version, const GemmArgs<T>& g, void* workspace,
                                long long workspace_bytes, cudaStream_t stream) {
    using namespace gemm_tc;
    const bool b_shared = g.stride_b == 0;
    // Batch entries per launch: all of them, or (a batched B) as many as the workspace holds.
    const long long per_entry = tc_layout(g.N, g.K, 1).tiles_bytes();
    const long long room = workspace_bytes - tc_layout(g.N, g.K, 0).bytes();  // minus the flags
    const int chunk = b_shared ? g.batch
                               : static_cast<int>(room / per_entry < g.batch ? room / per_entry
                                                                             : g.batch);
    if (chunk <= 0) return cudaErrorInvalidValue;  // the workspace holds not even one B
    auto* packed = static_cast<uint8_t*>(workspace);
    const bool a_pairs = pair_accesses_fit(g.A, g.lda, g.stride_a);
    const bool c_pairs = pair_accesses_fit(g.C, g.ldc, g.stride_c);
    for (int b0 = 0; b0 < g.batch; b0 += chunk) {
        const int count = g.batch - b0 < chunk ? g.batch - b0 : chunk;
        const tc::PackedB layout = tc_layout(g.N, g.K, b_shared ? 1 : count);
        cudaError_t err = tc::pack_b<kTcBN>(
            RowMajorB<T>{g.B + b0 * g.stride_b, g.N, g.K, g.ldb, g.stride_b}, packed, layout,
            stream);
        if (err != cudaSuccess) return err;
        const RowMajorRows<T> rows{g.A + b0 * g.stride_a, g.M, g.K, g.lda, g.stride_a, a_pairs};
        const RowMajorStore<T> store{g.C + b0 * g.stride_c, g.bias, g.M, g.N, g.ldc, g.stride_c,
                                     c_pairs};
        err = launch_tensor_core_mode(version, g, rows, store, packed, layout, count, stream);
        if (err != cudaSuccess) return err;
    }
    return cudaSuccess;
}

}  // namespace
}  // namespace scratchops
