"""Drop-in replacement for :mod:`torch.nn.utils.prune`, with masks computed by arrayprune.

Replace ``import torch.nn.utils.prune as prune`` with
``import arrayprune.adapters.torch as prune``: every public name exists with the same
signature (random methods also take a keyword-only ``seed`` or ``generator``) and the
same effect on modules, with masks computed by the arrayprune core on the module's own
tensors, on their device. The reparametrization is PyTorch's, object for object
(``<name>_orig``, the buffer ``<name>_mask``, a forward pre-hook, a
:class:`PruningContainer` when pruning again, :func:`remove`), and the classes derive
from PyTorch's, so either library's ``is_pruned`` and ``remove`` work on modules
pruned by the other. Unseeded random methods draw exactly as PyTorch does.

One class and one verb exist for every method of :data:`arrayprune.METHODS`, made from
that table. The differences from PyTorch are listed in ``docs/torch-dropin.md``.

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

from arrayprune.registry import METHODS as _METHODS

from . import _compat
from ._base import BasePruningMethod, PruningContainer
from ._compat import *  # noqa: F403 (PyTorch's private helpers)
from ._methods import CLASSES as _CLASSES
from ._methods import VERBS as _VERBS
from ._verbs import global_unstructured, is_pruned, prune_to_sparsity, remove

globals().update({cls.__name__: cls for cls in _CLASSES.values()}, **_VERBS)

__all__ = [
    "BasePruningMethod",
    "PruningContainer",
    *(cls.__name__ for cls in _CLASSES.values()),
    *_METHODS,
    "global_unstructured",
    "prune_to_sparsity",
    "remove",
    "is_pruned",
]

# Public names and PyTorch's private helpers belong to this package wherever they are
# defined: pickles, reprs, help() and doctest name them ``arrayprune.adapters.torch.<name>``.
for _name in (*__all__, *_compat.__all__):
    globals()[_name].__module__ = __name__
del _name
