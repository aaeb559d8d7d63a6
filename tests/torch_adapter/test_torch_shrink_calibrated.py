"""prune.shrink with calibrated group scores (``activation_structured``, ``obs_structured``).

The yardsticks, all float64 NumPy written out here: each consumer's Hessian ``X^T X`` of
its input rows (a convolution's im2col matrix unfolded by hand), each group's score by the
method's formula in every consumer, combined over the consumers (OBS scores add,
activation scores as the root of the sum of squares), the kept channels by a stable
ranking (ties to the lower index), the refit ``W Hd[:, K] Hd[K, K]^-1`` of every consumer
over all its kept columns, and the shrunk model's output against the dense model with
the removed channels zeroed in every member of their group (and, with the refit, each
consumer's weight replaced by the NumPy refit).
"""

from __future__ import annotations

import contextlib
import copy

import numpy as np
import pytest
import torch
import torchvision_layouts as L
from torch import nn
from torchvision_layouts import randomized as _randomize

import arrayprune
import arrayprune.adapters.torch as prune
from arrayprune.adapters.torch import shrink_calibrated as SC

ATOL = 1e-5
DAMP = 0.01
METHODS = ["activation_structured", "obs_structured"]


# --------------------------------------------------------------------------------------
# NumPy references
# --------------------------------------------------------------------------------------


def _im2col(x: np.ndarray, k: tuple[int, int], stride: int = 1, pad: int = 0) -> np.ndarray:
    """Rows ``(n, oh, ow)``, columns ``(c, i, j)`` channel-major: what a Conv2d multiplies by."""
    x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    n, c, h, w = x.shape
    oh, ow = (h - k[0]) // stride + 1, (w - k[1]) // stride + 1
    rows = np.empty((n, oh, ow, c, k[0], k[1]))
    for a in range(oh):
        for b in range(ow):
            rows[:, a, b] = x[:, :, a * stride : a * stride + k[0], b * stride : b * stride + k[1]]
    return rows.reshape(n * oh * ow, c * k[0] * k[1])


def _gram(rows: list[np.ndarray]) -> np.ndarray:
    return sum(r.T @ r for r in rows)


def _hd(h: np.ndarray) -> np.ndarray:
    mean = np.mean(np.diag(h))
    return h + DAMP * (mean if mean > 0 else 1.0) * np.eye(h.shape[0])


def _unit_scores(method: str, w: np.ndarray, h: np.ndarray, per: int) -> np.ndarray:
    """One score per input channel of a consumer ``w`` ``[out, channels * per]``."""
    units = w.shape[1] // per
    if method == "activation_structured":
        col = (w**2).sum(0) * np.diag(h)
        return np.sqrt(col.reshape(units, per).sum(1))
    inv = np.linalg.inv(_hd(h))
    out = []
    for u in range(units):
        s = slice(u * per, (u + 1) * per)
        out.append(np.trace(w[:, s] @ np.linalg.inv(inv[s, s]) @ w[:, s].T))
    return np.array(out)


def _combine(method: str, parts: list[np.ndarray]) -> np.ndarray:
    if method == "activation_structured":
        return np.sqrt(sum(p**2 for p in parts))
    return sum(parts)


def _refit(w: np.ndarray, h: np.ndarray, kept_columns: np.ndarray) -> np.ndarray:
    """The consumer's new ``[out, in]``: kept columns refit, the others zero."""
    hd = _hd(h)
    new = np.zeros_like(w)
    new[:, kept_columns] = np.linalg.solve(hd[np.ix_(kept_columns, kept_columns)], hd[kept_columns] @ w.T).T
    return new


def _numpy_choice(model, groups, consumers, hessians, method, amount):
    """Per group: NumPy scores and kept channels; per consumer: the refit weight ``[out, in, ...]``."""
    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    mats = {p: state[p].reshape(state[p].shape[0], -1) for p in consumers}
    units = {p: _unit_scores(method, mats[p], hessians[p], per) for p, per in consumers.items()}
    scores, kept, removed = [], [], {p: set() for p in consumers}
    for g in groups:
        reads = [s for s in g.members if s.param in consumers and s.axis == 1]
        score = _combine(method, [units[s.param][s.offset : s.offset + g.channels] for s in reads])
        drop = round(amount * g.channels)
        keep = np.sort(np.argsort(score, kind="stable")[drop:])
        scores.append(score)
        kept.append(keep)
        for s in reads:
            removed[s.param].update(s.offset + c for c in set(range(g.channels)) - set(keep.tolist()))
    refits = {}
    for p, per in consumers.items():
        channels = [c for c in range(mats[p].shape[1] // per) if c not in removed[p]]
        columns = (np.array(channels)[:, None] * per + np.arange(per)).reshape(-1)
        refits[p] = _refit(mats[p], hessians[p], columns).reshape(state[p].shape)
    return scores, kept, refits


def _zeroed(dense: nn.Module, groups: list, kept: list[np.ndarray], weights: dict | None = None) -> nn.Module:
    """The dense model with `weights` put in, then every removed channel zeroed in every member."""
    masked = copy.deepcopy(dense)
    state = masked.state_dict()
    with torch.no_grad():
        for p, w in (weights or {}).items():
            state[p].copy_(torch.from_numpy(w))
        for group, keep in zip(groups, kept, strict=True):
            gone = np.setdiff1d(np.arange(group.channels), keep)
            for s in group.members:
                state[s.param].index_fill_(s.axis, torch.as_tensor(gone + s.offset, dtype=torch.long), 0.0)
    return masked


def _expected(dense: nn.Module, groups: list, kept: list[np.ndarray], weights: dict | None = None) -> dict:
    """The shrunk state dict: every member sliced to its group's kept channels (consumers refit first)."""
    out = {k: v.detach().numpy() for k, v in dense.state_dict().items()}
    out.update(weights or {})
    cuts: dict[tuple[str, int], list[np.ndarray]] = {}
    for group, keep in zip(groups, kept, strict=True):
        for s in group.members:
            cuts.setdefault((s.param, s.axis), []).append(keep + s.offset)
    for (param, axis), parts in cuts.items():
        out[param] = np.take(out[param], np.sort(np.concatenate(parts)), axis=axis)
    return out


# --------------------------------------------------------------------------------------
# the models
# --------------------------------------------------------------------------------------


def _cnn() -> nn.Module:
    """conv -> bn -> relu -> conv -> pool -> flatten -> linear, float64, statistics far from 0/1."""
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 6, 3, stride=2), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 4),
    ).double().eval()  # fmt: skip
    with torch.no_grad():
        net[1].running_mean.uniform_(-0.2, 0.2)
        net[1].running_var.uniform_(0.5, 1.5)
        net[1].weight.normal_()
        net[1].bias.normal_(0, 0.1)
    return net


class MLP(nn.Module):
    """A residual trunk read by two layers (one through a ``torch.cat``, beside another group)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc_in, self.fc_a, self.fc_b = nn.Linear(5, 8), nn.Linear(8, 6), nn.Linear(6, 8)
        self.side, self.fc_out = nn.Linear(5, 4), nn.Linear(12, 3)

    def parts(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """The input of every consumer, by its weight's name, and the output."""
        h = self.fc_in(x)
        a = torch.relu(self.fc_a(h))
        y = h + self.fc_b(a)
        z = torch.cat([torch.relu(y), torch.tanh(self.side(x))], dim=-1)
        return {"fc_a.weight": h, "fc_b.weight": a, "fc_out.weight": z, "out": self.fc_out(z)}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.parts(x)["out"]


def _mlp() -> nn.Module:
    torch.manual_seed(1)
    return MLP().double().eval()


def _cnn_inputs(net: nn.Module, batches: list[torch.Tensor]) -> dict[str, np.ndarray]:
    with torch.no_grad():
        conv = [_im2col(net[:3](b).numpy(), (3, 3), stride=2) for b in batches]
        fc = [net[:7](b).numpy() for b in batches]
    return {"3.weight": _gram(conv), "7.weight": _gram(fc)}


def _mlp_inputs(net: MLP, batches: list[torch.Tensor]) -> dict[str, np.ndarray]:
    with torch.no_grad():
        parts = [net.parts(b) for b in batches]
    names = ("fc_a.weight", "fc_b.weight", "fc_out.weight")
    return {k: _gram([p[k].reshape(-1, p[k].shape[-1]).numpy() for p in parts]) for k in names}


CASES = {
    # model, calibration batches, example input, consumers (weight -> columns per channel), Hessians by hand
    "cnn": (_cnn, lambda: [torch.randn(3, 3, 9, 9, dtype=torch.float64) for _ in range(2)],
            {"3.weight": 9, "7.weight": 1}, _cnn_inputs),
    "mlp": (_mlp, lambda: [torch.randn(2, 7, 5, dtype=torch.float64) for _ in range(3)],  # [batch, tokens, features]
            {"fc_a.weight": 1, "fc_b.weight": 1, "fc_out.weight": 1}, _mlp_inputs),
}  # fmt: skip


def _case(name: str):
    build, batches, consumers, by_hand = CASES[name]
    torch.manual_seed(5)
    dense, data = build(), batches()
    groups = [g for g in prune.channel_groups(dense, data[0]) if g.shrinkable]
    return dense, data, groups, consumers, by_hand(dense, data)


# --------------------------------------------------------------------------------------
# statistics, scores, choice, refit
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["cnn", "mlp"])
def test_hessians_are_x_transpose_x_by_hand(name):
    dense, data, groups, consumers, hessians = _case(name)
    found, _ = SC.consumers(dense, groups)
    assert {p: c.per for p, c in found.items()} == consumers
    got = SC.input_hessians(dense, found, data)
    assert set(got) == set(hessians)
    for p, h in hessians.items():
        assert got[p].dtype == torch.float64
        np.testing.assert_allclose(got[p].numpy(), h, rtol=1e-12, atol=1e-12, err_msg=p)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", ["cnn", "mlp"])
def test_group_scores_and_kept_channels_by_hand(name, method):
    dense, data, groups, consumers, hessians = _case(name)
    want_scores, want_kept, _ = _numpy_choice(dense, groups, consumers, hessians, method, 0.5)
    found, reads = SC.consumers(dense, groups)
    weights = {p: dense.get_parameter(p) for p in found}
    got = SC.channel_scores(arrayprune.groups.unit_method(method, {}), groups, reads, found, weights,
                            SC.input_hessians(dense, found, data))  # fmt: skip
    for g, s, w in zip(groups, got, want_scores, strict=True):
        np.testing.assert_allclose(s.numpy(), w, rtol=1e-9, err_msg=g.name)
    model = copy.deepcopy(dense)
    prune.shrink(model, data[0], 0.5, method, calibration_batches=data, compensate=False)
    want = _expected(dense, groups, want_kept)
    assert list(model.state_dict()) == list(want)
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), want[k], err_msg=k)
    with torch.no_grad():  # without refit: the dense model with the channels zeroed in every member
        for b in data:
            np.testing.assert_allclose(model(b).numpy(), _zeroed(dense, groups, want_kept)(b).numpy(), atol=ATOL)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", ["cnn", "mlp"])
def test_refit_equals_numpy_and_lowers_the_error(name, method):
    dense, data, groups, consumers, hessians = _case(name)
    _, kept, refits = _numpy_choice(dense, groups, consumers, hessians, method, 0.5)
    model = copy.deepcopy(dense).train()  # the calibration pass runs in evaluation mode, the mode comes back
    prune.shrink(model, data[0], 0.5, method, calibration_batches=data)
    assert all(m.training for m in model.modules())
    want = _expected(dense, groups, kept, refits)
    for k, v in model.state_dict().items():
        np.testing.assert_allclose(v.numpy(), want[k], rtol=1e-9, atol=1e-12, err_msg=k)
    reference = _zeroed(dense, groups, kept, refits)
    plain = prune.shrink(copy.deepcopy(dense), data[0], 0.5, method, calibration_batches=data, compensate=False)
    model.eval()
    errors = {"refit": 0.0, "plain": 0.0}
    with torch.no_grad():
        for b in data:
            np.testing.assert_allclose(model(b).numpy(), reference(b).numpy(), atol=ATOL)
            errors["refit"] += float(((model(b) - dense(b)) ** 2).sum())
            errors["plain"] += float(((plain(b) - dense(b)) ** 2).sum())
    assert errors["refit"] < 0.9 * errors["plain"], errors


def test_a_method_object_and_its_damping():
    dense, data, groups, consumers, hessians = _case("mlp")
    a = prune.shrink(copy.deepcopy(dense), data[0], 0.5, "obs_structured", calibration_batches=data, damp=0.3)
    obs = arrayprune.ObsStructured(0, damp=0.3)
    b = prune.shrink(copy.deepcopy(dense), data[0], 0.5, obs, calibration_batches=data)
    c = prune.shrink(copy.deepcopy(dense), data[0], 0.5, arrayprune.ObsStructured(0), calibration_batches=data)
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k]), k
    assert not torch.equal(a.fc_out.weight, c.fc_out.weight)  # the damping reaches scores and refit


def test_amounts_by_group_and_rounding_as_the_l2_path():
    dense, data, groups, _, _ = _case("mlp")
    model = prune.shrink(copy.deepcopy(dense), data[0], {"side": 1}, "activation_structured", calibration_batches=data)
    assert (model.fc_in.out_features, model.side.out_features, model.fc_out.in_features) == (8, 3, 11)
    with torch.no_grad():  # fc_in's channels, read beside side's by fc_out, all stay; side loses 1, refit
        want = _zeroed(dense, groups, [np.arange(8), np.arange(6), np.array([0, 1, 2, 3])])
        assert float(((model(data[0]) - want(data[0])) ** 2).sum()) > 0
    model = prune.shrink(copy.deepcopy(dense), data[0], 0.3, "obs_structured", calibration_batches=data,
                         rounding="keep_floor")  # fmt: skip
    assert (model.fc_in.out_features, model.fc_a.out_features, model.side.out_features) == (5, 4, 2)


def test_conv1d_consumer():
    torch.manual_seed(3)
    net = nn.Sequential(nn.Conv1d(2, 6, 3, padding=2, dilation=2), nn.Tanh(), nn.Conv1d(6, 3, 3, stride=2)).double()
    data = [torch.randn(2, 2, 11, dtype=torch.float64)]
    groups = [g for g in prune.channel_groups(net, data[0]) if g.shrinkable]
    found, _ = SC.consumers(net, groups)
    with torch.no_grad():
        x = net[:2](data[0]).numpy()[:, :, None, :]  # a row of a 2-D convolution
    want = _gram([_im2col(x, (1, 3), stride=2)])
    np.testing.assert_allclose(SC.input_hessians(net, found, data)["2.weight"].numpy(), want, rtol=1e-12)
    _, kept, refits = _numpy_choice(net, groups, {"2.weight": 3}, {"2.weight": want}, "obs_structured", 0.5)
    model = prune.shrink(copy.deepcopy(net), data[0], 0.5, "obs_structured", calibration_batches=data)
    with torch.no_grad():
        want = _zeroed(net, groups, kept, refits)(data[0]).numpy()
        np.testing.assert_allclose(model(data[0]).numpy(), want, atol=ATOL)


@pytest.mark.parametrize("method", METHODS)
def test_group_norm_blocks_and_grouped_convolution_parts(method):
    """GroupNorm blocks score as ``combine_scores`` of their channels; the channels a grouped
    convolution writes are ranked within each of its parts, as with weight scores."""
    torch.manual_seed(6)
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3, groups=1), nn.GroupNorm(4, 8), nn.ReLU(), nn.Conv2d(8, 8, 1), nn.ReLU(),
        nn.Conv2d(8, 4, 3),
    ).double()  # fmt: skip
    data = [torch.randn(4, 3, 9, 9, dtype=torch.float64) for _ in range(2)]
    grouped = nn.Sequential(nn.Conv2d(3, 8, 1, groups=1), nn.Tanh(), nn.Conv2d(8, 6, 3, groups=2), nn.Tanh(),
                            nn.Conv2d(6, 2, 1)).double()  # fmt: skip
    with torch.no_grad():
        h = {"3.weight": _gram([_im2col(net[:3](b).numpy(), (1, 1)) for b in data]),
             "5.weight": _gram([_im2col(net[:5](b).numpy(), (3, 3)) for b in data]),
             "4.weight": _gram([_im2col(grouped[:4](b).numpy(), (1, 1)) for b in data])}  # fmt: skip
    w = net[3].weight.detach().numpy().reshape(8, -1)
    blocks = _unit_scores(method, w, h["3.weight"], 1).reshape(4, 2)
    block_scores = _combine(method, [blocks[:, 0], blocks[:, 1]])
    keep = np.sort(np.argsort(block_scores, kind="stable")[2:])  # 2 of 4 blocks go
    model = prune.shrink(copy.deepcopy(net), data[0], 2, method, calibration_batches=data, compensate=False)
    channels = np.repeat(keep * 2, 2) + np.tile([0, 1], 2)
    np.testing.assert_array_equal(model[1].weight.detach().numpy(), net[1].weight.detach().numpy()[channels])
    assert model[1].num_groups == 2
    score = _unit_scores(method, grouped[4].weight.detach().numpy().reshape(2, -1), h["4.weight"], 1)
    kept = [np.sort(np.argsort(score[j * 3 : (j + 1) * 3], kind="stable")[1:]) + 3 * j for j in range(2)]
    # only "2" loses channels: "0", read by the grouped convolution, is neither scored nor refused
    model = prune.shrink(copy.deepcopy(grouped), data[0], {"2": 0.34}, method, calibration_batches=data)
    want = grouped[2].bias.detach().numpy()[np.concatenate(kept)]
    np.testing.assert_array_equal(model[2].bias.detach().numpy(), want)
    assert (model[2].groups, model[2].out_channels, model[4].in_channels) == (2, 4, 4)


# --------------------------------------------------------------------------------------
# torchvision's layouts
# --------------------------------------------------------------------------------------


def _kept_from(dense: nn.Module, model: nn.Module, group) -> np.ndarray:
    """The channels a group kept, read back from one of its 1-D members (random values, distinct)."""
    slot = next(s for s in group.members if dense.state_dict()[s.param].ndim == 1)
    before, after = dense.state_dict()[slot.param].numpy(), model.state_dict()[slot.param].numpy()
    kept = np.array([int(np.flatnonzero(before == v)[0]) for v in after])
    assert np.all(np.diff(kept) > 0)
    return kept


@pytest.mark.slow
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("layout", ["resnet18", "mobilenet_v3_small"])
def test_layouts_shrink_with_calibrated_scores(layout, method):
    torch.manual_seed(11)
    build = {"resnet18": lambda: L.resnet18(10, width=lambda c: c // 4),
             "mobilenet_v3_small": lambda: L.mobilenet_v3_small(10)}  # fmt: skip
    dense = _randomize(build[layout]())
    data = [torch.randn(3, 3, 32, 32, dtype=torch.float64) for _ in range(2)]
    groups = [g for g in prune.channel_groups(dense, data[0]) if g.shrinkable]
    found, reads = SC.consumers(dense, groups)
    assert max(len(r) for r in reads) >= 2  # a trunk (or a squeeze-excite's group) read by several layers
    plain = prune.shrink(copy.deepcopy(dense), data[0], 0.5, method, calibration_batches=data, compensate=False)
    kept = [_kept_from(dense, plain, g) for g in groups]
    assert [len(k) for k in kept] == [g.channels - round(0.5 * g.channels) for g in groups]
    refit = prune.shrink(copy.deepcopy(dense), data[0], 0.5, method, calibration_batches=data)
    assert {k: v.shape for k, v in refit.state_dict().items()} == {k: v.shape for k, v in plain.state_dict().items()}
    errors = {"refit": 0.0, "plain": 0.0}
    with torch.no_grad():
        zeroed = _zeroed(dense, groups, kept)
        for b in data:
            np.testing.assert_allclose(plain(b).numpy(), zeroed(b).numpy(), atol=ATOL)
            errors["refit"] += float(((refit(b) - dense(b)) ** 2).sum())
            errors["plain"] += float(((plain(b) - dense(b)) ** 2).sum())
    assert 0 < errors["refit"] < errors["plain"], errors  # on the calibration data
    exported = torch.export.export(refit, (data[0],))
    with torch.no_grad():
        np.testing.assert_allclose(exported.module()(data[0]).numpy(), refit(data[0]).numpy(), atol=1e-9)


# --------------------------------------------------------------------------------------
# refusals, placement
# --------------------------------------------------------------------------------------


class ReadByGrouped(nn.Module):
    def __init__(self, groups: int = 2, transposed: bool = False) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 8, 1)
        self.b = nn.ConvTranspose2d(8, 4, 2) if transposed else nn.Conv2d(8, 4, 3, groups=groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x))).mean((2, 3))


def _masked_consumer() -> nn.Module:
    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 4, 3))
    prune.l1_unstructured(net[2], "weight", 0.3)
    return net


X = torch.randn(2, 3, 8, 8)


@pytest.mark.parametrize(
    ("build", "args", "kwargs", "error", "pattern"),
    [
        (ReadByGrouped, (0.5, "obs_structured"), {"calibration_batches": [X]}, ValueError,
         r"^group 'a': b \(Conv2d, groups=2\) reads its channels, and calibrated scores are taken on the inputs of "
         r"Linear and Conv1d/Conv2d layers with groups=1 only$"),
        (lambda: ReadByGrouped(transposed=True), (0.5, "activation_structured"), {"calibration_batches": [X]},
         ValueError, r"^group 'a': b \(ConvTranspose2d, groups=1\) reads its channels"),
        (ReadByGrouped, (0.5, "obs_structured"), {}, TypeError,
         r"scores units on calibration data .*calibration_batches=.*prune\.shrink_llm"),
        (_masked_consumer, (0.5, "obs_structured"), {"calibration_batches": [X]}, ValueError,
         r"^2\.weight carries a pruning mask and compensate=True"),
        (lambda: ReadByGrouped(1), (0.5, "ln_structured"), {"calibration_batches": [X]}, ValueError,
         r"^calibration_batches score channels with a calibrated method \(activation_structured, obs_structured\)"),
        (lambda: ReadByGrouped(1), (0.5, "obs_structured"), {"calibration_batches": []}, ValueError,
         r"no calibration batch"),
        (lambda: ReadByGrouped(1), (0.5, "obs_structured"), {"calibration_batches": X}, TypeError,
         r"calibration_batches must be an iterable of batches"),
        (lambda: ReadByGrouped(1), (0.5, "obs_structured"), {"calibration_batches": [torch.randn(1, 5, 8, 8)]},
         RuntimeError, r"^ReadByGrouped does not run on calibration_batches: "),
        (lambda: ReadByGrouped(1), (0.5, "obs_structured"),
         {"calibration_batches": [X], "importance_scores": {"a.weight": torch.ones(8, 3, 1, 1)}}, TypeError,
         r"importance_scores replace weights"),
        (lambda: ReadByGrouped(1), (0.5, "obs_structured"), {"calibration_batches": [X], "n": 2}, TypeError,
         r"^method 'obs_structured': .*'n'"),
        (lambda: ReadByGrouped(1), (None,), {"calibration_batches": [X]}, TypeError,
         r"calibration_batches and rounding are taken only with an amount"),
        (lambda: ReadByGrouped(1), (1.0, "obs_structured"), {"calibration_batches": [X]}, ValueError,
         r"every one of its 8 channels would go"),
    ],
)  # fmt: skip
def test_refusals_are_one_line_and_change_nothing(build, args, kwargs, error, pattern):
    net = build()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    with pytest.raises(error, match=pattern) as err:
        prune.shrink(net, X, *args, **kwargs)
    assert "\n" not in str(err.value)
    assert list(net.state_dict()) == list(before)
    assert all(torch.equal(v, before[k]) for k, v in net.state_dict().items())
    assert net.training


@pytest.mark.parametrize("method", [None, "obs_structured"])
def test_a_consumer_reading_a_cat_with_channels_that_stay(method):
    """``torch.cat([relu(a(x)), x])``: the model's input channels in the consumer stay, only a's go."""

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Conv2d(3, 8, 1), nn.Conv2d(11, 4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(torch.cat([torch.relu(self.a(x)), x], 1)).mean((2, 3))

    torch.manual_seed(4)
    dense = Net().double()
    x = torch.randn(2, 3, 6, 6, dtype=torch.float64)
    options = {} if method is None else {"method": method, "calibration_batches": [x], "compensate": False}
    model = prune.shrink(copy.deepcopy(dense), x, 0.5, **options)
    assert (model.a.out_channels, model.b.in_channels) == (4, 7)
    groups = [g for g in prune.channel_groups(dense, x) if g.shrinkable]
    kept = [_kept_from(dense, model, groups[0])]
    np.testing.assert_array_equal(model.b.weight.detach().numpy()[:, 4:], dense.b.weight.detach().numpy()[:, 8:])
    with torch.no_grad():
        np.testing.assert_allclose(model(x).numpy(), _zeroed(dense, groups, kept)(x).numpy(), atol=ATOL)


def test_compensate_false_takes_a_masked_consumer():
    net = _masked_consumer()
    prune.shrink(net, X, 0.5, "obs_structured", calibration_batches=[X], compensate=False)
    assert net[2].in_channels == 4 and not prune.is_pruned(net)


def test_every_tensor_on_the_input_device_under_a_meta_default():
    """With ``torch.device("meta")`` as the default device, the model and the batches on the
    CPU: every tensor the calibrated path makes lands beside them (else it would be meta)."""

    def run(context):
        dense, data, _, _, _ = _case("cnn")
        with context:
            prune.shrink(dense, data[0], 0.5, "obs_structured", calibration_batches=data)
        return dense.state_dict()

    want = run(contextlib.nullcontext())
    got = run(torch.device("meta"))
    assert list(got) == list(want)
    for k, v in got.items():
        assert v.device.type == "cpu", k
        torch.testing.assert_close(v, want[k], rtol=0, atol=0, msg=k)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("method", METHODS)
def test_on_cuda_the_same_channels_and_weights_as_on_the_cpu(method):
    """The model and batches on a GPU: statistics, scores and refits stay there, and the
    result is the CPU's (float64: the same channels, weights within float tolerance)."""
    cpu, data, _, _, _ = _case("cnn")
    gpu = copy.deepcopy(cpu).cuda()
    prune.shrink(cpu, data[0], 0.5, method, calibration_batches=data)
    prune.shrink(gpu, data[0].cuda(), 0.5, method, calibration_batches=[b.cuda() for b in data])
    want, got = cpu.state_dict(), gpu.state_dict()
    assert list(got) == list(want)
    for k, v in got.items():
        assert v.device.type == "cuda", k
        assert v.shape == want[k].shape, k
        torch.testing.assert_close(v.cpu(), want[k], rtol=1e-9, atol=1e-9, msg=k)
