"""One stage's analysis from its rows: the fits, the GIL share, the recommendation, the label and the limit.

:func:`analyze_stage` is a pure function of one stage's rows. The recommendation: the executor, then the
smallest concurrency within 5% of that executor's best measured throughput, never outside the measured
range; threads win whenever their best is within noise of the processes' best, and a head-to-head in
turns (role ``paired``) decides the executor where the sweep measured one. The ``spdl`` harness is
preferred where measured (what the user's pipeline can deliver).
"""

from __future__ import annotations

import statistics
from typing import Any

import pandas as pd

from stagebench._numbers import SourceItems, finite
from stagebench.analysis._fit import fit_scaling
from stagebench.analysis._gil import estimate_gil, harness_gil_s
from stagebench.analysis._labels import label_mix, limit_of, limit_rules, nature
from stagebench.core._curves import Curve, Point, StageRows
from stagebench.core._paired import WITHIN_BEST, paired_result, within_noise
from stagebench.model._json import read
from stagebench.model._stage import GilEstimate, HeadToHead, PageFaults, StageEntry, StageSetting, changed, keyed

__all__ = ["analyze_stage"]

_EXEC_PREFERENCE = ("thread", "async", "process")  # less memory first
_STATUS_ORDER = ("crashed", "failed", "timeout", "skipped")
_GIL_KEYS = ("pinned", "source", "saturated", "serializer", "harness", "executor", "notes")  # an entry's ``gil``


def _own_gc(sr: StageRows, harness: str, executor: str, p: Point, key: str = "gc_s_per_item") -> float | None:
    """Garbage-collector seconds per item the stage's own allocations cost: its point's less its ceiling's
    (``key``: all its collections; ``gc_full_s_per_item``, the full ones; ``gc_young_per_item``, how many
    young collections).

    The harness allocates too (futures, queue entries), and the replay runs
    the same harness, which pays that part by itself. Below the ceiling's
    (noise) the stage's own part is none.
    """
    mine = getattr(p, key)
    if not finite(mine):
        return None
    ceil = sr.ceiling(harness, executor, p.concurrency)
    base = getattr(ceil, key) if ceil is not None and finite(getattr(ceil, key)) else 0.0
    return max(0.0, mine - base)


def _best(curve: Curve) -> Point:
    """The best point of a curve that has points."""
    best = curve.best()
    assert best is not None  # callers pass only non-empty curves
    return best


def _setting(p: Point, harness: str, executor: str, **more: Any) -> StageSetting:
    """A setting of the stage as the entry lists it: the point's rate, then ``more``."""
    return keyed(
        StageSetting,
        executor=executor,
        concurrency=p.concurrency,
        qps=p.qps,
        qps_low=p.qps_low if p.has_interval else None,
        qps_high=p.qps_high if p.has_interval else None,
        harness=harness,
        **more,
    )


def _problems(sr: StageRows) -> list[str]:
    """One line per harness/executor/role whose points did not all measure."""
    bad = sr.not_ok()
    lines = []
    for (h, e, role), grp in bad.groupby(["harness", "executor", "role"], sort=False):
        grp = grp.sort_values("concurrency")
        first = grp.iloc[0]
        levels = ", ".join(str(int(c)) for c in grp["concurrency"] if finite(float(c)))
        what = "no-op ceiling" if role == "ceiling" else "stage"
        reason = str(first["reason"]) or "no items completed"
        lines.append(f"{h}/{e} {what} at concurrency {levels}: {first['status']} ({reason})")
    return lines


def _stage_status(sr: StageRows) -> tuple[str, str]:
    if len(sr.ok):
        return "ok", ""
    sr_rows = sr.stage_rows
    if not len(sr_rows):
        return "skipped", "not measured"
    for st in _STATUS_ORDER:
        hit = sr_rows[sr_rows["status"] == st]
        if len(hit):
            return st, str(hit.iloc[0]["reason"]) or st
    return "failed", "no item completed at any point"


# ------------------------------------------------------------------ recommendation
def _recommend(
    sr: StageRows, harness: str, src: SourceItems
) -> tuple[StageSetting | None, StageSetting | None, dict[str, Point], HeadToHead | None]:
    curves = {e: sr.curve(harness, e) for e in _EXEC_PREFERENCE if sr.curve(harness, e)}
    if not curves:
        return None, None, {}, None
    bests = {e: _best(c) for e, c in curves.items()}
    top_exec = max(bests, key=lambda e: bests[e].qps)
    top = bests[top_exec]
    near = [e for e in _EXEC_PREFERENCE if e in bests and within_noise(bests[e], top)]
    chosen = near[0]
    why = []
    paired = paired_result(sr, harness) if {"thread", "process"} <= set(bests) else None
    if paired is not None and paired.decisive:
        # the head-to-head saw both executors at the same moments of the machine: it decides
        chosen = "process" if paired.processes_win else "thread"
        why.append(_paired_why(paired, chosen))
    else:
        if paired is not None:
            why.append(f"the head-to-head measured only {paired.pairs} usable pair(s): the curves decide")
        others = [e for e in bests if e != chosen]
        if chosen != top_exec:
            why.append(
                f"{chosen} and {top_exec} are within noise of each other ({src.q(bests[chosen].qps)} vs "
                f"{src.q(top.qps)} items/s at their best): {chosen} preferred (less memory, no IPC)"
            )
        elif others:
            alt = max(others, key=lambda e: bests[e].qps)
            if within_noise(bests[alt], top):
                why.append(f"{chosen} and {alt} are within noise; {chosen} preferred (less memory, no IPC)")
            else:
                why.append(
                    f"{chosen} beats {alt} beyond noise ({src.q(top.qps)} vs {src.q(bests[alt].qps)} items/s at their best)"
                )
    curve = curves[chosen]
    target = WITHIN_BEST * bests[chosen].qps
    rec = next(p for p in curve if p.qps >= target)
    best_c = bests[chosen].concurrency
    if rec.concurrency == best_c:
        why.append(f"concurrency {rec.concurrency} gives the best measured throughput of {chosen}")
    else:
        why.append(
            f"concurrency {rec.concurrency} is the smallest within 5% of {chosen}'s best "
            f"({src.q(bests[chosen].qps)} items/s at {best_c})"
        )
    if rec.concurrency == curve.levels[-1] and len(curve) >= 2:
        prev = curve.points[-2]
        if rec.low > prev.high:
            why.append(f"still rising at the largest level measured ({rec.concurrency}): more may help, not measured")
    why.append(
        f"{harness} harness" + (" (what the pipeline delivers, SPDL overhead included)" if harness == "spdl" else "")
    )
    return _setting(rec, harness, chosen, why="; ".join(why)), _setting(top, harness, top_exec), bests, paired


def _paired_why(paired: HeadToHead, chosen: str) -> str:
    """What the head-to-head found, in one clause."""
    t, p = paired.thread, paired.process
    assert t is not None and p is not None  # a decisive head-to-head has both settings
    ci = f" (95% interval {paired.ratio_low:.2f}-{paired.ratio_high:.2f})" if paired.ratio_low is not None else ""
    said = (
        f"in a head-to-head (threads x {t.concurrency} and processes x {p.concurrency} in turns, "
        f"{paired.pairs} pairs of windows) processes reached {paired.ratio:.2f}x threads' throughput{ci}"
    )
    if chosen == "process":
        return f"{said}: processes win beyond noise"
    return f"{said}: threads preferred (the curves, measured seconds apart, had processes ahead; less memory, no IPC)"


# ------------------------------------------------------------------ per stage
def analyze_stage(
    rows_for_one_stage: pd.DataFrame,
    *,
    cores: float,
    free_threaded: bool = False,
    n_boot: int = 200,
    gil_probe: dict[str, Any] | None = None,
    cores_bound: str = "",
    items_per_input: float = 1.0,
) -> StageEntry:
    """Analyse the rows of one stage (all harnesses, executors, roles).

    ``gil_probe``: the stage's direct GIL reading, if one was taken (see
    :func:`stagebench.analysis._gil.estimate_gil`). ``cores_bound``: where a quota or an allocation
    sets ``cores``, in words (:meth:`stagebench.model._limits.HostLimits.cores_bound`), for a limit
    of the cores to name it; empty where the affinity mask sets them. ``items_per_input``: the source
    items one call stands for (after a batching step): the texts state rates and times per source item,
    as the report does; the entry's figures stay per call.

    Returns the stage entry of ``summary.json`` (``index`` and ``type`` are
    ``None``; :func:`summarize` fills them from ``run.json``). Never raises for
    odd rows: stages with no successful point get ``status`` and ``reason``.
    """
    if not cores > 0:  # a quota can give less than one CPU
        raise ValueError(f"cores must be > 0, got {cores}")
    df = rows_for_one_stage if isinstance(rows_for_one_stage, pd.DataFrame) else pd.DataFrame(rows_for_one_stage)
    sr = StageRows(df)
    names = [n for n in sr.all["stage"].unique() if n]
    problems = tuple(_problems(sr))
    status, reason = _stage_status(sr)
    payload = sr.payload_bytes()
    entry = changed(
        StageEntry.empty(names[0] if names else ""),
        problems=problems,
        status=status,
        reason=reason,
        payload_bytes=payload if finite(payload) else None,
        page_faults={
            ex: PageFaults.from_json({k: (v if finite(v) else None) for k, v in d.items()})
            for ex, d in sr.page_faults().items()
        },
    )
    if status != "ok":
        summary = (f"not measured: {status} ({reason})", *problems)
        return changed(entry, evidence=changed(entry.evidence, summary=summary))

    entry = _read_curves(entry, sr, n_boot)
    src = SourceItems(items_per_input)
    gil = estimate_gil(sr, cores=cores, fits=dict(entry.fit), free_threaded=free_threaded, probe=gil_probe, src=src)
    harness = sr.recommendation_harness()
    assert harness is not None  # status ok: there are ok rows, so a harness with a curve
    recommended, best, bests, paired = _recommend(sr, harness, src)
    # recommended and best are None only when no curve of this harness is of a known executor (rows
    # not written by stagebench), which the analysis does not read.
    assert recommended is not None and best is not None, f"no curve of a known executor in {harness}"
    label, lines, nature_signals = nature(sr, gil, src)
    kind, limit_lines, limit_signals = limit_rules(sr, harness, best, bests, gil, cores, src)
    limit = limit_of(kind, limit_lines, sr, best, gil, cores_bound=cores_bound)
    summary = _explain([*lines, f"at its best alone ({limit.at}): {limit.text}"], gil, recommended, problems, src)
    releases = (gil_probe or {}).get("releases")  # how often a call lets the GIL go (its stand-in does the same)
    return changed(
        _at_recommended(entry, sr, harness, recommended, bests),
        classification=label,
        limit=limit,
        gil_fraction=gil.fraction,
        gil_fraction_interval=gil.interval,
        evidence=changed(entry.evidence, summary=summary, signals={**gil.signals, **limit_signals, **nature_signals}),
        recommended=recommended,
        best=best,
        gil_s_per_item=gil.gil_s_per_item,
        stage_s_per_item=gil.stage_s_per_item,
        head_to_head=paired,
        gil=keyed(GilEstimate, **{k: getattr(gil, k) for k in _GIL_KEYS}, releases_per_call=releases),
        mix=label_mix(nature_signals),
    )


def _read_curves(entry: StageEntry, sr: StageRows, n_boot: int) -> StageEntry:
    """``entry`` with each curve's scaling fit, the levels it measured and its points."""
    fit, levels, curves = {}, {}, {}
    for curve in sr.curves():
        fit[curve.key] = fit_scaling(
            [p.concurrency for p in curve],
            [p.qps for p in curve],
            [p.qps_low for p in curve],
            [p.qps_high for p in curve],
            [p.n_batches for p in curve],
            n_boot=n_boot,
        )
        levels[curve.key] = curve.levels
        curves[curve.key] = tuple(
            changed(
                read(StageSetting, p.as_dict()),
                cores_used=p.cores_used,
                cpu_s_per_item=p.cpu_s_per_item,
                latency_p50_ms=p.latency_p50_ms,
                # the calling thread's CPU in a call at this point, beside its time: the replay reads
                # both at one point (pipeline/_replay._stand_in), as the host's speed moves between points
                call_cpu_s=p.call_cpu_ms / 1e3 if finite(p.call_cpu_ms) else None,
            )
            for p in curve
        )
    return changed(entry, fit=fit, levels_measured=levels, curves=curves)


def _at_recommended(
    entry: StageEntry, sr: StageRows, harness: str, recommended: StageSetting, bests: dict[str, Point]
) -> StageEntry:
    """``entry`` with the harness, each executor's best point (``alternatives``), and the recommended point's
    ceiling, CPU and the harness's GIL time."""
    alternatives = {
        e: _setting(
            p,
            harness,
            e,
            cpu_s_per_item=p.cpu_s_per_item if finite(p.cpu_s_per_item) else None,
            call_cpu_s=p.call_cpu_ms / 1e3 if finite(p.call_cpu_ms) else None,
            gc_s_per_item=_own_gc(sr, harness, e, p),
            gc_full_s_per_item=_own_gc(sr, harness, e, p, "gc_full_s_per_item"),
            gc_young_per_item=_own_gc(sr, harness, e, p, "gc_young_per_item"),
            harness_gil_s_per_item=_main_gil_overhead(sr, harness, e, p.concurrency),
            **({"ipc_s_per_item": _ipc_s(sr, harness)} if e == "process" else {}),
        )
        for e, p in bests.items()
    }
    ex, c = str(recommended.executor), int(recommended.concurrency or 0)
    rp = sr.curve(harness, ex).at(c)
    assert rp is not None  # the recommended point is a point of this curve (_recommend)
    ceil = sr.ceiling(harness, ex, c)
    return changed(
        entry,
        harness=harness,
        alternatives=alternatives,
        ceiling_qps=ceil.qps if ceil is not None else None,
        cpu_s_per_item=rp.cpu_s_per_item if finite(rp.cpu_s_per_item) else None,
        harness_gil_s_per_item=_main_gil_overhead(sr, harness, ex, c),
    )


def _explain(
    lines: list[str], gil: GilEstimate, recommended: StageSetting, problems: tuple[str, ...], src: SourceItems
) -> tuple[str, ...]:
    """The evidence summary: the label's lines (the limit at the best setting last), the GIL share and how it
    was read, its notes, the recommendation and the points that did not measure. A grouped stage's
    recommendation says its unit once: its rate is in source items, not calls."""
    summary = list(lines)
    if gil.fraction is not None:
        assert gil.interval is not None  # estimate_gil gives a fraction with its interval
        lo, hi = gil.interval
        kind = (
            "read by a counter thread next to the stage"
            if gil.source == "probe"
            else "inferred from the curves"
            if gil.pinned
            else "bounded only"
        )
        summary.append(f"GIL share {gil.fraction:.2f} (interval {lo:.2f}-{hi:.2f}, {kind}; not a direct measurement)")
    summary.extend(gil.notes)
    unit = f"{src.per_call()}; " if src.grouped else ""
    summary.append(
        f"recommended: {recommended.executor} x {recommended.concurrency} -> "
        f"{src.q(recommended.qps or 0.0)} items/s ({unit}{recommended.why})"
    )
    return (*summary, *problems)


def _ipc_s(sr: StageRows, harness: str) -> float | None:
    """The main process's cost of moving an item to a process worker and back, beyond the thread harness's.

    The process no-op ceiling's time per item less the thread one's at the same concurrency, the median over
    the concurrencies from 2 where both measured: the cost is the same at every concurrency (each item is
    pickled and unpickled once each way), while each pair differs by the host's speed between two short
    readings (gil_mix on the 2-core VM: 0.13-0.24 ms at most levels, -0.02 at one, and the stand-in took 0 to
    0.30 from one pair chosen by the stage's own best points). At 1 a process ceiling waits on each round
    trip, which the main process does not spend. None: no pair measured.
    """
    pairs = []
    for c in sr.ceiling_levels(harness, "process"):
        proc, thread = sr.ceiling(harness, "process", c), sr.ceiling(harness, "thread", c)
        if c >= 2 and proc is not None and thread is not None:
            pairs.append(harness_gil_s(proc) - harness_gil_s(thread))
    return max(0.0, statistics.median(pairs)) if pairs else None


def _main_gil_overhead(sr: StageRows, harness: str, executor: str, concurrency: int) -> float:
    """Per-item GIL time the harness spends in the main process for this setting.

    Thread and async stages: the no-op ceiling of the same setting. Process
    stages schedule, pickle and unpickle every item in the main process (the
    event loop or driver, the pool's feeder and manager threads): their process
    no-op ceiling is limited by that serial work, so its time per item
    (:func:`harness_gil_s`: 1/throughput or CPU per item, whichever is
    smaller) stands for it: the thread ceiling's scheduling cost alone would
    leave the IPC out. Without a process ceiling, the thread ceiling at the
    same concurrency is the fallback.
    """
    if executor == "process":
        ceil = sr.ceiling(harness, "process", concurrency)
        return harness_gil_s(ceil if ceil is not None else sr.ceiling(harness, "thread", concurrency))
    return harness_gil_s(sr.ceiling(harness, executor, concurrency))
