"""The loader's side of the job runs: the settings offered to run with the user's loop, and their pick.

The job runs (:mod:`stagebench.core._jobrun`) run the user's own loop on the real loader at each
candidate, in turns; what they decide is the recommendation, with its figures from the sweep where the
setting was measured alone.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from stagebench._settings import DEMAND_HEADROOM
from stagebench.analysis._ladder import Rung, build_ladder
from stagebench.analysis._loader_pick import _stall
from stagebench.analysis._loader_rows import (
    _cost,
    _knob_text,
    _memory_cap,
    _over_budget,
    _rows,
    near_fastest,
    normalize_row,
    user_point,
)
from stagebench.core._jobrun import Ladder
from stagebench.model._job import JobVerdict
from stagebench.model._knobs import KNOBS, LoaderKnobs
from stagebench.model._loader import LoaderRow, LoaderTarget
from stagebench.model._meta import RunMeta, UserKnobs
from stagebench.model._rate import Rate
from stagebench.runs._knobs import NOT_APPLICABLE, normalize_knobs

__all__ = ["job_candidates", "apply_job_pick"]


def job_candidates(rows: Any, meta: dict[str, Any], demand: Rate | None) -> Ladder:
    """The loader settings to run with the user's loop, from the sweep's ``rows``, ``run.json`` (``meta``)
    and the step's ``demand`` (its rate, None where not measured): a :class:`stagebench.core._jobrun.Ladder`
    (:mod:`stagebench.analysis._ladder` builds it from what this adapter offers).

    Offered: yours, exactly as the script sets it (a knob this host cannot take is named as changed);
    the cheapest setting whose throughput alone feeds the step's demand with 10% to spare
    (``num_workers=0`` included: the job run shows what loading between the steps costs); the next
    measured setting with more workers; the fastest alone; on a host with a CUDA device where you do
    not pin, the pick with ``pin_memory=True``. Knobs whose effect an isolated sweep cannot see keep
    the user's value in the settings offered besides yours: ``persistent_workers`` (it acts at epoch
    boundaries, which a job slice does not reach) and, on a host with a CUDA device, ``pin_memory``
    (its benefit shows only with the copy to the device, which the user's loop makes).
    """
    pts = [p for p in _rows(rows) if p.ok]
    if not pts:
        return Ladder(run=[])
    m = RunMeta.from_json(meta)
    backend = "torch" if m.loader.backend is None else m.loader.backend
    cuda = m.settings.cuda
    budget = m.settings.memory_budget_mb
    headroom = float(DEMAND_HEADROOM if m.settings.headroom is None else m.settings.headroom)
    mine = m.loader.user_knobs or UserKnobs()
    pool = [p for p in pts if not _over_budget(p, budget, _memory_cap(m))] or pts

    def knobs_of(p: LoaderRow, pin: bool | None = None) -> LoaderKnobs:
        # the rules of _kept_knobs, so that the job's pick is what the summary recommends
        persistent = bool(mine.persistent_workers) if mine.gave("persistent_workers") else p.persistent_workers is True
        stall = _stall(replace(p, persistent_workers=False), pts, m) if p.num_workers > 0 else None
        persistent = persistent or (stall is not None and stall.matters)
        if pin is None:
            pin = bool(mine.pin_memory) if cuda and mine.gave("pin_memory") else p.pin_memory is True
        req = LoaderKnobs(
            num_workers=p.num_workers,
            prefetch_factor=p.prefetch_factor if p.num_workers > 0 else None,
            persistent_workers=persistent and p.num_workers > 0,
            pin_memory=pin,
        )
        return normalize_knobs(req, backend, cuda=cuda)[0]

    def rung(p: LoaderRow | None, k: LoaderKnobs | None = None, notes: tuple[str, ...] = ()) -> Rung | None:
        if p is None:
            return None
        k = k or knobs_of(p)
        shown = replace(p, **{f: getattr(k, f) for f in KNOBS})
        label = _knob_text(shown)
        return Rung(
            key=k.label(),
            label=label + (f" (as run: {'; '.join(notes)})" if notes else ""),
            settings={f: getattr(k, f) for f in KNOBS},
            cost=_cost(shown),
            alone=p.rate if math.isfinite(p.samples_per_s) else None,
            alone_as=_knob_text(p) if _knob_text(p) != label else None,
            round_steps=max(1, k.num_workers),
            serial=k.num_workers == 0,
            memory_mb=p.mem_workers_mb if math.isfinite(p.mem_workers_mb) else None,
        )

    user = user_point(pts, m)
    yours: Rung | None = None
    if mine.given:
        # exactly the script's setting: its knobs as given, only what this host cannot take changed (and named)
        k, _, notes = normalize_knobs(LoaderKnobs(**mine.to_json()), backend, cuda=cuda)
        yours = rung(user or LoaderRow(**{f: getattr(k, f) for f in KNOBS}), k, tuple(notes))
    elif user is not None:
        yours = rung(user)
    need = None if demand is None else demand.value * (1 + headroom)
    feeding = sorted((p for p in pool if need is not None and p.samples_per_s >= need), key=_cost)
    best = max(pool, key=lambda p: p.samples_per_s)
    offers: list[tuple[Rung | None, str]] = [(yours, "yours")]
    feeds = feeding[0] if feeding else None
    if feeds is not None:
        offers.append((rung(feeds), "feeds"))
        above = [p for p in feeding if p.num_workers > feeds.num_workers]
        offers.append((rung(min(above, key=_cost)) if above else None, "above"))
    offers.append((rung(best), "best"))
    if feeds is None and m.ranks > 1:
        # a host's ranks, none feeding the step: the loaders alone ranked the settings without the ranks'
        # steps taking the same cores, and those near the fastest (near_fastest) are the job's to tell
        near = [p for p in pool if near_fastest(p, best) and p.num_workers != best.num_workers]
        for nw in sorted({p.num_workers for p in near}):
            offers.append((rung(min((p for p in near if p.num_workers == nw), key=_cost)), "near"))
    if cuda and not mine.pin_memory:
        first = feeds or best
        offers.append((rung(first, knobs_of(first, pin=True)), "pinned"))
    return build_ladder(offers, demand=demand, memory_budget_mb=budget)


def apply_job_pick(pts: list[LoaderRow], job: JobVerdict) -> LoaderRow:
    """The job runs' decided pick (``job``, ``summary.json["job"]``) as the recommended point among ``pts``:
    its isolated figures where measured, its knobs, the job's why; returns that point."""
    cand = next(c for c in job.candidates if c.key == job.pick)
    k = cand.settings
    same = [
        p
        for p in pts
        if p.ok
        and p.num_workers == k["num_workers"]
        and (k["num_workers"] == 0 or p.prefetch_factor == k["prefetch_factor"])
    ]
    exact = [
        p
        for p in same
        if (p.persistent_workers is True) == bool(k["persistent_workers"])
        and (p.pin_memory is True) == bool(k["pin_memory"])
    ]
    if exact or same:
        rec = (exact or same)[0]
    else:  # not a measured point (cannot happen for candidates built from points; kept total)
        rec = normalize_row({**k, "samples_per_s": cand.alone.value if cand.alone is not None else None})
    # a knob that does not apply to the point stays so
    return replace(
        rec,
        persistent_workers=rec.persistent_workers
        if rec.persistent_workers == NOT_APPLICABLE
        else bool(k["persistent_workers"]),
        pin_memory=rec.pin_memory if rec.pin_memory == NOT_APPLICABLE else bool(k["pin_memory"]),
        prefetch_factor=k["prefetch_factor"] if k["num_workers"] > 0 else None,
        why=f"run with your training loop: {job.why}",
    )


def _zero_workers_note(v: JobVerdict) -> str | None:
    """Why num_workers=0 was or was not chosen, from the job runs (None: it was not a candidate).

    Loading without workers adds to every step (the DataLoader guide's T4), so against a setting of yours
    with workers it is advised only where the job runs, in turns, show it faster by more than 5%
    (:attr:`stagebench.model._evidence.Option.in_step`); as fast within 5%, or a reading that could not
    tell, is not that.
    """
    zero = next((c for c in v.candidates if c.settings.get("num_workers") == 0), None)
    if zero is None:
        return None
    f = zero.job
    if f is None:
        return "num_workers=0 was a candidate but did not run with your loop, so it is not advised"
    if zero.key == v.yours:  # nothing to hold it to: it is what the others were held to
        head = f"num_workers=0 is your setting and ran your job at {f.samples_per_s:,.0f} samples/s"
        if zero.key == v.pick:
            return f"{head}; it is kept: no setting with workers was shown to do better in turns"
        return f"{head}, loading each batch between your steps; the pick, with workers, was shown to do better in turns"
    x = zero.versus_yours
    vs = x.text("yours") if x is not None else "not run in turns with yours"
    if zero.key == v.pick:
        if x is not None and x.above(1.0):
            # faster beyond noise: the workers cost more than the loading between the steps (cores the
            # ranks' or the step's own work needs, batches shipped), however long the loop waits for data
            return (
                f"num_workers=0 ran your job at {f.samples_per_s:,.0f} samples/s, {vs}: shown faster than yours, "
                "so here workers cost your job more than loading between the steps does"
            )
        return (
            f"num_workers=0 ran your job at {f.samples_per_s:,.0f} samples/s, {vs}: shown within 5% of yours, "
            "so loading between the steps costs your step little here"
        )
    if x is not None and x.below(1.0):
        return (
            f"num_workers=0 ran your job at {f.samples_per_s:,.0f} samples/s, {vs}: without workers the main "
            "process loads each batch between your steps, so loading adds to every step"
        )
    return (
        f"num_workers=0 ran your job at {f.samples_per_s:,.0f} samples/s, {vs}: not shown more than 5% faster "
        "than yours, which it must be to be advised (without workers, loading adds to every step)"
    )


def _job_not_run(job: JobVerdict | None, target: LoaderTarget) -> str:
    """What the verdict says of the job where no setting ran with the user's loop."""
    if job is not None:
        return str(job.text)
    if target.source == "stated":
        return (
            "inconclusive: your step's rate was stated, not measured, so no setting was run with your loop "
            "(STAGEBENCH_TRAINER=measure runs it)"
        )
    return "inconclusive: no setting was run with your loop"
