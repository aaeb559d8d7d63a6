"""``--shrink --method activation_structured|obs_structured``: units scored on calibration data, consumer refit.

A reference is built here with the dense model run whole by ``transformers`` and NumPy:
layer after layer, ``X^T X`` of the consumer's inputs (``down_proj``, ``o_proj``,
GPT-2's ``c_proj``) is taken from a hook on the model pruned so far, the units scored by
the formulas, the best kept, and the consumer set to its float64 least-squares refit
``W Hd[:, K] Hd[K, K]^-1`` (or sliced, without compensation), the dropped columns zero.
The shrunk folder must keep the same units, load with no missing, unexpected or
mismatched key, equal that reference model and generate.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
tr = pytest.importorskip("transformers")

from arrayprune.adapters import formats  # noqa: E402, F401  (formats before the pipeline: an import cycle otherwise)
from arrayprune.adapters.cli import main  # noqa: E402
from arrayprune.adapters.pipeline.shrink_structure import shrink_calibrated  # noqa: E402
from cli_helpers import assert_error, run  # noqa: E402
from hf_models import IDS, load, tensors  # noqa: E402


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    torch.manual_seed(0)
    cfg = tr.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    path = tmp_path_factory.mktemp("llama") / "dense"
    tr.LlamaForCausalLM(cfg).eval().save_pretrained(path, max_shard_size="20KB")
    assert len([n for n in os.listdir(path) if n.endswith(".safetensors")]) > 2
    return path


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    torch.manual_seed(0)
    cfg = tr.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64)
    path = tmp_path_factory.mktemp("gpt2") / "dense"
    tr.GPT2LMHeadModel(cfg).eval().save_pretrained(path, max_shard_size="40KB")
    return path


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    path = tmp_path_factory.mktemp("tokens") / "tokens.npz"
    np.savez(path, input_ids=np.random.default_rng(2).integers(0, 64, size=(6, 16)))
    return path


def _scores(method, w, h, units):
    per = w.shape[1] // units
    if method == "activation_structured":
        col = (w**2).sum(0) * np.diagonal(h)
        return np.sqrt(col.reshape(units, per).sum(1))
    inv = np.linalg.inv(h + 0.01 * np.mean(np.diagonal(h)) * np.eye(len(h)))
    out = []
    for u in range(units):
        s = slice(u * per, (u + 1) * per)
        out.append(np.trace(w[:, s] @ np.linalg.inv(inv[s, s]) @ w[:, s].T))
    return np.array(out)


def sequential_reference(cls, folder, tokens_path, consumer, units, drop, method, compensated):
    """The dense model pruned layer after layer by NumPy; the kept units of each layer."""
    model = cls.from_pretrained(folder).eval()
    ids = torch.from_numpy(np.load(tokens_path)["input_ids"])
    kept_all = []
    for i in range(model.config.num_hidden_layers):
        module = consumer(model, i)
        conv = type(module).__name__ == "Conv1D"
        w = module.weight.detach().double().numpy()
        w = w.T if conv else w
        k = w.shape[1]
        h = np.zeros((k, k))

        def grab(mod, args, h=h, k=k):
            x = args[0].detach().double().reshape(-1, k).numpy()
            h += x.T @ x

        handle = module.register_forward_pre_hook(grab)
        with torch.no_grad():
            model(ids)
        handle.remove()
        scores = _scores(method, w, h, units)
        kept = np.sort(np.argsort(scores, kind="stable")[drop:])
        per = k // units
        cols = (kept[:, None] * per + np.arange(per)).reshape(-1)
        new = np.zeros_like(w)
        if compensated:
            hd = h + 0.01 * np.mean(np.diagonal(h)) * np.eye(k)
            new[:, cols] = w @ hd[:, cols] @ np.linalg.inv(hd[np.ix_(cols, cols)])
        else:
            new[:, cols] = w[:, cols]
        with torch.no_grad():
            module.weight.copy_(torch.from_numpy(new.T if conv else new))
        kept_all.append(kept.tolist())
    return model, kept_all


def _down(model, i):
    return model.model.layers[i].mlp.down_proj


def _o(model, i):
    return model.model.layers[i].self_attn.o_proj


CASES = [
    ("channels", "obs_structured", True, _down, 48, 0.5),
    ("channels", "activation_structured", False, _down, 48, 0.25),
    ("heads", "activation_structured", True, _o, 2, 0.5),
    ("heads", "obs_structured", True, _o, 2, 0.5),
]


@pytest.mark.slow
@pytest.mark.parametrize(("groups", "method", "compensated", "consumer", "units", "amount"), CASES)
def test_llama_equals_the_sequential_numpy_reference(
    llama, tokens, tmp_path, groups, method, compensated, consumer, units, amount
):
    done = shrink_calibrated(
        llama, tmp_path / "small", amount, method, str(tokens), groups=groups, compensated=compensated
    )
    drop = round(amount * units)
    ref, kept = sequential_reference(tr.LlamaForCausalLM, llama, tokens, consumer, units, drop, method, compensated)
    name = "mlp" if groups == "channels" else "self_attn"
    assert [done.kept[f"model.layers.{i}.{name}"] for i in range(2)] == kept
    with torch.no_grad():
        small = load(tr.LlamaForCausalLM, tmp_path / "small")
        got, want = small(IDS).logits.numpy(), ref(IDS, use_cache=False).logits.numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)
    if not compensated:  # the consumer sliced as stored
        dense, shrunk = tensors(llama), tensors(tmp_path / "small")
        d = dense["model.layers.0.mlp.down_proj.weight"]
        np.testing.assert_array_equal(shrunk["model.layers.0.mlp.down_proj.weight"], d[:, kept[0]])
    out = small.generate(IDS[:, :4], max_new_tokens=4, do_sample=False)
    assert out.shape == (1, 8)


@pytest.mark.slow
def test_gpt2_conv1d_consumer(gpt2, tokens, tmp_path):
    done = shrink_calibrated(gpt2, tmp_path / "small", 0.5, "obs_structured", str(tokens))

    def c_proj(model, i):
        return model.transformer.h[i].mlp.c_proj

    ref, kept = sequential_reference(tr.GPT2LMHeadModel, gpt2, tokens, c_proj, 128, 64, "obs_structured", True)
    assert [done.kept[f"transformer.h.{i}.mlp"] for i in range(2)] == kept
    with torch.no_grad():
        got = load(tr.GPT2LMHeadModel, tmp_path / "small")(IDS).logits.numpy()
        np.testing.assert_allclose(got, ref(IDS, use_cache=False).logits.numpy(), rtol=0, atol=2e-5)


@pytest.mark.slow
def test_cli_dry_run_and_write(llama, tokens, tmp_path, capsys):
    capsys.readouterr()
    args = ["prune", str(llama), "--shrink", "--groups", "heads", "--amount", "0.5", "--method", "obs_structured",
            "--calibration", str(tokens)]  # fmt: skip
    assert main([*args, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "OBS" in out and "KV groups model.layers.1.self_attn (2 -> 1 KV groups)" in out and "removed: " in out
    assert main([*args, "-o", str(tmp_path / "small"), "--no-compensate"]) == 0, capsys.readouterr().err
    with open(tmp_path / "small" / "config.json") as f:
        cfg = json.load(f)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (2, 1)
    assert cfg["arrayprune"]["method"] == "obs_structured"


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--method", "obs_structured"], ["--method obs_structured scores units on calibration data"]),
        (["--method", "ln_structured", "--calibration", "{tokens}"], ["--calibration ranks channels with"]),
        (["--method", "ln_structured", "--no-compensate"], ["--no-compensate turns off the refit"]),
        (["--method", "obs_structured", "--calibration", "{tokens}", "--groups", "layers"], ["has its own score"]),
    ],
)
def test_refused(llama, tokens, tmp_path, args, fragments):
    args = [a.format(tokens=tokens) for a in args]
    proc = run("prune", llama, "-o", tmp_path / "out", "--shrink", "--amount", "0.5", *args)
    assert_error(proc, *fragments)
    assert not os.path.exists(tmp_path / "out")


def test_calibrated_method_needs_shrink(llama, tokens, tmp_path):
    proc = run("prune", llama, "-o", tmp_path / "out", "--amount", "0.5", "--method", "obs_structured",
               "--calibration", tokens)  # fmt: skip
    assert_error(proc, "--method obs_structured scores the units --shrink removes: add --shrink")


@pytest.mark.slow
def test_bert_output_dense_consumer(tmp_path, tokens):
    torch.manual_seed(0)
    cfg = tr.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=40, max_position_embeddings=64)  # fmt: skip
    tr.BertModel(cfg).eval().save_pretrained(tmp_path / "dense")
    done = shrink_calibrated(tmp_path / "dense", tmp_path / "small", 0.5, "activation_structured", str(tokens))

    def output_dense(model, i):
        return model.encoder.layer[i].output.dense

    ref, kept = sequential_reference(
        tr.BertModel, tmp_path / "dense", tokens, output_dense, 40, 20, "activation_structured", True
    )
    assert [done.kept[f"encoder.layer.{i}.intermediate"] for i in range(2)] == kept
    assert done.config == {"intermediate_size": 20}
    with torch.no_grad():
        got = load(tr.BertModel, tmp_path / "small")(IDS).last_hidden_state.numpy()
        np.testing.assert_allclose(got, ref(IDS).last_hidden_state.numpy(), rtol=0, atol=2e-5)


def _column_norm_method():
    """A calibrated structured method written by a user: a unit scored by its columns' weight norm."""
    import arrayprune as ap

    class ColumnNorm(ap.UnitPruningMethod):
        DESCRIPTION = "sum of the squares of a unit's weight columns"

        def unit_scores(self, weight, hessian, units):
            return (weight**2).sum(0).reshape(units, -1).sum(1)

    return ColumnNorm


@pytest.mark.slow
def test_a_registered_unit_method_shrinks_from_its_table_row(llama, tokens, tmp_path, capsys):
    from arrayprune.registry import register_method, unregister_method

    register_method("column_norm_structured", _column_norm_method())
    try:
        out = tmp_path / "small"
        args = ["prune", str(llama), "--shrink", "--amount", "0.25", "--method", "column_norm_structured",
                "--calibration", str(tokens), "-o", str(out), "--no-compensate"]  # fmt: skip
        assert main(args) == 0, capsys.readouterr().err
    finally:
        unregister_method("column_norm_structured")
    dense, shrunk = tensors(llama), tensors(out)
    for i in range(2):
        key = f"model.layers.{i}.mlp.down_proj.weight"
        norms = (dense[key].astype(np.float64) ** 2).sum(0)
        kept = np.sort(np.argsort(norms, kind="stable")[12:])
        np.testing.assert_array_equal(shrunk[key], dense[key][:, kept])
        up = f"model.layers.{i}.mlp.up_proj.weight"
        np.testing.assert_array_equal(shrunk[up], dense[up][kept])
    with open(out / "config.json") as f:
        cfg = json.load(f)
    assert cfg["intermediate_size"] == 36 and cfg["arrayprune"]["method"] == "column_norm_structured"
