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
from arrayprune.adapters.pipeline.hf_stage import calibrated, dense_input_norms, given_hessians
from arrayprune.adapters.pipeline.job import Job
from arrayprune.adapters.pipeline.reconstruct_stage import reconstruct
from arrayprune.adapters.pipeline.scoring import input_norms

__all__ = ["RUNNERS", "Runner", "compress", "dense_norms", "runner_for"]

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
