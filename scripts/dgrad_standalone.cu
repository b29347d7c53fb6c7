// dgrad_standalone.cu — the convolution's fp32 input gradient on the tensor cores (3xTF32,
// the wgmma engine) without torch or the extension, as wgrad_standalone.cu does for the
// weight gradient: built with nvcc alone, run on the GPU in seconds. It runs v4 (the roles
// swapped, conv_input_grad_swapped.cuh) and v2 (the implicit GEMM over dy) side by side, v2
// by a workspace too small for v4.
//   check  shapes with odd sizes, partial tiles, 1 x 1 and 5 x 5 kernels, padding and
//          dilation: each version's largest error against a float64 kernel over the largest
//          |dx|, and a hash of dx's bits; then one shape with Inf, NaN and values that round
//          up to Inf in dy (and an Inf weight), each output's class (NaN, +-Inf, finite)
//          against the float64 reference's
//   time N C H W K   medians of 20 calls (CUDA events) of a 3 x 3, padding 1 convolution's
//          input gradient, v4 and v2, in turns
// Build (the repository root as working directory):
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Icuda -o /tmp/dgrad \
//        scripts/dgrad_standalone.cu cuda/transpose.cu cuda/gemm.cu cuda/conv_implicit.cu \
//        cuda/tf32_round.cu cuda/conv_im2col.cu cuda/min_add_mul_backward_channels_last.cu
//   /tmp/dgrad check && /tmp/dgrad time 128 64 128 128 128
#include "conv_backward.cu"
#include "standalone_driver.cuh"
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>
using namespace scratchops;

// dx[n][c][h][w] = sum over k, i, j of dy[n][k][h + pad - i dil][w + pad - j dil] W[k][c][i][j]
// (stride 1) in float64, one thread an element; dy is 0 past its edges, and those zeros are
// multiplied too, as by every padded convolution (so an Inf weight gives NaN there).
__global__ void reference_kernel(const float* dy, const float* w, double* dx, int n_images,
                                 Conv2dGeometry g, int out_channels) {
    const long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
    if (i >= static_cast<long long>(n_images) * g.channels * g.height * g.width) return;
    const int x = i % g.width, y = i / g.width % g.height, c = i / g.width / g.height % g.channels;
    const int n = i / g.width / g.height / g.channels;
    double sum = 0;
    for (int k = 0; k < out_channels; ++k)
        for (int r = 0; r < g.kernel_h; ++r)
            for (int s = 0; s < g.kernel_w; ++s) {
                const int oh = y + g.pad_h - r * g.dil_h, ow = x + g.pad_w - s * g.dil_w;
                const double weight = w[((k * g.channels + c) * g.kernel_h + r) * g.kernel_w + s];
                if (oh < 0 || oh >= g.out_h || ow < 0 || ow >= g.out_w) {
                    sum += 0.0 * weight;  // (a padded tap: 0 x Inf is NaN, as in torch's)
                    continue;
                }
                sum += static_cast<double>(
                           dy[((static_cast<long long>(n) * out_channels + k) * g.out_h + oh) *
                                  g.out_w + ow]) * weight;
            }
    dx[i] = sum;
}

struct Shape {
    int n, c, h, w, k, kernel, pad, dil;
};
struct Result {
    unsigned long long hash;
    double error;
    int class_mismatches;
    float median_ms;
};

static int value_class(double v) { return v != v ? 0 : std::isinf(v) ? (v > 0 ? 1 : 2) : 3; }

// conv2d_input_grad_launch, version 4: with the workspace its rule asks; 2: with one too small
// for v4's chunk of one image (v2's: the flipped weights and their packing).
static Result input_grad(const Shape& s, int version, int reps, bool nonfinite) {
    const int out_h = s.h + 2 * s.pad - s.dil * (s.kernel - 1);
    const int out_w = s.w + 2 * s.pad - s.dil * (s.kernel - 1);
    const Conv2dGeometry g{s.c, s.h, s.w, s.kernel, s.kernel, 1, 1, s.pad, s.pad, s.dil, s.dil,
                           out_h, out_w};
    const size_t dx_count = size_t(s.n) * s.c * s.h * s.w;
    const size_t dy_count = size_t(s.n) * s.k * out_h * out_w;
    const size_t w_count = size_t(s.k) * s.c * s.kernel * s.kernel;
    std::vector<float> dy(dy_count), w(w_count), dx(dx_count);
    std::mt19937 generator(11);
    std::uniform_real_distribution<float> uniform(-1.f, 1.f);
    for (float& v : dy) v = uniform(generator);
    for (float& v : w) v = uniform(generator);
    if (nonfinite) {
        const uint32_t bits = 0x7f7ff123u;  // rounds up to Inf as a TF32
        float rounds_to_inf;
        memcpy(&rounds_to_inf, &bits, 4);
        dy[5] = INFINITY, dy[dy_count / 2] = rounds_to_inf, dy[dy_count / 3] = -rounds_to_inf;
        dy[dy_count - 3] = NAN, dy[dy_count / 5] = -INFINITY;
        w[w_count / 2] = INFINITY;
        w[1] = 0.5f;  // (a TF32 value exactly: its small part is 0)
    }
    float *dy_gpu = to_device(dy), *w_gpu = to_device(w), *dx_gpu, *workspace;
    CHECK(cudaMalloc(&dx_gpu, dx_count * 4));
    CHECK(cudaMemset(dx_gpu, 0xff, dx_count * 4));  // NaN
    const long long budget = 1LL << 30;  // (versions.TENSOR_CORE_GRAD_WORKSPACE_BYTES)
    const FlippedWeights v2_needs = flipped_weights<float>(s.k, g);
    const long long elements = version == 4 ? conv2d_grad_workspace_elements<float>(
                                                  false, s.n, s.k, g, kGemmTensorCoreVersion,
                                                  TensorCorePath::kWgmma, false, budget)
                                            : v2_needs.flipped + v2_needs.packed;
    CHECK(cudaMalloc(&workspace, elements * 4));
    CHECK(cudaMemset(workspace, 0xff, elements * 4));
    auto call = [&] {
        return conv2d_input_grad_launch<float>(dy_gpu, w_gpu, dx_gpu, s.n, s.k, g,
                                               kGemmTensorCoreVersion, TensorCorePath::kWgmma,
                                               false, workspace, elements, nullptr);
    };
    CHECK(call());
    CHECK(cudaDeviceSynchronize());
    Result result{};
    if (reps > 0) result.median_ms = median_ms(call, reps);
    CHECK(cudaMemcpy(dx.data(), dx_gpu, dx_count * 4, cudaMemcpyDeviceToHost));
    result.hash = bits_hash(dx);
    if (reps == 0) {
        double* reference_gpu;
        CHECK(cudaMalloc(&reference_gpu, dx_count * 8));
        reference_kernel<<<(dx_count + 127) / 128, 128>>>(dy_gpu, w_gpu, reference_gpu, s.n, g,
                                                          s.k);
        CHECK(cudaGetLastError());
        std::vector<double> reference(dx_count);
        CHECK(cudaMemcpy(reference.data(), reference_gpu, dx_count * 8, cudaMemcpyDeviceToHost));
        double largest = 0, worst = 0;
        for (size_t i = 0; i < dx_count; ++i) {
            // (float64 overflows nowhere fp32 does not; 0x7f7ff123 stays finite in both)
            const int expected = value_class(reference[i]), got = value_class(dx[i]);
            if (expected != got) {
                if (result.class_mismatches < 3)
                    printf("  class at %zu: dx %g reference %g\n", i, dx[i], reference[i]);
                ++result.class_mismatches;
                continue;
            }
            if (expected != 3) continue;
            largest = fmax(largest, fabs(reference[i]));
            worst = fmax(worst, fabs(reference[i] - dx[i]));
        }
        result.error = worst / largest;
        CHECK(cudaFree(reference_gpu));
    }
    CHECK(cudaFree(dy_gpu));
    CHECK(cudaFree(w_gpu));
    CHECK(cudaFree(dx_gpu));
    CHECK(cudaFree(workspace));
    return result;
}

int main(int argc, char** argv) {
    const char* mode = argc > 1 ? argv[1] : "check";
    if (!strcmp(mode, "check")) {
        const Shape shapes[] = {{2, 64, 20, 130, 128, 3, 1, 1}, {1, 3, 9, 70, 32, 3, 0, 1},
                                {3, 70, 11, 64, 36, 5, 2, 2},  {2, 64, 5, 200, 64, 1, 0, 1},
                                {2, 130, 7, 67, 96, 3, 1, 1},  {1, 1, 3, 129, 32, 3, 2, 1},
                                {4, 130, 40, 128, 64, 3, 1, 1}};  // (480 tiles: several each)
        int bad = 0;
        for (const Shape& s : shapes) {
            const Result v4 = input_grad(s, 4, 0, false), v2 = input_grad(s, 2, 0, false);
            const bool ok = v4.error < 1e-5 && v4.class_mismatches == 0;  // (test bounds)
            bad += !ok;
            printf("check N%d C%d H%d W%d K%d k%d pad%d dil%d v4 rel_err %.3e v2 %.3e hash %016llx"
                   " %s\n", s.n, s.c, s.h, s.w, s.k, s.kernel, s.pad, s.dil, v4.error, v2.error,
                   v4.hash, ok ? "ok" : "BAD");
        }
        const Shape s{2, 64, 12, 100, 64, 3, 1, 1};
        for (int version : {4, 2}) {
            const Result r = input_grad(s, version, 0, true);
            printf("nonfinite v%d class mismatches %d rel_err %.3e %s\n", version,
                   r.class_mismatches, r.error, r.class_mismatches == 0 ? "ok" : "BAD");
            bad += version == 4 && r.class_mismatches != 0;
        }
        printf("%s\n", bad ? "FAILED" : "all ok");
        return bad != 0;
    }
    if (!strcmp(mode, "time") && argc == 7) {
        const Shape s{atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), atoi(argv[5]), atoi(argv[6]),
                      3, 1, 1};
        for (int turn = 0; turn < 2; ++turn)
            for (int version : {4, 2}) {
                const Result r = input_grad(s, version, 20, false);
                printf("time N%d C%d H%d W%d K%d v%d median %.3f ms hash %016llx\n", s.n, s.c,
                       s.h, s.w, s.k, version, r.median_ms, r.hash);
            }
        return 0;
    }
    fprintf(stderr, "usage: %s check | time N C H W K\n", argv[0]);
    return 2;
}
