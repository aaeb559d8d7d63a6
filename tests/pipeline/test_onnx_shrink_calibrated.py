"""Shrinking ONNX graphs with calibrated group scores: Hessians, kept channels and refits checked.

Models are ``torch.onnx.export`` of small torch modules. References are computed here
in float64 NumPy from the torch modules' own weights (``[out, in]`` layout) and
activations (forward hooks; a convolution's patches by ``torch.nn.functional.unfold``):
``X^T X`` of each consumer's inputs, the OBS and activation-aware scores of each
channel summed (or root-summed) over its consumers, the ranking (lowest first, ties to
the lower index), and the refit ``W'_K = W Hd[:, K] Hd[K, K]^-1``.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from arrayprune.adapters import formats, prune_file  # noqa: E402
from arrayprune.adapters.pipeline.reconstruction import onnx_input_hessians  # noqa: E402
from arrayprune.adapters.roles.onnx_groups import onnx_groups  # noqa: E402
from arrayprune.adapters.shrink import consumers, shrink_onnx, zeroed_onnx  # noqa: E402
from tests.cli_helpers import assert_error  # noqa: E402
from tests.cli_helpers import run as cli  # noqa: E402

DAMP = 0.01


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(6, 12), nn.Linear(12, 10), nn.Linear(10, 3)

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


class Residual(nn.Module):
    """A trunk read by two layers (fc1 and head): one group with two consumers."""

    def __init__(self):
        super().__init__()
        self.inp, self.fc1, self.fc2, self.head = nn.Linear(6, 8), nn.Linear(8, 16), nn.Linear(16, 8), nn.Linear(8, 3)

    def forward(self, x):
        h = self.inp(x)
        h = h + self.fc2(torch.relu(self.fc1(h)))
        return self.head(h)


class Cnn(nn.Module):
    def __init__(self, groups: int = 1):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = nn.Conv2d(8, 6, 3, padding=1, stride=2, groups=groups)
        self.fc = nn.Linear(6, 4)

    def forward(self, x):
        y = torch.relu(self.c2(torch.relu(self.c1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(y, 1), 1))


class Cat(nn.Module):
    """Two groups read by one layer at offsets 0 and 6 of its input (a Concat)."""

    def __init__(self):
        super().__init__()
        self.w1, self.w2, self.w3, self.w4 = nn.Linear(6, 12), nn.Linear(12, 6), nn.Linear(6, 5), nn.Linear(11, 3)

    def forward(self, x):
        return self.w4(torch.cat([self.w2(torch.relu(self.w1(x))), torch.tanh(self.w3(x))], dim=-1))


# the consumers of each model's groups: torch layer -> its ONNX weight name
READERS = {
    Mlp: {"fc2": "fc2.weight", "fc3": "fc3.weight"},
    Residual: {"fc1": "fc1.weight", "fc2": "fc2.weight", "head": "head.weight"},
    Cnn: {"c2": "c2.weight", "fc": "fc.weight"},
    Cat: {"w2": "w2.weight", "w4": "w4.weight"},
}


def built(cls, seed=0):
    torch.manual_seed(seed)
    net = cls().eval()
    if cls is Residual:  # both consumers of the trunk weigh in: its kept channels are neither's alone
        with torch.no_grad():
            net.head.weight.mul_(3.0)
    x = torch.randn(48, 3, 8, 8) if cls is Cnn else torch.randn(48, 6)
    return net, x


def export(net, x, path=None) -> onnx.ModelProto:
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            net, (x,), f, input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "n"}}, dynamo=False
        )
    model = onnx.load_from_string(f.getvalue())
    if path is not None:
        onnx.save(model, str(path))
    return model


def torch_hessians(net, x) -> dict[str, np.ndarray]:
    """Per consumer layer name, X^T X (float64) of its inputs: rows of a Linear, patches of a Conv2d."""
    rows: dict[str, np.ndarray] = {}

    def hook(name, module):
        def grab(_, args):
            a = args[0].detach().double()
            if isinstance(module, nn.Conv2d):
                cols = F.unfold(a, module.kernel_size, padding=module.padding, stride=module.stride)
                a = cols.transpose(1, 2).reshape(-1, cols.shape[1])
            rows[name] = a.reshape(-1, a.shape[-1]).numpy()

        return grab

    handles = [m.register_forward_pre_hook(hook(n, m)) for n, m in net.named_modules() if n in READERS[type(net)]]
    with torch.no_grad():
        net(x)
    for h in handles:
        h.remove()
    return {n: r.T @ r for n, r in rows.items()}


def matrix(net, name) -> np.ndarray:
    w = net.get_submodule(name).weight.detach().double().numpy()
    return w.reshape(w.shape[0], -1)


def damped(h):
    return h + DAMP * np.mean(np.diag(h)) * np.eye(len(h))


def obs(w, h, per):
    inv = np.linalg.inv(damped(h))
    out = []
    for u in range(w.shape[1] // per):
        s = slice(u * per, (u + 1) * per)
        out.append(np.trace(w[:, s] @ np.linalg.inv(inv[s, s]) @ w[:, s].T))
    return np.array(out)


def activation(w, h, per):
    col = (w**2).sum(0) * np.diag(h)
    return np.sqrt(col.reshape(-1, per).sum(1))


def refit(w, h, kept_columns):
    hd = damped(h)
    new = np.zeros_like(w)
    k = np.asarray(kept_columns)
    new[:, k] = w @ hd[:, k] @ np.linalg.inv(hd[np.ix_(k, k)])
    return new


def drop_lowest(scores, amount):
    k = round(amount * len(scores))
    order = np.argsort(scores, kind="stable")
    return np.sort(order[k:])


# each group: its channels, and the torch layers reading it (columns per channel, first channel there)
GROUPS = {
    Mlp: [(12, [("fc2", 1, 0)]), (10, [("fc3", 1, 0)])],
    Residual: [(8, [("fc1", 1, 0), ("head", 1, 0)]), (16, [("fc2", 1, 0)])],
    Cnn: [(8, [("c2", 9, 0)]), (6, [("fc", 1, 0)])],
    Cat: [(12, [("w2", 1, 0)]), (6, [("w4", 1, 0)]), (5, [("w4", 1, 6)])],
}


def reference_kept(net, x, method, amount):
    hs = torch_hessians(net, x)
    score = obs if method == "obs_structured" else activation
    kept = []
    for channels, readers in GROUPS[type(net)]:
        parts = [score(matrix(net, n), hs[n], per)[at : at + channels] for n, per, at in readers]
        total = sum(parts) if method == "obs_structured" else np.sqrt(sum(p**2 for p in parts))
        kept.append(drop_lowest(total, amount))
    return kept, hs


def reference_output(net, x, kept, hs, compensate):
    """The dense torch model, each consumer's dropped columns zero (and its kept ones refit)."""
    ref = type(net)().eval()
    ref.load_state_dict(net.state_dict())
    removed: dict[str, set[int]] = {}
    per = {name: p for _, readers in GROUPS[type(net)] for name, p, _ in readers}
    for (channels, readers), keep in zip(GROUPS[type(net)], kept, strict=True):
        for name, _, at in readers:
            removed.setdefault(name, set()).update(at + c for c in set(range(channels)) - set(keep.tolist()))
    for name, gone in removed.items():
        w = matrix(net, name)
        dropped = np.isin(np.arange(w.shape[1]) // per[name], sorted(gone))
        new = refit(w, hs[name], np.flatnonzero(~dropped)) if compensate else np.where(dropped, 0, w)
        layer = ref.get_submodule(name)
        layer.weight.data = torch.from_numpy(new.reshape(layer.weight.shape)).float()
    with torch.no_grad():
        return ref(x).numpy()


def ort_run(model, x):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def onnx_hessians(model, path, x):
    onnx.save(model, str(path))
    found = onnx_groups(model)
    readers, _ = consumers(model, found)
    return onnx_input_hessians(formats.load(str(path)), list(readers), {"x": x.numpy()}, batch_size=20)


@pytest.mark.slow
@pytest.mark.parametrize("cls", [Mlp, Residual, Cnn, Cat])
def test_hessians_equal_the_torch_activations(cls, tmp_path):
    net, x = built(cls)
    model = export(net, x)
    got = onnx_hessians(model, tmp_path / "m.onnx", x)
    want = torch_hessians(net, x)
    assert set(got) == set(READERS[cls].values())
    for layer, name in READERS[cls].items():
        assert got[name].dtype == np.float64
        np.testing.assert_allclose(got[name], want[layer], rtol=1e-5, atol=1e-5 * np.abs(want[layer]).max())


@pytest.mark.slow
@pytest.mark.parametrize("method", ["obs_structured", "activation_structured"])
@pytest.mark.parametrize("cls", [Mlp, Residual, Cnn, Cat])
def test_kept_channels_and_refit_equal_the_numpy_reference(cls, method, tmp_path):
    net, x = built(cls)
    model = export(net, x)
    hessians = onnx_hessians(model, tmp_path / "m.onnx", x)
    kept, hs = reference_kept(net, x, method, 0.5)
    before = model.SerializeToString()
    for compensate in (True, False):
        small, report = shrink_onnx(model, 0.5, method, hessians=hessians, compensate=compensate)
        assert model.SerializeToString() == before
        onnx.checker.check_model(small, full_check=True)
        assert [report.kept[g.group.name] for g in report.groups.groups] == [k.tolist() for k in kept]
        assert report.params_after < report.params_before
        assert bool(report.refit) == compensate
        want = reference_output(net, x, kept, hs, compensate)
        out = ort_run(small, x.numpy())
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
        # the dense model zeroed (and refit) by zeroed_onnx computes the same
        np.testing.assert_allclose(ort_run(zeroed_onnx(model, report), x.numpy()), out, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("cls", [Mlp, Cnn])
def test_the_refit_lowers_the_output_error(cls, tmp_path):
    net, x = built(cls)
    model = export(net, x)
    hessians = onnx_hessians(model, tmp_path / "m.onnx", x)
    dense = ort_run(model, x.numpy())
    errors = {}
    for compensate in (True, False):
        small, _ = shrink_onnx(model, 0.5, "obs_structured", hessians=hessians, compensate=compensate)
        errors[compensate] = float(np.linalg.norm(ort_run(small, x.numpy()) - dense))
    assert errors[True] < 0.8 * errors[False], errors


def test_refusals_before_anything_changes():
    net, x = built(Mlp)
    model = export(net, x)
    before = model.SerializeToString()
    with pytest.raises(TypeError, match="scores channels on calibration data: give hessians"):
        shrink_onnx(model, 0.5, "obs_structured")
    with pytest.raises(TypeError, match="hessians are taken by a calibrated"):
        shrink_onnx(model, 0.5, "ln_structured", hessians={})
    with pytest.raises(ValueError, match="hessians has no entry for 'fc2.weight'"):
        shrink_onnx(model, 0.5, "obs_structured", hessians={})
    with pytest.raises(ValueError, match=r"hessians\['fc2.weight'\] has shape \(3, 3\)"):
        shrink_onnx(model, 0.5, "obs_structured", hessians={"fc2.weight": np.eye(3), "fc3.weight": np.eye(10)})
    with pytest.raises(ValueError, match="global ranking is not supported"):
        shrink_onnx(model, 0.5, "obs_structured", hessians={}, global_=True)
    assert model.SerializeToString() == before


def test_a_grouped_convolution_consumer_is_refused_naming_the_group():
    torch.manual_seed(0)
    net = Cnn(groups=2).eval()
    model = export(net, torch.randn(2, 3, 8, 8))
    found = onnx_groups(model)
    names = [g.group.name for g in found.groups]
    with pytest.raises(ValueError, match=rf"^group '{names[0]}': grouped Conv .* reads its channels"):
        consumers(model, found)
    with pytest.raises(ValueError, match=rf"^group '{names[0]}': grouped Conv"):
        shrink_onnx(model, 0.5, "obs_structured", hessians={})


def test_a_group_that_loses_no_channel_is_not_scored():
    """An amount that leaves a group whole asks nothing of its readers: the grouped
    convolution that would be refused for a group losing channels is not looked at."""
    torch.manual_seed(0)
    net = Cnn(groups=2).eval()
    model = export(net, torch.randn(2, 3, 8, 8))
    found = onnx_groups(model)
    readers, reads = consumers(model, found, 0)
    assert readers == {} and reads == [[] for _ in found.groups]
    small, report = shrink_onnx(model, 0, "obs_structured", hessians={})
    assert report.params_after == report.params_before and report.refit == {}


class Shared(nn.Module):
    """One Linear applied to two branches: its weight is read by two Gemm nodes."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.out = nn.Linear(6, 8), nn.Linear(6, 8), nn.Linear(8, 3)

    def forward(self, x):
        return self.out(torch.relu(self.a(x))) * self.out(torch.tanh(self.b(x)))


def test_a_shared_consumer_weight_is_refused_naming_the_group():
    torch.manual_seed(0)
    model = export(Shared().eval(), torch.randn(4, 6))
    found = onnx_groups(model)
    assert len(found.groups) == 2  # both read a private copy of out.weight
    with pytest.raises(ValueError, match=r"^group '/a/Gemm': Gemm '/out/Gemm' reads its channels through 'out.weight'"):
        consumers(model, found)


@pytest.mark.slow
def test_command_line_end_to_end(tmp_path):
    net, x = built(Residual)
    src, cal, out = tmp_path / "m.onnx", tmp_path / "cal.npz", tmp_path / "out.onnx"
    model = export(net, x, src)
    np.savez(cal, x=x.numpy())
    proc = cli("prune", src, "-o", out, "--shrink", "--method", "obs_structured", "--amount", "0.5",
               "--calibration", cal, "--verify")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "verify: output 'y'" in proc.stdout and ": pass" in proc.stdout
    small = onnx.load(str(out))
    count = lambda m: sum(int(np.prod(t.dims)) for t in m.graph.initializer)  # noqa: E731
    assert count(small) < count(model)
    # the same as the Python entry point, and as prune_file
    hessians = onnx_hessians(model, tmp_path / "again.onnx", x)
    want, _ = shrink_onnx(model, 0.5, "obs_structured", hessians=hessians)
    np.testing.assert_allclose(ort_run(small, x.numpy()), ort_run(want, x.numpy()), rtol=1e-5, atol=1e-6)
    out2 = tmp_path / "out2.onnx"
    prune_file(str(src), str(out2), method="obs_structured", amount=0.5, shrink=True, calibration=str(cal),
               compensate=False)  # fmt: skip
    nocomp, _ = shrink_onnx(model, 0.5, "obs_structured", hessians=hessians, compensate=False)
    np.testing.assert_allclose(ort_run(onnx.load(str(out2)), x.numpy()), ort_run(nocomp, x.numpy()), atol=1e-6)


@pytest.mark.slow
def test_command_line_dry_run_and_refusals_write_nothing(tmp_path):
    net, x = built(Mlp)
    src, cal, out = tmp_path / "m.onnx", tmp_path / "cal.npz", tmp_path / "out.onnx"
    export(net, x, src)
    np.savez(cal, x=x.numpy())
    args = ["prune", src, "--shrink", "--method", "activation_structured", "--amount", "0.5"]
    proc = cli(*args, "--dry-run", "--calibration", cal)
    assert proc.returncode == 0, proc.stderr
    assert "scored on calibration data" in proc.stderr and "12 -> 6 channels" in proc.stdout
    assert_error(cli(*args, "-o", out), "--method activation_structured scores units on calibration data")
    assert_error(cli(*args, "-o", out, "--calibration", cal, "--global"), "--global is not supported")
    bad = tmp_path / "bad.npz"
    np.savez(bad, z=x.numpy())  # no input named z: the output is refused before the calibration runs
    out.write_bytes(b"keep")
    assert_error(cli(*args, "-o", out, "--calibration", bad), "exists; use --force")
    assert_error(cli(*args, "-o", tmp_path / "out.npz", "--calibration", bad), "OUT must be .onnx")
    out.unlink()
    assert_error(cli(*args[:-1], "13", "-o", out, "--calibration", bad), "--amount 13 would remove every channel")
    out.write_bytes(b"keep")
    assert out.read_bytes() == b"keep"
    out.unlink()
    bad.unlink()
    torch.manual_seed(0)
    export(Cnn(groups=2).eval(), torch.randn(2, 3, 8, 8), src)
    np.savez(cal, x=np.random.default_rng(0).standard_normal((4, 3, 8, 8)).astype(np.float32))
    assert_error(cli(*args, "-o", out, "--calibration", cal), "grouped Conv", "reads its channels")
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cal.npz", "m.onnx"]


@pytest.mark.slow
def test_heads_of_bert_scored_on_the_output_projection(tmp_path):
    pytest.importorskip("transformers")
    from test_onnx_shrink_heads import HEADS, SIZE, build
    from test_onnx_shrink_residual import export as export_bert

    module, _, blocks = build("bert")
    torch.manual_seed(1)
    x = torch.randint(0, 60, (6, 7))
    model = export_bert(module, x)
    path = tmp_path / "bert.onnx"
    onnx.save(model, str(path))
    found = onnx_groups(model, "heads")
    readers, _ = consumers(model, found)
    hessians = onnx_input_hessians(formats.load(str(path)), list(readers), {"x": x.numpy()})
    rows: list[np.ndarray] = []
    handles = [
        b[3].register_forward_pre_hook(lambda _, args: rows.append(args[0].detach().double().reshape(-1, 32).numpy()))
        for b in blocks
    ]  # fmt: skip
    with torch.no_grad():
        module(x)
    for h in handles:
        h.remove()
    want_h = [r.T @ r for r in rows]
    for got, want in zip(hessians.values(), want_h, strict=True):  # in graph order: one per attention block
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    small, report = shrink_onnx(model, 0.5, "obs_structured", kind="heads", hessians=hessians)
    saved = [b[3].weight.detach().clone() for b in blocks]
    for b, h, g in zip(blocks, want_h, report.groups.groups, strict=True):
        w = b[3].weight.detach().double().numpy()
        keep = drop_lowest(obs(w, h, SIZE), 0.5)
        assert report.kept[g.group.name] == keep.tolist() and len(keep) == HEADS // 2
        cols = (keep[:, None] * SIZE + np.arange(SIZE)).reshape(-1)
        with torch.no_grad():
            b[3].weight.copy_(torch.from_numpy(refit(w, h, cols)))
    with torch.no_grad():
        want = module(x).numpy()
        for b, w in zip(blocks, saved, strict=True):
            b[3].weight.copy_(w)
    assert report.params_after < report.params_before
    np.testing.assert_allclose(ort_run_as(small, x.numpy()), want, rtol=1e-4, atol=1e-4)


def ort_run_as(model, x):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x})[0]


class Gn(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.gn, self.c2 = nn.Conv2d(3, 8, 3, padding=1), nn.GroupNorm(4, 8), nn.Conv2d(8, 5, 3, padding=1)

    def forward(self, x):
        return self.c2(torch.relu(self.gn(self.c1(x))))


@pytest.mark.slow
def test_groupnorm_groups_are_scored_whole(tmp_path):
    """A GroupNorm group (2 channels, 18 columns of the next convolution) is one unit of the OBS score."""
    torch.manual_seed(0)
    net, x = Gn().eval(), torch.randn(10, 3, 6, 6)
    model = export(net, x)
    (og,) = onnx_groups(model).groups
    assert (og.per, og.group.channels) == (2, 4)
    hessians = onnx_hessians(model, tmp_path / "gn.onnx", x)
    small, report = shrink_onnx(model, 0.5, "obs_structured", hessians=hessians)
    rows = []
    handle = net.c2.register_forward_pre_hook(lambda _, a: rows.append(F.unfold(a[0].detach().double(), 3, padding=1)))
    with torch.no_grad():
        net(x)
    handle.remove()
    cols = rows[0].transpose(1, 2).reshape(-1, 72).numpy()
    h, w = cols.T @ cols, matrix(net, "c2")
    keep = drop_lowest(obs(w, h, 18), 0.5)
    assert report.kept[og.group.name] == keep.tolist()
    kept_columns = (keep[:, None] * 18 + np.arange(18)).reshape(-1)
    with torch.no_grad():
        net.c2.weight.copy_(torch.from_numpy(refit(w, h, kept_columns).reshape(net.c2.weight.shape)))
        want = net(x).numpy()
    np.testing.assert_allclose(ort_run(small, x.numpy()), want, rtol=1e-4, atol=1e-4)
