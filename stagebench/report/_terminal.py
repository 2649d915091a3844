"""The short table printed when a diagnosis ends.

The report is the full story; the terminal gets what fits on one screen: per
stage, what limits it, the setting to use, and the throughput there, then the
pipeline's prediction and validation and the path of the report. Plain text
with aligned columns (it lands in CI logs and Slurm output files), and stage
names are cleaned of control characters because the user chose them.
"""

from __future__ import annotations

import math
import os
import unicodedata
from collections.abc import Mapping, Sequence
from typing import Any

from stagebench._numbers import SourceItems, num, num_or_none
from stagebench.analysis._job import ORIGIN_SHORT
from stagebench.analysis._labels import LIMIT_SHORT
from stagebench.analysis._pipeline_job import user_setting
from stagebench.model._job import JobVerdict
from stagebench.model._loader import LoaderPoint
from stagebench.model._meta import LoaderInfo, Provenance
from stagebench.model._stage import StageSetting
from stagebench.model._summary import Summary

__all__ = ["format_table", "format_rate", "format_loader_table", "job_lines"]

_MAX_NAME = 32


def _clean(text: Any, limit: int | None = None) -> str:
    s = "".join(ch if unicodedata.category(ch)[0] != "C" else " " for ch in str(text))
    s = " ".join(s.split())
    if limit is not None and len(s) > limit:
        s = s[: limit - 1] + "…"
    return s


def format_rate(qps: Any, low: Any = None, high: Any = None) -> str:
    """``1,234`` or ``1,234 (1,200-1,270)``; ``12.3`` below 100; ``-`` when unknown."""
    q = num_or_none(qps)
    if q is None:
        return "-"

    def fmt(v: float) -> str:
        return f"{v:,.0f}" if abs(v) >= 100 else f"{v:,.1f}"

    lo, hi = num_or_none(low), num_or_none(high)
    if lo is None or hi is None:
        return fmt(q)
    return f"{fmt(q)} ({fmt(max(lo, 0.0))}-{fmt(hi)})"


def _setting(point: StageSetting | None) -> str:
    if point is None or point.executor is None:
        return "-"
    c = point.concurrency
    return f"{point.executor} x {int(c)}" if c is not None and num_or_none(c) is not None else str(point.executor)


def _aligned(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]


def format_table(summary: Mapping[str, Any], report_path: str | os.PathLike | None = None) -> str:
    """The end-of-run table for a pipeline ``summary`` (see docs/contracts.md), the path of its report where
    given; returns it, each line ended."""
    sm = Summary.from_json(summary)
    header = ("stage", "verdict", "recommended", "items/s (95% CI)", "notes")
    rows: list[tuple[str, ...]] = [header]
    for st in sm.stages:
        status = st.status or "ok"
        verdict = st.classification or "unknown"
        if status not in ("ok", None):
            verdict = f"{status}" if verdict == "unknown" else f"{verdict} ({status})"
        gil = num_or_none(st.gil_fraction)
        mix = st.mix
        if len(mix) > 1 and status in ("ok", None):
            # a tie within the shares' noise: the label the tie rule gives, and the shares it was decided on
            words = {
                "gil-bound": ("GIL", "share_gil"),
                "cpu-bound": ("CPU", "share_cpu"),
                "io-bound": ("waiting", "share_io"),
            }
            parts = [
                f"{words[k][0]} {v:.0%}"
                for k in mix
                if (v := num_or_none(st.evidence.signal_value(words[k][1]))) is not None
            ]
            verdict += " (mix)" + (", " + ", ".join(parts) if parts else "")
        elif st.gil_unread:
            verdict += ", GIL not read"
        elif (bounded := st.gil_only_bounded) is not None:
            verdict += f", GIL ≤{bounded[1]:.0%}"  # only bounded: its midpoint is a guess
        elif gil is not None:
            verdict += f", GIL {gil:.0%}"  # the stage's own share, as its label reads it (analysis/_labels.nature)
        rec = st.recommended or StageSetting()
        best = st.best or StageSetting()
        # Rates in source items/s, comparable across stages and with the prediction: a
        # stage after a batch of 16 handles 16 items per call.
        src = SourceItems(st.items_per_input)

        notes = []
        limit = st.limit
        if limit is not None and limit.kind:
            notes.append(f"alone at {limit.at}: limited by {LIMIT_SHORT.get(limit.kind, limit.kind)}")
        mine = user_setting(st)
        if mine and mine != _setting(rec):
            notes.append(f"yours {mine}")
        if _setting(best) != _setting(rec):
            notes.append(f"best {_setting(best)}: {format_rate(src.rate(best.qps))}")
        if src.grouped and num_or_none(rec.qps) is not None:
            notes.append(f"{format_rate(rec.qps)} calls/s x {src.k:.3g} items")
        rows.append(
            (
                _clean(st.name if "name" in st.keys else "?", _MAX_NAME),
                _clean(verdict, 48),
                _setting(rec),
                format_rate(src.rate(rec.qps), src.rate(rec.qps_low), src.rate(rec.qps_high)),
                "; ".join(notes),
            )
        )
    lines = ["", "stagebench diagnosis"]
    ranks = (sm.provenance or Provenance()).ranks.local_world_size
    if ranks > 1:  # the host's ranks measured together: its rates, each rank's settings
        lines.append(
            f"{ranks} ranks on this host, each running its own pipeline at the settings shown (each rank's): "
            "items/s are the host's, the sum over the ranks"
        )
    if len(rows) > 1:
        lines += _aligned(rows)
    else:
        lines.append("  (no stage was measured)")
    for ni in sm.not_isolated:
        lines.append(f"not isolated: {_clean(ni.get('name'), _MAX_NAME)}: {_clean(ni.get('reason'), 120)}")
    pred = sm.prediction
    if num_or_none(pred.qps) is not None:
        why = f" ({_clean(pred.binding)} binds)" if pred.binding else ""
        if pred.method == "replay" and num_or_none(pred.bounds_qps) is not None:
            why = f" (replayed with stand-ins; the bounds say {format_rate(pred.bounds_qps)}" + (
                f", {_clean(pred.binding)} binds)" if pred.binding else ")"
            )
        lines.append(f"predicted pipeline: {format_rate(pred.qps)} items/s{why}")
    val = sm.validation
    if num_or_none(val.qps) is not None:
        per = summary.get("validation") or {}
        lo, hi = num_or_none(per.get("rank_min_qps")), num_or_none(per.get("rank_max_qps"))
        lines.append(
            f"measured pipeline:  {format_rate(val.qps, val.qps_low, val.qps_high)} "
            f"items/s with the recommended settings ({num_or_none(val.seconds) or 0:.1f} s window)"
            + (f"; a rank: {format_rate(lo)}-{format_rate(hi)}" if lo is not None and hi is not None else "")
        )
    elif val.error:
        lines.append(f"validation run: {_clean(val.error, 160)}")
    yours = sm.recommended_vs_yours
    if yours.text and yours.verdict != "same":
        lines.append(f"against yours: {_clean(yours.text, 240)}")
    lines += job_lines(summary)
    if sm.verdict:
        lines.append(f"verdict: {_clean(sm.verdict, 200)}")
    if sm.scope:
        lines.append(f"scope: {_clean(sm.scope, 600)}")
    if sm.demand.text:
        lines.append(f"trainer: {_clean(sm.demand.text, 200)}")
    for w in sm.warnings[:3]:
        lines.append(f"warning: {_clean(w, 200)}")
    if report_path is not None:
        lines.append(f"report: {os.fspath(report_path)}")
    return "\n".join(lines) + "\n"


def job_lines(summary: Mapping[str, Any]) -> list[str]:
    """The job runs of a ``summary`` (your loop on the real loader or pipeline at each candidate) as a few
    lines; [] without them.

    Each setting with its job rate, its rate over yours in turns (the ratio the advice rests on), and
    the steps it ran; then the verdict, what was not checked, and what more would settle an open question.
    """
    job = JobVerdict.from_json(summary.get("job"))
    if job is None:
        return []
    unit = job.unit or "samples/s"
    settled = job.decision.settled if job.decision is not None else None
    lines = [
        f"job: your training loop on {job.what or 'the real loader or pipeline'}, in turns "
        f"({job.rounds or 0} round(s), {num_or_none(job.seconds) or 0:.0f} s, "
        f"{job.steps_handed or 0} steps"
        + ("; settled)" if settled else "; not settled)" if settled is not None else ")")
    ]
    rows: list[tuple[str, ...]] = [
        ("", "setting", "why run", f"job {unit} (95% CI)", "vs yours in turns", "steps", "data wait", "alone")
    ]
    for c in job.candidates:
        f = c.job
        x = c.versus_yours
        vs = "yours" if c.key == job.yours else (x.text() if x is not None else "-")
        rows.append(
            (
                "*" if c.key == job.pick else " ",
                _clean(c.label, 60),
                ", ".join(ORIGIN_SHORT.get(o, o) for o in c.origin),
                format_rate(f.samples_per_s, f.samples_per_s_low, f.samples_per_s_high) if f is not None else "not run",
                _clean(vs, 44),
                str((f.steps if f is not None else None) or "-"),
                f"{f.data_wait_share:.0%}" if f is not None and num_or_none(f.data_wait_share) is not None else "-",
                format_rate(c.alone.value if c.alone is not None else None),
            )
        )
    lines += ["  " + r for r in _aligned(rows)]
    lines.append(f"job verdict: {_clean(job.text, 400)}")
    if job.zero_workers:
        lines.append(f"  {_clean(job.zero_workers, 240)}")
    for u in job.unproven:
        lines.append(f"  not checked: {_clean(u, 240)}")
    return lines


def _fmt(v: float | None, spec: str, unit: str = "") -> str:
    return f"{v:{spec}}{unit}" if isinstance(v, (int, float)) and math.isfinite(v) else "-"


def format_loader_table(summary: Mapping[str, Any]) -> str:
    """A short terminal table of a loader ``summary``'s points, the recommendation marked with '*', the best
    with '+'; returns it without a newline at its end."""
    info = LoaderInfo.from_json(summary.get("loader"))
    name, backend, batch = ("?" if v is None else v for v in (info.name, info.backend, info.batch_size))
    lines = [f"stagebench loader sweep: {name} (backend {backend}, batch size {batch})"]
    sm = Summary.from_json(summary)
    points = sm.points
    ranks = max((p.ranks or 1 for p in points), default=1)
    if ranks > 1:  # the host's ranks measured together: its rate, and each rank's beside it
        lines[0] += (
            f", {ranks} ranks on this host, each with its own loader at the setting shown: samples/s is "
            "the host's (the sum over the ranks), 'a rank' the slowest to the fastest rank"
        )
    head = (
        f"  {'':1} {'workers':>7} {'prefetch':>8} {'persist':>7} {'samples/s':>11} {'95% interval':>21} "
        + (f"{'a rank':>15} " if ranks > 1 else "")
        + f"{'1st batch':>9} {'stall':>7} {'PSS MB':>8} {'cores':>5}  status"
    )
    lines.append(head)
    # the knobs of the recommended and the best point, where the summary has them
    rec, best = (None if q is None else LoaderPoint.from_json(q).knobs for q in (sm.recommended, sm.best))
    # each point's knobs read once: the order (cheapest first; a point naming none last) and the marks
    read = [(p.knobs, p) for p in points]
    for k, p in sorted(read, key=lambda kp: (kp[0] is None, kp[0].cost() if kp[0] is not None else ())):
        mark = " " if k is None else ("*" if k == rec else ("+" if k == best else " "))
        r = p.samples_per_s
        ci = f"[{r.low:,.1f}, {r.high:,.1f}]" if r is not None and r.low is not None and r.high is not None else "-"
        status = p.status if p.ok else f"{p.status}: {p.reason}"[:60]
        pf = "-" if p.prefetch_factor is None else str(p.prefetch_factor)
        per_rank = ""
        if ranks > 1:
            lo, hi = p.rank_min_samples_per_s, p.rank_max_samples_per_s
            per_rank = f"{'-' if lo is None or hi is None else f'{lo:,.0f}-{hi:,.0f}':>15} "
        lines.append(
            f"  {mark:1} {p.num_workers:>7} {pf:>8} {str(p.persistent_workers):>7} "
            f"{_fmt(p.rate, ',.1f'):>11} {ci:>21} {per_rank}{_fmt(p.time_to_first_batch_s, '.2f', 's'):>9} "
            f"{_fmt(p.epoch_stall_s, '.2f', 's'):>7} {_fmt(p.mem_pss_mb, ',.0f'):>8} "
            f"{_fmt(p.cores_used, '.2f'):>5}  {status}"
        )
    if rec is not None or best is not None:  # a key to marks that are there
        lines.append("  * recommended   + best throughput")
    lines.append(f"verdict: {sm.verdict or ''}")
    if sm.scope:
        lines.append(f"scope: {_clean(sm.scope)}")
    for f in sm.findings[:3]:
        lines.append(f"  [{f.severity}] {f.title}")
    s = sm.search
    if s is not None:
        full = num(s.estimated_full_grid_seconds)
        lines.append(
            f"search: {s.strategy} measured {s.points_measured} of {s.full_grid_points} grid "
            f"points in {_fmt(num(s.seconds), '.0f', 's')}"
            # no estimate where nothing ran long enough to time (NaN, or "about 0s", which reads as a figure)
            + (f" (full grid about {_fmt(full, '.0f', 's')})" if full >= 0.5 else "")
        )
    return "\n".join(lines)
