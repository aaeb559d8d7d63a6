"""The example of CONTRIBUTING.md, "Adding a pruning method": its class and its tests.

The class below is the one the guide shows (a test checks that the guide holds this very
source); the tests are those the guide asks of a new method.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest

import arrayprune as ap
from arrayprune._namespace import namespace
from arrayprune.adapters import mapping as mp
from arrayprune.adapters.cli import main
from arrayprune.method_parts import Score
from arrayprune.registry import register_method, unregister_method
from conftest import to_numpy


class RowRelative(ap.UnstructuredPruningMethod):
    """Prune the entries of smallest magnitude relative to the largest of their row.

    An entry's score is ``|x| / max |row|`` along the last axis, so that every row
    loses the entries that are small *for that row*; a row of zeros scores NaN (kept
    last).

    Parameters
    ----------
    amount : int or float
        Fraction in ``[0, 1]`` of the entries to prune, or their number.
    """

    SCORE = Score("row-relative magnitude", elementwise=False)  # depends on the whole row

    def entry_scores(self, arrays):
        out = []
        for a in arrays:
            xp = namespace(a)
            magnitude = xp.abs(a)
            out.append(magnitude / xp.max(magnitude, axis=-1, keepdims=True))
        return out


X = np.array([[1.0, -2.0, 4.0, 0.5], [10.0, 30.0, -40.0, 20.0]], dtype=np.float32)
# |x| / max|row|: [[0.25, 0.5, 1, 0.125], [0.25, 0.75, 1, 0.5]]; ties by position.
THREE = np.array([[False, True, True, False], [False, True, True, True]])


def test_the_guide_shows_this_class():
    guide = (Path(__file__).parents[2] / "CONTRIBUTING.md").read_text()
    assert inspect.getsource(RowRelative) in guide


def test_hand_computed_mask_with_ties():
    np.testing.assert_array_equal(RowRelative(3).keep_mask(X), THREE)
    np.testing.assert_array_equal(ap.mask_for(RowRelative(0.375), X), THREE)  # round(0.375 * 8) = 3


def test_every_backend(backend):
    x = backend.asarray(X)
    np.testing.assert_array_equal(to_numpy(ap.mask_for(RowRelative(3), x)), THREE)


def test_iterative_pruning_and_a_schedule():
    first = ap.mask_for(RowRelative(3), X)
    # A second pass ranks only what remains: 0.5 of the 5 left, 2 more (0.5 of row 0, 0.5 of row 1: by position).
    second = ap.mask_for(RowRelative(0.5), X, default_mask=first)
    np.testing.assert_array_equal(second, [[False, False, True, False], [False, True, True, False]])
    scheduled = ap.prune_to_sparsity(X, 0.625, default_mask=first, pruning_method=RowRelative)
    np.testing.assert_array_equal(scheduled, second)


def test_registered_it_is_a_method_of_the_command_line_and_the_adapters(tmp_path):
    register_method("row_relative", RowRelative)
    try:
        assert "row_relative" in ap.METHODS
        np.savez(tmp_path / "w.npz", w=X)
        argv = ["prune", str(tmp_path / "w.npz"), "-o", str(tmp_path / "o.npz"), "--method", "row_relative"]
        assert main([*argv, "--amount", "3"]) == 0
        np.testing.assert_array_equal(np.load(tmp_path / "o.npz")["w"], X * THREE)
        np.testing.assert_array_equal(mp.prune({"w": X}, "w", RowRelative(3))["w_mask"], THREE.astype(np.float32))
    finally:
        unregister_method("row_relative")
    assert "row_relative" not in ap.METHODS


def test_its_scores_are_not_streamed():
    from arrayprune.adapters.pipeline.stream_pruning import streams

    assert not streams(RowRelative) and streams(ap.L1Unstructured)
    with pytest.raises(TypeError, match="declares no command-line flag"):

        class WithCut(RowRelative):
            def __init__(self, amount, cut=0.5):
                super().__init__(amount)
                self.cut = cut

        register_method("with_cut", WithCut)
