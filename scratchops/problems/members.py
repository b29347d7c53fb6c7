"""nn.Module members read without nn.Module.__getattr__'s slow path.

A ModelNew forward reads several submodules and parameters a call (P85's: ten). None of them is
in the instance's __dict__, so each `self.conv` or `conv.weight` first fails inside Python's
attribute lookup (an AttributeError raised and caught) before nn.Module.__getattr__ searches
_parameters, _buffers and _modules: about 1 µs a lookup on a CPU where a dict lookup costs
0.1, a fifth of P85's whole ModelNew host time (docs/call-path.md). member() reads those
tables in __getattr__'s order and falls back to getattr where the name is in none of them (a
parametrization's property, a plain attribute), so it returns what getattr returns; under
torch.compile it is getattr itself (the tracer follows attribute access as it is).
"""

from __future__ import annotations

from torch.compiler import is_compiling

_MISSING = object()


def member(module, name: str):
    """getattr(module, name), without the failed lookup in front of nn.Module.__getattr__."""
    if not is_compiling():
        for table in (module._parameters, module._buffers, module._modules):
            value = table.get(name, _MISSING)
            if value is not _MISSING:
                return value
    return getattr(module, name)
