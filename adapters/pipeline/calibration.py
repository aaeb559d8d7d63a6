"""Wanda's calibration for model files: input-feature norms, and the scores made from them.

For an ONNX model, :func:`onnx_input_norms` runs calibration batches through the dense
model with onnxruntime, once. The activations each weight multiplies (``MatMul`` and
``Gemm`` A, a convolution's X: :func:`~arrayprune.adapters.roles.onnx_graph.weight_feeds`)
are added as extra graph outputs, read batch by batch, and reduced at once to a running
sum of squares per input feature, so memory holds one batch of activations and one
vector per weight. Files without a graph take norms computed elsewhere
(:func:`read_input_norms`: a ``.npz`` of weight name -> vector). :func:`wanda_scores_for`
turns norms into scores along each weight's reduction axis (from its role).

All norms come from one pass over the unpruned model; the paper's block-by-block
variant (each block calibrated on the output of the blocks already pruned) is not done.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

import arrayprune
from arrayprune.adapters import formats
from arrayprune.adapters.formats import onnx as onnx_format
from arrayprune.adapters.pipeline.devices import onnx_providers
from arrayprune.adapters.roles import Role
from arrayprune.adapters.roles.onnx_graph import weight_feeds

__all__ = [
    "InputNorms",
    "graph_inputs",
    "onnx_input_norms",
    "read_calibration",
    "read_input_norms",
    "wanda_scores_for",
]

#: Calibration samples onnxruntime runs at a time, unless told otherwise.
BATCH_SIZE = 64

_ORT_FLOATS = {"tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16}


class InputNorms(NamedTuple):
    """The input-feature norms of one weight.

    Attributes
    ----------
    norms : ndarray
        float64, one L2 norm per input feature of the layer.
    groups : int
        Groups of a grouped convolution (each output unit reads one group), else 1.
    """

    norms: np.ndarray
    groups: int = 1


def read_calibration(path: str) -> dict[str, np.ndarray]:
    """Calibration batches from an ``.npz`` file: graph input name -> array ``[N, ...]``.

    Read with the safety rules of every ``.npz`` input (no pickle, sizes checked).

    Raises
    ------
    ValueError
        If the file holds no array, or the arrays differ in their first dimension.
    """
    arrays = _read_npz(path)
    if not arrays:
        raise ValueError("the calibration file holds no array")
    lengths = {name: int(a.shape[0]) if a.ndim else 0 for name, a in arrays.items()}
    if len(set(lengths.values())) != 1 or 0 in lengths.values():
        raise ValueError(f"calibration arrays need one common, non-zero first dimension (samples); got {lengths}")
    return arrays


def read_input_norms(path: str) -> dict[str, np.ndarray]:
    """Precomputed input norms from an ``.npz`` file: weight name -> 1-D vector.

    Raises
    ------
    ValueError
        If an entry is not a 1-D real vector of finite, non-negative values.
    """
    norms = _read_npz(path)
    for name, v in norms.items():
        if v.ndim != 1 or v.dtype.kind not in "fiu":
            raise ValueError(f"input norms {name!r}: expected a 1-D vector of non-negative numbers, all finite")
        bad = {
            "NaN": int(np.count_nonzero(np.isnan(v))) if v.dtype.kind == "f" else 0,
            "infinite": int(np.count_nonzero(np.isinf(v))) if v.dtype.kind == "f" else 0,
            "negative": int(np.count_nonzero(v < 0)),
        }
        if any(bad.values()):
            found = ", ".join(f"{n} {what}" for what, n in bad.items() if n)
            raise ValueError(
                f"input norms {name!r}: expected a 1-D vector of non-negative numbers, all finite; {found} of {v.size}"
            )
    return {name: v.astype(np.float64) for name, v in norms.items()}


def _read_npz(path: str) -> dict[str, np.ndarray]:

    wf = formats.load(path, "npz")
    return {str(k): formats.to_numpy(v) for k, v in wf.params.items()}


def onnx_input_norms(
    wf: Any,
    calibration: Mapping[str, np.ndarray],
    names: Iterable[str],
    *,
    batch_size: int | None = None,
    progress: Callable[[Sequence[Any], str], Iterable[Any]] | None = None,
) -> dict[str, InputNorms]:
    """Input-feature norms of ONNX weights over calibration data, in one onnxruntime pass.

    Parameters
    ----------
    wf : WeightFile
        The ONNX model, as :func:`arrayprune.adapters.formats.load` read it.
    calibration : mapping of str to ndarray
        Every graph input (initializers aside) to a batch of samples along axis 0.
    names : iterable of str
        The weights to calibrate.
    batch_size : int, optional
        Samples run at a time; :data:`BATCH_SIZE` if omitted.
    progress : callable, optional
        ``progress(items, description)`` wraps the loop over batches (a progress bar).

    Returns
    -------
    dict of str to InputNorms

    Raises
    ------
    ValueError
        If a weight cannot be calibrated (a use inside a subgraph, or by an integer
        operator), the calibration data does not match the graph's inputs, the model is
        over 2 GB without external data (onnxruntime takes such a model in memory), or
        onnxruntime fails. A model with external data is handed to onnxruntime by path.
    ImportError
        If onnx or onnxruntime is missing.
    """

    names = list(names)
    all_feeds = weight_feeds(wf.context["model"])
    feeds = {}
    for name in names:
        found = all_feeds.get(name)
        if found is None:
            raise ValueError(f"{name!r} is not a weight of the graph: Wanda has no input norms for it")
        if isinstance(found, str):
            raise ValueError(f"{name!r} cannot be calibrated ({found}); leave it out with --exclude")
        feeds[name] = found
    session = _session(wf, sorted({f.activation for fs in feeds.values() for f in fs}))
    casts, samples = _check_inputs(session, calibration)
    wanted = [o.name for o in session.get_outputs()]
    sums: dict[str, np.ndarray] = {}
    for outputs in _run_batches(session, calibration, casts, samples, wanted, batch_size, progress=progress):
        for name, fs in feeds.items():
            for f in fs:
                squares = _feature_squares(outputs[f.activation], f.feature_axis)
                sums[name] = squares if name not in sums else sums[name] + squares
    return {name: InputNorms(np.sqrt(sums[name]), feeds[name][0].groups) for name in names}


def _feature_squares(a: np.ndarray, axis: int) -> np.ndarray:
    """Sum of squares of `a` per index along `axis`, over every other axis (float64)."""
    a = np.asarray(a)
    if a.ndim == 1:
        axis = 0
    flat = np.moveaxis(a, axis, -1).reshape(-1, a.shape[axis]).astype(np.float64)
    return np.einsum("ij,ij->j", flat, flat)


def _run_batches(
    session: Any,
    calibration: Mapping[str, np.ndarray],
    casts: Mapping[str, Any],
    samples: int,
    wanted: list[str],
    batch_size: int | None = None,
    fixed: Mapping[str, np.ndarray] | None = None,
    progress: Callable[[Sequence[Any], str], Iterable[Any]] | None = None,
) -> Iterator[dict[str, np.ndarray]]:
    """Run the calibration data through `session` a batch at a time: the `wanted` outputs of each.

    Parameters
    ----------
    session : onnxruntime.InferenceSession
    calibration : mapping of str to ndarray
        Graph input name to samples along axis 0 (checked by :func:`_check_inputs`).
    casts : mapping of str to dtype or None
        The dtype each input is cast to, a batch at a time (from :func:`_check_inputs`).
    samples : int
        Number of samples.
    wanted : list of str
        The outputs to fetch.
    batch_size : int, optional
        Samples run at a time; :data:`BATCH_SIZE` if omitted.
    fixed : mapping of str to ndarray, optional
        Further inputs fed unchanged with every batch (weights made graph inputs).
    progress : callable, optional
        ``progress(items, description)`` wraps the loop over batches (a progress bar).

    Yields
    ------
    dict of str to ndarray
        Output name to its value for one batch.

    Raises
    ------
    ValueError
        If onnxruntime fails (its message's last line).
    """
    batch_size = batch_size or BATCH_SIZE
    quiet = _quiet_run_options()
    starts = range(0, samples, batch_size)
    for start in starts if progress is None else progress(starts, "calibration"):
        batch = dict(fixed or {})
        for k, cast in casts.items():  # one batch cast at a time: memory holds one batch
            part = calibration[k][start : start + batch_size]
            batch[k] = part if cast is None else part.astype(cast)
        try:
            values = session.run(wanted, batch, quiet)
        except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own types
            raise ValueError(f"onnxruntime cannot run the calibration data: {_first_line(exc)}") from None
        yield dict(zip(wanted, values, strict=True))


def _session(wf: Any, activations: list[str], fed: Mapping[str, np.dtype] | None = None) -> Any:
    """An onnxruntime session of the model whose outputs are `activations`.

    `fed` names initializers of the main graph that become graph inputs instead, of the
    given dtypes, so that their current values are fed with every run
    (:func:`_fed_inputs` names the inputs; a weight stored in another dtype, bfloat16
    say, is cast to it inside the graph). The model is made by :func:`_prepared_model`
    and handed over by :func:`_open_session`.
    """
    return _open_session(wf, _prepared_model(wf, activations, fed))


def _prepared_model(wf: Any, activations: list[str], fed: Mapping[str, np.dtype] | None = None) -> Any:
    """A copy of the model whose outputs are `activations`, the initializers in `fed` made graph inputs."""
    import onnx

    model = onnx.ModelProto()
    model.CopyFrom(wf.context["model"])
    del model.graph.output[:]
    model.graph.output.extend(onnx.ValueInfoProto(name=a) for a in activations)
    if fed:
        _feed_initializers(model, fed)
    return model


def _open_session(wf: Any, model: Any) -> Any:
    """An onnxruntime session of `model`, a graph made from `wf`'s (its initializers may be stored outside).

    A model without external data is handed over in memory. One with external data is
    handed over by path, so that onnxruntime reads the data files itself (no 2 GB limit
    of protobuf, no copy of the weights): the graph is written to a temporary ``.onnx``
    in the model's own folder, where its relative data locations resolve, and removed
    once the session is made. Where that folder cannot be written, the data is inlined
    in memory (under 2 GB).
    """
    import onnx

    external = wf.context.get("external", {})
    uses_external = any(t.data_location == onnx.TensorProto.EXTERNAL for t in onnx_format.iter_initializers(model))
    if uses_external:
        folder = os.path.dirname(os.path.abspath(wf.path))
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(wf.path)}.", suffix=".calibration.onnx", dir=folder)
        except OSError:
            fd = -1
        if fd >= 0:
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(model.SerializeToString())
                return _ort_session(tmp)
            finally:
                os.unlink(tmp)
        for tensor in onnx_format.iter_initializers(model):
            if tensor.name in external:  # read and checked by the loader: inline it
                tensor.CopyFrom(onnx_format.inline_tensor(tensor, external[tensor.name]))
    if model.ByteSize() > onnx_format._PROTOBUF_LIMIT:
        raise ValueError(
            "the model is over 2 GB without external data, or its folder cannot be written: onnxruntime "
            "cannot be handed it"
        )
    return _ort_session(model.SerializeToString())


def _fed_inputs(model: Any, fed: Mapping[str, Any]) -> dict[str, str]:
    """The graph input that feeds each initializer named in `fed` (name -> dtype fed).

    The initializer's own name, or ``name + "::fed"`` where it is stored in another
    dtype than the one fed (bfloat16, fed as float32): a ``Cast`` makes it.
    """
    from onnx import helper

    inputs = {}
    for tensor in model.graph.initializer:
        if tensor.name in fed:
            same = helper.np_dtype_to_tensor_dtype(np.dtype(fed[tensor.name])) == tensor.data_type
            inputs[tensor.name] = tensor.name if same else tensor.name + "::fed"
    return inputs


def _feed_initializers(model: Any, fed: Mapping[str, Any]) -> None:
    """Turn initializers of the main graph into graph inputs of the given dtypes, in place.

    Each is fed under the name :func:`_fed_inputs` gives; one stored in another dtype is
    cast back to it by a ``Cast`` node at the start of the graph.
    """
    from onnx import helper

    names = _fed_inputs(model, fed)
    given = {v.name for v in model.graph.input}
    kept, casts, inputs = [], [], []
    for tensor in model.graph.initializer:
        if tensor.name not in names:
            kept.append(tensor)
            continue
        name = names[tensor.name]
        elem = helper.np_dtype_to_tensor_dtype(np.dtype(fed[tensor.name]))
        if name != tensor.name:
            casts.append(helper.make_node("Cast", [name], [tensor.name], to=tensor.data_type))
        if name not in given:
            inputs.append(helper.make_tensor_value_info(name, elem, list(tensor.dims)))
    # an old-style model lists initializers among its inputs too: a cast one is no input any more
    kept_inputs = [v for v in model.graph.input if v.name not in names or names[v.name] == v.name]
    del model.graph.input[:]
    model.graph.input.extend([*kept_inputs, *inputs])
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    nodes = [*casts, *model.graph.node]
    del model.graph.node[:]
    model.graph.node.extend(nodes)


def _ort_session(model: str | bytes) -> Any:
    """An onnxruntime CPU session of a model (a path or its bytes), its log silenced.

    Raises
    ------
    ValueError
        If onnxruntime cannot load it (its message's last line).
    """
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    try:
        return ort.InferenceSession(model, opts, providers=onnx_providers())
    except Exception as exc:  # noqa: BLE001
        raise ValueError(f"onnxruntime cannot load the model: {_first_line(exc)}") from None


def _quiet_run_options() -> Any:
    """onnxruntime run options that log errors only through the exception they raise.

    A failing run (a token id out of a Gather's range, say) would otherwise print
    onnxruntime's own log line to stderr before arrayprune's one-line error.
    """
    import onnxruntime as ort

    options = ort.RunOptions()
    options.log_severity_level = 4  # fatal only: the exception carries the message
    return options


def _check_values(name: str, values: np.ndarray, want: Any) -> None:
    """Refuse calibration values that are not finite, or do not fit the input's float dtype.

    Scanned a slice of samples at a time, so memory holds one slice of flags.
    """
    if values.dtype.kind != "f":
        return
    limit = np.finfo(want).max if want is not None and np.finfo(want).max < np.finfo(values.dtype).max else None
    step = max(1, (1 << 20) // max(1, int(np.prod(values.shape[1:]))))
    bad = beyond = 0
    for start in range(0, values.shape[0], step):
        part = values[start : start + step]
        finite = np.isfinite(part)
        bad += int(part.size - np.count_nonzero(finite))
        if limit is not None:
            beyond += int(np.count_nonzero(np.abs(np.where(finite, part, 0)) > limit))
    if bad:
        raise ValueError(
            f"calibration input {name!r}: {bad} of {values.size} values are not finite (NaN or infinity)"
        )
    if beyond:
        kind = np.dtype(want).name
        raise ValueError(
            f"calibration input {name!r}: {beyond} {values.dtype.name} values lie beyond {kind}'s range "
            f"(the model takes {kind})"
        )


def graph_inputs(session: Any, data: Mapping[str, Any], what: str, skip: Iterable[str] = ()) -> dict[str, Any]:
    """The graph inputs of an onnxruntime `session` by name, once `data` names exactly them.

    Parameters
    ----------
    session : onnxruntime.InferenceSession
        The model's session.
    data : mapping
        Graph input name to samples.
    what : str
        What `data` is, for the message (``"the calibration data"``).
    skip : iterable of str, optional
        Graph inputs that are not data (weights the caller feeds).

    Returns
    -------
    dict
        Name to the input's ``NodeArg``, in the graph's order.

    Raises
    ------
    ValueError
        If `data` lacks a graph input or has a name that is not one (the first named).
    """
    skip = set(skip)
    inputs = {i.name: i for i in session.get_inputs() if i.name not in skip}
    missing = [n for n in inputs if n not in data]
    extra = [n for n in data if n not in inputs]
    if missing or extra:
        problem = f"lacks graph input {missing[0]!r}" if missing else f"has {extra[0]!r}, not a graph input"
        raise ValueError(f"{what} {problem} (graph inputs: {', '.join(map(repr, inputs))})")
    return inputs


def _check_inputs(
    session: Any, calibration: Mapping[str, np.ndarray], fed: Iterable[str] = ()
) -> tuple[dict[str, Any], int]:
    """Check the calibration arrays against the graph inputs: the dtype to cast each to, the sample count.

    Values must be finite and fit the float dtype the graph input takes: NaN or
    infinity would make every norm they reach meaningless. The inputs named in `fed`
    (weights fed by the caller) are not calibration inputs.
    """
    inputs = graph_inputs(session, calibration, "the calibration data", skip=fed)
    casts = {}
    for name, info in inputs.items():
        want, have = _ORT_FLOATS.get(info.type), calibration[name].dtype
        casts[name] = want if want is not None and have.kind == "f" and have != want else None
        _check_values(name, calibration[name], want)
    return casts, int(next(iter(calibration.values())).shape[0])


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[-1] if text else type(exc).__name__


def wanda_scores_for(weight: Any, role: Role, norms: InputNorms | np.ndarray, name: str) -> Any:
    """Wanda scores of one weight from its input norms, along its reduction axis.

    Parameters
    ----------
    weight : array
        The weight.
    role : Role
        Its role (the reduction axis, and the output axis for grouped convolutions).
    norms : InputNorms or ndarray
        Its input norms. For a convolution weight (3 or more axes), a vector of ``g``
        times the length of the reduction axis holds the norms of its ``g`` groups of input channels (as
        :func:`arrayprune.adapters.torch.input_norms` gives them); otherwise one group.
    name : str
        Its name, for messages.

    Returns
    -------
    array
        Scores shaped like `weight`.

    Raises
    ------
    ValueError
        If the weight's reduction axis is unknown or the norms do not fit it.
    """
    if role.reduction_axis is None:
        raise ValueError(f"{name!r}: its reduction axis is unknown ({role.why}), so its input norms cannot be placed")
    if not isinstance(norms, InputNorms):
        vector = np.asarray(norms, dtype=np.float64)
        per_unit = int(weight.shape[role.reduction_axis]) if 0 <= role.reduction_axis < len(weight.shape) else 0
        groups = 1
        convolution = len(weight.shape) >= 3
        if convolution and vector.ndim == 1 and 0 < per_unit < vector.shape[0] and vector.shape[0] % per_unit == 0:
            groups = vector.shape[0] // per_unit  # a grouped convolution: the norms of all its input channels
        norms = InputNorms(vector, groups)
    output_axis = role.output_axis if role.output_axis is not None else 0
    try:
        return arrayprune.wanda_scores(
            weight, norms.norms, role.reduction_axis, groups=norms.groups, output_axis=output_axis
        )
    except ValueError as exc:
        raise ValueError(f"{name!r}: {exc}") from None
