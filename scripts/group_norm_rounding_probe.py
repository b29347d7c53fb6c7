"""P85's bench shape in bf16 (the `bench --quick` P85 workload, seed 17): torch's group norm
against float32 group norm rounded once, and scratchops' group_norm / group_norm_scale against
both. Usage: python scripts/group_norm_rounding_probe.py"""
import torch, torch.nn.functional as F
import scratchops
from scratchops.tools import workloads
from scratchops.tools.timing import tf32_disabled
dt = torch.bfloat16
w = workloads.p85_one_pass_workloads(True)[0]
with tf32_disabled(), torch.no_grad():
    torch.manual_seed(17)
    i = {k: v.to(dt) for k, v in w.make_inputs().items()}
    x = F.conv2d(i["input"], i["weight"], i["conv_bias"])
    gm, bt, s = i["gamma"], i["beta"], i["s"]
    t = F.group_norm(x, 16, gm, bt, 1e-5)
    once = F.group_norm(x.float(), 16, gm.float(), bt.float(), 1e-5).to(dt)
    o = scratchops.group_norm(x, 16, gm, bt)
    print("group_norm bf16: torch vs fp32-rounded-once differ", (t != once).sum().item(), "ours vs torch", (o != t).sum().item(), "ours vs once", (o != once).sum().item(), "of", t.numel())
    ts = t * s; os_ = scratchops.group_norm_scale(x, 16, gm, bt, s)
    print("group_norm*s: ours vs torch", (os_ != ts).sum().item(), " ours vs bf16(ours_gn*s)", (os_ != o * s).sum().item(), " fp32 once", (os_ != (F.group_norm(x.float(),16,gm.float(),bt.float(),1e-5)*s.float()).to(dt)).sum().item())
    # mean / rstd of torch in fp32 vs float64
    xs = x.float().view(x.shape[0], 16, -1)
    print("x magnitude", x.abs().max().item(), "group means", xs.mean(-1).abs().max().item(), "stds", xs.std(-1).min().item())
