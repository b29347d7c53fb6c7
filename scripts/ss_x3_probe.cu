// ss_x3_probe.cu — how fast the 3xTF32 products of P31's forward can run with both wgmma
// operands in shared memory (A's two TF32 parts and B's staged there already, as a copy
// engine would leave them), and what the tile's store adds: the floor of an implicit GEMM
// whose A is staged like v4's (conv_implicit_staged_a.cuh) in three products. Nothing is
// loaded from global memory: the operands are one value, written once into two ring stages
// that the wgmmas read in turn; the products' results are not checked (timing only).
// Build and run on the GPU (the repository root as working directory):
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Icuda -Iscripts \
//        -o /tmp/ss_x3_probe scripts/ss_x3_probe.cu && /tmp/ss_x3_probe
// P31's sizes: 16,128 tiles of 128 output pixels x 128 channels, K = 576 (18 k-blocks of 32),
// three m64n128k8 wgmmas a k-step (a_small b_big, a_big b_small, a_big b_big: the cross
// parts are the big ones for finite data), partial sums of 9 k-blocks added in fp32 as
// tf32x3.cuh's engine does. Two consumer warpgroups a CTA, one CTA a multiprocessor. Forms:
//   in step     a 128-pixel tile a CTA, each warpgroup 64 rows of it, a barrier of both at each
//               k-block (a shared ring's stage released by both)
//   + store     each tile's 128 x 128 results stored as NCHW planes (a channel's pixels
//               consecutive; 8 lanes write 32 contiguous bytes)
//   own tiles   each warpgroup walks 64-pixel tiles of its own, no barrier between them: one's
//               store runs under the other's products
#include "hopper.cuh"
#include "standalone_driver.cuh"
#include "wgmma_tf32.cuh"

using namespace scratchops;

constexpr int kTilesP31 = 16128;  // 128 x 126 x 126 pixels / 128
constexpr int kKBlocks = 18, kGroup = 9;
constexpr int kTileBytes = 128 * 128;               // 128 rows of one 32-value k-block
constexpr int kStageBytes = 4 * kTileBytes;         // A big, A small, B big, B small
constexpr int kSmemBytes = 2 * kStageBytes + 1024;  // two stages, aligned to 1024

template <bool kStore, bool kOwnTiles>
__global__ void __launch_bounds__(256, 1) ss_x3_kernel(float* out, long long rows) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ uint8_t smem_raw[];
    uint8_t* smem = reinterpret_cast<uint8_t*>(
        (reinterpret_cast<uintptr_t>(smem_raw) + 1023) / 1024 * 1024);
    for (int i = threadIdx.x; i < 2 * kStageBytes / 4; i += blockDim.x)
        reinterpret_cast<uint32_t*>(smem)[i] = 0x3c000000u;  // 2^-7: no overflow in 576 x 3
    __syncthreads();
    fence_proxy_async_shared();  // (the generic writes, seen by wgmma's async reads)
    const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    const uint32_t base = smem_address(smem);
    const int tiles = kOwnTiles ? 2 * kTilesP31 : kTilesP31;
    const int first = kOwnTiles ? 2 * blockIdx.x + wg : blockIdx.x;
    const int step = kOwnTiles ? 2 * gridDim.x : gridDim.x;
    const uint32_t a_rows = kOwnTiles ? 0 : wg * 64 * 128;  // (in step: this half's rows)
    float total[64], part[64];
    for (int t = first; t < tiles; t += step) {
        for (int i = 0; i < 64; ++i) total[i] = 0.0f;
        for (int kb0 = 0; kb0 < kKBlocks; kb0 += kGroup) {
            for (int kb = kb0; kb < kb0 + kGroup; ++kb) {
                if (!kOwnTiles) named_barrier_sync(1, 256);
                const uint32_t stage = base + (kb % 2) * kStageBytes;
                const uint64_t a_big = make_smem_desc_sw128(stage + a_rows);
                const uint64_t a_small = make_smem_desc_sw128(stage + kTileBytes + a_rows);
                const uint64_t b_big = make_smem_desc_sw128(stage + 2 * kTileBytes);
                const uint64_t b_small = make_smem_desc_sw128(stage + 3 * kTileBytes);
#pragma unroll
                for (int s = 0; s < 4; ++s) {
                    pin_registers(part);
                    wgmma_fence();
                    WgmmaTf32Ss<128>::mma(part, a_small + 2 * s, b_big + 2 * s, kb > kb0 || s > 0);
                    WgmmaTf32Ss<128>::mma(part, a_big + 2 * s, b_small + 2 * s, 1);
                    WgmmaTf32Ss<128>::mma(part, a_big + 2 * s, b_big + 2 * s, 1);
                    wgmma_commit();
                    wgmma_wait<1>();
                }
            }
            wgmma_wait<0>();
            pin_registers(part);
#pragma unroll
            for (int i = 0; i < 64; ++i) total[i] += part[i];
        }
        if (kStore) {  // d[4i + e]: row 16 warp + lane / 4 (+ 8 for e >= 2), column
                       // 8i + 2 (lane % 4) (+ 1 for odd e); out is column-major (NCHW-like)
            const long long m0 = kOwnTiles ? 64LL * t : 128LL * t + 64 * wg;
            const long long row = m0 + 16 * warp + lane / 4;
#pragma unroll
            for (int i = 0; i < 16; ++i)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int col = 8 * i + 2 * (lane % 4) + e % 2;
                    out[col * rows + row + 8 * (e / 2)] = total[4 * i + e];
                }
        } else if (total[0] == 1234.5f) {
            out[threadIdx.x] = total[1];  // (keeps the products)
        }
    }
#else
    __trap();  // (wgmma needs sm_90a: build as the top says)
#endif
}

template <bool kStore, bool kOwnTiles>
void time_form(const char* name, float* out, long long rows, int sms) {
    auto kernel = ss_x3_kernel<kStore, kOwnTiles>;
    CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    const float ms = median_ms(
        [&] {
            kernel<<<sms, 256, kSmemBytes>>>(out, rows);
            return cudaGetLastError();
        },
        11);
    const double flop = 2.0 * 128 * 128 * 576 * kTilesP31;  // fp32 products of P31's forward
    printf("%-34s %7.3f ms  %6.1f TFLOP/s fp32-accurate (%.1f TF32)\n", name, ms,
           flop / ms / 1e9, 3 * flop / ms / 1e9);
}

int main() {
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const long long rows = 128LL * kTilesP31;
    float* out;
    CHECK(cudaMalloc(&out, rows * 128 * sizeof(float)));
    printf("P31's forward products, 3xTF32, both operands in shared memory, %d CTAs\n", sms);
    time_form<false, false>("in step, products alone", out, rows, sms);
    time_form<true, false>("in step, + store", out, rows, sms);
    time_form<false, true>("own tiles, products alone", out, rows, sms);
    time_form<true, true>("own tiles, + store", out, rows, sms);
    CHECK(cudaFree(out));
    return 0;
}
