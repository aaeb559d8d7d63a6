"""The PyTorch adapter is made from arrayprune.METHODS: every method has a class and a verb."""

from __future__ import annotations

import inspect

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
tprune = pytest.importorskip("torch.nn.utils.prune")

import arrayprune as ap  # noqa: E402
import arrayprune.adapters.torch as prune  # noqa: E402
from arrayprune.adapters.torch._base import CoreMethod, core_parameter, make_core  # noqa: E402
from arrayprune.method_parts import masks_alone  # noqa: E402
from arrayprune.registry import constructor_parameters  # noqa: E402

P = inspect.Parameter


def described(params):
    return [(p.name, p.kind, p.default) for p in params]


#: The methods that only mask (a method with a solver is the drop-in's ``reconstruct``).
MASK_METHODS = [name for name, cls in ap.METHODS.items() if masks_alone(cls)]


@pytest.mark.parametrize("name", MASK_METHODS)
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


class LargestFirstHook(CoreMethod):
    """A drop-in class written by hand, as tools/write_verbs.py writes those of the table."""

    PRUNING_TYPE = "unstructured"
    _CORE = LargestFirst
    _PARAMS = ("amount", "seed")
    amount = core_parameter("amount")
    seed = core_parameter("seed")

    def __init__(self, amount, *, seed=None):
        self._core = make_core(type(self), (), {"amount": amount, "seed": seed})


def test_a_plain_subclass_of_core_method_is_a_drop_in_class():
    m = nn.Linear(5, 4)
    w = m.weight.detach().clone()
    hook = LargestFirstHook.apply(m, "weight", 0.25)
    assert isinstance(hook, LargestFirstHook) and isinstance(hook._core, LargestFirst) and hook.amount == 0.25
    expected = LargestFirst(0.25).keep_mask(w.numpy())
    assert torch.equal(m.weight_mask != 0, torch.from_numpy(expected))
    prune.l1_unstructured(m, "weight", amount=2)  # a container: both combine
    LargestFirstHook.apply(m, "weight", amount=1)
    assert int((m.weight_mask == 0).sum()) == 5 + 2 + 1
    assert isinstance(next(iter(m._forward_pre_hooks.values())), prune.PruningContainer)
    hook = LargestFirstHook.apply(m, "bias", 2, seed=3)
    assert hook.seed == 3 and int((m.bias_mask == 0).sum()) == 2


def test_table_classes_are_plain_classes_of_this_package():
    for name in MASK_METHODS:
        core = ap.METHODS[name]
        cls = getattr(prune, core.__name__)
        assert cls.__qualname__ == core.__name__ and cls.__init__.__qualname__ == f"{core.__name__}.__init__"
        assert inspect.getsourcefile(cls.__init__).endswith("_methods.py")
        assert inspect.getsource(cls.apply).lstrip().startswith("@classmethod\n    def apply(")
        assert inspect.getsource(getattr(prune, name)).startswith(f"def {name}(")
