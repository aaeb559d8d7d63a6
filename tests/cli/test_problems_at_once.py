"""Every mistake the files' headers, ``config.json`` and the weight names can tell is
reported in one run, before a framework is imported.

A user who gets OUT, a calibration key, token ids and an ``--include`` pattern wrong
learns all four from one command, in under 2 s, not one per full model load: one error
(its first line counts the problems, then one line each), exit status 2, nothing
written. The command runs in a fresh interpreter whose ``sys.modules`` is checked.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_models import VOCAB, save_sharded_llama  # noqa: E402

HEAVY = ("torch", "transformers", "onnxruntime", "jax", "dask")

PROBE = """
import json, sys, time
start = time.perf_counter()
from arrayprune.adapters.cli import main
try:
    rc = main(sys.argv[1:])
except SystemExit as exc:
    rc = exc.code
print(json.dumps({"rc": rc, "seconds": time.perf_counter() - start,
                  "modules": sorted({m.split(".")[0] for m in sys.modules})}))
"""


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A sharded random-init Llama with grouped-query attention, saved by ``save_pretrained``."""
    return save_sharded_llama(tmp_path_factory.mktemp("llama") / "llama")


def _command(*args):
    """The command in a fresh interpreter: exit status, stderr, seconds, modules imported."""
    proc = subprocess.run([sys.executable, "-c", PROBE, *map(str, args)], capture_output=True, text=True, timeout=120)
    out = json.loads(proc.stdout.splitlines()[-1])
    return out["rc"], proc.stderr, out["seconds"], set(out["modules"])


def _snapshot(folder):
    return {n: (folder / n).read_bytes() for n in sorted(os.listdir(folder))}


@pytest.mark.parametrize("method", ["sparsegpt", "wanda"])
def test_four_mistakes_are_reported_in_one_run_without_torch(llama, tmp_path, method):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")  # OUT exists, no --force
    ids = np.random.default_rng(0).integers(0, VOCAB, (8, 12))
    ids[3, 4] = VOCAB + 72  # beyond the vocabulary
    tokens = tmp_path / "tokens.npz"
    np.savez(tokens, input_ids=ids, attention_msk=np.ones_like(ids))  # a misspelt key
    before = _snapshot(llama)

    rc, stderr, seconds, modules = _command(
        "prune",
        llama,
        "-o",
        out,
        "--method",
        method,
        "--amount",
        "0.5",
        "--calibration",
        tokens,
        "--include",
        "model.layers.*.mlp.gate_prj.weight",  # matches nothing
    )

    assert rc == 2, stderr
    assert "Traceback" not in stderr, stderr
    lines = stderr.splitlines()
    assert lines[0].startswith("arrayprune: error: "), stderr
    assert re.search(r"\b4\b", lines[0].replace(str(tmp_path), "")), lines[0]  # how many problems
    assert len(lines) == 5, stderr  # then one line each
    text = "\n".join(lines[1:])
    assert "exists" in text and "--force" in text, stderr
    assert "'attention_msk'" in text, stderr
    assert f"[0, {VOCAB})" in text and str(VOCAB + 72) in text, stderr
    assert "gate_prj" in text or "--include" in text, stderr
    assert not modules & set(HEAVY), sorted(modules & set(HEAVY))
    assert seconds < 2.0, seconds
    assert _snapshot(llama) == before
    assert sorted(os.listdir(out)) == ["keep.txt"]
    assert [n for n in os.listdir(tmp_path) if n.startswith(".")] == []


def test_one_mistake_is_still_one_line_without_torch(llama, tmp_path):
    """Token ids beyond the vocabulary alone: the one-line error, before torch is imported."""
    tokens = tmp_path / "tokens.npz"
    np.savez(tokens, input_ids=np.array([[1, 2, VOCAB]]))
    rc, stderr, seconds, modules = _command(
        "prune", llama, "-o", tmp_path / "out", "--method", "sparsegpt", "--amount", "0.5", "--calibration", tokens
    )
    assert rc == 2 and len(stderr.splitlines()) == 1, stderr
    assert f"token ids must be in [0, {VOCAB})" in stderr, stderr
    assert not modules & set(HEAVY), sorted(modules & set(HEAVY))
    assert seconds < 2.0, seconds
    assert not (tmp_path / "out").exists()


@pytest.fixture
def single(tmp_path):
    """Two weights as one .safetensors and one .npz file, and OUTs that exist."""
    st = pytest.importorskip("safetensors.numpy")
    rng = np.random.default_rng(0)
    w = {
        "a.weight": rng.standard_normal((8, 8)).astype(np.float32),
        "b.weight": rng.standard_normal((8, 16)).astype(np.float32),
    }
    st.save_file(w, str(tmp_path / "w.safetensors"))
    np.savez(tmp_path / "w.npz", **w)
    for name in ("out.safetensors", "out.npz"):
        (tmp_path / name).write_bytes(b"mine")
    norms = {"a.weight": np.ones(8), "b.weight": np.ones(16)}
    norms["b.weight"][5] = np.inf
    np.savez(tmp_path / "norms.npz", **norms)
    return tmp_path


def test_a_safetensors_file_reports_out_the_plan_and_the_norms_at_once(single):
    tmp_path = single
    rc, stderr, seconds, modules = _command(
        "prune", tmp_path / "w.safetensors", "-o", tmp_path / "out.safetensors", "--method", "wanda",
        "--amount", "0.5", "--input-norms", tmp_path / "norms.npz", "--include", "a.wieght",
    )  # fmt: skip
    assert rc == 2, stderr
    lines = stderr.splitlines()
    assert lines[0] == "arrayprune: error: 3 problems:", stderr
    assert "out.safetensors: exists; use --force" in lines[1]
    assert "w.safetensors: no tensor selected for pruning" in lines[2]
    assert "norms.npz: input norms 'b.weight'" in lines[3] and "1 infinite" in lines[3]
    assert not modules & set(HEAVY) and seconds < 2.0, (sorted(modules & set(HEAVY)), seconds)
    assert (tmp_path / "out.safetensors").read_bytes() == b"mine"


def test_a_dim_out_of_range_is_reported_with_out(single):
    tmp_path = single
    rc, stderr, _, _ = _command(
        "prune", tmp_path / "w.safetensors", "-o", tmp_path / "out.safetensors", "--method", "nm_structured",
        "--dim", "5",
    )  # fmt: skip
    lines = stderr.splitlines()
    assert rc == 2 and lines[0] == "arrayprune: error: 2 problems:", stderr
    assert "tensor 'a.weight'" in lines[2] and "Invalid index 5 for tensor of size (8, 8)" in lines[2]


def test_an_npz_reports_out_and_the_option_files_at_once(single):
    tmp_path = single
    (tmp_path / "scan.json").write_text('{"format": "arrayprune scan", "version": 1, "method": "l1_unstructured",'
                                        ' "sparsities": [0.5], "curves": [], "samples": 1e400}')  # fmt: skip
    rc, stderr, _, modules = _command(
        "prune", tmp_path / "w.npz", "-o", tmp_path / "out.npz", "--amount", "0.5",
        "--allocation", tmp_path / "scan.json",
    )  # fmt: skip
    lines = stderr.splitlines()
    assert rc == 2 and lines[0] == "arrayprune: error: 2 problems:", stderr
    assert "out.npz: exists" in lines[1] and "scan.json: " in lines[2] and "'samples'" in lines[2]
    rc, stderr, _, _ = _command(
        "prune", tmp_path / "w.npz", "-o", tmp_path / "out.npz", "--method", "wanda", "--amount", "0.5",
        "--input-norms", tmp_path / "nrms.npz",
    )  # fmt: skip
    lines = stderr.splitlines()
    assert rc == 2 and lines[0] == "arrayprune: error: 2 problems:", stderr
    assert "nrms.npz: No such file or directory" in lines[2]
    assert (tmp_path / "out.npz").read_bytes() == b"mine"


def test_sharded_input_norms_missing_a_weight_are_reported_with_out(llama, tmp_path):
    (tmp_path / "out").mkdir()
    np.savez(tmp_path / "norms.npz", **{"model.layers.0.self_attn.q_proj.weight": np.ones(64)})
    rc, stderr, _, modules = _command(
        "prune", llama, "-o", tmp_path / "out", "--method", "wanda", "--amount", "0.5",
        "--input-norms", tmp_path / "norms.npz",
    )  # fmt: skip
    lines = stderr.splitlines()
    assert rc == 2 and lines[0] == "arrayprune: error: 2 problems:", stderr
    assert "no input norms for 'model.layers.0.mlp.down_proj.weight' and 12 more (selected for pruning)" in lines[2]
    assert not modules & set(HEAVY)


def test_an_option_that_does_not_apply_is_reported_with_out_and_the_tokens(llama, tmp_path):
    (tmp_path / "out").mkdir()
    np.savez(tmp_path / "tokens.npz", input_ids=np.array([[1, 2, VOCAB + 5]]))
    rc, stderr, seconds, modules = _command(
        "prune", llama, "-o", tmp_path / "out", "--method", "sparsegpt", "--amount", "0.5", "--dim", "0",
        "--calibration", tmp_path / "tokens.npz",
    )  # fmt: skip
    lines = stderr.splitlines()
    assert rc == 2 and lines[0] == "arrayprune: error: 3 problems:", stderr
    assert "out: exists; use --force" in lines[1]
    assert "--dim does not apply to sparsegpt" in lines[2]
    assert f"token ids must be in [0, {VOCAB})" in lines[3] and f"{VOCAB + 5}" in lines[3]
    assert not modules & set(HEAVY) and seconds < 2.0
