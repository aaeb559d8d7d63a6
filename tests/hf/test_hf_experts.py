"""``--shrink --groups experts``: experts of mixture-of-experts layers removed (Mixtral, Qwen2-MoE, Qwen3-MoE).

Each case saves a tiny random model in several shards (transformers writes one set of
tensors per expert), removes experts by their router statistics on calibration token
ids, and checks against references computed here: the scores from the dense model's own
router logits (``output_router_logits``), the result equal to the dense model with
those experts' router logits at -inf, loaded with no missing, unexpected or mismatched
key, and generating.
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
from arrayprune.adapters.pipeline.shrink_structure import shrink_experts  # noqa: E402
from cli_helpers import assert_error, run  # noqa: E402
from hf_models import IDS, load, save_family, tensors  # noqa: E402

COUNT_KEY = {"mixtral": "num_local_experts", "qwen2_moe": "num_experts", "qwen3_moe": "num_local_experts"}
BLOCK = {"mixtral": "block_sparse_moe", "qwen2_moe": "mlp", "qwen3_moe": "mlp"}


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    path = tmp_path_factory.mktemp("tokens") / "tokens.npz"
    np.savez(path, input_ids=np.random.default_rng(1).integers(0, 64, size=(6, 16)))
    return path


def router_scores(cls, folder, tokens_path, top_k=2):
    """Per layer: the routing weight per token each expert gets, from the dense model's router logits."""
    model = cls.from_pretrained(folder).eval()
    ids = torch.from_numpy(np.load(tokens_path)["input_ids"])
    with torch.no_grad():
        logits = model(ids, output_router_logits=True).router_logits
    out = []
    for layer in logits:
        probs = torch.softmax(layer.double().reshape(-1, layer.shape[-1]), dim=-1).numpy()
        top = np.argsort(-probs, axis=1, kind="stable")[:, :top_k]
        mass = np.zeros(probs.shape[1])
        for row, chosen in zip(probs, top, strict=True):
            mass[chosen] += row[chosen]
        out.append(mass / probs.shape[0])
    return out


class _MinusInf:
    """Router logits of the `removed` experts at -inf in a dense model (the reference)."""

    def __init__(self, model, block, removed):
        self.handles = []
        for i, layer in enumerate(model.model.layers):
            router = (getattr(layer, block, None) or layer.mlp).gate  # transformers 5 names Mixtral's block mlp
            self.handles.append(router.register_forward_pre_hook(self._patch(router, removed[i])))
            self.handles.append(router.register_forward_hook(self._restore))

    def _patch(self, router, removed):
        def hook(module, args):
            original = torch.nn.functional.linear

            def linear(x, w, b=None):
                y = original(x, w, b)
                if w is router.weight:
                    y = y.clone()
                    y[..., removed] = -torch.inf
                return y

            self.original = original
            torch.nn.functional.linear = linear

        return hook

    def _restore(self, module, args, output):
        torch.nn.functional.linear = self.original


@pytest.mark.slow
@pytest.mark.parametrize(
    ("family", "amount", "kept_count"), [("mixtral", 1, 3), ("qwen2_moe", 0.5, 2), ("qwen3_moe", 1, 3)]
)
def test_experts_removed_equal_router_logits_at_minus_inf(tmp_path, tokens, family, amount, kept_count):
    cls = save_family(tmp_path / "dense", family, shard="8KB")
    done = shrink_experts(tmp_path / "dense", tmp_path / "small", amount, str(tokens))
    want = router_scores(cls, tmp_path / "dense", tokens)
    block = BLOCK[family]
    removed = []
    for i in range(2):
        name = f"model.layers.{i}.{block}"
        np.testing.assert_allclose(done.report.scores[name], want[i], rtol=1e-6, atol=1e-6)
        kept = np.sort(np.argsort(want[i], kind="stable")[4 - kept_count :])
        assert done.kept[name] == kept.tolist()
        removed.append(np.setdiff1d(np.arange(4), kept))
    with open(tmp_path / "small" / "config.json") as f:
        cfg = json.load(f)
    assert cfg[COUNT_KEY[family]] == kept_count and cfg["num_experts_per_tok"] == 2
    dense, small = tensors(tmp_path / "dense"), tensors(tmp_path / "small")
    for i in range(2):
        p = f"model.layers.{i}.{block}."
        kept = done.kept[p[:-1]]
        np.testing.assert_array_equal(small[p + "gate.weight"], dense[p + "gate.weight"][kept])
        for j, e in enumerate(kept):  # experts renumbered in order
            for n in [k for k in dense if k.startswith(f"{p}experts.{e}.")]:
                np.testing.assert_array_equal(small[n.replace(f"experts.{e}.", f"experts.{j}.")], dense[n])
        assert not [k for k in small if k.startswith(f"{p}experts.{kept_count}.")]
    with torch.no_grad():
        got = load(cls, tmp_path / "small")
        reference = cls.from_pretrained(tmp_path / "dense").eval()
        full = reference(IDS).logits.numpy()
        _MinusInf(reference, block, removed)
        np.testing.assert_allclose(got(IDS).logits.numpy(), reference(IDS).logits.numpy(), rtol=0, atol=1e-5)
    assert not np.allclose(got(IDS).logits.detach().numpy(), full, atol=1e-4)  # the experts did matter
    out = got.generate(IDS[:, :4], max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert out.shape == (1, 8)


@pytest.mark.slow
def test_experts_by_weight_norm_and_cli(tmp_path, tokens, capsys):
    save_family(tmp_path / "dense", "mixtral", shard="8KB")
    capsys.readouterr()
    code = main(["prune", str(tmp_path / "dense"), "-o", str(tmp_path / "small"), "--shrink", "--groups", "experts",
                 "--amount", "2", "--method", "ln_structured"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    assert f"shrunk the experts of {tmp_path / 'dense'} (ln_structured, amount 2): " in capsys.readouterr().out
    dense = tensors(tmp_path / "dense")
    for i in range(2):
        p = f"model.layers.{i}.block_sparse_moe.experts."
        norms = [np.sqrt(sum((dense[f"{p}{e}.{w}.weight"].astype(np.float64) ** 2).sum() for w in ("w1", "w2", "w3")))
                 for e in range(4)]  # fmt: skip
        kept = np.sort(np.argsort(norms, kind="stable")[2:])
        small = tensors(tmp_path / "small")
        np.testing.assert_array_equal(small[f"{p}1.w2.weight"], dense[f"{p}{kept[1]}.w2.weight"])
    code = main(["prune", str(tmp_path / "dense"), "--dry-run", "--shrink", "--groups", "experts", "--amount", "1",
                 "--calibration", str(tokens), "--method", "ln_structured"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0 and "experts model.layers.1.block_sparse_moe (4 -> 3 experts)" in out and "removed: " in out
    assert "experts of " in out and "(Hugging Face checkpoint), router_statistics, amount 1; nothing is written" in out


def test_too_few_experts_refused(tmp_path):
    save_family(tmp_path / "dense", "mixtral", shard="8KB")
    proc = run("prune", tmp_path / "dense", "-o", tmp_path / "out", "--shrink", "--groups", "experts", "--amount",
               "3", "--method", "ln_structured")  # fmt: skip
    assert_error(proc, "would leave 1 experts per layer, fewer than num_experts_per_tok=2")
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.slow
def test_fused_experts_are_sliced(tmp_path, tokens):
    """A folder storing each layer's experts fused (``experts.gate_up_proj`` ``[experts, 2 x inner, hidden]``,
    as transformers 5 names its parameters) shrinks as the same model stored per expert."""
    from safetensors.numpy import save_file

    cls = save_family(tmp_path / "dense", "qwen2_moe", shard="8KB")
    t = tensors(tmp_path / "dense")
    fused = {k: v for k, v in t.items() if ".experts." not in k}
    for i in range(2):
        p = f"model.layers.{i}.mlp.experts."
        fused[p + "gate_up_proj"] = np.stack(
            [np.concatenate([t[f"{p}{e}.gate_proj.weight"], t[f"{p}{e}.up_proj.weight"]]) for e in range(4)]
        )
        fused[p + "down_proj"] = np.stack([t[f"{p}{e}.down_proj.weight"] for e in range(4)])
    (tmp_path / "fused").mkdir()
    save_file(fused, tmp_path / "fused" / "model.safetensors", metadata={"format": "pt"})
    (tmp_path / "fused" / "config.json").write_bytes((tmp_path / "dense" / "config.json").read_bytes())
    per_expert = shrink_experts(tmp_path / "dense", tmp_path / "a", 0.5, str(tokens))
    done = shrink_experts(tmp_path / "fused", tmp_path / "b", 0.5, str(tokens))
    assert done.kept == per_expert.kept
    small = tensors(tmp_path / "b")
    for i in range(2):
        kept = done.kept[f"model.layers.{i}.mlp"]
        p = f"model.layers.{i}.mlp.experts."
        np.testing.assert_array_equal(small[p + "gate_up_proj"], fused[p + "gate_up_proj"][kept])
        np.testing.assert_array_equal(small[p + "down_proj"], fused[p + "down_proj"][kept])
    with torch.no_grad():
        got, want = load(cls, tmp_path / "b")(IDS).logits, load(cls, tmp_path / "a")(IDS).logits
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=0, atol=1e-6)
