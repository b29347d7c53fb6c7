"""Every kernel once on small, awkward shapes, for compute-sanitizer (memcheck, racecheck).

Run it as scripts/gpu_check.sh does:
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck python3 scripts/sanitize_driver.py
Without torch's caching allocator every tensor is its own cudaMalloc, so an access past a
tensor's end is outside any allocation and memcheck sees it. Each result is also compared
with torch, so a clean sanitizer run is not mistaken for a correct one.
"""

import sys

import torch
import torch.nn.functional as F

import scratchops
from scratchops.problems import PROBLEMS, build_pair
from scratchops.tools.report import ATOL, HALF_TOL, RTOL
from scratchops.tools.timing import tf32_disabled

failures = []
CONV_GN_POOL_CUDA_CORES = scratchops.versions.CONV_GN_POOL_CUDA_CORE_VERSION


def check(name, out, ref, equal_nan=False, tol=None):
    """out against ref at scratchops' fp32 tolerance, or at `tol` (the half types')."""
    atol, rtol = (ATOL, RTOL) if tol is None else (tol, tol)
    try:
        torch.testing.assert_close(out, ref, atol=atol, rtol=rtol, equal_nan=equal_nan)
    except AssertionError as e:
        failures.append(f"{name}: {e}")


def r(*shape):
    return torch.rand(shape, device="cuda") * 2 - 1


def one_element_in(x):
    """x's values one element into a new storage: off 16 bytes, as no allocation is."""
    return torch.empty(x.numel() + 1, device=x.device, dtype=x.dtype)[1:].view(x.shape).copy_(x)


def check_gemm(label, version):
    """gemm `version` on awkward shapes, a bias, and a batch."""
    for m, n, k in [(1, 1, 1), (33, 65, 17), (130, 129, 9), (64, 200, 72)]:
        a, b, bias = r(m, k), r(k, n), r(m)
        check(f"{label} {m}x{n}x{k}", scratchops.gemm(a, b, bias, version=version),
              a @ b + bias[:, None])
    a, b = r(3, 5, 7), r(3, 7, 9)
    check(f"{label} batched", scratchops.gemm(a, b, version=version), a @ b)


def check_one_pass(label, version):
    """P85's one pass, `version`, on an odd shape with 3 groups of 4 channels."""
    x, w, bias, g, b, s = r(2, 5, 14, 13), r(12, 5, 3, 3), r(12), r(12), r(12), r(12)
    check(label,
          scratchops.conv2d_group_norm_pool_clamp(x, w, bias, 3, g, b, s, 1e-5, -0.5, 0.5,
                                                  version=version),
          torch.clamp(F.max_pool2d(F.group_norm(F.conv2d(x, w, bias), 3, g, b) *
                                   s[:, None, None], 4), -0.5, 0.5))


def check_kept(label, x, w, bias, b2, constant=0.1):
    """P31's keeping form: its output equal to the plain operator's, and the shares it kept
    (a byte an output, in halves) equal to the min's rule on the convolution's own output."""
    ops = torch.ops.scratchops
    args = ([1, 1], [0, 0], [1, 1])
    out, halves = ops._conv2d_min_add_mul_keeping(x, w, bias, *args, constant, b2, 2.0)
    conv = ops.conv2d(x, w, bias, *args, 1, scratchops.versions.DEFAULT_CONV_WORKSPACE_BYTES,
                      scratchops.versions.DEFAULT_IM2COL_GEMM_VERSION)
    limit = torch.tensor(constant, dtype=x.dtype).item()
    rule = torch.where(conv > limit, 0, torch.where(conv == limit, 1, 2)).to(torch.uint8)
    if not torch.equal(out, ops.conv2d_min_add_mul(x, w, bias, *args, constant, b2, 2.0)):
        failures.append(f"{label}: the keeping form's output differs")
    if not torch.equal(halves, rule):
        failures.append(f"{label}: {(halves != rule).sum().item()} kept shares differ")


def tensor_core_kernels(engine):
    """gemm's tensor-core version, the implicit-GEMM conv2d, P31 in one kernel and P85's one
    pass on the tensor cores."""
    tc = scratchops.versions.GEMM_TENSOR_CORE_VERSION
    check_gemm(f"{engine} gemm v{tc}", tc)
    x, w, bias = r(3, 3, 11, 9), r(70, 3, 3, 2), r(70)
    check(f"{engine} conv2d implicit", scratchops.conv2d(x, w, bias, 2, 1, (1, 2)),
          F.conv2d(x, w, bias, 2, 1, (1, 2)))
    b2 = r(70)
    check(f"{engine} conv2d_min_add_mul", scratchops.conv2d_min_add_mul(x, w, bias, 0.1, b2, 2.0),
          (torch.clamp_max(F.conv2d(x, w, bias), 0.1) + b2[:, None, None]) * 2.0)
    check_kept(f"{engine} conv2d_min_add_mul keeping", x, w, bias, b2)
    for version in scratchops.CONV_GN_POOL_VERSIONS:
        if version != CONV_GN_POOL_CUDA_CORES:
            check_one_pass(f"{engine} conv2d_group_norm_pool_clamp v{version}", version)
    # The convolution's gradients on the tensor cores: with stride 1 (the input gradient a
    # convolution) and strided (the weight gradient's loader reading left of the input's edge),
    # dilated; the weight gradient's implicit GEMM in both.
    for stride, padding in ((1, (1, 2)), (2, 1)):
        check_grads(f"{engine} conv2d backward stride {stride}",
                    lambda x, w, b, s=stride, p=padding: scratchops.conv2d(x, w, b, s, p, (2, 1)),
                    lambda x, w, b, s=stride, p=padding: F.conv2d(x, w, b, s, p, (2, 1)),
                    r(3, 5, 13, 11), r(70, 5, 3, 3), r(70))
    # A non-finite dy: the weight gradient's deferred cross tiles written by their own pass.
    x, dy = r(3, 5, 13, 11), r(3, 70, 11, 9)
    dy[2, 69, 10, 8], dy[0, 3, 0, 0] = float("inf"), float("nan")
    check(f"{engine} conv2d weight gradient of a non-finite dy",
          torch.ops.scratchops._conv2d_weight_grad(
              dy, x, [70, 5, 3, 3], [1, 1], [0, 0], [1, 1],
              scratchops.versions.TENSOR_CORE_GRAD_WORKSPACE_BYTES,
              scratchops.versions.GEMM_TENSOR_CORE_VERSION),
          torch.nn.grad.conv2d_weight(x, (70, 5, 3, 3), dy), equal_nan=True)


def native_half_kernels():
    """The native bf16 products on the wgmma engine: the resident-B kernel (one column tile of
    weights), the ring (Cout 130: two tiles), P31 in one kernel, the weight gradient's implicit
    GEMM, P85's one pass v2 and v3, each
    against torch in bf16 (at two bf16 steps relative, as tests/test_half.py compares bf16: one
    step of another summation order's rounding can become two after the fused tail); Cin 24
    leaves a part block of 8 channels."""
    half = lambda *shape: r(*shape).to(torch.bfloat16)
    tol = max(HALF_TOL, 2 * torch.finfo(torch.bfloat16).eps)
    for cout in (70, 130):
        x, w, bias = half(3, 24, 11, 9), half(cout, 24, 3, 2), half(cout)
        check(f"bf16 conv2d implicit Cout {cout}", scratchops.conv2d(x, w, bias, 2, 1, (1, 2)),
              F.conv2d(x, w, bias, 2, 1, (1, 2)), tol=tol)
    x, w, bias, b2 = half(2, 24, 10, 9), half(70, 24, 3, 3), half(70), half(70)
    half_limit = torch.tensor(0.1, device="cuda", dtype=torch.bfloat16)
    check("bf16 conv2d_min_add_mul", scratchops.conv2d_min_add_mul(x, w, bias, 0.1, b2, 2.0),
          (torch.min(F.conv2d(x, w, bias), half_limit) + b2[:, None, None]) * 2.0, tol=tol)
    check_kept("bf16 conv2d_min_add_mul keeping", x, w, bias, b2)
    x, dy = half(3, 24, 13, 11), half(3, 70, 11, 9)
    check("bf16 conv2d weight gradient",
          torch.ops.scratchops._conv2d_weight_grad(
              dy, x, [70, 24, 3, 3], [1, 1], [0, 0], [1, 1],
              scratchops.versions.TENSOR_CORE_GRAD_WORKSPACE_BYTES,
              scratchops.versions.GEMM_TENSOR_CORE_VERSION),
          torch.nn.grad.conv2d_weight(x, (70, 24, 3, 3), dy), tol=tol)
    x, w, bias, g, b, s = half(2, 5, 14, 13), half(12, 5, 3, 3), half(12), half(12), half(12), \
        half(12)
    for version in (2, 3):  # v2 on the native products, v3 its own kernel in bf16
        check(f"bf16 conv2d_group_norm_pool_clamp v{version}",
              scratchops.conv2d_group_norm_pool_clamp(x, w, bias, 3, g, b, s, 1e-5, -0.5, 0.5,
                                                      version=version),
              torch.clamp(F.max_pool2d(F.group_norm(F.conv2d(x, w, bias), 3, g, b) *
                                       s[:, None, None], 4), -0.5, 0.5), tol=tol)


def staged_a_kernels():
    """The implicit-GEMM conv's v4 (A staged by the copy engine from a channels-last copy):
    bf16 with B resident (one column tile) and in its ring (Cout 130), TF32 under torch's
    switch, P31's tail; rows shorter than a tile, a 72-channel input (a part block of
    channels read past the tensor as zeros) and padding (boxes partly outside the image); the
    bf16 input gradient, a convolution of dy on v4, and the bf16 weight gradient v3."""
    half = lambda *shape: r(*shape).to(torch.bfloat16)
    tol = max(HALF_TOL, 2 * torch.finfo(torch.bfloat16).eps)
    for cout in (70, 130):
        x, w, bias = half(2, 72, 9, 140), half(cout, 72, 3, 3), half(cout)
        check(f"v4 bf16 conv2d Cout {cout}", scratchops.conv2d(x, w, bias, 1, 1),
              F.conv2d(x, w, bias, 1, 1), tol=tol)
    x, w, bias, b2 = r(2, 64, 7, 19), r(40, 64, 3, 3), r(40), r(40)
    before, torch.backends.cudnn.allow_tf32 = torch.backends.cudnn.allow_tf32, True
    try:
        check("v4 tf32 conv2d_min_add_mul",
              scratchops.conv2d_min_add_mul(x, w, bias, 0.1, b2, 2.0),
              (torch.clamp_max(F.conv2d(x, w, bias), 0.1) + b2[:, None, None]) * 2.0)
        check_kept("v4 tf32 conv2d_min_add_mul keeping", x, w, bias, b2)
        x, w, bias, b2 = (t.to(torch.bfloat16) for t in (x, w, bias, b2))
        check_kept("v4 bf16 conv2d_min_add_mul keeping", x, w, bias, b2)
    finally:
        torch.backends.cudnn.allow_tf32 = before
    # The 16-bit input gradient on v4 (dy staged channels-last): chunks of one image (a
    # workspace of about the fixed part and one image's copy) and one chunk.
    x_shape, w, dy = (3, 16, 11, 140), half(64, 16, 3, 3), half(3, 64, 9, 138)
    for ws in (600_000 + dy[0].numel() * 2, 1 << 30):
        check(f"v4 bf16 conv2d input gradient ws={ws}",
              torch.ops.scratchops._conv2d_input_grad(
                  dy, w, list(x_shape), [1, 1], [0, 0], [1, 1], ws,
                  scratchops.versions.GEMM_TENSOR_CORE_VERSION),
              torch.nn.grad.conv2d_input(x_shape, w, dy), tol=tol)
    # The 16-bit weight gradient v3 (x and dy staged channels-last, MN-major operands): a
    # dilated 3 x 3 with channels past a block on both sides and rows of two k-blocks, then an
    # Inf at x's edge; a 1 x 1 with Cout 64 (dy's second box all outside) in chunks of one
    # image and in one chunk. The references in float64 on the CPU: the GPU's bf16 one for
    # the 1 x 1 (a cuBLAS kernel) drew racecheck's hazards into this driver's report.
    for x_shape, w_shape, padding, dilation in (((3, 72, 11, 70), (72, 72, 3, 3), 1, 2),
                                                ((3, 64, 96, 200), (64, 64, 1, 1), 0, 1)):
        x = half(*x_shape)
        dy_shape = F.conv2d(x, half(*w_shape), None, 1, padding, dilation).shape
        dy = half(*dy_shape)

        def reference():
            return torch.nn.grad.conv2d_weight(x.double().cpu(), w_shape, dy.double().cpu(), 1,
                                               padding, dilation).to("cuda", torch.bfloat16)
        # (1 x 1: an image's copies 4.9 MB, its partials and the fixed part under 1 MB: chunks
        # of one image)
        for ws in ((x[0].numel() + dy[0].numel()) * 2 + 2**20, 1 << 30):
            check(f"v3 bf16 conv2d weight gradient {w_shape} ws={ws}",
                  torch.ops.scratchops._conv2d_weight_grad(
                      dy, x, list(w_shape), [1, 1], [padding] * 2, [dilation] * 2, ws,
                      scratchops.versions.GEMM_TENSOR_CORE_VERSION),
                  reference(), tol=tol)
        if w_shape[-1] == 3:  # an Inf in x's last column: partial blocks split a stage a tap
            x[1, 3, 5, -1] = float("inf")
            check("v3 bf16 conv2d weight gradient, Inf at x's edge",
                  torch.ops.scratchops._conv2d_weight_grad(
                      dy, x, list(w_shape), [1, 1], [padding] * 2, [dilation] * 2, 1 << 30,
                      scratchops.versions.GEMM_TENSOR_CORE_VERSION),
                  reference(), equal_nan=True, tol=tol)
    # Both gradients at once, dy's channels-last copy made once for both.
    x, w, dy = half(2, 64, 12, 70), half(96, 64, 3, 3), half(2, 96, 10, 68)
    dx, dw = torch.ops.scratchops._conv2d_grads(dy, x, w, [1, 1], [0, 0], [1, 1], 1 << 30,
                                                scratchops.versions.GEMM_TENSOR_CORE_VERSION)
    check("bf16 conv2d gradients at once: dx", dx,
          torch.nn.grad.conv2d_input(x.shape, w, dy), tol=tol)
    check("bf16 conv2d gradients at once: dw", dw,
          torch.nn.grad.conv2d_weight(x.double().cpu(), w.shape, dy.double().cpu()).to(
              "cuda", torch.bfloat16), tol=tol)
    # P31's four gradients at once from the kept shares: the min's rule written channels-last
    # where the two gradients read dy (min_add_mul_backward v4), on whole quads of pixels (an
    # even output row) and value by value (an odd plane), 72 channels (a partial block);
    # against the same operator run apart (a budget of 1 byte).
    for x_shape in ((2, 64, 12, 70), (2, 64, 13, 17)):
        x, w, bias, b2 = half(*x_shape), half(72, 64, 3, 3), half(72), half(72)
        _, halves = torch.ops.scratchops._conv2d_min_add_mul_keeping(
            x, w, bias, [1, 1], [0, 0], [1, 1], 0.1, b2, 2.0)
        dy = half(*halves.shape)
        args = (dy, halves, x, w, 2.0, [1, 1], [0, 0], [1, 1])
        version = scratchops.versions.GEMM_TENSOR_CORE_VERSION
        at_once = torch.ops.scratchops._conv2d_min_add_mul_grads_kept(*args, 1 << 30, version)
        apart = torch.ops.scratchops._conv2d_min_add_mul_grads_kept(*args, 1, version)
        for name, a, b in zip(("dx", "dw", "conv bias", "bias"), at_once, apart):
            check(f"bf16 P31 gradients at once {x_shape}: {name}", a, b, tol=tol)

def float_grads_at_once():
    """P31's four gradients at once in fp32, TF32 off (min_add_mul_conv_grads_launch: the rule's
    pass writes dy's two TF32 parts for the input gradient v4, the weight gradient's packing
    computes the rule, its workspace over the dead parts; or one pass writes both operands, a
    chunk of slices at a time, shapes below): P31's channels on 70-pixel rows, and
    batch 1 with 3 input and 36 output channels, against the same operator run apart (a budget
    of 1 byte), dx and dW bit for bit. (Two of tests/test_kept_shares.py's FLOAT_FUSED_SHAPES,
    where the tests count the launches: the form runs at the default budget, and apart the
    input gradient is v4 too, whose flipped weights' workspace holds an image's chunk even at
    1 byte, so the bits must agree. This driver cannot count launches: compute-sanitizer
    refuses torch's profiler.)"""
    version = scratchops.versions.GEMM_TENSOR_CORE_VERSION
    # Then the one pass over dy (min_add_mul_operands.cuh: output rows of whole k-blocks):
    # 126-pixel rows, 250-pixel rows with 36 output channels, 125-pixel rows, 36 rows in
    # chunks of one slice (a budget of 4 MiB) and 108 rows in chunks of two slices, each
    # chunk's pass beside the product before it (16 MiB), the last two held to the one pass
    # in one chunk (the default budget): at 1 byte that shape's input gradient apart is v2,
    # whose bits are not v4's.
    for x_shape, w_shape, padding, budget, apart_budget in (
            ((2, 64, 9, 70), (128, 64, 3, 3), 0, 1 << 30, 1),
            ((1, 3, 7, 67), (36, 3, 3, 3), 1, 1 << 30, 1),
            ((2, 64, 6, 128), (128, 64, 3, 3), 0, 1 << 30, 1),
            ((1, 8, 4, 250), (36, 8, 3, 3), 1, 1 << 30, 1),
            ((1, 8, 5, 125), (40, 8, 3, 3), 1, 1 << 30, 1),
            ((2, 16, 20, 128), (32, 16, 3, 3), 0, 1 << 22, 1 << 30),
            ((6, 16, 20, 128), (32, 16, 3, 3), 0, 1 << 24, 1 << 30)):
        x, w, bias, b2 = r(*x_shape), r(*w_shape), r(w_shape[0]), r(w_shape[0])
        window = ([1, 1], [padding] * 2, [1, 1])
        _, halves = torch.ops.scratchops._conv2d_min_add_mul_keeping(x, w, bias, *window, 0.1,
                                                                     b2, 2.0)
        args = (r(*halves.shape), halves, x, w, 2.0, *window)
        at_once = torch.ops.scratchops._conv2d_min_add_mul_grads_kept(*args, budget, version)
        apart = torch.ops.scratchops._conv2d_min_add_mul_grads_kept(*args, apart_budget,
                                                                    version)
        for name, a, b in zip(("dx", "dw", "conv bias", "bias"), at_once, apart):
            check(f"fp32 P31 gradients at once {x_shape}: {name}", a, b,
                  tol=0 if name in ("dx", "dw") else None)


def row_ring_kernels():
    """The implicit-GEMM conv's v5 (NCHW rows made channels-last in a ring in shared memory):
    bf16, P31's tail and its keeping form, on one output row an image (every tile starts an
    image) and on padded rows; enough output rows for v5 on this GPU (8 a multiprocessor)."""
    half = lambda *shape: r(*shape).to(torch.bfloat16)
    tol = max(HALF_TOL, 2 * torch.finfo(torch.bfloat16).eps)
    rows = 8 * torch.cuda.get_device_properties(0).multi_processor_count
    x, w, bias, b2 = half(rows + 3, 64, 3, 16), half(128, 64, 3, 3) / 24, half(128), half(128)
    limit = torch.tensor(0.1, device="cuda", dtype=torch.bfloat16)
    out = scratchops.conv2d_min_add_mul(x, w, bias, 0.1, b2, 2.0)
    check("v5 bf16 conv2d_min_add_mul", out,
          (torch.min(F.conv2d(x, w, bias), limit) + b2[:, None, None]) * 2.0, tol=tol)
    # v4's bits (v4 takes the same values one element into their storage: v5 needs 16 bytes)
    if not torch.equal(out, scratchops.conv2d_min_add_mul(one_element_in(x), w, bias, 0.1, b2,
                                                          2.0)):
        failures.append("v5 bf16 conv2d_min_add_mul: not v4's bits")
    check_kept("v5 bf16 conv2d_min_add_mul keeping", x, w, bias, b2)
    x, w = half(rows // 5 + 1, 64, 7, 24), half(40, 64, 3, 2)
    check("v5 bf16 conv2d padded", scratchops.conv2d(x, w, None, 1, (1, 2)),
          F.conv2d(x, w, None, 1, (1, 2)), tol=tol)


def check_grads(label, ours, ref, *inputs):
    """The gradients of ours(*inputs) and ref(*inputs) for one random output gradient."""
    leaves = [t.detach().requires_grad_() for t in inputs]
    y = ref(*leaves)
    g = torch.rand_like(y)
    expected = torch.autograd.grad(y, leaves, g)
    got = torch.autograd.grad(ours(*leaves), leaves, g)
    for i, (a, b) in enumerate(zip(got, expected)):
        scale = b.abs().max().item()
        try:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4 * scale)
        except AssertionError as e:
            failures.append(f"{label} gradient {i}: {e}")


def check_half_input_paths():
    """P85's fused backward in bf16 reads its input in pairs where the rows start on 4-byte
    boundaries (an even width, x aligned) and a value at a time otherwise (the same input one
    value into its storage): both paths, on the general and the full-shape instantiations,
    must give the same bits."""
    for w_shape in ((6, 3, 3, 3), (8, 8, 3, 3), (4, 8, 5, 5)):
        x = r(2, w_shape[1], 19, 38).to(torch.bfloat16)
        params = [t.to(torch.bfloat16) for t in (r(*w_shape), r(w_shape[0]), r(w_shape[0]),
                                                 r(w_shape[0]), r(w_shape[0]))]
        shifted = one_element_in(x)

        def gradients(inp, g=None):
            leaves = [t.detach().requires_grad_() for t in (inp, *params)]
            y = scratchops.conv2d_group_norm_pool_clamp(leaves[0], leaves[1], leaves[2], 2,
                                                        leaves[3], leaves[4], leaves[5], 1e-5,
                                                        -0.5, 0.5)
            g = torch.rand_like(y) if g is None else g
            return torch.autograd.grad(y, leaves, g), g

        paired, g = gradients(x)
        loaded, _ = gradients(shifted, g)
        if not all(torch.equal(a, b) for a, b in zip(paired, loaded)):
            failures.append(f"bf16 fused backward {w_shape}: the input's two paths differ")


def backward_kernels():
    """Every backward kernel (cuda/*_backward.cu, transpose.cu), through the operators'
    backward formulas, with chunked convolution workspaces."""
    for ws in (1, 1 << 20):
        check_grads(f"conv2d backward ws={ws}",
                    lambda x, w, b: scratchops.conv2d(x, w, b, 2, 1, (1, 2), algorithm="im2col_gemm",
                                                      workspace_bytes=ws),
                    lambda x, w, b: F.conv2d(x, w, b, 2, 1, (1, 2)), r(3, 3, 11, 9), r(5, 3, 3, 2),
                    r(5))
    check_grads("gemm backward", lambda a, b, c: scratchops.gemm(a, b, c, version=4),
                lambda a, b, c: a @ b + c[:, None], r(33, 17), r(3, 17, 45), r(33))
    check_grads("im2col backward", lambda x: scratchops.im2col(x, (3, 2), 1, 1, 2),
                lambda x: F.unfold(x, (3, 2), 1, 1, 2), r(2, 3, 9, 7))
    check_grads("group_norm_scale backward",
                lambda x, g, b, s: scratchops.group_norm_scale(x, 3, g, b, s),
                lambda x, g, b, s: F.group_norm(x, 3, g, b) * s, r(2, 6, 5, 7), r(6), r(6),
                r(6, 1, 1))
    check_grads("scale / min_add_mul backward",
                lambda x, s: scratchops.min_add_mul(scratchops.scale(x, s), 0.1, s, -2.0),
                lambda x, s: (torch.clamp_max(x * s, 0.1) + s) * -2.0, r(2, 5, 7, 9), r(5, 1, 1))
    check_grads("conv2d_min_add_mul backward (from the kept shares)",
                lambda x, w, b, b2: scratchops.conv2d_min_add_mul(x, w, b, 0.1, b2, 2.0),
                lambda x, w, b, b2: (torch.clamp_max(F.conv2d(x, w, b), 0.1) +
                                     b2[:, None, None]) * 2.0,
                r(2, 5, 9, 8), r(70, 5, 3, 3), r(70), r(70))
    # Each kernel instantiation: 3 x 3 and 5 x 5, for the call's shape and for the full shape
    # (8 input channels and the whole kernel size, extent_of in conv_gn_pool_backward_tile.cuh).
    for w_shape, groups in (((12, 5, 3, 3), 3), ((6, 2, 5, 4), 2), ((8, 8, 3, 3), 2),
                            ((4, 8, 5, 5), 2)):
        check_grads(f"conv2d_group_norm_pool_clamp backward (fused, {w_shape[2]}x{w_shape[3]})",
                    lambda x, w, b, g, b2, s, k=groups: scratchops.conv2d_group_norm_pool_clamp(
                        x, w, b, k, g, b2, s, 1e-5, -0.5, 0.5, version=CONV_GN_POOL_CUDA_CORES),
                    lambda x, w, b, g, b2, s, k=groups: torch.clamp(F.max_pool2d(
                        F.group_norm(F.conv2d(x, w, b), k, g, b2) * s[:, None, None], 4),
                        -0.5, 0.5),
                    r(2, w_shape[1], 19, 37), r(*w_shape), r(w_shape[0]), r(w_shape[0]),
                    r(w_shape[0]), r(w_shape[0]))
    check_half_input_paths()
    check_grads("max_pool2d_clamp / clamp backward",
                lambda x: scratchops.clamp(scratchops.max_pool2d_clamp(x, 3, 2, 1, -0.5, 0.5),
                                           -0.2, 0.3),
                lambda x: torch.clamp(torch.clamp(F.max_pool2d(x, 3, 2, 1), -0.5, 0.5), -0.2, 0.3),
                r(2, 3, 11, 10))


def main():
    hopper = torch.cuda.get_device_capability() == (9, 0)
    tensor_cores = torch.cuda.get_device_capability() >= (8, 0)
    for version in scratchops.GEMM_VERSIONS:
        if version == scratchops.versions.GEMM_TENSOR_CORE_VERSION:
            continue  # on each engine below
        if version >= scratchops.versions.GEMM_FIRST_TENSOR_CORE_VERSION and not (
                hopper if version in scratchops.versions.GEMM_WGMMA_VERSIONS else tensor_cores):
            continue  # no kernel for this GPU
        check_gemm(f"gemm v{version}", version)
        if version not in scratchops.IM2COL_GEMM_VERSIONS:
            continue
        x, w, bias = r(3, 3, 11, 9), r(5, 3, 3, 2), r(5)
        for ws in (1, 4 * 18 * 40, 1 << 20):
            check(f"conv2d im2col v{version} ws={ws}",
                  scratchops.conv2d(x, w, bias, 2, 1, (1, 2), algorithm="im2col_gemm",
                                    workspace_bytes=ws, gemm_version=version),
                  F.conv2d(x, w, bias, 2, 1, (1, 2)))
    # The tensor-core kernels on every engine this GPU has (scratchops/tensor_cores.py).
    for engine in (["wgmma", "mma_sync"] if hopper else ["mma_sync"] if tensor_cores else []):
        with scratchops.tensor_core_path(engine):
            tensor_core_kernels(engine)
    if hopper:
        native_half_kernels()
        staged_a_kernels()
        row_ring_kernels()
        float_grads_at_once()
    x = r(2, 3, 9, 7)
    for version in scratchops.IM2COL_VERSIONS:
        check(f"im2col v{version}", scratchops.im2col(x, (3, 2), 1, 1, 2, version=version),
              F.unfold(x, (3, 2), 1, 1, 2))
    for version in scratchops.GROUP_NORM_VERSIONS:
        for shape, groups in [((2, 6, 5, 7), 3), ((2, 8, 4, 4), 4), ((3, 4), 2)]:
            x, g, b, s = r(*shape), r(shape[1]), r(shape[1]), r(shape[1])
            check(f"group_norm v{version} {shape}",
                  scratchops.group_norm(x, groups, g, b, version=version),
                  F.group_norm(x, groups, g, b))
            check(f"group_norm_scale v{version} {shape}",
                  scratchops.group_norm_scale(x, groups, g, b, s, version=version),
                  F.group_norm(x, groups, g, b) * s.reshape(shape[1], *([1] * (len(shape) - 2))))
    # P85's one pass on the CUDA cores (the tensor-core versions run on each engine above).
    check_one_pass(f"conv2d_group_norm_pool_clamp v{CONV_GN_POOL_CUDA_CORES}",
                   CONV_GN_POOL_CUDA_CORES)
    x, s = r(2, 5, 7, 9), r(5, 1, 1)
    check("scale", scratchops.scale(x, s), x * s)
    check("min_add_mul", scratchops.min_add_mul(x, 0.5, s, 2.0), (torch.clamp_max(x, 0.5) + s) * 2)
    for shape in [(7,), (3, 5, 7), (4, 4, 4)]:
        x = r(*shape)
        check(f"clamp {shape}", scratchops.clamp(x, -0.2, 0.3), torch.clamp(x, -0.2, 0.3))
    x = r(2, 3, 11, 10)
    for version in scratchops.MAX_POOL2D_VERSIONS:
        check(f"max_pool2d v{version}", scratchops.max_pool2d(x, 3, 2, 1, version=version),
              F.max_pool2d(x, 3, 2, 1))
        check(f"max_pool2d_clamp v{version}",
              scratchops.max_pool2d_clamp(x, 4, None, 0, 0.0, 1.0, version=version),
              torch.clamp(F.max_pool2d(x, 4), 0.0, 1.0))
    for name, module in PROBLEMS.items():
        x = torch.rand(2, *module.get_inputs()[0].shape[1:2], 20, 19, device="cuda")
        for label in module.VARIANTS:
            model, model_new = build_pair(module, label, seed=0)
            with torch.no_grad():
                check(f"{name} {label}", model_new(x), model(x))
            check_grads(f"{name} {label} backward", model_new, model, x)
    backward_kernels()
    torch.cuda.synchronize()
    for f in failures:
        print("MISMATCH", f)
    print(f"sanitize_driver: {len(failures)} mismatches")
    return 1 if failures else 0


if __name__ == "__main__":
    with tf32_disabled():  # torch's references in true fp32
        short_runs = {"row_ring": row_ring_kernels, "grads_at_once": float_grads_at_once}
        if len(sys.argv) == 2 and sys.argv[1] in short_runs:  # one group alone (a short run)
            short_runs[sys.argv[1]]()
            print(f"sanitize_driver: {len(failures)} mismatches", *failures, sep="\n")
            sys.exit(1 if failures else 0)
        sys.exit(main())
