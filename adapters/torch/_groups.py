"""Channel groups of a torch module, read from a ``torch.fx`` trace.

A *group* is a set of channels that must go together: the output channels of one or more
producers (``Conv*d``, ``ConvTranspose*d``, ``Linear``), everything that carries them
channel by channel (biases, norm scales, shifts and running statistics, a depthwise
convolution's filters, a parameter added to them) and the input columns of every
consumer. Element-wise operations, activations, pools and flattening after a global pool
carry a group on; a ``GroupNorm`` makes its groups of channels go whole; a grouped
convolution splits the channels it reads and those it writes into equal parts that each
lose as many channels (``groups`` stays; its weight's columns go block by block); a residual
``Add``/``Mul`` joins the groups of its operands into one (a
ResNet stage's trunk is one group); ``torch.cat`` along the channels lays several groups
side by side (each consumer's columns are members at an offset).

Why ``torch.fx`` and not ``torch.export``: ``symbolic_trace`` keeps every ``nn.Module``
call as one node naming the module object by its qualified name, which is what shrinking
slices (the same modules, the same state-dict keys); ``torch.export`` lowers modules to
ATen operators on lifted parameters, and mapping those back to modules and attributes
needs its metadata. ``symbolic_trace`` also needs no compilation (milliseconds for a
ResNet), and a module it cannot trace through (data-dependent control flow) is kept as
one leaf, whose channels are left with that reason. The example inputs give the shapes the rules
need: the graph runs once on PyTorch's ``meta`` device (shapes without values), or for
real where something needs values, without gradients and in evaluation mode (restored
after).

Every operation is looked up in two tables, :data:`MODULE_RULES` (module type, searched
along the type's MRO) and :data:`FUNCTION_RULES` (a function, or a method's name); an
operation with no row *leaves* the groups that reach it, with a one-line reason.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import fx, nn

from ._group_rules import FUNCTION_RULES, MODULE_RULES
from ._group_walk import Rule, Slot, TorchGroup, _Shapes, _Walk, _what

__all__ = ["Slot", "TorchGroup", "channel_groups", "MODULE_RULES", "FUNCTION_RULES"]


# ---------------------------------------------------------------------------------------
# tracing
# ---------------------------------------------------------------------------------------


class _Tracer(fx.Tracer):
    """``torch.fx``'s tracer; a module it cannot trace through, or one named a leaf, stays whole."""

    def __init__(self, leaves: tuple[Any, ...], tried: dict[int, bool] | None = None) -> None:
        super().__init__()
        self.leaves = leaves
        self.untraceable: dict[int, str] = {}
        self._tried: dict[int, bool] = {} if tried is None else tried  # shared with the trial tracers

    def named_leaf(self, m: nn.Module) -> bool:
        """Whether `m` is one of the modules or types the caller keeps whole."""
        return any(m is leaf or (isinstance(leaf, type) and isinstance(m, leaf)) for leaf in self.leaves)

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if self.named_leaf(m):
            return True
        if super().is_leaf_module(m, module_qualified_name):
            return True
        if isinstance(m, (nn.Sequential, nn.ModuleList, nn.ModuleDict)):
            return False
        if id(m) not in self._tried:
            try:
                _Tracer(self.leaves, self._tried).trace(m)
                self._tried[id(m)] = False
            except Exception as e:  # any failure of fx inside the module: keep it whole
                self._tried[id(m)] = True
                self.untraceable[id(m)] = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return self._tried[id(m)]


def _rule(node: fx.Node, module: nn.Module | None) -> Rule | None:
    if node.op == "call_module":
        for cls in type(module).__mro__:
            if cls in MODULE_RULES:
                return MODULE_RULES[cls]
        return None
    try:
        return FUNCTION_RULES.get(node.target)
    except TypeError:  # an unhashable target
        return None


def _as_tuple(example_inputs: Any) -> tuple[torch.Tensor, ...]:
    inputs = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else example_inputs
    if not isinstance(inputs, (tuple, list)) or not all(isinstance(t, torch.Tensor) for t in inputs):
        raise TypeError(
            f"example_inputs must be a tensor or a tuple of tensors, got {type(example_inputs).__name__}"
        )
    return tuple(inputs)


def trace(model: nn.Module, example_inputs: Any, leaf_modules: Iterable[Any] = ()) -> tuple[fx.GraphModule, _Tracer]:
    """The model's ``torch.fx`` graph, with the shapes of `example_inputs` on its nodes."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    inputs = _as_tuple(example_inputs)
    tracer = _Tracer(tuple(leaf_modules))
    try:
        graph = tracer.trace(model)
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        hint = (
            "; a transformers model shrinks by its own units with prune.shrink_llm(model, calibration, groups=...)"
            if callable(getattr(model, "save_pretrained", None)) and hasattr(model, "config")
            else ""
        )
        raise RuntimeError(f"torch.fx cannot trace {type(model).__name__}: {first}{hint}") from None
    gm = fx.GraphModule(model, graph)
    modes = {m: m.training for m in model.modules()}
    try:
        model.eval()
        with torch.no_grad():
            try:  # shapes without computing
                _Shapes(gm, meta=True).run(*[torch.empty_like(t, device="meta") for t in inputs])
            except Exception:  # something needs values: run it for real
                _Shapes(gm, meta=False).run(*inputs)
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise RuntimeError(f"{type(model).__name__} does not run on example_inputs: {first}") from None
    finally:
        for m, mode in modes.items():
            m.training = mode
    return gm, tracer


def channel_groups(model: nn.Module, example_inputs: Any, *, leaf_modules: Iterable[Any] = ()) -> list[TorchGroup]:
    """The channel groups of `model`, those that can shrink and those left with their reason.

    Parameters
    ----------
    model : torch.nn.Module
        The model; traced with ``torch.fx`` (see the module's docstring), not modified.
    example_inputs : tensor or tuple of tensors
        Inputs the model runs on once (without gradients, in evaluation mode), for shapes.
    leaf_modules : iterable of modules or module types, optional
        Modules kept whole: the channels reaching them are left. Modules ``torch.fx``
        cannot trace through are kept whole anyway.

    Returns
    -------
    list of TorchGroup
        In the order of their first producer in the graph.

    Raises
    ------
    TypeError
        If `model` is not a module or `example_inputs` not tensors.
    RuntimeError
        If ``torch.fx`` cannot trace the model or it does not run on the inputs.
    """
    gm, tracer = trace(model, example_inputs, leaf_modules)
    walk = _Walk(model, gm)
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "get_attr"):
            walk.layouts[node] = None
            continue
        if node.op == "output":
            for a in node.all_input_nodes:
                walk.lock_value(a, "they are an output of the model")
            continue
        module = walk.gm_modules.get(str(node.target)) if node.op == "call_module" else None
        named = module is not None and tracer.named_leaf(module)
        rule = None if named else _rule(node, module)
        if rule is None:
            if module is not None:
                cause = tracer.untraceable.get(id(module))
                how = f"torch.fx cannot trace into it ({cause})" if cause else "shrinking does not know this module"
                how = "it is one of leaf_modules" if named else how
                walk.refuse(node, f"they reach {node.target} ({type(module).__name__}): {how}")
                for key, t in module.named_parameters():
                    walk.opaque.setdefault(walk.names.get(id(t), f"{node.target}.{key}"), f"{node.target} uses it")
            else:
                walk.refuse(node, f"they reach {_what(node)}, which shrinking does not follow")
            walk.layouts[node] = None
            continue
        walk.layouts[node] = rule(walk, node)
    if walk.opaque:
        for s in walk.spaces:
            root = s.root()
            for slot in root.slots:
                if slot.param in walk.opaque:
                    walk.lock(root, f"{slot.param} is also read where it is not followed ({walk.opaque[slot.param]})")
    out: list[TorchGroup] = []
    seen: set[int] = set()
    for s in walk.spaces:
        root = s.root()
        if id(root) in seen or not root.slots:
            continue
        seen.add(id(root))
        slots = tuple(dict.fromkeys(root.slots))
        reason = root.reasons[0] if root.reasons else None
        if reason is None and not any(slot.weight for slot in slots):
            reason = "no layer weight holds them"
        out.append(TorchGroup(root.name, root.channels, slots, reason, root.block, root.segments))
    return out
