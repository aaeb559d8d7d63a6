"""Calibration for Wanda: input-feature norms of a model's layers, in one pass.

:func:`input_norms` runs calibration batches through the dense model once, with a
forward pre-hook on each chosen ``Linear`` and convolution, and keeps per layer only a
running sum of squares per input feature (float64, on the layer's device): memory is
one vector per layer, whatever the number of batches. Norms are keyed by *weight name*
(``"encoder.fc1.weight"``), the names of the model's ``state_dict`` and of the command
line's ``--input-norms``: :func:`save_input_norms` writes them in that file's format, so
that a model saved as safetensors or a state dict is pruned by ``arrayprune prune
model.safetensors --method wanda --input-norms norms.npz`` with the masks of the
drop-in's Wanda. :func:`wanda_importance` turns the norms into Wanda's scores, ready for
the verbs::

    scores = prune.wanda_importance(model, batches)          # one pass, no gradients
    for module, s in scores.items():
        prune.wanda(module, "weight", amount=0.5, importance_scores=s)

The same scores feed ``prune.nm_structured(module, "weight", 2, 4, dim=1,
importance_scores=s)`` (the paper's 2:4 setting) and ``prune.global_unstructured``.
All norms come from the unpruned model: the paper's block-by-block variant, which
calibrates each block on the output of the blocks already pruned, is not done here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

import arrayprune
from arrayprune.adapters import formats

__all__ = ["input_norms", "save_input_norms", "wanda_importance"]

_LAYERS = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


def is_transposed_linear(module: nn.Module) -> bool:
    """Whether `module` is Hugging Face's ``Conv1D`` (GPT-2): a Linear whose weight is stored ``[in, out]``.

    Its forward is ``x @ weight + bias``; transformers is not imported to tell.
    """
    weight = getattr(module, "weight", None)
    return (
        type(module).__name__ == "Conv1D"
        and hasattr(module, "nf")
        and isinstance(weight, torch.Tensor)
        and weight.ndim == 2
    )


def layer_list(model: Any, config: Any) -> tuple[str, Any]:
    """The qualified name and the ``ModuleList`` of the model's decoder (or encoder) layers."""
    count = getattr(config, "num_hidden_layers", None)
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) == count:
            return name, module
    raise ValueError(f"{type(model).__name__} has no list of its {count} layers (num_hidden_layers)")


def block_layers(model: nn.Module, layers: dict[str, nn.Module]) -> dict[str, nn.Module]:
    """The entries of `layers` inside the repeated blocks of a transformers model.

    A model whose ``config`` gives ``num_hidden_layers`` has a ``ModuleList`` of that many
    decoder (or encoder) layers; layer-by-layer calibration reaches only the layers inside
    them, so the output embeddings (``lm_head``), a pooler or classifier heads are left.
    Any other model: `layers` as given.
    """
    config = getattr(model, "config", None)
    if not isinstance(getattr(config, "num_hidden_layers", None), int):
        return layers
    try:
        prefix, _ = layer_list(model, config)
    except ValueError:  # no list of that many layers: nothing to tell inside from outside
        return layers
    inside = prefix + "." if prefix else ""
    return {name: layer for name, layer in layers.items() if name.startswith(inside)}


def _chosen(model: nn.Module, modules: Iterable[Any] | None) -> dict[str, nn.Module]:
    """Qualified name -> layer, for the layers to calibrate (every Linear and Conv by default)."""
    named = dict(model.named_modules())
    if modules is None:
        return {name: m for name, m in named.items() if isinstance(m, _LAYERS) or is_transposed_linear(m)}
    by_module = {id(m): name for name, m in named.items()}
    chosen = {}
    for item in modules:
        name = item if isinstance(item, str) else by_module.get(id(item))
        if isinstance(name, str) and name not in named and name.endswith(".weight"):
            name = name[: -len(".weight")]  # a weight name: its layer
        if name is None or name not in named:
            raise ValueError(f"{item!r} is not a submodule of the model")
        if not isinstance(named[name], _LAYERS) and not is_transposed_linear(named[name]):
            raise TypeError(f"{name!r} is a {type(named[name]).__name__}: Wanda calibrates Linear and Conv layers")
        chosen[name] = named[name]
    return chosen


def _feature_axis(module: nn.Linear | nn.Conv1d | nn.Conv2d, x: torch.Tensor) -> int:
    """Axis of the input features of `x`, as `module` reads it."""
    if isinstance(module, nn.Linear) or is_transposed_linear(module):
        return x.ndim - 1
    spatial = len(module.kernel_size)
    return 0 if x.ndim == spatial + 1 else 1  # an unbatched input has no batch axis


def _run(model: nn.Module, batch: Any) -> Any:
    """`model` on one batch (a tensor, positional arguments or keywords): its output."""
    if isinstance(batch, Mapping):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    return model(batch)


def input_norms(
    model: nn.Module, batches: Iterable[Any], modules: Iterable[Any] | None = None
) -> dict[str, torch.Tensor]:
    """The L2 norm of every input feature of the chosen layers over calibration data.

    Parameters
    ----------
    model : torch.nn.Module
        The dense model, in the mode to calibrate in (usually ``model.eval()``).
    batches : iterable
        Calibration batches: each a tensor (``model(batch)``), a tuple or list
        (``model(*batch)``) or a mapping (``model(**batch)``).
    modules : iterable of modules or names, optional
        The layers to calibrate, as modules, qualified names (``"encoder.fc1"``) or
        weight names (``"encoder.fc1.weight"``); every ``Linear``, ``Conv1d``,
        ``Conv2d`` and ``Conv3d`` of `model` if omitted.

    Returns
    -------
    dict of str to torch.Tensor
        Per layer, by the name of its weight (``"encoder.fc1.weight"``, as in
        ``model.state_dict()`` and the command line's ``--input-norms``),
        ``sqrt(sum of x_j**2)`` over every token, batch entry and spatial position seen,
        one float64 value per input feature ``j`` (``in_features``, or all the input
        channels of a convolution, groups included). :func:`save_input_norms` writes
        them for the command line.

    Raises
    ------
    ValueError
        If `batches` is empty, or a module is not part of `model`.
    TypeError
        If a chosen module is not a Linear or convolution layer.
    """
    layers = _chosen(model, modules)
    sums: dict[str, torch.Tensor] = {}

    def hook_for(name: str):
        def hook(module: nn.Linear | nn.Conv1d | nn.Conv2d, args: tuple) -> None:
            x = args[0].detach()
            axis = _feature_axis(module, x)
            flat = torch.movedim(x, axis, -1).reshape(-1, x.shape[axis])
            squares = torch.linalg.vector_norm(flat, dim=0, dtype=torch.float64) ** 2
            sums[name] = squares if name not in sums else sums[name] + squares

        return hook

    handles = [m.register_forward_pre_hook(hook_for(name)) for name, m in layers.items()]
    seen = 0
    try:
        with torch.no_grad():
            for batch in batches:
                _run(model, batch)
                seen += 1
    finally:
        for h in handles:
            h.remove()
    if not seen:
        raise ValueError("no calibration batch was given")
    missing = sorted(set(layers) - set(sums))
    if missing:
        raise ValueError(f"the calibration batches never reached {missing[0]!r}")
    return {_weight_name(name): torch.sqrt(sums[name]) for name in layers}


def _weight_name(module_name: str) -> str:
    return f"{module_name}.weight" if module_name else "weight"


def save_input_norms(norms: Mapping[str, Any], path: Any) -> None:
    """Write input norms in the format of the command line's ``--input-norms``.

    The file maps weight names to one float64 norm per input feature (an ``.npz``, or
    any format of :func:`arrayprune.adapters.formats.save` by the suffix of `path`),
    written to a temporary name and renamed into place.

    Parameters
    ----------
    norms : mapping of str to tensor or array
        What :func:`input_norms` returned (weight name to a 1-D vector).
    path : str or os.PathLike
        The file to write.

    Raises
    ------
    ValueError
        If a name is not a string or a vector is not 1-D, real and non-negative
        (nothing is written then).
    FormatError
        If the file cannot be written.
    """
    import numpy as np

    arrays = {}
    for name, value in norms.items():
        if not isinstance(name, str):
            raise ValueError(f"input norms are keyed by weight name (a str), not {type(name).__name__}")
        if isinstance(value, torch.Tensor):
            value = value.detach().cpu()
        vector = np.asarray(value)
        if vector.ndim != 1 or vector.dtype.kind not in "fiu" or not np.all(vector >= 0):
            raise ValueError(f"input norms {name!r}: expected a 1-D vector of non-negative numbers")
        arrays[name] = vector.astype(np.float64)
    formats.save(path, arrays)


def _layer_scores(module: nn.Linear | nn.Conv1d | nn.Conv2d, norms: torch.Tensor) -> torch.Tensor:
    """Wanda scores of a layer's weight ``[out, in/groups, ...]``: |W| times its input norms."""
    weight = module.weight.detach()
    groups = getattr(module, "groups", 1)
    axis = 0 if is_transposed_linear(module) else 1
    return arrayprune.wanda_scores(weight, norms.to(weight.device), reduction_axis=axis, groups=groups)


def wanda_importance(
    model: nn.Module, batches: Iterable[Any], modules: Iterable[Any] | None = None
) -> dict[nn.Module, torch.Tensor]:
    """Wanda's importance scores of the weights of the chosen layers, from one calibration pass.

    Parameters
    ----------
    model, batches, modules
        As for :func:`input_norms`.

    Returns
    -------
    dict of torch.nn.Module to torch.Tensor
        Per layer, scores shaped like its ``weight`` (``|W| * ||X_j||_2``), for
        ``importance_scores`` of ``prune.wanda`` (``dim=0``: per output unit),
        ``prune.nm_structured`` (``dim=1``) or, keyed by ``(module, "weight")``,
        ``prune.global_unstructured``.
    """
    norms = input_norms(model, batches, modules)
    named = dict(model.named_modules())
    layers = [named[name[: -len(".weight")] if name != "weight" else ""] for name in norms]
    return {m: _layer_scores(m, n) for m, n in zip(layers, norms.values(), strict=True)}
