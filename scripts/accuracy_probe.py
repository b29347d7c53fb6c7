"""How far the implicit-GEMM conv (3xTF32) strays from float64, against torch fp32, over
many fresh random draws of each shape the tests use (the tests draw once per run, so a
shape near the 4x rule fails now and then; this shows the distribution).

    python3 scripts/accuracy_probe.py [draws]      (default 40; needs an sm_90 GPU)

Per shape: the ratio max|ours - float64| / max(max|torch fp32 - float64|, 1 ulp of the
largest output), as tests/test_tensor_cores.py's assert_fp32_accurate counts it.
"""

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import scratchops

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_tensor_cores import CONV_CASES  # noqa: E402


def main(draws: str = "40") -> int:
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    n = int(draws)
    for x_shape, w_shape, stride, padding, dilation in CONV_CASES:
        ratios = []
        for _ in range(n):
            x = torch.rand(*x_shape, device="cuda")
            w = (torch.rand(*w_shape, device="cuda") * 2 - 1) / (
                w_shape[1] * w_shape[2] * w_shape[3]) ** 0.5
            b = torch.rand(w_shape[0], device="cuda") * 2 - 1
            args = (stride, padding, dilation)
            ref32 = F.conv2d(x, w, b, *args)
            ref64 = F.conv2d(x.double(), w.double(), b.double(), *args)
            out = scratchops.conv2d(x, w, b, *args, algorithm="implicit_gemm")
            ulp = torch.finfo(torch.float32).eps * ref64.abs().max().item()
            floor = max((ref32.double() - ref64).abs().max().item(), ulp)
            ratios.append((out.double() - ref64).abs().max().item() / floor)
        ratios.sort()
        k = w_shape[1] * w_shape[2] * w_shape[3]
        print(f"x {x_shape} w {w_shape} K {k}: median {ratios[n // 2]:.2f}  "
              f"p90 {ratios[(9 * n) // 10]:.2f}  max {ratios[-1]:.2f}  over 4x: "
              f"{sum(r > 4 for r in ratios)}/{n}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
