"""The selection primitive against a stable-argsort reference, on every backend and path.

``smallest_magnitude_keep`` has a small exact path, a sample-bracket path (NumPy/CPU
torch on the bit patterns of the floats; the portable path elsewhere) and a recovery
for brackets that miss. The module constants are shrunk with monkeypatch to reach the
bracket and the recovery on small arrays, so every path runs on every backend.
"""

from __future__ import annotations

import math

import array_api_compat as apc
import numpy as np
import pytest

import arrayprune as ap
from arrayprune import selection as sel
from arrayprune.selection import bracket, host, portable
from conftest import Backend, reference_keep, to_numpy

# JAX compiles every operation anew for each new shape (about a second per shape on a
# loaded machine): the exhaustive grids skip it, the tests marked below run it.
NOT_JAX = pytest.mark.skip_backend("jax", reason="XLA compiles per shape: JAX runs the smaller grids")


# --------------------------------------------------------------------------------------
# data
# --------------------------------------------------------------------------------------


def make_data(kind: str, n: int, seed: int = 0) -> np.ndarray:
    """float64 data of `n` entries with the named structure."""
    rng = np.random.default_rng(seed)
    if kind == "gauss":
        return rng.standard_normal(n)
    if kind == "half_zeros":  # 50% exact zeros (signed), the rest continuous
        x = rng.standard_normal(n)
        z = rng.random(n) < 0.5
        x[z] = np.where(rng.random(int(z.sum())) < 0.5, 0.0, -0.0)
        return x
    if kind == "all_equal":
        return np.full(n, -1.5)
    if kind == "integers":  # integer-valued floats: heavy ties
        return rng.integers(-6, 7, n).astype(np.float64)
    if kind == "nan_inf":
        x = rng.standard_normal(n)
        u = rng.random(n)
        x[u < 0.05] = np.nan
        x[(u >= 0.05) & (u < 0.08)] = np.inf
        x[(u >= 0.08) & (u < 0.10)] = -np.inf
        return x
    if kind == "sorted":
        return np.sort(np.abs(rng.standard_normal(n)))
    if kind == "reversed":
        return -np.sort(np.abs(rng.standard_normal(n)))[::-1].copy()
    if kind == "periodic":
        return (np.arange(n) % 7).astype(np.float64) - 3.0
    if kind == "sawtooth":  # periodic with the sampling stride: defeats a strided sample
        return ((np.arange(n) % 256) / 256.0) * np.where(np.arange(n) % 2, 1.0, -1.0)
    if kind == "tiny":  # subnormals and zeros
        x = rng.standard_normal(n) * 1e-40
        x[::3] = 0.0
        return x
    raise ValueError(kind)


KINDS = [
    "gauss",
    "half_zeros",
    "all_equal",
    "integers",
    "nan_inf",
    "sorted",
    "reversed",
    "periodic",
    "sawtooth",
    "tiny",
]


def ks_for(n: int) -> list[int]:
    return sorted({0, 1, 2, n // 3, n // 2, (2 * n) // 3, n - 1, n} & set(range(n + 1)))


def check_keep(backend, arrays_np, k, eligible_np=None, dtype="float32"):
    arrays = [backend.asarray(a, dtype) for a in arrays_np]
    host = [to_numpy(a).astype(np.float64) for a in arrays]  # values after rounding
    elig = None
    if eligible_np is not None:
        elig = [None if e is None else backend.asarray(e) for e in eligible_np]
    got = sel.smallest_magnitude_keep(arrays, k, elig)
    want = reference_keep(host, k, eligible_np)
    assert len(got) == len(arrays)
    for g, w, a in zip(got, want, arrays, strict=True):
        assert g.dtype == backend.dtype("bool")
        assert tuple(g.shape) == tuple(a.shape)
        assert apc.array_namespace(g) is apc.array_namespace(a)
        np.testing.assert_array_equal(to_numpy(g), w, err_msg=f"k={k}")
    return got


# --------------------------------------------------------------------------------------
# monkeypatching the constants, and counting what ran
# --------------------------------------------------------------------------------------


def shrink(monkeypatch, small=16, sample=256, sigmas=0.0, chunk=64):
    """Make the bracket path run on small arrays, with a tiny sample and bracket."""
    settings = {
        "SMALL_SIZE": small,
        "SAMPLE_SIZE": sample,
        "SAMPLE_STRIDE": 1 << 30,
        "SAMPLE_BOUNDS": (sample, sample),
        "BRACKET_SIGMAS": sigmas,
        "CHUNK_SIZE": chunk,
    }
    for name, value in settings.items():
        if hasattr(bracket, name):
            monkeypatch.setattr(bracket, name, value)


class Counter:
    """Counts calls of the bracket pieces (when the implementation has them)."""

    def __init__(self, monkeypatch):
        self.calls = {"keep": 0, "scan": 0, "exact": 0}
        # A pass in tie mode (the k-th key inside a heavy run of equal keys) is a bracket
        # pass too: it counts as "scan".
        counted_as = {"keep": "keep", "scan": "scan", "scan_tie": "scan", "exact": "exact"}
        for module, cls_name in ((host, "NumpyKeyStorage"), (portable, "StandardKeyStorage")):
            cls = getattr(module, cls_name, None)
            if cls is None:
                continue
            for meth, label in counted_as.items():
                orig = getattr(cls, meth, None)
                if orig is None:
                    continue
                monkeypatch.setattr(cls, meth, self._wrap(label, orig))

    def _wrap(self, name, orig):
        def wrapped(obj, *args, **kwargs):
            self.calls[name] += 1
            return orig(obj, *args, **kwargs)

        return wrapped

    @property
    def available(self) -> bool:
        return hasattr(bracket, "_BracketSelect")


# --------------------------------------------------------------------------------------
# small exact path
# --------------------------------------------------------------------------------------


@NOT_JAX
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", [1, 7, 1000, (1 << 15) - 1])
def test_small_single_array(backend, kind, n):
    x = make_data(kind, n, seed=n)
    for k in ks_for(n):
        check_keep(backend, [x], k)


@pytest.mark.parametrize("kind", ["gauss", "half_zeros", "integers", "nan_inf", "periodic"])
def test_small_single_array_jax_grid(backend, kind):
    if backend.backend is not Backend.JAX:
        pytest.skip("the full grid covers the other backends")
    x = make_data(kind, 1000, seed=1)
    for k in ks_for(1000):
        check_keep(backend, [x], k)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64"])
@pytest.mark.parametrize("kind", ["gauss", "integers", "nan_inf", "tiny"])
def test_small_other_dtypes(backend, dtype, kind):
    if not backend.has_dtype(dtype):
        pytest.skip(f"{backend.name} has no {dtype}")
    if backend.backend is Backend.JAX and kind in ("tiny", "integers"):
        pytest.skip("JAX grid kept small")
    x = make_data(kind, 999, seed=3)
    if kind == "tiny" and dtype in ("float16", "bfloat16"):
        x = x * 1e35  # subnormal range of the half types
    for k in (1, 333, 500, 998):
        check_keep(backend, [x], k, dtype=dtype)


@NOT_JAX
def test_small_multi_array_with_eligibility(backend):
    rng = np.random.default_rng(5)
    arrays = [
        make_data("integers", 300, 1).reshape(10, 30),
        make_data("gauss", 7, 2),
        np.zeros(0),
        make_data("nan_inf", 500, 3),
    ]
    elig = [rng.random((10, 30)) < 0.6, None, np.zeros(0, bool), rng.random(500) < 0.9]
    n_elig = sum(a.size if e is None else int(e.sum()) for a, e in zip(arrays, elig, strict=True))
    for k in sorted({0, 1, 17, n_elig // 2, n_elig - 1, n_elig}):
        got = check_keep(backend, arrays, k, elig)
        # ineligible entries are always kept
        for g, e in zip(got, elig, strict=True):
            if e is not None:
                assert to_numpy(g)[~e].all()
    with pytest.raises(ValueError):
        sel.smallest_magnitude_keep(
            [backend.asarray(a) for a in arrays], n_elig + 1, [None if e is None else backend.asarray(e) for e in elig]
        )


def test_ties_across_arrays_earlier_array_first(backend):
    a = backend.asarray(np.ones((2, 2), np.float32))
    b = backend.asarray(np.ones(3, np.float32))
    keep = sel.smallest_magnitude_keep([a, b], 5)
    np.testing.assert_array_equal(to_numpy(keep[0]), np.zeros((2, 2), bool))
    np.testing.assert_array_equal(to_numpy(keep[1]), [False, True, True])
    keep = sel.smallest_magnitude_keep([b, a], 2, [backend.asarray(np.array([True, False, True])), None])
    np.testing.assert_array_equal(to_numpy(keep[0]), [False, True, False])
    np.testing.assert_array_equal(to_numpy(keep[1]), np.ones((2, 2), bool))


def test_api_errors_and_k_zero(backend):
    x = backend.asarray(np.arange(6, dtype=np.float32))
    with pytest.raises(ValueError):
        sel.smallest_magnitude_keep([x], 7)
    with pytest.raises(ValueError):
        sel.smallest_magnitude_keep([x], -1)
    with pytest.raises(ValueError):
        sel.smallest_magnitude_keep([x, x], 1, [None])
    keep = sel.smallest_magnitude_keep([x, x], 0)
    for m in keep:
        assert m.dtype == backend.dtype("bool")
        np.testing.assert_array_equal(to_numpy(m), np.ones(6, bool))


def test_mixed_float_dtypes_numpy():
    a = np.array([0.5, 3.0, 1e-3], np.float32)
    b = np.array([0.25, 1e-3 + 1e-12, 2.0], np.float64)
    keep = sel.smallest_magnitude_keep([a, b], 3)
    want = reference_keep([a.astype(np.float64), b], 3)
    for g, w in zip(keep, want, strict=True):
        np.testing.assert_array_equal(g, w)


def test_integer_scores_portable(backend):
    x = np.array([[5, -2, 0, 7], [2, -9, 1, 0]], dtype=np.int64)
    for k in range(9):
        keep = sel.smallest_magnitude_keep([backend.asarray(x)], k)[0]
        np.testing.assert_array_equal(to_numpy(keep), reference_keep([x], k)[0])


def test_mixed_half_dtypes_torch():
    torch = pytest.importorskip("torch")
    a = torch.tensor([0.25, 4.0], dtype=torch.float16)
    b = torch.tensor([0.001, 8.0], dtype=torch.bfloat16)
    keep = sel.smallest_magnitude_keep([a, b], 1)
    np.testing.assert_array_equal(keep[0].numpy(), [True, True])
    np.testing.assert_array_equal(keep[1].numpy(), [False, True])  # 0.001 is the smallest


def test_big_endian_numpy():
    x = np.array([3.0, -1.0, 2.0, 0.5, 10.0], dtype=">f4")
    np.testing.assert_array_equal(sel.smallest_magnitude_keep([x], 2)[0], [True, False, True, False, True])


def test_non_contiguous_inputs(backend):
    x = make_data("integers", 600, 4).reshape(20, 30)
    t = backend.xp.permute_dims(backend.asarray(x), (1, 0))  # logical order is x.T
    for k in (0, 100, 301, 600):
        keep = sel.smallest_magnitude_keep([t], k)[0]
        np.testing.assert_array_equal(to_numpy(keep), reference_keep([x.T.copy()], k)[0])


def test_numpy_strided_views():
    x = make_data("half_zeros", 4000, 9)
    v = x[::3]  # non-contiguous view
    for k in (1, 500, 1333):
        np.testing.assert_array_equal(sel.smallest_magnitude_keep([v], k)[0], reference_keep([v.copy()], k)[0])
    np.testing.assert_array_equal(x, make_data("half_zeros", 4000, 9))  # untouched


# --------------------------------------------------------------------------------------
# bracket path: large sizes, default constants and a forced bracket
# --------------------------------------------------------------------------------------


@NOT_JAX
@pytest.mark.parametrize("mode", ["default", "bracket"])
@pytest.mark.parametrize(
    "n,kind",
    [
        (1 << 17, "gauss"),
        (1 << 17, "half_zeros"),
        (1 << 17, "integers"),
        (1 << 17, "nan_inf"),
        (1 << 17, "sorted"),
        (1 << 17, "periodic"),
        (1 << 20, "gauss"),
        (1 << 20, "half_zeros"),
    ],
)
@pytest.mark.slow
def test_large_single_array(backend, monkeypatch, mode, n, kind):
    if mode == "bracket":
        monkeypatch.setattr(bracket, "SMALL_SIZE", 1 << 12)
    counter = Counter(monkeypatch)
    x = make_data(kind, n, seed=7).astype(np.float32)
    ks = [1, n // 2, n - 3] if n > (1 << 17) else [1, n // 10, n // 2, (9 * n) // 10, n]
    for k in ks:
        check_keep(backend, [x], k)
    if mode == "bracket" and counter.available and backend.backend is not Backend.JAX:
        assert counter.calls["scan"] >= len(ks), counter.calls  # the bracket ran


@NOT_JAX
@pytest.mark.parametrize("mode", ["default", "bracket"])
def test_large_multi_array_with_eligibility(backend, monkeypatch, mode):
    if mode == "bracket":
        monkeypatch.setattr(bracket, "SMALL_SIZE", 1 << 12)
    rng = np.random.default_rng(11)
    arrays = [
        make_data("gauss", 1 << 16, 1).reshape(256, 256),
        make_data("half_zeros", 50_000, 2),
        make_data("integers", 300, 3),
        make_data("nan_inf", 30_000, 4),
    ]
    elig = [rng.random((256, 256)) < 0.7, None, rng.random(300) < 0.5, rng.random(30_000) < 0.5]
    total = sum(a.size if e is None else int(e.sum()) for a, e in zip(arrays, elig, strict=True))
    for k in (1, total // 4, total // 2, total - 1):
        check_keep(backend, [a.astype(np.float32) for a in arrays], k, elig)


@NOT_JAX
@pytest.mark.parametrize("dtype", ["float16", "float64"])
def test_large_other_dtypes(backend, monkeypatch, dtype):
    if not backend.has_dtype(dtype):
        pytest.skip(f"{backend.name} has no {dtype}")
    monkeypatch.setattr(bracket, "SMALL_SIZE", 1 << 12)
    x = make_data("gauss", 1 << 17, seed=8)
    for k in (5, 1 << 15, (1 << 17) - 5):  # float16 rounding makes many ties
        check_keep(backend, [x], k, dtype=dtype)


# --------------------------------------------------------------------------------------
# bracket misses, forced on small arrays
# --------------------------------------------------------------------------------------


@NOT_JAX
@pytest.mark.parametrize("sample", [64, 256])
def test_forced_bracket_misses(backend, monkeypatch, sample):
    shrink(monkeypatch, sample=sample)
    counter = Counter(monkeypatch)
    n = 1500
    kinds = ["gauss", "half_zeros", "integers", "nan_inf", "sorted", "reversed", "sawtooth"]
    for kind in kinds:
        x = make_data(kind, n, seed=13)
        for k in (1, 7, 300, 750, 751, 1200, 1499, 1500):
            check_keep(backend, [x], k)
    if counter.available:
        assert counter.calls["scan"] > counter.calls["keep"] > 0, counter.calls  # some bracket missed


@NOT_JAX
def test_forced_bracket_misses_multi_array(backend, monkeypatch):
    shrink(monkeypatch)
    counter = Counter(monkeypatch)
    rng = np.random.default_rng(17)
    arrays = [
        make_data("integers", 400, 1).reshape(20, 20),
        make_data("nan_inf", 300, 2),
        make_data("half_zeros", 500, 3),
    ]
    elig = [rng.random((20, 20)) < 0.5, None, rng.random(500) < 0.8]
    total = sum(a.size if e is None else int(e.sum()) for a, e in zip(arrays, elig, strict=True))
    for k in (1, 40, total // 2, total - 40, total):
        check_keep(backend, arrays, k, elig)
    if counter.available:
        assert counter.calls["scan"] > counter.calls["keep"], counter.calls


@NOT_JAX
def test_forced_bracket_nan_threshold(backend, monkeypatch):
    # k reaches into the NaN entries: the portable path cannot bracket NaN and must fall
    # back to the exact selection; the bit path ranks NaN above inf directly.
    shrink(monkeypatch)
    x = np.full(1000, np.nan)
    x[::4] = np.arange(250.0)
    x[1::8] = np.inf
    for k in (249, 250, 374, 375, 376, 900, 1000):
        check_keep(backend, [x], k)


@NOT_JAX
def test_forced_bracket_other_dtypes(backend, monkeypatch):
    shrink(monkeypatch)
    for dtype in ["float16", "float64", "bfloat16"]:
        if not backend.has_dtype(dtype):
            continue
        x = make_data("gauss", 2000, seed=19)
        for k in (3, 1000, 1997):
            check_keep(backend, [x], k, dtype=dtype)


@NOT_JAX
def test_forced_bracket_through_methods(backend, monkeypatch):
    shrink(monkeypatch)
    x = make_data("integers", 1200, 23).reshape(30, 40).astype(np.float32)
    t = backend.asarray(x)
    m1 = ap.l1_unstructured(t, 0.4)
    np.testing.assert_array_equal(to_numpy(m1), reference_keep([x], 480)[0])
    m2 = ap.l1_unstructured(t, 0.5, default_mask=m1)  # 0.5 of the 720 left: 360 more
    np.testing.assert_array_equal(to_numpy(m2), reference_keep([x], 840)[0])
    g = ap.global_unstructured([t, backend.asarray(x[:5].copy())], ap.L1Unstructured, amount=0.3)
    want = reference_keep([x, x[:5]], round(0.3 * 1400))
    for a, b in zip(g, want, strict=True):
        np.testing.assert_array_equal(to_numpy(a), b)


def test_bracket_paths_jax(monkeypatch):
    """The portable bracket on JAX (immutable arrays: xpx.at writes back by copy)."""
    jax_backend = pytest.importorskip("conftest")._load(Backend.JAX)
    monkeypatch.setattr(bracket, "SMALL_SIZE", 1 << 12)
    counter = Counter(monkeypatch)
    x = make_data("half_zeros", 1 << 17, seed=7).astype(np.float32)
    check_keep(jax_backend, [x], 1 << 16)  # threshold inside the zeros
    shrink(monkeypatch)  # a bracket of +-2 entries of a 256-entry sample: misses often
    y = make_data("nan_inf", 1500, seed=13)
    for k in (750, 1460):  # 1460 reaches the NaN entries
        check_keep(jax_backend, [y], k)
    rng = np.random.default_rng(17)
    arrays = [make_data("integers", 400, 1).reshape(20, 20), make_data("gauss", 500, 3)]
    elig = [rng.random((20, 20)) < 0.5, None]
    check_keep(jax_backend, arrays, 300, elig)
    if counter.available:
        assert counter.calls["scan"] > counter.calls["keep"] > 0, counter.calls


def test_portable_bracket_with_tiny_array_strict(monkeypatch):
    xs = pytest.importorskip("array_api_strict")
    monkeypatch.setattr(bracket, "SMALL_SIZE", 1 << 12)  # the default needs > 2**22 entries in all
    big = make_data("gauss", 1 << 20, seed=1).astype(np.float32)
    tiny = np.array([0.5, -2.0, 0.1], np.float32)
    keep = sel.smallest_magnitude_keep([xs.asarray(big), xs.asarray(tiny)], 1 << 19)
    want = reference_keep([big, tiny], 1 << 19)
    np.testing.assert_array_equal(np.from_dlpack(keep[1]), want[1])


def test_portable_bracket_with_tiny_array_other_backends(backend, monkeypatch):
    if backend.backend is Backend.ARRAY_API_STRICT:
        pytest.skip("strict has its own test above")
    if backend.backend is Backend.JAX:
        pytest.skip("JAX grid kept small")
    monkeypatch.setattr(bracket, "SMALL_SIZE", 1 << 12)
    big = make_data("gauss", 1 << 17, seed=1).astype(np.float32)
    tiny = np.array([0.5, -2.0, 1e-6], np.float32)
    check_keep(backend, [big, tiny], 1 << 16)


# --------------------------------------------------------------------------------------
# kth_smallest
# --------------------------------------------------------------------------------------


def _ref_kth(x: np.ndarray, k: int) -> float:
    return np.sort(x.reshape(-1))[k - 1]  # NumPy sorts NaN last


@pytest.mark.parametrize("kind", ["gauss", "integers", "nan_inf", "all_equal"])
def test_kth_smallest(backend, kind):
    if backend.backend is Backend.JAX and kind in ("all_equal", "integers"):
        pytest.skip("JAX grid kept small")
    x = make_data(kind, 301, seed=29).astype(np.float32).reshape(7, 43)
    t = backend.asarray(x)
    for k in (1, 2, 100, 150, 151, 280, 300, 301):
        v = ap.kth_smallest(t, k)
        assert tuple(v.shape) == ()
        assert v.dtype == t.dtype
        assert apc.array_namespace(v) is apc.array_namespace(t)
        np.testing.assert_array_equal(to_numpy(v), _ref_kth(x, k), err_msg=f"k={k}")
    for bad in (0, -1, 302):
        with pytest.raises(ValueError):
            ap.kth_smallest(t, bad)


def test_kth_smallest_signed_not_magnitude(backend):
    t = backend.asarray(np.array([-5.0, 1.0, -0.5, 3.0], np.float32))
    assert float(to_numpy(ap.kth_smallest(t, 1))) == -5.0
    assert float(to_numpy(ap.kth_smallest(t, 2))) == -0.5
    assert float(to_numpy(ap.kth_smallest(t, 4))) == 3.0
    ti = backend.asarray(np.array([4, -2, 9], np.int32))
    assert int(to_numpy(ap.kth_smallest(ti, 2))) == 4


def test_kth_smallest_large():
    x = make_data("half_zeros", 1 << 17, 31).astype(np.float32)
    for k in (1, 1 << 16, 1 << 17):
        np.testing.assert_array_equal(ap.kth_smallest(x, k), _ref_kth(x, k))


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_kth_smallest_dtypes(dtype):
    x = make_data("nan_inf", 500, 37).astype(dtype)
    for k in (1, 250, 449, 450, 470, 500):
        np.testing.assert_array_equal(ap.kth_smallest(x, k), _ref_kth(x, k))


def test_nan_and_inf_ordering_hand_computed(backend):
    x = np.array([np.nan, -np.inf, 0.0, np.inf, -1.0, np.nan, 2.0], np.float32)
    order_expected = [2, 4, 6, 1, 3, 0, 5]  # |x|: 0, 1, 2, inf(1), inf(3), nan(0), nan(5)
    t = backend.asarray(x)
    for k in range(len(x) + 1):
        keep = to_numpy(sel.smallest_magnitude_keep([t], k)[0])
        want = np.ones(len(x), bool)
        want[order_expected[:k]] = False
        np.testing.assert_array_equal(keep, want, err_msg=f"k={k}")


def test_math_sanity_of_reference():
    # the reference itself: NaN above inf, ties by index
    x = np.array([np.nan, 1.0, -np.inf, -1.0, 0.0])
    np.testing.assert_array_equal(__import__("conftest").reference_order(x), [4, 1, 3, 2, 0])
    assert math.isnan(_ref_kth(np.array([np.nan, 1.0]), 2))


# --------------------------------------------------------------------------------------
# heavy ties in the bracket path: counted, not gathered
# --------------------------------------------------------------------------------------


@NOT_JAX
@pytest.mark.parametrize("kind", ["zeros80", "quantized"])
@pytest.mark.parametrize("q", [0.3, 0.79, 0.8, 0.81, 0.95])
def test_heavy_ties_take_the_counting_pass(backend, monkeypatch, kind, q):
    monkeypatch.setattr(bracket, "SMALL_SIZE", 1 << 12)
    g = np.random.default_rng(5)
    n = 1 << 17
    if kind == "zeros80":
        x = np.where(g.random(n) < 0.8, 0.0, g.standard_normal(n)).astype(np.float32)
    else:
        x = (np.round(g.standard_normal(n) * 4) / 4).astype(np.float32)
    y = x[: 1 << 15].copy()
    elig = [g.random(n) < 0.9, None]
    counter = Counter(monkeypatch)
    available = int(elig[0].sum()) + y.size
    check_keep(backend, [x, y], round(q * available), elig)
    if counter.available:
        assert counter.calls["exact"] == 0, counter.calls


@pytest.mark.parametrize("bit_keys", [False, True], ids=["float-keys", "bit-keys"])
@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_portable_bracket_writes_candidates_by_position(monkeypatch, lib, bit_keys):
    """The route of CuPy and CUDA tensors, forced on host arrays: candidates are gathered
    once by position and written back there, with the same masks as the reference."""
    from arrayprune.selection import keys

    if lib == "torch":
        torch = pytest.importorskip("torch")
        convert = torch.from_numpy
    else:
        convert = np.asarray
    monkeypatch.setattr(keys, "on_accelerator", lambda x: bit_keys)
    shrink(monkeypatch, small=1 << 10, sample=1 << 10, sigmas=1.0)
    rng = np.random.default_rng(23)
    kinds = ["gauss", "half_zeros", "nan_inf", "integers"]
    arrays = [make_data(kind, 5000, seed).astype(np.float32) for seed, kind in enumerate(kinds)]
    elig = [None, rng.random(5000) < 0.6, None, rng.random(5000) < 0.5]
    xs = [convert(a) for a in arrays]
    es = [None if e is None else convert(e) for e in elig]
    xp = sel.namespace(xs[0])
    storage = portable.StandardKeyStorage(xp, xs, es)
    assert storage.writeable and (storage.bits is not None) == bit_keys
    written = []
    monkeypatch.setattr(portable.xpx, "at", _recording_at(portable.xpx.at, written))
    total = sum(a.size if e is None else int(e.sum()) for a, e in zip(arrays, elig, strict=True))
    for k in [1, 3000, total // 2, total - 7, total]:
        got = portable.keep_masks(xp, xs, es, k)
        want = reference_keep([a.astype(np.float64) for a in arrays], k, elig)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(to_numpy(g), w)
    assert written and all(str(dtype).endswith("int64") for dtype in written)


def _recording_at(at, written):
    """`xpx.at`, noting the dtype of each index it is given."""

    def recording(x, idx):
        written.append(idx.dtype)
        return at(x, idx)

    return recording


def test_portable_bracket_on_strict_writes_by_mask():
    """array-api-strict assigns at boolean masks only: its candidates stay a mask."""
    xs = pytest.importorskip("array_api_strict")
    x = xs.asarray(make_data("gauss", 100, 1).astype(np.float32))
    assert not portable.StandardKeyStorage(sel.namespace(x), [x], [None]).writeable
