"""What a method is made of: a score (what ranks) and a pattern (which units go, how many).

Every method class declares its :class:`Score` as ``SCORE`` and its :class:`Pattern` as
``PATTERN``; code that must know how a method behaves (can its scores be streamed? which
axis is its ``dim``? what does its amount count?) asks these two, never the class's name
or identity. A method's constructor parameters declare their command-line flags in
``FLAGS`` (a :class:`Flag` each, or :data:`NO_FLAG` for those a command line cannot
give, such as a mask or a generator); :func:`check_method` refuses a method with a
parameter that declares neither.

The built-in scores and patterns:

==================  ==========  ===========================================================
score               elementwise  ranks by
==================  ==========  ===========================================================
``MAGNITUDE``       yes          ``|x|`` (the values, or the importance scores given)
``RANDOM``          no           uniform draws (a seed or generator; drawn per array)
``CHANNEL_NORM``    no           a channel's L``n`` norm
``BLOCK_NORM``      no           a block's power mean of ``|x|``
``WANDA``           yes          ``|W| * ||X||`` (input norms from calibration)
``HESSIAN``         yes          the solver's choice from a layer's Hessian (calibration);
                                 ``|x|`` without one
``GIVEN_MASK``      yes          a mask given by the caller (nothing is ranked)
``NOTHING``         yes          nothing: no entry is pruned
==================  ==========  ===========================================================

==================  ============  =========  ==============================================
pattern             ``dim``        whole      unit of the amount
==================  ============  =========  ==============================================
``UNSTRUCTURED``    none           no         entries (ranked across arrays: global pruning)
``CHANNELS``        output axis    no         channels along ``dim``
``PER_OUTPUT``      output axis    yes        entries of each output unit
``N_OF_M``          reduction      yes        none (``n`` of every ``m``)
``BLOCKS``          none           yes        blocks
``GIVEN``           none           yes        none (a given mask)
==================  ============  =========  ==============================================

"whole": a :class:`~arrayprune.PruningContainer` hands the method the whole array and
the mask of earlier pruning (which the method then respects itself), not only what
remains; PyTorch calls that ``PRUNING_TYPE = "global"``, a name unrelated to global
pruning across arrays.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Score",
    "Pattern",
    "Flag",
    "NO_FLAG",
    "MAGNITUDE",
    "RANDOM",
    "CHANNEL_NORM",
    "BLOCK_NORM",
    "WANDA",
    "HESSIAN",
    "GIVEN_MASK",
    "NOTHING",
    "UNSTRUCTURED",
    "CHANNELS",
    "PER_OUTPUT",
    "N_OF_M",
    "BLOCKS",
    "GIVEN",
    "score_of",
    "solver_of",
    "prunes_units",
    "masks_alone",
    "pattern_of",
    "flags_of",
    "check_method",
    "constructor_parameters",
]


@dataclass(frozen=True)
class Score:
    """What ranks the units of a method.

    Attributes
    ----------
    name : str
        A label (``"magnitude"``).
    elementwise : bool
        An entry's score depends on that entry alone, so that scores can be computed
        chunk by chunk of a stored tensor (streamed) and ranked across tensors.
    magnitude : bool
        The score is the magnitude of the values ranked (or of the importance scores
        given): stored bit patterns can be ranked as they are, and LAMP can rescale it.
    uses_values : bool
        The values (or importance scores) are read at all (False for random draws and
        given masks): verbs then offer ``importance_scores``.
    needs_calibration : bool
        It ranks by a statistic of calibration data (Wanda's input norms, a Hessian).
    needs_seed : bool
        It draws random numbers (a seed or generator; one stream per tensor in files).
    statistic : {None, 'input_norms', 'hessian'}
        The statistic of calibration data it needs: none; the L2 norm of each input
        feature of a layer (importance scores ``|W| * ||X||``); or the Hessian ``X^T X``
        of a layer's inputs, which a method with a solver (``SOLVE``, see
        :class:`~arrayprune.reconstruction.ReconstructionMethod`) prunes and updates
        the kept weights from.
    """

    name: str
    elementwise: bool
    magnitude: bool = False
    uses_values: bool = True
    needs_calibration: bool = False
    needs_seed: bool = False
    statistic: str | None = None


@dataclass(frozen=True)
class Pattern:
    """Which units a method removes, and what its amount counts.

    Attributes
    ----------
    name : str
        A label (``"unstructured"``).
    unit : str or None
        What the amount counts (``"entries"``, ``"channels"``, ``"blocks"``,
        ``"entries of each output unit"``); None without an amount.
    dim_axis : {'output', 'reduction'} or None
        Which axis of a weight the method's ``dim`` names, if it has one.
    whole_array : bool
        A container hands the method the whole array and the earlier mask (PyTorch's
        ``PRUNING_TYPE = "global"``).
    pruning_type : str
        PyTorch's ``PRUNING_TYPE`` for it: ``"unstructured"``, ``"structured"`` or
        ``"global"`` (the whole array).
    """

    name: str
    unit: str | None
    dim_axis: str | None
    whole_array: bool
    pruning_type: str

    @property
    def across_arrays(self) -> bool:
        """Units are single entries ranked by one score: arrays can be ranked together."""
        return self.pruning_type == "unstructured"


@dataclass(frozen=True)
class Flag:
    """The command-line flag of a constructor parameter.

    Attributes
    ----------
    flag : str or None
        The flag (``"--amount"``); None for a parameter a command line cannot give (a
        mask, a generator): see :data:`NO_FLAG`.
    type : callable
        Turns the flag's text into the value (``float``, ``int``).
    help : str
        One line for ``--help``.
    """

    flag: str | None
    type: Any = str
    help: str = ""


NO_FLAG = Flag(None)
"""The declaration of a parameter that no command line gives (a mask, a generator)."""

MAGNITUDE = Score("magnitude", elementwise=True, magnitude=True)
RANDOM = Score("random", elementwise=False, uses_values=False, needs_seed=True)
CHANNEL_NORM = Score("channel norm", elementwise=False)
BLOCK_NORM = Score("block norm", elementwise=False)
WANDA = Score("wanda", elementwise=True, magnitude=True, needs_calibration=True, statistic="input_norms")
HESSIAN = Score("hessian", elementwise=True, magnitude=True, needs_calibration=True, statistic="hessian")
GIVEN_MASK = Score("given mask", elementwise=True, uses_values=False)
NOTHING = Score("nothing", elementwise=True, uses_values=False)

UNSTRUCTURED = Pattern("unstructured", "entries", None, whole_array=False, pruning_type="unstructured")
CHANNELS = Pattern("channels", "channels", "output", whole_array=False, pruning_type="structured")
PER_OUTPUT = Pattern("per output", "entries of each output unit", "output", whole_array=True, pruning_type="global")
N_OF_M = Pattern("n of m", None, "reduction", whole_array=True, pruning_type="global")
BLOCKS = Pattern("blocks", "blocks", None, whole_array=True, pruning_type="global")
GIVEN = Pattern("given", None, None, whole_array=True, pruning_type="global")


def score_of(method: Any) -> Score:
    """The :class:`Score` a method (class or instance) declares; for a method that declares
    none (PyTorch's own, say), what its ``PRUNING_TYPE`` and ``USES_SCORES`` tell."""
    score = getattr(method, "SCORE", None)
    if isinstance(score, Score):
        return score
    uses = bool(getattr(method, "USES_SCORES", True))
    return Score("undeclared", elementwise=False, uses_values=uses)


def solver_of(method: Any) -> Any:
    """The solver a method (class or instance) carries to update the weights it keeps
    (``SOLVE``, see :class:`~arrayprune.reconstruction.ReconstructionMethod`); None for a
    method that only masks."""
    return getattr(method, "SOLVE", None)


def prunes_units(method: Any) -> bool:
    """Whether a method (class or instance) removes units of a layer's input columns scored
    on calibration data, refitting that layer (``prune_units``, see
    :class:`~arrayprune.structured_methods.UnitPruningMethod`)."""
    return callable(getattr(method, "prune_units", None))


def masks_alone(method: Any) -> bool:
    """Whether a method is what it masks: no solver (:func:`solver_of`) and no unit refit
    (:func:`prunes_units`). Such methods get the written verbs (``arrayprune.l1_unstructured``,
    the adapters' ``prune.l1_unstructured``); the others run through a model on calibration
    data (a file's pipeline, ``prune.reconstruct``, ``prune.shrink_llm``)."""
    return solver_of(method) is None and not prunes_units(method)


def pattern_of(method: Any) -> Pattern:
    """The :class:`Pattern` a method (class or instance) declares; for one that declares
    none, a pattern read from its ``PRUNING_TYPE``."""
    pattern = getattr(method, "PATTERN", None)
    if isinstance(pattern, Pattern):
        return pattern
    kind = getattr(method, "PRUNING_TYPE", "global")
    return {"unstructured": UNSTRUCTURED, "structured": CHANNELS}.get(kind, GIVEN)


def flags_of(cls: type) -> dict[str, Flag]:
    """The :class:`Flag` of each constructor parameter of `cls` (``FLAGS`` along its MRO).

    Raises
    ------
    TypeError
        If a parameter declares no flag (see :func:`check_method`).
    """
    check_method(cls)
    declared: dict[str, Flag] = {}
    for klass in reversed(cls.__mro__):
        declared.update(getattr(klass, "__dict__", {}).get("FLAGS", {}))
    return {p: declared[p] for p in _parameters(cls)}


def check_method(cls: type, name: str | None = None) -> None:
    """Refuse a method class whose parts are not declared.

    Parameters
    ----------
    cls : type
        The method class.
    name : str, optional
        Its name in the table, for the message.

    Raises
    ------
    TypeError
        If it declares no ``SCORE`` or ``PATTERN``, its ``PRUNING_TYPE`` disagrees with
        its pattern's, or a constructor parameter declares no flag in ``FLAGS`` (use
        :data:`NO_FLAG` for one no command line gives).
    """
    label = name or cls.__name__
    if not isinstance(getattr(cls, "SCORE", None), Score) or not isinstance(getattr(cls, "PATTERN", None), Pattern):
        raise TypeError(f"method {label}: declare its SCORE and PATTERN (see arrayprune.method_parts)")
    pattern: Pattern = getattr(cls, "PATTERN")  # noqa: B009 (checked above)
    if getattr(cls, "PRUNING_TYPE", None) != pattern.pruning_type:
        raise TypeError(f"method {label}: PRUNING_TYPE must be {pattern.pruning_type!r}, that of its pattern")
    declared: dict[str, Flag] = {}
    for klass in cls.__mro__:
        for key, flag in getattr(klass, "__dict__", {}).get("FLAGS", {}).items():
            declared.setdefault(key, flag)
    missing = [p for p in _parameters(cls) if not isinstance(declared.get(p), Flag)]
    if missing:
        raise TypeError(
            f"method {label}: parameter {missing[0]!r} declares no command-line flag; add it to FLAGS "
            "(arrayprune.method_parts.Flag, or NO_FLAG if no command line can give it)"
        )


def constructor_parameters(cls: type) -> list[inspect.Parameter]:
    """The named parameters of ``cls.__init__`` after ``self`` (none for ``object``'s)."""
    init = inspect.getattr_static(cls, "__init__")
    if init is object.__init__:
        return []
    params = list(inspect.signature(init).parameters.values())[1:]
    return [p for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _parameters(cls: type) -> list[str]:
    return [p.name for p in constructor_parameters(cls)]


def flag_table(methods: Mapping[str, type]) -> dict[str, dict[str, Flag]]:
    """:func:`flags_of` of every method of a table, by name."""
    return {name: flags_of(cls) for name, cls in methods.items()}
