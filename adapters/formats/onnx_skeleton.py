"""An ONNX model in pieces: everything but its main graph's initializers, and those as records.

The ONNX writer never copies nor serializes a whole model: it copies what is not the
main graph's initializers (nodes, inputs, outputs, opsets: small), serializes that in two
pieces around the ``initializer`` field, and writes each initializer as a record between
them, its raw data straight from its array (:mod:`~arrayprune.adapters.formats.protowire`).
The result has the bytes that serializing the whole model would give. A model or main
graph that holds fields its ONNX version does not know is copied whole instead (without
its initializers) and followed by a second ``graph`` record that holds them, which
protobuf merges into the first on reading.

Field numbers (``onnx.proto``): ``ModelProto.graph`` 7, ``GraphProto.initializer`` 5,
``TensorProto.raw_data`` 9.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import IO, Any

from arrayprune.adapters.formats.record import KEY, as_text

from . import files, protowire
from .arrays import release_pages

__all__ = [
    "GRAPH_INITIALIZER",
    "MODEL_GRAPH",
    "TENSOR_RAW_DATA",
    "Skeleton",
    "external_locations",
    "graph_initializers",
    "write_buffers",
]

MODEL_GRAPH = 7
GRAPH_INITIALIZER = 5
TENSOR_RAW_DATA = 9


def graph_initializers(graph: Any) -> Iterator[Any]:
    """The initializers of `graph`, then those of its subgraphs (the bodies of ``If``,
    ``Loop``, ``Scan``: any graph attribute), depth first in node and attribute order."""
    yield from graph.initializer
    for node in graph.node:
        for a in node.attribute:
            if a.HasField("g"):
                yield from graph_initializers(a.g)
            for sub in a.graphs:
                yield from graph_initializers(sub)


def _tensor_locations(tensors: Iterable[Any], found: set[str]) -> None:
    external = importlib.import_module("onnx").TensorProto.EXTERNAL
    for t in tensors:
        if t.data_location == external:
            found.update(e.value for e in t.external_data if e.key == "location")


def _graph_locations(graph: Any, found: set[str]) -> None:
    """Add to `found` the external-data locations of `graph`'s tensors (subgraphs included)."""
    _tensor_locations(graph.initializer, found)
    for st in graph.sparse_initializer:
        _tensor_locations((st.values, st.indices), found)
    for node in graph.node:
        for a in node.attribute:
            _tensor_locations([a.t] if a.HasField("t") else [], found)
            _tensor_locations(a.tensors, found)
            if a.HasField("g"):
                _graph_locations(a.g, found)
            for sub in a.graphs:
                _graph_locations(sub, found)


def _function_locations(functions: Iterable[Any], found: set[str]) -> None:
    for fn in functions:
        for node in fn.node:
            for a in node.attribute:
                _tensor_locations([a.t] if a.HasField("t") else [], found)


def external_locations(model: Any) -> set[str]:
    """The external-data locations that any tensor of an ONNX model references.

    Parameters
    ----------
    model : onnx.ModelProto
        The model.

    Returns
    -------
    set of str
    """
    found: set[str] = set()
    _graph_locations(model.graph, found)
    _function_locations(model.functions, found)
    return found


def _set_metadata(model: Any, made: Mapping[str, str]) -> None:
    """Put the provenance record into `model`'s ``metadata_props`` (a copy's), replacing one there."""

    kept = [(p.key, p.value) for p in model.metadata_props if p.key != KEY]
    del model.metadata_props[:]
    for key, value in [*kept, (KEY, as_text(made))]:
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value


class Skeleton:
    """An ONNX model without its main graph's initializers, as pieces to write around them.

    Parameters
    ----------
    model : onnx.ModelProto
        The model; never changed. Everything but its main graph's initializers is
        copied (small), so the subgraphs' initializers (:meth:`subgraph_initializers`)
        may be changed here without touching `model`.
    made : mapping of str to str, optional
        A provenance record (:mod:`arrayprune.adapters.provenance`), written into the
        copy's ``metadata_props`` under its key (an entry of that key replaced).
    """

    def __init__(self, model: Any, made: Mapping[str, str] | None = None):
        self._whole: Any = None
        if protowire.has_unknown_fields(model) or protowire.has_unknown_fields(model.graph):
            # only a whole copy keeps those fields: the initializers follow in a second record
            self._whole = type(model)()
            self._whole.CopyFrom(model)
            self._whole.graph.ClearField("initializer")
            self._graph = self._whole.graph
            self._parts: tuple[Any, ...] = ()
        else:
            model_head, model_tail = protowire.split(model, MODEL_GRAPH)
            graph_head, graph_tail = protowire.split(model.graph, GRAPH_INITIALIZER)
            self._graph = graph_head  # the nodes, and in them the subgraphs
            self._parts = (model_head, graph_head, graph_tail, model_tail)
        if made:
            _set_metadata(self._whole if self._whole is not None else model_tail, made)

    def subgraph_initializers(self) -> list[Any]:
        """The initializers of the subgraphs, in :func:`graph_initializers` order (copies:
        changing them changes what is written)."""
        return list(graph_initializers(self._graph))  # its own initializer list is empty

    def external_locations(self, initializers: Iterable[Any]) -> set[str]:
        """The external-data locations of the model written with `initializers` (protos)
        as its main graph's initializers."""
        found: set[str] = set()
        if self._whole is not None:
            found = external_locations(self._whole)
        else:
            model_head, graph_head, graph_tail, model_tail = self._parts
            _graph_locations(graph_head, found)
            _graph_locations(graph_tail, found)
            _function_locations(model_tail.functions, found)
        _tensor_locations(initializers, found)
        return found

    def buffers(self, records: Sequence[protowire.Buffers]) -> list[Any]:
        """The serialized model with `records` (each the serialized fields of one
        ``TensorProto``, in pieces) as its main graph's initializers, in order.

        Parameters
        ----------
        records : list of buffer sequences
            One per initializer.

        Returns
        -------
        list
            Buffers (``bytes`` or byte ``memoryview``) to write one after the other.
        """
        initializers: list[Any] = []
        for record in records:
            initializers.append(protowire.field_header(GRAPH_INITIALIZER, protowire.nbytes(record)))
            initializers.extend(record)
        if self._whole is not None:
            out = [self._whole.SerializeToString()]
            if initializers:
                out += [protowire.field_header(MODEL_GRAPH, protowire.nbytes(initializers)), *initializers]
            return out
        model_head, graph_head, graph_tail, model_tail = (p.SerializeToString() for p in self._parts)
        graph = [graph_head, *initializers, graph_tail]
        return [model_head, protowire.field_header(MODEL_GRAPH, protowire.nbytes(graph)), *graph, model_tail]


def write_buffers(f: IO[bytes], buffers: Iterable[Any]) -> None:
    """Write `buffers` one after the other (large ones straight from their memory, their
    writeback started as they go: :func:`~.files.write_out`; the pages of read-only
    memory maps given back once written, see :func:`release_pages`)."""
    for b in buffers:
        files.write_out(f, b)
        if isinstance(b, memoryview):
            release_pages(b.obj)
