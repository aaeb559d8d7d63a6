"""Shared test fixtures: one ``xp`` fixture per array library.

Every test that takes the ``xp`` fixture (or ``backend``) runs once per library:

========================  ===============================================================
``Backend.NUMPY``         NumPy (must be installed: never skipped)
``Backend.ARRAY_API_STRICT``  array-api-strict (must be installed: never skipped); proves
                          that a code path uses nothing outside the standard
``Backend.TORCH``         PyTorch, CPU tensors (must be installed: never skipped)
``Backend.JAX``           JAX, default device; skipped when JAX is not installed.
                          ``jax_enable_x64`` is switched on so that float64 exists.
``Backend.CUPY``          CuPy, current GPU; skipped without CuPy or without a GPU
========================  ===============================================================

Fixtures
--------
``backend``
    A :class:`BackendInfo` (session scope): ``.name``, ``.xp`` (the namespace that
    ``array_api_compat.array_namespace`` returns for the library's arrays, so standard
    functions such as ``xp.asarray(..., device=...)`` work), ``.asarray(np_array,
    dtype=None)`` to build an array of the library from NumPy data (``dtype`` a name such
    as ``"float32"`` or ``"bfloat16"``), ``.to_numpy(arr)`` to copy back to the host,
    ``.has_dtype(name)`` and ``.dtype(name)``.
``xp``
    ``backend.xp``; request ``backend`` too when you need the helpers.

Helpers importable from tests (``from conftest import to_numpy, ALL_BACKENDS``):
:func:`to_numpy` (any supported array to a NumPy array), :func:`available_backends`
(the :class:`BackendInfo` of every library importable here, for tests that compare
libraries against each other inside one test, e.g. under Hypothesis).

Marks: ``@pytest.mark.skip_backend("jax", reason=...)`` and
``@pytest.mark.xfail_backend("array_api_strict", reason=...)`` skip or xfail a test for
the named backends (names as in :class:`Backend` values).

Selection: ``python -m pytest`` runs the fast loop; ``python -m pytest --runslow`` runs
everything (CI does). Slow are the tests marked ``@pytest.mark.slow`` (end-to-end runs of
a second or more on two cores) and every JAX case (:data:`SLOW_BACKENDS`: the same code
paths as array-api-strict and NumPy, at a JAX dispatch cost of milliseconds a call). An
explicit ``-m`` expression selects as written.
"""

from __future__ import annotations

import enum
import importlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest


class Backend(enum.Enum):
    """The array libraries the test-suite knows, by import name."""

    NUMPY = "numpy"
    ARRAY_API_STRICT = "array_api_strict"
    TORCH = "torch"
    JAX = "jax"
    CUPY = "cupy"

    def __str__(self) -> str:  # test ids read "test_x[torch]"
        return self.value


#: Libraries whose absence is an error of the test environment, not a reason to skip.
REQUIRED = {Backend.NUMPY, Backend.ARRAY_API_STRICT, Backend.TORCH}


@dataclass
class BackendInfo:
    """A library under test and the conversions tests need."""

    backend: Backend
    module: Any  # the library's own top-level module (numpy, torch, jax.numpy, ...)
    xp: Any  # the Array API namespace the core sees for this library's arrays
    device: Any = None
    _dtypes: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.backend.value

    def has_dtype(self, name: str) -> bool:
        """Whether the library has a floating/bool dtype of this name (e.g. 'bfloat16')."""
        return name in self._dtypes

    def dtype(self, name: str) -> Any:
        """The library's dtype object for a name such as 'float32', 'bfloat16', 'bool'."""
        if name not in self._dtypes:
            pytest.skip(f"{self.name} has no dtype {name}")
        return self._dtypes[name]

    def asarray(self, a: Any, dtype: str | None = None) -> Any:
        """A new array of this library holding a copy of the NumPy data `a`.

        `dtype` (a name) converts after transfer, which also reaches dtypes NumPy lacks
        (``'bfloat16'``).
        """
        a = np.array(a, copy=True)
        if a.dtype.byteorder not in "=|":
            a = a.astype(a.dtype.newbyteorder("="))
        if self.backend is Backend.TORCH:
            out = self.module.from_numpy(a.copy(order="C"))  # keeps 0-D (ascontiguousarray would not)
        elif self.backend is Backend.CUPY:
            out = self.module.asarray(a)
        else:
            out = self.xp.asarray(a)
        if dtype is not None:
            out = self.xp.astype(out, self.dtype(dtype))
        return out

    def to_numpy(self, x: Any) -> np.ndarray:
        """A NumPy copy of an array of this library (bfloat16 becomes float32)."""
        return to_numpy(x)

    def __repr__(self) -> str:
        return f"BackendInfo({self.name})"


def to_numpy(x: Any) -> np.ndarray:
    """Copy any supported array (NumPy, array-api-strict, torch, JAX, CuPy) to NumPy.

    bfloat16 data is widened to float32 (NumPy has no bfloat16); Python scalars and NumPy
    scalars become 0-D arrays.
    """
    mod = type(x).__module__.split(".")[0]
    if mod == "torch":
        import torch

        x = x.detach().cpu()
        if x.dtype == torch.bfloat16:
            x = x.float()
        return x.numpy().copy()
    if mod == "cupy":
        return x.get()
    if mod in ("jax", "jaxlib"):
        if str(x.dtype) == "bfloat16":
            x = x.astype("float32")
        return np.array(x, copy=True)
    if mod == "array_api_strict":
        return np.from_dlpack(x).copy()
    return np.array(x, copy=True)


_INFOS: dict[Backend, BackendInfo] = {}


def _dtype_table(xp: Any, module: Any) -> dict[str, Any]:
    names = ["bool", "int8", "int32", "int64", "uint8", "float16", "float32", "float64"]
    table = {n: getattr(xp, n) for n in names if hasattr(xp, n)}
    bf16 = getattr(module, "bfloat16", None)
    if bf16 is not None:
        table["bfloat16"] = bf16
    return table


def _load(backend: Backend) -> BackendInfo:
    """Import a library (skipping the test if an optional one is missing)."""
    if backend in _INFOS:
        return _INFOS[backend]
    import array_api_compat as apc

    if backend in REQUIRED:
        module = importlib.import_module(backend.value)
    else:
        module = pytest.importorskip(backend.value)
    device = None
    if backend is Backend.NUMPY:
        xp = apc.array_namespace(np.empty(0))
    elif backend is Backend.ARRAY_API_STRICT:
        xp = module
    elif backend is Backend.TORCH:
        xp = apc.array_namespace(module.empty(0))
        device = module.device("cpu")
    elif backend is Backend.JAX:
        module.config.update("jax_enable_x64", True)
        jnp = importlib.import_module("jax.numpy")
        xp = apc.array_namespace(jnp.empty(0))
        module = jnp
    else:  # CuPy needs a working GPU, not only the package
        try:
            if module.cuda.runtime.getDeviceCount() < 1:
                raise RuntimeError("no GPU")
        except Exception as exc:  # pragma: no cover - depends on the machine
            pytest.skip(f"CuPy installed but unusable: {exc}")
        xp = apc.array_namespace(module.empty(0))
    info = BackendInfo(backend, module, xp, device, _dtype_table(xp, module))
    _INFOS[backend] = info
    return info


def available_backends() -> list[BackendInfo]:
    """BackendInfo of every library that can be used here (required ones always)."""
    out = []
    for b in Backend:
        try:
            out.append(_load(b))
        except pytest.skip.Exception:
            continue
    return out


ALL_BACKENDS = list(Backend)


@pytest.fixture(scope="session", params=ALL_BACKENDS, ids=str)
def backend(request) -> BackendInfo:
    """The library under test (see the module docstring)."""
    return _load(request.param)


@pytest.fixture(scope="session")
def xp(backend: BackendInfo) -> Any:
    """The Array API namespace of the library under test."""
    return backend.xp


#: Backends whose cases are slow: run with ``--runslow`` (the JAX grids take a quarter of
#: the suite's time and check paths that array-api-strict and NumPy check too).
SLOW_BACKENDS = frozenset({"jax"})


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", help="run the slow tests too (the whole suite, as CI does)")


def pytest_configure(config):
    config.addinivalue_line("markers", "skip_backend(*names, reason=''): skip these backends")
    config.addinivalue_line("markers", "xfail_backend(*names, reason=''): xfail these backends")


def pytest_collection_modifyitems(config, items):
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None or "backend" not in callspec.params:
            continue
        name = str(callspec.params["backend"])
        if name in SLOW_BACKENDS:
            item.add_marker(pytest.mark.slow)
        for mark in item.iter_markers("skip_backend"):
            if name in mark.args:
                item.add_marker(pytest.mark.skip(reason=mark.kwargs.get("reason", f"not on {name}")))
        for mark in item.iter_markers("xfail_backend"):
            if name in mark.args:
                item.add_marker(
                    pytest.mark.xfail(strict=mark.kwargs.get("strict", True), reason=mark.kwargs.get("reason", ""))
                )
    if config.getoption("--runslow") or config.getoption("markexpr"):
        return
    slow = [item for item in items if item.get_closest_marker("slow") is not None]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if item.get_closest_marker("slow") is None]


# --------------------------------------------------------------------------------------
# Reference ranking (NumPy, slow and obviously right) for tests of any pruning code
# --------------------------------------------------------------------------------------


def reference_order(values: np.ndarray) -> np.ndarray:
    """Flat indices of `values` from first pruned to last: arrayprune's total order.

    ``|value|`` ascending, NaN above +inf, ties by lowest flat index (a stable argsort).
    """
    v = np.abs(np.asarray(values, dtype=np.float64).reshape(-1))
    nan = np.isnan(v)
    order = np.argsort(np.where(nan, np.inf, v), kind="stable")
    return order[np.argsort(nan[order], kind="stable")]


def reference_keep(arrays, k: int, eligible=None) -> list[np.ndarray]:
    """Keep masks dropping the `k` eligible entries of smallest magnitude over all arrays.

    `arrays` are NumPy arrays ranked as if concatenated (earlier array first on ties);
    `eligible` is ``None`` or one boolean NumPy array (or ``None``) per array.
    """
    arrays = [np.asarray(a) for a in arrays]
    if eligible is None:
        eligible = [None] * len(arrays)
    flat = np.concatenate([a.reshape(-1).astype(np.float64) for a in arrays]) if arrays else np.empty(0)
    elig = (
        np.concatenate(
            [
                np.ones(a.size, bool) if e is None else np.asarray(e, bool).reshape(-1)
                for a, e in zip(arrays, eligible, strict=True)
            ]
        )
        if arrays
        else np.empty(0, bool)
    )
    idx = np.flatnonzero(elig)
    if k > idx.size:
        raise ValueError("k larger than the number of eligible entries")
    drop = idx[reference_order(flat[idx])[:k]]
    keep = np.ones(flat.size, bool)
    keep[drop] = False
    out, offset = [], 0
    for a in arrays:
        out.append(keep[offset : offset + a.size].reshape(a.shape))
        offset += a.size
    return out
