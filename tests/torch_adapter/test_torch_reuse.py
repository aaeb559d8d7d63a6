"""Sequential SparseGPT in PyTorch: the outputs of finished layers are reused, not computed again.

Each step of sequential calibration runs every batch up to the layer it calibrates; the
layers pruned in earlier steps give the same outputs in every later run, so they are kept
and handed back. Checked against the same calls with nothing kept (a budget of 0 bytes):
every weight and mask equal byte for byte, fewer ``Linear`` products computed, an output
changed in place downstream computed again, and the model's own forwards back afterwards.
Likewise the layers a step calibrates give zeros while the run only goes on to see which
layers share their input (the same bytes as computing them), and Hessians of float32
inputs come from the upper panels of ``X^T X`` (the full product's bits, checked).
"""

from __future__ import annotations

import contextlib

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import arrayprune.adapters.torch as prune  # noqa: E402
from arrayprune.adapters.torch import reconstruction  # noqa: E402


class _Block(nn.Module):
    """Attention-like: q, k, v share an input; o, up and down follow; `trick` varies what reads them."""

    def __init__(self, width: int = 12, trick: str = ""):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(width, width) for _ in range(4))
        self.up, self.down = nn.Linear(width, 2 * width), nn.Linear(2 * width, width)
        self.trick = trick

    def forward(self, x):
        h = torch.tanh(x)
        q, k, v = self.q(h), self.k(h), self.v(h)
        if self.trick == "in place":
            q.mul_(0.5)  # the kept output of q, changed by what reads it: computed again next time
        a = torch.softmax(q @ k.transpose(-1, -2) / 3.0, dim=-1) @ v
        r = self.o(a) + h
        if self.trick == "twice":
            r = self.o(torch.relu(r))  # o called again after its first call: two outputs per batch
        return self.down(torch.relu(self.up(r))) + r


def _data(trick: str) -> tuple[_Block, list[torch.Tensor]]:
    torch.manual_seed(0)
    net = _Block(trick=trick).double()
    return net, [torch.randn(3, 5, 12, dtype=torch.float64) for _ in range(3)]


def _counted(monkeypatch) -> list[int]:
    """Count the products ``nn.Linear.forward`` computes (kept outputs are not computed)."""
    counts = [0]
    original = nn.Linear.forward

    def forward(self, x):
        counts[0] += 1
        return original(self, x)

    monkeypatch.setattr(nn.Linear, "forward", forward)
    return counts


def _pruned(monkeypatch, trick: str, budget: int) -> tuple[_Block, int, list]:
    monkeypatch.setattr(reconstruction, "REUSE_BYTES", budget)
    counts = _counted(monkeypatch)
    net, batches = _data(trick)
    outputs: list = []
    reconstruction.sparsegpt(net, batches, 0.5, block_size=4, outputs=outputs)
    return net, counts[0], outputs


@pytest.mark.slow
@pytest.mark.parametrize("trick", ["", "in place", "twice"])
def test_reused_outputs_give_the_same_bytes_with_fewer_products(monkeypatch, trick):
    kept, computed, outputs = _pruned(monkeypatch, trick, 1 << 30)
    fresh, recomputed, expected = _pruned(monkeypatch, trick, 0)
    for name in ("q", "k", "v", "o", "up", "down"):
        a, b = getattr(kept, name), getattr(fresh, name)
        assert a.weight_orig.detach().numpy().tobytes() == b.weight_orig.detach().numpy().tobytes(), name
        assert torch.equal(a.weight_mask, b.weight_mask), name
    for out, ref in zip(outputs, expected, strict=True):
        assert out.numpy().tobytes() == ref.numpy().tobytes()
    # Without reuse, per batch (and one full forward to find the order, 6 or 7 products):
    # the q/k/v step computes none (q, k and v give zeros: the run only goes on to see k
    # and v take q's input), o's step 3 (o gives zeros, as up might follow it; "twice": o
    # is computed, its second call ends the run), up's 4, down's 5, the final outputs 6
    # (+1 for "twice" from o's step on).
    per_batch = {"": 0 + 3 + 4 + 5 + 6, "in place": 18, "twice": 0 + 4 + 5 + 6 + 7}[trick]
    assert recomputed == (7 if trick == "twice" else 6) + 3 * per_batch
    # With it, a finished layer's output is computed in the next step, then kept: the steps of
    # up, down and the final outputs reuse q, k, v; q, k, v, o; q, k, v, o, up (q, changed
    # in place, is computed each time; o called twice has two outputs kept).
    saved = {"": 3 + 4 + 5, "in place": 2 + 3 + 4, "twice": 3 + 5 + 6}[trick]
    assert computed == recomputed - 3 * saved


@pytest.mark.slow
@pytest.mark.parametrize("trick", ["", "in place", "twice"])
def test_zeros_for_outputs_nobody_reads_give_the_same_bytes(monkeypatch, trick):
    skipped, fewer, outputs = _pruned(monkeypatch, trick, 0)
    monkeypatch.setattr(reconstruction._SharedCapture, "skipping", lambda self, layers: contextlib.nullcontext())
    computed, more, expected = _pruned(monkeypatch, trick, 0)
    for name in ("q", "k", "v", "o", "up", "down"):
        a, b = getattr(skipped, name), getattr(computed, name)
        assert a.weight_orig.detach().numpy().tobytes() == b.weight_orig.detach().numpy().tobytes(), name
        assert torch.equal(a.weight_mask, b.weight_mask), name
    for out, ref in zip(outputs, expected, strict=True):
        assert out.numpy().tobytes() == ref.numpy().tobytes()
    # q, k and v in their own step, and o in its step where up might have followed it
    assert more - fewer == 3 * (3 + (0 if trick == "twice" else 1))


def test_the_final_outputs_equal_the_pruned_models_bit_for_bit(monkeypatch):
    net, _, outputs = _pruned(monkeypatch, "", 1 << 30)
    _, batches = _data("")
    with torch.no_grad():
        for out, batch in zip(outputs, batches, strict=True):
            assert out.numpy().tobytes() == net(batch).numpy().tobytes()


@pytest.mark.slow
def test_the_budget_bounds_what_is_kept(monkeypatch):
    one = 3 * 5 * 12 * 8  # bytes of one batch's output of a width-12 layer
    _, unbounded, _ = _pruned(monkeypatch, "", 1 << 30)
    _, bounded, _ = _pruned(monkeypatch, "", one)  # q of the first batch alone
    _, none, _ = _pruned(monkeypatch, "", 0)
    assert unbounded < bounded < none
    assert none - bounded == 3  # q of batch 0, kept in the step of o, reused in those of up, down and the final outputs


def test_forwards_and_hooks_are_restored(monkeypatch):
    net, _, _ = _pruned(monkeypatch, "", 1 << 30)
    for layer in (net.q, net.k, net.v, net.o, net.up, net.down):
        assert "forward" not in vars(layer)
        assert len(layer._forward_pre_hooks) == 1  # the reparametrization's own


def test_a_failing_step_restores_forwards_and_weights(monkeypatch):
    net, batches = _data("")
    before = {n: p.detach().clone() for n, p in net.named_parameters()}
    calls = [0]
    original = reconstruction._reconstruct

    def failing(*args, **kwargs):
        calls[0] += 1
        if calls[0] == 4:  # after q, k, v (one step) are finished
            raise RuntimeError("stop")
        return original(*args, **kwargs)

    monkeypatch.setattr(reconstruction, "_reconstruct", failing)
    with pytest.raises(RuntimeError, match="stop"):
        prune.sparsegpt(net, batches, 0.5, block_size=4)
    for name, param in net.named_parameters():
        assert torch.equal(param, before[name]), name
    for layer in (net.q, net.k, net.v, net.o):
        assert "forward" not in vars(layer) and not layer._forward_pre_hooks


# --------------------------------------------------------------------------------------
# Hessians of float32 inputs: the upper panels of X^T X, mirrored, checked against the full product
# --------------------------------------------------------------------------------------


def _bits(t: torch.Tensor) -> bytes:
    return t.numpy().tobytes()


@pytest.mark.parametrize("rows, k", [(64, 300), (7, 700), (130, 512)])
def test_panel_gram_gives_the_full_products_bits(monkeypatch, rows, k):
    monkeypatch.setattr(reconstruction, "_PANEL_EXACT", {})
    torch.manual_seed(rows)
    x = torch.randn(rows, k).double()  # float32 values: their products are exact in float64
    panels = reconstruction._panel_gram(x)
    assert _bits(panels) == _bits(x.T @ x)
    assert _bits(reconstruction._gram(x)) == _bits(x.T @ x)  # checked once, then panels
    assert reconstruction._PANEL_EXACT == {(rows, k, torch.get_num_threads()): True}
    assert _bits(reconstruction._gram(x)) == _bits(x.T @ x)


def test_panels_that_differ_are_not_used(monkeypatch):
    monkeypatch.setattr(reconstruction, "_PANEL_EXACT", {})
    used = []

    def off_by_a_bit(x):
        used.append(1)
        g = x.T @ x
        g[0, 1] = torch.nextafter(g[0, 1], g[0, 1] + 1)  # one entry one bit off
        return g

    monkeypatch.setattr(reconstruction, "_panel_gram", off_by_a_bit)
    x = torch.randn(16, 300).double()
    for _ in range(3):
        assert _bits(reconstruction._gram(x)) == _bits(x.T @ x)
    assert used == [1]  # compared once, then never used for that shape
    assert reconstruction._PANEL_EXACT == {(16, 300, torch.get_num_threads()): False}


def test_float32_layers_use_the_panels_and_float64_layers_the_full_product(monkeypatch):
    seen = []
    original = reconstruction._gram

    def spy(x):
        seen.append(tuple(x.shape))
        return original(x)

    monkeypatch.setattr(reconstruction, "_gram", spy)
    for dtype in (torch.float32, torch.float64):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(300, 4), nn.ReLU(), nn.Linear(4, 2)).to(dtype)
        prune.sparsegpt(net, [torch.randn(2, 5, 300, dtype=dtype)], 0.5)
    assert seen == [(10, 300), (10, 4)]  # float32 only (a float64 input's products are not exact)


def test_the_reuse_budget_on_a_cuda_device_is_at_most_a_quarter_of_its_free_memory(monkeypatch):
    asked = []

    def mem_get_info(device):
        asked.append(device)
        return free, 80 << 30

    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    free = 2 << 30
    assert reconstruction._reuse_budget(torch.device("cuda", 1)) == 512 << 20
    assert asked == [torch.device("cuda", 1)]
    free = 60 << 30
    assert reconstruction._reuse_budget(torch.device("cuda")) == reconstruction.REUSE_BYTES == 1 << 30
    assert reconstruction._reuse_budget(torch.device("cpu")) == reconstruction.REUSE_BYTES
    assert reconstruction._reuse_budget(None) == reconstruction.REUSE_BYTES
    assert len(asked) == 2  # the CPU asks nothing


def test_outputs_must_be_a_list_and_nothing_is_pruned_otherwise():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    before = {k: v.clone() for k, v in net.state_dict().items()}
    with pytest.raises(TypeError, match="outputs must be a list"):
        prune.sparsegpt(net, [torch.randn(8, 4)], 0.5, outputs=())
    assert not prune.is_pruned(net)
    assert all(torch.equal(v, before[k]) for k, v in net.state_dict().items())
