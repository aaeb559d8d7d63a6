"""Norms over several channels in ONNX exports: what shrinking leaves, and why.

``LayerNormalization`` over the channel axis: its mean and variance run over every
channel, so a model without some channels is not the dense model with them zeroed (the
zeros still count in the statistics): the channels stay, and the reason says so. The
GroupNorm that ``torch.onnx.export`` writes (``Reshape`` to ``[N, G, -1]``,
``InstanceNormalization``, ``Reshape`` back) could lose whole groups; ONNX shrinking
does not follow it (the torch adapter does), and says so.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from arrayprune.adapters.roles.onnx_groups import onnx_groups  # noqa: E402

WHY_LN = "a norm over the channels, whose statistics would change without the removed ones"
WHY_GN = "only whole groups could go, which ONNX shrinking does not follow (torch modules: prune.shrink)"


def _export(module: nn.Module, x: torch.Tensor, dynamo: bool) -> onnx.ModelProto:
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), (x,), f, dynamo=dynamo, input_names=["x"], output_names=["y"])
    return onnx.load_from_string(f.getvalue())


def test_zeroed_channels_are_not_removed_channels_for_a_layer_norm():
    """Why LayerNorm's channels stay: float64 NumPy, the two models differ."""
    x = np.random.default_rng(0).standard_normal((3, 6))
    keep = np.array([0, 2, 3, 5])

    def ln(a: np.ndarray) -> np.ndarray:
        return (a - a.mean(-1, keepdims=True)) / np.sqrt(a.var(-1, keepdims=True) + 1e-5)

    zeroed = x.copy()
    zeroed[:, [1, 4]] = 0
    assert not np.allclose(ln(zeroed)[:, keep], ln(x[:, keep]), atol=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize("dynamo", [False, True])
def test_layer_norm_over_the_channels_is_left_with_its_reason(dynamo):
    net = nn.Sequential(nn.Linear(4, 6), nn.LayerNorm(6), nn.Linear(6, 5), nn.GELU(), nn.Linear(5, 2))
    found = onnx_groups(_export(net, torch.randn(2, 3, 4), dynamo))
    (left_ln, left_out) = found.left
    assert left_ln.channels == 6 and left_ln.reason.endswith(f": {WHY_LN}")
    assert "LayerNormalization" in left_ln.reason
    (group,) = found.groups  # the MLP's channels still go
    assert group.group.channels == 5


@pytest.mark.slow
@pytest.mark.parametrize("dynamo", [False, True])
def test_group_norm_is_left_with_its_reason(dynamo):
    net = nn.Sequential(nn.Conv2d(3, 8, 1), nn.GroupNorm(4, 8), nn.ReLU(), nn.Conv2d(8, 4, 1), nn.ReLU(),
                        nn.Conv2d(4, 2, 1))  # fmt: skip
    found = onnx_groups(_export(net, torch.randn(1, 3, 4, 4), dynamo))
    assert found.left[0].channels == 8
    assert found.left[0].reason.endswith(f"normalize groups of channels together (a GroupNorm): {WHY_GN}")
    assert "InstanceNormalization" in found.left[0].reason
    assert [g.group.channels for g in found.groups] == [4]
