"""Sharded checkpoints and safetensors headers against hostile or unusual layouts.

Headers that claim more than the format allows, indexes nested too deeply, Hugging Face
cache snapshots (symlinks into ``blobs/``), and the atomic switch of an output folder.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from test_sharded import (
    OTHER_FILES,
    bits,
    cli,
    header,
    in_memory,
    llama_tensors,
    made,
    one_line_error,
    with_made,
    write_checkpoint,
)

from arrayprune.adapters.formats import FormatError, files, sharded
from arrayprune.adapters.formats.safetensors import HEADER_MAX_BYTES, read_header
from arrayprune.adapters.pipeline import prune_checkpoint
from arrayprune.adapters.provenance import as_text

pytest.importorskip("safetensors")
torch = pytest.importorskip("torch")
from safetensors.torch import load_file as load_torch  # noqa: E402
from safetensors.torch import save as save_torch  # noqa: E402

LIMITED = """
import resource, sys
limit = int(sys.argv[1]) << 20
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
from arrayprune.adapters.cli import main
sys.exit(main(sys.argv[2:]))
"""


def run_limited(mib, *args):
    """The command in a subprocess whose address space is limited to `mib` MiB."""
    return subprocess.run(
        [sys.executable, "-c", LIMITED, str(mib), *map(str, args)], capture_output=True, text=True, timeout=120
    )


def sparse_header_file(path, claimed=2 << 30):
    """A sparse file whose header length field says `claimed` bytes (the file is larger)."""
    with open(path, "wb") as f:
        f.write(claimed.to_bytes(8, "little"))
        f.write(b'{"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}')
        f.truncate(claimed + (1 << 30))
    return path


# --------------------------------------------------------------------------------------
# Header bound
# --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_header_larger_than_the_format_allows_is_refused_before_reading(tmp_path):
    big = sparse_header_file(tmp_path / "big.safetensors")
    src = write_checkpoint(tmp_path / "in", llama_tensors(layers=1), 2)
    shard = src / "model-00002-of-00002.safetensors"
    os.unlink(shard)
    sparse_header_file(shard)
    want = f"safetensors header of {2 << 30} bytes, larger than the format's limit of 100000000"
    assert HEADER_MAX_BYTES == 100_000_000
    with pytest.raises(FormatError, match="larger than the format's limit"):
        read_header(str(big))
    for args in (
        ["report", big],
        ["prune", big, "-o", tmp_path / "o.safetensors", "--amount", "0.5"],
        ["prune", big, "-o", tmp_path / "o.npz", "--amount", "0.5"],  # the in-memory reader
        ["prune", big, "--dry-run", "--amount", "0.5"],
        ["report", src],
        ["prune", src, "-o", tmp_path / "out", "--amount", "0.5"],
    ):
        proc = run_limited(1000, *args)  # reading the claimed header would need 2 GiB
        lines = proc.stderr.splitlines()
        assert proc.returncode == 2 and len(lines) == 1, (args, proc.stderr[-2000:])
        assert lines[0].startswith("arrayprune: error: ") and want in lines[0], lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.safetensors", "in"]


@pytest.mark.slow
def test_header_at_the_limit_is_read(tmp_path):
    """A header of exactly the limit is not refused for its size (here: padded JSON)."""
    body = b'{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
    path = tmp_path / "padded.safetensors"
    with open(path, "wb") as f:
        f.write(HEADER_MAX_BYTES.to_bytes(8, "little"))
        f.write(body + b" " * (HEADER_MAX_BYTES - len(body)))
        f.write(b"\x00\x00\x80\x3f")
    header = read_header(str(path))
    assert header.names == ["w"] and header.entries["w"] == ("F32", (1,), 8 + HEADER_MAX_BYTES, 12 + HEADER_MAX_BYTES)


# --------------------------------------------------------------------------------------
# Deeply nested index
# --------------------------------------------------------------------------------------


def test_deeply_nested_index_is_one_line(tmp_path, capsys):
    src = write_checkpoint(tmp_path / "in", llama_tensors(layers=1), 2)
    depth = 5000
    (src / "model.safetensors.index.json").write_text('{"weight_map": ' * depth + "{}" + "}" * depth)
    for args in (["prune", src, "-o", tmp_path / "out", "--amount", "0.5"], ["report", src],
                 ["prune", src, "--dry-run", "--amount", "0.5"]):
        assert cli(*args) == 2
        one_line_error(capsys, "model.safetensors.index.json: not a valid index: nested too deeply")
    assert not (tmp_path / "out").exists()
    with pytest.raises(FormatError, match="nested too deeply"):
        sharded.open_checkpoint(src)
    index = {"metadata": {"total_size": 1}, "weight_map": json.loads((src / "config.json").read_text())}
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    assert cli("report", src) == 2  # a shallow index is read as before
    one_line_error(capsys, "weight_map")


# --------------------------------------------------------------------------------------
# Hugging Face cache snapshots, and folders holding one safetensors file
# --------------------------------------------------------------------------------------


def cache_snapshot(cache, plain, repo="models--org--name", revision="0123abcd"):
    """A ``huggingface_hub`` cache layout of the files of folder `plain`.

    Every file becomes ``blobs/<sha256>`` and a relative symlink ``../../blobs/<sha256>``
    in ``snapshots/<revision>/``, as the hub's downloads are stored.
    """
    import hashlib

    blobs = cache / repo / "blobs"
    snap = cache / repo / "snapshots" / revision
    blobs.mkdir(parents=True, exist_ok=True)
    snap.mkdir(parents=True)
    for p in sorted(plain.iterdir()):
        data = p.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        os.symlink(os.path.join("..", "..", "blobs", digest), snap / p.name)
    (cache / repo / "refs").mkdir(exist_ok=True)
    (cache / repo / "refs" / "main").write_text(revision)
    return snap


def folder_bytes(folder):
    """Name to bytes of every entry of a folder; symlinks are refused (OUT is regular files)."""
    out = {}
    for p in sorted(Path(folder).iterdir()):
        assert not p.is_symlink() and p.is_file(), p
        out[p.name] = p.read_bytes()
    return out


def one_file_folder(folder, tensors):
    """How MiniLM and BERT ship: model.safetensors, config.json, tokenizer files."""
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(save_torch(tensors, metadata={"format": "pt"}))
    for name, data in OTHER_FILES.items():
        (folder / name).write_bytes(data)
    return folder


@pytest.mark.parametrize("layout", ["sharded", "one file"])
def test_cache_snapshot_is_pruned_like_a_plain_copy(tmp_path, capsys, layout):
    tensors = llama_tensors(layers=2, seed=3)
    if layout == "sharded":
        plain = write_checkpoint(tmp_path / "plain", tensors, 3)
    else:
        plain = one_file_folder(tmp_path / "plain", tensors)
    snap = cache_snapshot(tmp_path / "hub", plain)
    blobs = {p.name: p.read_bytes() for p in (tmp_path / "hub" / "models--org--name" / "blobs").iterdir()}
    args = ["--amount", "0.5", "--global"]
    assert cli("prune", plain, "-o", tmp_path / "want", *args) == 0
    assert cli("prune", snap, "-o", tmp_path / "got", *args) == 0
    said = capsys.readouterr().out
    assert folder_bytes(tmp_path / "got") == folder_bytes(tmp_path / "want")
    names = sorted(folder_bytes(tmp_path / "got"))
    if layout == "sharded":
        assert names == sorted([*OTHER_FILES, "model.safetensors.index.json", *(
            f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3))])
    else:
        assert names == sorted([*OTHER_FILES, "model.safetensors"])
        alone = tmp_path / "alone.safetensors"
        assert cli("prune", plain / "model.safetensors", "-o", alone, *args) == 0
        assert (tmp_path / "got" / "model.safetensors").read_bytes() == alone.read_bytes(), "pruned like the file"
        got = load_torch(str(alone))
        want, _ = in_memory(tensors, 0.5)
        for name, t in tensors.items():
            assert torch.equal(bits(got[name]), bits(want.get(name, t))), name
    assert "not copied" not in said
    assert {p.name: p.read_bytes() for p in (tmp_path / "hub" / "models--org--name" / "blobs").iterdir()} == blobs
    assert all(p.is_symlink() for p in snap.iterdir()), "the snapshot is left as it was"
    capsys.readouterr()
    for extra in ([], ["--force"]):  # the dry run and the report read the snapshot as the plain folder
        assert cli("prune", snap, "--dry-run", *args, *extra) == 0
        plan_snap = capsys.readouterr().out.split("\n", 1)[1]
        assert cli("prune", plain, "--dry-run", *args, *extra) == 0
        assert capsys.readouterr().out.split("\n", 1)[1] == plan_snap
    assert cli("report", snap, "--json") == 0
    report_snap = json.loads(capsys.readouterr().out)
    assert cli("report", plain, "--json") == 0
    report_plain = json.loads(capsys.readouterr().out)
    assert report_snap["tensors"] == report_plain["tensors"] and report_snap["total"] == report_plain["total"]
    assert report_snap["format"] == ("sharded safetensors" if layout == "sharded" else "safetensors folder")


@pytest.mark.parametrize("where", ["other repo", "outside the cache", "datasets repo", "blob folder"])
def test_cache_snapshot_symlink_leading_elsewhere_is_refused(tmp_path, capsys, where):
    plain = write_checkpoint(tmp_path / "plain", llama_tensors(layers=1), 2)
    cache = tmp_path / "hub"
    snap = cache_snapshot(cache, plain)
    other = cache_snapshot(cache, plain, repo="models--other--repo")
    shard = "model-00001-of-00002.safetensors"
    target = {
        "other repo": os.readlink(other / shard),  # ../../blobs/SHA of models--other--repo, reached from here
        "outside the cache": str(tmp_path / "outside.safetensors"),
        "datasets repo": os.path.join("..", "..", "..", "datasets--org--name", "blobs", "x"),
        "blob folder": os.path.join("..", "..", "blobs"),
    }[where]
    if where == "other repo":
        target = os.path.join("..", "..", "..", "models--other--repo", "blobs", os.path.basename(target))
    (tmp_path / "outside.safetensors").write_bytes((plain / shard).read_bytes())
    (cache / "datasets--org--name" / "blobs").mkdir(parents=True)
    (cache / "datasets--org--name" / "blobs" / "x").write_bytes((plain / shard).read_bytes())
    os.unlink(snap / shard)
    os.symlink(target, snap / shard)
    assert (snap / shard).exists()
    for args in (["prune", snap, "-o", tmp_path / "out", "--amount", "0.5"], ["report", snap],
                 ["prune", snap, "--dry-run", "--amount", "0.5"]):
        assert cli(*args) == 2
        one_line_error(capsys, shard, "symlink leading outside the checkpoint's folder")
    assert not (tmp_path / "out").exists()


def test_one_file_folder_and_folders_that_are_neither(tmp_path, capsys):
    tensors = llama_tensors(layers=1, seed=5)
    folder = one_file_folder(tmp_path / "minilm", tensors)
    (folder / ".gitattributes").write_text("*.safetensors filter=lfs")
    assert cli("prune", folder, "-o", tmp_path / "out", "--amount", "0.5") == 0
    said = capsys.readouterr().out
    assert "wrote 5 files" in said and ".gitattributes (hidden)" in said
    assert sorted(folder_bytes(tmp_path / "out")) == sorted([*OTHER_FILES, "model.safetensors"])
    for name, data in OTHER_FILES.items():
        assert (tmp_path / "out" / name).read_bytes() == with_made(name, data, made()), name
    assert cli("prune", folder / "model.safetensors", "-o", tmp_path / "one.safetensors", "--amount", "0.5") == 0
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == (tmp_path / "one.safetensors").read_bytes()
    capsys.readouterr()
    (folder / "extra.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    assert cli("report", folder) == 2
    one_line_error(capsys, str(folder), "several safetensors files (extra.safetensors, model.safetensors) and no index")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    assert cli("prune", empty, "-o", tmp_path / "out2", "--amount", "0.5") == 2
    one_line_error(capsys, "without a sharded safetensors index", "or a .safetensors file")
    assert not (tmp_path / "out2").exists()


# --------------------------------------------------------------------------------------
# The output folder is switched as a whole
# --------------------------------------------------------------------------------------

KILLED_AT = """
import os, signal, sys
from arrayprune.adapters.formats import files
from arrayprune.adapters.cli import main
at, how = sys.argv[1], sys.argv[2]
steps = []
def step(name):
    steps.append(name)
    print(name, flush=True)
    if name == at:
        os.kill(os.getpid(), signal.SIGKILL)
files._step = step
if how == "fallback":
    files._renameat2 = lambda *args: False
sys.exit(main(sys.argv[3:]))
"""

SHARDS3 = [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
STEPS = [*(f"shard {s}" for s in SHARDS3),  # config.json written with the provenance record, the rest copied
         *(f"{'write' if n == 'config.json' else 'copy'} {n}" for n in sorted(OTHER_FILES)),
         "copy model.safetensors.index.json", "complete", "switched", "removed"]


def killed_at(step, how, *args):
    return subprocess.run([sys.executable, "-c", KILLED_AT, step, how, *map(str, args)], capture_output=True,
                          text=True, timeout=120)


def without(folder, *names):
    return {k: v for k, v in folder_bytes(folder).items() if k not in names}


@pytest.mark.parametrize("how", ["exchange", "fallback"])
@pytest.mark.slow
def test_force_killed_after_each_step_leaves_old_or_new_whole(tmp_path, how):
    src = write_checkpoint(tmp_path / "in", llama_tensors(layers=2, seed=4), 3)
    work = tmp_path / "work"
    work.mkdir()
    out = work / "out"
    for amount, ref in (("0.3", tmp_path / "old"), ("0.6", tmp_path / "new")):
        assert cli("prune", src, "-o", ref, "--amount", amount) == 0
    old, new = folder_bytes(tmp_path / "old"), folder_bytes(tmp_path / "new")
    assert old != new
    steps = STEPS[:-2] + ["aside"] + STEPS[-2:] if how == "fallback" else STEPS
    shutil.copytree(tmp_path / "old", tmp_path / "probe")
    proc = killed_at("none", how, "prune", src, "-o", tmp_path / "probe", "--amount", "0.6", "--force")
    assert proc.returncode == 0, proc.stderr
    said = proc.stdout.split("\n")[: len(steps)]
    assert sorted(said[:3]) == steps[:3] and said[3:] == steps[3:], said  # shards in the index's order
    steps = said
    for i, step in enumerate(steps):
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(tmp_path / "old", out)
        (out / "keep.txt").write_text("mine")
        proc = killed_at(step, how, "prune", src, "-o", out, "--amount", "0.6", "--force")
        assert proc.returncode == -signal.SIGKILL, (step, proc.returncode, proc.stderr)
        if step == "aside":  # no exchange in one step here: the next run puts the old folder back
            assert not out.exists()
            assert cli("report", src) == 0
            proc = killed_at("complete", how, "prune", src, "-o", out, "--amount", "0.6", "--force")
            assert proc.returncode == -signal.SIGKILL
        want = new if i >= steps.index("switched") else old
        assert (out / "keep.txt").read_text() == "mine", step
        assert without(out, "keep.txt") == want, step
    assert cli("prune", src, "-o", out, "--amount", "0.6", "--force") == 0
    assert without(out, "keep.txt") == new
    assert sorted(p.name for p in work.iterdir()) == ["out"], "the next run removes what killed runs left"


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP", "SIGINT"])
@pytest.mark.parametrize("existing", [True, False])
def test_signal_after_the_first_shard_leaves_the_old_folder(tmp_path, signame, existing):
    signum = getattr(signal, signame)
    if signal.getsignal(signum) is signal.SIG_IGN:
        pytest.skip(f"{signame} is ignored here (nohup): the command inherits that")
    src = write_checkpoint(tmp_path / "in", llama_tensors(layers=2), 3)
    work = tmp_path / "work"
    work.mkdir()
    out = work / "out"
    if existing:
        assert cli("prune", src, "-o", out, "--amount", "0.3") == 0
    before = folder_bytes(out) if existing else None
    code = KILLED_AT.replace("os.kill(os.getpid(), signal.SIGKILL)",
                             "print('wait', flush=True); import time; time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code, f"shard {SHARDS3[0]}", "exchange", "prune", src, "-o", out,
                             "--amount", "0.6", "--force"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while proc.stdout.readline().strip() != "wait":
            pass
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == (130 if signame == "SIGINT" else 128 + signum), err
    if existing:
        assert folder_bytes(out) == before
        assert sorted(p.name for p in work.iterdir()) == ["out"]
    else:
        assert list(work.iterdir()) == [], "no one-shard, no-index folder"


def test_folder_named_like_a_shard_and_nul_in_a_shard_name(tmp_path, capsys):
    src = write_checkpoint(tmp_path / "in", llama_tensors(layers=1), 3)
    out = tmp_path / "out"
    assert cli("prune", src, "-o", out, "--amount", "0.3") == 0
    before = folder_bytes(out)
    os.unlink(out / SHARDS3[1])
    (out / SHARDS3[1]).mkdir()
    (out / SHARDS3[1] / "mine.txt").write_text("mine")
    capsys.readouterr()
    assert cli("prune", src, "-o", out, "--amount", "0.6", "--force") == 2
    one_line_error(capsys, str(out), f"holds a folder named {SHARDS3[1]!r}", "not replaced")
    assert (out / SHARDS3[1] / "mine.txt").read_text() == "mine"
    assert (out / SHARDS3[0]).read_bytes() == before[SHARDS3[0]]
    index = json.loads((src / "model.safetensors.index.json").read_text())
    index["weight_map"]["lm_head.weight"] = "model-00001\x00.safetensors"
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    for args in (["prune", src, "-o", tmp_path / "o2", "--amount", "0.5"], ["report", src]):
        assert cli(*args) == 2
        one_line_error(capsys, "shard 'model-00001\\x00.safetensors': a name holding a NUL byte")


def test_concurrent_writers_leave_one_whole_checkpoint(tmp_path):
    src = write_checkpoint(tmp_path / "in", llama_tensors(layers=3, hidden=64, inter=96), 3)
    refs = {}
    for amount in ("0.2", "0.7"):
        assert cli("prune", src, "-o", tmp_path / amount, "--amount", amount) == 0
        refs[amount] = folder_bytes(tmp_path / amount)
    work = tmp_path / "work"
    work.mkdir()
    out = work / "out"
    for force in ([], ["--force"]):
        for _ in range(3):
            if force:
                shutil.copytree(tmp_path / "0.2", out)  # both replace an existing OUT
            procs = [subprocess.Popen([sys.executable, "-m", "arrayprune", "prune", str(src), "-o", str(out),
                                       "--amount", amount, *force], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                     for amount in ("0.2", "0.7")]
            codes = [p.wait(timeout=120) for p in procs]
            assert folder_bytes(out) in (refs["0.2"], refs["0.7"]), "one whole checkpoint"
            assert sorted(p.name for p in work.iterdir()) == ["out"]
            if force:
                assert codes == [0, 0]  # each switched in a whole folder; the last one stays
            else:
                assert sorted(codes) == [0, 2], codes  # the second to finish finds OUT there
                assert folder_bytes(out) == refs["0.2" if codes[0] == 0 else "0.7"]
            shutil.rmtree(out)


def test_a_folder_switched_in_after_the_check_is_not_replaced_without_force(tmp_path, monkeypatch):
    """The race of the test above, made certain: OUT passed the check (absent), then another
    run switched its folder in before this one wrote. Without --force nothing is replaced."""
    src = write_checkpoint(tmp_path / "in", llama_tensors(layers=2, hidden=32, inter=48), 2)
    theirs = tmp_path / "theirs"
    assert cli("prune", src, "-o", theirs, "--amount", "0.7") == 0
    out = tmp_path / "out"
    check = sharded.check_destination

    def then_another_run_switches_in(dst, source, force):
        check(dst, source, force)
        shutil.copytree(theirs, dst)

    monkeypatch.setattr(sharded, "check_destination", then_another_run_switches_in)
    assert cli("prune", src, "-o", out, "--amount", "0.2") == 2
    assert folder_bytes(out) == folder_bytes(theirs)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "out", "theirs"]  # no hidden folder left
    shutil.rmtree(out)
    monkeypatch.setattr(sharded, "check_destination", check)
    with pytest.raises(FormatError, match="created by another process"):
        with files.replace_folder(theirs, replace=False):
            pass


# --------------------------------------------------------------------------------------
# Sharded in, one file out
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sharded_into_one_safetensors_file(tmp_path, capsys, dtype):
    tensors = llama_tensors(layers=2, dtype=dtype, seed=6)
    src = write_checkpoint(tmp_path / "in", tensors, 3)
    whole = tmp_path / "whole.safetensors"
    whole.write_bytes(save_torch(tensors, metadata={"format": "pt"}))
    merged = tmp_path / "merged.safetensors"
    assert cli("prune", src, "-o", merged, "--amount", "0.5", "--global") == 0
    assert "wrote one safetensors file holding the tensors of 3 shards" in capsys.readouterr().out
    assert merged.is_file(), "a file, never a folder with a file's name"
    got = load_torch(str(merged))
    want, _ = in_memory(tensors, 0.5)
    assert sorted(got) == sorted(tensors)
    for name, t in tensors.items():
        assert torch.equal(bits(got[name]), bits(want.get(name, t))), name
    metadata = {"format": "pt", "arrayprune": as_text(made(global_=True))}
    reference = tmp_path / "in" / "reference.safetensors"
    reference.write_bytes(save_torch({n: want.get(n, t).contiguous() for n, t in tensors.items()}, metadata=metadata))
    # safetensors orders two metadata keys at random (a Rust HashMap); we sort them: all else byte for byte
    (h_got, data_got), (h_want, data_want) = header(merged), header(reference)
    assert list(h_got) == list(h_want) and h_got == h_want, "what safetensors writes for the same tensors"
    assert list(h_got["__metadata__"]) == sorted(metadata) and data_got == data_want
    assert merged.stat().st_size == reference.stat().st_size
    reference.unlink()
    expected = merged.read_bytes()
    assert cli("prune", whole, "-o", tmp_path / "one.safetensors", "--amount", "0.5", "--global") == 0
    assert merged.read_bytes() == (tmp_path / "one.safetensors").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "merged.safetensors", "one.safetensors",
                                                          "whole.safetensors"]
    capsys.readouterr()
    assert cli("prune", src, "-o", merged, "--amount", "0.5") == 2
    one_line_error(capsys, str(merged), "exists; use --force")
    assert cli("prune", src, "-o", tmp_path / "merged.npz", "--amount", "0.5") == 2
    one_line_error(capsys, "written to a folder or to one .safetensors file")
    summary = prune_checkpoint(src, tmp_path / "api.safetensors", amount=0.5, global_=True)
    assert summary.files == [str(tmp_path / "api.safetensors")]
    assert (tmp_path / "api.safetensors").read_bytes() == expected


def test_onnx_external_data_in_a_cache_snapshot_subfolder(tmp_path):
    """``snapshots/<rev>/onnx/model.onnx`` and its data, both symlinks to ``../../../blobs/``."""
    import hashlib

    onnx = pytest.importorskip("onnx")
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    w = np.arange(1, 65, dtype=np.float32).reshape(8, 8) * np.float32(0.5 - 1 / 64)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="/fc/MatMul")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
        [numpy_helper.from_array(w, "W")],
    )
    plain = tmp_path / "plain"
    plain.mkdir()
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, plain / "model.onnx", save_as_external_data=True, location="model.onnx_data",
              size_threshold=0)
    repo = tmp_path / "hub" / "models--org--name"
    (repo / "blobs").mkdir(parents=True)
    sub = repo / "snapshots" / "0123abcd" / "onnx"
    sub.mkdir(parents=True)
    for p in sorted(plain.iterdir()):
        digest = hashlib.sha256(p.read_bytes()).hexdigest()
        (repo / "blobs" / digest).write_bytes(p.read_bytes())
        os.symlink(os.path.join("..", "..", "..", "blobs", digest), sub / p.name)
    assert cli("prune", plain / "model.onnx", "-o", tmp_path / "want.onnx", "--amount", "0.5") == 0
    assert cli("prune", sub / "model.onnx", "-o", tmp_path / "got.onnx", "--amount", "0.5") == 0
    got = numpy_helper.to_array(onnx.load(str(tmp_path / "got.onnx")).graph.initializer[0])
    want = numpy_helper.to_array(onnx.load(str(tmp_path / "want.onnx")).graph.initializer[0])
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, np.where(np.arange(64).reshape(8, 8) < 32, 0, w))  # the 32 smallest go

    # A data file leading into another repository's blobs is still refused.
    other = tmp_path / "hub" / "models--other--repo" / "blobs"
    other.mkdir(parents=True)
    (other / "x").write_bytes((plain / "model.onnx_data").read_bytes())
    (sub / "model.onnx_data").unlink()
    os.symlink(os.path.join("..", "..", "..", "..", "models--other--repo", "blobs", "x"), sub / "model.onnx_data")
    assert cli("prune", sub / "model.onnx", "-o", tmp_path / "bad.onnx", "--amount", "0.5") == 2
    assert not (tmp_path / "bad.onnx").exists()
