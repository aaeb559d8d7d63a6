"""Shrink an in-memory :mod:`transformers` language model: channels, heads, layers or experts removed.

:func:`shrink_llm` is the file route (``arrayprune prune FOLDER --shrink --groups ...``)
for a model already in memory. It writes the model with ``save_pretrained`` to a
temporary folder, shrinks that folder with the same pipeline (the family table of
:mod:`arrayprune.adapters.roles.hf_groups`, the layer-by-layer calibration runner, the
scores and refit of :mod:`arrayprune.structured`), and loads the result with
``from_pretrained`` into a new model of the same class, dtype and device. The result is
therefore the file route's, tensor for tensor: the same units removed, the same config
(``num_hidden_layers``, ``layer_types``, ``intermediate_size``, ``num_attention_heads`` /
``num_key_value_heads``, ``num_local_experts`` / ``num_experts``) and the same parameter
names that ``save_pretrained`` writes.

Disk and memory: the temporary folder holds the dense and the shrunk checkpoints (about
twice the model's size on disk, in ``tempfile.gettempdir()`` unless `workdir` says where);
the shrinking itself reads one decoder layer at a time.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import numpy as np

from arrayprune.adapters.pipeline.errors import error_text
from arrayprune.adapters.pipeline.hf_calibration import TOKENS_KEY, token_problems
from arrayprune.adapters.pipeline.method_names import unit_methods
from arrayprune.adapters.pipeline.runner import prune_file

__all__ = ["GROUPS", "shrink_llm"]

#: The kinds of unit :func:`shrink_llm` removes.
GROUPS = ("channels", "heads", "layers", "experts")


def _check_model(model: Any) -> Any:
    config = getattr(model, "config", None)
    if not callable(getattr(model, "save_pretrained", None)) or config is None:
        raise TypeError(
            f"shrink_llm() takes a transformers model (a PreTrainedModel with save_pretrained), "
            f"not {type(model).__name__}"
        )
    return config


def _check_amount(amount: Any) -> None:
    if isinstance(amount, bool) or not isinstance(amount, int | float):
        raise TypeError(f"amount must be an int or a float, not {type(amount).__name__}")
    if isinstance(amount, float) and not 0.0 <= amount <= 1.0:
        raise ValueError(f"amount={amount} should either be a float in the range [0, 1] or a non-negative integer")
    if isinstance(amount, int) and amount < 0:
        raise ValueError(f"amount={amount} should either be a float in the range [0, 1] or a non-negative integer")


def _tokens(calibration: Any, vocab_size: int | None) -> np.ndarray:
    import torch

    if isinstance(calibration, torch.Tensor):
        if calibration.is_floating_point() or calibration.is_complex() or calibration.dtype == torch.bool:
            raise TypeError(f"calibration must be a tensor of token ids (integers), not {calibration.dtype}")
        ids = calibration.detach().to("cpu", torch.int64).numpy()
    elif isinstance(calibration, np.ndarray):
        if calibration.dtype.kind not in "iu":
            raise TypeError(f"calibration must be an array of token ids (integers), not {calibration.dtype}")
        ids = calibration.astype(np.int64)
    else:
        raise TypeError(f"calibration must be a tensor of token ids [batch, seq], not {type(calibration).__name__}")
    if ids.ndim == 1:
        ids = ids[None, :]
    problems = token_problems({TOKENS_KEY: ids}, vocab_size)
    if problems:
        raise ValueError(f"calibration: {problems[0]}")
    return ids


def shrink_llm(
    model: Any,
    calibration: Any = None,
    *,
    groups: str = "channels",
    amount: int | float,
    method: str = "ln_structured",
    compensate: bool = True,
    calibration_batch: int | None = None,
    workdir: Any = None,
) -> Any:
    """Remove MLP channels, attention heads, decoder layers or experts of a transformers model.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A causal LM (or base model) of a family of the table
        (:data:`arrayprune.adapters.roles.hf_groups.FAMILIES`): Llama, Mistral, Qwen2/3,
        Gemma, Phi-3, Mixtral, Qwen2-MoE/Qwen3-MoE, ... It is left as it was.
    calibration : torch.Tensor or numpy.ndarray, optional
        Token ids ``[batch, seq]`` (or ``[seq]``), integers in ``[0, vocab_size)``. Needed
        by ``groups="layers"`` and by the calibrated methods; ranks experts by their
        router statistics when given.
    groups : {"channels", "heads", "layers", "experts"}, default "channels"
        The kind of unit removed: MLP channels (every layer loses the same count), KV
        groups of attention heads, whole decoder layers, or the experts of every MoE
        layer.
    amount : int or float
        A fraction of the units of that kind (of each layer's, for channels, heads and
        experts; of all layers, for layers), or a count.
    method : str, default "ln_structured"
        How channels and heads are scored: ``"ln_structured"`` (weight norm, no data),
        ``"activation_structured"`` or ``"obs_structured"`` (on `calibration`), or a
        registered :class:`~arrayprune.UnitPruningMethod`. Layers and experts have their
        own scores (``1 - cosine`` of the residual stream; router statistics).
    compensate : bool, default True
        With a calibrated method, refit the consumer's kept columns
        (:func:`arrayprune.structured.compensate`); with ``groups="layers"``, refit each
        run of removed layers into the last projection of the layer before it
        (:func:`arrayprune.structured.absorb`). Ignored by the others.
    calibration_batch : int, optional
        Calibration sequences run at a time (on the model's device, one layer at a time).
    workdir : str or os.PathLike, optional
        Where the temporary checkpoints go (default ``tempfile.gettempdir()``).

    Returns
    -------
    transformers.PreTrainedModel
        A new model of `model`'s class, dtype, device and train/eval mode, with the
        units physically removed and its config rewritten, equal to what
        ``save_pretrained`` -> ``arrayprune prune --shrink`` -> ``from_pretrained`` gives.

    Raises
    ------
    TypeError
        A model that is not a transformers model, an amount or calibration of the wrong type.
    ValueError
        An unknown group or method, an amount the model cannot lose, token ids out of
        range, a family the table does not know; one line, the model left as it was (the
        argument checks come before anything is saved; the pipeline's own, such as a
        count a layer cannot lose, on the temporary folder, which is removed).

    Examples
    --------
    >>> import arrayprune.adapters.torch as prune
    >>> small = prune.shrink_llm(model, ids, groups="channels", amount=0.25,
    ...                          method="obs_structured")  # doctest: +SKIP
    >>> small.config.intermediate_size  # doctest: +SKIP
    """
    import torch
    import transformers

    config = _check_model(model)
    if not isinstance(groups, str) or groups not in GROUPS:
        raise ValueError(f"groups must be one of {', '.join(map(repr, GROUPS))}, not {groups!r}")
    _check_amount(amount)
    if not isinstance(method, str):
        raise TypeError(f"method must be a method's name (str), not {type(method).__name__}")
    if not isinstance(compensate, bool):
        raise TypeError(f"compensate must be a bool, not {type(compensate).__name__}")
    calibrated = method in unit_methods()
    if method != "ln_structured" and not calibrated:
        choices = ", ".join(map(repr, ("ln_structured", *unit_methods())))
        raise ValueError(f"method must be one that removes whole units ({choices}), not {method!r}")
    if groups in ("layers", "experts") and method != "ln_structured":
        raise ValueError(f"groups={groups!r} ranks {groups} by its own score: leave method as 'ln_structured'")
    if calibrated and calibration is None:
        raise ValueError(f"method={method!r} scores units on calibration data: pass calibration token ids")
    if groups == "layers" and calibration is None:
        raise ValueError("groups='layers' ranks layers on calibration data: pass calibration token ids")
    if calibration is not None and groups in ("channels", "heads") and not calibrated:
        raise ValueError(
            f"calibration ranks {groups} with method {' or '.join(map(repr, unit_methods()))}, not {method!r}"
        )
    ids = None if calibration is None else _tokens(calibration, getattr(config, "vocab_size", None))
    options: dict[str, Any] = {"shrink": True, "groups": groups, "amount": amount, "method": method}
    if calibration_batch is not None:
        options["calibration_batch"] = calibration_batch
    if (calibrated or groups == "layers") and not compensate:
        options["compensate"] = False
    first = next(iter(model.parameters()), None)
    dtype = first.dtype if first is not None else torch.float32
    device = first.device if first is not None else torch.device("cpu")
    if ids is not None and device.type != "cpu":
        options["device"] = str(device)  # the calibration runs where the model is
    with tempfile.TemporaryDirectory(prefix="arrayprune-llm-", dir=workdir) as tmp:
        dense, small = os.path.join(tmp, "dense"), os.path.join(tmp, "small")
        bars = transformers.utils.logging.is_progress_bar_enabled()
        transformers.utils.logging.disable_progress_bar()
        try:
            model.save_pretrained(dense)
        finally:
            if bars:
                transformers.utils.logging.enable_progress_bar()
        if ids is not None:
            options["calibration"] = os.path.join(tmp, "tokens.npz")
            np.savez(options["calibration"], input_ids=ids)
        try:
            prune_file(dense, small, **options)
        except ValueError as exc:
            text = error_text(exc)
            text = text[len(dense) + 2 :] if text.startswith(dense + ": ") else text
            raise ValueError(text.removeprefix("--shrink: ")) from None
        transformers.utils.logging.disable_progress_bar()
        try:
            out = type(model).from_pretrained(small, dtype=dtype)
        finally:
            if bars:
                transformers.utils.logging.enable_progress_bar()
    out.to(device)
    out.train(model.training)
    return out
