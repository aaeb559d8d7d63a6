"""The ONNX writer against the writer it replaced: the same bytes, on models nobody here wrote.

The writer serializes a model's skeleton around its initializers and writes their data
straight from the arrays (:mod:`arrayprune.adapters.formats.onnx_skeleton`). The
reference here is the writer before it, in a few lines: copy the whole model, replace
each initializer by ``numpy_helper.from_array`` of its new value (bfloat16: its bits as
raw data) keeping its doc string, serialize the whole model with protobuf; with external
data, move every raw data of 1024 bytes or more, in order and 64-byte aligned, to one
file named after the SHA-256 of its bytes.
"""

from __future__ import annotations

import hashlib
import io
import os
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import arrayprune
from arrayprune.adapters import formats as fmt
from arrayprune.adapters.cli import main
from arrayprune.adapters.formats import files as fmt_files
from arrayprune.adapters.formats import protowire
from arrayprune.adapters.provenance import as_text

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from arrayprune.adapters.formats import onnx as onnx_format  # noqa: E402
from arrayprune.adapters.formats.onnx import iter_initializers  # noqa: E402

ml_dtypes = pytest.importorskip("ml_dtypes")


# --------------------------------------------------------------------------------------
# The reference: the previous writer
# --------------------------------------------------------------------------------------


def reference_model(wf, params):
    """The model the previous writer serialized for `params` (see the module's notes)."""
    model = onnx.ModelProto()
    model.CopyFrom(wf.context["model"])
    values = {**wf.context["external"], **params}
    seen = set()
    for t in iter_initializers(model):
        first = t.name not in seen
        seen.add(t.name)
        if not first or t.name not in values:
            continue
        arr = np.asarray(values[t.name])
        if t.data_type == TensorProto.BFLOAT16:
            bits = arr if arr.dtype == np.uint16 else arr.astype(ml_dtypes.bfloat16).view(np.uint16)
            new = helper.make_tensor(t.name, TensorProto.BFLOAT16, arr.shape, bits.astype("<u2").tobytes(), raw=True)
        else:
            new = numpy_helper.from_array(arr, t.name)
        if t.doc_string:
            new.doc_string = t.doc_string
        t.CopyFrom(new)
    return model


def reference_external(model, base):
    """(model bytes, data file name, data bytes) of `model` written by the previous writer
    with external data; `model` (data inline) is changed."""
    blob = bytearray()
    moved = []
    for t in iter_initializers(model):
        if t.HasField("raw_data") and len(t.raw_data) >= 1024:
            blob += b"\0" * (-len(blob) % 64)
            moved.append((t, len(blob), len(t.raw_data)))
            blob += t.raw_data
    name = f"{base}.{hashlib.sha256(blob).hexdigest()[:16]}.data"
    for t, offset, length in moved:
        t.ClearField("raw_data")
        t.data_location = TensorProto.EXTERNAL
        del t.external_data[:]
        for key, value in (("location", name), ("offset", str(offset)), ("length", str(length))):
            t.external_data.add(key=key, value=value)
    return model.SerializeToString(), name, bytes(blob)


def _files(folder):
    return {p.name: p.read_bytes() for p in sorted(Path(folder).iterdir())}


def _new_values(wf, seed=0, integers=None):
    """New values for every initializer read: floats with their smaller half zeroed and the
    rest scaled; integers shifted by one and booleans flipped unless they are shapes and
    the like (`integers` False; default: only for the hand-made models)."""
    if integers is None:
        integers = wf.context["model"].producer_name in ("tests", "")
    rng = np.random.default_rng(seed)
    out = {}
    for name, a in wf.params.items():
        a = np.asarray(a)
        if a.dtype.kind == "f":
            keep = np.abs(a) >= np.median(np.abs(a)) if a.size else np.ones(a.shape, bool)
            out[name] = np.where(keep, a * a.dtype.type(rng.uniform(0.5, 2)), 0).astype(a.dtype)
        elif not integers:
            out[name] = a.copy()  # the same values, written anew
        elif a.dtype == np.bool_:
            out[name] = ~a
        else:
            out[name] = (a + 1).astype(a.dtype)
    return out


def _run(path, feeds):
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _same_outputs(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        x, y = np.asarray(x), np.asarray(y)
        assert x.dtype == y.dtype and x.shape == y.shape
        if x.dtype.kind in "fc":
            np.testing.assert_array_equal(x.reshape(-1).view(np.uint8), y.reshape(-1).view(np.uint8))  # bit for bit
        else:
            np.testing.assert_array_equal(x, y)


# --------------------------------------------------------------------------------------
# Models: two exporters and a hand-made one with every kind of initializer
# --------------------------------------------------------------------------------------


class _Net:
    """A conv, batch norm and linear layer (torch), with its input."""

    @staticmethod
    def make():
        torch = pytest.importorskip("torch")

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = torch.nn.Conv2d(3, 8, 3)
                self.bn = torch.nn.BatchNorm2d(8)
                self.fc = torch.nn.Linear(8 * 6 * 6, 10)

            def forward(self, x):
                return self.fc(torch.relu(self.bn(self.conv(x))).flatten(1))

        torch.manual_seed(0)
        net = Net().eval()
        return net, (torch.randn(1, 3, 8, 8),)


def torch_legacy(folder):
    torch = pytest.importorskip("torch")
    net, args = _Net.make()
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, args, f, dynamo=False, input_names=["x"])
    path = folder / "legacy.onnx"
    path.write_bytes(f.getvalue())
    return path, {"x": args[0].numpy()}


def torch_dynamo(folder):
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxscript")
    net, args = _Net.make()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = torch.onnx.export(net, args, dynamo=True, verbose=False).model_proto
    path = folder / "dynamo.onnx"
    onnx.save_model(model, str(path))
    (name,) = [i.name for i in model.graph.input]
    return path, {name: args[0].numpy()}


def sklearn_mlp(folder):
    from exports import digits_mlp

    _, path, x = digits_mlp(folder, max_iter=5)  # typed fields (float_data), int32 and int64 initializers
    return path, {"X": x[:3]}


K = 40  # the larger initializers: 40 x 40 float32, 6400 bytes


def zoo_model(with_int4=True):
    """Every kind of initializer, each fed to an output by Identity: float32/16/64 (one in
    float_data), bfloat16, integers, bool, a 0-d scalar, an empty tensor, strings, doc
    strings; a sparse initializer (unused: no operator takes one); an ``If`` whose branches hold initializers (one
    named as a main one: another scope's); a local function; metadata everywhere. With
    `with_int4`, an unused int4 initializer (a type that is not read: left as it is)."""
    rng = np.random.default_rng(7)
    f32 = rng.standard_normal((K, K)).astype(np.float32)
    bf16_bits = rng.standard_normal((K, 8)).astype(ml_dtypes.bfloat16).view(np.uint16)
    inits = [
        numpy_helper.from_array(f32, "w"),
        helper.make_tensor("typed", TensorProto.FLOAT, (K, 4), rng.standard_normal(K * 4).astype(np.float32)),
        numpy_helper.from_array(rng.standard_normal((K, 3)).astype(np.float16), "half"),
        numpy_helper.from_array(rng.standard_normal(5), "f64"),
        helper.make_tensor("bf", TensorProto.BFLOAT16, bf16_bits.shape, bf16_bits.tobytes(), raw=True),
        numpy_helper.from_array(rng.integers(-9, 9, (K, 7)).astype(np.int64), "i64"),
        numpy_helper.from_array(rng.integers(-9, 9, 6).astype(np.int8), "i8"),
        numpy_helper.from_array(rng.integers(0, 2, (3, 3)).astype(bool), "mask"),
        numpy_helper.from_array(np.array(1.5, np.float32), "scalar"),
        numpy_helper.from_array(np.zeros((0, 3), np.float32), "empty"),
        numpy_helper.from_array(np.array([b"a", b"bc"], dtype=object), "names"),
        numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "s"),
    ]
    inits[0].doc_string = "the main weight"
    inits[1].doc_string = "stored as float_data"
    if with_int4:
        inits.append(helper.make_tensor("nibbles", TensorProto.INT4, (64, 64), rng.integers(-8, 8, 64 * 64)))
    outputs = [i.name for i in inits if i.name != "nibbles"]
    nodes = [  # bfloat16 cast to float32: onnxruntime returns no bfloat16 arrays
        helper.make_node("Cast", [n], [f"{n}_out"], to=TensorProto.FLOAT)
        if n == "bf"
        else helper.make_node("Identity", [n], [f"{n}_out"])
        for n in outputs
    ]

    def branch(name, w):
        return helper.make_graph(
            [helper.make_node("Identity", [w.name], [f"{name}_y"]), helper.make_node("Identity", ["s"], [f"{name}_s"])],
            name,
            [],
            [
                helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, [K, K]),
                helper.make_tensor_value_info(f"{name}_s", TensorProto.FLOAT, [4]),
            ],
            initializer=[w, numpy_helper.from_array(np.full(4, 9, np.float32), "s")],  # "s": another scope's
        )

    then_w = numpy_helper.from_array(rng.standard_normal((K, K)).astype(np.float32), "wt")
    else_w = numpy_helper.from_array(rng.standard_normal((K, K)).astype(np.float32), "we")
    nodes.append(
        helper.make_node(
            "If", ["cond"], ["if_y", "if_s"], then_branch=branch("then", then_w), else_branch=branch("else", else_w)
        )
    )
    nodes.append(helper.make_node("Twice", ["x"], ["twice"], domain="local"))
    sparse = helper.make_sparse_tensor(
        numpy_helper.from_array(np.array([1.0, 2.0], np.float32), "sp"),
        numpy_helper.from_array(np.array([1, 5], np.int64), "sp_idx"),
        [2, 3],
    )
    types = {t.name: (t.data_type, list(t.dims)) for t in inits}
    types["bf"] = (TensorProto.FLOAT, types["bf"][1])
    graph = helper.make_graph(
        nodes,
        "zoo",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info(f"{n}_out", *types[n]) for n in outputs]
        + [
            helper.make_tensor_value_info("if_y", TensorProto.FLOAT, [K, K]),
            helper.make_tensor_value_info("if_s", TensorProto.FLOAT, [4]),
            helper.make_tensor_value_info("twice", TensorProto.FLOAT, [2]),
        ],
        initializer=inits,
        sparse_initializer=[sparse],
        doc_string="a graph of every kind of initializer",
    )
    twice = helper.make_function(
        "local", "Twice", ["X"], ["Y"], [helper.make_node("Add", ["X", "X"], ["Y"])], [helper.make_opsetid("", 17)]
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)],
        functions=[twice],
        producer_name="tests",
        doc_string="every kind of initializer",
    )
    model.ir_version = 10
    helper.set_model_props(model, {"made": "by hand"})
    return model


def zoo(folder):
    path = folder / "zoo.onnx"
    onnx.save_model(zoo_model(), str(path))
    return path, {"x": np.array([1.0, -2.5], np.float32), "cond": np.array(True)}


MODELS = {"torch-legacy": torch_legacy, "torch-dynamo": torch_dynamo, "sklearn-mlp": sklearn_mlp, "zoo": zoo}


def _as_external(path):
    """The model at `path` saved again by onnx with every tensor's data in one external
    file (beside it, in a folder of its own); the int4 tensor is left out (not read), and
    the main graph's typed-field tensors (which onnx leaves inline) get raw data first."""
    model = onnx.load(str(path))
    kept = [
        t
        if t.HasField("raw_data") or t.data_type == TensorProto.STRING
        else numpy_helper.from_array(numpy_helper.to_array(t), t.name)
        for t in model.graph.initializer
        if t.data_type != TensorProto.INT4
    ]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    folder = path.parent / "external"
    folder.mkdir()
    out = folder / path.name
    onnx.save_model(model, str(out), save_as_external_data=True, location=path.stem + ".bin", size_threshold=0)
    return out


# --------------------------------------------------------------------------------------
# Inline: the bytes of the whole model serialized
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("make", MODELS.values(), ids=MODELS.keys())
def test_inline_model_has_the_previous_writers_bytes(tmp_path, make):
    src, feeds = make(tmp_path)
    wf = fmt.load(src)
    params = _new_values(wf)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "out.onnx"
    fmt.save(out, params, like=wf)

    expected = reference_model(wf, params)
    written = out.read_bytes()
    assert written == expected.SerializeToString()
    assert onnx.load(str(out)) == expected
    assert _files(out_dir) == {"out.onnx": written}, "no external data, no temporary file"
    onnx.checker.check_model(onnx.load(str(out)), full_check=True)
    ref = tmp_path / "ref.onnx"
    ref.write_bytes(expected.SerializeToString())
    _same_outputs(_run(out, feeds), _run(ref, feeds))
    np.testing.assert_array_equal(fmt.load(out).params[next(iter(params))], next(iter(params.values())))

    fmt.save(out, params, like=wf)  # again: the same bytes
    assert out.read_bytes() == written


def test_zoo_new_values_reach_every_kind_of_initializer(tmp_path):
    """The values the writer put in are the ones onnxruntime computes with (the zoo's
    outputs are its initializers), subgraphs included; another scope's "s" is left."""
    src, feeds = zoo(tmp_path)
    wf = fmt.load(src)
    assert "nibbles" not in wf.params
    params = _new_values(wf)
    out = tmp_path / "out.onnx"
    fmt.save(out, params, like=wf)
    outs = dict(zip([o.name for o in onnx.load(str(out)).graph.output], _run(out, feeds), strict=True))
    for name in ("w", "typed", "half", "f64", "i64", "i8", "mask", "scalar", "empty"):
        np.testing.assert_array_equal(outs[f"{name}_out"], params[name])
    np.testing.assert_array_equal(outs["bf_out"], params["bf"].astype(ml_dtypes.bfloat16).astype(np.float32))
    np.testing.assert_array_equal(outs["if_y"], params["wt"])
    np.testing.assert_array_equal(outs["if_s"], np.full(4, 9, np.float32))
    np.testing.assert_array_equal(outs["s_out"], params["s"])
    np.testing.assert_array_equal(outs["names_out"], np.array(["a", "bc"], dtype=object))
    np.testing.assert_array_equal(outs["twice"], 2 * feeds["x"])
    sparse = onnx.load(str(out)).graph.sparse_initializer
    assert sparse == wf.context["model"].graph.sparse_initializer and len(sparse) == 1
    typed = [t for t in onnx.load(str(out)).graph.initializer if t.name == "typed"][0]
    assert typed.HasField("raw_data") and not typed.float_data, "rewritten as from_array writes it"
    nibbles = [t for t in onnx.load(str(out)).graph.initializer if t.name == "nibbles"][0]
    assert nibbles == [t for t in wf.context["model"].graph.initializer if t.name == "nibbles"][0]


def test_some_initializers_given_the_others_left_as_they_are(tmp_path):
    src, feeds = zoo(tmp_path)
    wf = fmt.load(src)
    params = {k: v for k, v in _new_values(wf).items() if k in ("w", "i8", "we", "bf")}
    out = tmp_path / "out.onnx"
    fmt.save(out, params, like=wf)
    assert out.read_bytes() == reference_model(wf, params).SerializeToString()


def test_command_line_prune_writes_the_previous_writers_bytes(tmp_path, capsys):
    src, _ = torch_legacy(tmp_path)
    out = tmp_path / "out.onnx"
    assert main(["prune", str(src), "-o", str(out), "--amount", "0.5"]) == 0
    capsys.readouterr()
    wf, written = fmt.load(src), fmt.load(out)
    assert any(np.count_nonzero(np.asarray(v) == 0) for v in written.params.values()), "something was pruned"
    reference = reference_model(wf, dict(written.params))
    entry = reference.metadata_props.add()  # the provenance record, last
    entry.key, entry.value = "arrayprune", as_text({"amount": "0.5", "method": "l1_unstructured",
                                                    "version": arrayprune.__version__})
    assert out.read_bytes() == reference.SerializeToString()


def test_the_loaded_model_is_left_as_it_was(tmp_path, monkeypatch):
    src, _ = zoo(tmp_path)
    wf = fmt.load(src)
    before = wf.context["model"].SerializeToString()
    fmt.save(tmp_path / "out.onnx", _new_values(wf), like=wf)
    monkeypatch.setattr(onnx_format, "_PROTOBUF_LIMIT", 1000)  # with external data, too
    fmt.save(tmp_path / "ext.onnx", _new_values(wf), like=wf)
    assert wf.context["model"].SerializeToString() == before


def test_data_is_written_from_the_arrays_memory(tmp_path, monkeypatch):
    """Each float array's bytes go to the file from the array itself (a view, no copy)."""
    src, _ = torch_legacy(tmp_path)
    wf = fmt.load(src)
    params = _new_values(wf)
    written = []
    real = onnx_format.write_buffers

    def recording(f, buffers):
        written.extend(buffers)
        return real(f, buffers)

    monkeypatch.setattr(onnx_format, "write_buffers", recording)
    fmt.save(tmp_path / "out.onnx", params, like=wf)
    views = [np.frombuffer(b, np.uint8) for b in written if isinstance(b, memoryview)]
    assert len(views) == len(params)
    for arr in params.values():
        assert any(np.shares_memory(v, arr) and v.nbytes == arr.nbytes for v in views)
    assert max(len(b) for b in written if isinstance(b, bytes)) < 4096, "only the skeleton goes through protobuf"


# --------------------------------------------------------------------------------------
# External data
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("make", MODELS.values(), ids=MODELS.keys())
def test_external_data_has_the_previous_writers_bytes(tmp_path, make):
    src, feeds = make(tmp_path)
    ext = _as_external(src)
    wf = fmt.load(ext)
    assert wf.context["external"], "read from external data"
    params = _new_values(wf)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "out.onnx"
    fmt.save(out, params, like=wf)

    model_bytes, name, data = reference_external(reference_model(wf, params), "out.onnx")
    assert _files(out_dir) == {"out.onnx": model_bytes, name: data}
    onnx.checker.check_model(str(out), full_check=True)
    ref = tmp_path / "ref.onnx"
    ref.write_bytes(reference_model(wf, params).SerializeToString())
    _same_outputs(_run(out, feeds), _run(ref, feeds))

    fmt.save(out, params, like=wf)  # over itself: the same files
    assert _files(out_dir) == {"out.onnx": model_bytes, name: data}


def test_external_data_is_written_from_the_arrays_memory(tmp_path, monkeypatch):
    src, _ = torch_legacy(tmp_path)
    wf = fmt.load(_as_external(src))
    params = _new_values(wf)
    written = []
    real = fmt_files.atomic_write_named

    class Recorder:
        def __init__(self, f):
            self.f = f

        def write(self, b):
            written.append(b)
            return self.f.write(b)

        def __getattr__(self, name):  # flush, tell, fileno
            return getattr(self.f, name)

    monkeypatch.setattr(fmt_files, "atomic_write_named", lambda d, p, write: real(d, p, lambda f: write(Recorder(f))))
    fmt.save(tmp_path / "out.onnx", params, like=wf)
    large = {k: v for k, v in params.items() if v.nbytes >= 1024}
    views = [np.frombuffer(b, np.uint8) for b in written if isinstance(b, memoryview)]
    assert large and len(views) == len(large)
    for arr in large.values():
        assert any(np.shares_memory(v, arr) and v.nbytes == arr.nbytes for v in views)


# --------------------------------------------------------------------------------------
# The 2 GiB protobuf limit: over it, external data
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["data alone over", "data under, model over", "model at the limit"])
def test_protobuf_limit(tmp_path, monkeypatch, where):
    """Over the limit (made small here), the model is written with external data, as the
    previous writer wrote it; at the limit exactly, inline. The zoo has subgraph
    initializers: filled for an inline attempt, they must not stay so."""
    src, feeds = zoo(tmp_path)
    wf = fmt.load(src)
    params = _new_values(wf)
    inline = reference_model(wf, params).SerializeToString()
    limit = {"data alone over": 1000, "data under, model over": len(inline) - 1, "model at the limit": len(inline)}
    monkeypatch.setattr(onnx_format, "_PROTOBUF_LIMIT", limit[where])
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "out.onnx"
    fmt.save(out, params, like=wf)
    if where == "model at the limit":
        assert _files(out_dir) == {"out.onnx": inline}
        return
    model_bytes, name, data = reference_external(reference_model(wf, params), "out.onnx")
    assert _files(out_dir) == {"out.onnx": model_bytes, name: data}
    assert len(data) > 4 * K * K * 3, "w, wt and we at least"
    ref = tmp_path / "ref.onnx"
    ref.write_bytes(inline)
    _same_outputs(_run(out, feeds), _run(ref, feeds))


# --------------------------------------------------------------------------------------
# Fields the ONNX schema does not know: kept (a whole copy, then a second graph record)
# --------------------------------------------------------------------------------------


def _with_unknown_fields(model):
    """`model` with an unknown field (number 1000, a varint 7) in the model and in its graph."""
    extra = protowire.varint(1000 << 3) + protowire.varint(7)
    graph = onnx.GraphProto()
    graph.ParseFromString(model.graph.SerializeToString() + extra)
    out = onnx.ModelProto()
    out.ParseFromString(model.SerializeToString() + extra)
    out.graph.CopyFrom(graph)
    assert protowire.has_unknown_fields(out) and protowire.has_unknown_fields(out.graph)
    return out


@pytest.mark.parametrize("external", [False, True], ids=["inline", "external"])
def test_unknown_fields_are_kept(tmp_path, external):
    src, feeds = zoo(tmp_path)
    onnx.save_model(_with_unknown_fields(onnx.load(str(src))), str(src))
    if external:
        src = _as_external(src)
    wf = fmt.load(src)
    params = _new_values(wf)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "out.onnx"
    fmt.save(out, params, like=wf)

    expected = reference_model(wf, params)
    if external:
        model_bytes, name, data = reference_external(expected, "out.onnx")
        assert _files(out_dir)[name] == data
        expected = onnx.load_model_from_string(model_bytes)
    written = onnx.load_model(str(out), load_external_data=False)
    assert written == expected
    assert written.SerializeToString() == expected.SerializeToString()  # the unknown fields included
    assert protowire.has_unknown_fields(written) and protowire.has_unknown_fields(written.graph)
    onnx.checker.check_model(str(out), full_check=True)
    ref = tmp_path / "ref.onnx"
    ref.write_bytes(reference_model(wf, params).SerializeToString())
    _same_outputs(_run(out, feeds), _run(ref, feeds))


# --------------------------------------------------------------------------------------
# Random models (hypothesis)
# --------------------------------------------------------------------------------------

_DTYPES = ["float32", "float16", "float64", "bfloat16", "int64", "int32", "int8", "uint8", "bool"]


@st.composite
def _models(draw):
    """(model, names given new values): random initializers, some typed-field, some with
    doc strings, optionally some inside an If branch."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    count = draw(st.integers(0, 6))
    inits = []
    for i in range(count):
        dtype = draw(st.sampled_from(_DTYPES))
        shape = tuple(draw(st.lists(st.integers(0, 40), max_size=3)))
        if dtype == "bfloat16":
            bits = rng.standard_normal(shape).astype(ml_dtypes.bfloat16).view(np.uint16)
            t = helper.make_tensor(f"t{i}", TensorProto.BFLOAT16, shape, bits.tobytes(), raw=True)
        else:
            values = (rng.standard_normal(shape) * 50).astype(dtype)
            if draw(st.booleans()) and dtype not in ("bool",):  # typed fields instead of raw data
                code = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
                t = helper.make_tensor(f"t{i}", code, shape, values.ravel().tolist())
            else:
                t = numpy_helper.from_array(values, f"t{i}")
        if draw(st.booleans()):
            t.doc_string = draw(st.text(max_size=8))
        inits.append(t)
    split = draw(st.integers(0, count))
    main, inner = inits[:split], inits[split:]
    nodes = []
    if inner:
        body = helper.make_graph([], "then", [], [], initializer=inner)
        empty = helper.make_graph([], "else", [], [])
        nodes.append(helper.make_node("If", ["cond"], [], then_branch=body, else_branch=empty))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("cond", TensorProto.BOOL, [])], [], main)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    given_names = draw(st.sets(st.sampled_from([t.name for t in inits]))) if inits else set()
    return model, given_names


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=_models(), external=st.booleans())
def test_random_models_have_the_previous_writers_bytes(case, external):
    model, given_names = case
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        src = folder / "src" / "m.onnx"
        src.parent.mkdir()
        if external:
            onnx.save_model(model, str(src), save_as_external_data=True, location="m.bin", size_threshold=0)
        else:
            onnx.save_model(model, str(src))
        wf = fmt.load(src)
        params = {k: v for k, v in _new_values(wf).items() if k in given_names}
        out = folder / "out" / "m.onnx"
        out.parent.mkdir()
        fmt.save(out, params, like=wf)
        expected = reference_model(wf, params)
        if wf.context["external"]:
            model_bytes, name, data = reference_external(expected, "m.onnx")
            assert _files(out.parent) == {"m.onnx": model_bytes, name: data}
        else:
            assert _files(out.parent) == {"m.onnx": expected.SerializeToString()}


# --------------------------------------------------------------------------------------
# protowire: checked against protobuf's own encoder
# --------------------------------------------------------------------------------------


@given(st.integers(0, 2**63 - 1))
def test_varint_is_protobufs(n):
    # dims is "repeated int64 dims = 1" (proto2, not packed): key 0x08, then the varint
    assert b"\x08" + protowire.varint(n) == TensorProto(dims=[n]).SerializeToString()


def test_varint_refuses_negative_numbers():
    with pytest.raises(ValueError, match="negative"):
        protowire.varint(-1)


@given(st.binary(max_size=300), st.binary(max_size=300))
def test_field_header_is_protobufs(key, value):
    # StringStringEntryProto: key = 1, value = 2, both length-delimited
    entry = onnx.StringStringEntryProto(key=key.decode("latin-1"), value=value.decode("latin-1"))
    k, v = entry.key.encode(), entry.value.encode()
    assert protowire.field_header(1, len(k)) + k + protowire.field_header(2, len(v)) + v == entry.SerializeToString()


def test_split_and_without_copy_the_other_fields_only():
    model = zoo_model()
    below, above = protowire.split(model, 7)
    assert not below.HasField("graph") and not above.HasField("graph")
    assert [f.number for f, _ in below.ListFields()] == [1, 2, 6]
    assert [f.number for f, _ in above.ListFields()] == [8, 14, 25]
    graph = model.SerializeToString()[len(below.SerializeToString()) :][: -len(above.SerializeToString())]
    assert below.SerializeToString() + graph + above.SerializeToString() == model.SerializeToString()
    tensor = model.graph.initializer[0]
    bare = protowire.without(tensor, 9)
    assert not bare.HasField("raw_data") and bare.doc_string == "the main weight" and bare.name == "w"
    bare.raw_data = tensor.raw_data
    assert bare == tensor


def test_without_keeps_unknown_fields():
    tensor = TensorProto()
    tensor.ParseFromString(
        numpy_helper.from_array(np.ones(3, np.float32), "t").SerializeToString() + protowire.varint(999 << 3) + b"\x05"
    )
    bare = protowire.without(tensor, 9)
    assert not bare.HasField("raw_data") and protowire.has_unknown_fields(bare)
    assert not protowire.has_unknown_fields(numpy_helper.from_array(np.ones(3, np.float32), "t"))


# --------------------------------------------------------------------------------------
# atomic_write_named
# --------------------------------------------------------------------------------------


def test_atomic_write_named_names_the_file_after_writing(tmp_path):
    def write(f):
        f.write(b"abc")
        return "abc.data"

    path = fmt_files.atomic_write_named(tmp_path, "x", write)
    assert path == os.path.join(tmp_path, "abc.data")
    assert _files(tmp_path) == {"abc.data": b"abc"}
    fmt_files.atomic_write_named(tmp_path, "x", lambda f: f.write(b"new") and "abc.data")  # replaced
    assert _files(tmp_path) == {"abc.data": b"new"}


@pytest.mark.parametrize("name", ["", "a/b", "..", "."])
def test_atomic_write_named_refuses_a_path_and_leaves_nothing(tmp_path, name):
    with pytest.raises(ValueError, match="not a plain file name"):
        fmt_files.atomic_write_named(tmp_path, "x", lambda f: f.write(b"abc") and name)
    assert _files(tmp_path) == {}


def test_atomic_write_named_failure_leaves_nothing(tmp_path):
    def write(f):
        f.write(b"abc")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        fmt_files.atomic_write_named(tmp_path, "x", write)
    assert _files(tmp_path) == {}
    with pytest.raises(fmt.FormatError, match="does not exist"):
        fmt_files.atomic_write_named(tmp_path / "missing", "x", write)


def test_write_out_writes_slices_and_starts_their_writeback(tmp_path, monkeypatch):
    started = []
    monkeypatch.setattr(fmt_files, "_WRITEBACK_SLICE", 1000)
    monkeypatch.setattr(fmt_files, "_WRITEBACK_MIN", 100)
    monkeypatch.setattr(fmt_files, "_start_writeback", lambda fd, offset, length: started.append((offset, length)))
    data = np.arange(2600, dtype=np.uint8)
    with open(tmp_path / "f", "wb") as f:
        fmt_files.write_out(f, b"head")  # small: buffered, no writeback
        fmt_files.write_out(f, data)
        fmt_files.write_out(f, memoryview(np.arange(30, dtype=np.float32).reshape(5, 6)))  # 120 bytes, 2-D
    assert (tmp_path / "f").read_bytes() == b"head" + data.tobytes() + np.arange(30, dtype=np.float32).tobytes()
    assert started == [(4, 1000), (1004, 1000), (2004, 600), (2604, 120)]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sync_file_range is Linux's")
def test_writeback_is_started_with_sync_file_range_on_linux(tmp_path):
    with open(tmp_path / "f", "wb") as f:
        f.write(b"x" * 8192)
        f.flush()
        fmt_files._start_writeback(f.fileno(), 0, 8192)  # no error, no wait
    assert fmt_files._sync_file_range_fn and fmt_files._sync_file_range_fn[0] is not None
