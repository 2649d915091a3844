"""Amdahl and Universal Scalability Law fits of throughput against concurrency.

The Universal Scalability Law (Gunther) models throughput at concurrency c as

    X(c) = λ c / (1 + σ (c - 1) + κ c (c - 1))

with σ the serial (contended) fraction and κ the coherency cost; Amdahl's law
is the special case κ = 0, whose ceiling is λ / σ. Why these two: σ is the
number a GIL-holding stage moves (threads that hold the GIL a fraction f of
their time flatten at λ / f, so σ ≈ f), κ captures curves that go *down*
past a peak (thrashing, oversubscribed cores), and both are standard enough
that a reader can check them.

Why the linearised fit: dividing c by X gives

    c / X = a + u c + d c (c - 1),   with a, u, d >= 0
    λ = 1 / (a + u),  σ = u λ,  κ = d λ

so the constrained fit (σ in [0, 1], κ >= 0) is a three-column non-negative
least-squares problem: exact, fast and free of starting values. The residuals
are weighted by each point's relative uncertainty, so a noisy point pulls
less than a tight one.

Why this bootstrap: each point carries a batch-means interval. Replicates
draw every point from a normal with that point's standard error, widened to
its residual when the model misses the point by more than its noise (model
misfit is uncertainty too), and refit. Percentiles of the replicates give the
parameter intervals. The generator is seeded, so a summary rebuilt from the
same rows is identical.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy.optimize import nnls

from stagebench.core._stats import t_quantile

__all__ = ["fit_scaling", "usl", "point_sd", "MIN_LEVELS", "POOR_R2"]

#: Fewer distinct concurrency levels than this make the fit indicative only.
MIN_LEVELS = 4
#: Below this R² (on throughput) a fit is called poor.
POOR_R2 = 0.8
_DEFAULT_REL_SD = 0.10  # assumed when a point has no interval (one batch)
_MIN_REL_SD = 0.01  # no point is trusted to better than 1%


def usl(c: np.ndarray | float, lam: float, sigma: float, kappa: float) -> np.ndarray | float:
    """Throughput predicted by the USL at concurrency ``c``."""
    c = np.asarray(c, dtype=float)
    return lam * c / (1.0 + sigma * (c - 1.0) + kappa * c * (c - 1.0))


def point_sd(qps: float, low: float, high: float, n_batches: float | None = None) -> float:
    """Standard error of one point's throughput, from its confidence interval."""
    if not (math.isfinite(low) and math.isfinite(high)) or high <= low:
        return _DEFAULT_REL_SD * qps
    half = (high - low) / 2.0
    crit = 1.96
    if n_batches is not None and math.isfinite(n_batches) and n_batches >= 2:
        crit = t_quantile(0.975, int(n_batches) - 1)
    return max(half / crit, _MIN_REL_SD * qps)


def _nnls_fit(c: np.ndarray, x: np.ndarray, rel_sd: np.ndarray, amdahl: bool) -> tuple[float, float, float]:
    """(λ, σ, κ) by weighted NNLS on c / X."""
    y = c / x
    cols = [np.ones_like(c), c] if amdahl else [np.ones_like(c), c, c * (c - 1.0)]
    design = np.column_stack(cols)
    # relative error of X is the relative error of c / X (first order)
    w = 1.0 / (np.maximum(rel_sd, _MIN_REL_SD) * y)
    coef, _ = nnls(design * w[:, None], y * w)
    a, u = coef[0], coef[1]
    d = 0.0 if amdahl else coef[2]
    if a + u <= 0:
        return (math.nan, math.nan, math.nan)
    lam = 1.0 / (a + u)
    return (lam, u * lam, d * lam)


def _r2(x: np.ndarray, pred: np.ndarray | float) -> float:
    ss_tot = float(((x - x.mean()) ** 2).sum())
    ss_res = float(((x - pred) ** 2).sum())
    if ss_tot <= 0:
        return 1.0 if ss_res <= 1e-12 * max(1.0, float((x**2).sum())) else math.nan
    return 1.0 - ss_res / ss_tot


def _peak(sigma: float, kappa: float) -> float:
    """Concurrency of the USL maximum; inf when the curve never turns down."""
    if not (math.isfinite(sigma) and math.isfinite(kappa)) or kappa <= 0:
        return math.inf
    return math.sqrt(max(0.0, 1.0 - sigma) / kappa)


def _interval(samples: np.ndarray, confidence: float) -> list[float] | None:
    s = samples[np.isfinite(samples)]
    if len(s) < 10:
        return None
    lo, hi = np.percentile(s, [50 * (1 - confidence), 50 * (1 + confidence)])
    return [float(lo), float(hi)]


def fit_scaling(
    concurrency: Sequence[float],
    qps: Sequence[float],
    qps_low: Sequence[float] | None = None,
    qps_high: Sequence[float] | None = None,
    n_batches: Sequence[float] | None = None,
    *,
    n_boot: int = 200,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict[str, Any]:
    """Fit the USL and Amdahl's law to one throughput curve, with bootstrap intervals.

    Points with a non-positive or missing throughput are ignored. Returns the
    ``fit`` entry of ``summary.json``: ``model, lambda, sigma, kappa,
    sigma_interval, kappa_interval, amdahl_serial_fraction, amdahl_interval,
    amdahl_ceiling, peak_concurrency, peak_interval, r2, amdahl_r2, levels,
    points, warning``. ``peak_concurrency`` is where the fitted USL curve is
    highest (``None`` when it never turns down); ``peak_beyond_measured`` says
    whether that lies past the largest measured level.
    """
    c = np.asarray(concurrency, dtype=float)
    x = np.asarray(qps, dtype=float)
    lo = np.asarray(qps_low if qps_low is not None else [math.nan] * len(c), dtype=float)
    hi = np.asarray(qps_high if qps_high is not None else [math.nan] * len(c), dtype=float)
    nb = np.asarray(n_batches if n_batches is not None else [math.nan] * len(c), dtype=float)
    keep = np.isfinite(c) & np.isfinite(x) & (x > 0) & (c >= 1)
    c, x, lo, hi, nb = c[keep], x[keep], lo[keep], hi[keep], nb[keep]
    levels = int(len(np.unique(c)))
    out: dict[str, Any] = {
        "model": "usl",
        "lambda": None,
        "sigma": None,
        "kappa": None,
        "sigma_interval": None,
        "kappa_interval": None,
        "amdahl_serial_fraction": None,
        "amdahl_interval": None,
        "amdahl_ceiling": None,
        "peak_concurrency": None,
        "peak_interval": None,
        "peak_beyond_measured": None,
        "r2": None,
        "amdahl_r2": None,
        "levels": levels,
        "points": int(len(c)),
        "warning": None,
    }
    if levels < 2:
        out["warning"] = (
            "one concurrency level measured: nothing to fit" if levels == 1 else "no successful points: nothing to fit"
        )
        return out

    sd = np.array([point_sd(q, low, high, n) for q, low, high, n in zip(x, lo, hi, nb)])
    rel = sd / x
    amdahl_only = levels < 3  # two levels determine two parameters, not three
    lam, sig, kap = _nnls_fit(c, x, rel, amdahl=amdahl_only)
    a_lam, a_sig, _ = _nnls_fit(c, x, rel, amdahl=True)
    if not (math.isfinite(lam) and math.isfinite(a_lam)):
        # c / X falls with c: no non-negative (σ, κ) describes that, so there is
        # nothing to fit or bootstrap around
        out["warning"] = (
            "throughput rises faster than linearly with concurrency: no scaling law fits "
            "(usually a low-concurrency point measured low by noise)"
        )
        return out
    pred = usl(c, lam, sig, kap)
    a_pred = usl(c, a_lam, a_sig, 0.0)
    r2 = _r2(x, pred)
    a_r2 = _r2(x, a_pred)

    # Parametric bootstrap: each point drawn around its value with its standard
    # error, or its distance from the model when that is larger (misfit is
    # uncertainty too). Replicates are fitted with the same weights as the data.
    rng = np.random.default_rng(seed)
    spread = np.maximum(sd, np.abs(x - pred))
    a_spread = np.maximum(sd, np.abs(x - a_pred))
    boots = np.full((n_boot, 4), math.nan)
    for b in range(n_boot):
        z = rng.standard_normal(len(x))
        xb = np.maximum(x + z * spread, 0.05 * x)  # a throughput cannot go negative
        _, s_b, k_b = _nnls_fit(c, xb, rel, amdahl=amdahl_only)
        xa = np.maximum(x + z * a_spread, 0.05 * x)
        _, as_b, _ = _nnls_fit(c, xa, rel, amdahl=True)
        boots[b] = (s_b, k_b, as_b, _peak(s_b, k_b))

    peak = _peak(sig, kap)
    warnings = []
    if levels < MIN_LEVELS:
        warnings.append(f"only {levels} concurrency levels: the fit is indicative only")
    if amdahl_only:
        warnings.append("two levels determine Amdahl's law only (coherency κ set to 0)")
    if math.isfinite(r2) and r2 < POOR_R2:
        warnings.append(f"poor fit (R² {r2:.2f}): the curve is not the shape the USL describes")
    peaks = boots[:, 3]
    finite_peaks = peaks[np.isfinite(peaks)]
    out.update(
        {
            "lambda": float(lam),
            "sigma": float(sig),
            "kappa": float(kap),
            "sigma_interval": _interval(boots[:, 0], confidence),
            "kappa_interval": _interval(boots[:, 1], confidence),
            "amdahl_serial_fraction": float(a_sig),
            "amdahl_interval": _interval(boots[:, 2], confidence),
            "amdahl_ceiling": float(a_lam / a_sig) if a_sig > 0 else None,
            "peak_concurrency": float(peak) if math.isfinite(peak) else None,
            # only meaningful when most replicates have a peak at all
            "peak_interval": _interval(finite_peaks, confidence) if len(finite_peaks) >= 0.8 * n_boot else None,
            "peak_beyond_measured": bool(peak > c.max()) if math.isfinite(peak) else True,
            "r2": float(r2) if math.isfinite(r2) else None,
            "amdahl_r2": float(a_r2) if math.isfinite(a_r2) else None,
            "warning": "; ".join(warnings) or None,
        }
    )
    return out
