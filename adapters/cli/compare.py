"""``arrayprune report FILE --compare OTHER``: parameters and tensor shapes of two files side by side.

Made for a model and its shrunk copy (``prune --shrink``): the parameter count of each
(entries of all tensors) and every tensor whose shape differs, as ``before -> after``;
tensors of one file only are named. Only shapes are read: safetensors (one file or
sharded) from their headers, other formats loaded as ``report`` loads them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any

from arrayprune.adapters.pipeline import Hooks, open_storage
from arrayprune.adapters.state_dict import iter_entries

from .errors import CliError
from .tensors import _stage

__all__ = ["compare_shapes", "run_compare", "tensor_shapes"]


def tensor_shapes(path: str) -> tuple[str, dict[str, tuple[int, ...]]]:
    """The format of `path` and the shape of each of its tensors, by name (nested names joined by ``.``)."""
    if not os.path.exists(path):
        raise CliError("no such file", path)
    storage = open_storage(path, Hooks(stage=_stage))
    shapes = {}
    for key, value, _ in iter_entries(storage.params):
        if hasattr(value, "shape") and hasattr(value, "dtype"):
            shapes[".".join(map(str, key))] = tuple(int(n) for n in value.shape)
    return storage.kind, shapes


def compare_shapes(before: dict[str, tuple[int, ...]], after: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    """Parameter counts and the tensors whose shape differs, or that one side lacks.

    Returns
    -------
    dict
        ``parameters`` (``before``, ``after``), ``changed`` (name, before, after, in the
        first file's order, then the second's), ``same`` (how many tensors have the same
        shape), ``only_before``, ``only_after`` (names).
    """
    changed = [
        {"name": n, "before": list(before[n]), "after": list(after[n])}
        for n in before
        if n in after and before[n] != after[n]
    ]
    return {
        "parameters": {
            "before": sum(math.prod(s) for s in before.values()),
            "after": sum(math.prod(s) for s in after.values()),
        },
        "changed": changed,
        "same": sum(1 for n in before if n in after and before[n] == after[n]),
        "only_before": [n for n in before if n not in after],
        "only_after": [n for n in after if n not in before],
    }


def _shape(s: list[int]) -> str:
    return "x".join(map(str, s)) or "scalar"


def run_compare(args: argparse.Namespace) -> int:
    """Run ``arrayprune report FILE --compare OTHER``."""
    kind_a, a = tensor_shapes(args.file)
    kind_b, b = tensor_shapes(args.compare)
    out = compare_shapes(a, b)
    if args.json:
        json.dump({"file": args.file, "compare": args.compare, **out}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    before, after = out["parameters"]["before"], out["parameters"]["after"]
    pct = f"{100.0 * after / before:.2f}%" if before else "-"
    print(f"{args.file} ({kind_a}) -> {args.compare} ({kind_b})")
    print(f"parameters: {before} -> {after} ({pct})")
    if out["changed"]:
        rows = [("name", "shape", "")] + [(c["name"], _shape(c["before"]), _shape(c["after"])) for c in out["changed"]]
        widths = [max(len(r[i]) for r in rows) for i in range(2)]
        for i, (name, x, y) in enumerate(rows):
            print(f"{name.ljust(widths[0])}  {x.rjust(widths[1])}" + (f" -> {y}" if i else ""))
    print(f"{out['same']} tensors of the same shape, {len(out['changed'])} changed")
    for where, names in ((args.file, out["only_before"]), (args.compare, out["only_after"])):
        if names:
            print(f"only in {where}: {', '.join(names)}")
    return 0
