"""Masks inside ``jax.jit``: the same masks as outside, with ties, NaN and subnormals.

Under tracing no value can be read back to Python; the core then takes an exact path
with a sort and a cumulative-sum tie rule. Every test compares the jitted result with
the eager one on the same JAX data (random methods included: the same key draws the
same numbers), and deterministic ones also with NumPy's (the host path, on bit patterns).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import arrayprune as ap
from arrayprune.selection import bracket

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
jax.config.update("jax_enable_x64", True)  # as tests/conftest.py does: float64 exists

NAN, INF = math.nan, math.inf
SHAPES = [(7,), (6, 8), (4, 3, 5)]


def data(kind: str, shape: tuple[int, ...], dtype: Any = np.float32, seed: int = 0) -> np.ndarray:
    """Test data: heavy ties with signed zeros, NaN and infinities, or subnormals."""
    rng = np.random.default_rng(seed)
    if kind == "subnormal":
        tiny = np.finfo(dtype).smallest_subnormal
        x = (rng.integers(-40, 41, size=shape) * tiny).astype(dtype)
        x.reshape(-1)[:: max(1, x.size // 4)] = np.finfo(dtype).tiny  # the smallest normal
        return x
    x = rng.integers(-3, 4, size=shape).astype(dtype) * np.where(rng.random(shape) < 0.5, -1, 1).astype(dtype)
    if kind == "nan":
        flat = x.reshape(-1)
        spots = rng.choice(flat.size, size=max(2, flat.size // 8), replace=False)
        flat[spots] = rng.choice(np.array([NAN, -NAN, INF, -INF], dtype=dtype), size=spots.size)
    return x


def earlier_mask(shape: tuple[int, ...], dtype: Any = bool, seed: int = 1) -> np.ndarray:
    """A mask of earlier pruning: about a third pruned, and the whole first channel along 0."""
    rng = np.random.default_rng(seed)
    mask = rng.random(shape) >= 1 / 3
    mask[0] = False
    return mask.astype(dtype)


def assert_same(got: Any, want: Any) -> None:
    got, want = jax.tree.leaves(got), jax.tree.leaves(want)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)


def jit_matches_eager(f: Callable[..., Any], *args: np.ndarray, numpy: bool = True) -> None:
    """``jax.jit(f)`` equals `f` on JAX arrays and, if `numpy`, `f` on the NumPy data."""
    jax_args = [jnp.asarray(a) for a in args]
    eager = f(*jax_args)
    assert_same(jax.jit(f)(*jax_args), eager)
    if numpy:
        assert_same(eager, f(*args))


def for_each_kind(f: Callable[..., Any], shape: tuple[int, ...], *more: np.ndarray, numpy: bool = True) -> None:
    """`jit_matches_eager` on data with ties, then with NaN and infinities (one compilation)."""
    for kind in ("ties", "nan"):
        jit_matches_eager(f, data(kind, shape), *more, numpy=numpy)


# --------------------------------------------------------------------------------------
# Every method, fresh and on top of a default mask
# --------------------------------------------------------------------------------------

AMOUNTS = [0.0, 0.3, 1.0, 5]

#: (verb, constructor arguments other than amount, whether NumPy draws the same masks)
METHODS = {
    "l1_unstructured": ({}, True),
    "random_unstructured": ({"seed": 3}, False),
    "ln_structured": ({"n": 2, "dim": 0}, True),
    "random_structured": ({"dim": -1, "seed": 5}, False),
    "block_unstructured": ({"block_shape": (2,)}, True),
}


def amount_for(name: str, amount: float | int, shape: tuple[int, ...]) -> float | int:
    """`amount`, with counts cut to what the method's units allow."""
    if isinstance(amount, float):
        return amount
    kwargs = METHODS[name][0]
    units = shape[kwargs["dim"]] if "dim" in kwargs else math.prod(shape)
    return min(amount, units // 2 if name == "block_unstructured" else units)


def skip_structured_on_1d(name: str, shape: tuple[int, ...]) -> None:
    if name.endswith("_structured") and len(shape) < 2:
        pytest.skip("structured pruning needs two dimensions")


# One jitted function computes the masks of several amounts: XLA compiles once per
# function and shape, and compiling dominates the time of these small cases.


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name", list(METHODS))
@pytest.mark.slow
def test_methods_with_an_amount(name, shape):
    skip_structured_on_1d(name, shape)
    kwargs, same_on_numpy = METHODS[name]
    verb = getattr(ap, name)
    amounts = [amount_for(name, a, shape) for a in AMOUNTS]
    for_each_kind(lambda w: [verb(w, amount=a, **kwargs) for a in amounts], shape, numpy=same_on_numpy)


@pytest.mark.parametrize("mask_dtype", [bool, np.float32])
@pytest.mark.parametrize("name", list(METHODS))
def test_int_amount_on_top_of_a_default_mask(name, mask_dtype):
    """Iterative pruning with a count: it depends on the shapes and the amount only."""
    shape = (6, 8)
    kwargs, same_on_numpy = METHODS[name]
    verb = getattr(ap, name)
    for_each_kind(
        lambda w, m: [verb(w, amount=a, **kwargs, default_mask=m) for a in (0, 2, 4)],
        shape,
        earlier_mask(shape, mask_dtype),
        numpy=same_on_numpy,
    )


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("nm", [(2, 4), (1, 3), (3, 5)], ids=str)
@pytest.mark.slow
def test_nm_structured(nm, shape):
    n, m = nm

    def masks(w, d):
        return [ap.nm_structured(w, n, m), ap.nm_structured(w, n, m, dim=0, default_mask=d)]

    for_each_kind(masks, shape, earlier_mask(shape))


@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.slow
def test_wanda(dim):
    shape = (6, 8)
    rng = np.random.default_rng(2)
    mask = rng.random(shape) >= 1 / 3
    mask[:3] = True
    mask[:, :3] = True  # every output unit keeps three entries or more
    norms = np.abs(data("ties", (shape[1 - dim],), seed=3)) + 1

    def masks(w, m, n):
        scores = ap.wanda_scores(w, n, 1 - dim, output_axis=dim)
        fresh = [ap.wanda(w, amount=a, dim=dim, importance_scores=scores) for a in (0.0, 0.3, 1.0, 2)]
        return [*fresh, ap.wanda(w, amount=2, dim=dim, default_mask=m)]

    for_each_kind(masks, shape, mask, norms)
    with pytest.raises(TypeError, match="inside jax.jit, the number of entries"):
        jax.jit(lambda w, m: ap.wanda(w, amount=0.5, default_mask=m))(jnp.asarray(data("ties", shape)), mask)


def test_identity_and_custom_from_mask():
    x, mask, given = data("nan", (6, 8)), earlier_mask((6, 8), np.float32), data("ties", (6, 8)) > 0
    jit_matches_eager(lambda w: ap.identity(w), x)
    jit_matches_eager(lambda w, d: ap.identity(w, default_mask=d), x, mask)
    jit_matches_eager(lambda w, g: ap.custom_from_mask(w, mask=g), x, given)
    jit_matches_eager(lambda w, g, d: ap.custom_from_mask(w, mask=g, default_mask=d), x, given, mask)


def test_random_methods_with_a_key():
    key = jax.random.key(11)
    x = jnp.asarray(data("ties", (6, 8)))
    for f in (
        lambda w: ap.random_unstructured(w, amount=0.4, generator=key),
        lambda w: ap.random_structured(w, amount=3, dim=0, generator=key),
    ):
        assert_same(jax.jit(f)(x), f(x))


@pytest.mark.slow
def test_container_of_several_methods():
    """Three rounds, each on what the earlier ones left, inside one jitted function."""
    x = data("nan", (8, 12))

    def rounds(w):
        methods = [ap.L1Unstructured(0.25), ap.LnStructured(2, n=1, dim=0), ap.NMStructured(1, 4)]
        methods += [ap.BlockUnstructured(3, (2, 2)), ap.L1Unstructured(10)]
        masks = [methods[0].keep_mask(w)]
        for i in range(1, len(methods)):
            masks.append(ap.PruningContainer(*methods[: i + 1]).compute_mask(w, masks[-1]))
        return masks

    jit_matches_eager(rounds, x)


def test_constants_closed_over():
    """Arrays a jitted function closes over are concrete; what is computed from them is not."""
    w, m = jnp.asarray(data("nan", (6, 8))), jnp.asarray(earlier_mask((6, 8)))

    def masks():
        return [
            ap.l1_unstructured(w, amount=0.5),
            ap.l1_unstructured(w, amount=5, default_mask=m),
            ap.ln_structured(w, amount=2, n=1, dim=0, default_mask=m),
            ap.nm_structured(w, default_mask=m),
            ap.block_unstructured(w, amount=3, block_shape=(2, 2), default_mask=m),
            ap.kth_smallest(w, 30),
        ]

    assert_same(jax.jit(masks)(), masks())
    with pytest.raises(TypeError, match="inside jax.jit, the number of entries"):
        jax.jit(lambda x: ap.l1_unstructured(x, amount=0.5, default_mask=m))(w)


def test_int_amount_beyond_what_remains_prunes_everything_left():
    """The count cannot be checked against a traced mask: every remaining unit goes."""
    x, mask = jnp.asarray(data("ties", (6, 8))), jnp.asarray(earlier_mask((6, 8)))
    got = jax.jit(lambda w, m: ap.l1_unstructured(w, amount=40, default_mask=m))(x, mask)
    assert not np.asarray(got).any()
    with pytest.raises(ValueError, match="should be smaller"):
        ap.l1_unstructured(x, amount=40, default_mask=mask)  # eagerly, it is checked
    got = jax.jit(lambda w, m: ap.ln_structured(w, amount=6, n=1, dim=0, default_mask=m))(x, mask)
    assert not np.asarray(got).any()


@pytest.mark.parametrize(
    "call",
    [
        lambda w, m: ap.l1_unstructured(w, amount=0.5, default_mask=m),
        lambda w, m: ap.random_unstructured(w, amount=0.5, seed=1, default_mask=m),
        lambda w, m: ap.ln_structured(w, amount=0.5, n=2, dim=0, default_mask=m),
        lambda w, m: ap.block_unstructured(w, amount=0.5, block_shape=(2, 2), default_mask=m),
        lambda w, m: ap.PruningContainer(ap.L1Unstructured(0.2), ap.L1Unstructured(0.5)).compute_mask(w, m),
        lambda w, m: ap.prune_to_sparsity(w, 0.6, default_mask=m),
        lambda w, m: ap.global_unstructured([w, w], ap.L1Unstructured, amount=0.5, default_masks=[m, None]),
        lambda w, m: ap.global_unstructured([w], ap.L1Unstructured, amount=3, default_masks=[m], min_sparsity=0.1),
    ],
    ids=["l1", "random", "ln", "block", "container", "schedule", "global", "global-bounds"],
)
def test_counts_relative_to_a_traced_mask_raise_a_clear_error(call):
    x, mask = jnp.asarray(data("ties", (6, 8))), jnp.asarray(earlier_mask((6, 8)))
    call(x, mask)  # eagerly, fine
    with pytest.raises(TypeError, match="inside jax.jit, the number of entries") as info:
        jax.jit(call)(x, mask)
    assert type(info.value) is TypeError  # not JAX's ConcretizationTypeError


# --------------------------------------------------------------------------------------
# Global pruning, schedules, selection
# --------------------------------------------------------------------------------------


def global_data(kind: str) -> list[np.ndarray]:
    return [data(kind, (6, 8), seed=1), data(kind, (10,), seed=2) * 2, data(kind, (3, 2, 4), seed=3)]


@pytest.mark.parametrize(
    "options",
    [
        {"amount": 0.4},
        {"amount": 25},
        {"amount": 0.5, "min_sparsity": 0.2, "max_sparsity": [0.6, 0.9, 0.7]},
        {"pruning_method": ap.RandomUnstructured, "amount": 0.5, "seed": 4},
    ],
    ids=["float", "int", "bounds", "random"],
)
@pytest.mark.slow
def test_global_unstructured(options):
    options = dict(options)
    method = options.pop("pruning_method", ap.L1Unstructured)

    def masks(*ws):
        return ap.global_unstructured(list(ws), method, **options)

    for kind in ("ties", "nan"):
        jit_matches_eager(masks, *global_data(kind), numpy=method is ap.L1Unstructured)


def test_global_unstructured_over_a_mapping_with_masks_and_scores():
    a, b, c = global_data("nan")
    masks = [earlier_mask(a.shape, np.float32), earlier_mask(c.shape, seed=4)]

    def call(x, y, z, ma, mc):
        return ap.global_unstructured(
            {"a": x, "b": y, "c": z},
            ap.L1Unstructured,
            importance_scores={"b": y * 3},
            default_masks={"a": ma, "c": mc},
            amount=20,
        )

    jit_matches_eager(call, a, b, c, *masks)


@pytest.mark.slow
def test_global_unstructured_with_lamp():
    arrays = global_data("ties")
    masks = [earlier_mask(a.shape) for a in arrays]

    def lamp(*a):
        fresh = ap.global_unstructured(list(a[:3]), ap.L1Unstructured, amount=0.45, normalization="lamp")
        again = ap.global_unstructured(
            list(a[:3]), ap.L1Unstructured, amount=9, normalization="lamp", default_masks=list(a[3:])
        )
        return [fresh, again]

    jit_matches_eager(lamp, *arrays, *masks)
    jit_matches_eager(lambda w, m: ap.lamp_scores(w, m), arrays[0], masks[0])


@pytest.mark.parametrize(
    "method, kwargs",
    [(ap.L1Unstructured, {}), (ap.LnStructured, {"n": 1, "dim": 1}), (ap.BlockUnstructured, {"block_shape": (3, 2)})],
)
@pytest.mark.slow
def test_schedules_without_earlier_pruning(method, kwargs):
    schedule = ap.PolynomialDecay(0.1, 0.8, begin_step=0, end_step=10)
    x = data("nan", (6, 8))
    jit_matches_eager(lambda w: ap.prune_to_sparsity(w, 0.55, pruning_method=method, **kwargs), x)
    jit_matches_eager(lambda w: ap.prune_to_schedule(w, schedule, 4, pruning_method=method, **kwargs), x)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.uint8])
@pytest.mark.parametrize("kind", ["ties", "nan", "subnormal"])
def test_kth_smallest(kind, dtype):
    if kind == "subnormal" and not np.issubdtype(dtype, np.floating):
        pytest.skip("integers have no subnormals")
    x = data(kind, (6, 8), dtype=dtype if np.issubdtype(dtype, np.floating) else np.float32)
    if not np.issubdtype(dtype, np.floating):
        x = np.nan_to_num(x, nan=0.0, posinf=9.0, neginf=-9.0)
        x = (np.abs(x) if dtype is np.uint8 else x).astype(dtype)
    jit_matches_eager(lambda w: [ap.kth_smallest(w, k) for k in (1, 2, 17, 24, 47, 48)], x)


# --------------------------------------------------------------------------------------
# Subnormals: JAX on CPU flushes them to zero in float comparisons
# --------------------------------------------------------------------------------------

SUBNORMAL_DTYPES = [np.float16, np.float32, np.float64]


def test_jax_flushes_subnormals_in_comparisons():
    """Why the JAX path ranks by bit patterns: JAX's CPU backend finds these equal."""
    tiny = np.finfo(np.float32).smallest_subnormal
    small, large = np.float32(tiny), np.float32(3 * tiny)
    assert small < large
    if bool(jnp.asarray(small) < jnp.asarray(large)):
        pytest.skip("this JAX backend compares subnormals exactly")
    x = np.array([large, small, 0.0], np.float32)
    np.testing.assert_array_equal(np.asarray(ap.l1_unstructured(jnp.asarray(x), amount=2)), [True, False, False])


#: Calls on subnormal data `w` and a mask `m` that involve no arithmetic on `w` (JAX's
#: arithmetic flushes subnormals too: ``w != 0`` or ``2 * w`` would differ from NumPy's).
SUBNORMAL_CALLS = [
    lambda w, m: ap.l1_unstructured(w, amount=0.5),
    lambda w, m: ap.l1_unstructured(w, amount=9, default_mask=m),
    lambda w, m: ap.nm_structured(w),
    lambda w, m: ap.nm_structured(w, 1, 3, dim=0, default_mask=m),
    lambda w, m: ap.global_unstructured([w, w[:2]], ap.L1Unstructured, amount=0.6),
    lambda w, m: ap.smallest_magnitude_keep([w, w[::-1]], 40, [m, None]),
    lambda w, m: [ap.kth_smallest(w, k) for k in (1, 9, 24, 40, 48)],
]
SUBNORMAL_IDS = ["l1", "l1-mask", "nm", "nm-mask", "global", "eligible", "kth"]


@pytest.mark.parametrize("dtype", SUBNORMAL_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("call", SUBNORMAL_CALLS, ids=SUBNORMAL_IDS)
@pytest.mark.slow
def test_subnormals_rank_as_on_numpy(call, dtype):
    """Eager and jitted JAX masks on subnormals equal NumPy's (bit patterns on the host)."""
    jit_matches_eager(call, data("subnormal", (6, 8), dtype=dtype), earlier_mask((6, 8)))


def test_subnormals_in_bfloat16():
    bits = np.random.default_rng(3).integers(0, 0x80, size=48).astype(np.uint16)  # subnormal bfloat16
    bits[::5] |= 0x8000  # some negative
    x = jax.lax.bitcast_convert_type(jnp.asarray(bits), jnp.bfloat16)
    want = ap.l1_unstructured(np.asarray(x, dtype=np.float32), amount=0.5)  # exact in float32
    assert_same(ap.l1_unstructured(x, amount=0.5), want)
    assert_same(jax.jit(lambda w: ap.l1_unstructured(w, amount=0.5))(x), want)


@pytest.mark.parametrize("kind", ["ties", "nan", "subnormal"])
@pytest.mark.slow
def test_bracket_path_matches_the_traced_exact_path(kind, monkeypatch):
    """Eager JAX on large inputs takes the sample bracket; jit the exact path: same masks."""
    monkeypatch.setattr(bracket, "SMALL_SIZE", 64)
    x = data(kind, (40, 50))
    mask = earlier_mask(x.shape)
    jit_matches_eager(lambda w: [ap.l1_unstructured(w, amount=a) for a in (0.1, 0.5, 1999)], x)
    jit_matches_eager(lambda w, m: ap.l1_unstructured(w, amount=700, default_mask=m), x, mask)
    jit_matches_eager(lambda w: [ap.kth_smallest(w, k) for k in (1, 1000, 2000)], x)
