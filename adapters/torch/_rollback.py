"""Module state, recorded so that a failed pruning leaves modules exactly as they were."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch.nn.utils import prune as _tprune

_STATE_DICTS = ("_parameters", "_buffers", "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs")


class _ModuleState:
    """What pruning may change in a module, recorded so that it can be put back.

    Covers the plain attributes (``module.<name>``), the parameter, buffer and
    forward-pre-hook dictionaries (restored in place, keeping their order and identity,
    so hook handles stay valid), the non-persistent buffer names, an RNN's
    ``_flat_weights`` list, and the method tuples of pruning containers among the hooks.
    """

    def __init__(self, module: torch.nn.Module):
        self.module = module
        d = module.__dict__
        self.attrs = dict(d)
        self.dicts = [(d[k], list(d[k].items())) for k in _STATE_DICTS if isinstance(d.get(k), dict)]
        nonpersistent = d.get("_non_persistent_buffers_set")
        self.nonpersistent = (nonpersistent, set(nonpersistent)) if isinstance(nonpersistent, set) else None
        flat = d.get("_flat_weights")
        self.flat = (flat, list(flat)) if isinstance(flat, list) else None
        hooks = d.get("_forward_pre_hooks", {})
        self.containers = [
            (h, h.__dict__.get("_pruning_methods"))
            for h in hooks.values()
            if isinstance(h, _tprune.PruningContainer)
        ]

    def restore(self) -> None:
        d = self.module.__dict__
        for key in [k for k in d if k not in self.attrs]:
            del d[key]
        d.update(self.attrs)
        for obj, items in self.dicts:
            obj.clear()
            obj.update(items)
        if self.nonpersistent is not None:
            obj, items = self.nonpersistent
            obj.clear()
            obj.update(items)
        if self.flat is not None:
            obj, items = self.flat
            obj[:] = items
        for container, methods in self.containers:
            if methods is None:
                container.__dict__.pop("_pruning_methods", None)
            else:
                container._pruning_methods = methods


class _Transaction:
    """Context manager: restore the given modules if the block raises."""

    def __init__(self, modules: Iterable[torch.nn.Module]):
        unique = {id(m): m for m in modules}
        self.states = [_ModuleState(m) for m in unique.values()]

    def __enter__(self) -> _Transaction:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is not None:
            for state in reversed(self.states):
                state.restore()
        return False
