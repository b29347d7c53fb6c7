"""How far the implicit-GEMM conv (3xTF32) strays from float64, against torch fp32, over
many fresh random draws of each shape the tests use (the tests draw once per run, so a
shape near the 4x rule fails now and then; this shows the distribution).

    python3 scripts/accuracy_probe.py [draws [engine]]
        (default 40 draws, engine "auto": scratchops.set_tensor_core_path's names; sm_80+ GPU)

Per shape: the ratio max|ours - float64| / max(max|torch fp32 - float64|, 1 ulp of the
largest output), as tests/test_tensor_cores.py's assert_fp32_accurate counts it, on inputs
drawn as that test draws them (conv_inputs).
"""

import sys
from pathlib import Path

import torch.nn.functional as F

import scratchops
from scratchops.tools.timing import tf32_disabled

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_tensor_cores import CONV_CASES, conv_inputs, error_floor, max_err  # noqa: E402


def main(draws: str = "40", engine: str = "auto") -> int:
    n = int(draws)
    scratchops.set_tensor_core_path(engine)
    print(f"engine: {scratchops.tensor_core_engine()}")
    for x_shape, w_shape, stride, padding, dilation in CONV_CASES:
        ratios = []
        for _ in range(n):
            x, w, b = conv_inputs(x_shape, w_shape)
            args = (stride, padding, dilation)
            # TF32 off for both: scratchops follows torch's switch, and this probes 3xTF32.
            with tf32_disabled():
                ref32 = F.conv2d(x, w, b, *args)
                out = scratchops.conv2d(x, w, b, *args, algorithm="implicit_gemm")
            ref64 = F.conv2d(x.double(), w.double(), b.double(), *args)
            ratios.append(max_err(out, ref64) / error_floor(ref32, ref64))
        ratios.sort()
        k = w_shape[1] * w_shape[2] * w_shape[3]
        print(f"x {x_shape} w {w_shape} K {k}: median {ratios[n // 2]:.2f}  "
              f"p90 {ratios[(9 * n) // 10]:.2f}  max {ratios[-1]:.2f}  over 4x: "
              f"{sum(r > 4 for r in ratios)}/{n}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
