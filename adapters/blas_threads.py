"""One BLAS thread for SparseGPT's small matrices.

SparseGPT on a file spends its linear algebra on ``K x K`` Hessians: the running
``X^T X`` of every calibration batch, then a Cholesky factorization and an inverse per
weight. For ``K`` up to a thousand or so these are small BLAS and LAPACK calls, and a
multi-threaded BLAS (OpenBLAS, as NumPy ships it) loses time waking and synchronising
its threads, the more so on a machine whose cores are busy, or right after an
onnxruntime session has run its own thread pool. Measured on 2 shared x86_64 cores at a
load average of 5 to 9 (512 rows, medians of 5, ms, all BLAS threads / one; NumPy 2.4
and its OpenBLAS; ``benchmarks/results/sparsegpt-cpu-x86_64-2cores.md``):

======  ============  ============  =============
K       ``X^T X``     Cholesky      inverse
======  ============  ============  =============
256     12.4 / 0.8    105.3 / 0.5   1.6 / 1.7
1024    12.5 / 14.6   21.0 / 18.5   65.0 / 69.9
2048    36.8 / 49.1   96.1 / 114.8  278.0 / 454.0
======  ============  ============  =============

One thread wins by far at 256, the two are even at 1024, all threads win at 2048.
:func:`blas_threads` limits BLAS to one thread while the largest ``K`` is at most
:data:`SMALL`, through ``threadpoolctl`` where it is installed
(it comes with the ``onnx`` extra); larger Hessians keep every thread, which pays on
machines with idle cores.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["SMALL", "blas_threads"]

#: The largest Hessian side computed with one BLAS thread.
SMALL = 1024


@contextlib.contextmanager
def blas_threads(k: int) -> Iterator[None]:
    """BLAS limited to one thread inside the block if `k` is at most :data:`SMALL` (and threadpoolctl is there).

    Parameters
    ----------
    k : int
        The side of the largest Hessian computed inside the block.
    """
    if k > SMALL:
        yield
        return
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        yield
        return
    with threadpool_limits(limits=1, user_api="blas"):
        yield
