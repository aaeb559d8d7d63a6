"""The ``config.json`` of a Hugging Face checkpoint folder, read as plain JSON.

Only data is read: a JSON object of at most :data:`CONFIG_MAX_BYTES`, from a regular file
of the folder (no code runs, ``auto_map`` and the like are ignored). Writers keep the
layout ``transformers`` writes (``indent=2``, keys sorted, a final newline).
"""

from __future__ import annotations

import json
import os
from typing import Any

from arrayprune.adapters.formats.errors import FormatError
from arrayprune.adapters.formats.files import read_json

__all__ = ["CONFIG_MAX_BYTES", "CONFIG_NAME", "config_bytes", "read_config"]

#: The name of the file.
CONFIG_NAME = "config.json"

#: The largest config read (real ones are a few KB).
CONFIG_MAX_BYTES = 4 << 20


def read_config(folder: str) -> dict[str, Any] | None:
    """The folder's ``config.json`` as a dict; None if there is none.

    Raises
    ------
    FormatError
        If the file is not a regular file, is too large or is not a JSON object.
    """
    path = os.path.join(folder, CONFIG_NAME)
    if not os.path.lexists(path):
        return None
    config = read_json(path, CONFIG_MAX_BYTES, "config", "not valid JSON")
    if not isinstance(config, dict):
        raise FormatError(path, "not a JSON object")
    return config


def config_bytes(config: dict[str, Any]) -> bytes:
    """`config` as ``transformers`` writes it: ``indent=2``, keys sorted, a final newline."""
    return (json.dumps(config, indent=2, sort_keys=True) + "\n").encode()
