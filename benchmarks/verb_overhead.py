"""Per-call overhead of the verbs on tiny inputs, where the call itself is what is timed.

``python -m benchmarks.verb_overhead`` prints the best of 7 repeats of 2,000 calls of the
functional verb, the mapping verb and the drop-in's verb (a fresh ``Linear(8, 8)``
each call). Run it on two commits, alternating, to compare the ways verbs are made.
"""

from __future__ import annotations

import timeit

import numpy as np


def main() -> None:
    import torch

    import arrayprune as ap
    import arrayprune.adapters.torch as prune
    from arrayprune.adapters import mapping as mp

    x = np.random.default_rng(0).standard_normal(64).astype(np.float32)
    params = {"w": x}

    def dropin() -> None:
        prune.l1_unstructured(torch.nn.Linear(8, 8, bias=False), "weight", amount=0.5)

    cases = (
        ("ap.l1_unstructured(x64)", lambda: ap.l1_unstructured(x, 0.5)),
        ("mapping.l1_unstructured(x64)", lambda: mp.l1_unstructured(params, "w", 0.5)),
        ("prune.l1_unstructured(Linear(8, 8))", dropin),
    )
    for label, call in cases:
        seconds = min(timeit.repeat(call, number=2000, repeat=7)) / 2000
        print(f"{label}: {seconds * 1e6:.1f} us")


if __name__ == "__main__":
    main()
