"""Pruning of mappings of names to arrays, in the state-dict convention of PyTorch.

The verbs of :mod:`torch.nn.utils.prune`, applied to one entry of a mapping (a PyTorch
``state_dict``, the arrays of an ``.npz`` or ``.safetensors`` file, a Flax parameter
tree, ...) instead of a parameter of a module.

Contract
--------
* **Nothing is mutated.** Every function returns a *new* mapping and leaves its input
  as it was, so immutable mappings (Flax ``FrozenDict``, ``MappingProxyType``) and
  immutable arrays (JAX) work as well as ``dict`` and NumPy. Entries that are not
  touched are shared with the input, not copied. The result has the type of the input
  mapping where that type can be built from a ``dict`` (``dict``, ``OrderedDict``,
  ``FrozenDict``, ``MappingProxyType``), a ``dict`` otherwise; the ``_metadata``
  attribute of a PyTorch ``state_dict`` is carried over.
* **Pruned state is the PyTorch state-dict convention.** Pruning the entry ``key``
  replaces it with ``key_orig`` (the original array, unchanged) and ``key_mask`` (the
  mask), at the position ``key`` had; the effective array ``key_orig * key_mask`` is
  *not* stored, exactly as in the ``state_dict`` of a module pruned with
  :mod:`torch.nn.utils.prune`. :func:`apply_masks` gives the effective arrays, and
  :func:`remove` folds the mask of one entry back into ``key``.
* **Masks** have the dtype of the existing ``key_mask`` entry when there is one, and the
  dtype of the array otherwise (float for float weights, as PyTorch saves them), so
  that the result loads with ``load_state_dict`` into a module pruned with
  :mod:`torch.nn.utils.prune`.
* **Iterative pruning** of an entry that is already pruned combines masks exactly as a
  :class:`~arrayprune.PruningContainer` does: the new method acts only on what the
  existing mask leaves (remaining entries, or remaining channels), and ranks the
  original array (``key_orig``), as PyTorch does.
* **Arrays** may come from any Array API library (NumPy, PyTorch, JAX, CuPy, ...); masks
  are computed in that library, on the array's device, and stay there.
* **Errors** are raised before anything is built: :class:`KeyError` for a key that
  names no array, the core's :class:`TypeError` / :class:`ValueError` for bad amounts,
  dimensions or shapes.

Keys and paths
--------------
A key names one array:

* a ``str`` that is a key of the top-level mapping (``"fc1.weight"``), or whose
  ``_orig`` / ``_mask`` entries are, is used as it is;
* otherwise a ``str`` containing ``"/"`` is a path into nested mappings:
  ``"params/Dense_0/kernel"`` is ``params["params"]["Dense_0"]["kernel"]``;
* a ``tuple`` is always a path, one element per level:
  ``("params", "Dense_0", "kernel")``; use it when a key contains ``"/"`` itself.

The ``_orig`` / ``_mask`` entries of a nested array live beside it, in the same
sub-mapping (``params["params"]["Dense_0"]["kernel_mask"]``).

Examples
--------
>>> import numpy as np
>>> from arrayprune.adapters import mapping as mp
>>> sd = {"fc.weight": np.array([[0.5, 0.1], [0.2, -2.0]], dtype=np.float32)}
>>> pruned = mp.l1_unstructured(sd, "fc.weight", amount=2)
>>> sorted(pruned)
['fc.weight_mask', 'fc.weight_orig']
>>> pruned["fc.weight_mask"]
array([[1., 0.],
       [0., 1.]], dtype=float32)
>>> mp.apply_masks(pruned)["fc.weight"]
array([[ 0.5,  0. ],
       [ 0. , -2. ]], dtype=float32)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import arrayprune as ap
from arrayprune import methods as M
from arrayprune.adapters.state_dict import (
    MASK_SUFFIX,
    ORIG_SUFFIX,
    _Entry,
    _fold,
    _with_mask,
    apply_masks,
    is_pruned,
    iter_arrays,
    iter_entries,
    pruned_keys,
)
from arrayprune.adapters.trees import (
    MAX_DEPTH,
    MAX_ENTRIES,
    Key,
    Path,
    TreeError,
    _name,
    _node,
    _rebuild,
    _replace_at,
    check_tree,
)
from arrayprune.functional import mask_for
from arrayprune.global_pruning import global_unstructured as _core_global_unstructured
from arrayprune.method_parts import solver_of
from arrayprune.registry import METHODS
from arrayprune.schedules import prune_to_sparsity as _core_prune_to_sparsity

__all__ = [
    "prune",
    *(name for name, cls in METHODS.items() if solver_of(cls) is None),  # the verbs below
    "prune_to_sparsity",
    "global_unstructured",
    "remove",
    "is_pruned",
    "pruned_keys",
    "apply_masks",
    "replace",
    "iter_arrays",
    "iter_entries",
    "check_tree",
    "TreeError",
    "MAX_DEPTH",
    "MAX_ENTRIES",
    "ORIG_SUFFIX",
    "MASK_SUFFIX",
]

Array = Any

# --------------------------------------------------------------------------------------
# The verbs
# --------------------------------------------------------------------------------------


def prune(params: Mapping, key: Key, method: Any, importance_scores: Array | None = None) -> Mapping:
    """Prune the entry `key` with a pruning method: the verb behind every other.

    Parameters
    ----------
    params : mapping
        Mapping of names to arrays (possibly nested).
    key : str or tuple
        The array to prune; see *Keys and paths* in the module docs.
    method : BasePruningMethod
        A method of the arrayprune core, e.g. ``arrayprune.L1Unstructured(0.5)``, or one
        written by the user on the same base classes.
    importance_scores : array, optional
        Scores to rank by instead of the original array, same shape.

    Returns
    -------
    mapping
        A new mapping with ``key_orig`` and the ``key_mask`` in place of ``key``; if
        `key` was pruned before, its mask combined with the method's as a
        :class:`~arrayprune.PruningContainer` combines them.

    Raises
    ------
    KeyError
        If `key` names no array.
    ValueError
        If `importance_scores` has another shape, or the method refuses the array.
    """
    entry = _Entry(params, key)
    mask = mask_for(method, entry.orig(), default_mask=entry.default_mask(), importance_scores=importance_scores)
    return _with_mask(params, entry, entry.stored_mask(mask))


# <verbs>
# Written by tools/write_verbs.py from arrayprune.METHODS: edit the table or the class, then rerun it.

def identity(params: Mapping, key: Key) -> Mapping:
    """Prune the entry `key` with :class:`arrayprune.Identity`.

    ``prune(params, key, Identity(...), importance_scores)``: if `key` was pruned before,
    the method acts only on what its mask leaves, as in a :class:`~arrayprune.PruningContainer`.

    Parameters
    ----------
    params : mapping
        Mapping of names to arrays (possibly nested).
    key : str or tuple
        The array to prune; see *Keys and paths* in the module docs.

    importance_scores : array, optional
        Scores to rank by instead of the original array, same shape (methods that rank
        by value).

    Returns
    -------
    mapping
        A new mapping with ``key_orig`` and the combined ``key_mask`` in place of ``key``.

    Raises
    ------
    KeyError
        If `key` names no array.
    TypeError, ValueError, IndexError
        If the method's arguments are invalid for the array.
    """
    return prune(params, key, ap.Identity())


def random_unstructured(
    params: Mapping,
    key: Key,
    amount: int | float,
    *,
    seed: int | None = None,
    generator: Any = None,
) -> Mapping:
    """Prune the entry `key` with :class:`arrayprune.RandomUnstructured`.

    ``prune(params, key, RandomUnstructured(...), importance_scores)``: if `key` was pruned before,
    the method acts only on what its mask leaves, as in a :class:`~arrayprune.PruningContainer`.

    Parameters
    ----------
    params : mapping
        Mapping of names to arrays (possibly nested).
    key : str or tuple
        The array to prune; see *Keys and paths* in the module docs.
    amount : int or float
        Fraction in ``[0, 1]`` of the entries to prune, or their number.
    seed : int, optional
        Seed making the choice reproducible.
    generator : object, optional
        The array library's generator (or a JAX key) to draw from.
    importance_scores : array, optional
        Scores to rank by instead of the original array, same shape (methods that rank
        by value).

    Returns
    -------
    mapping
        A new mapping with ``key_orig`` and the combined ``key_mask`` in place of ``key``.

    Raises
    ------
    KeyError
        If `key` names no array.
    TypeError, ValueError, IndexError
        If the method's arguments are invalid for the array.
    """
    return prune(params, key, ap.RandomUnstructured(amount, seed=seed, generator=generator))


def l1_unstructured(params: Mapping, key: Key, amount: int | float, importance_scores: Array | None = None) -> Mapping:
    """Prune the entry `key` with :class:`arrayprune.L1Unstructured`.

    ``prune(params, key, L1Unstructured(...), importance_scores)``: if `key` was pruned before,
    the method acts only on what its mask leaves, as in a :class:`~arrayprune.PruningContainer`.

    Parameters
    ----------
    params : mapping
        Mapping of names to arrays (possibly nested).
    key : str or tuple
        The array to prune; see *Keys and paths* in the module docs.
    amount : int or float
        Fraction in ``[0, 1]`` of the entries to prune, or their number.
    importance_scores : array, optional
        Scores to rank by instead of the original array, same shape (methods that rank
        by value).

    Returns
    -------
    mapping
        A new mapping with ``key_orig`` and the combined ``key_mask`` in place of ``key``.

    Raises
    ------
    KeyError
        If `key` names no array.
    TypeError, ValueError, IndexError
        If the method's arguments are invalid for the array.
    """
    return prune(params, key, ap.L1Unstructured(amount), importance_scores)


def random_structured(
    params: Mapping,
    key: Key,
    amount: int | float,
    dim: int = -1,
    *,
    seed: int | None = None,
    generator: Any = None,
) -> Mapping:
    """Prune the entry `key` with :class:`arrayprune.RandomStructured`.

    ``prune(params, key, RandomStructured(...), importance_scores)``: if `key` was pruned before,
    the method acts only on what its mask leaves, as in a :class:`~arrayprune.PruningContainer`.

    Parameters
    ----------
    params : mapping
        Mapping of names to arrays (possibly nested).
    key : str or tuple
        The array to prune; see *Keys and paths* in the module docs.
    amount : int or float
        Fraction in ``[0, 1]`` of the channels to prune, or their number.
    dim : int, default -1
        Axis along which channels are defined.
    seed : int, optional
        Seed making the choice reproducible.
    generator : object, optional
        The array library's generator (or a JAX key) to draw from.
    importance_scores : array, optional
        Scores to rank by instead of the original array, same shape (methods that rank
        by value).

    Returns
    -------
    mapping
        A new mapping with ``key_orig`` and the combined ``key_mask`` in place of ``key``.

    Raises
    ------
    KeyError
        If `key` names no array.
    TypeError, ValueError, IndexError
        If the method's arguments are invalid for the array.
    """
    return prune(params, key, ap.RandomStructured(amount, dim, seed=seed, generator=generator))


def ln_structured(
    params: Mapping,
    key: Key,
    amount: int | float,
    n: Any,
    dim: int = -1,
    importance_scores: Array | None = None,
) -> Mapping:
    """Prune the entry `key` with :class:`arrayprune.LnStructured`.

    ``prune(params, key, LnStructured(...), importance_scores)``: if `key` was pruned before,
    the method acts only on what its mask leaves, as in a :class:`~arrayprune.PruningContainer`.

    Parameters
    ----------
    params : mapping
        Mapping of names to arrays (possibly nested).
    key : str or tuple
        The array to prune; see *Keys and paths* in the module docs.
    amount : int or float
        Fraction in ``[0, 1]`` of the channels to prune, or their number.
    n : int, float, inf, -inf, 'fro' or 'nuc'
        Order of the norm, as ``p`` in :func:`torch.norm` (see
        :func:`arrayprune.norms.channel_norms`).
    dim : int, default -1
        Axis along which channels are defined.
    importance_scores : array, optional
        Scores to rank by instead of the original array, same shape (methods that rank
        by value).

    Returns
    -------
    mapping
        A new mapping with ``key_orig`` and the combined ``key_mask`` in place of ``key``.

    Raises
    ------
    KeyError
        If `key` names no array.
    TypeError, ValueError, IndexError
        If the method's arguments are invalid for the array.
    """
    return prune(params, key, ap.LnStructured(amount, n, dim), importance_scores)


def custom_from_mask(params: Mapping, key: Key, mask: Array) -> Mapping:
    """Prune the entry `key` with :class:`arrayprune.CustomFromMask`.

    ``prune(params, key, CustomFromMask(...), importance_scores)``: if `key` was pruned before,
    the method acts only on what its mask leaves, as in a :class:`~arrayprune.PruningContainer`.

    Parameters
    ----------
    params : mapping
        Mapping of names to arrays (possibly nested).
    key : str or tuple
        The array to prune; see *Keys and paths* in the module docs.
    mask : array
        The mask; non-zero entries are kept.
    importance_scores : array, optional
        Scores to rank by instead of the original array, same shape (methods that rank
        by value).

    Returns
    -------
    mapping
        A new mapping with ``key_orig`` and the combined ``key_mask`` in place of ``key``.

    Raises
    ------
    KeyError
        If `key` names no array.
    TypeError, ValueError, IndexError
        If the method's arguments are invalid for the array.
    """
    return prune(params, key, ap.CustomFromMask(mask))


def nm_structured(
    params: Mapping,
    key: Key,
    n: int = 2,
    m: int = 4,
    dim: int = -1,
    importance_scores: Array | None = None,
) -> Mapping:
    """Prune the entry `key` with :class:`arrayprune.NMStructured`.

    ``prune(params, key, NMStructured(...), importance_scores)``: if `key` was pruned before,
    the method acts only on what its mask leaves, as in a :class:`~arrayprune.PruningContainer`.

    Parameters
    ----------
    params : mapping
        Mapping of names to arrays (possibly nested).
    key : str or tuple
        The array to prune; see *Keys and paths* in the module docs.
    n : int, default 2
        Entries pruned per group.
    m : int, default 4
        Group length.
    dim : int, default -1
        Axis along which groups run (the input dimension of a linear weight is -1).
    importance_scores : array, optional
        Scores to rank by instead of the original array, same shape (methods that rank
        by value).

    Returns
    -------
    mapping
        A new mapping with ``key_orig`` and the combined ``key_mask`` in place of ``key``.

    Raises
    ------
    KeyError
        If `key` names no array.
    TypeError, ValueError, IndexError
        If the method's arguments are invalid for the array.
    """
    return prune(params, key, ap.NMStructured(n, m, dim), importance_scores)


def block_unstructured(
    params: Mapping,
    key: Key,
    amount: int | float,
    block_shape: tuple[int, ...],
    n: float = 1,
    importance_scores: Array | None = None,
) -> Mapping:
    """Prune the entry `key` with :class:`arrayprune.BlockUnstructured`.

    ``prune(params, key, BlockUnstructured(...), importance_scores)``: if `key` was pruned before,
    the method acts only on what its mask leaves, as in a :class:`~arrayprune.PruningContainer`.

    Parameters
    ----------
    params : mapping
        Mapping of names to arrays (possibly nested).
    key : str or tuple
        The array to prune; see *Keys and paths* in the module docs.
    amount : int or float
        Fraction in ``[0, 1]`` of the remaining blocks, or their number.
    block_shape : tuple of int
        Shape of a block, e.g. ``(1, 4)`` or ``(4, 4)``.
    n : float, default 1
        Order of the power mean (positive, or ``inf``).
    importance_scores : array, optional
        Scores to rank by instead of the original array, same shape (methods that rank
        by value).

    Returns
    -------
    mapping
        A new mapping with ``key_orig`` and the combined ``key_mask`` in place of ``key``.

    Raises
    ------
    KeyError
        If `key` names no array.
    TypeError, ValueError, IndexError
        If the method's arguments are invalid for the array.
    """
    return prune(params, key, ap.BlockUnstructured(amount, block_shape, n), importance_scores)


def wanda(
    params: Mapping,
    key: Key,
    amount: int | float,
    dim: int = 0,
    importance_scores: Array | None = None,
) -> Mapping:
    """Prune the entry `key` with :class:`arrayprune.Wanda`.

    ``prune(params, key, Wanda(...), importance_scores)``: if `key` was pruned before,
    the method acts only on what its mask leaves, as in a :class:`~arrayprune.PruningContainer`.

    Parameters
    ----------
    params : mapping
        Mapping of names to arrays (possibly nested).
    key : str or tuple
        The array to prune; see *Keys and paths* in the module docs.
    amount : int or float
        Per output unit, the fraction in ``[0, 1]`` of its entries to prune, or their
        number. Inside a container (iterative pruning), of its entries still unpruned.
    dim : int, default 0
        The output axis of the weight.
    importance_scores : array, optional
        Scores to rank by instead of the original array, same shape (methods that rank
        by value).

    Returns
    -------
    mapping
        A new mapping with ``key_orig`` and the combined ``key_mask`` in place of ``key``.

    Raises
    ------
    KeyError
        If `key` names no array.
    TypeError, ValueError, IndexError
        If the method's arguments are invalid for the array.
    """
    return prune(params, key, ap.Wanda(amount, dim), importance_scores)
# </verbs>


def prune_to_sparsity(
    params: Mapping,
    key: Key,
    sparsity: float,
    pruning_method: Any = M.L1Unstructured,
    importance_scores: Array | None = None,
    **kwargs: Any,
) -> Mapping:
    """Prune just enough more of `key` that a fraction `sparsity` of its units is pruned.

    The step of gradual pruning: call it with ``schedule(step)`` (see
    :class:`arrayprune.PolynomialDecay`); units already pruned count and stay pruned.

    Parameters
    ----------
    params : mapping
        Mapping of names to arrays (possibly nested).
    key : str or tuple
        The array to prune.
    sparsity : float
        Target fraction of pruned units (entries, or channels for structured methods).
    pruning_method : type, default arrayprune.L1Unstructured
        Unstructured or structured method class.
    importance_scores : array, optional
        Scores to rank by instead of the original array, same shape.
    **kwargs
        Further arguments of the method (``n``, ``dim``, ...).

    Returns
    -------
    mapping
        A new mapping with ``key_orig`` and the combined ``key_mask`` in place of ``key``.
    """
    entry = _Entry(params, key)
    mask = _core_prune_to_sparsity(
        entry.orig(),
        sparsity,
        default_mask=entry.default_mask(),
        pruning_method=pruning_method,
        importance_scores=importance_scores,
        **kwargs,
    )
    return _with_mask(params, entry, entry.stored_mask(mask))


def global_unstructured(
    params: Mapping,
    keys: Iterable[Key],
    pruning_method: Any,
    importance_scores: Mapping[Key, Array] | None = None,
    **kwargs: Any,
) -> Mapping:
    """Prune the entries `keys` together, ranking all their entries against each other.

    The equivalent of ``torch.nn.utils.prune.global_unstructured`` for a mapping: entries
    already pruned take part with their existing masks (only what those keep is a
    candidate, and a float amount is a fraction of that), and every entry ends up with
    ``_orig`` / ``_mask`` entries.

    Parameters
    ----------
    params : mapping
        Mapping of names to arrays (possibly nested).
    keys : iterable of str or tuple
        The arrays to prune, each named once.
    pruning_method : type
        An unstructured method class such as :class:`arrayprune.L1Unstructured`,
        instantiated with `kwargs`.
    importance_scores : mapping, optional
        Scores per key (keys as written in `keys`); the original array where missing.
    **kwargs
        Arguments of `pruning_method`, such as ``amount``.

    Returns
    -------
    mapping
        A new mapping with ``_orig`` and ``_mask`` entries for every key.

    Raises
    ------
    KeyError
        If a key names no array, or `importance_scores` has a key not in `keys`.
    ValueError
        If a key is named twice, a score has another shape or the amount is too large.
    TypeError
        If the method is not unstructured.
    """
    keys = list(keys)
    entries = [_Entry(params, k) for k in keys]
    seen: dict[tuple[Path, Any], Key] = {}
    for entry in entries:
        if entry.ident in seen:
            raise ValueError(f"{entry.key!r} names the same array as {seen[entry.ident]!r}")
        seen[entry.ident] = entry.key
    scores: list[Array | None] = [None] * len(entries)
    if importance_scores is not None:
        position = {entry.ident: i for i, entry in enumerate(entries)}
        for k, score in importance_scores.items():
            ident = _Entry(params, k).ident
            if ident not in position:
                raise KeyError(f"importance_scores has {k!r}, which is not among the keys pruned")
            scores[position[ident]] = score
    for entry in entries:
        if not isinstance(entry.leaf, str):
            raise KeyError(f"{entry.key!r}: only string keys can take the {ORIG_SUFFIX!r}/{MASK_SUFFIX!r} suffixes")
    masks = _core_global_unstructured(
        [e.orig() for e in entries],
        pruning_method,
        importance_scores=scores,
        default_masks=[e.default_mask() for e in entries],
        **kwargs,
    )
    out = params
    for entry, mask in zip(entries, masks, strict=True):
        out = _with_mask(out, entry, entry.stored_mask(mask))
    return out if entries else _rebuild(params, params.items())


def remove(params: Mapping, key: Key) -> Mapping:
    """Fold the mask of a pruned entry into it: ``key = key_orig * key_mask``.

    Parameters
    ----------
    params : mapping
        Mapping of names to arrays (possibly nested).
    key : str or tuple
        A pruned array.

    Returns
    -------
    mapping
        A new mapping with ``key`` (the pruned array, of the dtype of ``key_orig``) in
        place of ``key_orig``, and ``key_mask`` dropped.

    Raises
    ------
    KeyError
        If `key` names no array.
    ValueError
        If `key` is not pruned.
    """
    entry = _Entry(params, key)
    if not entry.pruned:
        raise ValueError(f"{key!r} has to be pruned before pruning can be removed")
    node = entry.node
    folded = _fold(entry.orig(), entry.mask())
    items: list[tuple[Any, Any]] = []
    for k, v in node.items():
        if k == entry.orig_key:
            items.append((entry.leaf, folded))
        elif k != entry.mask_key:
            items.append((k, v))
    return _replace_at(params, entry.parent, _rebuild(node, items))


def replace(params: Mapping, arrays: Mapping[Key, Array]) -> Mapping:
    """A new mapping with the arrays at the given keys replaced, in place in the order.

    Parameters
    ----------
    params : mapping
        Mapping of names to arrays (possibly nested).
    arrays : mapping
        New arrays by key (see *Keys and paths* in the module docs); each key must name
        an array that is not pruned.

    Returns
    -------
    mapping
        A new mapping; entries not replaced, and the sub-mappings holding none of the
        keys, are shared with `params`.

    Raises
    ------
    KeyError
        If a key names no array.
    ValueError
        If a key names a pruned array (replace its ``_orig`` or fold it first).
    """
    by_parent: dict[Path, dict[Any, Array]] = {}
    for key, value in arrays.items():
        entry = _Entry(params, key)
        if entry.pruned:
            raise ValueError(f"{key!r} is pruned: its array is {entry.orig_key!r}, with a mask")
        by_parent.setdefault(entry.parent, {})[entry.leaf] = value
    out = params
    for parent, new in by_parent.items():
        node = _node(out, parent, _name(parent))
        out = _replace_at(out, parent, _rebuild(node, ((k, new.get(k, v)) for k, v in node.items())))
    return out
