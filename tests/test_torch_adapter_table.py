"""The PyTorch adapter is made from arrayprune.METHODS: every method has a class and a verb."""

from __future__ import annotations

import inspect

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
tprune = pytest.importorskip("torch.nn.utils.prune")

import arrayprune as ap  # noqa: E402
import arrayprune.adapters.torch as prune  # noqa: E402
from arrayprune.adapters.torch import _methods  # noqa: E402
from arrayprune.registry import constructor_parameters  # noqa: E402

P = inspect.Parameter


def described(params):
    return [(p.name, p.kind, p.default) for p in params]


@pytest.mark.parametrize("name", list(ap.METHODS))
def test_every_table_method_has_a_class_and_a_verb(name):
    core = ap.METHODS[name]
    cls, verb = getattr(prune, core.__name__), getattr(prune, name)
    assert core.__name__ in prune.__all__ and name in prune.__all__
    assert issubclass(cls, prune.BasePruningMethod) and cls._CORE is core
    assert cls.__module__ == verb.__module__ == "arrayprune.adapters.torch"
    assert cls.PRUNING_TYPE == core.PRUNING_TYPE
    own = constructor_parameters(core)
    theirs = getattr(tprune, core.__name__, None)
    init = list(inspect.signature(cls.__init__).parameters.values())[1:]
    verb_params = list(inspect.signature(verb).parameters.values())
    assert [p.name for p in verb_params[:2]] == ["module", "name"]
    scores = ["importance_scores"] if core.USES_SCORES else []
    if theirs is None:  # the core class's signatures
        assert described(init) == described(own)
        assert [p.name for p in verb_params[2:]] == [p.name for p in own] + scores
        assert described(verb_params[2:]) == described(inspect.signature(cls.apply).parameters.values())[2:]
    else:  # PyTorch's signatures, extended with the core's keyword-only parameters
        assert issubclass(cls, theirs)
        kw_only = [p for p in own if p.kind is P.KEYWORD_ONLY]
        assert described(p for p in init if p.kind is P.KEYWORD_ONLY) == described(kw_only)
        assert {p.name for p in own} <= {p.name for p in init} or not own
        torch_verb = list(inspect.signature(getattr(tprune, name)).parameters.values())
        assert described(verb_params) == described([*torch_verb, *kw_only])
        assert ("importance_scores" in {p.name for p in verb_params}) == core.USES_SCORES


class LargestFirst(ap.UnstructuredPruningMethod):
    """Prune the (currently unpruned) entries of largest absolute value.

    Parameters
    ----------
    amount : int or float
        Fraction in ``[0, 1]`` of the entries to prune, or their number.
    seed : int, optional
        Unused: a keyword-only parameter, to be carried over.
    """

    def __init__(self, amount, *, seed=None):
        super().__init__(amount)
        self.seed = seed

    def entry_scores(self, arrays):
        return [-abs(a) for a in arrays]


def test_a_new_table_entry_needs_no_edit_of_the_adapter():
    cls = _methods.method_class("largest_first", LargestFirst)
    verb = _methods.method_verb("largest_first", cls)
    assert issubclass(cls, prune.BasePruningMethod) and not issubclass(cls, tprune.L1Unstructured)
    assert list(inspect.signature(verb).parameters) == ["module", "name", "amount", "importance_scores", "seed"]
    assert "amount : int or float" in verb.__doc__ and "amount : int or float" in cls.__doc__
    m = nn.Linear(5, 4)
    w = m.weight.detach().clone()
    assert verb(m, "weight", 0.25) is m
    hook = next(iter(m._forward_pre_hooks.values()))
    assert isinstance(hook, cls) and isinstance(hook._core, LargestFirst) and hook.amount == 0.25
    expected = LargestFirst(0.25).keep_mask(w.numpy())
    assert torch.equal(m.weight_mask != 0, torch.from_numpy(expected))
    prune.l1_unstructured(m, "weight", amount=2)  # a container: both combine
    verb(m, "weight", amount=1)
    assert int((m.weight_mask == 0).sum()) == 5 + 2 + 1
    assert isinstance(next(iter(m._forward_pre_hooks.values())), prune.PruningContainer)
    hook = cls.apply(m, "bias", 2, seed=3)
    assert hook.seed == 3 and int((m.bias_mask == 0).sum()) == 2
