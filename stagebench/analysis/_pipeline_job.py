"""A pipeline's settings run with the user's training loop: the candidates, and the job's pick on the stages.

The diagnosis chooses the stages' settings for the pipeline alone, at the pace its bounds allow
(:mod:`stagebench.analysis._joint`). With the training step measured, the question is the job's:
the candidates (:func:`job_candidates`) are the user's own settings, the cheapest that feed the
step's demand with 10% to spare (the joint choice for that demand), one a step above it (for 1.5x
the demand: what the stages cost each other in the pipeline is only bounded), and the pipeline's
own pick at full pace. Each runs with the user's loop (:mod:`stagebench.core._jobrun`); the job
runs' pick (:mod:`stagebench.analysis._job`) then becomes every stage's recommendation
(:func:`apply_job_pick`), the isolated choice kept beside it, so the snippet, the findings and the
tables say one thing.

Cost of a setting: workers and threads over all stages, then how many of them are processes (each
holds a copy of the stage's state, and its inputs and outputs are pickled).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stagebench._numbers import finite
from stagebench.analysis._joint import recommend_jointly
from stagebench.analysis._ladder import Rung, build_ladder
from stagebench.core._jobrun import Ladder
from stagebench.model._job import JobVerdict
from stagebench.model._meta import RunMeta
from stagebench.model._rate import Rate
from stagebench.model._stage import StageEntry, StageSetting, changed, keyed, own_choice

__all__ = ["job_candidates", "apply_job_pick", "user_choice", "user_setting", "settings_label", "settings_cost"]

#: The "a step above" candidate feeds this multiple of the demand.
ABOVE = 1.5


def user_choice(stage: Mapping[str, Any]) -> tuple[str, int] | None:
    """A pipe stage's own (executor, concurrency) in ``run.json``'s stage record (:func:`own_choice`)."""
    return own_choice(stage.get("user_executor"), stage.get("user_concurrency"), stage.get("type"))


def user_setting(stage: StageEntry) -> str:
    """A stage's own setting (``user_choice``) as the report and the terminal write it, ``thread x 8``, or ""."""
    choice = stage.user_choice
    return f"{choice[0]} x {choice[1]}" if choice else ""


def settings_label(settings: Mapping[str, tuple[str, int]]) -> str:
    """``read thread x 8, decode process x 4``."""
    return ", ".join(f"{name} {ex} x {c}" for name, (ex, c) in settings.items())


def _choices(stages: list[StageEntry]) -> dict[str, tuple[str, int]]:
    out = {}
    for st in stages:
        rec = st.recommended or StageSetting()
        if (st.type or "pipe") == "pipe" and rec.executor and finite(rec.concurrency):
            out[st.name] = (str(rec.executor), int(rec.concurrency or 0))
    return out


def settings_cost(settings: Mapping[str, tuple[str, int]]) -> tuple[float, ...]:
    """What a pipeline's settings cost, compared in order: its worker processes over all stages, then its
    workers and threads in all.

    Processes first: each is an interpreter of its own, with its memory, its start-up and the items
    pickled to it, where a thread is a stack in the same process. Counted together, a process stage at
    8 beside 12 threads read as cheaper than 28 threads, and a gil_mix diagnosis advised 8 processes
    as "as fast within 5% with fewer workers"."""
    return (
        float(sum(c for ex, c in settings.values() if ex == "process")),
        float(sum(c for _, c in settings.values())),
    )


def job_candidates(
    stages: list[StageEntry],
    meta: RunMeta,
    *,
    demand: Rate | None,
    cores: float,
    free_threaded: bool,
    fixed: float,
    ranks: int = 1,
) -> Ladder:
    """The pipeline settings to run with the user's loop, most important first (module docstring), as
    :func:`stagebench.analysis._ladder.build_ladder` makes them one list.

    ``stages``: the run's stage entries before any joint choice (they are copied, not changed).
    """

    def joint(d: float | None) -> dict[str, tuple[str, int]]:
        """The joint choice for demand ``d``; {} where ``d`` is not below the pace (nothing to cut for it)."""
        trial = list(stages)
        out = recommend_jointly(trial, cores=cores, free_threaded=free_threaded, fixed=fixed, demand=d, ranks=ranks)
        if d is not None and (out is None or not out.for_demand):
            return {}
        return _choices(trial)

    at_pace = joint(None)
    if not at_pace:
        return Ladder(run=[])
    names = list(at_pace)
    yours = {str(s["name"]): c for s in meta.stages if (c := user_choice(s)) is not None}
    yours = {n: yours[n] for n in names if n in yours}

    def rung(settings: dict[str, tuple[str, int]], alone: Rate | None = None) -> Rung | None:
        if not settings:
            return None
        full = {n: settings.get(n) or at_pace[n] for n in names}
        return Rung(
            key=settings_label(full),
            label=settings_label(full),
            settings={n: [ex, c] for n, (ex, c) in full.items()},
            cost=settings_cost(full),
            alone=alone,
        )

    offers: list[tuple[Rung | None, str]] = []
    if len(yours) == len(names):
        offers.append((rung(yours, meta.yours.rate if meta.yours else None), "yours"))
    if demand is not None and demand.value > 0:
        offers.append((rung(joint(demand.value)), "feeds"))
        offers.append((rung(joint(demand.value * ABOVE)), "above"))
    offers.append((rung(at_pace, meta.validation.rate if meta.validation else None), "best"))
    # alone figures of a setting offered twice come from the offer that measured it
    merged: dict[str, Rung] = {}
    for r, _ in offers:
        if r is not None and (r.key not in merged or merged[r.key].alone is None):
            merged[r.key] = r
    return build_ladder([(merged[r.key] if r is not None else None, origin) for r, origin in offers], demand=demand)


def apply_job_pick(stages: list[StageEntry], job: JobVerdict) -> list[str]:
    """Make the job runs' pick every stage's recommendation; returns the names of the stages it changed.

    Each entry of ``stages`` it changes is replaced by its copy. The isolated choice moves to
    ``recommended_isolated``; the stage's measured point at the picked setting gives its figures where the
    sweep measured it (else they are None).
    """
    cand = job.picked
    if cand is None:
        return []
    names = []
    for i, e in enumerate(stages):
        setting = cand.settings.get(e.name) if "name" in e.keys else None
        rec = e.recommended
        if not setting or rec is None or not rec.executor:
            continue
        ex, c = str(setting[0]), int(setting[1])
        why = f"run with your training loop: {job.why or ''}"
        if (ex, c) == (rec.executor, int(rec.concurrency or 0)):
            stages[i] = changed(e, recommended=changed(rec, why=why))
            continue
        harness = rec.harness or e.harness
        point = next((p for p in e.curve(f"{harness}/{ex}") if int(p.concurrency or 0) == c), StageSetting())
        picked = keyed(
            StageSetting,
            executor=ex,
            concurrency=c,
            qps=point.qps,
            qps_low=point.qps_low,
            qps_high=point.qps_high,
            harness=harness,
            why=why,
        )
        stages[i] = changed(e, recommended_isolated=rec, recommended=picked)
        names.append(e.name)
    return names
