"""The table of pruning methods, and verbs made from it.

:data:`METHODS` maps each method's name to its class. It is the single list of
methods: the functional verbs of :mod:`arrayprune`, the verbs of the mapping and PyTorch
adapters, and the ``--method`` choices and flags of the command line are all made from
it. Adding a method is one class and one line here.

A verb is made from a class by :func:`make_verb`: its parameters are the leading ones
of the verb (``x``, or ``params, key``, or ``module, name``), then the parameters of the
class's constructor, then ``importance_scores`` if the method ranks by scores
(``USES_SCORES``); its docstring lists the constructor's parameters from the class's
own docstring.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

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

__all__ = ["METHODS", "method_name", "make_verb", "parameters_doc"]

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
    if cls.__init__ is object.__init__:
        return []
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    return [p for p in params if p.kind not in (_P.VAR_POSITIONAL, _P.VAR_KEYWORD)]


def make_verb(
    cls: type,
    name: str,
    call: Callable[..., Any],
    *,
    leading: Sequence[inspect.Parameter],
    scores: str,
    extra: Sequence[inspect.Parameter] = (),
    doc: str,
    module: str,
    signature: inspect.Signature | None = None,
) -> Callable[..., Any]:
    """A function applying method `cls`, with an explicit signature and docstring.

    Parameters
    ----------
    cls : type
        The method class.
    name : str
        The function's name.
    call : callable
        ``call(method, **leading_and_extra)`` does the work, given the method built from
        the constructor's arguments, the leading and extra arguments by name, and
        ``importance_scores`` when the method takes it.
    leading : sequence of inspect.Parameter
        Parameters before the constructor's.
    scores : {'positional', 'keyword'}
        How ``importance_scores`` is passed, when ``cls.USES_SCORES``: after the
        constructor's positional parameters (PyTorch's verbs) or keyword-only.
    extra : sequence of inspect.Parameter
        Keyword-only parameters after the constructor's (e.g. ``default_mask``).
    doc : str
        Docstring template; ``{parameters}`` is replaced by the constructor's
        parameter descriptions and ``{cls}`` by the class name.
    module : str
        ``__module__`` of the function.
    signature : inspect.Signature, optional
        A signature to use instead of the one built from `cls` (PyTorch's verbs keep
        PyTorch's); it must name the same parameters.

    Returns
    -------
    callable
        The verb.
    """
    if signature is None:
        signature = verb_signature(cls, leading, scores, extra)
    own = {p.name for p in constructor_parameters(cls)}
    verb = _compiled(signature, own, cls, call)
    if verb is None:  # positional-only or variadic parameters: bind them with the signature

        def verb(*args: Any, **kwargs: Any) -> Any:
            arguments = signature.bind(*args, **kwargs).arguments
            method = cls(**{k: v for k, v in arguments.items() if k in own})
            return call(method, **{k: v for k, v in arguments.items() if k not in own})

    verb.__name__ = verb.__qualname__ = name
    verb.__module__ = module
    verb.__signature__ = signature  # type: ignore[attr-defined]
    verb.__doc__ = doc.replace("{parameters}", parameters_doc(cls).rstrip("\n")).replace("{cls}", cls.__name__)
    return verb


_UNSET = object()


def _compiled(signature: inspect.Signature, own: set[str], cls: type, call: Callable[..., Any]) -> Any:
    """The verb as Python code, ``call(cls(<own arguments>), <the others>)``, so that the
    interpreter binds its arguments (an argument not given is not passed on); None if the
    signature has positional-only or variadic parameters (or names clashing with the code's)."""
    params = list(signature.parameters.values())
    if any(p.kind not in (_P.POSITIONAL_OR_KEYWORD, _P.KEYWORD_ONLY) or p.name.startswith("_") for p in params):
        return None
    head: list[str] = []
    given: dict[tuple[bool, bool], list[str]] = {(o, r): [] for o in (True, False) for r in (True, False)}
    for p in params:
        if p.kind is _P.KEYWORD_ONLY and "*" not in head:
            head.append("*")
        head.append(p.name if p.default is _P.empty else f"{p.name}=_unset")
        given[p.name in own, p.default is _P.empty].append(p.name)
    lines, args = [], {}
    for mine, d in ((True, "_own"), (False, "_rest")):  # (the constructor's, the others)
        args[mine] = [f"{n}={n}" for n in given[mine, True]]
        if given[mine, False]:
            lines += [f"    {d} = {{}}", *(f"    if {n} is not _unset: {d}[{n!r}] = {n}" for n in given[mine, False])]
            args[mine].append(f"**{d}")
    call_line = f"    return _call(_cls({', '.join(args[True])}), {', '.join(args[False])})"
    source = f"def verb({', '.join(head)}):\n" + "\n".join([*lines, call_line]) + "\n"
    namespace = {"_unset": _UNSET, "_cls": cls, "_call": call}
    exec(source, namespace)  # names and structure from a signature; values stay in the namespace
    return namespace["verb"]


def verb_signature(
    cls: type, leading: Sequence[inspect.Parameter], scores: str, extra: Sequence[inspect.Parameter] = ()
) -> inspect.Signature:
    """The signature :func:`make_verb` gives a verb of `cls` (see there)."""
    own = constructor_parameters(cls)
    positional = [p for p in own if p.kind is not _P.KEYWORD_ONLY]
    keyword = [p for p in own if p.kind is _P.KEYWORD_ONLY]
    scored = []
    if getattr(cls, "USES_SCORES", True):
        kind = _P.POSITIONAL_OR_KEYWORD if scores == "positional" else _P.KEYWORD_ONLY
        scored = [_P("importance_scores", kind, default=None)]
    if scores == "positional":
        params = [*leading, *positional, *scored, *keyword, *extra]
    else:
        params = [*leading, *positional, *keyword, *extra, *scored]
    return inspect.Signature(params)
