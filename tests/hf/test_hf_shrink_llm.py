"""``prune.shrink_llm``: an in-memory transformers model shrunk as the file route shrinks its folder.

Each case saves a tiny random model with ``save_pretrained`` (sharded), runs ``arrayprune
prune FOLDER --shrink ...`` on it and loads the result; ``shrink_llm`` on the same model
object with the same token ids must give the same config and the same logits, and
generate. Bad input is refused with one line of PyTorch's error types, the model untouched.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
tr = pytest.importorskip("transformers")

import arrayprune.adapters.torch as prune  # noqa: E402
from arrayprune.adapters.cli import main  # noqa: E402
from hf_models import FAMILY_MODELS, IDS, check_generates, load, save_family, save_sharded_llama  # noqa: E402

TOKENS = np.random.default_rng(2).integers(0, 64, size=(6, 16))


def _file_route(tmp_path, family, args, calibrated):
    if family == "llama":
        save_sharded_llama(tmp_path / "dense")
        cls = tr.LlamaForCausalLM
    else:
        cls = save_family(tmp_path / "dense", family)
    extra = []
    if calibrated:
        np.savez(tmp_path / "tokens.npz", input_ids=TOKENS)
        extra = ["--calibration", str(tmp_path / "tokens.npz")]
    code = main(["prune", str(tmp_path / "dense"), "-o", str(tmp_path / "small"), "--shrink", *args, *extra])
    assert code == 0
    return cls, load(cls, tmp_path / "dense"), load(cls, tmp_path / "small")


CASES = [
    ("llama", dict(groups="heads", amount=1, method="obs_structured"), True),
    ("llama", dict(groups="channels", amount=0.5, method="activation_structured"), True),
    ("mistral", dict(groups="channels", amount=0.25), False),
    ("qwen3", dict(groups="channels", amount=0.5, method="obs_structured"), True),
    ("mistral", dict(groups="heads", amount=0.5, method="activation_structured", compensate=False), True),
    ("qwen2", dict(groups="layers", amount=1), True),
    ("qwen2", dict(groups="layers", amount=1, compensate=False), True),
    ("mixtral", dict(groups="experts", amount=0.5), True),
    ("qwen2_moe", dict(groups="experts", amount=1), True),
    ("mixtral", dict(groups="experts", amount=1), False),  # by the experts' weight norm
]


def _args(kw):
    args = ["--groups", kw["groups"], "--amount", str(kw["amount"])]
    if kw["groups"] in ("channels", "heads"):
        args += ["--method", kw.get("method", "ln_structured")]
    elif kw["groups"] == "layers":
        args += ["--method", "ln_structured"]
    return args + ([] if kw.get("compensate", True) else ["--no-compensate"])


@pytest.mark.slow
@pytest.mark.parametrize(("family", "kw", "calibrated"), CASES)
def test_equals_the_file_route(tmp_path, family, kw, calibrated):
    cls, dense, want = _file_route(tmp_path, family, _args(kw), calibrated)
    before = {k: v.clone() for k, v in dense.state_dict().items()}
    got = prune.shrink_llm(dense, torch.from_numpy(TOKENS) if calibrated else None, **kw)
    assert type(got) is cls and got is not dense and not got.training and got.dtype == dense.dtype
    assert sorted(got.state_dict()) == sorted(want.state_dict())
    for key, value in want.state_dict().items():
        assert got.state_dict()[key].shape == value.shape, key
    keys = ("num_hidden_layers", "layer_types", "intermediate_size", "num_attention_heads", "num_key_value_heads",
            "num_local_experts", "num_experts", "moe_intermediate_size")  # fmt: skip
    for key in keys:
        assert getattr(got.config, key, None) == getattr(want.config, key, None), key
    with open(tmp_path / "small" / "config.json") as f:
        stored = json.load(f)
    assert stored["arrayprune"]["shrink"] == kw["groups"]
    with torch.no_grad():
        np.testing.assert_allclose(got(IDS).logits.numpy(), want(IDS).logits.numpy(), rtol=0, atol=1e-5)
    assert all(torch.equal(before[k], v) for k, v in dense.state_dict().items())  # the dense model as it was
    check_generates(got, vocab=got.config.vocab_size)


@pytest.mark.slow
def test_units_really_go(tmp_path):
    cls = save_family(tmp_path / "dense", "mistral")
    dense = load(cls, tmp_path / "dense")
    small = prune.shrink_llm(dense, torch.from_numpy(TOKENS), groups="heads", amount=1, method="obs_structured")
    assert (small.config.num_attention_heads, small.config.num_key_value_heads) == (2, 1)
    assert small.model.layers[0].self_attn.q_proj.weight.shape == (16, 32)  # head_dim 8, 2 heads
    n_dense, n_small = (sum(p.numel() for p in m.parameters()) for m in (dense, small))
    assert n_small < n_dense
    assert FAMILY_MODELS["mistral"][1] == type(small).__name__


@pytest.mark.parametrize(
    ("model", "calibration", "kw", "error", "fragment"),
    [
        ("linear", None, dict(amount=0.5), TypeError, "takes a transformers model"),
        ("llm", None, dict(amount=0.5, groups="rows"), ValueError, "groups must be one of"),
        ("llm", None, dict(amount=1.5), ValueError, "amount=1.5 should either be"),
        ("llm", None, dict(amount="half"), TypeError, "amount must be an int or a float"),
        ("llm", None, dict(amount=0.5, method="l1_unstructured"), ValueError, "removes whole units"),
        ("llm", None, dict(amount=0.5, method="obs_structured"), ValueError, "pass calibration token ids"),
        ("llm", None, dict(amount=1, groups="layers"), ValueError, "ranks layers on calibration data"),
        ("llm", "ids", dict(amount=0.5), ValueError, "calibration ranks channels with"),
        ("llm", "floats", dict(amount=1, groups="layers"), TypeError, "token ids (integers)"),
        ("llm", "big", dict(amount=1, groups="layers"), ValueError, "token ids must be in [0, 64)"),
        ("llm", None, dict(amount=24), ValueError, "would remove every one of the 24 channels"),
        ("llm", "ids", dict(amount=0.5, groups="experts"), ValueError, "Mistral layers hold no experts"),
    ],
)
def test_bad_input_one_line_nothing_changed(tmp_path, model, calibration, kw, error, fragment):
    cls = save_family(tmp_path / "dense", "mistral")
    dense = load(cls, tmp_path / "dense")
    before = {k: v.clone() for k, v in dense.state_dict().items()}
    target = torch.nn.Linear(2, 2) if model == "linear" else dense
    cal = {None: None, "ids": torch.from_numpy(TOKENS), "floats": torch.rand(2, 8), "big": torch.full((2, 8), 99)}
    with pytest.raises(error) as info:
        prune.shrink_llm(target, cal[calibration], **kw)
    text = str(info.value)
    assert fragment in text and "\n" not in text and "/tmp" not in text and "arrayprune-llm-" not in text
    assert all(torch.equal(before[k], v) for k, v in dense.state_dict().items())
    assert dense.config.intermediate_size == 24 and dense.config.num_hidden_layers == 2


@pytest.mark.slow
def test_bfloat16_model_stays_bfloat16(tmp_path):
    cls = save_family(tmp_path / "dense", "mistral")
    dense = load(cls, tmp_path / "dense").to(torch.bfloat16)
    dense.save_pretrained(tmp_path / "bf16")
    args = ["prune", str(tmp_path / "bf16"), "-o", str(tmp_path / "small"), "--shrink", "--amount", "0.25",
            "--method", "ln_structured"]
    assert main(args) == 0
    want = cls.from_pretrained(tmp_path / "small", dtype=torch.bfloat16).eval()
    got = prune.shrink_llm(dense, amount=0.25)
    assert got.dtype == torch.bfloat16 and got.config.intermediate_size == 18
    for key, value in want.state_dict().items():
        assert torch.equal(got.state_dict()[key], value), key
