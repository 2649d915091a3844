"""The job runs' verdict: which setting makes the user's training job fast, at the least cost.

A pure function of ``run.json["job"]`` (written by :mod:`stagebench.core._jobrun`: the user's own
loop on the real loader or pipeline at each candidate setting, in turns) and ``run.json["trainer"]``
(the step alone on cached batches), so ``stagebench report`` rebuilds it from saved runs.

**Figures per candidate**, pooled over its slices: counted steps over their seconds, times the items
per step. Each slice's counted steps are cut to whole groups (rounds of the workers: a window that
ends inside a round counts part of a burst); the 95% Student-t interval comes from the groups'
rates, every group of every slice, so that a change of the machine between rounds widens it. The
data-wait share is the part of each step spent waiting for the batch; the step's own rate next to
the loader (the loop body alone) says whether the two slowed each other down on shared cores.

**The decision.** The best is the fastest job measured. A candidate is *as good* as the best when
their intervals overlap or it is within 5% of it (:data:`stagebench.core._paired.WITHIN_BEST`: no
change rests on a difference the runs cannot tell from noise). The pick is the cheapest candidate as
good as the best: fewest workers and threads, then the rest of its cost (memory). So the user's own
setting is kept when nothing cheaper is as good and nothing runs faster beyond noise; a cheaper one is
named when the job runs confirm it is as fast. When the loop stopped before a check ran, the verdict
says which, and what that leaves unproven; the callers then fall back to what was measured.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from stagebench._numbers import finite, fmt_q, num
from stagebench.core._paired import WITHIN_BEST

__all__ = [
    "candidate_figures",
    "contenders",
    "decide_job",
    "job_findings",
    "alone_scope",
    "ORIGIN_WORDS",
    "ORIGIN_SHORT",
    "TRAINER_BOUND",
]

#: Why a setting was run with the user's loop, in words.
ORIGIN_WORDS = {
    "yours": "your own setting",
    "feeds": "the cheapest that feeds your step, by the isolated sweep",
    "above": "a step above that",
    "best": "the fastest alone",
    "pinned": "the same with pinned memory",
}
#: The same, in a word or two (the terminal's table).
ORIGIN_SHORT = {
    "yours": "yours",
    "feeds": "feeds your step",
    "above": "a step above",
    "best": "fastest alone",
    "pinned": "pinned",
}
#: A job running at this share of the step's own rate (or more) is set by the step: trainer-bound.
TRAINER_BOUND = 0.90
_CLEARLY_BEHIND = 0.8  # without intervals: a candidate under this share of the best needs no second slice
_FAR_APART = 1.10  # point estimates this far apart inside each other's noise: measure the two again


def _usable(slice_: Mapping[str, Any], group: int) -> int:
    """Counted steps of a slice that form whole groups (all of them when there is less than one group)."""
    n = min(len(slice_.get("waits") or []), len(slice_.get("bodies") or []))
    return n - n % group if n >= group else n


def candidate_figures(job: Mapping[str, Any]) -> dict[str, dict[str, Any] | None]:
    """Per candidate key: its pooled job figures, or None where no slice measured it."""
    from stagebench.core._stats import interval_about

    k = float(job.get("items_per_step") or 1.0)
    out: dict[str, dict[str, Any] | None] = {}
    for cand in job.get("candidates") or []:
        key = cand["key"]
        group = int(cand.get("group_steps") or 1)
        steps, seconds, waited, body = 0, 0.0, 0.0, 0.0
        groups: list[float] = []
        startups: list[float] = []
        used, failed = 0, []
        for s in job.get("slices") or []:
            if s.get("candidate") != key:
                continue
            if s.get("status") == "failed":
                failed.append(str(s.get("reason") or "failed"))
                continue
            n = _usable(s, group)
            if n < 2:
                continue
            w, b = [float(x) for x in s["waits"][:n]], [float(x) for x in s["bodies"][:n]]
            dur = [x + y for x, y in zip(w, b)]
            if sum(dur) <= 0:
                continue
            steps += n
            seconds += sum(dur)
            waited += sum(w)
            body += sum(b)
            groups += [group / sum(dur[j : j + group]) for j in range(0, n - group + 1, group) if n >= group]
            if finite(s.get("startup_s")):
                startups.append(float(s["startup_s"]))
            used += 1
        if not steps:
            out[key] = {"failed": failed} if failed else None
            continue
        rate = steps / seconds * k
        lo, hi, _ = interval_about(rate, [g * k for g in groups], 0.95)
        out[key] = {
            "samples_per_s": rate,
            "samples_per_s_low": lo if math.isfinite(lo) else None,
            "samples_per_s_high": hi if math.isfinite(hi) else None,
            "data_wait_share": waited / seconds,
            "step_samples_per_s": steps / body * k if body > 0 else None,  # the loop body alone, next to the loader
            "steps": steps,
            "seconds": seconds,
            "slices": used,
            "groups": len(groups),
            "startup_s": sum(startups) / len(startups) if startups else None,
            "failed": failed,
        }
    return out


def _ran(figs: Mapping[str, dict[str, Any] | None]) -> dict[str, dict[str, Any]]:
    return {k: f for k, f in figs.items() if f and finite(f.get("samples_per_s"))}


def _as_good(f: Mapping[str, Any], best: Mapping[str, Any]) -> bool:
    """Within noise of the best: intervals overlap, or within 5% of it."""
    if f["samples_per_s"] >= WITHIN_BEST * best["samples_per_s"]:
        return True
    lo, hi = num(f.get("samples_per_s_low")), num(f.get("samples_per_s_high"))
    blo, bhi = num(best.get("samples_per_s_low")), num(best.get("samples_per_s_high"))
    return finite(lo, hi, blo, bhi) and lo <= bhi and blo <= hi


def _pick(job: Mapping[str, Any], ran: dict[str, dict[str, Any]]) -> tuple[str, str, list[str]]:
    """(best, pick, keys as good as the best)."""
    cost = {c["key"]: tuple(c.get("cost") or ()) for c in job.get("candidates") or []}
    order = {c["key"]: i for i, c in enumerate(job.get("candidates") or [])}
    best = max(ran, key=lambda k: ran[k]["samples_per_s"])
    good = [k for k in ran if _as_good(ran[k], ran[best])]
    pick = min(good, key=lambda k: (cost.get(k, ()), order.get(k, 0)))
    return best, pick, good


def contenders(job: Mapping[str, Any]) -> list[str]:
    """Candidates the decision still hinges on: what the next round runs (empty: settled).

    A candidate with one slice gets a second unless it is clearly behind the best (its interval
    under the best's, or under 80% of it without intervals); a candidate that never ran gets a
    chance; and where the pick and the best read more than 10% apart inside each other's noise,
    both run again, until they separate or the rounds run out. Most important first (the pick,
    yours, the best): where the budget cannot fit them all, they run first.
    """
    figs = candidate_figures(job)
    ran = _ran(figs)
    never = [k for k, f in figs.items() if f is None]
    if not ran:
        return never
    best, pick, _ = _pick(job, ran)
    b = ran[best]
    out = list(never)
    for key, f in ran.items():
        hi, blo = num(f.get("samples_per_s_high")), num(b.get("samples_per_s_low"))
        behind = (hi < blo) if finite(hi, blo) else f["samples_per_s"] < _CLEARLY_BEHIND * b["samples_per_s"]
        if f["slices"] < 2 and not behind:
            out.append(key)
    if pick != best and b["samples_per_s"] > _FAR_APART * ran[pick]["samples_per_s"]:
        out += [pick, best]
    # most important first: the pick, yours, the best, then the others in the candidates' order
    yours = next((c["key"] for c in job.get("candidates") or [] if "yours" in (c.get("origin") or [])), None)
    first = [k for k in (pick, yours, best) if k in out]
    return list(dict.fromkeys(first + out))


def _bare(f: Mapping[str, Any]) -> str:
    """A job figure without its unit, with its interval: ``252, 214-291``."""
    lo, hi = num(f.get("samples_per_s_low")), num(f.get("samples_per_s_high"))
    return fmt_q(f["samples_per_s"]) + (f", {fmt_q(lo)}-{fmt_q(hi)}" if finite(lo, hi) else "")


def _rate(f: Mapping[str, Any] | None, unit: str) -> str:
    if not f:
        return "not run"
    lo, hi = num(f.get("samples_per_s_low")), num(f.get("samples_per_s_high"))
    ci = f" ({fmt_q(lo)}-{fmt_q(hi)})" if finite(lo, hi) else " (no interval: one group)"
    return f"{fmt_q(f['samples_per_s'])} {unit}{ci}"


def decide_job(
    job: Mapping[str, Any] | None, trainer: Mapping[str, Any] | None, *, unit: str = "samples/s"
) -> dict[str, Any] | None:
    """The job's verdict for ``summary.json["job"]``, or None where no job run was planned.

    ``status``: ``decided`` (the pick was run with the loop), ``not run`` (no candidate was: the
    callers fall back to the isolated pick). ``pick`` and ``best`` are candidate keys; ``advice``
    is ``keep yours``, ``cheaper`` (a cheaper setting the runs found as fast as yours), ``change``
    (faster than yours beyond noise) or ``use`` (no setting of yours to compare); ``bound``:
    ``trainer-bound`` (the job runs at 90% of the step's own rate or more), ``shared cores`` (the
    step itself ran slower next to the loader) or ``data-bound``. ``unproven`` lists the checks
    that did not run and what that leaves open.
    """
    if not isinstance(job, Mapping) or not job.get("candidates"):
        return None
    trainer = trainer or {}
    demand = trainer.get("samples_per_s") if finite(trainer.get("samples_per_s")) else None
    figs = candidate_figures(job)
    ran = _ran(figs)
    cands = list(job.get("candidates") or [])
    yours = next((c["key"] for c in cands if "yours" in (c.get("origin") or [])), None)
    label = {c["key"]: c.get("label") or c["key"] for c in cands}
    stopped = job.get("stopped")
    unproven = []
    for c in cands:
        f = figs.get(c["key"])
        if f and f.get("failed") and not finite(f.get("samples_per_s")):
            unproven.append(f"{c['label']} failed with your loop: {f['failed'][0]}")
        elif not (f and finite(f.get("samples_per_s"))):
            why = ", ".join(ORIGIN_WORDS.get(o, o) for o in c.get("origin") or [])
            unproven.append(
                f"{c['label']} ({why}) was not run with your loop"
                + (f" ({stopped})" if stopped else "")
                + ": what it does to the job rests on the isolated sweep"
            )
    entries = []
    for c in cands:
        f = figs.get(c["key"])
        entries.append({**c, "job": f if f and finite(f.get("samples_per_s")) else None})
    base: dict[str, Any] = {
        "candidates": entries,
        "demand": demand,
        "rounds": job.get("rounds"),
        "seconds": job.get("seconds"),
        "steps_handed": job.get("steps_handed"),
        "stopped": stopped,
        "yours": yours,
        "unit": unit,
        "what": job.get("what"),
    }
    if not ran:
        text = "inconclusive: no setting was run with your loop" + (f" ({stopped})" if stopped else "")
        return {
            **base,
            "status": "not run",
            "pick": None,
            "best": None,
            "advice": None,
            "bound": None,
            "unproven": unproven,
            "text": text,
        }
    best, pick, good = _pick(job, ran)
    for e in entries:
        e["as_good"] = e["key"] in good
    p, b = ran[pick], ran[best]
    y = ran.get(yours) if yours else None
    if yours and pick == yours:
        advice = "keep yours"
        why = (
            f"your setting ran your job at {_rate(p, unit)}; of the settings run with your loop, none was faster "
            "beyond noise"
            + (f" (the fastest read {fmt_q(b['samples_per_s'])} at {label[best]})" if best != pick else "")
            + " and none cheaper was as fast"
        )
    elif y is not None and yours in good:
        advice = "cheaper"
        why = (
            f"as fast in your job as yours, with fewer resources: {_rate(p, unit)} against "
            f"{_rate(y, unit)} at yours (within noise), run in turns with your loop"
        )
    elif y is not None:
        advice = "change"
        why = (
            f"your job ran {_rate(p, unit)} here against {_rate(y, unit)} at yours "
            f"({p['samples_per_s'] / y['samples_per_s']:.2f}x, beyond noise), in turns with your loop"
        )
    else:
        advice = "use"
        why = f"the cheapest setting that ran your job as fast as any: {_rate(p, unit)}"
        if yours:
            unproven.append("your own setting was not run with your loop: the comparison with yours is not measured")
    bound, bound_text = _bound(p, demand, unit)
    if p["slices"] < 2:
        unproven.append(
            f"{label[pick]} ran one slice with your loop: its interval does not cover a change of the machine "
            "between rounds"
        )
    text = {
        "keep yours": f"keep yours ({label[pick]}): your job ran {_rate(p, unit)}",
        # yours with its interval: "as fast as with yours (252)" beside 294 reads as a contradiction without it
        "cheaper": f"{label[pick]}: your job ran {_rate(p, unit)}, as fast as with yours within noise ({_bare(y)})"
        if y
        else "",
        "change": f"use {label[pick]}: your job ran {_rate(p, unit)}"
        + (f" against {fmt_q(y['samples_per_s'])} with yours" if y else ""),
        "use": f"use {label[pick]}: your job ran {_rate(p, unit)}",
    }[advice]
    text += f", {p['data_wait_share']:.0%} of each step waiting for data; {bound_text}"
    return {
        **base,
        "status": "decided",
        "pick": pick,
        "best": best,
        "as_good": good,
        "advice": advice,
        "why": why,
        "bound": bound,
        "samples_per_s": p["samples_per_s"],
        "samples_per_s_low": p.get("samples_per_s_low"),
        "samples_per_s_high": p.get("samples_per_s_high"),
        "data_wait_share": p["data_wait_share"],
        "unproven": unproven,
        "text": text,
    }


def alone_scope(
    what: str, trainer: Mapping[str, Any] | None, settings: Mapping[str, Any], *, planned: bool
) -> str | None:
    """``summary.json["scope"]``: one line saying the pick is for ``what`` (the loader, the pipeline) alone,
    and how to check the job; None where the training loop was measured, or is about to be (``planned``:
    the first table, printed before the loop runs, must not say it will not).

    Why it is said at all: the user's question is their training job, which shares the host's cores
    (and, on a GPU host, the copy to the device) with the loading; an isolated sweep cannot see that.
    """
    if isinstance(trainer, Mapping) or planned:
        return None
    from stagebench._settings import setting

    def most(key: str) -> str:
        return f"{float(settings.get(key) or setting(key).default):g} s"

    return (
        f"the pick is for {what} alone: your training loop shares this host's cores (and, with a GPU, the copy "
        "to it) and was not run. To check your job, run your script under `stagebench diagnose --trainer` (or "
        f"with STAGEBENCH_TRAINER=measure): your loop on cached batches until its step is known (at most "
        f"{most('trainer_s')}), then on the real {what.removeprefix('the ')} at up to four settings in turns (at "
        f"most {most('job_s')}); the advice is then the cheapest setting that runs your job as fast as any."
    )


def job_findings(job: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The user's setting against the job runs' pick (what the training job itself did), and what was not checked.

    The same shape as the loader's and the pipeline's findings (``stage`` None)."""
    cands = {c["key"]: c for c in job["candidates"]}
    pick, yours = cands[job["pick"]], cands.get(job.get("yours") or "")
    out = []
    if job["advice"] == "change" and yours is not None and yours.get("job"):
        out.append(
            _jf(
                "medium",
                "Your setting slows your training job",
                f"Run in turns with your loop: {pick['label']} ran your job at {pick['job']['samples_per_s']:,.0f} "
                f"samples/s, yours ({yours['label']}) at {yours['job']['samples_per_s']:,.0f}, beyond noise.",
                {"yours": yours["job"]["samples_per_s"], "recommended": pick["job"]["samples_per_s"]},
            )
        )
    elif job["advice"] == "cheaper" and yours is not None and yours.get("job"):
        out.append(
            _jf(
                "low",
                "A cheaper setting runs your training job as fast",
                f"Run in turns with your loop: {pick['label']} ran your job at {pick['job']['samples_per_s']:,.0f} "
                f"samples/s, yours ({yours['label']}) at {yours['job']['samples_per_s']:,.0f}: within noise, "
                "with fewer resources.",
                {"yours": yours["job"]["samples_per_s"], "recommended": pick["job"]["samples_per_s"]},
            )
        )
    for text in job.get("unproven") or []:
        out.append(_jf("info", "Not checked with your loop", text[0].upper() + text[1:] + ".", {}))
    return out


def _jf(severity: str, title: str, detail: str, evidence: dict[str, Any]) -> dict[str, Any]:
    return {"severity": severity, "title": title, "detail": detail, "stage": None, "evidence": evidence}


def _bound(p: Mapping[str, Any], demand: float | None, unit: str) -> tuple[str | None, str]:
    """What sets the job's pace at the pick, in words."""
    if demand is None or not demand > 0:
        return None, "your step's own rate was not measured"
    ratio = p["samples_per_s"] / demand
    body = num(p.get("step_samples_per_s"))
    if ratio >= TRAINER_BOUND:
        return (
            "trainer-bound",
            f"trainer-bound: the job runs at {ratio:.0%} of your step alone ({fmt_q(demand)} {unit})",
        )
    if finite(body) and body < TRAINER_BOUND * demand and p["data_wait_share"] < 0.5:
        return (
            "shared cores",
            f"shared cores: your step itself ran at {body / demand:.0%} of its rate alone next to the loading "
            f"(they share the cores, and a pipeline's threads the GIL): the job runs at {ratio:.0%} of your step "
            f"alone ({fmt_q(demand)} {unit})",
        )
    return (
        "data-bound",
        f"data-bound: the job runs at {ratio:.0%} of your step alone ({fmt_q(demand)} {unit}); the loop waits "
        "for its batches",
    )


def trainer_summary(trainer: Mapping[str, Any] | None, job: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``summary.json["trainer"]``: the step alone, with ``with_pipeline`` the job at the pick (the key kept
    from before the job runs: your loop on the real loader at the recommended setting)."""
    if not isinstance(trainer, Mapping):
        return None
    out = dict(trainer)
    if job is not None and job.get("status") == "decided":
        pick = next(c for c in job["candidates"] if c["key"] == job["pick"])["job"]
        out["with_pipeline"] = {
            "steps": pick["steps"],
            "seconds": pick["seconds"],
            "data_wait_share": pick["data_wait_share"],
            "samples_per_s": pick["samples_per_s"],
        }
    else:
        out.setdefault("with_pipeline", None)
    return out
