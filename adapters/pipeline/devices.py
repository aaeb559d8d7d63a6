"""The device calibration runs on: ``arrayprune prune --device cuda[:N]``.

Calibration (Wanda's input norms, SparseGPT's Hessians and updates, an allocation's
statistics) runs the model. On a Hugging Face folder the model runs in PyTorch, one
decoder layer on the device at a time (:mod:`arrayprune.adapters.pipeline.hf_calibration`); an
ONNX model runs in onnxruntime, on its CUDA execution provider for a CUDA device. The
weights written are computed there and copied back; everything else (reading, planning,
writing) stays on the host.

:func:`parse_device` checks the spelling, :func:`device_problem` that the device exists
for the input at hand, before anything is read. :func:`onnx_providers` gives the
execution providers of onnxruntime sessions: the pipeline sets the device for a job with
:func:`onnx_device`.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import re
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["Device", "checked_device", "device_problem", "onnx_device", "onnx_providers", "parse_device"]


@dataclass(frozen=True)
class Device:
    """A device as ``--device`` names it: ``kind`` ``"cpu"`` or ``"cuda"``, and its index."""

    kind: str
    index: int | None = None

    def __str__(self) -> str:
        return self.kind if self.index is None else f"{self.kind}:{self.index}"


_SPELLING = re.compile(r"(cpu|cuda)(?::(\d+))?")


def parse_device(text: str) -> Device:
    """The device `text` names: ``cpu``, ``cuda`` or ``cuda:N``.

    Raises
    ------
    ValueError
        For any other spelling, naming the flag.
    """
    found = _SPELLING.fullmatch(text.strip()) if isinstance(text, str) else None
    if found is None or (found.group(1) == "cpu" and found.group(2) is not None):
        raise ValueError(f"--device: expected cpu, cuda or cuda:N, got {text!r}")
    return Device(found.group(1), None if found.group(2) is None else int(found.group(2)))


def device_problem(device: Device, runner: str) -> str | None:
    """Why `device` cannot run calibration with `runner` here, as one line; None if it can.

    Parameters
    ----------
    device : Device
        From :func:`parse_device`.
    runner : str
        ``"torch"`` (a Hugging Face folder) or ``"onnxruntime"`` (an ONNX model).
    """
    if device.kind == "cpu":
        return None
    if runner == "onnxruntime":
        try:
            ort = importlib.import_module("onnxruntime")
        except ImportError:
            return None  # the calibration stage reports the missing package
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            return (
                f"--device {device}: this onnxruntime has no CUDA execution provider "
                f"({', '.join(ort.get_available_providers())}); pip install onnxruntime-gpu"
            )
        return None
    try:
        torch = importlib.import_module("torch")
    except ImportError:
        return None  # the calibration stage reports the missing package
    if not torch.cuda.is_available():
        return f"--device {device}: PyTorch sees no CUDA device here (torch.cuda.is_available() is False)"
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        seen = f"{count} CUDA device{'s' if count != 1 else ''}"
        return f"--device {device}: PyTorch sees {seen} (cuda:0 to cuda:{count - 1})"
    return None


def checked_device(text: str, runner: str = "torch") -> Device:
    """The device `text` names, if `runner` can run on it here (:func:`parse_device`, then
    :func:`device_problem`).

    Raises
    ------
    ValueError
        A misspelt device, or one that is not here: one line.
    """
    device = parse_device(text)
    problem = device_problem(device, runner)
    if problem is not None:
        raise ValueError(problem)
    return device


_ONNX_DEVICE: contextvars.ContextVar[Device | None] = contextvars.ContextVar("onnx_device", default=None)


@contextlib.contextmanager
def onnx_device(device: Device | None) -> Iterator[None]:
    """Run the onnxruntime sessions made inside on `device` (None: the CPU)."""
    token = _ONNX_DEVICE.set(device)
    try:
        yield
    finally:
        _ONNX_DEVICE.reset(token)


def onnx_providers() -> list:
    """The execution providers of a calibration session: CUDA's first on a CUDA device."""
    device = _ONNX_DEVICE.get()
    if device is None or device.kind == "cpu":
        return ["CPUExecutionProvider"]
    return [("CUDAExecutionProvider", {"device_id": device.index or 0}), "CPUExecutionProvider"]
