"""``arrayprune eval``: loss, perplexity, KL and cosine to the dense model, layer by layer.

Every figure is checked against a full in-memory forward of the model loaded by
``from_pretrained`` (float64 NumPy on its logits and last hidden states), on sharded
random-init Llama, GPT-2 (tied embeddings, learned positions), Mixtral and Qwen3-MoE
(experts stored one per tensor, fused in the module) folders.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from arrayprune.adapters import prune_file  # noqa: E402
from arrayprune.adapters.pipeline.evaluate import evaluate  # noqa: E402
from cli_helpers import assert_error, run  # noqa: E402
from hf_models import VOCAB, save_sharded_llama  # noqa: E402

SEQ = 12


def _gpt2(folder):
    config = transformers.GPT2Config(
        n_embd=32, n_head=4, n_layer=2, vocab_size=VOCAB, n_positions=16, bos_token_id=0, eos_token_id=0
    )
    torch.manual_seed(1)
    transformers.GPT2LMHeadModel(config).eval().save_pretrained(folder, max_shard_size="20KB")
    return folder


def _mixtral(folder):
    config = transformers.MixtralConfig(
        hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        num_local_experts=4, num_experts_per_tok=2, vocab_size=VOCAB, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(2)
    transformers.MixtralForCausalLM(config).eval().save_pretrained(folder, max_shard_size="20KB")
    return folder


def _qwen3_moe(folder):
    config = transformers.Qwen3MoeConfig(
        hidden_size=32, intermediate_size=48, moe_intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, num_experts=4, num_experts_per_tok=2, vocab_size=VOCAB,
        max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(3)
    transformers.Qwen3MoeForCausalLM(config).eval().save_pretrained(folder, max_shard_size="20KB")
    return folder


def _qwen3_sliding(folder):
    """Sliding-window and full-attention layers: each layer runs with its own mask."""
    config = transformers.Qwen3Config(
        hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        head_dim=8, vocab_size=VOCAB, max_position_embeddings=64, use_sliding_window=True, sliding_window=4,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    )  # fmt: skip
    torch.manual_seed(4)
    transformers.Qwen3ForCausalLM(config).eval().save_pretrained(folder, max_shard_size="20KB")
    return folder


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval")
    ids = np.random.default_rng(0).integers(0, VOCAB, (10, SEQ))
    np.savez(root / "tokens.npz", input_ids=ids)
    folders = {
        "llama": save_sharded_llama(root / "llama"),
        "gpt2": _gpt2(root / "gpt2"),
        "mixtral": _mixtral(root / "mixtral"),
        "qwen3_moe": _qwen3_moe(root / "qwen3_moe"),
        "qwen3_sliding": _qwen3_sliding(root / "qwen3_sliding"),
    }
    return root, folders, ids


def _forward(folder, ids, mask=None):
    """Logits and the last hidden state (after the final norm) of the whole model, in memory."""
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        out = model(
            input_ids=torch.from_numpy(ids),
            attention_mask=None if mask is None else torch.from_numpy(mask),
            output_hidden_states=True,
            use_cache=False,
        )
    hidden = model.base_model(
        input_ids=torch.from_numpy(ids), attention_mask=None if mask is None else torch.from_numpy(mask)
    ).last_hidden_state
    return out.logits.double().numpy(), hidden.detach().double().numpy()


def _log_softmax(logits):
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def _reference(folder, ids, dense=None, mask=None):
    """float64 NumPy: token-weighted loss; KL(dense || model) and cosine over valid positions."""
    mask = np.ones_like(ids) if mask is None else mask
    logits, hidden = _forward(folder, ids, mask)
    logp = _log_softmax(logits)
    counted = (mask[:, :-1] == 1) & (mask[:, 1:] == 1)
    picked = np.take_along_axis(logp[:, :-1], ids[:, 1:, None], -1)[..., 0]
    loss = -picked[counted].mean()
    out = {"loss": loss, "perplexity": math.exp(loss), "tokens": int(counted.sum())}
    if dense is not None:
        dense_logits, dense_hidden = _forward(dense, ids, mask)
        p = _log_softmax(dense_logits)
        valid = mask == 1
        out["kl_to_dense"] = (np.exp(p) * (p - logp)).sum(-1)[valid].mean()
        a, b = hidden[valid], dense_hidden[valid]
        out["cosine_to_dense"] = ((a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)).mean()
    return out


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", "gpt2", "mixtral", "qwen3_moe", "qwen3_sliding"])
def test_loss_equals_a_whole_forward_of_transformers(models, family):
    root, folders, ids = models
    folder = folders[family]
    got = evaluate(folder, root / "tokens.npz", batch=4)  # 10 sequences: batches of 4, 4, 2
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        loss = float(model(input_ids=torch.from_numpy(ids), labels=torch.from_numpy(ids)).loss)
    assert got.tokens == 10 * (SEQ - 1) and got.sequences == 10
    assert got.loss == pytest.approx(loss, rel=1e-5)
    assert got.perplexity == pytest.approx(math.exp(loss), rel=1e-5)
    assert got.loss == pytest.approx(_reference(folder, ids)["loss"], rel=1e-6)
    assert got.kl_to_dense is None and got.cosine_to_dense is None


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", "mixtral"])
def test_against_itself_kl_is_zero_and_cosine_one(models, family):
    root, folders, _ = models
    got = evaluate(folders[family], root / "tokens.npz", compare=folders[family])
    assert abs(got.kl_to_dense) < 1e-12 and got.cosine_to_dense == pytest.approx(1.0, abs=1e-12)
    assert got.dense_loss == got.loss and got.positions == 10 * SEQ


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_after_pruning_kl_and_cosine_equal_the_reference(models, family, tmp_path):
    root, folders, ids = models
    dense = folders[family]
    pruned = tmp_path / "pruned"
    prune_file(dense, pruned, amount=0.5)  # magnitude, every weight of the layers
    got = evaluate(pruned, root / "tokens.npz", compare=dense, batch=3)
    want = _reference(pruned, ids, dense=dense)
    assert got.kl_to_dense > 1e-4 and got.cosine_to_dense < 0.9999
    assert got.kl_to_dense == pytest.approx(want["kl_to_dense"], rel=1e-4)
    assert got.cosine_to_dense == pytest.approx(want["cosine_to_dense"], rel=1e-6)
    assert got.loss == pytest.approx(want["loss"], rel=1e-5)
    assert got.dense_loss == pytest.approx(_reference(dense, ids)["loss"], rel=1e-5)


@pytest.mark.slow
def test_an_attention_mask_counts_only_valid_predictions(models, tmp_path):
    root, folders, ids = models
    mask = np.ones_like(ids)
    mask[0, 8:] = 0  # right padding
    mask[3, 5:] = 0
    tokens = tmp_path / "masked.npz"
    np.savez(tokens, input_ids=ids, attention_mask=mask)
    pruned = tmp_path / "pruned"
    prune_file(folders["llama"], pruned, amount=0.3)
    got = evaluate(pruned, tokens, compare=folders["llama"])
    want = _reference(pruned, ids, dense=folders["llama"], mask=mask)
    assert got.tokens == want["tokens"] == 10 * (SEQ - 1) - 4 - 7
    assert got.positions == int(mask.sum())
    assert got.loss == pytest.approx(want["loss"], rel=1e-5)
    assert got.kl_to_dense == pytest.approx(want["kl_to_dense"], rel=1e-4)
    assert got.cosine_to_dense == pytest.approx(want["cosine_to_dense"], rel=1e-6)


@pytest.mark.slow
def test_the_command_prints_one_line_and_writes_json(models, tmp_path):
    root, folders, ids = models
    out = tmp_path / "eval.json"
    proc = run("eval", folders["llama"], "--tokens", root / "tokens.npz", "--compare", folders["llama"],
               "--json", out)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    figures = json.loads(out.read_text())
    want = _reference(folders["llama"], ids)
    assert figures["perplexity"] == pytest.approx(want["perplexity"], rel=1e-5)
    assert figures["loss"] == pytest.approx(want["loss"], rel=1e-5)
    assert figures["tokens"] == 10 * (SEQ - 1)
    assert abs(figures["kl_to_dense"]) < 1e-12 and figures["cosine_to_dense"] == pytest.approx(1.0)
    lines = proc.stdout.splitlines()
    assert len(lines) == 1 and f"perplexity {want['perplexity']:.4f}" in lines[0] and "kl_to_dense 0" in lines[0]
    again = run("eval", folders["llama"], "--tokens", root / "tokens.npz", "--json", out)
    assert_error(again, "--json: exists; use --force")


@pytest.mark.slow
def test_bad_token_files_are_one_line_errors(models, tmp_path):
    root, folders, _ = models
    llama = folders["llama"]
    cases = {
        "ids.npz": ({"tokens": np.zeros((2, 4), np.int64)}, "needs 'input_ids'"),
        "range.npz": ({"input_ids": np.full((2, 4), VOCAB)}, f"token ids must be in [0, {VOCAB})"),
        "float.npz": ({"input_ids": np.zeros((2, 4))}, "must be [batch, seq] integers"),
        "short.npz": ({"input_ids": np.zeros((2, 1), np.int64)}, "needs at least 2"),
        "mask.npz": ({"input_ids": np.zeros((2, 4), np.int64), "attention_mask": np.full((2, 4), 2)}, "0 and 1"),
        "empty.npz": ({"input_ids": np.zeros((2, 4), np.int64), "attention_mask": np.zeros((2, 4))}, "no next-token"),
    }
    for name, (arrays, fragment) in cases.items():
        np.savez(tmp_path / name, **arrays)
        with pytest.raises(ValueError, match="^[^\n]*$") as caught:
            evaluate(llama, tmp_path / name)
        assert fragment in str(caught.value) and name in str(caught.value)
    # the command: one line, no traceback (each run starts Python and transformers: a few)
    assert_error(run("eval", llama, "--tokens", tmp_path / "range.npz"), "range.npz", "token ids must be in")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    assert_error(run("eval", llama, "--tokens", tmp_path / "junk.npz"), "junk.npz")
    assert_error(run("eval", tmp_path, "--tokens", root / "tokens.npz"), "not a Hugging Face folder")
    with pytest.raises(ValueError, match="--device: expected cpu, cuda or cuda:N"):
        evaluate(llama, root / "tokens.npz", device="tpu")
    long = tmp_path / "long.npz"
    np.savez(long, input_ids=np.zeros((1, 17), np.int64))
    with pytest.raises(ValueError, match="longer than the 16 positions"):
        evaluate(folders["gpt2"], long)
    small = tmp_path / "small"
    save_sharded_llama(small, transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
        vocab_size=VOCAB // 2, max_position_embeddings=64), shard="20KB")  # fmt: skip
    with pytest.raises(ValueError, match="vocabulary"):
        evaluate(small, root / "tokens.npz", compare=llama)


@pytest.mark.slow
def test_prune_verify_on_a_folder_runs_eval_against_the_input(models, tmp_path):
    root, folders, _ = models
    llama, out = folders["llama"], tmp_path / "out"
    proc = run("prune", llama, "-o", out, "--amount", "0.4", "--verify", "--verify-data", root / "tokens.npz")
    assert proc.returncode == 0, proc.stderr
    want = evaluate(out, root / "tokens.npz", compare=llama)
    assert want.kl_to_dense > 0
    assert proc.stdout.splitlines()[-1] == f"verify: {want.summary()}"


@pytest.mark.slow
def test_prune_verify_on_a_folder_checks_its_tokens_before_writing(models, tmp_path):
    root, folders, _ = models
    llama, out = folders["llama"], tmp_path / "out"
    with pytest.raises(ValueError, match="give --verify-data TOKENS.npz"):
        prune_file(llama, out, amount=0.4, verify=True)
    np.savez(tmp_path / "range.npz", input_ids=np.full((2, 4), VOCAB))
    with pytest.raises(ValueError, match=f"range.npz: --verify: token ids must be in \\[0, {VOCAB}\\)"):
        prune_file(llama, out, amount=0.4, verify=True, verify_data=tmp_path / "range.npz")
    with pytest.raises(ValueError, match="--verify-tol gates ONNX outputs"):
        prune_file(llama, out, amount=0.4, verify=True, verify_data=root / "tokens.npz", verify_tol=(0.1, 0.0))
    assert not out.exists()
