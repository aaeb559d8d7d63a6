"""The layers that read an ONNX channel group, where calibrated structured methods score it.

A calibrated structured method (:class:`arrayprune.UnitPruningMethod`:
``activation_structured``, ``obs_structured``) scores a group's channels in the layers
that *read* them, its consumers (``MatMul`` and ``Gemm`` B, ``Conv`` with ``group=1``), on
``X^T X`` of their input rows from calibration data, and refits them on the channels that
stay. :func:`consumers` finds them (and refuses, in one line naming the group, a layer
whose statistic cannot be taken here); :func:`calibrated_scores` scores every group,
:func:`refits` gives each consumer its refit weight, :func:`check_hessians` checks the
Hessians given. :func:`~arrayprune.adapters.shrink.shrink_onnx` puts them together; the
torch drop-in's counterpart is :mod:`arrayprune.adapters.torch.shrink_calibrated`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from arrayprune.structured_methods import UnitPruningMethod

from .roles.onnx_graph import _attr, _onnx
from .roles.onnx_group_types import even_drop
from .roles.onnx_groups import OnnxGroups, View

__all__ = ["Consumer", "calibrated_scores", "check_hessians", "consumers", "refits"]


@dataclass(frozen=True)
class Consumer:
    """A layer reading the channels of a group: where a calibrated method scores them.

    Attributes
    ----------
    weight : str
        Its weight initializer (read by this layer alone).
    op : str
        ``"MatMul"``, ``"Gemm"`` or ``"Conv"`` (``group=1``).
    label : str
        The operator, for people.
    transposed : bool
        A ``Gemm`` B stored ``[N, K]`` (``transB=1``).
    scale : float
        A ``Gemm``'s ``alpha`` (1 otherwise): scores are taken on ``alpha * W``.
    kernel : int
        Entries of a convolution's kernel (``kh * kw``); 1 for ``MatMul`` and ``Gemm``.
    block : int
        Input features per channel of the groups it reads (a head's size, a GroupNorm
        group's channels; 1 for plain channels).
    """

    weight: str
    op: str
    label: str
    transposed: bool = False
    scale: float = 1.0
    kernel: int = 1
    block: int = 1

    @property
    def per(self) -> int:
        """Columns of :meth:`matrix` per channel of the groups it reads."""
        return self.block * self.kernel

    def matrix(self, w: np.ndarray) -> np.ndarray:
        """Its weight `w` as ``[out, in * kernel]`` in float64 (input channels channel-major)."""
        a = np.asarray(w, dtype=np.float64)
        if self.op == "Conv":
            return a.reshape(a.shape[0], -1)
        return a if self.transposed else a.T

    def stored(self, m: np.ndarray, like: np.ndarray) -> np.ndarray:
        """The inverse of :meth:`matrix`: `m` in the layout and dtype of `like`."""
        a = m.reshape(like.shape) if self.op == "Conv" else (m if self.transposed else m.T)
        return np.ascontiguousarray(a.astype(like.dtype))



def _closing(og: Any, views: Mapping[str, View]) -> list[tuple[str, str, int, int]]:
    """(initializer, operator label, first channel, block) of each layer closing `og`."""
    out = []
    for key, label in zip(og.closing, og.consumers, strict=True):
        view = views.get(key)
        if view is None:
            out.append((key, label, 0, 1))
            continue
        if view.rewire is not None:
            raise ValueError(
                f"group {og.group.name!r}: {label} reads its channels through {view.source!r}, an initializer "
                "shared with other operators or read through Identity; calibrated scores need a weight of its own"
            )
        if view.segments > 1:
            raise ValueError(
                f"group {og.group.name!r}: grouped {label} reads its channels; calibrated scores are taken on "
                "MatMul, Gemm and Conv with group=1 only"
            )
        if view.start % view.block:
            raise ValueError(f"group {og.group.name!r}: {label} reads its channels inside a block")
        out.append((view.source, label, view.start // view.block, view.block))
    return out


def consumers(
    model: Any, found: OnnxGroups, amount: int | float | None = None, rounding: str = "nearest"
) -> tuple[dict[str, Consumer], list[list[tuple[str, int]]]]:
    """The layers that read the channels of `found`'s groups, and where each group's channels lie in them.

    A calibrated method scores a group's channels in these layers, on ``X^T X`` of their
    input rows (the tokens of a ``MatMul`` or ``Gemm`` A, the patches of a convolution,
    channel-major): :func:`shrink_onnx` takes those Hessians by weight name.

    Parameters
    ----------
    model : onnx.ModelProto
        The model.
    found : OnnxGroups
        Its groups (:func:`~arrayprune.adapters.roles.onnx_groups.onnx_groups`).
    amount, rounding : optional
        What each group loses (as for :func:`~arrayprune.adapters.shrink.shrink_onnx`):
        a group that loses no channel is not scored, so its readers are not asked for.

    Returns
    -------
    (dict of str to Consumer, list of list of (str, int))
        The consumers by weight name, in graph order; per group, each consumer's weight
        name and the first unit of its input the group's channels take (after a
        ``Concat``); none for a group that loses no channel.

    Raises
    ------
    ValueError
        A group read by a layer whose statistic cannot be taken here (a grouped
        convolution, a weight shared with other operators or read through
        ``Identity``); one line naming the group.
    """
    onnx = _onnx()
    views: dict[str, View] = {k: v for og in found.groups for k, v in og.views}
    readers = {n.input[1]: n for n in model.graph.node if n.op_type in ("MatMul", "Gemm", "Conv") and len(n.input) > 1}
    dims_of = {t.name: [int(d) for d in t.dims] for t in model.graph.initializer}
    found_consumers: dict[str, Consumer] = {}
    reads: list[list[tuple[str, int]]] = []
    for og in found.groups:
        slots: list[tuple[str, int]] = []
        reads.append(slots)
        if amount is not None and not even_drop(amount, og.group.channels, og.segments, str(og.group.name), rounding):
            continue
        for weight, label, offset, block in _closing(og, views):
            node = readers.get(weight)
            if node is None:
                raise ValueError(f"group {og.group.name!r}: {label} does not read {weight!r} as its weight")
            if node.op_type == "Conv" and int(_attr(onnx, node, "group", 1)) != 1:
                raise ValueError(f"group {og.group.name!r}: grouped {label} reads its channels")
            dims = dims_of[weight]
            c = Consumer(
                weight,
                node.op_type,
                label,
                transposed=node.op_type == "Gemm" and bool(int(_attr(onnx, node, "transB", 0))),
                scale=float(_attr(onnx, node, "alpha", 1.0)) if node.op_type == "Gemm" else 1.0,
                kernel=int(np.prod(dims[2:])) if node.op_type == "Conv" else 1,
                block=block,
            )
            known = found_consumers.setdefault(weight, c)
            if known != c:
                raise ValueError(f"group {og.group.name!r}: {label} reads channels of groups of different sizes")
            slots.append((weight, offset))
    return found_consumers, reads


def _matrices(cons: Mapping[str, Consumer], weights: Mapping[str, np.ndarray], scaled: bool) -> Any:
    """``matrix(name)``: a consumer's weight ``[out, in]`` (times Gemm's ``alpha`` when `scaled`)."""

    def matrix(name: Any) -> np.ndarray:
        c = cons[name]
        w = c.matrix(weights[name])
        return w if c.scale == 1 or not scaled else w * c.scale

    return matrix


def calibrated_scores(
    method: UnitPruningMethod,
    found: OnnxGroups,
    reads: Sequence[Sequence[tuple[str, int]]],
    cons: Mapping[str, Consumer],
    weights: Mapping[str, np.ndarray],
    hessians: Mapping[str, np.ndarray],
) -> list[np.ndarray]:
    """Per group, one score per channel: ``method.group_scores`` over its consumers (zeros for
    a group that loses no channel: nothing to rank)."""
    sizes = [og.group.channels for og in found.groups]
    scores = method.group_scores(
        reads, sizes, _matrices(cons, weights, scaled=True), hessians, {name: c.per for name, c in cons.items()}
    )
    return [np.zeros(n) if s is None else np.asarray(s) for n, s in zip(sizes, scores, strict=True)]


def refits(
    method: UnitPruningMethod,
    found: OnnxGroups,
    kept: Sequence[np.ndarray],
    reads: Sequence[Sequence[tuple[str, int]]],
    cons: Mapping[str, Consumer],
    weights: Mapping[str, np.ndarray],
    hessians: Mapping[str, np.ndarray],
) -> dict[str, np.ndarray]:
    """Each consumer that loses channels: its new weight as stored (``method.refit_consumers``)."""
    new = method.refit_consumers(
        [np.asarray(k).tolist() for k in kept], reads, [og.group.channels for og in found.groups],
        _matrices(cons, weights, scaled=False), {n: np.asarray(h) for n, h in hessians.items()},
        {name: c.per for name, c in cons.items()},
    )  # fmt: skip
    return {str(name): cons[str(name)].stored(np.asarray(w), weights[str(name)]) for name, w in new.items()}


def check_hessians(cons: Mapping[str, Consumer], weights: Mapping[str, np.ndarray], hessians: Mapping) -> None:
    for name, c in cons.items():
        h = hessians.get(name)
        if h is None:
            raise ValueError(f"hessians has no entry for {name!r}, the weight of {c.label} (a consumer of a group)")
        shape = np.shape(weights[name])
        k = int(np.prod(shape[1:])) if c.op == "Conv" else int(shape[1] if c.transposed else shape[0])
        if tuple(np.shape(h)) != (k, k):
            raise ValueError(f"hessians[{name!r}] has shape {tuple(np.shape(h))}; {c.label} reads {k} input features")
