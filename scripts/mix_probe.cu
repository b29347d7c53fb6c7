// mix_probe.cu — what this GPU's DRAM moves for a mix of reads and writes, by the simplest
// streaming kernels: a fill (writes alone), a copy (one write a read) and a read fanned out to
// two and three destinations (P31's one pass over dy writes about 2.9 bytes a byte it reads:
// docs/notes.md, "One pass over dy for both gradients' operands"). The rate such a kernel
// reaches is the ceiling a pass of that mix can be held to.
// Build and run on the GPU (the repository root as working directory):
//   nvcc -O3 -std=c++17 -arch=sm_90 -o /tmp/mix_probe scripts/mix_probe.cu && /tmp/mix_probe
// Each line: the bytes read and written, the median of 20 launches (CUDA events, L2 flushed by
// a 512 MiB memset before each) and the rate, (read + written) / time.
#include "standalone_driver.cuh"  // (CHECK)

// Each thread moves float4s n4 apart (a grid-stride loop): kReads sources (0 or 1) into
// kWrites destinations, each destination dst + d * n4.
template <int kReads, int kWrites>
__global__ void stream_kernel(const float4* src, float4* dst, long long n4) {
    for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n4;
         i += static_cast<long long>(gridDim.x) * blockDim.x) {
        float4 v = make_float4(1.0f, 2.0f, 3.0f, 4.0f);
        if (kReads) v = src[i];
#pragma unroll
        for (int d = 0; d < kWrites; ++d) dst[d * n4 + i] = v;
        if (kWrites == 0 && v.x == 12345.0f) dst[i] = v;  // (src is zeros: keeps the read)
    }
}

template <int kReads, int kWrites>
void time_mix(const char* name, const float4* src, float4* dst, long long n4, void* flush,
              size_t flush_bytes, int sms) {
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    std::vector<float> ms;
    const int blocks = sms * 8, threads = 256;
    for (int rep = 0; rep < 23; ++rep) {
        CHECK(cudaMemsetAsync(flush, rep, flush_bytes));
        CHECK(cudaEventRecord(start));
        stream_kernel<kReads, kWrites><<<blocks, threads>>>(src, dst, n4);
        CHECK(cudaGetLastError());
        CHECK(cudaEventRecord(stop));
        CHECK(cudaEventSynchronize(stop));
        float t;
        CHECK(cudaEventElapsedTime(&t, start, stop));
        if (rep >= 3) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    const double median = ms[ms.size() / 2];
    const double read = kReads * n4 * 16.0, written = kWrites * n4 * 16.0;
    std::printf("%-26s read %6.3f GB  written %6.3f GB  median %8.3f ms  %5.2f TB/s\n", name,
                read / 1e9, written / 1e9, median, (read + written) / median / 1e9);
    CHECK(cudaEventDestroy(start));
    CHECK(cudaEventDestroy(stop));
}

int main() {
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const long long n4 = (256ll << 20) / 16;  // 256 MiB a stream
    float4 *src, *dst;
    void* flush;
    const size_t flush_bytes = 512ull << 20;
    CHECK(cudaMalloc(&src, n4 * 16));
    CHECK(cudaMalloc(&dst, 4 * n4 * 16));
    CHECK(cudaMalloc(&flush, flush_bytes));
    CHECK(cudaMemset(src, 0, n4 * 16));
    time_mix<0, 4>("fill (writes alone)", src, dst, n4, flush, flush_bytes, sms);
    time_mix<1, 0>("read alone", src, dst, n4, flush, flush_bytes, sms);
    time_mix<1, 1>("copy (1 write a read)", src, dst, n4, flush, flush_bytes, sms);
    time_mix<1, 2>("2 writes a read", src, dst, n4, flush, flush_bytes, sms);
    time_mix<1, 3>("3 writes a read", src, dst, n4, flush, flush_bytes, sms);
    time_mix<1, 4>("4 writes a read", src, dst, n4, flush, flush_bytes, sms);
    return 0;
}
