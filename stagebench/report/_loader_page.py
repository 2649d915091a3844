"""The loader page: the headline tiles, one row per setting measured, the snippet to paste, the
figures, the transforms as stage cards and what each worker costs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from stagebench._numbers import finite
from stagebench.analysis._loader import pooled_frame
from stagebench.model._knobs import KNOBS
from stagebench.model._loader import LoaderPoint, Shipping, Shm, WorkerCosts, WorkerMemory
from stagebench.model._meta import RunSettings
from stagebench.model._rate import Rate
from stagebench.report import _loader_plots
from stagebench.report._html import interval_text, num_text, rate_text, svg_uri
from stagebench.report._page_parts import cell, job_tile, noise_tile, problem_rows, tile, with_keys
from stagebench.report._run import RunData
from stagebench.report._snippets import loader_snippet
from stagebench.report._stage_cards import stage_cards

__all__ = ["loader_context"]

#: what the template reads of the recommended and the best point: the knobs, the rate, why
_LOADER_KEYS = (*KNOBS, "samples_per_s", "samples_per_s_low", "samples_per_s_high", "why")


def loader_context(run: RunData) -> dict[str, Any]:
    """The loader page's part of the report's context.

    Args: the loaded run (a loader sweep). Returns: what ``report.html.j2`` reads as ``loader``: the tiles,
    the recommended and best settings, one row per setting measured, the snippet, the figures, the
    transforms' stage cards and what each worker costs.
    """
    rows, sm = run.rows, run.summary
    rec = with_keys(sm.recommended, _LOADER_KEYS) if sm.recommended else {}
    best = with_keys(sm.best, _LOADER_KEYS)
    # the same points, read: the tiles' figures and the table's mark of the recommended
    rec_pt = LoaderPoint.from_json(sm.recommended) if rec else None
    best_rate, user = LoaderPoint.from_json(sm.best).samples_per_s, LoaderPoint.from_json(sm.user_setting)
    search = sm.search
    target = with_keys(sm.target, ("rate", "met", "verdict")) if sm.target else None
    tiles = _tiles(run, rec_pt, best_rate, user, target)
    rows, points = _setting_rows(rows, rec_pt)
    trows = run.transform_rows
    transforms = stage_cards(
        trows if trows is not None else pd.DataFrame(),
        run.transforms,
        [],
        run.provenance.cores,
        anchor="transform",
    )
    budget = (sm.settings or RunSettings()).memory_budget_mb
    target_rate = sm.target.get("rate") if sm.target else None
    return {
        "rec": rec,
        "best": best,
        "search": search,
        "target": target,
        "tiles": tiles,
        "snippet": loader_snippet(sm),
        "img_tput": svg_uri(_loader_plots.loader_throughput_svg(rows, rec_pt, target_rate)) if len(rows) else None,
        "img_heat": svg_uri(_loader_plots.loader_heatmap_svg(rows, rec_pt)) if len(rows) else None,
        "img_startup": svg_uri(_loader_plots.loader_startup_memory_svg(rows, budget if finite(budget) else None))
        if len(rows)
        else None,
        "points": points,
        "problems": problem_rows(rows),
        "transforms": transforms,
        "costs": _worker_costs_context(sm.worker_costs),
    }


def _tiles(
    run: RunData,
    rec_pt: LoaderPoint | None,
    best_rate: Rate | None,
    user: LoaderPoint,
    target: Mapping[str, Any] | None,
) -> list[dict[str, str]]:
    """The loader page's headline tiles: the job's, the recommended and best settings, the trainer's
    demand, the search, your setting, and the measurement noise."""
    rows, search = run.rows, run.summary.search
    tiles = job_tile(run.job)
    if rec_pt is not None and rec_pt.samples_per_s is not None:
        tiles.append(
            tile(
                "recommended setting, loader alone",
                f"{rate_text(rec_pt.samples_per_s.value)} samples/s",
                _knobs_text(rec_pt),
            )
        )
    if best_rate is not None:
        tiles.append(
            tile(
                "best measured", f"{rate_text(best_rate.value)} samples/s", interval_text(best_rate.low, best_rate.high)
            )
        )
    if target:
        tiles.append(
            tile(
                "trainer needs",
                f"{rate_text(target.get('rate'))} samples/s",
                "the loader alone meets it" if target.get("met") else "NOT met even by the loader alone",
            )
        )
    if search is not None and search.points_measured is not None:
        points = f"{search.points_measured} point{'' if search.points_measured == 1 else 's'}"
        sub = f"{points} in {num_text(search.seconds)} s"
        if finite(search.time_saved_s) and best_rate is not None:  # a saving only where a setting was measured
            sub += f"; saved {num_text(search.time_saved_s)} s vs the full grid"
        tiles.append(tile(f"search ({'?' if search.strategy is None else search.strategy})", points, sub))
    if user.samples_per_s is not None:
        tiles.append(
            tile("your setting, loader alone", f"{rate_text(user.samples_per_s.value)} samples/s", _knobs_text(user))
        )
    noise = noise_tile(rows, "samples_per_s")
    if noise is not None:
        tiles.append(noise)
    return tiles


@dataclass(frozen=True, slots=True)
class _SettingRow:
    """One setting measured, as the points table shows it (its readings pooled)."""

    nw: str
    pf: str
    pw: Any
    pin: Any
    sps: float | None
    lo: float | None
    hi: float | None
    ttfb: float | None
    stall: float | None
    cores: float | None
    mem: float | None
    runs: int
    rec: bool


def _setting_rows(rows: pd.DataFrame, rec_pt: LoaderPoint | None) -> tuple[pd.DataFrame, list[_SettingRow]]:
    """The rows with repeated readings pooled (the page's figures draw these), and one table row per setting."""
    points: list[_SettingRow] = []
    if not rows.empty and "num_workers" in rows:
        # one point per setting, repeated readings pooled (a setting measured twice is never shown at its higher)
        rows = pooled_frame(rows)
        ok = rows[(rows["status"] == "ok") & rows["samples_per_s"].notna()].copy()
        for c in ("num_workers", "prefetch_factor"):
            ok[c] = pd.to_numeric(ok[c], errors="coerce")
        ok = ok.sort_values(["num_workers", "prefetch_factor"], kind="stable", na_position="first")
        for pt in map(LoaderPoint.from_json, ok.to_dict("records")):
            r = pt.samples_per_s
            points.append(
                _SettingRow(
                    nw=num_text(pt.num_workers) if pt.num_workers is not None else "—",
                    pf=num_text(pt.prefetch_factor) if pt.prefetch_factor is not None else "—",
                    pw=cell(pt.persistent_workers),
                    pin=cell(pt.pin_memory),
                    sps=None if r is None else r.value,
                    lo=None if r is None else r.low,
                    hi=None if r is None else r.high,
                    ttfb=pt.time_to_first_batch_s,
                    stall=pt.epoch_stall_s,
                    cores=pt.cores_used,
                    mem=pt.mem_pss_mb,
                    runs=pt.measurements or 1,
                    rec=_same_knobs(pt, rec_pt),
                )
            )
    return rows, points


def _worker_costs_context(costs: WorkerCosts | None) -> dict[str, Any] | None:
    """What each worker costs (summary["worker_costs"]): the start-up split and the memory over the pass."""
    if costs is None:
        return None
    return {
        "img_startup": svg_uri(_loader_plots.worker_startup_svg(costs)),
        "img_memory": svg_uri(_loader_plots.worker_memory_svg(costs)),
        "ship": costs.shipping or Shipping(),
        "mem": costs.memory or WorkerMemory(),
        "available_mb": costs.available_mb,
        "shm": costs.shm or Shm(),
        "seconds": costs.seconds,
    }


def _knobs_text(point: LoaderPoint) -> str:
    """``num_workers=4, prefetch_factor=2`` (prefetch only with workers: :meth:`LoaderKnobs.label`)."""
    knobs = point.knobs
    return f"num_workers={point.num_workers}" if knobs is None else knobs.label(as_call=True, flags=False)


def _same_knobs(row: LoaderPoint, rec: LoaderPoint | None) -> bool:
    """Whether a table's point is the recommended setting (a prefetch_factor either leaves out matches any)."""
    if rec is None or rec.num_workers is None:
        return False
    if (row.num_workers or 0) != rec.num_workers:
        return False
    pf_r, pf_c = row.prefetch_factor, rec.prefetch_factor
    if pf_r is not None and pf_c is not None and pf_r != pf_c:
        return False
    flags = ((row.persistent_workers, rec.persistent_workers), (row.pin_memory, rec.pin_memory))
    return all(str(a).lower() == str(b).lower() for a, b in flags)
