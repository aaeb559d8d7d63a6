"""The method classes and their verbs: one of each per entry of :data:`arrayprune.METHODS`."""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch.nn.utils import prune as _tprune

from arrayprune.registry import METHODS, constructor_parameters, make_verb, parameters_doc, verb_signature

from ._apply import apply_method
from ._base import CoreMethod, core_parameter, make_core
from ._streams import STREAMS

PACKAGE = __name__.rpartition(".")[0]
_P = inspect.Parameter
LEADING = [_P("module", _P.POSITIONAL_OR_KEYWORD), _P("name", _P.POSITIONAL_OR_KEYWORD)]
SHAPED = ("mask",)  # constructor parameters that are tensors shaped like the pruned one
_DOC = "{summary}\n\n{origin}; masks computed by :class:`arrayprune.{cls}`.{stream}\n\nParameters\n----------\n"
_STREAM = " Without `seed` or `generator`,\ndraws from PyTorch's global generator exactly as PyTorch does."


def extended(signature: inspect.Signature, core_class: type) -> inspect.Signature:
    """`signature` with `core_class`'s keyword-only parameters added (before any ``**kwargs``)."""
    params, kw_only = list(signature.parameters.values()), _P.KEYWORD_ONLY
    extra = [p for p in constructor_parameters(core_class) if p.kind is kw_only and p.name not in signature.parameters]
    at = len(params) - (bool(params) and params[-1].kind is _P.VAR_KEYWORD)
    return signature.replace(parameters=[*params[:at], *extra, *params[at:]])


def method_class(verb: str, core_class: type) -> type:
    """The adapter class of `core_class` (of verb `verb`), PyTorch's class of that name extended."""
    name, own = core_class.__name__, [p.name for p in constructor_parameters(core_class)]
    theirs = getattr(_tprune, name, None)  # PyTorch's class of that name
    if isinstance(theirs, type) and issubclass(theirs, _tprune.BasePruningMethod):
        bases: tuple[type, ...] = (CoreMethod, theirs)
        init, apply = (extended(inspect.signature(f), core_class) for f in (theirs.__init__, theirs.apply))
        origin = f"A subclass of :class:`torch.nn.utils.prune.{name}`"
    else:
        bases, origin = (CoreMethod,), "Not in :mod:`torch.nn.utils.prune`"
        init, apply = inspect.signature(core_class.__init__), verb_signature(core_class, LEADING, "positional")
    summary = inspect.cleandoc(core_class.__doc__ or name).split("\n\n")[0]
    stream = _STREAM if core_class in STREAMS else ""
    doc = _DOC.format(summary=summary, origin=origin, cls=name, stream=stream) + parameters_doc(core_class)

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        self._core = make_core(type(self), args, kwargs)

    def apply_(cls: type, *args: Any, **kwargs: Any) -> Any:
        arguments = apply.bind(*args, **kwargs).arguments
        module, name, scores = arguments.pop("module"), arguments.pop("name"), arguments.pop("importance_scores", None)
        return apply_method(module, name, cls(**arguments), scores)

    __init__.__signature__ = init  # type: ignore[attr-defined]
    apply_.__signature__ = apply.replace(parameters=[_P("cls", _P.POSITIONAL_OR_KEYWORD), *apply.parameters.values()])  # type: ignore[attr-defined]
    apply_.__name__ = apply_.__qualname__ = "apply"
    apply_.__doc__ = f"Prune ``module.<name>`` as :func:`{verb}`; return the hook installed."
    namespace = {
        "__module__": PACKAGE,
        "__doc__": doc if own else doc.split("\n\nParameters")[0],
        "PRUNING_TYPE": core_class.PRUNING_TYPE,
        "_CORE": core_class,
        "_STREAM": STREAMS.get(core_class),
        "_PARAMS": tuple(own),
        "_SHAPED": tuple(p for p in SHAPED if p in own),
        "__init__": __init__,
        "apply": classmethod(apply_),
        **{key: core_parameter(key) for key in own},
    }
    return type(name, bases, namespace)


CLASSES: dict[str, type] = {name: method_class(name, core) for name, core in METHODS.items()}


_VERB_DOC = """Prune ``module.<name>`` with :class:`{cls}` (what remains of it); return `module`.

{origin}Parameters
----------
module : torch.nn.Module
    Module holding the tensor.
name : str
    Name of the parameter within `module`.
{parameters}
"""
_SCORES = """importance_scores : torch.Tensor, optional
    Scores ranking the entries instead of the parameter, same shape.
"""


def _call(method: Any, module: torch.nn.Module, name: str, importance_scores: Any = None) -> torch.nn.Module:
    apply_method(module, name, method, importance_scores)
    return module


def method_verb(name: str, cls: type) -> Any:
    """The verb `name` of adapter class `cls`, with PyTorch's signature (extended) if PyTorch has it."""
    theirs = getattr(_tprune, name, None)  # PyTorch's verb of that name
    signature = extended(inspect.signature(theirs), cls._CORE) if callable(theirs) else None
    doc = _VERB_DOC.replace("{origin}", "" if signature else "Not in :mod:`torch.nn.utils.prune`.\n\n")
    doc += _SCORES if cls._CORE.USES_SCORES else ""
    kwargs = {"leading": LEADING, "scores": "positional", "doc": doc, "module": PACKAGE, "signature": signature}
    return make_verb(cls, name, _call, **kwargs)


VERBS: dict[str, Any] = {name: method_verb(name, cls) for name, cls in CLASSES.items()}
