"""The provenance record as files hold it: its key, its text, and a file's metadata with it.

:mod:`arrayprune.adapters.provenance` builds the record from a request; the formats write
it under :data:`KEY` (safetensors ``__metadata__``, ONNX ``metadata_props``, a Hugging Face
``config.json``). These helpers live with the formats so that writing a file needs
nothing above them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

__all__ = ["KEY", "as_text", "with_record"]

#: The key of the record in ``config.json``, safetensors metadata and ONNX metadata.
KEY = "arrayprune"


def as_text(made: Mapping[str, str]) -> str:
    """The record as one compact JSON string (safetensors and ONNX metadata values)."""
    return json.dumps(dict(made), sort_keys=True, separators=(",", ":"))


def with_record(metadata: Mapping[str, str] | None, made: Mapping[str, str] | None) -> dict[str, str]:
    """`metadata` (a file's string metadata) with the record under :data:`KEY`; unchanged without one.

    With the record, the keys are sorted, as the ``safetensors`` package writes them.
    """
    out = dict(metadata or {})
    if made:
        out[KEY] = as_text(made)
        out = dict(sorted(out.items()))
    return out
