"""Tests of arrayprune.adapters.formats: reading and writing weight files."""

from __future__ import annotations

import os
import zipfile
from collections import OrderedDict

import numpy as np
import pytest

from arrayprune.adapters import formats as fmt
from arrayprune.adapters import mapping as mp

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

EXAMPLE = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "examples", "mlp.onnx")


def _rand(shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _arrays():
    return {
        "fc1.weight": _rand((16, 8), 1),
        "fc1.bias": _rand((16,), 2),
        "emb": _rand((5, 3), 3, np.float64),
        "half": _rand((4, 4), 4, np.float16),
        "steps": np.arange(6, dtype=np.int64).reshape(2, 3),
    }


def _small_onnx():
    """x(1x8) -> MatMul(w1 8x16) -> Add(b1) -> Relu -> MatMul(w2 16x4) -> Reshape(shape)."""
    inits = [
        numpy_helper.from_array(_rand((8, 16), 5), "w1"),
        numpy_helper.from_array(_rand((16,), 6), "b1"),
        numpy_helper.from_array(_rand((16, 4), 7), "w2"),
        numpy_helper.from_array(np.array([-1, 2, 2], dtype=np.int64), "shape"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h0"]),
        helper.make_node("Add", ["h0", "b1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["h2"]),
        helper.make_node("MatMul", ["h2", "w2"], ["h3"]),
        helper.make_node("Reshape", ["h3", "shape"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "small",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _save_external(model, path, location="weights.bin"):
    onnx.save_model(
        model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=location, size_threshold=0
    )


def _run(path, x):
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x})[0]


# --------------------------------------------------------------------------------------
# round trips
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("compressed", [False, True])
def test_npz_round_trip(tmp_path, compressed):
    src = tmp_path / "w.npz"
    (np.savez_compressed if compressed else np.savez)(src, **_arrays())
    wf = fmt.load(src)
    assert wf.format == "npz" and list(wf.params) == list(_arrays())
    for k, v in _arrays().items():
        assert wf.params[k].dtype == v.dtype
        np.testing.assert_array_equal(wf.params[k], v)
    pruned = mp.l1_unstructured(wf.params, "fc1.weight", 0.5)
    dst = tmp_path / "out.npz"
    fmt.save(dst, pruned, like=wf)
    with zipfile.ZipFile(dst) as zf:
        kinds = {i.compress_type for i in zf.infolist()}
    assert kinds == {zipfile.ZIP_DEFLATED if compressed else zipfile.ZIP_STORED}
    back = fmt.load(dst)
    assert list(back.params) == list(pruned)
    np.testing.assert_array_equal(back.params["fc1.weight_mask"], pruned["fc1.weight_mask"])
    assert int((back.params["fc1.weight_mask"] == 0).sum()) == 64
    # keys that np.savez cannot take as keyword arguments
    odd = {"file": np.ones(2), "allow_pickle": np.zeros(3), "a/b": np.ones((1, 1))}
    fmt.save(tmp_path / "odd.npz", odd)
    got = np.load(tmp_path / "odd.npz")
    assert sorted(got.files) == sorted(odd)


def test_npz_with_objects_is_refused(tmp_path):
    path = tmp_path / "obj.npz"
    np.savez(path, ok=np.ones(2), bad=np.array([{"x": 1}], dtype=object))
    with pytest.raises(fmt.FormatError, match="Python objects"):
        fmt.load(path)


def test_safetensors_round_trip_is_lazy_and_keeps_metadata(tmp_path):
    from safetensors.numpy import save_file

    src = tmp_path / "w.safetensors"
    save_file(_arrays(), str(src), metadata={"format": "np", "author": "test"})
    wf = fmt.load(src)
    assert wf.format == "safetensors" and not isinstance(wf.params, dict), "tensors are read on access"
    assert set(wf.params) == set(_arrays())
    for k, v in _arrays().items():
        np.testing.assert_array_equal(wf.params[k], v)
        assert wf.params[k].dtype == v.dtype
    out = mp.apply_masks(mp.ln_structured(wf.params, "fc1.weight", 0.25, n=2, dim=0))
    dst = tmp_path / "o.safetensors"
    fmt.save(dst, out, like=wf)
    back = fmt.load(dst)
    assert back.context["metadata"] == {"format": "np", "author": "test"}
    assert int((np.asarray(back.params["fc1.weight"]).sum(axis=1) == 0).sum()) == 4
    np.testing.assert_array_equal(back.params["emb"], _arrays()["emb"])


def test_safetensors_tensors_are_read_only_views_of_the_mapped_file(tmp_path):
    from safetensors.numpy import save_file

    arrays = {
        "w": np.arange(12, dtype=np.float32).reshape(3, 4),
        "empty": np.zeros((0, 4), np.float64),
        "scalar": np.array(-3, np.int64),
        "flags": np.array([True, False, True]),
        "half": np.linspace(-1, 1, 7, dtype=np.float16),
    }
    src = tmp_path / "v.safetensors"
    save_file(arrays, str(src))
    before = src.read_bytes()
    wf = fmt.load(src)
    for k, v in arrays.items():
        got = wf.params[k]
        assert type(got) is np.ndarray and got.dtype == v.dtype and got.shape == v.shape
        np.testing.assert_array_equal(got, v)
        assert not got.flags.writeable
    assert np.shares_memory(wf.params["w"], wf.params["w"]), "no copy per access"
    with pytest.raises(ValueError):
        wf.params["w"][0, 0] = 1.0
    pruned = mp.apply_masks(mp.l1_unstructured(wf.params, "w", 0.5))
    assert int((pruned["w"] == 0).sum()) == 6
    assert src.read_bytes() == before


def test_safetensors_bfloat16_goes_through_torch(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    src = tmp_path / "bf.safetensors"
    w = torch.randn(8, 4, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    save_file({"w": w, "b": torch.zeros(4)}, str(src))
    wf = fmt.load(src)
    assert isinstance(wf.params["w"], torch.Tensor) and wf.params["w"].dtype == torch.bfloat16
    out = mp.apply_masks(mp.l1_unstructured(wf.params, "w", 0.5))
    assert out["w"].dtype == torch.bfloat16
    fmt.save(tmp_path / "o.safetensors", out, like=wf)
    back = fmt.load(tmp_path / "o.safetensors")
    assert int((back.params["w"] == 0).sum()) == 16


def test_torch_round_trip_nested_checkpoint(tmp_path):
    torch = pytest.importorskip("torch")
    net = torch.nn.Linear(6, 4)
    sd = net.state_dict()
    ckpt = {"state_dict": sd, "epoch": 3, "name": "net"}
    src = tmp_path / "ckpt.pt"
    torch.save(ckpt, src)
    wf = fmt.load(src)
    assert wf.format == "torch" and wf.params["epoch"] == 3
    out = mp.l1_unstructured(wf.params, "state_dict/weight", 0.5)
    assert list(out["state_dict"]) == ["weight_orig", "weight_mask", "bias"]
    fmt.save(tmp_path / "o.pt", out, like=wf)
    back = torch.load(tmp_path / "o.pt", weights_only=True)
    assert back["epoch"] == 3 and back["name"] == "net"
    assert back["state_dict"]["weight_mask"].dtype == torch.float32
    assert int((back["state_dict"]["weight_mask"] == 0).sum()) == 12
    assert hasattr(back["state_dict"], "_metadata")
    import torch.nn.utils.prune as tprune

    fresh = torch.nn.Linear(6, 4)
    tprune.identity(fresh, "weight")
    fresh.load_state_dict(back["state_dict"])
    torch.testing.assert_close(fresh.weight_orig, sd["weight"], rtol=0, atol=0)


def test_cross_format_conversion(tmp_path):
    torch = pytest.importorskip("torch")
    sd = {"a.weight": torch.randn(3, 4), "a.bias": torch.randn(3)}
    torch.save(sd, tmp_path / "m.pth")
    wf = fmt.load(tmp_path / "m.pth")
    fmt.save(tmp_path / "m.npz", wf.params)
    fmt.save(tmp_path / "m.safetensors", wf.params)
    for name in ("m.npz", "m.safetensors"):
        back = fmt.load(tmp_path / name)
        np.testing.assert_array_equal(np.asarray(back.params["a.weight"]), sd["a.weight"].numpy())
    np_wf = fmt.load(tmp_path / "m.npz")
    fmt.save(tmp_path / "back.pt", np_wf.params)
    again = torch.load(tmp_path / "back.pt", weights_only=True)
    torch.testing.assert_close(again["a.bias"], sd["a.bias"], rtol=0, atol=0)
    with pytest.raises(fmt.FormatError, match="only be written from an ONNX model"):
        fmt.save(tmp_path / "x.onnx", np_wf.params)
    with pytest.raises(fmt.FormatError, match="cannot store 'epoch'"):
        fmt.save(tmp_path / "x.npz", {"w": np.ones(2), "epoch": 3})


def test_onnx_round_trip_changes_only_float_initializers(tmp_path):
    wf = fmt.load(EXAMPLE)
    assert wf.format == "onnx"
    assert list(wf.params) == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias"]
    assert wf.params["fc1.weight"].shape == (256, 64) and wf.params["fc1.weight"].dtype == np.float32
    out = mp.apply_masks(mp.l1_unstructured(wf.params, "fc2.weight", 0.75))
    dst = tmp_path / "p.onnx"
    fmt.save(dst, out, like=wf)
    back = fmt.load(dst)
    assert int((back.params["fc2.weight"] == 0).sum()) == round(0.75 * 65536)
    np.testing.assert_array_equal(back.params["fc1.weight"], wf.params["fc1.weight"])
    a, b = onnx.load(EXAMPLE), onnx.load(str(dst))
    assert [n.SerializeToString() for n in a.graph.node] == [n.SerializeToString() for n in b.graph.node]
    assert a.opset_import == b.opset_import and a.graph.input == b.graph.input
    onnx.checker.check_model(b)
    x = _rand((3, 64), 9)
    y = _run(dst, x)
    h = np.maximum(x @ out["fc1.weight"].T + out["fc1.bias"], 0)
    h = np.maximum(h @ out["fc2.weight"].T + out["fc2.bias"], 0)
    np.testing.assert_allclose(y, h @ out["fc3.weight"].T + out["fc3.bias"], rtol=1e-5, atol=1e-5)
    with pytest.raises(fmt.FormatError, match="not an initializer"):
        fmt.save(tmp_path / "q.onnx", mp.l1_unstructured(wf.params, "fc2.weight", 0.5), like=wf)


def test_onnx_external_data_round_trip(tmp_path):
    model = _small_onnx()
    src_dir = tmp_path / "src"
    src_dir.mkdir()
    _save_external(model, src_dir / "m.onnx")
    wf = fmt.load(src_dir / "m.onnx")
    assert set(wf.params) == {"w1", "b1", "w2", "shape"}, "integer initializers are read too"
    np.testing.assert_array_equal(wf.params["shape"], np.array([-1, 2, 2], np.int64))
    np.testing.assert_array_equal(wf.params["w1"], _rand((8, 16), 5))
    out = mp.apply_masks(mp.l1_unstructured(wf.params, "w1", 0.5))
    dst = tmp_path / "dst" / "pruned.onnx"
    dst.parent.mkdir()
    fmt.save(dst, out, like=wf)
    assert len(list(dst.parent.glob("pruned.onnx.*.data"))) == 1, "external data stays external, beside the output"
    back = fmt.load(dst)
    assert int((back.params["w1"] == 0).sum()) == 64
    np.testing.assert_array_equal(back.params["w2"], _rand((16, 4), 7))
    x = _rand((2, 8), 1)
    expected = (np.maximum(x @ out["w1"] + out["b1"], 0) @ out["w2"]).reshape(-1, 2, 2)
    np.testing.assert_allclose(_run(dst, x), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("where", ["parent", "absolute", "symlink", "missing"])
def test_onnx_external_data_must_stay_in_the_models_folder(tmp_path, where):
    model = _small_onnx()
    folder = tmp_path / "model"
    folder.mkdir()
    _save_external(model, folder / "m.onnx")
    data = (folder / "weights.bin").read_bytes()
    secret = tmp_path / "secret.bin"
    secret.write_bytes(data)  # readable, valid data: only the path is wrong
    if where == "parent":
        location, problem = "../secret.bin", "outside"
    elif where == "absolute":
        location, problem = str(secret), "absolute"
    elif where == "symlink":
        os.symlink(secret, folder / "link.bin")
        location, problem = "link.bin", "outside"
    else:
        location, problem = "nowhere.bin", "not found"
    proto = onnx.load_model(str(folder / "m.onnx"), load_external_data=False)
    for t in proto.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = location
    path = folder / "evil.onnx"
    path.write_bytes(proto.SerializeToString())
    with pytest.raises(fmt.FormatError, match=problem) as info:
        fmt.load(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_onnx_truncated_external_data(tmp_path):
    _save_external(_small_onnx(), tmp_path / "m.onnx")
    blob = tmp_path / "weights.bin"
    blob.write_bytes(blob.read_bytes()[:100])
    with pytest.raises(fmt.FormatError, match="too short"):
        fmt.load(tmp_path / "m.onnx")


# --------------------------------------------------------------------------------------
# recognising formats, damaged files
# --------------------------------------------------------------------------------------


def _write_all_formats(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.numpy import save_file

    arrays = {"w": _rand((4, 4), 0)}
    np.savez(tmp_path / "a.npz", **arrays)
    save_file(arrays, str(tmp_path / "a.safetensors"))
    torch.save({"w": torch.from_numpy(arrays["w"])}, tmp_path / "a.pt")
    torch.save({"w": torch.from_numpy(arrays["w"])}, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    onnx.save_model(_small_onnx(), str(tmp_path / "a.onnx"))
    return {"a.npz": "npz", "a.safetensors": "safetensors", "a.pt": "torch", "legacy.pt": "torch", "a.onnx": "onnx"}


def test_format_is_recognised_from_content(tmp_path):
    expected = _write_all_formats(tmp_path)
    for name, kind in expected.items():
        assert fmt.detect_format(tmp_path / name) == kind
        # a misleading suffix does not matter, and no suffix neither
        for alias in ("renamed.bin", "renamed.npz", "renamed"):
            target = tmp_path / alias
            target.write_bytes((tmp_path / name).read_bytes())
            assert fmt.detect_format(target) == kind, (name, alias)
            assert fmt.load(target).format == kind
    legacy = fmt.load(tmp_path / "legacy.pt")
    np.testing.assert_array_equal(legacy.params["w"].numpy(), _rand((4, 4), 0))


@pytest.mark.parametrize("name", ["a.npz", "a.safetensors", "a.pt", "legacy.pt", "a.onnx"])
def test_truncated_and_corrupt_files_give_one_line_errors(tmp_path, name):
    _write_all_formats(tmp_path)
    data = (tmp_path / name).read_bytes()
    for label, content in (("half", data[: len(data) // 2]), ("head", data[:20]), ("flipped", _corrupt(data))):
        bad = tmp_path / f"{label}-{name}"
        bad.write_bytes(content)
        try:
            wf = fmt.load(bad)
        except fmt.FormatError as exc:
            msg = str(exc)
            assert msg.startswith(str(bad) + ": ") and "\n" not in msg and len(msg) < 400
        else:  # a flipped byte inside tensor data is undetectable by design; the structure must be intact
            assert label == "flipped" and set(mp.iter_arrays(wf.params)), name


def _corrupt(data: bytes) -> bytes:
    b = bytearray(data)
    for i in range(8, min(len(b), 200), 7):
        b[i] ^= 0x5A
    return bytes(b)


def test_unrecognised_and_empty_files(tmp_path):
    (tmp_path / "empty.npz").write_bytes(b"")
    (tmp_path / "text.txt").write_text("hello world, not a model\n")
    (tmp_path / "zip.zip").write_bytes(b"")
    with zipfile.ZipFile(tmp_path / "other.zip", "w") as zf:
        zf.writestr("readme.txt", "hi")
    with pytest.raises(fmt.FormatError, match="empty file"):
        fmt.load(tmp_path / "empty.npz")
    with pytest.raises(fmt.FormatError, match="unrecognised file format"):
        fmt.load(tmp_path / "text.txt")
    with pytest.raises(fmt.FormatError, match="neither"):
        fmt.load(tmp_path / "other.zip")
    with pytest.raises(fmt.FormatError, match="No such file|not found|no such"):
        fmt.load(tmp_path / "missing.npz")
    with pytest.raises(fmt.FormatError, match="not a mapping"):
        torch = pytest.importorskip("torch")
        torch.save([torch.ones(2)], tmp_path / "list.pt")
        fmt.load(tmp_path / "list.pt")


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_pickle_that_would_run_code_is_refused(tmp_path):
    torch = pytest.importorskip("torch")
    marker = tmp_path / "pwned"
    torch.save({"w": torch.ones(2), "x": _Evil(marker)}, tmp_path / "evil.pt")
    with pytest.raises(fmt.FormatError, match="refused") as info:
        fmt.load(tmp_path / "evil.pt")
    assert "\n" not in str(info.value)
    assert not marker.exists()


# --------------------------------------------------------------------------------------
# atomic writes
# --------------------------------------------------------------------------------------


def test_failed_write_leaves_destination_and_folder_clean(tmp_path):
    dst = tmp_path / "out.npz"
    dst.write_bytes(b"previous content")

    def boom(f):
        f.write(b"partial")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        fmt.atomic_write(dst, boom)
    assert dst.read_bytes() == b"previous content"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.npz"]
    with pytest.raises(fmt.FormatError, match="cannot store"):
        fmt.save(dst, {"w": np.ones(2), "meta": {"epoch": 1}})
    assert dst.read_bytes() == b"previous content"
    fmt.save(dst, OrderedDict(w=np.ones(2)))
    assert np.load(dst)["w"].tolist() == [1.0, 1.0]
    umask = os.umask(0)
    os.umask(umask)
    assert dst.stat().st_mode & 0o777 == 0o666 & ~umask, "not the 0600 of a temporary file"
    with pytest.raises(fmt.FormatError, match="does not exist"):
        fmt.save(tmp_path / "no" / "such" / "dir.npz", {"w": np.ones(2)})
