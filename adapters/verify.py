"""Run an ONNX model and its pruned copy on the same inputs and compare their outputs.

What ``arrayprune prune --verify`` does, callable from Python: :func:`prepare` runs the
original model once (before anything is written), :func:`compare` runs the pruned one on
the same inputs, :func:`verify_onnx` does both.

Inputs are real data when given (a mapping of graph input name -> array: ``--verify-data``,
or calibration samples), else random: standard normal floats, 0/1 integers and booleans.
Random inputs need a size for every symbolic dimension. Exporters often bake the sizes
of their example into the graph (``torch.onnx.export`` of a ``TransformerEncoder``
reshapes to the traced batch and sequence length), so sizes are searched: every symbolic
dimension 1, then the combinations of 1..8 in order of their product, until the original
model runs; if none does, the error names the dimensions to give real inputs for.

Models are handed to onnxruntime by path (external data and models over 2 GB work),
with its log silenced: a failure is one line. bfloat16 inputs are fed as bfloat16
(rounded to nearest, ties to even); bfloat16 outputs, which onnxruntime cannot hand to
NumPy, are not compared.

The default tolerance (:data:`DEFAULT_TOL`) only catches broken models (outputs off by
more than their own largest magnitude, or no longer finite), not less accurate ones.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from arrayprune.adapters.formats.onnx import _narrow_bfloat16
from arrayprune.adapters.pipeline.calibration import graph_inputs
from arrayprune.adapters.plan import stream_seed

__all__ = ["DEFAULT_TOL", "OutputCheck", "Prepared", "compare", "prepare", "verify_onnx"]

DEFAULT_TOL = (1.0, 1e-6)
"""Default ``(rtol, atol)``: an output fails if ``max|pruned - original| > atol + rtol * max|original|``."""

_SIZES = range(1, 9)  # sizes tried for each symbolic dimension
_MAX_TRIES = 40  # runs of the original model while searching for sizes
_TYPES: dict[str, Any] = {
    "tensor(float)": np.float32,
    "tensor(double)": np.float64,
    "tensor(float16)": np.float16,
    "tensor(bool)": np.bool_,
    **{f"tensor({t})": np.dtype(t).type for t in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32")},
    "tensor(uint64)": np.uint64,
}
_BFLOAT16 = "tensor(bfloat16)"


class OutputCheck(NamedTuple):
    """The comparison of one output of the two models.

    Attributes
    ----------
    name : str
        The output.
    difference : float or None
        ``max|pruned - original|``; None if not compared (not floating point, bfloat16,
        shapes differ).
    tolerance : float or None
        ``atol + rtol * max|original|``; None if not compared.
    passed : bool
        Within the tolerance, and finite wherever the original is (True if not compared).
    """

    name: str
    difference: float | None
    tolerance: float | None
    passed: bool


class Prepared(NamedTuple):
    """The inputs and the original model's outputs, from :func:`prepare`.

    Attributes
    ----------
    feeds : dict of str to ndarray
        Graph input name -> array fed (bfloat16 inputs: their bits, uint16).
    outputs : list of tuple of (str, ndarray or None)
        The original model's outputs in graph order (None: bfloat16, not read).
    sizes : dict of str to int
        The size chosen for each symbolic dimension (empty with real data).
    """

    feeds: dict[str, np.ndarray]
    outputs: list[tuple[str, np.ndarray | None]]
    sizes: dict[str, int]


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def _label(model: Any) -> str:
    """How messages name a model: its path, or what a model in memory is."""
    return "the reference model (in memory)" if hasattr(model, "SerializeToString") else str(model)


def _session(path: Any) -> Any:
    """An onnxruntime CPU session of the model at `path` (by path: its external data beside it),
    or of an ``onnx.ModelProto`` in memory (its data inline)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 4  # fatal only: failures come back as one-line errors
    source = path.SerializeToString() if hasattr(path, "SerializeToString") else str(path)
    try:
        return ort.InferenceSession(source, opts, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own types
        raise ValueError(f"onnxruntime cannot load {_label(path)}: {_first_line(exc)}") from None


def _bfloat16_bits(x: np.ndarray) -> np.ndarray:

    if x.dtype.name == "bfloat16" and x.dtype.itemsize == 2:  # ml_dtypes' bfloat16
        return np.ascontiguousarray(x).view(np.uint16)
    return _narrow_bfloat16(np.asarray(x, dtype=np.float32))


def _run(session: Any, feeds: Mapping[str, np.ndarray]) -> list[tuple[str, np.ndarray | None]]:
    """Run `session`; bfloat16 inputs (bits) fed as bfloat16, bfloat16 outputs left unread (None)."""
    import onnxruntime as ort

    values = {}
    for inp in session.get_inputs():
        arr = np.ascontiguousarray(feeds[inp.name])
        if inp.type == _BFLOAT16:
            values[inp.name] = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(arr, 16)
        else:
            values[inp.name] = ort.OrtValue.ortvalue_from_numpy(arr)
    opts = ort.RunOptions()
    opts.log_severity_level = 4
    names = [o.name for o in session.get_outputs()]
    results = session.run_with_ort_values(names, values, opts)
    return [(n, None if r.data_type() == _BFLOAT16 else r.numpy()) for n, r in zip(names, results, strict=True)]


def _given_feeds(session: Any, data: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """`data` checked against the graph inputs, each cast to its input's type."""
    inputs = graph_inputs(session, data, "the verify data")
    feeds = {}
    for name, info in inputs.items():
        arr = np.asarray(data[name])
        if info.type == _BFLOAT16:
            if arr.dtype.kind != "f":
                raise ValueError(f"the verify data for bfloat16 input {name!r} is {arr.dtype}, not floating point")
            feeds[name] = _bfloat16_bits(arr)
        elif info.type in _TYPES:
            want = np.dtype(_TYPES[info.type])
            same_kind = arr.dtype.kind == want.kind or (arr.dtype.kind in "iu" and want.kind in "iu")
            if not same_kind:
                raise ValueError(f"the verify data for input {name!r} ({info.type}) is {arr.dtype}")
            feeds[name] = arr.astype(want, copy=False)
        else:
            raise ValueError(f"input {name!r} of type {info.type} is not supported")
    return feeds


def _symbols(session: Any) -> list[tuple[str, str]]:
    """(symbol, where) for every distinct symbolic dimension of the graph inputs."""
    found: dict[str, str] = {}
    for inp in session.get_inputs():
        for axis, d in enumerate(inp.shape):
            if not (isinstance(d, int) and d > 0):
                key = d if isinstance(d, str) and d else f"{inp.name}:{axis}"
                found.setdefault(key, f"axis {axis} of {inp.name!r}")
    return list(found.items())


def _random_feeds(session: Any, sizes: Mapping[str, int], rng: np.random.Generator) -> dict[str, np.ndarray]:
    feeds = {}
    for inp in session.get_inputs():
        shape = []
        for axis, d in enumerate(inp.shape):
            if isinstance(d, int) and d > 0:
                shape.append(d)
            else:
                shape.append(sizes[d if isinstance(d, str) and d else f"{inp.name}:{axis}"])
        if inp.type == _BFLOAT16:
            feeds[inp.name] = _bfloat16_bits(rng.standard_normal(shape).astype(np.float32))
        elif inp.type in ("tensor(float)", "tensor(double)", "tensor(float16)"):
            feeds[inp.name] = rng.standard_normal(shape).astype(_TYPES[inp.type])
        elif inp.type in _TYPES:
            feeds[inp.name] = rng.integers(0, 2, shape).astype(_TYPES[inp.type])
        else:
            raise ValueError(f"input {inp.name!r} of type {inp.type} is not supported: give --verify-data")
    return feeds


def _size_choices(n: int) -> list[tuple[int, ...]]:
    """Sizes for `n` symbolic dimensions: all 1, then 1..8 each, by product, at most a few dozen."""
    if n == 0:
        return [()]
    combos = sorted(itertools.product(_SIZES, repeat=min(n, 3)), key=lambda c: (math.prod(c), c))
    if n > 3:  # beyond three, the others follow the third
        combos = [(*c, *([c[-1]] * (n - 3))) for c in combos]
    return combos[:_MAX_TRIES]


def prepare(original: Any, *, data: Mapping[str, Any] | None = None, seed: int | None = None) -> Prepared:
    """Choose the inputs and run the original model on them.

    Parameters
    ----------
    original : str or onnx.ModelProto
        Path of the original ONNX model, or the model to compare with, in memory (the
        dense model with the channels that shrinking removed zeroed, for instance).
    data : mapping of str to array, optional
        Real inputs: every graph input name -> array. Random inputs if omitted.
    seed : int, optional
        Seed of the random inputs (0 if omitted).

    Returns
    -------
    Prepared

    Raises
    ------
    ValueError
        One line: onnxruntime cannot load or run the model, `data` does not match the
        graph inputs, or no size tried for the symbolic dimensions lets the model run
        (the message names them).
    ImportError
        If onnxruntime is missing.
    """
    session = _session(original)
    if data is not None:
        feeds = _given_feeds(session, data)
        try:
            return Prepared(feeds, _run(session, feeds), {})
        except Exception as exc:  # noqa: BLE001
            what = _label(original)
            raise ValueError(f"onnxruntime cannot run {what} on the verify data: {_first_line(exc)}") from None

    symbols = _symbols(session)
    first_error = None
    for choice in _size_choices(len(symbols)):
        sizes = dict(zip([s for s, _ in symbols], choice, strict=True))
        rng = np.random.default_rng(stream_seed(0 if seed is None else seed, "verify"))
        feeds = _random_feeds(session, sizes, rng)
        try:
            return Prepared(feeds, _run(session, feeds), sizes)
        except Exception as exc:  # noqa: BLE001
            first_error = first_error or _first_line(exc)
    named = ", ".join(f"{s!r} ({where})" for s, where in symbols)
    raise ValueError(
        f"onnxruntime cannot run {_label(original)} on random inputs with its symbolic dimensions {named} set to "
        f"sizes 1..{_SIZES[-1]} ({first_error}); give real inputs with --verify-data inputs.npz"
    )


def compare(pruned: str, prepared: Prepared, tol: tuple[float, float] = DEFAULT_TOL) -> list[OutputCheck]:
    """Run the pruned model on the prepared inputs and compare each output.

    Parameters
    ----------
    pruned : str
        Path of the pruned ONNX model.
    prepared : Prepared
        From :func:`prepare` on the original model.
    tol : tuple of float, default DEFAULT_TOL
        ``(rtol, atol)``.

    Returns
    -------
    list of OutputCheck
        One per output of the original model, in graph order.

    Raises
    ------
    ValueError
        One line: onnxruntime cannot load or run the pruned model.
    """
    session = _session(pruned)
    try:
        results = _run(session, prepared.feeds)
    except Exception as exc:  # noqa: BLE001
        raise ValueError(f"onnxruntime cannot run {pruned}: {_first_line(exc)}") from None
    rtol, atol = tol
    checks = []
    for (name, a), (_, b) in zip(prepared.outputs, results, strict=True):
        if a is None or b is None or a.dtype.kind != "f" or b.dtype.kind != "f" or a.shape != b.shape:
            checks.append(OutputCheck(name, None, None, True))  # labels, sequences, bfloat16: not a distance
            continue
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        diff = float(np.max(np.abs(a64 - b64))) if a.size else 0.0
        bound = atol + rtol * (float(np.max(np.abs(a64))) if a.size else 0.0)
        finite_lost = bool(np.any(np.isfinite(a64) & ~np.isfinite(b64)))
        checks.append(OutputCheck(name, diff, bound, not finite_lost and diff <= bound))
    return checks


def verify_onnx(
    original: str,
    pruned: str,
    *,
    data: Mapping[str, Any] | None = None,
    seed: int | None = None,
    tol: tuple[float, float] = DEFAULT_TOL,
) -> list[OutputCheck]:
    """Run both models on the same inputs and compare their outputs (``prune --verify``).

    Parameters
    ----------
    original, pruned : str
        Paths of the two ONNX models.
    data : mapping of str to array, optional
        Real inputs (``--verify-data``); random inputs if omitted (see the module notes).
    seed : int, optional
        Seed of the random inputs.
    tol : tuple of float, default DEFAULT_TOL
        ``(rtol, atol)``; the default only catches broken models.

    Returns
    -------
    list of OutputCheck

    Raises
    ------
    ValueError
        One line, as :func:`prepare` and :func:`compare` raise.
    """
    return compare(pruned, prepare(original, data=data, seed=seed), tol)
