"""Which decoder layers of a Hugging Face checkpoint go, on calibration data.

* :func:`score_layers`: each layer's ``1 - cosine(input, output)`` of the residual
  stream on the dense model (``--no-compensate`` removes the lowest);
* :func:`choose_layers`: the layers chosen one at a time, each scored as it would be
  refit into the layer before, on the model shrunk so far (the default);
* the report of either, as the command prints it.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import numpy as np

from arrayprune.adapters.pipeline.hf_calibration import workdir_beside
from arrayprune.adapters.pipeline.hf_structure import RefitChanges, layer_changes, refit_changes
from arrayprune.adapters.pipeline.shrink_checkpoint import open_hf
from arrayprune.adapters.pipeline.shrink_folder import (
    UnitReport,
    UnitScores,
    _count_kept,
    _Named,
    _Unitset,
    _walk,
)
from arrayprune.adapters.roles.hf_groups import HfGroupsError, HfLayers, hf_layers
from arrayprune.structured import absorb

__all__ = ["choose_layers", "score_layers"]


def score_layers(
    src: Any, calibration: str, *, rows: int | None = None, device: Any = None, hooks: Any = None
) -> tuple[HfLayers, np.ndarray]:
    """The decoder layers of a checkpoint folder and their scores (mean ``1 - cosine``; lowest go)."""
    ckpt, config = open_hf(src)
    layers = hf_layers(config, {n: t.shape for n, t in ckpt.tensors.items()})
    with _walk(ckpt, calibration, rows, device) as walk:
        _check_layers(walk, layers)
        return layers, layer_changes(walk, hooks)


def _check_layers(walk: Any, layers: HfLayers) -> None:
    if len(walk.layers) != layers.units:
        raise HfGroupsError(f"transformers builds {len(walk.layers)} layers, the checkpoint holds {layers.units}")


_LAYER_SCORE = "1 - cosine(input, output) of each layer's residual stream, mean over calibration tokens"
_REFIT_LAYER_SCORE = (
    "1 - cosine between the residual stream after each layer and after the layer before once the layer is "
    "removed and refit into it, mean over calibration tokens, on the dense model"
)


def _layers_report(scores: UnitScores) -> UnitReport:
    """The layers with their scores: as they are, or once refit (:func:`choose_layers`)."""
    layers = scores.found
    name = layers.names[0].rsplit(".", 1)[0]
    what, kept = (_LAYER_SCORE, None) if scores.order is None else (_REFIT_LAYER_SCORE, scores.kept)
    units = [_Unitset(_Named(name, layers.units), "layers")]
    return UnitReport("layers", units, {name: scores.scores}, what, kept=kept)


def _order_notes(scores: UnitScores) -> list[str]:
    """The order in which :func:`choose_layers` removed layers, with their scores then."""
    if not scores.order:
        return []
    steps = ", ".join(f"{i} ({score:.4g})" for i, score in scores.order)
    return [f"layers chosen one at a time, each rescored on the model without those before it: {steps}"]


def choose_layers(
    src: Any,
    amount: int | float,
    calibration: str,
    *,
    beside: str | None = None,
    damp: float = 0.01,
    rows: int | None = None,
    device: Any = None,
    hooks: Any = None,
) -> UnitScores:
    """Choose the layers to remove one at a time, each scored as it would be refit.

    Each step walks the model as shrunk so far (the layers chosen left out, what they
    added refit into the layer before) and removes the layer of lowest
    :func:`~arrayprune.adapters.pipeline.hf_structure.refit_changes` score: the one whose
    removal, refit, changes the residual stream after it least. Scoring layers once on
    the dense model misses how removals interact (a layer next to a removed one must
    absorb the run). Each step after the first rescores only from the layer refit on (the
    scores before it cannot have changed), with a walk that stops there if a kept score is
    the lowest; a layer scored costs three runs of a layer and one ``X^T X``. The refit
    weights of the layers chosen are kept on disk between walks: in a temporary folder
    beside `beside` (the output; the system's temporary folder without it).

    Parameters
    ----------
    src : str
        A Hugging Face checkpoint folder.
    amount : int or float
        A fraction of the layers, or their number; one layer at least stays.
    calibration : str
        Token ids (``.npz``, ``input_ids``).
    beside : str, optional
        Where the output goes: the refit weights wait in a folder beside it.
    damp : float, default 0.01
        The damping of the refits' Hessians (:func:`arrayprune.structured.absorb`).
    rows, device, hooks
        Sequences run at a time, where the layers run, progress (as for
        :func:`score_layers`).

    Returns
    -------
    UnitScores
        ``residual_change`` scores of the dense model (the first step), the layers kept,
        and `order`: each layer removed with its score when it was.
    """
    ckpt, config = open_hf(src)
    layers = hf_layers(config, {n: t.shape for n, t in ckpt.tensors.items()})
    keeps = _count_kept(amount, layers.units, "layers")
    writers = {p: w[0] for p in range(layers.units) if (w := layers.writer(p)) is not None and w[0] in ckpt.tensors}
    probed = layers.checked(writers)

    def refit(p: int, weight: Any, hessian: Any, cross: Any) -> Any:
        return absorb(weight, hessian, cross, damp, overwrite_hessian=True)

    def walked(**window: Any) -> RefitChanges:
        with _walk(ckpt, calibration, rows, device) as walk:
            _check_layers(walk, layers)
            walk.replaced = replaced
            return refit_changes(walk, writers, refit, hooks, probed=probed, skip={i for i, _ in order}, **window)

    first: np.ndarray | None = None
    scores = np.full(layers.units, np.nan)
    order: list[tuple[int, float]] = []
    replaced: dict[str, str] = {}
    start = 0  # the layers before it kept their scores: nothing before them changed
    with workdir_beside(beside) if beside is not None else tempfile.TemporaryDirectory() as workdir:
        while len(order) < layers.units - keeps:
            found = walked(start=start)
            scores[start:] = found.scores[start:]
            first = scores.copy() if first is None else first
            writers = {p: w for p, w in writers.items() if p not in found.failed}
            probed = set()  # the check is of the layer's form, not of its weights: once is enough
            i = int(np.nanargmin(scores))
            lowest = found.lowest
            if i < start:  # a score kept from before: its refit again, the walk stopping there
                lowest = walked(start=i, stop=i + 1).lowest
            order.append((i, float(scores[i])))
            scores[i] = np.nan
            start = i
            if lowest is not None:  # in the walk's precision: the layers run in float32
                start, key, weight = lowest  # the layer refit: the first whose score changes
                replaced[key] = os.path.join(workdir, f"{len(order)}.npy")
                np.save(replaced[key], weight.float().cpu().numpy())
            del found, lowest
    name = layers.names[0].rsplit(".", 1)[0]
    gone = {i for i, _ in order}
    kept = np.asarray([i for i in range(layers.units) if i not in gone])
    return UnitScores("residual_change", layers, first, {name: kept}, order=order)
