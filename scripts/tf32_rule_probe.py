"""Which fp32 convolutions (and matmuls) does torch compute in TF32 when TF32 is allowed?

torch's switches only *allow* TF32: cuDNN then picks an algorithm by its own heuristics, and
some of those stay fp32. scratchops follows the switches by reproducing that choice, so the
choice has to be measured. For each shape this script runs torch's convolution with TF32
allowed and classifies the result by what it agrees with:

  tf32  a float64 convolution of the inputs and weights rounded to TF32 to nearest
        (ties away from zero: add 0x1000 to the bits, clear the low 13);
  fp32  a float64 convolution of the unrounded inputs;
  other neither (printed with both distances).

Errors are relative to the largest |x| * |w| sum of an output (a float64 convolution of the
magnitudes), so one scale serves every shape. The grid covers input channels, output
channels, kernel sizes, image sizes and batch sizes; a random fuzz adds strides, paddings and
dilations. Matmuls are classified the same way (tf32 to nearest, tf32 truncated, fp32).

Usage (on a GPU): python3 scripts/tf32_rule_probe.py [--json PATH] [--seconds S]
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
import time

import torch
import torch.nn.functional as F

from scratchops.tools.report import ATOL, RTOL
from scratchops.versions import conv2d_uses_tf32


def round_tf32(t: torch.Tensor, nearest: bool = True) -> torch.Tensor:
    """fp32 -> TF32 (10 mantissa bits) as fp32 bits: to nearest, ties away, or truncated."""
    bits = t.contiguous().view(torch.int32)
    if nearest:
        bits = bits + 0x1000
    return (bits & ~0x1FFF).view(torch.float32)


def classify(out: torch.Tensor, ref: torch.Tensor, ref_rn: torch.Tensor, scale: float,
             ref_rz: torch.Tensor | None = None) -> tuple[str, dict]:
    err = {"fp32": float((out.double() - ref).abs().max()) / scale,
           "tf32": float((out.double() - ref_rn).abs().max()) / scale}
    if ref_rz is not None:
        err["tf32_rz"] = float((out.double() - ref_rz).abs().max()) / scale
    best = min(err, key=err.get)
    others = [v for k, v in err.items() if k != best]
    return (best if err[best] * 8 < min(others) else "other"), err


def conv_case(n, cin, cout, k, hw, stride=1, padding=0, dilation=1, seed=0) -> dict:
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.rand(n, cin, hw, hw, device="cuda", generator=g)
    bound = 1.0 / (cin * k * k) ** 0.5
    w = (torch.rand(cout, cin, k, k, device="cuda", generator=g) * 2 - 1) * bound
    torch.backends.cudnn.allow_tf32 = True
    out = F.conv2d(x, w, None, stride, padding, dilation)
    torch.backends.cudnn.allow_tf32 = False
    out_off = F.conv2d(x, w, None, stride, padding, dilation)
    args = (None, stride, padding, dilation)
    ref = F.conv2d(x.double(), w.double(), *args)
    ref_rn = F.conv2d(round_tf32(x).double(), round_tf32(w).double(), *args)
    scale = float(F.conv2d(x.double().abs(), w.double().abs(), *args).max())
    kind, err = classify(out, ref, ref_rn, scale)
    kind_off, _ = classify(out_off, ref, ref_rn, scale)
    # What scratchops computes under its rule (versions.conv2d_uses_tf32), emulated in float64,
    # and whether that is allclose to torch's result as KernelBench compares.
    rule = conv2d_uses_tf32(cin, k, k, True)
    ours = (ref_rn if rule else ref).float()
    agrees = bool(torch.allclose(ours, out, atol=ATOL, rtol=RTOL))
    return {"n": n, "cin": cin, "cout": cout, "k": k, "hw": hw, "stride": stride,
            "padding": padding, "dilation": dilation, "allowed": kind, "off": kind_off,
            "err": err, "rule_tf32": rule, "rule_agrees": agrees}


def matmul_case(m, k, n, seed=0) -> dict:
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.rand(m, k, device="cuda", generator=g) * 2 - 1
    b = torch.rand(k, n, device="cuda", generator=g) * 2 - 1
    torch.backends.cuda.matmul.allow_tf32 = True
    out = a @ b
    torch.backends.cuda.matmul.allow_tf32 = False
    ref = a.double() @ b.double()
    ref_rn = round_tf32(a).double() @ round_tf32(b).double()
    ref_rz = round_tf32(a, False).double() @ round_tf32(b, False).double()
    scale = float((a.double().abs() @ b.double().abs()).max())
    kind, err = classify(out, ref, ref_rn, scale, ref_rz)
    return {"m": m, "k": k, "n": n, "allowed": kind, "err": err}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None)
    parser.add_argument("--seconds", type=float, default=240.0)
    parser.add_argument("--fuzz", type=int, default=300)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
          f"{torch.cuda.get_device_name()}", flush=True)

    grid = list(itertools.product((1, 8, 128), (1, 2, 3, 4, 8, 12, 16, 32, 64, 128, 256),
                                  (1, 8, 64, 128, 256), (1, 3, 5, 7), (8, 32, 128)))
    rng = random.Random(0)
    fuzz = []
    for _ in range(args.fuzz):
        k = rng.choice((1, 2, 3, 4, 5, 7))
        fuzz.append((rng.choice((1, 2, 5, 16, 64)), rng.randint(1, 160), rng.randint(1, 200), k,
                     rng.randint(8, 96), rng.choice((1, 1, 2, 3)), rng.randint(0, 3),
                     rng.choice((1, 1, 2))))
    start = time.time()
    conv = []
    for i, case in enumerate([c + (1, 0, 1) for c in grid] + fuzz):
        n, cin, cout, k, hw, stride, padding, dilation = case
        span = dilation * (k - 1) + 1
        out_hw = (hw + 2 * padding - span) // stride + 1
        flops = 2 * n * cout * out_hw**2 * cin * k * k
        if out_hw < 1 or flops > 4e11 or n * max(cin, cout) * hw * hw > 2**28:
            continue
        if time.time() - start > args.seconds:
            print(f"time budget reached after {i} cases", flush=True)
            break
        conv.append(conv_case(*case, seed=i))
    mm = [matmul_case(*s) for s in ((64, 64, 64), (512, 576, 512), (1000, 72, 300),
                                    (4096, 4096, 4096), (127, 4097, 33))]

    counts = {}
    for c in conv:
        counts[(c["allowed"], c["off"])] = counts.get((c["allowed"], c["off"]), 0) + 1
    print("conv cases:", len(conv), "(allowed, off) ->", counts)
    # Per input channel count and kernel: the share computed in TF32.
    by = {}
    for c in conv:
        key = (c["cin"], c["k"])
        t, tot = by.get(key, (0, 0))
        by[key] = (t + (c["allowed"] == "tf32"), tot + 1)
    print("cin k : tf32 / cases")
    for key in sorted(by):
        print(f"  {key[0]:4d} {key[1]} : {by[key][0]} / {by[key][1]}")
    print("cases that are neither (or fp32 with TF32 off is not fp32):")
    for c in conv:
        if c["allowed"] == "other" or c["off"] != "fp32":
            print("  ", c)
    for c in mm:
        print("matmul", c)
    fuzz_start = sum(1 for c in conv if (c["stride"], c["padding"], c["dilation"]) == (1, 0, 1)
                     and c["hw"] in (8, 32, 128) and c["n"] in (1, 8, 128))
    for name, cases in (("grid", conv[:fuzz_start]), ("fuzz", conv[fuzz_start:]),
                        ("all", conv)):
        share = sum(c["rule_agrees"] for c in cases) / max(1, len(cases))
        print(f"the rule (TF32 iff Cin*kh*kw >= 128) is allclose to torch on {share:.1%} "
              f"of the {name} shapes ({len(cases)})")
    for label, case in (("P31", (128, 64, 128, 3, 128)), ("P85", (128, 8, 64, 3, 128))):
        c = conv_case(*case)
        print(f"{label} {case}: torch computes {c['allowed']}, the rule says "
              f"{'tf32' if c['rule_tf32'] else 'fp32'}, allclose: {c['rule_agrees']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
                       "gpu": torch.cuda.get_device_name(), "conv": conv, "matmul": mm}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
