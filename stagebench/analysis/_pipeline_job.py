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

import copy
from collections.abc import Mapping
from typing import Any

from stagebench._numbers import finite

__all__ = ["job_candidates", "apply_job_pick", "user_choice", "user_setting", "settings_label"]

#: The "a step above" candidate feeds this multiple of the demand.
ABOVE = 1.5


def user_choice(stage: Mapping[str, Any]) -> tuple[str, int] | None:
    """A pipe stage's own (executor, concurrency) in the user's config, or None (not a pipe, not known).

    SPDL's shared thread pool (``default``) counts as threads: at equal concurrency the
    recommendation and the user's setting run the stage on the same number of threads.
    """
    ex, c = stage.get("user_executor"), stage.get("user_concurrency")
    if not ex or c is None or (stage.get("type") or "pipe") != "pipe":
        return None
    return ("thread" if ex == "default" else str(ex), int(c))


def user_setting(stage: Mapping[str, Any]) -> str:
    """:func:`user_choice` as the report and the terminal write it, ``thread x 8``, or ""."""
    choice = user_choice(stage)
    return f"{choice[0]} x {choice[1]}" if choice else ""


def settings_label(settings: Mapping[str, Any]) -> str:
    """``read thread x 8, decode process x 4``."""
    return ", ".join(f"{name} {ex} x {c}" for name, (ex, c) in settings.items())


def _choices(stages: list[dict]) -> dict[str, tuple[str, int]]:
    out = {}
    for st in stages:
        rec = st.get("recommended") or {}
        if (st.get("type") or "pipe") == "pipe" and rec.get("executor") and finite(rec.get("concurrency")):
            out[str(st["name"])] = (str(rec["executor"]), int(rec["concurrency"]))
    return out


def _cost(settings: Mapping[str, tuple[str, int]]) -> tuple[float, ...]:
    return (
        float(sum(c for _, c in settings.values())),
        float(sum(c for ex, c in settings.values() if ex == "process")),
    )


def job_candidates(
    stages: list[dict],
    meta: Mapping[str, Any],
    *,
    demand: float | None,
    cores: int,
    free_threaded: bool,
    fixed: float,
) -> list[Any]:
    """The pipeline settings to run with the user's loop, most important first (module docstring).

    ``stages``: the run's stage entries before any joint choice (they are copied, not changed).
    """
    from stagebench.analysis._joint import recommend_jointly
    from stagebench.core._jobrun import Candidate

    def joint(d: float | None) -> dict[str, tuple[str, int]]:
        """The joint choice for demand ``d``; {} where ``d`` is not below the pace (nothing to cut for it)."""
        trial = copy.deepcopy(stages)
        out = recommend_jointly(trial, cores=cores, free_threaded=free_threaded, fixed=fixed, demand=d)
        if d is not None and not (out or {}).get("for_demand"):
            return {}
        return _choices(trial)

    at_pace = joint(None)
    if not at_pace:
        return []
    names = list(at_pace)
    yours = {str(s["name"]): c for s in meta.get("stages") or [] if (c := user_choice(s)) is not None}
    yours = {n: yours[n] for n in names if n in yours}
    found: list[tuple[dict[str, tuple[str, int]], list[str], dict | None]] = []

    def add(settings: dict[str, tuple[str, int]], origin: str, alone: dict | None = None) -> None:
        if not settings:
            return
        full = {n: settings.get(n) or at_pace[n] for n in names}
        for i, (s, origins, known) in enumerate(found):
            if s == full:
                origins.append(origin)
                if known is None:
                    found[i] = (s, origins, alone)
                return
        found.append((full, [origin], alone))

    measured_yours = meta.get("yours") or {}
    if len(yours) == len(names):
        add(yours, "yours", _alone(measured_yours))
    if demand is not None and demand > 0:
        add(joint(demand), "feeds")
        add(joint(demand * ABOVE), "above")
    add(at_pace, "best", _alone(meta.get("validation") or {}))
    return [
        Candidate(
            key=settings_label(s),
            label=settings_label(s),
            settings={n: [ex, c] for n, (ex, c) in s.items()},
            origin=tuple(origins),
            cost=_cost(s),
            round_steps=1,
            alone=alone,
        )
        for s, origins, alone in found
    ]


def _alone(run: Mapping[str, Any]) -> dict | None:
    """The whole pipeline alone at a setting, as a whole-pipeline run measured it."""
    if not finite(run.get("qps")):
        return None
    return {
        "samples_per_s": float(run["qps"]),
        "samples_per_s_low": run.get("qps_low"),
        "samples_per_s_high": run.get("qps_high"),
    }


def apply_job_pick(stages: list[dict], job: Mapping[str, Any]) -> list[str]:
    """Make the job runs' pick every stage's recommendation; returns the names of the stages it changed.

    The isolated choice moves to ``recommended_isolated``; the stage's measured point at the
    picked setting gives its figures where the sweep measured it (else they are None).
    """
    cand = next((c for c in job.get("candidates") or [] if c["key"] == job.get("pick")), None)
    if cand is None:
        return []
    changed = []
    for st in stages:
        setting = (cand.get("settings") or {}).get(st.get("name"))
        rec = st.get("recommended") or {}
        if not setting or not rec.get("executor"):
            continue
        ex, c = str(setting[0]), int(setting[1])
        why = f"run with your training loop: {job.get('why') or ''}"
        if (ex, c) == (rec.get("executor"), int(rec.get("concurrency") or 0)):
            st["recommended"] = {**rec, "why": why}
            continue
        point: Mapping[str, Any] = next(
            (
                p
                for p in (st.get("curves") or {}).get(f"{rec.get('harness') or st.get('harness')}/{ex}") or []
                if int(p.get("concurrency") or 0) == c
            ),
            {},
        )
        st["recommended_isolated"] = rec
        st["recommended"] = {
            "executor": ex,
            "concurrency": c,
            "qps": point.get("qps"),
            "qps_low": point.get("qps_low"),
            "qps_high": point.get("qps_high"),
            "harness": rec.get("harness") or st.get("harness"),
            "why": why,
        }
        changed.append(str(st["name"]))
    return changed
