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

from stagebench._numbers import finite, num
from stagebench.analysis._loader_evidence import is_ok, pool_points
from stagebench.analysis._worker_costs import workers_that_fit
from stagebench.core._config import CANNOT_MATTER
from stagebench.model._knobs import LoaderKnobs
from stagebench.model._loader import WorkerCosts
from stagebench.model._meta import RunMeta
from stagebench.runs._knobs import NOT_APPLICABLE, normalize_knobs
from stagebench.runs._schema import LOADER_COLUMNS, RANK_COLUMNS

__all__ = ["normalize_row", "user_point", "near_fastest"]


_NUMERIC = (
    "samples_per_s",
    "samples_per_s_low",
    "samples_per_s_high",
    "batches_per_s",
    "cv",
    "time_to_first_batch_s",
    "epoch_stall_s",
    "n_batches",
    "window_s",
    "cores_used",
    "mem_pss_mb",
    "mem_uss_mb",
    "mem_main_mb",
    "mem_workers_mb",
    "disk_read_mb_s",
    "elapsed_s",
    "n_samples",
    "workers_seen",
    "worker_threads",
    "startup_s",
    "warmup_s",
    "stall_phase_s",
    "teardown_s",
    "turn",
    "workers_start_s",
    "workers_start_last_s",
    "workers_created_s",
    "worker_boot_s",
    "worker_init_s",
    "first_batch_work_s",
    "first_delivery_s",
    "worker_unsplit_s",
)


def _flag(v: Any) -> bool | str:
    """True / False, or NOT_APPLICABLE where the knob does not apply (NaN after a CSV round trip)."""
    if isinstance(v, bool):
        return v
    if isinstance(v, str):
        s = v.strip().lower()
        if s in ("true", "1", "yes"):
            return True
        if s in ("false", "0", "no"):
            return False
        return NOT_APPLICABLE
    try:
        if v is None or math.isnan(float(v)):
            return NOT_APPLICABLE
        return bool(v)
    except (TypeError, ValueError):
        return NOT_APPLICABLE


def _text(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    return str(v)


def normalize_row(row: Any) -> dict[str, Any]:
    """One row with Python types: ints, floats (NaN when missing), True/False/NOT_APPLICABLE."""
    r = dict(row)
    out: dict[str, Any] = {c: r.get(c, math.nan) for c in LOADER_COLUMNS}
    out["num_workers"] = int(num(r.get("num_workers")) if math.isfinite(num(r.get("num_workers"))) else 0)
    pf = num(r.get("prefetch_factor"))
    out["prefetch_factor"] = int(pf) if math.isfinite(pf) else None
    out["persistent_workers"] = _flag(r.get("persistent_workers"))
    out["pin_memory"] = _flag(r.get("pin_memory"))
    for c in _NUMERIC:
        out[c] = num(r.get(c))
    for c in ("loader", "backend", "status", "reason", "search_phase", "started_at", "notes"):
        out[c] = _text(r.get(c))
    out["status"] = out["status"] or "ok"
    ranks = num(r.get("ranks"))
    for c in RANK_COLUMNS:  # a ranked window's; a row of one process holds none (as rows before ranks)
        if math.isfinite(ranks):
            out[c] = int(ranks) if c == "ranks" else num(r.get(c))
        else:
            del out[c]
    return out


def _raw(rows: Any) -> list[dict[str, Any]]:
    """Every row as measured, normalised (the tie-break reads them in order)."""
    if hasattr(rows, "to_dict"):
        rows = rows.to_dict(orient="records")
    return [normalize_row(r) for r in rows]


def _rows(rows: Any) -> list[dict[str, Any]]:
    """One point per setting, its readings pooled (:func:`stagebench.analysis._loader_evidence.pool_points`)."""
    return pool_points(_raw(rows))


def _over_budget(p: dict[str, Any], budget_mb: float | None, max_workers: int | None = None) -> bool:
    """Whether a setting passes the memory budget as measured, or has more workers than a cgroup's memory
    limit holds over an epoch (``max_workers``, :func:`_memory_cap`)."""
    if max_workers is not None and p["num_workers"] > max_workers:
        return True
    return budget_mb is not None and math.isfinite(p["mem_pss_mb"]) and p["mem_pss_mb"] > budget_mb


def _memory_cap(m: RunMeta) -> int | None:
    """The most workers a rank's loader may have for a cgroup's memory limit to hold every rank's over an
    epoch, where one sets the run's memory and the workers' growth was read
    (:func:`stagebench.analysis._worker_costs.workers_that_fit`); None otherwise."""
    return workers_that_fit(WorkerCosts.from_json(m.worker_costs), m.ranks) if m.worker_costs else None


def _cheapest_first(p: dict[str, Any]) -> tuple[float, ...]:
    return LoaderKnobs.from_row(p).cost()


def _cost(p: dict[str, Any]) -> tuple[float, ...]:
    """Workers first, then the other knobs, then memory (a candidate's cost in the job runs)."""
    mem = p["mem_pss_mb"] if math.isfinite(p["mem_pss_mb"]) else 0.0
    return (*_cheapest_first(p), mem)


def _stall_gain(p: dict, q: dict) -> float:
    """Seconds per epoch that q's persistent workers save over p (NaN when unknown)."""
    a, b = p["epoch_stall_s"], q["epoch_stall_s"]
    if not (math.isfinite(a) and math.isfinite(b)):
        return math.nan
    return a - b


def _overlaps(p: Mapping[str, Any], q: Mapping[str, Any]) -> bool:
    """Whether two points' 95% intervals overlap (both known)."""
    lo, hi = num(p.get("samples_per_s_low")), num(p.get("samples_per_s_high"))
    qlo, qhi = num(q.get("samples_per_s_low")), num(q.get("samples_per_s_high"))
    if not finite(lo, hi, qlo, qhi):
        return False
    return lo <= qhi and qlo <= hi


def near_fastest(p: Mapping[str, Any], top: Mapping[str, Any]) -> bool:
    """Whether ``p`` reads within :data:`CANNOT_MATTER` of the fastest, ``top``, or overlaps it: a comparison
    in turns could show it as good, or as the fastest. One rule for the decision (:func:`_near`) and for
    the loaders the search keeps open for it (:meth:`stagebench.loader._sweep._Sweep.prune`)."""
    return p["samples_per_s"] >= CANNOT_MATTER * top["samples_per_s"] or _overlaps(p, top)


def _rel_half(p: dict[str, Any]) -> float:
    lo, hi, s = p["samples_per_s_low"], p["samples_per_s_high"], p["samples_per_s"]
    if math.isfinite(lo) and math.isfinite(hi) and s > 0:
        return (hi - lo) / 2 / s
    return 0.0


def _knob_text(p: Mapping[str, Any]) -> str:
    """The point's setting as the DataLoader's arguments (:meth:`LoaderKnobs.label`)."""
    return LoaderKnobs.from_row(p).label(as_call=True)


def _mine(points: list[dict], user: dict | None) -> dict | None:
    """The user's measured setting among ``points``, if there."""
    if user is None or not is_ok(user):
        return None
    return next((p for p in points if LoaderKnobs.from_row(p) == LoaderKnobs.from_row(user)), None)


def _same_knobs_but(pool: list[dict], p: dict, **changed: Any) -> dict | None:
    """The measured point with p's knobs except ``changed``."""
    want = LoaderKnobs.from_row({**p, **changed})
    return next((q for q in pool if LoaderKnobs.from_row(q) == want), None)


def user_point(pts: list[dict[str, Any]], meta: Mapping[str, Any] | RunMeta) -> dict[str, Any] | None:
    """The point measured at the user's own setting: the "user" row, or the search point it coincided with."""
    for p in pts:
        if p["search_phase"] == "user":
            return p
    m = meta if isinstance(meta, RunMeta) else RunMeta.from_json(meta)
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
    return next((p for p in pts if LoaderKnobs.from_row(p) == eff), None)


def _why(p: Mapping[str, Any]) -> str | None:
    """The words of a point's pick (its ``why``), None where it has none."""
    why = p.get("why")
    return None if why is None else str(why)


def _decision(p: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The rule's record a point's pick rests on (its ``decision``), None where it has none."""
    decision = p.get("decision")
    return decision if isinstance(decision, Mapping) else None
