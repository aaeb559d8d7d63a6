"""Every array the core makes lives on its input's device, proven on the CPU two ways.

* array-api-strict's second device: it refuses to combine arrays of different devices,
  so any array the core creates without ``device=`` (a scalar for ``where``, a mask of
  ones, a sample, ...) makes the call fail on ``Device('device1')``.
* PyTorch with ``torch.device("meta")`` as the default device and the inputs on the CPU:
  a tensor made without the input's device lands on ``meta`` and the call fails, as it
  would next to a CUDA input (array-api-extra's torch ``partition`` did: its ``arange``
  ignored the input's device).

Each test runs one call twice, on data placed the ordinary way and on the same data
placed the second way, and checks that every array returned is on the device of the
input and equal to the first result. The ``placement`` fixture runs every test both ways.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable
from typing import Any

import array_api_compat as apc
import array_api_strict as xps
import numpy as np
import pytest

import arrayprune as ap
from arrayprune.method_parts import masks_alone
from arrayprune.selection import bracket
from conftest import to_numpy

# prune() multiplies infinities by zero in the data with NaN and infinities.
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")

DEVICE1 = xps.Device("device1")
NAN, INF = math.nan, math.inf

#: (rows, cols): a small array (exact selection) and a large one, which reaches the
#: sample bracket once SMALL_SIZE is shrunk (see the `size` fixture).
SHAPES = {"small": (6, 10), "large": (40, 50)}


@pytest.fixture(params=list(SHAPES))
def size(request, monkeypatch) -> str:
    """The size of the data; "large" shrinks the bracket threshold below it."""
    if request.param == "large":
        monkeypatch.setattr(bracket, "SMALL_SIZE", 64)
    return request.param


def data(kind: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """float32 test data: heavy ties (with signed zeros), or NaN and infinities."""
    rng = np.random.default_rng(seed)
    if kind == "ties":
        return rng.integers(-3, 4, size=shape).astype(np.float32) * np.where(rng.random(shape) < 0.5, -1, 1)
    x = rng.standard_normal(shape).astype(np.float32)
    if kind == "nan":
        flat = x.reshape(-1)
        spots = rng.choice(flat.size, size=max(3, flat.size // 10), replace=False)
        flat[spots] = rng.choice(np.array([NAN, -NAN, INF, -INF, -0.0], dtype=np.float32), size=spots.size)
    return x


def earlier_mask(shape: tuple[int, ...], dtype: Any = bool, seed: int = 1) -> np.ndarray:
    """A mask of earlier pruning: about a third pruned, a whole first row and column too."""
    rng = np.random.default_rng(seed)
    mask = rng.random(shape) >= 1 / 3
    mask[0] = False
    mask[:, 0] = False
    return mask.astype(dtype)


Build = Callable[[np.ndarray], Any]

#: The placement under test (set by the autouse ``placement`` fixture).
PLACEMENT = "strict_device1"


@pytest.fixture(autouse=True, params=["strict_device1", "torch_meta_default"])
def placement(request, monkeypatch) -> str:
    """Run the test with array-api-strict's second device, then under torch's meta default."""
    if request.param == "torch_meta_default":
        pytest.importorskip("torch")
    monkeypatch.setattr(sys.modules[__name__], "PLACEMENT", request.param)
    return request.param


def on_default(a: np.ndarray) -> Any:
    if PLACEMENT == "torch_meta_default":
        import torch

        return torch.asarray(a)
    return xps.asarray(a)


def on_device1(a: np.ndarray) -> Any:
    if PLACEMENT == "torch_meta_default":
        import torch

        return torch.asarray(a, device="cpu")
    return xps.asarray(a, device=DEVICE1)


def _second_placement() -> Any:
    """The context the second run is made in: torch's meta default device, or nothing."""
    if PLACEMENT == "torch_meta_default":
        import torch

        return torch.device("meta")
    return contextlib.nullcontext()


def leaves(result: Any) -> list[Any]:
    """The arrays and plain values of a (nested) result, in a fixed order."""
    if isinstance(result, dict):
        return [leaf for key in result for leaf in leaves(result[key])]
    if isinstance(result, (list, tuple)):
        return [leaf for item in result for leaf in leaves(item)]
    return [result]


def same_on_both_devices(call: Callable[[Build], Any]) -> None:
    """Run `call` on default-device and device1 data; results equal, on the input's device."""
    want = leaves(call(on_default))
    with _second_placement():
        got = leaves(call(on_device1))
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        if apc.is_array_api_obj(w):
            if PLACEMENT == "torch_meta_default":
                assert apc.is_torch_namespace(apc.array_namespace(g)) and g.device.type == "cpu"
            else:
                assert apc.is_array_api_strict_namespace(apc.array_namespace(g))
                assert g.device == DEVICE1
            assert g.dtype == w.dtype and tuple(g.shape) == tuple(w.shape)
            np.testing.assert_array_equal(to_numpy(g), to_numpy(w))
        else:
            assert g == w


# --------------------------------------------------------------------------------------
# Every method of the table
# --------------------------------------------------------------------------------------

#: Constructor arguments per method; a callable gets the data and the array builder.
METHOD_ARGS: dict[str, list[Any]] = {
    "identity": [{}],
    "random_unstructured": [{"amount": 0.3, "seed": 7}, {"amount": 5, "seed": 3}],
    "l1_unstructured": [{"amount": 0.3}, {"amount": 17}, {"amount": 1.0}],
    "random_structured": [{"amount": 0.4, "dim": 0, "seed": 7}, {"amount": 3, "dim": -1, "seed": 1}],
    "ln_structured": [
        {"amount": 0.4, "n": 2, "dim": 0},
        {"amount": 3, "n": 1, "dim": -1},
        {"amount": 0.5, "n": INF, "dim": 1},
        {"amount": 2, "n": "fro", "dim": 0},
    ],
    "custom_from_mask": [lambda x, to: {"mask": to(np.abs(x) > 1)}],
    "nm_structured": [{}, {"n": 1, "m": 3, "dim": 0}],
    "block_unstructured": [{"amount": 0.3, "block_shape": (2, 3)}, {"amount": 4, "block_shape": (4,), "n": INF}],
    # Fractions: an earlier mask prunes a whole row and column, where no count fits.
    "wanda": [{"amount": 0.5}, {"amount": 0.3, "dim": 1}],
    # Without a Hessian: magnitude, unstructured or N:M along the last axis.
    "sparsegpt": [{"amount": 0.5}, {"n": 2, "m": 4}],
    # Without a Hessian: L2 channel norms.
    "activation_structured": [{"amount": 0.4, "dim": 0}],
    "obs_structured": [{"amount": 3, "dim": -1, "compensate": False}],
}

METHOD_CASES = [
    pytest.param(name, i, id=f"{name}-{i}") for name in ap.METHODS for i in range(len(METHOD_ARGS[name]))
]
# A method with a solver or a unit refit has no mask verb (``ap.sparsegpt`` is the
# solver): its class alone.
VERB_CASES = [case for case in METHOD_CASES if masks_alone(ap.METHODS[case.values[0]])]


def test_every_method_has_device_cases():
    assert set(METHOD_ARGS) == set(ap.METHODS)


def method_kwargs(name: str, i: int, x: np.ndarray, to: Build) -> dict[str, Any]:
    spec = METHOD_ARGS[name][i]
    return spec(x, to) if callable(spec) else dict(spec)


@pytest.mark.parametrize("kind", ["ties", "nan"])
@pytest.mark.parametrize("name, i", VERB_CASES)
def test_verbs(name, i, kind, size):
    x = data(kind, SHAPES[size])

    def call(to):
        verb = getattr(ap, name)
        return verb(to(x), **method_kwargs(name, i, x, to))

    same_on_both_devices(call)


@pytest.mark.parametrize("mask_dtype", [bool, np.float32])
@pytest.mark.parametrize("kind", ["ties", "nan"])
@pytest.mark.parametrize("name, i", VERB_CASES)
def test_verbs_on_top_of_a_default_mask(name, i, kind, mask_dtype, size):
    x = data(kind, SHAPES[size])
    mask = earlier_mask(x.shape, mask_dtype)

    def call(to):
        verb = getattr(ap, name)
        return verb(to(x), **method_kwargs(name, i, x, to), default_mask=to(mask))

    same_on_both_devices(call)


@pytest.mark.parametrize("name, i", METHOD_CASES)
def test_method_entry_points(name, i, size):
    """keep_mask, compute_mask, prune (with importance scores), mask_for, a container."""
    x = data("nan", SHAPES[size])
    scores = data("ties", SHAPES[size], seed=5)
    mask = earlier_mask(x.shape)

    def call(to):
        method = ap.METHODS[name](**method_kwargs(name, i, x, to))
        first = ap.L1Unstructured(0.2)
        container = ap.PruningContainer(first, method)
        return [
            method.keep_mask(to(x)),
            method.compute_mask(to(x), to(mask)),
            method.compute_mask(to(x), None),
            method.prune(to(x), default_mask=to(mask), importance_scores=to(scores)),
            method.prune(to(scores)),
            ap.mask_for(method, to(x), default_mask=to(mask), importance_scores=to(scores)),
            ap.combine_masks(method, to(x), to(mask)),
            container.compute_mask(to(x), first.keep_mask(to(x))),
        ]

    same_on_both_devices(call)


def test_iterative_pruning_in_a_container(size):
    """Three rounds of different methods, each on what the earlier ones left."""
    x = data("ties", SHAPES[size])

    def call(to):
        methods = [ap.L1Unstructured(0.25), ap.LnStructured(1, n=2, dim=0), ap.NMStructured(1, 4)]
        methods += [ap.RandomUnstructured(0.2, seed=1), ap.BlockUnstructured(0.2, (2, 2))]
        masks = [methods[0].keep_mask(to(x))]
        for i in range(1, len(methods)):
            masks.append(ap.PruningContainer(*methods[: i + 1]).compute_mask(to(x), masks[-1]))
        return masks

    same_on_both_devices(call)


# --------------------------------------------------------------------------------------
# Global pruning
# --------------------------------------------------------------------------------------


def global_data(size: str, kind: str) -> list[np.ndarray]:
    rows, cols = SHAPES[size]
    return [data(kind, (rows, cols), seed=1), data(kind, (cols,), seed=2) * 4, data(kind, (3, rows, 2), seed=3)]


@pytest.mark.parametrize("kind", ["ties", "nan"])
@pytest.mark.parametrize(
    "options",
    [
        {"amount": 0.4},
        {"amount": 11},
        {"pruning_method": ap.RandomUnstructured, "amount": 0.5, "seed": 3},
        {"amount": 0.4, "min_sparsity": 0.1, "max_sparsity": 0.6},
        {"amount": 0.5, "min_sparsity": [0.0, 0.5, 0.2], "max_sparsity": 0.9},
        {"amount": 0.3, "scores": True},
    ],
    ids=["float", "int", "random", "bounds", "bounds-per-array", "scores"],
)
@pytest.mark.parametrize("masks", [False, True], ids=["fresh", "default_masks"])
def test_global_unstructured(options, masks, kind, size):
    arrays = global_data(size, kind)
    earlier = [earlier_mask(a.shape, seed=i) if a.ndim == 2 else None for i, a in enumerate(arrays)]
    options = dict(options)
    method = options.pop("pruning_method", ap.L1Unstructured)
    scored = options.pop("scores", False)

    def call(to):
        extra = dict(options)
        if masks:
            extra["default_masks"] = [None if m is None else to(m) for m in earlier]
        if scored:
            extra["importance_scores"] = [to(np.abs(a) + 1) for a in arrays]
        return ap.global_unstructured([to(a) for a in arrays], method, **extra)

    same_on_both_devices(call)


@pytest.mark.parametrize("masks", [False, True], ids=["fresh", "default_masks"])
def test_global_unstructured_lamp_on_a_mapping(masks, size):
    arrays = dict(zip("abc", global_data(size, "ties"), strict=True))
    earlier = {k: earlier_mask(a.shape, np.float32) for k, a in arrays.items() if a.ndim == 2}

    def call(to):
        extra = {"default_masks": {k: to(m) for k, m in earlier.items()}} if masks else {}
        return ap.global_unstructured(
            {k: to(a) for k, a in arrays.items()}, ap.L1Unstructured, amount=0.45, normalization="lamp", **extra
        )

    same_on_both_devices(call)


# --------------------------------------------------------------------------------------
# Schedules, selection and the other public functions that return arrays
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "method, kwargs",
    [
        (ap.L1Unstructured, {}),
        (ap.RandomUnstructured, {"seed": 2}),
        (ap.LnStructured, {"n": 2, "dim": 0}),
        (ap.RandomStructured, {"dim": 1, "seed": 4}),
        (ap.BlockUnstructured, {"block_shape": (2, 2)}),
    ],
)
def test_schedules(method, kwargs, size):
    x = data("nan", SHAPES[size])
    schedule = ap.PolynomialDecay(0.1, 0.7, begin_step=0, end_step=10)

    def call(to):
        first = ap.prune_to_sparsity(to(x), 0.3, pruning_method=method, **kwargs)
        second = ap.prune_to_sparsity(to(x), 0.6, pruning_method=method, default_mask=first, **kwargs)
        third = ap.prune_to_schedule(to(x), schedule, 7, pruning_method=method, default_mask=second, **kwargs)
        scored = ap.prune_to_sparsity(
            to(x), 0.5, pruning_method=method, importance_scores=to(data("ties", x.shape)), **kwargs
        )
        return [first, second, third, scored]

    same_on_both_devices(call)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.uint8])
@pytest.mark.parametrize("kind", ["ties", "nan"])
def test_kth_smallest(kind, dtype, size):
    x = data(kind, SHAPES[size])
    if not np.issubdtype(dtype, np.floating):
        x = np.nan_to_num(x, nan=0.0, posinf=5.0, neginf=-5.0)
        x = (np.abs(x) * 10 if dtype is np.uint8 else x * 10).astype(dtype)
    n = x.size

    def call(to):
        return [ap.kth_smallest(to(x), k) for k in (1, 2, n // 3, n // 2, n - 1, n)]

    same_on_both_devices(call)


@pytest.mark.parametrize("kind", ["ties", "nan"])
def test_smallest_magnitude_keep_with_eligibility(kind, size):
    arrays = global_data(size, kind)
    eligible = [earlier_mask(a.shape, seed=i) if a.ndim == 2 else None for i, a in enumerate(arrays)]
    available = sum(a.size if e is None else int(e.sum()) for a, e in zip(arrays, eligible, strict=True))

    def call(to):
        out = []
        for k in (0, 1, available // 3, available):
            elig = [None if e is None else to(e) for e in eligible]
            out.append(ap.smallest_magnitude_keep([to(a) for a in arrays], k, elig))
        out.append(ap.smallest_magnitude_keep([to(arrays[0])], 7))
        return out

    same_on_both_devices(call)


def test_scores_and_norms(size):
    x = data("ties", SHAPES[size])
    cube = data("ties", (4, 3, 5))
    conv = data("nan", (4, 3, 2, 2))
    norms = np.abs(data("ties", (x.shape[1],), seed=4))

    def call(to):
        out = [ap.lamp_scores(to(x)), ap.lamp_scores(to(x), to(earlier_mask(x.shape)))]
        out += [ap.channel_norms(to(x), n, dim) for n in (1, 2, INF, -INF, 0, "fro") for dim in (0, 1)]
        out.append(ap.channel_norms(to(cube), "nuc", 1))
        out.append(ap.wanda_scores(to(x), to(norms), 1))
        out.append(ap.wanda_scores(to(conv), to(np.arange(6.0)), 1, groups=2))
        return out

    same_on_both_devices(call)


def test_packed_masks_and_pattern_checks():
    x = data("ties", (5, 12))

    def call(to):
        mask = ap.nm_structured(to(x))
        packed = ap.pack_mask(mask)
        xp = apc.array_namespace(mask)
        return [
            packed,
            ap.pack_mask(to(x)),
            ap.unpack_mask(packed, x.shape),
            ap.is_nm_sparse(to(x) * xp.astype(mask, xp.float32)),
            ap.is_nm_sparse(to(x)),
            sorted(ap.sparse_nbytes(to(x) * xp.astype(mask, xp.float32)).items()),
        ]

    same_on_both_devices(call)


def test_reconstruction():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((30, 12)) @ rng.standard_normal((12, 12))
    x[:, 4] = 0.0  # a dead input
    w = data("nan", (6, 12))
    w[~np.isfinite(w)] = 0.5  # SparseGPT needs a finite weight
    conv = rng.standard_normal((4, 3, 2, 2)).astype(np.float32)
    images = rng.standard_normal((2, 4, 5, 5)).astype(np.float32)
    wide = rng.standard_normal((5, 150))  # 150 inputs: the factor is built by halves, the columns in steps
    wide_x = rng.standard_normal((300, 150))

    def call(to):
        acc = ap.HessianAccumulator(12)
        acc.update(to(x[:10]))
        acc.update(to(x[10:].reshape(4, 5, 12)))
        h = acc.hessian()
        patches = ap.unfold_patches(to(images), 2, stride=2, padding=1, dilation=1, groups=2)
        return [
            h,
            patches,
            ap.sparsegpt(to(w), h, 0.5, block_size=5),
            ap.sparsegpt(to(w), h, n=2, m=4, block_size=8),
            ap.sparsegpt(to(np.ascontiguousarray(w.T)), h, 17, reduction_axis=0),
            ap.sparsegpt(to(conv), to(np.eye(12) + 0.5), 0.25, block_size=4),
            ap.sparsegpt(to(wide), to(wide_x.T @ wide_x), 0.5, block_size=64),
        ]

    same_on_both_devices(call)


@pytest.mark.parametrize("compensate", [True, False])
@pytest.mark.parametrize("name", ["activation_structured", "obs_structured"])
def test_calibrated_structured_units(name, compensate):
    """Scores, kept units and the refit consumer of the calibrated structured methods."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((40, 12))
    x[:, 5] = 0.0  # a dead input: its column scores 0 by activation
    w = rng.standard_normal((7, 12)).astype(np.float32)

    def call(to):
        h = to(x.T @ x)
        method = ap.METHODS[name](0.5, compensate=compensate)
        per_column = method.prune_units(to(w), h, 12)
        per_head = method.prune_units(to(w), h, 3)  # heads of 4 columns
        return [[c.scores, c.kept, c.columns, c.weight] for c in (per_column, per_head)]

    same_on_both_devices(call)
