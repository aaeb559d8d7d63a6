"""The state-dict convention of pruned arrays in nested mappings.

A pruned entry ``key`` is stored as ``key_orig`` (the original array) and ``key_mask``
(its mask), side by side, as in the ``state_dict`` of a module pruned with
:mod:`torch.nn.utils.prune`. This module addresses entries (plain or pruned, at any
depth) and reads the convention back: which entries are pruned, their effective arrays
``key_orig * key_mask``, and every logical entry once. The verbs that write it are in
:mod:`arrayprune.adapters.mapping`, which re-exports the public names here.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import array_api_compat as apc

from arrayprune.adapters.trees import Key, Path, _node, _rebuild, _replace_at, check_tree, walk

__all__ = [
    "ORIG_SUFFIX",
    "MASK_SUFFIX",
    "pruned_keys",
    "is_pruned",
    "apply_masks",
    "iter_arrays",
    "iter_entries",
]

Array = Any

ORIG_SUFFIX = "_orig"
MASK_SUFFIX = "_mask"

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


def _pruned_leaf(node: Mapping, key: Any) -> str | None:
    """The entry whose original `key` holds (``leaf_orig`` beside ``leaf_mask``), or None."""
    if isinstance(key, str) and key.endswith(ORIG_SUFFIX):
        leaf = key[: -len(ORIG_SUFFIX)]
        if leaf + MASK_SUFFIX in node and leaf not in node:
            return leaf
    return None


def _is_pruned_mask(node: Mapping, key: Any) -> bool:
    """Whether `key` is the ``_mask`` entry of a pruned entry of `node`."""
    if not (isinstance(key, str) and key.endswith(MASK_SUFFIX)):
        return False
    return _pruned_leaf(node, key[: -len(MASK_SUFFIX)] + ORIG_SUFFIX) is not None


def _pruned_leaves(node: Mapping) -> list[str]:
    return [leaf for k in node if (leaf := _pruned_leaf(node, k)) is not None]


def pruned_keys(params: Mapping) -> list[Path]:
    """Paths of all pruned entries (those stored as ``_orig`` + ``_mask``).

    Parameters
    ----------
    params : mapping
        Mapping of names to arrays (possibly nested).

    Returns
    -------
    list of tuple
        One path per pruned entry, in the order of their ``_orig`` entries
        (``("fc1.weight",)`` at top level, ``("params", "Dense_0", "kernel")`` nested).
    """
    return [(*prefix, leaf) for prefix, node, key, _ in walk(params) if (leaf := _pruned_leaf(node, key)) is not None]


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
    return any(_pruned_leaf(node, key) is not None for _, node, key, _ in walk(params))


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

    Raises
    ------
    TreeError
        If the tree contains itself or is too deep or too large to walk (see
        :func:`arrayprune.adapters.trees.walk`).
    """
    if effective:
        for path, value, mask in iter_entries(params):
            yield path, value if mask is None else _fold(value, mask)
        return
    for prefix, _, key, value in walk(params):
        if not isinstance(value, Mapping):
            yield (*prefix, key), value


def iter_entries(params: Mapping) -> Iterator[tuple[Path, Array, Array | None]]:
    """Walk a (nested) mapping by logical entry: pruned ones once, with their mask.

    Parameters
    ----------
    params : mapping
        Mapping of names to arrays (possibly nested).

    Yields
    ------
    tuple
        ``(path, value, mask)``: for an entry pruned in the state-dict convention, its
        own path, its ``_orig`` array and its ``_mask`` (at the position of the
        ``_orig`` entry); for any other non-mapping entry, its path, value and None.

    Raises
    ------
    TreeError
        As :func:`iter_arrays`.
    """
    for prefix, node, key, value in walk(params):
        if isinstance(value, Mapping) or _is_pruned_mask(node, key):
            continue
        leaf = _pruned_leaf(node, key)
        if leaf is None:
            yield (*prefix, key), value, None
        else:
            yield (*prefix, leaf), value, node[leaf + MASK_SUFFIX]
