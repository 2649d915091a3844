"""Loader rows as points: one row with Python types, and one pooled point per setting.

Rows arrive either as the dicts the sweep just measured or as a DataFrame read back from CSV (where
``True`` became a string and an empty prefetch_factor became NaN); :func:`normalize_row` makes both
look the same, so ``stagebench report RUN_DIR`` rebuilds the same summary from saved rows. The helpers
beside it compare points: their knobs, their cost, their intervals, the memory budget, the user's own.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from stagebench._numbers import finite
from stagebench.analysis._loader_evidence import pool_points
from stagebench.analysis._worker_costs import workers_that_fit
from stagebench.core._config import CANNOT_MATTER
from stagebench.model._knobs import LoaderKnobs
from stagebench.model._loader import LoaderRow
from stagebench.model._meta import RunMeta
from stagebench.runs._knobs import normalize_knobs

__all__ = ["normalize_row", "user_point", "near_fastest"]


def normalize_row(row: Mapping[str, Any]) -> LoaderRow:
    """One row with Python types (:meth:`LoaderRow.from_row`)."""
    return row if isinstance(row, LoaderRow) else LoaderRow.from_row(row)


def _raw(rows: Any) -> list[LoaderRow]:
    """Every row as measured, read once (the tie-break reads them in order): ``rows`` a DataFrame read
    back from results.csv, or the rows as the sweep measured them."""
    if hasattr(rows, "to_dict"):
        rows = rows.to_dict(orient="records")
    return [normalize_row(r) for r in rows]


def _rows(rows: Any) -> list[LoaderRow]:
    """One point per setting, its readings pooled (:func:`stagebench.analysis._loader_evidence.pool_points`)."""
    return pool_points(_raw(rows))


def _over_budget(p: LoaderRow, budget_mb: float | None, max_workers: int | None = None) -> bool:
    """Whether a setting passes the memory budget as measured, or has more workers than a cgroup's memory
    limit holds over an epoch (``max_workers``, :func:`_memory_cap`)."""
    if max_workers is not None and p.num_workers > max_workers:
        return True
    return budget_mb is not None and math.isfinite(p.mem_pss_mb) and p.mem_pss_mb > budget_mb


def _memory_cap(m: RunMeta) -> int | None:
    """The most workers a rank's loader may have for a cgroup's memory limit to hold every rank's over an
    epoch, where one sets the run's memory and the workers' growth was read
    (:func:`stagebench.analysis._worker_costs.workers_that_fit`); None otherwise."""
    return workers_that_fit(m.worker_costs, m.ranks) if m.worker_costs is not None else None


def _cheapest_first(p: LoaderRow) -> tuple[float, ...]:
    return p.knobs.cost()


def _cost(p: LoaderRow) -> tuple[float, ...]:
    """Workers first, then the other knobs, then memory (a candidate's cost in the job runs)."""
    mem = p.mem_pss_mb if math.isfinite(p.mem_pss_mb) else 0.0
    return (*_cheapest_first(p), mem)


def _stall_gain(p: LoaderRow, q: LoaderRow) -> float:
    """Seconds per epoch that q's persistent workers save over p (NaN when unknown)."""
    a, b = p.epoch_stall_s, q.epoch_stall_s
    if not (math.isfinite(a) and math.isfinite(b)):
        return math.nan
    return a - b


def _overlaps(p: LoaderRow, q: LoaderRow) -> bool:
    """Whether two points' 95% intervals overlap (both known)."""
    lo, hi, qlo, qhi = p.samples_per_s_low, p.samples_per_s_high, q.samples_per_s_low, q.samples_per_s_high
    if not finite(lo, hi, qlo, qhi):
        return False
    return lo <= qhi and qlo <= hi


def near_fastest(p: LoaderRow, top: LoaderRow) -> bool:
    """Whether ``p`` reads within :data:`CANNOT_MATTER` of the fastest, ``top``, or overlaps it: a comparison
    in turns could show it as good, or as the fastest. One rule for the decision (:func:`_near`) and for
    the loaders the search keeps open for it (:meth:`stagebench.loader._search._Sweep.prune`)."""
    return p.samples_per_s >= CANNOT_MATTER * top.samples_per_s or _overlaps(p, top)


def _rel_half(p: LoaderRow) -> float:
    lo, hi, s = p.samples_per_s_low, p.samples_per_s_high, p.samples_per_s
    if math.isfinite(lo) and math.isfinite(hi) and s > 0:
        return (hi - lo) / 2 / s
    return 0.0


def _knob_text(p: LoaderRow) -> str:
    """The point's setting as the DataLoader's arguments (:meth:`LoaderKnobs.label`)."""
    return p.knobs.label(as_call=True)


def _mine(points: list[LoaderRow], user: LoaderRow | None) -> LoaderRow | None:
    """The user's measured setting among ``points``, if there."""
    if user is None or not user.ok:
        return None
    return next((p for p in points if p.knobs == user.knobs), None)


def _same_knobs_but(
    pool: list[LoaderRow], p: LoaderRow, *, persistent_workers: bool | None = None, pin_memory: bool | None = None
) -> LoaderRow | None:
    """The measured point with p's knobs except those given."""
    k = p.knobs
    want = LoaderKnobs(
        num_workers=k.num_workers,
        prefetch_factor=k.prefetch_factor,
        persistent_workers=k.persistent_workers if persistent_workers is None else persistent_workers,
        pin_memory=k.pin_memory if pin_memory is None else pin_memory,
    )
    return next((q for q in pool if q.knobs == want), None)


def user_point(pts: list[LoaderRow], m: RunMeta) -> LoaderRow | None:
    """The point measured at the user's own setting: the "user" row, or the search point it coincided with."""
    for p in pts:
        if p.search_phase == "user":
            return p
    knobs = m.loader.user_knobs
    if knobs is None:
        return None

    try:
        eff, _, _ = normalize_knobs(
            LoaderKnobs(**knobs.to_json()),
            "torch" if m.loader.backend is None else m.loader.backend,
            cuda=m.settings.cuda,
        )
    except (TypeError, ValueError):
        return None
    return next((p for p in pts if p.knobs == eff), None)
