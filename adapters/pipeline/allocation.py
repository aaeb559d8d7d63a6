"""The allocation stage of the file pipeline: each weight's share of the pruning, ``prune --allocation``.

``--allocation scan.json`` reads the curves of a sensitivity scan
(:mod:`arrayprune.adapters.pipeline.scan`) and gives each selected weight the count of entries
that minimises the summed predicted error (:func:`arrayprune.allocate_from_curves`);
``--allocation owl`` sets the counts from outlier ratios of the importance scores (OWL,
:func:`arrayprune.owl_allocation`): Wanda's ``|W| * ||X||`` where the calibration data give
input norms (``wanda``, ``sparsegpt``, or ``l1_unstructured`` with ``--calibration``), the
magnitudes otherwise. Either way the selected weights lose ``round(amount * n)`` entries
in all, each within ``--min-sparsity`` and ``--max-sparsity``.

With ``--calibration`` (ONNX), a scan's allocation is **checked jointly**: the curves
come from one weight pruned at a time and miss how layers interact, so the scan's counts,
uniform and global (:func:`candidate_counts`) each prune the model in memory and run
the calibration data (:func:`measure_allocations`, the scan's metric with every weight
pruned at once); a few coordinate moves from the best of them follow
(:func:`refine_counts`), and the least measured error wins, ties to the scan's
(``allocation_check=False``, ``--no-allocation-check``: the scan's counts as they are).

A method that prunes the same number of entries from every output unit (``wanda``)
moves in steps of its number of output units, and ``ln_structured`` in whole channels;
the total is then the nearest the steps reach below it. The counts become the amounts
handed to each weight's method (:func:`arrayprune.adapters.pipeline.method_for`) or to
SparseGPT (a count per weight).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

import arrayprune
from arrayprune.adapters.formats.arrays import to_numpy
from arrayprune.adapters.formats.safetensors_stream import TensorFiles
from arrayprune.adapters.pipeline.allocation_request import OWL
from arrayprune.adapters.pipeline.calibration import read_calibration, wanda_scores_for
from arrayprune.adapters.pipeline.errors import PruneError, error_text
from arrayprune.adapters.pipeline.job import Job
from arrayprune.adapters.pipeline.method_names import reconstructs
from arrayprune.adapters.pipeline.reconstruction import onnx_sparsegpt
from arrayprune.adapters.pipeline.scan import OnnxTrials, ScanResult
from arrayprune.adapters.pipeline.scoring import method_for, scores_for, trial_request
from arrayprune.adapters.pipeline.stream_pruning import read_whole
from arrayprune.adapters.plan import file_roles, make_plan
from arrayprune.allocation import _bounds, counts_near
from arrayprune.method_parts import PER_OUTPUT, pattern_of

if TYPE_CHECKING:  # the request module imports this one
    from arrayprune.adapters.pipeline.request import PruneSpec

__all__ = [
    "CANDIDATES",
    "OWL",
    "REFINE_ROUNDS",
    "REFINE_STEP",
    "Allocation",
    "allocate",
    "candidate_counts",
    "measure_allocations",
    "refine_counts",
]


#: The allocations a joint check measures, in the order ties are broken.
CANDIDATES = ("scan", "uniform", "global")
#: Refinement rounds of a joint check (coordinate moves from the best candidate).
REFINE_ROUNDS = 4
#: The first move of a refinement, as a fraction of the entries pruned in all.
REFINE_STEP = 0.02


@dataclass
class Allocation:
    """Each selected weight's share of the pruning.

    Attributes
    ----------
    source : str
        ``"owl"`` or the scan file.
    counts : dict of str to int
        Weight name to the entries it loses.
    sizes : dict of str to int
        Weight name to its entries.
    amounts : dict of str to int
        Weight name to the amount its method is given (entries; per output unit for
        ``wanda``; channels for ``ln_structured``).
    notes : list of str
        What the command says about it (a scan made with another method).
    checked : dict of str to float
        The joint check (a scan's allocation with calibration data): each candidate of
        :data:`CANDIDATES` to the output error measured with every weight pruned at
        once; empty without a check.
    candidates : dict of str to dict of str to int
        Each candidate's counts (weight name to entries), with the check.
    chosen : str
        The candidate whose counts are used: the least measured error, ties to the
        scan's; ``"scan"`` without a check.
    samples : int
        Samples of the check.
    check_data : str or None
        The file of ``--allocation-check-data`` the check ran on (None: the calibration data).
    """

    source: str
    counts: dict[str, int] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)
    amounts: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    checked: dict[str, float] = field(default_factory=dict)
    candidates: dict[str, dict[str, int]] = field(default_factory=dict)
    chosen: str = "scan"
    samples: int = 0
    check_data: str | None = None

    def sparsity(self, name: str) -> float:
        """The sparsity weight `name` is given."""
        return self.counts[name] / self.sizes[name] if self.sizes[name] else 0.0

    def describe(self) -> str:
        """One line per weight: its share, as a table for people."""
        width = max((len(n) for n in self.counts), default=6)
        lines = [f"{'weight'.ljust(width)}  sparsity  pruned/entries"]
        for name, k in self.counts.items():
            lines.append(f"{name.ljust(width)}  {100 * self.sparsity(name):7.2f}%  {k}/{self.sizes[name]}")
        total, n = sum(self.counts.values()), sum(self.sizes.values())
        lines.append(f"{'all'.ljust(width)}  {100 * total / n if n else 0.0:7.2f}%  {total}/{n}")
        if self.checked:
            errors = ", ".join(f"{how} {e:.6g}" for how, e in self.checked.items())
            what = "calibration samples" if self.check_data is None else f"samples of {self.check_data}"
            lines.append(
                f"checked jointly on {self.samples} {what} (output error, every weight pruned): "
                f"{errors}; chosen: {self.chosen}"
            )
        return "\n".join(lines)


def _step(target: Any, method: str) -> int:
    """Entries a weight loses at a time under `method`."""
    size = math.prod(target.shape)
    pattern = pattern_of(arrayprune.METHODS[method]) if method in arrayprune.METHODS else None
    if pattern is PER_OUTPUT:  # the same count from each output unit
        return int(target.shape[target.dim]) if size else 1
    if pattern is not None and pattern.unit == "channels":  # whole channels
        return size // int(target.shape[target.dim]) if size else 1
    return 1


def _owl_scores(
    spec: PruneSpec, storage: Any, targets: list[Any], norms: Mapping | None, src: str, hooks: Any
) -> list[Any]:
    """The scores OWL counts outliers among: Wanda's where input norms exist, else magnitudes."""
    scores = []
    for t in targets:
        value = np.asarray(t.value)
        if norms is None:
            scores.append(np.abs(value))
            continue
        try:
            scores.append(np.asarray(wanda_scores_for(value, t.role, norms[t.name], t.name)))
        except ValueError as exc:
            raise PruneError(f"--allocation owl: {error_text(exc)}", src) from None
    return scores


def _owl_uniform_note(m: float, ratios: list[float], calibrated: bool) -> str | None:
    """The note when OWL finds the same outlier ratio in every weight (its allocation is then uniform)."""
    if len(set(ratios)) != 1:
        return None
    what = "Wanda's scores" if calibrated else "magnitudes alone (no --calibration or --input-norms)"
    return (
        f"--allocation owl: every weight has the same outlier ratio ({100 * ratios[0]:.2f}% of its scores above "
        f"{m:g} x their mean) on {what}, so every weight gets the same sparsity (uniform): "
        + "to spread it, give "
        + ("--calibration (or --input-norms) for Wanda's scores, or " if not calibrated else "")
        + "a smaller --owl-m (more entries count as outliers)"
    )


def _owl_ratios(
    spec: PruneSpec, storage: Any, targets: list[Any], norms: Mapping | None, src: str, hooks: Any, m: float
) -> list[float]:
    """Each target's outlier ratio among OWL's scores (:func:`_owl_scores`), one target
    read at a time (a streamed checkpoint's whole, as the in-memory path reads it)."""
    if not getattr(storage, "streamed", False):
        return [arrayprune.outlier_ratio(s, m) for s in _owl_scores(spec, storage, targets, norms, src, hooks)]
    ratios = []
    with TensorFiles() as files:
        for t in targets:
            try:
                value = read_whole(files, t)
            except TypeError as exc:
                raise PruneError(f"--allocation owl: {error_text(exc)}", src) from None
            if not isinstance(value, np.ndarray):  # bfloat16: as float32
                value = to_numpy(value.float())
            (score,) = _owl_scores(spec, storage, [dataclasses.replace(t, value=value)], norms, src, hooks)
            ratios.append(arrayprune.outlier_ratio(score, m))
            files.release_tensor(t.value)
    return ratios


def _scan_curves(spec: PruneSpec, targets: list[Any]) -> tuple[list[list[float]], Any, list[str]]:
    """The curves of the targets from the scan file, the scan, and what to note about them."""

    try:
        scan = ScanResult.load(spec.allocation)
    except ValueError as exc:
        raise PruneError(error_text(exc), spec.allocation) from None
    curves = []
    for t in targets:
        try:
            curve = scan.curve(t.name)
        except KeyError:
            raise PruneError(
                f"no curve for {t.name!r} (selected for pruning): scan it with the same --include/--exclude",
                spec.allocation,
            ) from None
        if tuple(curve.shape) != tuple(t.shape):
            raise PruneError(f"{t.name!r} was scanned with shape {curve.shape}, not {t.shape}", spec.allocation)
        curves.append(list(curve.errors))
    notes = []
    if scan.method != spec.method:
        notes.append(f"--allocation: the scan measured {scan.method}; pruning with {spec.method}")
    return curves, scan, notes


def allocate(job: Job, norms: Mapping | None) -> Allocation:
    """The stage: each target's count of pruned entries, from a scan's curves or OWL.

    Parameters
    ----------
    job : Job
        The job (its request with ``allocation`` set); its hooks are told of the stage.
    norms : mapping or None
        The dense model's input norms, where the calibrate stage gives them
        (:func:`~arrayprune.adapters.pipeline.calibrate.dense_norms`).

    Returns
    -------
    Allocation

    Raises
    ------
    PruneError
        An unreadable scan, a target without a curve, bounds that cannot hold the total.
    """
    spec, storage, targets, src, hooks = job.spec, job.storage, job.targets, job.src, job.hooks
    sizes = [math.prod(t.shape) for t in targets]
    steps = [_step(t, spec.method) for t in targets]
    bounds = {"min_sparsity": spec.min_sparsity, "max_sparsity": spec.max_sparsity, "steps": steps}
    notes: list[str] = []
    try:
        if spec.allocation == OWL:
            hooks.stage(f"allocation: OWL over {len(targets)} weights")
            m = arrayprune.allocation.OWL_M if spec.owl_m is None else spec.owl_m
            if not (math.isfinite(m) and m >= 0):
                raise ValueError(f"m and lam must be finite and >= 0, got m={m}, lam={spec.owl_lambda}")
            ratios = _owl_ratios(spec, storage, targets, norms, src, hooks, m)
            lam = {} if spec.owl_lambda is None else {"lam": spec.owl_lambda}
            counts = arrayprune.allocation.owl_counts(ratios, sizes, spec.amount, **lam, **bounds)
            calibrated = norms is not None or (reconstructs(spec.method) and bool(spec.calibration))
            uniform = _owl_uniform_note(m, ratios, calibrated)
            notes.extend([uniform] if uniform else [])
        else:
            curves, scan, notes = _scan_curves(spec, targets)
            sparsities = scan.sparsities
            hooks.stage(f"allocation: {len(targets)} weights from the curves of {spec.allocation}")
            counts = arrayprune.allocate_from_curves(curves, sizes, spec.amount, sparsities=sparsities, **bounds)
            beyond = [t.name for t, k, n in zip(targets, counts, sizes, strict=True) if n and k / n > sparsities[-1]]
            if beyond:
                notes.append(
                    f"--allocation: {len(beyond)} weight(s) ({', '.join(beyond[:3])}) get more than the scan's last "
                    f"sparsity ({sparsities[-1]:g}), where their curves are extrapolated: scan up to it "
                    "(arrayprune scan --sparsities ...,0.95,0.98)"
                )
    except ValueError as exc:
        if isinstance(exc, PruneError):
            raise
        raise PruneError(f"--allocation: {error_text(exc)}", src) from None
    result = Allocation(spec.allocation, notes=notes)
    onnx = getattr(storage, "kind", None) == "onnx"
    if spec.allocation_check_data is not None and not onnx:
        raise PruneError("--allocation-check-data: the joint check runs ONNX models only", src)
    checked = spec.allocation_check and (spec.calibration or spec.allocation_check_data) and onnx
    if spec.allocation != OWL and checked:
        counts = _check_jointly(spec, storage, targets, norms, counts, scan.outputs, bounds, result, src, hooks)
    for t, n, k, step in zip(targets, sizes, counts, steps, strict=True):
        result.counts[t.name], result.sizes[t.name] = int(k), n
        result.amounts[t.name] = int(k) // step
    return result


def candidate_counts(
    scores: list[Any],
    amount: int | float,
    scan: list[int],
    *,
    min_sparsity: float | None = None,
    max_sparsity: float | None = None,
    steps: list[int] | None = None,
) -> dict[str, list[int]]:
    """The allocations a joint check compares (:data:`CANDIDATES`): each weight's count under each.

    Parameters
    ----------
    scores : list of ndarray
        Each weight's importance scores (magnitudes, or Wanda's ``|W| * ||X||``); their
        sizes are the weights'.
    amount : int or float
        Fraction of all entries to prune, or their number.
    scan : list of int
        The scan's allocation (:func:`arrayprune.allocate_from_curves`).
    min_sparsity, max_sparsity, steps
        As for :func:`arrayprune.allocate_from_curves`.

    Returns
    -------
    dict of str to list of int
        ``"scan"``: `scan` itself; ``"uniform"``: every weight at the same sparsity;
        ``"global"``: the counts one threshold over all `scores` gives (the
        ``round(amount * n)`` lowest, ties by position). Uniform and global are clipped
        into the bounds, moved to the steps and repaired to the total as
        :func:`arrayprune.counts_near` does (shifted by one common sparsity).
    """
    sizes = [int(np.size(x)) for x in scores]
    n = sum(sizes)
    total = arrayprune.amount.compute_nparams_toprune(amount, n)
    # global pruning's own ranking (ties by position, NaN above +inf), without concatenating
    keeps = arrayprune.L1Unstructured(total).keep_masks(list(scores), [None] * len(scores)) if n else []
    below = [m - int(np.count_nonzero(np.asarray(keep))) for m, keep in zip(sizes, keeps, strict=True)]
    fraction = total / n if n else 0.0

    def near(sparsities: list[float]) -> list[int]:
        return counts_near(sparsities, sizes, amount, min_sparsity=min_sparsity, max_sparsity=max_sparsity, steps=steps)

    wished = [int(k) / m if m else fraction for k, m in zip(below, sizes, strict=True)]
    return {"scan": [int(k) for k in scan], "uniform": near([fraction] * len(sizes)), "global": near(wished)}


def _pruned(
    spec: PruneSpec,
    wf: Any,
    targets: list[Any],
    counts: Mapping[str, int],
    norms: Mapping | None,
    calibration: Mapping[str, np.ndarray] | None,
) -> dict[str, np.ndarray]:
    """Every target pruned to its count, as the pipeline will prune it (nothing written)."""
    if reconstructs(spec.method):
        done = onnx_sparsegpt(
            wf,
            [t.name for t in targets],
            calibration,
            amount=dict(counts),
            sequential=not spec.one_pass,
            batch_size=spec.calibration_batch,
            method=spec.method,
        )
        return {name: np.asarray(r.weight) for name, r in done.items()}

    amounts = {t.name: int(counts[t.name]) // _step(t, spec.method) for t in targets}
    request = dataclasses.replace(spec, amount=amounts)
    out = {}
    for t in targets:
        value = np.asarray(t.value)
        scores = scores_for(t, norms, value)
        ranked = value if scores is None else scores
        keep = np.asarray(method_for(t, request).compute_mask(ranked, None), dtype=bool)
        out[t.name] = np.where(keep, value, np.zeros((), value.dtype))
    return out


def measure_allocations(
    wf: Any,
    calibration: Mapping[str, np.ndarray],
    candidates: Mapping[str, Mapping[str, int]],
    *,
    method: str = "l1_unstructured",
    norms: Mapping[str, Any] | None = None,
    outputs: tuple[str, ...] | list[str] = (),
    batch_size: int | None = None,
    sequential: bool = True,
    check_data: Mapping[str, np.ndarray] | None = None,
) -> dict[str, float]:
    """The output error of an ONNX model pruned by each candidate allocation, every weight at once.

    Each candidate prunes the model in memory (the masks of ``arrayprune prune``, or
    SparseGPT's reconstruction) and runs it on the calibration data with the pruned
    weights fed to one onnxruntime session (:class:`arrayprune.adapters.pipeline.scan.OnnxTrials`):
    the error is the scan's metric against the dense model, for all layers together.

    Parameters
    ----------
    wf : WeightFile
        The model, as :func:`arrayprune.adapters.formats.load` read it; not modified.
    calibration : mapping of str to ndarray
        Every graph input to samples along axis 0.
    candidates : mapping of str to mapping of str to int
        Label to the entries each weight loses (every candidate names the same weights).
    method : str, default "l1_unstructured"
        ``l1_unstructured``, ``wanda``, ``sparsegpt`` or ``ln_structured``; counts of
        ``wanda`` are multiples of the weight's output units, of ``ln_structured`` of
        its channels.
    norms : mapping of str to ndarray, optional
        Wanda's input norms (``wanda``; with ``l1_unstructured`` they rank by Wanda's
        scores within each weight, as ``--calibration`` does).
    outputs : sequence of str, optional
        The values compared (a scan's ``outputs``); every floating graph output if omitted.
    batch_size : int, optional
        Samples run at a time.
    sequential : bool, default True
        SparseGPT: each weight calibrated on the model whose earlier weights are pruned.
    check_data : mapping of str to ndarray, optional
        The samples the error is measured on, if not `calibration` (which then only
        feeds SparseGPT's Hessians): ``--allocation-check-data``.

    Returns
    -------
    dict of str to float
        Label to the measured error, in the order of `candidates`; candidates with the
        same counts are measured once.

    Raises
    ------
    ValueError
        Calibration data that do not fit, an unknown weight or output, a method that
        cannot prune a weight.
    """

    names = list(next(iter(candidates.values()), {}))
    by_name = {e.name: e for e in make_plan(wf.params, file_roles(wf), method=method)}
    missing = [name for name in names if name not in by_name]
    if missing:
        raise ValueError(f"{missing[0]!r} is no tensor of the model")
    spec = trial_request(method, sequential=sequential, batch_size=batch_size)
    return _measure(spec, wf, [by_name[n] for n in names], candidates, norms, calibration, outputs, check_data)[0]


def _measure(
    spec: PruneSpec,
    wf: Any,
    targets: list[Any],
    candidates: Mapping[str, Mapping[str, int]],
    norms: Mapping | None,
    calibration: Mapping[str, np.ndarray] | None,
    outputs: Any,
    check: Mapping[str, np.ndarray] | None = None,
) -> tuple[dict[str, float], int]:
    """Each candidate's joint error on `check` (`calibration` if None), and the samples run.

    `calibration` feeds a reconstruction's Hessians."""

    check = calibration if check is None else check
    trials = OnnxTrials(wf, check, [t.name for t in targets], outputs=outputs, batch_size=spec.calibration_batch)
    errors: dict[str, float] = {}
    seen: dict[tuple[int, ...], float] = {}
    for how, counts in candidates.items():
        key = tuple(int(counts[t.name]) for t in targets)
        if key not in seen:
            seen[key] = trials.error(_pruned(spec, wf, targets, counts, norms, calibration))
        errors[how] = seen[key]
    return errors, trials.samples


def _check_jointly(
    spec: PruneSpec,
    storage: Any,
    targets: list[Any],
    norms: Mapping | None,
    counts: list[int],
    outputs: list[str],
    bounds: Mapping[str, Any],
    result: Allocation,
    src: str,
    hooks: Any,
) -> list[int]:
    """The joint check of a scan's allocation: the candidate with the least measured error (into `result`)."""

    if norms is not None and not reconstructs(spec.method):
        scores = _owl_scores(spec, storage, targets, norms, src, hooks)
    else:
        scores = [np.abs(np.asarray(t.value)) for t in targets]
    candidates = candidate_counts(scores, spec.amount, counts, **bounds)
    named = {how: {t.name: int(k) for t, k in zip(targets, c, strict=True)} for how, c in candidates.items()}
    model = storage.wf.context["model"]
    values = {v for node in model.graph.node for v in node.output} | {o.name for o in model.graph.output}
    compared = list(outputs) if outputs and all(o in values for o in outputs) else []
    data: dict[str, Any] = {}  # what each file holds: the check's samples, and the reconstruction's
    for path in dict.fromkeys(p for p in (spec.allocation_check_data, spec.calibration) if p):
        try:
            data[path] = read_calibration(path)
        except ValueError as exc:
            raise PruneError(error_text(exc), path) from None
    samples_of = data[spec.allocation_check_data or spec.calibration]
    calibration = data[spec.calibration] if spec.calibration else None
    hooks.stage(f"allocation: checking {len(named)} allocations jointly on {len(next(iter(samples_of.values())))} "
                "samples")
    try:
        errors, samples = _measure(spec, storage.wf, targets, named, norms, calibration, compared, check=samples_of)
    except (ValueError, TypeError) as exc:
        raise PruneError(f"--allocation: joint check: {error_text(exc)}", src) from None
    chosen = min(CANDIDATES, key=lambda how: errors[how])  # ties: the first, the scan's
    least, most = _limits(targets, bounds)
    trials = _Evaluator(spec, storage.wf, targets, norms, calibration, compared, check=samples_of)
    try:
        refined, error = refine_counts(trials, candidates[chosen], errors[chosen], least, most, bounds["steps"])
    except (ValueError, TypeError) as exc:
        raise PruneError(f"--allocation: joint check: {error_text(exc)}", src) from None
    if error < errors[chosen]:
        chosen = "refined"
        candidates[chosen] = refined
        named[chosen] = {t.name: int(k) for t, k in zip(targets, refined, strict=True)}
        errors[chosen] = error
    result.checked, result.candidates, result.chosen, result.samples = errors, named, chosen, samples
    result.check_data = spec.allocation_check_data
    return candidates[chosen]


def _limits(targets: list[Any], bounds: Mapping[str, Any]) -> tuple[list[int], list[int]]:
    """Each target's fewest and most pruned entries (multiples of its step) within the bounds."""

    sizes = [math.prod(t.shape) for t in targets]
    return _bounds(sizes, bounds["steps"], bounds["min_sparsity"], bounds["max_sparsity"])


class _Evaluator:
    """``evaluator(counts)``: the joint output error of the targets pruned to `counts` (one session)."""

    def __init__(
        self,
        spec: PruneSpec,
        wf: Any,
        targets: list[Any],
        norms: Any,
        calibration: Any,
        outputs: Any,
        check: Any = None,
    ):

        self.trials = OnnxTrials(
            wf,
            calibration if check is None else check,
            [t.name for t in targets],
            outputs=outputs,
            batch_size=spec.calibration_batch,
        )
        self.args = (spec, wf, targets)
        self.norms, self.calibration = norms, calibration

    def __call__(self, counts: list[int]) -> float:
        spec, wf, targets = self.args
        named = {t.name: int(k) for t, k in zip(targets, counts, strict=True)}
        return self.trials.error(_pruned(spec, wf, targets, named, self.norms, self.calibration))


def refine_counts(
    error: Any,
    counts: list[int],
    start: float,
    least: list[int],
    most: list[int],
    steps: list[int],
    *,
    rounds: int = REFINE_ROUNDS,
    step: float = REFINE_STEP,
) -> tuple[list[int], float]:
    """Coordinate moves from `counts`: entries moved from the most to the least sensitive array, measured jointly.

    Each round measures every array's joint sensitivity (the error's increase per entry
    when that array alone loses ``m`` more entries, the others at the current counts),
    then moves ``m`` entries from the most sensitive array to the least sensitive one;
    the move is kept if the measured error falls, else ``m`` is halved. The total and
    the bounds hold throughout.

    Parameters
    ----------
    error : callable
        ``error(counts)``: the measured joint error.
    counts : list of int
        The start (multiples of `steps`, within `least` and `most`).
    start : float
        ``error(counts)``.
    least, most : list of int
        Each array's bounds, in entries.
    steps : list of int
        Entries each array moves by.
    rounds : int, default :data:`REFINE_ROUNDS`
        Rounds (each ``len(counts) + 1`` measurements at most).
    step : float, default :data:`REFINE_STEP`
        The first move, a fraction of ``sum(counts)``.

    Returns
    -------
    (list of int, float)
        The counts with the least error measured, and that error (`counts`, `start`
        when no move helps).
    """
    best, best_error = list(counts), start
    move = max(1, round(step * sum(counts)))
    for _ in range(rounds):
        slopes = []
        for i, k in enumerate(best):
            m = max(steps[i], move // steps[i] * steps[i])
            if k + m <= most[i]:
                slopes.append(((error([*best[:i], k + m, *best[i + 1 :]]) - best_error) / m, i))
        if len(slopes) < 2:
            break
        slopes.sort()
        cheap = slopes[0][1]
        fragile = next((i for _, i in reversed(slopes) if i != cheap and best[i] > least[i]), None)
        if fragile is None:
            break
        unit = math.lcm(steps[cheap], steps[fragile])
        m = unit * max(1, round(move / unit))
        m = min(m, (most[cheap] - best[cheap]) // unit * unit, (best[fragile] - least[fragile]) // unit * unit)
        if m <= 0:
            break
        trial = list(best)
        trial[cheap] += m
        trial[fragile] -= m
        e = error(trial)
        if e < best_error:
            best, best_error = trial, e
        else:
            move //= 2
            if move < 1:
                break
    return best, best_error
