// cooperative_launch_probe.cu — what a cooperative launch costs, before building on one
// (docs/notes.md, "P31 in one launch"): the host time of queueing a plain launch, the same
// through cudaLaunchKernelEx, and a cooperative launch (the attribute, and
// cudaLaunchCooperativeKernel), of an empty kernel of 132 CTAs x 384 threads and 200 KB of
// dynamic shared memory (the shape of the tensor-core kernels' persistent grids; timed in
// rounds of 100 launches, 40 rounds: fastest and median); the GPU time of one grid.sync()
// (1000 launches back to back); a cooperative launch captured into a CUDA graph and replayed;
// and the error of a grid the GPU cannot hold at once.
// Build and run on a GPU (the repository root as working directory):
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o /tmp/coop \
//        scripts/cooperative_launch_probe.cu && /tmp/coop
#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <chrono>
#include <cstdio>
#include <algorithm>
#include <vector>
namespace cg = cooperative_groups;
__global__ void plain(int* out, int syncs) { if (threadIdx.x == 0 && out) out[blockIdx.x] = 1; }
__global__ void coop(int* out, int syncs) {
  for (int i = 0; i < syncs; ++i) cg::this_grid().sync();
  if (threadIdx.x == 0 && out) out[blockIdx.x] = 2;
}
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)
int main() {
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const int smem = 200 * 1024;
  CK(cudaFuncSetAttribute(plain, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CK(cudaFuncSetAttribute(coop, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int* out; CK(cudaMalloc(&out, 4096));
  cudaStream_t s; CK(cudaStreamCreate(&s));
  auto time_host = [&](const char* name, auto launch) {
    std::vector<double> rounds;
    for (int r = 0; r < 40; ++r) {
      cudaStreamSynchronize(s);
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < 100; ++i) launch();
      auto t1 = std::chrono::steady_clock::now();
      rounds.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / 100);
    }
    cudaStreamSynchronize(s);
    std::sort(rounds.begin(), rounds.end());
    printf("%-44s host us/launch: min %.2f median %.2f  (%s)\n", name, rounds[0], rounds[20],
           cudaGetErrorString(cudaGetLastError()));
  };
  int syncs0 = 0, syncs1 = 1; int* outp = out;
  void* args0[] = {&outp, &syncs0}; void* args1[] = {&outp, &syncs1};
  cudaLaunchConfig_t cfg = {}; cfg.gridDim = sms; cfg.blockDim = 384; cfg.dynamicSmemBytes = smem; cfg.stream = s;
  cudaLaunchAttribute attr; attr.id = cudaLaunchAttributeCooperative; attr.val.cooperative = 1;
  for (int rep = 0; rep < 2; ++rep) {
    time_host("plain <<<>>>", [&] { plain<<<sms, 384, smem, s>>>(out, 0); });
    time_host("cudaLaunchKernelEx, no attribute", [&] { cfg.attrs = nullptr; cfg.numAttrs = 0; cudaLaunchKernelEx(&cfg, plain, out, 0); });
    time_host("cudaLaunchKernelEx cooperative, 1 grid.sync", [&] { cfg.attrs = &attr; cfg.numAttrs = 1; cudaLaunchKernelEx(&cfg, coop, out, 1); });
    time_host("cudaLaunchCooperativeKernel, 1 grid.sync", [&] { cudaLaunchCooperativeKernel((void*)coop, sms, 384, args1, smem, s); });
  }
  // GPU time: 1000 launches back to back, events around.
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  auto gpu = [&](const char* name, auto launch) {
    for (int i = 0; i < 100; ++i) launch();
    cudaEventRecord(a, s); for (int i = 0; i < 1000; ++i) launch(); cudaEventRecord(b, s);
    cudaEventSynchronize(b); float ms; cudaEventElapsedTime(&ms, a, b);
    printf("%-44s GPU us/launch back to back: %.2f\n", name, ms);
  };
  cfg.attrs = &attr; cfg.numAttrs = 1;
  gpu("plain", [&] { plain<<<sms, 384, smem, s>>>(out, 0); });
  gpu("cooperative, 0 grid.sync", [&] { cudaLaunchKernelEx(&cfg, coop, out, 0); });
  gpu("cooperative, 1 grid.sync", [&] { cudaLaunchKernelEx(&cfg, coop, out, 1); });
  gpu("cooperative, 10 grid.sync", [&] { cudaLaunchKernelEx(&cfg, coop, out, 10); });
  // Capture.
  cudaGraph_t g; cudaGraphExec_t ge;
  CK(cudaMemset(out, 0, 4096));
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  cudaError_t le = cudaLaunchKernelEx(&cfg, coop, out, 1);
  CK(cudaStreamEndCapture(s, &g));
  printf("capture launch: %s\n", cudaGetErrorString(le));
  CK(cudaGraphInstantiate(&ge, g, 0));
  CK(cudaGraphLaunch(ge, s)); CK(cudaStreamSynchronize(s));
  int h[4]; cudaMemcpy(h, out, 16, cudaMemcpyDeviceToHost);
  printf("graph replay wrote %d %d %d %d\n", h[0], h[1], h[2], h[3]);
  // Too large a grid: the error.
  cfg.gridDim = sms * 2;
  printf("grid of 2x SMs at 1 CTA/SM: %s\n", cudaGetErrorString(cudaLaunchKernelEx(&cfg, coop, out, 1)));
  cudaGetLastError();
  return 0;
}
