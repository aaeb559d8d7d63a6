"""What :func:`~arrayprune.adapters.formats.load` returns: a :class:`WeightFile`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class WeightFile:
    """A weight file read by :func:`load`.

    Attributes
    ----------
    path : str
        Where it was read from.
    format : str
        One of :data:`FORMATS`.
    params : mapping
        Names to arrays (nested mappings for PyTorch checkpoints that nest them).
    context : dict
        What else :func:`save` needs to write the file again in its format (the ONNX
        model, safetensors metadata, npz compression).
    """

    path: str
    format: str
    params: Mapping[str, Any]
    context: dict[str, Any] = field(default_factory=dict)

