"""The methods a request can name, and the flags that set their parameters.

Read from the method table (:data:`arrayprune.METHODS`, methods registered at run time
included): the ``--method`` choices, each method's flags, the flags methods declare
beyond the command line's own, and which methods carry a solver that updates the
weights they keep (:func:`reconstructs`).
"""

from __future__ import annotations

import inspect

import arrayprune
from arrayprune.method_parts import Flag, flags_of, pattern_of, prunes_units, score_of, solver_of
from arrayprune.registry import constructor_parameters

__all__ = [
    "PARAMETER_FLAGS",
    "extra_flags",
    "method_flags",
    "methods_with",
    "reconstruction_methods",
    "reconstructs",
    "runnable_methods",
    "scan_methods",
    "scored_methods",
    "unit_methods",
]


#: The constructor parameters the command line has options of its own for, with their
#: flags. A method with both ``n`` and ``m`` (an N:M pattern) takes them together as
#: ``--nm N:M``. Any other parameter's flag is the one it declares, and its value goes to
#: ``method_options``.
PARAMETER_FLAGS = {"amount": "--amount", "dim": "--dim", "n": "--n", "block_shape": "--block", "seed": "--seed"}
_OWN_FLAGS = {*PARAMETER_FLAGS.values(), "--nm"}


def reconstructs(name: str) -> bool:
    """Whether method `name` carries a solver that updates the weights it keeps (SparseGPT):
    it then needs the Hessians of calibration data and runs through a model."""
    method = arrayprune.METHODS.get(name) if isinstance(name, str) else None
    return method is not None and solver_of(method) is not None


def reconstruction_methods() -> tuple[str, ...]:
    """The methods of the table that carry a solver (:func:`reconstructs`), in table order."""
    return tuple(name for name in arrayprune.METHODS if reconstructs(name))


def unit_methods() -> tuple[str, ...]:
    """The calibrated structured methods (:func:`~arrayprune.method_parts.prunes_units`):
    units of a layer's input columns scored on calibration data, that layer refit. They
    run with ``--shrink --groups channels|heads`` on a Hugging Face folder. Table order,
    methods registered at run time included."""
    return tuple(name for name, cls in arrayprune.METHODS.items() if prunes_units(cls))


def scored_methods() -> list[str]:
    """The methods that can rank by the scores Wanda's input norms make (``calibration``,
    ``input_norms``): those whose score is elementwise, reads the values and needs no
    other statistic (Wanda first, whose score they are)."""
    scored = [
        n
        for n, cls in arrayprune.METHODS.items()
        if score_of(cls).elementwise and score_of(cls).uses_values and score_of(cls).statistic != "hessian"
    ]
    return sorted(scored, key=lambda name: not score_of(arrayprune.METHODS[name]).needs_calibration)


def method_flags(name: str) -> dict[str, str]:
    """The flags of method `name` of :data:`arrayprune.METHODS`: constructor parameter -> flag.

    Parameters the command line cannot give (a mask, a generator) are left out.
    """
    return {p: f.flag for p, f in flags_of(arrayprune.METHODS[name]).items() if f.flag is not None}


def extra_flags() -> dict[str, tuple[str, Flag, list[str]]]:
    """The flags methods declare beyond the command line's own: flag -> (parameter, its
    declaration, the methods taking it)."""
    out: dict[str, tuple[str, Flag, list[str]]] = {}
    for name in runnable_methods():
        for param, flag in flags_of(arrayprune.METHODS[name]).items():
            if flag.flag is not None and flag.flag not in _OWN_FLAGS:
                out.setdefault(flag.flag, (param, flag, []))[2].append(name)
    return out


def _runnable(name: str) -> bool:
    """Whether the options can give every required parameter of method `name`."""
    flags = method_flags(name)
    return all(
        p.name in flags or p.default is not inspect.Parameter.empty
        for p in constructor_parameters(arrayprune.METHODS[name])
    )


def runnable_methods() -> tuple[str, ...]:
    """The methods a request can name: those of the table that prune something the options
    can describe (``identity`` has nothing to set; ``custom_from_mask`` needs a mask).
    Methods registered at run time (:func:`arrayprune.registry.register_method`) are in."""
    return tuple(name for name in arrayprune.METHODS if method_flags(name) and _runnable(name))


def methods_with(flag: str) -> list[str]:
    """The methods of :func:`runnable_methods` that take `flag` (``"--n"``, ``"--dim"``, ...)."""
    return [m for m in runnable_methods() if flag in method_flags(m).values()]


#: The units whose amount a scan varies: entries, entries of each output unit, channels.
_SCANNED_UNITS = ("entries", "entries of each output unit", "channels")


def scan_methods() -> tuple[str, ...]:
    """The methods a scan prunes with: those that rank a weight's values (or Wanda's scores
    of them) and remove an amount of entries, of each output unit's entries or of
    channels, and the reconstructions; not the calibrated structured methods (they shrink
    a model: :func:`unit_methods`). Methods registered at run time are in."""

    def scanned(name: str) -> bool:
        method = arrayprune.METHODS[name]
        return score_of(method).uses_values and pattern_of(method).unit in _SCANNED_UNITS and not prunes_units(method)

    return tuple(name for name in runnable_methods() if scanned(name))
