"""The loader's findings: what the measured points say of the loader, each a ranked, actionable diagnosis.

The diagnoses read the shape of the curve (throughput against workers) together with the cores the
loader used, which is what separates "the work is CPU" from "the workers wait" from "the batches cost
more to ship than to make". None advises a setting the recommendation does not have.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from stagebench.analysis._job import job_findings
from stagebench.analysis._loader_pick import SERIAL_WORDS, STALL_HIGH, STALL_SHARE, _decision_words, _stall
from stagebench.analysis._loader_rows import _knob_text, _over_budget, _rel_half, user_point
from stagebench.model._evidence import EQUIVALENT
from stagebench.model._finding import Finding, by_severity
from stagebench.model._job import JobVerdict
from stagebench.model._loader import LoaderRow, LoaderTarget
from stagebench.model._meta import Provenance, RunMeta

__all__ = ["loader_findings"]


# The numbers behind the findings' words (docs/loaders.md has them as a table; a test per finding).
#: "Workers make this loader slower": the best with workers this share (or its interval) under none.
WORKERS_SLOWER = 0.05
#: "Too many workers": the worst above the peak this share (or its interval) under the peak.
TOO_MANY = 0.10
#: "CPU-bound": the best setting with workers keeps this share of the usable cores busy.
CPU_BOUND = 0.75
#: "I/O- or wait-bound": it keeps fewer cores busy than this share of its workers (up to the cores).
WAITING = 0.5


@dataclass(frozen=True)
class _SweepRead:
    """What the loader's findings read: the measured points, the run's settings and what was recommended."""

    pts: list[LoaderRow]
    ok: list[LoaderRow]
    #: the points measured ok with workers
    multi: list[LoaderRow]
    meta: RunMeta
    rec: LoaderRow | None
    target: LoaderTarget | None
    #: the job runs' verdict (None without a job)
    jv: JobVerdict | None
    #: the job runs decided the pick: the comparisons with the user's setting are the job's
    decided: bool
    cores: float
    budget: float | None
    backend: str
    #: where a quota or an allocation sets ``cores``, in words (empty: the affinity mask does)
    cores_bound: str = ""


def loader_findings(
    pts: list[LoaderRow],
    m: RunMeta,
    rec: LoaderRow | None,
    target: LoaderTarget | None,
    job: JobVerdict | None = None,
) -> list[Finding]:
    """Diagnoses, most important first (same shape as the pipeline findings).

    None advises a setting the recommendation does not have: where the job ran (``job``), the
    comparisons with the user's setting are the job's, not the loader alone's.
    """
    prov = m.provenance or Provenance()
    ok = [p for p in pts if p.ok]
    c = _SweepRead(
        pts=pts,
        ok=ok,
        multi=[p for p in ok if p.num_workers > 0],
        meta=m,
        rec=rec,
        target=target,
        jv=job,
        decided=job is not None and job.decided,
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
            *_stall_not_measured(c),
            *_your_setting(c),
        ]
    )


def _failed_points(c: _SweepRead) -> list[Finding]:
    """A setting whose worker died, hung or raised: the search could not measure it."""
    out: list[Finding] = []
    for p in c.pts:
        if p.status in ("crashed", "timeout", "failed"):
            title = {
                "crashed": f"A worker died at {_knob_text(p)}",
                "timeout": f"The loader hung at {_knob_text(p)}",
                "failed": f"The loader raised at {_knob_text(p)}",
            }[p.status]
            detail = p.reason
            if p.status == "crashed":
                detail += ". The search kept the settings with fewer workers."
            out.append(Finding("high", title, detail, evidence={"num_workers": p.num_workers, "status": p.status}))
    return out


def _data_bound(c: _SweepRead) -> list[Finding]:
    """The training job waits for data (by the job runs), or the loader alone cannot feed the trainer."""
    job, target = c.jv, c.target
    if c.decided and job is not None and job.bound == "data-bound":
        return [
            Finding(
                "high",
                "Data-bound: your training job waits for data",
                f"{job.text}. The loader alone at its best gives {max(p.samples_per_s for p in c.ok):,.0f} "
                "samples/s; the findings below say what limits it.",
                evidence={"job_samples_per_s": job.samples_per_s, "data_wait_share": job.data_wait_share},
            )
        ]
    if not c.decided and target is not None and not target.met:
        return [
            Finding(
                "high",
                "Data-bound: the loader cannot feed the trainer",
                target.verdict,
                evidence={"target_rate": target.rate},
            )
        ]
    return []


def _zero_workers_starve(c: _SweepRead) -> list[Finding]:
    """The job runs showed num_workers=0 slower, and the recommendation keeps workers: why."""
    zero_note = c.jv.zero_workers if c.decided and c.jv is not None else None
    if not (zero_note and c.rec is not None and c.rec.num_workers > 0):
        return []
    return [
        Finding(
            "medium",
            "num_workers=0 starves your step: loading adds to every step",
            zero_note + ".",
            evidence={"job": True},
        )
    ]


def _workers_slower(c: _SweepRead) -> list[Finding]:
    """Workers slower than none: shipping batches between processes costs more than making them."""
    zero = [p for p in c.ok if p.num_workers == 0]
    if not (zero and c.multi):
        return []
    z = zero[0]
    w = max(c.multi, key=lambda p: p.samples_per_s)
    tol = max(WORKERS_SLOWER, _rel_half(z), _rel_half(w))
    if not w.samples_per_s < z.samples_per_s * (1 - tol):
        return []
    per_batch_ms = 1e3 / z.batches_per_s if z.batches_per_s > 0 else math.nan
    serial = c.rec is not None and c.rec.num_workers == 0
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
        Finding(
            "high" if serial else "medium",
            "Workers make this loader slower: shipping batches costs more than making them",
            f"With no workers the main process makes a batch in {per_batch_ms:.2f} ms "
            f"({z.samples_per_s:,.0f} samples/s); the best with workers is {w.samples_per_s:,.0f} "
            f"samples/s at num_workers={w.num_workers}. Items are cheap (in-memory tensors?), so "
            f"inter-process communication dominates: {advice}.",
            evidence={
                "samples_per_s_0": z.samples_per_s,
                "best_with_workers": w.samples_per_s,
                "best_with_workers_num_workers": w.num_workers,
                "batch_ms_at_0": per_batch_ms,
            },
        )
    ]


def _too_many_workers(c: _SweepRead) -> list[Finding]:
    """Throughput falls past the peak. Not when the peak is no workers at all: :func:`_workers_slower`
    says that, and "too many" of one is odd."""
    if not c.ok:
        return []
    best = max(c.ok, key=lambda p: p.samples_per_s)
    beyond = [p for p in c.ok if p.num_workers > best.num_workers]
    if not (best.num_workers > 0 and beyond):
        return []
    worst = min(beyond, key=lambda p: p.samples_per_s)
    tol = max(TOO_MANY, _rel_half(best), _rel_half(worst))
    if not worst.samples_per_s < best.samples_per_s * (1 - tol):
        return []
    extra = worst.mem_pss_mb - best.mem_pss_mb
    return [
        Finding(
            "medium",
            f"Too many workers: throughput falls past num_workers={best.num_workers}",
            f"{worst.samples_per_s:,.0f} samples/s at num_workers={worst.num_workers} against "
            f"{best.samples_per_s:,.0f} at {best.num_workers}"
            + (f", for {extra:,.0f} MB more memory" if math.isfinite(extra) and extra > 0 else "")
            + (
                f". More workers than the {c.cores} usable cores"
                + (f" ({c.cores_bound})" if c.cores_bound else "")
                + " compete for them (thrashing)"
                if worst.num_workers > c.cores
                else ". The workers compete with the main process for the cores"
            )
            + " and each holds a copy of the dataset object.",
            evidence={
                "peak_num_workers": best.num_workers,
                "peak_samples_per_s": best.samples_per_s,
                "worst_num_workers": worst.num_workers,
                "worst_samples_per_s": worst.samples_per_s,
            },
        )
    ]


def _memory_budget(c: _SweepRead) -> list[Finding]:
    """Settings over the memory budget (never recommended), and the search's stops at the budget."""
    out: list[Finding] = []
    over = [p for p in c.pts if _over_budget(p, c.budget)]
    if over:
        p = max(over, key=lambda q: q.mem_pss_mb)
        out.append(
            Finding(
                "medium",
                "Some settings exceed the memory budget",
                f"{_knob_text(p)} uses {p.mem_pss_mb:,.0f} MB (PSS of main process and workers) against a "
                f"budget of {c.budget:,.0f} MB; such settings are never recommended.",
                evidence={"mem_pss_mb": p.mem_pss_mb, "budget_mb": c.budget},
            )
        )
    for s in c.meta.search.stopped:
        if "memory budget" in s:
            out.append(Finding("info", "The memory budget capped num_workers", s, evidence={"budget_mb": c.budget}))
    return out


def _cpu_or_wait_bound(c: _SweepRead) -> list[Finding]:
    """CPU-transform-bound against waiting (I/O) -bound, at the best setting with workers: the cores it kept busy."""
    if not c.multi:
        return []
    b = max(c.multi, key=lambda p: p.samples_per_s)
    u = b.cores_used
    if not math.isfinite(u):
        return []
    cores = c.cores
    cpu_ms = 1e3 * u / b.samples_per_s
    if u >= CPU_BOUND * cores:
        return [
            Finding(
                "medium",
                "CPU-bound: the loader's work saturates the cores" + (f": {c.cores_bound}" if c.cores_bound else ""),
                f"At num_workers={b.num_workers} the loader keeps {u:.2f} of {cores} cores busy "
                f"({cpu_ms:.2f} ms of CPU per sample). More workers cannot help: make the per-sample "
                "work cheaper (smaller inputs, vectorised transforms)"
                + (", raise the CPU limit" if c.cores_bound else "")
                + " or move it off these cores.",
                evidence={
                    "cores_used": u,
                    "usable_cores": cores,
                    "cpu_ms_per_sample": cpu_ms,
                    "classification": "cpu-bound",
                },
            )
        ]
    if not u < WAITING * max(1, min(b.num_workers, cores)):
        return []
    rising = b.num_workers == max(p.num_workers for p in c.multi)
    return [
        Finding(
            "info" if rising else "medium",
            "I/O- or wait-bound: the workers mostly wait",
            f"At num_workers={b.num_workers} the loader uses only {u:.2f} cores for "
            f"{b.samples_per_s:,.0f} samples/s ({cpu_ms:.2f} ms of CPU per sample): the workers wait "
            "on storage, the network or sleeps, not on the CPU. "
            + (
                "Throughput was still rising at the highest setting tried: more workers may help "
                "(raise max_workers) if memory allows."
                if rising
                else "Throughput stopped rising before the cores were busy: the storage or a shared lock "
                "is the limit (stage the data on local NVMe, shard small files, check locks)."
            ),
            evidence={
                "cores_used": u,
                "usable_cores": cores,
                "cpu_ms_per_sample": cpu_ms,
                "classification": "io-bound",
                "still_rising": rising,
            },
        )
    ]


def _oversubscribed(c: _SweepRead) -> list[Finding]:
    """Thread oversubscription: torch threads per worker x workers > cores (the first setting that shows it)."""
    for p in c.multi:
        t = p.worker_threads
        if math.isfinite(t) and t > 1 and t * p.num_workers > c.cores:
            busy = math.isfinite(p.cores_used) and p.cores_used >= CPU_BOUND * c.cores
            return [
                Finding(
                    "medium" if busy else "low",
                    "Thread oversubscription inside the workers",
                    f"Each of the {p.num_workers} workers runs torch with {int(t)} intra-op threads: "
                    f"{int(t * p.num_workers)} threads for {c.cores} cores. torch's DataLoader sets 1 thread per "
                    "worker; this loader's workers keep torch's default"
                    + (" (SPDL's loader does not change it)" if c.backend == "spdl_pytorch" else "")
                    + ". Call torch.set_num_threads(1) in the dataset (or set OMP_NUM_THREADS=1) when the "
                    "transforms use torch ops.",
                    evidence={"worker_threads": t, "num_workers": p.num_workers, "usable_cores": c.cores},
                )
            ]
    return []


def _stall_not_measured(c: _SweepRead) -> list[Finding]:
    """The pause at each epoch's start, measured at the pick, could not be: say why, so that a stall column
    without a figure (and the seconds spent waiting for an epoch to end) is explained."""
    rec = c.rec
    if rec is None or math.isfinite(rec.epoch_stall_s) or (why := rec.stall_unmeasured) is None:
        return []
    return [
        Finding(
            "info",
            "The pause at each epoch's start was not measured",
            f"At {_knob_text(rec)}: {why}. The figures leave out that pause (workers that are not persistent "
            "start again at every epoch); a run of many epochs pays it once an epoch.",
            evidence={"num_workers": rec.num_workers, "reason": why},
        )
    ]


def _workers_restart(c: _SweepRead) -> list[Finding]:
    """Workers restarting at every epoch: judged at the recommendation, whose persistent_workers follows
    the same rule (:func:`_kept_knobs`), so the finding explains the snippet rather than contradicting it."""
    rec = c.rec
    stall = _stall(rec, c.ok, c.meta) if rec is not None else None
    if not (rec is not None and stall is not None and stall.matters and rec.persistent_workers is True):
        return []
    detail = (
        f"Each epoch starts with a {stall.stall_s:.2f}s stall at {_knob_text(replace(rec, persistent_workers=False))} "
        "while the workers restart"
    )
    if math.isfinite(stall.share):
        detail += f": {stall.share:.0%} of an epoch of {int(stall.epoch_batches)} batches ({stall.epoch_s:.1f}s)"
    if math.isfinite(stall.persistent_stall_s):
        detail += f". With persistent_workers=True the stall is {stall.persistent_stall_s:.2f}s"
    detail += ". The recommendation sets persistent_workers=True."
    return [
        Finding(
            "high" if stall.share > STALL_HIGH else "medium" if stall.share > STALL_SHARE else "low",
            f"Workers restart at every epoch: a {stall.stall_s:.2f}s stall",
            detail,
            evidence={
                "epoch_stall_s": stall.stall_s,
                "epoch_s": stall.epoch_s,
                "share": stall.share,
                "persistent_stall_s": stall.persistent_stall_s,
            },
        )
    ]


def _your_setting(c: _SweepRead) -> list[Finding]:
    """The user's own setting, when it was measured: with the job run, the job's comparison."""
    u = user_point(c.pts, c.meta)
    if c.decided and c.jv is not None:
        return job_findings(c.jv)
    if u is not None and c.rec is not None and u.ok and (d := c.rec.decision) is not None:
        return _user_findings(u, c.rec, d)
    return []


def _user_findings(u: LoaderRow, rec: LoaderRow, d: Any) -> list[Finding]:
    """The user's setting against the pick, by the rule: what the windows in turns showed, or could not."""
    x = d.versus_yours
    alone = "Measured without your training step: what that buys your job is not measured (STAGEBENCH_TRAINER=measure runs it)."
    if d.advice == "change" and x is not None:
        return [
            Finding(
                "medium",
                "Your setting leaves loader throughput on the table",
                f"In turns with yours, {_knob_text(rec)} ran {x.text('yours')}: faster beyond noise "
                f"({rec.samples_per_s:,.0f} against {u.samples_per_s:,.0f} samples/s over all their windows). " + alone,
                evidence={"yours": u.samples_per_s, "recommended": rec.samples_per_s, **x.to_json()},
            )
        ]
    if d.advice == "cheaper" and x is not None:
        saved = u.mem_pss_mb - rec.mem_pss_mb
        return [
            Finding(
                "low",
                "Your setting uses more resources than it needs",
                f"In turns with yours, {_knob_text(rec)} ran {x.text('yours')}: within 5%, with fewer resources"
                + (f" ({saved:,.0f} MB less memory)." if math.isfinite(saved) and saved > 0 else ".")
                + " "
                + alone,
                evidence={"yours": u.samples_per_s, "recommended": rec.samples_per_s, **x.to_json()},
            )
        ]
    if d.advice == "keep yours" and d.rival is not None:
        return [
            Finding(
                "info",
                f"Your setting is kept: the runs could not tell {d.rival} from it",
                _decision_words(d, {}, 1 - EQUIVALENT)[0].upper() + _decision_words(d, {}, 1 - EQUIVALENT)[1:] + ". "
                "Readings measured apart, or inside each other's intervals, are not evidence of a difference; "
                "more rounds in turns (LoaderSweepConfig.tie_rounds) would settle it.",
                evidence={"rival": d.rival, **(x.to_json() if x is not None else {})},
            )
        ]
    return []
