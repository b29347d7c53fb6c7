"""The two KernelBench level-2 problems, each with Model (torch) and ModelNew (scratchops)."""

from . import conv_groupnorm_scale_maxpool_clamp, conv_min_add_multiply

# Short names used by `scratchops run --problem`.
PROBLEMS = {
    "p85": conv_groupnorm_scale_maxpool_clamp,
    "p31": conv_min_add_multiply,
}
