"""Module state, recorded so that a failed pruning leaves modules exactly as they were."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.nn.utils import prune as _tprune

_DICTS = ("_parameters", "_buffers", "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs")


def _record(module: torch.nn.Module) -> list[tuple[Any, Any]]:
    """(object, contents) pairs to put back: the module's attributes, its parameter, buffer
    and hook dictionaries (in place: hook handles stay valid), non-persistent buffer names,
    an RNN's ``_flat_weights``, and the methods of pruning containers among its hooks."""
    d = module.__dict__
    saved: list[tuple[Any, Any]] = [(d, dict(d)), *((d[k], dict(d[k])) for k in _DICTS if isinstance(d.get(k), dict))]
    for key, kind in (("_non_persistent_buffers_set", set), ("_flat_weights", list)):
        if isinstance(d.get(key), kind):
            saved.append((d[key], kind(d[key])))
    hooks = d.get("_forward_pre_hooks", {}).values()
    return saved + [(h, h.__dict__.get("_pruning_methods")) for h in hooks if isinstance(h, _tprune.PruningContainer)]


@contextmanager
def transaction(modules: Iterable[torch.nn.Module]) -> Iterator[None]:
    """Restore the given modules if the block raises."""
    saved = [_record(m) for m in {id(m): m for m in modules}.values()]
    try:
        yield
    except BaseException:
        for obj, contents in (pair for record in reversed(saved) for pair in record):
            if isinstance(obj, _tprune.PruningContainer):
                obj.__dict__.pop("_pruning_methods", None)
                if contents is not None:
                    obj._pruning_methods = contents
            elif isinstance(obj, list):
                obj[:] = contents
            else:  # a dict or a set, in place
                obj.clear()
                obj.update(contents)
        raise
