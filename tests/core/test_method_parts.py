"""A method declares its score, its pattern and its parameters' flags; code asks them."""

from __future__ import annotations

import numpy as np
import pytest

import arrayprune as ap
from arrayprune import method_parts as parts
from arrayprune.adapters.pipeline.request import PruneError, PruneSpec, scored_methods
from arrayprune.adapters.pipeline.stream_pruning import streams
from arrayprune.adapters.plan import make_plan
from arrayprune.adapters.roles.names import tree_roles
from arrayprune.registry import register_method, unregister_method


def test_every_table_method_declares_its_parts():
    declared = {name: (cls.SCORE.name, cls.PATTERN.name) for name, cls in ap.METHODS.items()}
    assert declared == {
        "identity": ("nothing", "unstructured"),
        "random_unstructured": ("random", "unstructured"),
        "l1_unstructured": ("magnitude", "unstructured"),
        "random_structured": ("random", "channels"),
        "ln_structured": ("channel norm", "channels"),
        "custom_from_mask": ("given mask", "given"),
        "nm_structured": ("magnitude", "n of m"),
        "block_unstructured": ("block norm", "blocks"),
        "wanda": ("wanda", "per output"),
        "sparsegpt": ("hessian", "unstructured"),
        "activation_structured": ("unit scores", "channels"),
        "obs_structured": ("unit scores", "channels"),
    }
    for cls in ap.METHODS.values():  # PyTorch's containers read PRUNING_TYPE: the pattern's
        assert cls.PRUNING_TYPE == cls.PATTERN.pruning_type
        assert cls.USES_SCORES == cls.SCORE.uses_values


def test_dim_axis_comes_from_the_pattern():
    assert [cls.PATTERN.dim_axis for cls in (ap.LnStructured, ap.Wanda, ap.NMStructured, ap.L1Unstructured)] == [
        "output",
        "output",
        "reduction",
        None,
    ]
    params = {"fc.weight": np.ones((4, 8), np.float32)}  # [out, in]: output axis 0, reduction axis 1
    roles = tree_roles(params)
    dims = {m: make_plan(params, roles, method=m)[0].dim for m in ("ln_structured", "wanda", "nm_structured")}
    assert dims == {"ln_structured": 0, "wanda": 0, "nm_structured": 1}


def test_questions_are_asked_of_the_parts():
    assert [n for n, cls in ap.METHODS.items() if streams(cls)] == ["l1_unstructured"]
    assert scored_methods() == ["wanda", "l1_unstructured", "nm_structured"]
    with pytest.raises(PruneError, match="--lamp ranks magnitudes: use it with --method l1_unstructured"):
        PruneSpec("random_unstructured", amount=0.5, global_=True, lamp=True).checked()


def test_a_subclass_with_its_own_scores_does_not_inherit_the_magnitude_score():
    class Offset(ap.L1Unstructured):
        def entry_scores(self, arrays):
            return [a - 1 for a in arrays]

    assert ap.L1Unstructured.SCORE.magnitude and not Offset.SCORE.magnitude and not streams(Offset)
    with pytest.raises(ValueError, match="lamp"):
        ap.global_unstructured([np.ones(4)], Offset, amount=1, normalization="lamp")


class _Powered(ap.UnstructuredPruningMethod):
    """Entries of smallest ``|x| ** power``.

    Parameters
    ----------
    amount : int or float
        Fraction of the entries, or their number.
    power : float
        The power.
    """

    SCORE = parts.Score("power", elementwise=True)

    def __init__(self, amount, power=1.0):
        super().__init__(amount)
        self.power = power

    def entry_scores(self, arrays):
        return [abs(a) ** self.power for a in arrays]


def test_a_parameter_without_a_flag_is_refused_at_registration():
    with pytest.raises(TypeError, match="parameter 'power' declares no command-line flag"):
        register_method("powered", _Powered)
    assert "powered" not in ap.METHODS

    class Undeclared(ap.AmountPruningMethod):
        def units(self, t, mask=None):
            return 0, 0

        def compute_mask(self, t, default_mask):
            return default_mask

    with pytest.raises(TypeError, match="declare its SCORE and PATTERN"):
        register_method("undeclared", Undeclared)
    with pytest.raises(ValueError, match="already in arrayprune.METHODS"):
        register_method("l1_unstructured", ap.L1Unstructured)
    with pytest.raises(KeyError):
        unregister_method("l1_unstructured")


def test_flags_of_the_table():
    flags = {name: {p: f.flag for p, f in parts.flags_of(cls).items()} for name, cls in ap.METHODS.items()}
    assert flags["nm_structured"] == {"n": "--nm", "m": "--nm", "dim": "--dim"}
    assert flags["random_unstructured"] == {"amount": "--amount", "seed": "--seed", "generator": None}
    assert flags["custom_from_mask"] == {"mask": None}
