"""The pipeline summary: from measured rows and ``run.json`` to ``summary.json``.

A pure function of the rows (and ``run.json``), so ``stagebench report RUN_DIR`` rebuilds the same
summary from ``results.csv``. :func:`summarize` puts together each stage's analysis
(:mod:`._stage`, its label and limit from :mod:`._labels`), the stages' settings chosen together
(:mod:`._joint`), the prediction (:mod:`._predict`, with SPDL's fixed per-item cost and its per-stage
increment from ``run.json["pipeline_overhead"]``: :func:`pipeline_overhead`), the whole-pipeline runs
and the training job where they ran, the verdicts (:mod:`._verdicts`), findings (:mod:`._findings`)
and warnings. A stage measured fused with the stages before it (it consumes its inputs) has their
work taken out of its figures (:mod:`._fused`), so the bounds and the replay count it once.

The CPU's speed (``run.json["cpu_speed"]``, :func:`stagebench.analysis._verdicts.cpu_speed`): a fixed
loop's CPU time per iteration after every point and around the validation run. A spread during the
sweeps, or a validation run at another speed, is a warning. Not a correction: scaling the prediction
by the speed ratio made it worse on 2 of 3 benchmark pipelines, because the speed flips within seconds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pandas as pd

from stagebench._numbers import finite, fmt_cores, num, num_or_none
from stagebench.analysis._findings import build_findings
from stagebench.analysis._fused import unfuse
from stagebench.analysis._gil import harness_gil_s
from stagebench.analysis._job import decide_job
from stagebench.analysis._joint import process_headroom, recommend_jointly
from stagebench.analysis._kind import job_keys, summary_head
from stagebench.analysis._labels import relabel_unfused
from stagebench.analysis._pipeline_job import apply_job_pick, job_candidates
from stagebench.analysis._predict import apply_replay, predict_pipeline
from stagebench.analysis._stage import analyze_stage
from stagebench.analysis._verdicts import cpu_speed, demand_verdict, pipeline_verdict, speed_warnings, yours_verdict
from stagebench.core._curves import StageRows
from stagebench.core._jobrun import Ladder
from stagebench.core._paired import HOST_PHASES
from stagebench.core._resources import usable_cores
from stagebench.core._stage_draft import StageDraft
from stagebench.model._meta import Provenance, RunMeta
from stagebench.model._pipeline import Interference, Prediction, WholeRun
from stagebench.model._rate import Rate
from stagebench.model._stage import StageEntry, changed
from stagebench.runs._provenance import load_warnings
from stagebench.runs._schema import STAGE_COLUMNS

__all__ = [
    "summarize",
    "pipeline_overhead",
    "job_candidates_of_run",
    "process_headroom_of_run",
    "paired_needless_of_run",
]


_NOISY_CV = 0.15
_WIDE_INTERVAL = 0.30  # interval width / value


# ------------------------------------------------------------------ pipeline summary
def pipeline_overhead(raw: Any) -> dict[str, float] | None:
    """SPDL's fixed and per-stage main-process time per item, from ``run.json["pipeline_overhead"]``.

    ``one_stage`` and ``three_stage`` are no-op pipelines (thread x 4). A
    k-stage pipeline costs about fixed + k x per-stage, so per-stage =
    (three - one) / 2 and fixed = one - per-stage. ``None`` when absent (older runs) or not
    measured: the prediction then charges the whole one-stage cost per stage.
    """
    if not isinstance(raw, Mapping):
        return None
    cost = []
    for key in ("one_stage", "three_stage"):
        r = raw.get(key)
        if not isinstance(r, Mapping) or r.get("status") != "ok" or not finite(r.get("qps")) or not r["qps"] > 0:
            return None
        cpu = r.get("cpu_s_per_item")
        cost.append(harness_gil_s(SimpleNamespace(qps=float(r["qps"]), cpu_s_per_item=num(cpu))))
    one, three = cost
    # more pipes cannot make the pipeline cheaper; noise that says so is read as no increment
    per_stage = max(0.0, (three - one) / 2)
    return {
        "one_stage_s_per_item": one,
        "three_stage_s_per_item": three,
        "per_stage_s_per_item": per_stage,
        "fixed_s_per_item": max(0.0, one - per_stage),
    }


def _cores(prov: Provenance) -> float:
    """The cores the run could use as recorded (a quota's fraction kept), else this host's."""
    for v in (prov.usable_cores, prov.cpu_count):
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0:
            return v
    return usable_cores()


def _run_warnings(df: pd.DataFrame, stages: Sequence[StageEntry], m: RunMeta, cores: float) -> list[str]:
    out: list[str] = []
    status = m.status
    if status in ("interrupted", "terminated", "running"):
        how = {"interrupted": "interrupted (Ctrl-C)", "terminated": "terminated (SIGTERM)"}.get(
            str(status), "not finished (killed, or still running)" if m.ended is None else m.ended.text
        )
        out.append(f"the diagnosis was cut short: {how}; this summary covers the points measured before it")
    for st in m.stages:
        out.extend(f"{st.get('name')}: {st[k]}" for k in ("inputs_cut", "short_batch") if st.get(k))
    prov, after = m.provenance or Provenance(), m.provenance_after
    if prov.recorded:
        out.extend(load_warnings(prov.to_json(), None if after is None else after.to_json()))
    if prov.free_threaded:
        out.append("free-threaded Python: there is no GIL; GIL fractions measure how much threads serialise")
    if len(df):
        qps = df["qps"]
        ok = (df["status"] == "ok") & (qps > 0)
        cv = df["qps_cv"][ok]
        width = ((df["qps_high"] - df["qps_low"]) / qps)[ok]
        n_ok = int(ok.sum())
        noisy = int((cv > _NOISY_CV).sum())
        wide = int((width > _WIDE_INTERVAL).sum())
        if noisy:
            out.append(
                f"{noisy} of {n_ok} points are noisy (batch-to-batch variation above {_NOISY_CV:.0%}): "
                "differences smaller than their intervals are not evidence"
            )
        if wide:
            out.append(
                f"{wide} of {n_ok} points have confidence intervals wider than {_WIDE_INTERVAL:.0%} of their value"
            )
        if df["reason"].str.contains("hung stage still running", regex=False).any():
            out.append(
                "worker threads of a hung stage kept running during later points: those thread points may be low"
            )
        cu = df["cores_used"][ok]
        conc = df["concurrency"][ok]
        ex = df["executor"][ok]
        wide_runs = ((ex == "process") & (conc >= 2)).any()
        if cores >= 2 and wide_runs and len(cu.dropna()) and cu.max() < 0.6 * cores:
            out.append(
                f"no point used more than {cu.max():.2f} of the {cores} cores, not even processes: other load may "
                "have taken them; CPU-bound and GIL-bound stages then look alike"
            )
    few, poor = [], []
    for e in stages:
        for key, fit in e.fit.items():
            w = fit.get("warning") or ""
            if "poor fit" in w:
                poor.append(f"{e.name} ({key}, R² {fit['r2']:.2f})")
            elif w:
                few.append(f"{e.name} ({key})")
    # one line each: the per-curve details stay in each stage's fit entry
    if few:
        out.append(f"curve fits are indicative only (fewer than 4 concurrency levels): {', '.join(few)}")
    if poor:
        out.append(f"poor fit: the USL does not describe these curves well: {', '.join(poor)}")
    return out


@dataclass(frozen=True)
class _RunContext:
    """What every pipeline analysis of a run reads first: ``run.json``, the rows with string stage names,
    the cores, whether Python is free-threaded, and SPDL's no-op pipeline cost (None where not measured)."""

    meta: RunMeta
    df: pd.DataFrame
    cores: float
    free_threaded: bool
    overhead: dict | None
    #: the host's ranks measured together (the rows' figures are the host's): each a GIL of its own
    ranks: int = 1
    #: where a quota or an allocation set ``cores``, in words (empty: the affinity mask did)
    cores_bound: str = ""

    @property
    def fixed(self) -> float:
        """SPDL's per-item cost a pipeline pays once (source, sink, consumer), 0 where it was not measured."""
        return float((self.overhead or {}).get("fixed_s_per_item") or 0.0)

    def stages(self, stage_cache: dict | None, df: pd.DataFrame | None = None) -> list[StageEntry]:
        """Each declared stage's analysis (:func:`analyze_stage`) of these rows, or of ``df``, with its place
        in the pipeline, in pipeline order."""
        df = self.df if df is None else df
        cores, free_threaded, cores_bound = self.cores, self.free_threaded, self.cores_bound
        declared = list(self.meta.stages)
        names = [str(s.get("name", "")) for s in declared]
        for extra in df["stage"].unique():
            if extra and extra not in names:
                names.append(extra)
                declared.append({"name": extra})
        stages: list[StageEntry] = []
        for i, (name, decl) in enumerate(zip(names, declared)):
            part = df[df["stage"] == name]
            # its texts are in source items: the items one call stands for is part of what it is read from
            per_input = float(decl.get("items_per_input") or 1.0)
            key = (name, cores, free_threaded, len(part), cores_bound, per_input)
            if stage_cache is not None and key in stage_cache:
                entry = stage_cache[key]
            else:
                entry = (
                    analyze_stage(
                        part,
                        cores=cores,
                        free_threaded=free_threaded,
                        gil_probe=decl.get("gil_probe"),
                        cores_bound=cores_bound,
                        items_per_input=per_input,
                    )
                    if len(part)
                    else _unmeasured(name)
                )
                if stage_cache is not None:
                    stage_cache[key] = entry
            entry = changed(
                entry,
                name=name,
                index=decl.get("index", i),
                type=decl.get("type", "pipe"),
                is_async=bool(decl.get("is_async", False)),
                items_per_input=per_input,
                **{k: decl[k] for k in ("user_executor", "user_concurrency") if k in decl},
            )
            skipped, rec = decl.get("head_to_head_skipped"), entry.recommended
            if skipped and rec is not None:
                why = f"{rec.why}; {skipped}"
                entry = changed(entry, head_to_head_skipped=skipped, recommended=changed(rec, why=why))
            stages.append(entry)
        # fused measurements counted once: in the bounds, the joint choice, the replay
        fused = unfuse(stages, self.meta)
        return [relabel_unfused(e) if e.name in fused else e for e in stages]


def _run_context(rows: Any, meta: dict | None) -> _RunContext:
    """The run's :class:`_RunContext` from its rows and ``run.json``."""
    m = RunMeta.from_json(meta)
    prov = m.provenance or Provenance()
    df = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows)
    if "stage" not in df.columns:
        df = df.assign(stage=pd.Series(dtype=str))
    df = df.assign(stage=df["stage"].fillna("").astype(str))
    return _RunContext(
        m,
        df,
        _cores(prov),
        bool(prov.free_threaded),
        pipeline_overhead(m.pipeline_overhead),
        m.ranks,
        "" if prov.limits is None else prov.limits.cores_bound(),
    )


def _per_rank(ranks: int, cores: float) -> str:
    """A ranked diagnosis's settings in the words they are set in (each rank's pipeline), and what its
    figures are; "" on one rank."""
    if ranks <= 1:
        return ""
    return (
        f"; the settings are each rank's pipeline's: {ranks} ranks run one each on {fmt_cores(cores)}, and items/s "
        "are the host's, every rank's pipeline at once"
    )


def process_headroom_of_run(
    rows: pd.DataFrame, meta: dict, pending: dict[str, list[int]], *, stage_cache: dict | None = None
) -> dict[str, dict]:
    """:func:`stagebench.analysis._joint.process_headroom` on a diagnosis's rows so far (its thread points)."""
    run = _run_context(rows, meta)
    stages = run.stages(stage_cache)
    return process_headroom(
        stages, pending, cores=run.cores, free_threaded=run.free_threaded, fixed=run.fixed, ranks=run.ranks
    )


def paired_needless_of_run(
    rows: pd.DataFrame, meta: dict, planned: dict[str, tuple[str, int, int]], *, stage_cache: dict | None = None
) -> dict[str, str]:
    """Which planned head-to-heads could not change the pipeline's settings, and why.

    ``planned``: stage name -> (harness, thread level, process level) of the
    head-to-head its curves call for (:func:`stagebench.core._paired.plan`). The
    ratio it would find lies within the curves' ratio over and times
    :data:`~stagebench.core._paired.HOST_PHASES` (what two moments of this kind of
    host differ by). For each stage, the joint recommendation
    (:func:`~stagebench.analysis._joint.recommend_jointly`) is computed as if the
    head-to-head had found the low end, the curves' ratio and the high end (each
    stage's own choice follows it, as after a real one). Where every stage gets
    the same executor and concurrency all three times, running it could change
    nothing the user is told to set: name -> why, for the stage's recommendation.
    """
    run = _run_context(rows, meta)
    df = run.df
    demand = num_or_none(run.meta.settings.target_rate)
    cache = stage_cache if stage_cache is not None else {}
    run.stages(cache)  # every stage as measured, analysed once
    out: dict[str, str] = {}
    for name, (harness, t_level, p_level) in planned.items():
        sr = StageRows(df[df["stage"] == name])
        t, p = sr.curve(harness, "thread").at(t_level), sr.curve(harness, "process").at(p_level)
        if t is None or p is None or not t.qps > 0:
            continue
        ratio = p.qps / t.qps
        picks = []
        for r in (ratio / HOST_PHASES, ratio, ratio * HOST_PHASES):
            tw, pw = ("thread", t_level, t.qps), ("process", p_level, t.qps * r)
            fake = pd.DataFrame(
                [
                    StageDraft.start(name, "paired", ex, harness, c).as_row() | {"qps": q, "qps_low": q, "qps_high": q}
                    for ex, c, q in (tw, pw, pw, tw)  # one round, T P P T: two pairs
                ]
            )
            mine = {k: v for k, v in cache.items() if k[0] != name}  # this stage analysed afresh each time
            stages = run.stages(mine, pd.concat([df, fake], ignore_index=True))
            recommend_jointly(
                stages,
                cores=run.cores,
                free_threaded=run.free_threaded,
                fixed=run.fixed,
                demand=demand,
                ranks=run.ranks,
            )
            picks.append(
                {
                    e.name: (e.recommended.executor, e.recommended.concurrency)
                    for e in stages
                    if e.recommended is not None
                }
            )
        if picks[0] == picks[1] == picks[2]:
            out[name] = (
                f"no head-to-head: whatever it found (processes at {ratio / HOST_PHASES:.2f}x to "
                f"{ratio * HOST_PHASES:.2f}x threads: the curves' {ratio:.2f}x, over and times the {HOST_PHASES:g}x "
                "two moments of this host can differ by), the pipeline's settings would be the same, so the "
                "curves decide this stage alone (STAGEBENCH_PROCESS_FLAT_LEVELS=0 runs it)"
            )
    return out


def job_candidates_of_run(rows: Any, meta: dict, demand: Rate | None) -> Ladder:
    """The settings to run the user's loop with (:func:`stagebench.analysis._pipeline_job.job_candidates`);
    ``demand``: the step's rate (None where not measured)."""
    run = _run_context(rows, meta)
    return job_candidates(
        run.stages(None),
        run.meta,
        demand=demand,
        cores=run.cores,
        free_threaded=run.free_threaded,
        fixed=run.fixed,
        ranks=run.ranks,
    )


def summarize(rows: pd.DataFrame, meta: dict, *, stage_cache: dict | None = None) -> dict:
    """The pipeline ``summary.json``: per-stage verdicts, prediction, findings, verdict.

    ``rows``: :data:`stagebench.runs._schema.STAGE_COLUMNS` rows of every stage
    (any roles, harnesses, executors and statuses). ``meta``: ``run.json``
    (``provenance``, ``settings``, ``stages`` in pipeline order,
    ``not_isolated``, optionally ``validation``). Stage entries of ``run.json``
    may carry ``items_per_input`` (source items per input of that stage, for
    stages after a batching step); it defaults to 1.
    ``stage_cache``: a dict kept between calls on the same rows (the diagnosis
    summarizes before and after its whole-pipeline runs): each stage's analysis,
    whose bootstrap fits are most of the time, is then done once.
    """
    run = _run_context(rows, meta)
    m, df, cores, free_threaded, overhead = run.meta, run.df, run.cores, run.free_threaded, run.overhead
    stages = run.stages(stage_cache)
    # the stages' settings chosen together (each stage's own best alone is kept beside it)
    target = m.settings.target_rate
    joint = recommend_jointly(
        stages,
        cores=cores,
        free_threaded=free_threaded,
        fixed=run.fixed,
        demand=num_or_none(target),
        ranks=run.ranks,
        replays=m.joint_replays,
    )
    entries = list(stages)  # as chosen together; the job's pick comes later
    failed = None if m.validation is None else m.validation.failed
    # a pipeline that delivers nothing has no throughput: none is predicted for it, here, in the report
    # or on the terminal
    prediction = (
        predict_pipeline(
            entries,
            cores=cores,
            free_threaded=free_threaded,
            overhead=overhead,
            ranks=run.ranks,
            cores_bound=run.cores_bound,
        )
        if stages and not failed
        else None
    )
    prediction = apply_replay(prediction, m.replay)
    speed = cpu_speed(m.cpu_speed)
    validation = _validation(m.validation, prediction, df, entries)
    # the CPU's speed first: on a host that changes it, it outweighs every other noise source
    warnings = speed_warnings(speed) + _run_warnings(StageRows(df).all, entries, m, cores)
    if prediction is not None and prediction.caveat:
        warnings.append(prediction.caveat)
    if validation is None and m.validation is not None and m.validation.error and not failed:
        warnings.append(f"the whole-pipeline validation run did not complete: {m.validation.error}")
    not_isolated = list(m.not_isolated)
    yours = yours_verdict(m.yours, validation, entries)
    # the training job, where it ran with the user's loop: its pick becomes every stage's recommendation
    # (after the prediction and the whole-pipeline runs, which were made at the isolated choice)
    verdict = decide_job(m.job, m.step, unit="items/s")
    if verdict is not None and verdict.decided:
        verdict = changed(verdict, changed=tuple(apply_job_pick(stages, verdict)))
        entries = stages
    findings = build_findings(
        entries,
        prediction=prediction,
        validation=validation,
        warnings=warnings,
        not_isolated=not_isolated,
        cores=cores,
        page_fault=m.page_fault,
        yours=yours,
        job=verdict,
        cores_bound=run.cores_bound,
    )
    demand = demand_verdict(m.settings.target_rate, validation, prediction, m.step, verdict)
    return {
        **summary_head("pipeline", m, {}),
        # a pipeline that delivers nothing has no throughput to predict: that, not the prediction, is the verdict
        "verdict": f"validation failed: {failed}"
        if failed
        else (
            str(verdict.text)
            if verdict is not None and verdict.decided
            else pipeline_verdict(entries, prediction, validation, not_isolated)
        )
        + _per_rank(run.ranks, cores),
        "validation_failed": failed,
        "warnings": warnings,
        "cores": cores,
        "stages": [e.to_json() for e in stages],
        "not_isolated": not_isolated,
        "joint": None if joint is None else joint.to_json(),
        "prediction": None if prediction is None else prediction.to_json(),
        "validation": None if validation is None else validation.to_json(),
        "recommended_vs_yours": None if yours is None else yours.to_json(),
        **job_keys("the pipeline", m, verdict, planned=m.settings.trainer == "measure", picked=not failed),
        "demand": None if demand is None else demand.to_json(),
        "cpu_speed": None if speed is None else speed.to_json(),
        "findings": [f.to_json() for f in findings],
    }


def _unmeasured(name: str) -> StageEntry:
    entry = analyze_stage(pd.DataFrame(columns=list(STAGE_COLUMNS)), cores=1)
    why = "not measured: no rows for this stage"
    return changed(entry, name=name, status="skipped", reason=why, evidence=changed(entry.evidence, summary=(why,)))


def _validation(
    val: WholeRun | None, prediction: Prediction | None, rows: pd.DataFrame, stages: Sequence[StageEntry]
) -> WholeRun | None:
    """The validation run (``run.json["validation"]``) with its error against the prediction and each
    stage's interference; None where it gave no number."""
    if val is None or not finite(val.qps):
        return None
    predicted = prediction or Prediction()
    pred = predicted.qps
    measured = num(val.qps)
    replay_lat = (predicted.replay or {}).get("stage_latency")
    shared = _with_replay(val) if predicted.method == "replay" else None
    against = measured if shared is None else shared
    if shared is not None:
        val = changed(val, qps_with_replay=shared)
    return changed(
        val,
        # relative error of the prediction against the measurement: +0.10 = predicted 10% too high
        error_vs_prediction=(pred - against) / against if pred is not None and finite(pred) and against > 0 else None,
        interference=tuple(_interference(val.stage_latency, rows, stages, replay_lat)),
    )


def _with_replay(val: WholeRun) -> float | None:
    """The validation run's rate in the round the replay took part in, where later rounds counted more
    (None where it counted no more, or cannot tell which were which).

    The replay runs in the first round in turns only; the validation run takes more rounds where its
    comparison with yours asks for them. A prediction read against those reads the host's drift between
    rounds as its own error. The windows are of equal length, so the rate over the first ones is the
    whole rate scaled by their mean over all the windows' mean (the local rank's windows, in a ranked
    diagnosis, where ``qps`` is the host's).
    """
    k, rates = val.first_round_windows, val.window_rates
    if not isinstance(k, int) or not 0 < k < len(rates) or not finite(val.qps):
        return None
    first, every = sum(rates[:k]) / k, sum(rates) / len(rates)
    return num(val.qps) * first / every if every > 0 else None


def _interference(lat: Any, rows: pd.DataFrame, stages: Sequence[StageEntry], replay_lat: Any) -> list[Interference]:
    """Each timed stage's median call inside the pipeline against alone at the same setting.

    Alone: the stage's row at its recommended harness, executor and
    concurrency. A ratio well above 1 is the interference the prediction's
    bounds leave out (the GIL or the cores shared with the other stages, seen
    as longer calls), measured rather than modelled.

    ``replay_lat``: the stand-ins' median calls inside the replay, which took
    turns with the validation run. ``vs_replay`` (the real call over its
    stand-in's, both inside their pipelines) is where the replay's prediction
    and the measurement part: above 1, the stage costs more among the others
    than its stand-in does, so the replay is optimistic about it.
    """
    if not isinstance(lat, Mapping) or not len(rows):
        return []
    out = []
    for st in stages:
        name, rec = (st.name if "name" in st.keys else None), st.recommended
        got = lat.get(name)
        if not isinstance(got, Mapping) or not finite(got.get("p50_ms")) or rec is None:
            continue
        hit = rows[
            (rows["stage"] == name)
            & (rows["role"] == "stage")
            & (rows["status"] == "ok")
            & (rows["harness"] == rec.harness)
            & (rows["executor"] == rec.executor)
            & (rows["concurrency"] == rec.concurrency)
        ]
        alone = float(hit["latency_p50_ms"].iloc[0]) if len(hit) else math.nan
        stood = replay_lat.get(name) if isinstance(replay_lat, Mapping) else None
        rep = float(stood["p50_ms"]) if isinstance(stood, Mapping) and finite(stood.get("p50_ms")) else math.nan
        out.append(
            Interference(
                stage=name,
                in_pipeline_p50_ms=float(got["p50_ms"]),
                calls=got.get("calls"),
                alone_p50_ms=alone if finite(alone) else None,
                ratio=float(got["p50_ms"]) / alone if finite(alone) and alone > 0 else None,
                replay_p50_ms=rep if finite(rep) else None,
                vs_replay=float(got["p50_ms"]) / rep if finite(rep) and rep > 0 else None,
            )
        )
    return out
