"""Drop-in replacement for :mod:`torch.nn.utils.prune`, with masks computed by arrayprune.

Replace ``import torch.nn.utils.prune as prune`` with
``import arrayprune.adapters.torch as prune``: every public name exists here with the
same signature and the same effect on modules, and every mask is computed by the
arrayprune core directly on the module's tensors, on their device (CPU tensors through
zero-copy NumPy views, CUDA tensors with tensor operations).

The reparametrization is PyTorch's, object for object: pruning ``module.<name>`` moves
the parameter (the same :class:`torch.nn.Parameter` object) to ``<name>_orig``, registers
the mask as the buffer ``<name>_mask`` (dtype of the parameter) and installs a forward
pre-hook that recomputes ``module.<name> = <name>_mask * <name>_orig`` before every
forward pass, so gradients reach ``<name>_orig`` and are zero where it is masked.
Pruning the same tensor again turns the hook into a :class:`PruningContainer` that holds
the methods in order; :func:`remove` makes the pruning permanent.

The classes derive from their counterparts in :mod:`torch.nn.utils.prune`, so code that
checks ``isinstance(hook, torch.nn.utils.prune.BasePruningMethod)`` (PyTorch's own
:func:`torch.nn.utils.prune.is_pruned` and :func:`torch.nn.utils.prune.remove` among
them) recognises modules pruned here, and the two libraries can prune the same tensor
one after the other.

Random methods. Without ``seed`` or ``generator``, :func:`random_unstructured`,
:func:`random_structured`, their classes (``apply``, ``compute_mask``, ``prune``,
inside a :class:`PruningContainer`) and :func:`global_unstructured` with
:class:`RandomUnstructured` reproduce PyTorch exactly: the same draws from PyTorch's
global generator (``torch.rand_like`` of the entries still in play, in the dtype and on
the device of the importance scores, or of their concatenation in global pruning;
``torch.rand(nchannels)`` on the CPU in the default dtype for the channels still in
play), selected with the same operations (``torch.topk``; ``torch.kthvalue`` and
``prob > threshold``), so the masks are PyTorch's bit for bit, ties in half precision
included, and the generator ends in the same state; nothing is drawn when nothing is
pruned, and invalid amounts or dims raise before any draw. Global pruning draws for the
remaining entries without concatenating the parameters. With a keyword-only ``seed`` or
``generator`` (not in PyTorch), arrayprune's own documented streams are used instead
(:mod:`arrayprune.rng`; ties by position), and PyTorch's global generator is not
touched; those masks differ from PyTorch's. With ``min_sparsity`` / ``max_sparsity``
(not in PyTorch), unseeded random global pruning draws arrayprune's stream (float32,
one array after another) from PyTorch's global generator.

Differences from PyTorch (everything not listed behaves as in PyTorch):

* a failure while pruning (in ``compute_mask`` or anywhere else) leaves the module exactly
  as it was: parameters, buffers, plain attributes, hooks and the hook's container
  (PyTorch drops the pruning hook of a container whose new method fails);
* pruned modules support :func:`copy.deepcopy` (PyTorch refuses with RuntimeError,
  because the pruned tensor ``module.<name>`` is not a leaf of the autograd graph);
* deterministic methods (L1, Ln) break ties by position (the lowest flat index or
  channel is pruned first), so the result is deterministic; PyTorch's choice among ties
  is that of ``torch.topk``. :func:`global_unstructured` with built-in methods never
  concatenates the parameters;
* non-contiguous tensors (transposed, channels-last) can be pruned by the unstructured
  methods; PyTorch raises RuntimeError (``view(-1)``). Random methods then draw as for a
  contiguous tensor, the numbers taken in row-major order;
* a ``bool`` amount counts as the integer 0 or 1 everywhere; PyTorch raises TypeError for
  ``amount=True`` in :func:`l1_unstructured`, :func:`random_unstructured`,
  :func:`random_structured` and :func:`global_unstructured` (after drawing, for the
  random methods);
* shape mismatches raise an exception that is both a :class:`ValueError` (as in the
  arrayprune core) and an :class:`AssertionError` (as in PyTorch);
* structured methods always refuse 1-D tensors (ValueError, before any draw); PyTorch's
  container, on a tensor pruned before, may instead raise IndexError or prune (and, for
  random_structured, draw for) a phantom dimension;
* ``n`` of :func:`ln_structured`: ``n=None`` raises ValueError (PyTorch: the 2-norm, as
  ``torch.norm(p=None)``); an unknown order (such as an unknown string) and ``n='nuc'``
  on a tensor that is not 3-D raise ValueError (PyTorch: RuntimeError); ``n='fro'`` over
  more than two dimensions is the 2-norm (PyTorch: RuntimeError);
* ``_validate_pruning_dim`` also rejects dims below ``-t.dim()`` (IndexError, as
  PyTorch's later indexing does);
* :func:`global_unstructured` accepts one-shot iterators and an empty list of
  parameters (PyTorch: ValueError from concatenating nothing), and leaves every module
  untouched if it fails part-way;
* :class:`PruningContainer` accepts several methods or one iterable of them, and ignores
  ``None`` (PyTorch: AttributeError for a lone iterable or ``None``).

A method object is its own forward pre-hook, as in PyTorch; masks are never tracked by
autograd (custom masks are stored detached).
"""

from __future__ import annotations

from ._compat import (
    _compute_norm,
    _compute_nparams_toprune,
    _validate_pruning_amount,
    _validate_pruning_amount_init,
    _validate_pruning_dim,
    _validate_structured_pruning,
)
from ._global import global_unstructured
from ._methods import (
    BlockUnstructured,
    CustomFromMask,
    Identity,
    L1Unstructured,
    LnStructured,
    NMStructured,
    RandomStructured,
    RandomUnstructured,
)
from ._reparam import BasePruningMethod, PruningContainer
from ._verbs import (
    block_unstructured,
    custom_from_mask,
    identity,
    is_pruned,
    l1_unstructured,
    ln_structured,
    nm_structured,
    prune_to_sparsity,
    random_structured,
    random_unstructured,
    remove,
)

__all__ = [
    "BasePruningMethod",
    "PruningContainer",
    "Identity",
    "RandomUnstructured",
    "L1Unstructured",
    "RandomStructured",
    "LnStructured",
    "CustomFromMask",
    "NMStructured",
    "BlockUnstructured",
    "identity",
    "random_unstructured",
    "l1_unstructured",
    "random_structured",
    "ln_structured",
    "global_unstructured",
    "custom_from_mask",
    "nm_structured",
    "block_unstructured",
    "prune_to_sparsity",
    "remove",
    "is_pruned",
]

_PRIVATE_HELPERS = (
    _validate_pruning_amount_init,
    _validate_pruning_amount,
    _compute_nparams_toprune,
    _validate_structured_pruning,
    _validate_pruning_dim,
    _compute_norm,
)

# The public names (and PyTorch's private helpers) belong to this package, wherever they
# are defined: pickles of pruned modules, reprs, help() and doctest name them
# ``arrayprune.adapters.torch.<name>`` (as numpy's ``set_module`` does).
for _obj in (*(globals()[_name] for _name in __all__), *_PRIVATE_HELPERS):
    _obj.__module__ = __name__
del _obj
