"""The two KernelBench level-2 problems, each with Model (torch) and ModelNew (scratchops)."""

from . import conv_groupnorm_scale_maxpool_clamp, conv_min_add_multiply

# Short names used by `scratchops run --problem`.
PROBLEMS = {
    "p85": conv_groupnorm_scale_maxpool_clamp,
    "p31": conv_min_add_multiply,
}


def build_pair(module, variant: str, seed: int, device: str = "cuda", init=None,
               load_state: bool = True):
    """(Model, ModelNew(variant)) of a problem module with equal parameters, in eval mode on
    `device`: both built after the same seed, as KernelBench evaluates (ModelNew subclasses
    Model, so they draw their parameters in the same order), and Model's state_dict loaded
    into ModelNew as well (strictly), which makes equal parameters certain. `init`: the
    constructor arguments (default: the module's get_init_inputs(), KernelBench's);
    load_state=False leaves the seed alone to make them equal (KernelBench's own check)."""
    import torch

    init = module.get_init_inputs() if init is None else init
    torch.manual_seed(seed)
    model = module.Model(*init).to(device).eval()
    torch.manual_seed(seed)
    model_new = module.ModelNew(*init, **module.VARIANTS[variant]).to(device).eval()
    if load_state:
        model_new.load_state_dict(model.state_dict())
    return model, model_new
