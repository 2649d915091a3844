"""The pipeline's verdicts in words: what binds it, whether it keeps up with the step, your settings against
the recommended ones (by the rule of :mod:`stagebench.model._evidence`), and the CPU's speed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from stagebench._numbers import finite, fmt_ms_each, fmt_q, num
from stagebench._settings import DEMAND_HEADROOM, WHOLE_RUN_ROUNDS
from stagebench.analysis._pipeline_job import settings_cost
from stagebench.model._evidence import EQUIVALENT, Option, Ratio, decide, look_confidence, more_rounds_text
from stagebench.model._job import JobVerdict, StepAlone
from stagebench.model._meta import CpuReadings
from stagebench.model._pipeline import CpuSpeed, Demand, Prediction, VersusYours, WholeRun
from stagebench.model._rate import Rate
from stagebench.model._stage import StageEntry, StageSetting, changed, keyed

__all__ = [
    "pipeline_verdict",
    "demand_verdict",
    "versus_yours_decision",
    "yours_verdict",
    "cpu_speed",
    "speed_warnings",
    "FAR_UNDER_BOUNDS",
    "SCHEDULING_BINDS",
]

#: The level of the recommended-against-yours ratio: fitted to the looks its rounds can take
_LEVEL = look_confidence(WHOLE_RUN_ROUNDS)


def demand_verdict(
    target: Any,
    validation: WholeRun | None,
    prediction: Prediction | None,
    trainer: StepAlone | None = None,
    job: JobVerdict | None = None,
) -> Demand | None:
    """Whether the pipeline keeps up with the training step's demand, and what the job did (a :class:`Demand`;
    None where no demand is stated or measured).

    Where the job ran with the user's loop (``job``, decided: :mod:`stagebench.analysis._job`), the
    verdict is the job's: ``trainer-bound``, ``shared cores`` or ``data-bound``, with the job's
    measured throughput and data wait. Otherwise it compares the pipeline alone with the demand,
    and says that the job itself was not run.

    The demand: ``STAGEBENCH_TARGET_RATE`` when set, else the training loop's own rate on
    cached batches (``trainer``, ``STAGEBENCH_TRAINER=measure``:
    :mod:`stagebench.pipeline._trainer`), whose data-wait share on the real pipeline
    is quoted too.

    The capacity is the measured whole pipeline at the recommended settings when there is one,
    else the replay (labelled so); with neither, the verdict is ``inconclusive``: a bound alone
    is not advice. ``trainer-bound``: capacity >= demand x 1.1 (the loader waits for the
    trainer); ``balanced``: within 10% above the demand; ``data-bound``: below it.
    """
    step = trainer or StepAlone()
    measured = not (finite(target) and float(target) > 0) and finite(step.samples_per_s)
    if measured:
        target = step.samples_per_s
    if not finite(target) or not float(target) > 0:
        return None
    need = float(target)
    whose = (
        f"your training step, measured: {fmt_q(need)} items/s"
        + (
            f" ({fmt_q(num(step.samples_per_s_low))}-{fmt_q(num(step.samples_per_s_high))})"
            if finite(step.samples_per_s_low) and finite(step.samples_per_s_high)
            else ""
        )
        if measured
        else f"the {fmt_q(need)} items/s the trainer needs"
    )
    wp = step.with_pipeline
    waited = (
        f"; run together, your loop waited for data {wp.data_wait_share:.0%} of each step"
        if measured and wp is not None and finite(wp.data_wait_share)
        else ""
    )
    val = validation or WholeRun()
    pred = prediction or Prediction()
    if finite(val.qps):
        capacity, low, high, source = val.qps, val.qps_low, val.qps_high, "measured"
    elif pred.method == "replay" and finite(pred.qps):
        capacity, low, high, source = pred.qps, pred.qps_low, pred.qps_high, "replayed"
    else:
        return Demand(
            target_rate=need,
            verdict="inconclusive",
            demand_source="measured" if measured else "stated",
            text=f"inconclusive: the whole pipeline was neither run nor replayed, so its capacity against "
            f"{whose} is not known{waited}",
        )
    capacity = num(capacity)  # finite above
    ratio = capacity / need
    base = Demand(
        target_rate=need,
        capacity=capacity,
        capacity_low=low,
        capacity_high=high,
        source=source,
        ratio=ratio,
        demand_source="measured" if measured else "stated",
    )
    if job is not None and job.decided and job.bound:
        return replace(
            base,
            verdict=job.bound,
            data_wait_share=job.data_wait_share,
            job_samples_per_s=job.samples_per_s,
            text=f"{job.bound}: your job ran {fmt_q(num(job.samples_per_s))} items/s at the recommended "
            f"settings, {job.data_wait_share:.0%} of each step waiting for data, against {whose}; the "
            f"pipeline alone gave {fmt_q(capacity)} items/s ({source}) at the isolated sweep's pick",
        )
    if ratio >= 1 + DEMAND_HEADROOM:
        verdict, text = "trainer-bound", "alone keeps up with the trainer"
    elif ratio >= 1:
        verdict, text = "balanced", f"alone keeps up, with less than {DEMAND_HEADROOM:.0%} headroom"
    else:
        verdict, text = "data-bound", "cannot keep up even alone: the trainer will wait for data"
    not_run = (
        ""
        if verdict == "data-bound"
        else "; the job itself was not run with your loop, so what it reaches is not measured"
        + ("" if measured else " (STAGEBENCH_TRAINER=measure runs it)")
    )
    return replace(
        base,
        verdict=verdict,
        data_wait_share=wp.data_wait_share if measured and wp is not None else None,
        text=f"{verdict}: the pipeline {text} ({fmt_q(capacity)} items/s {source} at the recommended "
        f"settings against {whose}, {ratio:.2f}x){waited}{not_run}",
    )


def versus_yours_decision(
    recommended_rates: list[float],
    your_rates: list[float],
    recommended: Mapping[str, tuple[str, int]],
    yours: Mapping[str, tuple[str, int]],
    rates: tuple[Any, Any] | None = None,
) -> Any:
    """The rule (:mod:`stagebench.model._evidence`) on the recommended settings against yours, from their
    whole-pipeline windows in turns (the i-th window of one beside the i-th of the other); None where
    either has no window. ``rates``: their pooled rates, where known (else the windows' mean)."""
    if not recommended_rates or not your_rates:
        return None
    pooled = rates or (
        Rate(sum(recommended_rates) / len(recommended_rates)),
        Rate(sum(your_rates) / len(your_rates)),
    )
    full_yours = {**recommended, **yours}
    pairs = list(zip(recommended_rates, your_rates))

    def ratio(a: str, b: str) -> Ratio | None:
        return Ratio.of_pairs(pairs if a == "recommended" else [(y, x) for x, y in pairs], confidence=_LEVEL)

    options = [
        Option("recommended", settings_cost(recommended), pooled[0]),
        Option("yours", settings_cost(full_yours), pooled[1]),
    ]
    return decide(options, yours="yours", ratio=ratio)


def yours_verdict(
    yours: WholeRun | None, validation: WholeRun | None, stages: Sequence[StageEntry]
) -> VersusYours | None:
    """The recommended settings against the user's own, both run for real in turns (``run.json["yours"]``),
    by the rule of :mod:`stagebench.model._evidence` on their windows' ratio.

    ``recommended``: faster than yours beyond noise; ``cheaper``: fewer worker processes, else fewer
    workers and threads (:func:`settings_cost`), and within 5% of yours, shown; ``yours``: yours faster
    beyond noise (keep them); ``could not tell``: the windows in turns could not tell them apart, so yours are kept (the ratio's interval, and how many rounds
    would settle it); ``same``: the user's settings are the recommended ones; ``inconclusive``: one
    of the two runs has no number; ``not run``: neither was run (quick mode,
    ``STAGEBENCH_VALIDATE=off``). ``changes`` lists each stage whose setting differs (its name, the
    user's and the recommended setting); ``decision`` is the rule's record.
    """
    if yours is None:
        return None
    if yours.same:
        return keyed(VersusYours, verdict="same", changes=(), text="your settings are the recommended ones")
    changes = []
    recommended: dict[str, tuple[str, int]] = {}
    mine: dict[str, tuple[str, int]] = {}
    for st in stages:
        point, choice = st.recommended or StageSetting(), st.user_choice
        own = f"{choice[0]} x {choice[1]}" if choice else ""
        if point.executor and finite(point.concurrency) and (st.type or "pipe") == "pipe":
            recommended[str(st.name)] = (str(point.executor), int(point.concurrency or 0))
        if choice is not None:
            mine[str(st.name)] = choice
        if own and point.executor and own != f"{point.executor} x {point.concurrency}":
            changes.append({"stage": st.name, "yours": own, "recommended": f"{point.executor} x {point.concurrency}"})
    out = keyed(
        VersusYours,
        qps=yours.qps,
        qps_low=yours.qps_low,
        qps_high=yours.qps_high,
        settings=yours.settings,
        changes=tuple(changes),
    )
    val = validation or WholeRun()
    if yours.not_run:
        return changed(
            out,
            verdict="not run",
            text=f"not checked against your settings ({yours.not_run}): keep yours until a full diagnosis "
            "runs both in turns",
        )
    if not finite(yours.qps) or not finite(val.qps):
        which = "your settings" if not finite(yours.qps) else "the recommended settings"
        err = yours.error if not finite(yours.qps) else val.error
        return changed(
            out,
            verdict="inconclusive",
            text=f"inconclusive: the run at {which} gave no number" + (f" ({err})" if err else ""),
        )
    r_rate, m_rate = val.rate, yours.rate
    assert r_rate is not None and m_rate is not None  # both finite above
    figures = f"{r_rate.text('items/s')} with the recommended settings, {m_rate.text()} with yours"
    rec_w, your_w = list(val.window_rates), list(yours.window_rates)
    d = versus_yours_decision(rec_w, your_w, recommended, mine, (r_rate, m_rate))
    full_yours = {**recommended, **mine}  # a stage without a setting of yours runs as recommended
    x = Ratio.of_pairs(list(zip(rec_w, your_w)), confidence=_LEVEL)  # the recommended over yours, round by round
    if d is None or x is None:  # saved before the windows were kept: no ratio in turns to decide on
        return changed(
            out,
            verdict="could not tell",
            ratio=r_rate.value / m_rate.value if m_rate.value > 0 else None,
            text=f"keep yours: the runs kept no windows in turns to compare them by; {figures}",
        )
    if d.advice == "change":
        verdict, text = "recommended", f"the recommended settings are faster beyond noise, {x.text('yours')}: {figures}"
    elif d.advice == "cheaper":
        verdict, text = (
            "cheaper",
            f"the recommended settings are as fast within {1 - EQUIVALENT:.0%} with "
            f"{_cost_words(recommended, full_yours, 'fewer')}, {x.text('yours')}: {figures}",
        )
    elif x.below(1.0):
        verdict, text = (
            "yours",
            f"your settings are faster beyond noise: keep them; the recommended ran {x.text('yours')}: {figures}",
        )
    elif d.settled:  # yours the fastest, the recommended costlier: nothing it could gain once the rounds say so
        verdict, text = (
            "yours",
            f"keep yours: the recommended settings use {_cost_words(recommended, full_yours, 'more')} and "
            f"were not shown faster, {x.text('yours')}: {figures}",
        )
    else:
        # what the rounds cost: the whole runs in turns (one call, its seconds recorded with each run)
        spent = max((w for w in (val.wall_s, yours.wall_s) if w is not None and finite(w)), default=0.0)
        n_more = d.rounds_more(x.rounds)
        within = f" within {spent:.0f} s" if spent > 0 else ""
        if n_more is not None and spent > 0:
            more = (
                f"; about {n_more} more round{'s' if n_more != 1 else ''} in turns (~{n_more * spent / x.rounds:.0f} s)"
                " would settle it at the spread seen"
            )
        else:
            more = f"; {more_rounds_text(n_more)}"
        verdict, text = (
            "could not tell",
            f"keep yours: the runs could not tell the recommended settings from yours{within}, {x.text('yours')}"
            f"{more}; {figures}",
        )
    return changed(out, verdict=verdict, ratio=x.value, ratio_low=x.low, ratio_high=x.high, decision=d, text=text)


def _cost_words(recommended: Mapping[str, tuple[str, int]], yours: Mapping[str, tuple[str, int]], word: str) -> str:
    """Where the recommended settings' cost and yours part, in the order :func:`settings_cost` compares
    them (worker processes, else workers and threads), after ``word`` ("fewer", "more"): "fewer worker
    processes (2 against 8 of yours)"."""
    (pr, tr), (py, ty) = settings_cost(recommended), settings_cost(yours)
    what, r, y = ("worker processes", pr, py) if pr != py else ("workers and threads", tr, ty)
    return f"{word} {what} ({r:g} against {y:g} of yours)"


# ------------------------------------------------------------------ the CPU's speed
_SPEED_SPREAD = 1.25  # sweep probes further apart than this: warn
_SPEED_SHIFT = 0.10  # validation this far from the sweeps' median: say so


def cpu_speed(readings: CpuReadings | None) -> CpuSpeed | None:
    """The core's speed during the sweeps and the validation run, from what the diagnosis read (None: none);
    None where no sweep probe was kept."""
    if readings is None:
        return None
    sweep = [float(x) for x in readings.sweep_ns or () if finite(x) and float(x) > 0]
    val = [float(x) for x in readings.validation_ns or () if finite(x) and float(x) > 0]
    if not sweep:
        return None
    return CpuSpeed(
        sweep_ns_median=float(np.median(sweep)),
        sweep_ns_min=min(sweep),
        sweep_ns_max=max(sweep),
        sweep_spread=max(sweep) / min(sweep),
        probes=len(sweep),
        validation_ns=float(np.mean(val)) if val else None,
        validation_ns_probes=tuple(val),
    )


def speed_warnings(speed: CpuSpeed | None) -> list[str]:
    """What the CPU's ``speed`` (None: not probed) says of the figures: their spread during the sweeps, and
    a change around the validation run. Returns the warnings, none where it held still."""
    if speed is None:
        return []
    out = []
    if speed.sweep_spread > _SPEED_SPREAD:
        out.append(
            f"the CPU's speed changed during the sweeps: a fixed Python loop took {speed.sweep_ns_min:.0f}-"
            f"{speed.sweep_ns_max:.0f} ns per iteration ({speed.sweep_spread:.1f}x; a shared host's other "
            "tenants do this): CPU-bound points measured at different moments can differ by that much"
        )
    v, m = speed.validation_ns, speed.sweep_ns_median
    if v is not None and finite(v) and abs(m / v - 1) > _SPEED_SHIFT:
        # only said, not corrected: the speed flips within the validation window itself
        out.append(
            f"the CPU ran at another speed around the validation run than during the sweeps ({v:.0f} vs a "
            f"median {m:.0f} ns per loop): the measured pipeline and the prediction compare different moments"
        )
    return out


#: A pipeline that runs this many times under the lowest bound of its measured stages is bound by none of them.
FAR_UNDER_BOUNDS = 1.5
#: Over this share of the GIL an item needs being the pipeline's own scheduling, the scheduling is what binds.
SCHEDULING_BINDS = 0.5


def pipeline_verdict(
    stages: Sequence[StageEntry],
    prediction: Prediction | None,
    validation: WholeRun | None = None,
    not_isolated: Sequence[Mapping[str, Any]] | None = None,
) -> str:
    """What binds the pipeline, in one line: what binds the *measured* pipeline where it was run.

    Where the pipeline (measured, else replayed) runs well under every bound its measured stages
    set (:data:`FAR_UNDER_BOUNDS`), none of them binds it: the line names the parts that could not
    run alone, or the pipeline's own scheduling; where the GIL binds and most of what it holds per
    item is the pipeline's own scheduling, that is named rather than the stage holding the most.
    """
    ok = [s for s in stages if s.status == "ok"]
    if not ok:
        return "no stage could be measured: see the stage reasons and warnings"
    failed = [s.name for s in stages if s.status != "ok"]
    pred = prediction or Prediction()
    if prediction is None or not finite(pred.qps):
        return "no prediction could be made: see the stage reasons"
    name = pred.bottleneck
    st = next((s for s in ok if s.name == name), None)
    cls = st.classification if st else "unknown"
    q = fmt_q(num(pred.qps))
    val = validation or WholeRun()
    runs, how = (num(val.qps), "measured") if finite(val.qps) else (num(pred.qps), "predicted")
    lowest = num(pred.bounds_qps)
    sched = num(pred.scheduling_gil_s_per_item)
    gil_bound = num(pred.bounds.get("gil"))
    if finite(runs, lowest) and lowest > FAR_UNDER_BOUNDS * runs:
        parts = [str(x.get("name")) for x in not_isolated or []]
        what = (
            f"the parts that could not run alone bind ({', '.join(parts)}: under not isolated)"
            if parts
            else "the stages together bind (the pipeline's scheduling: hand-offs, and the cores and GIL they share)"
        )
        line = (
            f"{what}: the pipeline runs at {fmt_q(runs)} items/s ({how}), {lowest / runs:.1f}x under "
            f"the lowest bound of its measured stages ({pred.binding}, {fmt_q(lowest)} items/s)"
        )
    elif pred.binding == "gil" and finite(sched, gil_bound) and sched > SCHEDULING_BINDS / gil_bound:
        by_pipeline, per_item = fmt_ms_each(sched, 1.0 / gil_bound)
        line = (
            f"the GIL binds, held mostly by the pipeline's own scheduling ({by_pipeline} of the "
            f"{per_item} each item needs): predicted {q} items/s; of the stages, {name} holds it "
            f"longest ({cls})"
        )
    # a shared resource that binds is the bottleneck, not the stage that uses most of it
    elif pred.binding == "gil" and name is None:
        line = f"the GIL binds: predicted {q} items/s; no stage's own Python holds it: the pipeline's scheduling does"
    elif pred.binding == "gil":
        line = f"the GIL binds: predicted {q} items/s; {name} holds it longest ({cls})"
    elif pred.binding == "cores" and name is None:
        line = f"the cores bind: predicted {q} items/s; the pipeline's own work uses them"
    elif pred.binding == "cores":
        line = f"the cores bind: predicted {q} items/s; {name} uses the most CPU ({cls})"
    else:
        alone = f": {fmt_q(lowest)} items/s alone" if finite(lowest) else ""
        line = f"{name} is the bottleneck: {cls}; predicted {q} items/s (its own capacity binds{alone})"
    if above := (pred.replay or {}).get("above_bounds"):
        # the prediction is the bound the line names; what the replay read is said beside it, with why it
        # is not the prediction
        line += f"; {above}"
    if failed:
        line += f"; not measured: {', '.join(failed)}"
    return line
