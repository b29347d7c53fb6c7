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
// Checked against v1 (conv2d_implicit_launch, 3xTF32) and a float64 sample, and timed:
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Icuda -Iscripts \
//        -o /tmp/staged_x3 scripts/staged_x3_probe.cu cuda/transpose.cu && /tmp/staged_x3
#include "conv_implicit.cu"
#include "standalone_driver.cuh"

#include <cmath>
#include <random>

namespace scratchops {
namespace staged_x3 {

using staged_a::a_descriptor;
using staged_a::kHaloRows;
using staged_a::kRowBytes;
using staged_a::kStoreChannels;
using staged_a::Walk;
constexpr int kConsumers = 2, kThreads = 384, kBN = 128, kGroup = 9;
constexpr int kBTileBytes = kBN * kRowBytes;   // one TF32 tile
constexpr int kBStageBytes = 2 * kBTileBytes;  // big, small
constexpr int kStoreStride = 64 + 4;           // a consumer stores 64 rows
constexpr int kStoreStageBytes = (kStoreChannels * kStoreStride * 4 + 15) / 16 * 16;
constexpr int kStoreBytes = kStoreStageBytes + 8 * kBN;
template <bool kShared, int kAStages = 2, int kBStages = kShared ? 3 : 2>
struct Cfg {
    static constexpr int kTileRows = kShared ? 128 : 64;
    static constexpr int kRings = kShared ? 1 : kConsumers;
    static constexpr int kPlaneBytes = (kTileRows + kHaloRows) * kRowBytes;  // 1024-aligned
    static constexpr int kAStageBytes = 2 * kPlaneBytes;                      // big, small
    static constexpr int kAS = kAStages, kBS = kBStages;
    static constexpr int kRingBytes = kAS * kAStageBytes + kBS * kBStageBytes;
    static constexpr int kSmemBytes =
        kRings * kRingBytes + kConsumers * kStoreBytes + tc::kAlignSlack;
    static_assert(kSmemBytes <= staged_a::kMaxSmemBytes, "the rings fit");
};

struct Params {
    CUtensorMap a_map;  // (C, W, H, 2N): images n, then their small planes at N + n
    const uint8_t* packed_b;
    tc::PackedB b_layout;
    Walk walk;
    int images;
};

// The pass: tile (64 channels x 64 pixels) of an image into both planes.
__global__ void __launch_bounds__(256) planes_kernel(const float* x, float* planes, int images,
                                                     int channels, int pixels) {
    __shared__ float tile[kVecTile][kVecTile + 1];
    const int tiles_p = (pixels + kVecTile - 1) / kVecTile;
    const int per_image = (channels + kVecTile - 1) / kVecTile * tiles_p;
    const long long image_floats = static_cast<long long>(channels) * pixels;
    for (long long t = blockIdx.x; t < static_cast<long long>(per_image) * images;
         t += gridDim.x) {
        const int image = static_cast<int>(t / per_image), ti = static_cast<int>(t % per_image);
        const int c0 = ti / tiles_p * kVecTile, p0 = ti % tiles_p * kVecTile;
        channels_last_tile_load(x, channels, pixels, c0, p0, image, tile, threadIdx.x,
                                blockDim.x);
        __syncthreads();
        channels_last_tile_store<float, true>(tile, planes + image * image_floats, channels,
                                              pixels, c0, p0, threadIdx.x, blockDim.x);
        channels_last_tile_store<float, true, true>(
            tile, planes + (images + image) * image_floats, channels, pixels, c0, p0,
            threadIdx.x, blockDim.x);
        __syncthreads();
    }
}

// The rings' barriers: a stage is empty once each warp that reads it (4 a ring of its own, 8
// a shared one) has released it.
template <class C>
struct Barriers {
    uint64_t a_full[C::kRings][C::kAS], a_empty[C::kRings][C::kAS];
    uint64_t b_full[C::kRings][C::kBS], b_empty[C::kRings][C::kBS];
    __device__ void init() {
        const int readers = 4 * kConsumers / C::kRings;
        for (int c = 0; c < C::kRings; ++c) {
            for (int i = 0; i < C::kAS; ++i) {
                mbarrier_init(&a_full[c][i], 1);
                mbarrier_init(&a_empty[c][i], readers);
            }
            for (int i = 0; i < C::kBS; ++i) {
                mbarrier_init(&b_full[c][i], 1);
                mbarrier_init(&b_empty[c][i], readers);
            }
        }
        fence_barrier_init();
    }
};

// Ring c's tiles: a CTA's in turn (shared), or consumer c's (its own).
template <bool kShared>
__device__ __forceinline__ int first_tile(int c) {
    return kShared ? blockIdx.x : blockIdx.x * kConsumers + c;
}
template <bool kShared>
__device__ __forceinline__ int tile_step() {
    return kShared ? gridDim.x : gridDim.x * kConsumers;
}

template <bool kShared, class C>
__device__ void fill_rings(const Params& p, uint8_t* rings, Barriers<C>& bars, int c) {
    constexpr int kAS = C::kAS, kBS = C::kBS, kAStageBytes = C::kAStageBytes;
    const Walk& w = p.walk;
    uint8_t* a_ring = rings + c * C::kRingBytes;
    uint8_t* b_ring = a_ring + kAS * kAStageBytes;
    int a_j = 0, b_j = 0;
    for (int t = first_tile<kShared>(c); t < w.tiles; t += tile_step<kShared>()) {
        int n, oh, ow0, nt;
        w.tile(t, C::kTileRows, n, oh, ow0, nt);
        const uint8_t* b_tile = p.packed_b + static_cast<long long>(nt) * w.num_kb *
                                                 p.b_layout.stage_bytes();
        for (int l = 0; l < w.a_loads; ++l, ++a_j) {
            int r, g, cb;
            w.box(l, r, g, cb);
            const int as = a_j % kAS;
            if (a_j >= kAS) mbarrier_wait(&bars.a_empty[c][as], ((a_j / kAS) - 1) & 1);
            mbarrier_arrive_expect_tx(&bars.a_full[c][as], 2 * w.box_bytes);
            const int col = ow0 + g * w.taps_a * w.dil_w - w.pad_w;
            const int row = oh + r * w.dil_h - w.pad_h;
            uint8_t* dst = a_ring + as * kAStageBytes;
            tma_load_4d(dst, &p.a_map, cb * tc::kBlockK, col, row, n, &bars.a_full[c][as]);
            tma_load_4d(dst + C::kPlaneBytes, &p.a_map, cb * tc::kBlockK, col, row, p.images + n,
                        &bars.a_full[c][as]);
            for (int i = 0; i < w.taps_a; ++i, ++b_j) {
                const int bs = b_j % kBS;
                if (b_j >= kBS) mbarrier_wait(&bars.b_empty[c][bs], ((b_j / kBS) - 1) & 1);
                mbarrier_arrive_expect_tx(&bars.b_full[c][bs], kBStageBytes);
                bulk_copy_to_shared(b_ring + bs * kBStageBytes,
                                    b_tile + w.kblock(r, g, cb, i) * p.b_layout.stage_bytes(),
                                    kBStageBytes, &bars.b_full[c][bs]);
            }
        }
    }
}

template <bool kShared, class C, class Epilogue>
__global__ void __launch_bounds__(kThreads, 1)
    staged_x3_kernel(const __grid_constant__ Params p, const Epilogue epilogue) {
    constexpr int kAS = C::kAS, kBS = C::kBS, kAStageBytes = C::kAStageBytes;
    extern __shared__ uint8_t smem_raw[];
    __shared__ Barriers<C> bars;
    uint8_t* rings = tc::align_1024(smem_raw);
    const Walk& w = p.walk;
    const int role = threadIdx.x / kWarpgroupThreads;
    if (threadIdx.x == 0) bars.init();
    __syncthreads();
    if (role == 0) {
        setmaxnreg_dec<staged_a::kProducerRegisters>();
        const int c = threadIdx.x / 32;
        if (c < C::kRings && threadIdx.x % 32 == 0) fill_rings<kShared, C>(p, rings, bars, c);
        return;
    }
    setmaxnreg_inc<staged_a::kConsumerRegisters>();
    const int c = role - 1, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    const int ring = kShared ? 0 : c;
    const int half_rows = kShared ? 64 * c : 0;  // (this consumer's rows of the tile)
    const tc::TileCoords me{0, 0, 0, 0, warp, lane};
    const uint32_t a_ring = smem_address(rings) + ring * C::kRingBytes;
    const uint32_t b_ring = a_ring + kAS * kAStageBytes;
    uint8_t* store_area = rings + C::kRings * C::kRingBytes + c * kStoreBytes;
    float* column_params = reinterpret_cast<float*>(store_area + kStoreStageBytes);
    float total[1][kBN / 2], part[1][kBN / 2];
    tc::set_zero(part);
    int prev_a = -1, prev_b = -1, a_j = 0, b_j = 0;
    auto release_prev = [&] {
        if (lane == 0 && prev_b >= 0) mbarrier_arrive(&bars.b_empty[ring][prev_b]);
        if (lane == 0 && prev_a >= 0) mbarrier_arrive(&bars.a_empty[ring][prev_a]);
    };
    const int me_in_group = warp * 32 + lane;
    for (int t = first_tile<kShared>(c); t < w.tiles; t += tile_step<kShared>()) {
        int n, oh, ow0, nt;
        w.tile(t, C::kTileRows, n, oh, ow0, nt);
        float add = 0.0f, add2 = 0.0f;
        if (me_in_group < kBN) epilogue.channel_params(nt * kBN + me_in_group, add, add2);
        tc::set_zero(total);
        int kb = 0;
        for (int l = 0; l < w.a_loads; ++l, ++a_j) {
            int r, g, cb;
            w.box(l, r, g, cb);
            const int as = a_j % kAS;
            mbarrier_wait(&bars.a_full[ring][as], (a_j / kAS) & 1);
            const uint32_t a_big_base = a_ring + as * kAStageBytes + half_rows * kRowBytes;
            for (int i = 0; i < w.taps_a; ++i, ++kb, ++b_j) {
                const int bs = b_j % kBS;
                mbarrier_wait(&bars.b_full[ring][bs], (b_j / kBS) & 1);
                const uint32_t b_address = b_ring + bs * kBStageBytes;
                const uint64_t b_big = make_smem_desc_sw128(b_address);
                const uint64_t b_small = make_smem_desc_sw128(b_address + kBTileBytes);
                const uint64_t a_big = a_descriptor(a_big_base + i * w.dil_w * kRowBytes);
                const uint64_t a_small =
                    a_descriptor(a_big_base + C::kPlaneBytes + i * w.dil_w * kRowBytes);
                const bool fresh = kb % kGroup == 0;
                pin_registers(part[0]);
                wgmma_fence();
#pragma unroll
                for (int s = 0; s < 4; ++s) {
                    WgmmaTf32Ss<kBN>::mma(part[0], a_small + 2 * s, b_big + 2 * s,
                                          !fresh || s > 0);
                    WgmmaTf32Ss<kBN>::mma(part[0], a_big + 2 * s, b_small + 2 * s, 1);
                    WgmmaTf32Ss<kBN>::mma(part[0], a_big + 2 * s, b_big + 2 * s, 1);
                }
                wgmma_commit();
                wgmma_wait<1>();
                release_prev();
                prev_b = bs;
                prev_a = i == w.taps_a - 1 ? as : -1;
                if ((kb + 1) % kGroup == 0 || kb + 1 == w.num_kb) {  // the partial sum joins
                    wgmma_wait<0>();
                    pin_registers(part[0]);
#pragma unroll
                    for (int v = 0; v < kBN / 2; ++v) total[0][v] += part[0][v];
                }
            }
        }
        release_prev();
        prev_a = prev_b = -1;
        const int first = ow0 + half_rows;  // (past the row's end: nothing to store)
        tc::TileCoords at = me.at(n, (n * w.out_h + oh) * w.out_w + first, nt * kBN);
        at.rows = w.out_w - first < 64 ? w.out_w - first : 64;
        if (at.rows <= 0) continue;
        if (me_in_group < kBN) {
            column_params[me_in_group] = add;
            column_params[kBN + me_in_group] = add2;
        }
        named_barrier_sync(1 + c, kWarpgroupThreads);
        epilogue.template store_staged<kBN, 1, kStoreChannels, kStoreStride>(
            total, at, reinterpret_cast<float*>(store_area), column_params, 1 + c);
    }
}

}  // namespace staged_x3
}  // namespace scratchops

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
