"""P85's kernels beside another tree's, in one GPU call.

    python3 scripts/p85_ab.py run TAG OUT.pt        (in each tree: PYTHONPATH picks it)
    python3 scripts/p85_ab.py compare A.pt B.pt
    python3 scripts/p85_ab.py backward IN.pt OUT.pt

run: the one pass's per-kernel GPU times at KernelBench's size (step_profile.py's profiler
loop) in fp32 (TF32 off), bf16 and fp16, and its outputs on five shapes in each dtype, saved.
backward: the fused backward (the keeping operator's backward) in the half types on three
shapes, from inputs and kept tensors that IN.pt holds (made by the first tree that runs it:
IN.pt absent), so that two trees' gradients of the same inputs compare bit for bit although
their forwards differ. compare: two OUT.pt files, bit for bit.
"""
import os
import sys

import torch

import scratchops
from scratchops.problems import PROBLEMS, build_pair
from scratchops.tools.timing import tf32_disabled

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from step_profile import kernel_ms  # noqa: E402  (the same profiler loop as the steps')


def compare(path_a, path_b):
    a, b = torch.load(path_a), torch.load(path_b)
    for key in a:
        x, y = a[key], b[key]
        bits = torch.int32 if x.dtype == torch.float32 else torch.int16
        if torch.equal(x.view(bits), y.view(bits)):
            print(key, "bitwise equal")
        else:
            print(key, f"DIFFER: {(x != y).sum().item()} values, max |d| "
                       f"{(x.float() - y.float()).abs().max().item():.3g}")


def backward(inputs_path, out_path):
    ops = torch.ops.scratchops
    try:
        cases = torch.load(inputs_path)
    except FileNotFoundError:
        cases = {}
        for dt in (torch.bfloat16, torch.float16):
            for shape in ((16, 8, 128, 128), (2, 8, 37, 70), (1, 3, 21, 18)):
                g = torch.Generator(device="cuda").manual_seed(11)
                cin = shape[1]
                cout = 8 if cin == 3 else 64
                r = lambda *s: torch.randn(*s, generator=g, device="cuda").to(dt)
                x, w, cb = r(*shape), r(cout, cin, 3, 3), r(cout)
                gw, gb, s = r(cout), r(cout), r(cout)
                groups = 4 if cin == 3 else 16
                _, extremes, stats = ops._conv2d_group_norm_pool_clamp_keeping(
                    x, w, cb, groups, gw, gb, s, 1e-5, -0.5, 0.5, 3)
                grad = r(*extremes.shape)
                cases[(str(dt), shape)] = [t.cpu() if torch.is_tensor(t) else t for t in
                                           (grad, x, w, cb, groups, gw, gb, s, extremes, stats)]
        torch.save(cases, inputs_path)
    outs = {}
    for key, args in cases.items():
        args = [t.cuda() if torch.is_tensor(t) else t for t in args]
        grads = ops._conv2d_group_norm_pool_clamp_backward_kept(*args, -0.5, 0.5)
        for i, t in enumerate(grads):
            outs[key + (i,)] = t.cpu()
    torch.save(outs, out_path)
    print("saved", len(outs), "gradients to", out_path)


if sys.argv[1] == "compare":
    compare(sys.argv[2], sys.argv[3])
    sys.exit(0)
if sys.argv[1] == "backward":
    scratchops.load()
    backward(sys.argv[2], sys.argv[3])
    sys.exit(0)
scratchops.load()
module = PROBLEMS["p85"]
tag, path = sys.argv[2], sys.argv[3]
for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)):
    _, m = build_pair(module, "one_pass", seed=0)
    torch.manual_seed(1)
    x = module.get_inputs()[0].cuda().to(dt)
    m = m.to(dt)
    with torch.no_grad(), tf32_disabled():
        kernels = kernel_ms(lambda: m(x))
    print(f"== {name} {tag}  total {sum(ms for ms, _ in kernels.values()):.4f} ms")
    for k, (ms, _) in sorted(kernels.items(), key=lambda kv: -kv[1][0]):
        if ms > 0.0005:
            print(f"  {k[:90]:90s} {ms:.4f} ms")
outs = {}
for dt in (torch.float32, torch.bfloat16, torch.float16):
    for shape, mean in (((128, 8, 128, 128), 0.0), ((2, 8, 21, 18), 0.0), ((1, 8, 14, 23), 4.0),
                        ((3, 8, 37, 70), 0.0), ((2, 3, 11, 10), 0.0)):
        g = torch.Generator(device="cuda").manual_seed(7)
        cin = shape[1]
        cout, groups = (8, 4) if cin == 3 else (64, 16)
        r = lambda *s: torch.randn(*s, generator=g, device="cuda")
        x = (r(*shape) + mean).to(dt)
        w, cb = (r(cout, cin, 3, 3) * 0.2).to(dt), r(cout).to(dt)
        gw, gb, s = r(cout).to(dt), r(cout).to(dt), r(cout, 1, 1).to(dt)
        with tf32_disabled():
            out = scratchops.conv2d_group_norm_pool_clamp(x, w, cb, groups, gw, gb, s, 1e-5,
                                                          -0.5, 0.5)
        outs[(str(dt), shape)] = out.cpu()
torch.save(outs, path)
print("saved", len(outs), "outputs to", path)
