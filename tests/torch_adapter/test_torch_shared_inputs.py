"""Sequential SparseGPT in PyTorch: layers that multiply the very same input share one run and one Hessian.

Query, key and value projections read one tensor; their Hessians from separate runs
(each after the ones before are pruned) are the same, bit for bit, so one run feeds all
three. Checked against the same call with sharing turned off: every weight and mask
equal byte for byte; and only where the input is truly the same (the same tensor, not
modified in place, each layer called once) is anything shared.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import arrayprune.adapters.torch as prune  # noqa: E402
from arrayprune.adapters.torch import reconstruction  # noqa: E402

_CAPTURE = reconstruction._capture_shared


class _Attention(nn.Module):
    def __init__(self, width: int = 12, trick: str = ""):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(width, width) for _ in range(4))
        self.up = nn.Linear(width, 2 * width)
        self.trick = trick

    def forward(self, x):
        h = torch.tanh(x)
        q = self.q(h)
        if self.trick == "in place":
            h.mul_(2.0)  # the same tensor, changed: k and v must not share q's Hessian
        k = self.k(h if self.trick != "copy" else h.clone())
        v = self.v(h)
        a = torch.softmax(q @ k.transpose(-1, -2) / 3.0, dim=-1) @ v
        return self.up(self.o(a) + h)


def _runs(monkeypatch, trick, share):
    torch.manual_seed(0)
    net = _Attention(trick=trick)
    batches = [torch.randn(3, 5, 12) for _ in range(3)]
    steps = []

    def spy(*args, **kwargs):
        names = _CAPTURE(*args, **kwargs)
        names = names if share else names[:1]
        steps.append(names)
        return names

    monkeypatch.setattr(reconstruction, "_capture_shared", spy)
    prune.sparsegpt(net, batches, 0.5)
    return net, steps


@pytest.mark.slow
@pytest.mark.parametrize("trick", ["", "copy", "in place"])
def test_shared_runs_equal_separate_runs_bit_for_bit(monkeypatch, trick):
    shared, steps = _runs(monkeypatch, trick, share=True)
    separate, alone = _runs(monkeypatch, trick, share=False)
    assert alone == [["q"], ["k"], ["v"], ["o"], ["up"]]
    expected = {
        "": [["q", "k", "v"], ["o"], ["up"]],
        "copy": [["q"], ["k"], ["v"], ["o"], ["up"]],  # k reads a copy; v then follows k, not q
        "in place": [["q"], ["k", "v"], ["o"], ["up"]],
    }[trick]
    assert steps == expected
    for name in ("q", "k", "v", "o", "up"):
        a, b = getattr(shared, name), getattr(separate, name)
        assert a.weight_orig.detach().numpy().tobytes() == b.weight_orig.detach().numpy().tobytes(), name
        assert torch.equal(a.weight_mask, b.weight_mask)
        assert int((a.weight == 0).sum()) == a.weight.numel() // 2
