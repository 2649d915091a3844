"""The job runs' verdict: which setting makes the user's training job fast, at the least cost.

A pure function of ``run.json["job"]`` (written by :mod:`stagebench.core._jobrun`: the user's own
loop on the real loader or pipeline at each candidate setting, in turns) and ``run.json["trainer"]``
(the step alone on cached batches), so ``stagebench report`` rebuilds it from saved runs.

**Figures per candidate**, pooled over its slices: counted steps over their seconds, times the items
per step, with a 95% interval (on the log scale: it stays positive) from the rates of groups of
whole rounds of the workers, every group of every slice. The data-wait share is the part of each
step spent waiting for the batch; the step's own rate next to the loader (the loop body alone) says
whether the two slowed each other down on shared cores.

**The decision** is the one rule of :mod:`stagebench.model._evidence` on the ratio of each round's
slices (docs/method.md#rounds-in-turns). A setting other than the user's is advised only
where those ratios show it faster beyond noise, or cheaper and within 5% (their 95% interval above
0.95), and as good as the fastest; otherwise the user's setting is kept, and the verdict names the
setting the runs could not tell from it, the ratio's interval, and how many rounds more would
settle it. ``num_workers=0`` is no exception: it is advised only where the job, in turns, shows it
equivalent (loading then adds to every step: the DataLoader guide's T4).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stagebench._numbers import finite, num
from stagebench._settings import setting
from stagebench.model._evidence import (
    EQUIVALENT,
    MIN_ROUNDS,
    PRACTICAL_ROUNDS,
    Decision,
    Option,
    Ratio,
    decide,
    settling_bounds,
)
from stagebench.model._finding import Finding
from stagebench.model._job import JobCandidate, JobFigures, JobRecord, JobSlice, JobVerdict, StepAlone
from stagebench.model._meta import RunSettings
from stagebench.model._rate import Rate

__all__ = [
    "candidate_figures",
    "contenders",
    "futile",
    "decide_job",
    "job_decision",
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
    "near": "near the fastest alone (within 80% of it, or not told apart): the ranks' steps share the cores",
    "pinned": "the same with pinned memory",
}
#: The same, in a word or two (the terminal's table).
ORIGIN_SHORT = {
    "yours": "yours",
    "feeds": "feeds your step",
    "above": "a step above",
    "best": "fastest alone",
    "near": "near fastest alone",
    "pinned": "pinned",
}
#: A job running at this share of the step's own rate (or more) is set by the step: trainer-bound.
TRAINER_BOUND = 0.90
#: A pick's wait for data that the verdict shows as 1% or more: where another setting ran its loop waiting
#: far less, the verdict names it, whatever the bound (a trainer-bound pick that waits must not leave a
#: setting that did not wait unexplained).
SHOWN_WAIT = 0.005


def _usable(slice_: JobSlice, group: int) -> int:
    """Counted steps of a slice that form whole groups (all of them when there is less than one group)."""
    n = min(len(slice_.waits), len(slice_.bodies))
    return n - n % group if n >= group else n


def candidate_figures(job: JobRecord) -> dict[str, JobFigures | None]:
    """Per candidate key: its pooled job figures, or None where no slice measured it.

    ``round_rates`` maps each round to the rate of the candidate's slice in it (what the
    comparisons in turns pair up).
    """
    k = job.items_per_step
    out: dict[str, JobFigures | None] = {}
    for cand in job.candidates:
        key = cand.key
        group = cand.group_steps
        steps, seconds, waited, body = 0, 0.0, 0.0, 0.0
        groups: list[float] = []
        startups: list[float] = []
        by_round: dict[int, float] = {}
        used, failed = 0, []
        for s in job.slices:
            if s.candidate != key:
                continue
            if s.status == "failed":
                failed.append(str(s.reason or "failed"))
                continue
            n = _usable(s, group)
            if n < 2:
                continue
            w, b = [float(x) for x in s.waits[:n]], [float(x) for x in s.bodies[:n]]
            dur = [x + y for x, y in zip(w, b)]
            if sum(dur) <= 0:
                continue
            steps += n
            seconds += sum(dur)
            waited += sum(w)
            body += sum(b)
            groups += [group / sum(dur[j : j + group]) for j in range(0, n - group + 1, group)]
            by_round[s.round] = n / sum(dur) * k
            if s.startup_s is not None and finite(s.startup_s):
                startups.append(float(s.startup_s))
            used += 1
        if not steps:
            out[key] = JobFigures(failed=tuple(failed)) if failed else None
            continue
        rate = Rate.around(steps / seconds * k, [g * k for g in groups])
        out[key] = JobFigures(
            samples_per_s=rate.value,
            samples_per_s_low=rate.low,
            samples_per_s_high=rate.high,
            data_wait_share=waited / seconds,
            step_samples_per_s=steps / body * k if body > 0 else None,
            steps=steps,
            seconds=seconds,
            slices=used,
            groups=len(groups),
            startup_s=sum(startups) / len(startups) if startups else None,
            failed=tuple(failed),
            round_rates={str(r): v for r, v in sorted(by_round.items())},
        )
    return out


#: Per candidate key: its pooled job figures (None: no slice measured it).
Figures = Mapping[str, JobFigures | None]


def _measured(f: JobFigures | None) -> bool:
    """Whether ``f`` holds a rate (not only failures)."""
    return f is not None and f.samples_per_s is not None and finite(f.samples_per_s)


def _ratio_of(figs: Figures) -> Any:
    """``ratio(a, b)``: a's job rate over b's, round by round, over the rounds both ran in."""

    def rates(k: str) -> Mapping[str, float]:
        f = figs.get(k)  # a key not run has none
        return f.round_rates if f is not None else {}

    def ratio(a: str, b: str) -> Ratio | None:
        ra, rb = rates(a), rates(b)
        return Ratio.of_pairs([(ra[r], rb[r]) for r in ra if r in rb])

    return ratio


def job_decision(job: JobRecord) -> tuple[Decision, dict[str, JobFigures | None]]:
    """The rule applied to the job runs so far, and the figures it read."""
    figs = candidate_figures(job)
    options = [
        Option(c.key, c.cost, f.rate if (f := figs[c.key]) is not None else None, in_step=c.in_step)
        for c in job.candidates
    ]
    yours = next((c.key for c in job.candidates if "yours" in c.origin), None)
    return decide(options, yours=yours, ratio=_ratio_of(figs)), figs


def contenders(job: JobRecord) -> list[str]:
    """Candidates the decision still hinges on: what the next round runs (empty: settled).

    The settings whose comparison is open, with the settings they are compared with (yours, the
    fastest): a pair of windows needs both in the same round. Most important first (yours, the
    fastest, then the open ones, cheapest first): where the budget cannot fit them all, they run first.
    """
    d, figs = job_decision(job)
    return _contenders_of(d, job, figs)


def _contenders_of(d: Decision, rec: JobRecord, figs: Mapping[str, JobFigures | None]) -> list[str]:
    """:func:`contenders` of a decision already made (:func:`futile` reads them beside it)."""
    if d.advice == "none":
        return [c.key for c in rec.candidates if figs[c.key] is None]
    if d.settled:
        return []
    refs = [k for k in (d.yours, d.best) if k is not None and figs.get(k) is not None]
    return list(dict.fromkeys(refs + list(d.open)))


def futile(rec: JobRecord, seconds_left: float) -> str | None:
    """Why more rounds within ``seconds_left`` cannot settle the decision, or None (they may, or too few
    rounds ran to say: under :data:`MIN_ROUNDS` + 1 the spread is not known well enough).

    Each comparison still open needs its interval to clear one of the rule's bounds (0.95, 1, 1/0.95) on
    the side its ratio lies; at the spread seen, :meth:`Ratio.rounds_to_clear` says after how many rounds
    in all. Where even the nearest of those, for every open comparison, takes more rounds than the time
    left can run, the runs stop there and the verdict says could not tell, and what more would take:
    otherwise a slow step's job phase runs its whole budget on settings that tie."""
    d, figs = job_decision(rec)
    if d.settled or d.advice == "none":
        return None
    ratio = _ratio_of(figs)
    per = _seconds_per_round(rec, _contenders_of(d, rec, figs))
    if not per or per <= 0:
        return None
    fit = int(seconds_left // per)
    ref = d.yours if d.yours is not None else d.best
    cands = {c.key: c for c in rec.candidates}
    needs: list[int] = []
    for k in d.open:
        x = ratio(k, ref) if ref is not None else None
        if ref is None or x is None or x.log_sd is None or x.rounds < MIN_ROUNDS + 1:
            return None  # not enough rounds to say what more would do
        bounds = settling_bounds(cands[k], cands[ref], ref_is_yours=ref == d.yours)
        end = x.rounds_to_settle(bounds)
        more = end - x.rounds if end is not None else None
        if more is not None and more <= fit:
            return None
        needs.append(more if more is not None else -1)
    if not needs:
        return None
    known = [n for n in needs if n > 0]
    what = (
        f"about {min(known)} more rounds (~{min(known) * per:.0f} s) would settle the nearest of"
        if known and min(known) <= PRACTICAL_ROUNDS
        else "no practical number of rounds would settle"
    )
    return (
        f"the job runs stopped after {rec.rounds} rounds: at the spread seen, {what} the comparisons "
        f"still open, and {seconds_left:.0f} s of the budget were left (STAGEBENCH_JOB_S)"
    )


def _rate(f: JobFigures | None, unit: str) -> str:
    r = f.rate if f is not None else None
    return r.text(unit) if r is not None else "not run"


def _seconds_per_round(job: JobRecord, keys: list[str]) -> float | None:
    """Seconds one more round of ``keys`` would take, from their slices so far (opening included)."""
    walls: dict[str, list[float]] = {}
    for s in job.slices:
        walls.setdefault(str(s.candidate), []).append(s.wall_s)
    known = [sum(walls[k]) / len(walls[k]) for k in keys if walls.get(k)]
    return sum(known) if len(known) == len(keys) else None


def _could_not_tell(d: Decision, job: JobRecord, label: Mapping[str, str], figs: Figures) -> str:
    """The runs could not tell the rival from yours: the ratio, and what would settle it (``figs``: the figures
    ``d`` was decided on)."""
    if d.rival is None:
        return ""
    x = d.versus_yours
    ref = d.yours if d.yours is not None else d.best
    said = f"the runs could not tell {label[d.rival]} from {'yours' if ref == d.yours else label.get(ref or '', '')}"
    if x is None:
        return said + " (they never ran in the same round)"
    said += f": {x.text('yours' if ref == d.yours else 'it')}"
    cands = {c.key: c for c in job.candidates}
    whose = "yours" if ref == d.yours else "the fastest"
    bounds = (
        settling_bounds(cands[d.rival], cands[ref], ref_is_yours=ref == d.yours)
        if ref in cands and d.rival in cands
        else ()
    )
    bound = (
        f"more than {1 - EQUIVALENT:.0%} faster than {whose}"  # it loads in the training process: held to more
        if bounds == (1 / EQUIVALENT,)
        else f"within {1 - EQUIVALENT:.0%} of {whose}"
        if bounds == (EQUIVALENT,)
        else f"faster than {whose} beyond noise"
    )
    more = d.rounds_more(x.rounds)
    if more is not None:
        # a round as the runs would go on: every setting still in them, as the stop's words count it (futile)
        per = _seconds_per_round(job, _contenders_of(d, job, figs))
        said += (
            f"; about {more} more round{'s' if more != 1 else ''}"
            + (f" (~{more * per:.0f} s, STAGEBENCH_JOB_S)" if per else "")
            + f" would show whether it is {bound}, at the spread seen"
        )
    else:
        # the ratio sits on the margin, or the rounds spread too much: the two are as good as each other
        # for any run a user would make, and yours stays
        said += (
            f"; at the spread seen, it would take over {PRACTICAL_ROUNDS} more rounds to show whether it is {bound}: "
            "for your job the two are not told apart"
        )
    loads, cores = [x for x in job.load_avg if x is not None], job.cores
    if loads and cores:
        # what the host looked like: a load well beyond what the loop and its loader keep busy is someone else's
        said += f" (the host's 1-min load reached {max(loads):.1f} on {cores} cores during the runs, yours included)"
    return said


def decide_job(job: JobRecord | None, trainer: StepAlone | None, *, unit: str = "samples/s") -> JobVerdict | None:
    """The job's verdict (``summary.json["job"]``), or None where no job run was planned.

    ``status``: ``decided`` (the pick was run with the loop), ``not run`` (no candidate was: the
    callers fall back to the isolated pick). ``pick`` and ``best`` are candidate keys; ``advice``
    is ``keep yours``, ``cheaper`` (a cheaper setting shown within 5% of yours and of the best, in
    turns), ``change`` (faster than yours beyond noise, in turns) or ``use`` (no setting of yours to
    compare); ``decision`` is the rule's record (:class:`stagebench.model._evidence.Decision`):
    the ratio to yours, what stayed open and how many rounds would settle it; ``bound``:
    ``trainer-bound`` (the job runs at 90% of the step's own rate or more, or cannot be told from
    it), ``shared cores`` (the step itself ran slower next to the loader) or ``data-bound``.
    ``unproven`` lists the checks that did not run and what that leaves open.
    """
    if job is None or not job.candidates:
        return None
    demand = trainer.rate if trainer is not None else None
    d, figs = job_decision(job)
    ran = {k: f for k, f in figs.items() if f is not None and _measured(f)}
    label = {c.key: c.name for c in job.candidates}
    stopped = job.stopped
    unproven = _not_run(job, figs)
    # each candidate as run.json holds it, with its figures
    entries = _entries(job.candidates, figs, d.yours)
    base: dict[str, Any] = {
        "candidates": entries,
        "demand": demand.value if demand else None,
        "rounds": job.rounds,
        "seconds": job.seconds,
        "steps_handed": job.steps_handed,
        "stopped": stopped,
        "yours": d.yours,
        "unit": unit,
        "what": job.what,
        "decision": d.to_json(),
    }
    if not ran or d.pick is None:
        text = "inconclusive: no setting was run with your loop" + (f" ({stopped})" if stopped else "")
        return _verdict(
            {
                **base,
                "status": "not run",
                "pick": None,
                "best": None,
                "advice": None,
                "bound": None,
                "unproven": unproven,
                "text": text,
            }
        )
    for e in entries:
        e["as_good"] = e["key"] in d.as_good
    v = _Verdict(d, job, ran, label, unit, _ratio_of(figs))
    why = v.why()
    if d.advice == "use" and d.yours:
        unproven.append("your own setting was not run with your loop: the comparison with yours is not measured")
    bound, bound_text = _bound(v.p, demand, unit)
    if (v.p.slices or 0) < 2:
        unproven.append(
            f"{label[v.pick]} ran one slice with your loop: its interval does not cover a change of the machine "
            "between rounds"
        )
    text = v.headline() + f", {v.p.data_wait_share:.0%} of each step waiting for data; {bound_text}"
    if d.advice == "keep yours" and d.rival is not None:
        text += "; " + _could_not_tell(d, job, label, figs)
    if bound == "data-bound" or (v.p.data_wait_share or 0.0) >= SHOWN_WAIT:
        # whatever the bound, a verdict that says its pick waits names the settings that waited far less
        text += v.calmer(text)
    return _verdict(
        {
            **base,
            "status": "decided",
            "pick": v.pick,
            "best": d.best or v.pick,
            "as_good": list(d.as_good),
            "advice": d.advice,
            "why": why,
            "bound": bound,
            "samples_per_s": v.p.samples_per_s,
            "samples_per_s_low": v.p.samples_per_s_low,
            "samples_per_s_high": v.p.samples_per_s_high,
            "data_wait_share": v.p.data_wait_share,
            "unproven": unproven,
            "text": text,
        }
    )


def _verdict(d: dict[str, Any]) -> JobVerdict:
    """The verdict as the model reads it: the candidates' figures and the rule's record typed, the keys as
    set here (:meth:`JobVerdict.to_json` gives them back)."""
    verdict = JobVerdict.from_json(d)
    assert verdict is not None  # a verdict always holds its candidates
    return verdict


def _not_run(job: JobRecord, figs: Figures) -> list[str]:
    """The candidates that failed or did not run with the loop, and the ones skipped: what rests on the
    isolated sweep."""
    stopped = job.stopped
    out = []
    for c in job.candidates:
        f = figs[c.key]
        if f is not None and f.failed and not _measured(f):
            out.append(f"{c.label} failed with your loop: {f.failed[0]}")
        elif not _measured(f):
            why = ", ".join(ORIGIN_WORDS.get(o, o) for o in c.origin)
            out.append(
                f"{c.label} ({why}) was not run with your loop"
                + (f" ({stopped})" if stopped else "")
                + ": what it does to the job rests on the isolated sweep"
            )
    for skipped in job.skipped:
        out.append(f"{skipped.label} was not run with your loop: {skipped.why}")
    return out


def _entries(cands: tuple[JobCandidate, ...], figs: Figures, yours: str | None) -> list[dict[str, Any]]:
    """Each candidate as run.json holds it (every key), with its job figures (None where it did not run) and
    its ratio to yours in turns."""
    ratio = _ratio_of(figs)
    entries = []
    for c in cands:
        key = c.key
        f = figs[key]
        e = {**c.as_run(), "job": f.to_json() if f is not None and _measured(f) else None}
        if yours and key != yours and e["job"] is not None:
            x = ratio(key, yours)
            e["versus_yours"] = x.to_json() if x else None
        entries.append(e)
    return entries


@dataclass(frozen=True)
class _Verdict:
    """The words of a decided job verdict: the pick's figures beside yours, and the rule's record."""

    d: Decision
    job: JobRecord
    ran: dict[str, JobFigures]
    label: Mapping[str, str]
    unit: str
    #: ``ratio(a, b)``: a's job rate over b's in the rounds both ran (:func:`_ratio_of`)
    ratio: Any

    @property
    def pick(self) -> str:
        assert self.d.pick is not None  # decided: a pick was run
        return self.d.pick

    @property
    def p(self) -> JobFigures:
        return self.ran[self.pick]

    @property
    def y(self) -> JobFigures | None:
        return self.ran.get(self.d.yours) if self.d.yours else None

    @property
    def evidence(self) -> str:
        x = self.d.versus_yours
        return x.text("yours") if x is not None else ""

    def why(self) -> str:
        """Why the pick, in the rule's terms."""
        d, p, unit = self.d, self.p, self.unit
        if d.advice == "keep yours":
            nothing = (
                "of the settings run with your loop in turns, none was shown faster beyond noise, nor cheaper "
                f"and within {1 - EQUIVALENT:.0%}"
            )
            return f"your setting ran your job at {_rate(p, unit)}; " + (
                _could_not_tell(d, self.job, self.label, self.ran) or nothing
            )
        if d.advice == "cheaper":
            return (
                f"as fast in your job as yours within {1 - EQUIVALENT:.0%}, with fewer resources: {_rate(p, unit)}, "
                f"{self.evidence} (the whole interval above {EQUIVALENT:g})"
            )
        if d.advice == "change":
            return (
                f"your job ran {_rate(p, unit)} here against {_rate(self.y, unit)} at yours: {self.evidence}, "
                "faster beyond noise"
            )
        # against the fastest (the fastest other setting, where the pick is the fastest itself)
        others = [k for k in self.ran if k != self.pick]
        ref = (
            d.best
            if d.best not in (None, self.pick)
            else max(others, key=lambda k: self.ran[k].samples_per_s or 0.0, default=None)
        )
        x = self.ratio(self.pick, ref) if ref is not None else None
        versus = f", {x.text(self.label[ref])}" if x is not None and ref is not None else ""
        return f"the cheapest setting shown as fast as any in turns with your loop: {_rate(p, unit)}{versus}"

    def headline(self) -> str:
        """The verdict's first words: the advice, the pick, its rate and the evidence."""
        p, unit, name = self.p, self.unit, self.label[self.pick]
        steps = f"{p.steps} steps in {p.slices} slice{'s' if p.slices != 1 else ''}"
        return {
            "keep yours": f"keep yours ({name}): your job ran {_rate(p, unit)} over {steps}",
            "cheaper": f"use {name}: your job ran {_rate(p, unit)}, {self.evidence}: as fast within "
            f"{1 - EQUIVALENT:.0%}, with fewer resources",
            "change": f"use {name}: your job ran {_rate(p, unit)} against {_rate(self.y, unit)} with yours, "
            f"{self.evidence}: faster beyond noise",
            "use": f"use {name}: your job ran {_rate(p, unit)}",
        }[self.d.advice]

    def calmer(self, said: str) -> str:
        """Every measured setting whose loop waited far less than the pick's, and why it is not
        the pick: a verdict that says its own pick waits for data must not leave a calmer setting it ran
        unexplained. ``said``: the verdict so far (a setting it names already is not named again)."""
        out = ""
        for k, f in self.ran.items():
            if k == self.pick or not (f.data_wait_share or 0.0) < 0.5 * (self.p.data_wait_share or 0.0):
                continue
            name = "yours" if k == self.d.yours else self.label[k]
            # a setting the verdict named already is not named again; yours is (its ratio), but not its wait
            if (f"; {name} waited" if k == self.d.yours else name) in said + out:
                continue
            xk = self.ratio(k, self.pick)  # against the pick, in the rounds both ran
            shown = xk is not None and xk.low is not None and xk.low > 1
            out += f"; {name} waited {f.data_wait_share:.0%}, but " + (
                ("" if xk.wide else "ran ") + xk.text("the pick") + ("" if shown else ", not shown faster")
                if xk
                else "was not run in the same rounds"
            )
        return out


def alone_scope(what: str, trainer: StepAlone | None, settings: RunSettings, *, planned: bool) -> str | None:
    """``summary.json["scope"]``: one line saying the pick is for ``what`` (the loader, the pipeline) alone,
    and how to check the job; None where the training loop was measured, or is about to be (``planned``:
    the first table, printed before the loop runs, must not say it will not).

    Why it is said at all: the user's question is their training job, which shares the host's cores
    (and, on a GPU host, the copy to the device) with the loading; an isolated sweep cannot see that.
    """
    if trainer is not None:
        return _unmeasured_scope(what, trainer)
    if planned:
        return None

    def most(given: float | None, key: str) -> str:
        value = given or setting(key).default
        return f"at most {float(value):g} s" if value is not None else "150 of your steps, 60-300 s"

    return (
        f"the pick is for {what} alone: your training loop shares this host's cores (and, with a GPU, the copy "
        "to it) and was not run. To check your job, run your script under `stagebench diagnose --trainer` (or "
        f"with STAGEBENCH_TRAINER=measure): your loop on cached batches until its step is known "
        f"({most(settings.trainer_s, 'trainer_s')}), then on the real {what.removeprefix('the ')} at up to four settings in turns until "
        f"they are told apart ({most(settings.job_s, 'job_s')}); your setting is changed only where those runs show the change "
        "faster beyond noise, or cheaper and within 5%."
    )


def _unmeasured_scope(what: str, step: StepAlone) -> str | None:
    """The scope where the training loop was to be measured and its step was not (None where it was): the
    pick is then the isolated one, and a run asked for job advice says why it has none."""
    if finite(step.samples_per_s):
        return None
    why = step.unmeasured_why
    clock = (
        " (the diagnosis runs inside your loop's first next(): a loop that stops on a clock started before it "
        "counts the diagnosis's time)"
        if step.stopped_early
        else ""
    )
    return (
        f"the pick is for {what} alone: your training loop was to be run with it, but {why}{clock}; so your job "
        "was not checked"
    )


def job_findings(v: JobVerdict) -> list[Finding]:
    """The user's setting against the job runs' pick (what the training job itself did), and what was not checked.

    The same shape as the loader's and the pipeline's findings (``stage`` None)."""
    assert v.pick is not None  # decided: a pick was run
    cands = {c.key: c for c in v.candidates}
    pick, yours = cands[v.pick], cands.get(v.yours or "")
    x = v.decision.versus_yours if v.decision is not None else None
    out = []
    if v.advice in ("change", "cheaper") and yours is not None and yours.job is not None and x is not None:
        assert pick.job is not None  # the pick was run
        faster = v.advice == "change"
        out.append(
            Finding(
                "medium" if faster else "low",
                "Your setting slows your training job"
                if faster
                else "A cheaper setting runs your training job as fast",
                f"Run in turns with your loop: {pick.label} ran your job at {pick.job.samples_per_s:,.0f} "
                f"samples/s, yours ({yours.label}) at {yours.job.samples_per_s:,.0f}: {x.text('yours')}, "
                + ("faster beyond noise." if faster else f"within {1 - EQUIVALENT:.0%}, with fewer resources."),
                None,
                {
                    "yours": yours.job.samples_per_s,
                    "recommended": pick.job.samples_per_s,
                    **x.to_json(),
                },
            )
        )
    for text in v.unproven:
        out.append(Finding("info", "Not checked with your loop", text[0].upper() + text[1:] + ".", None, {}))
    return out


def _bound(p: JobFigures, demand: Rate | None, unit: str) -> tuple[str | None, str]:
    """What sets the job's pace at the pick, in words, decided with the noise of both rates.

    ``trainer-bound``: the job runs at 90% of the step alone or more, or its interval reaches that
    (nothing shows the job under its step); ``shared cores``: the step itself ran slower next to the
    loading, and the loop waited little; ``data-bound``: the loop waits for its batches.
    """
    if demand is None or not demand.value > 0:
        return None, "your step's own rate was not measured"
    job = p.rate
    assert job is not None  # a ran candidate has a rate
    ratio = job.value / demand.value
    share = f"{ratio:.0%}"
    if job.low is not None and job.high is not None:
        share += f" ({job.low / demand.value:.0%}-{job.high / demand.value:.0%})"
    alone = f"your step alone, {demand.text(unit)}"
    body = num(p.step_samples_per_s)
    overlap = demand.high is not None and job.low is not None and job.low <= demand.high
    if ratio > 1 / TRAINER_BOUND and not overlap:
        return (
            "trainer-bound",
            f"trainer-bound: the job ran at {share} of {alone}, faster than the step measured alone: the host's "
            "speed moved between the two measurements",
        )
    if ratio > 1 and overlap:  # a job cannot outrun its step: above it only within the noise of both
        return (
            "trainer-bound",
            f"trainer-bound: the job runs as fast as {alone}: the job's {job.text(unit)} reaches into the step's "
            "interval (a job cannot outrun its step; the two were measured at different moments)",
        )
    if ratio >= TRAINER_BOUND:
        return "trainer-bound", f"trainer-bound: the job runs at {share} of {alone}"
    if job.high is not None and job.high >= TRAINER_BOUND * demand.value and (p.data_wait_share or 0.0) < 0.1:
        return (
            "trainer-bound",
            f"trainer-bound within noise: the job runs at {share} of {alone}, and its loop waited "
            f"{p.data_wait_share:.0%} of each step for data",
        )
    if finite(body) and body < TRAINER_BOUND * demand.value and (p.data_wait_share or 0.0) < 0.5:
        return (
            "shared cores",
            f"shared cores: your step itself ran at {body / demand.value:.0%} of its rate alone next to the "
            f"loading (they share the cores, and a pipeline's threads the GIL): the job runs at {share} of {alone}",
        )
    return (
        "data-bound",
        f"data-bound: the job runs at {share} of {alone}; the loop waits for its batches",
    )


def trainer_summary(trainer: Mapping[str, Any] | None, v: JobVerdict | None) -> dict[str, Any] | None:
    """``summary.json["trainer"]``: the step alone, with ``with_pipeline`` the job at the pick (the key kept
    from before the job runs: your loop on the real loader at the recommended setting), from the job's verdict ``v``."""
    if not isinstance(trainer, Mapping):
        return None
    out = dict(trainer)
    pick = v.picked.job if v is not None and v.decided and v.picked is not None else None
    if pick is not None:  # decided: the pick was run
        out["with_pipeline"] = {k: getattr(pick, k) for k in ("steps", "seconds", "data_wait_share", "samples_per_s")}
    else:
        out.setdefault("with_pipeline", None)
    return out
