// binding.cpp — the one C++ file that includes torch: the CUDA implementations of the public
// operators torch.ops.scratchops.<name>, whose schemas, fakes and autograd
// scratchops/_library.py defines at import (so that they trace without this file built).
// Once built and loaded (scratchops/_build.py), register_public_kernels() registers each
// implementation for the CUDA key of its public operator, so a call goes from the dispatcher
// straight here; the same implementations also stand as scratchops_cuda::<name>, which the
// Python placeholder kernels call before that registration.
//
// The checks here are the cheap half of the argument validation: every call of the public
// functions without autograd comes here with its arguments as given, and whatever these
// checks refuse, Python asks scratchops/_validate.py, the one validator, for the error (see
// scratchops/ops.py). So they refuse exactly what the validator refuses (tests/
// test_call_path.py checks the two agree), tersely: ValueError, TypeError or
// NotImplementedError, as the validator would raise. They also keep every kernel inside its
// buffers when an operator is called directly. The rest is the launchers' contract
// (cuda/launchers.h).
//
// The direct calls: the same file is also a Python module (scratchops_kernels) with one function
// per operator, which scratchops/ops.py calls when no gradient is wanted. Each converts its
// Python arguments with pybind11 and calls the public operator through the C++ dispatcher,
// below autograd: every dispatch key still applies (fake tensors, dispatch modes, the
// profiler, vmap, tracing), but the call skips torch.ops' schema-driven argument parsing,
// which cost more host time than the rest of the call.
//
// Precision: the convolutions follow torch's cuDNN TF32 switch and gemm the matmul one, read
// at each call as torch's own operators read them (see conv2d_uses_tf32 in launchers.h).

#include <ATen/Context.h>
#include <ATen/core/Tensor.h>
#include <ATen/cuda/EmptyTensor.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/accumulate.h>
#include <torch/extension.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdio>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
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
// gemm v5-v9 pack a batched B into a workspace of at most this many bytes, a chunk at a time.
constexpr long long kGemmWorkspaceBudget = 256LL << 20;
// The one-pass P85 operator: output channels it covers, and its pooling window.
constexpr int64_t kOnePassMaxChannels = 64, kOnePassPool = 4;

int i32(int64_t v) { return static_cast<int>(v); }  // a size already checked to fit
float f32(double v) { return static_cast<float>(v); }

// A refused argument: the validator raises the error a user reads (see the top).
// Messages hold strings only: formatting a number into them crashed on the GPU machine (the
// extension's own copy of libstdc++'s number formatting met torch's stream; seen in cuda-gdb).
#define SCRATCHOPS_ARG(cond, ...) TORCH_CHECK_VALUE(cond, "scratchops: ", __VA_ARGS__)

// The element types (launchers.h): float32, float16, bfloat16.
bool element_type(const Tensor& t) {
    const at::ScalarType type = t.scalar_type();
    return type == at::kFloat || type == at::kHalf || type == at::kBFloat16;
}

// A contiguous CUDA tensor of an element type, of rank in [min_dim, max_dim], 32-bit
// addressable, on the device and of the dtype of `like` when given, with no zero-size
// dimension among the bits of `nonzero` (bit d: dimension d).
void check_tensor(const Tensor& t, const char* name, int64_t min_dim, int64_t max_dim,
                  const Tensor* like = nullptr, unsigned nonzero = 0) {
    SCRATCHOPS_ARG(t.is_cuda() && (like == nullptr || t.device() == like->device()), name,
                   " must be a CUDA tensor on the input's device");
    SCRATCHOPS_ARG(element_type(t) && (like == nullptr || t.scalar_type() == like->scalar_type()),
                   name, " must be float32, float16 or bfloat16, the input's dtype");
    SCRATCHOPS_ARG(t.is_contiguous() && t.dim() >= min_dim && t.dim() <= max_dim &&
                       t.numel() <= kMaxElements,
                   name, " must be a contiguous tensor of the operator's rank, with at "
                   "most 2^31-1 elements");
    for (int64_t d = 0; d < t.dim() && d < 32; ++d)
        SCRATCHOPS_ARG(!(nonzero >> d & 1u) || t.size(d) != 0, name, " has a zero-size dimension");
}
constexpr unsigned kAllButBatch = 0b1110, kAll = 0b1111;

// A per-channel parameter of `channels` values for an input of `x_dims` dimensions: shape
// (C,), or (C, 1, ..., 1) with x_dims - 2 ones unless exact_1d; or absent.
void check_per_channel(const OptTensor& p, const Tensor& x, const char* name, int64_t channels,
                       int64_t x_dims, bool exact_1d = false) {
    if (!p.has_value()) return;
    check_tensor(*p, name, 1, 8, &x);
    bool shaped = p->size(0) == channels &&
                  (p->dim() == 1 || (!exact_1d && x_dims > 2 && p->dim() == x_dims - 1));
    for (int64_t d = 1; shaped && d < p->dim(); ++d) shaped = p->size(d) == 1;
    SCRATCHOPS_ARG(shaped, name, " must hold one value per channel");
}

// ------------------------------------------------------------------------ element types
// f(Element<T>{}) with T the launchers' name of x's element type (checked by check_tensor):
// float, __half or __nv_bfloat16, whose bits are torch's float, at::Half and at::BFloat16.
template <class T>
struct Element {
    using type = T;
};
template <class F>
decltype(auto) with_element_type(const Tensor& x, F&& f) {
    switch (x.scalar_type()) {
        case at::kHalf: return f(Element<__half>{});
        case at::kBFloat16: return f(Element<__nv_bfloat16>{});
        default: return f(Element<float>{});
    }
}
template <class T>
const T* data(const Tensor& t) {
    return static_cast<const T*>(t.const_data_ptr());
}
template <class T>
const T* data(const OptTensor& t) {  // nullptr when absent
    return t.has_value() ? data<T>(*t) : nullptr;
}


// The tensor-core kernels are sm_90a code (wgmma), left empty in a build for other GPUs.
// A kernel version in [1, last] (launchers.h has each operator's last).
void check_choice(int64_t value, int64_t last, const char* name) {
    SCRATCHOPS_ARG(value >= 1 && value <= last, name, " is not one of the operator's versions");
}

// ---------------------------------------------------------- the tensor-core engine
// Which engine the tensor-core kernels run on (launchers.h: TensorCorePath): by default the
// best the device has, wgmma on an sm_90 GPU and mma.sync on any other sm_80+ GPU; or the one
// scratchops.set_tensor_core_path forced (so that an H100 can test both). Read at each call,
// like torch's TF32 switches. The names are scratchops/versions.py's TENSOR_CORE_PATHS.
constexpr int kAutoPath = -1;
std::atomic<int> forced_path{kAutoPath};  // kAutoPath or a TensorCorePath
struct PathName {
    const char* name;
    int path;
};
constexpr PathName kPathNames[] = {{"auto", kAutoPath},
                                   {"wgmma", static_cast<int>(TensorCorePath::kWgmma)},
                                   {"mma_sync", static_cast<int>(TensorCorePath::kMmaSync)}};

void set_tensor_core_path(const std::string& name) {
    for (const PathName& p : kPathNames)
        if (name == p.name) {
            forced_path.store(p.path, std::memory_order_relaxed);
            return;
        }
    SCRATCHOPS_ARG(false, "the tensor-core path must be one of auto, wgmma, mma_sync");
}

std::string get_tensor_core_path() {
    const int path = forced_path.load(std::memory_order_relaxed);
    for (const PathName& p : kPathNames)
        if (p.path == path) return p.name;
    return "auto";
}

struct Capability {
    int major = 0, minor = 0;
    explicit Capability(int device) {
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    }
    bool hopper() const { return major == 9 && minor == 0; }  // wgmma (sm_90a)
    bool tensor_cores() const { return major >= 8; }          // mma.sync's TF32
};

// The engine the tensor-core kernels run on for tensors on `device` under the current
// setting, or none when it has none.
std::optional<TensorCorePath> engine_for(int device) {
    const Capability cap(device);
    const int forced = forced_path.load(std::memory_order_relaxed);
    if (!cap.tensor_cores()) return std::nullopt;
    if (forced == static_cast<int>(TensorCorePath::kWgmma) && !cap.hopper()) return std::nullopt;
    if (forced != kAutoPath) return static_cast<TensorCorePath>(forced);
    return cap.hopper() ? TensorCorePath::kWgmma : TensorCorePath::kMmaSync;
}

// The engine `what` runs on for t's device; refuses a device it cannot run on.
TensorCorePath tensor_core_engine(const Tensor& t, const char* what) {
    const std::optional<TensorCorePath> engine = engine_for(t.device().index());
    if (engine.has_value()) return *engine;
    const Capability cap(t.device().index());
    char found[32];
    std::snprintf(found, sizeof found, "sm_%d%d", cap.major, cap.minor);
    TORCH_CHECK(cap.tensor_cores(), "scratchops: ", what, " runs on the tensor cores of an sm_80 "
                "or later GPU; this GPU is ", found,
                " (conv2d: use algorithm='im2col_gemm'; gemm: version 1-4)");
    TORCH_CHECK(false, "scratchops: the tensor-core path 'wgmma' (set by "
                "scratchops.set_tensor_core_path) needs an sm_90 GPU (H100, H200); this GPU is ",
                found);
}

// The engine of gemm's tensor-core version `version` for t's device: v9 the one the setting
// picks, v5 mma.sync, v6-v8 wgmma; refuses a device without it.
TensorCorePath gemm_engine(const Tensor& t, int version) {
    if (version == kGemmTensorCoreVersion) return tensor_core_engine(t, "gemm version 9");
    const Capability cap(t.device().index());
    char found[32];
    std::snprintf(found, sizeof found, "sm_%d%d", cap.major, cap.minor);
    if (!gemm_version_needs_wgmma(version)) {
        TORCH_CHECK(cap.tensor_cores(), "scratchops: gemm version 5 runs on the tensor cores of "
                    "an sm_80 or later GPU; this GPU is ", found, " (gemm: version 1-4)");
        return TensorCorePath::kMmaSync;
    }
    char which[8];
    std::snprintf(which, sizeof which, "%d", version);
    TORCH_CHECK(cap.hopper(), "scratchops: gemm version ", which, " runs on Hopper's wgmma: an "
                "sm_90 GPU (H100, H200); this GPU is ", found, " (gemm: version 1-5, or 9)");
    return TensorCorePath::kWgmma;
}

// For scratchops run's labels: the engine a tensor-core call on `device` would use.
std::string tensor_core_engine_name(int64_t device) {
    const std::optional<TensorCorePath> engine = engine_for(static_cast<int>(device));
    if (!engine.has_value()) return "none";
    return *engine == TensorCorePath::kWgmma ? "wgmma" : "mma_sync";
}

// A workspace of `bytes` for one call, from torch's caching allocator on the current device
// and stream (launch_into's guard sets the device): freed when the returned pointer goes,
// right after the launch, and handed out again only in that stream's order. (The allocator
// directly: a tensor around it would cost host time and nothing else.)
at::DataPtr workspace(long long bytes) {
    return c10::cuda::CUDACachingAllocator::get()->allocate(static_cast<size_t>(bytes));
}

// torch's TF32 switches, read at each call as torch's operators read them.
bool conv_tf32_allowed() { return at::globalContext().allowTF32CuDNN(at::Float32Op::CONV); }
bool matmul_tf32_allowed() { return at::globalContext().allowTF32CuBLAS(); }

// An uninitialised output of `shape` with x's dtype on x's device. The CUDA allocation itself,
// as torch's own CUDA kernels allocate their outputs: the caller already runs at the CUDA
// key, and at::empty would go through the dispatcher again to get here.
Tensor new_output(const Tensor& x, IntArrayRef shape) {
    return at::detail::empty_cuda(shape, x.scalar_type(), x.device(), std::nullopt);
}

// Every operator ends here: an output of `shape` (checked to be 32-bit addressable) on x's
// device, which launch(output, stream) fills on x's current stream unless it is empty. A
// workspace the launch allocates may be freed when it returns: the caching allocator hands it
// out again only in that stream's order. A failed launch raises, naming `what`.
// The output has x's dtype; launch(Element<T>, T* output, stream) with T its element type.
template <typename Launch>
Tensor launch_into(const Tensor& x, IntArrayRef shape, const char* what, Launch&& launch) {
    SCRATCHOPS_ARG(c10::multiply_integers(shape) <= kMaxElements, "the ", what,
                   " output would have more than 2^31-1 elements (32-bit indexing)");
    c10::cuda::CUDAGuard guard(x.device());
    Tensor y = new_output(x, shape);
    if (y.numel() == 0) return y;
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
    const cudaError_t err = with_element_type(x, [&](auto element) {
        using T = typename decltype(element)::type;
        return launch(element, static_cast<T*>(y.data_ptr()), stream);
    });
    TORCH_CHECK(err == cudaSuccess, "scratchops: ", what, " failed: ", cudaGetErrorString(err));
    return y;
}

// The window of im2col, conv2d and max_pool2d over 4-D x: sizes in range, the padded input
// 32-bit addressable and holding at least one window, so out_h, out_w >= 1.
Conv2dGeometry window_of(int64_t channels, int64_t height, int64_t width, IntArrayRef kernel,
                         IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation) {
    SCRATCHOPS_ARG(kernel.size() == 2 && stride.size() == 2 && padding.size() == 2 &&
                       dilation.size() == 2, "window sizes must have 2 values");
    int64_t out[2];
    for (int i = 0; i < 2; ++i) {
        const int64_t padded = (i == 0 ? height : width) + 2 * padding[i];
        const int64_t span = dilation[i] * (kernel[i] - 1) + 1;
        SCRATCHOPS_ARG(std::min({kernel[i], stride[i], dilation[i], padding[i] + 1}) >= 1 &&
                           std::max({kernel[i], stride[i], dilation[i], padding[i]}) <= kMaxGeometry &&
                           padded <= kMaxElements && padded >= span,
                       "window sizes out of range, or the window exceeds the input");
        out[i] = (padded - span) / stride[i] + 1;
    }
    return {i32(channels), i32(height), i32(width), i32(kernel[0]), i32(kernel[1]),
            i32(stride[0]), i32(stride[1]), i32(padding[0]), i32(padding[1]), i32(dilation[0]),
            i32(dilation[1]), i32(out[0]), i32(out[1])};
}
Conv2dGeometry window(const Tensor& x, IntArrayRef kernel, IntArrayRef stride,
                      IntArrayRef padding, IntArrayRef dilation) {
    return window_of(x.size(1), x.size(2), x.size(3), kernel, stride, padding, dilation);
}

// ---------------------------------------------------------------------------- im2col, GEMM
Tensor im2col_cuda(const Tensor& x, IntArrayRef kernel_size, IntArrayRef dilation,
                   IntArrayRef padding, IntArrayRef stride, int64_t version) {
    check_tensor(x, "input", 4, 4, nullptr, kAllButBatch);  // F.unfold allows only a 0 batch
    const Conv2dGeometry g = window(x, kernel_size, stride, padding, dilation);
    check_choice(version, kIm2colVersions, "version");
    const int64_t taps = int64_t{g.channels} * g.kernel_h * g.kernel_w;
    const int64_t pixels = int64_t{g.out_h} * g.out_w;
    return launch_into(x, {x.size(0), taps, pixels}, "im2col", [&](auto e, auto* cols,
                                                                    cudaStream_t s) {
        using T = typename decltype(e)::type;
        return im2col_launch<T>(i32(version), data<T>(x), cols, i32(x.size(0)), g, 0,
                                i32(pixels), s);
    });
}

// a @ b (+ bias per row) for (M,K)@(K,N), (B,M,K)@(B,K,N) and a 2-D operand shared by a batch.
Tensor gemm_cuda(const Tensor& a, const Tensor& b, const OptTensor& bias,
                 std::optional<int64_t> chosen_version) {
    check_tensor(a, "a", 2, 3);
    check_tensor(b, "b", 2, 3, &a);
    const int64_t M = a.size(-2), K = a.size(-1), N = b.size(-1);
    SCRATCHOPS_ARG(b.size(-2) == K && (a.dim() == 2 || b.dim() == 2 || a.size(0) == b.size(0)),
                   "gemm inner dimensions or batch sizes differ");
    if (bias.has_value()) {
        check_tensor(*bias, "bias", 1, 1, &a);
        SCRATCHOPS_ARG(bias->size(0) == M, "gemm bias must have one value per row");
    }
    // No version: the faster one for this shape (launchers.h, kGemmTensorCoreMinRows).
    const int64_t version =
        chosen_version.has_value() ? *chosen_version
        : M >= kGemmTensorCoreMinRows && engine_for(a.device().index()).has_value()
            ? kGemmTensorCoreVersion
            : kGemmFirstTensorCoreVersion - 1;
    check_choice(version, kGemmTensorCoreVersion, "version");
    const int batch = i32(a.dim() == 3 ? a.size(0) : (b.dim() == 3 ? b.size(0) : 1));
    std::vector<int64_t> shape{M, N};
    if (a.dim() == 3 || b.dim() == 3) shape.insert(shape.begin(), batch);
    return launch_into(a, shape, "gemm", [&](auto e, auto* c, cudaStream_t s) {
        using T = typename decltype(e)::type;
        GemmArgs<T> args{data<T>(a), data<T>(b), data<T>(bias), c, i32(M), i32(N), i32(K), i32(K),
                         i32(N), i32(N), a.dim() == 3 ? M * K : 0, b.dim() == 3 ? K * N : 0,
                         M * N, batch, std::is_same_v<T, float> && matmul_tf32_allowed()};
        if (version >= kGemmFirstTensorCoreVersion && K > 0)
            args.engine = gemm_engine(a, i32(version));
        const long long bytes = gemm_workspace_bytes(i32(version), args, kGemmWorkspaceBudget);
        const at::DataPtr ws = workspace(bytes);
        return gemm_launch(i32(version), args, ws.get(), bytes, s);
    });
}

// ------------------------------------------------------------------------------ conv2d
// What every convolution shares: x, weight and bias checked, the window and the output shape,
// and whether it computes in TF32 (float alone: torch's switch and conv2d_uses_tf32).
struct Conv {
    int batch, cout;
    Conv2dGeometry g;
    std::vector<int64_t> shape;  // (N, Cout, out_h, out_w)
    bool tf32;
};
Conv conv_setup(const Tensor& x, const Tensor& weight, const OptTensor& bias,
                IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation) {
    // (F.conv2d refuses an empty image; scratchops also 0 input channels)
    check_tensor(x, "input", 4, 4, nullptr, kAllButBatch);
    check_tensor(weight, "weight", 4, 4, &x, kAll);
    SCRATCHOPS_ARG(weight.size(1) == x.size(1), "weight and input channels differ");
    check_per_channel(bias, x, "bias", weight.size(0), 2);
    const Conv2dGeometry g = window(x, weight.sizes().slice(2), stride, padding, dilation);
    return {i32(x.size(0)), i32(weight.size(0)), g,
            {x.size(0), weight.size(0), g.out_h, g.out_w},
            x.scalar_type() == at::kFloat && conv_tf32_allowed() && conv2d_uses_tf32(g)};
}

// A tensor-core convolution's workspaces for this call, in one allocation: `packed` for its
// weights, which the launch packs at every call (conv2d_implicit_launch's weight argument:
// inside the convolution's kernel where it can, else with a small kernel first) so that no
// copy could outlive the weights; and, where the launch may stage A (may_stage:
// conv2d_implicit_stages_a), `channels_last` for the input x's channels-last copy, from the
// next kWorkspaceAlign-byte boundary (else nullptr; where the launch reads x itself, v5, a
// pointer to 0 bytes).
// engine: the tensor cores that multiply.
constexpr long long kWorkspaceAlign = 256;  // (a tensor map's base needs 16 bytes)
struct ConvWorkspaces {
    at::DataPtr memory;
    void* packed = nullptr;
    void* channels_last = nullptr;
    TensorCorePath engine = TensorCorePath::kWgmma;
};
template <class T>
ConvWorkspaces conv_workspaces(const Conv& c, bool may_stage, TensorCorePath engine,
                               const T* x) {
    const bool staged = may_stage && conv2d_implicit_stages_a<T>(c.g, c.tf32, engine);
    const long long packed_bytes = (conv2d_implicit_packed_bytes(c.g, c.cout) + kWorkspaceAlign -
                                    1) / kWorkspaceAlign * kWorkspaceAlign;
    ConvWorkspaces ws;
    ws.memory = workspace(
        packed_bytes +
        (staged && !conv2d_implicit_reads_input_rows<T>(x, c.batch, c.cout, c.g)
             ? conv2d_implicit_channels_last_bytes<T>(c.batch, c.g)
             : 0));
    ws.packed = ws.memory.get();
    if (staged) ws.channels_last = static_cast<char*>(ws.memory.get()) + packed_bytes;
    ws.engine = engine;
    return ws;
}
template <class T>
ConvWorkspaces conv_workspaces(const Tensor& w, const Conv& c, const T* x) {
    return conv_workspaces<T>(c, true, tensor_core_engine(w, "this convolution"), x);
}

// The weights packed now for a kernel that reads them packed and packs nothing itself
// (conv_gn_pool's version 2), in a workspace of this call.
template <class T>
ConvWorkspaces packed_weights(const Tensor& w, const Conv& c, TensorCorePath engine) {
    ConvWorkspaces ws = conv_workspaces<T>(c, false, engine, nullptr);
    const cudaError_t err = conv2d_implicit_pack(
        data<T>(w), c.cout, c.g, engine, false, ws.packed,
        c10::cuda::getCurrentCUDAStream(w.device().index()).stream());
    TORCH_CHECK(err == cudaSuccess, "scratchops: weight packing failed: ", cudaGetErrorString(err));
    return ws;
}

// algorithm 0: im2col + gemm in a bounded workspace; 1: implicit GEMM on the tensor cores.
Tensor conv2d_cuda(const Tensor& x, const Tensor& weight, const OptTensor& bias,
                   IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                   int64_t algorithm, int64_t workspace_bytes, int64_t gemm_version) {
    const Conv c = conv_setup(x, weight, bias, stride, padding, dilation);
    SCRATCHOPS_ARG(algorithm == 0 || algorithm == 1, "algorithm must be 0 or 1");
    SCRATCHOPS_ARG(workspace_bytes > 0, "workspace_bytes must be positive");
    check_choice(gemm_version, kGemmFirstTensorCoreVersion - 1, "gemm_version");  // CUDA cores
    return launch_into(x, c.shape, "conv2d", [&](auto e, auto* y, cudaStream_t s) {
        using T = typename decltype(e)::type;
        if (algorithm == 1) {
            const ConvWorkspaces w = conv_workspaces<T>(weight, c, data<T>(x));
            return conv2d_implicit_launch<T>(data<T>(x), w.packed, data<T>(bias), y, c.batch,
                                             c.cout, c.g,
                                             ConvTail<T>{ConvTail<T>::kNone, 0.0f, nullptr, 1.0f},
                                             c.tf32, w.engine, s, true, w.channels_last,
                                             data<T>(weight));
        }
        const long long elements =
            conv2d_im2col_workspace_elements<T>(c.batch, c.cout, c.g, workspace_bytes, c.tf32);
        const at::DataPtr cols = workspace(elements * static_cast<long long>(sizeof(T)));
        return conv2d_im2col_launch<T>(data<T>(x), data<T>(weight), data<T>(bias), y, c.batch,
                                       c.cout, c.g, i32(gemm_version), c.tf32,
                                       static_cast<T*>(cols.get()), elements, s);
    });
}

// P31 in one kernel: (min(conv2d(x) + conv_bias, constant) + bias) * factor; where halves is
// given, the min's gradient shares too, a byte an output in *halves (ConvTail::halves).
Tensor conv2d_min_add_mul_run(const Tensor& x, const Tensor& weight, const OptTensor& conv_bias,
                              IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                              double constant, const Tensor& bias, double factor,
                              Tensor* halves) {
    const Conv c = conv_setup(x, weight, conv_bias, stride, padding, dilation);
    check_per_channel(bias, x, "bias", c.cout, 4);
    const auto bytes = x.options().dtype(at::kByte);
    Tensor y = launch_into(x, c.shape, "conv2d_min_add_mul", [&](auto e, auto* y, cudaStream_t s) {
        using T = typename decltype(e)::type;
        ConvTail<T> tail{ConvTail<T>::kMinAddMul, f32(constant), data<T>(bias), f32(factor)};
        if (halves != nullptr) {  // (allocated once launch_into has checked the size)
            *halves = at::empty(c.shape, bytes);
            tail.halves = halves->data_ptr<uint8_t>();
        }
        const ConvWorkspaces w = conv_workspaces<T>(weight, c, data<T>(x));
        return conv2d_implicit_launch<T>(data<T>(x), w.packed, data<T>(conv_bias), y, c.batch,
                                         c.cout, c.g, tail, c.tf32, w.engine, s, true,
                                         w.channels_last, data<T>(weight));
    });
    if (halves != nullptr && !halves->defined()) *halves = at::empty(c.shape, bytes);  // empty y
    return y;
}
Tensor conv2d_min_add_mul_cuda(const Tensor& x, const Tensor& weight, const OptTensor& conv_bias,
                               IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                               double constant, const Tensor& bias, double factor) {
    return conv2d_min_add_mul_run(x, weight, conv_bias, stride, padding, dilation, constant, bias,
                                  factor, nullptr);
}
// The same when a gradient is wanted: (output, the min's gradient shares in halves).
std::tuple<Tensor, Tensor> conv2d_min_add_mul_keeping_cuda(
    const Tensor& x, const Tensor& weight, const OptTensor& conv_bias, IntArrayRef stride,
    IntArrayRef padding, IntArrayRef dilation, double constant, const Tensor& bias,
    double factor) {
    Tensor halves;
    Tensor y = conv2d_min_add_mul_run(x, weight, conv_bias, stride, padding, dilation, constant,
                                      bias, factor, &halves);
    return {y, halves};
}

// The group norm parameters' checks (F.group_norm's): groups divide the channels, eps >= 0.
void check_groups(int64_t groups, int64_t channels, double eps) {
    SCRATCHOPS_ARG(groups > 0 && channels % groups == 0, "num_groups must divide the channels");
    SCRATCHOPS_ARG(eps >= 0.0, "eps must be non-negative");
}

// P85 in one pass: clamp(max_pool2d(group_norm(conv2d(x)) * scale, 4), min, max); where
// extremes and stats are given, what its backward by recomputation needs too (each window's
// extreme of the convolution, each (sample, group)'s {mean, 1/std}: GnPoolArgs::kept_*).
Conv gn_pool_setup(const Tensor& x, const Tensor& weight, const OptTensor& conv_bias,
                   int64_t num_groups, const OptTensor& gn_weight, const OptTensor& gn_bias,
                   const OptTensor& scale, double eps) {
    const int64_t one[] = {1, 1}, zero[] = {0, 0};
    const Conv c = conv_setup(x, weight, conv_bias, one, zero, one);
    check_groups(num_groups, c.cout, eps);
    check_per_channel(gn_weight, x, "gn_weight", c.cout, 4, true);
    check_per_channel(gn_bias, x, "gn_bias", c.cout, 4, true);
    check_per_channel(scale, x, "scale", c.cout, 4);
    TORCH_CHECK_NOT_IMPLEMENTED(c.cout <= kOnePassMaxChannels, "scratchops: "
                                "conv2d_group_norm_pool_clamp covers fewer output channels");
    SCRATCHOPS_ARG(c.g.out_h >= kOnePassPool && c.g.out_w >= kOnePassPool,
                   "the convolution output is smaller than the pooling window");
    return c;
}
template <class T>
GnPoolArgs<T> gn_pool_args(const OptTensor& conv_bias, int64_t num_groups,
                           const OptTensor& gn_weight, const OptTensor& gn_bias,
                           const OptTensor& scale, double eps, double min, double max) {
    return {data<T>(conv_bias), data<T>(gn_weight), data<T>(gn_bias), data<T>(scale),
            i32(num_groups),    f32(eps),           f32(min),         f32(max)};
}
Tensor conv2d_group_norm_pool_clamp_run(const Tensor& x, const Tensor& weight,
                                        const OptTensor& conv_bias, int64_t num_groups,
                                        const OptTensor& gn_weight, const OptTensor& gn_bias,
                                        const OptTensor& scale, double eps, double min,
                                        double max, int64_t version, Tensor* extremes,
                                        Tensor* stats) {
    const Conv c = gn_pool_setup(x, weight, conv_bias, num_groups, gn_weight, gn_bias, scale, eps);
    check_choice(version, kConvGnPoolVersions, "version");
    const std::vector<int64_t> pooled{x.size(0), c.cout, c.g.out_h / kOnePassPool,
                                      c.g.out_w / kOnePassPool};
    if (extremes != nullptr) {  // (float whatever x's dtype: the kernels keep them so)
        const auto floats = x.options().dtype(at::kFloat);
        *extremes = at::empty(pooled, floats);
        *stats = at::empty({x.size(0), num_groups, 2}, floats);
    }
    return launch_into(x, pooled, "conv2d_group_norm_pool_clamp",
                       [&](auto e, auto* y, cudaStream_t s) {
        using T = typename decltype(e)::type;
        GnPoolArgs<T> a = gn_pool_args<T>(conv_bias, num_groups, gn_weight, gn_bias, scale, eps,
                                          min, max);
        if (extremes != nullptr) {
            a.kept_extremes = extremes->data_ptr<float>();
            a.kept_stats = stats->data_ptr<float>();
        }
        // Version 1 (the CUDA cores) and version 3's own kernel (the tensor cores, which the
        // device must have) read the weight tensor as it is; otherwise the weights are packed.
        ConvWorkspaces w;
        if (version != kConvGnPoolCudaCoreVersion) {
            w.engine = tensor_core_engine(weight, "this convolution");
            if (conv_gn_pool_reads_packed<T>(i32(version), c.g, c.cout, c.tf32, w.engine))
                w = packed_weights<T>(weight, c, w.engine);
        }
        const at::DataPtr ws =
            workspace(conv_gn_pool_workspace_bytes(c.batch, c.cout, c.g, a.groups,
                                                   extremes != nullptr));
        return conv_gn_pool_launch<T>(i32(version), data<T>(x), data<T>(weight), w.packed,
                                      a, y, c.batch, c.cout, c.g, c.tf32, w.engine, ws.get(), s);
    });
}
Tensor conv2d_group_norm_pool_clamp_cuda(const Tensor& x, const Tensor& weight,
                                         const OptTensor& conv_bias, int64_t num_groups,
                                         const OptTensor& gn_weight, const OptTensor& gn_bias,
                                         const OptTensor& scale, double eps, double min,
                                         double max, int64_t version) {
    return conv2d_group_norm_pool_clamp_run(x, weight, conv_bias, num_groups, gn_weight, gn_bias,
                                            scale, eps, min, max, version, nullptr, nullptr);
}
// The same when a gradient is wanted: (output, the windows' extremes, the groups' statistics).
std::tuple<Tensor, Tensor, Tensor> conv2d_group_norm_pool_clamp_keeping_cuda(
    const Tensor& x, const Tensor& weight, const OptTensor& conv_bias, int64_t num_groups,
    const OptTensor& gn_weight, const OptTensor& gn_bias, const OptTensor& scale, double eps,
    double min, double max, int64_t version) {
    Tensor extremes, stats;
    Tensor y = conv2d_group_norm_pool_clamp_run(x, weight, conv_bias, num_groups, gn_weight,
                                                gn_bias, scale, eps, min, max, version,
                                                &extremes, &stats);
    return {y, extremes, stats};
}

// ---------------------------------------------------- per-channel ops on (N, C, *) tensors
struct Planes {
    int batch, channels, size;  // size: the elements of one (n, c) plane
};
Planes planes(const Tensor& x) {
    check_tensor(x, "input", 2, 8);
    const int64_t nc = x.size(0) * x.size(1);
    return {i32(x.size(0)), i32(x.size(1)), i32(nc ? x.numel() / nc : 0)};
}

Tensor group_norm_cuda(const Tensor& x, int64_t num_groups, const OptTensor& weight,
                       const OptTensor& bias, const OptTensor& scale, double eps,
                       int64_t version) {
    const Planes p = planes(x);
    // Channel c of sample n reads the statistics of group n * groups + c / (C / groups).
    check_groups(num_groups, p.channels, eps);
    check_per_channel(weight, x, "weight", p.channels, x.dim(), true);
    check_per_channel(bias, x, "bias", p.channels, x.dim(), true);
    check_per_channel(scale, x, "scale", p.channels, x.dim());
    check_choice(version, kGroupNormVersions, "version");
    return launch_into(x, x.sizes(), "group_norm", [&](auto e, auto* y, cudaStream_t stream) {
        using T = typename decltype(e)::type;
        const at::DataPtr stats =  // mean, 1/std (float whatever T)
            workspace(2 * p.batch * num_groups * static_cast<long long>(sizeof(float)));
        return group_norm_launch<T>(i32(version), data<T>(x), y, data<T>(weight), data<T>(bias),
                                    data<T>(scale), static_cast<float*>(stats.get()), p.batch,
                                    p.channels, p.size, i32(num_groups), f32(eps), stream);
    });
}

Tensor scale_cuda(const Tensor& x, const Tensor& scale) {
    const Planes p = planes(x);
    check_per_channel(scale, x, "scale", p.channels, x.dim());
    return launch_into(x, x.sizes(), "scale", [&](auto e, auto* y, cudaStream_t stream) {
        using T = typename decltype(e)::type;
        return scale_launch<T>(data<T>(x), data<T>(scale), y, p.batch, p.channels, p.size,
                               stream);
    });
}

Tensor min_add_mul_cuda(const Tensor& x, double constant, const Tensor& bias, double factor) {
    const Planes p = planes(x);
    check_per_channel(bias, x, "bias", p.channels, x.dim());
    return launch_into(x, x.sizes(), "min_add_mul", [&](auto e, auto* y, cudaStream_t stream) {
        using T = typename decltype(e)::type;
        return min_add_mul_launch<T>(data<T>(x), f32(constant), data<T>(bias), f32(factor), y,
                                     p.batch, p.channels, p.size, stream);
    });
}

// --------------------------------------------------------------------- pooling and clamp
// The pooling window over 4-D x (dilation 1), padding at most half the kernel (torch's rule).
PoolGeometry pool_window(const Tensor& x, IntArrayRef kernel_size, IntArrayRef stride,
                         IntArrayRef padding) {
    check_tensor(x, "input", 4, 4, nullptr, kAllButBatch);  // F.max_pool2d: only a 0 batch
    const int64_t one[] = {1, 1};
    const Conv2dGeometry w = window(x, kernel_size, stride, padding, one);
    SCRATCHOPS_ARG(2 * w.pad_h <= w.kernel_h && 2 * w.pad_w <= w.kernel_w,
                   "max_pool2d padding must be at most half the kernel size");
    return {w.height, w.width, w.kernel_h, w.kernel_w, w.stride_h,
            w.stride_w, w.pad_h, w.pad_w, w.out_h, w.out_w};
}

Tensor max_pool2d_clamp_cuda(const Tensor& x, IntArrayRef kernel_size, IntArrayRef stride,
                             IntArrayRef padding, double min, double max, int64_t version) {
    const PoolGeometry g = pool_window(x, kernel_size, stride, padding);
    check_choice(version, kMaxPool2dVersions, "version");
    return launch_into(x, {x.size(0), x.size(1), g.out_h, g.out_w}, "max_pool2d_clamp",
                       [&](auto e, auto* y, cudaStream_t s) {
        using T = typename decltype(e)::type;
        return max_pool2d_clamp_launch<T>(i32(version), data<T>(x), y,
                                          i32(x.size(0) * x.size(1)), g, f32(min), f32(max), s);
    });
}

Tensor clamp_cuda(const Tensor& x, double min, double max) {
    check_tensor(x, "input", 0, 64);
    return launch_into(x, x.sizes(), "clamp", [&](auto e, auto* y, cudaStream_t s) {
        using T = typename decltype(e)::type;
        return clamp_launch<T>(data<T>(x), y, i32(x.numel()), f32(min), f32(max), s);
    });
}

// ------------------------------------------------------------------------------ backward
// The private operators scratchops::_<name> that the public operators' backward formulas
// (scratchops/_backward.py) are made of. Only those formulas call them, with tensors the
// forward checked; the checks here keep every kernel inside its buffers all the same.

// grad must have exactly `shape` (and x's device and dtype).
void check_grad(const Tensor& grad, const Tensor& x, IntArrayRef shape) {
    check_tensor(grad, "grad", 0, 64, &x);
    SCRATCHOPS_ARG(grad.sizes() == shape, "grad must have the forward output's shape");
}

// The gradient of im2col: cols (N, C*kh*kw, L) back to (N, C, H, W), (H, W) = input_size.
Tensor col2im_cuda(const Tensor& cols, IntArrayRef input_size, IntArrayRef kernel_size,
                   IntArrayRef dilation, IntArrayRef padding, IntArrayRef stride) {
    check_tensor(cols, "grad", 3, 3);
    SCRATCHOPS_ARG(input_size.size() == 2 && kernel_size.size() == 2 && kernel_size[0] >= 1 &&
                       kernel_size[1] >= 1 && cols.size(1) % (kernel_size[0] * kernel_size[1]) == 0,
                   "col2im sizes do not match the columns");
    const int64_t channels = cols.size(1) / (kernel_size[0] * kernel_size[1]);
    const Conv2dGeometry g =
        window_of(channels, input_size[0], input_size[1], kernel_size, stride, padding, dilation);
    SCRATCHOPS_ARG(cols.size(2) == int64_t{g.out_h} * g.out_w, "col2im sizes do not match the columns");
    return launch_into(cols, {cols.size(0), channels, input_size[0], input_size[1]}, "col2im",
                       [&](auto e, auto* dx, cudaStream_t s) {
        using T = typename decltype(e)::type;
        return col2im_launch<T>(data<T>(cols), dx, i32(cols.size(0)), g, s);
    });
}

// What both convolution gradients share: the geometry, grad's shape checked against it, and
// one image's columns 32-bit addressable.
Conv2dGeometry conv_grad_window(const Tensor& grad, int64_t batch, int64_t channels,
                                int64_t height, int64_t width, int64_t out_channels,
                                IntArrayRef kernel, IntArrayRef stride, IntArrayRef padding,
                                IntArrayRef dilation) {
    const Conv2dGeometry g = window_of(channels, height, width, kernel, stride, padding, dilation);
    SCRATCHOPS_ARG(grad.dim() == 4 && grad.size(0) == batch && grad.size(1) == out_channels &&
                       grad.size(2) == g.out_h && grad.size(3) == g.out_w,
                   "grad must have the convolution output's shape");
    SCRATCHOPS_ARG(channels * kernel[0] * kernel[1] * g.out_h * g.out_w <= kMaxElements,
                   "the convolution's backward needs one image's column matrix (C*kh*kw x "
                   "out_h*out_w) below 2^31 elements (32-bit indexing)");
    return g;
}

// The convolution gradients' gemm_version: a CUDA-core one (1-4, the im2col chain), or
// kGemmTensorCoreVersion for the tensor cores (conv_backward.cu's v2), whose engine this
// returns (refusing a GPU without one); the CUDA-core versions ignore it.
TensorCorePath conv_grad_engine(const Tensor& t, int64_t gemm_version) {
    SCRATCHOPS_ARG(gemm_version >= 1 && (gemm_version < kGemmFirstTensorCoreVersion ||
                                         gemm_version == kGemmTensorCoreVersion),
                   "gemm_version is not one of the operator's versions (a CUDA-core GEMM "
                   "version, or the tensor-core one)");
    return gemm_version == kGemmTensorCoreVersion
               ? tensor_core_engine(t, "conv2d's backward on the tensor cores")
               : TensorCorePath::kWgmma;
}

// Whether a convolution gradient computes in TF32: float on the tensor cores, where torch's
// switch allows TF32 for convolutions and conv2d_grad_uses_tf32 holds (the forward's rule on
// the gradient's own reduction), read at each call as torch's backward reads it.
bool conv_grad_tf32(const Tensor& grad, int64_t gemm_version, bool weight, int64_t batch,
                    int64_t out_channels, const Conv2dGeometry& g) {
    return grad.scalar_type() == at::kFloat && gemm_version == kGemmTensorCoreVersion &&
           conv_tf32_allowed() && conv2d_grad_uses_tf32(weight, i32(batch), i32(out_channels), g);
}

// dx of conv2d (input_size = (N, C, H, W)) through Wᵀ @ dy and col2im, or on the tensor cores
// as a convolution of dy, in a workspace of at most workspace_bytes (at least one image's
// chunk).
Tensor conv2d_input_grad_cuda(const Tensor& grad, const Tensor& weight, IntArrayRef input_size,
                              IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                              int64_t workspace_bytes, int64_t gemm_version) {
    check_tensor(weight, "weight", 4, 4, nullptr, kAll);
    check_tensor(grad, "grad", 4, 4, &weight);
    SCRATCHOPS_ARG(input_size.size() == 4 && input_size[1] == weight.size(1),
                   "input_size must be (N, C, H, W) with the weight's C");
    const Conv2dGeometry g =
        conv_grad_window(grad, input_size[0], input_size[1], input_size[2], input_size[3],
                         weight.size(0), weight.sizes().slice(2), stride, padding, dilation);
    const TensorCorePath engine = conv_grad_engine(weight, gemm_version);
    const bool tf32 = conv_grad_tf32(grad, gemm_version, false, input_size[0], weight.size(0), g);
    return launch_into(weight, input_size, "conv2d input gradient",
                       [&](auto e, auto* dx, cudaStream_t s) {
        using T = typename decltype(e)::type;
        const long long elements = conv2d_grad_workspace_elements<T>(
            false, i32(input_size[0]), i32(weight.size(0)), g, i32(gemm_version), engine, tf32,
            workspace_bytes);
        const at::DataPtr ws = workspace(elements * static_cast<long long>(sizeof(T)));
        return conv2d_input_grad_launch<T>(data<T>(grad), data<T>(weight), dx,
                                           i32(input_size[0]), i32(weight.size(0)), g,
                                           i32(gemm_version), engine, tf32,
                                           static_cast<T*>(ws.get()), elements, s);
    });
}

// dW of conv2d (weight_size = (Cout, C, kh, kw)) as the sum over images of dy @ im2col(x)ᵀ.
Tensor conv2d_weight_grad_cuda(const Tensor& grad, const Tensor& x, IntArrayRef weight_size,
                               IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                               int64_t workspace_bytes, int64_t gemm_version) {
    check_tensor(x, "input", 4, 4, nullptr, kAllButBatch);
    check_tensor(grad, "grad", 4, 4, &x);
    SCRATCHOPS_ARG(weight_size.size() == 4 && weight_size[1] == x.size(1) &&
                       weight_size[0] >= 1 && weight_size[0] <= kMaxElements,
                   "weight_size must be (Cout, C, kh, kw) with the input's C");
    const Conv2dGeometry g =
        conv_grad_window(grad, x.size(0), x.size(1), x.size(2), x.size(3), weight_size[0],
                         weight_size.slice(2), stride, padding, dilation);
    const TensorCorePath engine = conv_grad_engine(x, gemm_version);
    const bool tf32 = conv_grad_tf32(grad, gemm_version, true, x.size(0), weight_size[0], g);
    return launch_into(x, weight_size, "conv2d weight gradient",
                       [&](auto e, auto* dw, cudaStream_t s) {
        using T = typename decltype(e)::type;
        if (x.size(0) == 0)  // an empty batch: dW = 0, the sum over no images
            return batch_sum_launch<T, T>(nullptr, nullptr, dw, 0,
                                          i32(c10::multiply_integers(weight_size)), s);
        const long long elements = conv2d_grad_workspace_elements<T>(
            true, i32(x.size(0)), i32(weight_size[0]), g, i32(gemm_version), engine, tf32,
            workspace_bytes);
        const at::DataPtr ws = workspace(elements * static_cast<long long>(sizeof(T)));
        return conv2d_weight_grad_launch<T>(data<T>(grad), data<T>(x), dw, i32(x.size(0)),
                                            i32(weight_size[0]), g, i32(gemm_version), engine,
                                            tf32, static_cast<T*>(ws.get()), elements, s);
    });
}

// The checks and the window of a form that computes dx and dW at once (the operators apart
// check their own arguments, each as it needs).
Conv2dGeometry grads_at_once_window(const Tensor& grad, const Tensor& x, const Tensor& weight,
                                    IntArrayRef stride, IntArrayRef padding,
                                    IntArrayRef dilation) {
    check_tensor(weight, "weight", 4, 4, nullptr, kAll);
    check_tensor(x, "input", 4, 4, &weight, kAllButBatch);
    check_tensor(grad, "grad", 4, 4, &x);
    SCRATCHOPS_ARG(x.size(1) == weight.size(1), "input and weight must have the same C");
    return conv_grad_window(grad, x.size(0), x.size(1), x.size(2), x.size(3), weight.size(0),
                            weight.sizes().slice(2), stride, padding, dilation);
}

// Whether conv2d's two gradients share dy's channels-last copy (conv2d_grads_shared_bytes):
// the workspace bytes that takes, 0 where the two operators run apart. Checks the arguments
// where it can say yes.
struct SharedGrads {
    Conv2dGeometry g;
    TensorCorePath engine;
    long long bytes = 0;
};
SharedGrads shared_grads(const Tensor& grad, const Tensor& x, const Tensor& weight,
                         IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                         int64_t workspace_bytes, int64_t gemm_version) {
    if (x.scalar_type() == at::kFloat || gemm_version != kGemmTensorCoreVersion ||
        x.dim() != 4 || weight.dim() != 4 || x.size(0) == 0)
        return {};  // (the operators apart check every argument and give their errors)
    SharedGrads s;
    s.g = grads_at_once_window(grad, x, weight, stride, padding, dilation);
    s.engine = conv_grad_engine(x, gemm_version);
    s.bytes = with_element_type(x, [&](auto e) {
        using T = typename decltype(e)::type;
        return conv2d_grads_shared_bytes<T>(i32(x.size(0)), i32(weight.size(0)), s.g,
                                            i32(gemm_version), s.engine, workspace_bytes);
    });
    return s;
}

// (dx, dW) of conv2d at once: dy's channels-last copy made once for both where the two staged
// versions take the whole batch within the budget (conv2d_grads_shared_bytes), else the two
// operators above one after the other; the same bits either way.
std::tuple<Tensor, Tensor> conv2d_grads_cuda(const Tensor& grad, const Tensor& x,
                                             const Tensor& weight, IntArrayRef stride,
                                             IntArrayRef padding, IntArrayRef dilation,
                                             int64_t workspace_bytes, int64_t gemm_version) {
    const SharedGrads shared =
        shared_grads(grad, x, weight, stride, padding, dilation, workspace_bytes, gemm_version);
    if (shared.bytes == 0)
        return {conv2d_input_grad_cuda(grad, weight, x.sizes(), stride, padding, dilation,
                                       workspace_bytes, gemm_version),
                conv2d_weight_grad_cuda(grad, x, weight.sizes(), stride, padding, dilation,
                                        workspace_bytes, gemm_version)};
    c10::cuda::CUDAGuard guard(x.device());
    Tensor dx = new_output(x, x.sizes()), dw = new_output(x, weight.sizes());
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
    const cudaError_t err = with_element_type(x, [&](auto e) {
        using T = typename decltype(e)::type;
        const at::DataPtr ws = workspace(shared.bytes);
        return conv2d_grads_shared_launch<T>(data<T>(grad), data<T>(x), data<T>(weight),
                                             static_cast<T*>(dx.data_ptr()),
                                             static_cast<T*>(dw.data_ptr()), i32(x.size(0)),
                                             i32(weight.size(0)), shared.g, shared.engine,
                                             workspace_bytes, ws.get(), stream);
    });
    TORCH_CHECK(err == cudaSuccess, "scratchops: conv2d gradients failed: ",
                cudaGetErrorString(err));
    return {dx, dw};
}

// out[c] = factor * sum of x (times other, when given) over every dimension but dim 1.
Tensor channel_sums_cuda(const Tensor& x, const OptTensor& other, double factor) {
    const Planes p = planes(x);
    if (other.has_value()) check_grad(*other, x, x.sizes());
    return launch_into(x, {x.size(1)}, "channel sums", [&](auto e, auto* out, cudaStream_t s) {
        using T = typename decltype(e)::type;
        const at::DataPtr partials =
            workspace(channel_sums_workspace_bytes(p.batch, p.channels));
        return channel_sums_launch<T>(data<T>(x), data<T>(other), f32(factor), out, p.batch,
                                      p.channels, p.size, static_cast<float*>(partials.get()), s);
    });
}

// x[b]ᵀ for each matrix of a 2-D or 3-D tensor.
Tensor transpose_cuda(const Tensor& x) {
    check_tensor(x, "input", 2, 3);
    const int64_t rows = x.size(-2), cols = x.size(-1), batch = x.dim() == 3 ? x.size(0) : 1;
    std::vector<int64_t> shape{cols, rows};
    if (x.dim() == 3) shape.insert(shape.begin(), batch);
    return launch_into(x, shape, "transpose", [&](auto e, auto* y, cudaStream_t s) {
        using T = typename decltype(e)::type;
        return transpose_launch<T, T>(data<T>(x), y, i32(batch), i32(rows), i32(cols), s);
    });
}

// The sum over dim 0, in order.
Tensor batch_sum_cuda(const Tensor& x) {
    check_tensor(x, "input", 2, 8);
    const int64_t n = x.size(0) ? x.numel() / x.size(0) : 0;
    return launch_into(x, x.sizes().slice(1), "batch sum", [&](auto e, auto* y, cudaStream_t s) {
        using T = typename decltype(e)::type;
        return batch_sum_launch<T, T>(data<T>(x), nullptr, y, i32(x.size(0)), i32(n), s);
    });
}

// dx and the parameters' gradients of group_norm(x) * scale: (dx, dweight, dbias, dscale),
// each parameter's empty (0 elements) when the parameter is absent.
std::tuple<Tensor, Tensor, Tensor, Tensor> group_norm_backward_cuda(
    const Tensor& grad, const Tensor& x, int64_t num_groups, const OptTensor& weight,
    const OptTensor& bias, const OptTensor& scale, double eps) {
    const Planes p = planes(x);
    check_grad(grad, x, x.sizes());
    check_groups(num_groups, p.channels, eps);
    check_per_channel(weight, x, "weight", p.channels, x.dim(), true);
    check_per_channel(bias, x, "bias", p.channels, x.dim(), true);
    check_per_channel(scale, x, "scale", p.channels, x.dim());
    c10::cuda::CUDAGuard guard(x.device());
    const auto param_grad = [&](const OptTensor& param) {
        static constexpr int64_t kNoElements[] = {0};
        return new_output(x, param.has_value() ? param->sizes() : IntArrayRef(kNoElements));
    };
    Tensor dx = new_output(x, x.sizes());
    Tensor dweight = param_grad(weight), dbias = param_grad(bias), dscale = param_grad(scale);
    if (p.channels == 0) return {dx, dweight, dbias, dscale};
    // (Not launch_into: an empty batch still has parameter gradients, of 0, to write.)
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
    const cudaError_t err = with_element_type(x, [&](auto e) {
        using T = typename decltype(e)::type;
        const at::DataPtr ws =
            workspace(group_norm_backward_workspace_bytes(p.batch, p.channels, i32(num_groups)));
        const auto out = [](Tensor& t) {
            return t.numel() ? static_cast<T*>(t.data_ptr()) : nullptr;
        };
        return group_norm_backward_launch<T>(data<T>(grad), data<T>(x), data<T>(weight),
                                             data<T>(bias), data<T>(scale), out(dx), out(dweight),
                                             out(dbias), out(dscale), ws.get(), p.batch,
                                             p.channels, p.size, i32(num_groups), f32(eps),
                                             stream);
    });
    TORCH_CHECK(err == cudaSuccess, "scratchops: group_norm backward failed: ",
                cudaGetErrorString(err));
    return {dx, dweight, dbias, dscale};
}

Tensor max_pool2d_clamp_backward_cuda(const Tensor& grad, const Tensor& x, IntArrayRef kernel_size,
                                      IntArrayRef stride, IntArrayRef padding, double min,
                                      double max) {
    const PoolGeometry g = pool_window(x, kernel_size, stride, padding);
    check_grad(grad, x, {x.size(0), x.size(1), g.out_h, g.out_w});
    const int planes = i32(x.size(0) * x.size(1));
    return launch_into(x, x.sizes(), "max_pool2d backward", [&](auto e, auto* dx, cudaStream_t s) {
        using T = typename decltype(e)::type;
        const at::DataPtr ws = workspace(max_pool2d_clamp_backward_workspace_bytes(planes, g));
        return max_pool2d_clamp_backward_launch<T>(data<T>(grad), data<T>(x), dx, planes, g,
                                                   f32(min), f32(max), ws.get(), s);
    });
}

Tensor clamp_backward_cuda(const Tensor& grad, const Tensor& x, double min, double max) {
    check_tensor(x, "input", 0, 64);
    check_grad(grad, x, x.sizes());
    return launch_into(x, x.sizes(), "clamp backward", [&](auto e, auto* dx, cudaStream_t s) {
        using T = typename decltype(e)::type;
        return clamp_backward_launch<T>(data<T>(grad), data<T>(x), dx, i32(x.numel()), f32(min),
                                        f32(max), s);
    });
}

Tensor min_add_mul_backward_cuda(const Tensor& grad, const Tensor& x, double constant,
                                 double factor) {
    check_tensor(x, "input", 0, 64);
    check_grad(grad, x, x.sizes());
    return launch_into(x, x.sizes(), "min_add_mul backward", [&](auto e, auto* dx, cudaStream_t s) {
        using T = typename decltype(e)::type;
        return min_add_mul_backward_launch<T>(data<T>(grad), data<T>(x), dx, i32(x.numel()),
                                              f32(constant), f32(factor), s);
    });
}

// From the shares conv2d_min_add_mul_keeping kept: (dx = dy * factor * halves / 2, the conv
// bias's gradient dx summed over each channel, the bias's factor * dy summed likewise).
void check_halves(const Tensor& halves, const Tensor& grad) {
    SCRATCHOPS_ARG(halves.is_cuda() && halves.device() == grad.device() &&
                       halves.scalar_type() == at::kByte && halves.is_contiguous() &&
                       halves.sizes() == grad.sizes(),
                   "halves must be the forward's contiguous uint8 shares, grad's shape and device");
}
std::tuple<Tensor, Tensor, Tensor> min_add_mul_backward_kept_cuda(const Tensor& grad,
                                                                  const Tensor& halves,
                                                                  double factor) {
    const Planes p = planes(grad);
    check_halves(halves, grad);
    // (Launched as the bias gradient's operator: an empty batch still writes its zero sums.)
    Tensor dx = new_output(grad, grad.sizes()), conv_bias_grad = new_output(grad, {p.channels});
    Tensor bias_grad = launch_into(grad, {p.channels}, "min_add_mul backward",
                                   [&](auto e, auto* bias_grad, cudaStream_t s) {
        using T = typename decltype(e)::type;
        const at::DataPtr partials =
            workspace(2 * channel_sums_workspace_bytes(p.batch, p.channels));
        return min_add_mul_backward_kept_launch<T>(
            data<T>(grad), halves.data_ptr<uint8_t>(), static_cast<T*>(dx.data_ptr()), bias_grad,
            static_cast<T*>(conv_bias_grad.data_ptr()), p.batch, p.channels, p.size, f32(factor),
            static_cast<float*>(partials.get()), s);
    });
    return {dx, conv_bias_grad, bias_grad};
}

// float's form of the four at once (min_add_mul_conv_grads_launch, launchers_backward.h): the
// min's rule applied inside both gradients' passes over dy, where both gradients are
// fp32-accurate (torch's switch, or the reductions' sizes, leave TF32 out) on the wgmma
// engine and the input gradient v4 applies; nullopt elsewhere (the caller's forms then run).
using FourGrads = std::tuple<Tensor, Tensor, Tensor, Tensor>;
std::optional<FourGrads> min_add_mul_conv_grads_float(
    const Tensor& grad, const Tensor& halves, const Tensor& x, const Tensor& weight,
    double factor, IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
    int64_t workspace_bytes, int64_t gemm_version) {
    if (x.scalar_type() != at::kFloat || gemm_version != kGemmTensorCoreVersion ||
        x.dim() != 4 || weight.dim() != 4 || x.size(0) == 0)
        return std::nullopt;  // (the forms apart check every argument and give their errors)
    const int batch = i32(x.size(0)), out_channels = i32(weight.size(0));
    const Conv2dGeometry g = grads_at_once_window(grad, x, weight, stride, padding, dilation);
    const TensorCorePath engine = conv_grad_engine(x, gemm_version);
    const bool tf32 = conv_grad_tf32(grad, gemm_version, false, batch, out_channels, g) ||
                      conv_grad_tf32(grad, gemm_version, true, batch, out_channels, g);
    const long long bytes =
        min_add_mul_conv_grads_bytes(batch, out_channels, g, engine, tf32, workspace_bytes);
    if (bytes == 0) return std::nullopt;
    check_halves(halves, grad);
    c10::cuda::CUDAGuard guard(x.device());
    Tensor dx = new_output(x, x.sizes()), dw = new_output(x, weight.sizes());
    Tensor conv_bias_grad = new_output(x, {out_channels});
    Tensor bias_grad = new_output(x, {out_channels});
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
    const at::DataPtr ws = workspace(bytes);
    const cudaError_t err = min_add_mul_conv_grads_launch(
        data<float>(grad), halves.data_ptr<uint8_t>(), data<float>(x), data<float>(weight),
        f32(factor), static_cast<float*>(dx.data_ptr()), static_cast<float*>(dw.data_ptr()),
        static_cast<float*>(bias_grad.data_ptr()), static_cast<float*>(conv_bias_grad.data_ptr()),
        batch, out_channels, g, engine, workspace_bytes, ws.get(), stream);
    TORCH_CHECK(err == cudaSuccess, "scratchops: conv2d_min_add_mul gradients failed: ",
                cudaGetErrorString(err));
    return FourGrads{dx, dw, conv_bias_grad, bias_grad};
}

// P31's four gradients from the kept shares, for a backward that wants both dx and dW: (dx,
// dW, the conv bias's gradient, the bias's). Where conv2d's gradients share dy's
// channels-last copy (shared_grads), the min's rule writes its gradient channels-last into the
// place of that copy (min_add_mul_backward v4), so that no pass makes it; elsewhere the two
// operators one after the other. dx and dW have the same bits either way; the two sums, added
// in v4's order, may differ from channel_sums' in the last bit.
std::tuple<Tensor, Tensor, Tensor, Tensor> conv2d_min_add_mul_grads_kept_cuda(
    const Tensor& grad, const Tensor& halves, const Tensor& x, const Tensor& weight,
    double factor, IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
    int64_t workspace_bytes, int64_t gemm_version) {
    if (auto fused = min_add_mul_conv_grads_float(grad, halves, x, weight, factor, stride,
                                                  padding, dilation, workspace_bytes,
                                                  gemm_version))
        return *fused;
    const SharedGrads shared =
        shared_grads(grad, x, weight, stride, padding, dilation, workspace_bytes, gemm_version);
    if (shared.bytes == 0) {
        auto [conv_grad, conv_bias_grad, bias_grad] =
            min_add_mul_backward_kept_cuda(grad, halves, factor);
        auto [dx, dw] = conv2d_grads_cuda(conv_grad, x, weight, stride, padding, dilation,
                                          workspace_bytes, gemm_version);
        return {dx, dw, conv_bias_grad, bias_grad};
    }
    check_halves(halves, grad);
    c10::cuda::CUDAGuard guard(x.device());
    const int batch = i32(x.size(0)), out_channels = i32(weight.size(0));
    const int pixels = shared.g.out_h * shared.g.out_w;
    Tensor dx = new_output(x, x.sizes()), dw = new_output(x, weight.sizes());
    Tensor conv_bias_grad = new_output(x, {out_channels});
    Tensor bias_grad = new_output(x, {out_channels});
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
    const cudaError_t err = with_element_type(x, [&](auto e) {
        using T = typename decltype(e)::type;
        const at::DataPtr ws = workspace(shared.bytes);
        const at::DataPtr partials = workspace(
            min_add_mul_backward_kept_channels_last_workspace_bytes(batch, out_channels, pixels));
        auto* dy_copy = reinterpret_cast<T*>(
            static_cast<uint8_t*>(ws.get()) +
            conv2d_grads_shared_dy_offset<T>(out_channels, shared.g));
        cudaError_t status = min_add_mul_backward_kept_channels_last_launch<T>(
            data<T>(grad), halves.data_ptr<uint8_t>(), dy_copy,
            static_cast<T*>(bias_grad.data_ptr()), static_cast<T*>(conv_bias_grad.data_ptr()),
            batch, out_channels, pixels, f32(factor), static_cast<float*>(partials.get()),
            stream);
        if (status != cudaSuccess) return status;
        return conv2d_grads_shared_launch<T>(nullptr, data<T>(x), data<T>(weight),
                                             static_cast<T*>(dx.data_ptr()),
                                             static_cast<T*>(dw.data_ptr()), batch, out_channels,
                                             shared.g, shared.engine, workspace_bytes, ws.get(),
                                             stream, /*dy_copied=*/true);
    });
    TORCH_CHECK(err == cudaSuccess, "scratchops: conv2d_min_add_mul gradients failed: ",
                cudaGetErrorString(err));
    return {dx, dw, conv_bias_grad, bias_grad};
}

// P85's gradients from what conv2d_group_norm_pool_clamp_keeping kept, the convolution's
// output computed again tile by tile (conv_gn_pool_backward.cu): (dx, dweight, dconv_bias,
// and the group norm weight's, its bias's and the scale's gradients as rows of a (3, Cout)).
std::tuple<Tensor, Tensor, Tensor, Tensor> conv2d_group_norm_pool_clamp_backward_kept_cuda(
    const Tensor& grad, const Tensor& x, const Tensor& weight, const OptTensor& conv_bias,
    int64_t num_groups, const OptTensor& gn_weight, const OptTensor& gn_bias,
    const OptTensor& scale, const Tensor& extremes, const Tensor& stats, double min,
    double max) {
    const Conv c = gn_pool_setup(x, weight, conv_bias, num_groups, gn_weight, gn_bias, scale, 0.0);
    TORCH_CHECK_NOT_IMPLEMENTED(conv_gn_pool_backward_covers(c.cout, c.g, x.device().index()),
                                "scratchops: P85's fused backward covers at most 8 input "
                                "channels, 5 x 5 kernels and GPUs that lend a block the "
                                "shared memory it holds (up to 211 KiB: sm_90)");
    const std::vector<int64_t> pooled{x.size(0), c.cout, c.g.out_h / kOnePassPool,
                                      c.g.out_w / kOnePassPool};
    check_tensor(grad, "grad", 4, 4, &x);
    SCRATCHOPS_ARG(grad.sizes() == IntArrayRef(pooled), "grad must have the output's shape");
    const auto kept = [&](const Tensor& t, IntArrayRef shape, const char* name) {
        SCRATCHOPS_ARG(t.is_cuda() && t.device() == x.device() &&
                           t.scalar_type() == at::kFloat && t.is_contiguous() &&
                           t.sizes() == shape,
                       name, " must be what the forward kept: float32, contiguous, its shape");
    };
    kept(extremes, pooled, "extremes");
    kept(stats, {x.size(0), num_groups, 2}, "stats");
    Tensor dx = new_output(x, x.sizes()), dweight = new_output(x, weight.sizes());
    Tensor dconv_bias = new_output(x, {c.cout});
    Tensor dparams = launch_into(x, {3, c.cout}, "conv2d_group_norm_pool_clamp backward",
                                 [&](auto e, auto* dparams, cudaStream_t s) {
        using T = typename decltype(e)::type;
        const GnPoolArgs<T> a =
            gn_pool_args<T>(conv_bias, num_groups, gn_weight, gn_bias, scale, 0.0, min, max);
        const at::DataPtr ws = workspace(conv_gn_pool_backward_workspace_bytes(c.batch, c.cout, c.g));
        return conv_gn_pool_backward_launch<T>(
            data<T>(grad), data<T>(x), data<T>(weight), a, extremes.data_ptr<float>(),
            stats.data_ptr<float>(), static_cast<T*>(dx.data_ptr()),
            static_cast<T*>(dweight.data_ptr()), static_cast<T*>(dconv_bias.data_ptr()), dparams,
            c.batch, c.cout, c.g, ws.get(), s);
    });
    return {dx, dweight, dconv_bias, dparams};
}

// The private backward operators with their CUDA implementations (names without the leading
// underscore of scratchops::_<name>).
template <class Register>
void each_backward_operator(Register&& reg) {
    reg("_col2im", &col2im_cuda);
    reg("_conv2d_input_grad", &conv2d_input_grad_cuda);
    reg("_conv2d_weight_grad", &conv2d_weight_grad_cuda);
    reg("_conv2d_grads", &conv2d_grads_cuda);
    reg("_channel_sums", &channel_sums_cuda);
    reg("_transpose", &transpose_cuda);
    reg("_batch_sum", &batch_sum_cuda);
    reg("_group_norm_backward", &group_norm_backward_cuda);
    reg("_max_pool2d_clamp_backward", &max_pool2d_clamp_backward_cuda);
    reg("_clamp_backward", &clamp_backward_cuda);
    reg("_min_add_mul_backward", &min_add_mul_backward_cuda);
    reg("_min_add_mul_backward_kept", &min_add_mul_backward_kept_cuda);
    reg("_conv2d_min_add_mul_grads_kept", &conv2d_min_add_mul_grads_kept_cuda);
    reg("_conv2d_group_norm_pool_clamp_backward_kept",
        &conv2d_group_norm_pool_clamp_backward_kept_cuda);
}

// The private forward operators that keep what their backward needs (scratchops/_library.py's
// KEEPING_SCHEMAS: called by the public functions when a gradient is wanted).
template <class Register>
void each_keeping_operator(Register&& reg) {
    reg("_conv2d_min_add_mul_keeping", &conv2d_min_add_mul_keeping_cuda);
    reg("_conv2d_group_norm_pool_clamp_keeping", &conv2d_group_norm_pool_clamp_keeping_cuda);
}

// Each operator with its CUDA implementation, for both registrations below.
template <class Register>
void each_operator(Register&& reg) {
    reg("im2col", &im2col_cuda);
    reg("gemm", &gemm_cuda);
    reg("conv2d", &conv2d_cuda);
    reg("conv2d_min_add_mul", &conv2d_min_add_mul_cuda);
    reg("conv2d_group_norm_pool_clamp", &conv2d_group_norm_pool_clamp_cuda);
    reg("group_norm", &group_norm_cuda);
    reg("scale", &scale_cuda);
    reg("min_add_mul", &min_add_mul_cuda);
    reg("max_pool2d_clamp", &max_pool2d_clamp_cuda);
    reg("clamp", &clamp_cuda);
}

// The implementations as the CUDA kernels of the public operators (defined in Python, with
// the argument names; the types are checked against the C++ signatures here). Called once,
// by scratchops/_library.py, after it has removed its placeholder kernels.
void register_public_kernels() {
    static const torch::Library* registered = [] {
        auto* library = new torch::Library(torch::Library::IMPL, "scratchops",
                                           c10::DispatchKey::CUDA, __FILE__, __LINE__);
        const auto impl = [&](const char* name, auto* implementation) {
            library->impl(name, implementation);
        };
        each_operator(impl);
        each_backward_operator(impl);
        each_keeping_operator(impl);
        return library;
    }();
    (void)registered;
}

}  // namespace

// --------------------------------------------------------------------------- direct calls
// A Python int or tuple / list of ints, read as the schemas' int[2] reads it: one int n stands
// for (n, n). Exact ints only (no bool or numpy integer): what this refuses, Python's checked
// path normalises or refuses with the validator's message.
struct IntList {
    std::vector<int64_t> values;
    operator IntArrayRef() const { return values; }
};

// Each argument type as the direct call takes it from Python: IntArrayRef as an IntList, the
// rest as themselves.
template <class T>
struct FromPython { using type = T; };
template <>
struct FromPython<IntArrayRef> { using type = IntList; };

// The Python function `name` of the module: its arguments converted, then the public operator
// scratchops::<name> called through the dispatcher below autograd (the caller has checked
// that no gradient is wanted), with the GIL released as torch's own operators release it.
template <class Result, class... Args>
void def_direct_call(pybind11::module_& module, const char* name, Result (*)(Args...)) {
    const auto op = c10::Dispatcher::singleton()
                        .findSchemaOrThrow((std::string("scratchops::") + name).c_str(), "")
                        .typed<Result(Args...)>();
    module.def(
        name,
        [op](typename FromPython<std::decay_t<Args>>::type... args) -> Result {
            at::AutoDispatchBelowAutograd below_autograd;
            return op.call(args...);
        },
        pybind11::call_guard<pybind11::gil_scoped_release>());
}

// The same implementations as scratchops_cuda::<name>, with schemas inferred from the C++
// signatures, for the placeholders to call before register_public_kernels has run.
TORCH_LIBRARY(scratchops_cuda, m) {
    const auto def = [&](const char* name, auto* implementation) {
        m.def(name, torch::dispatch(c10::DispatchKey::CUDA, implementation));
    };
    each_operator(def);
    each_backward_operator(def);
    each_keeping_operator(def);
    m.def("register_public_kernels", &register_public_kernels);
    m.def("set_tensor_core_path", &set_tensor_core_path);
    m.def("get_tensor_core_path", &get_tensor_core_path);
    m.def("tensor_core_engine", &tensor_core_engine_name);
}

}  // namespace scratchops

namespace pybind11::detail {
template <>
struct type_caster<scratchops::IntList> {
    PYBIND11_TYPE_CASTER(scratchops::IntList, const_name("int | tuple[int, ...]"));

    bool load(handle source, bool /*convert*/) {
        PyObject* object = source.ptr();
        if (PyLong_CheckExact(object)) {
            int64_t v = 0;
            if (!exact_int(object, v)) return false;
            value.values.assign(2, v);
            return true;
        }
        if (!PyTuple_CheckExact(object) && !PyList_CheckExact(object)) return false;
        const Py_ssize_t n = PySequence_Fast_GET_SIZE(object);
        PyObject** items = PySequence_Fast_ITEMS(object);
        value.values.resize(static_cast<size_t>(n));
        for (Py_ssize_t i = 0; i < n; ++i)
            if (!PyLong_CheckExact(items[i]) || !exact_int(items[i], value.values[i])) return false;
        return true;
    }

  private:
    static bool exact_int(PyObject* object, int64_t& v) {  // false past 64 bits
        int overflow = 0;
        v = PyLong_AsLongLongAndOverflow(object, &overflow);
        return overflow == 0 && !(v == -1 && PyErr_Occurred());
    }
};
}  // namespace pybind11::detail

namespace scratchops {
// Whether P85's fused backward runs a call with this weight shape on GPU `device`
// (conv_gn_pool_backward_covers: the shape, and the shared memory that GPU lends a block):
// the question scratchops/_backward.py asks before it runs the fused kernel.
bool conv_gn_pool_backward_runs(int64_t in_channels, int64_t out_channels, int64_t kernel_h,
                                int64_t kernel_w, int64_t device) {
    const int64_t one[] = {1, 1}, zero[] = {0, 0}, kernel[] = {kernel_h, kernel_w};
    const Conv2dGeometry g = window_of(in_channels, kernel_h + kOnePassPool - 1,
                                       kernel_w + kOnePassPool - 1, kernel, one, zero, one);
    return conv_gn_pool_backward_covers(i32(out_channels), g, static_cast<int>(device));
}
}  // namespace scratchops

// The module scratchops/_build.py loads: one direct call per public operator (the schemas,
// defined by scratchops/_library.py, exist before it loads), and the backward's question above
// (a plain function, outside the dispatcher, so that tracing may ask it too).
PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
    scratchops::each_operator([&](const char* name, auto* implementation) {
        scratchops::def_direct_call(module, name, implementation);
    });
    module.def("conv_gn_pool_backward_runs", &scratchops::conv_gn_pool_backward_runs);
}
