"""Drop-in replacement for :mod:`torch.nn.utils.prune`, with masks computed by arrayprune.

``import arrayprune.adapters.torch as prune`` instead of ``import torch.nn.utils.prune as
prune``: the same names, signatures (random methods also take a keyword-only ``seed`` or
``generator``), reparametrization and masks, computed by the arrayprune core on the
module's tensors, on their device; the classes derive from PyTorch's. There is one class
and one verb per method of :data:`arrayprune.METHODS` (in ``_methods``, written from
that table by ``tools/write_verbs.py``). How, and the differences from PyTorch:
``docs/torch-dropin.md``.

Examples
--------
>>> import torch.nn as nn
>>> import arrayprune.adapters.torch as prune
>>> m = prune.l1_unstructured(nn.Linear(2, 3), "weight", amount=0.5)
>>> sorted(m.state_dict()), int((m.weight_mask == 0).sum())
(['bias', 'weight_mask', 'weight_orig'], 3)
>>> prune.custom_from_mask(m, "bias", mask=[0, 1, 0]).bias_mask
tensor([0., 1., 0.])
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import _compat, _methods
from ._base import BasePruningMethod, PruningContainer
from ._compat import *  # noqa: F403 (PyTorch's private helpers)
from ._methods import *  # noqa: F403 (one class and one verb per method of the table)
from ._verbs import global_unstructured, is_pruned, prune_to_sparsity, remove
from .calibration import input_norms, save_input_norms, wanda_importance
from .reconstruction import reconstruct, sparsegpt
from .shrink import channel_groups, shrink

if TYPE_CHECKING:  # loaded by __getattr__ on first use
    from .llm import shrink_llm

__all__ = [
    "BasePruningMethod",
    "PruningContainer",
    *_methods.__all__,
    "global_unstructured",
    "prune_to_sparsity",
    "remove",
    "is_pruned",
    "input_norms",
    "save_input_norms",
    "wanda_importance",
    "reconstruct",
    "sparsegpt",
    "shrink",
    "channel_groups",
    "shrink_llm",
]

# Public names and PyTorch's private helpers belong to this package wherever they are
# defined: pickles, reprs, help() and doctest name them ``arrayprune.adapters.torch.<name>``.
for _name in (*__all__, *_compat.__all__):
    if _name != "shrink_llm":  # loaded on first use (it imports the file pipeline, which imports this package)
        globals()[_name].__module__ = __name__
del _name


def __getattr__(name: str) -> Any:
    """``shrink_llm`` on first use: :mod:`.llm` runs the file pipeline, which imports this package."""
    if name == "shrink_llm":
        from .llm import shrink_llm

        globals()[name] = shrink_llm
        return shrink_llm
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
