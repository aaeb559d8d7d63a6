"""Write the verbs and PyTorch classes of the method table into their modules.

Every method of :data:`arrayprune.METHODS` has a functional verb (``arrayprune.functional``),
a mapping verb (``arrayprune.adapters.mapping``), and a class and a verb in the PyTorch
drop-in (``arrayprune.adapters.torch._methods``). They are plain Python, checked in; this
script writes them, between the markers ``# <verbs>`` and ``# </verbs>`` of each module,
from the classes' constructors and docstrings. After adding a method to the table (or
changing a constructor or its docstring), run::

    python tools/write_verbs.py

``--check`` writes nothing and exits with status 1 when a module is out of date (a test
runs it). PyTorch is needed: the drop-in keeps the signatures of PyTorch's own verbs.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "# <verbs>", "# </verbs>"
_P = inspect.Parameter

GENERATED = "# Written by tools/write_verbs.py from arrayprune.METHODS: edit the table or the class, then rerun it."


def _import_table() -> tuple[Any, Any]:
    sys.path.insert(0, str(ROOT))
    from arrayprune import registry
    from arrayprune.method_parts import masks_alone

    # A method with a solver or a unit refit needs a Hessian, which no mask verb is given:
    # its verbs are the solver (``arrayprune.sparsegpt``) and the drop-in's
    # ``prune.reconstruct`` and ``prune.shrink_llm``.
    return {name: cls for name, cls in registry.METHODS.items() if masks_alone(cls)}, registry


def _streams() -> Any:
    """The drop-in's module of PyTorch's random streams, loaded alone (not its package)."""
    spec = importlib.util.spec_from_file_location("_write_verbs_streams", ROOT / "adapters/torch/_streams.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------------------
# Rendering parameters
# --------------------------------------------------------------------------------------


def _annotation(p: inspect.Parameter, fallback: str | None = None) -> str:
    if p.annotation is _P.empty:
        return "" if fallback is None else f": {fallback}"
    ann = p.annotation if isinstance(p.annotation, str) else getattr(p.annotation, "__name__", repr(p.annotation))
    return f": {ann}"


def _render(p: inspect.Parameter, annotations: dict[str, str] | None = None) -> str:
    ann = _annotation(p, (annotations or {}).get(p.name))
    if p.default is _P.empty:
        return f"{p.name}{ann}"
    return f"{p.name}{ann} = {_q(p.default)}" if ann else f"{p.name}={_q(p.default)}"


def _params(params: Sequence[inspect.Parameter], annotations: dict[str, str] | None = None) -> list[str]:
    out: list[str] = []
    star = False
    for p in params:
        if p.kind is _P.KEYWORD_ONLY and not star:
            out.append("*")
            star = True
        out.append(_render(p, annotations))
    return out


def _q(value: Any) -> str:
    """`value` as Python source, strings in double quotes (as the rest of the code base)."""
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, tuple):
        return "(" + ", ".join(_q(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    return repr(value)


def _def(name: str, params: list[str], returns: str, indent: str = "", comment: str = "") -> str:
    """A ``def`` line, one parameter a line if it would be longer than 120 characters."""
    one = f"{indent}def {name}({', '.join(params)}) -> {returns}:{comment}"
    if len(one) <= 120:
        return one
    inner = "".join(f"{indent}    {p},\n" for p in params)
    return f"{indent}def {name}({comment}\n{inner}{indent}) -> {returns}:"


def _listing(head: str, items: Sequence[str], close: str) -> str:
    """``head item, item close`` on one line, or one item a line if that is too long."""
    one = f"{head}{', '.join(items)}{close}"
    if len(one) <= 120:
        return one
    return head + "\n" + "".join(f"    {item},\n" for item in items) + close


def _wrapped(text: str, width: int = 92) -> str:
    """`text` (a paragraph) wrapped to `width`, its lines joined by newlines."""
    return textwrap.fill(text, width=width, break_long_words=False, break_on_hyphens=False)


def _docstring(text: str, indent: str) -> str:
    lines = text.strip("\n").split("\n")
    body = "\n".join(f"{indent}{line}" if line else "" for line in lines[1:])
    return f'{indent}"""{lines[0]}\n{body}\n{indent}"""' if len(lines) > 1 else f'{indent}"""{lines[0]}"""'


def _call(cls_expr: str, own: Sequence[inspect.Parameter]) -> str:
    args = [p.name if p.kind is not _P.KEYWORD_ONLY else f"{p.name}={p.name}" for p in own]
    return f"{cls_expr}({', '.join(args)})"


def _with_scores(
    registry: Any, cls: type, leading: Sequence[inspect.Parameter], scores: str, extra: Sequence[inspect.Parameter] = ()
) -> list[inspect.Parameter]:
    """The verb's parameters: leading ones, the constructor's, ``importance_scores`` if the
    method ranks by value (after the positional ones, or keyword-only last)."""
    own = registry.constructor_parameters(cls)
    positional = [p for p in own if p.kind is not _P.KEYWORD_ONLY]
    keyword = [p for p in own if p.kind is _P.KEYWORD_ONLY]
    scored = []
    if cls.USES_SCORES:
        kind = _P.POSITIONAL_OR_KEYWORD if scores == "positional" else _P.KEYWORD_ONLY
        scored = [_P("importance_scores", kind, default=None, annotation="Array | None")]
    if scores == "positional":
        return [*leading, *positional, *scored, *keyword, *extra]
    return [*leading, *positional, *keyword, *extra, *scored]


# --------------------------------------------------------------------------------------
# The three modules
# --------------------------------------------------------------------------------------

_FUNCTIONAL_DOC = """Mask of :class:`~arrayprune.{cls}` on `x`, on top of earlier pruning.

See :class:`~arrayprune.{cls}` for what is pruned; this is ``mask_for({cls}(...), x,
...)``.

Parameters
----------
x : array
    The array to prune.
{parameters}
default_mask : array, optional
    Mask of earlier pruning: the method acts only on what it leaves, as in a
    :class:`~arrayprune.PruningContainer`.
importance_scores : array, optional
    Scores to rank by instead of `x`, same shape (methods that rank by value).

Returns
-------
array
    The mask: boolean without `default_mask`, else of its dtype.
"""


def functional_block(methods: Any, registry: Any) -> str:
    parts = [GENERATED]
    for name, cls in methods.items():
        own = registry.constructor_parameters(cls)
        params = _with_scores(
            registry,
            cls,
            [_P("x", _P.POSITIONAL_OR_KEYWORD, annotation="Array")],
            "keyword",
            [_P("default_mask", _P.KEYWORD_ONLY, default=None, annotation="Array | None")],
        )
        doc = _FUNCTIONAL_DOC.replace("{parameters}", registry.parameters_doc(cls).rstrip("\n"))
        scores = ", importance_scores=importance_scores" if cls.USES_SCORES else ""
        parts.append(
            "\n\n"
            + _def(name, _params(params), "Array")
            + "\n"
            + _docstring(doc.replace("{cls}", cls.__name__), "    ")
            + f"\n    method = {_call('_table.' + cls.__name__, own)}"
            + f"\n    return mask_for(method, x, default_mask=default_mask{scores})\n"
        )
    parts.append("\n\n" + _listing("__all__ += [", [_q(n) for n in methods], "]") + "\n")
    return "".join(parts)


_MAPPING_DOC = """Prune the entry `key` with :class:`arrayprune.{cls}`.

``prune(params, key, {cls}(...), importance_scores)``: if `key` was pruned before,
the method acts only on what its mask leaves, as in a :class:`~arrayprune.PruningContainer`.

Parameters
----------
params : mapping
    Mapping of names to arrays (possibly nested).
key : str or tuple
    The array to prune; see *Keys and paths* in the module docs.
{parameters}
importance_scores : array, optional
    Scores to rank by instead of the original array, same shape (methods that rank
    by value).

Returns
-------
mapping
    A new mapping with ``key_orig`` and the combined ``key_mask`` in place of ``key``.

Raises
------
KeyError
    If `key` names no array.
TypeError, ValueError, IndexError
    If the method's arguments are invalid for the array.
"""


def mapping_block(methods: Any, registry: Any) -> str:
    parts = [GENERATED]
    leading = [
        _P("params", _P.POSITIONAL_OR_KEYWORD, annotation="Mapping"),
        _P("key", _P.POSITIONAL_OR_KEYWORD, annotation="Key"),
    ]
    for name, cls in methods.items():
        own = registry.constructor_parameters(cls)
        params = _with_scores(registry, cls, leading, "positional")
        doc = _MAPPING_DOC.replace("{parameters}", registry.parameters_doc(cls).rstrip("\n"))
        scores = ", importance_scores" if cls.USES_SCORES else ""
        parts.append(
            "\n\n"
            + _def(name, _params(params), "Mapping")
            + "\n"
            + _docstring(doc.replace("{cls}", cls.__name__), "    ")
            + f"\n    return prune(params, key, {_call('ap.' + cls.__name__, own)}{scores})\n"
        )
    return "".join(parts)


_TORCH_CLASS_DOC = "{summary}\n\n{origin}; masks computed by :class:`arrayprune.{cls}`.{stream}\n"
_STREAM_DOC = " Without `seed` or `generator`,\ndraws from PyTorch's global generator exactly as PyTorch does."
_TORCH_VERB_DOC = """Prune ``module.<name>`` with :class:`{cls}` (what remains of it); return `module`.

{origin}Parameters
----------
module : torch.nn.Module
    Module holding the tensor.
name : str
    Name of the parameter within `module`.
{parameters}
"""
_TORCH_SCORES_DOC = """importance_scores : torch.Tensor, optional
    Scores ranking the entries instead of the parameter, same shape.
"""
SHAPED = ("mask",)  # constructor parameters that are tensors shaped like the pruned one
_MODULE = _P("module", _P.POSITIONAL_OR_KEYWORD, annotation="torch.nn.Module")
_NAME = _P("name", _P.POSITIONAL_OR_KEYWORD, annotation="str")


def _extended(signature: inspect.Signature, own: Sequence[inspect.Parameter]) -> list[inspect.Parameter]:
    """`signature`'s parameters with the core's keyword-only ones added (before ``**kwargs``)."""
    params = [p for p in signature.parameters.values() if p.kind is not _P.VAR_POSITIONAL]
    extra = [p for p in own if p.kind is _P.KEYWORD_ONLY and p.name not in signature.parameters]
    params = [p for p in params if p.kind is not _P.VAR_KEYWORD]
    return [*params, *extra]


def torch_block(methods: Any, registry: Any) -> str:
    from torch.nn.utils import prune as tprune

    STREAMS = _streams().STREAMS

    parts = [GENERATED]
    for verb, cls in methods.items():
        name = cls.__name__
        own = registry.constructor_parameters(cls)
        annotations = {p.name: _annotation(p)[2:] for p in own if p.annotation is not _P.empty}
        annotations.update(module="torch.nn.Module", name="str", importance_scores="Any")
        theirs = getattr(tprune, name, None)
        if isinstance(theirs, type) and issubclass(theirs, tprune.BasePruningMethod):
            bases = f"CoreMethod, _tprune.{name}"
            init = _extended(inspect.signature(theirs.__init__), own)[1:]
            passed = theirs.__init__ is object.__init__  # PyTorch's (self, /, *args, **kwargs): passed on
            apply = _extended(inspect.signature(theirs.apply), own)  # a bound classmethod: no cls
            origin = f"A subclass of :class:`torch.nn.utils.prune.{name}`"
        else:
            bases, origin = "CoreMethod", "Not in :mod:`torch.nn.utils.prune`"
            init, passed = own, False
            apply = _with_scores(registry, cls, [_MODULE, _NAME], "positional")
        summary = inspect.cleandoc(cls.__doc__ or name).split("\n\n")[0]
        stream = STREAMS.get(cls)
        doc = _TORCH_CLASS_DOC.format(summary=summary, origin=origin, cls=name, stream=_STREAM_DOC if stream else "")
        head, _, rest = doc.partition("\n\n")
        doc = head + "\n\n" + _wrapped(" ".join(rest.split())) + "\n"
        if own:
            doc += "\nParameters\n----------\n" + registry.parameters_doc(cls)
        shaped = tuple(p.name for p in own if p.name in SHAPED)
        body = [
            f"\n\nclass {name}({bases}):",
            _docstring(doc, "    "),
            "",
            f"    PRUNING_TYPE = {_q(cls.PRUNING_TYPE)}",
            f"    _CORE = ap.{name}",
        ]
        if stream is not None:
            body.append(f"    _STREAM = {stream.__name__}")
        body.append(f"    _PARAMS = {_q(tuple(p.name for p in own))}")
        if shaped:
            body.append(f"    _SHAPED = {_q(shaped)}")
        body += [f"    {p.name} = core_parameter({_q(p.name)})" for p in own]
        core_args = [f"{_q(p.name)}: {p.name}" for p in init]
        make = _listing("        self._core = make_core(type(self), (), {", core_args, "})")
        if passed:
            init_def = _def("__init__", ["self", "/", "*args: Any", "**kwargs: Any"], "None", "    ")
            make = "        self._core = make_core(type(self), args, kwargs)"
        else:
            init_def = _def("__init__", ["self", *_params(init, annotations)], "None", "    ")
            make = make.replace("\n    ", "\n            ").replace("\n})", "\n        })")
        body += [
            "",
            init_def,
            make,
            "",
            "    @classmethod",
            _def("apply", ["cls", *_params(apply, annotations)], "Any", "    ", "  # type: ignore[override]"),
            f'        """Prune ``module.<name>`` as :func:`{verb}`; return the hook installed."""',
        ]
        method_args = ", ".join(f"{p.name}={p.name}" for p in apply[2:] if p.name != "importance_scores")
        scores = "importance_scores" if any(p.name == "importance_scores" for p in apply) else "None"
        body.append(f"        return apply_method(module, name, cls({method_args}), {scores})")
        parts.append("\n".join(body) + "\n")
    for verb, cls in methods.items():
        name = cls.__name__
        own = registry.constructor_parameters(cls)
        annotations = {p.name: _annotation(p)[2:] for p in own if p.annotation is not _P.empty}
        annotations.update(module="torch.nn.Module", name="str", importance_scores="Any")
        theirs = getattr(tprune, verb, None)
        if callable(theirs):
            params = _extended(inspect.signature(theirs), own)
            origin = ""
        else:
            params = _with_scores(registry, cls, [_MODULE, _NAME], "positional")
            origin = "Not in :mod:`torch.nn.utils.prune`.\n\n"
        doc = _TORCH_VERB_DOC.replace("{origin}", origin).replace("{cls}", name)
        doc = doc.replace("{parameters}", registry.parameters_doc(cls).rstrip("\n"))
        if cls.USES_SCORES:
            doc += _TORCH_SCORES_DOC
        method_args = ", ".join(
            p.name if p.kind is not _P.KEYWORD_ONLY else f"{p.name}={p.name}"
            for p in params[2:]
            if p.name != "importance_scores"
        )
        scores = "importance_scores" if cls.USES_SCORES else "None"
        parts.append(
            "\n\n"
            + _def(verb, _params(params, annotations), "torch.nn.Module")
            + "\n"
            + _docstring(doc, "    ")
            + f"\n    apply_method(module, name, {name}({method_args}), {scores})\n    return module\n"
        )
    classes = [f"{_q(v)}: {c.__name__}" for v, c in methods.items()]
    verbs = [f"{_q(v)}: {v}" for v in methods]
    names = [_q(n) for n in [*(c.__name__ for c in methods.values()), *methods]]
    parts.append("\n\n" + _listing("CLASSES: dict[str, type[CoreMethod]] = {", classes, "}") + "\n")
    parts.append(_listing("VERBS: dict[str, Callable[..., torch.nn.Module]] = {", verbs, "}") + "\n")
    parts.append(_listing("__all__ = [", names, "]") + "\n")
    return "".join(parts)


TARGETS: dict[str, Callable[[Any, Any], str]] = {
    "arrayprune/functional.py": functional_block,
    "adapters/mapping.py": mapping_block,
    "adapters/torch/_methods.py": torch_block,
}


def replaced(text: str, block: str, path: str) -> str:
    """`text` with what lies between the markers replaced by `block`."""
    start, end = text.find(BEGIN + "\n"), text.find(END + "\n")
    if start < 0 or end < start:
        raise SystemExit(f"{path}: markers {BEGIN!r} and {END!r} not found")
    return text[: start + len(BEGIN) + 1] + block.lstrip("\n") + text[end:]


def stale(write: bool) -> list[str]:
    """The modules whose verbs differ from the table's (rewritten if `write`)."""
    methods, registry = _import_table()
    out = []
    for rel, make in TARGETS.items():
        path = ROOT / rel
        text = path.read_text()
        new = replaced(text, make(methods, registry), rel)
        if new != text:
            out.append(rel)
            if write:
                path.write_text(new)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a module is out of date")
    args = parser.parse_args(argv)
    changed = stale(write=not args.check)
    for rel in changed:
        print(("out of date: " if args.check else "wrote ") + rel)
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
