"""The host selection at mid sizes: its own crossover, its sample, and the narrowing of
key arrays before a partition (samples and candidates), against sorted references."""

from __future__ import annotations

import numpy as np
import pytest

import arrayprune as ap
from arrayprune.selection import bracket, host
from conftest import reference_keep


def _keys(kind: str, n: int, seed: int = 0) -> np.ndarray:
    """Unsigned magnitude keys of float32 data of the named structure."""
    rng = np.random.default_rng(seed)
    if kind == "gauss":
        x = rng.standard_normal(n)
    elif kind == "integers":  # heavy ties
        x = rng.integers(-6, 7, n).astype(np.float64)
    elif kind == "sorted":
        x = np.sort(np.abs(rng.standard_normal(n)))
    elif kind == "sawtooth":
        x = (np.arange(n) % 256) / 256.0
    else:
        raise ValueError(kind)
    return x.astype(np.float32).view(np.uint32) & np.uint32(0x7FFF_FFFF)


KINDS = ["gauss", "integers", "sorted", "sawtooth"]


def _check_narrowed(keys: np.ndarray, first: int, last: int) -> tuple[np.ndarray, int]:
    before = keys.copy()
    part, offset = host._narrow(keys, first, last)
    np.testing.assert_array_equal(keys, before)  # read only
    want = np.sort(keys)
    got = np.sort(part)
    # The ranks asked for sit at the same ranks of `part`, shifted by `offset` ...
    np.testing.assert_array_equal(got[first - offset : last - offset + 1], want[first : last + 1])
    # ... and `part` is a whole value range: every key between its extremes is in it.
    inside = (keys >= got[0]) & (keys <= got[-1])
    assert int(np.count_nonzero(inside)) == part.size
    assert offset == int(np.count_nonzero(keys < got[0]))
    return part, offset


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", [host.NARROW_SIZE, host.NARROW_SIZE + 1, 50_000])
def test_narrow_keeps_the_ranks(kind, n):
    keys = _keys(kind, n, seed=n)
    for first, last in [(0, 0), (n // 2, n // 2), (n // 3, n // 2), (n - 1, n - 1), (0, n - 1), (7, n - 8)]:
        _check_narrowed(keys, first, last)


def test_narrow_narrows_long_arrays():
    keys = _keys("gauss", 200_000)
    part, _ = _check_narrowed(keys, 100_000, 100_000)
    assert part.size < keys.size // 5
    short = keys[:100]
    part, offset = host._narrow(short, 50, 50)
    assert part is short and offset == 0  # short: left as it is


@pytest.mark.parametrize("kind", KINDS)
def test_narrow_recovers_from_missed_brackets(monkeypatch, kind):
    monkeypatch.setattr(bracket, "BRACKET_SIGMAS", 0.0)  # a bracket of +-2 sub-sample keys
    keys = _keys(kind, 30_000, seed=3)
    missed = 0
    for first in (1, 999, 15_000, 29_990):
        part, _ = _check_narrowed(keys, first, first + 3)
        missed += part.size == keys.size
    if kind == "gauss":
        assert missed  # the fallback ran


@pytest.mark.parametrize("kind", KINDS)
def test_ranked_matches_the_sorted_sample(kind):
    sample = _keys(kind, 40_000, seed=5)
    want = np.sort(sample)
    select = host.NumpyKeyStorage([sample.copy()], [None])
    ranks = [20_000, 0, 39_999, 12_345]
    for r, (value, first, last) in zip(ranks, select.ranked(sample.copy(), ranks), strict=True):
        assert value == want[r]
        assert first == int(np.searchsorted(want, value, "left"))
        assert last == int(np.searchsorted(want, value, "right")) - 1


def test_crossover_is_bounded_by_the_shared_one(monkeypatch):
    assert host.small_size() == min(host.SMALL_SIZE, bracket.SMALL_SIZE)
    monkeypatch.setattr(bracket, "SMALL_SIZE", 16)  # what tests do to force the bracket
    assert host.small_size() == 16


@pytest.mark.parametrize("offset", [0, 1, 1000])
@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_both_sides_of_the_crossover(lib, offset):
    n = host.small_size() + offset
    x = np.random.default_rng(offset).standard_normal(n).astype(np.float32)
    x[::5] = np.round(x[::5])  # ties straddling the cut
    arr = x
    if lib == "torch":
        torch = pytest.importorskip("torch")
        arr = torch.from_numpy(x)
    for k in (1, n // 3, n // 2, n - 1):
        (keep,) = ap.smallest_magnitude_keep([arr], k)
        np.testing.assert_array_equal(np.asarray(keep), reference_keep([x], k)[0])
        assert ap.kth_smallest(arr, k).item() == np.sort(x)[k - 1]


@pytest.mark.parametrize("total", [2, 3, 9, 10_000, 1 << 20, 1 << 26])
def test_sample_stride_is_prime_to_six(total):
    stride = host.NumpyKeyStorage([np.zeros(1, np.uint32)], [None]).sample_stride(total)
    assert stride % 2 == 1 and stride % 3 != 0


def test_a_missed_bracket_widens_by_the_sample_first(monkeypatch):
    monkeypatch.setattr(bracket, "SMALL_SIZE", 1 << 10)
    monkeypatch.setattr(host, "BRACKET_SIGMAS", 0.0)  # a bracket of +-2 sample keys: misses often
    brackets = []
    scan = host.NumpyKeyStorage.scan

    def spy(self, lo, hi):
        brackets.append(lo != self.min_key and hi != self.max_key)
        return scan(self, lo, hi)

    monkeypatch.setattr(host.NumpyKeyStorage, "scan", spy)
    x = np.random.default_rng(9).standard_normal(1 << 16).astype(np.float32)
    widened = 0
    for k in range(1, x.size, 997):
        brackets.clear()
        (keep,) = ap.smallest_magnitude_keep([x], k)
        np.testing.assert_array_equal(keep, reference_keep([x], k)[0])
        widened += len(brackets) > 1 and brackets[1]
    assert widened  # some second scan took a bracket of sample keys, not the whole side
