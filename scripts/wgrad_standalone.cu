// wgrad_standalone.cu — the convolution's weight gradient on the tensor cores
// (conv2d_weight_grad_launch, the tensor-core version, on the wgmma engine) without torch or
// the extension: built on a machine with nvcc and no GPU, then run on the GPU in seconds, so
// that a kernel change can be checked, timed and put under compute-sanitizer and ncu without
// the extension's build on the GPU machine (a few minutes a tree). docs/notes.md ("The
// weight gradient's dy split by the consumers") used it.
//   check  nine small shapes (odd sizes, a single channel, partial tiles; the last four with
//          output rows of whole k-blocks, which the weight gradient v4 takes) in 3xTF32 and
//          TF32: the largest error against a float64 kernel over the largest |dW|, and a hash
//          of dW's bits (to compare two builds bit for bit); then two shapes with Inf, NaN and
//          a value that rounds up to Inf in dy (the second, a v4 shape, in x too), by hash
//   time N C H W K   the median of 20 calls (CUDA events, no L2 flush: the call reads 1 GB
//          at P31's size) of a 3x3 convolution's weight gradient, 3xTF32 and TF32
//   rule N C H W K   P31's form (3xTF32): the weight gradient of the min's gradient computed
//          by the packing from dy and random shares (DyColumns<float, true>) against the
//          plain weight gradient of that gradient made first; medians of 20 calls in turns,
//          and whether the two dW have the same bits (they must)
// Build (the repository root as working directory; with -I pointing at another tree's cuda/
// to build that tree's kernels instead):
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Icuda -o /tmp/wgrad \
//        scripts/wgrad_standalone.cu cuda/transpose.cu cuda/gemm.cu cuda/conv_implicit.cu \
//        cuda/tf32_round.cu cuda/conv_im2col.cu cuda/min_add_mul_backward_channels_last.cu
//   /tmp/wgrad check && /tmp/wgrad time 128 64 128 128 128
// (conv_backward.cu's other launchers need those files, P31's four gradients at once the
// min's pass; the weight gradient itself uses only transpose.cu's batch sum.)
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

// dW[k][c][r][s] = sum over n, oh, ow of dy[n][k][oh][ow] * x[n][c][oh + r][ow + s] (stride 1,
// no padding) in float64, one thread an element: the reference for the small shapes.
__global__ void reference_kernel(const float* dy, const float* x, double* dw, int n_images,
                                 int channels, int height, int width, int out_channels) {
    const int out_h = height - 2, out_w = width - 2;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= out_channels * channels * 9) return;
    const int s = i % 3, r = (i / 3) % 3, c = (i / 9) % channels, k = i / (9 * channels);
    double sum = 0;
    for (int n = 0; n < n_images; ++n)
        for (int oh = 0; oh < out_h; ++oh)
            for (int ow = 0; ow < out_w; ++ow)
                sum += static_cast<double>(dy[((n * out_channels + k) * out_h + oh) * out_w + ow]) *
                       x[((n * channels + c) * height + oh + r) * width + ow + s];
    dw[i] = sum;
}

struct Shape {
    int n_images, channels, height, width, out_channels;
};
struct Result {
    unsigned long long hash;  // FNV-1a over dW's bits
    double error;             // largest |dW - reference| / largest |reference| (check mode)
    float median_ms;          // (timed calls only)
    int nans, infs;
};

// A shape's 3 x 3, stride-1, unpadded convolution and its tensors' element counts.
struct Sizes {
    Conv2dGeometry g;
    size_t x_count, dy_count, dw_count;
};
static Sizes sizes_of(const Shape& shape) {
    const int out_h = shape.height - 2, out_w = shape.width - 2;
    return {{shape.channels, shape.height, shape.width, 3, 3, 1, 1, 0, 0, 1, 1, out_h, out_w},
            size_t(shape.n_images) * shape.channels * shape.height * shape.width,
            size_t(shape.n_images) * shape.out_channels * out_h * out_w,
            size_t(shape.out_channels) * shape.channels * 9};
}

// One shape, 3x3 and stride 1: x and dy uniform in [-1, 1] (with_nonfinite: Inf, NaN and
// +-0x7f7ff123, which rounds up to Inf as a TF32, put into dy; in_x: into x as well), dW
// poisoned with NaN, one call checked, then `reps` calls timed; the error against the
// reference where `compare`.
static Result weight_grad(const Shape& shape, bool tf32, int reps, bool compare,
                          bool with_nonfinite, bool in_x = false) {
    const Sizes z = sizes_of(shape);
    const Conv2dGeometry& g = z.g;
    const size_t x_count = z.x_count, dy_count = z.dy_count, dw_count = z.dw_count;
    std::vector<float> x(x_count), dy(dy_count), dw(dw_count);
    std::mt19937 generator(7);
    std::uniform_real_distribution<float> uniform(-1.f, 1.f);
    for (float& v : x) v = uniform(generator);
    for (float& v : dy) v = uniform(generator);
    if (with_nonfinite) {
        const uint32_t rounds_to_inf_bits = 0x7f7ff123u;
        float rounds_to_inf;
        memcpy(&rounds_to_inf, &rounds_to_inf_bits, 4);
        dy[5] = INFINITY, dy[dy_count / 2] = rounds_to_inf, dy[dy_count / 3] = -rounds_to_inf;
        dy[dy_count - 3] = NAN;
        if (in_x) {
            x[7] = -INFINITY, x[x_count / 2] = NAN, x[x_count / 3] = rounds_to_inf;
            x[x_count - 1] = INFINITY;  // (the last column: read by padding slots alone)
        }
    }
    float *x_gpu = to_device(x), *dy_gpu = to_device(dy), *dw_gpu, *workspace;
    CHECK(cudaMalloc(&dw_gpu, dw_count * 4));
    CHECK(cudaMemset(dw_gpu, 0xff, dw_count * 4));  // NaN
    const long long budget = 1LL << 30;  // (versions.TENSOR_CORE_GRAD_WORKSPACE_BYTES)
    const long long elements = conv2d_grad_workspace_elements<float>(
        true, shape.n_images, shape.out_channels, g, kGemmTensorCoreVersion,
        TensorCorePath::kWgmma, tf32, budget);
    CHECK(cudaMalloc(&workspace, elements * 4));
    CHECK(cudaMemset(workspace, 0xff, elements * 4));
    auto call = [&] {
        return conv2d_weight_grad_launch<float>(dy_gpu, x_gpu, dw_gpu, shape.n_images,
                                                shape.out_channels, g, kGemmTensorCoreVersion,
                                                TensorCorePath::kWgmma, tf32, workspace,
                                                elements, nullptr);
    };
    CHECK(call());
    CHECK(cudaDeviceSynchronize());
    Result result{};
    if (reps > 0) result.median_ms = median_ms(call, reps);
    CHECK(cudaMemcpy(dw.data(), dw_gpu, dw_count * 4, cudaMemcpyDeviceToHost));
    result.hash = bits_hash(dw);
    for (float v : dw) {
        result.nans += v != v;
        result.infs += std::isinf(v);
    }
    if (compare) {
        double* reference_gpu;
        CHECK(cudaMalloc(&reference_gpu, dw_count * 8));
        reference_kernel<<<(dw_count + 127) / 128, 128>>>(dy_gpu, x_gpu, reference_gpu,
                                                          shape.n_images, shape.channels,
                                                          shape.height, shape.width,
                                                          shape.out_channels);
        CHECK(cudaGetLastError());
        std::vector<double> reference(dw_count);
        CHECK(cudaMemcpy(reference.data(), reference_gpu, dw_count * 8,
                         cudaMemcpyDeviceToHost));
        double largest = 0, worst = 0;
        for (size_t i = 0; i < dw_count; ++i) {
            const double difference = fabs(reference[i] - dw[i]);
            largest = fmax(largest, fabs(reference[i]));
            worst = difference != difference ? INFINITY : fmax(worst, difference);  // NaN fails
        }
        result.error = worst / largest;
        CHECK(cudaFree(reference_gpu));
    }
    CHECK(cudaFree(x_gpu));
    CHECK(cudaFree(dy_gpu));
    CHECK(cudaFree(dw_gpu));
    CHECK(cudaFree(workspace));
    return result;
}

// The rule's form against the plain one (see the top): x, dy uniform in [-1, 1], shares
// uniform in {0, 1, 2}, factor 2; the plain form reads dy * 2 * share / 2, made on the host.
static void rule_vs_plain(const Shape& shape) {
    const Sizes z = sizes_of(shape);
    const Conv2dGeometry& g = z.g;
    const size_t x_count = z.x_count, dy_count = z.dy_count, dw_count = z.dw_count;
    const float factor = 2.0f;
    std::vector<float> x(x_count), dy(dy_count), rule(dy_count), dw(dw_count);
    std::vector<uint8_t> halves(dy_count);
    std::mt19937 generator(11);
    std::uniform_real_distribution<float> uniform(-1.f, 1.f);
    for (float& v : x) v = uniform(generator);
    for (size_t i = 0; i < dy_count; ++i) {
        dy[i] = uniform(generator);
        halves[i] = static_cast<uint8_t>(generator() % 3);
        rule[i] = dy[i] * factor * (0.5f * static_cast<float>(halves[i]));  // (exact in fp32)
    }
    float *x_gpu = to_device(x), *dy_gpu = to_device(dy), *rule_gpu = to_device(rule);
    uint8_t* halves_gpu = to_device(halves);
    float *dw_gpu, *workspace;
    CHECK(cudaMalloc(&dw_gpu, dw_count * 4));
    const long long budget = 1LL << 30;  // (versions.TENSOR_CORE_GRAD_WORKSPACE_BYTES)
    const long long elements = conv2d_grad_workspace_elements<float>(
        true, shape.n_images, shape.out_channels, g, kGemmTensorCoreVersion,
        TensorCorePath::kWgmma, false, budget);
    CHECK(cudaMalloc(&workspace, elements * 4));
    auto plain = [&] {
        return weight_grad_implicit<float>(rule_gpu, x_gpu, dw_gpu, shape.n_images,
                                           shape.out_channels, g, TensorCorePath::kWgmma, false,
                                           workspace, elements * 4, nullptr);
    };
    auto with_rule = [&] {
        return weight_grad_implicit<float>(dy_gpu, x_gpu, dw_gpu, shape.n_images,
                                           shape.out_channels, g, TensorCorePath::kWgmma, false,
                                           workspace, elements * 4, nullptr, halves_gpu, factor);
    };
    unsigned long long hashes[2];
    for (int turn = 0; turn < 2; ++turn)
        for (int form = 0; form < 2; ++form) {
            CHECK(cudaMemset(dw_gpu, 0xff, dw_count * 4));  // NaN
            const float ms = form == 0 ? median_ms(plain, 20) : median_ms(with_rule, 20);
            CHECK(cudaMemcpy(dw.data(), dw_gpu, dw_count * 4, cudaMemcpyDeviceToHost));
            hashes[form] = bits_hash(dw);
            printf("rule N%d C%d H%d W%d K%d %s median %.3f ms hash %016llx\n", shape.n_images,
                   shape.channels, shape.height, shape.width, shape.out_channels,
                   form == 0 ? "plain" : "rule ", ms, hashes[form]);
        }
    printf("rule: the two forms' dW %s\n", hashes[0] == hashes[1] ? "bit for bit" : "DIFFER");
    for (void* p : {static_cast<void*>(x_gpu), static_cast<void*>(dy_gpu),
                    static_cast<void*>(rule_gpu), static_cast<void*>(halves_gpu),
                    static_cast<void*>(dw_gpu), static_cast<void*>(workspace)})
        CHECK(cudaFree(p));
}

int main(int argc, char** argv) {
    const char* mode = argc > 1 ? argv[1] : "check";
    if (!strcmp(mode, "check")) {
        // (The fourth on are the weight gradient v4's: output rows of whole k-blocks, 32, 64,
        // 96 and 128 pixels; slices across images, a half-empty tile, a single channel.)
        const Shape shapes[] = {{1, 1, 5, 7, 1},      {2, 3, 17, 19, 5},   {3, 64, 20, 23, 128},
                                {2, 8, 34, 33, 64},   {5, 16, 11, 40, 70}, {2, 3, 30, 34, 5},
                                {3, 64, 20, 66, 128}, {4, 20, 13, 98, 40}, {1, 1, 9, 130, 1}};
        for (const Shape& s : shapes)
            for (int tf32 = 0; tf32 < 2; ++tf32) {
                const Result r = weight_grad(s, tf32, 0, true, false);
                // (tests/test_tensor_cores.py's bounds on the gradients against float64)
                const bool ok = r.error < (tf32 ? 4e-3 : 1e-5);
                printf("check N%d C%d H%d W%d K%d tf32=%d rel_err %.3e hash %016llx %s\n",
                       s.n_images, s.channels, s.height, s.width, s.out_channels, tf32, r.error,
                       r.hash, ok ? "ok" : "BAD");
            }
        for (int tf32 = 0; tf32 < 2; ++tf32) {
            const Result r = weight_grad({3, 64, 20, 23, 128}, tf32, 0, false, true);
            printf("nonfinite N3 C64 H20 W23 K128 tf32=%d hash %016llx nan %d inf %d\n", tf32,
                   r.hash, r.nans, r.infs);
            const Result v4 = weight_grad({3, 64, 20, 66, 128}, tf32, 0, false, true, true);
            printf("nonfinite x and dy N3 C64 H20 W66 K128 tf32=%d hash %016llx nan %d inf %d\n",
                   tf32, v4.hash, v4.nans, v4.infs);
        }
        return 0;
    }
    if (!strcmp(mode, "time") && argc == 7) {
        const Shape s{atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), atoi(argv[5]), atoi(argv[6])};
        for (int tf32 = 0; tf32 < 2; ++tf32) {
            const Result r = weight_grad(s, tf32, 20, false, false);
            printf("time N%d C%d H%d W%d K%d tf32=%d median %.3f ms hash %016llx\n", s.n_images,
                   s.channels, s.height, s.width, s.out_channels, tf32, r.median_ms, r.hash);
        }
        return 0;
    }
    if (!strcmp(mode, "rule") && argc == 7) {
        rule_vs_plain({atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), atoi(argv[5]), atoi(argv[6])});
        return 0;
    }
    fprintf(stderr, "usage: %s check | time N C H W K | rule N C H W K\n", argv[0]);
    return 2;
}
