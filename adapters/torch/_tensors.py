"""Tensors in and out of the core, and direct writes to plain modules.

Shape checks with PyTorch's and arrayprune's error types, the core's ``compute_mask`` run
on detached aliases of module tensors, and the dictionary writes that stand in for
``register_parameter`` / ``register_buffer`` / ``setattr`` on modules whose attribute
protocol is nn.Module's own.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.modules.module as _torch_module


class _ShapeMismatchError(ValueError, AssertionError):
    """A tensor does not have the shape of the tensor it goes with.

    Both a :class:`ValueError` (what the arrayprune core raises) and an
    :class:`AssertionError` (what :mod:`torch.nn.utils.prune` raises).
    """


def _check_shape(t: torch.Tensor, other: Any, what: str) -> None:
    if tuple(other.shape) != tuple(t.shape):
        raise _ShapeMismatchError(
            f"{what} should have the same shape as the tensor to prune: "
            f"got {tuple(other.shape)}, expected {tuple(t.shape)}"
        )


def _check_scores(param: torch.Tensor, scores: Any, name: str) -> None:
    """Check that the importance scores of parameter `name` have its shape."""
    _check_shape(param, scores, f"importance_scores of parameter {name}")


def _scores_for(param: torch.Tensor, importance_scores: Any, name: str) -> Any:
    """The scores ranking the entries of parameter `name`: the given ones (checked), or the parameter."""
    if importance_scores is None:
        return param
    _check_scores(param, importance_scores, name)
    return importance_scores


# --------------------------------------------------------------------------------------
# Running the core on tensors
# --------------------------------------------------------------------------------------


def _detached(t: Any) -> Any:
    return t.detach() if isinstance(t, torch.Tensor) else t


def _run_core(core_method: Any, t: torch.Tensor, default_mask: torch.Tensor | None) -> torch.Tensor:
    """``core_method.compute_mask`` on detached aliases of the inputs (outside autograd).

    ``default_mask=None`` (first pruning with a built-in method) gives the core's
    boolean mask, spared a mask of ones and a multiplication. Tensors on the ``meta``
    device have a shape and no values: their mask is a ``meta`` tensor too, as PyTorch
    gives (shape-only tracing and deferred initialization keep working).
    """
    if t.is_meta or (default_mask is not None and default_mask.is_meta):
        dtype = torch.bool if default_mask is None else default_mask.dtype
        return torch.empty(t.shape, dtype=dtype, device="meta")
    return core_method.compute_mask(_detached(t), _detached(default_mask))


# --------------------------------------------------------------------------------------
# Direct writes to plain modules
# --------------------------------------------------------------------------------------
#
# ``register_parameter``, ``register_buffer`` and ``Module.__setattr__`` cost about 2 us
# each, mostly a ``hasattr`` that raises AttributeError through ``Module.__getattr__``:
# as much as the whole mask of a small tensor. On a module whose attribute protocol is
# nn.Module's own, and while no global registration hook is installed, the adapter makes
# the same checks directly and then writes the dictionaries, which is all those methods
# do once their checks pass. Any other module goes through the public methods.

_Module = torch.nn.Module
_Parameter = torch.nn.Parameter


def _plain_module(module: torch.nn.Module) -> bool:
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


def _free_name(module: torch.nn.Module, name: str) -> bool:
    """Whether `name` is no attribute of the plain `module` (``not hasattr(module, name)``).

    The class attributes are looked up in the dictionaries of the MRO, which is what
    ``object.__getattribute__`` does, without raising and catching an AttributeError.
    """
    d = module.__dict__
    if name in d or name in d["_parameters"] or name in d["_buffers"] or name in d["_modules"]:
        return False
    for cls in type(module).__mro__:
        if name in cls.__dict__:
            return False
    return True


_NUMPY_FLOATS = {torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16}


def _to_dtype(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`mask` (a fresh boolean mask of the core) in `dtype`.

    On the CPU NumPy converts a small boolean array in a third of the time of
    ``Tensor.to``, whose dispatch dominates below ~10^4 entries.
    """
    if mask.dtype == dtype:
        return mask
    np_dtype = _NUMPY_FLOATS.get(dtype)
    if np_dtype is not None and mask.is_cpu:
        return torch.from_numpy(mask.numpy().astype(np_dtype))
    return mask.to(dtype=dtype)
