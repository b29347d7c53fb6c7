// tensor_core_launch.cuh — one tensor-core product on the engine a call names (launchers.h:
// TensorCorePath): Hopper's wgmma engine (tf32x3.cuh) or the mma.sync one for every sm_80+
// GPU (mma_sync_3xtf32.cuh). Both take the same loader, epilogue and packed B, so the kernel
// files choose an engine with one argument.
#pragma once

#include <cstdint>

#include "launchers.h"
#include "mma_sync_3xtf32.cuh"
#include "tf32x3.cuh"

namespace scratchops {

// tf32x3::launch's arguments; STAGES is the wgmma engine's ring depth (mma.sync's is its own).
// Op: the operand type (tensor_core_operands.cuh's Operand); the native 16-bit products are
// the wgmma engine's alone (cudaErrorInvalidValue on mma.sync: the callers choose them only
// there, tensor_cores_native16 in launchers.h). b_source: where present(), B is packed from it
// into `packed` by the launch (inside the kernel on the wgmma engine: tf32x3::launch; with
// pack_b's kernel first on mma.sync).
template <int BN, int MB, int STAGES, int kGroup = 1, bool kTf32 = false, class Op = float,
          class ALoader, class Epilogue, class BSource = tc::PackedAlready>
cudaError_t tensor_core_launch(TensorCorePath engine, const ALoader& loader,
                               const Epilogue& epilogue, const uint8_t* packed,
                               const tc::PackedB& layout, int m_rows, int batch,
                               bool b_shared, cudaStream_t stream,
                               const BSource& b_source = BSource{}) {
    if constexpr (tc::Operand<Op>::kNative16) {
        if (engine != TensorCorePath::kWgmma) return cudaErrorInvalidValue;
    } else if (engine == TensorCorePath::kMmaSync) {  // (one CTA a tile: packed first)
        return tc::launch_packing_b<BN, Op, false>(
            b_source, packed, layout, 0, false, stream, [&](bool, int) {
                return mma_sync::launch<BN, MB, kGroup, kTf32>(loader, epilogue, packed, layout,
                                                               m_rows, batch, b_shared, stream);
            });
    }
    return tf32x3::launch<BN, MB, STAGES, kGroup, kTf32, Op>(
        loader, epilogue, packed, layout, m_rows, batch, b_shared, stream, true, b_source);
}

}  // namespace scratchops
