"""Sequential calibration of an ONNX graph, one level at a time, without rerunning its start.

Sequential SparseGPT (:func:`~arrayprune.adapters.pipeline.reconstruction.onnx_sparsegpt`)
needs, for every level of weights (:func:`~arrayprune.adapters.roles.onnx_graph.weight_levels`),
the activations those weights multiply, computed on the model whose earlier levels are
already pruned. Running the whole graph again for each level costs ``L`` passes for ``L``
levels. :class:`LevelRunner` runs each level's part only:

* **Plan** (once, from the graph): level ``i`` needs the nodes its activations depend on
  that no earlier level ran. Every such node reads only values of levels ``< i`` (the
  activations of a level depend on no weight of that level or later), so the values it
  makes are final once computed: none has to be computed twice. A value made at level
  ``i`` and read by a node of a later level is kept (the *frontier*) until its last
  reader has run, then dropped: memory holds the values that cross the cut between what
  has run and what has not (a transformer's residual stream, its attention mask), per
  calibration sample.
* **Run**: level ``i`` gets an onnxruntime session of a model holding its nodes only,
  whose inputs are the frontier values it reads (fed from memory), the calibration
  inputs and the pruned weights it reads, and whose outputs are its activations and the
  frontier values it makes. Sessions are made one level at a time.

The kept values are held in memory up to a budget (:func:`frontier_memory`: a quarter of
the memory available by default); beyond it they are written to a temporary folder
(``tempfile``'s, so ``TMPDIR`` chooses the disk) and read back memory-mapped, the same
bytes either way. The folder is removed when the runner closes.

Across all levels every node runs once per batch, as in one pass of the whole graph.
The values are those of the whole graph: each node gets the same inputs, batch by
batch. Graphs this cannot cut (subgraphs of ``If``, ``Loop`` or ``Scan``; random
operators, whose draws would differ; an activation that no node makes) report so through
:func:`stage_plan` returning None, and the caller runs the whole graph per level.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from arrayprune.adapters.formats import memory_limit
from arrayprune.adapters.pipeline.calibration import _first_line, _open_session, _prepared_model, _quiet_run_options

__all__ = ["FrontierStore", "LevelRunner", "Stage", "frontier_memory", "stage_plan"]

#: Operators whose values differ from run to run: a graph holding one is run whole per level.
RANDOM_OPERATORS = frozenset(
    {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli"}
)

#: Used where the memory available cannot be read: 2 GiB.
FALLBACK_MEMORY = 2 << 30


def frontier_memory() -> int:
    """The default budget in bytes for kept frontier values: a quarter of the memory available.

    The memory available as the file formats measure it
    (:func:`arrayprune.adapters.formats.memory_limit`: ``ARRAYPRUNE_MEMORY_LIMIT``, else
    ``MemAvailable``, the process's limits and its cgroup's), :data:`FALLBACK_MEMORY`
    where none is known.
    """
    limit = memory_limit()
    return FALLBACK_MEMORY if limit >= 2**63 - 1 else limit // 4


class FrontierStore:
    """Kept values by batch: in memory up to `budget` bytes, memory-mapped files beyond.

    Parameters
    ----------
    batches : int
        How many calibration batches (one mapping of values each).
    budget : int
        Bytes of values held in memory; a value that would pass it is written to a
        temporary folder and read back memory-mapped (``numpy.load(mmap_mode="r")``).
    """

    def __init__(self, batches: int, budget: int):
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
            raise ValueError(f"the frontier memory budget must be a whole number of bytes >= 0, got {budget!r}")
        self.batches: list[dict[str, np.ndarray]] = [{} for _ in range(batches)]
        self.budget = budget
        #: Bytes held in memory now, and the most held at once.
        self.held = 0
        self.peak = 0
        self._folder: Path | None = None
        self._files: dict[tuple[int, str], Path] = {}
        self._written = 0

    def put(self, batch: int, name: str, value: np.ndarray) -> None:
        """Keep `value` as `name` of batch `batch`."""
        self.pop(batch, name)
        if self.held + value.nbytes <= self.budget:
            self.batches[batch][name] = value
            self.held += value.nbytes
            self.peak = max(self.peak, self.held)
            return
        if self._folder is None:
            self._folder = Path(tempfile.mkdtemp(prefix="arrayprune-frontier-"))
        path = self._folder / f"{self._written}.npy"  # a new name: a live map is never overwritten
        self._written += 1
        np.save(path, np.ascontiguousarray(value), allow_pickle=False)
        self._files[(batch, name)] = path
        self.batches[batch][name] = np.load(path, mmap_mode="r", allow_pickle=False)

    def pop(self, batch: int, name: str) -> None:
        """Forget `name` of batch `batch` (its file too), if kept."""
        value = self.batches[batch].pop(name, None)
        path = self._files.pop((batch, name), None)
        if path is not None:
            del value
            try:
                path.unlink(missing_ok=True)
            except OSError:  # still mapped (Windows): close() removes the folder
                pass
        elif value is not None:
            self.held -= value.nbytes

    @property
    def spilled(self) -> int:
        """How many values are on disk now."""
        return len(self._files)

    def close(self) -> None:
        """Drop every value and remove the temporary folder."""
        self.batches = [{} for _ in self.batches]
        self._files.clear()
        self.held = 0
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None


@dataclass(frozen=True)
class Stage:
    """What one level runs.

    Attributes
    ----------
    nodes : tuple of int
        Indices (in the graph's order) of the nodes it runs; empty when every activation
        it needs is already at hand.
    frontier_in : tuple of str
        Values made by earlier levels that its nodes read (fed from memory).
    sources : tuple of str
        Graph inputs (initializers aside) its nodes read: calibration data, fed weights.
    wanted : tuple of str
        The activations of the level, in the order asked for.
    fetch : tuple of str
        Those of them its nodes make (the others were made, and kept, before).
    made : tuple of str
        Values its nodes make that later levels read (kept in memory).
    drop : tuple of str
        Kept values no later level reads: dropped once the level has run.
    """

    nodes: tuple[int, ...]
    frontier_in: tuple[str, ...]
    sources: tuple[str, ...]
    wanted: tuple[str, ...]
    fetch: tuple[str, ...]
    made: tuple[str, ...]
    drop: tuple[str, ...]


def _has_subgraph(onnx: Any, node: Any) -> bool:
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)


def stage_plan(model: Any, levels: Sequence[Sequence[str]]) -> list[Stage] | None:
    """Which nodes each level runs and which values cross from one level to the next.

    Parameters
    ----------
    model : onnx.ModelProto
        The graph to run, its target weights already graph inputs (nodes in topological
        order).
    levels : sequence of sequence of str
        Per level, the activations (values of the main graph) it needs.

    Returns
    -------
    list of Stage, or None
        One stage per level; None where the graph cannot be cut (see the module notes).
    """
    import onnx

    graph = model.graph
    inputs = {v.name for v in graph.input} - {t.name for t in graph.initializer}
    sources = inputs | {t.name for t in graph.initializer} | {""}
    producer: dict[str, int] = {}
    for index, node in enumerate(graph.node):
        if node.op_type in RANDOM_OPERATORS or _has_subgraph(onnx, node):
            return None
        for out in node.output:
            if out:
                producer[out] = index
    if any(a not in producer for level in levels for a in level):
        return None  # an activation that is a graph input or a constant: nothing to cut
    ran: set[int] = set()
    chosen: list[list[int]] = []
    for level in levels:
        mine: set[int] = set()
        stack = list(level)
        while stack:
            made_by = producer.get(stack.pop())
            if made_by is None or made_by in ran or made_by in mine:
                continue
            mine.add(made_by)
            stack.extend(x for x in graph.node[made_by].input if x and x not in sources)
        ran |= mine
        chosen.append(sorted(mine))
    made_at = {out: i for i, nodes in enumerate(chosen) for n in nodes for out in graph.node[n].output if out}
    last_use: dict[str, int] = {}
    for i, nodes in enumerate(chosen):
        for x in [*(x for n in nodes for x in graph.node[n].input), *levels[i]]:
            if x in made_at:
                last_use[x] = i
    stages = []
    for i, (nodes, level) in enumerate(zip(chosen, levels, strict=True)):
        mine_out = {out for n in nodes for out in graph.node[n].output if out}
        reads = dict.fromkeys(x for n in nodes for x in graph.node[n].input if x)
        frontier_in = tuple(x for x in reads if x in made_at and made_at[x] < i)
        stages.append(
            Stage(
                nodes=tuple(nodes),
                frontier_in=frontier_in,
                sources=tuple(x for x in reads if x in inputs),
                wanted=tuple(dict.fromkeys(level)),
                fetch=tuple(x for x in dict.fromkeys(level) if made_at[x] == i),
                made=tuple(sorted(x for x in mine_out if last_use.get(x, i) > i)),
                drop=tuple(sorted(x for x, last in last_use.items() if last == i and made_at[x] < i)),
            )
        )
    return stages


def _stage_model(model: Any, stage: Stage, kinds: Mapping[str, tuple[int, int]]) -> Any:
    """The model of one stage: its nodes, the initializers they read, frontier values as inputs.

    `kinds` gives each frontier value's ONNX element type and rank (from the arrays kept).
    """
    import onnx
    from onnx import helper

    graph = model.graph
    nodes = [graph.node[i] for i in stage.nodes]
    read = {x for node in nodes for x in node.input if x}
    sub = onnx.ModelProto()
    for field, value in model.ListFields():
        if field.name == "graph":
            continue
        if hasattr(value, "extend"):  # a repeated field
            getattr(sub, field.name).extend(value)
        elif hasattr(value, "CopyFrom"):
            getattr(sub, field.name).CopyFrom(value)
        else:
            setattr(sub, field.name, value)
    g = sub.graph
    g.name = graph.name
    g.node.extend(nodes)
    given = [v for v in graph.input if v.name in read]
    frontier = [
        helper.make_tensor_value_info(name, kinds[name][0], [f"{name}:{d}" for d in range(kinds[name][1])])
        for name in stage.frontier_in
    ]
    g.input.extend([*given, *frontier])
    g.initializer.extend(t for t in graph.initializer if t.name in read)
    g.sparse_initializer.extend(t for t in graph.sparse_initializer if t.values.name in read)
    g.output.extend(onnx.ValueInfoProto(name=name) for name in dict.fromkeys([*stage.fetch, *stage.made]))
    return sub


class LevelRunner:
    """Runs calibration data through an ONNX model level by level, each level's nodes only.

    Made by :meth:`for_levels`.

    Parameters
    ----------
    wf : WeightFile
        The model file (where its external data lies).
    model : onnx.ModelProto
        The prepared model (target weights as graph inputs:
        :func:`~arrayprune.adapters.pipeline.calibration._prepared_model`).
    plan : list of Stage
        From :func:`stage_plan` on `model`.
    memory : int, optional
        Bytes of kept values held in memory (:class:`FrontierStore`); default
        :func:`frontier_memory`.

    Use it as a context manager (or call :meth:`close`) so that values written to disk
    are removed.
    """

    def __init__(self, wf: Any, model: Any, plan: list[Stage], memory: int | None = None):
        self._wf = wf
        self._model = model
        self._plan = plan
        self._memory = frontier_memory() if memory is None else memory
        self.store: FrontierStore | None = None

    def __enter__(self) -> LevelRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Drop the kept values and remove any written to disk."""
        if self.store is not None:
            self.store.close()

    @classmethod
    def for_levels(
        cls,
        wf: Any,
        levels: Sequence[Sequence[str]],
        fed: Mapping[str, Any],
        model: Any = None,
        memory: int | None = None,
    ) -> LevelRunner | None:
        """A runner for `levels`, or None where the graph cannot be cut (run it whole instead).

        `model` is the prepared model (target weights as graph inputs) where the caller
        has it already; otherwise it is made from `wf` and `fed`. `memory` as for the class.
        """
        if model is None:
            model = _prepared_model(wf, sorted({a for level in levels for a in level}), fed)
        plan = stage_plan(model, levels)
        return None if plan is None else cls(wf, model, plan, memory)

    def run(
        self,
        level: int,
        calibration: Mapping[str, np.ndarray],
        casts: Mapping[str, Any],
        samples: int,
        batch_size: int,
        fixed: Mapping[str, np.ndarray],
        progress: Callable[[Sequence[Any], str], Iterable[Any]] | None = None,
    ) -> Iterator[dict[str, np.ndarray]]:
        """The activations of level `level`, batch by batch (levels must be run in order).

        Parameters
        ----------
        level : int
            The level, 0 first; each is run once, after every earlier one.
        calibration, casts, samples, batch_size
            As for :func:`~arrayprune.adapters.pipeline.calibration._run_batches`.
        fixed : mapping of str to ndarray
            The fed weights by graph input name (their current values).
        progress : callable, optional
            ``progress(items, description)`` wraps the loop over batches.

        Yields
        ------
        dict of str to ndarray
            The level's activations for one batch.

        Raises
        ------
        ValueError
            If onnxruntime fails (its message's last line).
        """
        stage = self._plan[level]
        starts = range(0, samples, batch_size)
        if self.store is None:
            self.store = FrontierStore(len(starts), self._memory)
        store = self.store
        session = None
        if stage.nodes:
            first = store.batches[0]
            kinds = {name: (_tensor_type(first[name].dtype), first[name].ndim) for name in stage.frontier_in}
            session = _open_session(self._wf, _stage_model(self._model, stage, kinds))
        quiet = _quiet_run_options()
        outputs = list(dict.fromkeys([*stage.fetch, *stage.made]))
        for b, start in enumerate(starts if progress is None else progress(starts, "calibration")):
            kept = store.batches[b]
            if session is not None:
                feeds = {name: kept[name] for name in stage.frontier_in}
                for name in stage.sources:
                    if name in casts:
                        part = calibration[name][start : start + batch_size]
                        feeds[name] = part if casts[name] is None else part.astype(casts[name])
                    elif name in fixed:
                        feeds[name] = fixed[name]
                try:
                    values = session.run(outputs, feeds, quiet)
                except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own types
                    raise ValueError(f"onnxruntime cannot run the calibration data: {_first_line(exc)}") from None
                made = dict(zip(outputs, values, strict=True))
                for name in stage.made:
                    store.put(b, name, made[name])
            else:
                made = {}
            result = {name: made[name] if name in made else _loaded(kept[name]) for name in stage.wanted}
            for name in stage.drop:
                store.pop(b, name)
            yield result


def _loaded(value: np.ndarray) -> np.ndarray:
    """`value` in memory: a copy where it is a memory map of a kept file (the caller keeps it)."""
    return np.array(value) if isinstance(value, np.memmap) else value


def _tensor_type(dtype: np.dtype) -> int:
    from onnx import helper

    return int(helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))
