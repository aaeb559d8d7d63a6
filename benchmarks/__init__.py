"""Benchmark suite of arrayprune against ``torch.nn.utils.prune``.

Run it with ``python -m benchmarks`` from the repository root (``--quick`` for a run of
about a minute, ``--cases`` to pick cases, ``--out`` for the results folder); see
``benchmarks/README.md``. Nothing here is a test: pytest collects only ``tests/``.
"""

SUITE_VERSION = 1
