"""Nested mappings of arrays: addressing, rebuilding, and walking them safely.

The trees come from files that may be hostile (a PyTorch checkpoint is whatever
``torch.load(weights_only=True)`` accepts): a dict that contains itself, nesting
thousands of levels deep, or a few kilobytes of dicts that share references so that
a naive walk visits 2**40 paths. :func:`walk` is the one way this package goes through
a tree: iterative, refusing cycles, capping the depth at :data:`MAX_DEPTH` and the
entries visited at :data:`MAX_ENTRIES`. Sub-mappings shared by several parents (a DAG)
are allowed, and visited once per parent; arrays shared under several names (tied
weights) are ordinary leaves.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

__all__ = ["MAX_DEPTH", "MAX_ENTRIES", "TreeError", "check_tree", "lookup", "walk"]

Key = str | tuple
Path = tuple

MAX_DEPTH = 64
"""Deepest nesting of mappings that the walkers accept (a state dict has 1, a Flax tree a few)."""

MAX_ENTRIES = 1_000_000
"""Most entries a walk visits; a mapping shared by several parents counts once per parent."""


class TreeError(ValueError):
    """A nested mapping that cannot be walked: it contains itself, is nested deeper than
    :data:`MAX_DEPTH` or holds more than :data:`MAX_ENTRIES` entries."""


def walk(
    params: Mapping, *, max_depth: int = MAX_DEPTH, max_entries: int = MAX_ENTRIES
) -> Iterator[tuple[Path, Mapping, Any, Any]]:
    """Every entry of a nested mapping, depth first in mapping order, without recursion.

    A sub-mapping is yielded as an entry, then its own entries follow before the next
    entry of its parent.

    Parameters
    ----------
    params : mapping
        The tree.
    max_depth : int, default :data:`MAX_DEPTH`
        Most levels of nested mappings below `params`.
    max_entries : int, default :data:`MAX_ENTRIES`
        Most entries visited in all.

    Yields
    ------
    tuple
        ``(prefix, node, key, value)``: the path of the mapping `node` that holds the
        entry, the mapping itself, and the entry.

    Raises
    ------
    TreeError
        (a :class:`ValueError`) naming the path where the problem was found, as soon as
        it is reached.
    TypeError
        If `params` is not a mapping.
    """
    if not isinstance(params, Mapping):
        raise TypeError(f"expected a mapping, got {type(params).__name__}")
    visited = 0
    on_path = {id(params)}
    stack: list[tuple[Path, Mapping, Iterator[tuple[Any, Any]]]] = [((), params, iter(params.items()))]
    while stack:
        prefix, node, items = stack[-1]
        item = next(items, None)
        if item is None:
            stack.pop()
            on_path.discard(id(node))
            continue
        key, value = item
        visited += 1
        if visited > max_entries:
            raise TreeError(
                f"more than {max_entries:,} entries (at {_short_name((*prefix, key))!r}); "
                "mappings shared by several parents count once per parent"
            )
        yield prefix, node, key, value
        if isinstance(value, Mapping):
            where = _short_name((*prefix, key))
            if id(value) in on_path:
                raise TreeError(f"the mapping at {where!r} contains itself")
            if len(stack) > max_depth:
                raise TreeError(f"nested deeper than {max_depth} levels (at {where!r})")
            on_path.add(id(value))
            stack.append(((*prefix, key), value, iter(value.items())))


def check_tree(params: Mapping, *, max_depth: int = MAX_DEPTH, max_entries: int = MAX_ENTRIES) -> int:
    """Check that a nested mapping can be walked: :func:`walk` to the end.

    Callers that walk a tree recursively (rebuilding it, writing it) call this first, so
    that their recursion is bounded; its cost is at most `max_entries` steps.

    Parameters
    ----------
    params : mapping
        The tree.
    max_depth, max_entries : int
        As for :func:`walk`.

    Returns
    -------
    int
        The number of entries visited.

    Raises
    ------
    TreeError
        As :func:`walk` does.
    """
    return sum(1 for _ in walk(params, max_depth=max_depth, max_entries=max_entries))


# --------------------------------------------------------------------------------------
# Addressing and rebuilding
# --------------------------------------------------------------------------------------


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


def lookup(params: Mapping, path: Path) -> Any:
    """The value at `path` (a tuple of keys, one per level).

    Raises
    ------
    KeyError
        Naming the part of the path that is missing.
    """
    return _node(params, path[:-1], path)[path[-1]]


def _rebuild(like: Mapping, items: Iterable[tuple[Any, Any]]) -> Mapping:
    """A new mapping holding `items`, of the type of `like` where possible."""
    data = dict(items)
    cls: Any = type(like)
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
