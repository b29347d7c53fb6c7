"""Which arithmetic torch's convolution gradients use when TF32 is allowed (cuDNN chooses by
shape, as for the forward: docs/tf32.md). For each shape, each gradient's largest distance to
float64 on the operands rounded to the nearest TF32 ("vs rounded") and on the exact operands
("vs exact"), relative to the gradient's largest value: TF32 products put "vs exact" near 1e-4
and "vs rounded" far below it; fp32 the other way round; near 1e-4 both ways, neither.
Usage (a GPU): python3 scripts/tf32_grad_probe.py
"""

import torch

from tf32_rule_probe import round_tf32  # (this folder: run as below)

SHAPES = [("p31 b8", (8, 64, 128, 128), (128, 64, 3, 3)),
          ("p85 b8", (8, 8, 128, 128), (64, 8, 3, 3)),
          ("test", (2, 40, 21, 37), (96, 40, 3, 3)),  # test_tensor_cores' TF32-gradient case
          ("cin3", (4, 3, 64, 64), (16, 3, 3, 3))]
GRADIENTS = {"dx": lambda x, w, dy: torch.nn.grad.conv2d_input(x.shape, w, dy),
             "dW": lambda x, w, dy: torch.nn.grad.conv2d_weight(x, w.shape, dy)}


def main():
    torch.backends.cudnn.allow_tf32 = True
    for name, x_shape, w_shape in SHAPES:
        x = torch.rand(x_shape, device="cuda") * 2 - 1
        w = (torch.rand(w_shape, device="cuda") * 2 - 1) / (w_shape[1] * 9) ** 0.5
        dy = torch.rand(torch.nn.functional.conv2d(x, w).shape, device="cuda") * 2 - 1
        for g, f in GRADIENTS.items():
            out = f(x, w, dy).double()
            rounded = f(*(round_tf32(t).double() for t in (x, w, dy)))
            exact = f(x.double(), w.double(), dy.double())
            scale = exact.abs().max().item()
            print(f"{name} {g}: vs rounded {(out - rounded).abs().max().item() / scale:.2e}  "
                  f"vs exact {(out - exact).abs().max().item() / scale:.2e}")


if __name__ == "__main__":
    main()
