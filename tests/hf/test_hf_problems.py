"""``prune HF_FOLDER --calibration tokens.npz``: every mistake the headers, ``config.json``
and the tokens can tell is reported at once, before PyTorch is imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from arrayprune.adapters import prune_file  # noqa: E402
from arrayprune.adapters.pipeline.request import PruneProblems  # noqa: E402
from cli_helpers import run  # noqa: E402
from hf_models import VOCAB, llama_config, save_sharded_llama  # noqa: E402

PROBE = """
import json, sys, time
from arrayprune.adapters.cli import main
start = time.perf_counter()
rc = main(sys.argv[1:])
seconds = time.perf_counter() - start
print(json.dumps({"rc": rc, "seconds": seconds, "modules": sorted({m.split(".")[0] for m in sys.modules})}))
"""


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    root = tmp_path_factory.mktemp("llama")
    return save_sharded_llama(root / "llama", llama_config(hidden=32, inner=64, positions=32), shard="50KB")


def mistakes(tmp_path):
    """OUT exists (no --force), ids beyond the vocabulary, a misspelt key, a pattern matching nothing."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("mine")
    np.savez(tmp_path / "tokens.npz", input_ids=np.array([[1, 2, VOCAB + 5]]), attention_masc=np.ones((1, 3)))
    return out, tmp_path / "tokens.npz"


def test_every_mistake_is_reported_in_one_run(llama, tmp_path):
    out, tokens = mistakes(tmp_path)
    args = ["--method", "sparsegpt", "--amount", "0.5", "--calibration", tokens, "--include", "*.nope"]
    proc = run("prune", llama, "-o", out, *args)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0] == "arrayprune: error: 4 problems:", proc.stderr
    assert len(lines) == 5, proc.stderr
    assert f"{out}: exists; use --force" in lines[1]
    assert "no tensor selected for pruning" in lines[2]
    assert f"{tokens}: unexpected array 'attention_masc'" in lines[3]
    assert f"{tokens}: token ids must be in [0, {VOCAB})" in lines[4] and "holds 1..133" in lines[4]
    assert os.listdir(out) == ["mine.txt"]

    with pytest.raises(PruneProblems) as info:
        prune_file(llama, out, method="sparsegpt", amount=0.5, calibration=tokens, include="*.nope")
    assert len(info.value.problems) == 4
    assert str(info.value).splitlines()[0] == "4 problems:"


def test_config_json_that_cannot_be_read_is_one_of_the_problems(llama, tmp_path):
    import shutil

    src = tmp_path / "copy"
    shutil.copytree(llama, src)
    (src / "config.json").write_text("{" * 10)
    out, tokens = mistakes(tmp_path)
    proc = run("prune", src, "-o", out, "--method", "wanda", "--amount", "0.5", "--calibration", tokens)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and lines[0] == "arrayprune: error: 3 problems:", proc.stderr
    assert "config.json: not a valid config.json" in lines[2]
    assert "unexpected array 'attention_masc'" in lines[3]  # the vocabulary unknown: the range is not checked


@pytest.mark.parametrize("case", ["misspelt path", "several"])
def test_calibration_checks_fail_fast_without_importing_torch(llama, tmp_path, case):
    out, tokens = mistakes(tmp_path)
    if case == "misspelt path":
        tokens, out = tmp_path / "tokns.npz", tmp_path / "new"
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, "prune", str(llama), "-o", str(out), "--method", "sparsegpt",
         "--amount", "0.5", "--calibration", str(tokens)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["rc"] == 2, proc.stderr
    assert "torch" not in result["modules"] and "transformers" not in result["modules"]
    assert result["seconds"] < 2.0, result["seconds"]
    if case == "misspelt path":
        assert proc.stderr == f"arrayprune: error: {tokens}: No such file or directory\n"
    else:
        assert proc.stderr.splitlines()[0] == "arrayprune: error: 3 problems:", proc.stderr


def test_a_single_safetensors_file_of_a_folder_reports_its_problems_together(llama, tmp_path):
    model = transformers.LlamaForCausalLM.from_pretrained(llama)
    folder = tmp_path / "single"
    model.save_pretrained(folder)
    src = folder / "model.safetensors"
    assert src.exists()
    _, tokens = mistakes(tmp_path)
    out = tmp_path / "out.safetensors"
    out.write_text("mine")
    proc = run("prune", src, "-o", out, "--method", "sparsegpt", "--amount", "0.5", "--calibration", tokens)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and lines[0] == "arrayprune: error: 3 problems:", proc.stderr
    assert f"{out}: exists; use --force" in lines[1]
    assert "unexpected array 'attention_masc'" in lines[2] and "token ids must be in [0, 128)" in lines[3]
    assert out.read_text() == "mine"
