"""The functional interface: one verb per method of :data:`arrayprune.METHODS`, and the others."""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch.nn.utils import prune as _tprune

import arrayprune.schedules as _schedules
from arrayprune.registry import make_verb

from ._apply import apply_method, pruning_hooks
from ._methods import CLASSES, LEADING, PACKAGE, extended, torch_counterpart

_DOC = """Prune ``module.<name>`` with :class:`{cls}`; return `module`, modified in place.

{origin}On a pruned tensor, only what remains is pruned; on any failure, the module is
left as it was.

Parameters
----------
module : torch.nn.Module
    Module holding the tensor.
name : str
    Name of the parameter within `module`.
{parameters}
"""
_SCORES = """importance_scores : torch.Tensor, optional
    Scores ranking the entries instead of the parameter, same shape.
"""


def _call(method: Any, module: torch.nn.Module, name: str, importance_scores: Any = None) -> torch.nn.Module:
    apply_method(module, name, method, importance_scores)
    return module


def method_verb(name: str, cls: type) -> Any:
    """The verb `name` of adapter class `cls`, with PyTorch's signature (extended) if PyTorch has it."""
    theirs = torch_counterpart(name)
    signature = extended(inspect.signature(theirs), cls._CORE) if callable(theirs) else None
    doc = _DOC.replace("{origin}", "" if signature else "Not in :mod:`torch.nn.utils.prune`. ")
    doc += _SCORES if cls._CORE.USES_SCORES else ""
    kwargs = {"leading": LEADING, "scores": "positional", "doc": doc, "module": PACKAGE, "signature": signature}
    return make_verb(cls, name, _call, **kwargs)


VERBS: dict[str, Any] = {name: method_verb(name, cls) for name, cls in CLASSES.items()}


def prune_to_sparsity(
    module: torch.nn.Module,
    name: str,
    sparsity: float,
    pruning_method: type = CLASSES["l1_unstructured"],
    importance_scores: torch.Tensor | None = None,
    **kwargs: Any,
) -> torch.nn.Module:
    """Prune just enough more of ``module.<name>`` that a fraction `sparsity` is pruned.

    Not in :mod:`torch.nn.utils.prune`: a step of gradual pruning, with
    ``schedule(step)`` (:class:`arrayprune.PolynomialDecay`, ...). Units already pruned
    count and stay pruned; `pruning_method` (of an amount) is applied with an integer
    amount, `importance_scores` and `kwargs` (``n``, ``dim``, ...). Returns `module`.

    Examples
    --------
    >>> import arrayprune, torch.nn as nn
    >>> import arrayprune.adapters.torch as prune
    >>> m, schedule = nn.Linear(10, 10), arrayprune.PolynomialDecay(0.0, 0.9, 0, 100)
    >>> for step in range(0, 101, 10):
    ...     _ = prune.prune_to_sparsity(m, "weight", schedule(step))
    >>> int((m.weight_mask == 0).sum())
    90
    """
    probe = pruning_method(0, **kwargs)
    mask = getattr(module, name + "_mask", None)
    extra = _schedules.units_to_prune(getattr(module, name).detach(), sparsity, mask, getattr(probe, "_core", probe))
    apply_method(module, name, pruning_method(amount=extra, **kwargs), importance_scores)
    return module


def remove(module: torch.nn.Module, name: str) -> torch.nn.Module:
    """Make the pruning of ``module.<name>`` permanent (ValueError if not pruned); return `module`.

    The pruned values go into the original parameter, which becomes ``module.<name>`` again.
    """
    for key, hook in pruning_hooks(module, name):
        hook.remove(module)
        del module._forward_pre_hooks[key]
        return module
    raise ValueError(f"Parameter '{name}' of module {module} has to be pruned before pruning can be removed")


def is_pruned(module: torch.nn.Module) -> bool:
    """Whether `module` or a submodule has a pruning hook (of either library)."""
    hooks = (hook for submodule in module.modules() for hook in submodule._forward_pre_hooks.values())
    return any(isinstance(hook, _tprune.BasePruningMethod) for hook in hooks)
