"""The fast paths of pruning stored tensors give what the plain paths give, bit for bit.

The streaming path finds a global threshold in one pass when a sample of the keys
brackets it (:func:`arrayprune.selection.radix.cut_of_chunks`), writes through a
background thread (:class:`~arrayprune.adapters.formats.safetensors_stream.BackgroundWrites`)
and counts zeros from the mask. Here chunks are made small so that tensors span many of
them, the sample is made to bracket the threshold or to miss it, and every output is
compared with the in-memory path's (the core on the whole model) and with the digit
passes alone.
"""

from __future__ import annotations

import numpy as np
import pytest

from arrayprune.adapters.formats import safetensors_stream
from arrayprune.selection import radix

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from test_sharded import bits, cli, in_memory, llama_tensors, load_folder, write_checkpoint  # noqa: E402

import arrayprune.adapters.pipeline.stream_pruning as stream_pruning  # noqa: E402


def _keys(rng, n, kind):
    if kind == "ties":
        return rng.integers(0, 50, n).astype(np.uint32)
    if kind == "wide":
        return rng.integers(0, 1 << 31, n, dtype=np.uint64).astype(np.uint32)
    x = np.abs(rng.standard_normal(n).astype(np.float32)) * np.float32(0.02)
    return x.view(np.uint32)


@pytest.mark.parametrize("kind", ["normal", "ties", "wide"])
@pytest.mark.parametrize("k_frac", [0.001, 0.5, 0.97])
@pytest.mark.parametrize("sample", ["spread", "misleading", "tiny"])
def test_cut_with_a_sample_equals_the_digit_passes(kind, k_frac, sample):
    rng = np.random.default_rng(1)
    keys = _keys(rng, 300_000, kind)
    chunks = [keys[i : i + 70_000] for i in range(0, keys.size, 70_000)]
    k = max(1, round(k_frac * keys.size))
    if sample == "spread":
        picked = keys[::97]
    elif sample == "misleading":  # brackets keys far from the k-th: the digit passes follow
        picked = np.sort(keys)[-5000:]
    else:
        picked = keys[:100]
    want = radix.cut_of_chunks(lambda: chunks, 31, k, keys.size)
    got = radix.cut_of_chunks(lambda: chunks, 31, k, keys.size, sample=picked)
    assert got == want
    assert np.count_nonzero(keys < got.key) == got.below and 1 <= got.need <= np.count_nonzero(keys == got.key)


@pytest.mark.parametrize("bits_, dtype", [(15, np.uint16), (63, np.uint64)])
def test_cut_with_a_sample_16_and_64_bit_keys(bits_, dtype):
    rng = np.random.default_rng(2)
    keys = rng.integers(0, 1 << min(bits_, 40), 50_000, dtype=np.uint64).astype(dtype)
    for k in (1, 17_000, 50_000):
        want = radix.cut_of_chunks(lambda: [keys[:20_000], keys[20_000:]], bits_, k, keys.size)
        got = radix.cut_of_chunks(lambda: [keys[:20_000], keys[20_000:]], bits_, k, keys.size, sample=keys[::7])
        assert got == want


@pytest.fixture(params=["bracket", "missed"])
def small_chunks(request, monkeypatch):
    """Chunks of 200 entries and a sample of blocks of 16; or a sample that misses."""
    monkeypatch.setattr(safetensors_stream, "CHUNK", 200)
    monkeypatch.setattr(stream_pruning, "_BLOCK", 16)
    monkeypatch.setattr(stream_pruning, "_SAMPLE", 2048)
    if request.param == "missed":
        real = stream_pruning._sample

        def misleading(*args):
            keys = real(*args)
            return np.sort(keys)[-keys.size // 4 :]

        monkeypatch.setattr(stream_pruning, "_sample", misleading)
    return request.param


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("global_", [True, False])
@pytest.mark.parametrize("ties", [False, True])
def test_streamed_equals_in_memory_in_small_chunks(tmp_path, capsys, small_chunks, dtype, global_, ties):
    tensors = llama_tensors(dtype=dtype, ties=ties, seed=11, hidden=48, inter=80)
    tensors["model.layers.1.mlp.up_proj.weight"][0, :2] = float("inf")
    tensors["model.layers.2.mlp.up_proj.weight"][1, :3] = 0.0
    src = write_checkpoint(tmp_path / "in", tensors, 3)
    out = tmp_path / "out"
    amount = 0.6 if ties else 0.5
    assert cli("prune", src, "-o", out, "--amount", amount, *(["--global"] if global_ else [])) == 0
    got, _ = load_folder(out)
    want, targets = in_memory(tensors, amount, global_=global_)
    for name, t in tensors.items():
        assert torch.equal(bits(got[name]), bits(want.get(name, t))), name
    # the zeros the summary counts (from the mask) are the zeros written
    written = sum(int((got[e.name] == 0).sum()) for e in targets)
    total = sum(e.value.numel() if hasattr(e.value, "numel") else e.value.size for e in targets)
    assert f"{written} of {total} entries zero" in capsys.readouterr().out


def test_background_writes_raise_the_writers_error_and_stop():
    class Failing:
        def __init__(self):
            self.calls = []

        def write(self, name, data):
            self.calls.append(name)
            if name == "b":
                raise OSError(28, "No space left on device")

    failing = Failing()
    with pytest.raises(OSError, match="No space"):
        with safetensors_stream.BackgroundWrites({"a": failing, "b": failing, "c": failing}) as sink:
            for name in ("a", "b", "c", "c", "c"):
                sink.write(name, b"x")
    assert failing.calls[:2] == ["a", "b"] and "c" not in failing.calls


def test_background_writes_stop_on_the_callers_exception():
    written = []

    class Slow:
        def write(self, name, data):
            written.append(name)

    with pytest.raises(KeyboardInterrupt):
        with safetensors_stream.BackgroundWrites({"a": Slow()}) as sink:
            sink.write("a", b"x")
            sink.wait()
            raise KeyboardInterrupt
    assert written == ["a"]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("nm", ["2:4", "1:4", "3:8"])
def test_nm_streamed_in_small_chunks_equals_in_memory(tmp_path, monkeypatch, dtype, nm):
    monkeypatch.setattr(safetensors_stream, "CHUNK", 256)
    tensors = llama_tensors(dtype=dtype, ties=True, layers=2, seed=12, hidden=32, inter=64)
    w = tensors["model.layers.0.mlp.up_proj.weight"]
    w[0, :8] = torch.tensor([float("inf"), 1.0, float("inf"), -1.0, 0.0, -0.0, 0.5, -0.5]).to(w.dtype)
    if dtype != "bfloat16":  # PyTorch's bfloat16 multiply rewrites NaN payloads; its mask is checked below
        w[1, :8] = torch.tensor([float("nan"), float("nan"), 1.0, float("inf"), 2, 2, 2, 2]).to(w.dtype)
    src = write_checkpoint(tmp_path / "in", tensors, 2)
    out = tmp_path / "out"
    assert cli("prune", src, "-o", out, "--method", "nm_structured", "--nm", nm) == 0
    got, _ = load_folder(out)
    n, m = map(int, nm.split(":"))
    want, _ = in_memory(tensors, None, method="nm_structured", global_=False, n=n, m=m)
    for name, t in tensors.items():
        assert torch.equal(bits(got[name]), bits(want.get(name, t))), name


def test_nm_streamed_bfloat16_nan_mask_equals_in_memory(tmp_path, monkeypatch):
    monkeypatch.setattr(safetensors_stream, "CHUNK", 256)
    tensors = llama_tensors(dtype="bfloat16", layers=1, seed=13)
    w = tensors["model.layers.0.mlp.up_proj.weight"]
    w[1, :8] = torch.tensor([float("nan"), float("nan"), 1.0, float("inf"), 2, 2, float("nan"), 2]).to(w.dtype)
    src = write_checkpoint(tmp_path / "in", tensors, 1)
    assert cli("prune", src, "-o", tmp_path / "out", "--method", "nm_structured") == 0
    got, _ = load_folder(tmp_path / "out")
    want, _ = in_memory(tensors, None, method="nm_structured", global_=False, n=2, m=4)
    for name, t in want.items():
        assert torch.equal(got[name] == 0, t == 0) and torch.equal(got[name].isnan(), t.isnan()), name


@pytest.mark.parametrize("chunk", [64, 1 << 22])
def test_report_rows_scanned_equal_rows_of_loaded_tensors(tmp_path, monkeypatch, chunk):
    from safetensors.torch import save_file

    from arrayprune.adapters.pipeline import open_storage
    from arrayprune.adapters.summary import report_rows

    monkeypatch.setattr(safetensors_stream, "CHUNK", chunk)
    rng = np.random.default_rng(14)
    t = {}
    for i, dtype in enumerate((torch.float32, torch.bfloat16, torch.float16)):
        dense = torch.from_numpy(rng.standard_normal((16, 32)).astype(np.float32)).to(dtype)
        two_four = dense.clone().reshape(-1, 4)
        two_four[:, :2] = 0
        two_four[3, 0] = -0.0
        t[f"model.layers.{i}.mlp.up_proj.weight"] = dense
        t[f"model.layers.{i}.mlp.down_proj.weight"] = two_four.reshape(16, 32)
        t[f"model.layers.{i}.mlp.gate_proj.weight"] = torch.zeros(8, 6, dtype=dtype)  # 6: not a multiple of 4
        t[f"model.layers.{i}.input_layernorm.weight"] = torch.ones(32, dtype=dtype)
    t["model.layers.0.self_attn.q_proj.weight"] = torch.zeros(4, 4, 4, dtype=torch.float32)
    t["model.embed_tokens.weight"] = torch.arange(12, dtype=torch.int32).reshape(3, 4)
    save_file(t, str(tmp_path / "model.safetensors"))
    storage = open_storage(str(tmp_path / "model.safetensors"))
    with safetensors_stream.TensorFiles() as files:
        want = report_rows(storage.params, roles=storage.roles, load=files.load)
        got = report_rows(storage.params, roles=storage.roles, load=files.load, scan=files.scan)
    assert got == want
    assert any(r["nm_2_4"] for r in got) and not all(r.get("nm_2_4", True) for r in got)


def test_cuts_ahead_start_the_next_cut_and_raise_errors_at_their_tensor(tmp_path):
    """Per tensor, the next tensor's cut is found in a worker thread while the current
    one is written: the same cut as found in order, and a method's error is raised when
    its own tensor is reached, not while the one before it is written."""
    from types import SimpleNamespace

    import arrayprune
    from arrayprune.adapters.formats.sharded import open_checkpoint

    tensors = llama_tensors(dtype="float32", seed=5, hidden=48, inter=80)
    src = write_checkpoint(tmp_path / "in", tensors, 2)
    stored = open_checkpoint(src).tensors
    entries = [SimpleNamespace(name=n, value=t) for n, t in stored.items() if n.endswith("proj.weight")][:3]

    def method_for(entry):
        if entry is entries[2]:
            raise ValueError("bad dim")
        return arrayprune.L1Unstructured(0.5)

    with safetensors_stream.TensorFiles() as files:
        ahead = stream_pruning._CutsAhead(entries, files, method_for)
        try:
            _, first = ahead.take(entries[0])
            assert entries[1].name in ahead._started  # found while entries[0] is written
            _, second = ahead.take(entries[1])  # entries[2]'s method fails: not raised yet
            with pytest.raises(ValueError, match="bad dim"):
                ahead.take(entries[2])
            for entry, found in ((entries[0], first), (entries[1], second)):
                got = found.result()
                want = stream_pruning._Cut([entry], files, method_for(entry), release=True)
                assert (got.key, got.stream.left) == (want.key, want.stream.left)
        finally:
            ahead.close()


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("fold_threads", [1, 2, 3])
@pytest.mark.parametrize("global_", [True, False])
def test_cuts_in_any_number_of_threads_equal_in_memory(
    tmp_path, small_chunks, monkeypatch, threads, fold_threads, global_
):
    """Counting and folding in threads: the ties at the cut's key, spread over many
    chunks (of 200 entries), are dropped first in position order, as in memory."""
    monkeypatch.setattr(stream_pruning, "_COUNTING_THREADS", threads)
    monkeypatch.setattr(stream_pruning, "_FOLD_THREADS", fold_threads)
    tensors = llama_tensors(dtype="float32", ties=True, seed=14, hidden=48, inter=80)
    src = write_checkpoint(tmp_path / "in", tensors, 3)
    out = tmp_path / "out"
    assert cli("prune", src, "-o", out, "--amount", 0.6, *(["--global"] if global_ else [])) == 0
    got, _ = load_folder(out)
    want, _ = in_memory(tensors, 0.6, global_=global_)
    for name, t in tensors.items():
        assert torch.equal(bits(got[name]), bits(want.get(name, t))), name


@pytest.mark.parametrize("fails_at", [1, 4, 9])
def test_an_error_in_a_fold_thread_is_raised_and_nothing_is_written(tmp_path, monkeypatch, capsys, fails_at):
    monkeypatch.setattr(safetensors_stream, "CHUNK", 200)
    monkeypatch.setattr(stream_pruning, "_FOLD_THREADS", 2)
    real, calls = stream_pruning.fold, []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == fails_at:
            raise MemoryError
        return real(*args, **kwargs)

    monkeypatch.setattr(stream_pruning, "fold", failing)
    src = write_checkpoint(tmp_path / "in", llama_tensors(dtype="float32", ties=True, seed=3), 2)
    out = tmp_path / "out"
    assert cli("prune", src, "-o", out, "--amount", 0.6, "--global") != 0
    assert "out of memory" in capsys.readouterr().err
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["in"]
