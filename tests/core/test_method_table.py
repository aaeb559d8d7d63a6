"""The method table and the public extension contract.

Every method of ``arrayprune.METHODS`` has a functional verb, a mapping verb and a
``--method`` choice made from its class; a method written by a user on the public base
classes works in containers, global pruning, schedules and the mapping adapter.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import arrayprune as ap
from arrayprune import reconstruction
from arrayprune.adapters import mapping as mp
from arrayprune.adapters.cli.options import METHODS as CLI_METHODS
from arrayprune.method_parts import masks_alone, prunes_units, solver_of
from arrayprune.registry import constructor_parameters, method_name
from cli_helpers import run
from conftest import to_numpy

RNG = np.random.default_rng(7)
#: The methods that only mask: each has a functional and a mapping verb.
MASK_METHODS = [name for name, cls in ap.METHODS.items() if masks_alone(cls)]


def _example_arguments(name):
    return {
        "identity": {},
        "random_unstructured": {"amount": 0.5, "seed": 3},
        "l1_unstructured": {"amount": 0.5},
        "random_structured": {"amount": 0.5, "dim": 0, "seed": 3},
        "ln_structured": {"amount": 0.5, "n": 1, "dim": 0},
        "custom_from_mask": {"mask": (np.arange(48).reshape(6, 8) % 3 != 0)},
        "nm_structured": {"n": 2, "m": 4},
        "block_unstructured": {"amount": 0.5, "block_shape": (2, 2)},
        "wanda": {"amount": 0.5, "dim": 0},
        "sparsegpt": {"amount": 0.5},
        "activation_structured": {"amount": 0.5, "dim": 0},
        "obs_structured": {"amount": 2, "dim": -1},
    }[name]


def test_table_is_read_only_and_names_its_classes():
    assert list(ap.METHODS) == [
        "identity",
        "random_unstructured",
        "l1_unstructured",
        "random_structured",
        "ln_structured",
        "custom_from_mask",
        "nm_structured",
        "block_unstructured",
        "wanda",
        "sparsegpt",
        "activation_structured",
        "obs_structured",
    ]
    with pytest.raises(TypeError):
        ap.METHODS["mine"] = ap.L1Unstructured  # type: ignore[index]
    for name, cls in ap.METHODS.items():
        assert getattr(ap, cls.__name__) is cls
        assert method_name(cls) == name
    assert method_name(type("Mine", (ap.L1Unstructured,), {})) == "l1_unstructured"
    with pytest.raises(KeyError, match="not in arrayprune.METHODS"):
        method_name(int)


def test_a_method_with_a_solver_has_no_mask_verbs():
    # Its verbs need a Hessian: the solver and the drop-in's model-level reconstruction.
    assert [name for name, cls in ap.METHODS.items() if solver_of(cls) is not None] == ["sparsegpt"]
    assert ap.sparsegpt is ap.SparseGPT.SOLVE is reconstruction.sparsegpt
    assert "sparsegpt" not in mp.__all__ and not hasattr(mp, "sparsegpt")


def test_calibrated_structured_methods_have_no_mask_verbs():
    # They refit the layer reading the units from its Hessian: they run through a model.
    units = [name for name, cls in ap.METHODS.items() if prunes_units(cls)]
    assert units == ["activation_structured", "obs_structured"]
    for name in ("activation_structured", "obs_structured"):
        assert not hasattr(ap, name) and not hasattr(mp, name)
        assert ap.METHODS[name].SCORE.statistic == "hessian" and ap.METHODS[name].SCORE.needs_calibration


@pytest.mark.parametrize("name", MASK_METHODS)
def test_every_method_has_verbs_made_from_its_class(name):
    cls = ap.METHODS[name]
    own = [(p.name, p.kind, p.default) for p in constructor_parameters(cls)]
    for verb, lead in ((getattr(ap, name), ["x"]), (getattr(mp, name), ["params", "key"])):
        params = list(inspect.signature(verb).parameters.values())
        assert [p.name for p in params[: len(lead)]] == lead
        rest = [
            (p.name, p.kind, p.default)
            for p in params[len(lead) :]
            if p.name not in ("default_mask", "importance_scores")
        ]
        assert rest == own
        assert ("importance_scores" in inspect.signature(verb).parameters) == cls.USES_SCORES
        assert cls.__name__ in verb.__doc__
        assert name in ap.__all__ and name in mp.__all__
    # The verbs compute the class's mask.
    x = RNG.standard_normal((6, 8)).astype(np.float32)
    kwargs = _example_arguments(name)
    want = cls(**kwargs).keep_mask(x)
    np.testing.assert_array_equal(getattr(ap, name)(x, **kwargs), want)
    folded = mp.apply_masks(getattr(mp, name)({"w": x}, "w", **kwargs))["w"]
    np.testing.assert_array_equal(folded, x * want)


def test_verbs_check_their_arguments_like_functions():
    with pytest.raises(TypeError, match="amount"):
        ap.l1_unstructured(np.ones(4))
    with pytest.raises(TypeError, match="unexpected"):
        ap.l1_unstructured(np.ones(4), 0.5, dim=0)
    with pytest.raises(TypeError):
        ap.random_unstructured(np.ones(4), 0.5, importance_scores=np.ones(4))


def test_command_line_choices_are_the_runnable_table_methods():
    assert CLI_METHODS == (
        "random_unstructured",
        "l1_unstructured",
        "random_structured",
        "ln_structured",
        "nm_structured",
        "block_unstructured",
        "wanda",
        "sparsegpt",
        "activation_structured",
        "obs_structured",
    )


def test_command_line_block_power_mean(tmp_path):
    w = RNG.standard_normal((8, 8)).astype(np.float32)
    src, out = tmp_path / "w.npz", tmp_path / "o.npz"
    np.savez(src, w=w)
    proc = run(
        "prune", src, "-o", out, "--method", "block_unstructured", "--amount", "0.5", "--block", "2x2", "--n", "inf"
    )
    assert proc.returncode == 0, proc.stderr
    want = w * ap.block_unstructured(w, 0.5, (2, 2), n=np.inf)
    np.testing.assert_array_equal(np.load(out)["w"], want)
    assert not np.array_equal(want, w * ap.block_unstructured(w, 0.5, (2, 2)))  # the order matters here


@pytest.mark.parametrize("name", list(ap.METHODS))
def test_keep_mask_is_the_mask_on_ones(backend, name):
    x = backend.asarray(RNG.standard_normal((6, 8)).astype(np.float32))
    kwargs = _example_arguments(name)
    if name == "custom_from_mask":
        kwargs = {"mask": backend.asarray(kwargs["mask"])}
    method = ap.METHODS[name](**kwargs)
    keep = method.keep_mask(x)
    assert to_numpy(keep).dtype == np.bool_
    ones = backend.xp.ones(x.shape, dtype=backend.xp.bool)
    np.testing.assert_array_equal(to_numpy(keep), to_numpy(method.compute_mask(x, ones)))
    np.testing.assert_array_equal(to_numpy(keep), to_numpy(method.compute_mask(x, None)))


# --------------------------------------------------------------------------------------
# Block patterns follow schedules; N:M patterns cannot
# --------------------------------------------------------------------------------------


def test_block_pattern_follows_a_schedule():
    x = RNG.standard_normal((8, 12)).astype(np.float32)
    blocks = np.abs(x).reshape(2, 4, 3, 4).mean(axis=(1, 3))  # 2 x 3 grid of 4x4 blocks
    mask = None
    for sparsity, n_blocks in ((0.2, 1), (0.5, 3), (0.5, 3), (1.0, 6)):
        new = ap.prune_to_sparsity(
            x, sparsity, default_mask=mask, pruning_method=ap.BlockUnstructured, block_shape=(4, 4)
        )
        pruned_blocks = ~new.reshape(2, 4, 3, 4).any(axis=(1, 3))
        assert pruned_blocks.sum() == n_blocks
        if mask is not None:
            assert not (new & ~mask).any()  # pruned blocks stay pruned
        mask = new
        # the weakest blocks go first
        order = np.argsort(blocks, axis=None, kind="stable")
        assert set(np.flatnonzero(pruned_blocks)) == set(order[:n_blocks])
    mapped = mp.prune_to_sparsity({"w": x}, "w", 0.5, ap.BlockUnstructured, block_shape=(4, 4))
    assert (~mapped["w_mask"].astype(bool).reshape(2, 4, 3, 4).any(axis=(1, 3))).sum() == 3


def test_units_count_what_each_method_prunes():
    x = np.ones((6, 8), np.float32)
    mask = np.ones((6, 8), bool)
    mask[0] = False  # one row: 8 entries, one channel along 0, no whole 4x4 block
    mask[:4, :4] = False  # one whole 4x4 block
    assert ap.L1Unstructured(0).units(x, mask) == (48, 20)
    assert ap.LnStructured(0, 1, dim=0).units(x, mask) == (6, 1)
    assert ap.BlockUnstructured(0, (4, 4)).units(x, mask) == (4, 1)
    assert ap.BlockUnstructured(0, (4, 4)).units(x) == (4, 0)


@pytest.mark.parametrize("method", [ap.NMStructured, ap.CustomFromMask, ap.Identity])
def test_methods_without_an_amount_refuse_schedules(method):
    with pytest.raises(TypeError, match="amount of units"):
        ap.prune_to_sparsity(np.ones((4, 4)), 0.5, pruning_method=method)


# --------------------------------------------------------------------------------------
# A method written by a user on the public contract
# --------------------------------------------------------------------------------------


class SquaredUnstructured(ap.UnstructuredPruningMethod):
    """Prune the entries of smallest square, offset so that ranks differ from |x|."""

    def entry_scores(self, arrays):
        return [(a - 0.25) ** 2 for a in arrays]


class ChannelMeans(ap.StructuredPruningMethod):
    """Prune the channels of smallest mean (signed: not a norm)."""

    def channel_scores(self, t, dim):
        others = tuple(d for d in range(t.ndim) if d != dim)
        return np.mean(t, axis=others) - np.min(t)  # non-negative, ordered like the mean


def _reference_unstructured(x, k, eligible=None):
    score = (x - 0.25) ** 2
    flat = score.reshape(-1).astype(np.float64)
    candidates = np.arange(flat.size) if eligible is None else np.flatnonzero(eligible.reshape(-1))
    order = candidates[np.argsort(flat[candidates], kind="stable")]
    keep = np.ones(flat.size, bool)
    keep[order[:k]] = False
    return keep.reshape(x.shape)


def test_user_unstructured_method_everywhere():
    x = RNG.standard_normal((5, 6)).astype(np.float32)
    method = SquaredUnstructured(0.4)
    np.testing.assert_array_equal(ap.mask_for(method, x), _reference_unstructured(x, 12))
    # Inside a container it ranks only what is left, 40% of it.
    earlier = ap.l1_unstructured(x, 0.5)
    combined = ap.mask_for(method, x, default_mask=earlier)
    np.testing.assert_array_equal(combined, earlier & _reference_unstructured(x, 6, earlier))
    # Global pruning ranks the arrays together.
    y = RNG.standard_normal((3, 4)).astype(np.float32)
    gx, gy = ap.global_unstructured([x, y], SquaredUnstructured, amount=0.5)
    both = _reference_unstructured(np.concatenate([x.reshape(-1), y.reshape(-1)]), 21)
    np.testing.assert_array_equal(np.concatenate([gx.reshape(-1), gy.reshape(-1)]), both)
    # Schedules and the mapping adapter.
    scheduled = ap.prune_to_sparsity(x, 0.3, pruning_method=SquaredUnstructured)
    np.testing.assert_array_equal(scheduled, _reference_unstructured(x, 9))
    out = mp.prune({"w": x}, "w", method)
    np.testing.assert_array_equal(out["w_mask"], _reference_unstructured(x, 12).astype(np.float32))


def test_user_structured_method_everywhere():
    x = RNG.standard_normal((6, 4)).astype(np.float32)
    means = x.mean(axis=1)
    method = ChannelMeans(2, dim=0)
    mask = ap.mask_for(method, x)
    dropped = np.argsort(means, kind="stable")[:2]
    np.testing.assert_array_equal(np.flatnonzero(~mask.any(axis=1)), np.sort(dropped))
    # A second pass prunes 2 more of the 4 channels left.
    again = ap.mask_for(ChannelMeans(2, dim=0), x, default_mask=mask)
    assert (~again.any(axis=1)).sum() == 4
    assert ap.prune_to_sparsity(x, 0.5, default_mask=mask, pruning_method=ChannelMeans, dim=0).any(axis=1).sum() == 3


def test_readme_names_every_method():
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    for name, cls in ap.METHODS.items():
        assert f"| `{name}`" in readme and f"`{cls.__name__}`" in readme, name


def test_readme_usage_lists_the_command_line_methods():
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    assert "[--method {" + ",".join(CLI_METHODS) + "}]" in readme
