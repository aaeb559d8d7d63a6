"""End-to-end tests of the ``arrayprune`` command, run in a subprocess."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import arrayprune as ap
from arrayprune.adapters import cli
from arrayprune.adapters import formats as fmt
from cli_helpers import EXAMPLE, assert_error, run

WEIGHTS = ["fc1.weight", "fc2.weight", "fc3.weight"]


def sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


@pytest.fixture
def model(tmp_path):
    dst = tmp_path / "mlp.onnx"
    shutil.copyfile(EXAMPLE, dst)
    return dst


def _rand(shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


# --------------------------------------------------------------------------------------
# prune: results
# --------------------------------------------------------------------------------------


def test_global_prune_of_the_example_equals_the_core(model, tmp_path):
    before = sha(model)
    out = tmp_path / "pruned.onnx"
    proc = run("prune", model, "-o", out, "--amount", "0.5", "--global")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "", "no progress bar or warnings when stderr is not a terminal"
    assert "42240 of 84480" in proc.stdout and str(out) in proc.stdout
    assert sha(model) == before, "IN must stay byte-identical"

    original = fmt.load(model).params
    pruned = fmt.load(out).params
    masks = ap.global_unstructured([original[k] for k in WEIGHTS], ap.L1Unstructured, amount=0.5)
    for k, m in zip(WEIGHTS, masks, strict=True):
        np.testing.assert_array_equal(pruned[k], original[k] * m.astype(np.float32), err_msg=k)
    assert sum(int((pruned[k] == 0).sum()) for k in WEIGHTS) == round(0.5 * 84480)
    for k in ("fc1.bias", "fc2.bias", "fc3.bias"):
        np.testing.assert_array_equal(pruned[k], original[k])
    # the graph is that of the input
    import onnx

    a, b = onnx.load(str(model)), onnx.load(str(out))
    assert [n.op_type for n in a.graph.node] == [n.op_type for n in b.graph.node]


def test_layerwise_prune_counts_per_tensor(model, tmp_path):
    out = tmp_path / "p.npz"
    proc = run("prune", model, "-o", out, "--amount", "0.3")
    assert proc.returncode == 0, proc.stderr
    got = np.load(out)
    assert sorted(got.files) == sorted(["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias"])
    for k in WEIGHTS:
        assert int((got[k] == 0).sum()) == round(0.3 * got[k].size), k
    assert int((got["fc1.bias"] == 0).sum()) == 0


@pytest.mark.slow
def test_keep_masks_writes_the_convention_and_iterates(model, tmp_path):
    original = fmt.load(model).params
    first = tmp_path / "masks.npz"
    proc = run("prune", model, "-o", first, "--amount", "0.3", "--keep-masks")
    assert proc.returncode == 0, proc.stderr
    z = dict(np.load(first))
    assert set(z) == {f"{k}{s}" for k in WEIGHTS for s in ("_orig", "_mask")} | {"fc1.bias", "fc2.bias", "fc3.bias"}
    for k in WEIGHTS:
        np.testing.assert_array_equal(z[k + "_orig"], original[k])
        assert z[k + "_mask"].dtype == np.float32
        assert int((z[k + "_mask"] == 0).sum()) == round(0.3 * original[k].size)
        np.testing.assert_array_equal(z[k + "_mask"], ap.l1_unstructured(original[k], 0.3).astype(np.float32))

    second = tmp_path / "masks2.safetensors"
    proc = run("prune", first, "-o", second, "--amount", "0.5", "--keep-masks")
    assert proc.returncode == 0, proc.stderr
    z2 = fmt.load(second).params
    for k in WEIGHTS:
        n = original[k].size
        left = n - round(0.3 * n)
        assert int((z2[k + "_mask"] == 0).sum()) == round(0.3 * n) + round(0.5 * left), k
        assert np.all(z2[k + "_mask"] <= z[k + "_mask"])

    folded = tmp_path / "folded.npz"
    assert run("prune", second, "-o", folded, "--amount", "0").returncode == 0
    f = np.load(folded)
    assert sorted(f.files) == sorted(original)
    np.testing.assert_array_equal(f["fc2.weight"], original["fc2.weight"] * z2["fc2.weight_mask"])

    report = json.loads(run("report", second, "--json").stdout)
    row = {r["name"]: r for r in report["tensors"]}["fc2.weight"]
    assert row["masked"] is True and row["zeros"] == int((z2["fc2.weight_mask"] == 0).sum())


def test_keep_masks_to_onnx_is_refused(model, tmp_path):
    out = tmp_path / "x.onnx"
    assert_error(run("prune", model, "-o", out, "--amount", "0.5", "--keep-masks"), "--keep-masks", out)
    assert not out.exists()


@pytest.mark.slow
def test_structured_pruning_of_a_torch_state_dict(tmp_path):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 12), torch.nn.LayerNorm(12), torch.nn.Linear(12, 8))
    src = tmp_path / "net.pt"
    torch.save(net.state_dict(), src)
    out = tmp_path / "net-pruned.pt"
    proc = run("prune", src, "-o", out, "--method", "ln_structured", "--amount", "0.25", "--dim", "0", "--n", "1")
    assert proc.returncode == 0, proc.stderr
    sd = torch.load(out, weights_only=True)
    assert set(sd) == set(net.state_dict())
    for k, rows in (("0.weight", 12), ("2.weight", 8)):
        zero_rows = int((sd[k].abs().sum(dim=1) == 0).sum())
        assert zero_rows == round(0.25 * rows), k
        keep = ap.ln_structured(net.state_dict()[k].numpy(), 0.25, 1, 0)
        np.testing.assert_array_equal(sd[k].numpy(), net.state_dict()[k].numpy() * keep)
    torch.testing.assert_close(sd["1.weight"], net.state_dict()["1.weight"], rtol=0, atol=0)

    # --keep-masks output loads into a module pruned with torch.nn.utils.prune
    kept = tmp_path / "kept.pt"
    proc = run(
        "prune", src, "-o", kept, "--method", "random_structured", "--amount", "0.5", "--seed", "3", "--keep-masks"
    )
    assert proc.returncode == 0, proc.stderr
    import torch.nn.utils.prune as tprune

    fresh = torch.nn.Sequential(torch.nn.Linear(16, 12), torch.nn.LayerNorm(12), torch.nn.Linear(12, 8))
    tprune.identity(fresh[0], "weight")
    tprune.identity(fresh[2], "weight")
    fresh.load_state_dict(torch.load(kept, weights_only=True))
    assert int((fresh[0].weight_mask.sum(dim=1) == 0).sum()) == 6

    # a 1-D tensor included explicitly cannot take structured pruning
    bad = run(
        "prune", src, "-o", tmp_path / "b.pt", "--method", "ln_structured", "--amount", "0.5", "--include", "*.bias"
    )
    assert_error(bad, src, "0.bias", "multidimensional")


@pytest.mark.slow
def test_selection_include_exclude_min_size(tmp_path):
    src = tmp_path / "w.npz"
    arrays = {
        "a.weight": _rand((4, 4), 1),
        "b.weight": _rand((10, 10), 2),
        "norm.weight": _rand((10,), 3),
        "b.bias": _rand((10,), 4),
        "ids": np.arange(20).reshape(4, 5),
    }
    np.savez(src, **arrays)

    def zeros_after(*extra):
        out = tmp_path / "o.npz"
        proc = run("prune", src, "-o", out, "--amount", "0.5", "--force", *extra)
        assert proc.returncode == 0, proc.stderr
        z = np.load(out)
        return {k: int((z[k] == 0).sum()) for k in arrays}

    base = {k: int((v == 0).sum()) for k, v in arrays.items()}
    assert zeros_after() == {**base, "a.weight": 8, "b.weight": 50}
    assert zeros_after("--exclude", "b.*") == {**base, "a.weight": 8}
    assert zeros_after("--include", "norm.*", "*.bias") == {**base, "norm.weight": 5, "b.bias": 5}
    assert zeros_after("--min-size", "50") == {**base, "b.weight": 50}
    none = run("prune", src, "-o", tmp_path / "n.npz", "--amount", "0.5", "--include", "nothing*")
    assert_error(none, src, "no tensor selected")


@pytest.mark.slow
def test_random_unstructured_seeded_runs_repeat(model, tmp_path):
    outs = []
    for i, seed in enumerate((7, 7, 8)):
        out = tmp_path / f"r{i}.npz"
        proc = run("prune", model, "-o", out, "--method", "random_unstructured", "--amount", "0.4", "--seed", seed)
        assert proc.returncode == 0, proc.stderr
        outs.append(np.load(out))
    for k in WEIGHTS:
        np.testing.assert_array_equal(outs[0][k], outs[1][k])
        assert not np.array_equal(outs[0][k] == 0, outs[2][k] == 0)
        assert int((outs[0][k] == 0).sum()) == round(0.4 * outs[0][k].size)
    glob = tmp_path / "g.npz"
    proc = run(
        "prune", model, "-o", glob, "--method", "random_unstructured", "--amount", "0.4", "--seed", "1", "--global"
    )
    assert proc.returncode == 0, proc.stderr
    g = np.load(glob)
    assert sum(int((g[k] == 0).sum()) for k in WEIGHTS) == round(0.4 * 84480)


@pytest.mark.slow
def test_verify_reports_the_output_difference(model, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    same = run("prune", model, "-o", tmp_path / "same.onnx", "--amount", "0", "--verify")
    assert same.returncode == 0, same.stderr
    assert "max abs output difference 0, " in same.stdout
    out = tmp_path / "half.onnx"
    proc = run("prune", model, "-o", out, "--amount", "0.5", "--global", "--verify", "--seed", "5")
    assert proc.returncode == 0, proc.stderr
    printed = float(proc.stdout.split("max abs output difference ")[1].split(",")[0])
    x = np.random.default_rng(cli.stream_seed(5, "verify")).standard_normal((1, 64)).astype(np.float32)
    ya, yb = (
        ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
        for p in (model, out)
    )
    assert printed > 0 and printed == pytest.approx(float(np.abs(ya - yb).max()), rel=1e-5)
    assert_error(run("prune", model, "-o", tmp_path / "v.npz", "--amount", "0.5", "--verify"), "--verify")


# --------------------------------------------------------------------------------------
# prune: refusals
# --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_existing_output_and_input_as_output_are_refused(model, tmp_path):
    out = tmp_path / "out.onnx"
    out.write_bytes(b"keep me")
    assert_error(run("prune", model, "-o", out, "--amount", "0.5"), out, "exists", "--force")
    assert out.read_bytes() == b"keep me"
    assert run("prune", model, "-o", out, "--amount", "0.5", "--force").returncode == 0
    assert fmt.detect_format(out) == "onnx"

    before = sha(model)
    assert_error(run("prune", model, "-o", model, "--amount", "0.5"), model, "input file")
    assert sha(model) == before
    link = tmp_path / "same-file.onnx"
    os.link(model, link)
    assert_error(run("prune", model, "-o", link, "--amount", "0.5"), "input file")
    proc = run("prune", model, "-o", model, "--amount", "0.5", "--force")
    assert proc.returncode == 0, proc.stderr
    assert int((fmt.load(model).params["fc2.weight"] == 0).sum()) == 32768
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlp.onnx", "out.onnx", "same-file.onnx"], (
        "no temp files left"
    )


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["--amount", "1.5"], ["--amount", "1.5"]),
        (["--amount", "half"], ["amount", "half"]),
        (["--amount", "0.5", "--method", "ln_structured", "--global"], ["--global", "unstructured"]),
        (["--amount", "0.5", "--method", "nope"], ["--method", "nope"]),
        (["--amount", "100000"], ["100000", "should be smaller"]),
        (["--amount", "0.5", "--dim", "5", "--method", "ln_structured"], ["fc1.weight", "Invalid index 5"]),
        ([], ["--amount"]),
    ],
)
def test_bad_options_are_one_line_errors(model, tmp_path, args, fragments):
    out = tmp_path / "o.onnx"
    assert_error(run("prune", model, "-o", out, *args), *fragments)
    assert not out.exists()


@pytest.mark.slow
def test_missing_and_unreadable_inputs(tmp_path):
    assert_error(
        run("prune", tmp_path / "nope.onnx", "-o", tmp_path / "o.onnx", "--amount", "0.5"), "nope.onnx", "no such file"
    )
    assert_error(run("report", tmp_path / "nope.npz"), "nope.npz", "no such file")
    assert_error(run("report", tmp_path), "is a directory")
    assert_error(run("frobnicate"), "invalid choice")


def _damaged_files(tmp_path):
    from safetensors.numpy import save_file

    arrays = {"w": _rand((32, 32), 0)}
    np.savez(tmp_path / "ok.npz", **arrays)
    save_file(arrays, str(tmp_path / "ok.safetensors"))
    files = {}
    for name in ("ok.npz", "ok.safetensors"):
        data = (tmp_path / name).read_bytes()
        files["truncated-" + name] = data[: len(data) // 2]
    files["truncated.onnx"] = open(EXAMPLE, "rb").read()[:50000]
    files["garbage.onnx"] = os.urandom(3000)
    files["garbage.bin"] = b"\x00\x01garbage" * 100
    files["empty.npz"] = b""
    files["text.safetensors"] = b"hello, I am not a model"
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    return list(files)


@pytest.mark.slow
def test_corrupt_and_truncated_files_are_refused(tmp_path, capsys):
    from arrayprune.adapters.cli import main

    for name in _damaged_files(tmp_path):
        path = tmp_path / name
        before = sha(path)
        out = tmp_path / ("out-" + name)
        assert_error(run("prune", path, "-o", out, "--amount", "0.5"), path)
        assert not out.exists()
        assert sha(path) == before
        assert main(["report", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"arrayprune: error: {path}: ") and err.count("\n") == 1


@pytest.mark.parametrize("where", ["../secret.bin", "absolute"])
@pytest.mark.slow
def test_onnx_external_data_outside_the_folder_is_refused(tmp_path, where):
    import onnx

    folder = tmp_path / "model"
    folder.mkdir()
    proto = onnx.load(EXAMPLE)
    onnx.save_model(
        proto,
        str(folder / "m.onnx"),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="w.bin",
        size_threshold=0,
    )
    secret = tmp_path / "secret.bin"
    secret.write_bytes((folder / "w.bin").read_bytes())
    location = str(secret) if where == "absolute" else where
    proto = onnx.load_model(str(folder / "m.onnx"), load_external_data=False)
    for t in proto.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = location
    evil = folder / "evil.onnx"
    evil.write_bytes(proto.SerializeToString())
    out = tmp_path / "out.onnx"
    line = assert_error(run("prune", evil, "-o", out, "--amount", "0.5"), evil, location)
    assert ("absolute" if where == "absolute" else "outside") in line
    assert not out.exists()
    assert_error(run("report", evil), evil)

    # the legitimate version next to it works, and its output keeps external data beside it
    ok_out = tmp_path / "ok.onnx"
    proc = run("prune", folder / "m.onnx", "-o", ok_out, "--amount", "0.5", "--verify")
    assert proc.returncode == 0, proc.stderr
    assert len(list(tmp_path.glob("ok.onnx.*.data"))) == 1


@pytest.mark.slow
def test_pickle_that_would_run_code_is_refused_without_running(tmp_path):
    torch = pytest.importorskip("torch")
    marker = tmp_path / "marker"
    # the pickle refers to os.system only (not to this test module): loading it anywhere runs the command
    torch.save({"w": torch.ones(3, 3), "evil": _Evil(marker)}, tmp_path / "evil.pt")
    assert not marker.exists()
    out = tmp_path / "out.pt"
    line = assert_error(run("prune", tmp_path / "evil.pt", "-o", out, "--amount", "0.5"), "evil.pt", "refused")
    assert "system" in line
    assert not marker.exists() and not out.exists()
    from arrayprune.adapters.cli import main

    assert main(["report", str(tmp_path / "evil.pt")]) == 2
    assert not marker.exists()


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


# --------------------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_report_json_values_are_exact(model, tmp_path):
    out = tmp_path / "p.safetensors"
    assert run("prune", model, "-o", out, "--amount", "0.25").returncode == 0
    proc = run("report", out, "--json")
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    assert rep["format"] == "safetensors" and rep["file"] == str(out)
    arrays = fmt.load(out).params
    assert [r["name"] for r in rep["tensors"]] == list(arrays)
    for r in rep["tensors"]:
        a = np.asarray(arrays[r["name"]])
        assert r["shape"] == list(a.shape) and r["dtype"] == "float32" and r["size"] == a.size
        assert r["zeros"] == int((a == 0).sum()) and r["sparsity"] == r["zeros"] / a.size and r["masked"] is False
        if r["name"].endswith("weight"):
            assert r["zeros"] == round(0.25 * a.size)
    assert [r["name"] for r in rep["tensors"] if r["prunable"]] == ["fc1.weight", "fc2.weight", "fc3.weight"]
    assert {r["reason"] for r in rep["tensors"] if not r["prunable"]} == {"not a layer weight (name ends in bias)"}
    assert {r["name"]: r["role"] for r in rep["tensors"]} == {
        f"fc{i}.{k}": k for i in (1, 2, 3) for k in ("weight", "bias")
    }
    assert rep["prunable"]["tensors"] == 3 and rep["prunable"]["size"] == 84480 and rep["prunable"]["zeros"] == 21120
    assert set(rep["covers"]) == {"total", "prunable"}
    total = rep["total"]
    nnz = 85002 - (4096 + 16384 + 640)
    assert total == {
        "tensors": 6,
        "size": 85002,
        "zeros": 4096 + 16384 + 640,
        "sparsity": (4096 + 16384 + 640) / 85002,
        "bytes": {
            "dense": 85002 * 4,
            # CSR over (rows, -1) views: values and int32 column indices, row pointers
            "csr": nnz * 8 + (256 + 1) * 4 + (256 + 1) * 4 + (10 + 1) * 4 + 3 * (1 + 1) * 4,
            "bitmask": nnz * 4 + sum(-(-n // 8) for n in (16384, 256, 65536, 256, 2560, 10)),
            "semi_structured_2_4": 85002 * 4,  # no tensor is 2:4 sparse: all dense
        },
    }
    text = run("report", out)
    assert text.returncode == 0
    lines = text.stdout.splitlines()
    assert lines[0] == f"{out} (safetensors)"
    assert lines[1].split() == ["name", "shape", "dtype", "role", "zeros", "sparsity", "2:4", "prunable"]
    row = ["fc2.weight", "256x256", "float32", "weight", "16384/65536", "25.00%", "no", "yes"]
    assert any(ln.split() == row for ln in lines)
    row = ["fc2.bias", "256", "float32", "bias", "0/256", "0.00%", "no", "no:", "not", "a", "layer", "weight"]
    assert any(ln.split()[: len(row)] == row for ln in lines)
    assert lines[-4].split() == ["prunable", "3", "tensors", "21120/84480", "25.00%"]
    assert lines[-3].split() == ["total", "6", "tensors", "21120/85002", "24.85%"]
    assert lines[-1].startswith("storage: dense 0.32 MiB, CSR 0.49 MiB")


# --------------------------------------------------------------------------------------
# terminal niceties and entry points
# --------------------------------------------------------------------------------------


def test_progress_bar_only_on_a_terminal(model, tmp_path):
    pytest.importorskip("tqdm")
    import fcntl
    import pty
    import select
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # tqdm draws nothing at 0 columns
    chunks = []
    try:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "arrayprune",
                "prune",
                str(model),
                "-o",
                str(tmp_path / "t.onnx"),
                "--amount",
                "0.5",
            ],
            stdout=subprocess.DEVNULL,
            stderr=slave,
        )
        os.close(slave)
        while True:
            ready, _, _ = select.select([master], [], [], 60)
            if not ready:
                break
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        assert proc.wait(timeout=120) == 0
    finally:
        os.close(master)
    assert b"pruning" in b"".join(chunks) and b"tensor" in b"".join(chunks)


def test_console_script_and_version():
    proc = run("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"arrayprune {ap.__version__}"
    script = os.path.join(os.path.dirname(sys.executable), "arrayprune")
    if not os.path.exists(script):
        pytest.skip("console script not installed next to this interpreter")
    proc = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "prune" in proc.stdout and "report" in proc.stdout


def test_main_in_process_returns_status(model, tmp_path, capsys):
    from arrayprune.adapters.cli import main

    assert main(["report", str(model), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["total"]["zeros"] == 0
    assert main(["prune", str(model), "-o", str(tmp_path / "x.onnx")]) == 2
    assert capsys.readouterr().err.startswith("arrayprune: error: ")


# --------------------------------------------------------------------------------------
# Folding directly (boolean masks) gives what the mask convention folds to
# --------------------------------------------------------------------------------------

FOLD_CASES = [
    ["--amount", "0.4"],
    ["--amount", "0.4", "--method", "random_unstructured", "--seed", "7"],
    ["--amount", "0.3", "--method", "ln_structured", "--n", "1", "--dim", "1"],
    ["--amount", "0.3", "--method", "random_structured", "--seed", "7"],
    ["--method", "nm_structured", "--nm", "2:4"],
    ["--amount", "0.5", "--method", "block_unstructured", "--block", "2x4"],
    ["--amount", "0.6", "--global"],
    ["--amount", "0.6", "--global", "--max-sparsity", "0.7", "--lamp"],
    ["--amount", "0.6", "--global", "--method", "random_unstructured", "--seed", "3"],
]


@pytest.mark.parametrize("options", FOLD_CASES, ids=" ".join)
@pytest.mark.parametrize("suffix", [".npz", ".pt"])
def test_folded_output_equals_the_folded_masks(tmp_path, options, suffix):
    """Without --keep-masks the masks are never stored; the weights are the same."""
    from arrayprune.adapters import cli
    from arrayprune.adapters import mapping as mp

    weights = {"a.weight": _rand((8, 16), 1), "b.weight": _rand((12, 8), 2), "b.bias": _rand(12, 3)}
    weights["a.weight"][0, :6] = 0.0  # ties at zero
    src = tmp_path / ("w" + suffix)
    if suffix == ".pt":
        torch = pytest.importorskip("torch")
        torch.save({k: torch.from_numpy(v) for k, v in weights.items()}, src)
    else:
        np.savez(src, **weights)
    folded, masked = tmp_path / ("f" + suffix), tmp_path / ("m" + suffix)
    assert cli.main(["prune", str(src), "-o", str(folded), *options]) == 0
    assert cli.main(["prune", str(src), "-o", str(masked), "--keep-masks", *options]) == 0
    ours = fmt.load(folded).params
    reference = mp.apply_masks(fmt.load(masked).params)
    assert list(ours) == list(reference) == list(weights)
    for k in weights:
        a, b = fmt.to_numpy(ours[k]), fmt.to_numpy(reference[k])
        assert a.dtype == b.dtype == np.float32
        np.testing.assert_array_equal(a, b)
    assert int((fmt.to_numpy(ours["a.weight"]) == 0).sum()) > 6
    np.testing.assert_array_equal(fmt.to_numpy(ours["b.bias"]), weights["b.bias"])
