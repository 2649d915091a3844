"""From loader rows to a recommendation, diagnoses and a terminal table.

Everything here is a pure function of ``results.csv`` rows and ``run.json``, so
``stagebench report RUN_DIR`` rebuilds the same summary from saved rows. Rows
arrive either as the dicts the sweep just measured or as a DataFrame read back
from CSV (where ``True`` became a string and an empty prefetch_factor became
NaN); :func:`normalize_row` makes both look the same.

The recommendation is the cheapest setting (fewest workers, then the smallest
prefetch) within a few percent of the best throughput and inside the memory
budget, because every worker costs memory and cores that the trainer could
use, and a difference within the measurement's noise buys nothing. The
diagnoses read the shape of the curve (throughput against workers) together
with the cores the loader used, which is what separates "the work is CPU" from
"the workers wait" from "the batches cost more to ship than to make".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from stagebench._numbers import finite, num
from stagebench._settings import DEMAND_HEADROOM
from stagebench.analysis._job import job_findings
from stagebench.analysis._loader_evidence import is_ok, paired_ratio, paired_rounds, pool_points
from stagebench.analysis._worker_costs import (
    beside_the_pick,
    worker_cost_findings,
    worker_costs_summary,
    workers_that_fit,
)
from stagebench.core._config import CANNOT_MATTER
from stagebench.model._evidence import EQUIVALENT, Decision, more_rounds_text
from stagebench.model._finding import Finding, by_severity
from stagebench.model._job import JobVerdict, StepAlone
from stagebench.model._knobs import LoaderKnobs
from stagebench.model._loader import LoaderPoint, WorkerCosts
from stagebench.model._meta import Provenance, RunMeta, UserKnobs
from stagebench.runs._knobs import KNOB_KEYS, NOT_APPLICABLE, normalize_knobs

__all__ = [
    "normalize_row",
    "user_point",
    "recommend",
    "loader_pick",
    "summarize_loader",
    "loader_findings",
    "job_candidates",
    "loader_decision",
    "turns_to_run",
    "near_fastest",
    "pooled_frame",
]


# The numbers behind the findings' words (docs/loaders.md has them as a table; a test per finding).
#: "Workers make this loader slower": the best with workers this share (or its interval) under none.
WORKERS_SLOWER = 0.05
#: "Too many workers": the worst above the peak this share (or its interval) under the peak.
TOO_MANY = 0.10
#: "CPU-bound": the best setting with workers keeps this share of the usable cores busy.
CPU_BOUND = 0.75
#: "I/O- or wait-bound": it keeps fewer cores busy than this share of its workers (up to the cores).
WAITING = 0.5
#: "Workers restart at every epoch": the stall is over this share of an epoch (or, with the epoch's length
#: unknown, persistent workers were measured to save more than half of it and over 0.1 s); high over STALL_HIGH.
STALL_SHARE = 0.05
STALL_HIGH = 0.20
#: Why num_workers=0 is not advised for a training job without a job run that says so (T4 of the
#: DataLoader-knob guide: the main process then loads serially, between the steps).
SERIAL_WORDS = (
    "without workers the main process loads each batch between your training steps, so loading adds to "
    "every step; only a run with your loop can show what that costs (STAGEBENCH_TRAINER=measure)"
)
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
    from stagebench.runs._schema import LOADER_COLUMNS, RANK_COLUMNS

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


def pooled_frame(rows: Any) -> Any:
    """The rows as one pooled point per setting, as a DataFrame (what the report's table and figures show)."""
    import pandas as pd

    return pd.DataFrame(_rows(rows))


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


def recommend(
    rows: Any,
    *,
    budget_mb: float | None,
    within_best: float = 0.05,
    target_rate: float | None = None,
    headroom: float = DEMAND_HEADROOM,
    user: dict[str, Any] | None = None,
    serial_ok: bool = True,
    max_workers: int | None = None,
) -> dict[str, Any] | None:
    """The recommended row (with a ``why`` and the rule's ``decision``), or None when nothing was measured ok.

    Without a target: the rule of :mod:`stagebench.model._evidence` over the settings the pick hinges
    on (yours, the fastest, the settings whose readings come near it (:func:`_near`), and any measured
    in turns): a setting other than yours only where the windows in turns show it faster beyond noise,
    or cheaper and within ``within_best``; without a setting of yours, the cheapest shown within
    ``within_best`` of the fastest, else the fastest. Readings measured apart, even within 5% or inside
    each other's intervals, decide nothing. Inside the memory budget where any setting fits. With a
    target: the cheapest that delivers target x (1 + headroom); when none does, the same as without.
    ``serial_ok=False`` (a trainer is waiting on this loader, and no job run has said otherwise): a
    setting with workers is preferred over ``num_workers=0``, whose loading adds to every training step
    (a loader alone cannot show that). ``max_workers``: the most workers a cgroup's memory limit holds over
    an epoch (:func:`_memory_cap`): a setting with more is never advised where one with fewer was measured.
    """
    pts = _rows(rows)
    ok = [p for p in pts if is_ok(p)]
    if not ok:
        return None
    fits = [p for p in ok if not _over_budget(p, budget_mb, max_workers)]
    pool = fits or ok
    budget_note = "" if fits else "; no setting fits the memory budget: the least memory-hungry near the best"
    if target_rate is not None:
        need = target_rate * (1 + headroom)
        meeting = [p for p in pool if p["samples_per_s"] >= need]
        serial_note = ""
        if not serial_ok and any(p["num_workers"] > 0 for p in meeting) and any(p["num_workers"] == 0 for p in meeting):
            meeting = [p for p in meeting if p["num_workers"] > 0]
            serial_note = f"; num_workers=0 left out: {SERIAL_WORDS}"
        if meeting:
            # the cheapest; persistent_workers and pin_memory are set afterwards, one rule each (_kept_knobs)
            rec = min(meeting, key=_cheapest_first).copy()
            rec["why"] = (
                f"cheapest setting that delivers the target {target_rate:,.1f} samples/s with "
                f"{headroom:.0%} headroom ({need:,.1f}){serial_note}"
            )
            return rec
    d, by_key = loader_decision(rows, pool, within_best=within_best, user=user)
    assert d.pick is not None  # pool holds measured points
    rec = dict(by_key[d.pick])
    rec["why"] = _decision_words(d, by_key, within_best, _turn_seconds(_raw(rows))) + budget_note
    if budget_mb is not None and fits:
        rec["why"] += f"; inside the memory budget ({budget_mb:,.0f} MB)"
    if max_workers is not None and fits and any(p["num_workers"] > max_workers for p in ok):
        rec["why"] += f"; at most {max_workers} workers fit the container's memory limit over an epoch"
    rec["decision"] = d.to_json()
    return rec


def _near(pool: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Settings whose readings come within :data:`CANNOT_MATTER` of the fastest, or overlap it, cheapest
    first: those a comparison in turns could show as good, or as the fastest. Readings seconds apart
    show nothing closer: the host's phases move two windows of one setting by up to 18% (the JPEG
    loader's 2 workers read 439 against 4 workers' 387; in turns 4 ran 5-10% ahead in each round)."""
    top = max(pool, key=lambda p: p["samples_per_s"])
    return sorted((p for p in pool if near_fastest(p, top)), key=_cheapest_first)


def loader_decision(
    rows: Any, pool: list[dict[str, Any]], *, within_best: float, user: dict[str, Any] | None
) -> tuple[Any, dict[str, dict[str, Any]]]:
    """The rule over the loader settings the pick hinges on: (:class:`~stagebench.model._evidence.Decision`,
    the points by the decision's keys).

    Considered: yours (where measured), the fastest, every setting measured in turns, and the
    cheapest setting near the fastest (:func:`_near`) that the turns have not ruled out; once none
    cheaper than the pick is left, the cheapest costlier near setting the pick has not been compared
    with (the rule keeps it open until the rounds give their ratio an interval).
    """
    from stagebench.model._evidence import Option, decide
    from stagebench.model._rate import Rate

    raw = _raw(rows)
    rounds = paired_rounds(raw)
    in_turns = {k for r in rounds for k in r}
    top = max(pool, key=lambda p: p["samples_per_s"])
    mine = _mine(pool, user)

    def key(p: dict[str, Any]) -> str:
        return _knob_text(p)

    considered: dict[str, dict[str, Any]] = {}
    for p in [mine, top] + [q for q in pool if LoaderKnobs.from_row(q) in in_turns]:
        if p is not None:
            considered.setdefault(key(p), p)
    near = _near(pool)

    def ratio(a: str, b: str) -> Any:
        return paired_ratio(rounds, LoaderKnobs.from_row(by_key[a]), LoaderKnobs.from_row(by_key[b]))

    while True:
        by_key = dict(considered)
        options = [Option(k, _cheapest_first(p), Rate.from_json(p)) for k, p in by_key.items()]
        options.sort(key=lambda o: o.cost)
        d = decide(options, yours=key(mine) if mine else None, ratio=ratio, margin=1 - within_best)
        # the cheapest near setting the turns have not ruled out joins: what the next turns would measure
        for p in near:
            k = key(p)
            if k in d.open:
                return d, by_key
            if k not in by_key:
                considered[k] = p
                break
        else:
            return d, by_key


def _turn_seconds(pts: list[dict[str, Any]]) -> tuple[float, float] | None:
    """(seconds the windows in turns took, seconds a round took on average), from the ``paired`` rows; None
    without any."""
    by_turn: dict[Any, float] = {}
    for p in pts:
        if p.get("search_phase") == "paired" and finite(p.get("elapsed_s")):
            by_turn[p.get("turn")] = by_turn.get(p.get("turn"), 0.0) + float(p["elapsed_s"])
    if not by_turn:
        return None
    spent = sum(by_turn.values())
    return spent, spent / len(by_turn)


def _decision_words(
    d: Any, by_key: dict[str, dict[str, Any]], within_best: float, seconds: tuple[float, float] | None = None
) -> str:
    """The rule's decision, in the words of ``why``. ``seconds``: what the rounds in turns took, in all and
    a round (:func:`_turn_seconds`): a comparison the rounds could not settle says how long they ran and
    what more would cost."""
    best = by_key.get(d.best) or {}
    x = d.versus_yours
    if d.advice == "cheaper":
        return f"{x.text('yours')}: within {within_best:.0%} of yours, with fewer resources"
    if d.advice == "change":
        return f"{x.text('yours')}: faster beyond noise"
    if d.rival is not None:
        # the rival is cheaper than the fastest, or costlier than a pick that is the fastest by its readings
        whose = "yours" if d.advice == "keep yours" else "it" if d.pick == d.best else "the fastest"
        within = f" within {seconds[0]:.0f} s" if seconds is not None and x is not None else ""
        tell = f"the runs could not tell {d.rival} from {whose}{within}" + (
            f": {x.text(whose if whose == 'yours' else 'it')}"
            if x is not None
            else " (they were not measured in turns)"
        )
        more = ""
        if x is not None:
            n_more = d.rounds_more(x.rounds)
            more = f"; {more_rounds_text(n_more)}"
            if n_more is not None and seconds is not None:
                more = (
                    f"; about {n_more} more round{'' if n_more == 1 else 's'} in turns (~{n_more * seconds[1]:.0f} s) "
                    "would settle it at the spread seen"
                )
        # the other settings still open, each with its ratio: a faster reading left open is said, not dropped
        nor = "".join(
            f"; nor {k} from {whose}"
            + (f": {r.text(whose if whose == 'yours' else 'it')}" if r is not None else " (not measured in turns)")
            for k, r in d.others.items()
        )
        head = "your setting, kept" if d.advice == "keep yours" else "the fastest measured"
        return f"{head}: {tell}{more}{nor}"
    if d.advice == "keep yours":
        if d.pick == d.best:
            return "your setting, the fastest measured, and no cheaper setting was shown within " + f"{within_best:.0%}"
        return (
            f"your setting, kept: no setting was shown faster beyond noise in turns (the fastest read {d.best}), "
            f"nor cheaper and within {within_best:.0%}"
        )
    if d.pick == d.best:
        return f"the best throughput measured, and no cheaper setting was shown within {within_best:.0%} of it"
    said = f", {best['samples_per_s']:,.1f} samples/s" if best else ""
    return f"cheapest setting shown within {within_best:.0%} of the best ({d.best}{said}) in turns"


def _mine(points: list[dict], user: dict | None) -> dict | None:
    """The user's measured setting among ``points``, if there."""
    if user is None or not is_ok(user):
        return None
    return next((p for p in points if LoaderKnobs.from_row(p) == LoaderKnobs.from_row(user)), None)


def turns_to_run(
    rows: Any,
    *,
    budget_mb: float | None,
    within_best: float,
    user: dict[str, Any] | None,
    max_rounds: int | None = None,
) -> list[dict[str, Any]]:
    """The settings to measure (again) in turns: yours, the fastest and those still open; [] once the
    rule is settled (the sweep's last step, :mod:`stagebench.loader._turns`), or once the spread seen
    says it would take more than ``max_rounds`` rounds in all to settle. Rounds that cannot settle it
    within the cap only cost time (a slow-starting loader's two settings near a tie ran all 8 rounds,
    40 s); stopping them makes no claim, so the rule's error rate is unchanged, and the verdict says
    the runs could not tell and how many rounds would."""
    pts = _rows(rows)
    ok = [p for p in pts if is_ok(p)]
    if not ok:
        return []
    pool = [p for p in ok if not _over_budget(p, budget_mb)] or ok
    d, by_key = loader_decision(rows, pool, within_best=within_best, user=user)
    if d.settled or (max_rounds is not None and (d.rounds_to_settle or 0) > max_rounds):
        return []
    keys = [k for k in (d.yours, d.best) if k is not None and k in by_key] + list(d.open)
    return [by_key[k] for k in dict.fromkeys(keys)][:3]


def _knob_text(p: dict[str, Any]) -> str:
    parts = [f"num_workers={p['num_workers']}"]
    if p["prefetch_factor"] is not None:
        parts.append(f"prefetch_factor={p['prefetch_factor']}")
    if p["persistent_workers"] is True:
        parts.append("persistent_workers=True")
    if p["pin_memory"] is True:
        parts.append("pin_memory=True")
    return ", ".join(parts)


def _public(p: dict[str, Any], why: str | None = None) -> dict[str, Any]:
    out = {
        "num_workers": p["num_workers"],
        "prefetch_factor": p["prefetch_factor"],
        "persistent_workers": p["persistent_workers"],
        "pin_memory": p["pin_memory"],
        "samples_per_s": p["samples_per_s"],
        "samples_per_s_low": p["samples_per_s_low"],
        "samples_per_s_high": p["samples_per_s_high"],
        "batches_per_s": p["batches_per_s"],
        "mem_pss_mb": p["mem_pss_mb"],
        "cores_used": p["cores_used"],
        "time_to_first_batch_s": p["time_to_first_batch_s"],
        "epoch_stall_s": p["epoch_stall_s"],
    }
    if why is not None:
        out["why"] = why
    decision = LoaderPoint.from_json(p).decision
    if decision is not None:  # the rule's record: what the pick rests on (model/_evidence)
        out["decision"] = decision
    return out


def _rel_half(p: dict[str, Any]) -> float:
    lo, hi, s = p["samples_per_s_low"], p["samples_per_s_high"], p["samples_per_s"]
    if math.isfinite(lo) and math.isfinite(hi) and s > 0:
        return (hi - lo) / 2 / s
    return 0.0


def _finding(severity: str, title: str, detail: str, evidence: dict[str, Any]) -> dict[str, Any]:
    return Finding(severity, title, detail, None, evidence).to_json()


@dataclass(frozen=True)
class _SweepRead:
    """What the loader's findings read: the measured points, the run's settings and what was recommended."""

    pts: list[dict[str, Any]]
    ok: list[dict[str, Any]]
    #: the points measured ok with workers
    multi: list[dict[str, Any]]
    meta: RunMeta
    rec: dict | None
    target: dict | None
    job: dict | None
    #: the same, read (None without a job)
    jv: JobVerdict | None
    #: the job runs decided the pick: the comparisons with the user's setting are the job's
    decided: bool
    cores: float
    budget: float | None
    backend: str
    #: where a quota or an allocation sets ``cores``, in words (empty: the affinity mask does)
    cores_bound: str = ""


def loader_findings(
    pts: list[dict[str, Any]],
    meta: Mapping[str, Any] | RunMeta,
    rec: dict | None,
    target: dict | None,
    job: dict | None = None,
) -> list[dict[str, Any]]:
    """Diagnoses, most important first (same shape as the pipeline findings).

    None advises a setting the recommendation does not have: where the job ran (``job``), the
    comparisons with the user's setting are the job's, not the loader alone's.
    """
    m = meta if isinstance(meta, RunMeta) else RunMeta.from_json(meta)
    prov = m.provenance or Provenance()
    ok = [p for p in pts if is_ok(p)]
    c = _SweepRead(
        pts=pts,
        ok=ok,
        multi=[p for p in ok if p["num_workers"] > 0],
        meta=m,
        rec=rec,
        target=target,
        job=job,
        jv=(jv := JobVerdict.from_json(job)),
        decided=jv is not None and jv.decided,
        cores=m.settings.usable_cores or prov.usable_cores or 1,
        budget=m.settings.memory_budget_mb,
        backend="" if m.loader.backend is None else m.loader.backend,
        cores_bound="" if prov.limits is None else prov.limits.cores_bound(),
    )
    return by_severity(
        [
            *_failed_points(c),
            *_data_bound(c),
            *_zero_workers_starve(c),
            *_workers_slower(c),
            *_too_many_workers(c),
            *_memory_budget(c),
            *_cpu_or_wait_bound(c),
            *_oversubscribed(c),
            *_workers_restart(c),
            *_your_setting(c),
        ]
    )


def _failed_points(c: _SweepRead) -> list[dict[str, Any]]:
    """A setting whose worker died, hung or raised: the search could not measure it."""
    out = []
    for p in c.pts:
        if p["status"] in ("crashed", "timeout", "failed"):
            title = {
                "crashed": f"A worker died at {_knob_text(p)}",
                "timeout": f"The loader hung at {_knob_text(p)}",
                "failed": f"The loader raised at {_knob_text(p)}",
            }[p["status"]]
            detail = p["reason"]
            if p["status"] == "crashed":
                detail += ". The search kept the settings with fewer workers."
            out.append(_finding("high", title, detail, {"num_workers": p["num_workers"], "status": p["status"]}))
    return out


def _data_bound(c: _SweepRead) -> list[dict[str, Any]]:
    """The training job waits for data (by the job runs), or the loader alone cannot feed the trainer."""
    job, target = c.jv, c.target
    if c.decided and job is not None and job.bound == "data-bound":
        return [
            _finding(
                "high",
                "Data-bound: your training job waits for data",
                f"{job.text}. The loader alone at its best gives {max(p['samples_per_s'] for p in c.ok):,.0f} "
                "samples/s; the findings below say what limits it.",
                {"job_samples_per_s": job.samples_per_s, "data_wait_share": job.data_wait_share},
            )
        ]
    if not c.decided and target is not None and not target.get("met"):
        return [
            _finding(
                "high",
                "Data-bound: the loader cannot feed the trainer",
                target["verdict"],
                {"target_rate": target["rate"]},
            )
        ]
    return []


def _zero_workers_starve(c: _SweepRead) -> list[dict[str, Any]]:
    """The job runs showed num_workers=0 slower, and the recommendation keeps workers: why."""
    zero_note = c.jv.zero_workers if c.decided and c.jv is not None else None
    if not (zero_note and c.rec is not None and c.rec["num_workers"] > 0):
        return []
    return [
        _finding(
            "medium",
            "num_workers=0 starves your step: loading adds to every step",
            zero_note + ".",
            {"job": True},
        )
    ]


def _workers_slower(c: _SweepRead) -> list[dict[str, Any]]:
    """Workers slower than none: shipping batches between processes costs more than making them."""
    zero = [p for p in c.ok if p["num_workers"] == 0]
    if not (zero and c.multi):
        return []
    z = zero[0]
    w = max(c.multi, key=lambda p: p["samples_per_s"])
    tol = max(WORKERS_SLOWER, _rel_half(z), _rel_half(w))
    if not w["samples_per_s"] < z["samples_per_s"] * (1 - tol):
        return []
    per_batch_ms = 1e3 / z["batches_per_s"] if z["batches_per_s"] > 0 else math.nan
    serial = c.rec is not None and c.rec["num_workers"] == 0
    advice = (
        "use num_workers=0, or make each item do more work (bigger batches, decoding in the worker) "
        "before adding workers"
        if serial
        else "yet the recommendation keeps workers: "
        + (
            "your training job ran faster with them (without workers, loading adds to every step)"
            if c.decided
            else SERIAL_WORDS
        )
    )
    return [
        _finding(
            "high" if serial else "medium",
            "Workers make this loader slower: shipping batches costs more than making them",
            f"With no workers the main process makes a batch in {per_batch_ms:.2f} ms "
            f"({z['samples_per_s']:,.0f} samples/s); the best with workers is {w['samples_per_s']:,.0f} "
            f"samples/s at num_workers={w['num_workers']}. Items are cheap (in-memory tensors?), so "
            f"inter-process communication dominates: {advice}.",
            {
                "samples_per_s_0": z["samples_per_s"],
                "best_with_workers": w["samples_per_s"],
                "best_with_workers_num_workers": w["num_workers"],
                "batch_ms_at_0": per_batch_ms,
            },
        )
    ]


def _too_many_workers(c: _SweepRead) -> list[dict[str, Any]]:
    """Throughput falls past the peak. Not when the peak is no workers at all: :func:`_workers_slower`
    says that, and "too many" of one is odd."""
    if not (c.ok and max(c.ok, key=lambda p: p["samples_per_s"])["num_workers"] > 0):
        return []
    best = max(c.ok, key=lambda p: p["samples_per_s"])
    beyond = [p for p in c.ok if p["num_workers"] > best["num_workers"]]
    if not beyond:
        return []
    worst = min(beyond, key=lambda p: p["samples_per_s"])
    tol = max(TOO_MANY, _rel_half(best), _rel_half(worst))
    if not worst["samples_per_s"] < best["samples_per_s"] * (1 - tol):
        return []
    extra = worst["mem_pss_mb"] - best["mem_pss_mb"]
    return [
        _finding(
            "medium",
            f"Too many workers: throughput falls past num_workers={best['num_workers']}",
            f"{worst['samples_per_s']:,.0f} samples/s at num_workers={worst['num_workers']} against "
            f"{best['samples_per_s']:,.0f} at {best['num_workers']}"
            + (f", for {extra:,.0f} MB more memory" if math.isfinite(extra) and extra > 0 else "")
            + (
                f". More workers than the {c.cores} usable cores"
                + (f" ({c.cores_bound})" if c.cores_bound else "")
                + " compete for them (thrashing)"
                if worst["num_workers"] > c.cores
                else ". The workers compete with the main process for the cores"
            )
            + " and each holds a copy of the dataset object.",
            {
                "peak_num_workers": best["num_workers"],
                "peak_samples_per_s": best["samples_per_s"],
                "worst_num_workers": worst["num_workers"],
                "worst_samples_per_s": worst["samples_per_s"],
            },
        )
    ]


def _memory_budget(c: _SweepRead) -> list[dict[str, Any]]:
    """Settings over the memory budget (never recommended), and the search's stops at the budget."""
    out = []
    over = [p for p in c.pts if _over_budget(p, c.budget)]
    if over:
        p = max(over, key=lambda q: q["mem_pss_mb"])
        out.append(
            _finding(
                "medium",
                "Some settings exceed the memory budget",
                f"{_knob_text(p)} uses {p['mem_pss_mb']:,.0f} MB (PSS of main process and workers) against a "
                f"budget of {c.budget:,.0f} MB; such settings are never recommended.",
                {"mem_pss_mb": p["mem_pss_mb"], "budget_mb": c.budget},
            )
        )
    for s in c.meta.search.stopped:
        if "memory budget" in s:
            out.append(_finding("info", "The memory budget capped num_workers", s, {"budget_mb": c.budget}))
    return out


def _cpu_or_wait_bound(c: _SweepRead) -> list[dict[str, Any]]:
    """CPU-transform-bound against waiting (I/O) -bound, at the best setting with workers: the cores it kept busy."""
    if not c.multi:
        return []
    b = max(c.multi, key=lambda p: p["samples_per_s"])
    u = b["cores_used"]
    if not math.isfinite(u):
        return []
    cores = c.cores
    cpu_ms = 1e3 * u / b["samples_per_s"]
    if u >= CPU_BOUND * cores:
        return [
            _finding(
                "medium",
                "CPU-bound: the loader's work saturates the cores" + (f": {c.cores_bound}" if c.cores_bound else ""),
                f"At num_workers={b['num_workers']} the loader keeps {u:.2f} of {cores} cores busy "
                f"({cpu_ms:.2f} ms of CPU per sample). More workers cannot help: make the per-sample "
                "work cheaper (smaller inputs, vectorised transforms)"
                + (", raise the CPU limit" if c.cores_bound else "")
                + " or move it off these cores.",
                {
                    "cores_used": u,
                    "usable_cores": cores,
                    "cpu_ms_per_sample": cpu_ms,
                    "classification": "cpu-bound",
                },
            )
        ]
    if not u < WAITING * max(1, min(b["num_workers"], cores)):
        return []
    rising = b["num_workers"] == max(p["num_workers"] for p in c.multi)
    return [
        _finding(
            "info" if rising else "medium",
            "I/O- or wait-bound: the workers mostly wait",
            f"At num_workers={b['num_workers']} the loader uses only {u:.2f} cores for "
            f"{b['samples_per_s']:,.0f} samples/s ({cpu_ms:.2f} ms of CPU per sample): the workers wait "
            "on storage, the network or sleeps, not on the CPU. "
            + (
                "Throughput was still rising at the highest setting tried: more workers may help "
                "(raise max_workers) if memory allows."
                if rising
                else "Throughput stopped rising before the cores were busy: the storage or a shared lock "
                "is the limit (stage the data on local NVMe, shard small files, check locks)."
            ),
            {
                "cores_used": u,
                "usable_cores": cores,
                "cpu_ms_per_sample": cpu_ms,
                "classification": "io-bound",
                "still_rising": rising,
            },
        )
    ]


def _oversubscribed(c: _SweepRead) -> list[dict[str, Any]]:
    """Thread oversubscription: torch threads per worker x workers > cores (the first setting that shows it)."""
    for p in c.multi:
        t = p["worker_threads"]
        if math.isfinite(t) and t > 1 and t * p["num_workers"] > c.cores:
            busy = math.isfinite(p["cores_used"]) and p["cores_used"] >= CPU_BOUND * c.cores
            return [
                _finding(
                    "medium" if busy else "low",
                    "Thread oversubscription inside the workers",
                    f"Each of the {p['num_workers']} workers runs torch with {int(t)} intra-op threads: "
                    f"{int(t * p['num_workers'])} threads for {c.cores} cores. torch's DataLoader sets 1 thread per "
                    "worker; this loader's workers keep torch's default"
                    + (" (SPDL's loader does not change it)" if c.backend == "spdl_pytorch" else "")
                    + ". Call torch.set_num_threads(1) in the dataset (or set OMP_NUM_THREADS=1) when the "
                    "transforms use torch ops.",
                    {"worker_threads": t, "num_workers": p["num_workers"], "usable_cores": c.cores},
                )
            ]
    return []


def _workers_restart(c: _SweepRead) -> list[dict[str, Any]]:
    """Workers restarting at every epoch: judged at the recommendation, whose persistent_workers follows
    the same rule (:func:`_kept_knobs`), so the finding explains the snippet rather than contradicting it."""
    rec = c.rec
    stall = _stall(rec, c.ok, c.meta) if rec is not None else None
    if not (rec is not None and stall is not None and stall["matters"] and rec["persistent_workers"] is True):
        return []
    detail = (
        f"Each epoch starts with a {stall['stall_s']:.2f}s stall at {_knob_text({**rec, 'persistent_workers': False})} "
        "while the workers restart"
    )
    if math.isfinite(stall["share"]):
        detail += (
            f": {stall['share']:.0%} of an epoch of {int(stall['epoch_batches'])} batches ({stall['epoch_s']:.1f}s)"
        )
    if math.isfinite(stall["persistent_stall_s"]):
        detail += f". With persistent_workers=True the stall is {stall['persistent_stall_s']:.2f}s"
    detail += ". The recommendation sets persistent_workers=True."
    return [
        _finding(
            "high" if stall["share"] > STALL_HIGH else "medium" if stall["share"] > STALL_SHARE else "low",
            f"Workers restart at every epoch: a {stall['stall_s']:.2f}s stall",
            detail,
            {
                "epoch_stall_s": stall["stall_s"],
                "epoch_s": stall["epoch_s"],
                "share": stall["share"],
                "persistent_stall_s": stall["persistent_stall_s"],
            },
        )
    ]


def _your_setting(c: _SweepRead) -> list[dict[str, Any]]:
    """The user's own setting, when it was measured: with the job run, the job's comparison."""
    u = user_point(c.pts, c.meta)
    if c.decided and c.job is not None:
        return job_findings(c.job)
    if u is not None and c.rec is not None and is_ok(u) and (d := LoaderPoint.from_json(c.rec).decision):
        return _user_findings(u, c.rec, Decision.from_json(d))
    return []


def _user_findings(u: dict[str, Any], rec: dict[str, Any], d: Any) -> list[dict[str, Any]]:
    """The user's setting against the pick, by the rule: what the windows in turns showed, or could not."""
    x = d.versus_yours
    alone = "Measured without your training step: what that buys your job is not measured (STAGEBENCH_TRAINER=measure runs it)."
    if d.advice == "change" and x is not None:
        return [
            _finding(
                "medium",
                "Your setting leaves loader throughput on the table",
                f"In turns with yours, {_knob_text(rec)} ran {x.text('yours')}: faster beyond noise "
                f"({rec['samples_per_s']:,.0f} against {u['samples_per_s']:,.0f} samples/s over all their windows). "
                + alone,
                {"yours": u["samples_per_s"], "recommended": rec["samples_per_s"], **x.to_json()},
            )
        ]
    if d.advice == "cheaper" and x is not None:
        saved = u["mem_pss_mb"] - rec["mem_pss_mb"]
        return [
            _finding(
                "low",
                "Your setting uses more resources than it needs",
                f"In turns with yours, {_knob_text(rec)} ran {x.text('yours')}: within 5%, with fewer resources"
                + (f" ({saved:,.0f} MB less memory)." if math.isfinite(saved) and saved > 0 else ".")
                + " "
                + alone,
                {"yours": u["samples_per_s"], "recommended": rec["samples_per_s"], **x.to_json()},
            )
        ]
    if d.advice == "keep yours" and d.rival is not None:
        return [
            _finding(
                "info",
                f"Your setting is kept: the runs could not tell {d.rival} from it",
                _decision_words(d, {}, 1 - EQUIVALENT)[0].upper() + _decision_words(d, {}, 1 - EQUIVALENT)[1:] + ". "
                "Readings measured apart, or inside each other's intervals, are not evidence of a difference; "
                "more rounds in turns (LoaderSweepConfig.tie_rounds) would settle it.",
                {"rival": d.rival, **(x.to_json() if x is not None else {})},
            )
        ]
    return []


def _stall(rec: dict[str, Any], ok: list[dict[str, Any]], m: RunMeta) -> dict[str, Any] | None:
    """The epoch-boundary stall at the recommendation's knobs without persistent workers, and whether it matters."""
    if rec["num_workers"] == 0 or rec["persistent_workers"] == NOT_APPLICABLE:
        return None
    p = _same_knobs_but(ok, rec, persistent_workers=False)
    if p is None or not math.isfinite(p["epoch_stall_s"]):
        return None
    q = _same_knobs_but(ok, rec, persistent_workers=True)
    stall = p["epoch_stall_s"]
    epoch_batches = num(m.loader.epoch_batches)
    epoch_s = (
        epoch_batches / p["batches_per_s"] if math.isfinite(epoch_batches) and p["batches_per_s"] > 0 else math.nan
    )
    share = stall / (epoch_s + stall) if math.isfinite(epoch_s) else math.nan
    gain = _stall_gain(p, q) if q is not None else math.nan
    matters = (math.isfinite(share) and share > STALL_SHARE) or (
        not math.isfinite(share) and math.isfinite(gain) and gain > max(0.1, 0.5 * stall)
    )
    return {
        "matters": bool(matters),
        "stall_s": stall,
        "epoch_s": epoch_s,
        "epoch_batches": epoch_batches,
        "share": share,
        "persistent_stall_s": q["epoch_stall_s"] if q is not None else math.nan,
    }


def _kept_knobs(
    rec: dict[str, Any] | None, ok: list[dict[str, Any]], m: RunMeta, *, with_loop: bool = False
) -> dict[str, Any] | None:
    """:func:`_knobs_kept` on the recommendation, its ``decision`` carried over to the twin point it may become."""
    out = _knobs_kept(rec, ok, m, with_loop=with_loop)
    decision = LoaderPoint.from_json(rec).decision if rec is not None else None
    if out is not None and decision is not None:
        out = {**out, "decision": decision}
    return out


def _knobs_kept(
    rec: dict[str, Any] | None, ok: list[dict[str, Any]], m: RunMeta, *, with_loop: bool = False
) -> dict[str, Any] | None:
    """The knobs a throughput window cannot judge, set by one rule each (the findings follow the same rules).

    ``pin_memory`` on a host with a CUDA device: as the user set it. Its benefit appears only with
    the copy to the device, which a loader measured alone never makes, so an isolated sweep can only
    see its cost; a job run with the user's loop judges it: ``with_loop`` (``rec`` is the job runs'
    pick), its ``pin_memory`` stands.
    ``persistent_workers``: the user's own where given (it acts only at epoch boundaries, which neither
    a throughput window nor a job slice reaches), else True where the stall matters (:func:`_stall`).
    """
    if rec is None:
        return rec
    mine = m.loader.user_knobs or UserKnobs()
    cuda = m.settings.cuda
    out = rec
    if cuda and not with_loop and mine.gave("pin_memory") and rec["pin_memory"] != NOT_APPLICABLE:
        if (rec["pin_memory"] is True) != bool(mine.pin_memory):
            twin = _same_knobs_but(ok, rec, pin_memory=bool(mine.pin_memory))
            out = dict(twin or rec)
            out["pin_memory"] = bool(mine.pin_memory)
            out["why"] = (LoaderPoint.from_json(rec).why or "") + (
                "; pin_memory kept as yours: its benefit shows only with the copy to the device, which the "
                "loader measured alone does not make"
            )
    if out["num_workers"] == 0 or out["persistent_workers"] == NOT_APPLICABLE:
        return out
    stall = _stall(out, ok, m)
    matters = stall is not None and stall["matters"]
    if mine.gave("persistent_workers") and bool(mine.persistent_workers) != (out["persistent_workers"] is True):
        if mine.persistent_workers or not matters:
            why = LoaderPoint.from_json(out).why or ""
            out = dict(_same_knobs_but(ok, out, persistent_workers=bool(mine.persistent_workers)) or out)
            out["persistent_workers"] = bool(mine.persistent_workers)
            out["why"] = why + (
                "; persistent_workers kept as yours: it acts only at epoch boundaries, which the throughput "
                "windows do not see"
            )
            return out
    if matters and out["persistent_workers"] is not True:
        why = LoaderPoint.from_json(out).why or ""
        out = dict(_same_knobs_but(ok, out, persistent_workers=True) or out)
        out["persistent_workers"] = True
        out["why"] = why + "; persistent_workers=True: workers restart at every epoch otherwise"
    return out


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


def _cost(p: dict[str, Any]) -> tuple[float, ...]:
    """Workers first, then the other knobs, then memory (a candidate's cost in the job runs)."""
    mem = p["mem_pss_mb"] if math.isfinite(p["mem_pss_mb"]) else 0.0
    return (*_cheapest_first(p), mem)


def job_candidates(rows: Any, meta: dict[str, Any], demand: dict[str, Any] | float | None) -> Any:
    """The loader settings to run with the user's loop: a :class:`stagebench.core._jobrun.Ladder`
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
    from stagebench.analysis._ladder import Rung, build_ladder
    from stagebench.core._jobrun import Ladder
    from stagebench.model._rate import Rate

    rate = Rate.from_json(demand) if isinstance(demand, dict) else (Rate(float(demand)) if demand else None)
    pts = [p for p in _rows(rows) if is_ok(p)]
    if not pts:
        return Ladder(run=[])
    m = RunMeta.from_json(meta)
    backend = "torch" if m.loader.backend is None else m.loader.backend
    cuda = m.settings.cuda
    budget = m.settings.memory_budget_mb
    headroom = float(DEMAND_HEADROOM if m.settings.headroom is None else m.settings.headroom)
    mine = m.loader.user_knobs or UserKnobs()
    pool = [p for p in pts if not _over_budget(p, budget, _memory_cap(m))] or pts

    def knobs_of(p: dict[str, Any], pin: bool | None = None) -> LoaderKnobs:
        # the rules of _kept_knobs, so that the job's pick is what the summary recommends
        persistent = (
            bool(mine.persistent_workers) if mine.gave("persistent_workers") else p["persistent_workers"] is True
        )
        stall = _stall({**p, "persistent_workers": False}, pts, m) if p["num_workers"] > 0 else None
        persistent = persistent or (stall is not None and stall["matters"])
        if pin is None:
            pin = bool(mine.pin_memory) if cuda and mine.gave("pin_memory") else p["pin_memory"] is True
        req = LoaderKnobs(
            num_workers=p["num_workers"],
            prefetch_factor=p["prefetch_factor"] if p["num_workers"] > 0 else None,
            persistent_workers=persistent and p["num_workers"] > 0,
            pin_memory=pin,
        )
        return normalize_knobs(req, backend, cuda=cuda)[0]

    def rung(p: dict[str, Any] | None, k: LoaderKnobs | None = None, notes: tuple[str, ...] = ()) -> Rung | None:
        if p is None:
            return None
        k = k or knobs_of(p)
        shown = {**p, **{f: getattr(k, f) for f in KNOB_KEYS}}
        label = _knob_text(shown)
        return Rung(
            key=k.label(),
            label=label + (f" (as run: {'; '.join(notes)})" if notes else ""),
            settings={f: getattr(k, f) for f in KNOB_KEYS},
            cost=_cost(shown),
            alone=Rate.from_json(p) if math.isfinite(p["samples_per_s"]) else None,
            alone_as=_knob_text(p) if _knob_text(p) != label else None,
            round_steps=max(1, k.num_workers),
            serial=k.num_workers == 0,
            memory_mb=p["mem_workers_mb"] if math.isfinite(p["mem_workers_mb"]) else None,
        )

    user = user_point(pts, m)
    yours: Rung | None = None
    if mine.given:
        # exactly the script's setting: its knobs as given, only what this host cannot take changed (and named)
        k, _, notes = normalize_knobs(LoaderKnobs(**mine.to_json()), backend, cuda=cuda)
        yours = rung(user or normalize_row({**asdict(k), "status": "ok"}), k, tuple(notes))
    elif user is not None:
        yours = rung(user)
    need = None if rate is None else rate.value * (1 + headroom)
    feeding = sorted((p for p in pool if need is not None and p["samples_per_s"] >= need), key=_cost)
    best = max(pool, key=lambda p: p["samples_per_s"])
    offers: list[tuple[Rung | None, str]] = [(yours, "yours")]
    feeds = feeding[0] if feeding else None
    if feeds is not None:
        offers.append((rung(feeds), "feeds"))
        above = [p for p in feeding if p["num_workers"] > feeds["num_workers"]]
        offers.append((rung(min(above, key=_cost)) if above else None, "above"))
    offers.append((rung(best), "best"))
    if feeds is None and m.ranks > 1:
        # a host's ranks, none feeding the step: the loaders alone ranked the settings without the ranks'
        # steps taking the same cores, and those near the fastest (near_fastest) are the job's to tell
        near = [p for p in pool if near_fastest(p, best) and p["num_workers"] != best["num_workers"]]
        for nw in sorted({p["num_workers"] for p in near}):
            offers.append((rung(min((p for p in near if p["num_workers"] == nw), key=_cost)), "near"))
    if cuda and not mine.pin_memory:
        first = feeds or best
        offers.append((rung(first, knobs_of(first, pin=True)), "pinned"))
    return build_ladder(offers, demand=rate, memory_budget_mb=budget)


def _job_pick(job: dict[str, Any], pts: list[dict[str, Any]], meta: RunMeta) -> dict[str, Any]:
    """The job runs' pick as a recommended point: its isolated figures where measured, its knobs, the job's why."""
    v = JobVerdict.from_json(job)
    assert v is not None  # decided
    cand = next(c for c in v.candidates if c.key == v.pick)
    k = cand.settings
    same = [
        p
        for p in pts
        if is_ok(p)
        and p["num_workers"] == k["num_workers"]
        and (k["num_workers"] == 0 or p["prefetch_factor"] == k["prefetch_factor"])
    ]
    exact = [
        p
        for p in same
        if (p["persistent_workers"] is True) == bool(k["persistent_workers"])
        and (p["pin_memory"] is True) == bool(k["pin_memory"])
    ]
    if exact or same:
        rec = dict((exact or same)[0])
    else:  # not a measured point (cannot happen for candidates built from points; kept total)
        rec = normalize_row({**k, "samples_per_s": cand.alone.value if cand.alone is not None else None})
    measured = LoaderPoint.from_json(rec)  # a knob that does not apply to the point stays so
    if measured.persistent_workers != NOT_APPLICABLE:
        rec["persistent_workers"] = bool(k["persistent_workers"])
    if measured.pin_memory != NOT_APPLICABLE:
        rec["pin_memory"] = bool(k["pin_memory"])
    rec["prefetch_factor"] = k["prefetch_factor"] if k["num_workers"] > 0 else None
    rec["why"] = f"run with your training loop: {v.why}"
    return rec


def _zero_workers_note(job: dict[str, Any]) -> str | None:
    """Why num_workers=0 was or was not chosen, from the job runs (None: it was not a candidate).

    Loading without workers adds to every step (the DataLoader guide's T4), so it is advised only
    where the job runs, in turns, show it as fast as the others within 5% (the rule of
    :mod:`stagebench.model._evidence`); a reading that could not tell is not that.
    """
    v = JobVerdict.from_json(job)
    zero = next((c for c in v.candidates if c.settings.get("num_workers") == 0), None) if v is not None else None
    if zero is None:
        return None
    f = zero.job
    if f is None:
        return "num_workers=0 was a candidate but did not run with your loop, so it is not advised"
    x = zero.versus_yours
    vs = x.text("yours") if x is not None else "not run in turns with yours"
    if v is not None and zero.key == v.pick:
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
        f"num_workers=0 ran your job at {f.samples_per_s:,.0f} samples/s, {vs}: not shown as fast as your "
        "setting, so it is not advised (without workers, loading adds to every step)"
    )


def _job_not_run(job: dict[str, Any] | None, target: dict[str, Any]) -> str:
    """What the verdict says of the job where no setting ran with the user's loop."""
    if job is not None:
        return str(job["text"])
    if target.get("source") == "stated":
        return (
            "inconclusive: your step's rate was stated, not measured, so no setting was run with your loop "
            "(STAGEBENCH_TRAINER=measure runs it)"
        )
    return "inconclusive: no setting was run with your loop"


def _warnings(pts: list[dict[str, Any]], m: RunMeta) -> list[str]:
    from stagebench.runs._provenance import load_warnings

    before, after = m.provenance, m.provenance_after
    out = list(load_warnings({} if before is None else before.to_json(), None if after is None else after.to_json()))
    wide = [p for p in pts if is_ok(p) and _rel_half(p) > 0.15]
    if wide:
        out.append(
            f"wide intervals (over ±15%) at {len(wide)} of {len(pts)} points: the machine may be busy, "
            "or batches are bursty; a longer budget_s narrows them"
        )
    no_int = [p for p in pts if is_ok(p) and not math.isfinite(p["samples_per_s_low"])]
    if no_int:
        out.append(f"no interval at {len(no_int)} point(s): too few batches in the window (raise budget_s)")
    for p in pts:
        if "perturbed" in p["notes"]:
            out.append(f"{_knob_text(p)}: {p['notes']}")
    if m.search.interrupted:
        out.append("the sweep was interrupted: the summary covers the points measured before it")
    if m.status == "running" and m.ended is not None:  # a sweep that never finished, as the rebuild found it
        out.append(f"the sweep was cut short: {m.ended.text}; this summary covers the points measured before it")
    out.extend(m.warnings)
    return out


@dataclass(frozen=True)
class _Picks:
    """What the loader summary is built from: the pooled points, the demand on the loader and the settings picked."""

    settings: dict[str, Any]
    within: float
    headroom: float
    #: samples/s the trainer needs (stated, or its step measured: ``measured_demand``); None without a trainer
    target_rate: Any
    measured_demand: bool
    trainer: StepAlone
    pts: list[dict[str, Any]]
    best: dict[str, Any] | None
    user: dict[str, Any] | None
    job: dict[str, Any] | None
    #: the job runs decided the pick
    decided: bool
    #: the recommendation: the job's pick where its runs decided, else :attr:`isolated`
    rec: dict[str, Any] | None
    #: the loader alone's recommendation
    isolated: dict[str, Any] | None
    #: what the rounds in turns took: in all, and a round (:func:`_turn_seconds`)
    turn_seconds: tuple[float, float] | None = None


def summarize_loader(rows: Any, meta: dict[str, Any]) -> dict[str, Any]:
    """The loader summary.json (docs/contracts.md, kind "loader").

    With the training job run (``run.json["job"]``: the user's loop on the real loader at
    each candidate, :mod:`stagebench.analysis._job`), the recommendation is the job's pick
    and the verdict the job's figure; without it, the loader alone's, and a verdict about
    the job is "inconclusive".
    """
    from stagebench._version import __version__
    from stagebench.analysis._job import alone_scope, trainer_summary
    from stagebench.runs._schema import SUMMARY_SCHEMA_VERSION

    m = RunMeta.from_json(meta)
    c = _picks(rows, m)
    target = _target(c)
    costs = worker_costs_summary(m, c.pts)
    verdict = _verdict(c, target) + beside_the_pick(costs, c.rec)
    rec, isolated, settings = c.rec, c.isolated, c.settings
    return {
        "schema_version": SUMMARY_SCHEMA_VERSION,
        "kind": "loader",
        "stagebench_version": __version__,
        "provenance": None if m.provenance is None else m.provenance.to_json(),
        "settings": settings,
        "loader": m.loader.to_json(),
        "verdict": verdict,
        "warnings": _warnings(c.pts, m),
        "recommended": _public(rec, rec["why"]) if rec is not None else None,
        "recommended_alone": _public(isolated, isolated["why"])
        if isolated is not None and rec is not None and LoaderKnobs.from_row(isolated) != LoaderKnobs.from_row(rec)
        else None,
        "best": _public(c.best) if c.best is not None else None,
        "user_setting": _public(c.user) if c.user is not None else None,
        "points": c.pts,
        "search": _search_summary(m, c.pts),
        "target": target,
        "trainer": trainer_summary(m.trainer, c.job),
        "job": c.job,
        "scope": alone_scope("the loader", m.trainer, m.settings, planned=m.trainer_planned),
        "findings": by_severity(loader_findings(c.pts, m, rec, target, c.job) + worker_cost_findings(costs, rec)),
        "worker_costs": costs,
        "transforms": list(m.transforms),
    }


def loader_pick(rows: Any, meta: Mapping[str, Any] | RunMeta) -> dict[str, Any] | None:
    """The recommended row as the summary makes it from ``rows`` and the run's ``meta`` (the script's own
    setting, a target rate, the job's pick where its runs decided): what is measured at the pick (each
    worker's memory) is measured at this one."""
    return _picks(rows, meta if isinstance(meta, RunMeta) else RunMeta.from_json(meta)).rec


def _picks(rows: Any, m: RunMeta) -> _Picks:
    """The demand on the loader, the points and the recommendation (the job's pick where its runs decided).

    The job's candidates gain ``zero_workers``, why num_workers=0 was or was not chosen.
    """
    from stagebench.analysis._job import decide_job

    s = m.settings
    within = float(0.05 if s.within_best is None else s.within_best)
    headroom = float(DEMAND_HEADROOM if s.headroom is None else s.headroom)
    target_rate = s.target_rate
    trainer = StepAlone.from_json(m.trainer)
    measured_demand = target_rate is None and finite(trainer.samples_per_s)
    if measured_demand:  # STAGEBENCH_TRAINER=measure: the loop's own step is the demand (loader/_trainer)
        target_rate = num(trainer.samples_per_s)
    pts = _rows(rows)
    ok = [p for p in pts if is_ok(p)]
    user = user_point(pts, m)
    job = decide_job(m.job, m.trainer)
    decided = job is not None and job["status"] == "decided"
    rec = recommend(
        rows,  # as measured: the tie-break's rows are read in their order
        budget_mb=s.memory_budget_mb,
        within_best=within,
        target_rate=target_rate,
        headroom=headroom,
        user=user,
        serial_ok=target_rate is None,
        max_workers=_memory_cap(m),
    )
    rec = _kept_knobs(rec, ok, m)
    isolated = rec
    if decided and job is not None:
        rec = _kept_knobs(_job_pick(job, pts, m), ok, m, with_loop=True)
        job["zero_workers"] = _zero_workers_note(job)
    return _Picks(
        settings=s.to_json(),
        within=within,
        headroom=headroom,
        target_rate=target_rate,
        measured_demand=measured_demand,
        trainer=trainer,
        pts=pts,
        best=max(ok, key=lambda p: p["samples_per_s"]) if ok else None,
        user=user,
        job=job,
        decided=decided,
        rec=rec,
        isolated=isolated,
        turn_seconds=_turn_seconds(_raw(rows)),
    )


def _target(c: _Picks) -> dict[str, Any] | None:
    """The trainer's demand and whether the loader alone meets it with the headroom (None without a demand)."""
    target_rate, headroom, best, trainer = c.target_rate, c.headroom, c.best, c.trainer
    if target_rate is None:
        return None
    need = target_rate * (1 + headroom)
    met = best is not None and best["samples_per_s"] >= need
    if best is None:
        verdict = f"data-bound: no loader setting could be measured, the trainer needs {target_rate:,.1f} samples/s"
    elif met:
        isolated = c.isolated
        assert isolated is not None  # recommend() is None only when no point is ok, and best is one
        verdict = (
            f"the loader alone keeps up: {isolated['samples_per_s']:,.1f} samples/s at {_knob_text(isolated)} "
            f"against {target_rate:,.1f} needed (+{headroom:.0%} headroom)"
        )
    else:
        verdict = (
            f"data-bound: the best loader alone gives {best['samples_per_s']:,.1f} samples/s, "
            f"the trainer needs {target_rate:,.1f}"
        )
    if c.measured_demand:
        verdict += f" (the demand is your training step, measured: {trainer.steps_per_s:,.2f} steps/s)"
    return {
        "rate": target_rate,
        "needed_with_headroom": need,
        "met": bool(met),
        "verdict": verdict,
        "source": "measured" if c.measured_demand else "stated",
    }


def _verdict(c: _Picks, target: dict[str, Any] | None) -> str:
    """The summary's verdict: the job's where its runs decided, the demand not met, else the pick alone."""
    if c.rec is None:
        first = next((p for p in c.pts if p["reason"]), None)
        verdict = "no loader setting could be measured" + (f": {first['reason']}" if first else "")
    elif c.decided and c.job is not None:
        verdict = c.job["text"]
    elif target is not None and not target["met"]:
        verdict = target["verdict"]
    else:
        verdict = _pick_verdict(c, c.rec, target)
    if target is not None and not c.decided:
        verdict += "; the job: " + _job_not_run(c.job, target)
    return verdict + _per_rank(c.rec, c.settings)


def _per_rank(rec: dict[str, Any] | None, settings: Mapping[str, Any]) -> str:
    """A ranked sweep's pick in the words users set it (each rank's own loader) and what it makes on the
    host; "" on one rank."""
    ranks = num(settings.get("ranks"))
    if rec is None or not math.isfinite(ranks) or ranks <= 1:
        return ""
    n, nw = int(ranks), int(rec["num_workers"])
    cores = num(settings.get("usable_cores"))
    on = f" on {cores:g} cores" if math.isfinite(cores) else ""
    workers = f"{n} ranks x {nw} worker{'' if nw == 1 else 's'} = {n * nw} worker processes{on}"
    if nw == 0:
        workers = f"{n} ranks, each loading in its own process{on}"
    return f"; num_workers={nw} a rank: {workers}; samples/s are the host's, every rank's loader at once"


def _pick_verdict(c: _Picks, rec: dict[str, Any], target: dict[str, Any] | None) -> str:
    """The loader alone's pick: use it (or keep yours), its throughput and interval, and what it rests on."""
    lo, hi = rec["samples_per_s_low"], rec["samples_per_s_high"]
    ci = f" [{lo:,.1f}, {hi:,.1f}]" if math.isfinite(lo) and math.isfinite(hi) else ""
    # the same words as the job's verdict and the pipeline's: a pick that is your setting is "keep yours"
    keep = c.user is not None and _knob_text(c.user) == _knob_text(rec)
    said = f"keep yours ({_knob_text(rec)})" if keep else f"use {_knob_text(rec)}"
    verdict = f"{said}: {rec['samples_per_s']:,.1f} samples/s{ci}"
    if target is not None:
        verdict += " by the loader alone"
    best = c.best
    if best is not None and LoaderKnobs.from_row(best) != LoaderKnobs.from_row(rec):
        verdict += f" (best {best['samples_per_s']:,.1f} at num_workers={best['num_workers']})"
    decision = LoaderPoint.from_json(rec).decision
    if decision and target is None:
        # what the pick rests on: the ratio in turns, or that the runs could not tell
        verdict += f"; {_decision_words(Decision.from_json(decision), {}, c.within, c.turn_seconds)}"
    return verdict


def _search_summary(m: RunMeta, pts: list[dict[str, Any]]) -> dict[str, Any]:
    """How the search went: its strategy, points and seconds, against an estimate for the full grid."""
    search = m.search
    elapsed = [p["elapsed_s"] for p in pts if math.isfinite(p["elapsed_s"])]
    seconds = float(sum(elapsed) if search.seconds is None else search.seconds)
    grid_points = int(m.settings.full_grid_points or len(pts))
    mean_point = sum(elapsed) / len(elapsed) if elapsed else math.nan
    est = mean_point * grid_points if math.isfinite(mean_point) else math.nan
    return {
        "strategy": search.strategy
        if search.strategy is not None
        else m.settings.strategy
        if m.settings.strategy is not None
        else "adaptive",
        "points_measured": len(pts),
        "seconds": seconds,
        "full_grid_points": grid_points,
        "estimated_full_grid_seconds": est,
        "time_saved_s": max(0.0, est - seconds) if math.isfinite(est) else math.nan,
        "stopped": list(search.stopped),
    }
