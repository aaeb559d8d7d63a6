"""``arrayprune prune FOLDER -o OUT --shrink`` on Hugging Face checkpoints (transformers models).

Each case builds a small random model with ``transformers``, saves it (sharded by
``save_pretrained(max_shard_size=...)`` for Llama), shrinks it and checks, against
references computed here with NumPy:

* the kept channels (or KV groups) of every layer are the top ones by the L2 norm of
  each unit's entries over the group's weight tensors;
* every member is the dense tensor sliced to them, every other tensor bit-identical;
* ``config.json`` holds the new sizes, the index's ``total_size`` the new byte count;
* the shrunk folder loads with ``from_pretrained`` with no missing, unexpected or
  mismatched key, and its outputs equal the dense model's with the dropped units zeroed
  where the next layer reads them (``down_proj``/``output.dense`` columns, ``c_proj``
  rows, ``o_proj`` columns).
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
tr = pytest.importorskip("transformers")
st = pytest.importorskip("safetensors.numpy")

import arrayprune  # noqa: E402
from arrayprune.adapters.cli import main  # noqa: E402
from arrayprune.adapters.pipeline.shrink_checkpoint import shrink_checkpoint  # noqa: E402
from cli_helpers import assert_error, run  # noqa: E402


def _randomize_biases(model, seed=1):
    """Give every bias random values (initializers zero them), so that slicing them shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    torch.manual_seed(0)
    cfg = tr.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, attention_bias=True, mlp_bias=True,
    )  # fmt: skip
    model = tr.LlamaForCausalLM(cfg).eval()
    _randomize_biases(model)
    path = tmp_path_factory.mktemp("llama") / "dense"
    model.save_pretrained(path, max_shard_size="20KB")
    assert len([n for n in os.listdir(path) if n.endswith(".safetensors")]) > 2
    return path


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    torch.manual_seed(0)
    cfg = tr.BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=40,
        max_position_embeddings=64,
    )  # fmt: skip
    model = tr.BertModel(cfg).eval()
    _randomize_biases(model)
    path = tmp_path_factory.mktemp("bert") / "dense"
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    torch.manual_seed(0)
    cfg = tr.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64)
    model = tr.GPT2LMHeadModel(cfg).eval()
    _randomize_biases(model)
    path = tmp_path_factory.mktemp("gpt2") / "dense"
    model.save_pretrained(path, max_shard_size="40KB")
    return path


def tensors(folder) -> dict[str, np.ndarray]:
    out = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".safetensors"):
            out.update(st.load_file(os.path.join(folder, name)))
    return out


def config(folder) -> dict:
    with open(os.path.join(folder, "config.json")) as f:
        return json.load(f)


def top(scores: np.ndarray, drop: int) -> np.ndarray:
    """The kept units: all but the `drop` lowest scores (ties to the lower index), ascending."""
    order = np.argsort(scores, kind="stable")
    return np.sort(order[drop:])


def shrink_cli(capsys, src, dst, *extra):
    capsys.readouterr()
    code = main(["prune", str(src), "-o", str(dst), "--shrink", "--method", "ln_structured", *map(str, extra)])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def load(cls, folder):
    model, info = cls.from_pretrained(folder, output_loading_info=True)
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set(), info
    assert info["mismatched_keys"] == set() and not info["error_msgs"], info
    return model.eval()


def zeroed(cls, folder, cuts):
    """The dense model with `cuts` ({param name: (axis, dropped indices)}) set to zero."""
    model = cls.from_pretrained(folder).eval()
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, (axis, dropped) in cuts.items():
            index = [slice(None)] * params[name].ndim
            index[axis] = torch.as_tensor(dropped, dtype=torch.long)
            params[name][tuple(index)] = 0
    return model


IDS = torch.tensor([[3, 14, 15, 9, 2, 6, 5, 35, 8, 9, 7, 9, 32, 38, 46, 26]])


def check_outside(dense, small, members):
    assert set(dense) == set(small)
    for name in dense:
        if name not in members:
            assert small[name].dtype == dense[name].dtype and np.array_equal(small[name], dense[name]), name


def test_llama_mlp_channels_sharded(llama, tmp_path, capsys):
    out = tmp_path / "small"
    printed = shrink_cli(capsys, llama, out, "--amount", "0.25")
    assert "48 -> 36 channels kept" in printed
    dense, small = tensors(llama), tensors(out)
    members, cuts = set(), {}
    for i in range(2):
        p = f"model.layers.{i}.mlp."
        g, u, d = dense[p + "gate_proj.weight"], dense[p + "up_proj.weight"], dense[p + "down_proj.weight"]
        score = np.sqrt((g.astype(np.float64) ** 2).sum(1) + (u**2).sum(1) + (d**2).sum(0))
        kept = top(score, 12)
        np.testing.assert_array_equal(small[p + "gate_proj.weight"], g[kept])
        np.testing.assert_array_equal(small[p + "up_proj.weight"], u[kept])
        np.testing.assert_array_equal(small[p + "down_proj.weight"], d[:, kept])
        for b in ("gate_proj.bias", "up_proj.bias"):
            np.testing.assert_array_equal(small[p + b], dense[p + b][kept])
        members |= {p + n for n in ("gate_proj.weight", "up_proj.weight", "down_proj.weight")}
        members |= {p + "gate_proj.bias", p + "up_proj.bias"}
        cuts[p + "down_proj.weight"] = (1, np.setdiff1d(np.arange(48), kept))
    check_outside(dense, small, members)
    cfg = config(out)
    assert cfg["intermediate_size"] == 36
    assert cfg.pop("arrayprune") == {
        "amount": "0.25", "method": "ln_structured", "shrink": "channels", "version": arrayprune.__version__
    }  # fmt: skip
    assert {k: v for k, v in cfg.items() if k != "intermediate_size"} == {
        k: v for k, v in config(llama).items() if k != "intermediate_size"
    }
    with open(out / "model.safetensors.index.json") as f:
        index = json.load(f)
    assert index["metadata"]["total_size"] == sum(a.nbytes for a in small.values())
    assert sorted(index["weight_map"]) == sorted(small)
    with torch.no_grad():
        got = load(tr.LlamaForCausalLM, out)(IDS).logits
        want = zeroed(tr.LlamaForCausalLM, llama, cuts)(IDS).logits
        dense_logits = tr.LlamaForCausalLM.from_pretrained(llama).eval()(IDS).logits
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=0, atol=1e-5)
    assert not np.allclose(got.numpy(), dense_logits.numpy(), atol=1e-3)  # the channels did matter
    assert sorted(os.listdir(out)) == sorted(os.listdir(llama))


def test_llama_kv_groups(llama, tmp_path, capsys):
    out = tmp_path / "heads"
    printed = shrink_cli(capsys, llama, out, "--amount", "0.5", "--groups", "heads")
    assert "2 -> 1 KV groups kept" in printed
    dense, small = tensors(llama), tensors(out)
    hd, rep = 8, 2
    members, cuts = set(), {}
    for i in range(2):
        p = f"model.layers.{i}.self_attn."
        q, k, v, o = (dense[p + n + "_proj.weight"].astype(np.float64) for n in "qkvo")
        score = np.array(
            [
                np.sqrt(
                    (q[g * rep * hd : (g + 1) * rep * hd] ** 2).sum()
                    + (k[g * hd : (g + 1) * hd] ** 2).sum()
                    + (v[g * hd : (g + 1) * hd] ** 2).sum()
                    + (o[:, g * rep * hd : (g + 1) * rep * hd] ** 2).sum()
                )
                for g in range(2)
            ]
        )
        g = int(top(score, 1)[0])
        qrows, kvrows = np.arange(g * rep * hd, (g + 1) * rep * hd), np.arange(g * hd, (g + 1) * hd)
        for n, rows in (("q", qrows), ("k", kvrows), ("v", kvrows)):
            np.testing.assert_array_equal(small[p + n + "_proj.weight"], dense[p + n + "_proj.weight"][rows])
            np.testing.assert_array_equal(small[p + n + "_proj.bias"], dense[p + n + "_proj.bias"][rows])
            members |= {p + n + "_proj.weight", p + n + "_proj.bias"}
        np.testing.assert_array_equal(small[p + "o_proj.weight"], dense[p + "o_proj.weight"][:, qrows])
        members.add(p + "o_proj.weight")
        cuts[p + "o_proj.weight"] = (1, np.setdiff1d(np.arange(32), qrows))
    check_outside(dense, small, members)
    cfg = config(out)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == (2, 1, 8)
    assert cfg["hidden_size"] == 32 and cfg["intermediate_size"] == 48
    with torch.no_grad():
        got = load(tr.LlamaForCausalLM, out)(IDS).logits
        want = zeroed(tr.LlamaForCausalLM, llama, cuts)(IDS).logits
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=0, atol=1e-5)


def test_bert_intermediate(bert, tmp_path, capsys):
    out = tmp_path / "small"
    shrink_cli(capsys, bert, out, "--amount", "0.5")
    dense, small = tensors(bert), tensors(out)
    members, cuts = set(), {}
    prefix = "encoder.layer." if "encoder.layer.0.intermediate.dense.weight" in dense else "bert.encoder.layer."
    for i in range(2):
        p = f"{prefix}{i}."
        w1, b1, w2 = (
            dense[p + "intermediate.dense.weight"],
            dense[p + "intermediate.dense.bias"],
            dense[p + "output.dense.weight"],
        )
        kept = top(np.sqrt((w1.astype(np.float64) ** 2).sum(1) + (w2.astype(np.float64) ** 2).sum(0)), 20)
        np.testing.assert_array_equal(small[p + "intermediate.dense.weight"], w1[kept])
        np.testing.assert_array_equal(small[p + "intermediate.dense.bias"], b1[kept])
        np.testing.assert_array_equal(small[p + "output.dense.weight"], w2[:, kept])
        members |= {p + "intermediate.dense.weight", p + "intermediate.dense.bias", p + "output.dense.weight"}
        cuts[p.removeprefix("bert.") + "output.dense.weight"] = (1, np.setdiff1d(np.arange(40), kept))
    check_outside(dense, small, members)
    assert config(out)["intermediate_size"] == 20
    with torch.no_grad():
        got = load(tr.BertModel, out)(IDS).last_hidden_state
        want = zeroed(tr.BertModel, bert, cuts)(IDS).last_hidden_state
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=0, atol=1e-5)


def test_gpt2_mlp(gpt2, tmp_path, capsys):
    out = tmp_path / "small"
    shrink_cli(capsys, gpt2, out, "--amount", "0.75")
    dense, small = tensors(gpt2), tensors(out)
    members, cuts = set(), {}
    prefix = "transformer.h." if "transformer.h.0.mlp.c_fc.weight" in dense else "h."
    for i in range(2):
        p = f"{prefix}{i}.mlp."
        fc, b, proj = dense[p + "c_fc.weight"], dense[p + "c_fc.bias"], dense[p + "c_proj.weight"]
        kept = top(np.sqrt((fc.astype(np.float64) ** 2).sum(0) + (proj.astype(np.float64) ** 2).sum(1)), 96)
        np.testing.assert_array_equal(small[p + "c_fc.weight"], fc[:, kept])
        np.testing.assert_array_equal(small[p + "c_fc.bias"], b[kept])
        np.testing.assert_array_equal(small[p + "c_proj.weight"], proj[kept])
        members |= {p + "c_fc.weight", p + "c_fc.bias", p + "c_proj.weight"}
        cuts[f"transformer.h.{i}.mlp.c_proj.weight"] = (0, np.setdiff1d(np.arange(128), kept))
    check_outside(dense, small, members)
    assert config(out)["n_inner"] == 32
    with torch.no_grad():
        got = load(tr.GPT2LMHeadModel, out)(IDS).logits
        want = zeroed(tr.GPT2LMHeadModel, gpt2, cuts)(IDS).logits
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=0, atol=1e-5)


def test_python_entry_and_seeded_random(llama, tmp_path):
    done = shrink_checkpoint(llama, tmp_path / "a", 0.5, "random_structured", seed=3)
    again = shrink_checkpoint(llama, tmp_path / "b", 0.5, "random_structured", seed=3)
    assert done.kept == again.kept and done.config == {"intermediate_size": 24}
    assert [len(k) for k in done.kept.values()] == [24, 24]
    assert done.kept["model.layers.0.mlp"] != done.kept["model.layers.1.mlp"]  # a stream per layer
    assert done.params_after < done.params_before


@pytest.mark.parametrize(
    ("fixture", "args", "fragments"),
    [
        ("llama", ["--amount", "0.5", "--global"], ["--global does not go with --shrink", "one size"]),
        ("llama", ["--amount", "1.0", "--groups", "heads"], ["would remove every one of the 2 KV groups"]),
        ("bert", ["--amount", "0.5", "--groups", "heads"], ["--groups heads", "BERT", "Llama-style"]),
        ("gpt2", ["--amount", "0.5", "--groups", "heads"], ["--groups heads", "GPT-2"]),
        ("llama", ["--amount", "0.5", "--verify"], ["--verify on a Hugging Face folder measures perplexity and KL"]),
    ],
)
def test_refused(request, tmp_path, fixture, args, fragments):
    src = request.getfixturevalue(fixture)
    proc = run("prune", src, "-o", tmp_path / "out", "--shrink", "--method", "ln_structured", *args)
    assert_error(proc, *fragments)
    assert not os.path.exists(tmp_path / "out")


def test_no_config_refused(llama, tmp_path):
    src = tmp_path / "noconfig"
    src.mkdir()
    for name in os.listdir(llama):
        if name != "config.json":
            (src / name).write_bytes((llama / name).read_bytes())
    proc = run("prune", src, "-o", tmp_path / "out", "--shrink", "--method", "ln_structured", "--amount", "0.5")
    assert_error(proc, "no config.json")
    assert not os.path.exists(tmp_path / "out")


def test_dry_run_lists_layers(llama, capsys):
    capsys.readouterr()
    assert (
        main(
            [
                "prune",
                str(llama),
                "--dry-run",
                "--shrink",
                "--groups",
                "heads",
                "--amount",
                "0.5",
                "--method",
                "ln_structured",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "group model.layers.1.self_attn (2 -> 1 KV groups): model.layers.1.self_attn.q_proj.weight[0]" in out
    assert "model.layers.1.self_attn.o_proj.weight[1]" in out and "model.layers.1.self_attn.q_proj.bias[0]*" in out


def test_report_compare(llama, tmp_path, capsys):
    out = tmp_path / "small"
    shrink_cli(capsys, llama, out, "--amount", "0.5", "--groups", "heads")
    dense, small = tensors(llama), tensors(out)
    assert main(["report", str(llama), "--compare", str(out), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["parameters"] == {
        "before": sum(a.size for a in dense.values()),
        "after": sum(a.size for a in small.values()),
    }
    assert got["changed"] == [
        {"name": n, "before": list(dense[n].shape), "after": list(small[n].shape)}
        for n in sorted(dense)
        if dense[n].shape != small[n].shape
    ]
    assert len(got["changed"]) == 14 and got["same"] == len(dense) - 14
    assert got["only_before"] == got["only_after"] == []
    assert main(["report", str(llama), "--compare", str(out)]) == 0
    text = capsys.readouterr().out.splitlines()
    before, after = got["parameters"]["before"], got["parameters"]["after"]
    assert text[1] == f"parameters: {before} -> {after} ({100 * after / before:.2f}%)"
    assert any(line.split() == ["model.layers.1.self_attn.o_proj.weight", "32x32", "->", "32x16"] for line in text)


def test_bfloat16_members_sliced_as_stored(llama, tmp_path):
    from safetensors.torch import load_file, save_file

    src = tmp_path / "bf16"
    src.mkdir()
    dense = {k: torch.from_numpy(v).to(torch.bfloat16) for k, v in tensors(llama).items()}
    save_file(dense, src / "model.safetensors", metadata={"format": "pt"})
    (src / "config.json").write_bytes((llama / "config.json").read_bytes())
    done = shrink_checkpoint(src, tmp_path / "out", 0.5)
    small = load_file(tmp_path / "out" / "model.safetensors")
    assert sorted(os.listdir(tmp_path / "out")) == ["config.json", "model.safetensors"]
    for i in range(2):
        p = f"model.layers.{i}.mlp."
        g, u, d = (
            dense[p + n].float().double().numpy() for n in ("gate_proj.weight", "up_proj.weight", "down_proj.weight")
        )
        kept = top(np.sqrt((g**2).sum(1) + (u**2).sum(1) + (d**2).sum(0)), 24)
        assert done.kept[f"model.layers.{i}.mlp"] == kept.tolist()
        bits = {k: v.view(torch.int16).numpy() for k, v in small.items()}
        dbits = {k: v.view(torch.int16).numpy() for k, v in dense.items()}
        np.testing.assert_array_equal(bits[p + "gate_proj.weight"], dbits[p + "gate_proj.weight"][kept])
        np.testing.assert_array_equal(bits[p + "down_proj.weight"], dbits[p + "down_proj.weight"][:, kept])
        assert small[p + "down_proj.weight"].dtype == torch.bfloat16
    for name in dense:
        if ".mlp." not in name:
            assert torch.equal(small[name].view(torch.int16), dense[name].view(torch.int16)), name


def _copy_without_config(llama, dst):
    dst.mkdir()
    for name in os.listdir(llama):
        if name != "config.json":
            (dst / name).write_bytes((llama / name).read_bytes())
    return dst


@pytest.mark.parametrize(
    ("config", "fragment"),
    [
        (b"[1, 2]", "config.json: not a JSON object"),
        (b"{not json", "config.json: not valid JSON"),
        (b'{"num_hidden_layers": 2, "hidden_size": 32, "intermediate_size": 47}', "not (47, 32) as config.json"),
        (b'{"num_hidden_layers": 3, "hidden_size": 32, "intermediate_size": 48}', "num_hidden_layers=3"),
        (b'{"num_hidden_layers": true, "hidden_size": 32, "intermediate_size": 48}', "not a positive integer"),
    ],
)
def test_bad_config_refused(llama, tmp_path, config, fragment):
    src = _copy_without_config(llama, tmp_path / "in")
    (src / "config.json").write_bytes(config)
    proc = run("prune", src, "-o", tmp_path / "out", "--shrink", "--method", "ln_structured", "--amount", "0.5")
    assert_error(proc, fragment)
    assert not os.path.exists(tmp_path / "out")


def test_config_symlink_out_of_the_folder_refused(llama, tmp_path):
    src = _copy_without_config(llama, tmp_path / "in")
    (tmp_path / "elsewhere.json").write_bytes((llama / "config.json").read_bytes())
    os.symlink(tmp_path / "elsewhere.json", src / "config.json")
    proc = run("prune", src, "-o", tmp_path / "out", "--shrink", "--method", "ln_structured", "--amount", "0.5")
    assert_error(proc, "config.json (a symlink leading outside the checkpoint's folder): not read")
    assert not os.path.exists(tmp_path / "out")


def test_the_family_table_gives_each_family_its_members_and_refusals():
    """One row per family: the members of a layer's group with their axes, the config keys,
    and the refusals, each one line."""
    from arrayprune.adapters.roles.hf_groups import HfGroupsError, hf_groups

    gpt2 = {"h.0.mlp.c_fc.weight": (8, 32), "h.0.mlp.c_fc.bias": (32,), "h.0.mlp.c_proj.weight": (32, 8)}
    found = hf_groups({"n_layer": 1, "n_embd": 8, "n_inner": None}, gpt2)  # n_inner null: 4 x n_embd
    assert [(m.key, m.axis, m.weight) for m in found.groups[0].members] == [
        ("h.0.mlp.c_fc.weight", 1, True), ("h.0.mlp.c_proj.weight", 0, True), ("h.0.mlp.c_fc.bias", 0, False)
    ]  # fmt: skip
    assert found.groups[0].units == 32 and found.config_updates(16) == {"n_inner": 16}
    llama = {
        f"model.layers.0.{n}": s
        for n, s in [("mlp.gate_proj.weight", (12, 4)), ("mlp.up_proj.weight", (12, 4)),
                     ("mlp.down_proj.weight", (4, 12)),
                     ("self_attn.q_proj.weight", (4, 4)), ("self_attn.k_proj.weight", (2, 4)),
                     ("self_attn.v_proj.weight", (2, 4)), ("self_attn.o_proj.weight", (4, 4)),
                     ("self_attn.q_proj.bias", (4,))]
    }  # fmt: skip
    config = {"num_hidden_layers": 1, "hidden_size": 4, "intermediate_size": 12, "num_attention_heads": 2,
              "num_key_value_heads": 1, "head_dim": 2}  # fmt: skip
    heads = hf_groups(config, llama, "heads")
    assert [m.key.rsplit(".", 2)[-2:] for m in heads.groups[0].members] == [
        ["q_proj", "weight"], ["k_proj", "weight"], ["v_proj", "weight"], ["o_proj", "weight"], ["q_proj", "bias"]
    ]  # fmt: skip
    assert heads.groups[0].unit == "KV groups" and heads.config_updates(1) == {
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 2
    }  # fmt: skip
    with pytest.raises(HfGroupsError, match=r"^--groups heads: transformers derives GPT-2's head size"):
        hf_groups({"n_layer": 1, "n_embd": 8}, gpt2, "heads")
    with pytest.raises(HfGroupsError) as info:
        hf_groups({}, {"encoder.block.0.w": (2, 2)})
    assert str(info.value) == (
        "no Llama, Mistral, Qwen2, Qwen3, Gemma (mlp.gate_proj), Phi-3 (mlp.gate_up_proj), Mixtral "
        "(block_sparse_moe.gate), Qwen2-MoE, Qwen3-MoE (mlp.gate), BERT (intermediate.dense) or GPT-2 (mlp.c_fc) "
        "layers in the checkpoint: its channel groups are not known"
    )
    with pytest.raises(HfGroupsError, match=r"layer 0: no tensor 'h.0.mlp.c_fc.bias' \(a gpt2 layer holds it\)"):
        hf_groups({"n_layer": 1, "n_embd": 8}, {k: v for k, v in gpt2.items() if "bias" not in k})


def test_llama_heads_that_do_not_divide_the_hidden_size_are_refused(tmp_path):
    """LlamaConfig refuses hidden_size % num_attention_heads != 0 whatever head_dim says: refused before writing."""

    torch.manual_seed(0)
    cfg = tr.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)  # fmt: skip
    tr.LlamaForCausalLM(cfg).save_pretrained(tmp_path / "dense")
    proc = run("prune", tmp_path / "dense", "-o", tmp_path / "out", "--shrink", "--groups", "heads", "--amount", "1",
               "--method", "ln_structured")  # fmt: skip
    assert_error(proc, "3 attention heads do not divide hidden_size=32", "keep 1 or 2 of the 4 heads")
    assert not os.path.exists(tmp_path / "out")
    done = shrink_checkpoint(tmp_path / "dense", tmp_path / "ok", 2, groups="heads")
    assert done.config["num_attention_heads"] == 2


def test_rounding_keep_floor_on_a_folder(llama, tmp_path):
    """``rounding="keep_floor"``: every layer keeps ``int(0.7 * 48) = 33`` MLP channels (nearest keeps 34),
    the channels of largest norm; the dry run counts the same."""
    from arrayprune.adapters import prune_file

    dry = prune_file(llama, shrink=True, amount=0.3, method="ln_structured", rounding="keep_floor", dry_run=True)
    assert "48 -> 33" in dry.shrink.describe()
    done = prune_file(llama, tmp_path / "small", shrink=True, amount=0.3, method="ln_structured", rounding="keep_floor")
    with open(tmp_path / "small" / "config.json") as f:
        cfg = json.load(f)
    assert cfg["intermediate_size"] == 33 and cfg["arrayprune"]["rounding"] == "keep_floor"
    dense = tensors(llama)
    for i in range(2):
        p = f"model.layers.{i}.mlp."
        norms = sum((dense[p + k].astype(np.float64) ** 2).sum(axis=a) for k, a in (("gate_proj.weight", 1),
                    ("up_proj.weight", 1), ("down_proj.weight", 0)))  # fmt: skip
        assert done.shrink.kept[f"model.layers.{i}.mlp"] == sorted(np.argsort(norms, kind="stable")[15:].tolist())
