"""The table of pruning methods.

:data:`METHODS` maps each method's name to its class. It is the single list of
methods: the functional verbs of :mod:`arrayprune`, the verbs of the mapping and PyTorch
adapters, and the ``--method`` choices and flags of the command line follow it.

The verbs are plain functions, written into their modules by ``tools/write_verbs.py``
from the table: a verb's parameters are the leading ones (``x``, or ``params, key``, or
``module, name``), then those of the class's constructor, then ``importance_scores`` if
the method ranks by scores (``USES_SCORES``); its docstring lists the constructor's
parameters from the class's own docstring (:func:`parameters_doc`). A test fails when
the written verbs and the table disagree.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping
from types import MappingProxyType

from .method_parts import check_method, constructor_parameters, solver_of
from .methods import (
    BasePruningMethod,
    CustomFromMask,
    Identity,
    L1Unstructured,
    LnStructured,
    RandomStructured,
    RandomUnstructured,
)
from .patterns import BlockUnstructured, NMStructured
from .reconstruction import ReconstructionMethod, SparseGPT
from .structured_methods import ActivationStructured, ObsStructured
from .wanda import Wanda

__all__ = [
    "METHODS",
    "register_method",
    "unregister_method",
    "method_name",
    "parameters_doc",
    "constructor_parameters",
    "reconstruction_method",
    "settings_for",
]

_TABLE: dict[str, type[BasePruningMethod]] = {
    "identity": Identity,
        "random_unstructured": RandomUnstructured,
        "l1_unstructured": L1Unstructured,
        "random_structured": RandomStructured,
        "ln_structured": LnStructured,
        "custom_from_mask": CustomFromMask,
        "nm_structured": NMStructured,
        "block_unstructured": BlockUnstructured,
    "wanda": Wanda,
    "sparsegpt": SparseGPT,
    "activation_structured": ActivationStructured,
    "obs_structured": ObsStructured,
}

METHODS: Mapping[str, type[BasePruningMethod]] = MappingProxyType(_TABLE)
"""Read-only mapping of method names (``"l1_unstructured"``, ...) to method classes."""

for _name, _cls in _TABLE.items():
    check_method(_cls, _name)  # a method of the table declares its score, pattern and flags
del _name, _cls


def register_method(name: str, cls: type[BasePruningMethod]) -> None:
    """Add a method to :data:`METHODS` while the program runs (a plug-in, a test).

    The command line offers it at once (``--method name``, with the flags its
    parameters declare), and so do the pipeline, :func:`arrayprune.mask_for` and both
    adapters' generic verbs (``mapping.prune``, the drop-in's ``CoreMethod``); the
    functional verbs written from the table (``arrayprune.l1_unstructured``, ...) are
    those of the methods listed in this module.

    Parameters
    ----------
    name : str
        Its name (``"largest_first"``): a Python identifier, not yet in the table.
    cls : type
        The method class; it declares ``SCORE``, ``PATTERN`` and a flag for each
        constructor parameter (``FLAGS``).

    Raises
    ------
    ValueError
        If `name` is taken or not an identifier.
    TypeError
        If `cls` is not a method class, or declares its parts incompletely
        (:func:`~arrayprune.method_parts.check_method`).
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"a method's name must be a Python identifier, got {name!r}")
    if name in _TABLE:
        raise ValueError(f"method {name!r} is already in arrayprune.METHODS")
    if not (isinstance(cls, type) and issubclass(cls, BasePruningMethod)):
        raise TypeError(f"{cls!r} is not a subclass of arrayprune.BasePruningMethod")
    check_method(cls, name)
    _TABLE[name] = cls


def unregister_method(name: str) -> None:
    """Remove a method added by :func:`register_method`.

    Raises
    ------
    KeyError
        If `name` was not registered at run time (the built-in methods stay).
    """
    if name in _BUILT_IN or name not in _TABLE:
        raise KeyError(f"{name!r} is not a method registered at run time")
    del _TABLE[name]


_BUILT_IN = frozenset(_TABLE)



def method_name(cls: type) -> str:
    """The name of a method class in :data:`METHODS` (for a subclass, of its table base).

    Raises
    ------
    KeyError
        If neither `cls` nor a base class of it is in the table.
    """
    for base in cls.__mro__:
        for name, listed in METHODS.items():
            if listed is base:
                return name
    raise KeyError(f"{cls.__name__} is not in arrayprune.METHODS")


def parameters_doc(cls: type) -> str:
    """The body of the "Parameters" section of `cls`'s docstring, dedented."""
    doc = inspect.cleandoc(cls.__doc__ or "")
    match = re.search(r"^Parameters\n-+\n(.*?)(?=\n\n\S[^\n]*\n-+\n|\Z)", doc, flags=re.S | re.M)
    return match.group(1).rstrip() + "\n" if match else ""


def reconstruction_method(method: str | type) -> type[ReconstructionMethod]:
    """The method class that `method` names (or is) in :data:`METHODS`, if it carries a solver.

    Parameters
    ----------
    method : str or type
        A name of the table (``"sparsegpt"``), or a subclass of
        :class:`~arrayprune.reconstruction.ReconstructionMethod`.

    Raises
    ------
    ValueError
        If `method` names no method of the table, or one without a solver (it only masks).
    """
    cls = METHODS.get(method) if isinstance(method, str) else method
    if not (isinstance(cls, type) and issubclass(cls, ReconstructionMethod) and solver_of(cls) is not None):
        known = ", ".join(name for name, c in METHODS.items() if solver_of(c) is not None)
        raise ValueError(f"{method!r} is not a method that updates the weights it keeps; choose from {known}")
    return cls


def settings_for(cls: type, settings: Mapping[str, object]) -> dict[str, object]:
    """The `settings` (``block_size``, ``damp``, ...) that the constructor of `cls` takes."""
    names = {p.name for p in constructor_parameters(cls)}
    return {k: v for k, v in settings.items() if k in names}
