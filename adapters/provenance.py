"""How an output was made: the record ``arrayprune prune`` writes into it.

:func:`record` builds it from the request: the method, the amount (or N:M pattern),
global ranking, allocation and shrinking when asked, the SHA-256 of each data file given
(``--calibration``, ``--input-norms``, ``--hessians``) and the arrayprune version; every
value is a string, as safetensors metadata requires, and nothing depends on the time or
the machine, so the same command still writes the same bytes.

Where it goes, under the key :data:`KEY`: a Hugging Face folder's ``config.json`` (an
object, which ``transformers`` carries through ``from_pretrained`` and
``save_pretrained``), safetensors ``__metadata__`` and ONNX ``metadata_props`` (the
record as compact JSON, :func:`as_text`). ``.npz`` and PyTorch files have no place for it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import arrayprune
from arrayprune.adapters.formats.files import _open_regular
from arrayprune.adapters.formats.record import KEY, as_text, with_record

__all__ = ["KEY", "as_text", "record", "sha256_of", "with_record"]

#: Data files whose digest is recorded: the request's field -> the record's key.
_DATA_FILES = {
    "calibration": "calibration_sha256",
    "input_norms": "input_norms_sha256",
    "hessians": "hessians_sha256",
}


def sha256_of(path: Any) -> str:
    """The SHA-256 of the regular file `path`, in hex.

    Raises
    ------
    FormatError
        If it is not a regular file or cannot be read.
    """

    digest = hashlib.sha256()
    with _open_regular(path) as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _amount(amount: Any) -> str:
    if isinstance(amount, Mapping):  # each weight its own (an allocation): the total is elsewhere
        return json.dumps({str(k): amount[k] for k in sorted(amount)}, separators=(",", ":"))
    return str(amount)


def record(spec: Any) -> dict[str, str]:
    """The provenance record of a request: what made the output, as strings.

    Parameters
    ----------
    spec : PruneSpec
        The checked request (:mod:`arrayprune.adapters.pipeline.request`), before an allocation
        replaced its amount by per-weight ones.

    Returns
    -------
    dict of str to str
        ``method``, ``amount`` or ``nm``, ``global``, ``allocation``, ``shrink``,
        ``rounding`` and ``compensate`` (when asked: ``"false"`` for ``--no-compensate``),
        ``calibration_sha256`` (and the same for ``input_norms``, ``hessians``)
        when given, and ``version``; keys sorted.
    """

    out = {"method": str(spec.method), "version": arrayprune.__version__}
    if spec.amount is not None:
        out["amount"] = _amount(spec.amount)
    if spec.nm is not None:
        out["nm"] = f"{spec.nm[0]}:{spec.nm[1]}"
    if spec.global_:
        out["global"] = "true"
    if spec.allocation:
        out["allocation"] = "owl" if spec.allocation == "owl" else f"scan sha256 {sha256_of(spec.allocation)}"
    if spec.shrink:
        out["shrink"] = spec.groups or "channels"
    if getattr(spec, "rounding", "nearest") != "nearest":
        out["rounding"] = spec.rounding
    if spec.shrink and not getattr(spec, "compensate", True):
        out["compensate"] = "false"
    for field, key in _DATA_FILES.items():
        path = getattr(spec, field, None)
        if path:
            out[key] = sha256_of(path)
    return dict(sorted(out.items()))
