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
from .wanda import Wanda

__all__ = ["METHODS", "method_name", "parameters_doc", "constructor_parameters"]

METHODS: Mapping[str, type[BasePruningMethod]] = MappingProxyType(
    {
        "identity": Identity,
        "random_unstructured": RandomUnstructured,
        "l1_unstructured": L1Unstructured,
        "random_structured": RandomStructured,
        "ln_structured": LnStructured,
        "custom_from_mask": CustomFromMask,
        "nm_structured": NMStructured,
        "block_unstructured": BlockUnstructured,
        "wanda": Wanda,
    }
)
"""Read-only mapping of method names (``"l1_unstructured"``, ...) to method classes."""

_P = inspect.Parameter


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


def constructor_parameters(cls: type) -> list[inspect.Parameter]:
    """The named parameters of ``cls.__init__`` after ``self`` (none for ``object``'s)."""
    init = inspect.getattr_static(cls, "__init__")
    if init is object.__init__:
        return []
    params = list(inspect.signature(init).parameters.values())[1:]
    return [p for p in params if p.kind not in (_P.VAR_POSITIONAL, _P.VAR_KEYWORD)]
