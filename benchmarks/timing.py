"""Timing: alternating runs in one process, medians of repeats, timeit-style ``number``.

A *bench* is a callable, a pair ``(setup, run)`` or a :class:`Bench`: ``setup()`` builds a fresh state
outside the timed region (a deep copy of a model, say) and ``run(state)`` is timed.
:func:`compare` runs several benches on the same data: round after round, each bench
takes one sample in turn (the order rotates every round), so slow drifts of a noisy
machine hit every bench alike. A sample times ``number`` calls back to back, with the
garbage collector off (as :mod:`timeit` does; ``gc.collect()`` runs before and after each
comparison, not between samples: with PyTorch imported one collection takes ~0.1 s); ``number`` is calibrated so that a sample
lasts at least ``min_sample_s``. Slow benches get fewer samples (``max_bench_s`` of
work each, never fewer than ``min_repeats``). The result is the median time per call.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Bench", "Settings", "Timing", "compare"]


@dataclass(frozen=True)
class Settings:
    """How hard to time: the full suite and ``--quick`` differ only here."""

    min_sample_s: float = 0.02
    repeats: int = 11
    min_repeats: int = 3
    max_bench_s: float = 4.0
    max_number: int = 10_000


@dataclass
class Timing:
    """Median time per call of one bench, with its samples."""

    median: float
    number: int
    samples: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"median_s": self.median, "min_s": min(self.samples), "number": self.number, "samples_s": self.samples}


@dataclass(frozen=True)
class Bench:
    """A timed call with optional fresh state and surroundings.

    ``setup()`` builds a state per call outside the timed region and ``run(state)`` is
    timed; ``enter()`` / ``exit()`` run around each sample, untimed (e.g. to time
    PyTorch with one thread: ``torch.set_num_threads(1)`` and back).
    """

    run: Callable[..., Any]
    setup: Callable[[], Any] | None = None
    enter: Callable[[], Any] | None = None
    exit: Callable[[], Any] | None = None


def _split(bench: Any) -> Bench:
    if isinstance(bench, Bench):
        return bench
    if isinstance(bench, tuple):
        return Bench(run=bench[1], setup=bench[0])
    return Bench(run=bench)


def _sample(bench: Bench, number: int) -> float:
    setup, run = bench.setup, bench.run
    states = [setup() for _ in range(number)] if setup is not None else None
    if bench.enter is not None:
        bench.enter()
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        if states is None:
            t0 = time.perf_counter()
            for _ in range(number):
                run()
            t1 = time.perf_counter()
        else:
            t0 = time.perf_counter()
            for s in states:
                run(s)
            t1 = time.perf_counter()
    finally:
        if gc_was_enabled:
            gc.enable()
        if bench.exit is not None:
            bench.exit()
    del states
    return (t1 - t0) / number


def compare(benches: dict[str, Any], settings: Settings, *, repeats: dict[str, int] | None = None) -> dict[str, Timing]:
    """Time every bench on alternating rounds; return the median time per call of each.

    Parameters
    ----------
    benches : dict
        Name to a callable, or to a ``(setup, run)`` pair.
    settings : Settings
        Sample length and repeat counts.
    repeats : dict, optional
        Fixed number of samples for some benches (e.g. 2 for a 20-second one).
    """
    gc.collect()
    plan: dict[str, tuple[Bench, int, int]] = {}
    first: dict[str, float] = {}
    for name, bench in benches.items():
        b = _split(bench)
        if repeats and name in repeats:  # slow bench: no warm-up, a fixed number of samples
            plan[name] = (b, 1, repeats[name])
            continue
        _sample(b, 1)  # warm-up: first-call costs (imports, caches) are not counted
        per_call = _sample(b, 1)
        number = 1
        if per_call >= 5 * settings.min_sample_s:
            first[name] = per_call  # a slow bench: this call already is a sample
        else:
            number = min(settings.max_number, max(1, math.ceil(settings.min_sample_s / max(per_call, 1e-9))))
            if number > 1:  # refine on a sample of the calibrated length
                per_call = min(per_call, _sample(b, number))
                number = min(settings.max_number, max(1, math.ceil(settings.min_sample_s / max(per_call, 1e-9))))
        r = int(settings.max_bench_s / max(per_call * number, 1e-9))
        r = max(settings.min_repeats, min(settings.repeats, r))
        plan[name] = (b, number, r)
    samples: dict[str, list[float]] = {name: [first[name]] if name in first else [] for name in benches}
    names = list(benches)
    rounds = max(p[2] for p in plan.values())
    for i in range(rounds):
        k = i % len(names)
        for name in names[k:] + names[:k]:
            b, number, r = plan[name]
            if len(samples[name]) < r:
                samples[name].append(_sample(b, number))
    gc.collect()
    out = {}
    for name, s in samples.items():
        ordered = sorted(s)
        mid = len(ordered) // 2
        median = ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])
        out[name] = Timing(median, plan[name][1], s)
    return out
