import math

import numpy as np
import pytest

from stagebench._stats import batch_count, fractional_counts, mean_interval, percentiles_ms


def test_back_to_back_items_tile_the_window_exactly():
    # one lane, items of 0.3 s back to back from t=-0.1: 1 s window holds 1/0.3 items
    starts = np.arange(-0.1, 1.5, 0.3)
    ends = starts + 0.3
    counts = fractional_counts(starts, ends, np.array([0.0, 0.5, 1.0]))
    assert counts.sum() == pytest.approx(1 / 0.3)
    assert counts[0] == pytest.approx(0.5 / 0.3)


def test_integer_counting_would_be_off_by_a_lot_but_fractional_is_not():
    starts = np.array([0.0, 0.4, 0.8])
    ends = starts + 0.4
    counts = fractional_counts(starts, ends, np.array([0.1, 1.1]))
    assert counts.sum() == pytest.approx(2.5)


def test_zero_length_items_count_in_their_bin():
    counts = fractional_counts(np.array([0.2, 0.7]), np.array([0.2, 0.7]), np.array([0.0, 0.5, 1.0]))
    assert list(counts) == [1.0, 1.0]


def test_batch_count_keeps_two_latencies_per_batch():
    assert batch_count(2.0, 0.01, 10) == 10
    assert batch_count(2.0, 0.25, 10) == 4
    assert batch_count(1.0, 1.0, 10) == 1


def test_interval_is_student_t_and_never_fakes_certainty():
    m, lo, hi, cv = mean_interval([10, 12, 11, 9, 13], 0.95)
    assert m == 11
    assert lo == pytest.approx(11 - 2.776 * math.sqrt(2.5) / math.sqrt(5), rel=1e-3)
    assert hi - m == pytest.approx(m - lo)
    m1, lo1, hi1, _ = mean_interval([5.0], 0.95)
    assert m1 == 5.0 and math.isnan(lo1) and math.isnan(hi1)


def test_percentiles_in_ms():
    p50, p90, p99 = percentiles_ms(np.linspace(0.001, 0.1, 100))
    assert p50 == pytest.approx(50.5, rel=0.02)
    assert p99 > p90 > p50


def _dense_reference(starts, ends, edges):
    counts = np.zeros(len(edges) - 1)
    for s, e in zip(starts, ends):
        if e <= s:
            i = np.searchsorted(edges, e, side="right") - 1
            if e == edges[-1]:
                i = len(edges) - 2
            if 0 <= i < len(counts):
                counts[i] += 1
            continue
        for b in range(len(counts)):
            counts[b] += max(0.0, min(e, edges[b + 1]) - max(s, edges[b])) / (e - s)
    return counts


@pytest.mark.parametrize("seed", range(5))
def test_fast_counting_equals_the_overlap_definition(seed):
    rng = np.random.default_rng(seed)
    starts = rng.uniform(-0.5, 1.5, 3000)
    ends = starts + rng.exponential(0.05, 3000) * (rng.random(3000) > 0.05)  # some zero-length
    edges = np.linspace(0.0, 1.0, 11)
    np.testing.assert_allclose(fractional_counts(starts, ends, edges), _dense_reference(starts, ends, edges), atol=1e-9)
