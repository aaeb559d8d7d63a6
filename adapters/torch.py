"""Drop-in replacement for :mod:`torch.nn.utils.prune`, with masks computed by arrayprune.

Replace ``import torch.nn.utils.prune as prune`` with
``import arrayprune.adapters.torch as prune``: every public name exists here with the
same signature and the same effect on modules, and every mask is computed by the
arrayprune core directly on the module's tensors, on their device (CPU tensors through
zero-copy NumPy views, CUDA tensors with tensor operations).

The reparametrization is PyTorch's, object for object: pruning ``module.<name>`` moves
the parameter (the same :class:`torch.nn.Parameter` object) to ``<name>_orig``, registers
the mask as the buffer ``<name>_mask`` (dtype of the parameter) and installs a forward
pre-hook that recomputes ``module.<name> = <name>_mask * <name>_orig`` before every
forward pass, so gradients reach ``<name>_orig`` and are zero where it is masked.
Pruning the same tensor again turns the hook into a :class:`PruningContainer` that holds
the methods in order; :func:`remove` makes the pruning permanent.

The classes derive from their counterparts in :mod:`torch.nn.utils.prune`, so code that
checks ``isinstance(hook, torch.nn.utils.prune.BasePruningMethod)`` (PyTorch's own
:func:`torch.nn.utils.prune.is_pruned` and :func:`torch.nn.utils.prune.remove` among
them) recognises modules pruned here, and the two libraries can prune the same tensor
one after the other.

Random methods. Without ``seed`` or ``generator``, :func:`random_unstructured`,
:func:`random_structured`, their classes (``apply``, ``compute_mask``, ``prune``,
inside a :class:`PruningContainer`) and :func:`global_unstructured` with
:class:`RandomUnstructured` reproduce PyTorch exactly: the same draws from PyTorch's
global generator (``torch.rand_like`` of the entries still in play, in the dtype and on
the device of the importance scores, or of their concatenation in global pruning;
``torch.rand(nchannels)`` on the CPU in the default dtype for the channels still in
play), selected with the same operations (``torch.topk``; ``torch.kthvalue`` and
``prob > threshold``), so the masks are PyTorch's bit for bit, ties in half precision
included, and the generator ends in the same state; nothing is drawn when nothing is
pruned, and invalid amounts or dims raise before any draw. Global pruning draws for the
remaining entries without concatenating the parameters. With a keyword-only ``seed`` or
``generator`` (not in PyTorch), arrayprune's own documented streams are used instead
(:mod:`arrayprune.rng`; ties by position), and PyTorch's global generator is not
touched; those masks differ from PyTorch's. With ``min_sparsity`` / ``max_sparsity``
(not in PyTorch), unseeded random global pruning draws arrayprune's stream (float32,
one array after another) from PyTorch's global generator.

Differences from PyTorch (everything not listed behaves as in PyTorch):

* a failure while pruning (in ``compute_mask`` or anywhere else) leaves the module exactly
  as it was: parameters, buffers, plain attributes, hooks and the hook's container
  (PyTorch drops the pruning hook of a container whose new method fails);
* pruned modules support :func:`copy.deepcopy` (PyTorch refuses with RuntimeError,
  because the pruned tensor ``module.<name>`` is not a leaf of the autograd graph);
* deterministic methods (L1, Ln) break ties by position (the lowest flat index or
  channel is pruned first), so the result is deterministic; PyTorch's choice among ties
  is that of ``torch.topk``. :func:`global_unstructured` with built-in methods never
  concatenates the parameters;
* non-contiguous tensors (transposed, channels-last) can be pruned by the unstructured
  methods; PyTorch raises RuntimeError (``view(-1)``). Random methods then draw as for a
  contiguous tensor, the numbers taken in row-major order;
* a ``bool`` amount counts as the integer 0 or 1 everywhere; PyTorch raises TypeError for
  ``amount=True`` in :func:`l1_unstructured`, :func:`random_unstructured`,
  :func:`random_structured` and :func:`global_unstructured` (after drawing, for the
  random methods);
* shape mismatches raise an exception that is both a :class:`ValueError` (as in the
  arrayprune core) and an :class:`AssertionError` (as in PyTorch);
* structured methods always refuse 1-D tensors (ValueError, before any draw); PyTorch's
  container, on a tensor pruned before, may instead raise IndexError or prune (and, for
  random_structured, draw for) a phantom dimension;
* ``n`` of :func:`ln_structured`: ``n=None`` raises ValueError (PyTorch: the 2-norm, as
  ``torch.norm(p=None)``); an unknown order (such as an unknown string) and ``n='nuc'``
  on a tensor that is not 3-D raise ValueError (PyTorch: RuntimeError); ``n='fro'`` over
  more than two dimensions is the 2-norm (PyTorch: RuntimeError);
* ``_validate_pruning_dim`` also rejects dims below ``-t.dim()`` (IndexError, as
  PyTorch's later indexing does);
* :func:`global_unstructured` accepts one-shot iterators and an empty list of
  parameters (PyTorch: ValueError from concatenating nothing), and leaves every module
  untouched if it fails part-way;
* :class:`PruningContainer` accepts several methods or one iterable of them, and ignores
  ``None`` (PyTorch: AttributeError for a lone iterable or ``None``).

A method object is its own forward pre-hook, as in PyTorch; masks are never tracked by
autograd (custom masks are stored detached).
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
import torch.nn.modules.module as _torch_module
from torch.nn.utils import prune as _tprune

import arrayprune.global_pruning as _global
import arrayprune.methods as _core
import arrayprune.patterns as _core_patterns
import arrayprune.schedules as _schedules
from arrayprune import amount as _amount
from arrayprune._masks import apply_keep as _apply_keep
from arrayprune._masks import check_same_shape as _check_same_shape
from arrayprune._masks import eligible as _eligible
from arrayprune.norms import channel_norms as _channel_norms
from arrayprune.rng import check_random_source as _check_random_source

__all__ = [
    "BasePruningMethod",
    "PruningContainer",
    "Identity",
    "RandomUnstructured",
    "L1Unstructured",
    "RandomStructured",
    "LnStructured",
    "CustomFromMask",
    "NMStructured",
    "BlockUnstructured",
    "identity",
    "random_unstructured",
    "l1_unstructured",
    "random_structured",
    "ln_structured",
    "global_unstructured",
    "custom_from_mask",
    "nm_structured",
    "block_unstructured",
    "prune_to_sparsity",
    "remove",
    "is_pruned",
]


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


def _native_core_method(method: Any) -> Any:
    """The core method equivalent to `method`, or None if `method` is not a built-in.

    A built-in method whose ``compute_mask`` was replaced (overridden in a subclass,
    patched on the class or set on the instance) is treated as foreign, so that the
    replacement is what gets called.
    """
    cls = type(method)
    if cls not in _CORE_BACKED_SET and not isinstance(method, _CORE_BACKED):
        return None  # (the set spares the abstract-base-class check in the common case)
    if "compute_mask" in vars(method) or getattr(cls, "compute_mask", None) not in _NATIVE_COMPUTE_MASKS:
        return None
    return method._core_method()


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


# --------------------------------------------------------------------------------------
# PyTorch's random streams: unseeded random methods
# --------------------------------------------------------------------------------------
#
# Without ``seed`` or ``generator``, RandomUnstructured and RandomStructured make exactly
# the calls torch.nn.utils.prune makes on the global generator, in the same order and
# with the same numbers, shapes, dtypes and devices, and select with the same torch
# operations (``torch.topk``, ``torch.kthvalue``), whose choice among tied draws is
# their own: masks are PyTorch's bit for bit and the generator ends in the same state.
# Every check that can fail runs before the draw, and nothing is drawn when nothing is
# pruned. With a seed or a generator the core's own streams apply (arrayprune.rng).
# This section is the only place where the adapter follows PyTorch's streams.


def _pytorch_random_keep(
    scores: list[torch.Tensor], eligible_masks: list[torch.Tensor | None], count: Any
) -> list[torch.Tensor]:
    """Keep masks of PyTorch's ``RandomUnstructured`` over one or several tensors.

    PyTorch scores the entries still in play, as one flat vector in row-major order
    (tensor after tensor in global pruning, whose concatenation has the promoted dtype),
    by ``torch.rand_like`` of that vector, and prunes the ``k`` largest draws
    (``torch.topk``). The same draw is made here from the count, dtype and device alone,
    and the positions chosen are scattered back tensor by tensor; the scores themselves
    are never concatenated.

    Parameters
    ----------
    scores : list of torch.Tensor
        Importance scores, all on one device (only shapes, dtypes and device matter).
    eligible_masks : list of (boolean torch.Tensor or None)
        Per tensor, the entries in play (``None``: all of them).
    count : callable
        ``count(available)``: the validated number of entries to prune.

    Returns
    -------
    list of torch.Tensor
        Boolean masks shaped like `scores`, False at the pruned entries (True outside
        the eligible entries).
    """
    sizes = [s.numel() if e is None else int(e.sum()) for s, e in zip(scores, eligible_masks, strict=False)]
    total = sum(sizes)
    k = count(total)  # validation errors come before any draw
    device = scores[0].device
    keeps = [torch.ones(s.shape, dtype=torch.bool, device=s.device) for s in scores]
    if k == 0:  # PyTorch draws nothing then (topk is never called)
        return keeps
    dtype = scores[0].dtype
    for s in scores[1:]:
        dtype = torch.promote_types(dtype, s.dtype)  # the dtype of torch.cat
    prob = torch.rand(total, dtype=dtype, device=device)  # == rand_like(<remaining entries>)
    dropped = torch.zeros(total, dtype=torch.bool, device=device)
    dropped[torch.topk(prob, k=k).indices] = True
    offset = 0
    for keep, e, n in zip(keeps, eligible_masks, sizes, strict=False):
        part = ~dropped[offset : offset + n].to(device=keep.device)
        if e is None:
            keep.view(-1).copy_(part)
        else:
            keep[e.to(device=keep.device)] = part  # row-major, as t[mask == 1]
        offset += n
    return keeps


def _pytorch_channel_keep(nchannels: int, k: int) -> torch.Tensor:
    """PyTorch's ``RandomStructured`` choice among `nchannels` channels, pruning `k` > 0.

    ``torch.rand(nchannels)`` (CPU, default dtype), then the channels whose draw exceeds
    the `k`-th smallest (``torch.kthvalue``) are kept: tied draws at the threshold are
    all pruned, as in PyTorch.
    """
    prob = torch.rand(nchannels)
    threshold = torch.kthvalue(prob, k=k).values
    return prob > threshold


class _PyTorchStreamRandomUnstructured(_core.RandomUnstructured):
    """The core's ``RandomUnstructured``, drawing and selecting as PyTorch does."""

    def __init__(self, amount: Any):
        super().__init__(amount)

    def _keep_masks(self, scores: list[Any], eligible_masks: list[Any]) -> list[Any]:
        return _pytorch_random_keep(list(scores), list(eligible_masks), self._count)


class _PyTorchStreamRandomStructured(_core.RandomStructured):
    """The core's ``RandomStructured``, drawing and selecting as PyTorch does."""

    def __init__(self, amount: Any, dim: int = -1):
        super().__init__(amount, dim)

    def compute_mask(self, t: Any, default_mask: Any) -> Any:
        """Prune ``amount`` of all channels of `t` (``RandomStructured.compute_mask``)."""
        if default_mask is None:
            default_mask = torch.ones(t.shape, dtype=torch.bool, device=t.device)
        _check_same_shape(t, default_mask, "default_mask")
        dim = self._checked_dim(t)
        return self._prune_channels(default_mask, dim, None)

    def _remaining_mask(self, t: Any, mask: Any) -> Any:
        """Prune ``amount`` of the remaining channels (a container's ``_combine_masks``)."""
        dim = self._checked_dim(t)
        return self._prune_channels(mask, dim, _core._remaining_channels(mask, dim))

    def _prune_channels(self, mask: torch.Tensor, dim: int, remaining: torch.Tensor | None) -> torch.Tensor:
        nchannels = mask.shape[dim] if remaining is None else int(remaining.sum())
        k = self._count(nchannels)
        if k == 0:
            return mask
        chosen = _pytorch_channel_keep(nchannels, k).to(device=mask.device)
        if remaining is None:
            keep = chosen
        else:
            keep = torch.ones(mask.shape[dim], dtype=torch.bool, device=mask.device)
            keep[remaining] = chosen
        return _core._channel_keep_to_mask(mask, keep, dim)


# --------------------------------------------------------------------------------------
# Module state, for all-or-nothing pruning
# --------------------------------------------------------------------------------------

_STATE_DICTS = ("_parameters", "_buffers", "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs")


class _ModuleState:
    """What pruning may change in a module, recorded so that it can be put back.

    Covers the plain attributes (``module.<name>``), the parameter, buffer and
    forward-pre-hook dictionaries (restored in place, keeping their order and identity,
    so hook handles stay valid), the non-persistent buffer names, an RNN's
    ``_flat_weights`` list, and the method tuples of pruning containers among the hooks.
    """

    def __init__(self, module: torch.nn.Module):
        self.module = module
        d = module.__dict__
        self.attrs = dict(d)
        self.dicts = [(d[k], list(d[k].items())) for k in _STATE_DICTS if isinstance(d.get(k), dict)]
        nonpersistent = d.get("_non_persistent_buffers_set")
        self.nonpersistent = (nonpersistent, set(nonpersistent)) if isinstance(nonpersistent, set) else None
        flat = d.get("_flat_weights")
        self.flat = (flat, list(flat)) if isinstance(flat, list) else None
        hooks = d.get("_forward_pre_hooks", {})
        self.containers = [
            (h, h.__dict__.get("_pruning_methods"))
            for h in hooks.values()
            if isinstance(h, _tprune.PruningContainer)
        ]

    def restore(self) -> None:
        d = self.module.__dict__
        for key in [k for k in d if k not in self.attrs]:
            del d[key]
        d.update(self.attrs)
        for obj, items in self.dicts:
            obj.clear()
            obj.update(items)
        if self.nonpersistent is not None:
            obj, items = self.nonpersistent
            obj.clear()
            obj.update(items)
        if self.flat is not None:
            obj, items = self.flat
            obj[:] = items
        for container, methods in self.containers:
            if methods is None:
                container.__dict__.pop("_pruning_methods", None)
            else:
                container._pruning_methods = methods


class _Transaction:
    """Context manager: restore the given modules if the block raises."""

    def __init__(self, modules: Iterable[torch.nn.Module]):
        unique = {id(m): m for m in modules}
        self.states = [_ModuleState(m) for m in unique.values()]

    def __enter__(self) -> _Transaction:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is not None:
            for state in reversed(self.states):
                state.restore()
        return False


# --------------------------------------------------------------------------------------
# Base class and container
# --------------------------------------------------------------------------------------


class BasePruningMethod(_tprune.BasePruningMethod):
    """Abstract base of pruning methods acting on tensors of PyTorch modules.

    A subclass of :class:`torch.nn.utils.prune.BasePruningMethod`. Subclasses set
    ``PRUNING_TYPE`` (``'unstructured'``, ``'structured'`` with a ``dim`` attribute, or
    ``'global'``) and implement :meth:`compute_mask`. An instance installed on a module
    is its forward pre-hook: calling it with ``(module, inputs)`` recomputes
    ``module.<name>`` from ``<name>_orig`` and ``<name>_mask``.

    Methods
    -------
    compute_mask(t, default_mask)
        The mask for importance scores `t` on top of `default_mask` (abstract).
    apply(module, name, *args, importance_scores=None, **kwargs)
        Prune ``module.<name>`` with a new instance (class method).
    apply_mask(module)
        The pruned tensor ``<name>_mask * <name>_orig``.
    prune(t, default_mask=None, importance_scores=None)
        `t` multiplied by its mask.
    remove(module)
        Make the pruning of ``module.<name>`` permanent.
    """

    _tensor_name: str | None = None

    def __call__(self, module: torch.nn.Module, inputs: Any) -> None:
        """Recompute ``module.<name>`` as ``<name>_mask * <name>_orig`` (the pre-hook).

        Parameters
        ----------
        module : torch.nn.Module
            The module the method is installed on.
        inputs : tuple
            The positional inputs of the forward call (unused).
        """
        self._remember(module)
        setattr(module, self._tensor_name, self.apply_mask(module))

    @classmethod
    def apply(
        cls,
        module: torch.nn.Module,
        name: str,
        *args: Any,
        importance_scores: torch.Tensor | None = None,
        **kwargs: Any,
    ):
        """Prune ``module.<name>`` with ``cls(*args, **kwargs)``, adding the reparametrization.

        On first pruning, the parameter moves to ``<name>_orig``, the mask becomes the
        buffer ``<name>_mask`` and the method is installed as a forward pre-hook. If the
        tensor is already pruned, the method joins the existing one(s) in a
        :class:`PruningContainer` and acts only on what is still unpruned. If anything
        fails, the module is left exactly as it was.

        Parameters
        ----------
        module : torch.nn.Module
            Module holding the tensor to prune.
        name : str
            Name of the parameter within `module`.
        *args, **kwargs
            Arguments of the pruning method's constructor.
        importance_scores : torch.Tensor, optional
            Scores of the shape of the parameter ranking its entries; the parameter
            itself (its current, pruned value) if omitted.

        Returns
        -------
        BasePruningMethod
            The forward pre-hook now installed: the new method, or the container holding
            it.

        Raises
        ------
        AssertionError
            If the tensor has more than one pruning hook.
        ValueError
            If `importance_scores` has another shape than the parameter (the error is an
            :class:`AssertionError` too), or the amount is invalid.
        TypeError
            If ``module.<name>`` is not a parameter.
        """
        return _apply(module, name, cls(*args, **kwargs), importance_scores)

    # -- bookkeeping ------------------------------------------------------------------

    def remove(self, module: torch.nn.Module) -> None:
        """Fold the mask into the original parameter and drop the reparametrization.

        ``<name>_orig`` (the same Parameter object) becomes ``module.<name>`` again, holding
        ``mask * orig``; ``<name>_orig`` and ``<name>_mask`` are removed. Pruning is not
        undone.

        Parameters
        ----------
        module : torch.nn.Module
            The module this method is installed on.
        """
        name = self._tensor_name
        params, buffers = module._parameters, module._buffers
        if name is None or name + "_orig" not in params or name + "_mask" not in buffers:
            super().remove(module)  # PyTorch's own checks and messages
            return
        orig = params[name + "_orig"]
        mask = buffers[name + "_mask"].detach()
        if mask.dtype != orig.dtype:
            mask = mask.to(dtype=orig.dtype)
        weight = mask * orig.detach()  # outside autograd
        module.__dict__.pop(name, None)
        orig.data = weight
        del params[name + "_orig"]
        del buffers[name + "_mask"]
        if _plain_module(module) and _free_name(module, name):
            params[name] = orig  # what Module.__setattr__ does, after its checks
        else:
            setattr(module, name, orig)  # e.g. RNNs, which refresh their flat weights

    def _remember(self, module: torch.nn.Module) -> None:
        """Keep a weak reference to the module this hook is installed on (for deepcopy)."""
        ref = self.__dict__.get("_module_ref")
        if ref is None or ref() is not module:
            self._module_ref = weakref.ref(module)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_module_ref", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __deepcopy__(self, memo: dict[int, Any]) -> BasePruningMethod:
        """Copy the method; when copied with its module, copy the pruned tensor too.

        ``module.<name>`` is ``<name>_mask * <name>_orig``, a tensor inside the autograd
        graph, which :func:`copy.deepcopy` refuses to copy. The hook is copied before
        that attribute (a module's hooks come first in its ``__dict__``), so it registers
        the copy in `memo`: the product of the copied mask and the copied parameter.
        """
        cls = type(self)
        new = cls.__new__(cls)
        memo[id(self)] = new
        ref = self.__dict__.get("_module_ref")
        module = ref() if ref is not None else None
        new_module = memo.get(id(module)) if module is not None else None
        if new_module is not None:
            _memoize_pruned_tensor(module, self._tensor_name, memo)
        new.__dict__.update(copy.deepcopy(self.__getstate__(), memo))
        if new_module is not None:
            new._module_ref = weakref.ref(new_module)
        return new

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={_short(v)}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({fields})"


def _short(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"<tensor {tuple(value.shape)} {str(value.dtype).replace('torch.', '')}>"
    return repr(value)


def _memoize_pruned_tensor(module: torch.nn.Module, name: str | None, memo: dict[int, Any]) -> None:
    if name is None:
        return
    current = module.__dict__.get(name)
    if not isinstance(current, torch.Tensor) or current.is_leaf or id(current) in memo:
        return
    orig = module._parameters.get(name + "_orig")
    mask = module._buffers.get(name + "_mask")
    if orig is None or mask is None:
        return
    new_orig = copy.deepcopy(orig, memo)
    new_mask = copy.deepcopy(mask, memo)
    with torch.set_grad_enabled(current.requires_grad):
        memo[id(current)] = new_mask.to(dtype=new_orig.dtype) * new_orig
    memo.setdefault(id(memo), []).append(current)  # keep the id taken while memo lives


class PruningContainer(BasePruningMethod, _tprune.PruningContainer):
    """Sequence of pruning methods applied one after the other to the same tensor.

    A subclass of :class:`torch.nn.utils.prune.PruningContainer`. It may hold any
    pruning method, including PyTorch's and user-written ones.

    Parameters
    ----------
    *args : BasePruningMethod
        Methods already applied, oldest first, or a single iterable of them. The
        container acts on the tensor of the first one (``_tensor_name``).

    Notes
    -----
    :meth:`compute_mask` applies only the newest method, on what the ``default_mask``
    (the mask of the earlier methods) leaves: its remaining entries for an
    ``'unstructured'`` method, its remaining channels for a ``'structured'`` one, all
    of it for a ``'global'`` one. Built-in methods do this with the core's fast paths;
    other methods get the remaining part gathered, as in PyTorch.
    """

    def __init__(self, *args: Any):
        self._pruning_methods: tuple[Any, ...] = ()
        if len(args) == 1 and not isinstance(args[0], _tprune.BasePruningMethod) and isinstance(args[0], Iterable):
            args = tuple(args[0])
        if args and isinstance(args[0], _tprune.BasePruningMethod):
            self._tensor_name = getattr(args[0], "_tensor_name", None)
        for method in args:
            self.add_pruning_method(method)

    def add_pruning_method(self, method: Any) -> None:
        """Append `method` to the container.

        Parameters
        ----------
        method : torch.nn.utils.prune.BasePruningMethod
            The method; ``None`` is ignored.

        Raises
        ------
        TypeError
            If `method` is not a pruning method.
        ValueError
            If `method` acts on another tensor than the container.
        """
        if method is None:
            return
        if not isinstance(method, _tprune.BasePruningMethod):
            raise TypeError(f"{type(method)} is not a BasePruningMethod subclass")
        if self._tensor_name != getattr(method, "_tensor_name", None):
            raise ValueError(
                f"Can only add pruning methods acting on the parameter named '{self._tensor_name}' "
                f"to PruningContainer {self}. Found '{getattr(method, '_tensor_name', None)}'"
            )
        self._pruning_methods += (method,)

    def __len__(self) -> int:
        return len(self._pruning_methods)

    def __iter__(self):
        return iter(self._pruning_methods)

    def __getitem__(self, idx: Any) -> Any:
        return self._pruning_methods[idx]

    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        """Apply the newest method to what `default_mask` leaves unpruned.

        Parameters
        ----------
        t : torch.Tensor
            Importance scores.
        default_mask : torch.Tensor
            Mask of the earlier methods, same shape; not modified.

        Returns
        -------
        torch.Tensor
            The combined mask, of the dtype of `t` (as in PyTorch).

        Raises
        ------
        IndexError
            If the container is empty, or a structured method's ``dim`` is out of range.
        ValueError
            If the method's ``PRUNING_TYPE`` is unknown.
        AttributeError
            If a structured method has no ``dim``.
        """
        if not self._pruning_methods:
            raise IndexError("PruningContainer holds no pruning method")
        method = self._pruning_methods[-1]
        with torch.no_grad():
            mask = _detached(default_mask).to(dtype=t.dtype)
            scores = _detached(t)
            core_method = _native_core_method(method)
            if isinstance(core_method, _core.Identity):
                return mask
            if isinstance(core_method, _core.CustomFromMask):
                return method.compute_mask(scores, mask)  # 'global': sees everything
            return _core.combine_masks(method if core_method is None else core_method, scores, mask)

    def __repr__(self) -> str:
        return f"PruningContainer{self._pruning_methods!r}"


# --------------------------------------------------------------------------------------
# Built-in methods
# --------------------------------------------------------------------------------------


class Identity(BasePruningMethod, _tprune.Identity):
    """A method that prunes nothing: the mask is the default mask (ones at first)."""

    PRUNING_TYPE = "unstructured"

    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        """Return `default_mask` itself."""
        return default_mask

    def _core_method(self) -> Any:
        return _core.Identity()

    @classmethod
    def apply(cls, module: torch.nn.Module, name: str):  # type: ignore[override]
        """Add the pruning reparametrization to ``module.<name>`` without pruning anything.

        Parameters
        ----------
        module : torch.nn.Module
            Module holding the tensor.
        name : str
            Name of the parameter within `module`.

        Returns
        -------
        BasePruningMethod
            The forward pre-hook installed.
        """
        return super().apply(module, name)


class RandomUnstructured(BasePruningMethod, _tprune.RandomUnstructured):
    """Prune (currently unpruned) entries chosen uniformly at random.

    Parameters
    ----------
    amount : int or float
        Fraction in ``[0, 1]`` of the entries to prune, or their number.
    seed : int, optional
        Seed of a fresh generator on the tensor's device, for reproducible masks.
    generator : torch.Generator, optional
        Generator to draw from. With neither `seed` nor `generator`, the draws and the
        mask are exactly PyTorch's (``torch.rand_like`` of the entries in play on the
        global generator, ``torch.topk``), so ``torch.manual_seed`` gives PyTorch's mask.

    Raises
    ------
    TypeError
        If `amount` is not a number, or both `seed` and `generator` are given.
    ValueError
        If `amount` is a float outside ``[0, 1]`` or a negative integer.
    """

    PRUNING_TYPE = "unstructured"

    def __init__(self, amount: int | float, *, seed: int | None = None, generator: torch.Generator | None = None):
        _amount.validate_pruning_amount_init(amount)
        _check_random_source(seed, generator)
        self.amount = amount
        self.seed = seed
        self.generator = generator

    def _core_method(self) -> Any:
        if self.seed is None and self.generator is None:
            return _PyTorchStreamRandomUnstructured(self.amount)
        return _core.RandomUnstructured(self.amount, seed=self.seed, generator=self.generator)

    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        """Return `default_mask` with ``amount`` of all entries of `t` zeroed at random.

        Parameters
        ----------
        t : torch.Tensor
            Tensor to prune (only its shape and device matter).
        default_mask : torch.Tensor
            Mask of earlier pruning, same shape; not modified.

        Returns
        -------
        torch.Tensor
            New mask of the dtype of `default_mask`.
        """
        return _run_core(self._core_method(), t, default_mask)

    @classmethod
    def apply(
        cls,
        module: torch.nn.Module,
        name: str,
        amount: int | float,
        *,
        seed: int | None = None,
        generator: torch.Generator | None = None,
    ):  # type: ignore[override]
        """Prune ``amount`` of the remaining entries of ``module.<name>`` at random.

        Parameters
        ----------
        module : torch.nn.Module
            Module holding the tensor.
        name : str
            Name of the parameter within `module`.
        amount : int or float
            Fraction in ``[0, 1]`` of the remaining entries, or their number.
        seed : int, optional
            Seed for reproducible masks.
        generator : torch.Generator, optional
            Generator to draw from.

        Returns
        -------
        BasePruningMethod
            The forward pre-hook installed.
        """
        return super().apply(module, name, amount=amount, seed=seed, generator=generator)


class L1Unstructured(BasePruningMethod, _tprune.L1Unstructured):
    """Prune the (currently unpruned) entries of smallest absolute value.

    Parameters
    ----------
    amount : int or float
        Fraction in ``[0, 1]`` of the entries to prune, or their number.

    Raises
    ------
    TypeError
        If `amount` is not a number.
    ValueError
        If `amount` is a float outside ``[0, 1]`` or a negative integer.

    Notes
    -----
    Among entries of equal magnitude, the lowest flat index is pruned first.
    """

    PRUNING_TYPE = "unstructured"

    def __init__(self, amount: int | float):
        _amount.validate_pruning_amount_init(amount)
        self.amount = amount

    def _core_method(self) -> Any:
        return _core.L1Unstructured(self.amount)

    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        """Return `default_mask` with the ``amount`` entries of smallest ``|t|`` zeroed.

        All entries of `t` are ranked (inside a :class:`PruningContainer`, only those
        still unpruned are).

        Parameters
        ----------
        t : torch.Tensor
            Importance scores.
        default_mask : torch.Tensor
            Mask of earlier pruning, same shape; not modified.

        Returns
        -------
        torch.Tensor
            New mask of the dtype of `default_mask`.

        Raises
        ------
        ValueError
            If an integer amount exceeds the number of entries.
        """
        return _run_core(self._core_method(), t, default_mask)

    @classmethod
    def apply(
        cls, module: torch.nn.Module, name: str, amount: int | float, importance_scores: torch.Tensor | None = None
    ):  # type: ignore[override]
        """Prune ``amount`` of the remaining entries of ``module.<name>`` of smallest magnitude.

        Parameters
        ----------
        module : torch.nn.Module
            Module holding the tensor.
        name : str
            Name of the parameter within `module`.
        amount : int or float
            Fraction in ``[0, 1]`` of the remaining entries, or their number.
        importance_scores : torch.Tensor, optional
            Scores ranking the entries instead of the parameter, same shape.

        Returns
        -------
        BasePruningMethod
            The forward pre-hook installed.
        """
        return super().apply(module, name, amount=amount, importance_scores=importance_scores)


def _structured_result(
    mask: torch.Tensor, given: torch.Tensor, default_mask: torch.Tensor, t: torch.Tensor
) -> torch.Tensor:
    """PyTorch's structured masks: `default_mask` itself if nothing was pruned, else `t`'s dtype."""
    if mask is given:
        return default_mask
    return mask if mask.dtype == t.dtype else mask.to(dtype=t.dtype)


class RandomStructured(BasePruningMethod, _tprune.RandomStructured):
    """Prune whole (currently unpruned) channels chosen uniformly at random.

    Parameters
    ----------
    amount : int or float
        Fraction in ``[0, 1]`` of the channels to prune, or their number.
    dim : int, default -1
        Dimension along which channels are defined.
    seed : int, optional
        Seed of a fresh generator on the tensor's device, for reproducible masks.
    generator : torch.Generator, optional
        Generator to draw from. With neither `seed` nor `generator`, the draws and the
        mask are exactly PyTorch's (``torch.rand(nchannels)`` on the global generator,
        ``torch.kthvalue``), so ``torch.manual_seed`` gives PyTorch's mask.

    Raises
    ------
    TypeError
        If `amount` is not a number, or both `seed` and `generator` are given.
    ValueError
        If `amount` is a float outside ``[0, 1]`` or a negative integer.
    """

    PRUNING_TYPE = "structured"

    def __init__(
        self, amount: int | float, dim: int = -1, *, seed: int | None = None, generator: torch.Generator | None = None
    ):
        _amount.validate_pruning_amount_init(amount)
        _check_random_source(seed, generator)
        self.amount = amount
        self.dim = dim
        self.seed = seed
        self.generator = generator

    def _core_method(self) -> Any:
        if self.seed is None and self.generator is None:
            return _PyTorchStreamRandomStructured(self.amount, self.dim)
        return _core.RandomStructured(self.amount, self.dim, seed=self.seed, generator=self.generator)

    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        """Return `default_mask` with ``amount`` of the channels of `t` zeroed at random.

        Parameters
        ----------
        t : torch.Tensor
            Tensor to prune, at least 2-D.
        default_mask : torch.Tensor
            Mask of earlier pruning, same shape; not modified.

        Returns
        -------
        torch.Tensor
            `default_mask` itself if nothing is pruned, else a new mask of the dtype of
            `t` (as in PyTorch).

        Raises
        ------
        ValueError
            If `t` has fewer than two dimensions, or an integer amount exceeds the
            number of channels.
        IndexError
            If ``dim`` is out of range.
        """
        given = _detached(default_mask)
        with torch.no_grad():
            mask = self._core_method().compute_mask(_detached(t), given)
        return _structured_result(mask, given, default_mask, t)

    @classmethod
    def apply(
        cls,
        module: torch.nn.Module,
        name: str,
        amount: int | float,
        dim: int = -1,
        *,
        seed: int | None = None,
        generator: torch.Generator | None = None,
    ):  # type: ignore[override]
        """Prune ``amount`` of the remaining channels of ``module.<name>`` at random.

        Parameters
        ----------
        module : torch.nn.Module
            Module holding the tensor.
        name : str
            Name of the parameter within `module`.
        amount : int or float
            Fraction in ``[0, 1]`` of the remaining channels, or their number.
        dim : int, default -1
            Dimension along which channels are defined.
        seed : int, optional
            Seed for reproducible masks.
        generator : torch.Generator, optional
            Generator to draw from.

        Returns
        -------
        BasePruningMethod
            The forward pre-hook installed.
        """
        return super().apply(module, name, amount=amount, dim=dim, seed=seed, generator=generator)


class LnStructured(BasePruningMethod, _tprune.LnStructured):
    """Prune whole (currently unpruned) channels of smallest L\\ ``n`` norm.

    Parameters
    ----------
    amount : int or float
        Fraction in ``[0, 1]`` of the channels to prune, or their number.
    n : int, float, inf, -inf, 'fro' or 'nuc'
        Order of the norm, as ``p`` in :func:`torch.norm`.
    dim : int, default -1
        Dimension along which channels are defined.

    Raises
    ------
    TypeError
        If `amount` is not a number.
    ValueError
        If `amount` is a float outside ``[0, 1]`` or a negative integer.

    Notes
    -----
    Among channels of equal norm, the lowest index is pruned first.
    """

    PRUNING_TYPE = "structured"

    def __init__(self, amount: int | float, n: Any, dim: int = -1):
        _amount.validate_pruning_amount_init(amount)
        self.amount = amount
        self.n = n
        self.dim = dim

    def _core_method(self) -> Any:
        return _core.LnStructured(self.amount, self.n, self.dim)

    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        """Return `default_mask` with the ``amount`` channels of smallest norm zeroed.

        Parameters
        ----------
        t : torch.Tensor
            Importance scores, at least 2-D.
        default_mask : torch.Tensor
            Mask of earlier pruning, same shape; not modified.

        Returns
        -------
        torch.Tensor
            `default_mask` itself if nothing is pruned, else a new mask of the dtype of
            `t` (as in PyTorch).

        Raises
        ------
        ValueError
            If `t` has fewer than two dimensions, `n` is not a valid order, or an integer
            amount exceeds the number of channels.
        IndexError
            If ``dim`` is out of range.
        """
        given = _detached(default_mask)
        with torch.no_grad():
            mask = self._core_method().compute_mask(_detached(t), given)
        return _structured_result(mask, given, default_mask, t)

    @classmethod
    def apply(
        cls,
        module: torch.nn.Module,
        name: str,
        amount: int | float,
        n: Any,
        dim: int,
        importance_scores: torch.Tensor | None = None,
    ):  # type: ignore[override]
        """Prune ``amount`` of the remaining channels of ``module.<name>`` of smallest norm.

        Parameters
        ----------
        module : torch.nn.Module
            Module holding the tensor.
        name : str
            Name of the parameter within `module`.
        amount : int or float
            Fraction in ``[0, 1]`` of the remaining channels, or their number.
        n : int, float, inf, -inf, 'fro' or 'nuc'
            Order of the norm, as ``p`` in :func:`torch.norm`.
        dim : int
            Dimension along which channels are defined.
        importance_scores : torch.Tensor, optional
            Scores to take norms of instead of the parameter, same shape.

        Returns
        -------
        BasePruningMethod
            The forward pre-hook installed.
        """
        return super().apply(module, name, amount=amount, n=n, dim=dim, importance_scores=importance_scores)


class CustomFromMask(BasePruningMethod, _tprune.CustomFromMask):
    """Prune with a precomputed mask, multiplied into the default mask.

    Parameters
    ----------
    mask : torch.Tensor or array_like
        The mask; non-zero entries are kept. It is stored detached from autograd.
    """

    PRUNING_TYPE = "global"

    def __init__(self, mask: Any):
        mask = torch.as_tensor(mask)
        self.mask = mask.detach() if mask.requires_grad else mask

    def _core_method(self) -> Any:
        return _core.CustomFromMask(self.mask)

    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        """Return ``default_mask * mask``, in the dtype of `default_mask`.

        Parameters
        ----------
        t : torch.Tensor
            Tensor to prune (unused).
        default_mask : torch.Tensor
            Mask of earlier pruning; not modified.

        Returns
        -------
        torch.Tensor
            The new mask.

        Raises
        ------
        ValueError
            If the stored mask has another shape than `default_mask` (the error is an
            :class:`AssertionError` too).
        """
        _check_shape(default_mask, self.mask, "mask")
        custom = self.mask.to(device=default_mask.device)
        return _run_core(_core.CustomFromMask(custom), t, default_mask)

    @classmethod
    def apply(cls, module: torch.nn.Module, name: str, mask: Any):  # type: ignore[override]
        """Prune ``module.<name>`` with the precomputed `mask`.

        Parameters
        ----------
        module : torch.nn.Module
            Module holding the tensor.
        name : str
            Name of the parameter within `module`.
        mask : torch.Tensor
            Mask of the shape of the parameter; non-zero entries are kept.

        Returns
        -------
        BasePruningMethod
            The forward pre-hook installed.
        """
        return super().apply(module, name, mask=mask)


class NMStructured(BasePruningMethod):
    """Prune `n` of every `m` consecutive entries along `dim` (2:4 by default).

    Not in :mod:`torch.nn.utils.prune`. Entries already pruned count first, so every group
    ends with at most ``m - n`` non-zeros; see :class:`arrayprune.NMStructured`.

    Parameters
    ----------
    n, m : int
        The pattern: `n` zeros in every group of `m`.
    dim : int, default -1
        Axis along which groups run (-1: the input features of a Linear weight).
    """

    PRUNING_TYPE = "global"

    def __init__(self, n: int = 2, m: int = 4, dim: int = -1):
        core = _core_patterns.NMStructured(n, m, dim)  # validates the pattern
        self.n, self.m, self.dim = core.n, core.m, dim

    def _core_method(self) -> Any:
        return _core_patterns.NMStructured(self.n, self.m, self.dim)

    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        """Return `default_mask` with the pattern imposed (dtype of `default_mask`)."""
        return _run_core(self._core_method(), t, default_mask)

    @classmethod
    def apply(
        cls,
        module: torch.nn.Module,
        name: str,
        n: int = 2,
        m: int = 4,
        dim: int = -1,
        importance_scores: torch.Tensor | None = None,
    ):  # type: ignore[override]
        """Impose `n`:`m` sparsity on ``module.<name>``; returns the installed hook."""
        return super().apply(module, name, n=n, m=m, dim=dim, importance_scores=importance_scores)


class BlockUnstructured(BasePruningMethod):
    """Prune whole blocks of `block_shape`, those of smallest power-mean magnitude first.

    Not in :mod:`torch.nn.utils.prune`. Blocks align to the trailing dimensions; blocks
    already entirely pruned are not counted; see :class:`arrayprune.BlockUnstructured`.

    Parameters
    ----------
    amount : int or float
        Fraction in ``[0, 1]`` of the remaining blocks, or their number.
    block_shape : tuple of int
        Shape of a block, e.g. ``(1, 4)`` or ``(4, 4)``.
    n : float, default 1
        Order of the power mean scoring a block.
    """

    PRUNING_TYPE = "global"

    def __init__(self, amount: int | float, block_shape: tuple[int, ...], n: float = 1):
        core = _core_patterns.BlockUnstructured(amount, block_shape, n)
        self.amount, self.block_shape, self.n = amount, core.block_shape, n

    def _core_method(self) -> Any:
        return _core_patterns.BlockUnstructured(self.amount, self.block_shape, self.n)

    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        """Return `default_mask` with ``amount`` of the remaining blocks zeroed."""
        return _run_core(self._core_method(), t, default_mask)

    @classmethod
    def apply(
        cls,
        module: torch.nn.Module,
        name: str,
        amount: int | float,
        block_shape: tuple[int, ...],
        n: float = 1,
        importance_scores: torch.Tensor | None = None,
    ):  # type: ignore[override]
        """Prune ``amount`` of the blocks of ``module.<name>``; returns the installed hook."""
        return super().apply(
            module, name, amount=amount, block_shape=block_shape, n=n, importance_scores=importance_scores
        )


_CORE_BACKED = (
    Identity,
    RandomUnstructured,
    L1Unstructured,
    RandomStructured,
    LnStructured,
    CustomFromMask,
    NMStructured,
    BlockUnstructured,
)
_CORE_BACKED_SET = frozenset(_CORE_BACKED)
_NATIVE_COMPUTE_MASKS = frozenset(cls.__dict__["compute_mask"] for cls in _CORE_BACKED)


# --------------------------------------------------------------------------------------
# Applying a method to a module
# --------------------------------------------------------------------------------------


def _pruning_hooks(module: torch.nn.Module, name: str) -> list[tuple[Any, Any]]:
    return [
        (key, hook)
        for key, hook in module._forward_pre_hooks.items()
        if isinstance(hook, _tprune.BasePruningMethod) and getattr(hook, "_tensor_name", None) == name
    ]


def _shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.device != b.device or a.numel() == 0 or b.numel() == 0:
        return False
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _apply(
    module: torch.nn.Module,
    name: str,
    method: Any,
    importance_scores: torch.Tensor | None,
    precomputed: torch.Tensor | None = None,
) -> Any:
    """Install `method` on ``module.<name>``, all or nothing (see BasePruningMethod.apply).

    `precomputed` is the mask the hook would compute, already known (global pruning
    computes every mask at once, existing masks included): it becomes the buffer as it
    is, sparing the ones mask and the multiplication.
    """
    method._tensor_name = name
    if precomputed is None:
        hook = _apply_fresh(module, name, method, importance_scores)
        if hook is not None:
            return hook
    with _Transaction([module]):
        found = _pruning_hooks(module, name)
        if len(found) > 1:
            raise AssertionError(
                f"Avoid adding multiple pruning hooks to the same tensor {name} of module {module}. "
                "Use a PruningContainer."
            )
        for key, _ in found:
            del module._forward_pre_hooks[key]
        old = found[0][1] if found else None

        if old is None:
            hook = method
        elif isinstance(old, PruningContainer):
            old.add_pruning_method(method)
            hook = old
        elif isinstance(old, _tprune.PruningContainer):
            # PyTorch's container: carry its methods over into one of ours.
            hook = PruningContainer(*old._pruning_methods, method)
            hook._tensor_name = name
        else:
            hook = PruningContainer(old)
            hook.add_pruning_method(method)

        orig = getattr(module, name)
        core = None
        if importance_scores is not None:
            _check_shape(orig, importance_scores, f"importance_scores of parameter {name}")
        else:
            importance_scores = orig

        if old is None:
            module.register_parameter(name + "_orig", orig)
            del module._parameters[name]
            fresh = precomputed is None and isinstance(orig, torch.Tensor)
            core = _native_core_method(hook) if fresh else None
            if isinstance(core, (_core._Unstructured, _core._Structured)):
                # A built-in, unpatched method on a fresh tensor: the core's boolean mask
                # is the whole answer, in the parameter's dtype as PyTorch has it.
                precomputed = _to_dtype(_run_core(core, importance_scores, None), orig.dtype)
            default_mask = torch.ones_like(orig) if precomputed is None else None
        elif precomputed is not None:
            old_mask = default_mask = None
        else:
            old_mask = getattr(module, name + "_mask").detach()
            if _native_core_method(hook[-1]) is None:
                # Foreign code may write into its default mask: give it a copy.
                default_mask = old_mask.clone(memory_format=torch.contiguous_format)
            else:
                default_mask = old_mask  # the core never writes into a default mask

        if precomputed is not None:
            mask = precomputed
        else:
            with torch.no_grad():
                mask = hook.compute_mask(_detached(importance_scores), default_mask=default_mask)
        if isinstance(mask, torch.Tensor) and precomputed is None:
            if mask.requires_grad:
                mask = mask.detach()
            if old is not None and _shares_memory(mask, old_mask):
                mask = mask.clone(memory_format=torch.contiguous_format)
        module.register_buffer(name + "_mask", mask)
        if core is not None and type(hook).apply_mask is _tprune.BasePruningMethod.apply_mask:
            pruned = mask * orig  # what apply_mask computes, without looking both up again
        else:
            pruned = hook.apply_mask(module)
        setattr(module, name, pruned)
        module.register_forward_pre_hook(hook)
    if isinstance(hook, BasePruningMethod):
        hook._remember(module)
    return hook


def _apply_fresh(module: torch.nn.Module, name: str, method: Any, importance_scores: torch.Tensor | None) -> Any:
    """`_apply` for the common case, or None where it does not apply.

    The common case: a built-in, unpatched method pruning a parameter for the first
    time, on a plain module (see `_plain_module`) where ``<name>_orig`` and
    ``<name>_mask`` are free. Everything that can fail (the checks, the mask) happens
    before the module is touched, so no rollback is needed; the writes that follow are
    those of ``register_parameter``, ``register_buffer`` and ``setattr`` after their
    checks, in the same order, so the state dict is ordered as PyTorch orders it.
    """
    d = module.__dict__
    params = d.get("_parameters")
    orig = params.get(name) if isinstance(params, dict) else None
    if type(orig) is not _Parameter or not _plain_module(module):
        return None
    core = _native_core_method(method)
    if not isinstance(core, (_core._Unstructured, _core._Structured)):
        return None
    orig_name, mask_name = name + "_orig", name + "_mask"
    if name in d or not (_free_name(module, orig_name) and _free_name(module, mask_name)):
        return None
    if _pruning_hooks(module, name):
        return None
    if importance_scores is None:
        importance_scores = orig
    else:
        _check_shape(orig, importance_scores, f"importance_scores of parameter {name}")
    mask = _to_dtype(_run_core(core, importance_scores, None), orig.dtype)

    params[orig_name] = orig
    del params[name]
    d["_buffers"][mask_name] = mask
    d["_non_persistent_buffers_set"].discard(mask_name)
    d[name] = mask * orig
    module.register_forward_pre_hook(method)
    method._remember(module)
    return method


# --------------------------------------------------------------------------------------
# Functional interface
# --------------------------------------------------------------------------------------


def identity(module: torch.nn.Module, name: str) -> torch.nn.Module:
    """Add the pruning reparametrization to ``module.<name>`` without pruning anything.

    The mask ``<name>_mask`` is all ones.

    Parameters
    ----------
    module : torch.nn.Module
        Module holding the tensor.
    name : str
        Name of the parameter within `module`.

    Returns
    -------
    torch.nn.Module
        `module`, modified in place.

    Examples
    --------
    >>> import torch.nn as nn
    >>> import arrayprune.adapters.torch as prune
    >>> prune.identity(nn.Linear(2, 3), "bias").bias_mask
    tensor([1., 1., 1.])
    """
    Identity.apply(module, name)
    return module


def random_unstructured(
    module: torch.nn.Module,
    name: str,
    amount: int | float,
    *,
    seed: int | None = None,
    generator: torch.Generator | None = None,
) -> torch.nn.Module:
    """Prune ``amount`` of the (currently unpruned) entries of ``module.<name>`` at random.

    Parameters
    ----------
    module : torch.nn.Module
        Module holding the tensor.
    name : str
        Name of the parameter within `module`.
    amount : int or float
        Fraction in ``[0, 1]`` of the remaining entries, or their number.
    seed : int, optional
        Seed for a reproducible mask (not in PyTorch).
    generator : torch.Generator, optional
        Generator to draw from (not in PyTorch). With neither, PyTorch's own draws and mask.

    Returns
    -------
    torch.nn.Module
        `module`, modified in place.

    Examples
    --------
    >>> import torch, torch.nn as nn
    >>> import arrayprune.adapters.torch as prune
    >>> m = prune.random_unstructured(nn.Linear(2, 3), "weight", amount=1)
    >>> int(torch.sum(m.weight_mask == 0))
    1
    """
    RandomUnstructured.apply(module, name, amount, seed=seed, generator=generator)
    return module


def l1_unstructured(
    module: torch.nn.Module,
    name: str,
    amount: int | float,
    importance_scores: torch.Tensor | None = None,
) -> torch.nn.Module:
    """Prune ``amount`` of the (currently unpruned) entries of smallest magnitude.

    Parameters
    ----------
    module : torch.nn.Module
        Module holding the tensor.
    name : str
        Name of the parameter within `module`.
    amount : int or float
        Fraction in ``[0, 1]`` of the remaining entries, or their number.
    importance_scores : torch.Tensor, optional
        Scores ranking the entries instead of the parameter, same shape.

    Returns
    -------
    torch.nn.Module
        `module`, modified in place.

    Examples
    --------
    >>> import torch.nn as nn
    >>> import arrayprune.adapters.torch as prune
    >>> m = prune.l1_unstructured(nn.Linear(2, 3), "weight", amount=0.2)
    >>> sorted(m.state_dict())
    ['bias', 'weight_mask', 'weight_orig']
    """
    L1Unstructured.apply(module, name, amount=amount, importance_scores=importance_scores)
    return module


def random_structured(
    module: torch.nn.Module,
    name: str,
    amount: int | float,
    dim: int,
    *,
    seed: int | None = None,
    generator: torch.Generator | None = None,
) -> torch.nn.Module:
    """Prune ``amount`` of the (currently unpruned) channels along `dim` at random.

    Parameters
    ----------
    module : torch.nn.Module
        Module holding the tensor.
    name : str
        Name of the parameter within `module`.
    amount : int or float
        Fraction in ``[0, 1]`` of the remaining channels, or their number.
    dim : int
        Dimension along which channels are defined.
    seed : int, optional
        Seed for a reproducible mask (not in PyTorch).
    generator : torch.Generator, optional
        Generator to draw from (not in PyTorch). With neither, PyTorch's own draws and mask.

    Returns
    -------
    torch.nn.Module
        `module`, modified in place.

    Examples
    --------
    >>> import torch, torch.nn as nn
    >>> import arrayprune.adapters.torch as prune
    >>> m = prune.random_structured(nn.Linear(5, 3), "weight", amount=3, dim=1)
    >>> int(torch.sum(m.weight_mask.sum(dim=0) == 0))
    3
    """
    RandomStructured.apply(module, name, amount, dim, seed=seed, generator=generator)
    return module


def ln_structured(
    module: torch.nn.Module,
    name: str,
    amount: int | float,
    n: Any,
    dim: int,
    importance_scores: torch.Tensor | None = None,
) -> torch.nn.Module:
    """Prune ``amount`` of the (currently unpruned) channels of smallest L\\ `n` norm.

    Parameters
    ----------
    module : torch.nn.Module
        Module holding the tensor.
    name : str
        Name of the parameter within `module`.
    amount : int or float
        Fraction in ``[0, 1]`` of the remaining channels, or their number.
    n : int, float, inf, -inf, 'fro' or 'nuc'
        Order of the norm, as ``p`` in :func:`torch.norm`.
    dim : int
        Dimension along which channels are defined.
    importance_scores : torch.Tensor, optional
        Scores to take norms of instead of the parameter, same shape.

    Returns
    -------
    torch.nn.Module
        `module`, modified in place.

    Examples
    --------
    >>> import torch.nn as nn
    >>> import arrayprune.adapters.torch as prune
    >>> m = prune.ln_structured(nn.Conv2d(5, 3, 2), "weight", amount=0.3, n=float("-inf"), dim=1)
    >>> int((m.weight_mask.sum(dim=(0, 2, 3)) == 0).sum())
    2
    """
    LnStructured.apply(module, name, amount, n, dim, importance_scores=importance_scores)
    return module


def custom_from_mask(module: torch.nn.Module, name: str, mask: Any) -> torch.nn.Module:
    """Prune ``module.<name>`` with the precomputed `mask`.

    Parameters
    ----------
    module : torch.nn.Module
        Module holding the tensor.
    name : str
        Name of the parameter within `module`.
    mask : torch.Tensor
        Mask of the shape of the parameter; non-zero entries are kept.

    Returns
    -------
    torch.nn.Module
        `module`, modified in place.

    Examples
    --------
    >>> import torch, torch.nn as nn
    >>> import arrayprune.adapters.torch as prune
    >>> prune.custom_from_mask(nn.Linear(5, 3), name="bias", mask=torch.tensor([0, 1, 0])).bias_mask
    tensor([0., 1., 0.])
    """
    CustomFromMask.apply(module, name, mask)
    return module


def global_unstructured(
    parameters: Iterable[tuple[torch.nn.Module, str]],
    pruning_method: type,
    importance_scores: dict | None = None,
    *,
    min_sparsity: Any = None,
    max_sparsity: Any = None,
    normalization: str | None = None,
    **kwargs: Any,
) -> None:
    """Prune many parameters together, ranking all their entries against each other.

    The result is that of pruning the concatenation of all parameters with one method,
    as :func:`torch.nn.utils.prune.global_unstructured` does, but the built-in methods
    never build that concatenation (:func:`arrayprune.global_unstructured`). Existing
    masks are respected: only the entries they keep are candidates, and a float amount
    is a fraction of those. Each parameter is then pruned with its share of the mask by
    :func:`custom_from_mask`. If anything fails, all modules are left as they were.

    Parameters
    ----------
    parameters : iterable of (torch.nn.Module, str)
        The parameters to prune, as pairs of a module and a parameter name.
    pruning_method : type
        A pruning method class of ``PRUNING_TYPE`` ``'unstructured'``, such as
        :class:`L1Unstructured`; it is instantiated with `kwargs`. PyTorch's own and
        user-written classes work too (their masks are computed on the concatenation).
    importance_scores : dict, optional
        Scores per parameter, keyed by the ``(module, name)`` pairs; a parameter without
        an entry is ranked by its own (current, pruned) values.
    min_sparsity, max_sparsity : float, or sequence of floats, optional
        Not in PyTorch: bounds on each parameter's final sparsity (one value for all, or
        one per pair), so that no layer is wiped out; see
        :func:`arrayprune.global_unstructured`.
    normalization : {None, 'lamp'}, optional
        Not in PyTorch: ``'lamp'`` ranks by layer-adaptive magnitude scores.
    **kwargs
        Arguments of `pruning_method`, such as ``amount``.

    Raises
    ------
    TypeError
        If `parameters` is not iterable, `importance_scores` is not a dict, or the method
        is not of ``PRUNING_TYPE`` ``'unstructured'``.
    ValueError
        If an importance score has another shape than its parameter, or the amount is
        too large.

    Examples
    --------
    >>> import torch, torch.nn as nn
    >>> import arrayprune.adapters.torch as prune
    >>> net = nn.Sequential(nn.Linear(10, 4), nn.Linear(4, 1))
    >>> prune.global_unstructured(
    ...     [(net[0], "weight"), (net[1], "weight")], pruning_method=prune.L1Unstructured, amount=10
    ... )
    >>> int(sum((b == 0).sum() for b in net.buffers()))
    10
    """
    if not isinstance(parameters, Iterable):
        raise TypeError("global_unstructured(): parameters is not an Iterable")
    importance_scores = importance_scores if importance_scores is not None else {}
    if not isinstance(importance_scores, dict):
        raise TypeError("global_unstructured(): importance_scores must be of type dict")
    pairs = [(module, name) for module, name in parameters]
    tensors = [getattr(module, name) for module, name in pairs]
    scores = [importance_scores.get(pair, t) for pair, t in zip(pairs, tensors, strict=False)]
    for (_, name), t, s in zip(pairs, tensors, scores, strict=False):
        _check_shape(t, s, f"importance_scores of parameter {name}")
    old_masks = [getattr(module, name + "_mask", None) for module, name in pairs]

    method = pruning_method(**kwargs)
    if method.PRUNING_TYPE != "unstructured":
        raise TypeError(
            'Only "unstructured" PRUNING_TYPE supported for the `pruning_method`. '
            f"Found method {pruning_method} of type {method.PRUNING_TYPE}"
        )
    if not pairs:
        return
    method._tensor_name = "temp"
    core_method = _native_core_method(method)
    with torch.no_grad():
        if core_method is not None:
            defaults = [None if m is None else m.detach() for m in old_masks]
            chosen = core_method
        else:
            # An unknown method: its compute_mask sees the concatenation, as in PyTorch.
            defaults = [
                torch.ones_like(t) if m is None else m.detach() for t, m in zip(tensors, old_masks, strict=False)
            ]
            chosen = method
        if isinstance(core_method, _PyTorchStreamRandomUnstructured) and (
            min_sparsity is None and max_sparsity is None and normalization is None
        ):
            # Unseeded random pruning: PyTorch's draw over the remaining entries.
            eligible = [None if m is None else _eligible(m) for m in defaults]
            keeps = _pytorch_random_keep([s.detach() for s in scores], eligible, core_method._count)
            masks = [keep if m is None else _apply_keep(m, keep) for m, keep in zip(defaults, keeps, strict=False)]
        else:
            masks = _global.global_unstructured(
                [t.detach() for t in tensors],
                lambda: chosen,
                importance_scores=[s.detach() for s in scores],
                default_masks=defaults,
                min_sparsity=min_sparsity,
                max_sparsity=max_sparsity,
                normalization=normalization,
            )
    # Each mask already holds the earlier pruning (it is what custom_from_mask would
    # compute on top of the old mask), so it is installed as it is, in the parameter's
    # dtype: one tensor serves as the buffer and as the hook's mask.
    # A patched or overridden CustomFromMask.compute_mask is honoured: then each mask
    # goes through custom_from_mask, as in PyTorch.
    with _Transaction(module for module, _ in pairs):
        for (module, name), mask, t in zip(pairs, masks, tensors, strict=False):
            mask = mask.to(dtype=t.dtype)
            hook = CustomFromMask(mask)
            if _native_core_method(hook) is None:
                custom_from_mask(module, name, mask=mask)
            else:
                _apply(module, name, hook, None, precomputed=mask)


def nm_structured(
    module: torch.nn.Module,
    name: str,
    n: int = 2,
    m: int = 4,
    dim: int = -1,
    importance_scores: torch.Tensor | None = None,
) -> torch.nn.Module:
    """Impose `n`:`m` sparsity (2:4 by default) on ``module.<name>`` along `dim`.

    Not in :mod:`torch.nn.utils.prune`; the reparametrization is the same as for the
    other verbs, and it combines with them in a :class:`PruningContainer`.

    Parameters
    ----------
    module : torch.nn.Module
        Module holding the tensor.
    name : str
        Name of the parameter within `module`.
    n, m : int
        The pattern: `n` zeros in every `m` consecutive entries.
    dim : int, default -1
        Axis along which groups run.
    importance_scores : torch.Tensor, optional
        Scores ranking the entries instead of the parameter, same shape.

    Returns
    -------
    torch.nn.Module
        `module`, modified in place.

    Examples
    --------
    >>> import torch.nn as nn
    >>> import arrayprune, arrayprune.adapters.torch as prune
    >>> m = prune.nm_structured(nn.Linear(8, 4), "weight")
    >>> arrayprune.is_nm_sparse(m.weight, 2, 4)
    True
    """
    NMStructured.apply(module, name, n=n, m=m, dim=dim, importance_scores=importance_scores)
    return module


def block_unstructured(
    module: torch.nn.Module,
    name: str,
    amount: int | float,
    block_shape: tuple[int, ...],
    n: float = 1,
    importance_scores: torch.Tensor | None = None,
) -> torch.nn.Module:
    """Prune ``amount`` of the (remaining) blocks of ``module.<name>``, weakest first.

    Not in :mod:`torch.nn.utils.prune`; see :class:`BlockUnstructured`.

    Parameters
    ----------
    module : torch.nn.Module
        Module holding the tensor.
    name : str
        Name of the parameter within `module`.
    amount : int or float
        Fraction in ``[0, 1]`` of the remaining blocks, or their number.
    block_shape : tuple of int
        Block shape, aligned to the trailing dimensions.
    n : float, default 1
        Order of the power mean scoring a block.
    importance_scores : torch.Tensor, optional
        Scores ranking the entries instead of the parameter, same shape.

    Returns
    -------
    torch.nn.Module
        `module`, modified in place.
    """
    BlockUnstructured.apply(module, name, amount, block_shape, n=n, importance_scores=importance_scores)
    return module


def prune_to_sparsity(
    module: torch.nn.Module,
    name: str,
    sparsity: float,
    pruning_method: type = L1Unstructured,
    importance_scores: torch.Tensor | None = None,
    **kwargs: Any,
) -> torch.nn.Module:
    """Prune just enough more of ``module.<name>`` that a fraction `sparsity` is pruned.

    Not in :mod:`torch.nn.utils.prune`: the step of gradual pruning. Call it at each
    training step with ``schedule(step)`` (:class:`arrayprune.PolynomialDecay`, ...):
    units already pruned count towards the target and stay pruned, and the new method
    joins the others in the :class:`PruningContainer`.

    Parameters
    ----------
    module : torch.nn.Module
        Module holding the tensor.
    name : str
        Name of the parameter within `module`.
    sparsity : float
        Target fraction of pruned units (entries, or channels for structured methods).
    pruning_method : type, default L1Unstructured
        Unstructured or structured method class, applied with an integer amount.
    importance_scores : torch.Tensor, optional
        Scores ranking the entries (for methods that take them).
    **kwargs
        Further arguments of the method's ``apply`` (``n``, ``dim``, ...).

    Returns
    -------
    torch.nn.Module
        `module`, modified in place (nothing is pruned if the target is already met,
        but the reparametrization is added, as with an amount of 0).

    Examples
    --------
    >>> import arrayprune, torch.nn as nn
    >>> import arrayprune.adapters.torch as prune
    >>> m, schedule = nn.Linear(10, 10), arrayprune.PolynomialDecay(0.0, 0.9, 0, 100)
    >>> for step in range(0, 101, 10):
    ...     _ = prune.prune_to_sparsity(m, "weight", schedule(step))
    >>> int((m.weight_mask == 0).sum())
    90
    """
    t = getattr(module, name)
    mask = getattr(module, name + "_mask", None)
    extra = _schedules.units_to_prune(t.detach(), sparsity, mask, pruning_method, kwargs.get("dim", -1))
    if importance_scores is not None:
        kwargs["importance_scores"] = importance_scores
    pruning_method.apply(module, name, amount=extra, **kwargs)
    return module


def remove(module: torch.nn.Module, name: str) -> torch.nn.Module:
    """Make the pruning of ``module.<name>`` permanent and remove its reparametrization.

    The pruned values are written into the original parameter object, which becomes
    ``module.<name>`` again; ``<name>_orig``, ``<name>_mask`` and the hook are removed.
    Works on tensors pruned by PyTorch as well.

    Parameters
    ----------
    module : torch.nn.Module
        Module holding the tensor.
    name : str
        Name of the pruned parameter.

    Returns
    -------
    torch.nn.Module
        `module`, modified in place.

    Raises
    ------
    ValueError
        If ``module.<name>`` is not pruned.
    """
    for key, hook in module._forward_pre_hooks.items():
        if isinstance(hook, _tprune.BasePruningMethod) and getattr(hook, "_tensor_name", None) == name:
            hook.remove(module)
            del module._forward_pre_hooks[key]
            return module
    raise ValueError(f"Parameter '{name}' of module {module} has to be pruned before pruning can be removed")


def is_pruned(module: torch.nn.Module) -> bool:
    """Whether `module` or one of its submodules has a pruning hook (from either library).

    Parameters
    ----------
    module : torch.nn.Module
        The module to inspect.

    Returns
    -------
    bool
        True if some forward pre-hook is a pruning method.
    """
    for _, submodule in module.named_modules():
        for hook in submodule._forward_pre_hooks.values():
            if isinstance(hook, _tprune.BasePruningMethod):
                return True
    return False


# --------------------------------------------------------------------------------------
# Private helpers of torch.nn.utils.prune, with the same meaning
# --------------------------------------------------------------------------------------


def _validate_pruning_amount_init(amount: Any) -> None:
    """Check an amount before the tensor is known (see arrayprune.validate_pruning_amount_init)."""
    _amount.validate_pruning_amount_init(amount)


def _validate_pruning_amount(amount: Any, tensor_size: int) -> None:
    """Check that an integer amount does not exceed `tensor_size` units."""
    _amount.validate_pruning_amount(amount, tensor_size)


def _compute_nparams_toprune(amount: Any, tensor_size: int) -> int:
    """Number of units to prune: an integer amount as is, a float as ``round(amount * tensor_size)``."""
    return _amount.compute_nparams_toprune(amount, tensor_size)


def _validate_structured_pruning(t: torch.Tensor) -> None:
    """Raise ValueError unless `t` has at least two dimensions."""
    _amount.validate_structured_pruning(tuple(t.shape))


def _validate_pruning_dim(t: torch.Tensor, dim: int) -> None:
    """Raise IndexError unless `dim` is a dimension of `t` (TypeError if not an int)."""
    _amount.validate_pruning_dim(tuple(t.shape), dim)


def _compute_norm(t: torch.Tensor, n: Any, dim: int) -> torch.Tensor:
    """L\\ `n` norm of every channel of `t` along `dim`, over all other dimensions.

    Parameters
    ----------
    t : torch.Tensor
        Tensor with at least two dimensions.
    n : int, float, inf, -inf, 'fro' or 'nuc'
        Order of the norm, as ``p`` in :func:`torch.norm`.
    dim : int
        Channel dimension (negative values count from the end).

    Returns
    -------
    torch.Tensor
        One norm per channel, shape ``(t.shape[dim],)``.
    """
    return _channel_norms(t, n, _amount.normalize_dim(tuple(t.shape), dim))
