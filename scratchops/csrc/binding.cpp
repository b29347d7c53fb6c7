// binding.cpp — the one C++ file that includes torch.
//
// The public operators torch.ops.scratchops.<name> are defined in Python
// (scratchops/_library.py) with their fake (meta) and autograd registrations, so they exist,
// and trace, without this file being built. This file is the CUDA side: it defines the same
// operators in the private namespace scratchops_cuda with their CUDA implementations, which
// scratchops.<name>'s CUDA kernel calls once the extension is loaded (scratchops/_build.py:
// a module-level read on every call, the lock and the build on the first only). A private
// operator namespace rather than pybind functions: the dispatcher converts Tensor?, int[2]
// and float arguments from the same schemas, and the library loads without a Python module
// (is_python_module=False). Autograd and fakes belong to the public operators, so these need
// only their CUDA kernels.
//
// Each implementation checks what memory safety needs (argument errors come from Python
// first, with friendlier messages), allocates outputs and workspaces, returns an empty output
// without launching anything, and otherwise calls a launcher from cuda/*.cu on the current
// stream of the input's device; a CUDA error becomes a Python exception.

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
using OptTensor = std::optional<Tensor>;
constexpr int64_t kMaxGeometry = 65535;  // kernel size, stride, padding, dilation

// A float32, contiguous CUDA tensor of rank in [min_dim, max_dim] that 32-bit offsets can
// address, on `device` when given.
void check_tensor(const Tensor& t, const char* name, int64_t min_dim, int64_t max_dim,
                  const Tensor* same_device_as = nullptr) {
    TORCH_CHECK(t.is_cuda(), "scratchops: ", name, " must be a CUDA tensor, got ", t.device());
    TORCH_CHECK(same_device_as == nullptr || t.device() == same_device_as->device(),
                "scratchops: ", name, " is on ", t.device(), ", the input on ",
                same_device_as->device());
    TORCH_CHECK(t.scalar_type() == at::kFloat, "scratchops: ", name, " must be float32");
    TORCH_CHECK(t.dim() >= min_dim && t.dim() <= max_dim, "scratchops: ", name, " must have ",
                min_dim, " to ", max_dim, " dimensions, got ", t.dim());
    TORCH_CHECK(t.is_contiguous(), "scratchops: ", name, " must be contiguous");
    TORCH_CHECK(t.numel() <= INT_MAX, "scratchops: ", name,
                " has more than 2^31-1 elements (32-bit indexing)");
}

void check_fits(int64_t numel, const char* what) {
    TORCH_CHECK(numel <= INT_MAX, "scratchops: ", what,
                " would have more than 2^31-1 elements (32-bit indexing)");
}

void check_cuda(cudaError_t err, const char* what) {
    TORCH_CHECK(err == cudaSuccess, "scratchops: ", what, " failed: ", cudaGetErrorString(err));
}

// Per-channel parameters: `length` values of any shape (Python checks (C,) or (C, 1, 1)).
const float* optional_vector(const OptTensor& p, const Tensor& x, const char* name,
                             int64_t length) {
    if (!p.has_value()) return nullptr;
    check_tensor(*p, name, 1, 8, &x);
    TORCH_CHECK(p->numel() == length, "scratchops: ", name, " must have ", length, " values");
    return p->data_ptr<float>();
}

// The tensor-core kernels are sm_90a code (wgmma): an sm_90 GPU (H100, H200) only.
void check_tensor_cores(const Tensor& t, const char* what) {
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, t.device().index());
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, t.device().index());
    TORCH_CHECK(major == 9 && minor == 0, "scratchops: ", what, " runs on the tensor cores of an "
                "sm_90 GPU (H100, H200); this GPU is sm_", major, minor,
                " (conv2d: use algorithm='im2col_gemm'; gemm: version 1-3)");
}

cudaStream_t stream_of(const Tensor& t) {
    return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}

// The window geometry of im2col and conv2d on a 4-D input: sizes in range, output non-empty.
Conv2dGeometry window(const Tensor& x, int64_t kernel_h, int64_t kernel_w, at::IntArrayRef stride,
                      at::IntArrayRef padding, at::IntArrayRef dilation) {
    TORCH_CHECK(stride.size() == 2 && padding.size() == 2 && dilation.size() == 2,
                "scratchops: stride, padding and dilation must have 2 values");
    const int64_t v[] = {kernel_h, kernel_w, stride[0], stride[1], padding[0] + 1, padding[1] + 1,
                         dilation[0], dilation[1]};
    for (int64_t value : v)
        TORCH_CHECK(value >= 1 && value <= kMaxGeometry, "scratchops: kernel size, stride, "
                    "padding and dilation must be in range (1..65535, padding 0..65534)");
    Conv2dGeometry g{};
    g.channels = static_cast<int>(x.size(1));
    g.height = static_cast<int>(x.size(2));
    g.width = static_cast<int>(x.size(3));
    g.kernel_h = static_cast<int>(kernel_h);
    g.kernel_w = static_cast<int>(kernel_w);
    g.stride_h = static_cast<int>(stride[0]);
    g.stride_w = static_cast<int>(stride[1]);
    g.pad_h = static_cast<int>(padding[0]);
    g.pad_w = static_cast<int>(padding[1]);
    g.dil_h = static_cast<int>(dilation[0]);
    g.dil_w = static_cast<int>(dilation[1]);
    const int64_t span_h = dilation[0] * (kernel_h - 1) + 1, span_w = dilation[1] * (kernel_w - 1) + 1;
    TORCH_CHECK(x.size(2) + 2 * g.pad_h >= span_h && x.size(3) + 2 * g.pad_w >= span_w,
                "scratchops: the (dilated) kernel is larger than the padded input");
    g.out_h = static_cast<int>((x.size(2) + 2 * g.pad_h - span_h) / g.stride_h + 1);
    g.out_w = static_cast<int>((x.size(3) + 2 * g.pad_w - span_w) / g.stride_w + 1);
    return g;
}

// ---------------------------------------------------------------------------- GEMM, im2col
Tensor im2col_cuda(const Tensor& x, at::IntArrayRef kernel_size, at::IntArrayRef dilation,
                   at::IntArrayRef padding, at::IntArrayRef stride, int64_t version) {
    check_tensor(x, "input", 4, 4);
    TORCH_CHECK(kernel_size.size() == 2, "scratchops: kernel_size must have 2 values");
    const Conv2dGeometry g = window(x, kernel_size[0], kernel_size[1], stride, padding, dilation);
    const int64_t taps = static_cast<int64_t>(g.channels) * g.kernel_h * g.kernel_w;
    const int64_t pixels = static_cast<int64_t>(g.out_h) * g.out_w;
    check_fits(x.size(0) * taps * pixels, "the im2col output");
    c10::cuda::CUDAGuard guard(x.device());
    Tensor cols = at::empty({x.size(0), taps, pixels}, x.options());
    if (cols.numel() == 0) return cols;
    check_cuda(im2col_launch(static_cast<int>(version), x.data_ptr<float>(), cols.data_ptr<float>(),
                             static_cast<int>(x.size(0)), g, 0, static_cast<int>(pixels),
                             stream_of(x)),
               "im2col");
    return cols;
}

// a @ b (+ bias per row) for (M,K)@(K,N), (B,M,K)@(B,K,N) and a 2-D operand shared by a batch.
Tensor gemm_cuda(const Tensor& a, const Tensor& b, const OptTensor& bias, int64_t version) {
    check_tensor(a, "a", 2, 3);
    check_tensor(b, "b", 2, 3, &a);
    const int64_t batch = a.dim() == 3 ? a.size(0) : (b.dim() == 3 ? b.size(0) : 1);
    TORCH_CHECK(a.dim() == 2 || b.dim() == 2 || a.size(0) == b.size(0),
                "scratchops: gemm batch sizes differ");
    const int64_t M = a.size(-2), K = a.size(-1), N = b.size(-1);
    TORCH_CHECK(b.size(-2) == K, "scratchops: gemm inner dimensions differ");
    check_fits(batch * M * N, "the gemm output");
    const float* bias_ptr = optional_vector(bias, a, "bias", M);
    c10::cuda::CUDAGuard guard(a.device());
    Tensor c = a.dim() == 3 || b.dim() == 3 ? at::empty({batch, M, N}, a.options())
                                            : at::empty({M, N}, a.options());
    if (c.numel() == 0) return c;
    const long long sa = a.dim() == 3 ? M * K : 0, sb = b.dim() == 3 ? K * N : 0;
    const int m = static_cast<int>(M), n = static_cast<int>(N), k = static_cast<int>(K);
    if (version == kGemmTensorCoreVersion && K > 0) {  // (K = 0: the bias alone, below)
        check_tensor_cores(a, "gemm version 5");
        // The packed B, a chunk of batch entries at a time when B is batched (<= 256 MiB).
        long long bytes = gemm_tf32x3_workspace_bytes(n, k, static_cast<int>(batch), sb);
        if (sb != 0 && bytes > (256LL << 20))
            bytes = std::max(256LL << 20, gemm_tf32x3_workspace_bytes(n, k, 1, sb));
        Tensor ws = at::empty({bytes}, a.options().dtype(at::kByte));
        check_cuda(gemm_tf32x3_launch(a.data_ptr<float>(), b.data_ptr<float>(), bias_ptr,
                                      c.data_ptr<float>(), m, n, k, k, n, n, sa, sb, M * N,
                                      static_cast<int>(batch), ws.data_ptr(), bytes, stream_of(a)),
                   "gemm (tensor cores)");
        return c;
    }
    check_cuda(gemm_launch(version == kGemmTensorCoreVersion ? 1 : static_cast<int>(version),
                           a.data_ptr<float>(), b.data_ptr<float>(),
                           bias_ptr, c.data_ptr<float>(), m, n, k, k, n, n, sa, sb, M * N,
                           static_cast<int>(batch), stream_of(a)),
               "gemm");
    return c;
}

// ------------------------------------------------------------------------------ conv2d
struct Conv {
    Conv2dGeometry g;
    Tensor y;
    const float* bias;
};

// Checks x, weight and bias, allocates y (N, Cout, out_h, out_w); y may be empty.
Conv conv_setup(const Tensor& x, const Tensor& weight, const OptTensor& bias,
                at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation) {
    check_tensor(x, "input", 4, 4);
    check_tensor(weight, "weight", 4, 4, &x);
    TORCH_CHECK(weight.size(1) == x.size(1), "scratchops: weight and input channels differ");
    const Conv2dGeometry g = window(x, weight.size(2), weight.size(3), stride, padding, dilation);
    check_fits(x.size(0) * weight.size(0) * g.out_h * g.out_w, "the conv2d output");
    const float* b = optional_vector(bias, x, "bias", weight.size(0));
    return {g, at::empty({x.size(0), weight.size(0), g.out_h, g.out_w}, x.options()), b};
}

// The weights packed for the tensor-core kernels (conv2d_implicit_pack).
Tensor conv2d_pack_weight_cuda(const Tensor& weight) {
    check_tensor(weight, "weight", 4, 4);
    TORCH_CHECK(weight.size(2) <= kMaxGeometry && weight.size(3) <= kMaxGeometry,
                "scratchops: kernel size out of range");
    Conv2dGeometry g{};
    g.channels = static_cast<int>(weight.size(1));
    g.kernel_h = static_cast<int>(weight.size(2));
    g.kernel_w = static_cast<int>(weight.size(3));
    const int cout = static_cast<int>(weight.size(0));
    c10::cuda::CUDAGuard guard(weight.device());
    Tensor packed = at::empty({conv2d_implicit_packed_bytes(g, cout)},
                              weight.options().dtype(at::kByte));
    if (weight.numel() > 0)
        check_cuda(conv2d_implicit_pack(weight.data_ptr<float>(), cout, g, packed.data_ptr(),
                                        stream_of(weight)),
                   "conv2d weight packing");
    return packed;
}

// `packed` as given (checked against the weight's packed size), or packed now.
Tensor packed_for(const Tensor& weight, const OptTensor& packed) {
    check_tensor_cores(weight, "this convolution");
    if (!packed.has_value()) return conv2d_pack_weight_cuda(weight);
    Conv2dGeometry g{};
    g.channels = static_cast<int>(weight.size(1));
    g.kernel_h = static_cast<int>(weight.size(2));
    g.kernel_w = static_cast<int>(weight.size(3));
    TORCH_CHECK(packed->is_cuda() && packed->device() == weight.device() &&
                    packed->scalar_type() == at::kByte && packed->dim() == 1 &&
                    packed->numel() == conv2d_implicit_packed_bytes(g, weight.size(0)),
                "scratchops: packed_weight is not conv2d_pack_weight(weight)");
    return *packed;
}

// algorithm 0: im2col + gemm (versions 1-3) in a bounded workspace; 1: implicit GEMM on the
// tensor cores (sm_90).
Tensor conv2d_cuda(const Tensor& x, const Tensor& weight, const OptTensor& bias,
                   at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                   int64_t algorithm, int64_t workspace_bytes, int64_t gemm_version) {
    Conv c = conv_setup(x, weight, bias, stride, padding, dilation);
    if (c.y.numel() == 0) return c.y;
    c10::cuda::CUDAGuard guard(x.device());
    const int batch = static_cast<int>(x.size(0)), cout = static_cast<int>(weight.size(0));
    if (algorithm == 1) {
        const Tensor packed = packed_for(weight, std::nullopt);
        check_cuda(conv2d_implicit_launch(x.data_ptr<float>(), packed.data_ptr(), c.bias,
                                          c.y.data_ptr<float>(), batch, cout, c.g,
                                          ConvTail{ConvTail::kNone, 0.0f, nullptr, 1.0f},
                                          stream_of(x)),
                   "conv2d (implicit GEMM)");
        return c.y;
    }
    const long long floats = conv2d_im2col_workspace_floats(batch, c.g, workspace_bytes);
    Tensor cols = at::empty({floats}, x.options());
    check_cuda(conv2d_im2col_launch(x.data_ptr<float>(), weight.data_ptr<float>(), c.bias,
                                    c.y.data_ptr<float>(), batch, cout, c.g,
                                    static_cast<int>(gemm_version), cols.data_ptr<float>(), floats,
                                    stream_of(x)),
               "conv2d (im2col + gemm)");
    return c.y;
}

// P31 in one kernel: (min(conv2d(x) + conv_bias, constant) + bias) * factor.
Tensor conv2d_min_add_mul_cuda(const Tensor& x, const Tensor& weight, const OptTensor& conv_bias,
                               at::IntArrayRef stride, at::IntArrayRef padding,
                               at::IntArrayRef dilation, double constant, const Tensor& bias,
                               double factor, const OptTensor& packed_weight) {
    Conv c = conv_setup(x, weight, conv_bias, stride, padding, dilation);
    const float* b = optional_vector(bias, x, "bias", weight.size(0));
    if (c.y.numel() == 0) return c.y;
    c10::cuda::CUDAGuard guard(x.device());
    const Tensor packed = packed_for(weight, packed_weight);
    const ConvTail tail{ConvTail::kMinAddMul, static_cast<float>(constant), b,
                        static_cast<float>(factor)};
    check_cuda(conv2d_implicit_launch(x.data_ptr<float>(), packed.data_ptr(), c.bias,
                                      c.y.data_ptr<float>(), static_cast<int>(x.size(0)),
                                      static_cast<int>(weight.size(0)), c.g, tail, stream_of(x)),
               "conv2d_min_add_mul");
    return c.y;
}

// P85 in one pass: clamp(max_pool2d(group_norm(conv2d(x)) * scale, 4), min, max).
Tensor conv2d_group_norm_pool_clamp_cuda(const Tensor& x, const Tensor& weight,
                                         const OptTensor& conv_bias, int64_t num_groups,
                                         const OptTensor& gn_weight, const OptTensor& gn_bias,
                                         const OptTensor& scale, double eps, double min,
                                         double max, const OptTensor& packed_weight) {
    const int64_t one[] = {1, 1}, zero[] = {0, 0};
    Conv c = conv_setup(x, weight, conv_bias, one, zero, one);
    const int64_t cout = weight.size(0);
    TORCH_CHECK(cout <= 64 && num_groups > 0 && cout % num_groups == 0 && c.g.out_h >= 4 &&
                    c.g.out_w >= 4,
                "scratchops: conv2d_group_norm_pool_clamp covers <= 64 output channels in "
                "whole groups and a conv output of at least 4 x 4");
    GnPoolArgs a{c.bias,
                 optional_vector(gn_weight, x, "gn_weight", cout),
                 optional_vector(gn_bias, x, "gn_bias", cout),
                 optional_vector(scale, x, "scale", cout),
                 static_cast<int>(num_groups),
                 static_cast<float>(eps),
                 static_cast<float>(min),
                 static_cast<float>(max)};
    c10::cuda::CUDAGuard guard(x.device());
    Tensor y = at::empty({x.size(0), cout, c.g.out_h / 4, c.g.out_w / 4}, x.options());
    if (y.numel() == 0) return y;
    const Tensor packed = packed_for(weight, packed_weight);
    Tensor ws = at::empty(
        {conv_gn_pool_workspace_bytes(static_cast<int>(x.size(0)), static_cast<int>(cout), c.g,
                                      static_cast<int>(num_groups))},
        x.options().dtype(at::kByte));
    check_cuda(conv_gn_pool_launch(x.data_ptr<float>(), packed.data_ptr(), a, y.data_ptr<float>(),
                                   static_cast<int>(x.size(0)), static_cast<int>(cout), c.g,
                                   ws.data_ptr(), stream_of(x)),
               "conv2d_group_norm_pool_clamp");
    return y;
}

// ------------------------------------------------------ per-channel ops on (N, C, *) tensors
struct Planes {
    int batch, channels, plane_size;
};
Planes planes(const Tensor& x) {
    check_tensor(x, "input", 2, 8);
    const int64_t nc = x.size(0) * x.size(1);
    return {static_cast<int>(x.size(0)), static_cast<int>(x.size(1)),
            static_cast<int>(nc == 0 ? 0 : x.numel() / nc)};
}

Tensor group_norm_cuda(const Tensor& x, int64_t num_groups, const OptTensor& weight,
                       const OptTensor& bias, const OptTensor& scale, double eps) {
    const Planes v = planes(x);
    TORCH_CHECK(num_groups > 0 && v.channels % num_groups == 0,
                "scratchops: num_groups must divide the channels");
    const float* gamma = optional_vector(weight, x, "weight", v.channels);
    const float* beta = optional_vector(bias, x, "bias", v.channels);
    const float* s = optional_vector(scale, x, "scale", v.channels);
    c10::cuda::CUDAGuard guard(x.device());
    Tensor y = at::empty_like(x);
    if (y.numel() == 0) return y;
    Tensor stats = at::empty({2 * x.size(0) * num_groups}, x.options());
    check_cuda(group_norm_launch(x.data_ptr<float>(), y.data_ptr<float>(), gamma, beta, s,
                                 stats.data_ptr<float>(), v.batch, v.channels, v.plane_size,
                                 static_cast<int>(num_groups), static_cast<float>(eps),
                                 stream_of(x)),
               "group_norm");
    return y;
}

Tensor scale_cuda(const Tensor& x, const Tensor& scale) {
    const Planes v = planes(x);
    const float* s = optional_vector(scale, x, "scale", v.channels);
    c10::cuda::CUDAGuard guard(x.device());
    Tensor y = at::empty_like(x);
    if (y.numel() == 0) return y;
    check_cuda(scale_launch(x.data_ptr<float>(), s, y.data_ptr<float>(), v.batch, v.channels,
                            v.plane_size, stream_of(x)),
               "scale");
    return y;
}

Tensor min_add_mul_cuda(const Tensor& x, double constant, const Tensor& bias, double factor) {
    const Planes v = planes(x);
    const float* b = optional_vector(bias, x, "bias", v.channels);
    c10::cuda::CUDAGuard guard(x.device());
    Tensor y = at::empty_like(x);
    if (y.numel() == 0) return y;
    check_cuda(min_add_mul_launch(x.data_ptr<float>(), static_cast<float>(constant), b,
                                  static_cast<float>(factor), y.data_ptr<float>(), v.batch,
                                  v.channels, v.plane_size, stream_of(x)),
               "min_add_mul");
    return y;
}

// ------------------------------------------------------------------- pooling and clamp
Tensor max_pool2d_clamp_cuda(const Tensor& x, at::IntArrayRef kernel_size, at::IntArrayRef stride,
                             at::IntArrayRef padding, double min, double max) {
    check_tensor(x, "input", 4, 4);
    TORCH_CHECK(kernel_size.size() == 2, "scratchops: kernel_size must have 2 values");
    const int64_t one[] = {1, 1};
    const Conv2dGeometry w = window(x, kernel_size[0], kernel_size[1], stride, padding, one);
    TORCH_CHECK(2 * w.pad_h <= w.kernel_h && 2 * w.pad_w <= w.kernel_w,
                "scratchops: max_pool2d padding must be at most half the kernel");
    const PoolGeometry g{w.height, w.width, w.kernel_h, w.kernel_w, w.stride_h, w.stride_w,
                         w.pad_h,  w.pad_w, w.out_h,    w.out_w};
    c10::cuda::CUDAGuard guard(x.device());
    Tensor y = at::empty({x.size(0), x.size(1), g.out_h, g.out_w}, x.options());
    if (y.numel() == 0) return y;
    check_cuda(max_pool2d_clamp_launch(x.data_ptr<float>(), y.data_ptr<float>(),
                                       static_cast<int>(x.size(0) * x.size(1)), g,
                                       static_cast<float>(min), static_cast<float>(max),
                                       stream_of(x)),
               "max_pool2d_clamp");
    return y;
}

Tensor clamp_cuda(const Tensor& x, double min, double max) {
    check_tensor(x, "input", 0, 64);
    c10::cuda::CUDAGuard guard(x.device());
    Tensor y = at::empty_like(x);
    if (y.numel() == 0) return y;
    check_cuda(clamp_launch(x.data_ptr<float>(), y.data_ptr<float>(), static_cast<int>(x.numel()),
                            static_cast<float>(min), static_cast<float>(max), stream_of(x)),
               "clamp");
    return y;
}

}  // namespace

// The schemas repeat scratchops/_library.py's (a test compares them).
TORCH_LIBRARY(scratchops_cuda, m) {
    m.def("im2col(Tensor input, int[2] kernel_size, int[2] dilation, int[2] padding, "
          "int[2] stride, int version) -> Tensor");
    m.def("gemm(Tensor a, Tensor b, Tensor? bias, int version) -> Tensor");
    m.def("conv2d(Tensor input, Tensor weight, Tensor? bias, int[2] stride, int[2] padding, "
          "int[2] dilation, int algorithm, int workspace_bytes, int gemm_version) -> Tensor");
    m.def("conv2d_pack_weight(Tensor weight) -> Tensor");
    m.def("conv2d_min_add_mul(Tensor input, Tensor weight, Tensor? conv_bias, int[2] stride, "
          "int[2] padding, int[2] dilation, float constant, Tensor bias, float factor, "
          "Tensor? packed_weight) -> Tensor");
    m.def("conv2d_group_norm_pool_clamp(Tensor input, Tensor weight, Tensor? conv_bias, "
          "int num_groups, Tensor? gn_weight, Tensor? gn_bias, Tensor? scale, float eps, "
          "float min, float max, Tensor? packed_weight) -> Tensor");
    m.def("group_norm(Tensor input, int num_groups, Tensor? weight, Tensor? bias, "
          "Tensor? scale, float eps) -> Tensor");
    m.def("scale(Tensor input, Tensor scale) -> Tensor");
    m.def("min_add_mul(Tensor input, float constant, Tensor bias, float factor) -> Tensor");
    m.def("max_pool2d_clamp(Tensor input, int[2] kernel_size, int[2] stride, int[2] padding, "
          "float min, float max) -> Tensor");
    m.def("clamp(Tensor input, float min, float max) -> Tensor");
}

TORCH_LIBRARY_IMPL(scratchops_cuda, CUDA, m) {
    m.impl("im2col", &im2col_cuda);
    m.impl("gemm", &gemm_cuda);
    m.impl("conv2d", &conv2d_cuda);
    m.impl("conv2d_pack_weight", &conv2d_pack_weight_cuda);
    m.impl("conv2d_min_add_mul", &conv2d_min_add_mul_cuda);
    m.impl("conv2d_group_norm_pool_clamp", &conv2d_group_norm_pool_clamp_cuda);
    m.impl("group_norm", &group_norm_cuda);
    m.impl("scale", &scale_cuda);
    m.impl("min_add_mul", &min_add_mul_cuda);
    m.impl("max_pool2d_clamp", &max_pool2d_clamp_cuda);
    m.impl("clamp", &clamp_cuda);
}

}  // namespace scratchops
