"""P85's bench shape in bf16 (the `bench --quick` P85 workload's inputs after seed 17): torch's
group norm against float32 group norm rounded once, and scratchops' group_norm / group_norm_scale
against both. Usage: python scripts/group_norm_rounding_probe.py"""

import torch
import torch.nn.functional as F

import scratchops
from scratchops.tools.timing import tf32_disabled
from scratchops.tools.workloads import GROUP_NORM_EPS, P85_GROUPS, p85_one_pass_workloads

DTYPE = torch.bfloat16
with tf32_disabled(), torch.no_grad():
    torch.manual_seed(17)
    i = {k: v.to(DTYPE) for k, v in p85_one_pass_workloads(True)[0].make_inputs().items()}
    x = F.conv2d(i["input"], i["weight"], i["conv_bias"])
    gamma, beta, s = i["gamma"], i["beta"], i["s"]
    torch_gn = F.group_norm(x, P85_GROUPS, gamma, beta, GROUP_NORM_EPS)
    fp32_gn = F.group_norm(x.float(), P85_GROUPS, gamma.float(), beta.float(), GROUP_NORM_EPS)
    once = fp32_gn.to(DTYPE)
    ours = scratchops.group_norm(x, P85_GROUPS, gamma, beta, GROUP_NORM_EPS)
    print("group_norm bf16: torch vs fp32-rounded-once differ", (torch_gn != once).sum().item(),
          "ours vs torch", (ours != torch_gn).sum().item(), "ours vs once",
          (ours != once).sum().item(), "of", torch_gn.numel())
    ours_scaled = scratchops.group_norm_scale(x, P85_GROUPS, gamma, beta, s, GROUP_NORM_EPS)
    print("group_norm*s: ours vs torch", (ours_scaled != torch_gn * s).sum().item(),
          " ours vs bf16(ours_gn*s)", (ours_scaled != ours * s).sum().item(), " fp32 once",
          (ours_scaled != (fp32_gn * s.float()).to(DTYPE)).sum().item())
    groups = x.float().view(x.shape[0], P85_GROUPS, -1)  # the data's scale
    print("x magnitude", x.abs().max().item(), "group means", groups.mean(-1).abs().max().item(),
          "stds", groups.std(-1).min().item())
