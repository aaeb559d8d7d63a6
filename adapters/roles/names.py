"""Roles from names and layout, for files without a graph (safetensors, npz, PyTorch).

Two sources of knowledge, used together:

* **the layout of a training checkpoint**: a PyTorch file holding the model's state dict
  under ``model``, ``state_dict``, ``model_state_dict``, ... beside optimizer, scheduler
  and counters. Only the model's tensors can be layer weights; optimizer state and
  everything else is carried through.
* **naming conventions** of PyTorch and Hugging Face checkpoints (BERT-style and
  Llama-style names at least): embeddings (``embeddings.*``, ``embed_tokens``, ``wte``,
  ``wpe``, ``lm_head``), norms (``LayerNorm``, ``*norm*``, ``ln_*``, batch-norm
  statistics), biases. Any other floating tensor of two or more dimensions is a layer
  weight: ``[out, in, ...]`` as PyTorch stores ``Linear`` and ``Conv`` weights, or
  ``[..., in, out]`` for a Flax/Keras ``kernel`` and the ``Conv1D`` layers of GPT-2
  (``c_attn``, ``c_fc``, ``c_proj``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from arrayprune.adapters.state_dict import iter_entries

from . import Role

__all__ = ["MODEL_KEYS", "OPTIMIZER_KEYS", "dtype_name", "is_float", "model_prefix", "name_role", "tree_roles"]

#: Keys under which training checkpoints keep the model's state dict.
MODEL_KEYS = ("model", "state_dict", "model_state_dict", "model_state", "net", "network", "module")

#: Keys under which they keep optimizer and scheduler state.
OPTIMIZER_KEYS = (
    "optimizer",
    "optimizer_state_dict",
    "optimizer_state",
    "optimizer_states",
    "optim",
    "scheduler",
    "lr_scheduler",
    "lr_schedulers",
    "scaler",
)

_EMBEDDING = re.compile(
    r"(^|[._/])(embeddings?|embed_tokens|embed_positions|word_embeddings|position_embeddings|"
    r"token_type_embeddings|wte|wpe|lm_head|shared)([._/]|$)",
    re.IGNORECASE,
)
_NORM = re.compile(r"norm|(^|[._/])ln(_\w+)?([._/]|$)", re.IGNORECASE)
_NORM_STATISTICS = ("running_mean", "running_var", "num_batches_tracked")
_IN_OUT_LAYERS = re.compile(r"(^|[._/])(c_attn|c_fc|c_proj)([._/]|$)")


def _is_array(value: Any) -> bool:
    return hasattr(value, "shape") and hasattr(value, "dtype")


def dtype_name(value: Any) -> str:
    """The dtype of an array of any library as a plain name: ``float32``, ``bfloat16``, ..."""
    return str(value.dtype).replace("torch.", "")


def is_float(value: Any) -> bool:
    """Whether an array of any library holds floating-point numbers."""
    name = dtype_name(value)
    return name.startswith(("float", "bfloat")) or name in ("half", "double")


def model_prefix(params: Mapping) -> tuple | None:
    """Where a training checkpoint keeps the model's state dict, or None.

    A checkpoint is a mapping with one of :data:`MODEL_KEYS` whose value is a mapping
    holding tensors, beside at least one entry that is not a tensor mapping of the model
    (optimizer state, an epoch counter, ...). A plain state dict gives None.

    Parameters
    ----------
    params : mapping
        The file's contents.

    Returns
    -------
    tuple or None
        The path of the model's state dict, e.g. ``("model",)``.
    """
    found = [k for k in MODEL_KEYS if isinstance(params.get(k), Mapping) and _holds_arrays(params[k])]
    if len(found) != 1 or len(params) < 2:
        return None
    return (found[0],)


def _holds_arrays(node: Mapping) -> bool:
    return any(_is_array(v) for v in node.values())


def name_role(name: str, value: Any) -> Role:
    """The role of a tensor of a state dict, from its name, rank and dtype.

    Parameters
    ----------
    name : str
        The tensor's name within the model (``encoder.layer.0.attention.self.query.weight``).
    value : array
        The tensor (its dtype and shape are read).

    Returns
    -------
    Role
        ``weight`` with its axes, ``bias``, ``embedding``, ``norm`` or ``other``.
    """
    leaf = re.split(r"[./]", name)[-1]
    if not is_float(value):
        return Role("other", why=f"{dtype_name(value)}, not floating point")
    if leaf == "bias" or leaf.endswith("_bias"):
        return Role("bias", why="name ends in bias")
    if _NORM.search(name) or leaf in _NORM_STATISTICS:
        return Role("norm", why="norm name")
    if _EMBEDDING.search(name) or leaf == "embedding":
        return Role("embedding", why="embedding name")
    ndim = len(value.shape)
    if ndim < 2:
        return Role("other", why=f"{ndim}-D")
    if leaf == "kernel" or _IN_OUT_LAYERS.search(name):
        why = "[..., in, out] (kernel)" if leaf == "kernel" else "[in, out] (GPT-2 Conv1D)"
        return Role("weight", output_axis=ndim - 1, reduction_axis=ndim - 2, why=why)
    return Role("weight", output_axis=0, reduction_axis=1, why="[out, in, ...] (PyTorch layout)")


def tree_roles(params: Mapping) -> dict[tuple, Role]:
    """Roles of the tensors of a state dict or training checkpoint, by path.

    Parameters
    ----------
    params : mapping
        The file's contents, possibly nested (pruned tensors under their own name).

    Returns
    -------
    dict
        Path to :class:`Role`.
    """
    prefix = model_prefix(params)
    roles = {}
    for path, value, _ in iter_entries(params):
        if not _is_array(value):
            continue
        name = ".".join(map(str, path))
        if prefix is None:
            roles[path] = name_role(name, value)
        elif path[: len(prefix)] == prefix:
            roles[path] = name_role(".".join(map(str, path[len(prefix) :])), value)
        elif str(path[0]) in OPTIMIZER_KEYS:
            roles[path] = Role("optimizer_state", why=f"under {path[0]!r}, not the model")
        else:
            roles[path] = Role("other", why=f"outside the model's state dict {prefix[0]!r}")
    return roles
