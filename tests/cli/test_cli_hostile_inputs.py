"""The command line on hostile and careless input: trees that never end, tied weights,
seeds of any size, options that do not apply, --verify's verdict, report's coverage.

Every case runs ``python -m arrayprune`` as a subprocess: an error is exit status 2 and
one line on stderr, and nothing is written.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

import arrayprune as ap
from arrayprune.adapters import cli
from cli_helpers import EXAMPLE, assert_error, run

torch = pytest.importorskip("torch")



def rand(shape, seed=0):
    return torch.from_numpy(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


@pytest.fixture
def model(tmp_path):
    dst = tmp_path / "mlp.onnx"
    shutil.copyfile(EXAMPLE, dst)
    return dst


# --------------------------------------------------------------------------------------
# trees that never end
# --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_shared_reference_bomb_is_refused_quickly(tmp_path):
    node = {"w": rand((4, 4))}
    for _ in range(40):  # 2**40 paths through 41 dicts
        node = {"a": node, "b": node}
    src = tmp_path / "bomb.pt"
    torch.save(node, src)
    assert src.stat().st_size < 8192
    for argv in (("prune", src, "-o", tmp_path / "out.pt", "--amount", "0.5"), ("report", src)):
        proc = run(*argv, timeout=60)
        assert_error(proc, "bomb.pt", "more than 1,000,000 entries")
    assert not (tmp_path / "out.pt").exists()


@pytest.mark.slow
def test_a_dict_that_contains_itself_is_refused(tmp_path):
    loop = {"w": rand((4, 4))}
    loop["self"] = loop
    src = tmp_path / "loop.pt"
    torch.save(loop, src)
    assert_error(run("prune", src, "-o", tmp_path / "out.pt", "--amount", "0.5"), "loop.pt", "contains itself")
    assert_error(run("report", src), "contains itself")
    assert not (tmp_path / "out.pt").exists()


@pytest.mark.slow
def test_nesting_5000_deep_is_refused(tmp_path):
    deep = {"w": rand((4, 4))}
    for _ in range(5000):
        deep = {"k": deep}
    src = tmp_path / "deep.pt"
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(50_000)
    try:
        torch.save(deep, src)
    finally:
        sys.setrecursionlimit(limit)
    assert_error(run("prune", src, "-o", tmp_path / "out.pt", "--amount", "0.5"), "deep.pt", "nested deeper than 64")
    assert not (tmp_path / "out.pt").exists()


@pytest.mark.slow
def test_a_legitimately_shared_sub_dict_is_walked(tmp_path):
    """A DAG (one dict under two keys) is not a cycle: it is pruned under both names."""
    sd = {"w": rand((8, 8)), "b": rand((8,), 1)}
    src = tmp_path / "dag.pt"
    torch.save({"model": sd, "ema": sd}, src)
    out = tmp_path / "out.pt"
    proc = run("prune", src, "-o", out, "--amount", "0.25")
    assert proc.returncode == 0, proc.stderr
    got = torch.load(out, weights_only=True)
    expected = sd["w"] * torch.from_numpy(ap.l1_unstructured(sd["w"].numpy(), 0.25))
    for top in ("model", "ema"):
        torch.testing.assert_close(got[top]["w"], expected, rtol=0, atol=0)
        torch.testing.assert_close(got[top]["b"], sd["b"], rtol=0, atol=0)


# --------------------------------------------------------------------------------------
# tied weights
# --------------------------------------------------------------------------------------


@pytest.fixture
def tied(tmp_path):
    embed = rand((32, 16), 0)
    sd = {"embed.weight": embed, "fc.weight": rand((16, 16), 1), "lm_head.weight": embed, "fc.bias": rand((16,), 2)}
    src = tmp_path / "tied.pt"
    torch.save(sd, src)
    loaded = torch.load(src, weights_only=True)
    assert loaded["embed.weight"].data_ptr() == loaded["lm_head.weight"].data_ptr()
    return src, sd


@pytest.mark.slow
def test_tied_weights_are_pruned_once_and_stay_tied(tied, tmp_path):
    src, sd = tied
    out = tmp_path / "out.pt"
    proc = run("prune", src, "-o", out, "--amount", "0.5", "--global")
    assert proc.returncode == 0, proc.stderr
    got = torch.load(out, weights_only=True)
    assert got["embed.weight"].data_ptr() == got["lm_head.weight"].data_ptr(), "written once, still tied"
    # the budget counts the tied tensor once: half of 32*16 + 16*16 entries
    masks = ap.global_unstructured([sd["embed.weight"].numpy(), sd["fc.weight"].numpy()], ap.L1Unstructured, amount=0.5)
    torch.testing.assert_close(got["embed.weight"], sd["embed.weight"] * torch.from_numpy(masks[0]), rtol=0, atol=0)
    torch.testing.assert_close(got["fc.weight"], sd["fc.weight"] * torch.from_numpy(masks[1]), rtol=0, atol=0)
    assert int((got["embed.weight"] == 0).sum() + (got["fc.weight"] == 0).sum()) == (32 * 16 + 16 * 16) // 2
    assert "pruned 2 tensors (and 1 tied names)" in proc.stdout
    assert f"{(32 * 16 + 16 * 16) // 2} of {32 * 16 + 16 * 16} entries zero (50.00%)" in proc.stdout


@pytest.mark.slow
def test_tied_weights_with_masks_share_the_mask(tied, tmp_path):
    src, sd = tied
    out = tmp_path / "out.pt"
    assert run("prune", src, "-o", out, "--amount", "0.3", "--keep-masks").returncode == 0
    got = torch.load(out, weights_only=True)
    assert got["embed.weight_orig"].data_ptr() == got["lm_head.weight_orig"].data_ptr()
    torch.testing.assert_close(got["embed.weight_mask"], got["lm_head.weight_mask"], rtol=0, atol=0)
    want = torch.from_numpy(ap.l1_unstructured(sd["embed.weight"].numpy(), 0.3).astype(np.float32))
    torch.testing.assert_close(got["lm_head.weight_mask"], want, rtol=0, atol=0)


@pytest.mark.slow
def test_excluding_one_name_of_a_tied_tensor_leaves_both(tied, tmp_path):
    src, sd = tied
    out = tmp_path / "out.pt"
    assert run("prune", src, "-o", out, "--amount", "0.5", "--exclude", "lm_head.*").returncode == 0
    got = torch.load(out, weights_only=True)
    torch.testing.assert_close(got["embed.weight"], sd["embed.weight"], rtol=0, atol=0)
    torch.testing.assert_close(got["lm_head.weight"], sd["lm_head.weight"], rtol=0, atol=0)
    assert int((got["fc.weight"] == 0).sum()) == 128


@pytest.mark.slow
def test_report_counts_a_tied_tensor_once(tied):
    src, _ = tied
    rep = json.loads(run("report", src, "--json").stdout)
    rows = {r["name"]: r for r in rep["tensors"]}
    assert rows["lm_head.weight"]["tied_to"] == "embed.weight" and rows["embed.weight"]["tied_to"] is None
    assert rep["total"]["tensors"] == 3 and rep["total"]["size"] == 32 * 16 + 16 * 16 + 16


# --------------------------------------------------------------------------------------
# seeds
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("extra", [["--global"], []])
@pytest.mark.slow
def test_any_integer_is_a_seed(model, tmp_path, extra):
    zeros = {}
    for seed in ("-1", "18446744073709551617", "0", "-1"):
        out = tmp_path / f"{seed}.npz"
        proc = run("prune", model, "-o", out, "--method", "random_unstructured", "--amount", "0.4",
                   "--seed", seed, *extra, "--force")
        assert proc.returncode == 0, proc.stderr
        with np.load(out) as z:
            zeros.setdefault(seed, []).append(np.concatenate([(z[k] == 0).ravel() for k in sorted(z.files)]))
    assert np.array_equal(zeros["-1"][0], zeros["-1"][1]), "the same seed gives the same masks"
    assert not np.array_equal(zeros["-1"][0], zeros["0"][0])
    assert not np.array_equal(zeros["-1"][0], zeros["18446744073709551617"][0])


def test_stream_seeds_tell_every_integer_apart():
    seeds = [0, 1, -1, 2**63 - 1, 2**63, -(2**63), 2**64, 18446744073709551617, -(2**100)]
    derived = [cli.stream_seed(s, "fc.weight") for s in seeds]
    assert len(set(derived)) == len(seeds)
    assert all(0 <= d < 2**63 for d in derived)
    assert cli.stream_seed(5, "a") != cli.stream_seed(5, "b")
    assert cli.stream_seed(None, "a") is None


def test_the_core_refuses_seeds_no_library_accepts():
    w = np.ones((4, 4), np.float32)
    for bad in (-1, 2**63, 2**64 + 1):
        with pytest.raises(ValueError, match=r"seed must be in \[0, 2\*\*63\)"):
            ap.RandomUnstructured(0.5, seed=bad)
    assert ap.RandomUnstructured(0.5, seed=2**63 - 1).compute_mask(w, None).sum() == 8


# --------------------------------------------------------------------------------------
# options that do not apply
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--amount", "0.5", "--seed", "3"], "--seed"),
        (["--amount", "0.5", "--nm", "2:4"], "--nm"),
        (["--amount", "0.5", "--block", "2x2"], "--block"),
        (["--amount", "0.5", "--n", "1"], "--n"),
        (["--amount", "0.5", "--dim", "1"], "--dim"),
        (["--method", "random_unstructured", "--amount", "0.5", "--dim", "1"], "--dim"),
        (["--method", "random_structured", "--amount", "0.5", "--n", "1"], "--n"),
        (["--method", "block_unstructured", "--amount", "0.5", "--dim", "0"], "--dim"),
        (["--method", "nm_structured", "--block", "1x4"], "--block"),
        (["--method", "ln_structured", "--amount", "0.5", "--seed", "1"], "--seed"),
        (["--amount", "0.5", "--verify-tol", "0.1"], "--verify-tol"),
    ],
)
def test_options_that_do_not_apply_are_refused(model, tmp_path, argv, flag):
    out = tmp_path / "out.npz"
    assert_error(run("prune", model, "-o", out, *argv), flag)
    assert not out.exists()


def test_seed_applies_to_verify(model, tmp_path):
    proc = run("prune", model, "-o", tmp_path / "v.onnx", "--amount", "0.5", "--verify", "--seed", "-7")
    assert proc.returncode == 0, proc.stderr


# --------------------------------------------------------------------------------------
# --verify
# --------------------------------------------------------------------------------------


def _with_label_output(src, dst):
    """The example model with a second output: the int64 ArgMax of the logits."""
    onnx = pytest.importorskip("onnx")
    m = onnx.load(src)
    logits = m.graph.output[0].name
    m.graph.node.append(onnx.helper.make_node("ArgMax", [logits], ["label"], axis=1, keepdims=0))
    m.graph.output.append(onnx.helper.make_tensor_value_info("label", onnx.TensorProto.INT64, ["batch"]))
    onnx.save(m, dst)


@pytest.mark.slow
def test_verify_exit_status_follows_the_tolerance(model, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    src = tmp_path / "labelled.onnx"
    _with_label_output(model, src)
    out = tmp_path / "out.onnx"

    def verify(*extra):
        return run("prune", src, "-o", out, "--amount", "0.5", "--global", "--verify", "--seed", "5", "--force", *extra)

    proc = verify()
    assert proc.returncode == 0, proc.stderr
    x = np.random.default_rng(cli.stream_seed(5, "verify")).standard_normal((1, 64)).astype(np.float32)
    ya, yb = (
        ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0] for p in (src, out)
    )
    diff, scale = float(np.abs(ya - yb).max()), float(np.abs(ya).max())
    assert "not compared (not floating point): 'label'" in proc.stdout
    printed = float(proc.stdout.split("max abs output difference ")[1].split(",")[0])
    assert printed == pytest.approx(diff, rel=1e-5)
    assert proc.stdout.count("max abs output difference") == 1, "the int64 label is not a distance"

    tight = verify("--verify-tol", f"{0.5 * diff / scale}")  # tighter than what pruning did: status 1
    assert tight.returncode == 1, tight.stderr
    assert tight.stderr.startswith("arrayprune: error: ") and "verify failed" in tight.stderr
    assert "FAIL" in tight.stdout
    assert out.exists(), "the pruned model is written; the verdict is the exit status"
    loose = verify("--verify-tol", f"{2 * diff / scale},0")
    assert loose.returncode == 0, loose.stderr
    assert_error(
        run("prune", src, "-o", out, "--amount", "0.5", "--verify", "--verify-tol", "x", "--force"), "tolerance"
    )


# --------------------------------------------------------------------------------------
# report and prune say what they count
# --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_report_shows_integer_tensors_and_what_totals_cover(tmp_path):
    src = tmp_path / "mixed.npz"
    w = np.arange(1, 13, dtype=np.float32).reshape(3, 4)
    np.savez(src, w=w, steps=np.array([0, 3, 0], dtype=np.int64), b=np.zeros(3, np.float32))
    rep = json.loads(run("report", src, "--json").stdout)
    rows = {r["name"]: r for r in rep["tensors"]}
    assert set(rows) == {"w", "steps", "b"}
    assert rows["steps"]["prunable"] is False and rows["steps"]["reason"] == "int64, not floating point"
    assert rows["steps"]["zeros"] == 2 and rows["steps"]["bytes"]["dense"] == 24
    assert rep["total"]["size"] == 18 and rep["total"]["zeros"] == 2 + 3
    assert rep["prunable"]["size"] == 12 and rep["prunable"]["zeros"] == 0
    out = tmp_path / "out.npz"
    proc = run("prune", src, "-o", out, "--amount", "0.5")
    assert "6 of 12 entries zero (50.00%)" in proc.stdout
    assert "whole file: 11 of 18 entries zero (61.11%) in 3 tensors" in proc.stdout
    after = json.loads(run("report", out, "--json").stdout)
    assert after["prunable"]["zeros"] == 6 and after["total"]["zeros"] == 11
    text = run("report", src).stdout
    assert "no: int64, not floating point" in text and "no: not a layer weight (1-D)" in text


@pytest.mark.slow
def test_meta_tensors_are_refused_naming_the_device(tmp_path):
    src = tmp_path / "meta.pt"
    torch.save({"w": torch.empty(4, 4, device="meta")}, src)
    assert_error(run("prune", src, "-o", tmp_path / "o.pt", "--amount", "0.5"), "'w'", "meta device")
    assert_error(run("report", src), "meta device")


def test_missing_onnxruntime_names_the_extra(model, tmp_path):
    code = (
        "import sys; sys.modules['onnxruntime'] = None\n"
        "from arrayprune.adapters.cli import main\n"
        f"sys.exit(main(['prune', {str(model)!r}, '-o', {str(tmp_path / 'o.onnx')!r}, '--amount', '0.5', '--verify']))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert_error(proc, "onnxruntime", 'pip install "arrayprune[onnx]"')


@pytest.mark.slow
def test_tied_weights_into_safetensors_are_written_under_both_names(tied, tmp_path):
    """safetensors cannot share data between names: each name gets its own copy."""
    from safetensors.numpy import load_file

    src, sd = tied
    out = tmp_path / "out.safetensors"
    proc = run("prune", src, "-o", out, "--amount", "0.5")
    assert proc.returncode == 0, proc.stderr
    got = load_file(out)
    want = sd["embed.weight"].numpy() * ap.l1_unstructured(sd["embed.weight"].numpy(), 0.5)
    np.testing.assert_array_equal(got["embed.weight"], want)
    np.testing.assert_array_equal(got["lm_head.weight"], want)


# --------------------------------------------------------------------------------------
# termination signals
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("signame", "status"), [("SIGTERM", 143), ("SIGHUP", 129)])
def test_a_terminated_run_leaves_no_temporary_file(model, tmp_path, signame, status):
    import signal
    import time

    if signame == "SIGHUP" and signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
        pytest.skip("SIGHUP is ignored here (nohup): the command inherits that and is not stopped by it")
    out = tmp_path / "out.npz"
    out.write_bytes(b"old")
    code = (
        "import sys, time\n"
        "from arrayprune.adapters import cli\n"
        "from arrayprune.adapters.formats import files\n"  # where the writers look up atomic_write
        "real = files.atomic_write\n"
        "def slow(path, write):\n"
        "    def slow_write(f):\n"
        "        write(f); f.flush(); print('writing', flush=True); time.sleep(60)\n"
        "    return real(path, slow_write)\n"
        "files.atomic_write = slow\n"
        f"sys.exit(cli.main(['prune', {str(model)!r}, '-o', {str(out)!r}, '--amount', '0.5', '--force']))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "writing"
        assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")], "a temporary file is being written"
        proc.send_signal(getattr(signal, signame))
        assert proc.wait(timeout=30) == status
    finally:
        proc.kill()
        proc.wait()
    time.sleep(0.1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlp.onnx", "out.npz"]
    assert out.read_bytes() == b"old"


# --------------------------------------------------------------------------------------
# bfloat16 signalling NaNs kept bit for bit
# --------------------------------------------------------------------------------------


def _bf16_file(path, bits):
    header = json.dumps({"w.weight": {"dtype": "BF16", "shape": list(bits.shape), "data_offsets": [0, bits.nbytes]}})
    header = header.encode() + b" " * (-len(header) % 8)
    path.write_bytes(len(header).to_bytes(8, "little") + header + bits.astype("<u2").tobytes())


def _bf16_bits(path):
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    return np.frombuffer(data[8 + n :], "<u2")


@pytest.mark.parametrize("extra", [["--global"], []])
def test_kept_bfloat16_signalling_nans_keep_their_bits(tmp_path, extra):
    # 1.0, sNaN, -sNaN, 2.0, 0.0078125, 3.0, 0.125, 4.0: the two smallest go (amount 0.25).
    bits = np.array([0x3F80, 0x7F81, 0xFF81, 0x4000, 0x3C00, 0x4040, 0x3E00, 0x4080], np.uint16).reshape(2, 4)
    src, out = tmp_path / "bf.safetensors", tmp_path / "out.safetensors"
    _bf16_file(src, bits)
    proc = run("prune", src, "-o", out, "--amount", "0.25", *extra)
    assert proc.returncode == 0, proc.stderr
    expected = bits.reshape(-1).copy()
    expected[[4, 6]] = 0
    assert _bf16_bits(out).tolist() == expected.tolist()
