"""Hugging Face and sentence-transformers folders: sub-folders, messages, provenance, full disks."""

from __future__ import annotations

import errno
import json
import warnings

import numpy as np
import pytest
from test_sharded import _minilm_folder, cli, header, in_memory, llama_tensors, write_checkpoint

from cli_helpers import EXAMPLE, assert_error, run

torch = pytest.importorskip("torch")
st = pytest.importorskip("sentence_transformers")
from safetensors.torch import load_file as load_torch  # noqa: E402

SENTENCES = ["A man is eating food.", "The new movie is awesome.", "Pruning removes weights.", "Hello world"]


def _cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def _sentence_model(folder):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return st.SentenceTransformer(str(folder), device="cpu")


@pytest.mark.slow
def test_pruned_sentence_transformers_folder_loads_and_matches_the_tensors(tmp_path, capsys):
    folder = _minilm_folder(tmp_path)
    assert (folder / "1_Pooling" / "config.json").is_file()
    assert cli("prune", folder, "-o", tmp_path / "m50", "--amount", "0.5", "--global") == 0
    said = capsys.readouterr().out
    assert "wrote 9 files to" in said and "1 weights file, 8 other files copied" in said, said
    assert "shards" not in said and "index" not in said
    assert (tmp_path / "m50" / "1_Pooling" / "config.json").read_bytes() == (
        folder / "1_Pooling" / "config.json"
    ).read_bytes()

    dense = _sentence_model(folder)
    want = dense.encode(SENTENCES, convert_to_numpy=True)
    pruned, _ = in_memory(load_torch(str(folder / "model.safetensors")), 0.5)
    transformer = dense[0].auto_model
    state = transformer.state_dict()
    assert set(pruned) <= set(state)
    transformer.load_state_dict({**state, **pruned})
    by_tensors = _cosine(dense.encode(SENTENCES, convert_to_numpy=True), want)

    loaded = _sentence_model(tmp_path / "m50")
    by_folder = _cosine(loaded.encode(SENTENCES, convert_to_numpy=True), want)
    assert by_tensors.min() < 0.99  # pruning did change the embeddings
    np.testing.assert_array_equal(by_folder, by_tensors)


@pytest.mark.slow
def test_dense_sub_folder_weights_are_pruned(tmp_path, capsys):
    from sentence_transformers.models import Dense

    folder = _minilm_folder(tmp_path)
    torch.manual_seed(0)
    (folder / "2_Dense").mkdir()
    Dense(384, 64).save(str(folder / "2_Dense"))
    modules = json.loads((folder / "modules.json").read_text())
    modules.append({"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
    (folder / "modules.json").write_text(json.dumps(modules))
    stored = load_torch(str(folder / "2_Dense" / "model.safetensors"))
    assert set(stored) == {"linear.weight", "linear.bias"}
    assert cli("prune", folder, "-o", tmp_path / "out", "--amount", "0.5") == 0
    said = capsys.readouterr().out
    assert "2 weights files" in said, said
    got = load_torch(str(tmp_path / "out" / "2_Dense" / "model.safetensors"))
    assert set(got) == {"linear.weight", "linear.bias"}
    w = stored["linear.weight"]
    keep = w.abs().flatten().argsort(stable=True)[round(0.5 * w.numel()) :]
    want = torch.zeros_like(w).flatten()
    want[keep] = w.flatten()[keep]
    assert torch.equal(got["linear.weight"], want.reshape(w.shape))
    assert int((got["linear.weight"] == 0).sum()) == w.numel() // 2
    assert torch.equal(got["linear.bias"], stored["linear.bias"])  # biases stay
    config = "2_Dense/config.json"
    assert (tmp_path / "out" / config).read_bytes() == (folder / config).read_bytes()
    loaded = _sentence_model(tmp_path / "out")
    assert torch.equal(loaded[2].linear.weight.detach(), got["linear.weight"])
    assert loaded.encode(SENTENCES, convert_to_numpy=True).shape == (len(SENTENCES), 64)


@pytest.mark.slow
def test_sub_folder_links_and_weights_are_not_copied(tmp_path, capsys):
    import os

    folder = _minilm_folder(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "secret.txt").write_text("outside")
    os.symlink(tmp_path / "elsewhere", folder / "linked")
    os.symlink(tmp_path / "elsewhere" / "secret.txt", folder / "1_Pooling" / "notes.txt")
    (folder / "onnx").mkdir()
    (folder / "onnx" / "model.onnx").write_bytes(b"unpruned weights")
    os.mkfifo(folder / "1_Pooling" / "pipe")
    assert cli("prune", folder, "-o", tmp_path / "out", "--amount", "0.5") == 0
    said = capsys.readouterr().out
    for fragment in ("linked (a symlink leading outside", "1_Pooling/notes.txt (a symlink leading outside",
                     "onnx/model.onnx (weights the index does not list)", "1_Pooling/pipe (not a regular file"):
        assert fragment in said, said
    out = tmp_path / "out"
    assert not (out / "linked").exists() and not (out / "onnx" / "model.onnx").exists()
    assert sorted(p.name for p in (out / "1_Pooling").iterdir()) == ["config.json"]


# --------------------------------------------------------------------------------------
# Messages
# --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_sparsegpt_without_calibration_on_a_hf_folder_says_how_to_give_it(tmp_path):
    folder = _minilm_folder(tmp_path)
    line = assert_error(
        run("prune", folder, "-o", tmp_path / "out", "--method", "sparsegpt", "--amount", "0.5"),
        "--method sparsegpt needs calibration data on this Hugging Face folder",
        "--calibration tokens.npz",
        "--hessians hessians.npz",
    )
    assert "ONNX" not in line
    line = assert_error(
        run("prune", folder / "model.safetensors", "-o", tmp_path / "o.safetensors", "--method", "sparsegpt",
            "--amount", "0.5"),
        "needs calibration data",
    )
    assert "ONNX" not in line
    assert not (tmp_path / "out").exists() and not (tmp_path / "o.safetensors").exists()


def test_files_line_counts_in_words(tmp_path, capsys):
    src = write_checkpoint(tmp_path / "in", llama_tensors(layers=1), 2, other={"config.json": b"{}"})
    assert cli("prune", src, "-o", tmp_path / "out", "--amount", "0.5") == 0
    said = capsys.readouterr().out
    assert f"wrote 4 files to {tmp_path / 'out'}: 2 shards, 1 other file copied, the index last" in said, said


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    tr = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = tr.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, head_dim=8,
    )  # fmt: skip
    path = tmp_path_factory.mktemp("llama") / "dense"
    tr.LlamaForCausalLM(cfg).save_pretrained(path, max_shard_size="20KB")
    return path


def test_shrink_note_lists_only_what_changes(llama, tmp_path):
    proc = run("prune", llama, "-o", tmp_path / "heads", "--shrink", "--method", "ln_structured", "--amount", "0.5",
               "--groups", "heads")
    assert proc.returncode == 0, proc.stderr
    note = next(line for line in proc.stderr.splitlines() if "config.json rewritten" in line)
    assert "num_key_value_heads 2 -> 1" in note and "num_attention_heads 4 -> 2" in note, note
    assert "head_dim" not in note, note
    assert json.loads((tmp_path / "heads" / "config.json").read_text())["head_dim"] == 8


@pytest.mark.slow
def test_owl_without_calibration_notes_why_it_is_uniform(tmp_path):
    proc = run("prune", EXAMPLE, "-o", tmp_path / "o.onnx", "--amount", "0.5", "--allocation", "owl")
    assert proc.returncode == 0, proc.stderr
    assert "fc1.weight    50.00%" in proc.stdout and "fc2.weight    50.00%" in proc.stdout
    notes = [line for line in proc.stderr.splitlines() if "--allocation owl" in line]
    assert len(notes) == 1 and notes[0].startswith("arrayprune: note: "), proc.stderr
    for fragment in ("same outlier ratio (0.00%", "5 x their mean", "magnitudes alone", "uniform", "--calibration",
                     "--owl-m"):
        assert fragment in notes[0], notes[0]
    spread = run("prune", EXAMPLE, "-o", tmp_path / "s.onnx", "--amount", "0.5", "--allocation", "owl", "--owl-m", "2")
    assert spread.returncode == 0 and "uniform" not in spread.stderr
    assert "fc3.weight    42.03%" in spread.stdout


# --------------------------------------------------------------------------------------
# A full disk
# --------------------------------------------------------------------------------------


def _full_disk(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def _one_line_error(capsys, *fragments):
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("arrayprune: error: "), err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def _entries(folder):
    return sorted((str(p.relative_to(folder)), p.read_bytes() if p.is_file() else None) for p in folder.rglob("*"))


@pytest.mark.parametrize("step", ["shard", "copy"])
def test_full_disk_during_hf_shrink_is_one_line(llama, tmp_path, capsys, monkeypatch, step):
    import shutil

    from arrayprune.adapters.cli import main
    from arrayprune.adapters.formats import safetensors_stream

    out = tmp_path / "out"
    out.mkdir()
    (out / "config.json").write_text("old")
    before, parent = _entries(out), sorted(p.name for p in tmp_path.iterdir())
    if step == "shard":
        monkeypatch.setattr(safetensors_stream.TensorWriter, "write", _full_disk)
    else:
        monkeypatch.setattr(shutil, "copyfileobj", _full_disk)
    code = main(["prune", str(llama), "-o", str(out), "--shrink", "--method", "ln_structured", "--amount", "0.5",
                 "--force"])
    assert code == 2
    _one_line_error(capsys, str(out), "No space left on device")
    assert _entries(out) == before, "OUT intact"
    assert sorted(p.name for p in tmp_path.iterdir()) == parent, "nothing left behind"


def test_full_disk_during_calibrated_sparsegpt_is_one_line(llama, tmp_path, capsys, monkeypatch):
    from arrayprune.adapters.cli import main

    tokens = tmp_path / "tokens.npz"
    np.savez(tokens, input_ids=np.random.default_rng(0).integers(0, 64, size=(4, 8)))
    out = tmp_path / "out"
    before = sorted(p.name for p in tmp_path.iterdir())
    monkeypatch.setattr(np, "save", _full_disk)  # the pruned layers wait in a folder beside OUT
    code = main(["prune", str(llama), "-o", str(out), "--method", "sparsegpt", "--amount", "0.5", "--calibration",
                 str(tokens)])
    assert code == 2
    _one_line_error(capsys, str(out), "No space left on device")
    assert sorted(p.name for p in tmp_path.iterdir()) == before, "no OUT, nothing left behind"


# --------------------------------------------------------------------------------------
# Provenance
# --------------------------------------------------------------------------------------


def st_open(path):
    import safetensors

    return safetensors.safe_open(str(path), "np")


def _record(**more):
    import arrayprune

    return {"version": arrayprune.__version__, **more}


@pytest.mark.slow
def test_provenance_in_config_survives_transformers(llama, tmp_path):
    import hashlib

    tr = pytest.importorskip("transformers")
    tokens = tmp_path / "tokens.npz"
    np.savez(tokens, input_ids=np.random.default_rng(0).integers(0, 64, size=(4, 8)))
    out = tmp_path / "out"
    proc = run("prune", llama, "-o", out, "--method", "sparsegpt", "--amount", "0.5", "--calibration", tokens)
    assert proc.returncode == 0, proc.stderr
    want = _record(method="sparsegpt", amount="0.5", calibration_sha256=hashlib.sha256(tokens.read_bytes()).hexdigest())
    assert json.loads((out / "config.json").read_text())["arrayprune"] == want
    dense = json.loads((llama / "config.json").read_text())
    assert {k: v for k, v in json.loads((out / "config.json").read_text()).items() if k != "arrayprune"} == dense
    for shard in out.glob("*.safetensors"):
        with st_open(shard) as f:
            assert json.loads(f.metadata()["arrayprune"]) == want
    model, info = tr.AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert all(not v for v in info.values()), info
    assert model.config.arrayprune == want
    model.save_pretrained(tmp_path / "again")
    assert json.loads((tmp_path / "again" / "config.json").read_text())["arrayprune"] == want
    again = run("prune", llama, "-o", tmp_path / "out2", "--method", "sparsegpt", "--amount", "0.5", "--calibration",
                tokens)
    assert again.returncode == 0
    assert _entries(tmp_path / "out2") == _entries(out), "the same command writes the same bytes"


def test_provenance_of_a_shrunk_folder(llama, tmp_path):
    proc = run("prune", llama, "-o", tmp_path / "heads", "--shrink", "--method", "ln_structured", "--amount", "0.5",
               "--groups", "heads")
    assert proc.returncode == 0, proc.stderr
    config = json.loads((tmp_path / "heads" / "config.json").read_text())
    assert config["arrayprune"] == _record(method="ln_structured", amount="0.5", shrink="heads")
    assert config["num_key_value_heads"] == 1


@pytest.mark.slow
def test_provenance_in_onnx_and_safetensors_metadata(tmp_path):
    import onnx

    out = tmp_path / "o.onnx"
    assert run("prune", EXAMPLE, "-o", out, "--amount", "0.5", "--global").returncode == 0
    props = {p.key: p.value for p in onnx.load(str(out)).metadata_props}
    assert json.loads(props["arrayprune"]) == _record(method="l1_unstructured", amount="0.5", **{"global": "true"})
    first = out.read_bytes()
    assert run("prune", EXAMPLE, "-o", out, "--amount", "0.5", "--global", "--force").returncode == 0
    assert out.read_bytes() == first, "no timestamp: the same bytes"

    src = tmp_path / "m.safetensors"
    from safetensors.torch import save_file

    save_file({"fc.weight": torch.arange(16.0).reshape(4, 4)}, str(src), metadata={"format": "pt"})
    for extra in ([], ["--keep-masks"]):  # streamed, and the in-memory writer
        dst = tmp_path / f"p{len(extra)}.safetensors"
        assert run("prune", src, "-o", dst, "--amount", "0.25", *extra).returncode == 0
        with st_open(dst) as f:
            meta = f.metadata()
        assert meta["format"] == "pt"
        assert json.loads(meta["arrayprune"]) == _record(method="l1_unstructured", amount="0.25")
        assert list(header(dst)[0]["__metadata__"]) == ["arrayprune", "format"]  # as stored (safe_open: any order)
        first = dst.read_bytes()
        for _ in range(3):  # the safetensors package orders metadata keys at random: sorted here
            assert run("prune", src, "-o", dst, "--amount", "0.25", "--force", *extra).returncode == 0
            assert dst.read_bytes() == first, "the same command writes the same bytes"
