"""Arrays traced by ``jax.jit``: their shapes are known, their values are not.

Inside ``jax.jit`` arrays are tracers. Anything that reads a value back to Python
(``int()``, ``bool()``, ``float()``) fails on them, so the core takes paths that read
nothing back when it is handed tracers (see :mod:`arrayprune.selection.portable`). What
cannot be known without reading values, how many entries or channels a mask still
leaves, raises :data:`DATA_DEPENDENT` instead of JAX's own concretization error. JAX is
never imported here: tracers are recognised through ``sys.modules``.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["DATA_DEPENDENT", "is_traced"]

DATA_DEPENDENT = (
    "inside jax.jit, the number of entries (or channels, or blocks) that a mask leaves "
    "unpruned depends on the mask's values, which are unknown while JAX traces. A float "
    "amount relative to what remains (pruning on top of a default_mask), a schedule "
    "applied over a default_mask and sparsity bounds with default_masks need that number: "
    "give an int amount, or compute the mask outside jax.jit"
)
"""Message of the TypeError raised when a count depends on traced values."""


def is_traced(*arrays: Any) -> bool:
    """Whether any of `arrays` is a JAX tracer (``jax.jit`` and other transformations).

    Ask about arrays computed inside the call, not only its inputs: a concrete array that
    a jitted function closes over is no tracer, but what is computed from it is.
    ``array_api_compat.is_lazy_array`` is no test: it holds for every JAX array, even a
    concrete one.
    """
    jax = sys.modules.get("jax")
    if jax is None:
        return False
    tracer = jax.core.Tracer
    return any(isinstance(a, tracer) for a in arrays)
