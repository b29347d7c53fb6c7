// staged_x3_probe.cu — a prototype of the fp32 forward with A staged in three products: v4's
// kernel (cuda/conv_implicit_staged_a.cuh: A boxes by the copy engine, both wgmma operands
// read by descriptor) in 3xTF32, in two forms: each consumer warpgroup on 64-pixel tiles of
// its own, through rings of its own (kShared false), or both on one 128-pixel tile, 64 rows
// each, through one ring, so that each k-block of B crosses L2 once for 128 pixels. A pass
// writes x channels-last as two planes, each value's big TF32 part (to nearest) and its small
// one (split_tf32), stacked as 2N images of one tensor map; a stage holds a box of each plane,
// and each k-step is three wgmmas (a_small b_big, a_big b_small, a_big b_big) into a partial
// sum of kGroup k-blocks that fp32 adds join to the tile's total, as tf32x3.cuh's engine does.
// A prototype: finite x and weights only (the cross parts are the big ones; the operators
// need the cross tile of a non-finite B and a third plane for a non-finite x, docs/notes.md),
// 3 x 3 kernels, stride 1, Cin a multiple of 32, one column tile of 128 output channels.
// The kernel is staged_x3_probe.cuh; this driver checks it against v1 (conv2d_implicit_launch,
// 3xTF32) and a float64 sample, and times it:
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Icuda -Iscripts \
//        -o /tmp/staged_x3 scripts/staged_x3_probe.cu cuda/transpose.cu && /tmp/staged_x3
#include "conv_implicit.cu"
#include "standalone_driver.cuh"
#include "staged_x3_probe.cuh"

#include <cmath>
#include <random>

using namespace scratchops;

struct Case {
    int n, c, h, w, cout, pad;
};

// Everything one case's runs share: the inputs, v1's output, the planes, the packed weights.
struct Inputs {
    Case k;
    Conv2dGeometry g;
    long long xn, yn;
    std::vector<float> hx, hw, hb, h1;
    float *x, *wt, *bias, *y1, *y6, *planes;
    void *packed1, *packed6;
};

// One form of the prototype on the case: its output against v1's and a float64 sample, and
// (timed) its pass and GEMM beside v1.
template <bool kShared, int kAS = 2, int kBS = kShared ? 3 : 2>
int run_form(Inputs& in, bool timed) {
    using C = staged_x3::Cfg<kShared, kAS, kBS>;
    const Case& k = in.k;
    const Conv2dGeometry& g = in.g;
    const tc::PackedB layout = staged_layout<float>(g, k.cout, 128);
    staged_x3::Params p{};
    staged_a::Walk& w = p.walk;
    w.taps_a = 3;
    const int box_rows = C::kTileRows + 2;
    const uint64_t dims[4] = {uint64_t(k.c), uint64_t(k.w), uint64_t(k.h), uint64_t(2 * k.n)};
    const uint64_t strides[3] = {dims[0] * 4, dims[0] * dims[1] * 4,
                                 dims[0] * dims[1] * dims[2] * 4};
    const uint32_t box[4] = {32, uint32_t(box_rows), 1, 1};
    CHECK(make_tensor_map_4d(&p.a_map, in.planes, 4, dims, strides, box));
    w.batch = k.n;
    w.out_h = g.out_h;
    w.out_w = g.out_w;
    w.row_tiles = staged_a::row_tiles(g, C::kTileRows);
    w.n_tiles = layout.n_tiles;
    w.cblocks = k.c / 32;
    w.num_kb = layout.num_kb;
    w.kernel_w = 3;
    w.dil_h = w.dil_w = 1;
    w.pad_h = w.pad_w = k.pad;
    w.groups = 1;
    w.a_loads = 3 * w.cblocks;
    w.box_bytes = box_rows * staged_a::kRowBytes;
    w.tiles = static_cast<int>(staged_a::tile_count(g, k.n, layout.n_tiles, C::kTileRows));
    p.packed_b = static_cast<const uint8_t*>(in.packed6);
    p.b_layout = layout;
    p.images = k.n;
    const ConvTail<float> none{ConvTail<float>::kNone, 0.0f, nullptr, 1.0f};
    const conv_tc::ConvStore<float> store{in.y6, in.bias, none,
                                          conv_tc::fast_geometry<float>(g, k.n, k.cout)};
    auto kernel = staged_x3::staged_x3_kernel<kShared, C, conv_tc::ConvStore<float>>;
    CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               C::kSmemBytes));
    const long long workers = kShared ? w.tiles : (w.tiles + 1) / 2;
    const int ctas = static_cast<int>(std::min<long long>(sm_count(), workers));
    auto pass = [&] {
        staged_x3::planes_kernel<<<4 * sm_count(), 256>>>(in.x, in.planes, k.n, k.c, k.h * k.w);
        return cudaGetLastError();
    };
    auto gemm = [&] {
        kernel<<<ctas, staged_x3::kThreads, C::kSmemBytes>>>(p, store);
        return cudaGetLastError();
    };
    CHECK(cudaMemset(in.y6, 0xff, in.yn * 4));  // (NaN: an output never written fails)
    CHECK(pass());
    CHECK(gemm());
    CHECK(cudaDeviceSynchronize());
    std::vector<float> h6(in.yn);
    CHECK(cudaMemcpy(h6.data(), in.y6, in.yn * 4, cudaMemcpyDeviceToHost));
    double diff = 0, scale = 0;
    long long bad = 0;
    for (long long i = 0; i < in.yn; ++i) {
        if (!std::isfinite(h6[i])) ++bad;
        diff = std::max(diff, double(std::fabs(h6[i] - in.h1[i])));
        scale = std::max(scale, double(std::fabs(in.h1[i])));
    }
    // float64 at 2,000 sampled outputs: the error of v1 and of this form against it
    double e1 = 0, e6 = 0;
    std::mt19937 rng(11);
    std::uniform_int_distribution<long long> pick(0, in.yn - 1);
    for (int s = 0; s < 2000; ++s) {
        const long long i = pick(rng);
        const long long plane = 1LL * g.out_w * g.out_h;
        const int ow = i % g.out_w, oh = i / g.out_w % g.out_h;
        const int co = i / plane % k.cout, n = static_cast<int>(i / (plane * k.cout));
        double ref = in.hb[co];
        for (int ci = 0; ci < k.c; ++ci)
            for (int r = 0; r < 3; ++r)
                for (int q = 0; q < 3; ++q) {
                    const int ih = oh + r - k.pad, iw = ow + q - k.pad;
                    if (ih < 0 || ih >= k.h || iw < 0 || iw >= k.w) continue;
                    ref += double(in.hx[((1LL * n * k.c + ci) * k.h + ih) * k.w + iw]) *
                           in.hw[((co * k.c + ci) * 3 + r) * 3 + q];
                }
        e1 = std::max(e1, std::fabs(in.h1[i] - ref));
        e6 = std::max(e6, std::fabs(h6[i] - ref));
    }
    printf("  %s, %d A and %d B stages: non-finite %lld, max|this - v1| %.3g of max|y| %.3g; "
           "float64 sample: v1 %.3g, this %.3g\n",
           kShared ? "shared 128-pixel tile" : "own 64-pixel tiles", kAS, kBS, bad, diff, scale,
           e1, e6);
    if (timed) {
        const float tp = median_ms(pass, 11), tg = median_ms(gemm, 11);
        printf("    pass %.3f + GEMM %.3f = %.3f ms\n", tp, tg, tp + tg);
    }
    return bad == 0 ? 0 : 1;
}

int run_case(const Case& k, bool timed) {
    Inputs in{};
    in.k = k;
    Conv2dGeometry& g = in.g;
    g.channels = k.c;
    g.height = k.h;
    g.width = k.w;
    g.kernel_h = g.kernel_w = 3;
    g.stride_h = g.stride_w = 1;
    g.pad_h = g.pad_w = k.pad;
    g.dil_h = g.dil_w = 1;
    g.out_h = k.h + 2 * k.pad - 2;
    g.out_w = k.w + 2 * k.pad - 2;
    in.xn = 1LL * k.n * k.c * k.h * k.w;
    in.yn = 1LL * k.n * k.cout * g.out_h * g.out_w;
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    in.hx.resize(in.xn);
    in.hw.resize(9LL * k.cout * k.c);
    in.hb.resize(k.cout);
    for (auto& v : in.hx) v = u(rng);
    for (auto& v : in.hw) v = (2 * u(rng) - 1) / 24;
    for (auto& v : in.hb) v = 2 * u(rng) - 1;
    in.x = to_device(in.hx);
    in.wt = to_device(in.hw);
    in.bias = to_device(in.hb);
    CHECK(cudaMalloc(&in.y1, in.yn * 4));
    CHECK(cudaMalloc(&in.y6, in.yn * 4));
    CHECK(cudaMalloc(&in.planes, 2 * in.xn * 4));
    CHECK(cudaMalloc(&in.packed1, conv2d_implicit_packed_bytes(g, k.cout)));
    CHECK(cudaMalloc(&in.packed6, conv2d_implicit_packed_bytes(g, k.cout)));
    const ConvTail<float> none{ConvTail<float>::kNone, 0.0f, nullptr, 1.0f};
    auto v1 = [&] {
        return conv2d_implicit_launch<float>(in.x, in.packed1, in.bias, in.y1, k.n, k.cout, g,
                                             none, false, TensorCorePath::kWgmma, 0, true,
                                             nullptr, in.wt);
    };
    CHECK(v1());
    CHECK((pack_staged<128, float>(in.wt, k.cout, g, in.packed6, 0)));
    CHECK(cudaDeviceSynchronize());
    in.h1.resize(in.yn);
    CHECK(cudaMemcpy(in.h1.data(), in.y1, in.yn * 4, cudaMemcpyDeviceToHost));
    printf("N=%d C=%d %dx%d Cout=%d pad %d", k.n, k.c, k.h, k.w, k.cout, k.pad);
    if (timed) printf(": v1 %.3f ms", median_ms(v1, 11));
    printf("\n");
    const int fails = run_form<false>(in, timed) + run_form<true>(in, timed) +
                      run_form<true, 2, 4>(in, timed) + run_form<true, 3, 3>(in, timed);
    for (void* q : {(void*)in.x, (void*)in.wt, (void*)in.bias, (void*)in.y1, (void*)in.y6,
                    (void*)in.planes, in.packed1, in.packed6})
        CHECK(cudaFree(q));
    return fails;
}

int main() {
    int fails = 0;
    fails += run_case({3, 64, 37, 41, 128, 1}, false);
    fails += run_case({2, 96, 20, 130, 128, 0}, false);
    fails += run_case({2, 64, 9, 70, 128, 1}, false);
    fails += run_case({128, 64, 128, 128, 128, 0}, true);
    printf(fails ? "FAIL\n" : "ok\n");
    return fails;
}
