// conv_gn_pool_backward.cu — P85's backward by recomputation: the gradients of
// out = clamp(max_pool2d(group_norm(conv2d(x)) * scale, 4), lo, hi) without the convolution's
// output y (batch x Cout x out_h x out_w, 520 MB at KernelBench's size) or its gradient ever
// in global memory. The forward (conv_gn_pool.cu, any version) keeps what it already finds:
// each pooling window's extreme of y (the value its output came from) and each (sample,
// group)'s mean and 1/std (GnPoolArgs::kept_extremes, kept_stats).
//
// The gradient, per sample n, group of M = (Cout / groups) * out_h * out_w outputs, channel c:
//   xhat = (y - mean) * rstd,  z = xhat * gamma_c + beta_c,  s = z * scale_c,
//   r_w  = dout_w where the clamp passes the window's maximum s_w (else 0): what window w
//          routes to the one output its maximum comes from; ds = r_w there, 0 elsewhere;
//   dscale_c = sum of r_w z_w;  dbeta_c = sum of r_w scale_c;  dgamma_c = sum of r_w scale_c xhat_w
//   (sums over the windows only: ds is zero elsewhere, and z_w, xhat_w are those of the
//   window's maximum, taken from its kept extreme: the forward's value of it, which the
//   recomputed y of the element the gradient goes to equals to within rounding);
//   group norm's backward, with g = ds * scale_c * gamma_c the gradient of xhat:
//   dy = rstd (g - mean(g) - xhat mean(g xhat))  (means over the group's M outputs)
//      = k_ds ds - k1 - xhat k2,   k_ds = rstd gamma_c scale_c,  k1 = rstd mean(g),
//                                  k2 = rstd mean(g xhat)
//   (again sums over the windows alone). Then the convolution's gradients from dy:
//   dconv_bias_c = sum of dy_c, dW = dy x im2col(x), dx = dy convolved with the flipped W.
//
// Two kernels, one idea each:
//   window_gradients  one block a (sample, group): r_w from dout and the kept extreme (the
//                     clamp's rule on the extreme mapped as the forward mapped it), the sums
//                     above in a fixed order, and each (sample, channel)'s constants.
//   fused_backward    (conv_gn_pool_backward.cuh) y computed again tile by tile, dy formed in
//                     shared memory and fed to the weight, bias and input gradients there.
// Then ordered sums over samples (the parameters') and over blocks (the weight's and conv
// bias's) by batch_sum_launch.
//
// Which element a window's gradient goes to: where torch's max_pool2d records the maximum,
// found in the recomputed y (as the recomputing backward finds it in the convolution computed
// again). The fused kernel computes y on the CUDA cores, in fp32 whatever torch's TF32 switch
// says (the backward is fp32-accurate either way), in conv_gn_pool v1's order of additions.
//
// Traffic and work at KernelBench's size (batch 128, 8 -> 64 channels, 128 x 128, 3 x 3),
// fp32: x read once by the fused kernel (67 MB, plus its region's overlap: 12 x 36 + halo of
// 8 x 32 owned), dx written once (67 MB), dout and the extremes read and the routed gradients
// written (3 x 31.5 MB) and read for each region (27 windows for 16 owned: 1.7 x 31.5 MB);
// about 0.26 GB. Products: y again on the regions
// (1.69 x 18.7 GFLOP: the regions overlap by whole windows), the weight gradient and the
// input gradient (18.7 GFLOP each): 69 GFLOP of fp32 fused multiply-adds.
#include "conv_gn_pool_backward.cuh"
#include "launchers.h"

namespace scratchops {
namespace conv_gn_pool_backward {
namespace {

constexpr int kThreads = 256;  // window_gradients' block

template <class T>
__global__ void __launch_bounds__(kThreads)
    window_gradients_kernel(const T* __restrict__ dout, const float* __restrict__ extremes,
                            const float* __restrict__ group_stats, GnPoolArgs<T> p,
                            float* __restrict__ routed, float* __restrict__ coefs,
                            float* __restrict__ param_partials, int cout, int windows,
                            float group_count) {
    const int n = blockIdx.x / p.groups, group = blockIdx.x % p.groups;
    const int cpg = cout / p.groups;
    const float mean = group_stats[2 * blockIdx.x], rstd = group_stats[2 * blockIdx.x + 1];
    const float lo = rounded<T>(p.lo), hi = rounded<T>(p.hi);  // (pool_clamp_backward.cu)
    Sums group_sums{0.0f, 0.0f};  // of g and g * xhat
    for (int k = 0; k < cpg; ++k) {
        const int c = group * cpg + k;
        const float gamma = value_or(p.gamma, c, true, 1.0f), beta = value_or(p.beta, c, true, 0.0f);
        const float scale = value_or(p.scale, c, true, 1.0f);
        const long long first = (static_cast<long long>(n) * cout + c) * windows;
        Sums beta_gamma{0.0f, 0.0f}, scale_sum{0.0f, 0.0f};
        for (int w = threadIdx.x; w < windows; w += kThreads) {
            const float e = extremes[first + w];
            const float xhat = (e - mean) * rstd;
            const float z = normed<T>(e, mean, rstd, gamma, beta);
            const float s = rounded<T>(normed_scaled<T>(e, mean, rstd, gamma, beta, scale));
            const float r = clamp_passes_gradient(s, lo, hi) ? to_float(dout[first + w]) : 0.0f;
            routed[first + w] = r;
            beta_gamma.a += r * scale;
            beta_gamma.b += r * scale * xhat;
            scale_sum.a += r * z;
            group_sums.a += r * scale * gamma;
            group_sums.b += r * scale * gamma * xhat;
        }
        beta_gamma = block_sum<kThreads>(beta_gamma);
        scale_sum = block_sum<kThreads>(scale_sum);
        if (threadIdx.x == 0) {  // [n][{gamma, beta, scale}][c]
            float* out = param_partials + static_cast<long long>(n) * 3 * cout + c;
            out[0] = beta_gamma.b;
            out[cout] = beta_gamma.a;
            out[2 * cout] = scale_sum.a;
        }
    }
    group_sums = block_sum<kThreads>(group_sums);
    const float k1 = rstd * (group_sums.a / group_count), k2 = rstd * (group_sums.b / group_count);
    for (int k = threadIdx.x; k < cpg; k += kThreads) {
        const int c = group * cpg + k;
        const float gamma = value_or(p.gamma, c, true, 1.0f), beta = value_or(p.beta, c, true, 0.0f);
        const float scale = value_or(p.scale, c, true, 1.0f);
        float* out = coefs + static_cast<long long>(n) * kCoefs * cout + c;  // [n][coef][c]
        out[kMean * cout] = mean;
        out[kRstd * cout] = rstd;
        out[kGamma * cout] = gamma;
        out[kBeta * cout] = beta;
        out[kScale * cout] = scale;
        out[kDsFactor * cout] = rstd * gamma * scale;
        out[kConstant * cout] = k1;
        out[kXhatFactor * cout] = k2;
    }
}

constexpr int kMostSplits = weight_splits(3);  // (the 3 x 3 instantiation's block is the larger)
static_assert(kMostSplits >= weight_splits(kPool + 1), "room for either instantiation's sums");
// add_weight_grad's thread layout (conv_gn_pool_backward.cuh): its splits of 128 threads share
// the owned rows evenly (input_grad checks its own layout where it is written).
static_assert(kOwnRows % kMostSplits == 0 && kOwnRows % weight_splits(kPool + 1) == 0 &&
                  fused_threads(3) % 128 == 0 && fused_threads(kPool + 1) % 128 == 0,
              "add_weight_grad's splits");

// The pieces of the workspace, in floats (each 16-byte aligned).
struct Pieces {
    long long routed, coefs, params, weight, bias;
};
Pieces pieces(int batch, int cout, const Conv2dGeometry& g) {
    auto aligned = [](long long floats) { return align16(4 * floats) / 4; };
    const long long windows = static_cast<long long>(g.out_h / kPool) * (g.out_w / kPool);
    return {aligned(batch * cout * windows), aligned(static_cast<long long>(batch) * cout * kCoefs),
            aligned(3LL * batch * cout),
            aligned(static_cast<long long>(kMostSplits) * kBlocks * cout * g.channels *
                    g.kernel_h * g.kernel_w),
            aligned(static_cast<long long>(kBlocks) * cout)};
}

template <class T, int kMaxK, bool kFull>
cudaError_t launch_fused_as(const FusedArgs<T>& a, int blocks, cudaStream_t stream) {
    constexpr int kBytes = Smem<kMaxK>::kFloats * 4;
    static std::atomic<unsigned long long> smem_set_on;
    const cudaError_t err =
        allow_dynamic_smem(smem_set_on, fused_backward_kernel<T, kMaxK, kFull>, kBytes);
    if (err != cudaSuccess) return err;
    fused_backward_kernel<T, kMaxK, kFull><<<blocks, fused_threads(kMaxK), kBytes, stream>>>(a);
    return cudaGetLastError();
}
// The instantiation for the full shape where the call has it (extent_of), the general one
// otherwise.
template <class T, int kMaxK>
cudaError_t launch_fused(const FusedArgs<T>& a, int blocks, cudaStream_t stream) {
    return a.cin == kMaxInputChannels && a.kh == kMaxK && a.kw == kMaxK
               ? launch_fused_as<T, kMaxK, true>(a, blocks, stream)
               : launch_fused_as<T, kMaxK, false>(a, blocks, stream);
}

}  // namespace
}  // namespace conv_gn_pool_backward

bool conv_gn_pool_backward_covers(int out_channels, const Conv2dGeometry& g, int device) {
    using namespace conv_gn_pool_backward;
    const bool shape = out_channels <= kMaxChannels && g.channels <= kMaxInputChannels &&
                       g.kernel_h <= kPool + 1 && g.kernel_w <= kPool + 1 && g.stride_h == 1 &&
                       g.stride_w == 1 && g.pad_h == 0 && g.pad_w == 0 && g.dil_h == 1 &&
                       g.dil_w == 1 && g.out_h >= kPool && g.out_w >= kPool;
    // The block's shared memory: 174.5 KiB (3 x 3) or 211.2 KiB (5 x 5), which an H100 or H200
    // (227 KiB) lends a block and an A100 (163 KiB) or an sm_86 / sm_89 GPU (99 KiB) does not.
    const int bytes = 4 * (g.kernel_h <= 3 && g.kernel_w <= 3 ? Smem<3>::kFloats
                                                               : Smem<kPool + 1>::kFloats);
    int lent = 0;
    return shape &&
           cudaDeviceGetAttribute(&lent, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) ==
               cudaSuccess &&
           bytes <= lent;
}

long long conv_gn_pool_backward_workspace_bytes(int batch, int out_channels,
                                                const Conv2dGeometry& g) {
    const auto p = conv_gn_pool_backward::pieces(batch, out_channels, g);
    return 4 * (p.routed + p.coefs + p.params + p.weight + p.bias);
}

template <class T>
cudaError_t conv_gn_pool_backward_launch(const T* dout, const T* x, const T* weight,
                                         const GnPoolArgs<T>& args, const float* extremes,
                                         const float* group_stats, T* dx, T* dweight,
                                         T* dconv_bias, T* dparams, int batch, int out_channels,
                                         const Conv2dGeometry& g, void* workspace,
                                         cudaStream_t stream) {
    using namespace conv_gn_pool_backward;
    if (!conv_gn_pool_backward_covers(out_channels, g, current_device()) || args.groups <= 0 ||
        out_channels % args.groups != 0)
        return cudaErrorInvalidValue;
    const Pieces p = pieces(batch, out_channels, g);
    float* routed = static_cast<float*>(workspace);
    float* coefs = routed + p.routed;
    float* params = coefs + p.coefs;
    float* weight_partials = params + p.params;
    float* bias_partials = weight_partials + p.weight;
    const int bands = (g.height + kOwnRows - 1) / kOwnRows;
    const int col_blocks = (g.width + kOwnCols - 1) / kOwnCols;
    const long long tiles = static_cast<long long>(batch) * bands * col_blocks;
    if (tiles > kMaxInt32Count) return cudaErrorInvalidValue;
    const int blocks = static_cast<int>(tiles < kBlocks ? tiles : kBlocks);
    const int windows = (g.out_h / kPool) * (g.out_w / kPool);
    const int taps_size = out_channels * g.channels * g.kernel_h * g.kernel_w;
    const bool small_kernel = g.kernel_h <= 3 && g.kernel_w <= 3;  // the 3 x 3 instantiation
    cudaError_t err = cudaSuccess;
    if (batch > 0) {
        window_gradients_kernel<T><<<batch * args.groups, kThreads, 0, stream>>>(
            dout, extremes, group_stats, args, routed, coefs, params, out_channels, windows,
            static_cast<float>(out_channels / args.groups) * g.out_h * g.out_w);
        if ((err = cudaGetLastError()) != cudaSuccess) return err;
        const FusedArgs<T> a{x,          weight,       args.conv_bias, coefs,    routed,
                             dx,         weight_partials, bias_partials, g.channels,
                             out_channels, g.height,   g.width,        g.kernel_h, g.kernel_w,
                             g.out_h,    g.out_w,      g.out_h / kPool, g.out_w / kPool,
                             bands,      col_blocks,   static_cast<int>(tiles),
                             g.width % 2 == 0 && reinterpret_cast<uintptr_t>(x) % 4 == 0};
        err = small_kernel ? launch_fused<T, 3>(a, blocks, stream)
                           : launch_fused<T, kPool + 1>(a, blocks, stream);
        if (err != cudaSuccess) return err;
    }
    // The ordered sums (an empty batch: zeros).
    err = batch_sum_launch<float, T>(params, nullptr, dparams, batch, 3 * out_channels, stream);
    if (err != cudaSuccess) return err;
    err = batch_sum_launch<float, T>(weight_partials, nullptr, dweight,
                                     blocks * weight_splits(small_kernel ? 3 : kPool + 1),
                                     taps_size, stream);
    if (err != cudaSuccess || dconv_bias == nullptr) return err;
    return batch_sum_launch<float, T>(bias_partials, nullptr, dconv_bias, blocks, out_channels,
                                      stream);
}

#define X(T)                                                                                 \
    template cudaError_t conv_gn_pool_backward_launch<T>(                                    \
        const T*, const T*, const T*, const GnPoolArgs<T>&, const float*, const float*, T*, \
        T*, T*, T*, int, int, const Conv2dGeometry&, void*, cudaStream_t);
SCRATCHOPS_FOR_EACH_ELEMENT(X)
#undef X

}  // namespace scratchops
