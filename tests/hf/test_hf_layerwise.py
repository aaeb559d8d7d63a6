"""``arrayprune prune HF_FOLDER --calibration tokens.npz``: SparseGPT and Wanda layer by layer.

A random-init ``LlamaForCausalLM`` with grouped-query attention, saved sharded by
``save_pretrained``: the command's SparseGPT weights equal those of the PyTorch path
(:func:`arrayprune.adapters.torch.sparsegpt` on the whole model, same calibration tokens,
same sequential order), its logits are closer to the dense model's than Wanda's, each
weight loses exactly its count, everything else is copied bit for bit; ``--hessians``
equals the core on the same Hessians; bad inputs are one line, exit status 2.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

import arrayprune as ap  # noqa: E402
import arrayprune.adapters.torch as prune  # noqa: E402
from arrayprune.adapters import prune_file  # noqa: E402
from arrayprune.adapters.pipeline.request import PruneError  # noqa: E402
from cli_helpers import assert_error, run  # noqa: E402
from hf_models import VOCAB, save_sharded_llama  # noqa: E402

ROWS = 8  # calibration sequences per forward (the command's default)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """The folder of a sharded random-init Llama, calibration tokens, held-out tokens."""
    root = tmp_path_factory.mktemp("llama")
    folder = save_sharded_llama(root / "llama")
    rng = np.random.default_rng(0)
    tokens = root / "tokens.npz"
    ids = rng.integers(0, VOCAB, (16, 12))
    np.savez(tokens, input_ids=ids)
    held_out = torch.from_numpy(rng.integers(0, VOCAB, (8, 12)))
    return folder, tokens, ids, held_out


def _tensors(folder):
    out = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".safetensors"):
            out.update(safetensors_numpy.load_file(os.path.join(folder, name)))
    return out


def _layer_linears(model):
    return [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and ".layers." in n]


def _torch_path(folder, ids, **options):
    """``prune.sparsegpt`` on the whole model: the pruned weights by name."""
    model = transformers.LlamaForCausalLM.from_pretrained(folder).eval()
    batches = [{"input_ids": torch.from_numpy(ids[i : i + ROWS]), "use_cache": False} for i in range(0, len(ids), ROWS)]
    prune.sparsegpt(model, batches, modules=_layer_linears(model), **options)
    return {f"{n}.weight": model.get_submodule(n).weight.detach().numpy() for n in _layer_linears(model)}


def _logits(folder, tokens):
    model = transformers.LlamaForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        return model(input_ids=tokens).logits.double().numpy()


@pytest.mark.parametrize(
    ("cli", "torch_options"),
    [({"amount": 0.5}, {"amount": 0.5}), ({"nm": (2, 4)}, {"n": 2, "m": 4})],
    ids=["50%", "2:4"],
)
def test_sparsegpt_equals_the_torch_path_and_beats_wanda(llama, tmp_path, cli, torch_options):
    folder, tokens, ids, held_out = llama
    out = tmp_path / "gpt"
    result = prune_file(folder, out, method="sparsegpt", calibration=tokens, **cli)
    want = _torch_path(folder, ids, **torch_options)
    got, dense = _tensors(out), _tensors(folder)
    assert set(result.written.by_tensor) == set(want)
    for name, weight in want.items():
        np.testing.assert_allclose(got[name], weight, rtol=1e-5, atol=1e-6, err_msg=name)
        assert np.array_equal(got[name] == 0, weight == 0), name
        assert not np.array_equal(got[name], dense[name] * (got[name] != 0)), f"{name}: kept weights not updated"
        count = weight.size // 2  # round(0.5 * size) and 2 of every 4
        assert int((got[name] == 0).sum()) == count == result.written.by_tensor[name][0], name
        if "nm" in cli:
            assert ((got[name].reshape(weight.shape[0], -1, 4) == 0).sum(-1) == 2).all(), name
    for name in dense.keys() - want.keys():  # embeddings, norms, lm_head: the same bytes
        assert got[name].dtype == dense[name].dtype and got[name].tobytes() == dense[name].tobytes(), name
    assert sorted(os.listdir(out)) == sorted(os.listdir(folder))

    wanda = tmp_path / "wanda"
    prune_file(
        folder,
        wanda,
        method="wanda" if "amount" in cli else "nm_structured",
        calibration=tokens,
        **cli,
    )
    w = _tensors(wanda)
    for name in want:
        assert int((w[name] == 0).sum()) == want[name].size // 2, name
    reference = _logits(folder, held_out)
    error_gpt = np.linalg.norm(_logits(out, held_out) - reference)
    error_wanda = np.linalg.norm(_logits(wanda, held_out) - reference)
    print(f"logit error: sparsegpt {error_gpt:.4f}, wanda {error_wanda:.4f}")
    assert error_gpt < 0.95 * error_wanda, (error_gpt, error_wanda)


def test_wanda_norms_come_from_the_layer_by_layer_run(llama, tmp_path):
    """Layer 0's Wanda mask is the one of the norms of its inputs; layer 1's of the pruned layer 0's outputs."""
    folder, tokens, ids, _ = llama
    out = tmp_path / "wanda"
    prune_file(folder, out, method="wanda", amount=0.5, calibration=tokens)
    got = _tensors(out)

    model = transformers.LlamaForCausalLM.from_pretrained(folder).eval()
    batches = [{"input_ids": torch.from_numpy(ids[i : i + ROWS]), "use_cache": False} for i in range(0, len(ids), ROWS)]
    for layer in range(2):
        names = [n for n in _layer_linears(model) if f".layers.{layer}." in n]
        norms = prune.input_norms(model, batches, modules=names)
        for name in names:
            weight = model.get_submodule(name).weight
            scores = weight.detach().abs() * norms[f"{name}.weight"][None, :]
            keep = torch.ones_like(weight, dtype=torch.bool)
            drop = torch.argsort(scores, dim=1, stable=True)[:, : weight.shape[1] // 2]
            keep.scatter_(1, drop, False)
            with torch.no_grad():
                weight.mul_(keep)
            np.testing.assert_array_equal(got[f"{name}.weight"], weight.detach().numpy(), err_msg=name)


def test_one_pass_differs_from_sequential_in_the_second_layer_only(llama, tmp_path):
    folder, tokens, _, _ = llama
    prune_file(folder, tmp_path / "seq", method="sparsegpt", amount=0.5, calibration=tokens)
    prune_file(folder, tmp_path / "one", method="sparsegpt", amount=0.5, calibration=tokens, one_pass=True)
    seq, one = _tensors(tmp_path / "seq"), _tensors(tmp_path / "one")
    # q/k/v of layer 0 read the embeddings in both modes; layer 1 reads pruned or dense outputs
    for proj in ("q_proj", "k_proj", "v_proj"):
        name = f"model.layers.0.self_attn.{proj}.weight"
        np.testing.assert_allclose(seq[name], one[name], rtol=1e-5, atol=1e-6)
    assert not np.allclose(seq["model.layers.1.mlp.down_proj.weight"], one["model.layers.1.mlp.down_proj.weight"])


@pytest.mark.slow
def test_the_command_writes_what_prune_file_writes(llama, tmp_path):
    folder, tokens, _, _ = llama
    prune_file(folder, tmp_path / "a", method="sparsegpt", nm=(2, 4), calibration=tokens)
    proc = run("prune", folder, "-o", tmp_path / "b", "--method", "sparsegpt", "--nm", "2:4", "--calibration", tokens)
    assert proc.returncode == 0, proc.stderr
    for name in os.listdir(tmp_path / "a"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


@pytest.mark.slow
def test_hessians_file_equals_the_core(llama, tmp_path):
    folder, _, _, _ = llama
    dense = _tensors(folder)
    names = [n for n in dense if ".layers." in n and n.endswith("proj.weight")]
    rng = np.random.default_rng(1)
    hessians = {}
    for name in names:
        x = rng.standard_normal((200, dense[name].shape[1])) @ rng.standard_normal((dense[name].shape[1],) * 2)
        hessians[name] = x.T @ x / len(x)
    np.savez(tmp_path / "h.npz", **hessians)
    proc = run(
        "prune",
        folder,
        "-o",
        tmp_path / "out",
        "--method",
        "sparsegpt",
        "--amount",
        "0.5",
        "--hessians",
        tmp_path / "h.npz",
    )
    assert proc.returncode == 0, proc.stderr
    got = _tensors(tmp_path / "out")
    for name in names:
        want, _ = ap.sparsegpt(dense[name], hessians[name], 0.5, reduction_axis=1)
        np.testing.assert_array_equal(got[name], np.asarray(want, dtype=np.float32), err_msg=name)
        assert int((got[name] == 0).sum()) == dense[name].size // 2
    for name in dense.keys() - set(names):
        assert got[name].tobytes() == dense[name].tobytes(), name


def _hf_copy(folder, tmp_path, drop_config=False):
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    if drop_config:
        os.remove(copy / "config.json")
    return copy


@pytest.mark.parametrize(
    ("case", "fragments"),
    [
        ("out_of_vocab", ["token ids must be in [0, 128)", "holds 1..128"]),
        ("no_input_ids", ["'input_ids'", "x"]),
        ("no_config", ["Hugging Face folder (config.json"]),
        ("remote_architecture", ["names no architecture of transformers", "remote code is not run"]),
        ("hessian_shape", ["must be finite floats of shape [64, 64]", "got float64 [3, 3]"]),
        ("hessian_missing", ["no Hessian for 'model.layers.0.mlp.down_proj.weight'"]),
        ("hessians_with_wanda", ["--hessians gives the Hessians of sparsegpt"]),
        ("hessians_on_onnx", ["--hessians applies to safetensors"]),
        ("hessian_all_zero", ["the Hessian of 'model.layers.1.mlp.up_proj.weight' is all zero"]),
        ("zero_attention_mask", ["'model.layers.0.self_attn.o_proj'", "the Hessian is all zero"]),
        ("overflowing_embeddings", ["'model.layers.0.self_attn.q_proj'", "the Hessian is all zero"]),
    ],
)
@pytest.mark.slow
def test_bad_inputs_are_one_line_and_write_nothing(llama, tmp_path, case, fragments):
    folder, tokens, ids, _ = llama
    args = ["--method", "sparsegpt", "--amount", "0.5", "--calibration", tokens]
    src = folder
    if case == "out_of_vocab":
        np.savez(tmp_path / "bad.npz", input_ids=np.array([[1, 2, VOCAB]]))
        args[-1] = tmp_path / "bad.npz"
    elif case == "no_input_ids":
        np.savez(tmp_path / "bad.npz", x=ids)
        args[-1] = tmp_path / "bad.npz"
    elif case == "no_config":
        src = _hf_copy(folder, tmp_path, drop_config=True)
    elif case == "remote_architecture":
        src = _hf_copy(folder, tmp_path)
        config = json.loads((src / "config.json").read_text())
        config["architectures"] = ["MyOwnForCausalLM"]
        (src / "config.json").write_text(json.dumps(config))
    elif case == "zero_attention_mask":  # every position masked: o_proj's inputs are all 0
        np.savez(tmp_path / "bad.npz", input_ids=ids, attention_mask=np.zeros_like(ids))
        args[-1] = tmp_path / "bad.npz"
    elif case == "overflowing_embeddings":  # the first norm overflows: q/k/v see zeros
        model = transformers.LlamaForCausalLM.from_pretrained(folder)
        with torch.no_grad():
            model.model.embed_tokens.weight.mul_(1e38)
        src = tmp_path / "big"
        model.save_pretrained(src)
    elif case.startswith("hessian"):
        dense = _tensors(folder)
        hessians = {n: np.eye(v.shape[1]) for n, v in dense.items() if ".layers." in n and n.endswith("proj.weight")}
        if case == "hessian_shape":
            hessians["model.layers.0.self_attn.q_proj.weight"] = np.eye(3)
        elif case == "hessian_missing":
            del hessians["model.layers.0.mlp.down_proj.weight"]
        elif case == "hessian_all_zero":
            hessians["model.layers.1.mlp.up_proj.weight"] *= 0
        np.savez(tmp_path / "h.npz", **hessians)
        args = ["--method", "wanda" if case == "hessians_with_wanda" else "sparsegpt", "--amount", "0.5"]
        args += ["--hessians", tmp_path / "h.npz"]
        if case == "hessians_on_onnx":
            src = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "examples", "mlp.onnx")
    out = tmp_path / ("out.onnx" if case == "hessians_on_onnx" else "out")
    assert_error(run("prune", src, "-o", out, *args), *fragments)
    assert not os.path.exists(out)
    assert [n for n in os.listdir(tmp_path) if n.startswith(".arrayprune")] == []


def test_missing_transformers_names_the_extra(llama, tmp_path):
    folder, tokens, _, _ = llama
    blocker = tmp_path / "blocker"
    (blocker / "transformers").mkdir(parents=True)
    (blocker / "transformers" / "__init__.py").write_text("raise ImportError('blocked for the test')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(blocker), os.environ.get("PYTHONPATH", "")])}
    out = tmp_path / "out"
    proc = run("prune", folder, "-o", out, "--method", "sparsegpt", "--amount", "0.5", "--calibration", tokens, env=env)
    assert_error(proc, "needs the 'transformers' package", 'pip install "arrayprune[transformers]"')
    assert not os.path.exists(out)


def test_prune_file_errors_are_prune_errors(llama, tmp_path):
    folder, _, _, _ = llama
    np.savez(tmp_path / "bad.npz", input_ids=np.array([[-1, 2]]))
    with pytest.raises(PruneError, match=r"token ids must be in \[0, 128\)"):
        prune_file(folder, tmp_path / "out", method="wanda", amount=0.5, calibration=tmp_path / "bad.npz")
    assert not os.path.exists(tmp_path / "out")


def test_one_layer_holds_values_at_a_time(llama, tmp_path, monkeypatch):
    """While a layer is pruned, the other layers and lm_head are on the meta device (no memory)."""
    from arrayprune.adapters.pipeline import hf_calibration

    folder, tokens, _, _ = llama
    built, seen = [], []
    skeleton, replay = hf_calibration._skeleton, hf_calibration._replay

    def recording_skeleton(path):
        model, config = skeleton(path)
        built.append(model)
        return model, config

    def checking_replay(layer, inputs):
        model = built[-1]  # the plan builds one too, to find the layers
        holding = [i for i, lay in enumerate(model.model.layers) if any(not p.is_meta for p in lay.parameters())]
        seen.append(holding)
        assert model.lm_head.weight.is_meta
        return replay(layer, inputs)

    monkeypatch.setattr(hf_calibration, "_skeleton", recording_skeleton)
    monkeypatch.setattr(hf_calibration, "_replay", checking_replay)
    prune_file(folder, tmp_path / "out", method="sparsegpt", amount=0.5, calibration=tokens)
    assert seen == [[0], [1]]


@pytest.mark.slow
def test_bert_encoder_layers_equal_the_torch_path(tmp_path):
    """``encoder.layer`` of a BertModel (with an attention mask); the pooler, outside the layers, left with a note."""
    config = transformers.BertConfig(
        hidden_size=32,
        num_attention_heads=4,
        num_hidden_layers=2,
        intermediate_size=64,
        vocab_size=VOCAB,
        max_position_embeddings=32,
    )
    torch.manual_seed(1)
    transformers.BertModel(config).eval().save_pretrained(tmp_path / "bert")
    rng = np.random.default_rng(2)
    ids = rng.integers(0, VOCAB, (12, 10))
    mask = np.ones_like(ids)
    mask[:, 7:] = 0  # padded ends
    np.savez(tmp_path / "tokens.npz", input_ids=ids, attention_mask=mask)

    note = "left 1 weight outside the model's layers unchanged (pooler.dense.weight)"
    dry = run("prune", tmp_path / "bert", "--dry-run", "--method", "sparsegpt", "--amount", "0.5",
              "--calibration", tmp_path / "tokens.npz")  # fmt: skip
    assert dry.returncode == 0 and note in dry.stdout + dry.stderr, dry.stderr
    assert "outside the model's layers" in next(line for line in dry.stdout.splitlines() if "pooler.dense.w" in line)
    result = prune_file(
        tmp_path / "bert", tmp_path / "out", method="sparsegpt", amount=0.5, calibration=tmp_path / "tokens.npz"
    )
    assert any(n.startswith(note) for n in result.notes) and "pooler.dense.weight" not in result.written.by_tensor
    got = _tensors(tmp_path / "out")

    model = transformers.BertModel.from_pretrained(tmp_path / "bert").eval()
    names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and n.startswith("encoder.layer.")]
    batches = [
        {"input_ids": torch.from_numpy(ids[i : i + ROWS]), "attention_mask": torch.from_numpy(mask[i : i + ROWS])}
        for i in range(0, len(ids), ROWS)
    ]
    prune.sparsegpt(model, batches, 0.5)  # the default: the layers of encoder.layer, not the pooler
    assert len(names) == 12 and not prune.is_pruned(model.pooler.dense)
    for name in names:
        want = model.get_submodule(name).weight.detach().numpy()
        np.testing.assert_allclose(got[f"{name}.weight"], want, rtol=1e-5, atol=1e-6, err_msg=name)
        assert int((got[f"{name}.weight"] == 0).sum()) == want.size // 2
    assert got["pooler.dense.weight"].tobytes() == _tensors(tmp_path / "bert")["pooler.dense.weight"].tobytes()


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """The folder of a random-init GPT-2 (``Conv1D`` weights stored ``[in, out]``) and calibration tokens."""
    root = tmp_path_factory.mktemp("gpt2")
    config = transformers.GPT2Config(n_embd=32, n_head=4, n_layer=2, vocab_size=VOCAB, n_positions=32)
    torch.manual_seed(3)
    transformers.GPT2LMHeadModel(config).eval().save_pretrained(root / "gpt2")
    ids = np.random.default_rng(4).integers(0, VOCAB, (16, 12))
    np.savez(root / "tokens.npz", input_ids=ids)
    return root / "gpt2", root / "tokens.npz", ids


def _gpt2_batches(ids):
    return [{"input_ids": torch.from_numpy(ids[i : i + ROWS]), "use_cache": False} for i in range(0, len(ids), ROWS)]


def _conv1d_names(model):
    return [n for n, m in model.named_modules() if type(m).__name__ == "Conv1D"]


@pytest.mark.slow
def test_gpt2_sparsegpt_equals_the_torch_default(gpt2, tmp_path):
    """GPT-2's Conv1D weights are calibrated: the command's weights equal ``prune.sparsegpt``'s (stored layout)."""
    folder, tokens, ids = gpt2
    proc = run("prune", folder, "-o", tmp_path / "out", "--method", "sparsegpt", "--amount", "0.5",
               "--calibration", tokens)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "pruned 8 tensors" in proc.stdout and "12288 of 24576 entries zero (50.00%)" in proc.stdout
    got, dense = _tensors(tmp_path / "out"), _tensors(folder)
    model = transformers.GPT2LMHeadModel.from_pretrained(folder).eval()
    prune.sparsegpt(model, _gpt2_batches(ids), 0.5)  # the default: the Conv1D layers of transformer.h
    names = _conv1d_names(model)
    assert len(names) == 8 and all(prune.is_pruned(model.get_submodule(n)) for n in names)
    assert not prune.is_pruned(model.lm_head)
    for name in names:
        want = model.get_submodule(name).weight.detach().numpy()  # [in, out], as stored
        np.testing.assert_allclose(got[f"{name}.weight"], want, rtol=1e-5, atol=1e-6, err_msg=name)
        assert np.array_equal(got[f"{name}.weight"] == 0, want == 0), name
        assert int((want == 0).sum()) == want.size // 2, name
        assert not np.array_equal(want, dense[f"{name}.weight"] * (want != 0)), f"{name}: kept weights not updated"
    for name in dense.keys() - {f"{n}.weight" for n in names}:
        assert got[name].tobytes() == dense[name].tobytes(), name


def test_gpt2_wanda_equals_the_torch_path(gpt2, tmp_path):
    folder, tokens, ids = gpt2
    prune_file(folder, tmp_path / "out", method="wanda", amount=0.5, calibration=tokens)
    got = _tensors(tmp_path / "out")
    model = transformers.GPT2LMHeadModel.from_pretrained(folder).eval()
    names = _conv1d_names(model)
    # the command runs layer by layer on the pruned layers' outputs: so does the torch side, block by block
    for block in range(2):
        inside = [n for n in names if n.startswith(f"transformer.h.{block}.")]
        scores = prune.wanda_importance(model, _gpt2_batches(ids), modules=inside)
        for module, score in scores.items():
            prune.wanda(module, "weight", 0.5, dim=1, importance_scores=score)  # outputs: axis 1 of [in, out]
            prune.remove(module, "weight")
    for name in names:
        want = model.get_submodule(name).weight.detach().numpy()
        np.testing.assert_array_equal(got[f"{name}.weight"], want, err_msg=name)
        assert ((want == 0).sum(axis=0) == want.shape[0] // 2).all(), name  # each output loses half its inputs


def test_torch_default_leaves_lm_head_as_the_command_does(llama, tmp_path):
    """``prune.sparsegpt(model, batches, 0.5)`` on a Llama prunes the decoder layers' Linears, not lm_head."""
    folder, tokens, ids, _ = llama
    model = transformers.LlamaForCausalLM.from_pretrained(folder).eval()
    head = model.lm_head.weight.detach().clone()
    batches = [{"input_ids": torch.from_numpy(ids[i : i + ROWS]), "use_cache": False} for i in range(0, len(ids), ROWS)]
    prune.sparsegpt(model, batches, 0.5)
    assert not prune.is_pruned(model.lm_head) and torch.equal(model.lm_head.weight, head)
    pruned = {f"{n}.weight" for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and prune.is_pruned(m)}
    assert pruned == {f"{n}.weight" for n in _layer_linears(model)} and len(pruned) == 14
    for name in pruned:
        weight = model.get_submodule(name[: -len(".weight")]).weight
        assert int((weight == 0).sum()) == weight.numel() // 2, name
    result = prune_file(folder, tmp_path / "out", method="sparsegpt", amount=0.5, calibration=tokens)
    assert set(result.written.by_tensor) == pruned  # the command and the torch default: the same weights
    got = _tensors(tmp_path / "out")
    for name in pruned:
        weight = model.get_submodule(name[: -len(".weight")]).weight.detach().numpy()
        np.testing.assert_allclose(got[name], weight, rtol=1e-5, atol=1e-6, err_msg=name)


def test_dead_inputs_of_a_given_hessian_count_toward_the_amount(llama, tmp_path):
    """A Hessian with dead inputs (zero rows and columns): exactly half of each weight is pruned, no more."""
    folder, _, _, _ = llama
    dense = _tensors(folder)
    names = [n for n in dense if ".layers." in n and n.endswith("proj.weight")]
    rng = np.random.default_rng(5)
    hessians = {}
    for name in names:
        k = dense[name].shape[1]
        x = rng.standard_normal((4 * k, k))
        x[:, : 3 * k // 4] = 0  # three quarters of the inputs never fire: more dead entries than the amount
        hessians[name] = x.T @ x / len(x)
    np.savez(tmp_path / "h.npz", **hessians)
    result = prune_file(folder, tmp_path / "out", method="sparsegpt", amount=0.5, hessians=tmp_path / "h.npz")
    got = _tensors(tmp_path / "out")
    for name in names:
        size = dense[name].size
        assert int((got[name] == 0).sum()) == size // 2 == result.written.by_tensor[name][0], name
        k = dense[name].shape[1]
        np.testing.assert_array_equal(got[name][:, 3 * k // 4 :], dense[name][:, 3 * k // 4 :], err_msg=name)


@pytest.mark.slow
def test_each_layer_is_calibrated_with_its_own_attention_mask(tmp_path):
    """Sliding-window and full-attention layers (``layer_types``) get different masks: layer by
    layer, each is replayed with its own, so the result equals the drop-in on the whole model."""
    torch.manual_seed(0)
    cfg = transformers.Qwen3Config(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=64, use_sliding_window=True, sliding_window=4,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    )  # fmt: skip
    folder = tmp_path / "qwen3"
    transformers.Qwen3ForCausalLM(cfg).eval().save_pretrained(folder, max_shard_size="20KB")
    ids = np.random.default_rng(1).integers(0, 64, size=(8, 16))
    tokens = tmp_path / "tokens.npz"
    np.savez(tokens, input_ids=ids)
    out = tmp_path / "out"
    prune_file(folder, out, method="sparsegpt", amount=0.5, calibration=tokens)

    model = transformers.Qwen3ForCausalLM.from_pretrained(folder).eval()
    names = _layer_linears(model)
    prune.sparsegpt(model, [{"input_ids": torch.from_numpy(ids), "use_cache": False}], 0.5, modules=names)
    got = _tensors(out)
    for name in names:
        want = model.get_submodule(name).weight.detach().numpy()
        np.testing.assert_allclose(got[f"{name}.weight"], want, rtol=1e-5, atol=1e-6, err_msg=name)
