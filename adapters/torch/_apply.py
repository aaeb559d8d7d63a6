"""Installing a method on ``module.<name>``: one path, restoring the module on any failure
(:func:`transaction`), and one fast path (the mask first, then direct writes)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.nn.utils import prune as _tprune

from ._base import BasePruningMethod, PruningContainer, core_mask, core_of
from ._tensors import detached, free_name, plain_module, scores_for, to_dtype

_DICTS = ("_parameters", "_buffers", "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs")


def _record(module: torch.nn.Module) -> list[tuple[Any, Any]]:
    """(object, contents) to put back in place: attributes, parameters, buffers, hooks (their
    handles stay valid), an RNN's ``_flat_weights``, the methods of pruning containers."""
    d = module.__dict__
    saved: list[tuple[Any, Any]] = [(d, dict(d)), *((d[k], dict(d[k])) for k in _DICTS if isinstance(d.get(k), dict))]
    for key, kind in (("_non_persistent_buffers_set", set), ("_flat_weights", list)):
        if isinstance(d.get(key), kind):
            saved.append((d[key], kind(d[key])))
    hooks = d.get("_forward_pre_hooks", {}).values()
    return saved + [(h, h.__dict__.get("_pruning_methods")) for h in hooks if isinstance(h, _tprune.PruningContainer)]


@contextmanager
def transaction(modules: Iterable[torch.nn.Module]) -> Iterator[None]:
    """Restore the given modules if the block raises."""
    saved = [_record(m) for m in {id(m): m for m in modules}.values()]
    try:
        yield
    except BaseException:
        for obj, contents in (pair for record in reversed(saved) for pair in record):
            if isinstance(obj, _tprune.PruningContainer):
                obj.__dict__.pop("_pruning_methods", None)
                if contents is not None:
                    obj._pruning_methods = contents
            elif isinstance(obj, list):
                obj[:] = contents
            else:  # a dict or a set, in place
                obj.clear()
                obj.update(contents)
        raise


def pruning_hooks(module: torch.nn.Module, name: str) -> list[tuple[Any, Any]]:
    hooks = module._forward_pre_hooks.items()
    return [(k, h) for k, h in hooks if isinstance(h, _tprune.BasePruningMethod) and h._tensor_name == name]


def fast_path(module: torch.nn.Module, name: str, method: Any) -> bool:
    """Whether an unpatched CoreMethod given no tensor (multiplied in as it is) prunes a
    parameter of a plain module for the first time, ``<name>_orig``/``_mask`` being free."""
    d = module.__dict__
    return (
        type(d.get("_parameters", {}).get(name)) is torch.nn.Parameter
        and core_of(method) is not None
        and not method._SHAPED
        and plain_module(module)
        and name not in d
        and free_name(module, name + "_orig", name + "_mask")
        and not pruning_hooks(module, name)
    )


def apply_method(module: torch.nn.Module, name: str, method: Any, scores: Any, precomputed: Any = None) -> Any:
    """Install `method` on ``module.<name>``; return the hook. `precomputed`: its known mask."""
    method._tensor_name = name
    if precomputed is None and fast_path(module, name, method):
        d = module.__dict__
        params = d["_parameters"]
        orig = params[name]
        mask = to_dtype(core_mask(method, scores_for(orig, scores, name), None), orig.dtype)
        params[name + "_orig"] = params.pop(name)
        d["_buffers"][name + "_mask"] = mask
        d["_non_persistent_buffers_set"].discard(name + "_mask")
        d[name] = mask * orig
        module.register_forward_pre_hook(method)
        method._remember(module)
        return method

    with transaction([module]):
        found = pruning_hooks(module, name)
        if len(found) > 1:
            msg = f"Avoid adding multiple pruning hooks to the same tensor {name} of module {module}."
            raise AssertionError(msg + " Use a PruningContainer.")
        for key, _ in found:
            del module._forward_pre_hooks[key]
        old = found[0][1] if found else None
        hook: Any = old
        if old is None:
            hook = method
        elif isinstance(old, PruningContainer):
            old.add_pruning_method(method)
        else:  # a lone method, or PyTorch's container: its methods move into one of ours
            hook = PruningContainer(*(old if isinstance(old, _tprune.PruningContainer) else [old]), method)
        orig = getattr(module, name)
        scores = scores_for(orig, scores, name)
        if old is None:
            module.register_parameter(name + "_orig", orig)
            del module._parameters[name]
        mask = precomputed
        if mask is None:
            old_mask = None if old is None else getattr(module, name + "_mask").detach()
            default_mask = torch.ones_like(orig) if old_mask is None else old_mask
            if old_mask is not None and core_of(hook[-1]) is None:  # foreign code may write into it
                default_mask = old_mask.clone(memory_format=torch.contiguous_format)
            with torch.no_grad():
                mask = hook.compute_mask(detached(scores), default_mask=default_mask)
            if isinstance(mask, torch.Tensor):
                mask = mask.detach() if mask.requires_grad else mask
                if old_mask is not None and _shares_memory(mask, old_mask):
                    mask = mask.clone(memory_format=torch.contiguous_format)
        module.register_buffer(name + "_mask", mask)
        setattr(module, name, hook.apply_mask(module))
        module.register_forward_pre_hook(hook)
    if isinstance(hook, BasePruningMethod):
        hook._remember(module)
    return hook


def _shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.device != b.device or a.numel() == 0 or b.numel() == 0:
        return False
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
