"""bfloat16 (and float16) initializers of ONNX models: read as float32, written back bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from arrayprune.adapters import formats as fmt
from arrayprune.adapters import mapping as mp
from cli_helpers import run

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from arrayprune.adapters.formats.onnx import _narrow_bfloat16, _widen_bfloat16  # noqa: E402

# Bits of bfloat16 values that must survive: NaNs with payloads (quiet and signalling),
# infinities, both zeros, the smallest subnormal, the largest finite, one, minus two.
_SPECIAL = np.array(
    [0x7FC1, 0xFF81, 0x7F80, 0xFF80, 0x0000, 0x8000, 0x0001, 0x7F7F, 0x3F80, 0xC000], dtype=np.uint16
)


def _bits(shape, seed, special=False):
    """Bits of finite bfloat16 values (top halves of random float32), with `_SPECIAL` first if asked."""
    f = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    bits = (f.view(np.uint32) >> 16).astype(np.uint16)
    if special:
        bits.reshape(-1)[: len(_SPECIAL)] = _SPECIAL
    return bits


def _bf16(name, bits, raw=True):
    """A bfloat16 initializer: raw data, or one value per int32 as onnx.helper writes it."""
    if raw:
        return helper.make_tensor(name, TensorProto.BFLOAT16, bits.shape, bits.astype("<u2").tobytes(), raw=True)
    t = TensorProto(name=name, data_type=TensorProto.BFLOAT16, dims=bits.shape)
    t.int32_data.extend(int(b) for b in bits.reshape(-1))
    return t


def _stored_bits(tensor):
    if tensor.HasField("raw_data"):
        return np.frombuffer(tensor.raw_data, "<u2").reshape(tuple(tensor.dims))
    return np.asarray(tensor.int32_data, np.int64).astype(np.uint16).reshape(tuple(tensor.dims))


def _model(w_bits, b_bits, raw=True, extra=()):
    """x (bfloat16, n x 8) -> MatMul(W 8x16) -> Add(b 1x16) -> y."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])],
        "bf16",
        [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, ["n", 8])],
        [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, ["n", 16])],
        initializer=[_bf16("W", w_bits, raw), _bf16("b", b_bits, raw), *extra],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _by_name(path):
    return {t.name: t for t in onnx.load(str(path)).graph.initializer}


def test_widen_then_narrow_is_exact_for_every_bfloat16():
    every = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    assert np.array_equal(_narrow_bfloat16(_widen_bfloat16(every)), every)
    assert _narrow_bfloat16(np.float32(1.5)).shape == ()


def test_narrow_rounds_to_nearest_even_like_ml_dtypes():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(0)
    x = rng.standard_normal(100_000).astype(np.float32) * np.float32(1e3)
    ties = (_widen_bfloat16(_bits((1000,), 1)).view(np.uint32) | 0x8000).view(np.float32)  # halfway: to even
    x = np.concatenate([x, ties, np.array([3.4e38, -3.4e38, 1e-40], np.float32)])
    assert np.array_equal(_narrow_bfloat16(x), x.astype(ml_dtypes.bfloat16).view(np.uint16))
    nan = np.array([np.nan, -np.nan], np.float32).view(np.uint32) | 1  # low bits set: not a bfloat16 NaN
    assert np.isnan(_widen_bfloat16(_narrow_bfloat16(nan.view(np.float32)))).all()


@pytest.mark.parametrize("raw", [True, False])
def test_bfloat16_loads_as_float32_and_saves_back_bit_for_bit(tmp_path, raw):
    w, b = _bits((8, 16), 0, special=True), _bits((1, 16), 1)
    onnx.save_model(_model(w, b, raw), str(tmp_path / "m.onnx"))
    wf = fmt.load(tmp_path / "m.onnx")
    assert wf.context["bfloat16"] == {"W", "b"}
    assert wf.params["W"].dtype == np.float32 and wf.params["W"].shape == (8, 16)
    assert np.array_equal(wf.params["W"].view(np.uint32) >> 16, w)
    assert np.array_equal(wf.params["W"].view(np.uint32) & 0xFFFF, np.zeros((8, 16), np.uint32))

    fmt.save(tmp_path / "same.onnx", wf.params, like=wf)
    out = _by_name(tmp_path / "same.onnx")
    assert out["W"].data_type == TensorProto.BFLOAT16 and list(out["W"].dims) == [8, 16]
    assert np.array_equal(_stored_bits(out["W"]), w) and np.array_equal(_stored_bits(out["b"]), b)
    onnx.checker.check_model(onnx.load(str(tmp_path / "same.onnx")))

    # Pruning multiplies by the mask, which turns the signalling NaN quiet: leave it out here.
    w = np.where(w == 0xFF81, 0xFFC1, w).astype(np.uint16)
    pruned = mp.l1_unstructured({"W": _widen_bfloat16(w)}, "W", 37)
    fmt.save(tmp_path / "pruned.onnx", mp.apply_masks(pruned), like=wf)
    out = _by_name(tmp_path / "pruned.onnx")
    got = _stored_bits(out["W"])
    zero = (got == 0x0000) | (got == 0x8000)
    kept = ~zero | (w == 0x0000) | (w == 0x8000)
    assert np.array_equal(got[kept], w[kept]), "entries left alone keep their bits"
    assert np.count_nonzero(zero) == 37, "the 2 zeros already there are among the 37 smallest"
    assert np.array_equal(_stored_bits(out["b"]), b), "tensors not given are written as they were"


def test_bfloat16_external_data_round_trip(tmp_path):
    w, b = _bits((8, 16), 2, special=True), _bits((1, 16), 3)
    onnx.save_model(
        _model(w, b),
        str(tmp_path / "m.onnx"),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="m.onnx.data",
        size_threshold=0,
    )
    wf = fmt.load(tmp_path / "m.onnx")
    assert np.array_equal(wf.params["W"].view(np.uint32) >> 16, w)
    fmt.save(tmp_path / "out.onnx", {"W": wf.params["W"]}, like=wf)  # b: from the external data, as read
    assert len(list(tmp_path.glob("out.onnx.*.data"))) == 1
    model = onnx.load(str(tmp_path / "out.onnx"))
    out = {t.name: t for t in model.graph.initializer}
    assert np.array_equal(_stored_bits(out["W"]), w) and np.array_equal(_stored_bits(out["b"]), b)


def test_bfloat16_refuses_other_dtypes(tmp_path):
    onnx.save_model(_model(_bits((8, 16), 0), _bits((1, 16), 1)), str(tmp_path / "m.onnx"))
    wf = fmt.load(tmp_path / "m.onnx")
    with pytest.raises(fmt.FormatError, match="'W' is bfloat16 .* got float64"):
        fmt.save(tmp_path / "o.onnx", {"W": wf.params["W"].astype(np.float64)}, like=wf)


def test_float16_still_round_trips(tmp_path):
    h = np.random.default_rng(4).standard_normal((8, 16)).astype(np.float16)
    extra = [numpy_helper.from_array(h, "H")]
    onnx.save_model(_model(_bits((8, 16), 0), _bits((1, 16), 1), extra=extra), str(tmp_path / "m.onnx"))
    wf = fmt.load(tmp_path / "m.onnx")
    assert wf.params["H"].dtype == np.float16 and np.array_equal(wf.params["H"], h)
    assert wf.context["bfloat16"] == {"W", "b"}
    fmt.save(tmp_path / "o.onnx", wf.params, like=wf)
    out = _by_name(tmp_path / "o.onnx")
    assert out["H"].data_type == TensorProto.FLOAT16
    assert np.array_equal(numpy_helper.to_array(out["H"]).view(np.uint16), h.view(np.uint16))


@pytest.mark.slow
def test_command_line_prunes_a_bfloat16_weight(tmp_path):
    w, b = _bits((8, 16), 5), _bits((1, 16), 6)
    onnx.save_model(_model(w, b), str(tmp_path / "m.onnx"))
    proc = run("prune", tmp_path / "m.onnx", "-o", tmp_path / "o.onnx", "--amount", "0.5")
    assert proc.returncode == 0, proc.stderr
    out = _by_name(tmp_path / "o.onnx")
    assert out["W"].data_type == TensorProto.BFLOAT16 and out["b"].data_type == TensorProto.BFLOAT16
    got = _stored_bits(out["W"])
    assert np.count_nonzero(numpy_helper.to_array(out["W"]).astype(np.float32) == 0) == 64
    kept = (got != 0) & (got != 0x8000)
    assert np.array_equal(got[kept], w[kept]) and np.count_nonzero(kept) == 64
    magnitude = np.abs(_widen_bfloat16(w))
    assert magnitude[kept].min() >= magnitude[~kept].max(), "the smallest magnitudes are the ones pruned"
    assert np.array_equal(_stored_bits(out["b"]), b), "the bias [1, N] is left alone"
    onnx.checker.check_model(onnx.load(str(tmp_path / "o.onnx")))

    proc = run("prune", tmp_path / "m.onnx", "-o", tmp_path / "nm.onnx", "--method", "nm_structured", "--nm", "2:4")
    assert proc.returncode == 0, proc.stderr
    got = _stored_bits(_by_name(tmp_path / "nm.onnx")["W"])
    zero = (got == 0) | (got == 0x8000)
    assert (zero.reshape(2, 4, 16).sum(axis=1) == 2).all(), "2 zeros in every 4 along K, the reduction axis"


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_scalar_initializers_keep_their_shape(tmp_path, dtype):
    scale = numpy_helper.from_array(np.array(0.5, dtype), "scale")
    onnx.save_model(_model(_bits((8, 16), 0), _bits((1, 16), 1), extra=[scale]), str(tmp_path / "m.onnx"))
    wf = fmt.load(tmp_path / "m.onnx")
    assert wf.params["scale"].shape == ()
    fmt.save(tmp_path / "o.onnx", wf.params, like=wf)
    out = _by_name(tmp_path / "o.onnx")["scale"]
    assert list(out.dims) == [] and numpy_helper.to_array(out) == 0.5


def test_narrow_a_0d_array_that_is_not_bfloat16_already():
    x = np.array(1.1, np.float32)  # between two bfloat16 values: rounded
    bits = _narrow_bfloat16(x)
    assert bits.shape == () and bits.dtype == np.uint16
    assert int(bits) == 0x3F8D  # 1.1015625, the nearest bfloat16 (1.09375 is 0x3F8C)
