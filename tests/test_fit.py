"""USL / Amdahl fits: exact recovery, honest intervals, warnings, robustness."""

from __future__ import annotations

import math

import numpy as np
import pytest

from stagebench.analysis._fit import fit_scaling, usl

LEVELS = np.array([1, 2, 4, 8, 16, 32], dtype=float)


def test_recovers_usl_parameters_exactly_from_a_usl_curve():
    q = usl(LEVELS, 100.0, 0.05, 0.002)
    fit = fit_scaling(LEVELS, q, q * 0.98, q * 1.02, [10] * len(q))
    assert fit["lambda"] == pytest.approx(100.0, rel=1e-6)
    assert fit["sigma"] == pytest.approx(0.05, abs=1e-6)
    assert fit["kappa"] == pytest.approx(0.002, abs=1e-7)
    assert fit["peak_concurrency"] == pytest.approx(math.sqrt(0.95 / 0.002), rel=1e-6)
    assert fit["peak_beyond_measured"] is False
    assert fit["r2"] == pytest.approx(1.0)
    assert fit["warning"] is None


def test_intervals_cover_the_truth_under_noise():
    rng = np.random.default_rng(1)
    truth_sigma, truth_kappa = 0.1, 0.003
    q_true = usl(LEVELS, 200.0, truth_sigma, truth_kappa)
    q = q_true * (1 + 0.03 * rng.standard_normal(len(LEVELS)))
    fit = fit_scaling(LEVELS, q, q * 0.95, q * 1.05, [10] * len(q))
    lo, hi = fit["sigma_interval"]
    assert lo <= truth_sigma <= hi
    klo, khi = fit["kappa_interval"]
    assert klo <= truth_kappa <= khi
    assert fit["sigma_interval"][1] - fit["sigma_interval"][0] > 0  # noise gives a real width


def test_amdahl_serial_fraction_of_gil_shaped_curves():
    # threads capped at 1/g: min(c/t, 1/g); the Amdahl serial fraction tracks g/t
    t = 4e-3
    flat = fit_scaling(LEVELS[:5], np.full(5, 1 / t))
    assert flat["amdahl_serial_fraction"] == pytest.approx(1.0, abs=1e-6)
    linear = fit_scaling(LEVELS[:5], LEVELS[:5] / t)
    assert linear["amdahl_serial_fraction"] == pytest.approx(0.0, abs=1e-6)
    assert linear["peak_concurrency"] is None  # never turns down
    half = fit_scaling(LEVELS[:5], np.minimum(LEVELS[:5] / t, 1 / (0.5 * t)))
    assert 0.35 < half["amdahl_serial_fraction"] < 0.65


def test_fewer_than_four_levels_warn_and_two_levels_fit_amdahl_only():
    q3 = usl(np.array([1.0, 2, 4]), 100, 0.1, 0.0)
    fit3 = fit_scaling([1, 2, 4], q3)
    assert "indicative only" in fit3["warning"]
    fit2 = fit_scaling([1, 2], [100.0, 150.0])
    assert fit2["kappa"] == 0.0
    assert "Amdahl" in fit2["warning"]
    assert fit2["amdahl_serial_fraction"] == pytest.approx(1 / 3, abs=1e-6)


def test_one_level_or_no_valid_points_give_no_fit_but_a_reason():
    one = fit_scaling([4], [100.0])
    assert one["sigma"] is None and "one concurrency level" in one["warning"]
    none = fit_scaling([1, 2], [math.nan, 0.0])
    assert none["sigma"] is None and none["levels"] == 0 and "no successful points" in none["warning"]


def test_poor_fit_is_flagged_with_r2():
    # a zig-zag no scalability law describes
    q = np.array([100, 400, 90, 500, 80, 450.0])
    fit = fit_scaling(LEVELS, q, q * 0.99, q * 1.01)
    assert fit["r2"] < 0.8
    assert "poor fit" in fit["warning"]


def test_nan_and_non_positive_points_are_ignored_and_results_are_deterministic():
    q = usl(LEVELS, 100.0, 0.05, 0.0)
    q_bad = q.copy()
    q_bad[2] = math.nan
    lo = q_bad * 0.97
    hi = q_bad * 1.03
    a = fit_scaling(LEVELS, q_bad, lo, hi)
    b = fit_scaling(LEVELS, q_bad, lo, hi)
    assert a == b
    assert a["points"] == 5
    assert a["sigma"] == pytest.approx(0.05, abs=1e-6)


def test_a_superlinear_curve_gets_a_reason_not_an_exception():
    # A first point measured during a load spike: c / X falls with c, which no
    # non-negative (σ, κ) describes. Seen inside a real diagnosis, where the
    # exception replaced the whole analysis with the fallback summary.
    c = [1.0, 2.0, 4.0, 8.0]
    q = [358.1, 18143.6, 761.5, 145.3]
    fit = fit_scaling(c, q, [x * 0.9 for x in q], [x * 1.1 for x in q], [10.0] * 4)
    assert fit["sigma"] is None and fit["points"] == 4
    assert "faster than linearly" in fit["warning"]
