// p31_parts_probe.cu — P31's convolution (128x64x128x128 input, 128 output channels, 3x3,
// with its min/add/mul tail) on the tensor-core engine (cuda/tf32x3.cuh), timed whole and
// with parts left out: A's loads (an A of constants) and the store (one that writes
// nothing), in the TF32 and the 3xTF32 modes, and a few tile shapes. docs/notes.md ("P31
// under torch's defaults") has the numbers and what they say.
// Build and run on an sm_90 GPU (the repository root as working directory):
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o /tmp/p31_parts \
//        scripts/p31_parts_probe.cu && /tmp/p31_parts
// The 256-row-tile line (MB = 2) spills registers (ptxas: ~760 bytes): that is the variant
// the notes measure and drop for it, kept here so that the measurement can be repeated.
// Each line: median and fastest of 15 launches (L2 flushed before each, CUDA events), and the
// largest difference from the first line's output where both compute the same thing.
#include "../cuda/conv_implicit.cu"
#include <cstdio>
#include <string>
#include <vector>
#include <algorithm>
using namespace scratchops;
// Probe parts: A of constants (no loads), and a store that writes nothing (unless a value is
// exactly 123.456, never), to time the kernel with one part left out.
struct ConstRows {
    struct Row { int m; };
    struct KBlock { int kb; };
    struct KPtr { float v; };
    __device__ Row row(int, int m) const { return {m}; }
    __device__ KBlock kblock(int kb, int) const { return {kb}; }
    __device__ KPtr none() const { return {0.f}; }
    __device__ KPtr kptr(const Row& r, const KBlock& b) const { return {(r.m & 7) * 0.01f + b.kb * 0.001f}; }
    __device__ float2 fetch2(const KPtr& p, int e) const { return make_float2(p.v + e, p.v - e); }
};
struct NullStore {
    float* y;
    struct Prepared {};
    __device__ Prepared prepare(const tc::TileCoords&) const { return {}; }
    template <int BN, int MB>
    __device__ void store(const float (&acc)[MB][BN / 2], const tc::TileCoords& tc, const Prepared&) const {
        float s = 0; for (int i = 0; i < BN / 2; ++i) s += acc[0][i];
        if (s == 123.456f) y[tc.lane] = s;
    }
};

__global__ void fill(float* p, long long n, unsigned seed) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed; h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
        p[i] = (h & 0xffffff) / float(0x1000000) - 0.5f;
    }
}
__global__ void maxdiff(const float* a, const float* b, long long n, unsigned* out) {
    float m = 0;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        float d = fabsf(a[i] - b[i]); if (!(d <= m)) m = d != d ? 1e30f : d; }
    atomicMax(out, __float_as_uint(m));
}
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("ERR %s line %d: %s\n", #x, __LINE__, cudaGetErrorString(e)); exit(1);} } while (0)

int main(int argc, char** argv) {
    (void)argc;
    (void)argv;
    const int N = 128, C = 64, H = 128, W = 128, CO = 128;
    Conv2dGeometry g{C, H, W, 3, 3, 1, 1, 0, 0, 1, 1, H - 2, W - 2};
    long long nx = (long long)N * C * H * W, ny = (long long)N * CO * g.out_h * g.out_w;
    float *x, *w, *b, *b2, *y, *yref; unsigned* dm; void* packed; float* flush;
    CK(cudaMalloc(&x, nx * 4)); CK(cudaMalloc(&w, CO * C * 9 * 4)); CK(cudaMalloc(&b, CO * 4));
    CK(cudaMalloc(&b2, CO * 4)); CK(cudaMalloc(&y, ny * 4)); CK(cudaMalloc(&yref, ny * 4)); CK(cudaMalloc(&dm, 4));
    CK(cudaMalloc(&flush, 256 << 20));
    fill<<<1024, 256>>>(x, nx, 1); fill<<<64, 256>>>(w, CO * C * 9, 2); fill<<<1, 128>>>(b, CO, 3); fill<<<1, 128>>>(b2, CO, 4);
    CK(cudaMalloc(&packed, conv2d_implicit_packed_bytes(g, CO)));
    CK(conv2d_implicit_pack(w, CO, g, TensorCorePath::kWgmma, false, packed, 0));
    ConvTail<float> tail{ConvTail<float>::kMinAddMul, 0.5f, b2, 2.0f};
    const ConvGeometryFast f = conv_tc::fast_geometry(g, N, CO);
    const ConvStore<float> store{nullptr, b, tail, f};
    const int m = N * g.out_h * g.out_w;
    const tc::PackedB layout = conv_tc::weight_layout(g, CO, 128);
    Im2colRows<true> loader{x, f};
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    // mode: 0 the reference (the first line), 1 compared with it, 2 not comparable (parts left out)
    auto timeit = [&](const char* name, auto launch_fn, int mode) {
        const bool ref = mode == 0;
        ConvStore<float> st = store; st.y = ref ? yref : y;
        CK(cudaMemset(st.y, 0xff, ny * 4));
        CK(launch_fn(st)); CK(cudaDeviceSynchronize());
        std::vector<float> ts;
        for (int i = 0; i < 15; ++i) {
            CK(cudaMemsetAsync(flush, i, 256 << 20));
            cudaEventRecord(e0); CK(launch_fn(st)); cudaEventRecord(e1); CK(cudaEventSynchronize(e1));
            float t; cudaEventElapsedTime(&t, e0, e1); ts.push_back(t);
        }
        std::sort(ts.begin(), ts.end());
        float d = 0;
        if (mode == 1) { CK(cudaMemset(dm, 0, 4)); maxdiff<<<1024, 256>>>(y, yref, ny, dm); unsigned u; CK(cudaMemcpy(&u, dm, 4, cudaMemcpyDeviceToHost)); memcpy(&d, &u, 4); }
        printf("%-36s median %.3f ms  min %.3f  (%.1f TFLOP/s)  max diff from the first: %s\n", name, ts[7], ts[0],
               2.0 * m * CO * 576 / (ts[7] * 1e-3) / 1e12, mode == 1 ? std::to_string(d).c_str() : "-");
    };
#define V(NAME, BN, MB, ST, GR, TF, REF) timeit(NAME, [&](const ConvStore<float>& st) { return tf32x3::launch<BN, MB, ST, GR, TF>(loader, st, (const uint8_t*)packed, layout, m, 1, true, 0); }, REF ? 0 : 1)
    V("tf32 BN128 MB1 ST4", 128, 1, 4, 1, true, true);
    V("3xtf32 BN128 MB1 ST4 G9 (default)", 128, 1, 4, 9, false, false);
    V("tf32 BN128 MB1 ST8", 128, 1, 8, 1, true, false);
    V("tf32 BN128 MB2 ST4 (256-row tiles)", 128, 2, 4, 1, true, false);
    ConstRows crows;
    NullStore nstore{y};
    timeit("tf32 const A, real store", [&](const ConvStore<float>& st) { return tf32x3::launch<128, 1, 4, 1, true>(crows, st, (const uint8_t*)packed, layout, m, 1, true, 0); }, 2);
    timeit("tf32 real A, null store", [&](const ConvStore<float>& st) { return tf32x3::launch<128, 1, 4, 1, true>(loader, nstore, (const uint8_t*)packed, layout, m, 1, true, 0); }, 2);
    timeit("tf32 const A, null store", [&](const ConvStore<float>& st) { return tf32x3::launch<128, 1, 4, 1, true>(crows, nstore, (const uint8_t*)packed, layout, m, 1, true, 0); }, 2);
    timeit("3x const A, null store", [&](const ConvStore<float>& st) { return tf32x3::launch<128, 1, 4, 9, false>(crows, nstore, (const uint8_t*)packed, layout, m, 1, true, 0); }, 2);
    return 0;
}
