"""A reconstruction registered from one file (``tests/refit_plugin.py``) reaches every surface.

The toy (magnitude selection, the kept weights refit by least squares on the Hessian),
registered with :func:`arrayprune.registry.register_method`, is a ``--method`` choice of
the command line, runs through ``prune_file`` on an ONNX graph (its Hessians from
onnxruntime) and layer by layer on a Hugging Face folder, and through the drop-in's
``prune.reconstruct``; each result equals the toy applied in float64 NumPy to the
Hessians of the same calibration data.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

import refit_plugin  # noqa: E402
from torch import nn  # noqa: E402

import arrayprune  # noqa: E402
import arrayprune.adapters.torch as prune  # noqa: E402
from arrayprune.adapters import formats, prune_file  # noqa: E402
from arrayprune.adapters.cli import main  # noqa: E402
from arrayprune.adapters.cli.options import build_parser  # noqa: E402
from cli_helpers import EXAMPLE  # noqa: E402

NAME = refit_plugin.NAME


@pytest.fixture
def registered():
    refit_plugin.register()
    yield
    refit_plugin.unregister()


def _calibration(tmp_path):
    x = np.random.default_rng(0).standard_normal((48, 64)).astype(np.float32)
    path = tmp_path / "calibration.npz"
    np.savez(path, input=x)
    return path, x.astype(np.float64)


def _reference_first_layer(x):
    """fc1 of the example (Gemm, weight [256, 64], inputs along axis 1) refit on X^T X."""
    weight = formats.load(EXAMPLE).params["fc1.weight"]
    return refit_plugin.magnitude_refit(weight, x.T @ x / len(x), 0.5, reduction_axis=1)


def test_the_command_line_offers_it_and_prunes_an_onnx_model(registered, tmp_path, capsys):
    choices = next(a.choices for a in build_parser()._subparsers._group_actions[0].choices["prune"]._actions
                   if "--method" in a.option_strings)  # fmt: skip
    assert NAME in choices and "sparsegpt" in choices
    calibration, x = _calibration(tmp_path)
    out = tmp_path / "out.onnx"
    assert main(["prune", EXAMPLE, "-o", str(out), "--method", NAME, "--amount", "0.5", "--calibration",
                 str(calibration)]) == 0  # fmt: skip
    new, keep = _reference_first_layer(x)
    got = formats.load(out).params["fc1.weight"]
    np.testing.assert_array_equal(got != 0, keep)
    np.testing.assert_allclose(got, new, rtol=2e-4, atol=1e-5)
    assert not np.allclose(got, formats.load(EXAMPLE).params["fc1.weight"] * keep)  # refit, not masked


def test_prune_file_runs_it_on_onnx_one_pass_and_sequential(registered, tmp_path):
    calibration, x = _calibration(tmp_path)
    new, keep = _reference_first_layer(x)
    for one_pass in (True, False):
        out = tmp_path / f"out-{one_pass}.onnx"
        result = prune_file(EXAMPLE, out, method=NAME, amount=0.5, calibration=calibration, one_pass=one_pass)
        params = formats.load(out).params
        np.testing.assert_allclose(params["fc1.weight"], new, rtol=2e-4, atol=1e-5)  # the first layer: either way
        for name in ("fc1.weight", "fc2.weight", "fc3.weight"):
            assert int((params[name] == 0).sum()) == params[name].size // 2 == result.written.by_tensor[name][0]


def test_the_drop_in_reconstructs_with_it(registered):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8)).double()
    dense = net[0].weight.detach().numpy().copy()
    batches = [torch.randn(20, 12, dtype=torch.float64) for _ in range(3)]
    prune.reconstruct(net, batches, 0.5, method=NAME, sequential=False)
    x = torch.cat(batches).numpy()
    new, keep = refit_plugin.magnitude_refit(dense, x.T @ x / len(x), 0.5, reduction_axis=1)
    np.testing.assert_allclose(net[0].weight.detach().numpy(), new, rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(net[0].weight_mask.numpy() != 0, keep)
    with pytest.raises(ValueError, match="is not a method that updates the weights it keeps"):
        prune.reconstruct(net, batches, 0.5, method="not_registered")


@pytest.mark.slow
def test_a_hugging_face_folder_layer_by_layer_equals_the_drop_in(registered, tmp_path):
    pytest.importorskip("transformers")
    import transformers

    from hf_models import VOCAB, save_sharded_llama

    folder = save_sharded_llama(tmp_path / "llama")
    ids = np.random.default_rng(0).integers(0, VOCAB, (8, 12))
    tokens = tmp_path / "tokens.npz"
    np.savez(tokens, input_ids=ids)
    out = tmp_path / "out"
    result = prune_file(folder, out, method=NAME, amount=0.5, calibration=tokens)
    model = transformers.LlamaForCausalLM.from_pretrained(folder).eval()
    linears = [n for n, mod in model.named_modules() if isinstance(mod, torch.nn.Linear) and ".layers." in n]
    prune.reconstruct(model, [{"input_ids": torch.from_numpy(ids), "use_cache": False}], 0.5, method=NAME,
                      modules=linears)  # fmt: skip
    got = {}
    from safetensors.numpy import load_file

    for path in sorted(out.glob("*.safetensors")):
        got.update(load_file(path))
    assert set(result.written.by_tensor) == {f"{n}.weight" for n in linears}
    for name in linears:
        want = model.get_submodule(name).weight.detach().numpy()
        np.testing.assert_allclose(got[f"{name}.weight"], want, rtol=1e-4, atol=1e-6, err_msg=name)
        assert int((got[f"{name}.weight"] == 0).sum()) == want.size // 2, name


def test_registration_is_checked():
    register, unregister = arrayprune.registry.register_method, arrayprune.registry.unregister_method
    with pytest.raises(ValueError, match="already"):
        register("sparsegpt", refit_plugin.MagnitudeRefit)
    with pytest.raises(ValueError, match="already"):
        register("wanda", refit_plugin.MagnitudeRefit)
    with pytest.raises(ValueError, match="identifier"):
        register("not a name", refit_plugin.MagnitudeRefit)
    with pytest.raises(TypeError, match="BasePruningMethod"):
        register("x", refit_plugin.magnitude_refit)
    with pytest.raises(KeyError, match="registered at run time"):
        unregister("sparsegpt")
    assert NAME not in arrayprune.METHODS
    # A method that only masks carries no solver: no surface reconstructs with it.
    with pytest.raises(ValueError, match="l1_unstructured' is not a method that updates the weights it keeps"):
        arrayprune.registry.reconstruction_method("l1_unstructured")
    with pytest.raises(ValueError, match="choose from sparsegpt"):
        prune.reconstruct(nn.Linear(4, 4), [torch.ones(2, 4)], 0.5, method="wanda")
