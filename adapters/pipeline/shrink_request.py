"""The options of a request that shrinks (``--shrink``, ``--groups``): what goes with them.

Checked by :meth:`arrayprune.adapters.pipeline.request.PruneSpec.checked`, before the other
options, so that an option that cannot go with ``--shrink`` is named as such. What a
file cannot do with them (not ONNX nor a Hugging Face folder) is :func:`format_refusal`,
by the format of the input, asked when the shrink job is resolved
(:meth:`arrayprune.adapters.pipeline.job.ShrinkJob.resolve`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import arrayprune
from arrayprune import amount as _amount
from arrayprune.adapters.pipeline.errors import PruneError
from arrayprune.adapters.pipeline.method_names import unit_methods
from arrayprune.adapters.roles.onnx_group_types import ROUNDINGS, OnnxGroups, even_drop
from arrayprune.method_parts import prunes_units

if TYPE_CHECKING:  # the request module imports this one
    from arrayprune.adapters.pipeline.request import PruneSpec

__all__ = ["GROUPS", "channel_methods", "check_group_amount", "check_shrink", "format_refusal"]

#: The values of ``--groups``: the coupled channels of layers, attention heads, whole
#: decoder layers, the experts of mixture-of-experts layers (the last two: Hugging Face
#: checkpoint folders).
GROUPS = ("channels", "heads", "layers", "experts")


def channel_methods() -> list[str]:
    """The methods of the table that remove whole channels scored by their weights: those
    that score channels, not on calibration data (those are :func:`unit_methods`)."""
    return [
        name
        for name, cls in arrayprune.METHODS.items()
        if callable(getattr(cls, "channel_scores", None)) and not prunes_units(cls)
    ]


def check_shrink(spec: PruneSpec) -> None:
    """Refuse what cannot go with ``shrink`` (or ``groups`` without it).

    Raises
    ------
    PruneError
        One line naming the flags.
    """

    if spec.groups is not None and spec.groups not in GROUPS:
        raise PruneError(f"invalid choice for --groups: {spec.groups!r} (choose from {', '.join(GROUPS)})")
    if spec.rounding not in ROUNDINGS:
        raise PruneError(f"invalid choice for --rounding: {spec.rounding!r} (choose from {', '.join(ROUNDINGS)})")
    if spec.rounding != "nearest":
        if not spec.shrink:
            raise PruneError("--rounding says how --shrink counts each group's channels: add --shrink")
        if spec.global_:
            raise PruneError("--rounding counts each group's channels; --global ranks all channels at once")
        if spec.groups in ("layers", "experts") or spec.method in unit_methods():
            raise PruneError("--rounding applies to channels and heads scored by their weights")
    if not spec.shrink:
        if spec.groups is not None:
            raise PruneError("--groups says what --shrink removes: add --shrink")
        if spec.method in unit_methods():
            raise PruneError(f"--method {spec.method} scores the units --shrink removes: add --shrink")
        if not spec.compensate:
            raise PruneError("--no-compensate goes with --shrink and a calibrated method")
        return
    calibrated = spec.method in unit_methods()
    if spec.groups == "layers" and not spec.calibration:
        raise PruneError(
            "--groups layers ranks layers by how much they change the residual stream on calibration data: "
            "add --calibration tokens.npz"
        )
    if calibrated and spec.groups in ("layers", "experts"):
        raise PruneError(f"--method {spec.method} scores channels and heads; --groups {spec.groups} has its own score")
    if calibrated and not spec.calibration:
        raise PruneError(
            f"--method {spec.method} scores units on calibration data: add --calibration "
            "(token ids for a folder, graph inputs for an ONNX model)"
        )
    if not spec.compensate and not calibrated and spec.groups != "layers":
        raise PruneError(
            f"--no-compensate turns off the refit of {' and '.join(unit_methods())}, and of --groups layers"
        )
    whole_units = spec.groups in ("layers", "experts")  # their own scores: the method is not asked
    if not calibrated and not whole_units and not callable(getattr(spec.method_class(), "channel_scores", None)):
        raise PruneError(
            f"--shrink removes whole channels: use a method that scores channels "
            f"({' or '.join(channel_methods())}), not {spec.method}"
        )
    if spec.min_sparsity is not None or spec.max_sparsity is not None or spec.lamp:
        raise PruneError("--min-sparsity, --max-sparsity and --lamp shape entry pruning; they do not go with --shrink")
    if spec.keep_masks:
        raise PruneError("--keep-masks does not go with --shrink: shrinking changes the shapes that masks would keep")
    if spec.dim is not None:
        raise PruneError("--dim does not apply to --shrink: each tensor of a channel group has its own axis")
    if spec.include or spec.exclude or spec.min_size:
        raise PruneError(
            "--include, --exclude and --min-size select tensors; --shrink removes every channel group of the "
            "graph (selecting groups is not supported yet)"
        )


def format_refusal(kind: str, spec: PruneSpec) -> str | None:
    """What an input of format `kind` cannot do with ``shrink``, as one line; None if it can."""
    if not spec.shrink:
        return None
    if kind in ("sharded safetensors", "safetensors folder", "Hugging Face checkpoint"):
        if spec.global_:
            return (
                "--global does not go with --shrink on a Hugging Face checkpoint: its config.json holds one size "
                "for all layers (intermediate_size, num_attention_heads), so every layer loses the same count"
            )
        return None  # --verify there is arrayprune eval of OUT against IN (runner.run)
    if kind != "onnx":
        return (
            "--shrink reads channel groups from an ONNX graph or a Hugging Face checkpoint folder "
            f"(config.json and safetensors), not from a {kind} file"
        )
    if spec.groups in ("layers", "experts"):
        return (
            f"--groups {spec.groups} reads the layers of a Hugging Face checkpoint folder (config.json); "
            "an ONNX model shrinks by --groups channels or heads"
        )
    if spec.method in unit_methods() and spec.global_:
        return f"--method {spec.method} scores each channel group on its consumers; --global is not supported with it"
    return None


def check_group_amount(
    found: OnnxGroups, amount: int | float, src: str, global_: bool = False, rounding: str = "nearest"
) -> None:
    """Refuse an amount that a group of an ONNX graph cannot lose (a count above its channels, or all of them).

    With `global_`, an amount of all channels that would leave a group none.
    """
    if global_:
        total, n = sum(g.group.channels for g in found.groups), len(found.groups)
        k = _amount.compute_nparams_toprune(amount, total)
        if n and (k > total - n or (_amount.is_count(amount) and amount > total)):
            raise PruneError(
                f"--amount {amount} with --global would remove {k} of the {total} channels of {n} channel groups; "
                f"each keeps at least one, so at most {total - n} can go",
                src,
            )
        return
    for g in found.groups:
        n = g.group.channels
        k = even_drop(amount, n, 1, str(g.group.name), rounding)
        if k >= n or (_amount.is_count(amount) and amount > n):
            raise PruneError(f"--amount {amount} would remove every channel of group {g.group.name!r} ({n})", src)
