"""The settings a job run tries, for both kinds: one ladder, fed by a small adapter per kind.

Each kind offers settings with why they are offered (:data:`stagebench.analysis._job.ORIGIN_WORDS`):
the user's own (the reference every change is held to), the cheapest that feeds the step's demand with
10% to spare by the isolated sweep, a step above it, the fastest alone, and on a GPU host the pick with
pinned memory. The DataLoader's adapter is :func:`stagebench.analysis._loader_job.job_candidates`, the
pipeline's :func:`stagebench.analysis._pipeline_job.job_candidates`. Here they become one list:

* one candidate per setting, its reasons merged, most important first, at most :data:`MAX_CANDIDATES`;
* **ruled out by the isolated sweep, not run**: a setting offered only as "a step above" or "the fastest
  alone" where a cheaper setting, not serial, already delivers :data:`ROOM` times the step's demand
  alone (its interval's low end over the demand's high end). The job runs at most at the step's own
  rate, so more capacity cannot raise it; it only takes cores from the step. Each round of the job runs
  costs a slice per candidate, so a slow step (a second, as real models take) would otherwise spend
  most of its budget on a setting that cannot win. The verdict names what was left out and why.
  ``num_workers=0`` (serial: the main process loads between the steps) is never ruled out this way: its
  cost to the job is what the job runs measure, and it is advised only where they show it equivalent;
* **kept open between turns** where the candidates' workers fit the memory budget together.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from stagebench.core._jobrun import Candidate, JobSetting, Ladder
from stagebench.model._job import JobSkipped
from stagebench.model._rate import Rate

__all__ = ["Rung", "build_ladder", "MAX_CANDIDATES", "ROOM"]

#: Most candidates run with the user's loop (each costs a slice per round, and loops stop early).
MAX_CANDIDATES = 4
#: A setting delivering this multiple of the step's demand alone feeds it with room: more cannot help.
ROOM = 1.5


@dataclass(frozen=True, slots=True, kw_only=True)
class Rung(JobSetting):
    """A setting a kind offers the job runs, with what the isolated sweep read of it."""

    alone: Rate | None = None
    """The loader or pipeline alone at this setting, where measured."""
    alone_as: str | None = None
    """The setting the alone figure was measured at, where it differs in words (knobs the windows ignore)."""
    serial: bool = False
    """It loads between the steps (a DataLoader without workers): its alone rate does not feed them."""
    memory_mb: float | None = None
    """What it holds while open (its workers), where measured."""


def build_ladder(
    offers: Sequence[tuple[Rung | None, str]],
    *,
    demand: Rate | None,
    memory_budget_mb: float | None = None,
) -> Ladder:
    """The candidates from ``offers`` ((setting, why offered), most important first; None: nothing to
    offer for that reason), less those the isolated sweep rules out (module docstring)."""
    # one per setting, its reasons merged, in the order first offered
    merged: dict[str, tuple[Rung, list[str]]] = {}
    for rung, origin in offers:
        if rung is not None:
            origins = merged.setdefault(rung.key, (rung, []))[1]
            if origin not in origins:
                origins.append(origin)
    need = None if demand is None else ROOM * (demand.high if demand.high is not None else demand.value)
    run: list[tuple[Rung, list[str]]] = []
    skipped: list[JobSkipped] = []
    for rung, origins in merged.values():
        roomy = [
            r
            for r, _ in merged.values()
            if r.key != rung.key and not r.serial and r.cost < rung.cost and r.alone is not None and need is not None
            if (r.alone.low if r.alone.low is not None else r.alone.value) >= need
        ]
        if set(origins) <= {"above", "best"} and roomy:
            r = min(roomy, key=lambda x: x.cost)
            skipped.append(
                JobSkipped(
                    rung.label,
                    f"the isolated sweep rules it out: {r.label} alone already delivers "
                    f"{r.alone.text() if r.alone else '?'}, over {ROOM:g}x your step's demand, with fewer "
                    "resources; more capacity cannot make your job faster than your step, only take its cores",
                )
            )
            continue
        run.append((rung, origins))
    for rung, _ in run[MAX_CANDIDATES:]:
        skipped.append(JobSkipped(rung.label, f"at most {MAX_CANDIDATES} settings run with your loop"))
    run = run[:MAX_CANDIDATES]
    held = sum(r.memory_mb or 0.0 for r, _ in run)
    keep_open = memory_budget_mb is None or held <= memory_budget_mb
    return Ladder(
        run=[
            Candidate(
                **{**r.setting(), "settings": dict(r.settings)},
                origin=tuple(origins),
                alone=r.alone,
                alone_as=r.alone_as,
            )
            for r, origins in run
        ],
        skipped=skipped,
        keep_open=keep_open,
    )
