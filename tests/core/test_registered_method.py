"""A method with a new parameter, registered while the program runs, is offered everywhere.

``PowerMagnitude`` ranks ``|x| ** power`` (a negative power prunes the largest entries
first, so a path that ignored the score would show). Its ``power`` declares the flag
``--power``; the command line, the mapping adapter, the PyTorch drop-in (a plain
subclass of ``CoreMethod``), schedules and the global pruning of a sharded checkpoint
(streamed: the path that loads a tensor whole is made to fail) take it.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from test_sharded import llama_tensors, load_folder, write_checkpoint  # noqa: E402

import arrayprune as ap  # noqa: E402
import arrayprune.adapters.torch as prune  # noqa: E402
from arrayprune import method_parts as parts  # noqa: E402
from arrayprune.adapters import mapping as mp  # noqa: E402
from arrayprune.adapters.cli import main  # noqa: E402
from arrayprune.adapters.cli.options import build_parser  # noqa: E402
from arrayprune.adapters.pipeline import prune_file, stream_pruning  # noqa: E402
from arrayprune.adapters.plan import make_plan  # noqa: E402
from arrayprune.adapters.roles.names import tree_roles  # noqa: E402
from arrayprune.adapters.torch._base import CoreMethod, core_parameter, make_core  # noqa: E402
from arrayprune.registry import register_method, unregister_method  # noqa: E402

RNG = np.random.default_rng(11)


class PowerMagnitude(ap.UnstructuredPruningMethod):
    """Prune the entries of smallest ``|x| ** power``.

    Parameters
    ----------
    amount : int or float
        Fraction in ``[0, 1]`` of the entries to prune, or their number.
    power : float, default 1
        The power of the magnitude ranked; a negative power prunes the largest first.
    """

    SCORE = parts.Score("power of magnitude", elementwise=True)
    FLAGS = {"power": parts.Flag("--power", float, "the power of |x| ranked")}

    def __init__(self, amount, power=1.0):
        super().__init__(amount)
        self.power = power

    def entry_scores(self, arrays):
        return [abs(a) ** self.power for a in arrays]


class PowerMagnitudeHook(CoreMethod):
    """The drop-in class of PowerMagnitude: a plain subclass, as those of the table."""

    PRUNING_TYPE = "unstructured"
    _CORE = PowerMagnitude
    _PARAMS = ("amount", "power")
    amount = core_parameter("amount")
    power = core_parameter("power")

    def __init__(self, amount, power=1.0):
        self._core = make_core(type(self), (), {"amount": amount, "power": power})


@pytest.fixture
def registered():
    register_method("power_magnitude", PowerMagnitude)
    try:
        yield
    finally:
        unregister_method("power_magnitude")


def largest_pruned(values, k):
    """Keep masks dropping the k entries of largest magnitude over all `values` together."""
    flat = np.concatenate([np.abs(v).reshape(-1) for v in values])
    keep = np.ones(flat.size, bool)
    keep[np.argsort(-flat, kind="stable")[:k]] = False
    out, start = [], 0
    for v in values:
        out.append(keep[start : start + v.size].reshape(v.shape))
        start += v.size
    return out


def test_its_flag_is_on_the_command_line(registered, capsys):
    argv = ["prune", "in.npz", "-o", "out.npz", "--method", "power_magnitude", "--power", "-1"]
    args = build_parser().parse_args(argv)
    assert args.method == "power_magnitude" and args.method_options == {"power": -1.0}
    with pytest.raises(SystemExit):
        build_parser().parse_args(["prune", "--help"])
    assert "--power POWER power_magnitude: the power of |x| ranked" in " ".join(capsys.readouterr().out.split())
    with pytest.raises(Exception, match="invalid value 'x'"):
        build_parser().parse_args(["prune", "in.npz", "--method", "power_magnitude", "--power", "x"])


def test_the_command_prunes_a_file_with_it(registered, tmp_path):
    w = RNG.standard_normal((8, 16)).astype(np.float32)
    np.savez(tmp_path / "w.npz", fc=w)
    argv = ["prune", str(tmp_path / "w.npz"), "-o", str(tmp_path / "o.npz"), "--method", "power_magnitude"]
    assert main([*argv, "--amount", "0.25", "--power", "-1"]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "o.npz")["fc"], w * largest_pruned([w], 32)[0])
    assert main([*argv, "--amount", "0.25", "--n", "3"]) == 2  # another method's flag: refused
    assert main(["prune", str(tmp_path / "w.npz"), "-o", str(tmp_path / "p.npz"), "--power", "2"]) == 2
    prune_file(tmp_path / "w.npz", tmp_path / "api.npz", method="power_magnitude", amount=0.25, power=-1)
    np.testing.assert_array_equal(np.load(tmp_path / "api.npz")["fc"], np.load(tmp_path / "o.npz")["fc"])


def test_both_adapters_and_schedules_take_it(registered):
    w = RNG.standard_normal((6, 10)).astype(np.float32)
    want = largest_pruned([w], 15)[0]
    np.testing.assert_array_equal(ap.mask_for(PowerMagnitude(15, power=-1), w), want)
    np.testing.assert_array_equal(mp.prune({"w": w}, "w", PowerMagnitude(15, power=-1))["w_mask"], want)
    np.testing.assert_array_equal(ap.prune_to_sparsity(w, 0.25, pruning_method=PowerMagnitude, power=-1), want)
    scheduled = mp.prune_to_sparsity({"w": w}, "w", 0.25, PowerMagnitude, power=-1)
    np.testing.assert_array_equal(scheduled["w_mask"], want)
    layer = torch.nn.Linear(10, 6)
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(w))
    hook = PowerMagnitudeHook.apply(layer, "weight", 15, power=-1)
    assert isinstance(hook, prune.BasePruningMethod) and hook.power == -1
    assert torch.equal(layer.weight_mask != 0, torch.from_numpy(want))
    prune.prune_to_sparsity(layer, "weight", 0.5, PowerMagnitudeHook, power=-1)  # 15 more, of the largest left
    assert torch.equal(layer.weight_mask != 0, torch.from_numpy(largest_pruned([w], 30)[0]))


def test_global_pruning_of_a_sharded_checkpoint_streams_it(registered, tmp_path, monkeypatch):
    tensors = llama_tensors(layers=2, dtype="float32", seed=4)
    src = write_checkpoint(tmp_path / "in", tensors, 3)

    def whole(*args, **kwargs):
        raise AssertionError("a tensor was loaded whole")

    monkeypatch.setattr(stream_pruning, "_prune_in_core", whole)
    argv = ["prune", str(src), "-o", str(tmp_path / "out"), "--method", "power_magnitude", "--power", "-1"]
    assert main([*argv, "--amount", "0.5", "--global"]) == 0
    out, _ = load_folder(tmp_path / "out")
    params = {n: t.numpy() for n, t in tensors.items()}
    targets = [e for e in make_plan(params, tree_roles(params), method="power_magnitude") if e.prune]
    assert len(targets) == 14
    total = sum(e.value.size for e in targets)
    masks = largest_pruned([e.value for e in targets], round(0.5 * total))
    for e, keep in zip(targets, masks, strict=True):
        np.testing.assert_array_equal(out[e.name].numpy(), e.value * keep)
    # Tensor by tensor, it streams too.
    assert main([*argv[:3], str(tmp_path / "each"), *argv[4:], "--amount", "0.5"]) == 0
    each, _ = load_folder(tmp_path / "each")
    name = targets[0].name
    want = params[name] * largest_pruned([params[name]], params[name].size // 2)[0]
    np.testing.assert_array_equal(each[name].numpy(), want)


def test_a_single_safetensors_file_is_streamed_too(registered, tmp_path, monkeypatch):
    from safetensors.numpy import save_file

    from arrayprune.adapters.pipeline import runner as pipeline
    from arrayprune.adapters.pipeline import storage

    a, b = (RNG.standard_normal(s).astype(np.float32) for s in ((16, 8), (8, 16)))
    save_file({"a.weight": a, "b.weight": b}, str(tmp_path / "m.safetensors"))

    def whole(*args, **kwargs):
        raise AssertionError("the file was loaded whole")

    monkeypatch.setattr(pipeline, "WholeFile", whole)

    monkeypatch.setattr(storage, "WholeFile", whole)
    monkeypatch.setattr(stream_pruning, "_prune_in_core", whole)
    argv = ["prune", str(tmp_path / "m.safetensors"), "-o", str(tmp_path / "o.safetensors")]
    assert main([*argv, "--method", "power_magnitude", "--power", "-1", "--amount", "0.5", "--global"]) == 0
    from safetensors.numpy import load_file

    out = load_file(str(tmp_path / "o.safetensors"))
    keep_a, keep_b = largest_pruned([a, b], 128)
    np.testing.assert_array_equal(out["a.weight"], a * keep_a)
    np.testing.assert_array_equal(out["b.weight"], b * keep_b)
