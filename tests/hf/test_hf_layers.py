"""``--shrink --groups layers``: whole decoder layers removed from a Hugging Face folder.

A Qwen3 model with sliding-window and full-attention layers (``layer_types``) is saved
in several shards; its layers are scored on calibration token ids, and the result must
load with no missing, unexpected or mismatched key, hold ``num_hidden_layers`` and the
per-layer lists cut to the layers kept, equal the dense model run without the removed
layers (``--no-compensate``), and generate. The scores are checked against hooks on the
dense model's own forward (float64 cosine of each layer's input and output).

By default each run of removed layers is refit into the last projection of the kept
layer before it (``down_proj``; ``o_proj`` for mixture-of-experts layers; GPT-2's
``Conv1D`` ``c_proj``): checked against `reference_absorbed`, float64 forwards of the
model with hooks, run after run on the model shrunk so far.
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
from arrayprune.adapters.pipeline.shrink_structure import shrink_layers  # noqa: E402
from cli_helpers import assert_error, run  # noqa: E402

IDS = torch.tensor([[3, 14, 15, 9, 2, 6, 5, 35, 8, 9, 7, 9, 32, 38, 46, 26]])


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    torch.manual_seed(0)
    cfg = tr.Qwen3Config(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=64, use_sliding_window=True, sliding_window=4,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    )  # fmt: skip
    model = tr.Qwen3ForCausalLM(cfg).eval()
    path = tmp_path_factory.mktemp("qwen3") / "dense"
    model.save_pretrained(path, max_shard_size="20KB")
    assert len([n for n in os.listdir(path) if n.endswith(".safetensors")]) > 2
    return path


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    path = tmp_path_factory.mktemp("tokens") / "tokens.npz"
    np.savez(path, input_ids=np.random.default_rng(0).integers(0, 64, size=(6, 16)))
    return path


def reference_changes(folder, tokens_path):
    """Mean over tokens of 1 - cosine of each layer's input and output, from hooks on the dense forward."""
    model = tr.Qwen3ForCausalLM.from_pretrained(folder).eval()
    ids = torch.from_numpy(np.load(tokens_path)["input_ids"])
    seen = {}

    def hook(i):
        def grab(module, args, kwargs, output):
            x = (args[0] if args else kwargs["hidden_states"]).double()
            y = (output[0] if isinstance(output, tuple) else output).double()
            seen[i] = (1 - torch.nn.functional.cosine_similarity(x, y, dim=-1)).mean().item()

        return grab

    for i, layer in enumerate(model.model.layers):
        layer.register_forward_hook(hook(i), with_kwargs=True)
    with torch.no_grad():
        model(ids)
    return np.array([seen[i] for i in range(len(seen))])


def without_layers(folder, kept):
    model = tr.Qwen3ForCausalLM.from_pretrained(folder).eval()
    model.model.layers = torch.nn.ModuleList([model.model.layers[i] for i in kept])
    model.config.num_hidden_layers = len(kept)
    model.config.layer_types = [model.config.layer_types[i] for i in kept]  # the model reads its masks' kinds here
    return model


def load(folder):
    model, info = tr.Qwen3ForCausalLM.from_pretrained(folder, output_loading_info=True)
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set(), info
    assert info["mismatched_keys"] == set() and not info["error_msgs"], info
    return model.eval()


@pytest.mark.slow
def test_layers_removed_equal_the_dense_model_without_them(qwen3, tokens, tmp_path):
    done = shrink_layers(qwen3, tmp_path / "small", 0.5, str(tokens), compensated=False)
    want_scores = reference_changes(qwen3, tokens)
    got_scores = done.report.scores["model.layers"]
    np.testing.assert_allclose(got_scores, want_scores, rtol=1e-6, atol=1e-7)
    kept = np.sort(np.argsort(want_scores, kind="stable")[2:])
    assert done.kept == {"model.layers": kept.tolist()}
    with open(tmp_path / "small" / "config.json") as f:
        cfg = json.load(f)
    types = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
    assert cfg["num_hidden_layers"] == 2 and cfg["layer_types"] == [types[i] for i in kept]
    with open(tmp_path / "small" / "model.safetensors.index.json") as f:
        index = json.load(f)
    assert not [n for n in index["weight_map"] if n.startswith(("model.layers.2.", "model.layers.3."))]
    shards = {n for n in os.listdir(tmp_path / "small") if n.endswith(".safetensors")}
    assert shards == set(index["weight_map"].values())  # a shard left empty is not written
    with torch.no_grad():
        small = load(tmp_path / "small")
        got = small(IDS).logits.numpy()
        want = without_layers(qwen3, kept.tolist())(IDS, use_cache=False).logits.numpy()
        dense = tr.Qwen3ForCausalLM.from_pretrained(qwen3).eval()(IDS).logits.numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    assert not np.allclose(got, dense, atol=1e-3)
    assert done.params_after < done.params_before
    out = small.generate(IDS[:, :4], max_new_tokens=4, do_sample=False)
    assert out.shape == (1, 8)


@pytest.mark.slow
def test_cli_layers_and_dry_run(qwen3, tokens, tmp_path, capsys):
    capsys.readouterr()
    code = main(["prune", str(qwen3), "--dry-run", "--shrink", "--groups", "layers", "--amount", "1",
                 "--calibration", str(tokens), "--method", "ln_structured"])  # fmt: skip
    captured = capsys.readouterr()
    out = captured.out
    assert code == 0
    dropped = int(np.argmin(reference_changes(qwen3, tokens)))
    planned = f"layer {dropped} would be refit into model.layers.{dropped - 1}.mlp.down_proj"
    assert (planned in captured.err) == (dropped > 0)
    assert "layers model.layers (4 -> 3 layers)" in out and "1 - cosine" in out
    assert f"layers of {qwen3} (Hugging Face checkpoint), residual_change, amount 1; nothing is written" in out
    scores = reference_changes(qwen3, tokens)
    assert f"removed: {int(np.argmin(scores))}" in out
    code = main(["prune", str(qwen3), "-o", str(tmp_path / "out"), "--shrink", "--groups", "layers", "--amount",
                 "1", "--calibration", str(tokens), "--method", "ln_structured"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    assert f"shrunk the layers of {qwen3} (residual_change, amount 1): " in capsys.readouterr().out
    with open(tmp_path / "out" / "config.json") as f:
        cfg = json.load(f)
    assert cfg["num_hidden_layers"] == 3 and cfg["arrayprune"]["method"] == "residual_change"
    assert cfg["arrayprune"]["shrink"] == "layers" and "calibration_sha256" in cfg["arrayprune"]


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--amount", "0.5"], ["--groups layers ranks layers", "--calibration"]),
        (["--amount", "4", "--calibration", "{tokens}"], ["would remove every one of the 4 layers"]),
    ],
)
def test_layers_refused(qwen3, tokens, tmp_path, args, fragments):
    args = [a.format(tokens=tokens) for a in args]
    proc = run("prune", qwen3, "-o", tmp_path / "out", "--shrink", "--groups", "layers", "--method", "ln_structured",
               *args)  # fmt: skip
    assert_error(proc, *fragments)
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.slow
def test_moe_with_dense_layers_keeps_each_layers_kind(tokens, tmp_path):
    """Qwen2-MoE with ``decoder_sparse_step=2`` (layers 0 and 2 dense): the kinds follow the layers kept."""
    from hf_models import save_family

    cls = save_family(tmp_path / "dense", "qwen2_moe", shard="8KB", num_hidden_layers=4, decoder_sparse_step=2)
    done = shrink_layers(tmp_path / "dense", tmp_path / "small", 2, str(tokens), compensated=False)
    kept = done.kept["model.layers"]
    with open(tmp_path / "small" / "config.json") as f:
        cfg = json.load(f)
    assert cfg["decoder_sparse_step"] == 1 and cfg["num_hidden_layers"] == 2
    assert cfg["mlp_only_layers"] == [j for j, i in enumerate(kept) if i % 2 == 0]
    with torch.no_grad():
        small = load_as(cls, tmp_path / "small")
        ref = cls.from_pretrained(tmp_path / "dense").eval()
        ref.model.layers = torch.nn.ModuleList([ref.model.layers[i] for i in kept])
        ref.config.num_hidden_layers = 2
        ref.config.layer_types = [ref.config.layer_types[i] for i in kept]
        np.testing.assert_allclose(small(IDS).logits.numpy(), ref(IDS, use_cache=False).logits.numpy(), atol=1e-5)


def load_as(cls, folder):
    model, info = cls.from_pretrained(folder, output_loading_info=True)
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set(), info
    assert info["mismatched_keys"] == set() and not info["error_msgs"], info
    return model.eval()


def test_config_lists_rewritten():
    from arrayprune.adapters.roles.hf_groups import HfGroupsError, HfLayers

    layers = HfLayers("qwen2_moe", "num_hidden_layers", [f"model.layers.{i}" for i in range(4)])
    config = {
        "num_hidden_layers": 4, "layer_types": ["a", "b", "c", "d"], "sliding_window_pattern_per_layer": [1, 2, 3, 4],
        "mlp_only_layers": [3], "decoder_sparse_step": 2, "architectures": ["X", "Y", "Z", "W"],
    }  # fmt: skip
    assert layers.config_updates(config, [0, 3]) == {
        "num_hidden_layers": 2, "layer_types": ["a", "d"], "sliding_window_pattern_per_layer": [1, 4],
        "decoder_sparse_step": 1, "mlp_only_layers": [0, 1],
    }  # fmt: skip
    names = ["model.layers.0.mlp.w", "model.layers.3.mlp.w", "model.layers.1.x", "model.norm.weight"]
    assert layers.renamed(names, [1, 3]) == {
        "model.layers.0.mlp.w": None, "model.layers.3.mlp.w": "model.layers.1.mlp.w",
        "model.layers.1.x": "model.layers.0.x", "model.norm.weight": "model.norm.weight",
    }  # fmt: skip
    with pytest.raises(HfGroupsError, match="use_sliding_window by max_window_layers"):
        layers.config_updates({"max_window_layers": 2, "use_sliding_window": True}, [0])


def test_bad_tokens_refused_in_one_line(qwen3, tmp_path):
    bad = tmp_path / "bad.npz"
    np.savez(bad, input_ids=np.full((2, 8), 99))
    proc = run("prune", qwen3, "-o", tmp_path / "out", "--shrink", "--groups", "layers", "--amount", "1",
               "--calibration", bad)  # fmt: skip
    assert_error(proc, "token ids must be in [0, 64)")
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.slow
def test_the_calibrate_stage_measures_once_and_the_shrink_stage_writes(qwen3, tokens, tmp_path, monkeypatch):
    """The runner asks the calibrate stage for the layers' residual change; shrinking does not run the model."""
    from arrayprune.adapters.pipeline import calibrate, shrink_structure
    from arrayprune.adapters.pipeline.runner import prune_file

    measured = []
    original = calibrate.score_layers

    def counted(*args, **kwargs):
        measured.append(args[0])
        return original(*args, **kwargs)

    def refused(*args, **kwargs):
        raise AssertionError("the shrink stage ran the model")

    monkeypatch.setattr(calibrate, "score_layers", counted)
    monkeypatch.setattr(shrink_structure, "score_layers", refused)
    assert [row.name for row in calibrate.UNIT_STATISTICS] == [
        "residual_change", "router_statistics", "unit_hessians", "consumer_hessians"
    ]
    result = prune_file(qwen3, tmp_path / "out", shrink=True, groups="layers", amount=1, calibration=tokens,
                        method="ln_structured", compensate=False)  # fmt: skip
    dropped = int(np.argmin(reference_changes(qwen3, tokens)))
    assert measured == [str(qwen3)]
    assert result.shrink.kept == {"model.layers": [i for i in range(4) if i != dropped]}
    # Compensated (the default), the layers are chosen one at a time in the calibrate stage.
    original_choice = calibrate.choose_layers
    monkeypatch.setattr(calibrate, "choose_layers", lambda *a, **k: measured.append(a[0]) or original_choice(*a, **k))
    monkeypatch.setattr(shrink_structure, "choose_layers", refused)
    measured.clear()
    result = prune_file(qwen3, tmp_path / "refit", shrink=True, groups="layers", amount=2, calibration=tokens)
    assert measured == [str(qwen3)]
    assert result.shrink.kept == {"model.layers": greedy_kept(qwen3, tokens, 2)}


def _layer_list(model):
    return model.transformer.h if hasattr(model, "transformer") else model.model.layers


def _set_layers(model, layers, types, present):
    inner = model.transformer if hasattr(model, "transformer") else model.model
    if hasattr(model, "transformer"):
        inner.h = torch.nn.ModuleList([layers[i] for i in present])
        model.config.n_layer = len(present)
    else:
        inner.layers = torch.nn.ModuleList([layers[i] for i in present])
        model.config.num_hidden_layers = len(present)
    if types:
        model.config.layer_types = [types[i] for i in present]


def _hidden(output):
    return output[0] if isinstance(output, tuple) else output


def reference_absorbed(cls, folder, tokens_path, removed, writer_of, damp=0.01, double=True):
    """The dense model in float64 (float32 unless `double`: experts' grouped products) with
    `removed` gone, each run refit into ``writer_of(layer before)``.

    Run after run: on the model shrunk so far (earlier runs gone and refit, a run at the
    start gone), the run's own layers still in, hooks take the writer's inputs ``X``, the
    stream after the layer before (``before``) and after the run (``after``);
    ``W += (solve(H + damp * mean(diag H) * I, X^T (after - before)))^T``.
    """
    model = cls.from_pretrained(folder).eval()
    model = model.double() if double else model
    stored = np.load(tokens_path)
    ids = torch.from_numpy(stored["input_ids"])
    mask = torch.from_numpy(stored["attention_mask"]) if "attention_mask" in stored else None
    counted = slice(None) if mask is None else mask.reshape(-1).numpy() > 0  # padding left out
    layers = list(_layer_list(model))
    types = list(getattr(model.config, "layer_types", None) or [])
    runs: list[list[int]] = []
    for i in sorted(removed):
        if runs and runs[-1][-1] == i - 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    present = [i for i in range(len(layers)) if not (runs[0][0] == 0 and i in runs[0])]
    seen: dict = {}
    for gone in runs:
        if gone[0] == 0:
            continue
        _set_layers(model, layers, types, present)
        writer = writer_of(layers[gone[0] - 1])
        handles = [
            writer.register_forward_pre_hook(lambda m, args: seen.__setitem__("x", args[0])),
            layers[gone[0] - 1].register_forward_hook(lambda m, a, o: seen.__setitem__("before", _hidden(o))),
            layers[gone[-1]].register_forward_hook(lambda m, a, o: seen.__setitem__("after", _hidden(o))),
        ]
        with torch.no_grad():
            model(ids, attention_mask=mask, use_cache=False)
        for h in handles:
            h.remove()
        conv1d = type(writer).__name__ == "Conv1D"
        w = (writer.weight.T if conv1d else writer.weight).detach().double().numpy()  # [out, in]
        x = seen["x"].reshape(-1, w.shape[1]).double().numpy()[counted]
        f = (seen["after"] - seen["before"]).reshape(-1, w.shape[0]).double().numpy()[counted]
        h = x.T @ x
        new = w + np.linalg.solve(h + damp * np.mean(np.diag(h)) * np.eye(len(h)), x.T @ f).T
        with torch.no_grad():
            writer.weight.copy_(torch.from_numpy(new.T if conv1d else new).to(writer.weight.dtype))
        present = [i for i in present if i not in gone]
    _set_layers(model, layers, types, present)
    return model


def forced_scores(folder, removed):
    """Layer scores that remove `removed` (lowest go)."""
    from arrayprune.adapters.pipeline.shrink_checkpoint import open_hf
    from arrayprune.adapters.pipeline.shrink_folder import UnitScores
    from arrayprune.adapters.roles.hf_groups import hf_layers

    ckpt, config = open_hf(folder)
    layers = hf_layers(config, {n: t.shape for n, t in ckpt.tensors.items()})
    changes = np.array([0.1 * removed.index(i) if i in removed else 1.0 + i for i in range(layers.units)])
    return UnitScores("residual_change", layers, changes)


@pytest.mark.slow
@pytest.mark.parametrize("removed", [[1, 2], [0, 2], [1, 3]], ids=["one-run", "run-at-start", "two-runs"])
def test_removed_layers_refit_into_the_layer_before(qwen3, tokens, tmp_path, removed):
    done = shrink_layers(qwen3, tmp_path / "small", 2, str(tokens), scores=forced_scores(qwen3, removed))
    kept = [i for i in range(4) if i not in removed]
    assert done.kept == {"model.layers": kept}
    runs = {"one-run": {0: [1, 2]}, "run-at-start": {1: [2]}, "two-runs": {0: [1], 2: [3]}}[
        {(1, 2): "one-run", (0, 2): "run-at-start", (1, 3): "two-runs"}[tuple(removed)]
    ]
    assert done.refits == {f"model.layers.{p}.mlp.down_proj.weight": run for p, run in runs.items()}
    ref = reference_absorbed(tr.Qwen3ForCausalLM, qwen3, tokens, removed, lambda layer: layer.mlp.down_proj)
    small, dense = load(tmp_path / "small"), tr.Qwen3ForCausalLM.from_pretrained(qwen3).eval()
    for j, i in enumerate(kept):
        got = small.model.layers[j].mlp.down_proj.weight.detach().numpy()
        want = ref.model.layers[j].mlp.down_proj.weight.detach().numpy()
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())
        if i not in runs:  # every other tensor as stored
            assert np.array_equal(got, dense.model.layers[i].mlp.down_proj.weight.detach().numpy())
    with torch.no_grad():
        got_logits = small(IDS).logits.double().numpy()
        want_logits = ref(IDS, use_cache=False).logits.numpy()
        plain = without_layers(qwen3, kept)(IDS, use_cache=False).logits.double().numpy()
    np.testing.assert_allclose(got_logits, want_logits, rtol=0, atol=1e-4)
    assert not np.allclose(got_logits, plain, atol=1e-3)  # the refit changed the model


@pytest.mark.slow
def test_cli_no_compensate_removes_the_layers_as_they_are(qwen3, tokens, tmp_path, capsys):
    args = ["prune", str(qwen3), "--shrink", "--groups", "layers", "--amount", "0.5", "--calibration", str(tokens)]
    assert main([*args, "-o", str(tmp_path / "plain"), "--no-compensate"]) == 0
    assert "refit into" not in capsys.readouterr().err
    assert main([*args, "-o", str(tmp_path / "refit")]) == 0
    assert "refit into model.layers." in capsys.readouterr().err
    for name, recorded in (("plain", "false"), ("refit", None)):
        with open(tmp_path / name / "config.json") as f:
            assert json.load(f)["arrayprune"].get("compensate") == recorded
    plain, refit = load(tmp_path / "plain"), load(tmp_path / "refit")
    kept = np.sort(np.argsort(reference_changes(qwen3, tokens), kind="stable")[2:]).tolist()
    with torch.no_grad():
        want = without_layers(qwen3, kept)(IDS, use_cache=False).logits.numpy()
        np.testing.assert_allclose(plain(IDS).logits.numpy(), want, rtol=0, atol=1e-5)
    differ = [n for n, p in refit.state_dict().items() if not torch.equal(p, plain.state_dict()[n])]
    assert differ and all(n.endswith("mlp.down_proj.weight") for n in differ)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen2_moe", "gpt2"])
def test_refit_into_o_proj_of_moe_layers_and_gpt2_conv1d(family, tokens, tmp_path):
    """Mixture-of-experts layers have no one MLP: ``o_proj`` absorbs the run. GPT-2's
    ``c_proj`` is a ``Conv1D``, its weight stored ``[in, out]``."""
    from hf_models import save_family

    if family == "gpt2":
        torch.manual_seed(0)
        cfg = tr.GPT2Config(vocab_size=64, n_embd=32, n_layer=4, n_head=4, n_positions=64)
        tr.GPT2LMHeadModel(cfg).eval().save_pretrained(tmp_path / "dense", max_shard_size="20KB")
        cls, writer_of, key = tr.GPT2LMHeadModel, (lambda layer: layer.mlp.c_proj), "transformer.h.0.mlp.c_proj.weight"
    else:
        cls = save_family(tmp_path / "dense", family, shard="8KB", num_hidden_layers=4, decoder_sparse_step=2)
        writer_of, key = (lambda layer: layer.self_attn.o_proj), "model.layers.0.self_attn.o_proj.weight"
    done = shrink_layers(tmp_path / "dense", tmp_path / "small", 2, str(tokens),
                         scores=forced_scores(tmp_path / "dense", [1, 2]))  # fmt: skip
    assert done.refits == {key: [1, 2]}
    ref = reference_absorbed(cls, tmp_path / "dense", tokens, [1, 2], writer_of, double=family == "gpt2")
    small = load_as(cls, tmp_path / "small")
    got = writer_of(_layer_list(small)[0]).weight.detach().numpy()
    want = writer_of(_layer_list(ref)[0]).weight.detach().numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())
    with torch.no_grad():
        np.testing.assert_allclose(small(IDS).logits.double().numpy(),
                                   ref(IDS, use_cache=False).logits.double().numpy(), rtol=0, atol=1e-4)  # fmt: skip


def test_where_each_family_refits_removed_layers():
    from arrayprune.adapters.roles.hf_groups import HfLayers

    names = [f"model.layers.{i}" for i in range(5)]
    llama = HfLayers("llama", "num_hidden_layers", names)
    stored = {f"model.layers.{i}.mlp.down_proj.weight" for i in range(5)}
    assert llama.writer(2) == ("model.layers.2.mlp.down_proj.weight", 1, True)
    writers, runs = llama.absorbers([1, 4], stored)  # layer 0: a run at the start, none before it
    assert writers == {1: "model.layers.1.mlp.down_proj.weight"}
    assert runs == {"model.layers.1.mlp.down_proj.weight": [2, 3]}
    assert llama.absorbers([1, 4], set()) == ({}, {})  # the writer not in the checkpoint: no refit
    mixtral = HfLayers("mixtral", "num_hidden_layers", names)
    assert mixtral.writer(0) == ("model.layers.0.self_attn.o_proj.weight", 1, False)  # the experts read after it
    assert HfLayers("gpt2", "n_layer", ["h.0"]).writer(0) == ("h.0.mlp.c_proj.weight", 0, True)
    assert HfLayers("bert", "num_hidden_layers", ["encoder.layer.0"]).writer(0) is None  # post-norm


@pytest.mark.slow
def test_a_norm_after_down_proj_is_found_and_the_run_removed_as_it_is(tokens, tmp_path, capsys):
    """Gemma 2 normalizes the MLP's output before the residual add (``post_feedforward_layernorm``):
    its ``down_proj`` fails the check that a change ``D`` moves the output by ``X D^T``, so the
    run after it is removed as it is, and the command says so."""
    torch.manual_seed(0)
    cfg = tr.Gemma2Config(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
    )  # fmt: skip
    model = tr.Gemma2ForCausalLM(cfg).eval()
    with torch.no_grad():  # norms away from their initial values
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.randn(p.shape) * 0.5)
    model.save_pretrained(tmp_path / "dense", max_shard_size="20KB")
    done = shrink_layers(tmp_path / "dense", tmp_path / "small", 2, str(tokens),
                         scores=forced_scores(tmp_path / "dense", [1, 2]))  # fmt: skip
    assert done.refits == {}
    code = main(["prune", str(tmp_path / "dense"), "-o", str(tmp_path / "cli"), "--shrink", "--groups", "layers",
                 "--amount", "1", "--calibration", str(tokens)])  # fmt: skip
    assert code == 0
    assert "removed without a refit" in capsys.readouterr().err
    small = load_as(tr.Gemma2ForCausalLM, tmp_path / "small")
    ref = tr.Gemma2ForCausalLM.from_pretrained(tmp_path / "dense").eval()
    ref.model.layers = torch.nn.ModuleList([ref.model.layers[i] for i in (0, 3)])
    ref.config.num_hidden_layers = 2
    ref.config.layer_types = [ref.config.layer_types[i] for i in (0, 3)]
    with torch.no_grad():
        np.testing.assert_allclose(small(IDS).logits.numpy(), ref(IDS, use_cache=False).logits.numpy(), atol=1e-5)


@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_layer_choice_on_cuda_equals_the_cpu(qwen3, tokens):
    """The walks of the choice on the GPU, the refit weights read back there: the same layers."""
    from arrayprune.adapters.pipeline.shrink_structure import choose_layers

    cpu, cuda = (choose_layers(qwen3, 2, str(tokens), device=device) for device in ("cpu", "cuda"))
    assert [i for i, _ in cuda.order] == [i for i, _ in cpu.order]
    np.testing.assert_allclose([s for _, s in cuda.order], [s for _, s in cpu.order], rtol=1e-4)
    np.testing.assert_allclose(cuda.scores, cpu.scores, rtol=1e-4, atol=1e-7)


@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_layer_refit_on_cuda_equals_the_cpu(qwen3, tokens, tmp_path):
    """The walk and the solve on the GPU (float64 there): the same refit weights as on the CPU."""
    scores = forced_scores(qwen3, [1, 3])
    for device in ("cpu", "cuda"):
        done = shrink_layers(qwen3, tmp_path / device, 2, str(tokens), scores=scores, device=device)
        assert done.refits == {"model.layers.0.mlp.down_proj.weight": [1], "model.layers.2.mlp.down_proj.weight": [3]}
    cpu, cuda = load(tmp_path / "cpu"), load(tmp_path / "cuda")
    for name, value in cpu.state_dict().items():
        np.testing.assert_allclose(cuda.state_dict()[name].numpy(), value.numpy(), rtol=0,
                                   atol=1e-4 * float(value.abs().max()) + 1e-7)  # fmt: skip


@pytest.mark.slow
def test_padding_tokens_are_left_out_of_the_refit(qwen3, tmp_path):
    """Calibration with an ``attention_mask``: padded positions add nothing to ``X^T X`` nor ``X^T F``."""
    ids = np.random.default_rng(1).integers(0, 64, size=(4, 16))
    mask = np.ones_like(ids)
    mask[1, 10:] = mask[3, 5:] = 0
    padded = tmp_path / "padded.npz"
    np.savez(padded, input_ids=ids, attention_mask=mask)
    shrink_layers(qwen3, tmp_path / "small", 2, str(padded), scores=forced_scores(qwen3, [1, 2]))
    ref = reference_absorbed(tr.Qwen3ForCausalLM, qwen3, padded, [1, 2], lambda layer: layer.mlp.down_proj)
    got = load(tmp_path / "small").model.layers[0].mlp.down_proj.weight.detach().numpy()
    want = ref.model.layers[0].mlp.down_proj.weight.detach().numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


def _outputs(model, ids, mask=None):
    """Each layer's output hidden states (float64) and the first layer's input."""
    seen: dict = {}
    layers = _layer_list(model)
    handles = [layer.register_forward_hook(lambda m, a, o, i=i: seen.__setitem__(i, _hidden(o).double()))
               for i, layer in enumerate(layers)]  # fmt: skip
    handles.append(layers[0].register_forward_pre_hook(
        lambda m, args, kwargs: seen.__setitem__("in", (args[0] if args else kwargs["hidden_states"]).double()),
        with_kwargs=True,
    ))  # fmt: skip
    with torch.no_grad():
        model(ids, attention_mask=mask, use_cache=False)
    for h in handles:
        h.remove()
    return seen


def _one_minus_cos(a, b):
    return float((1 - torch.nn.functional.cosine_similarity(a, b, dim=-1)).mean())


def reference_refit_changes(cls, folder, tokens_path, writer_of):
    """Per layer ``i``: 1 - cosine between the dense stream after ``i`` and, once ``i`` is
    removed and refit into layer ``i - 1`` (:func:`reference_absorbed`, float64), the stream
    after ``i - 1``; layer 0 as it is left out."""
    ids = torch.from_numpy(np.load(tokens_path)["input_ids"])
    dense = _outputs(cls.from_pretrained(folder).eval().double(), ids)
    n = len([k for k in dense if k != "in"])
    scores = [_one_minus_cos(dense["in"], dense[0])]
    for i in range(1, n):
        refit = reference_absorbed(cls, folder, tokens_path, [i], writer_of)
        scores.append(_one_minus_cos(dense[i], _outputs(refit, ids)[i - 1]))
    return np.array(scores)


def greedy_kept(folder, tokens_path, count):
    """The layers kept by removing, `count` times, the lowest :func:`reference_refit_changes`
    score on the model shrunk so far (written with one layer fewer each time)."""
    import tempfile

    kept = list(range(len(reference_changes(folder, tokens_path))))
    with tempfile.TemporaryDirectory() as tmp:
        for step in range(count):
            scores = reference_refit_changes(tr.Qwen3ForCausalLM, folder, tokens_path, lambda lay: lay.mlp.down_proj)
            drop = int(np.argmin(scores))
            out = os.path.join(tmp, f"step{step}")
            shrink_layers(folder, out, 1, str(tokens_path), scores=forced_scores(folder, [drop]))
            kept.pop(drop)
            folder = out
    return kept


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen3", "gpt2"])
def test_layers_chosen_one_at_a_time_as_they_would_be_refit(family, qwen3, tokens, tmp_path):
    """Each step's scores equal a float64 reference on the model written with the layers
    chosen before removed and refit; GPT-2's ``Conv1D`` weights are read back transposed."""
    from arrayprune.adapters.pipeline.shrink_structure import choose_layers

    if family == "gpt2":
        torch.manual_seed(1)
        cfg = tr.GPT2Config(vocab_size=64, n_embd=32, n_layer=4, n_head=4, n_positions=64)
        dense = tmp_path / "dense"
        tr.GPT2LMHeadModel(cfg).eval().save_pretrained(dense, max_shard_size="20KB")
        cls, writer_of = tr.GPT2LMHeadModel, (lambda layer: layer.mlp.c_proj)
    else:
        dense, cls, writer_of = qwen3, tr.Qwen3ForCausalLM, (lambda layer: layer.mlp.down_proj)
    chosen = choose_layers(dense, 2, str(tokens))
    first = reference_refit_changes(cls, dense, tokens, writer_of)
    np.testing.assert_allclose(chosen.scores, first, rtol=1e-4, atol=1e-6)
    (one, score_one), (two, score_two) = chosen.order
    assert one == int(np.argmin(first)) and score_one == pytest.approx(first[one], rel=1e-4)
    shrink_layers(dense, tmp_path / "step1", 1, str(tokens), scores=forced_scores(dense, [one]))
    second = reference_refit_changes(cls, tmp_path / "step1", tokens, writer_of)
    left = [i for i in range(4) if i != one]
    assert two == left[int(np.argmin(second))]
    assert score_two == pytest.approx(second.min(), rel=1e-4)
    assert chosen.kept == {chosen.found.names[0].rsplit(".", 1)[0]: pytest.approx([i for i in left if i != two])}
    # The final refit is the joint one of each run, from the stored weights (as for forced scores).
    done = shrink_layers(dense, tmp_path / "small", 2, str(tokens))
    forced = shrink_layers(dense, tmp_path / "forced", 2, str(tokens), scores=forced_scores(dense, [one, two]))
    assert done.kept == forced.kept and done.refits == forced.refits
    for name in sorted(os.listdir(tmp_path / "small")):
        if name.endswith(".safetensors"):
            from safetensors.numpy import load_file

            got, want = load_file(tmp_path / "small" / name), load_file(tmp_path / "forced" / name)
            assert got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) for k in got)


@pytest.mark.slow
def test_dry_run_names_the_layers_chosen_one_at_a_time(qwen3, tokens, capsys):
    args = ["prune", str(qwen3), "--dry-run", "--shrink", "--groups", "layers", "--amount", "2",
            "--calibration", str(tokens)]  # fmt: skip
    capsys.readouterr()
    assert main(args) == 0
    captured = capsys.readouterr()
    kept = greedy_kept(qwen3, tokens, 2)
    removed = [i for i in range(4) if i not in kept]
    assert f"removed: {', '.join(map(str, removed))}" in captured.out
    assert "once the layer is removed and refit into it" in captured.out
    assert "layers chosen one at a time, each rescored on the model without those before it: " in captured.err
    assert main([*args, "--no-compensate"]) == 0
    captured = capsys.readouterr()
    plain = np.sort(np.argsort(reference_changes(qwen3, tokens), kind="stable")[:2]).tolist()
    assert f"removed: {', '.join(map(str, plain))}" in captured.out
    assert "1 - cosine(input, output)" in captured.out and "one at a time" not in captured.err


def _refit_changes(folder, tokens_path, **window):
    from arrayprune.adapters.pipeline import hf_structure as hs
    from arrayprune.adapters.pipeline import shrink_structure as ss
    from arrayprune.structured import absorb

    ckpt, config = ss.open_hf(str(folder))
    layers = ss.hf_layers(config, {n: t.shape for n, t in ckpt.tensors.items()})
    writers = {p: layers.writer(p)[0] for p in range(layers.units)}

    def refit(p, weight, hessian, cross):
        return absorb(weight, hessian, cross, 0.01, overwrite_hessian=True)

    with ss._walk(ckpt, str(tokens_path), None, None) as walk:
        return hs.refit_changes(walk, writers, refit, **window)


@pytest.mark.slow
def test_refit_changes_scores_a_window_of_layers(qwen3, tokens):
    """Layers before `start` are run, not scored; none from `stop` on; the window's refit is
    the reference's (layer 2 refit into layer 1's down_proj)."""
    full = _refit_changes(qwen3, tokens)
    part = _refit_changes(qwen3, tokens, start=2, stop=3)
    assert np.isnan(part.scores[[0, 1, 3]]).all()
    assert part.scores[2] == full.scores[2]
    layer, key, weight = part.lowest
    assert (layer, key) == (1, "model.layers.1.mlp.down_proj.weight")  # refit into layer 1
    ref = reference_absorbed(tr.Qwen3ForCausalLM, qwen3, tokens, [2], lambda lay: lay.mlp.down_proj)
    want = ref.model.layers[1].mlp.down_proj.weight.detach().numpy()
    np.testing.assert_allclose(weight.numpy(), want, rtol=0, atol=1e-5 * np.abs(want).max())


@pytest.mark.slow
def test_layer_choice_reuses_the_scores_nothing_changed(tokens, tmp_path, monkeypatch):
    """Each step rescores from the layer refit on: the same choice as rescoring every layer,
    with fewer layers scored."""
    from arrayprune.adapters.pipeline import layer_choice

    torch.manual_seed(3)
    cfg = tr.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=8,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)  # fmt: skip
    tr.LlamaForCausalLM(cfg).eval().save_pretrained(tmp_path / "dense")
    windows = []
    original = layer_choice.refit_changes

    def recorded(*args, start=0, stop=None, **kwargs):
        windows.append((start, stop))
        return original(*args, start=start, stop=stop, **kwargs)

    def everything(*args, start=0, stop=None, **kwargs):
        return original(*args, **kwargs)

    monkeypatch.setattr(layer_choice, "refit_changes", recorded)
    reused = layer_choice.choose_layers(tmp_path / "dense", 5, str(tokens))
    monkeypatch.setattr(layer_choice, "refit_changes", everything)
    full = layer_choice.choose_layers(tmp_path / "dense", 5, str(tokens))
    assert [i for i, _ in reused.order] == [i for i, _ in full.order]
    np.testing.assert_allclose([s for _, s in reused.order], [s for _, s in full.order], rtol=1e-9)
    np.testing.assert_array_equal(reused.scores, full.scores)
    assert windows[0] == (0, None) and any(start > 0 for start, _ in windows[1:]), windows
