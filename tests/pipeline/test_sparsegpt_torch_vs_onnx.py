"""SparseGPT on a PyTorch model and on its ONNX export: the same masks, the same updated weights.

A small MLP and a small CNN (a grouped, strided, padded convolution) are exported with
``torch.onnx.export``; :func:`arrayprune.adapters.torch.sparsegpt` prunes the module and
``arrayprune prune --method sparsegpt`` (the file pipeline, onnxruntime) prunes the export,
both on the same calibration samples and in the same sequential order.
"""

from __future__ import annotations

import io

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from torch import nn  # noqa: E402

import arrayprune.adapters.torch as prune  # noqa: E402
from arrayprune.adapters import formats, prune_file  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:You are using the legacy TorchScript:DeprecationWarning")


def _mlp():
    return nn.Sequential(nn.Linear(12, 24), nn.ReLU(), nn.Linear(24, 16), nn.Tanh(), nn.Linear(16, 6))


def _cnn():
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, stride=2, groups=2),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(8 * 3 * 3, 5),
    )


def _export(net, sample, path):
    buffer = io.BytesIO()
    torch.onnx.export(
        net,
        (sample,),
        buffer,
        dynamo=False,
        do_constant_folding=False,
        input_names=["x"],
        output_names=["y"],
        dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}},
    )
    path.write_bytes(buffer.getvalue())


@pytest.mark.parametrize("options", [{"amount": 0.5}, {"amount": 0.8}, {"nm": (2, 4)}], ids=["50%", "80%", "2:4"])
@pytest.mark.parametrize(("make", "shape"), [(_mlp, (12,)), (_cnn, (3, 8, 8))], ids=["mlp", "cnn"])
@pytest.mark.parametrize("one_pass", [False, True], ids=["sequential", "one-pass"])
def test_torch_path_equals_onnx_path(tmp_path, make, shape, options, one_pass):
    torch.manual_seed(0)
    net = make().eval()
    # correlated inputs: SparseGPT's updates matter
    mixing = torch.randn(shape[0], shape[0])
    x = torch.einsum("ij,nj...->ni...", mixing, torch.randn(96, *shape))
    src = tmp_path / "net.onnx"
    _export(net, x[:2], src)
    np.savez(tmp_path / "calib.npz", x=x.numpy())

    dense = {k: v.detach().clone() for k, v in net.state_dict().items()}
    result = prune_file(
        src, tmp_path / "out.onnx", method="sparsegpt", calibration=tmp_path / "calib.npz", one_pass=one_pass, **options
    )
    weights = sorted(name for name in dense if name.endswith("weight"))
    assert sorted(result.written.by_tensor) == weights  # the exporter keeps the modules' names

    torch_options = {"n": options["nm"][0], "m": options["nm"][1]} if "nm" in options else options
    prune.sparsegpt(net, [x], sequential=not one_pass, **torch_options)

    got = formats.load(str(tmp_path / "out.onnx")).params
    for name in weights:
        module = net.get_submodule(name.rpartition(".")[0])
        want = module.weight.detach().numpy()
        mask = module.weight_mask.detach().numpy() != 0
        np.testing.assert_array_equal(np.asarray(got[name]) != 0, mask, err_msg=name)
        np.testing.assert_allclose(got[name], want, rtol=2e-4, atol=2e-5, err_msg=name)
        assert not np.allclose(want[mask], dense[name].numpy()[mask]), f"{name}: kept weights not updated"
    for name in dense.keys() - set(weights):  # biases untouched on both paths
        np.testing.assert_array_equal(got[name], dense[name].numpy(), err_msg=name)
