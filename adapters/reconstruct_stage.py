"""Reconstruction methods of the file pipeline: ``arrayprune prune --method sparsegpt``.

A reconstruction method prunes a weight *and updates the entries it keeps* from
calibration data run through the model's graph; it is not a mask method of
:data:`arrayprune.METHODS`. :data:`RECONSTRUCTIONS` is the one place that says which
methods these are and what each needs:

* the request (:class:`~arrayprune.adapters.request.PruneSpec`) offers their names as
  ``--method`` choices, checks their options with :func:`refusal` and with the checks of
  their *stand-in* mask method (``l1_unstructured`` for an ``--amount``,
  ``nm_structured`` for ``--nm N:M``), which also plans them (the targets, the axis of
  an N:M pattern) and, with ``--global``, ranks them: one magnitude threshold over all
  targets, whose per-weight counts (:func:`~arrayprune.adapters.reconstruction.amounts_from_masks`)
  the engine then prunes;
* the pipeline refuses inputs without a graph to run (:func:`input_refusal`) and calls
  :func:`reconstruct` in place of masking, between plan and write.

``--keep-masks``, ``--seed``, ``--dim`` and ``--input-norms`` do not apply (the
weights kept are not the original ones; nothing is random; the axis is each weight's
reduction axis; the Hessians come from ``--calibration``). ``--lamp``,
``--min-sparsity`` and ``--max-sparsity`` shape the global ranking as for
``l1_unstructured``. ``--one-pass`` takes every Hessian from the dense model
(``sequential=False``); by default each weight is calibrated on the model whose earlier
weights are already pruned and updated.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from arrayprune.adapters import formats as fmt
from arrayprune.adapters import hf_stage
from arrayprune.adapters import mapping as mp
from arrayprune.adapters.formats import sharded
from arrayprune.adapters.reconstruction import amounts_from_masks, onnx_sparsegpt

__all__ = ["RECONSTRUCTIONS", "Reconstruction", "input_refusal", "reconstruct", "refusal"]


@dataclass(frozen=True)
class Reconstruction:
    """A method that prunes the weights of a model's graph and updates those it keeps.

    Attributes
    ----------
    engine : callable
        ``engine(wf, names, calibration, *, amount=, n=, m=, sequential=, batch_size=)``
        -> ``{name: (weight, mask)}`` (:func:`~arrayprune.adapters.reconstruction.onnx_sparsegpt`).
    formats : tuple of str
        The input formats holding a graph the engine runs.
    elsewhere : str
        Where to turn for other inputs (said when one is refused).
    by_amount, by_pattern : str
        The mask methods of :data:`arrayprune.METHODS` standing in for it (plan, checks,
        global ranking) with an ``--amount`` and with ``--nm N:M``.
    """

    engine: Callable[..., Mapping[str, Any]]
    formats: tuple[str, ...]
    elsewhere: str
    by_amount: str = "l1_unstructured"
    by_pattern: str = "nm_structured"

    #: The method's constructor parameters as the command line spells them (``method_flags``).
    flags = MappingProxyType({"amount": "--amount", "n": "--nm", "m": "--nm"})

    def stand_in(self, spec: Any) -> str:
        """The mask method that plans, checks and ranks for `spec`."""
        return self.by_pattern if spec.nm is not None else self.by_amount


#: The reconstruction methods of the pipeline: ``--method`` name -> what it needs.
RECONSTRUCTIONS: Mapping[str, Reconstruction] = MappingProxyType(
    {
        "sparsegpt": Reconstruction(
            engine=onnx_sparsegpt,
            formats=("onnx",),
            elsewhere=(
                "a Hugging Face folder runs with --calibration tokens.npz; "
                "for a PyTorch model, use arrayprune.adapters.torch.sparsegpt(model, batches, amount)"
            ),
        ),
    }
)

#: The options only reconstruction methods take (restored after the stand-in's checks).
OWN_OPTIONS = ("method", "one_pass", "hessians")


def refusal(spec: Any) -> str | None:
    """The option of `spec` that a reconstruction method refuses (or that needs one), as one line; None if all apply.

    The other options are checked as those of the stand-in mask method
    (:meth:`Reconstruction.stand_in`) by :meth:`~arrayprune.adapters.request.PruneSpec.checked`.
    """
    method = spec.method
    if method not in RECONSTRUCTIONS:
        if spec.hessians:
            return f"--hessians gives the Hessians of {', '.join(RECONSTRUCTIONS)}: use it with --method sparsegpt"
        return f"--one-pass applies to {', '.join(RECONSTRUCTIONS)} only" if spec.one_pass else None
    if spec.hessians and (spec.calibration or spec.one_pass):
        return f"--hessians gives every Hessian: no {'--calibration' if spec.calibration else '--one-pass'} with it"
    if spec.amount is not None and spec.nm is not None:
        return f"--method {method} takes --amount A or --nm N:M, not both"
    if spec.amount is None and spec.nm is None and not spec.dry_run:
        return f"--method {method} needs --amount A or --nm N:M"
    if spec.global_ and spec.nm is not None:
        return f"--global ranks entries for an --amount; with --nm N:M every weight of {method} gets the pattern"
    if spec.input_norms:
        return f"--input-norms makes Wanda's scores; {method} takes its Hessians from --calibration"
    if not spec.calibration and not spec.hessians:
        return (
            f"--method {method} needs --calibration calib.npz: samples of the model's inputs "
            "(graph input name -> array, samples along axis 0; token ids for a Hugging Face folder), "
            "or --hessians hessians.npz for safetensors"
        )
    if spec.keep_masks:
        return (
            f"--keep-masks does not apply to {method}: it updates the weights it keeps, "
            "so name_orig would not be the original"
        )
    if spec.seed is not None:
        return f"--seed does not apply to {method}, which is deterministic (--verify runs on the --calibration samples)"
    if spec.dim is not None:
        return f"--dim does not apply to {method}: it prunes each weight along its reduction axis"
    for flag, value in (("--n", spec.n), ("--block", spec.block)):
        if value is not None:
            return f"{flag} does not apply to {method}"
    return None


def input_refusal(spec: Any, src: str) -> str | None:
    """Why the reconstruction method of `spec`, or ``calibration``, cannot run on `src`; None if it can."""
    method = RECONSTRUCTIONS.get(spec.method)
    if method is None and not spec.calibration:
        return None
    kind = "sharded" if sharded.is_sharded(src) else fmt.detect_format(src)
    if spec.hessians and kind not in ("sharded", "safetensors"):
        return f"--hessians applies to safetensors files and checkpoints; {kind} models take --calibration"
    if spec.hessians:
        return None
    if method is None:  # Wanda's norms: from a Hugging Face model layer by layer, or from ONNX
        return hf_stage.input_refusal(spec, src, kind)
    if kind in method.formats or (kind in ("sharded", "safetensors") and spec.calibration):
        return hf_stage.input_refusal(spec, src, kind)  # tokens through a Hugging Face model, layer by layer
    if kind in ("sharded", "safetensors"):  # no --calibration, no --hessians: say how to give them here
        return hf_stage.calibration_needed(spec.method, src)
    need = " or ".join(f.upper() if f == "onnx" else f for f in method.formats)
    what = "sharded checkpoints" if kind == "sharded" else f"{kind} files"
    return (
        f"--method {spec.method} runs the model on calibration data: IN must be an {need} model "
        f"({what} hold no graph to run); {method.elsewhere}"
    )


def reconstruct(
    storage: Any,
    targets: list[Any],
    spec: Any,
    hooks: Any,
    global_masks: Callable[[list[Any], Any], list[Any]],
) -> Mapping:
    """The stage: the storage's params with every target pruned and updated by the engine.

    Parameters
    ----------
    storage : WholeFile
        The input, read whole (its ``wf`` is handed to the engine; not modified).
    targets : list of PlanEntry
        The weights to prune, from the plan.
    spec : PruneSpec
        The checked request (``spec.method`` in :data:`RECONSTRUCTIONS`).
    hooks : Hooks
        Told of the calibration stage.
    global_masks : callable
        ``global_masks(targets, spec)``: the pipeline's global ranking (keep masks),
        called with the stand-in's request when ``spec.global_``.

    Returns
    -------
    mapping
        The params, targets replaced (and their tied names with them).

    Raises
    ------
    PruneError
        Unreadable calibration data, data that does not fit the graph, a target the
        engine cannot reconstruct: one line; nothing is written.
    """
    from arrayprune.adapters.calibration import read_calibration
    from arrayprune.adapters.request import PruneError, error_text, optional_module

    method = RECONSTRUCTIONS[spec.method]
    if storage.kind not in method.formats:
        kind = storage.kind
        raise PruneError(f"--method {spec.method} writes {kind} as {kind}: give OUT the input's suffix", storage.src)
    optional_module("onnxruntime", "onnx", f"--method {spec.method}")
    try:
        calibration = read_calibration(spec.calibration)
    except ValueError as exc:
        raise PruneError(error_text(exc), spec.calibration) from None
    options: dict[str, Any] = {"amount": spec.amount}
    if spec.nm is not None:
        options = {"n": spec.nm[0], "m": spec.nm[1]}
    elif spec.global_:
        masks = global_masks(targets, dataclasses.replace(spec, method=method.stand_in(spec), one_pass=False))
        options["amount"] = amounts_from_masks({t.name: mask for t, mask in zip(targets, masks, strict=True)})
    samples = len(next(iter(calibration.values())))
    how = "every Hessian from the dense model" if spec.one_pass else "layer by layer"
    hooks.stage(f"{spec.method}: {len(targets)} weights, {samples} calibration samples through onnxruntime, {how}")
    try:
        done = method.engine(
            storage.wf,
            [t.name for t in targets],
            calibration,
            **options,
            sequential=not spec.one_pass,
            batch_size=spec.calibration_batch,
        )
    except (ValueError, TypeError) as exc:
        raise PruneError(f"--method {spec.method}: {error_text(exc)}", storage.src) from None
    updated = {}
    for t in targets:
        updated[t.path] = done[t.name].weight
        updated.update(dict.fromkeys(t.tied, done[t.name].weight))
    return mp.replace(storage.params, updated)
