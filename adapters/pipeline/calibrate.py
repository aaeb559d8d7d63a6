"""The calibrate stage: the statistic a job's method needs, from the one runner that can give it.

A method's score declares the statistic of calibration data it needs
(:attr:`Score.statistic <arrayprune.method_parts.Score.statistic>`): none, the input
norms of each layer (Wanda's scores, and OWL's outliers), or the Hessian of each
layer's inputs (a method with a solver, such as SparseGPT). A *runner* computes
statistics from the data the request gives; :data:`RUNNERS` is the table, one row per
runner, and :func:`runner_for` picks the row of a job:

================  ===========================================  ===========================
runner            input and data                                sequential
================  ===========================================  ===========================
``file``          ``--input-norms`` norms.npz, ``--hessians``   no: given
                  hessians.npz (safetensors)
``transformers``  a Hugging Face folder, ``--calibration``      yes, layer by layer
                  token ids                                     (``--one-pass``: dense)
``onnxruntime``   an ONNX graph, ``--calibration`` samples      yes for Hessians, weight
                                                                 by weight (``--one-pass``:
                                                                 dense); input norms: dense
================  ===========================================  ===========================

Every runner answers two questions, in the order the pipeline asks them:

* :func:`dense_norms`: the input norms of the dense model, before anything is pruned
  (what the masks of a one-pass method rank by, and what ``--allocation owl`` counts
  outliers among); None where the runner computes them while it prunes;
* :func:`compress`: the targets' new values, where the runner prunes while it
  calibrates (sequentially, each layer on the model whose earlier layers are pruned,
  or from given Hessians); None where the masks are made afterwards from
  :func:`dense_norms`.

A shrink job (:class:`~arrayprune.adapters.pipeline.job.ShrinkJob`) asks a third question
of the transformers runner, :func:`unit_scores`: what calibration data say of the units
it removes. :data:`UNIT_STATISTICS` is that table, one row per statistic:

=====================  ===============================  ==================================
statistic              units                             how
=====================  ===============================  ==================================
``residual_change``    decoder layers                    ``1 - cosine`` of each layer's
                                                          residual stream, dense model;
                                                          then ``X^T X`` and ``X^T F`` of
                                                          the projection before each run
                                                          of removed layers, refit
``router_statistics``  experts (with ``--calibration``)  routing weight per token, dense
``unit_hessians``      channels, heads (a calibrated     ``X^T X`` of each consumer's
                       structured method)                inputs, layer after layer on
                                                          the model already pruned
``consumer_hessians``  an ONNX graph's channel groups    ``X^T X`` of the inputs of every
                       or heads (a calibrated            layer reading a group, dense
                       structured method)                model, one onnxruntime pass
=====================  ===============================  ==================================

The first three are a Hugging Face folder's, the last an ONNX graph's (not run by a dry run).

The engines themselves are below this stage: :mod:`~arrayprune.adapters.pipeline.calibration`
(onnxruntime, input norms), :mod:`~arrayprune.adapters.pipeline.reconstruction`
(onnxruntime, Hessians and a solver), :mod:`~arrayprune.adapters.pipeline.hf_calibration`
(transformers, layer by layer), through :mod:`~arrayprune.adapters.pipeline.reconstruct_stage`
and :mod:`~arrayprune.adapters.pipeline.hf_stage`. A new runner is a row here; a new
statistic, an engine that computes it and a line in each runner that can.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from arrayprune.adapters.pipeline.allocation_request import OWL
from arrayprune.adapters.pipeline.calibration import read_calibration
from arrayprune.adapters.pipeline.errors import PruneError, error_text, optional_module
from arrayprune.adapters.pipeline.hf_stage import calibrated, dense_input_norms, given_hessians
from arrayprune.adapters.pipeline.job import Job, ShrinkJob
from arrayprune.adapters.pipeline.layer_choice import choose_layers, score_layers
from arrayprune.adapters.pipeline.reconstruct_stage import reconstruct
from arrayprune.adapters.pipeline.reconstruction import onnx_input_hessians
from arrayprune.adapters.pipeline.scoring import input_norms
from arrayprune.adapters.pipeline.shrink_request import check_group_amount
from arrayprune.adapters.pipeline.shrink_structure import (
    UnitScores,
    decide_layers,
    decide_units,
    score_calibrated,
    score_experts,
    shrink_errors,
    walk_arguments,
)
from arrayprune.adapters.pipeline.storage import WholeFile
from arrayprune.adapters.roles.onnx_groups import onnx_groups
from arrayprune.adapters.shrink import consumers

__all__ = [
    "RUNNERS",
    "UNIT_STATISTICS",
    "Runner",
    "UnitStatistic",
    "compress",
    "dense_norms",
    "runner_for",
    "unit_scores",
]

#: ``global_masks(targets, spec)``: the pipeline's global ranking (keep masks).
GlobalMasks = Callable[[list[Any], Any], list[Any]]


@dataclass(frozen=True)
class Runner:
    """One way of computing statistics of calibration data: a row of :data:`RUNNERS`.

    Attributes
    ----------
    name : str
        ``"file"``, ``"transformers"``, ``"onnxruntime"``.
    applies : callable
        ``applies(job)``: whether this runner serves the job (the first row that does, wins).
    norms : callable
        ``norms(job, allocation)``: the dense model's input norms of every target, or
        None where this runner computes them while it prunes (`allocation`: asked for
        ``--allocation``, before pruning).
    compress : callable
        ``compress(job, stack, global_masks)``: the targets' new values where the
        runner prunes while it calibrates (weight name or path -> values, as the
        storage's writer takes them), else None. Temporary files live as long as `stack`.
    """

    name: str
    applies: Callable[[Job], bool]
    norms: Callable[[Job, bool], Mapping | None]
    compress: Callable[[Job, contextlib.ExitStack, GlobalMasks], Any]


def _norms(job: Job) -> Mapping | None:
    return input_norms(job.spec, job.storage, job.targets, job.src, job.hooks)


def _file_compress(job: Job, stack: contextlib.ExitStack, global_masks: GlobalMasks) -> Any:
    if not job.spec.hessians:
        return None
    return given_hessians(job, stack)


def _layerwise_norms(job: Job, allocation: bool) -> Mapping | None:
    # Pruning takes its norms layer by layer, from the pruned model; OWL counts outliers on the dense one.
    if allocation and job.spec.allocation == OWL:
        return dense_input_norms(job)
    return None


def _layerwise_compress(job: Job, stack: contextlib.ExitStack, global_masks: GlobalMasks) -> Any:
    return calibrated(job, stack)


def _graph_norms(job: Job, allocation: bool) -> Mapping | None:
    # A solver takes Hessians weight by weight; its input norms (for OWL) from the same activations.
    if job.solves and not (allocation and job.spec.allocation == OWL):
        return None
    return _norms(job)


def _graph_compress(job: Job, stack: contextlib.ExitStack, global_masks: GlobalMasks) -> Any:
    if not job.solves:
        return None
    return reconstruct(job, global_masks)


#: The runners, in the order they are tried (:func:`runner_for`).
RUNNERS: tuple[Runner, ...] = (
    Runner(
        "file",
        applies=lambda job: bool(job.spec.input_norms or job.spec.hessians),
        norms=lambda job, allocation: _norms(job),
        compress=_file_compress,
    ),
    Runner(
        "transformers",
        applies=lambda job: job.streamed and bool(job.spec.calibration),
        norms=_layerwise_norms,
        compress=_layerwise_compress,
    ),
    Runner(
        "onnxruntime",  # input norms of other inputs are refused there, with the reason
        applies=lambda job: bool(job.spec.calibration),
        norms=_graph_norms,
        compress=_graph_compress,
    ),
)


def runner_for(job: Job) -> Runner | None:
    """The runner that computes the job's statistics; None without calibration data."""
    return next((row for row in RUNNERS if row.applies(job)), None)


def dense_norms(job: Job, *, allocation: bool = False) -> Mapping | None:
    """The input norms of every target from the dense model, where the job's runner gives them first.

    Parameters
    ----------
    job : Job
        The job.
    allocation : bool, default False
        Asked by ``--allocation`` (OWL counts outliers among Wanda's scores, whatever
        the method), not by the masks.

    Returns
    -------
    mapping or None
        Weight name -> its input norms; None without calibration data, or where the
        runner computes them while it prunes (:func:`compress`).

    Raises
    ------
    PruneError
        Data that do not fit the model, a runner that cannot run the input: one line.
    """
    runner = runner_for(job)
    return None if runner is None else runner.norms(job, allocation)


def compress(job: Job, stack: contextlib.ExitStack, global_masks: GlobalMasks) -> Any:
    """The targets' new values where the job's runner prunes while it calibrates; None otherwise.

    Parameters
    ----------
    job : Job
        The job (its request with the per-target amounts of an allocation, if any).
    stack : contextlib.ExitStack
        Holds the temporary files of values set aside until they are written.
    global_masks : callable
        ``global_masks(targets, spec)``: the pipeline's global ranking, for a solver
        pruning each weight to its count of one global ranking.

    Returns
    -------
    mapping or None
        For an ONNX graph, the params with every target (and its tied names) replaced;
        for a checkpoint, weight name -> a function returning its pruned entries.

    Raises
    ------
    PruneError
        As the runner's engine raises them: one line, nothing written.
    """
    runner = runner_for(job)
    return None if runner is None else runner.compress(job, stack, global_masks)


@dataclass(frozen=True)
class UnitStatistic:
    """A statistic that ranks a shrink job's units: a row of :data:`UNIT_STATISTICS`.

    Attributes
    ----------
    name : str
        As :attr:`UnitScores.statistic <arrayprune.adapters.pipeline.shrink_structure.UnitScores.statistic>`.
    applies : callable
        ``applies(job)``: whether the job's units are ranked by it.
    compute : callable
        ``compute(job, stack)``: the :class:`~arrayprune.adapters.pipeline.shrink_structure.UnitScores`;
        files it sets aside live as long as `stack`.
    """

    name: str
    applies: Callable[[ShrinkJob], bool]
    compute: Callable[[ShrinkJob, contextlib.ExitStack], UnitScores]


def _layer_changes(job: ShrinkJob, stack: contextlib.ExitStack) -> UnitScores:
    spec, args = job.spec, walk_arguments(job)
    deciding = spec.amount is not None and (spec.dry_run or job.dst is not None)
    if deciding and spec.compensate:  # chosen one at a time, as they would be refit
        scores = choose_layers(job.src, spec.amount, spec.calibration, beside=job.dst, **args)
    else:
        scores = UnitScores("residual_change", *score_layers(job.src, spec.calibration, **args))
    if spec.dry_run or not deciding:  # nothing is written
        return scores
    return decide_layers(
        job.src, job.dst, spec.amount, spec.calibration, stack, scores=scores, compensated=spec.compensate, **args
    )


def _router(job: ShrinkJob, stack: contextlib.ExitStack) -> UnitScores:
    return UnitScores("router_statistics", *score_experts(job.src, job.spec.calibration, **walk_arguments(job)))


def _unit_hessians(job: ShrinkJob, stack: contextlib.ExitStack) -> UnitScores:
    spec = job.spec
    if spec.dry_run:  # the scores on the dense model: nothing is chosen
        dense = score_calibrated(job.src, spec.method, None, spec.calibration, job.groups, **walk_arguments(job))
        return UnitScores("unit_hessians", *dense)
    if job.dst is None:
        raise ValueError("the calibrated units are decided for an output: give one")
    return decide_units(
        job.src, job.dst, spec.method, spec.amount, spec.calibration, job.groups, stack,
        compensated=spec.compensate, **walk_arguments(job),
    )  # fmt: skip


def _consumer_hessians(job: ShrinkJob, stack: contextlib.ExitStack) -> UnitScores:
    spec, src = job.spec, job.src
    optional_module("onnxruntime", "onnx", f"--method {spec.method}")
    try:
        calibration = read_calibration(spec.calibration)
    except ValueError as exc:
        raise PruneError(error_text(exc), spec.calibration) from None
    wf = WholeFile(src, "onnx", job.hooks).wf
    try:
        found = onnx_groups(wf.context["model"], job.groups)
        if spec.amount is not None:  # before the calibration runs the model
            check_group_amount(found, spec.amount, src, spec.global_, spec.rounding)
        readers, _ = consumers(wf.context["model"], found, spec.amount, spec.rounding)
        samples = len(next(iter(calibration.values())))
        job.hooks.stage(
            f"{spec.method}: Hessians of the {len(readers)} layers reading {len(found.groups)} groups, "
            f"{samples} calibration samples through onnxruntime, dense model"
        )
        hessians = onnx_input_hessians(wf, list(readers), calibration, batch_size=spec.calibration_batch)
    except PruneError:
        raise
    except (ValueError, TypeError) as exc:
        raise PruneError(f"--shrink --method {spec.method}: {error_text(exc)}", src) from None
    return UnitScores("consumer_hessians", found, hessians)


def _folder(job: ShrinkJob) -> bool:
    return job.kind == "sharded safetensors"


#: The statistics of a shrink job's units, in the order they are tried (:func:`unit_scores`).
UNIT_STATISTICS: tuple[UnitStatistic, ...] = (
    UnitStatistic("residual_change", lambda job: _folder(job) and job.groups == "layers", _layer_changes),
    UnitStatistic(
        "router_statistics",
        lambda job: _folder(job) and job.groups == "experts" and bool(job.spec.calibration),
        _router,
    ),
    UnitStatistic("unit_hessians", lambda job: _folder(job) and not job.whole_units and job.calibrated, _unit_hessians),
    UnitStatistic(
        "consumer_hessians",
        lambda job: job.kind == "onnx" and not job.whole_units and job.calibrated and not job.spec.dry_run,
        _consumer_hessians,
    ),
)


def unit_scores(job: ShrinkJob, stack: contextlib.ExitStack) -> UnitScores | None:
    """What calibration data say of a shrink job's units (a folder's, an ONNX graph's), before anything is written.

    Parameters
    ----------
    job : ShrinkJob
        The job, checked by :func:`~arrayprune.adapters.pipeline.shrinking.check_shrink_job`.
    stack : contextlib.ExitStack
        Holds the refit consumers set aside until the shrink stage writes them.

    Returns
    -------
    UnitScores or None
        None for units ranked by their weights (and for an ONNX graph's dry run).

    Raises
    ------
    PruneError
        Token ids or samples that do not fit, a model transformers cannot build, a
        group of an ONNX graph whose consumers cannot be scored: one line.
    """
    row = next((r for r in UNIT_STATISTICS if r.applies(job)), None)
    if row is None:
        return None
    with shrink_errors(job):
        return row.compute(job, stack)
