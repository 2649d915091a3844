import math

import numpy as np
import pytest

from stagebench.core._stats import batch_count, fractional_counts, mean_interval, percentiles_ms


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


def test_interval_is_student_t_on_the_log_scale_and_never_fakes_certainty():
    r = mean_interval([10, 12, 11, 9, 13], 0.95)
    assert r.mean == 11
    h = 2.776 * math.sqrt(2.5) / math.sqrt(5) / 11  # the t half-width relative to the mean
    assert r.low == pytest.approx(11 * math.exp(-h), rel=1e-3)
    assert r.high == pytest.approx(11 * math.exp(h), rel=1e-3)
    assert r.high / r.mean == pytest.approx(r.mean / r.low)
    one = mean_interval([5.0], 0.95)
    assert one.mean == 5.0 and math.isnan(one.low) and math.isnan(one.high)


def test_a_wide_spread_of_batch_rates_never_reaches_below_zero():
    """Batches that waited for a core read at a fraction of the others: the linear interval went negative."""
    r = mean_interval([400.0, 5.0, 380.0, 2.0, 390.0], 0.95)
    assert 0 < r.low < r.mean < r.high
    assert r.cv > 0.8


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


def test_whole_run_interval_contains_its_rate_when_every_batch_counts_alike():
    """A periodic sink (sleep stages) fills every batch alike: a zero-width interval must still hold the rate.

    CI once read qps 373.30285639061793 against bounds of 373.3028563906179: the
    interval sat on the batches' mean rate, the point was items over seconds.
    """
    import numpy as np

    from stagebench.pipeline._wholerun import WholePipelineRun

    rng = np.random.default_rng(3)
    for _ in range(200):
        r = WholePipelineRun.__new__(WholePipelineRun)
        t0 = float(rng.uniform(0, 100))
        span = float(rng.uniform(0.5, 3.0))
        n = int(rng.integers(20, 400))
        r.error, r.windows, r.pulls, r.timings = None, [(t0, t0 + span)], [], {}
        r.arrivals = list(t0 + (np.arange(n) + 0.5) * span / n)  # one arrival in each 1/n of the window
        r.warmup_s, r.used, r.steady_latency_s, r.items_per_sink_item = 0.0, {}, None, 4.0
        out = r.result(items_per_sink_item=4)
        assert out.qps_low <= out.qps <= out.qps_high, out
