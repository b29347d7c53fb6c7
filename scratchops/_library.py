"""The operator library torch.ops.scratchops: schemas, CUDA kernels, fakes and autograd.

Everything here is defined at import, on any machine: the schemas and the fake (meta)
implementations need no CUDA build, so torch.compile, torch.library.opcheck, FakeTensorMode
and meta-device tracing work on a CPU too; Dynamo sees only the opaque custom operators.

The CUDA kernels: at import each operator gets a placeholder CUDA kernel, which builds and
loads the extension (_build.ops()) and calls the same implementation through its private
operator scratchops_cuda::<name>. The first call of a public function on a CUDA tensor
installs the compiled kernels instead (install_cuda_kernels): the placeholders are removed
and binding.cpp's C++ implementations become the public operators' CUDA kernels, so a call
runs no Python between the dispatcher and the launcher. (A placeholder cannot install them
itself: it would remove the kernel that is running.)

Autocast: under torch.autocast("cuda", dtype) each operator follows the policy of its torch
counterpart (the AUTOCAST table below).

Autograd: every operator has a backward made of scratchops kernels (scratchops._backward has
the formulas; they call the private operators of BACKWARD_SCHEMAS below, whose kernels are
cuda/*_backward.cu and cuda/transpose.cu). The backward itself has no backward: a private
operator's gradient raises NotImplementedError (scratchops::_backward_not_implemented) when a
double backward runs, naming the operator, so a second-order gradient never comes back
silently wrong or missing. Raising when that gradient *runs*, not when it is traced, keeps
create_graph=True usable for first-order gradients and lets torch.compile trace. Under
FakeTensorMode (tracing) that operator returns a gradient-shaped fake tensor; on real meta
tensors it raises like on the GPU.
"""

from __future__ import annotations

import threading
import types

import torch
from torch._C import _AutoDispatchBelowAutograd
from torch._subclasses.fake_tensor import is_fake

from . import _backward, _build, _fakes
from ._validate import ONE_PASS_POOL
from .versions import (CONV2D_ALGORITHMS, DEFAULT_CONV_WORKSPACE_BYTES, DEFAULT_GROUP_NORM_VERSION,
                       DEFAULT_IM2COL_GEMM_VERSION, DEFAULT_MAX_POOL2D_VERSION)

# name -> schema (arguments and result), written only here: binding.cpp's scratchops_cuda
# operators take the schemas inferred from their C++ signatures (tests/test_library.py checks
# that the types agree).
SCHEMAS = {
    "im2col": "(Tensor input, int[2] kernel_size, int[2] dilation, int[2] padding, "
              "int[2] stride, int version) -> Tensor",
    "gemm": "(Tensor a, Tensor b, Tensor? bias, int? version) -> Tensor",
    "conv2d": "(Tensor input, Tensor weight, Tensor? bias, int[2] stride, int[2] padding, "
              "int[2] dilation, int algorithm, int workspace_bytes, int gemm_version) -> Tensor",
    "conv2d_min_add_mul": "(Tensor input, Tensor weight, Tensor? conv_bias, int[2] stride, "
                          "int[2] padding, int[2] dilation, float constant, Tensor bias, "
                          "float factor) -> Tensor",
    "conv2d_group_norm_pool_clamp": "(Tensor input, Tensor weight, Tensor? conv_bias, "
                                    "int num_groups, Tensor? gn_weight, Tensor? gn_bias, "
                                    "Tensor? scale, float eps, float min, float max, "
                                    "int version) -> Tensor",
    "group_norm": "(Tensor input, int num_groups, Tensor? weight, Tensor? bias, Tensor? scale, "
                  "float eps, int version) -> Tensor",
    "scale": "(Tensor input, Tensor scale) -> Tensor",
    "min_add_mul": "(Tensor input, float constant, Tensor bias, float factor) -> Tensor",
    "max_pool2d_clamp": "(Tensor input, int[2] kernel_size, int[2] stride, int[2] padding, "
                        "float min, float max, int version) -> Tensor",
    "clamp": "(Tensor input, float min, float max) -> Tensor",
}

# The private operators the backward formulas (scratchops._backward) are made of, one kernel
# each (binding.cpp, each_backward_operator): callers are those formulas only.
BACKWARD_SCHEMAS = {
    "_col2im": "(Tensor grad, int[] input_size, int[] kernel_size, int[] dilation, "
               "int[] padding, int[] stride) -> Tensor",
    "_conv2d_input_grad": "(Tensor grad, Tensor weight, int[] input_size, int[] stride, "
                          "int[] padding, int[] dilation, int workspace_bytes, "
                          "int gemm_version) -> Tensor",
    "_conv2d_weight_grad": "(Tensor grad, Tensor input, int[] weight_size, int[] stride, "
                           "int[] padding, int[] dilation, int workspace_bytes, "
                           "int gemm_version) -> Tensor",
    "_conv2d_grads": "(Tensor grad, Tensor input, Tensor weight, int[] stride, int[] padding, "
                     "int[] dilation, int workspace_bytes, int gemm_version) -> (Tensor, Tensor)",
    "_channel_sums": "(Tensor input, Tensor? other, float factor) -> Tensor",
    "_transpose": "(Tensor input) -> Tensor",
    "_batch_sum": "(Tensor input) -> Tensor",
    "_group_norm_backward": "(Tensor grad, Tensor input, int num_groups, Tensor? weight, "
                            "Tensor? bias, Tensor? scale, float eps) "
                            "-> (Tensor, Tensor, Tensor, Tensor)",
    "_max_pool2d_clamp_backward": "(Tensor grad, Tensor input, int[] kernel_size, int[] stride, "
                                  "int[] padding, float min, float max) -> Tensor",
    "_clamp_backward": "(Tensor grad, Tensor input, float min, float max) -> Tensor",
    "_min_add_mul_backward": "(Tensor grad, Tensor input, float constant, float factor) "
                             "-> Tensor",
    "_min_add_mul_backward_kept": "(Tensor grad, Tensor halves, float factor) "
                                  "-> (Tensor, Tensor, Tensor)",
    "_conv2d_min_add_mul_grads_kept": (
        "(Tensor grad, Tensor halves, Tensor input, Tensor weight, float factor, int[] stride, "
        "int[] padding, int[] dilation, int workspace_bytes, int gemm_version) "
        "-> (Tensor, Tensor, Tensor, Tensor)"),
    "_conv2d_group_norm_pool_clamp_backward_kept": (
        "(Tensor grad, Tensor input, Tensor weight, Tensor? conv_bias, int num_groups, "
        "Tensor? gn_weight, Tensor? gn_bias, Tensor? scale, Tensor extremes, Tensor stats, "
        "float min, float max) -> (Tensor, Tensor, Tensor, Tensor)"),
}

# The private forward operators that also return what their backward needs, so that it need
# not compute it again: _<public name>_keeping, the public operator's arguments, its output and
# the kept tensor. The public function calls one when a gradient is wanted (scratchops/ops.py:
# _keeps_for_backward); torch.ops.scratchops.<public name> itself keeps nothing, and its
# backward computes what it needs.
#   _conv2d_min_add_mul_keeping  also the min's gradient share of each output, in halves (a
#                                byte an output, cuda/common.cuh's min_gradient_halves), which
#                                the backward reads instead of the convolution's output.
#   _conv2d_group_norm_pool_clamp_keeping  also each pooling window's extreme of the
#                                convolution (float32, the output's shape) and each (sample,
#                                group)'s mean and 1/std (float32, (N, groups, 2)), from which
#                                the backward computes the convolution again tile by tile.
KEEPING_SCHEMAS = {
    "_conv2d_min_add_mul_keeping": "(Tensor input, Tensor weight, Tensor? conv_bias, "
                                   "int[2] stride, int[2] padding, int[2] dilation, "
                                   "float constant, Tensor bias, float factor) "
                                   "-> (Tensor, Tensor)",
    "_conv2d_group_norm_pool_clamp_keeping": SCHEMAS["conv2d_group_norm_pool_clamp"].replace(
        "-> Tensor", "-> (Tensor, Tensor, Tensor)"),
}

_LIB = torch.library.Library("scratchops", "DEF")
_PLACEHOLDERS = torch.library.Library("scratchops", "IMPL")  # removed by install_cuda_kernels
OPS = torch.ops.scratchops


def _placeholder_cuda_kernel(name: str):
    def kernel(*args):
        return getattr(_build.ops(), name)(*args)

    kernel.__name__ = f"{name}_cuda_placeholder"
    return kernel


def _below_autograd(name: str):
    def call(*args):
        with _AutoDispatchBelowAutograd():
            return getattr(OPS, name).default(*args)

    call.__name__ = name
    return call


# The calls scratchops/ops.py makes when no gradient is wanted: KERNELS.<name>(*args) runs the
# public operator <name> below autograd. Until the CUDA kernels are installed, through
# torch.ops (below); after, binding.cpp's direct calls, which do the same from C++ without
# torch.ops' argument parsing.
KERNELS = types.SimpleNamespace(**{name: _below_autograd(name) for name in SCHEMAS})
cuda_kernels_installed = False


def install_cuda_kernels() -> None:
    """Make binding.cpp's implementations the public operators' CUDA kernels (building and
    loading the extension first), and its direct calls the KERNELS, once; RuntimeError saying
    why when they cannot run here. Call it outside any scratchops kernel (see the top)."""
    global cuda_kernels_installed
    if cuda_kernels_installed:
        return
    cuda = _build.ops()
    _PLACEHOLDERS._destroy()
    cuda.register_public_kernels()
    direct = _build.direct_calls()
    for name in SCHEMAS:
        setattr(KERNELS, name, getattr(direct, name))
    cuda_kernels_installed = True


def backward_error(what: str) -> NotImplementedError:
    """The error of a double backward; `what` names the public operator and the step of its
    backward whose gradient was asked for (_no_backward)."""
    return NotImplementedError(
        f"scratchops.{what}: double backward is not implemented (the backward is made of "
        "scratchops kernels that have no backward of their own); scratchops computes "
        "first-order gradients only")


_LIB.define("_backward_not_implemented(str op, Tensor grad, SymInt[] shape) -> Tensor")


def _backward_not_implemented(op, grad, shape):
    raise backward_error(op)


def _backward_not_implemented_fake(op, grad, shape):
    if not is_fake(grad):  # a real meta tensor: an eager backward on the meta device
        raise backward_error(op)
    return grad.new_empty(shape)


_LIB.impl("_backward_not_implemented", _backward_not_implemented, "CompositeExplicitAutograd")
torch.library.register_fake("scratchops::_backward_not_implemented",
                            _backward_not_implemented_fake, lib=_LIB)


# The public operator whose backward is running on this thread, if any: a private operator's
# double-backward error names it.
_running = threading.local()


def _backward_of(name: str, public: str | None = None):
    """The backward formula of operator `name` (scratchops._backward), noting the public
    operator it serves (`public`, default `name`) as the running one while it runs."""
    formula = getattr(_backward, f"backward_{name}")
    public = public or name

    def backward(ctx, *grads):
        outer = getattr(_running, "name", None)
        _running.name = public
        try:
            return formula(ctx, *grads)
        finally:
            _running.name = outer

    backward.__name__ = f"backward_{name}"
    return backward


def _save_input_shapes(ctx, inputs, output):
    ctx.input_shapes = [x.shape if isinstance(x, torch.Tensor) else None for x in inputs]
    ctx.public_name = getattr(_running, "name", None)


def _no_backward(name: str):
    """A private operator's gradient: raises backward_error when it runs (see the top)."""
    def backward(ctx, *grads):
        grad = next(g for g in grads if g is not None)
        what = f"{ctx.public_name or 'operator'} (its backward's step {name})"
        return tuple(
            OPS._backward_not_implemented(what, grad, list(shape)) if needed else None
            for shape, needed in zip(ctx.input_shapes, ctx.needs_input_grad))

    return backward


# ------------------------------------------------------------------------------- autocast
# Each operator's policy under torch.autocast("cuda", dtype), that of its torch counterpart in
# torch.amp's op lists:
#   lower     gemm and conv2d (torch: matmul, conv2d): floating tensors cast to the autocast dtype;
#   float32   group_norm (torch: group_norm): cast to float32;
#   promote   the elementwise and pooling operators (torch: no autocast rule, so the
#             elementwise type promotion of x * scale, x + bias): cast to the widest dtype among
#             the call's tensors (a single tensor: as it is);
#   composed  the fused operators run as the chain of the operators above that torch's own
#             model runs (_composed), each part under its own policy: the convolution in the
#             autocast dtype, group norm in float32, the result in the dtype torch gives.
def _cast(args, dtype):
    return tuple(a.to(dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                 for a in args)


def _widest(args):
    dtype = None
    for a in args:
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            dtype = a.dtype if dtype is None else torch.promote_types(dtype, a.dtype)
    return dtype


_AUTOCAST_OFF = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCUDA)


def _autocast_kernel(name: str, policy: str):
    op = getattr(OPS, name).default

    def kernel(_keyset, *args):
        if policy == "composed":  # (each operator of the chain meets autocast itself)
            return _COMPOSED[name](*args)
        dtype = (torch.get_autocast_dtype("cuda") if policy == "lower"
                 else torch.float32 if policy == "float32" else _widest(args))
        with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_OFF):
            return op(*_cast(args, dtype))

    kernel.__name__ = f"{name}_autocast"
    return kernel


def _conv2d_min_add_mul_chain(x, weight, conv_bias, stride, padding, dilation, constant, bias,
                              factor):
    y = OPS.conv2d(x, weight, conv_bias, stride, padding, dilation,
                   CONV2D_ALGORITHMS["implicit_gemm"], DEFAULT_CONV_WORKSPACE_BYTES,
                   DEFAULT_IM2COL_GEMM_VERSION)
    return OPS.min_add_mul(y, constant, bias, factor)


def _conv2d_group_norm_pool_clamp_chain(x, weight, conv_bias, num_groups, gn_weight, gn_bias,
                                        scale, eps, min, max, version):
    y = OPS.conv2d(x, weight, conv_bias, [1, 1], [0, 0], [1, 1],
                   CONV2D_ALGORITHMS["implicit_gemm"], DEFAULT_CONV_WORKSPACE_BYTES,
                   DEFAULT_IM2COL_GEMM_VERSION)
    y = OPS.group_norm(y, num_groups, gn_weight, gn_bias, None, eps, DEFAULT_GROUP_NORM_VERSION)
    if scale is not None:
        y = OPS.scale(y, scale)
    window = [ONE_PASS_POOL, ONE_PASS_POOL]
    return OPS.max_pool2d_clamp(y, window, window, [0, 0], min, max, DEFAULT_MAX_POOL2D_VERSION)


_COMPOSED = {"conv2d_min_add_mul": _conv2d_min_add_mul_chain,
             "conv2d_group_norm_pool_clamp": _conv2d_group_norm_pool_clamp_chain}
AUTOCAST = {"gemm": "lower", "conv2d": "lower", "group_norm": "float32", "im2col": "promote",
            "scale": "promote", "min_add_mul": "promote", "max_pool2d_clamp": "promote",
            "clamp": "promote", **{name: "composed" for name in _COMPOSED}}

for _name, _schema in SCHEMAS.items():
    _LIB.define(_name + _schema)
    _PLACEHOLDERS.impl(_name, _placeholder_cuda_kernel(_name), "CUDA")
    torch.library.register_fake(f"scratchops::{_name}", getattr(_fakes, _name), lib=_LIB)
    torch.library.register_autograd(f"scratchops::{_name}", _backward_of(_name),
                                    setup_context=getattr(_backward, f"setup_{_name}"), lib=_LIB)
    _LIB.impl(_name, _autocast_kernel(_name, AUTOCAST[_name]), "AutocastCUDA", with_keyset=True)

for _name, _schema in KEEPING_SCHEMAS.items():  # (no autocast kernel: called outside autocast)
    _LIB.define(_name + _schema)
    _PLACEHOLDERS.impl(_name, _placeholder_cuda_kernel(_name), "CUDA")
    torch.library.register_fake(f"scratchops::{_name}", getattr(_fakes, _name), lib=_LIB)
    torch.library.register_autograd(
        f"scratchops::{_name}",
        _backward_of(_name, public=_name.removeprefix("_").removesuffix("_keeping")),
        setup_context=getattr(_backward, f"setup_{_name}"), lib=_LIB)

for _name, _schema in BACKWARD_SCHEMAS.items():
    _LIB.define(_name + _schema)
    _PLACEHOLDERS.impl(_name, _placeholder_cuda_kernel(_name), "CUDA")
    torch.library.register_fake(f"scratchops::{_name}", getattr(_fakes, _name), lib=_LIB)
    torch.library.register_autograd(f"scratchops::{_name}", _no_backward(_name),
                                    setup_context=_save_input_shapes, lib=_LIB)
