"""Tensor checks and conversions, and the checks of direct writes to plain modules (where
``register_parameter``, ``register_buffer``, ``setattr`` would do just that, at ~2 us each)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.modules.module as _torch_module

_Module = torch.nn.Module
_NUMPY_FLOATS = {torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16}


class ShapeMismatchError(ValueError, AssertionError):
    """A tensor lacks the pruned one's shape: a ValueError (the core's) and an AssertionError (PyTorch's)."""


def check_shape(t: torch.Tensor, other: Any, what: str) -> None:
    if tuple(other.shape) != tuple(t.shape):
        raise ShapeMismatchError(
            f"{what} should have the same shape as the tensor to prune: "
            f"got {tuple(other.shape)}, expected {tuple(t.shape)}"
        )


def scores_for(param: torch.Tensor, importance_scores: Any, name: str) -> Any:
    """The scores ranking parameter `name`: the given ones (checked), or the parameter."""
    if importance_scores is not None:
        check_shape(param, importance_scores, f"importance_scores of parameter {name}")
    return param if importance_scores is None else importance_scores


def detached(t: Any) -> Any:
    return t.detach() if isinstance(t, torch.Tensor) else t


def to_dtype(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A fresh boolean `mask` in `dtype` (through NumPy on the CPU: 3x faster when small)."""
    np_dtype = _NUMPY_FLOATS.get(dtype) if mask.dtype != dtype and mask.is_cpu else None
    if np_dtype is not None:
        return torch.from_numpy(mask.numpy().astype(np_dtype))
    return mask if mask.dtype == dtype else mask.to(dtype=dtype)


def masked(mask: torch.Tensor, orig: torch.Tensor) -> torch.Tensor:
    """A fresh ``mask * orig`` outside autograd, for a mask of `orig`'s dtype and shape.

    Contiguous CPU tensors of a NumPy float dtype multiply through NumPy: PyTorch's two
    threads, which wait on each other for whole time slices on a busy 2-core machine,
    took 2x to 10x longer for the tensors of a ResNet-18. The product is IEEE's either way.
    """
    plain = all(type(t) is torch.Tensor and t.is_cpu and t.is_contiguous() and not t.is_neg() for t in (mask, orig))
    if plain and mask.dtype == orig.dtype and mask.dtype in _NUMPY_FLOATS and mask.shape == orig.shape:
        out = torch.empty_like(orig)  # PyTorch's own (resizable) storage
        np.multiply(mask.numpy(), orig.numpy(), out=out.numpy())
        return out
    return mask * orig


def plain_module(module: torch.nn.Module) -> bool:
    """Whether writing `module`'s dictionaries is what its public methods would do."""
    cls = type(module)
    return (
        cls.__getattribute__ is object.__getattribute__
        and cls.__getattr__ is _Module.__getattr__
        and cls.__setattr__ is _Module.__setattr__
        and cls.__delattr__ is _Module.__delattr__
        and cls.register_parameter is _Module.register_parameter
        and cls.register_buffer is _Module.register_buffer
        and not getattr(_torch_module, "_global_parameter_registration_hooks", None)
        and not getattr(_torch_module, "_global_buffer_registration_hooks", None)
    )


def free_name(module: torch.nn.Module, *names: str) -> bool:
    """``not hasattr(module, name)`` for each name, on a plain module, without raising AttributeError."""
    d = module.__dict__
    for name in names:
        if name in d or name in d["_parameters"] or name in d["_buffers"] or name in d["_modules"]:
            return False
    for cls in type(module).__mro__:
        if not cls.__dict__.keys().isdisjoint(names):
            return False
    return True
