// binding.cpp — the one C++ file that includes torch.
//
// It declares every operator's schema with TORCH_LIBRARY(scratchops, m), so each is
// torch.ops.scratchops.<name>, and registers its CUDA implementation: check the tensors,
// allocate the outputs, call a launcher from cuda/*.cu on the current stream of the input's
// device, and turn a CUDA error into a Python exception.
//
// The Python wrappers in scratchops/ops.py validate arguments first, with friendlier
// messages; the checks here are the last line, so that a direct call of torch.ops.scratchops.*
// can never launch a kernel on tensors it would read or write out of bounds.
// Fake (meta) implementations are registered in Python (scratchops/ops.py).

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <climits>
#include <optional>

#include "launchers.h"

namespace scratchops {
namespace {

using at::Tensor;

// A float32, contiguous, non-empty CUDA tensor of rank in [min_dim, max_dim], whose elements
// 32-bit offsets can address.
void check_tensor(const Tensor& t, const char* name, int64_t min_dim, int64_t max_dim) {
    TORCH_CHECK(t.is_cuda(), "scratchops: ", name, " must be a CUDA tensor, got ", t.device());
    TORCH_CHECK(t.scalar_type() == at::kFloat, "scratchops: ", name, " must be float32, got ",
                t.scalar_type());
    TORCH_CHECK(t.dim() >= min_dim && t.dim() <= max_dim, "scratchops: ", name, " must have ",
                min_dim, " to ", max_dim, " dimensions, got ", t.dim());
    TORCH_CHECK(t.is_contiguous(), "scratchops: ", name, " must be contiguous");
    TORCH_CHECK(t.numel() > 0, "scratchops: ", name, " is empty");
    TORCH_CHECK(t.numel() <= INT_MAX, "scratchops: ", name, " has ", t.numel(),
                " elements; kernels index with 32-bit integers (at most 2^31-1)");
}

void check_tensor(const Tensor& t, const char* name, int64_t dim) {
    check_tensor(t, name, dim, dim);
}

void check_same_device(const Tensor& t, const Tensor& reference, const char* name) {
    TORCH_CHECK(t.device() == reference.device(), "scratchops: ", name, " is on ", t.device(),
                " but the input is on ", reference.device());
}

void check_cuda(cudaError_t err, const char* what) {
    TORCH_CHECK(err == cudaSuccess, "scratchops: ", what, " failed: ", cudaGetErrorString(err));
}

void check_output_fits(int64_t numel, const char* what) {
    TORCH_CHECK(numel > 0, "scratchops: ", what, " would be empty");
    TORCH_CHECK(numel <= INT_MAX, "scratchops: ", what, " would have ", numel,
                " elements; kernels index with 32-bit integers (at most 2^31-1)");
}

// An optional vector of `length` float32 values on x's device (nullptr when absent), of rank
// 1 to max_dim: per-channel parameters may be shaped (C,) or (C, 1, 1) (Python checks the
// exact shape), a GEMM's or convolution's bias only (length,).
const float* optional_vector(const std::optional<Tensor>& p, const Tensor& x, const char* name,
                             int64_t length, int64_t max_dim) {
    if (!p.has_value()) return nullptr;
    check_tensor(*p, name, 1, max_dim);
    check_same_device(*p, x, name);
    TORCH_CHECK(p->numel() == length, "scratchops: ", name, " must have ", length,
                " values, got ", p->numel());
    return p->data_ptr<float>();
}

int64_t pair_at(at::IntArrayRef v, size_t i, const char* name) {
    TORCH_CHECK(v.size() == 2, "scratchops: ", name, " must have 2 values, got ", v.size());
    return v[i];
}

cudaStream_t current_stream(const Tensor& t) {
    return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}

// Shape of a convolution / unfold, checked: every size positive, the output non-empty.
Conv2dGeometry conv_geometry(const Tensor& x, int64_t kernel_h, int64_t kernel_w,
                             at::IntArrayRef stride, at::IntArrayRef padding,
                             at::IntArrayRef dilation) {
    Conv2dGeometry g{};
    g.channels = static_cast<int>(x.size(1));
    g.height = static_cast<int>(x.size(2));
    g.width = static_cast<int>(x.size(3));
    g.kernel_h = static_cast<int>(kernel_h);
    g.kernel_w = static_cast<int>(kernel_w);
    g.stride_h = static_cast<int>(pair_at(stride, 0, "stride"));
    g.stride_w = static_cast<int>(pair_at(stride, 1, "stride"));
    g.pad_h = static_cast<int>(pair_at(padding, 0, "padding"));
    g.pad_w = static_cast<int>(pair_at(padding, 1, "padding"));
    g.dil_h = static_cast<int>(pair_at(dilation, 0, "dilation"));
    g.dil_w = static_cast<int>(pair_at(dilation, 1, "dilation"));
    TORCH_CHECK(kernel_h > 0 && kernel_w > 0 && g.stride_h > 0 && g.stride_w > 0 &&
                    g.dil_h > 0 && g.dil_w > 0 && g.pad_h >= 0 && g.pad_w >= 0,
                "scratchops: kernel size, stride and dilation must be positive and padding "
                "non-negative");
    TORCH_CHECK(kernel_h <= 65535 && kernel_w <= 65535 && g.pad_h <= 65535 && g.pad_w <= 65535 &&
                    g.dil_h <= 65535 && g.dil_w <= 65535 && g.stride_h <= 65535 &&
                    g.stride_w <= 65535,
                "scratchops: kernel size, stride, padding and dilation must be at most 65535");
    TORCH_CHECK(x.size(2) + 2 * g.pad_h <= INT_MAX && x.size(3) + 2 * g.pad_w <= INT_MAX,
                "scratchops: padded input too large for 32-bit indexing");
    const int64_t out_h =
        (x.size(2) + 2 * g.pad_h - static_cast<int64_t>(g.dil_h) * (kernel_h - 1) - 1) / g.stride_h + 1;
    const int64_t out_w =
        (x.size(3) + 2 * g.pad_w - static_cast<int64_t>(g.dil_w) * (kernel_w - 1) - 1) / g.stride_w + 1;
    TORCH_CHECK(x.size(2) + 2 * g.pad_h >= static_cast<int64_t>(g.dil_h) * (kernel_h - 1) + 1 &&
                    x.size(3) + 2 * g.pad_w >= static_cast<int64_t>(g.dil_w) * (kernel_w - 1) + 1,
                "scratchops: the (dilated) kernel is larger than the padded input");
    g.out_h = static_cast<int>(out_h);
    g.out_w = static_cast<int>(out_w);
    return g;
}

// ------------------------------------------------------------------------------ im2col
Tensor im2col_cuda(const Tensor& x, at::IntArrayRef kernel_size, at::IntArrayRef dilation,
                   at::IntArrayRef padding, at::IntArrayRef stride, int64_t version) {
    TORCH_CHECK(version >= 1 && version <= kIm2colNumVersions,
                "scratchops: im2col version must be in [1, ", kIm2colNumVersions, "], got ", version);
    check_tensor(x, "input", 4);
    const Conv2dGeometry g =
        conv_geometry(x, pair_at(kernel_size, 0, "kernel_size"),
                      pair_at(kernel_size, 1, "kernel_size"), stride, padding, dilation);
    const int64_t taps = static_cast<int64_t>(g.channels) * g.kernel_h * g.kernel_w;
    const int64_t pixels = static_cast<int64_t>(g.out_h) * g.out_w;
    check_output_fits(x.size(0) * taps * pixels, "the im2col output");
    c10::cuda::CUDAGuard guard(x.device());
    Tensor cols = at::empty({x.size(0), taps, pixels}, x.options());
    check_cuda(im2col_launch(static_cast<int>(version), x.data_ptr<float>(), cols.data_ptr<float>(),
                             static_cast<int>(x.size(0)), g, 0, static_cast<int>(pixels),
                             current_stream(x)),
               "im2col kernel launch");
    return cols;
}

// -------------------------------------------------------------------------------- gemm
// a @ b for (M,K)@(K,N), (B,M,K)@(B,K,N), (M,K)@(B,K,N) or (B,M,K)@(K,N); the 2-D operand
// is shared across the batch (batch stride 0). bias: (M,), added to every row m.
Tensor gemm_cuda(const Tensor& a, const Tensor& b, const std::optional<Tensor>& bias,
                 int64_t version) {
    TORCH_CHECK(version >= 1 && version <= kGemmNumVersions, "scratchops: gemm version must be in [1, ",
                kGemmNumVersions, "], got ", version);
    check_tensor(a, "a", a.dim() == 3 ? 3 : 2);
    check_tensor(b, "b", b.dim() == 3 ? 3 : 2);
    check_same_device(b, a, "b");
    const bool batched = a.dim() == 3 || b.dim() == 3;
    const int64_t batch = a.dim() == 3 ? a.size(0) : (b.dim() == 3 ? b.size(0) : 1);
    TORCH_CHECK(a.dim() == 2 || b.dim() == 2 || a.size(0) == b.size(0),
                "scratchops: gemm batch sizes differ: a has ", a.size(0), ", b has ", b.size(0));
    const int64_t M = a.size(-2), K = a.size(-1), N = b.size(-1);
    TORCH_CHECK(b.size(-2) == K, "scratchops: gemm inner dimensions differ: a is ", a.sizes(),
                ", b is ", b.sizes());
    TORCH_CHECK(batch <= INT_MAX, "scratchops: gemm batch too large");
    check_output_fits(batch * M * N, "the gemm output");
    const float* bias_ptr = optional_vector(bias, a, "bias", M, 1);
    c10::cuda::CUDAGuard guard(a.device());
    Tensor c = batched ? at::empty({batch, M, N}, a.options()) : at::empty({M, N}, a.options());
    check_cuda(gemm_launch(static_cast<int>(version), a.data_ptr<float>(), b.data_ptr<float>(),
                           bias_ptr, c.data_ptr<float>(), static_cast<int>(M),
                           static_cast<int>(N), static_cast<int>(K), static_cast<int>(K),
                           static_cast<int>(N), static_cast<int>(N), a.dim() == 3 ? M * K : 0,
                           b.dim() == 3 ? K * N : 0, M * N, static_cast<int>(batch),
                           current_stream(a)),
               "gemm kernel launch");
    return c;
}

// ------------------------------------------------------------------------------ conv2d
// y[n] = weight (Cout x K) @ cols[n] (K x P) + bias, with the columns built chunk by chunk in
// a workspace of at most workspace_bytes: as many whole images as fit, or, when one image's
// columns do not fit, that image's output pixels in slices (the GEMM then writes a column
// slice of y[n], leading dimension P). The workspace never drops below one column of K taps.
Tensor conv2d_cuda(const Tensor& x, const Tensor& weight, const std::optional<Tensor>& bias,
                   at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                   int64_t workspace_bytes, int64_t gemm_version) {
    TORCH_CHECK(gemm_version >= 1 && gemm_version <= kGemmNumVersions,
                "scratchops: gemm version must be in [1, ", kGemmNumVersions, "], got ", gemm_version);
    TORCH_CHECK(workspace_bytes > 0, "scratchops: workspace_bytes must be positive");
    check_tensor(x, "input", 4);
    check_tensor(weight, "weight", 4);
    check_same_device(weight, x, "weight");
    TORCH_CHECK(weight.size(1) == x.size(1), "scratchops: weight expects ", weight.size(1),
                " input channels, input has ", x.size(1));
    const Conv2dGeometry g = conv_geometry(x, weight.size(2), weight.size(3), stride, padding, dilation);
    const int64_t batch = x.size(0), out_channels = weight.size(0);
    const int64_t taps = static_cast<int64_t>(g.channels) * g.kernel_h * g.kernel_w;  // K
    const int64_t pixels = static_cast<int64_t>(g.out_h) * g.out_w;                  // P
    check_output_fits(batch * out_channels * pixels, "the conv2d output");
    const float* bias_ptr = optional_vector(bias, x, "bias", out_channels, 1);

    // Chunk sizes, in floats: a chunk holds images_per_chunk x K x pixels_per_chunk.
    const int64_t workspace_floats =
        std::max<int64_t>(taps, std::min<int64_t>(workspace_bytes / 4, INT_MAX));
    int64_t images_per_chunk = 1, pixels_per_chunk = pixels;
    if (taps * pixels <= workspace_floats) {
        images_per_chunk = std::min(batch, workspace_floats / (taps * pixels));
    } else {
        pixels_per_chunk = workspace_floats / taps;  // >= 1 since workspace_floats >= taps
    }

    c10::cuda::CUDAGuard guard(x.device());
    cudaStream_t stream = current_stream(x);
    Tensor y = at::empty({batch, out_channels, g.out_h, g.out_w}, x.options());
    Tensor cols = at::empty({images_per_chunk * taps * pixels_per_chunk}, x.options());
    const float* x_ptr = x.data_ptr<float>();
    float* y_ptr = y.data_ptr<float>();
    const int64_t image_floats = static_cast<int64_t>(g.channels) * g.height * g.width;
    for (int64_t n0 = 0; n0 < batch; n0 += images_per_chunk) {
        const int64_t images = std::min(images_per_chunk, batch - n0);
        for (int64_t p0 = 0; p0 < pixels; p0 += pixels_per_chunk) {
            const int64_t count = std::min(pixels_per_chunk, pixels - p0);
            check_cuda(im2col_launch(kIm2colDefaultVersion, x_ptr + n0 * image_floats,
                                     cols.data_ptr<float>(),
                                     static_cast<int>(images), g, static_cast<int>(p0),
                                     static_cast<int>(count), stream),
                       "conv2d im2col launch");
            check_cuda(gemm_launch(static_cast<int>(gemm_version), weight.data_ptr<float>(),
                                   cols.data_ptr<float>(), bias_ptr,
                                   y_ptr + n0 * out_channels * pixels + p0,
                                   static_cast<int>(out_channels), static_cast<int>(count),
                                   static_cast<int>(taps), static_cast<int>(taps),
                                   static_cast<int>(count), static_cast<int>(pixels),
                                   /*stride_a=*/0, /*stride_b=*/taps * count,
                                   /*stride_c=*/out_channels * pixels, static_cast<int>(images),
                                   stream),
                       "conv2d gemm launch");
        }
    }
    return y;
}

// ------------------------------------------------- per-channel ops on (N, C, *) tensors
// An (N, C, *) input viewed as (N, C, S): S = product of the sizes after C (1 for 2-D).
struct ChannelView {
    int batch, channels, plane_size;
};

ChannelView channel_view(const Tensor& x) {
    check_tensor(x, "input", 2, 8);
    return {static_cast<int>(x.size(0)), static_cast<int>(x.size(1)),
            static_cast<int>(x.numel() / (x.size(0) * x.size(1)))};
}

Tensor group_norm_cuda(const Tensor& x, int64_t num_groups, const std::optional<Tensor>& weight,
                       const std::optional<Tensor>& bias, const std::optional<Tensor>& scale,
                       double eps) {
    const ChannelView v = channel_view(x);
    TORCH_CHECK(num_groups > 0 && v.channels % num_groups == 0, "scratchops: num_groups (",
                num_groups, ") must be positive and divide the channels (", v.channels, ")");
    TORCH_CHECK(eps >= 0.0, "scratchops: eps must be non-negative, got ", eps);
    const float* gamma = optional_vector(weight, x, "weight", v.channels, 1);
    const float* beta = optional_vector(bias, x, "bias", v.channels, 1);
    const float* s = optional_vector(scale, x, "scale", v.channels, 8);
    c10::cuda::CUDAGuard guard(x.device());
    Tensor y = at::empty_like(x);
    Tensor stats = at::empty({2 * x.size(0) * num_groups}, x.options());
    check_cuda(group_norm_launch(x.data_ptr<float>(), y.data_ptr<float>(), gamma, beta, s,
                                 stats.data_ptr<float>(), v.batch, v.channels, v.plane_size,
                                 static_cast<int>(num_groups), static_cast<float>(eps),
                                 current_stream(x)),
               "group_norm kernel launch");
    return y;
}

Tensor scale_cuda(const Tensor& x, const Tensor& scale) {
    const ChannelView v = channel_view(x);
    const float* s = optional_vector(scale, x, "scale", v.channels, 8);
    c10::cuda::CUDAGuard guard(x.device());
    Tensor y = at::empty_like(x);
    check_cuda(scale_launch(x.data_ptr<float>(), s, y.data_ptr<float>(), v.batch, v.channels,
                            v.plane_size, current_stream(x)),
               "scale kernel launch");
    return y;
}

Tensor min_add_mul_cuda(const Tensor& x, double constant, const Tensor& bias, double factor) {
    const ChannelView v = channel_view(x);
    const float* b = optional_vector(bias, x, "bias", v.channels, 8);
    c10::cuda::CUDAGuard guard(x.device());
    Tensor y = at::empty_like(x);
    check_cuda(min_add_mul_launch(x.data_ptr<float>(), static_cast<float>(constant), b,
                                  static_cast<float>(factor), y.data_ptr<float>(), v.batch,
                                  v.channels, v.plane_size, current_stream(x)),
               "min_add_mul kernel launch");
    return y;
}

// ------------------------------------------------------------------- pooling and clamp
Tensor max_pool2d_clamp_cuda(const Tensor& x, at::IntArrayRef kernel_size, at::IntArrayRef stride,
                             at::IntArrayRef padding, double min, double max) {
    check_tensor(x, "input", 4);
    PoolGeometry g{};
    g.height = static_cast<int>(x.size(2));
    g.width = static_cast<int>(x.size(3));
    g.kernel_h = static_cast<int>(pair_at(kernel_size, 0, "kernel_size"));
    g.kernel_w = static_cast<int>(pair_at(kernel_size, 1, "kernel_size"));
    g.stride_h = static_cast<int>(pair_at(stride, 0, "stride"));
    g.stride_w = static_cast<int>(pair_at(stride, 1, "stride"));
    g.pad_h = static_cast<int>(pair_at(padding, 0, "padding"));
    g.pad_w = static_cast<int>(pair_at(padding, 1, "padding"));
    TORCH_CHECK(g.kernel_h > 0 && g.kernel_w > 0 && g.stride_h > 0 && g.stride_w > 0 &&
                    g.kernel_h <= 65535 && g.kernel_w <= 65535 && g.stride_h <= 65535 &&
                    g.stride_w <= 65535,
                "scratchops: max_pool2d kernel_size and stride must be in [1, 65535]");
    TORCH_CHECK(g.pad_h >= 0 && g.pad_w >= 0 && 2 * g.pad_h <= g.kernel_h &&
                    2 * g.pad_w <= g.kernel_w,
                "scratchops: max_pool2d padding must be non-negative and at most half the kernel");
    TORCH_CHECK(g.height + 2 * g.pad_h >= g.kernel_h && g.width + 2 * g.pad_w >= g.kernel_w,
                "scratchops: max_pool2d kernel is larger than the padded input");
    g.out_h = (g.height + 2 * g.pad_h - g.kernel_h) / g.stride_h + 1;
    g.out_w = (g.width + 2 * g.pad_w - g.kernel_w) / g.stride_w + 1;
    c10::cuda::CUDAGuard guard(x.device());
    Tensor y = at::empty({x.size(0), x.size(1), g.out_h, g.out_w}, x.options());
    check_cuda(max_pool2d_clamp_launch(x.data_ptr<float>(), y.data_ptr<float>(),
                                       static_cast<int>(x.size(0) * x.size(1)), g,
                                       static_cast<float>(min), static_cast<float>(max),
                                       current_stream(x)),
               "max_pool2d kernel launch");
    return y;
}

Tensor clamp_cuda(const Tensor& x, double min, double max) {
    check_tensor(x, "input", 0, 64);
    c10::cuda::CUDAGuard guard(x.device());
    Tensor y = at::empty_like(x);
    check_cuda(clamp_launch(x.data_ptr<float>(), y.data_ptr<float>(),
                            static_cast<int>(x.numel()), static_cast<float>(min),
                            static_cast<float>(max), current_stream(x)),
               "clamp kernel launch");
    return y;
}

}  // namespace

TORCH_LIBRARY(scratchops, m) {
    m.def("im2col(Tensor input, int[2] kernel_size, int[2] dilation, int[2] padding, "
          "int[2] stride, int version) -> Tensor");
    m.def("gemm(Tensor a, Tensor b, Tensor? bias, int version) -> Tensor");
    m.def("conv2d(Tensor input, Tensor weight, Tensor? bias, int[2] stride, int[2] padding, "
          "int[2] dilation, int workspace_bytes, int gemm_version) -> Tensor");
    // group_norm with an optional per-channel scale fused into the same pass.
    m.def("group_norm(Tensor input, int num_groups, Tensor? weight, Tensor? bias, "
          "Tensor? scale, float eps) -> Tensor");
    m.def("scale(Tensor input, Tensor scale) -> Tensor");
    m.def("min_add_mul(Tensor input, float constant, Tensor bias, float factor) -> Tensor");
    // max_pool2d followed by clamp(min, max); a plain max pool passes -inf and inf.
    m.def("max_pool2d_clamp(Tensor input, int[2] kernel_size, int[2] stride, int[2] padding, "
          "float min, float max) -> Tensor");
    m.def("clamp(Tensor input, float min, float max) -> Tensor");
}

TORCH_LIBRARY_IMPL(scratchops, CUDA, m) {
    m.impl("im2col", &im2col_cuda);
    m.impl("gemm", &gemm_cuda);
    m.impl("conv2d", &conv2d_cuda);
    m.impl("group_norm", &group_norm_cuda);
    m.impl("scale", &scale_cuda);
    m.impl("min_add_mul", &min_add_mul_cuda);
    m.impl("max_pool2d_clamp", &max_pool2d_clamp_cuda);
    m.impl("clamp", &clamp_cuda);
}

}  // namespace scratchops
