"""The input of a file job, opened: read whole, or streamed from safetensors headers.

:class:`WholeFile` holds any format in memory; :class:`StreamedCheckpoint` a safetensors
file or a sharded checkpoint, pruned tensor by tensor. :func:`open_storage` chooses.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from arrayprune.adapters import formats as fmt
from arrayprune.adapters import mapping as mp
from arrayprune.adapters.formats import sharded
from arrayprune.adapters.pipeline.errors import PruneError
from arrayprune.adapters.pipeline.hooks import Hooks
from arrayprune.adapters.pipeline.method_names import reconstructs
from arrayprune.adapters.pipeline.request import PruneSpec
from arrayprune.adapters.pipeline.stream_pruning import streams
from arrayprune.adapters.plan import PlanEntry, _name, file_roles
from arrayprune.adapters.roles.names import tree_roles

__all__ = ["StreamedCheckpoint", "WholeFile", "check_arrays", "open_storage"]




def check_arrays(params: Mapping, src: str) -> None:
    """Refuse trees that cannot be walked and tensors that hold no values.

    Raises
    ------
    PruneError
        Naming `src` and the tensor.
    """
    try:
        for path, value in mp.iter_arrays(params):
            if getattr(value, "is_meta", False):
                raise PruneError(f"tensor {_name(path)!r} is on the meta device: it holds no values to prune", src)
    except mp.TreeError as exc:
        raise PruneError(f"cannot walk the file's contents: {exc}", src) from None


class WholeFile:
    """A model file read into memory, any format: every option applies.

    Parameters
    ----------
    src : str
        The file.
    format : str, optional
        Its format (detected if omitted).
    hooks : Hooks, optional
        Told of the loading stage.
    """

    streamed = False

    def __init__(self, src: str, format: str | None = None, hooks: Hooks = Hooks()):
        hooks.stage(f"loading {src}")
        self.wf = fmt.load(src) if format is None else fmt.load(src, format)
        check_arrays(self.wf.params, src)
        self.src, self.kind, self.params = src, self.wf.format, self.wf.params
        self.roles = file_roles(self.wf)

    @staticmethod
    def refusal(spec: PruneSpec) -> str | None:
        """The option this storage cannot honour: none."""
        return None

    def shown(self, plan: list[PlanEntry]) -> list[PlanEntry]:
        """The plan with each tensor's dtype as stored (ONNX bfloat16 is read as float32)."""
        stored = self.wf.context.get("stored_dtypes", {})
        return [dataclasses.replace(e, dtype=stored.get(e.name, e.dtype)) for e in plan] if stored else plan


class StreamedCheckpoint:
    """A safetensors file or a sharded checkpoint, read from its headers, pruned tensor by tensor.

    Parameters
    ----------
    source : SafetensorsFile or ShardedCheckpoint
        From :func:`arrayprune.adapters.formats.sharded.open_checkpoint`.
    src : str
        The path it was opened from, as given.
    """

    streamed = True

    def __init__(self, source: Any, src: str):
        self.src, self.source, self.kind, self.params = src, source, source.kind, source.tensors
        self.roles = tree_roles(self.params)

    @property
    def sharded(self) -> bool:
        """Whether the checkpoint is a folder of shards (or one file in a folder)."""
        return isinstance(self.source, sharded.ShardedCheckpoint)

    @staticmethod
    def refusal(spec: PruneSpec) -> str | None:
        """The option that tensor-by-tensor pruning cannot honour, as the command line names it, or None."""
        if spec.keep_masks:
            return "--keep-masks"
        if spec.global_ and not (streams(spec.method_class()) or reconstructs(spec.method)):
            return f"--global with {spec.method}"  # a solver's global ranking is by magnitude: it streams
        if spec.global_ and (spec.calibration or spec.input_norms):
            return "--global with input norms"
        if spec.verify:
            return "--verify (ONNX only)"
        return None

    def shown(self, plan: list[PlanEntry]) -> list[PlanEntry]:
        """The plan as stored."""
        return plan


def open_storage(src: str, hooks: Hooks = Hooks()) -> WholeFile | StreamedCheckpoint:
    """Open a file to read it: safetensors (one file or sharded) from headers, the others whole.

    Parameters
    ----------
    src : str
        A model file, a sharded checkpoint's folder or its index.
    hooks : Hooks, optional
        Told of the loading stage.

    Returns
    -------
    WholeFile or StreamedCheckpoint
    """
    if sharded.is_sharded(src) or fmt.detect_format(src) == "safetensors":
        return StreamedCheckpoint(sharded.open_checkpoint(src), src)
    return WholeFile(src, hooks=hooks)
