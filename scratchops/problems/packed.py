"""Packed conv weights kept across forwards (the tensor-core kernels read packed weights)."""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import is_fake

import scratchops


class PackedWeightCache:
    """conv2d_pack_weight(weight), packed again only when the weight changed: replaced (its
    storage), changed in place (its version counter: an optimizer step, load_state_dict) or
    moved. So a forward runs one kernel fewer. It returns None, and the operator packs on
    each call, under torch.compile (the cache's checks do not trace) and for an inference
    tensor (made under torch.inference_mode: it has no version counter to tell a change)."""

    def __init__(self):
        self._key = None
        self._packed = None

    def get(self, weight: torch.Tensor):
        if (torch.compiler.is_compiling() or weight.device.type != "cuda" or is_fake(weight)
                or weight.is_inference()):
            return None  # (meta and fake tensors trace shapes only: nothing to keep)
        key = (weight.data_ptr(), weight._version, weight.device, tuple(weight.shape))
        if key != self._key:
            self._packed = scratchops.conv2d_pack_weight(weight.detach())
            self._key = key
        return self._packed
