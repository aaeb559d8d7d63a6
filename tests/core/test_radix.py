"""Radix selection (`arrayprune.selection.radix`) against the stable-argsort reference.

The cut is computed from chunk histograms and applied chunk by chunk in position order,
so these tests split the arrays into chunks of every size (ties straddling chunks and
arrays), and mix dtypes whose keys share one space.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_selection import make_data

from arrayprune.selection import radix, smallest_magnitude_keep
from conftest import reference_keep

KINDS = ["gauss", "half_zeros", "all_equal", "integers", "nan_inf", "sawtooth"]


def _chunked(arrays, chunk):
    """Flat chunks of every array, in order, of at most `chunk` entries."""
    for a in arrays:
        flat = a.reshape(-1)
        for start in range(0, flat.size, chunk):
            yield flat[start : start + chunk]


def radix_keep(arrays, k, chunk, eligible=None):
    """Keep masks of the `k` smallest magnitudes by radix cut plus streaming application."""
    names = [str(a.dtype) for a in arrays]
    bits = radix.key_bits(names, shifted=eligible is not None)
    elig = [None] * len(arrays) if eligible is None else eligible

    def keys():
        for a, name, e in zip(arrays, names, elig, strict=True):
            flat = a.reshape(-1)
            ef = None if eligible is None else (np.ones(flat.size, bool) if e is None else e.reshape(-1))
            for start in range(0, flat.size, chunk):
                sl = slice(start, start + chunk)
                yield radix.magnitude_keys(flat[sl], name, bits, None if ef is None else ef[sl])

    n_inel = sum(0 if e is None else int(e.size - e.sum()) for e in elig)
    total = sum(a.size for a in arrays)
    if k == 0:
        return [np.ones(a.shape, bool) for a in arrays]
    found = radix.cut_of_chunks(keys, bits, k + n_inel, total)
    stream = radix.StreamingCut(found)
    flat = np.concatenate([stream.keep(key) for key in keys()])
    if eligible is not None:
        ineligible = [np.zeros(a.size, bool) if e is None else ~e.reshape(-1) for a, e in zip(arrays, elig)]  # noqa: B905
        flat |= np.concatenate(ineligible)
    out, offset = [], 0
    for a in arrays:
        out.append(flat[offset : offset + a.size].reshape(a.shape))
        offset += a.size
    return out


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("chunk", [1, 7, 64, 1 << 20])
def test_equals_reference_over_arrays(kind, dtype, chunk):
    data = make_data(kind, 600, seed=3).astype(dtype)
    arrays = [data[:250].reshape(10, 25), data[250:251], data[251:]]
    for k in (1, 17, 300, 599, 600):
        got = radix_keep(arrays, k, chunk)
        want = reference_keep(arrays, k)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w)
        # and the in-memory selection gives the same masks
        for g, w in zip(got, smallest_magnitude_keep(arrays, k), strict=True):
            np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("chunk", [3, 100])
def test_eligibility(chunk):
    rng = np.random.default_rng(1)
    arrays = [np.round(rng.standard_normal((20, 30)), 1).astype(np.float32), rng.standard_normal(77).astype(np.float32)]
    eligible = [rng.random((20, 30)) < 0.6, None]
    n_eligible = int(eligible[0].sum()) + 77
    for k in (0, 1, 50, n_eligible):
        got = radix_keep(arrays, k, chunk, eligible)
        for g, w in zip(got, reference_keep(arrays, k, eligible), strict=True):
            np.testing.assert_array_equal(g, w)


def test_mixed_dtypes_share_one_key_space():
    """float16 and bfloat16 keys widen exactly into float32's: one ranking over all."""
    rng = np.random.default_rng(2)
    half = rng.standard_normal(300).astype(np.float16)
    single = rng.standard_normal(200).astype(np.float32)
    single[:50] = half[:50]  # equal magnitudes across dtypes: ties by position
    # bfloat16 as bit patterns: the upper halves of float32 values
    bf = (rng.standard_normal(100).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    bf_values = (bf.astype(np.uint32) << 16).view(np.float32)
    bits = radix.key_bits(["float16", "float32", "bfloat16"])
    assert bits == 31

    def keys():
        yield radix.magnitude_keys(half, "float16", bits)
        yield radix.magnitude_keys(single, "float32", bits)
        yield radix.magnitude_keys(bf, "bfloat16", bits)

    as_float = [half.astype(np.float32), single, bf_values]
    for k in (1, 120, 599):
        found = radix.cut_of_chunks(keys, bits, k, 600)
        stream = radix.StreamingCut(found)
        got = np.concatenate([stream.keep(key) for key in keys()])
        want = np.concatenate([m.reshape(-1) for m in reference_keep(as_float, k)])
        np.testing.assert_array_equal(got, want)


def test_key_widths():
    assert radix.key_bits(["bfloat16"]) == 15
    assert radix.key_bits(["float16"], shifted=True) == 16
    assert radix.key_bits(["float16", "bfloat16"]) == 31  # two encodings: widened to float32
    assert radix.key_bits(["float32", "float64"]) == 63
    with pytest.raises(TypeError, match="floating-point"):
        radix.key_bits(["int8"])


def test_passes_per_width():
    """One histogram pass per 16-bit digit: 1 for 16-bit floats, 2 for float32, 4 for float64."""
    for name, passes in (("float16", 1), ("float32", 2), ("float64", 4)):
        x = np.random.default_rng(0).standard_normal(1000).astype(name)
        bits = radix.key_bits([name])
        calls = []

        def chunks(x=x, name=name, bits=bits, calls=calls):
            calls.append(1)
            return [radix.magnitude_keys(x, name, bits)]

        radix.cut_of_chunks(chunks, bits, 400, x.size)
        assert len(calls) == passes


def test_cut_checks_rank_and_totals():
    keys = np.arange(10, dtype=np.uint32)
    with pytest.raises(ValueError, match="out of range"):
        radix.cut_of_chunks(lambda: [keys], 31, 11, 10)
    with pytest.raises(ValueError, match="account"):
        radix.cut_of_chunks(lambda: [keys], 31, 12, 20)


def test_tie_quotas():
    assert radix.tie_quotas([3, 0, 5, 2], 6) == [3, 0, 3, 0]
    assert radix.tie_quotas([1, 1], 0) == [0, 0]
    assert radix.tie_quotas([], 0) == []


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.lists(st.sampled_from([0.0, -0.0, 1.0, -1.0, 2.5, np.inf, -np.inf, np.nan, 1e-40]), min_size=1, max_size=30),
        min_size=1,
        max_size=4,
    ),
    st.integers(1, 9),
    st.data(),
)
def test_property_any_chunking(values, chunk, data):
    arrays = [np.array(v, dtype=np.float32) for v in values]
    total = sum(a.size for a in arrays)
    k = data.draw(st.integers(0, total))
    for g, w in zip(radix_keep(arrays, k, chunk), reference_keep(arrays, k), strict=True):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("kind", KINDS)
def test_reused_buffers_give_the_same_keys_and_masks(kind, dtype):
    """``magnitude_keys(out=)`` and ``StreamingCut.keep(out=)`` write into buffers reused
    across chunks; keys and masks equal those of fresh arrays, ties straddling chunks."""
    x = make_data(kind, 37 * 29, seed=3).astype(dtype)
    bits = radix.key_bits([dtype])
    keys = radix.magnitude_keys(x, dtype, bits)
    found = radix.cut_of_chunks(lambda: [keys], bits, x.size // 2, x.size)
    fresh, reused = radix.StreamingCut(found), radix.StreamingCut(found)
    key_buf = np.empty(100, dtype=keys.dtype)
    keep_buf = np.empty(100, dtype=bool)
    for start in range(0, x.size, 100):
        part = x[start : start + 100]
        into = radix.magnitude_keys(part, dtype, bits, out=key_buf[: part.size])
        assert np.shares_memory(into, key_buf)
        np.testing.assert_array_equal(into, radix.magnitude_keys(part, dtype, bits))
        mask = reused.keep(into, out=keep_buf[: part.size])
        assert np.shares_memory(mask, keep_buf)
        np.testing.assert_array_equal(mask, fresh.keep(radix.magnitude_keys(part, dtype, bits)))


@pytest.mark.parametrize("parts", [1, 2, 3, 5])
@pytest.mark.parametrize("guide", ["none", "spread", "misleading"])
def test_cut_counted_in_threads_equals_one_thread(parts, guide):
    """``cut_of_chunks(split=)`` counts runs of chunks in threads and adds the counts:
    the same cut, by the sample's one pass or by the digit passes."""
    rng = np.random.default_rng(4)
    keys = rng.integers(0, 5000, 40_000).astype(np.uint32)
    chunks = [keys[i : i + 3000] for i in range(0, keys.size, 3000)]
    runs = np.array_split(np.arange(len(chunks)), parts)

    def split():
        return [(chunks[i] for i in run) for run in runs]

    sample = {"none": None, "spread": keys[::13], "misleading": np.sort(keys)[-3000:]}[guide]
    for k in (1, 777, 20_000, keys.size):
        want = radix.cut_of_chunks(lambda: chunks, 31, k, keys.size)
        assert radix.cut_of_chunks(lambda: chunks, 31, k, keys.size, sample=sample, split=split) == want


def test_cut_counted_in_threads_raises_a_parts_error():
    def failing():
        yield np.zeros(10, dtype=np.uint32)
        raise OSError(5, "Input/output error")

    def split():
        return [iter([np.ones(10, dtype=np.uint32)]), failing()]

    with pytest.raises(OSError, match="Input/output"):
        radix.cut_of_chunks(lambda: [], 31, 5, 20, split=split)


@pytest.mark.parametrize("seed", range(6))
def test_bounded_counts_equal_the_in_memory_bounded_ranking(seed):
    import arrayprune as ap

    rng = np.random.default_rng(seed)
    scales = rng.choice([0.01, 1.0, 30.0], 4)  # ties within and between arrays
    arrays = [(rng.integers(-20, 21, n) * s).astype(np.float32) for n, s in zip((50, 80, 33, 64), scales, strict=True)]
    low, high = float(rng.uniform(0, 0.4)), float(rng.uniform(0.6, 1.0))
    amount = float(rng.uniform(low + 0.01, high - 0.01))
    masks = ap.global_unstructured(arrays, ap.L1Unstructured, amount=amount, min_sparsity=low, max_sparsity=high)
    want = [int(a.size - np.count_nonzero(m)) for a, m in zip(arrays, masks, strict=True)]
    bits = radix.key_bits(["float32"])
    keys = [radix.magnitude_keys(a, "float32", bits) for a in arrays]

    def histograms(prefix, shift, width):
        for chunks in keys:  # each array in two chunks
            yield sum(radix.digit_histogram(c, prefix, shift, width) for c in np.array_split(chunks, 2))

    bounds = [(int(np.ceil(low * a.size - 1e-9)), int(np.floor(high * a.size + 1e-9))) for a in arrays]
    got = radix.bounded_counts(histograms, bits, sum(want), bounds)
    assert got == want
    for a, m, k in zip(arrays, masks, got, strict=True):  # and each array drops its k smallest, ties by position
        np.testing.assert_array_equal(np.asarray(m), smallest_magnitude_keep([a], k)[0])
    unbounded = radix.bounded_counts(histograms, bits, sum(want), [(0, a.size) for a in arrays])
    plain = ap.global_unstructured(arrays, ap.L1Unstructured, amount=sum(want))
    assert unbounded == [int(a.size - np.count_nonzero(m)) for a, m in zip(arrays, plain, strict=True)]
    with pytest.raises(ValueError, match="within the bounds"):
        radix.bounded_counts(histograms, bits, sum(hi for _, hi in bounds) + 1, bounds)
    # the same from each array's keys sorted, in two passes (a sample of 16, 64 keys, or all)
    ordered = [np.sort(c) for c in keys]
    sizes = [c.size for c in ordered]
    for sample in (16, 64, 1 << 20):
        found = radix.bounded_counts_of_sorted(lambda: iter(ordered), sizes, sum(want), bounds, sample=sample)
        if found is None:  # the bracket would hold too much: never for these sizes
            raise AssertionError("no bracket")
        counts, strict = found
        assert counts == want
        for c, k, flag in zip(ordered, counts, strict, strict=True):  # strict: two different keys meet at the cut
            assert not flag or k in (0, c.size) or c[k - 1] < c[k]
