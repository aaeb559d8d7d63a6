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

from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import array_api_compat as apc

from arrayprune import functional as F
from arrayprune import methods as M
from arrayprune import patterns as M_patterns
from arrayprune.global_pruning import global_unstructured as _core_global_unstructured
from arrayprune.schedules import prune_to_sparsity as _core_prune_to_sparsity

__all__ = [
    "identity",
    "random_unstructured",
    "l1_unstructured",
    "random_structured",
    "ln_structured",
    "custom_from_mask",
    "nm_structured",
    "block_unstructured",
    "prune_to_sparsity",
    "global_unstructured",
    "remove",
    "is_pruned",
    "pruned_keys",
    "apply_masks",
    "replace",
    "iter_arrays",
    "check_tree",
    "TreeError",
    "MAX_DEPTH",
    "MAX_ENTRIES",
    "ORIG_SUFFIX",
    "MASK_SUFFIX",
]

Array = Any
Key = str | tuple
Path = tuple

ORIG_SUFFIX = "_orig"
MASK_SUFFIX = "_mask"

MAX_DEPTH = 64
"""Deepest nesting of mappings that the walkers accept (a state dict has 1, a Flax tree a few)."""

MAX_ENTRIES = 1_000_000
"""Most entries a walk visits; a mapping shared by several parents counts once per parent."""


class TreeError(ValueError):
    """A nested mapping that cannot be walked: it contains itself, is nested deeper than
    :data:`MAX_DEPTH` or holds more than :data:`MAX_ENTRIES` entries."""


# --------------------------------------------------------------------------------------
# Walking trees safely
# --------------------------------------------------------------------------------------


def check_tree(params: Mapping, *, max_depth: int = MAX_DEPTH, max_entries: int = MAX_ENTRIES) -> int:
    """Check that a nested mapping can be walked, without recursion.

    Files deserialize to trees that may be hostile: a dict that contains itself, nesting
    thousands of levels deep, or a few kilobytes of dicts that share references so that
    walking visits every one of 2**40 paths. Every walker of this module calls this
    check first, which visits entries iteratively and stops at the first problem, so
    such a tree costs at most `max_entries` steps. Sub-mappings shared by several
    parents (a DAG) are allowed, and counted once per parent; arrays shared under
    several names (tied weights) are ordinary.

    Parameters
    ----------
    params : mapping
        The tree.
    max_depth : int, default :data:`MAX_DEPTH`
        Most levels of nested mappings below `params`.
    max_entries : int, default :data:`MAX_ENTRIES`
        Most entries visited in all.

    Returns
    -------
    int
        The number of entries visited.

    Raises
    ------
    TreeError
        (a :class:`ValueError`) naming the path where the problem was found.
    """
    if not isinstance(params, Mapping):
        raise TypeError(f"expected a mapping, got {type(params).__name__}")
    visited = 0
    on_path = {id(params)}
    # One iterator per open level; `path` and `nodes` run alongside the stack.
    stack: list[Iterator[tuple[Any, Any]]] = [iter(params.items())]
    path: list[Any] = []
    nodes: list[Mapping] = [params]
    while stack:
        item = next(stack[-1], None)
        if item is None:
            stack.pop()
            on_path.discard(id(nodes.pop()))
            if path:
                path.pop()
            continue
        key, value = item
        visited += 1
        if visited > max_entries:
            raise TreeError(
                f"more than {max_entries:,} entries (at {_short_name((*path, key))!r}); "
                "mappings shared by several parents count once per parent"
            )
        if not isinstance(value, Mapping):
            continue
        where = _short_name((*path, key))
        if id(value) in on_path:
            raise TreeError(f"the mapping at {where!r} contains itself")
        if len(stack) > max_depth:
            raise TreeError(f"nested deeper than {max_depth} levels (at {where!r})")
        on_path.add(id(value))
        nodes.append(value)
        path.append(key)
        stack.append(iter(value.items()))
    return visited


# --------------------------------------------------------------------------------------
# Paths and rebuilding
# --------------------------------------------------------------------------------------


def _path_of(params: Mapping, key: Key) -> Path:
    """Turn a key into a path (tuple of keys, one per level); see the module docs."""
    if isinstance(key, tuple):
        if not key:
            raise KeyError("empty path")
        return key
    if isinstance(key, str):
        if key in params or key + ORIG_SUFFIX in params or "/" not in key:
            return (key,)
        parts = tuple(key.split("/"))
        if any(p == "" for p in parts):
            raise KeyError(f"{key!r}: empty component in path")
        return parts
    # any other hashable (an int key, say) names a top-level entry
    return (key,)


def _name(path: Path) -> str:
    return "/".join(map(str, path))


def _short_name(path: Path, keep: int = 3) -> str:
    """`_name` of `path`, its middle elided when it is long (messages stay one short line)."""
    if len(path) <= 2 * keep + 1:
        return _name(path)
    return f"{_name(path[:keep])}/.../{_name(path[-keep:])} ({len(path)} levels)"


def _node(params: Mapping, parent: Path, key: Key) -> Mapping:
    """The sub-mapping at `parent`, or KeyError naming `key`."""
    node: Any = params
    for i, part in enumerate(parent):
        if not isinstance(node, Mapping) or part not in node:
            raise KeyError(f"{_name(parent[: i + 1])!r} not found (looking up {key!r})")
        node = node[part]
    if not isinstance(node, Mapping):
        raise KeyError(f"{_name(parent)!r} is not a mapping (looking up {key!r})")
    return node


def _rebuild(like: Mapping, items: Iterable[tuple[Any, Any]]) -> Mapping:
    """A new mapping holding `items`, of the type of `like` where possible."""
    data = dict(items)
    cls = type(like)
    if cls is dict:
        return data
    if cls is OrderedDict:
        out: Mapping = OrderedDict(data)
    else:
        try:
            out = cls(data)
        except Exception:  # a Mapping type that cannot be built from a dict
            return data
        if not isinstance(out, Mapping) or list(out.keys()) != list(data.keys()):
            return data
    meta = getattr(like, "_metadata", None)
    if meta is not None:
        try:
            out._metadata = meta  # type: ignore[attr-defined]
        except AttributeError:
            pass
    return out


def _replace_at(params: Mapping, parent: Path, new_node: Mapping) -> Mapping:
    """A copy of `params` with the sub-mapping at `parent` replaced by `new_node`."""
    if not parent:
        return new_node
    head, rest = parent[0], parent[1:]
    child = _replace_at(params[head], rest, new_node)
    return _rebuild(params, ((k, child if k == head else v) for k, v in params.items()))


class _Entry:
    """One addressed array: where it lives and whether it is pruned."""

    __slots__ = ("key", "parent", "leaf", "node", "pruned")

    def __init__(self, params: Mapping, key: Key):
        path = _path_of(params, key)
        self.key = key
        self.parent: Path = path[:-1]
        self.leaf = path[-1]
        self.node = _node(params, self.parent, key)
        node, leaf = self.node, self.leaf
        if not isinstance(leaf, str):
            if leaf not in node:
                raise KeyError(f"{key!r} not found")
            self.pruned = False
        else:
            has_orig = leaf + ORIG_SUFFIX in node
            has_mask = leaf + MASK_SUFFIX in node
            if has_orig and has_mask:
                if leaf in node:
                    raise ValueError(
                        f"{key!r}: found {leaf!r} beside {leaf + ORIG_SUFFIX!r} and "
                        f"{leaf + MASK_SUFFIX!r}; a pruned entry is stored only as the latter two"
                    )
                self.pruned = True
            elif leaf in node:
                self.pruned = False
            else:
                hint = ""
                if has_orig or has_mask:
                    hint = f" (found {leaf + (ORIG_SUFFIX if has_orig else MASK_SUFFIX)!r} without its pair)"
                raise KeyError(f"{key!r} not found{hint}")
        value = node[self.orig_key]
        if isinstance(value, Mapping) or not hasattr(value, "shape"):
            raise KeyError(f"{key!r} names a {type(value).__name__}, not an array")
        if getattr(value, "is_meta", False):  # a PyTorch tensor with a shape and no values
            raise ValueError(f"{key!r} is on the meta device: it holds no values to prune")

    @property
    def orig_key(self) -> Any:
        return self.leaf + ORIG_SUFFIX if self.pruned else self.leaf

    @property
    def mask_key(self) -> str:
        return self.leaf + MASK_SUFFIX

    @property
    def ident(self) -> tuple[Path, Any]:
        return (self.parent, self.leaf)

    def orig(self) -> Array:
        return self.node[self.orig_key]

    def mask(self) -> Array | None:
        return self.node[self.mask_key] if self.pruned else None

    def stored_mask(self, mask: Array) -> Array:
        """`mask` (computed on top of `default_mask()`) in the dtype it is stored in.

        That of the existing mask, which the core keeps, else that of the array, as
        PyTorch stores it.
        """
        if self.pruned:
            return mask
        orig = self.orig()
        xp = apc.array_namespace(orig)
        return mask if mask.dtype == orig.dtype else xp.astype(mask, orig.dtype)

    def default_mask(self) -> Array | None:
        """The existing mask, or None (nothing pruned yet).

        None lets the core start from its boolean mask (a byte per entry) rather than
        from ones of the array's dtype; `stored_mask` converts the result once.
        """
        return self.node[self.mask_key] if self.pruned else None


def _with_mask(params: Mapping, entry: _Entry, mask: Array) -> Mapping:
    """`params` with `entry` stored as ``_orig`` + ``_mask``, the mask being `mask`."""
    current = _node(params, entry.parent, entry.key)
    if not isinstance(entry.leaf, str):
        raise KeyError(f"{entry.key!r}: only string keys can take the {ORIG_SUFFIX!r}/{MASK_SUFFIX!r} suffixes")
    leaf, orig_key, mask_key = entry.leaf, entry.leaf + ORIG_SUFFIX, entry.leaf + MASK_SUFFIX
    items: list[tuple[Any, Any]] = []
    for k, v in current.items():
        if k == leaf:
            items.append((orig_key, v))
            items.append((mask_key, mask))
        elif k == mask_key:
            items.append((k, mask))
        else:
            items.append((k, v))
    return _replace_at(params, entry.parent, _rebuild(current, items))


def _fold(orig: Array, mask: Array) -> Array:
    xp = apc.array_namespace(orig)
    return orig * xp.astype(mask, orig.dtype)


def _prune_one(
    params: Mapping,
    key: Key,
    compute: Callable[..., Array],
    importance_scores: Array | None = None,
) -> Mapping:
    entry = _Entry(params, key)
    orig = entry.orig()
    kwargs: dict[str, Any] = {"default_mask": entry.default_mask()}
    if importance_scores is not None:
        kwargs["importance_scores"] = importance_scores
    mask = compute(orig, **kwargs)
    return _with_mask(params, entry, entry.stored_mask(mask))


# --------------------------------------------------------------------------------------
# The verbs
# --------------------------------------------------------------------------------------


def identity(params: Mapping, key: Key) -> Mapping:
    """Reparametrize `key` with a mask of ones (or keep its mask), pruning nothing.

    Parameters
    ----------
    params : mapping
        Mapping of names to arrays (possibly nested).
    key : str or tuple
        The array to act on; see *Keys and paths* in the module docs.

    Returns
    -------
    mapping
        A new mapping with ``key_orig`` and ``key_mask`` in place of ``key``.

    Raises
    ------
    KeyError
        If `key` names no array.
    """
    return _prune_one(params, key, lambda x, default_mask: F.identity(x, default_mask=default_mask))


def random_unstructured(
    params: Mapping,
    key: Key,
    amount: int | float,
    *,
    seed: int | None = None,
    generator: Any = None,
) -> Mapping:
    """Prune `amount` of the (remaining) entries of `key`, chosen at random.

    Parameters
    ----------
    params : mapping
        Mapping of names to arrays (possibly nested).
    key : str or tuple
        The array to prune.
    amount : int or float
        Fraction in ``[0, 1]`` of the remaining entries, or their number.
    seed : int, optional
        Seed making the choice reproducible.
    generator : object, optional
        The array library's generator (or a JAX key).

    Returns
    -------
    mapping
        A new mapping with ``key_orig`` and the combined ``key_mask`` in place of ``key``.

    Raises
    ------
    KeyError
        If `key` names no array.
    TypeError, ValueError
        If `amount` is invalid.
    """
    M.RandomUnstructured(amount, seed=seed, generator=generator)  # validate first

    def compute(x: Array, default_mask: Array) -> Array:
        return F.random_unstructured(x, amount, default_mask=default_mask, seed=seed, generator=generator)

    return _prune_one(params, key, compute)


def l1_unstructured(
    params: Mapping,
    key: Key,
    amount: int | float,
    importance_scores: Array | None = None,
) -> Mapping:
    """Prune `amount` of the (remaining) entries of `key` of smallest magnitude.

    Parameters
    ----------
    params : mapping
        Mapping of names to arrays (possibly nested).
    key : str or tuple
        The array to prune.
    amount : int or float
        Fraction in ``[0, 1]`` of the remaining entries, or their number.
    importance_scores : array, optional
        Scores to rank by instead of the original array, same shape.

    Returns
    -------
    mapping
        A new mapping with ``key_orig`` and the combined ``key_mask`` in place of ``key``.

    Raises
    ------
    KeyError
        If `key` names no array.
    TypeError, ValueError
        If `amount` is invalid or `importance_scores` has another shape.
    """
    M.L1Unstructured(amount)

    def compute(x: Array, default_mask: Array, importance_scores: Array | None = None) -> Array:
        return F.l1_unstructured(x, amount, default_mask=default_mask, importance_scores=importance_scores)

    return _prune_one(params, key, compute, importance_scores)


def random_structured(
    params: Mapping,
    key: Key,
    amount: int | float,
    dim: int,
    *,
    seed: int | None = None,
    generator: Any = None,
) -> Mapping:
    """Prune `amount` of the (remaining) channels of `key` along `dim`, at random.

    Parameters
    ----------
    params : mapping
        Mapping of names to arrays (possibly nested).
    key : str or tuple
        The array to prune, at least 2-D.
    amount : int or float
        Fraction in ``[0, 1]`` of the remaining channels, or their number.
    dim : int
        Axis along which channels are defined.
    seed : int, optional
        Seed making the choice reproducible.
    generator : object, optional
        The array library's generator (or a JAX key).

    Returns
    -------
    mapping
        A new mapping with ``key_orig`` and the combined ``key_mask`` in place of ``key``.

    Raises
    ------
    KeyError
        If `key` names no array.
    TypeError, ValueError, IndexError
        If `amount` or `dim` is invalid, or the array has fewer than two dimensions.
    """
    M.RandomStructured(amount, dim, seed=seed, generator=generator)

    def compute(x: Array, default_mask: Array) -> Array:
        return F.random_structured(x, amount, dim, default_mask=default_mask, seed=seed, generator=generator)

    return _prune_one(params, key, compute)


def ln_structured(
    params: Mapping,
    key: Key,
    amount: int | float,
    n: Any,
    dim: int,
    importance_scores: Array | None = None,
) -> Mapping:
    """Prune `amount` of the (remaining) channels of `key` of smallest L`n` norm.

    Parameters
    ----------
    params : mapping
        Mapping of names to arrays (possibly nested).
    key : str or tuple
        The array to prune, at least 2-D.
    amount : int or float
        Fraction in ``[0, 1]`` of the remaining channels, or their number.
    n : int, float, inf, -inf, 'fro' or 'nuc'
        Order of the norm, as ``p`` in :func:`torch.norm`.
    dim : int
        Axis along which channels are defined.
    importance_scores : array, optional
        Scores to take norms of instead of the original array, same shape.

    Returns
    -------
    mapping
        A new mapping with ``key_orig`` and the combined ``key_mask`` in place of ``key``.

    Raises
    ------
    KeyError
        If `key` names no array.
    TypeError, ValueError, IndexError
        If `amount` or `dim` is invalid, the array has fewer than two dimensions, or
        `importance_scores` has another shape.
    """
    M.LnStructured(amount, n, dim)

    def compute(x: Array, default_mask: Array, importance_scores: Array | None = None) -> Array:
        return F.ln_structured(x, amount, n, dim, default_mask=default_mask, importance_scores=importance_scores)

    return _prune_one(params, key, compute, importance_scores)


def nm_structured(
    params: Mapping,
    key: Key,
    n: int = 2,
    m: int = 4,
    dim: int = -1,
    importance_scores: Array | None = None,
) -> Mapping:
    """Prune `n` of every `m` consecutive entries of `key` along `dim` (2:4 by default).

    Parameters
    ----------
    params : mapping
        Mapping of names to arrays (possibly nested).
    key : str or tuple
        The array to prune.
    n, m : int
        The pattern: `n` zeros in every group of `m`; entries already pruned count.
    dim : int, default -1
        Axis along which groups run.
    importance_scores : array, optional
        Scores to rank by instead of the original array, same shape.

    Returns
    -------
    mapping
        A new mapping with ``key_orig`` and the combined ``key_mask`` in place of ``key``.

    Raises
    ------
    KeyError
        If `key` names no array.
    TypeError, ValueError, IndexError
        If the pattern or `dim` is invalid.
    """
    M_patterns.NMStructured(n, m, dim)

    def compute(x: Array, default_mask: Array, importance_scores: Array | None = None) -> Array:
        return F.nm_structured(x, n, m, dim, default_mask=default_mask, importance_scores=importance_scores)

    return _prune_one(params, key, compute, importance_scores)


def block_unstructured(
    params: Mapping,
    key: Key,
    amount: int | float,
    block_shape: tuple[int, ...],
    n: float = 1,
    importance_scores: Array | None = None,
) -> Mapping:
    """Prune `amount` of the (remaining) blocks of `key`, those of smallest norm first.

    Parameters
    ----------
    params : mapping
        Mapping of names to arrays (possibly nested).
    key : str or tuple
        The array to prune.
    amount : int or float
        Fraction in ``[0, 1]`` of the remaining blocks, or their number.
    block_shape : tuple of int
        Block shape, aligned to the trailing dimensions (e.g. ``(1, 4)``, ``(4, 4)``).
    n : float, default 1
        Order of the power mean scoring a block.
    importance_scores : array, optional
        Scores to rank by instead of the original array, same shape.

    Returns
    -------
    mapping
        A new mapping with ``key_orig`` and the combined ``key_mask`` in place of ``key``.

    Raises
    ------
    KeyError
        If `key` names no array.
    TypeError, ValueError
        If `amount` or `block_shape` is invalid.
    """
    M_patterns.BlockUnstructured(amount, block_shape, n)

    def compute(x: Array, default_mask: Array, importance_scores: Array | None = None) -> Array:
        return F.block_unstructured(
            x, amount, block_shape, n, default_mask=default_mask, importance_scores=importance_scores
        )

    return _prune_one(params, key, compute, importance_scores)


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
    def compute(x: Array, default_mask: Array, importance_scores: Array | None = None) -> Array:
        return _core_prune_to_sparsity(
            x,
            sparsity,
            default_mask=default_mask,
            pruning_method=pruning_method,
            importance_scores=importance_scores,
            **kwargs,
        )

    return _prune_one(params, key, compute, importance_scores)


def custom_from_mask(params: Mapping, key: Key, mask: Array) -> Mapping:
    """Prune `key` with a precomputed `mask`, multiplied into any existing mask.

    Parameters
    ----------
    params : mapping
        Mapping of names to arrays (possibly nested).
    key : str or tuple
        The array to prune.
    mask : array
        Mask of the shape of the array; non-zero entries are kept.

    Returns
    -------
    mapping
        A new mapping with ``key_orig`` and the combined ``key_mask`` in place of ``key``.

    Raises
    ------
    KeyError
        If `key` names no array.
    ValueError
        If `mask` has another shape than the array.
    """

    def compute(x: Array, default_mask: Array) -> Array:
        return F.custom_from_mask(x, mask, default_mask=default_mask)

    return _prune_one(params, key, compute)


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
    for entry, mask in zip(entries, masks, strict=False):
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


def _pruned_leaves(node: Mapping) -> list[str]:
    out = []
    for k in node:
        if isinstance(k, str) and k.endswith(ORIG_SUFFIX):
            leaf = k[: -len(ORIG_SUFFIX)]
            if leaf + MASK_SUFFIX in node and leaf not in node:
                out.append(leaf)
    return out


def pruned_keys(params: Mapping) -> list[Path]:
    """Paths of all pruned entries (those stored as ``_orig`` + ``_mask``).

    Parameters
    ----------
    params : mapping
        Mapping of names to arrays (possibly nested).

    Returns
    -------
    list of tuple
        One path per pruned entry, in the order of the mapping (``("fc1.weight",)`` at
        top level, ``("params", "Dense_0", "kernel")`` nested).
    """
    check_tree(params)
    found: list[Path] = []

    def walk(node: Mapping, prefix: Path) -> None:
        found.extend(prefix + (leaf,) for leaf in _pruned_leaves(node))
        for k, v in node.items():
            if isinstance(v, Mapping):
                walk(v, prefix + (k,))

    walk(params, ())
    return found


def is_pruned(params: Mapping) -> bool:
    """Whether any entry of `params`, at any depth, is stored as ``_orig`` + ``_mask``.

    Parameters
    ----------
    params : mapping
        Mapping of names to arrays (possibly nested).

    Returns
    -------
    bool
        True if some entry is pruned.
    """
    return bool(pruned_keys(params))


def apply_masks(params: Mapping) -> Mapping:
    """The effective arrays: every pruned entry folded, ``key = key_orig * key_mask``.

    Parameters
    ----------
    params : mapping
        Mapping of names to arrays (possibly nested).

    Returns
    -------
    mapping
        A new mapping without ``_orig`` / ``_mask`` pairs, each replaced by the effective
        array at the position of its ``_orig`` entry; other entries are shared.
    """

    def walk(node: Mapping) -> Mapping:
        leaves = set(_pruned_leaves(node))
        orig_of = {leaf + ORIG_SUFFIX: leaf for leaf in leaves}
        masks = {leaf + MASK_SUFFIX for leaf in leaves}
        items: list[tuple[Any, Any]] = []
        for k, v in node.items():
            if k in orig_of:
                leaf = orig_of[k]
                items.append((leaf, _fold(v, node[leaf + MASK_SUFFIX])))
            elif k in masks:
                continue
            elif isinstance(v, Mapping):
                items.append((k, walk(v)))
            else:
                items.append((k, v))
        return _rebuild(node, items)

    check_tree(params)
    return walk(params)


def iter_arrays(params: Mapping, *, effective: bool = False) -> Iterator[tuple[Path, Array]]:
    """Walk a (nested) mapping, yielding ``(path, value)`` for every non-mapping entry.

    Parameters
    ----------
    params : mapping
        Mapping of names to arrays (possibly nested).
    effective : bool, default False
        Yield pruned entries once, as their effective array under their own path,
        instead of their ``_orig`` and ``_mask`` entries.

    Yields
    ------
    tuple
        The path (a tuple of keys) and the value.
    """

    def walk(node: Mapping, prefix: Path) -> Iterator[tuple[Path, Array]]:
        leaves = set(_pruned_leaves(node)) if effective else set()
        for k, v in node.items():
            if leaves and isinstance(k, str):
                if k.endswith(MASK_SUFFIX) and k[: -len(MASK_SUFFIX)] in leaves:
                    continue
                if k.endswith(ORIG_SUFFIX) and k[: -len(ORIG_SUFFIX)] in leaves:
                    leaf = k[: -len(ORIG_SUFFIX)]
                    yield prefix + (leaf,), _fold(v, node[leaf + MASK_SUFFIX])
                    continue
            if isinstance(v, Mapping):
                yield from walk(v, prefix + (k,))
            else:
                yield prefix + (k,), v

    check_tree(params)
    yield from walk(params, ())
