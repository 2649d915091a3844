"""A loader run's summary: the loader summary.json from its rows and ``run.json``.

Everything here is a pure function of ``results.csv`` rows and ``run.json``, so ``stagebench report
RUN_DIR`` rebuilds the same summary from saved rows. The rows are pooled (:mod:`._loader_rows`), the
pick made (:mod:`._loader_pick`, or the job runs' where they decided: :mod:`._loader_job`), and the
findings read (:mod:`._loader_findings`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from stagebench._numbers import finite, fmt_cores, num
from stagebench._settings import DEMAND_HEADROOM, LOADER_TIE_ROUNDS
from stagebench.analysis._job import decide_job
from stagebench.analysis._kind import job_keys, summary_head
from stagebench.analysis._loader_findings import loader_findings
from stagebench.analysis._loader_job import _job_not_run, _zero_workers_note, apply_job_pick
from stagebench.analysis._loader_pick import _decision_words, _kept_knobs, _turn_seconds, recommend
from stagebench.analysis._loader_rows import _knob_text, _memory_cap, _raw, _rel_half, _rows, user_point
from stagebench.analysis._worker_costs import beside_the_pick, worker_cost_findings, worker_costs_summary
from stagebench.model._finding import by_severity
from stagebench.model._job import JobVerdict, StepAlone
from stagebench.model._loader import LoaderRow, LoaderTarget
from stagebench.model._meta import RunMeta
from stagebench.model._stage import changed
from stagebench.runs._provenance import load_warnings

__all__ = ["summarize_loader", "loader_pick", "pooled_frame"]


def pooled_frame(rows: Any) -> Any:
    """The rows as one pooled point per setting, as a DataFrame (what the report's table and figures show)."""
    import pandas as pd  # start-up cost: pandas only where the report asks for a frame

    return pd.DataFrame([p.to_json() for p in _rows(rows)])


def _warnings(pts: list[LoaderRow], m: RunMeta) -> list[str]:
    before, after = m.provenance, m.provenance_after
    out = list(load_warnings({} if before is None else before.to_json(), None if after is None else after.to_json()))
    wide = [p for p in pts if p.ok and _rel_half(p) > 0.15]
    if wide:
        out.append(
            f"wide intervals (over ±15%) at {len(wide)} of {len(pts)} points: the machine may be busy, "
            "or batches are bursty; a longer budget_s narrows them"
        )
    no_int = [p for p in pts if p.ok and not math.isfinite(p.samples_per_s_low)]
    if no_int:
        out.append(f"no interval at {len(no_int)} point(s): too few batches in the window (raise budget_s)")
    for p in pts:
        if "perturbed" in p.notes:
            out.append(f"{_knob_text(p)}: {p.notes}")
    if m.search.interrupted:
        out.append("the sweep was interrupted: the summary covers the points measured before it")
    if m.status == "running" and m.ended is not None:  # a sweep that never finished, as the rebuild found it
        out.append(f"the sweep was cut short: {m.ended.text}; this summary covers the points measured before it")
    out.extend(m.warnings)
    return out


@dataclass(frozen=True)
class _Picks:
    """What the loader summary is built from: the pooled points, the demand on the loader and the settings picked."""

    #: the host's ranks the sweep ran at once, and its usable cores (NaN where not recorded)
    ranks: float
    cores: float
    within: float
    headroom: float
    #: samples/s the trainer needs (stated, or its step measured: ``measured_demand``); None without a trainer
    target_rate: Any
    measured_demand: bool
    trainer: StepAlone
    pts: list[LoaderRow]
    best: LoaderRow | None
    user: LoaderRow | None
    #: the job runs' verdict (None without a job)
    verdict: JobVerdict | None
    #: the job runs decided the pick
    decided: bool
    #: the recommendation: the job's pick where its runs decided, else :attr:`isolated`
    rec: LoaderRow | None
    #: the loader alone's recommendation
    isolated: LoaderRow | None
    #: yours is the recommendation although the loader alone's differs: your step was measured, so a change
    #: is advised only where it ran with your loop, and the job did not run (:func:`_held`)
    held: bool = False
    #: what the rounds in turns took: in all, and a round (:func:`_turn_seconds`)
    turn_seconds: tuple[float, float] | None = None


def summarize_loader(rows: Any, meta: dict[str, Any]) -> dict[str, Any]:
    """The loader summary.json (docs/contracts.md, kind "loader").

    With the training job run (``run.json["job"]``: the user's loop on the real loader at
    each candidate, :mod:`stagebench.analysis._job`), the recommendation is the job's pick
    and the verdict the job's figure; without it, the loader alone's, and a verdict about
    the job is "inconclusive".
    """
    m = RunMeta.from_json(meta)
    c = _picks(rows, m)
    target = _target(c)
    costs = worker_costs_summary(m, c.pts)
    verdict = _verdict(c, target) + beside_the_pick(costs, c.rec)
    rec, isolated = c.rec, c.isolated
    return {
        **summary_head("loader", m, None),
        "loader": m.loader.to_json(),
        "verdict": verdict,
        "warnings": _warnings(c.pts, m),
        "recommended": rec.pick_json(with_why=True) if rec is not None else None,
        "recommended_alone": isolated.pick_json(with_why=True)
        if isolated is not None and rec is not None and isolated.knobs != rec.knobs
        else None,
        "best": c.best.pick_json() if c.best is not None else None,
        "user_setting": c.user.pick_json() if c.user is not None else None,
        "points": [p.to_json() for p in c.pts],
        "search": _search_summary(m, c.pts),
        "target": None if target is None else target.to_json(),
        **job_keys("the loader", m, c.verdict, planned=m.trainer_planned, picked=rec is not None),
        "findings": [
            f.to_json()
            for f in by_severity(loader_findings(c.pts, m, rec, target, c.verdict) + worker_cost_findings(costs, rec))
        ],
        "worker_costs": None if costs is None else costs.to_json(),
        "transforms": list(m.transforms),
    }


def loader_pick(rows: Any, meta: RunMeta) -> LoaderRow | None:
    """The recommended row as the summary makes it from ``rows`` and the run's ``meta`` (the script's own
    setting, a target rate, the job's pick where its runs decided): what is measured at the pick (each
    worker's memory) is measured at this one."""
    return _picks(rows, meta).rec


def _picks(rows: Any, m: RunMeta) -> _Picks:
    """The demand on the loader, the points and the recommendation (the job's pick where its runs decided).

    The job's candidates gain ``zero_workers``, why num_workers=0 was or was not chosen.
    """
    s = m.settings
    within = float(0.05 if s.within_best is None else s.within_best)
    headroom = float(DEMAND_HEADROOM if s.headroom is None else s.headroom)
    target_rate = s.target_rate
    trainer = m.step or StepAlone()
    measured_demand = target_rate is None and finite(trainer.samples_per_s)
    if measured_demand:  # STAGEBENCH_TRAINER=measure: the loop's own step is the demand (loader/_trainer)
        target_rate = num(trainer.samples_per_s)
    pts = _rows(rows)
    ok = [p for p in pts if p.ok]
    user = user_point(pts, m)
    verdict = decide_job(m.job, m.step)
    decided = verdict is not None and verdict.decided
    rec = recommend(
        rows,  # as measured: the tie-break's rows are read in their order
        budget_mb=s.memory_budget_mb,
        within_best=within,
        target_rate=target_rate,
        headroom=headroom,
        user=user,
        serial_ok=target_rate is None,
        max_workers=_memory_cap(m),
        max_rounds=LOADER_TIE_ROUNDS if s.tie_rounds is None else int(s.tie_rounds),
    )
    rec = _kept_knobs(rec, ok, m)
    isolated = rec
    held = False
    if decided and verdict is not None:
        rec = _kept_knobs(apply_job_pick(pts, verdict), ok, m, with_loop=True)
        verdict = changed(verdict, zero_workers=_zero_workers_note(verdict))
    elif measured_demand and (kept := _held(rec, user)) is not None:
        rec, held = _kept_knobs(kept, ok, m), True
    return _Picks(
        ranks=num(s.ranks),
        cores=num(s.usable_cores),
        within=within,
        headroom=headroom,
        target_rate=target_rate,
        measured_demand=measured_demand,
        trainer=trainer,
        pts=pts,
        best=max(ok, key=lambda p: p.samples_per_s) if ok else None,
        user=user,
        verdict=verdict,
        decided=decided,
        rec=rec,
        isolated=isolated,
        held=held,
        turn_seconds=_turn_seconds(_raw(rows)),
    )


def _held(rec: LoaderRow | None, user: LoaderRow | None) -> LoaderRow | None:
    """Yours, where the loader alone's pick is another setting and the job, with the step measured, did not run;
    else None.

    Why: the step measured makes the question the job's, and what a loader alone leaves out is what the job
    runs measure: the workers sharing the cores with the step, the copy to a GPU, and for ``num_workers=0``
    the loading added to every step (a loader 1.26x yours alone can make the job slower). A change from yours
    is advised only where a run with the loop shows it.
    """
    if rec is None or user is None or rec.knobs == user.knobs:
        return None
    return replace(
        user,
        why="your setting, kept: no setting was run with your loop, and a change from yours is advised only where "
        "one was",
        decision=None,
    )


def _target(c: _Picks) -> LoaderTarget | None:
    """The trainer's demand and whether the loader alone meets it with the headroom (None without a demand)."""
    target_rate, headroom, best, trainer = c.target_rate, c.headroom, c.best, c.trainer
    if target_rate is None:
        return None
    need = target_rate * (1 + headroom)
    met = best is not None and best.samples_per_s >= need
    if best is None:
        verdict = f"data-bound: no loader setting could be measured, the trainer needs {target_rate:,.1f} samples/s"
    elif met:
        isolated = c.isolated
        assert isolated is not None  # recommend() is None only when no point is ok, and best is one
        verdict = (
            f"the loader alone keeps up: {isolated.samples_per_s:,.1f} samples/s at {_knob_text(isolated)} "
            f"against {target_rate:,.1f} needed (+{headroom:.0%} headroom)"
        )
    else:
        verdict = (
            f"data-bound: the best loader alone gives {best.samples_per_s:,.1f} samples/s, "
            f"the trainer needs {target_rate:,.1f}"
        )
    if c.measured_demand:
        verdict += f" (the demand is your training step, measured: {trainer.steps_per_s:,.2f} steps/s)"
    return LoaderTarget(target_rate, need, bool(met), verdict, "measured" if c.measured_demand else "stated")


def _verdict(c: _Picks, target: LoaderTarget | None) -> str:
    """The summary's verdict: the job's where its runs decided, the demand not met, else the pick alone."""
    if c.rec is None:
        first = next((p for p in c.pts if p.reason), None)
        verdict = "no loader setting could be measured" + (f": {first.reason}" if first else "")
    elif c.decided and c.verdict is not None:
        verdict = str(c.verdict.text)
    elif c.held and c.isolated is not None and c.rec is not None:
        verdict = ("" if target is None or target.met else target.verdict + "; ") + _held_words(c, c.isolated, c.rec)
    elif target is not None and not target.met:
        verdict = target.verdict
    else:
        verdict = _pick_verdict(c, c.rec, target)
    if target is not None and not c.decided and not c.held:
        verdict += "; the job: " + _job_not_run(c.verdict, target)
    return verdict + _per_rank(c.rec, c.ranks, c.cores)


def _held_words(c: _Picks, alone: LoaderRow, yours: LoaderRow) -> str:
    """Yours kept for the job (:func:`_held`), why, and what the loader alone would have picked, on what."""
    stopped = c.verdict.stopped if c.verdict is not None else c.trainer.stopped_early
    said = (
        f"keep yours ({_knob_text(yours)}): no setting was run with your loop"
        + (f" ({stopped})" if stopped else "")
        + f", and a change from yours is advised only where one was; by the loader alone, {_knob_text(alone)} "
    )
    if alone.decision is None:  # the cheapest that delivers the step's demand
        return said + (
            f"is the cheapest setting that delivers your step's {c.target_rate:,.1f} samples/s with "
            f"{c.headroom:.0%} headroom ({alone.samples_per_s:,.1f} samples/s, yours {yours.samples_per_s:,.1f})"
        )
    return said + f"was the pick: {_decision_words(alone.decision, {}, c.within, c.turn_seconds)}"


def _per_rank(rec: LoaderRow | None, ranks: float, cores: float) -> str:
    """A ranked sweep's pick in the words users set it (each rank's own loader) and what it makes on the
    host; "" on one rank."""
    if rec is None or not math.isfinite(ranks) or ranks <= 1:
        return ""
    n, nw = int(ranks), int(rec.num_workers)
    on = f" on {fmt_cores(cores)}" if math.isfinite(cores) else ""
    workers = f"{n} ranks x {nw} worker{'' if nw == 1 else 's'} = {n * nw} worker processes{on}"
    if nw == 0:
        workers = f"{n} ranks, each loading in its own process{on}"
    return f"; num_workers={nw} a rank: {workers}; samples/s are the host's, every rank's loader at once"


def _keep_or_use(user: LoaderRow | None, rec: LoaderRow) -> str:
    """The pick's head, in the same words as the job's verdict and the pipeline's: a pick that is your
    setting is "keep yours"; one that keeps your workers and sets a flag the windows do not judge (the
    epoch stall's ``persistent_workers``, the device copy's ``pin_memory``) keeps yours and names the flag,
    so that "use" never heads a verdict whose workers are yours."""
    if user is None or user.knobs.label(flags=False) != rec.knobs.label(flags=False):
        return f"use {_knob_text(rec)}"
    if user.knobs == rec.knobs:
        return f"keep yours ({_knob_text(rec)})"
    flags = [
        f"{k}={getattr(rec.knobs, k)}"
        for k in ("persistent_workers", "pin_memory")
        if getattr(rec.knobs, k) != getattr(user.knobs, k)
    ]
    return f"keep yours ({user.knobs.label(as_call=True)}) and set {' and '.join(flags)}"


def _pick_verdict(c: _Picks, rec: LoaderRow, target: LoaderTarget | None) -> str:
    """The loader alone's pick: use it (or keep yours), its throughput and interval, and what it rests on."""
    lo, hi = rec.samples_per_s_low, rec.samples_per_s_high
    ci = f" [{lo:,.1f}, {hi:,.1f}]" if math.isfinite(lo) and math.isfinite(hi) else ""
    verdict = f"{_keep_or_use(c.user, rec)}: {rec.samples_per_s:,.1f} samples/s{ci}"
    if target is not None:
        verdict += " by the loader alone"
    best = c.best
    if best is not None and best.knobs.label(flags=False) != rec.knobs.label(flags=False):
        verdict += f" (best {best.samples_per_s:,.1f} at num_workers={best.num_workers})"
    decision = rec.decision
    if decision is not None and target is None:
        # what the pick rests on: the ratio in turns, or that the runs could not tell
        verdict += f"; {_decision_words(decision, {}, c.within, c.turn_seconds)}"
    return verdict


def _search_summary(m: RunMeta, pts: list[LoaderRow]) -> dict[str, Any]:
    """How the search went: its strategy, points and seconds, against an estimate for the full grid."""
    search = m.search
    elapsed = [p.elapsed_s for p in pts if math.isfinite(p.elapsed_s)]
    seconds = float(sum(elapsed) if search.seconds is None else search.seconds)
    grid_points = int(m.settings.full_grid_points or len(pts))
    mean_point = sum(elapsed) / len(elapsed) if elapsed else math.nan
    est = mean_point * grid_points if math.isfinite(mean_point) else math.nan
    return {
        "strategy": next((s for s in (search.strategy, m.settings.strategy) if s is not None), "adaptive"),
        "points_measured": len(pts),
        "seconds": seconds,
        "full_grid_points": grid_points,
        "estimated_full_grid_seconds": est,
        "time_saved_s": max(0.0, est - seconds) if math.isfinite(est) else math.nan,
        "stopped": list(search.stopped),
    }
