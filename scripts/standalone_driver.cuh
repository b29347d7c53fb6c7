// standalone_driver.cuh — what the nvcc-only drivers (wgrad_standalone.cu, dgrad_standalone.cu;
// mix_probe.cu its CHECK) share: every CUDA call checked, a host vector's device copy, a call's
// median time over repeated runs, and a hash of a result's bits (to compare two builds bit for
// bit).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cuda_runtime.h>

// Every CUDA call checked: a failure names the call and stops the run.
#define CHECK(call)                                                                    \
    do {                                                                               \
        const cudaError_t status = (call);                                             \
        if (status != cudaSuccess) {                                                   \
            printf("FAIL %s: %s (line %d)\n", #call, cudaGetErrorString(status), __LINE__); \
            exit(1);                                                                   \
        }                                                                              \
    } while (0)

// A device copy of a host vector (cudaFree it when done).
template <class T>
T* to_device(const std::vector<T>& values) {
    T* copy;
    CHECK(cudaMalloc(&copy, values.size() * sizeof(T)));
    CHECK(cudaMemcpy(copy, values.data(), values.size() * sizeof(T), cudaMemcpyHostToDevice));
    return copy;
}

// The median of `reps` runs of call() (a cudaError_t), each between two CUDA events on the
// default stream (no L2 flush: the calls timed here read a gigabyte or so).
template <class Call>
float median_ms(Call call, int reps) {
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    std::vector<float> times;
    for (int i = 0; i < reps; ++i) {
        CHECK(cudaEventRecord(start));
        CHECK(call());
        CHECK(cudaEventRecord(stop));
        CHECK(cudaEventSynchronize(stop));
        float ms;
        CHECK(cudaEventElapsedTime(&ms, start, stop));
        times.push_back(ms);
    }
    CHECK(cudaEventDestroy(start));
    CHECK(cudaEventDestroy(stop));
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
}

// FNV-1a over the values' bits.
inline unsigned long long bits_hash(const std::vector<float>& values) {
    unsigned long long hash = 1469598103934665603ULL;
    for (float v : values) {
        uint32_t bits;
        memcpy(&bits, &v, 4);
        hash = (hash ^ bits) * 1099511628211ULL;
    }
    return hash;
}
