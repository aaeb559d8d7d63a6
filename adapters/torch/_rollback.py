"""Module state, recorded so that a failed pruning leaves modules exactly as they were."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch.nn.utils import prune as _tprune

_DICTS = ("_parameters", "_buffers", "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs")


def _record(module: torch.nn.Module) -> list[tuple[Any, Any]]:
    """What pruning may change in `module`, as (object, contents) pairs to put back.

    The module's attributes, its parameter, buffer and hook dictionaries (restored in
    place, so hook handles stay valid), the non-persistent buffer names, an RNN's
    ``_flat_weights`` and the method tuples of pruning containers among the hooks.
    """
    d = module.__dict__
    saved: list[tuple[Any, Any]] = [(d, dict(d))]
    saved += [(d[k], dict(d[k])) for k in _DICTS if isinstance(d.get(k), dict)]
    for key, kind in (("_non_persistent_buffers_set", set), ("_flat_weights", list)):
        if isinstance(d.get(key), kind):
            saved.append((d[key], kind(d[key])))
    hooks = d.get("_forward_pre_hooks", {}).values()
    saved += [(h, h.__dict__.get("_pruning_methods")) for h in hooks if isinstance(h, _tprune.PruningContainer)]
    return saved


def _restore(saved: list[tuple[Any, Any]]) -> None:
    for obj, contents in saved:
        if isinstance(obj, _tprune.PruningContainer):
            obj.__dict__.pop("_pruning_methods", None)
            if contents is not None:
                obj._pruning_methods = contents
        elif isinstance(obj, list):
            obj[:] = contents
        else:  # a dict or a set, in place
            obj.clear()
            obj.update(contents)


class Transaction:
    """Context manager: restore the given modules if the block raises."""

    def __init__(self, modules: Iterable[torch.nn.Module]):
        self.saved = [_record(m) for m in {id(m): m for m in modules}.values()]

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        if exc_type is not None:
            for saved in reversed(self.saved):
                _restore(saved)
        return False
