"""Sensitivity scans: how much a model's outputs change when one weight alone is pruned.

For every selected weight and each of a few sparsities, the weight is pruned on its own
(the others dense) and the model is run on calibration data; the change of its outputs
against the dense model's is the weight's *curve*. Fragile weights have steep curves;
:func:`arrayprune.allocate_from_curves` turns curves into per-weight sparsities
(``arrayprune prune --allocation scan.json``).

* :func:`scan_onnx` runs an ONNX model through onnxruntime. The weights are graph inputs
  of one session, fed their values on every run, so a trial is one pass over the
  calibration data with one weight swapped in memory (no file, no new session); the
  dense outputs are computed once and kept (calibration samples times the outputs'
  sizes), the pruned outputs are compared batch by batch.
* :func:`scan_arrays` scans a mapping of arrays with a forward function of your own
  (a NumPy forward, a JAX function, ...).

The masks are those of the pruning pipeline (:func:`arrayprune.adapters.pipeline.method_for`:
``l1_unstructured``, ``wanda``, ``ln_structured`` along each weight's output axis) and,
for ``sparsegpt``, the reconstruction of :mod:`arrayprune.adapters.pipeline.reconstruction` (each
weight's Hessian from the dense model). The metric is the relative squared error
``sum((y - y0)^2) / sum(y0^2)`` of every floating output ``y`` against the dense ``y0``
over all calibration samples, averaged over the outputs.

A :class:`ScanResult` is written as JSON (:meth:`ScanResult.save`) and read back
(:meth:`ScanResult.load`); :func:`arrayprune.adapters.plots.plot_scan` draws it.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import arrayprune
from arrayprune.adapters import formats as fmt
from arrayprune.adapters.formats.files import read_json
from arrayprune.adapters.pipeline.calibration import (
    _check_inputs,
    _fed_inputs,
    _run_batches,
    _session,
    onnx_input_norms,
)
from arrayprune.adapters.pipeline.method_names import reconstructs, scan_methods
from arrayprune.adapters.pipeline.reconstruction import _hessians, _prune, _target
from arrayprune.adapters.pipeline.request import PruneSpec
from arrayprune.adapters.pipeline.scoring import method_for, scores_for
from arrayprune.adapters.plan import PlanEntry, file_roles, make_plan
from arrayprune.adapters.roles.names import tree_roles
from arrayprune.adapters.roles.onnx_graph import onnx_roles, weight_feeds
from arrayprune.method_parts import score_of
from arrayprune.registry import reconstruction_method

__all__ = [
    "DEFAULT_SPARSITIES",
    "METRIC",
    "OnnxTrials",
    "scan_methods",
    "Curve",
    "ScanResult",
    "check_sparsities",
    "scan_arrays",
    "scan_onnx",
]

#: The sparsities scanned unless told otherwise.
DEFAULT_SPARSITIES = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
#: What a curve's values are.
METRIC = "relative squared error of the floating outputs against the dense model, mean over outputs"
#: Fewest sparsities a scan takes.
MIN_SPARSITIES = 5

_FORMAT = "arrayprune scan"
_VERSION = 1
#: Largest scan file read.
_MAX_BYTES = 64 << 20


@dataclass(frozen=True)
class Curve:
    """One weight's sensitivity: the model's output error at each scanned sparsity.

    Attributes
    ----------
    name : str
        The weight.
    shape : tuple of int
        Its shape.
    errors : tuple of float
        The error at each sparsity of the scan.
    nodes : tuple of str
        The graph nodes reading the weight, in graph order (empty without a graph):
        what pictures call it.
    """

    name: str
    shape: tuple[int, ...]
    errors: tuple[float, ...]
    nodes: tuple[str, ...] = ()

    @property
    def size(self) -> int:
        """Its number of entries."""
        return math.prod(self.shape)

    @property
    def fragility(self) -> float:
        """The mean error over the scanned sparsities (higher: more fragile)."""
        return float(np.mean(self.errors)) if self.errors else 0.0


@dataclass
class ScanResult:
    """A sensitivity scan: the method, the sparsities, and one curve per weight.

    Attributes
    ----------
    method : str
        The pruning method of every trial.
    sparsities : tuple of float
        The sparsities scanned, ascending.
    curves : list of Curve
        One per weight, in the model's order (of an ONNX graph: the order of the first
        node reading each weight).
    outputs : list of str
        The outputs compared.
    samples : int
        Calibration samples run.
    model : str
        Where the model came from.
    metric : str
        What the curves' values are (:data:`METRIC`).
    """

    method: str
    sparsities: tuple[float, ...]
    curves: list[Curve] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    samples: int = 0
    model: str = ""
    metric: str = METRIC

    def curve(self, name: str) -> Curve:
        """The curve of weight `name` (``KeyError`` if it was not scanned)."""
        for c in self.curves:
            if c.name == name:
                return c
        raise KeyError(f"no curve for {name!r} in the scan")

    def ranked(self) -> list[Curve]:
        """The curves, most fragile first."""
        return sorted(self.curves, key=lambda c: -c.fragility)

    def to_dict(self) -> dict[str, Any]:
        """The scan as plain JSON values."""
        return {
            "format": _FORMAT,
            "version": _VERSION,
            "model": self.model,
            "method": self.method,
            "metric": self.metric,
            "sparsities": list(self.sparsities),
            "outputs": list(self.outputs),
            "samples": self.samples,
            "curves": [
                {"name": c.name, "shape": list(c.shape), "errors": list(c.errors)}
                | ({"nodes": list(c.nodes)} if c.nodes else {})
                for c in self.curves
            ],
        }

    @classmethod
    def from_dict(cls, data: Any) -> ScanResult:
        """A scan from :meth:`to_dict`'s values.

        Raises
        ------
        ValueError
            If `data` is not a scan of this version, or its curves do not fit its sparsities.
        """
        if not isinstance(data, dict) or data.get("format") != _FORMAT:
            raise ValueError("not a scan written by arrayprune scan (no 'format': 'arrayprune scan')")
        if data.get("version") != _VERSION or isinstance(data.get("version"), bool):
            raise ValueError(f"scan version {_shown(data.get('version'))} is not supported (expected {_VERSION})")
        for key in ("method", "sparsities", "curves"):
            if key not in data:
                raise ValueError(f"malformed scan: no {key!r}")
        sparsities = check_sparsities(_list(data["sparsities"], "'sparsities'", _number), least=1)
        curves = []
        for i, c in enumerate(_list(data["curves"], "'curves'")):
            if not isinstance(c, dict) or not {"name", "shape", "errors"} <= c.keys():
                raise ValueError(f"malformed scan: curve {i} is not an object with 'name', 'shape' and 'errors'")
            name = _text(c["name"], f"curve {i}: 'name'")
            errors = tuple(_list(c["errors"], f"curve {name!r}: 'errors'", _number))
            shape = tuple(_list(c["shape"], f"curve {name!r}: 'shape'", _count))
            nodes = tuple(_list(c.get("nodes", []), f"curve {name!r}: 'nodes'", _text))
            if len(errors) != len(sparsities):
                raise ValueError(f"curve {name!r} has {len(errors)} errors for {len(sparsities)} sparsities")
            if not all(e >= 0 for e in errors):
                raise ValueError(f"curve {name!r} has errors that are negative or not finite")
            curves.append(Curve(name, shape, errors, nodes))
        return cls(
            method=_text(data["method"], "'method'"),
            sparsities=sparsities,
            curves=curves,
            outputs=_list(data.get("outputs", []), "'outputs'", _text),
            samples=_count(data.get("samples", 0), "'samples'"),
            model=_text(data.get("model", ""), "'model'"),
            metric=_text(data.get("metric", METRIC), "'metric'"),
        )

    def save(self, path: Any) -> None:
        """Write the scan as JSON, atomically (a temporary file renamed into place)."""
        text = json.dumps(self.to_dict(), indent=1).encode() + b"\n"
        fmt.atomic_write(path, lambda f: f.write(text))

    @classmethod
    def load(cls, path: Any) -> ScanResult:
        """Read a scan written by :meth:`save`.

        Raises
        ------
        ValueError
            If the file is not JSON, or not a scan (one line, naming the problem).
        """
        try:
            data = read_json(os.fspath(path), _MAX_BYTES, "a scan", "not a valid scan")
        except fmt.FormatError as exc:  # not a regular file (a FIFO waits forever), too large, not JSON
            raise ValueError(f"cannot read the scan: {exc.problem}") from None
        return cls.from_dict(data)


def _shown(value: Any) -> str:
    """`value` for a message: short, whatever it holds."""
    text = repr(value) if isinstance(value, (str, bool)) or value is None else type(value).__name__
    return text if len(text) <= 40 else text[:37] + "..."


def _number(value: Any, what: str) -> float:
    """A finite JSON number (not a boolean) as a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"malformed scan: {what} must be numbers, got {_shown(value)}")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise ValueError(f"malformed scan: {what} must be finite numbers, got one out of range")
    return number


def _count(value: Any, what: str) -> int:
    """A whole JSON number of at most 2**63 - 1 (not a boolean, not 16.5)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        shown = f"{value:g}" if isinstance(value, float) else _shown(value)
        if isinstance(value, int) and not isinstance(value, bool):
            shown = "a number out of range"
        raise ValueError(f"malformed scan: {what} must be whole numbers from 0 to 2**63 - 1, got {shown}")
    return value


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"malformed scan: {what} must be a string, got {_shown(value)}")
    return value


def _list(value: Any, what: str, item: Callable[[Any, str], Any] | None = None) -> list[Any]:
    """A JSON list, each item checked by `item` (given `what` for its message)."""
    if not isinstance(value, list):
        raise ValueError(f"malformed scan: {what} must be a list, got {_shown(value)}")
    return value if item is None else [item(v, what) for v in value]


def check_sparsities(values: Iterable[Any], least: int = MIN_SPARSITIES) -> tuple[float, ...]:
    """Sparsities of a scan: at least `least`, ascending, in ``(0, 1)``.

    Raises
    ------
    ValueError
        Naming what is wrong.
    """
    try:
        out = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        raise ValueError("sparsities must be numbers") from None
    if len(out) < least:
        raise ValueError(f"a scan needs at least {least} sparsities, got {len(out)}")
    if not all(0.0 < s < 1.0 for s in out) or any(b <= a for a, b in zip(out, out[1:], strict=False)):
        raise ValueError(f"sparsities must be ascending, each in (0, 1): got {', '.join(f'{s:g}' for s in out)}")
    return out



def _check_method(method: str) -> None:
    methods = scan_methods()
    if method not in methods:
        raise ValueError(f"a scan prunes with {', '.join(methods)}, not {method!r}")


def _targets(
    params: Mapping, roles: Mapping, method: str, include: Sequence[str], exclude: Sequence[str], min_size: int
) -> list[PlanEntry]:
    plan = make_plan(params, roles, method=method, include=include, exclude=exclude, min_size=min_size)
    targets = [e for e in plan if e.prune]
    if not targets:
        raise ValueError("no weight selected to scan (see --include, --exclude, --min-size)")
    return targets


def _calibrated(method: str) -> bool:
    """Whether `method`'s score needs the calibration's input norms (Wanda's)."""
    return score_of(arrayprune.METHODS[method]).statistic == "input_norms"


def _masked(target: PlanEntry, method: str, sparsity: float, norms: Mapping | None) -> np.ndarray:
    """`target`'s value pruned alone at `sparsity` by the pipeline's method for it."""

    value = np.asarray(target.value)
    scores = scores_for(target, norms, value)
    ranked = value if scores is None else scores
    keep = method_for(target, PruneSpec(method=method, amount=sparsity)).compute_mask(ranked, None)
    return np.where(np.asarray(keep, dtype=bool), value, np.zeros((), value.dtype))


def _relative_errors(err: Sequence[float], ref: Sequence[float]) -> float:
    """Mean over outputs of ``err / ref`` (``err`` itself where the dense output is zero)."""
    return float(np.mean([e / r if r > 0 else e for e, r in zip(err, ref, strict=True)]))


def _squares(a: Any) -> float:
    a = np.asarray(a, dtype=np.float64)
    return float(np.einsum("i,i->", a.ravel(), a.ravel()))


class OnnxTrials:
    """An ONNX model run on calibration data with some weights replaced: its output error against the dense model.

    The weights named are graph inputs of one onnxruntime session, fed their values on
    every run (no file, no new session per trial); the dense outputs are computed once
    and kept, a trial's outputs are compared batch by batch. The error is the scan's
    metric (:data:`METRIC`): ``sum((y - y0)^2) / sum(y0^2)`` of every output compared,
    over all samples, averaged over the outputs.

    Parameters
    ----------
    wf : WeightFile
        The model, as :func:`arrayprune.adapters.formats.load` read it; not modified.
    calibration : mapping of str to ndarray
        Every graph input to samples along axis 0.
    names : sequence of str
        The weights (initializers) a trial may replace.
    outputs : sequence of str, optional
        The values compared (graph outputs or any value of the main graph); every
        floating graph output if omitted.
    extra : sequence of str, optional
        Further values the session computes (activations for Hessians).
    batch_size : int, optional
        Samples run at a time.

    Attributes
    ----------
    outputs : list of str
        The values compared.
    samples : int
        Calibration samples.
    session, casts, inputs, dense
        The session, the calibration inputs' dtypes, each weight's graph input, and the
        dense weights keyed by graph input.

    Raises
    ------
    ValueError
        Calibration data that do not fit the graph, an output that is no floating value
        of the graph, a model without a floating output.
    """

    def __init__(
        self,
        wf: Any,
        calibration: Mapping[str, np.ndarray],
        names: Sequence[str],
        *,
        outputs: Sequence[str] = (),
        extra: Sequence[str] = (),
        batch_size: int | None = None,
    ):

        model = wf.context["model"]
        chosen = list(dict.fromkeys(outputs))
        values = {v for node in model.graph.node for v in node.output} | {o.name for o in model.graph.output}
        unknown = [o for o in chosen if o not in values]
        if unknown:
            raise ValueError(f"{unknown[0]!r} is no value computed by the graph (outputs: compare graph values)")
        graph_outputs = chosen or [o.name for o in model.graph.output]
        fed = {name: np.asarray(wf.params[name]).dtype for name in names}
        self.session = _session(wf, list(dict.fromkeys([*graph_outputs, *extra])), fed)
        kinds = {o.name: o.type for o in self.session.get_outputs()}
        floating = ("tensor(float)", "tensor(double)", "tensor(float16)")
        self.outputs = [o for o in graph_outputs if kinds.get(o) in floating or (chosen and kinds.get(o) is None)]
        if chosen and self.outputs != chosen:
            raise ValueError(f"{sorted(set(chosen) - set(self.outputs))[0]!r} is not a floating-point value")
        if not self.outputs:
            raise ValueError("the model has no floating-point output to compare")
        self.inputs = _fed_inputs(model, fed)
        self.casts, self.samples = _check_inputs(self.session, calibration, self.inputs.values())
        self.dense = {self.inputs[name]: np.asarray(wf.params[name]) for name in names}
        self._calibration, self._batch_size = calibration, batch_size
        self._reference = [{o: np.asarray(v[o]) for o in self.outputs} for v in self._run(self.dense)]
        self._ref = [sum(_squares(b[o]) for b in self._reference) for o in self.outputs]

    def _run(self, weights: Mapping[str, np.ndarray]) -> Iterable[dict[str, np.ndarray]]:

        return _run_batches(
            self.session, self._calibration, self.casts, self.samples, self.outputs, self._batch_size, weights
        )

    def error(self, weights: Mapping[str, np.ndarray]) -> float:
        """The output error with `weights` (name to value) in place of the dense ones, the others dense."""
        err = [0.0] * len(self.outputs)
        fed = {**self.dense, **{self.inputs[name]: np.asarray(v) for name, v in weights.items()}}
        for batch, got in zip(self._reference, self._run(fed), strict=True):
            for i, o in enumerate(self.outputs):
                err[i] += _squares(np.asarray(got[o], dtype=np.float64) - batch[o])
        return _relative_errors(err, self._ref)


def scan_onnx(
    wf: Any,
    calibration: Mapping[str, np.ndarray],
    *,
    method: str = "l1_unstructured",
    sparsities: Sequence[float] = DEFAULT_SPARSITIES,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    min_size: int = 0,
    calibration_batch: int | None = None,
    outputs: Sequence[str] = (),
    progress: Callable[..., Iterable[Any]] | None = None,
) -> ScanResult:
    """Scan the weights of an ONNX model: each pruned alone, the outputs compared with the dense model's.

    Parameters
    ----------
    wf : WeightFile
        The model, as :func:`arrayprune.adapters.formats.load` read it; not modified.
    calibration : mapping of str to ndarray
        Every graph input to samples along axis 0.
    method : str, default "l1_unstructured"
        One of :func:`scan_methods`; ``wanda`` takes its input norms and ``sparsegpt``
        its Hessians from `calibration`, in the dense model.
    sparsities : sequence of float
        At least five, ascending, in ``(0, 1)``; :data:`DEFAULT_SPARSITIES` if omitted.
    include, exclude, min_size
        The selection, as for ``arrayprune prune`` (the default: every layer weight).
    calibration_batch : int, optional
        Samples run at a time.
    outputs : sequence of str, optional
        The values compared: names of graph outputs or of any value of the main graph
        (the logits before a ``Softmax``, whose probabilities saturate); every floating
        graph output if omitted.
    progress : callable, optional
        ``progress(items, description, unit)`` wraps the loop over weights.

    Returns
    -------
    ScanResult

    Raises
    ------
    ValueError
        A method or sparsities a scan does not take, no weight selected, calibration
        data that do not fit the graph, a model without a floating output, an output
        that is no value of the graph, or a weight the method cannot prune (one line).
    """

    _check_method(method)
    sparsities = check_sparsities(sparsities)
    targets = _targets(wf.params, file_roles(wf), method, include, exclude, min_size)
    model = wf.context["model"]
    position = {node.name: i for i, node in reversed(list(enumerate(model.graph.node))) if node.name}
    unread = len(model.graph.node)  # weights read in no named node of the main graph: last, in file order
    targets.sort(key=lambda t: min((position.get(n, unread) for n in t.role.nodes), default=unread))
    names = [t.name for t in targets]
    norms = onnx_input_norms(wf, calibration, names, batch_size=calibration_batch) if _calibrated(method) else None
    rebuilt = {}
    if reconstructs(method):
        feeds, roles = weight_feeds(model), onnx_roles(model)
        rebuilt = {name: _target(wf, name, feeds.get(name), roles.get(name)) for name in names}
    activations = sorted({f.activation for t in rebuilt.values() for f in t.feeds})
    trials = OnnxTrials(wf, calibration, names, outputs=outputs, extra=activations, batch_size=calibration_batch)
    session, casts, samples, dense = trials.session, trials.casts, trials.samples, trials.dense
    curves = []
    for target in targets if progress is None else progress(targets, "scan", "weight"):
        hessians = None
        if reconstructs(method):
            hessians = _hessians(session, calibration, casts, samples, [rebuilt[target.name]], calibration_batch, dense)
        errors = []
        for s in sparsities:
            if hessians is not None:
                weight = np.asarray(target.value)
                chosen = reconstruction_method(method)(amount=s)
                pruned = _prune(rebuilt[target.name], weight, hessians[target.name], chosen).weight
            else:
                pruned = _masked(target, method, s, norms)
            errors.append(trials.error({target.name: pruned}))
        curves.append(Curve(target.name, target.shape, tuple(errors), target.role.nodes))
    return ScanResult(method, sparsities, curves, trials.outputs, samples, wf.path)


def scan_arrays(
    params: Mapping[str, Any],
    forward: Callable[[Mapping[str, Any]], Any],
    *,
    method: str = "l1_unstructured",
    sparsities: Sequence[float] = DEFAULT_SPARSITIES,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    min_size: int = 0,
    input_norms: Mapping[str, Any] | None = None,
    hessians: Mapping[str, Any] | None = None,
    progress: Callable[..., Iterable[Any]] | None = None,
) -> ScanResult:
    """Scan the weights of a mapping of arrays with a forward function of your own.

    Parameters
    ----------
    params : mapping of str to array
        Weight name to array (NumPy, or anything :func:`numpy.asarray` reads); roles and
        axes come from the names, as for a state dict (``[out, in]`` weights).
    forward : callable
        ``forward(weights)``: the model's outputs on your calibration data for the
        weights given (a mapping like `params`): an array, or a sequence or mapping of
        arrays.
    method : str, default "l1_unstructured"
        One of :func:`scan_methods`.
    sparsities : sequence of float
        At least five, ascending, in ``(0, 1)``.
    include, exclude, min_size
        The selection (default: every layer weight, by its name).
    input_norms : mapping of str to ndarray, optional
        ``wanda``: each weight's input-feature norms (one per input feature).
    hessians : mapping of str to ndarray, optional
        ``sparsegpt``: each weight's Hessian ``X^T X / n`` (``[in, in]``).
    progress : callable, optional
        ``progress(items, description, unit)`` wraps the loop over weights.

    Returns
    -------
    ScanResult

    Raises
    ------
    ValueError
        A method or sparsities a scan does not take, no weight selected, missing norms or
        Hessians, or outputs without a floating array.

    Examples
    --------
    >>> def forward(w):  # doctest: +SKIP
    ...     return np.maximum(x @ w["fc1.weight"].T, 0) @ w["fc2.weight"].T
    >>> result = scan_arrays({"fc1.weight": w1, "fc2.weight": w2}, forward)  # doctest: +SKIP
    >>> [c.name for c in result.ranked()]  # most fragile first  # doctest: +SKIP
    """
    _check_method(method)
    sparsities = check_sparsities(sparsities)
    params = {str(k): v for k, v in params.items()}
    targets = _targets(params, tree_roles(params), method, include, exclude, min_size)
    needed = None
    if reconstructs(method):
        needed = ("hessians", hessians)
    elif _calibrated(method):
        needed = ("input_norms", input_norms)
    if needed is not None:
        what, given = needed
        missing = [t.name for t in targets if given is None or t.name not in given]
        if missing:
            raise ValueError(f"{method} needs {what} for every weight scanned; none for {missing[0]!r}")
    given_hessians: Mapping[str, Any] = hessians or {}

    def outputs_of(weights: Mapping[str, Any]) -> list[np.ndarray]:
        y = forward(weights)
        items = list(y.values()) if isinstance(y, Mapping) else list(y) if isinstance(y, list | tuple) else [y]
        return [np.asarray(a, dtype=np.float64) for a in items if np.asarray(a).dtype.kind in "fc"]

    reference = outputs_of(params)
    if not reference:
        raise ValueError("forward returned no floating-point output to compare")
    ref = [_squares(y) for y in reference]
    curves = []
    for target in targets if progress is None else progress(targets, "scan", "weight"):
        errors = []
        for s in sparsities:
            if reconstructs(method):
                try:
                    new, _ = reconstruction_method(method)(amount=s).reconstruct(
                        np.asarray(target.value), np.asarray(given_hessians[target.name]),
                        reduction_axis=target.role.reduction_axis,
                    )
                except ValueError as exc:  # a degenerate Hessian: named
                    raise ValueError(f"{target.name!r}: {exc}") from None
                pruned = np.asarray(new)
            else:
                pruned = _masked(target, method, s, input_norms)
            got = outputs_of({**params, target.name: pruned})
            errors.append(_relative_errors([_squares(g - y) for g, y in zip(got, reference, strict=True)], ref))
        curves.append(Curve(target.name, target.shape, tuple(errors)))
    return ScanResult(method, sparsities, curves, [f"output {i}" for i in range(len(reference))], 0, "arrays")

