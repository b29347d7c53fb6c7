// conv_gn_pool.cu — P85 in one pass, the host side: the workspace, the choice of version,
// and the launches (the kernels and their derivation: conv_gn_pool.cuh and the files
// it lists).
#include <type_traits>

#include "conv_gn_pool.cuh"
#include "conv_gn_pool_finalize.cuh"
#include "conv_gn_pool_v1.cuh"
#include "conv_gn_pool_v2.cuh"
#include "conv_gn_pool_v3.cuh"
#include "tensor_core_launch.cuh"

namespace scratchops {

namespace conv_gn_pool {

// v3's tile: 4 output rows x 16 columns, whose input halo is halo_h x halo_w pixels (the
// other fields: conv_gn_pool_launch's, for the kernel).
V3Shape v3_halo(const Conv2dGeometry& g) {
    V3Shape shape{(kPool - 1) * g.stride_h + (g.kernel_h - 1) * g.dil_h + 1,
                  (kWideBandCols - 1) * g.stride_w + (g.kernel_w - 1) * g.dil_w + 1,
                  g.kernel_h * g.kernel_w, 0, 0, -1, {}};
    shape.raw_pitch = (shape.halo_w + 3) / 4 * 4;
    return shape;
}

// Whether v3's kernel runs the call of `version`: version 3 where v3 covers it (the wgmma
// engine, products as exact as fp32's: 3xTF32 for float, where the reductions it covers, at
// most 96 long, are below the TF32 rule's kTf32MinReduction anyway; any product of the half
// types), Cin <= 8, at most kV3MaxKBlocks k-blocks and the halo within its shared memory.
template <class T>
bool v3_runs(int version, TensorCorePath engine, bool tf32, const Conv2dGeometry& g,
             int out_channels) {
    const tc::PackedB layout = conv_tc::weight_layout(g, out_channels, kBN);
    const V3Shape shape = v3_halo(g);
    return version == 3 && (is_half_type<T>() || !tensor_cores_single_product<T>(tf32)) &&
           engine == TensorCorePath::kWgmma && g.channels <= 8 &&
           layout.num_kb <= kV3MaxKBlocks && shape.halo_h * shape.raw_pitch <= kHaloPixels;
}

// v3's launch: a persistent grid, whose CTAs' warpgroups take a tile each, from the weight
// tensor itself (relay_weights).
template <class T>
cudaError_t launch_v3(const T* x, const T* weight, const tc::PackedB& layout,
                      const Params<T>& params, const ConvGeometryFast& f,
                      const BandPixels& wide_bands, const V3Shape& shape, int batch,
                      cudaStream_t stream) {
    const int smem = v3_smem_bytes<T>(layout.num_kb);
    // The limit, once per device: the most any launch asks (common.cuh).
    static std::atomic<unsigned long long> smem_set_on;
    const cudaError_t err =
        allow_dynamic_smem(smem_set_on, conv_gn_pool_v3_kernel<T>, v3_smem_bytes<T>(kV3MaxKBlocks));
    if (err != cudaSuccess) return err;
    const long long tiles = static_cast<long long>(batch) * wide_bands.tiles_per_image;
    const long long groups_of_tiles = (tiles + v3_warpgroups<T>() - 1) / v3_warpgroups<T>();
    const int ctas = static_cast<int>(groups_of_tiles < sm_count() ? groups_of_tiles : sm_count());
    conv_gn_pool_v3_kernel<T><<<ctas, v3_threads<T>(), smem, stream>>>(x, weight, layout, params,
                                                                       f, wide_bands, shape);
    return cudaGetLastError();
}

}  // namespace conv_gn_pool

long long conv_gn_pool_workspace_bytes(int batch, int out_channels, const Conv2dGeometry& g,
                                       int groups, bool extremes_kept) {
    using namespace conv_gn_pool;
    const long long extremes =
        extremes_kept ? 0
                      : static_cast<long long>(batch) * out_channels * (g.out_h / kPool) *
                            (g.out_w / kPool);
    return 4 * (stats_floats(batch, g, groups) + extremes);
}

template <class T>
bool conv_gn_pool_reads_packed(int version, const Conv2dGeometry& g, int out_channels,
                               bool tf32, TensorCorePath engine) {
    return version != kConvGnPoolCudaCoreVersion &&
           !conv_gn_pool::v3_runs<T>(version, engine, tf32, g, out_channels);
}

template <class T>
cudaError_t conv_gn_pool_launch(int version, const T* x, const T* weight, const void* packed,
                                const GnPoolArgs<T>& a, T* y, int batch, int out_channels,
                                const Conv2dGeometry& g, bool tf32, TensorCorePath engine,
                                void* workspace, cudaStream_t stream) {
    using namespace conv_gn_pool;
    if (batch <= 0) return cudaSuccess;
    if (version < 1 || version > kConvGnPoolVersions || out_channels <= 0 ||
        out_channels > kBN || a.groups <= 0 || out_channels % a.groups != 0 ||
        g.out_h < kPool || g.out_w < kPool)
        return cudaErrorInvalidValue;  // the caller picks the three-stage chain for these
    const ConvGeometryFast f = conv_tc::fast_geometry(g, batch, out_channels);
    const BandPixels bands = band_pixels(g, kBandCols);
    const BandPixels wide_bands = band_pixels(g, kWideBandCols);
    auto* stats = static_cast<float*>(workspace);
    float* extremes =
        a.kept_extremes != nullptr ? a.kept_extremes : stats + stats_floats(batch, g, a.groups);
    const Params<T> params{a.conv_bias, a.gamma,   a.scale,         stats,
                           extremes,    a.groups, g.out_h / kPool, g.out_w / kPool};
    const tc::PackedB layout = conv_tc::weight_layout(g, out_channels, kBN);
    const long long rows = static_cast<long long>(batch) * bands.tiles_per_image * kTileRows;
    if (rows > kMaxInt32Count) return cudaErrorInvalidValue;
    const auto* p = static_cast<const uint8_t*>(packed);
    cudaError_t err = cudaSuccess;
    BandPixels finalize_bands = bands;  // the tiles whose statistics the finalize merges
    V3Shape shape = v3_halo(g);
    shape.wide = g.stride_w == 1 && g.width % 4 == 0 && g.pad_w % 4 == 0 &&
                 reinterpret_cast<uintptr_t>(x) % 16 == 0;
    const int cpg = out_channels / a.groups;
    for (int shift = 0; shift <= 3; ++shift)
        if (cpg == 1 << shift) shape.group_shift = shift;
    for (int j = 0; j < kV3MaxTaps && j < shape.taps; ++j)
        shape.tap_offset[j] =
            (j / g.kernel_w) * g.dil_h * shape.halo_w + (j % g.kernel_w) * g.dil_w;
    // The tensor cores' products: one TF32 product (TF32 mode, and the half types), or three.
    const bool single_product = tensor_cores_single_product<T>(tf32);
    if (version == kConvGnPoolCudaCoreVersion) {
        err = tf32 ? launch_v1<true>(x, weight, params, g, batch, out_channels, wide_bands,
                                     stream)
                   : launch_v1<false>(x, weight, params, g, batch, out_channels, wide_bands,
                                      stream);
        finalize_bands = wide_bands;
    } else if (v3_runs<T>(version, engine, tf32, g, out_channels)) {
        err = launch_v3(x, weight, layout, params, f, wide_bands, shape, batch, stream);
        finalize_bands = wide_bands;
    } else {
        // Op: the operand type multiplied (float: TF32; T: natively, tensor_cores_native16),
        // which sets the loader's k-blocks and the packed layout.
        auto v2 = [&](auto kTf32, auto op) {
            constexpr bool kT = decltype(kTf32)::value;
            using Op = decltype(op);
            const ConvGeometryFast f_op = conv_tc::fast_geometry<Op>(g, batch, out_channels);
            const tc::PackedB layout_op = conv_tc::weight_layout<Op>(g, out_channels, kBN);
            const StatsAndExtremes<T> epilogue{params, f_op, bands};
            return g.channels % tc::Operand<Op>::kThreadK == 0
                       ? tensor_core_launch<kBN, kMB, kStages, 1, kT, Op>(
                             engine, conv_tc::Im2colRows<true, BandPixels, T, Op>{x, f_op, bands},
                             epilogue, p, layout_op, static_cast<int>(rows), 1, true, stream)
                       : tensor_core_launch<kBN, kMB, kStages, 1, kT, Op>(
                             engine, conv_tc::Im2colRows<false, BandPixels, T, Op>{x, f_op, bands},
                             epilogue, p, layout_op, static_cast<int>(rows), 1, true, stream);
        };
        if constexpr (std::is_same_v<T, float>) {  // (the half types: single products alone)
            err = single_product ? v2(std::true_type{}, float{}) : v2(std::false_type{}, float{});
        } else {
            err = tensor_cores_native16<T>(engine) ? v2(std::true_type{}, T{})
                                                   : v2(std::true_type{}, float{});
        }
    }
    if (err != cudaSuccess) return err;
    const int windows = (g.out_h / kPool) * (g.out_w / kPool);
    const FinalizeShape finalize_shape{out_channels / a.groups, g.out_h, g.out_w, windows,
                                       FastDiv(static_cast<uint32_t>(windows))};
    // (a.groups <= out_channels <= kBN: within the grid's y limit.)
    finalize_kernel<T><<<dim3(batch, a.groups), kFinalizeThreads, 0, stream>>>(
        stats, extremes, a.gamma, a.beta, a.scale, y, a.kept_stats, out_channels, a.groups,
        finalize_bands, finalize_shape, a.eps, a.lo, a.hi);
    return cudaGetLastError();
}

#define X(T)                                                                                \
    template bool conv_gn_pool_reads_packed<T>(int, const Conv2dGeometry&, int, bool,         \
                                               TensorCorePath);                              \
    template cudaError_t conv_gn_pool_launch<T>(int, const T*, const T*, const void*,        \
                                                const GnPoolArgs<T>&, T*, int, int,          \
                                                const Conv2dGeometry&, bool, TensorCorePath, \
                                                void*, cudaStream_t);
SCRATCHOPS_FOR_EACH_ELEMENT(X)
#undef X

}  // namespace scratchops
