"""The pruning plan: roles from names and checkpoint layouts, default axes, --dry-run."""

from __future__ import annotations

import numpy as np
import pytest

import arrayprune as ap
from arrayprune.adapters import formats as fmt
from arrayprune.adapters.plan import file_roles, make_plan
from arrayprune.adapters.roles.names import model_prefix, name_role
from cli_helpers import run

RNG = np.random.default_rng(11)


def _w(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


BERT = {
    "embeddings.word_embeddings.weight": _w(100, 16),
    "embeddings.position_embeddings.weight": _w(32, 16),
    "embeddings.token_type_embeddings.weight": _w(2, 16),
    "embeddings.LayerNorm.weight": _w(16),
    "embeddings.LayerNorm.bias": _w(16),
    "encoder.layer.0.attention.self.query.weight": _w(16, 16),
    "encoder.layer.0.attention.self.query.bias": _w(16),
    "encoder.layer.0.intermediate.dense.weight": _w(64, 16),
    "encoder.layer.0.output.dense.weight": _w(16, 64),
    "encoder.layer.0.output.LayerNorm.weight": _w(16),
    "pooler.dense.weight": _w(16, 16),
}
BERT_WEIGHTS = [
    "encoder.layer.0.attention.self.query.weight",
    "encoder.layer.0.intermediate.dense.weight",
    "encoder.layer.0.output.dense.weight",
    "pooler.dense.weight",
]

LLAMA = {
    "model.embed_tokens.weight": _w(128, 32),
    "model.layers.0.input_layernorm.weight": _w(32),
    "model.layers.0.self_attn.q_proj.weight": _w(32, 32),
    "model.layers.0.self_attn.o_proj.weight": _w(32, 32),
    "model.layers.0.post_attention_layernorm.weight": _w(32),
    "model.layers.0.mlp.gate_proj.weight": _w(64, 32),
    "model.layers.0.mlp.down_proj.weight": _w(32, 64),
    "model.norm.weight": _w(32),
    "lm_head.weight": _w(128, 32),
}
LLAMA_WEIGHTS = [
    "model.layers.0.self_attn.q_proj.weight",
    "model.layers.0.self_attn.o_proj.weight",
    "model.layers.0.mlp.gate_proj.weight",
    "model.layers.0.mlp.down_proj.weight",
]


@pytest.mark.parametrize(
    "name, shape, kind, axes",
    [
        ("bert.embeddings.word_embeddings.weight", (100, 16), "embedding", None),
        ("embeddings.LayerNorm.weight", (16,), "norm", None),
        ("encoder.layer.3.output.LayerNorm.bias", (16,), "bias", None),
        ("model.embed_tokens.weight", (10, 4), "embedding", None),
        ("transformer.wte.weight", (10, 4), "embedding", None),
        ("transformer.wpe.weight", (10, 4), "embedding", None),
        ("transformer.h.0.ln_1.weight", (4,), "norm", None),
        ("transformer.ln_f.weight", (4,), "norm", None),
        ("transformer.h.0.attn.c_attn.weight", (4, 12), "weight", (1, 0)),
        ("lm_head.weight", (10, 4), "embedding", None),
        ("model.layers.0.mlp.up_proj.weight", (8, 4), "weight", (0, 1)),
        ("features.0.weight", (8, 3, 3, 3), "weight", (0, 1)),
        ("bn1.running_mean", (8,), "norm", None),
        ("params/Dense_0/kernel", (4, 8), "weight", (1, 0)),
        ("params/Conv_0/kernel", (3, 3, 4, 8), "weight", (3, 2)),
        ("classifier.bias", (10,), "bias", None),
        ("step", (), "other", None),
    ],
)
def test_name_roles(name, shape, kind, axes):
    role = name_role(name, np.zeros(shape, np.float32))
    assert role.kind == kind, role
    if axes is not None:
        assert (role.output_axis, role.reduction_axis) == axes
    assert name_role(name, np.zeros(shape, np.int64)).kind == "other"


@pytest.mark.parametrize("model, weights", [(BERT, BERT_WEIGHTS), (LLAMA, LLAMA_WEIGHTS)], ids=["bert", "llama"])
@pytest.mark.slow
def test_cli_prunes_layer_weights_only(tmp_path, model, weights):
    pytest.importorskip("safetensors")
    src, out = tmp_path / "m.safetensors", tmp_path / "o.safetensors"
    fmt.save(str(src), model)
    proc = run("prune", src, "-o", out, "--global", "--amount", "0.5")
    assert proc.returncode == 0, proc.stderr
    got = fmt.load(str(out)).params
    changed = sorted(k for k in model if not np.array_equal(np.asarray(got[k]), model[k]))
    assert changed == sorted(weights)
    expected = ap.global_unstructured([model[k] for k in weights], ap.L1Unstructured, amount=0.5)
    for k, mask in zip(weights, expected, strict=True):
        np.testing.assert_array_equal(np.asarray(got[k]), model[k] * mask)
    n = sum(model[k].size for k in weights)
    assert sum(int((np.asarray(got[k]) == 0).sum()) for k in weights) == round(0.5 * n)
    assert f"{round(0.5 * n)} of {n} entries zero (50.00%)" in proc.stdout

    # 2:4 along the reduction axis (PyTorch layout [out, in]: axis 1)
    nm = tmp_path / "nm.safetensors"
    proc = run("prune", src, "-o", nm, "--method", "nm_structured")
    assert proc.returncode == 0, proc.stderr
    got = fmt.load(str(nm)).params
    for k in weights:
        w = np.asarray(got[k])
        assert ap.is_nm_sparse(w, 2, 4, dim=1) and int((w == 0).sum()) == w.size // 2
        np.testing.assert_array_equal(w, model[k] * ap.nm_structured(model[k], 2, 4, dim=1))
    for k in set(model) - set(weights):
        np.testing.assert_array_equal(np.asarray(got[k]), model[k])

    # ln_structured removes whole output channels (rows)
    ln = tmp_path / "ln.safetensors"
    assert run("prune", src, "-o", ln, "--method", "ln_structured", "--amount", "0.25").returncode == 0
    for k in weights:
        w = np.asarray(fmt.load(str(ln)).params[k])
        assert int((~w.any(axis=1)).sum()) == round(0.25 * w.shape[0])


def test_flax_kernels_take_groups_along_their_input_axis(tmp_path):
    kernel = _w(16, 8)  # [in, out]
    src, out = tmp_path / "f.npz", tmp_path / "o.npz"
    np.savez(src, **{"params/Dense_0/kernel": kernel, "params/Dense_0/bias": _w(8)})
    assert run("prune", src, "-o", out, "--method", "nm_structured").returncode == 0
    got = np.load(out)["params/Dense_0/kernel"]
    assert ap.is_nm_sparse(got, 2, 4, dim=0) and not ap.is_nm_sparse(got, 2, 4, dim=1)


@pytest.mark.slow
def test_training_checkpoint_prunes_the_model_only(tmp_path):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    loss = net(torch.randn(8, 12)).pow(2).mean()
    loss.backward()
    opt.step()
    src, out = tmp_path / "ckpt.pt", tmp_path / "out.pt"
    torch.save({"epoch": 3, "model": net.state_dict(), "optimizer": opt.state_dict()}, src)
    assert model_prefix(torch.load(src, weights_only=True)) == ("model",)

    dry = run("prune", src, "--dry-run", "--global", "--amount", "0.5")
    assert dry.returncode == 0, dry.stderr
    rows = {ln.split()[0]: ln.split()[1] for ln in dry.stdout.splitlines()[2:-1]}
    assert rows["model/0.weight"] == "weight" and rows["model/0.bias"] == "bias"
    assert rows["optimizer/state/0/exp_avg"] == "optimizer_state"
    assert "2 of " in dry.stdout.splitlines()[-1]

    proc = run("prune", src, "-o", out, "--global", "--amount", "0.5")
    assert proc.returncode == 0, proc.stderr
    before, after = torch.load(src, weights_only=True), torch.load(out, weights_only=True)
    assert after["epoch"] == 3
    w = [before["model"]["0.weight"].numpy(), before["model"]["2.weight"].numpy()]
    masks = ap.global_unstructured(w, ap.L1Unstructured, amount=0.5)
    np.testing.assert_array_equal(after["model"]["0.weight"].numpy(), w[0] * masks[0])
    np.testing.assert_array_equal(after["model"]["2.weight"].numpy(), w[1] * masks[1])
    assert int((after["model"]["0.weight"] == 0).sum() + (after["model"]["2.weight"] == 0).sum()) == (192 + 64) // 2
    for k in ("0.bias", "2.bias"):
        assert torch.equal(after["model"][k], before["model"][k])
    for i, state in before["optimizer"]["state"].items():
        for k, v in state.items():
            assert torch.equal(after["optimizer"]["state"][i][k], v)
    assert after["optimizer"]["param_groups"] == before["optimizer"]["param_groups"]


def test_dry_run_writes_nothing_and_matches_python(tmp_path):
    pytest.importorskip("safetensors")
    src, out = tmp_path / "m.safetensors", tmp_path / "o.safetensors"
    fmt.save(str(src), LLAMA)
    proc = run("prune", src, "-o", out, "--dry-run", "--method", "ln_structured", "--amount", "0.5")
    assert proc.returncode == 0, proc.stderr
    assert not out.exists()
    wf = fmt.load(str(src))
    plan = make_plan(wf.params, file_roles(wf), method="ln_structured")
    assert sorted(e.name for e in plan if e.prune) == sorted(LLAMA_WEIGHTS)
    assert all(e.dim == 0 for e in plan if e.prune)
    lines = proc.stdout.splitlines()
    for e in plan:
        line = next(ln for ln in lines if ln.startswith(e.name + " "))
        assert e.role.kind in line and (("prune, dim 0" in line) == e.prune)
    assert (
        lines[-1] == f"4 of {len(LLAMA)} tensors would be pruned ({sum(LLAMA[k].size for k in LLAMA_WEIGHTS)} entries)"
    )


@pytest.mark.slow
def test_include_and_dim_override_the_roles(tmp_path):
    src, out = tmp_path / "m.npz", tmp_path / "o.npz"
    np.savez(src, **LLAMA)
    proc = run("prune", src, "-o", out, "--amount", "0.5", "--include", "lm_head.*")
    assert proc.returncode == 0, proc.stderr
    got = np.load(out)
    assert int((got["lm_head.weight"] == 0).sum()) == LLAMA["lm_head.weight"].size // 2
    assert np.array_equal(
        got["model.layers.0.self_attn.q_proj.weight"], LLAMA["model.layers.0.self_attn.q_proj.weight"]
    )
    proc = run("prune", src, "-o", out, "--force", "--method", "nm_structured", "--dim", "0")
    got = np.load(out)
    assert ap.is_nm_sparse(got["model.layers.0.mlp.gate_proj.weight"], 2, 4, dim=0)


@pytest.mark.slow
def test_training_checkpoint_two_four_along_the_input_features(tmp_path):
    torch = pytest.importorskip("torch")
    torch.manual_seed(1)
    net = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    net(torch.randn(4, 12)).sum().backward()
    opt.step()
    src, out = tmp_path / "ckpt.pt", tmp_path / "nm.pt"
    torch.save({"model_state_dict": net.state_dict(), "optimizer_state_dict": opt.state_dict(), "step": 1}, src)
    proc = run("prune", src, "-o", out, "--method", "nm_structured")
    assert proc.returncode == 0, proc.stderr
    before, after = torch.load(src, weights_only=True), torch.load(out, weights_only=True)
    for k in ("0.weight", "2.weight"):
        w = after["model_state_dict"][k].numpy()
        assert ap.is_nm_sparse(w, 2, 4, dim=1) and int((w == 0).sum()) == w.size // 2
        np.testing.assert_array_equal(
            w, before["model_state_dict"][k].numpy() * ap.nm_structured(before["model_state_dict"][k].numpy(), dim=1)
        )
    for k in ("0.bias", "2.bias"):
        assert torch.equal(after["model_state_dict"][k], before["model_state_dict"][k])
    for i, state in before["optimizer_state_dict"]["state"].items():
        assert torch.equal(after["optimizer_state_dict"]["state"][i]["momentum_buffer"], state["momentum_buffer"])
    assert after["step"] == 1
