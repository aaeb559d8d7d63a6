"""Writes past the page cache give the bytes buffered writes give.

:class:`~arrayprune.adapters.formats.direct_writes.DirectWrites` turns writes of any
offset, length and memory address into block-aligned ``O_DIRECT`` ones, holding partial
blocks until they fill. Here files are written in random pieces, in random orders, from
buffers at random places in memory, and compared byte for byte with what was meant;
then whole checkpoints are pruned with direct writes forced on (every file large
enough) and compared with the same prune written through the page cache.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arrayprune.adapters.formats import direct_writes
from arrayprune.adapters.formats.direct_writes import BLOCK, DirectWrites, at_phase, block_buffer, open_direct


def _direct_or_skip(path, size):
    f = open(path, "xb")
    d = open_direct(f, size, min_size=0)
    if d is None:
        f.close()
        pytest.skip("no O_DIRECT writes on this file system")
    return f, d


@st.composite
def _pieces(draw):
    """A file's bytes cut into pieces at random points, in a random order."""
    size = draw(st.integers(1, 5 * BLOCK + 300))
    cuts = sorted(draw(st.sets(st.integers(1, size - 1), max_size=12))) if size > 1 else []
    bounds = [0, *cuts, size]
    pieces = list(zip(bounds, bounds[1:], strict=False))
    order = draw(st.permutations(pieces))
    shifts = draw(st.lists(st.integers(0, BLOCK - 1), min_size=len(order), max_size=len(order)))
    return size, order, shifts


@settings(max_examples=60, deadline=None)
@given(case=_pieces(), seed=st.integers(0, 2**32 - 1))
def test_pieces_in_any_order_and_place_give_the_file(tmp_path_factory, case, seed):
    size, order, shifts = case
    want = np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)
    path = tmp_path_factory.mktemp("direct") / "f.bin"
    f, d = _direct_or_skip(path, size)
    with f:
        for (start, stop), shift in zip(order, shifts, strict=True):
            # the piece at a chosen place in memory: in phase with the file (no copy) or not
            buf = at_phase(block_buffer(stop - start), shift if shift % 3 else start % BLOCK, np.uint8, stop - start)
            buf[:] = want[start:stop]
            d.write(start, buf)
        d.finish()
    assert path.read_bytes() == want.tobytes()


def test_at_phase_lies_at_its_phase_in_a_block_buffer():
    held = block_buffer(4000)
    for phase in (0, 1, 8, 4095, 4096 + 24):
        b = at_phase(held, phase, np.float32, 1000)
        assert b.ctypes.data % BLOCK == phase % BLOCK and b.shape == (1000,) and b.dtype == np.float32
    at_phase(held, 4095, np.float32, 1000)  # 4095 + 4000 bytes: fits in 4000 + 4096
    with pytest.raises(ValueError, match="cannot hold 4004 at phase 4095"):
        at_phase(held, 4095, np.float32, 1001)


def test_unwritten_bytes_are_an_error(tmp_path):
    f, d = _direct_or_skip(tmp_path / "f.bin", 3 * BLOCK)
    with f:
        d.write(0, np.ones(BLOCK + 10, np.uint8))
        d.write(BLOCK + 11, np.ones(2 * BLOCK - 11, np.uint8))  # byte BLOCK + 10 never written
        with pytest.raises(ValueError, match=f"block 1 \\(offset {BLOCK}\\)"):
            d.finish()


def test_writes_outside_the_file_are_an_error(tmp_path):
    f, d = _direct_or_skip(tmp_path / "f.bin", 100)
    with f:
        with pytest.raises(ValueError, match="outside a file of 100 bytes"):
            d.write(90, np.ones(11, np.uint8))
        d.close()


def test_small_files_and_unsupported_systems_are_written_through_the_cache(tmp_path, monkeypatch):
    with open(tmp_path / "a", "xb") as f:
        assert open_direct(f, 1000) is None  # under MIN_SIZE
    monkeypatch.setattr(direct_writes, "_O_DIRECT", 0)
    with open(tmp_path / "b", "xb") as f:
        assert open_direct(f, 1 << 40, min_size=0) is None

    def refuse(*args, **kwargs):
        raise OSError(22, "Invalid argument")

    monkeypatch.undo()
    monkeypatch.setenv("ARRAYPRUNE_DIRECT_WRITES", "0")  # turned off by the user
    with open(tmp_path / "d", "xb") as f:
        assert open_direct(f, 1 << 40, min_size=0) is None
    monkeypatch.undo()
    monkeypatch.setattr(direct_writes.os, "pwrite", refuse)  # opens, then refuses the write
    with open(tmp_path / "c", "xb") as f:
        assert open_direct(f, 1 << 40, min_size=0) is None
    assert os.path.getsize(tmp_path / "c") == 0


def test_a_short_write_that_is_not_whole_blocks_is_an_error(tmp_path, monkeypatch):
    f, d = _direct_or_skip(tmp_path / "f.bin", 4 * BLOCK)
    monkeypatch.setattr(direct_writes.os, "pwrite", lambda fd, data, offset: 100)
    with f, pytest.raises(OSError, match="short write"):
        d.write(0, np.ones(4 * BLOCK, np.uint8))
    d.close()


# --- whole checkpoints -------------------------------------------------------------------

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from test_sharded import cli, llama_tensors, write_checkpoint  # noqa: E402

from arrayprune.adapters.formats import safetensors_stream  # noqa: E402


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(
    "args",
    [("--amount", "0.5", "--global"), ("--amount", "0.3"), ("--method", "nm_structured", "--nm", "2:4")],
    ids=["global", "per-tensor", "2:4"],
)
@pytest.mark.parametrize("shards", [1, 3])
@pytest.mark.slow
def test_a_prune_written_directly_equals_one_written_through_the_cache(tmp_path, monkeypatch, dtype, args, shards):
    tensors = llama_tensors(dtype=dtype, seed=5, hidden=48, inter=80)
    src = write_checkpoint(tmp_path / "in", tensors, shards)
    if shards == 1:  # one .safetensors file
        src = next(src.glob("*.safetensors"))
    monkeypatch.setattr(safetensors_stream, "CHUNK", 200)  # tensors in many chunks, odd places
    buffered = tmp_path / ("buffered" if shards > 1 else "buffered.safetensors")
    direct = tmp_path / ("direct" if shards > 1 else "direct.safetensors")
    with monkeypatch.context() as m:
        m.setattr(safetensors_stream, "open_direct", lambda f, size: None)
        assert cli("prune", src, "-o", buffered, *args) == 0
    writes = []
    real = DirectWrites.write

    def counted(self, offset, data):
        writes.append(len(memoryview(data).cast("B")))
        return real(self, offset, data)

    monkeypatch.setattr(direct_writes, "MIN_SIZE", 0)
    monkeypatch.setattr(DirectWrites, "write", counted)
    assert cli("prune", src, "-o", direct, *args) == 0
    with open(tmp_path / "probe", "xb") as f:
        if open_direct(f, BLOCK, min_size=0) is None:
            pytest.skip("no O_DIRECT writes on this file system")
    assert writes, "no direct writes were made"
    names = sorted(p.name for p in buffered.iterdir()) if shards > 1 else [None]
    for name in names:
        a, b = (buffered / name, direct / name) if name else (buffered, direct)
        assert a.read_bytes() == b.read_bytes(), name


def test_output_buffers_held_stay_few_and_serve_any_phase():
    from arrayprune.adapters.pipeline import stream_pruning

    buffers = stream_pruning._Buffers()
    like = np.empty(1000, np.float32)
    out, first = buffers.take(like, 8)
    buffers.give(first)
    for phase in range(0, BLOCK, 8):  # a tensor at every phase: the one buffer serves them all
        out, held = buffers.take(like, phase)
        assert held is first
        assert out.ctypes.data % BLOCK == phase and out.shape == like.shape and out.dtype == like.dtype
        buffers.give(held)
    many = [buffers.take(like, 0)[1] for _ in range(10)]
    for held in many:
        buffers.give(held)
    assert len(buffers._free) == buffers.KEPT
    other, _ = buffers.take(np.empty(7, np.float64))  # another size: a buffer of its own
    assert other.shape == (7,) and other.dtype == np.float64


def test_onnx_external_data_written_directly_equals_it_written_through_the_cache(tmp_path, monkeypatch):
    onnx = pytest.importorskip("onnx")
    from onnx_builders import two_layer_relu

    rng = np.random.default_rng(0)
    src = tmp_path / "in" / "model.onnx"
    src.parent.mkdir()
    w1, w2 = rng.standard_normal((37, 61)).astype(np.float32), rng.standard_normal((61, 5)).astype(np.float32)
    two_layer_relu(src, w1, w2)
    model = onnx.load(str(src))
    onnx.save(model, str(src), save_as_external_data=True, location="model.onnx.data", size_threshold=0)
    (tmp_path / "buffered").mkdir()
    (tmp_path / "direct").mkdir()
    monkeypatch.setenv("ARRAYPRUNE_DIRECT_WRITES", "0")
    assert cli("prune", src, "-o", tmp_path / "buffered" / "out.onnx", "--amount", "0.5") == 0
    monkeypatch.delenv("ARRAYPRUNE_DIRECT_WRITES")
    monkeypatch.setattr(direct_writes, "MIN_SIZE", 0)
    made = []
    real = direct_writes.open_direct

    def spy(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr("arrayprune.adapters.formats.onnx.open_direct", spy)
    assert cli("prune", src, "-o", tmp_path / "direct" / "out.onnx", "--amount", "0.5") == 0
    if not any(made):
        pytest.skip("no O_DIRECT writes on this file system")
    a, b = sorted((tmp_path / "buffered").iterdir()), sorted((tmp_path / "direct").iterdir())
    assert [p.name for p in a] == [p.name for p in b] and len(a) == 2  # the model and its data file
    for x, y in zip(a, b, strict=True):
        assert x.read_bytes() == y.read_bytes(), x.name
