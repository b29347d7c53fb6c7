// binding.cpp — the one C++ file that includes torch: the CUDA implementations of the private
// operators scratchops_cuda::<name>, which the public torch.ops.scratchops.<name> (defined with
// their fakes and autograd in scratchops/_library.py, so that they trace without this file
// built) call once the extension is loaded (scratchops/_build.py). Argument errors are raised
// in Python (scratchops/_validate.py); as an operator can still be called directly, each
// implementation checks what keeps a kernel inside its buffers (device, dtype, layout, rank,
// operand sizes that agree, window geometry in range, 32-bit offsets) and no more: the rest
// is the launchers' documented contract (cuda/launchers.h).

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/accumulate.h>
#include <torch/library.h>

#include <algorithm>
#include <climits>
#include <optional>
#include <vector>

#include "launchers.h"

namespace scratchops {
namespace {

using at::IntArrayRef;
using at::Tensor;
using OptTensor = std::optional<Tensor>;

// Every buffer holds at most this many elements: kernels index with 32-bit offsets.
constexpr int64_t kMaxElements = INT_MAX;
// Kernel size, stride, padding and dilation at most this (scratchops/_checks.py:
// GEOMETRY_MAX), so that oh * stride + kh * dilation stays far inside 32 bits.
constexpr int64_t kMaxGeometry = 65535;
// gemm v5 packs a batched B into a workspace of at most this many bytes, a chunk at a time.
constexpr long long kGemmWorkspaceBudget = 256LL << 20;

int i32(int64_t v) { return static_cast<int>(v); }  // a size already checked to fit
float f32(double v) { return static_cast<float>(v); }

// A contiguous float32 CUDA tensor of rank in [min_dim, max_dim], 32-bit addressable, on the
// device of `like` when given. (Terse: Python has said what is wrong before this runs.)
void check_tensor(const Tensor& t, const char* name, int64_t min_dim, int64_t max_dim,
                  const Tensor* like = nullptr) {
    TORCH_CHECK(t.is_cuda() && (like == nullptr || t.device() == like->device()),
                "scratchops: ", name, " must be a CUDA tensor on the input's device");
    TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous() && t.dim() >= min_dim &&
                    t.dim() <= max_dim && t.numel() <= kMaxElements,
                "scratchops: ", name, " must be a contiguous float32 tensor of ", min_dim, " to ",
                max_dim, " dimensions and at most 2^31-1 elements");
}

// A per-channel parameter of `length` values (Python checks its shape), or nullptr.
const float* optional_vector(const OptTensor& p, const Tensor& x, const char* name,
                             int64_t length) {
    if (!p.has_value()) return nullptr;
    check_tensor(*p, name, 1, 8, &x);
    TORCH_CHECK(p->numel() == length, "scratchops: ", name, " must have ", length, " values");
    return p->data_ptr<float>();
}

// The tensor-core kernels are sm_90a code (wgmma), left empty in a build for other GPUs.
void check_tensor_cores(const Tensor& t, const char* what) {
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, t.device().index());
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, t.device().index());
    TORCH_CHECK(major == 9 && minor == 0, "scratchops: ", what, " runs on the tensor cores of an "
                "sm_90 GPU (H100, H200); this GPU is sm_", major, minor,
                " (conv2d: use algorithm='im2col_gemm'; gemm: version 1-4)");
}

// Every operator ends here: an output of `shape` (checked to be 32-bit addressable) on x's
// device, which launch(output, stream) fills on x's current stream unless it is empty. A
// workspace the launch allocates may be freed when it returns: the caching allocator hands it
// out again only in that stream's order. A failed launch raises, naming `what`.
template <typename T = float, typename Launch>
Tensor launch_into(const Tensor& x, IntArrayRef shape, const char* what, Launch&& launch) {
    TORCH_CHECK(c10::multiply_integers(shape) <= kMaxElements, "scratchops: the ", what,
                " output would have more than 2^31-1 elements (32-bit indexing)");
    c10::cuda::CUDAGuard guard(x.device());
    Tensor y = at::empty(shape, x.options().dtype(c10::CppTypeToScalarType<T>::value));
    if (y.numel() == 0) return y;
    const cudaError_t err =
        launch(y.data_ptr<T>(), c10::cuda::getCurrentCUDAStream(x.device().index()).stream());
    TORCH_CHECK(err == cudaSuccess, "scratchops: ", what, " failed: ", cudaGetErrorString(err));
    return y;
}

// The window of im2col, conv2d and max_pool2d over 4-D x: sizes in range, the padded input
// 32-bit addressable and holding at least one window, so out_h, out_w >= 1.
Conv2dGeometry window(const Tensor& x, IntArrayRef kernel, IntArrayRef stride,
                      IntArrayRef padding, IntArrayRef dilation) {
    TORCH_CHECK(kernel.size() == 2 && stride.size() == 2 && padding.size() == 2 &&
                    dilation.size() == 2, "scratchops: window sizes must have 2 values");
    int64_t out[2];
    for (int i = 0; i < 2; ++i) {
        const int64_t padded = x.size(2 + i) + 2 * padding[i];
        const int64_t span = dilation[i] * (kernel[i] - 1) + 1;
        TORCH_CHECK(std::min({kernel[i], stride[i], dilation[i], padding[i] + 1}) >= 1 &&
                        std::max({kernel[i], stride[i], dilation[i], padding[i]}) <= kMaxGeometry &&
                        padded <= kMaxElements && padded >= span,
                    "scratchops: window sizes out of range, or the window exceeds the input");
        out[i] = (padded - span) / stride[i] + 1;
    }
    return {i32(x.size(1)), i32(x.size(2)), i32(x.size(3)), i32(kernel[0]), i32(kernel[1]),
            i32(stride[0]), i32(stride[1]), i32(padding[0]), i32(padding[1]), i32(dilation[0]),
            i32(dilation[1]), i32(out[0]), i32(out[1])};
}

// ---------------------------------------------------------------------------- im2col, GEMM
Tensor im2col_cuda(const Tensor& x, IntArrayRef kernel_size, IntArrayRef dilation,
                   IntArrayRef padding, IntArrayRef stride, int64_t version) {
    check_tensor(x, "input", 4, 4);
    const Conv2dGeometry g = window(x, kernel_size, stride, padding, dilation);
    const int64_t taps = int64_t{g.channels} * g.kernel_h * g.kernel_w;
    const int64_t pixels = int64_t{g.out_h} * g.out_w;
    return launch_into(x, {x.size(0), taps, pixels}, "im2col", [&](float* cols, cudaStream_t s) {
        return im2col_launch(i32(version), x.data_ptr<float>(), cols, i32(x.size(0)), g, 0,
                             i32(pixels), s);
    });
}

// a @ b (+ bias per row) for (M,K)@(K,N), (B,M,K)@(B,K,N) and a 2-D operand shared by a batch.
Tensor gemm_cuda(const Tensor& a, const Tensor& b, const OptTensor& bias, int64_t version) {
    check_tensor(a, "a", 2, 3);
    check_tensor(b, "b", 2, 3, &a);
    const int64_t M = a.size(-2), K = a.size(-1), N = b.size(-1);
    TORCH_CHECK(b.size(-2) == K && (a.dim() == 2 || b.dim() == 2 || a.size(0) == b.size(0)),
                "scratchops: gemm inner dimensions or batch sizes differ");
    const int batch = i32(a.dim() == 3 ? a.size(0) : (b.dim() == 3 ? b.size(0) : 1));
    std::vector<int64_t> shape{M, N};
    if (a.dim() == 3 || b.dim() == 3) shape.insert(shape.begin(), batch);
    GemmArgs args{a.data_ptr<float>(), b.data_ptr<float>(), optional_vector(bias, a, "bias", M),
                  nullptr, i32(M), i32(N), i32(K), i32(K), i32(N), i32(N),
                  a.dim() == 3 ? M * K : 0, b.dim() == 3 ? K * N : 0, M * N, batch};
    return launch_into(a, shape, "gemm", [&](float* c, cudaStream_t s) {
        args.C = c;
        const long long bytes = gemm_workspace_bytes(i32(version), args, kGemmWorkspaceBudget);
        if (bytes > 0) check_tensor_cores(a, "gemm version 5");  // (v5 alone has a workspace)
        Tensor ws = at::empty({bytes}, a.options().dtype(at::kByte));
        return gemm_launch(i32(version), args, ws.data_ptr(), bytes, s);
    });
}

// ------------------------------------------------------------------------------ conv2d
// What every convolution shares: x, weight and bias checked, the window and the output shape.
struct Conv {
    const float *x, *bias;
    int batch, cout;
    Conv2dGeometry g;
    std::vector<int64_t> shape;  // (N, Cout, out_h, out_w)
};
Conv conv_setup(const Tensor& x, const Tensor& weight, const OptTensor& bias,
                IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation) {
    check_tensor(x, "input", 4, 4);
    check_tensor(weight, "weight", 4, 4, &x);
    TORCH_CHECK(weight.size(1) == x.size(1), "scratchops: weight and input channels differ");
    const Conv2dGeometry g = window(x, weight.sizes().slice(2), stride, padding, dilation);
    return {x.data_ptr<float>(), optional_vector(bias, x, "bias", weight.size(0)),
            i32(x.size(0)), i32(weight.size(0)), g, {x.size(0), weight.size(0), g.out_h, g.out_w}};
}

// The weight packed for the tensor cores (what packing reads of the geometry: the channels
// and the kernel size).
Conv2dGeometry weight_geometry(const Tensor& w) {
    return {i32(w.size(1)), 0, 0, i32(w.size(2)), i32(w.size(3)), 0, 0, 0, 0, 0, 0, 0, 0};
}
int64_t packed_bytes(const Tensor& w) {
    return conv2d_implicit_packed_bytes(weight_geometry(w), i32(w.size(0)));
}

Tensor conv2d_pack_weight_cuda(const Tensor& w) {
    check_tensor(w, "weight", 4, 4);
    TORCH_CHECK(std::max(w.size(2), w.size(3)) <= kMaxGeometry, "scratchops: kernel too large");
    return launch_into<uint8_t>(w, {packed_bytes(w)}, "weight packing",
                                [&](uint8_t* packed, cudaStream_t s) {
        return w.numel() == 0 ? cudaSuccess  // (the flags alone)
                              : conv2d_implicit_pack(w.data_ptr<float>(), i32(w.size(0)),
                                                     weight_geometry(w), packed, s);
    });
}

// `packed` as given (checked to be the weight's packed size), or the weight packed now.
Tensor packed_for(const Tensor& w, const OptTensor& packed) {
    check_tensor_cores(w, "this convolution");
    if (!packed.has_value()) return conv2d_pack_weight_cuda(w);
    TORCH_CHECK(packed->is_cuda() && packed->device() == w.device() &&
                    packed->scalar_type() == at::kByte && packed->dim() == 1 &&
                    packed->numel() == packed_bytes(w),
                "scratchops: packed_weight is not conv2d_pack_weight(weight)");
    return *packed;
}

// algorithm 0: im2col + gemm in a bounded workspace; 1: implicit GEMM on the tensor cores.
Tensor conv2d_cuda(const Tensor& x, const Tensor& weight, const OptTensor& bias,
                   IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                   int64_t algorithm, int64_t workspace_bytes, int64_t gemm_version) {
    const Conv c = conv_setup(x, weight, bias, stride, padding, dilation);
    return launch_into(x, c.shape, "conv2d", [&](float* y, cudaStream_t s) {
        if (algorithm == 1)
            return conv2d_implicit_launch(c.x, packed_for(weight, std::nullopt).data_ptr(), c.bias,
                                          y, c.batch, c.cout, c.g,
                                          ConvTail{ConvTail::kNone, 0.0f, nullptr, 1.0f}, s);
        const long long floats = conv2d_im2col_workspace_floats(c.batch, c.g, workspace_bytes);
        Tensor cols = at::empty({floats}, x.options());
        return conv2d_im2col_launch(c.x, weight.data_ptr<float>(), c.bias, y, c.batch, c.cout,
                                    c.g, i32(gemm_version), cols.data_ptr<float>(), floats, s);
    });
}

// P31 in one kernel: (min(conv2d(x) + conv_bias, constant) + bias) * factor.
Tensor conv2d_min_add_mul_cuda(const Tensor& x, const Tensor& weight, const OptTensor& conv_bias,
                               IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                               double constant, const Tensor& bias, double factor,
                               const OptTensor& packed_weight) {
    const Conv c = conv_setup(x, weight, conv_bias, stride, padding, dilation);
    const ConvTail tail{ConvTail::kMinAddMul, f32(constant),
                        optional_vector(bias, x, "bias", c.cout), f32(factor)};
    return launch_into(x, c.shape, "conv2d_min_add_mul", [&](float* y, cudaStream_t s) {
        return conv2d_implicit_launch(c.x, packed_for(weight, packed_weight).data_ptr(), c.bias,
                                      y, c.batch, c.cout, c.g, tail, s);
    });
}

// P85 in one pass: clamp(max_pool2d(group_norm(conv2d(x)) * scale, 4), min, max). The
// launcher refuses (cudaErrorInvalidValue) what its one pass does not cover.
Tensor conv2d_group_norm_pool_clamp_cuda(const Tensor& x, const Tensor& weight,
                                         const OptTensor& conv_bias, int64_t num_groups,
                                         const OptTensor& gn_weight, const OptTensor& gn_bias,
                                         const OptTensor& scale, double eps, double min,
                                         double max, const OptTensor& packed_weight) {
    const int64_t one[] = {1, 1}, zero[] = {0, 0};
    const Conv c = conv_setup(x, weight, conv_bias, one, zero, one);
    const GnPoolArgs a{c.bias, optional_vector(gn_weight, x, "gn_weight", c.cout),
                       optional_vector(gn_bias, x, "gn_bias", c.cout),
                       optional_vector(scale, x, "scale", c.cout), i32(num_groups), f32(eps),
                       f32(min), f32(max)};
    return launch_into(x, {x.size(0), c.cout, c.g.out_h / 4, c.g.out_w / 4},
                       "conv2d_group_norm_pool_clamp", [&](float* y, cudaStream_t s) {
        const Tensor packed = packed_for(weight, packed_weight);
        Tensor ws = at::empty({conv_gn_pool_workspace_bytes(c.batch, c.cout, c.g, a.groups)},
                              x.options().dtype(at::kByte));
        return conv_gn_pool_launch(c.x, packed.data_ptr(), a, y, c.batch, c.cout, c.g,
                                   ws.data_ptr(), s);
    });
}

// ---------------------------------------------------- per-channel ops on (N, C, *) tensors
struct Planes {
    const float* x;
    int batch, channels, size;  // size: the elements of one (n, c) plane
};
Planes planes(const Tensor& x) {
    check_tensor(x, "input", 2, 8);
    const int64_t nc = x.size(0) * x.size(1);
    return {x.data_ptr<float>(), i32(x.size(0)), i32(x.size(1)), i32(nc ? x.numel() / nc : 0)};
}

Tensor group_norm_cuda(const Tensor& x, int64_t num_groups, const OptTensor& weight,
                       const OptTensor& bias, const OptTensor& scale, double eps,
                       int64_t version) {
    const Planes p = planes(x);
    // Channel c of sample n reads the statistics of group n * groups + c / (C / groups).
    TORCH_CHECK(num_groups > 0 && p.channels % num_groups == 0,
                "scratchops: num_groups must divide the channels");
    const float* gamma = optional_vector(weight, x, "weight", p.channels);
    const float* beta = optional_vector(bias, x, "bias", p.channels);
    const float* s = optional_vector(scale, x, "scale", p.channels);
    return launch_into(x, x.sizes(), "group_norm", [&](float* y, cudaStream_t stream) {
        Tensor stats = at::empty({2 * p.batch * num_groups}, x.options());  // mean, 1/std
        return group_norm_launch(i32(version), p.x, y, gamma, beta, s, stats.data_ptr<float>(),
                                 p.batch, p.channels, p.size, i32(num_groups), f32(eps), stream);
    });
}

Tensor scale_cuda(const Tensor& x, const Tensor& scale) {
    const Planes p = planes(x);
    const float* s = optional_vector(scale, x, "scale", p.channels);
    return launch_into(x, x.sizes(), "scale", [&](float* y, cudaStream_t stream) {
        return scale_launch(p.x, s, y, p.batch, p.channels, p.size, stream);
    });
}

Tensor min_add_mul_cuda(const Tensor& x, double constant, const Tensor& bias, double factor) {
    const Planes p = planes(x);
    const float* b = optional_vector(bias, x, "bias", p.channels);
    return launch_into(x, x.sizes(), "min_add_mul", [&](float* y, cudaStream_t stream) {
        return min_add_mul_launch(p.x, f32(constant), b, f32(factor), y, p.batch, p.channels,
                                  p.size, stream);
    });
}

// --------------------------------------------------------------------- pooling and clamp
Tensor max_pool2d_clamp_cuda(const Tensor& x, IntArrayRef kernel_size, IntArrayRef stride,
                             IntArrayRef padding, double min, double max, int64_t version) {
    check_tensor(x, "input", 4, 4);
    const int64_t one[] = {1, 1};
    const Conv2dGeometry w = window(x, kernel_size, stride, padding, one);
    const PoolGeometry g{w.height, w.width, w.kernel_h, w.kernel_w, w.stride_h,
                         w.stride_w, w.pad_h, w.pad_w, w.out_h, w.out_w};
    return launch_into(x, {x.size(0), x.size(1), g.out_h, g.out_w}, "max_pool2d_clamp",
                       [&](float* y, cudaStream_t s) {
        return max_pool2d_clamp_launch(i32(version), x.data_ptr<float>(), y,
                                       i32(x.size(0) * x.size(1)), g, f32(min), f32(max), s);
    });
}

Tensor clamp_cuda(const Tensor& x, double min, double max) {
    check_tensor(x, "input", 0, 64);
    return launch_into(x, x.sizes(), "clamp", [&](float* y, cudaStream_t s) {
        return clamp_launch(x.data_ptr<float>(), y, i32(x.numel()), f32(min), f32(max), s);
    });
}

}  // namespace

// Each operator with its CUDA implementation. The schema is inferred from the C++ signature
// (Tensor, int[], Tensor?, float, int): its text, with the argument names, is written once, in
// scratchops/_library.py, whose operators call these; tests/test_library.py checks the types
// agree.
TORCH_LIBRARY(scratchops_cuda, m) {
    const auto def = [&m](const char* name, auto* implementation) {
        m.def(name, torch::dispatch(c10::DispatchKey::CUDA, implementation));
    };
    def("im2col", &im2col_cuda);
    def("gemm", &gemm_cuda);
    def("conv2d", &conv2d_cuda);
    def("conv2d_pack_weight", &conv2d_pack_weight_cuda);
    def("conv2d_min_add_mul", &conv2d_min_add_mul_cuda);
    def("conv2d_group_norm_pool_clamp", &conv2d_group_norm_pool_clamp_cuda);
    def("group_norm", &group_norm_cuda);
    def("scale", &scale_cuda);
    def("min_add_mul", &min_add_mul_cuda);
    def("max_pool2d_clamp", &max_pool2d_clamp_cuda);
    def("clamp", &clamp_cuda);
}

}  // namespace scratchops
