// conv_grads_min_add_mul.cuh — P31's four gradients at once in float (3xTF32), with the min's
// rule applied inside both convolution gradients' passes over dy (conv_backward.cu's "P31's
// four at once" versions; declared in launchers_backward.h). Included by conv_backward.cu after
// conv_backward_tensor_cores.cuh, whose input gradient v4 and weight gradient it runs.
#pragma once

#include <algorithm>

#include "conv_backward_tensor_cores.cuh"

namespace scratchops {

// P31's four gradients in float, 3xTF32, with the min's rule applied inside both gradients'
// passes over dy (launchers_backward.h), in one of two forms.
//   one pass   (min_rule_operands::applies: output rows of whole k-blocks) the weight gradient
//              first, each chunk of its slices packed by the min's one pass, which writes
//              the input gradient v4's two TF32 parts of those rows and the bias sums'
//              partials too (min_add_mul_operands.cuh); then the sums finished and v4 on the
//              parts. The workspace: the two parts (the batch's, each as large as dy), the
//              partials, v4's packed weights, then the weight gradient's workspace at the
//              budget, alive beside the parts.
//   two passes (otherwise) the rule's pass writes dy's two TF32 parts and the sums, v4 runs on
//              the parts, and the weight gradient v2's packing computes the rule again from
//              dy and the shares. The weight gradient runs after v4 on the same stream, when
//              the parts, the sums and the packed weights are dead, so its workspace lies over
//              them from byte 0.
// In both, one part stands where the rule's gradient would lie in the operators apart, outside
// the budget; the other part and the packed weights must fit the budget, and so must v4's
// chunk of one image's parts, as there (else the operators apart run: where they would run
// v2, this form's v4 would give other bits).
struct MinAddMulGrads {  // bytes, each 16-byte aligned (pieces: the one pass's partials a channel)
    bool one_pass;
    long long pieces, part, sums, packed_weights, weight_grad;
    long long parts_end() const { return 2 * part + sums + packed_weights; }
    long long total() const {
        return one_pass ? parts_end() + weight_grad : std::max(parts_end(), weight_grad);
    }
};
inline MinAddMulGrads min_add_mul_conv_grads_layout(int batch, int out_channels,
                                                    const Conv2dGeometry& g,
                                                    TensorCorePath engine, long long budget) {
    const long long pixels = static_cast<long long>(g.out_h) * g.out_w;
    const conv_wgrad::Slices s = conv_wgrad::slices_of<float>(batch, g, kWeightGradSlice);
    const bool one_pass = min_rule_operands::applies(s, out_channels);
    const long long pieces = one_pass ? min_rule_operands::pieces(s) : 0;
    const long long sums = one_pass ? 2 * 4 * out_channels * pieces
                                    : min_add_mul_backward_kept_channels_last_workspace_bytes(
                                          batch, out_channels, static_cast<int>(pixels));
    return {one_pass, pieces, align16(4 * pixels * out_channels * batch), align16(sums),
            align16(4 * swapped::workspace_floats(out_channels, g).packed),
            align16(weight_grad_workspace_bytes<float>(batch, out_channels, g, engine, budget))};
}

long long min_add_mul_conv_grads_bytes(int batch, int out_channels, const Conv2dGeometry& g,
                                       TensorCorePath engine, bool tf32, long long budget) {
    if (batch <= 0 || !input_grad_is_a_convolution(g) ||
        !swapped::applies(out_channels, g, engine, tf32) ||
        swapped::chunk_images(batch, out_channels, g, budget) == 0 ||
        swapped::tiles(g, batch) > kMaxInt32Count)  // (v4 would then run in chunks, apart)
        return 0;
    const MinAddMulGrads layout =
        min_add_mul_conv_grads_layout(batch, out_channels, g, engine, budget);
    return layout.part + layout.packed_weights <= budget ? layout.total() : 0;
}

cudaError_t min_add_mul_conv_grads_launch(const float* dy, const uint8_t* halves, const float* x,
                                          const float* weight, float factor, float* dx,
                                          float* dw, float* bias_grad, float* conv_bias_grad,
                                          int batch, int out_channels, const Conv2dGeometry& g,
                                          TensorCorePath engine, long long budget,
                                          void* workspace, cudaStream_t stream) {
    const MinAddMulGrads layout =
        min_add_mul_conv_grads_layout(batch, out_channels, g, engine, budget);
    auto* base = static_cast<uint8_t*>(workspace);
    auto* big = reinterpret_cast<float*>(base);
    auto* small = reinterpret_cast<float*>(base + layout.part);
    auto* sums = reinterpret_cast<float*>(base + 2 * layout.part);
    auto* packed = reinterpret_cast<float*>(base + 2 * layout.part + layout.sums);
    cudaError_t err = cudaSuccess;
    if (layout.one_pass) {
        const long long pieces = layout.pieces;
        const min_rule_operands::Outputs outputs{big, small, sums, sums + out_channels * pieces};
        err = weight_grad_implicit<float>(dy, x, dw, batch, out_channels, g, engine, false,
                                          base + layout.parts_end(), layout.weight_grad, stream,
                                          halves, factor, &outputs);
        if (err == cudaSuccess)
            err = min_add_mul_kept_sums_finish_launch(outputs.dy_partial, outputs.dx_partial,
                                                      factor, bias_grad, conv_bias_grad,
                                                      out_channels, pieces, stream);
    } else {
        err = min_add_mul_backward_kept_split_launch(dy, halves, big, small, bias_grad,
                                                     conv_bias_grad, batch, out_channels,
                                                     g.out_h * g.out_w, factor, sums, stream);
    }
    swapped::Params params;
    if (err == cudaSuccess)
        err = swapped::prepare(params, weight, out_channels, g, packed, stream);
    if (err == cudaSuccess)
        err = swapped::run_on_parts(params, big, small, dx, batch, out_channels, g, stream);
    if (err != cudaSuccess || layout.one_pass) return err;
    return weight_grad_implicit<float>(dy, x, dw, batch, out_channels, g, engine, false,
                                       base, layout.weight_grad, stream, halves,
                                       factor);
}

}  // namespace scratchops
