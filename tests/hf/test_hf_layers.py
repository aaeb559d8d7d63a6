"""``--shrink --groups layers``: whole decoder layers removed from a Hugging Face folder.

A Qwen3 model with sliding-window and full-attention layers (``layer_types``) is saved
in several shards; its layers are scored on calibration token ids, and the result must
load with no missing, unexpected or mismatched key, hold ``num_hidden_layers`` and the
per-layer lists cut to the layers kept, equal the dense model run without the removed
layers, and generate. The scores are checked against hooks on the dense model's own
forward (float64 cosine of each layer's input and output).
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
    done = shrink_layers(qwen3, tmp_path / "small", 0.5, str(tokens))
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
    out = capsys.readouterr().out
    assert code == 0
    assert "layers model.layers (4 -> 3 layers)" in out and "1 - cosine" in out
    scores = reference_changes(qwen3, tokens)
    assert f"removed: {int(np.argmin(scores))}" in out
    code = main(["prune", str(qwen3), "-o", str(tmp_path / "out"), "--shrink", "--groups", "layers", "--amount",
                 "1", "--calibration", str(tokens), "--method", "ln_structured"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    with open(tmp_path / "out" / "config.json") as f:
        cfg = json.load(f)
    assert cfg["num_hidden_layers"] == 3 and cfg["arrayprune"]["method"] == "residual_change"
    assert cfg["arrayprune"]["shrink"] == "layers" and "calibration_sha256" in cfg["arrayprune"]


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--amount", "0.5"], ["--groups layers ranks layers", "--calibration"]),
        (["--amount", "4", "--calibration", "{tokens}"], ["would remove every one of the 4 layers"]),
        (["--amount", "0.5", "--calibration", "{tokens}", "--no-compensate"], ["--no-compensate"]),
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
    done = shrink_layers(tmp_path / "dense", tmp_path / "small", 2, str(tokens))
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
                        method="ln_structured")  # fmt: skip
    dropped = int(np.argmin(reference_changes(qwen3, tokens)))
    assert measured == [str(qwen3)]
    assert result.shrink.kept == {"model.layers": [i for i in range(4) if i != dropped]}
