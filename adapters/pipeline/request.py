"""What to prune and how: the request of a file pipeline, validated once, here.

:class:`PruneSpec` holds every option of ``arrayprune prune`` under the name of its flag
(``global_`` for ``--global``); :meth:`PruneSpec.checked` refuses an option that does
not apply to the method, fills in the defaults (``nm=(2, 4)``, the ``verify`` tolerance)
and returns the request the pipeline (:mod:`arrayprune.adapters.pipeline`) runs. Errors
are :class:`PruneError`, one line naming the option as the command line spells it; the
command prints it as ``arrayprune: error: ...`` and exits with status 2.

The method table's constructor parameters become options here too, by the flags they
declare (``FLAGS``, :mod:`arrayprune.method_parts`): those the command line has its own
options for (:data:`PARAMETER_FLAGS`: ``amount``, ``dim``, ``n``, ``nm`` for ``n`` and
``m`` of an N:M pattern, ``block`` for ``block_shape``, and ``seed``), and any other a
method declares, held in ``method_options`` by parameter name. A new option of the pipeline is a
field of :class:`PruneSpec`, its check in :meth:`PruneSpec.checked`, and a flag in
:mod:`arrayprune.adapters.cli.options` that fills it.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import numbers
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import arrayprune
from arrayprune.adapters.pipeline.allocation_request import check_allocation
from arrayprune.adapters.pipeline.devices import parse_device
from arrayprune.adapters.pipeline.errors import PruneError, PruneProblems
from arrayprune.adapters.pipeline.method_names import (
    _OWN_FLAGS,
    PARAMETER_FLAGS,
    extra_flags,
    method_flags,
    methods_with,
    reconstructs,
    runnable_methods,
    scored_methods,
)
from arrayprune.adapters.pipeline.reconstruction_methods import refusal
from arrayprune.adapters.pipeline.shrink_request import check_shrink
from arrayprune.adapters.verify import DEFAULT_TOL
from arrayprune.method_parts import pattern_of, score_of
from arrayprune.registry import constructor_parameters

__all__ = [
    "DEFAULT_VERIFY_TOL",
    "METHODS",  # noqa: F822 (the module's __getattr__: the runnable methods as they are now)
    "PARAMETER_FLAGS",
    "scored_methods",
    "PruneError",
    "PruneProblems",
    "PruneSpec",
    "method_arguments",
    "method_options",
    "method_flags",
    "methods_with",
]


#: Values of required constructor parameters that the command line fills in.
_REQUIRED_DEFAULTS = {"n": 2, "block_shape": (1, 4)}

#: Constructor parameters without a flag of their own that are options of the request
#: (``--no-compensate``): a method object's value becomes the option, the option the value.
_FIELDS = frozenset({"compensate"})

#: ``(rtol, atol)`` of ``verify`` when none is given (see :mod:`arrayprune.adapters.verify`).
DEFAULT_VERIFY_TOL = DEFAULT_TOL


def __getattr__(name: str) -> Any:
    # ``METHODS``: :func:`runnable_methods` as it is now.
    if name == "METHODS":
        return runnable_methods()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def method_arguments(spec: PruneSpec, seed: int | None = None, dim: int | None = None) -> dict[str, Any]:
    """Constructor arguments of ``spec.method`` from the request's options.

    Parameters
    ----------
    spec : PruneSpec
        The request (any object with its attributes).
    seed : int, optional
        The seed to give a random method (the pipeline derives one per tensor).
    dim : int, optional
        The axis of the tensor at hand (``spec.dim``, or the tensor's own axis from the plan).

    Returns
    -------
    dict
        Keyword arguments of ``arrayprune.METHODS[spec.method]``.
    """
    cls = arrayprune.METHODS[spec.method]
    flags = method_flags(spec.method)
    values: dict[str, Any] = {
        "amount": spec.amount, "dim": spec.dim if dim is None else dim, "block_shape": spec.block, "seed": seed,
    }  # fmt: skip
    if flags.get("n") == "--nm" and spec.nm is not None:
        values["n"], values["m"] = spec.nm
    elif flags.get("n") == "--n":
        values["n"] = spec.n
    for param, flag in flags.items():
        if flag not in _OWN_FLAGS:
            values[param] = spec.method_options.get(param)
    given = spec.method_options
    kwargs = {}
    for p in constructor_parameters(cls):
        if p.name in flags and values.get(p.name) is not None:
            kwargs[p.name] = values[p.name]
        elif p.name not in flags and p.name in given:  # a setting without a flag, from a method object
            kwargs[p.name] = given[p.name]
        elif p.name not in flags and p.name in _FIELDS:  # a request's own option (``compensate``)
            kwargs[p.name] = getattr(spec, p.name)
        elif p.default is inspect.Parameter.empty:
            if p.name not in _REQUIRED_DEFAULTS:
                raise PruneError(f"{flags.get(p.name, p.name)} is required for {spec.method}")
            kwargs[p.name] = _REQUIRED_DEFAULTS[p.name]
    return kwargs


def _default(f: dataclasses.Field) -> Any:
    """A field's default value (a factory's product for ``method_options``)."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def method_options(method: Any) -> dict[str, Any]:
    """A method object as a request's options: its name in the table and its arguments.

    Parameters
    ----------
    method : BasePruningMethod
        An object of a class of :data:`arrayprune.METHODS` whose constructor parameters
        the options can express (:data:`METHODS`).

    Returns
    -------
    dict
        ``method`` (its name) and each constructor parameter under its option's name
        (``amount``, ``dim``, ``n``, ``nm`` for N and M, ``block`` for ``block_shape``,
        ``seed``).

    Raises
    ------
    TypeError
        If `method` is not an object of a class of the table, or holds a generator (a
        request draws from seeds, one stream per tensor).
    PruneError
        If its method cannot be run from a request (``identity``, ``custom_from_mask``).

    Examples
    --------
    >>> import arrayprune as ap
    >>> method_options(ap.NMStructured(2, 4, dim=0))
    {'method': 'nm_structured', 'nm': (2, 4), 'dim': 0}
    """
    name = {cls: n for n, cls in arrayprune.METHODS.items()}.get(type(method))
    if name is None:
        raise TypeError(
            f"method must be a name of {', '.join(runnable_methods())} or an object of a class of arrayprune.METHODS, "
            f"not {type(method).__name__} (add a new method to the table: see CONTRIBUTING)"
        )
    if name not in runnable_methods():
        raise PruneError(f"{name} cannot be run on a file (choose from {', '.join(runnable_methods())})")
    if getattr(method, "generator", None) is not None:
        raise TypeError(f"{type(method).__name__} with a generator: give it a seed (one stream per tensor)")
    options: dict[str, Any] = {"method": name}
    flags = method_flags(name)
    for p in constructor_parameters(type(method)):
        if p.name == "m":
            continue
        value = getattr(method, p.name)
        if p.name not in flags:  # no flag (a solver's block size, a refit switch): kept if not the default
            if p.name in _FIELDS:
                options[p.name] = value
            elif value is not p.default and value != p.default:
                options.setdefault("method_options", {})[p.name] = value
            continue
        if flags[p.name] == "--nm":
            if value is not None:  # a method with an amount instead (SparseGPT's)
                options["nm"] = (value, method.m)
        elif flags[p.name] not in _OWN_FLAGS:
            options.setdefault("method_options", {})[p.name] = value
        else:
            options[{"block_shape": "block"}.get(p.name, p.name)] = value
    return options


@dataclass(frozen=True)
class PruneSpec:
    """A request to prune a file: the options of ``arrayprune prune``, under their flags' names.

    Parameters
    ----------
    method : str or method object, default "l1_unstructured"
        A name of :data:`METHODS` (``--method``), or an object of a class of
        :data:`arrayprune.METHODS` (``ap.LnStructured(0.5, n=1, dim=0)``), which carries
        its own arguments: they become the options above (see :func:`method_options`), so
        its ``dim`` applies to every tensor and its ``seed`` is mixed with each tensor's
        name as ``seed`` is.
    amount : int or float, optional
        Fraction in ``[0, 1]`` or count (``--amount``); required by the methods that take one.
    global_ : bool, default False
        One threshold over all selected tensors (``--global``, unstructured methods).
    nm : tuple of (int, int), optional
        ``(N, M)`` of ``nm_structured`` (``--nm N:M``; default ``(2, 4)``).
    block : tuple of int, optional
        Block shape of ``block_unstructured`` (``--block RxC``).
    n : int, float or str, optional
        Norm order of ``ln_structured``, power of ``block_unstructured`` (``--n``).
    dim : int, optional
        The axis of structured and N:M methods for every tensor (default: each weight's own).
    include, exclude : tuple of str
        fnmatch patterns on tensor names, or the names of ONNX nodes reading them.
    min_size : int, default 0
        Tensors with fewer entries are left.
    min_sparsity, max_sparsity : float, optional
        ``global_``: bounds on every tensor's sparsity.
    lamp : bool, default False
        ``global_``: rank by layer-adaptive (LAMP) scores.
    calibration : str, optional
        Calibration samples (``.npz``) for Wanda's input norms or ``sparsegpt``: an ONNX
        model's inputs, or a Hugging Face folder's token ids (``input_ids``).
    calibration_batch : int, optional
        Samples run at a time with `calibration`.
    hessians : str, optional
        ``sparsegpt`` on safetensors: precomputed Hessians (``.npz``, weight name -> ``K x K``).
    input_norms : str, optional
        Precomputed input norms (``.npz``) for Wanda's scores.
    seed : int, optional
        Random methods and `verify` inputs.
    keep_masks : bool, default False
        Write ``name_orig`` + ``name_mask`` instead of folded weights.
    force : bool, default False
        Overwrite an existing output (even the input).
    dry_run : bool, default False
        Plan only: nothing is written.
    verify : bool, default False
        ONNX: run the original and the pruned model on the same inputs.
    verify_data : str, optional
        ``verify``: real inputs (``.npz``).
    verify_tol : tuple of (float, float), optional
        ``verify``: ``(rtol, atol)``; :data:`DEFAULT_VERIFY_TOL` if omitted.
    one_pass : bool, default False
        Reconstruction methods: every Hessian from the dense model (else layer by layer).
    shrink : bool, default False
        ONNX or Hugging Face folder: remove the channels a structured method drops
        (see :mod:`arrayprune.adapters.pipeline.shrinking`).
    groups : {"channels", "heads", "layers", "experts"}, optional
        ``shrink``: what a group is (``"channels"``, the default; ``"heads"``: attention heads,
        ``"layers"``: decoder layers, ``"experts"``: experts of MoE layers; the last three
        on Hugging Face folders; see :mod:`arrayprune.adapters.pipeline.shrink_structure`).
    compensate : bool, default True
        ``shrink`` with a calibrated structured method (``activation_structured``,
        ``obs_structured``: :class:`arrayprune.UnitPruningMethod`): refit the layer reading
        the removed units on the kept ones; ``groups="layers"``: refit each run of removed
        layers into the last projection of the layer before it (``--no-compensate``: off).
    rounding : {"nearest", "keep_floor"}, default "nearest"
        ``shrink`` by weights (channels or heads of an ONNX model or a Hugging Face
        folder): how a fraction becomes each group's count, ``round(amount * C)`` removed
        (PyTorch's rule), or ``int((1 - amount) * C)`` kept (Torch-Pruning's rule).
    allocation : str, optional
        Each weight's share of `amount`: a sensitivity scan's JSON file (``arrayprune
        scan``) or ``"owl"`` (see :mod:`arrayprune.adapters.pipeline.allocation`); bounded by
        `min_sparsity` and `max_sparsity`.
    allocation_check : bool, default True
        With a scan's ``allocation`` and ``calibration`` (or `allocation_check_data`):
        check the scan's allocation, uniform and global jointly on the calibration data
        and take the least error (:mod:`arrayprune.adapters.pipeline.allocation`); False: the
        scan's allocation as it is.
    allocation_check_data : str, optional
        ONNX, a scan's ``allocation``: the samples (``.npz``, graph input name ->
        samples) the joint check runs, in place of `calibration`'s. They make no scores:
        ``l1_unstructured`` then checks the magnitude masks it prunes with.
    owl_m : float, optional
        ``allocation="owl"``: a score is an outlier above `owl_m` times its weight's mean
        (``--owl-m``; :data:`arrayprune.allocation.OWL_M`, 5, if omitted).
    owl_lambda : float, optional
        ``allocation="owl"``: every weight's sparsity within ``amount +- owl_lambda``
        (``--owl-lambda``, in ``[0, 1]``; :data:`arrayprune.allocation.OWL_LAMBDA`, 0.08,
        if omitted).
    device : str, optional
        Where `calibration` runs (``--device``): ``"cpu"`` (the default), ``"cuda"`` or
        ``"cuda:N"``; a Hugging Face folder one decoder layer on the device at a time, an
        ONNX model on onnxruntime's CUDA execution provider (see
        :mod:`arrayprune.adapters.pipeline.devices`).
    """

    method: str = "l1_unstructured"
    amount: int | float | None = None
    global_: bool = False
    nm: tuple[int, int] | None = None
    block: tuple[int, ...] | None = None
    n: Any = None
    dim: int | None = None
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    min_size: int = 0
    min_sparsity: float | None = None
    max_sparsity: float | None = None
    lamp: bool = False
    calibration: str | None = None
    calibration_batch: int | None = None
    hessians: str | None = None
    input_norms: str | None = None
    seed: int | None = None
    keep_masks: bool = False
    force: bool = False
    dry_run: bool = False
    verify: bool = False
    verify_data: str | None = None
    verify_tol: tuple[float, float] | None = None
    one_pass: bool = False
    shrink: bool = False
    groups: str | None = None
    compensate: bool = True
    rounding: str = "nearest"
    allocation: str | None = None
    allocation_check: bool = True
    allocation_check_data: str | None = None
    owl_m: float | None = None
    owl_lambda: float | None = None
    device: str | None = None
    method_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.method, str):  # a method object: its name and arguments as options
            options = method_options(self.method)
            given = sorted(
                f.name
                for f in dataclasses.fields(self)
                if f.name in options and f.name != "method" and getattr(self, f.name) != _default(f)
            )
            if given:
                raise PruneError(f"the method object carries its own arguments: do not give {', '.join(given)} too")
            for name, value in options.items():
                object.__setattr__(self, name, value)
        for name in ("include", "exclude"):  # a single pattern, or any iterable: a tuple
            value = getattr(self, name)
            object.__setattr__(self, name, (value,) if isinstance(value, str) else tuple(value))
        for name in ("calibration", "input_norms", "verify_data", "allocation", "hessians", "allocation_check_data"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, os.fspath(value))

    @property
    def plan_only(self) -> bool:
        """A dry run without an amount: the plan lists roles and axes, nothing is constructed."""
        given = self.amount is not None or self.nm is not None
        return self.dry_run and not given and "--amount" in method_flags(self.method).values()

    def method_class(self) -> type:
        """The class of :data:`arrayprune.METHODS` that plans and masks for the request."""
        return arrayprune.METHODS[self.method]

    def checked(self) -> PruneSpec:
        """Refuse options that do not apply to the method; the request with its defaults filled in.

        ``dry_run`` needs no ``amount``: without one, the plan lists roles and axes.

        Returns
        -------
        PruneSpec
            This request with ``nm`` (``(2, 4)`` for N:M methods) and ``verify_tol`` set.

        Raises
        ------
        PruneError
            Naming the option as the command line spells it.
        """
        self._check_values()
        self._check_device()
        if refused := refusal(self):
            raise PruneError(refused)
        if refused := check_allocation(self):
            raise PruneError(refused)
        check_shrink(self)
        cls = self.method_class()
        if self.global_ and not pattern_of(cls).across_arrays and not self.shrink:  # --shrink: channels
            unstructured = [m for m in runnable_methods() if pattern_of(PruneSpec(m).method_class()).across_arrays]
            raise PruneError(f"--global needs an unstructured method ({' or '.join(unstructured)}), not {self.method}")
        bounded = self.min_sparsity is not None or self.max_sparsity is not None
        if not self.global_ and (self.lamp or (bounded and not self.allocation)):
            raise PruneError("--min-sparsity, --max-sparsity and --lamp shape global pruning: add --global")
        if self.lamp and not score_of(cls).magnitude:
            magnitudes = [
                name
                for name, method in arrayprune.METHODS.items()
                if name in runnable_methods() and score_of(method).magnitude and pattern_of(method).across_arrays
            ]
            raise PruneError(f"--lamp ranks magnitudes: use it with --method {' or '.join(magnitudes)}")
        flags = set(method_flags(self.method).values())
        declared = {param: flag for flag, (param, _, _) in extra_flags().items()}
        unflagged = {p.name for p in constructor_parameters(cls)} - set(method_flags(self.method))
        for param in self.method_options:
            if param in unflagged:  # set on a method object: no flag, taken as it is
                continue
            flag = declared.get(param, f"--{param.replace('_', '-')}")
            if flag not in flags:
                takes = methods_with(flag)
                only = f" (only to {', '.join(takes)})" if takes else ""
                raise PruneError(f"{flag} does not apply to {self.method}{only}")
        given = {"--n": self.n, "--dim": self.dim, "--nm": self.nm, "--block": self.block}
        for flag, value in given.items():
            if value is not None and flag not in flags:
                raise PruneError(f"{flag} does not apply to {self.method} (only to {', '.join(methods_with(flag))})")
        if self.amount is not None and "--amount" not in flags:
            raise PruneError(f"{self.method} prunes a pattern (--nm N:M), not an --amount")
        plan_only = self.dry_run and self.amount is None and self.nm is None
        if self.amount is None and "--amount" in flags and not plan_only and (self.nm is None or "--nm" not in flags):
            raise PruneError(f"--amount is required for {self.method} (--dry-run alone shows the roles and axes)")
        filled: dict[str, Any] = {}
        if self.nm is None and "--nm" in flags and "--amount" not in flags:
            filled["nm"] = (2, 4)
        if self.seed is not None and "--seed" not in flags and not self.verify:
            raise PruneError(
                f"--seed does not apply to {self.method}, which is deterministic (it seeds random methods and --verify)"
            )
        if self.verify_tol is not None and not self.verify:
            raise PruneError("--verify-tol needs --verify")
        if self.verify_data is not None and not self.verify:
            raise PruneError("--verify-data needs --verify")
        self._check_norm_options()
        if self.verify_tol is None:
            filled["verify_tol"] = DEFAULT_VERIFY_TOL
        spec = dataclasses.replace(self, **filled) if filled else self
        if plan_only and "--amount" in flags:
            return spec  # nothing to construct: the plan needs the method's axes only
        try:
            cls(**method_arguments(spec))
        except (TypeError, ValueError) as exc:
            flag = "--nm" if spec.nm is not None else "--amount" if "--amount" in flags else "--method"
            raise PruneError(f"{flag}: {exc}") from None
        return spec

    def _check_device(self) -> None:
        if self.device is None:
            return
        try:
            parse_device(self.device)
        except ValueError as exc:
            raise PruneError(str(exc)) from None
        if not self.calibration:
            raise PruneError("--device is where --calibration runs the model: add --calibration (or leave --device)")

    def _check_values(self) -> None:
        """What the command line's parser checks of each value alone (Python callers skip it)."""
        if self.method not in runnable_methods():
            choices = ", ".join(runnable_methods())
            raise PruneError(f"invalid choice for --method: {self.method!r} (choose from {choices})")
        amount = self.amount
        if amount is not None and (
            isinstance(amount, bool)
            or not isinstance(amount, numbers.Real)
            or (isinstance(amount, float) and not math.isfinite(amount))
        ):
            raise PruneError(f"invalid amount {amount!r}: a fraction like 0.5 or a count like 100")
        for flag, value in (("--min-sparsity", self.min_sparsity), ("--max-sparsity", self.max_sparsity)):
            if value is not None and not 0.0 <= value <= 1.0:
                raise PruneError(f"{flag}: invalid fraction {value!r}: must be in [0, 1]")
        if _negative(self.min_size):
            raise PruneError(f"--min-size: invalid count {self.min_size!r}: must be >= 0")
        if self.calibration_batch is not None and (_negative(self.calibration_batch) or self.calibration_batch == 0):
            raise PruneError(f"--calibration-batch: expected a positive integer, got {self.calibration_batch!r}")
        if self.nm is not None and (len(self.nm) != 2 or _negative(self.nm[0]) or _negative(self.nm[1])):
            raise PruneError(f"--nm: invalid pattern {self.nm!r}: write (N, M), like (2, 4)")
        if self.verify_tol is not None and (
            len(self.verify_tol) != 2 or not all(math.isfinite(v) and v >= 0 for v in self.verify_tol)
        ):
            raise PruneError(f"--verify-tol: invalid tolerance {self.verify_tol!r}: (RTOL, ATOL), numbers >= 0")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral)):
            raise PruneError(f"--seed: invalid seed {self.seed!r}: an integer")
        for flag, value, high in (("--owl-m", self.owl_m, math.inf), ("--owl-lambda", self.owl_lambda, 1.0)):
            if value is None:
                continue
            number = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
            if not number or not 0.0 <= value <= high or (flag == "--owl-m" and value == 0):
                what = "a finite number > 0" if flag == "--owl-m" else "a fraction in [0, 1]"
                raise PruneError(f"{flag}: invalid value {value!r}: must be {what}")

    def _check_norm_options(self) -> None:
        """Input norms go with the methods that rank by scores, and Wanda needs them."""
        given = [f for f, v in (("--calibration", self.calibration), ("--input-norms", self.input_norms)) if v]
        if reconstructs(self.method):
            return  # its Hessians come from --calibration; reconstruction_methods.refusal checked the rest
        if self.shrink and not self.input_norms:  # --shrink's calibrated scores: check_shrink
            given = []
        if len(given) == 2:
            raise PruneError("--calibration and --input-norms both give input norms: pass one")
        scored = scored_methods()
        if given and self.method not in scored:
            raise PruneError(f"{given[0]} makes Wanda's scores, for {', '.join(scored)}; not for {self.method}")
        if not given and self.method in arrayprune.METHODS and score_of(self.method_class()).statistic == "input_norms":
            raise PruneError(
                "--method wanda needs input norms: --calibration calib.npz (ONNX models; token ids for a "
                "Hugging Face folder) or --input-norms norms.npz"
            )
        if self.calibration_batch is not None and not self.calibration:
            raise PruneError("--calibration-batch needs --calibration")


def _negative(value: Any) -> bool:
    return isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0


def spec_from(options: Iterable[tuple[str, Any]]) -> PruneSpec:
    """A :class:`PruneSpec` from option names and values; an unknown name is a :class:`PruneError`."""
    fields = {f.name for f in dataclasses.fields(PruneSpec)}
    given = dict(options)
    # A parameter a method declares a flag of, beyond the options of the command line's own.
    extra = {param for param, _, _ in extra_flags().values()}
    method_options = {k: given.pop(k) for k in list(given) if k in extra and k not in fields}
    if method_options:
        given["method_options"] = {**given.get("method_options", {}), **method_options}
    unknown = sorted(set(given) - fields)
    if unknown:
        raise PruneError(f"unknown option {unknown[0]!r}; the options are {', '.join(sorted(fields))}")
    return PruneSpec(**given)
