"""From measured rows to verdicts: per-stage analysis and the pipeline summary.

Everything here is a pure function of the rows (and ``run.json``), so
``stagebench report RUN_DIR`` rebuilds the same summary from ``results.csv``.

Per stage (:func:`analyze_stage`):

- **fits**: USL and Amdahl per harness x executor (:mod:`._fit`);
- **GIL fraction** with its signals (:mod:`._gil`);
- **recommendation**: the executor, then the smallest concurrency within 5%
  of that executor's best measured throughput. Never outside the measured
  range: an unmeasured setting is a guess. Threads win whenever their best is
  within noise of the processes' best (intervals overlap, or within 5%):
  they use less memory and no IPC. Where the sweep measured a head-to-head
  (role ``paired``: threads and processes in turns, because the curves alone
  had processes ahead by less than 1.5x; :mod:`._paired`), it decides the
  executor instead: processes only when they win it beyond noise.
- **harness**: the recommendation and classification use the ``spdl``
  harness when the stage was measured through it (that is what the user's
  pipeline can deliver, SPDL's per-item overhead included), else ``direct``.
  The GIL fraction prefers ``direct`` (the least harness time to subtract).
- **classification**: what limits the stage *itself*, the same on any core count, from one decision
  table over its call alone at its lowest thread (or event-loop) level (:func:`_nature`): its call
  shorter than the harness's cost per item, ``overhead-bound``; else the largest share of the call:
  holding the GIL ``gil-bound``, computing without it ``cpu-bound``, waiting ``io-bound``.
- **limit**: what holds the stage back at its best setting alone, a second, separate fact
  (:func:`_limit_rules`, the rules that used to label it): the harness's ceiling, IPC on processes,
  the GIL busy, the cores, a curve still rising, a lock; or nothing that stands out.
- A stage measured fused with the stages before it (it consumes its inputs) has their work taken out
  of its figures (:mod:`._fused`), so the bounds and the replay count it once.

The CPU's speed (``run.json["cpu_speed"]``, :func:`cpu_speed`): a fixed
loop's CPU time per iteration after every point and around the validation
run. A spread during the sweeps, or a validation run at another speed, is a
warning. Not a correction: scaling the prediction by the speed ratio made it
worse on 2 of 3 benchmark pipelines, because the speed flips within seconds.

The pipeline summary adds the prediction (:mod:`._predict`), with SPDL's
fixed per-item cost (source, sink, consumer) and its per-stage increment
read from ``run.json["pipeline_overhead"]`` (:func:`pipeline_overhead`),
findings (:mod:`._findings`), warnings and a one-line verdict.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd

from stagebench._numbers import finite, fmt_above, fmt_ms, fmt_q, fmt_share_of, num, num_or_none
from stagebench._settings import DEMAND_HEADROOM
from stagebench.analysis._fit import fit_scaling
from stagebench.analysis._fused import unfuse
from stagebench.analysis._gil import estimate_gil, harness_gil_s
from stagebench.analysis._pipeline_job import user_choice, user_setting
from stagebench.core._curves import Curve, Point, StageRows
from stagebench.core._paired import WITHIN_BEST, paired_result, within_noise
from stagebench.core._resources import usable_cores

__all__ = [
    "analyze_stage",
    "summarize",
    "pipeline_overhead",
    "cpu_speed",
    "user_choice",
    "user_setting",
    "yours_verdict",
    "LIMIT_SHORT",
    "job_candidates_of_run",
    "CLASSIFICATIONS",
]

CLASSIFICATIONS = ("gil-bound", "cpu-bound", "io-bound", "overhead-bound", "ipc-bound", "unknown")

_NEAR_CEILING = 0.80  # within 20% of the no-op ceiling
# A GIL the stage holds for less than half the harness's own per-item Python is the harness's limit
_OWN_GIL_SHARE = 0.5
_CPU_BOUND = 0.75  # share of the cores
_IO_CORES = 0.50  # fewer cores than this share: mostly waiting
_COMPUTE_BOUND = 0.50  # CPU time / time per call alone at least this: the stage computes, it does not wait
_RISING = 0.5  # top level above prev x (1 + this x (ideal ratio - 1)): still rising
_EFFICIENT = 0.9  # top level at this share of linear scaling: still rising
_LARGE_PAYLOAD = 64 * 1024
_NOISY_CV = 0.15
_WIDE_INTERVAL = 0.30  # interval width / value
_EXEC_PREFERENCE = ("thread", "async", "process")  # less memory first
_STATUS_ORDER = ("crashed", "failed", "timeout", "skipped")


# ------------------------------------------------------------------ small helpers


def _own_gc(sr: StageRows, harness: str, executor: str, p: Point) -> float | None:
    """Garbage-collector seconds per item the stage's own allocations cost: its point's less its ceiling's.

    The harness allocates too (futures, queue entries), and the replay runs
    the same harness, which pays that part by itself. Below the ceiling's
    (noise) the stage's own part is none.
    """
    if not finite(p.gc_s_per_item):
        return None
    ceil = sr.ceiling(harness, executor, p.concurrency)
    base = ceil.gc_s_per_item if ceil is not None and finite(ceil.gc_s_per_item) else 0.0
    return max(0.0, p.gc_s_per_item - base)


def _best(curve: Curve) -> Point:
    """The best point of a curve that has points."""
    best = curve.best()
    assert best is not None  # callers pass only non-empty curves
    return best


def _point_dict(p: Point, harness: str, executor: str) -> dict[str, Any]:
    return {
        "executor": executor,
        "concurrency": p.concurrency,
        "qps": p.qps,
        "qps_low": p.qps_low if p.has_interval else None,
        "qps_high": p.qps_high if p.has_interval else None,
        "harness": harness,
    }


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
def _recommend(sr: StageRows, harness: str) -> tuple[dict | None, dict | None, dict[str, Point], dict | None]:
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
    if paired is not None and paired["decisive"]:
        # the head-to-head saw both executors at the same moments of the machine: it decides
        chosen = "process" if paired["processes_win"] else "thread"
        why.append(_paired_why(paired, chosen))
    else:
        if paired is not None:
            why.append(f"the head-to-head measured only {paired['pairs']} usable pair(s): the curves decide")
        others = [e for e in bests if e != chosen]
        if chosen != top_exec:
            why.append(
                f"{chosen} and {top_exec} are within noise of each other ({fmt_q(bests[chosen].qps)} vs "
                f"{fmt_q(top.qps)} items/s at their best): {chosen} preferred (less memory, no IPC)"
            )
        elif others:
            alt = max(others, key=lambda e: bests[e].qps)
            if within_noise(bests[alt], top):
                why.append(f"{chosen} and {alt} are within noise; {chosen} preferred (less memory, no IPC)")
            else:
                why.append(
                    f"{chosen} beats {alt} beyond noise ({fmt_q(top.qps)} vs {fmt_q(bests[alt].qps)} items/s at their best)"
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
            f"({fmt_q(bests[chosen].qps)} items/s at {best_c})"
        )
    if rec.concurrency == curve.levels[-1] and len(curve) >= 2:
        prev = curve.points[-2]
        if rec.low > prev.high:
            why.append(f"still rising at the largest level measured ({rec.concurrency}): more may help, not measured")
    why.append(
        f"{harness} harness" + (" (what the pipeline delivers, SPDL overhead included)" if harness == "spdl" else "")
    )
    recommended = _point_dict(rec, harness, chosen)
    recommended["why"] = "; ".join(why)
    best = _point_dict(top, harness, top_exec)
    return recommended, best, bests, paired


def _paired_why(paired: dict[str, Any], chosen: str) -> str:
    """What the head-to-head found, in one clause."""
    t, p = paired["thread"], paired["process"]
    ci = (
        f" (95% interval {paired['ratio_low']:.2f}-{paired['ratio_high']:.2f})"
        if paired["ratio_low"] is not None
        else ""
    )
    said = (
        f"in a head-to-head (threads x {t['concurrency']} and processes x {p['concurrency']} in turns, "
        f"{paired['pairs']} pairs of windows) processes reached {paired['ratio']:.2f}x threads' throughput{ci}"
    )
    if chosen == "process":
        return f"{said}: processes win beyond noise"
    return f"{said}: threads preferred (the curves, measured seconds apart, had processes ahead; less memory, no IPC)"


# ------------------------------------------------------------------ classification
def _still_rising(curve: Curve | None) -> str | None:
    """Why the curve has not flattened at its largest measured level, or None.

    Rising: the top level beats the one below it by half of what linear
    scaling would add (1.5x when it doubles), beyond noise; or the top level
    still runs at >= 90% of linear scaling from the lowest level.
    """
    if not curve or len(curve) < 2:
        return None
    top, prev, p0 = curve.points[-1], curve.points[-2], curve.points[0]
    ideal = top.concurrency / prev.concurrency
    if top.qps > prev.qps * (1 + _RISING * (ideal - 1)) and top.low > prev.high:
        return (
            f"still rising at the top of the grid ({fmt_q(top.qps)} items/s at {curve.executor} concurrency "
            f"{top.concurrency}, {top.qps / prev.qps:.2f}x the {fmt_q(prev.qps)} at {prev.concurrency})"
        )
    efficiency = top.qps / (top.concurrency * p0.qps / p0.concurrency)
    if efficiency >= _EFFICIENT:
        return (
            f"still rising at the top of the grid ({fmt_q(top.qps)} items/s at {curve.executor} concurrency "
            f"{top.concurrency}, {efficiency:.0%} of linear scaling)"
        )
    return None


def _limit_rules(
    sr: StageRows,
    harness: str,
    best: dict,
    bests: dict[str, Point],
    gil: dict,
    cores: int,
) -> tuple[str, list[str], dict[str, dict]]:
    """What limits the stage at its best setting, by the rules that used to label it (kept as they were:
    their kinds are :data:`LIMIT_OF`'s keys). ``(kind, lines, signals)``."""
    ex, c = best["executor"], best["concurrency"]
    bp = sr.curve(harness, ex).at(c)
    assert bp is not None  # ``best`` is a point of this curve (_recommend)
    signals: dict[str, dict] = {}
    ceil = sr.ceiling(harness, ex, c)
    u = bp.cores_used
    if finite(u):
        signals["cores_used_at_best"] = {
            "value": u,
            "interval": None,
            "label": f"cores used at the best point ({ex} concurrency {c}), of {cores} usable",
        }
    if ceil is not None:
        share = bp.qps / ceil.qps
        signals["ceiling_share"] = {
            "value": share,
            "interval": None,
            "label": f"best throughput / no-op ceiling of the {harness} harness at {ex} concurrency {c}",
        }
        near = share >= _NEAR_CEILING
        if near and ex != "process":
            return (
                "overhead-bound",
                [
                    f"{fmt_q(bp.qps)} items/s at {ex} concurrency {c} is {fmt_share_of(share)} the {harness} harness's "
                    f"no-op ceiling ({fmt_q(ceil.qps)} items/s{fmt_above(share)}): the per-item work is smaller than the "
                    "per-item overhead"
                ],
                signals,
            )
        # on processes that fill the cores, the cores (not the transfer) are the limit
        if near and not (finite(u) and u >= _CPU_BOUND * cores):
            return (
                "ipc-bound",
                [
                    f"on processes it reaches {fmt_q(bp.qps)} items/s at concurrency {c}, {fmt_share_of(share)} the "
                    f"process no-op ceiling ({fmt_q(ceil.qps)} items/s{fmt_above(share)}): moving items between "
                    "processes is the limit"
                ],
                signals,
            )

    payload = sr.payload_bytes()
    if ex == "process" and finite(payload) and payload >= _LARGE_PAYLOAD:
        pt = sr.curve(harness, "thread").at(c)
        if pt is not None and finite(pt.cpu_s_per_item, bp.cpu_s_per_item):
            ipc_cpu = bp.cpu_s_per_item - pt.cpu_s_per_item
            if ipc_cpu > pt.cpu_s_per_item:
                return (
                    "ipc-bound",
                    [
                        f"each item moves {payload / 1024:,.0f} KiB between processes; that costs {fmt_ms(ipc_cpu)} of CPU "
                        f"per item, more than the work itself ({fmt_ms(pt.cpu_s_per_item)} on threads)"
                    ],
                    signals,
                )

    # A GIL that binds caps the thread curve; one still rising at the top of
    # the grid has not met it, whatever small GIL share its CPU suggests. Each
    # rule judges the curve it reads: the GIL estimate's, and the best point's.
    gil_curve = sr.curve(gil.get("harness") or harness, gil.get("executor") or "thread")
    tb = bests.get(gil.get("executor") or "thread")
    if gil.get("saturated") and gil.get("serializer") == "gil" and tb is not None and not _still_rising(gil_curve):
        f = gil["fraction"]
        if gil.get("gil_s_per_item") is not None:
            signals["gil_busy_at_best"] = {
                "value": tb.qps * gil["gil_s_per_item"],
                "interval": None,
                "role": "verdict",
                "label": f"share of the time the GIL is held where the {gil['executor']}s flatten (concurrency "
                f"{tb.concurrency}): throughput x the stage's own GIL time per item",
            }
        lines = [
            f"{gil['executor']}s flatten at {fmt_q(tb.qps)} items/s (concurrency {tb.concurrency}, "
            f"{tb.cores_used:.2f} of {cores} cores): the stage holds the GIL about {f:.0%} of each item "
            f"({fmt_ms(gil['gil_s_per_item'])} of {fmt_ms(gil['stage_s_per_item'])})"
        ]
        # Measured through SPDL, a curve also flattens on SPDL's own per-item Python (its event loop
        # holds the GIL to schedule every item): where the stage holds it less than half as long, that
        # is the limit, as in the rule below (a 4 ms read at 16 threads read "gil-bound, 3% its own").
        g_own = gil.get("gil_s_per_item")
        h = harness_gil_s(sr.ceiling(gil.get("harness") or harness, gil.get("executor") or "thread", tb.concurrency))
        if g_own is not None and h > 0 and g_own < _OWN_GIL_SHARE * h:
            return (
                "overhead-bound",
                [
                    lines[0] + f", under half of the {fmt_ms(h)} the harness's own per-item Python holds it: "
                    "the per-item scheduling is the limit"
                ],
                signals,
            )
        pb = bests.get("process")
        if pb is not None:
            lines.append(
                f"processes, each with its own GIL, reach {fmt_q(pb.qps)} items/s (concurrency {pb.concurrency})"
            )
        return "gil-bound", lines, signals

    # The GIL busy at the best point itself: the stage's own GIL time plus the
    # harness's per item, times the throughput (catches a GIL that saturates
    # only together with SPDL's own Python, at the top of the curve).
    g = gil.get("gil_s_per_item")
    rising = _still_rising(sr.curve(harness, ex)) if ex in ("thread", "async") else None
    rising_note: str | None = None
    if ex in ("thread", "async") and g is not None and not gil.get("serializer") == "other":
        h = harness_gil_s(sr.ceiling(harness, ex, c))
        busy = bp.qps * (g + h)
        line = (
            f"at {ex} concurrency {c}, {fmt_q(bp.qps)} items/s x ({fmt_ms(g)} of the stage's own Python + {fmt_ms(h)} "
            f"of the harness's) keeps the GIL {busy:.0%} busy"
        )
        # a verdict of this rule rests on this share, not on the stage's own GIL share (which can be small)
        signals["gil_busy_at_best"] = {
            "value": busy,
            "interval": None,
            "label": f"share of the time the GIL is held at the best point ({ex} concurrency {c}): throughput x "
            "(the stage's own GIL time + the harness's per item)",
            "role": "check",
        }
        if busy >= _NEAR_CEILING and rising:
            rising_note = f"{line}, yet the curve is {rising}: the GIL is not the limit yet"
        elif busy >= _NEAR_CEILING:
            signals["gil_busy_at_best"]["role"] = "verdict"  # the verdict rests on it
            if g >= _OWN_GIL_SHARE * h:
                return "gil-bound", [line + ": the GIL is the limit"], signals
            return (
                "overhead-bound",
                [line + ": mostly the harness's own per-item Python, the GIL is the limit"],
                signals,
            )

    cpu = bp.cpu_s_per_item
    if (finite(u) and u >= _CPU_BOUND * cores) or (finite(cpu) and cpu > 0 and bp.qps >= 0.8 * cores / cpu):
        return (
            "cpu-bound",
            [
                f"at {ex} concurrency {c} it uses {u:.2f} of {cores} cores ({fmt_ms(cpu)} CPU per item, "
                f"{fmt_q(bp.qps)} items/s): the cores are the limit"
            ],
            signals,
        )

    if gil.get("saturated") and gil.get("serializer") == "other":
        return (
            "unknown",
            [
                f"{gil['executor']}s flatten using little CPU per item: something other than the GIL serialises them "
                "(a lock, or an external limit such as a disk or a server)"
            ],
            signals,
        )

    curve = sr.curve(harness, ex)
    p0 = curve.points[0]
    linear_share = bp.qps / (bp.concurrency * p0.qps / p0.concurrency)
    # The harness's per-item scheduling (its no-op ceiling's CPU per item at the
    # same setting) is CPU the stage would not spend in any other harness: a
    # stage that waits is judged on its own cores, both numbers shown.
    own_u, used, own_cpu = u, f"{u:.2f} of {cores} cores", math.nan
    if finite(u, cpu) and ceil is not None and finite(ceil.cpu_s_per_item) and ceil.cpu_s_per_item > 0:
        own_cpu = max(0.0, cpu - ceil.cpu_s_per_item)
        own_u = own_cpu * bp.qps
        used = (
            f"{own_u:.2f} of {cores} cores for its own work ({fmt_ms(own_cpu)} CPU per item; {u:.2f} cores with "
            f"the {harness} harness's own per-item scheduling, {fmt_ms(ceil.cpu_s_per_item)} per item)"
        )
        signals["own_cores_at_best"] = {
            "value": own_u,
            "interval": None,
            "label": f"cores used by the stage itself at the best point: (CPU per item - the {harness} harness's "
            f"no-op CPU per item) x throughput, of {cores} usable",
        }
    lines = [rising_note] if rising_note else []
    # Few cores of its own do not make a stage that computes a waiting one: a stage that computes
    # most of its call when alone, with less work per item than the harness's own scheduling,
    # is paced by the harness (the demo's aggregate step, 0.18 us of Python a call, read
    # "io-bound, it waits" at 80% of the SPDL ceiling, just short of the 'near the ceiling' rule).
    alone = gil["signals"].get("cpu_share", {}).get("value")
    # The probe's GIL share is Python running, so computing, read directly; the CPU share of a
    # sub-microsecond call is a difference of two per-item CPU readings (the demo's aggregate
    # read 0.42 beside a probe of 0.97 and was called "io-bound, it waits").
    probed = gil["signals"].get("gil_probe", {}).get("value")
    if finite(probed) and probed >= _COMPUTE_BOUND and not (finite(alone) and alone >= probed):
        alone = probed
    computes = finite(alone) and alone >= _COMPUTE_BOUND
    # own_cpu is finite only with a ceiling; the explicit test is for the type checker
    if computes and ceil is not None and finite(own_cpu) and own_cpu < ceil.cpu_s_per_item:
        lines.insert(
            0,
            f"at {ex} concurrency {c} it delivers {fmt_q(bp.qps)} items/s, {bp.qps / ceil.qps:.0%} of the {harness} "
            f"harness's no-op ceiling; its own work ({fmt_ms(own_cpu)} CPU per item; it computes {alone:.0%} of its call "
            f"alone) is less than the harness's per-item scheduling ({fmt_ms(ceil.cpu_s_per_item)}): the overhead sets "
            "the pace",
        )
        return "overhead-bound", lines, signals
    if finite(own_u) and own_u < _IO_CORES * cores and (c > cores or linear_share >= 0.75) and not computes:
        lines.insert(
            0,
            f"at {ex} concurrency {c} it delivers {fmt_q(bp.qps)} items/s ({linear_share:.0%} of linear scaling) "
            f"using only {used}: it waits (I/O, sleep, GIL-free waiting)",
        )
        return "io-bound", lines, signals

    lines.insert(0, f"at {ex} concurrency {c}: {fmt_q(bp.qps)} items/s, {used}; no single limit stands out")
    return "unknown", lines, signals


#: What limits a stage at its best setting, from :func:`_limit_rules`' verdict on it: the second fact,
#: beside the stage's own nature (:func:`_nature`), that is the same on any core count.
LIMIT_OF = {
    "overhead-bound": "harness",
    "ipc-bound": "ipc",
    "gil-bound": "gil",
    "cpu-bound": "cores",
    "io-bound": "concurrency",
    "unknown": None,
}
#: The limits in a word or two, for the terminal's table.
LIMIT_SHORT = {
    "harness": "the harness",
    "ipc": "IPC",
    "gil": "the GIL",
    "cores": "the cores",
    "concurrency": "its concurrency (still rising)",
    "serialised": "a lock",
}
#: The limits in words, for the evidence.
LIMIT_WORDS = {
    "harness": "the harness's cost per item (it runs near its no-op ceiling)",
    "ipc": "moving items between processes",
    "gil": "the GIL",
    "cores": "the cores",
    "concurrency": "its concurrency: it still scaled at the top of the grid",
    "serialised": "something other than the GIL serialises its threads (a lock, a disk, a server)",
}


def _nature(sr: StageRows, gil: dict) -> tuple[str, list[str], dict[str, dict]]:
    """What a stage *is* limited by, the same on 2 or 96 cores: one decision table over its call alone.

    Read at the lowest thread (or event-loop) level, where the stage runs without competing with itself:
    its call takes ``t`` per item; the harness spends ``h`` per item on a no-op through the same path.

    ====================  ==================================================================
    label                 rule (first match)
    ====================  ==================================================================
    ``overhead-bound``    the stage's own call is shorter than the harness's cost per item
    ``gil-bound``         of its call, holding the GIL is the largest share
    ``cpu-bound``         computing without the GIL (C code that releases it) is the largest
    ``io-bound``          waiting (sleep, I/O, await: time off the CPU) is the largest
    ====================  ==================================================================

    The shares: the GIL share ``f`` (:func:`stagebench.analysis._gil.estimate_gil`, its lower end
    where the curves only bound it), the CPU share ``A`` (CPU of the call over its time), waiting
    ``1 - max(A, f)`` and GIL-free computing ``max(A, f) - f``. A thread descheduled while holding
    the GIL reads as not computing, so ``f`` counts as CPU. Where nothing says how the call spends its
    time, the label is ``unknown`` with what would settle it.
    """
    signals: dict[str, dict] = {}
    H, E = gil.get("harness"), gil.get("executor")
    t = num(gil.get("stage_s_per_item"))
    if not H or not E or not finite(t) or not t > 0:
        return (
            "unknown",
            [
                "how the call spends its time was not measured (no thread or event-loop point): a thread "
                "point at concurrency 1 settles it"
            ],
            signals,
        )
    curve = sr.curve(H, E)
    p0 = curve.points[0]
    c0 = p0.concurrency
    ceil0 = sr.ceiling(H, E, c0)
    h = c0 / ceil0.qps if ceil0 is not None and finite(ceil0.qps) and ceil0.qps > 0 else math.nan
    own = p0.latency_p50_ms / 1e3 if finite(p0.latency_p50_ms) and p0.latency_p50_ms > 0 else float(t)
    if finite(h):
        signals["own_call_vs_harness"] = {
            "value": own / h,
            "interval": None,
            "role": "verdict" if own < h else "check",
            "label": f"the stage's own call per item / the {H} harness's cost per item for a no-op ({E} "
            f"concurrency {c0})",
        }
        if own < h:
            return (
                "overhead-bound",
                [
                    f"its own call takes {fmt_ms(own)} per item, less than the {fmt_ms(h)} the {H} harness spends "
                    f"per item on a no-op ({E} concurrency {c0}): scheduling an item costs more than the stage"
                ],
                signals,
            )
    sig = gil.get("signals") or {}
    A = num((sig.get("cpu_share") or {}).get("value"))
    f = gil.get("fraction")
    if f is not None and not gil.get("pinned") and gil.get("interval"):
        f = gil["interval"][0]  # only bounded: "holds the GIL for most of its work" needs evidence, not a midpoint
    if not finite(A) and f is None:
        return (
            "unknown",
            [
                "neither the CPU of its call nor its GIL share could be read (no CPU counters at its lowest "
                "level): the GIL probe (STAGEBENCH_GIL_PROBE=auto) settles it"
            ],
            signals,
        )
    label, line, share_signals = label_of_call(own, A, num(f), f"{E} concurrency {c0}")
    signals.update(share_signals)
    return label, [line], signals


#: The GIL share is known to about this much (the accuracy its known-answer tests hold it to,
#: tests/test_gil.py): a label that changes within it of the estimate is a tie between the shares.
SHARE_NOISE = 0.10
#: The tie rule: the first of these among the labels a tie allows (the GIL, then the CPU: what to act on).
TIE_ORDER = ("gil-bound", "cpu-bound", "io-bound")


def _shares(A: float, f: float) -> dict[str, float]:
    cpu = max(A if finite(A) else f, f)
    return {
        "gil-bound": f,
        "cpu-bound": max(0.0, min(1.0, cpu) - f),
        "io-bound": max(0.0, 1.0 - cpu),
    }


def _largest(shares: Mapping[str, float]) -> str:
    return max(shares, key=lambda k: (shares[k], k == "gil-bound", k == "cpu-bound"))


def label_of_call(own: float, A: float, f: float, where: str) -> tuple[str, str, dict[str, dict]]:
    """The table's last three rows (:func:`_nature`): the largest share of the call; its line and signals.

    ``own``: the call's time per item; ``A``: its CPU share (NaN: unknown); ``f``: its GIL share (NaN:
    unknown, taken as none). Decided with the GIL share's noise: where the largest share changes as
    ``f`` moves by :data:`SHARE_NOISE` either way, the shares are within their noise of each other,
    the tie rule gives the label (:data:`TIE_ORDER`), and the line says it is a mix (``signals["mix"]``
    lists the labels the noise allows). A 50/50 spin-and-sleep stage read 0.494 against 0.505 waiting
    and flipped between io-bound and gil-bound from run to run; it is now gil-bound, a mix.
    """
    f = f if finite(f) else 0.0
    shares = _shares(A, f)
    allowed = {_largest(_shares(A, min(1.0, max(0.0, f + d)))) for d in (-SHARE_NOISE, 0.0, SHARE_NOISE)}
    mix = [k for k in TIE_ORDER if k in allowed]
    label = mix[0] if len(mix) > 1 else _largest(shares)
    signals: dict[str, dict] = {}
    for key, value in shares.items():
        signals[f"share_{key.split('-')[0]}"] = {
            "value": value,
            "interval": None,
            "role": "verdict" if key == label else "check",
            "label": {
                "gil-bound": "share of its call holding the GIL",
                "cpu-bound": "share of its call computing without the GIL",
                "io-bound": "share of its call waiting (off the CPU)",
            }[key]
            + f" ({where})",
        }
    what = {
        "gil-bound": "holding the GIL is most of it: threads queue for the GIL, processes each have their own",
        "cpu-bound": "computing without the GIL is most of it (C code that releases it): it scales with the cores",
        "io-bound": "waiting is most of it (I/O, sleep, await): it scales with concurrency",
    }[label]
    if len(mix) > 1:
        names = {"gil-bound": "holding the GIL", "cpu-bound": "computing without it", "io-bound": "waiting"}
        what = (
            f"a mix: {' and '.join(names[k] for k in mix)} are within the GIL share's noise (±{SHARE_NOISE:g}) of "
            f"each other, and ties go to {label}"
        )
        signals["share_mix"] = {
            "value": None,
            "labels": mix,
            "interval": None,
            "role": "verdict",
            "label": f"labels the shares allow within the GIL share's noise (±{SHARE_NOISE:g}) ({where})",
        }
    line = (
        f"of each item's {fmt_ms(own)}: {shares['io-bound']:.0%} waiting, {shares['gil-bound']:.0%} holding the "
        f"GIL, {shares['cpu-bound']:.0%} computing without it ({where}): {what}"
    )
    return label, line, signals


def label_mix(signals: Mapping[str, Any]) -> list[str]:
    """The labels a stage's shares allow within their noise (more than one: a mix), from its signals."""
    return list((signals.get("share_mix") or {}).get("labels") or [])


def _relabel_unfused(st: dict) -> None:
    """A stage measured fused, labelled again from its own share of the call (analysis/_fused)."""
    t = num(st.get("stage_s_per_item"))
    if not finite(t) or not t > 0 or st.get("classification") == "overhead-bound":
        return
    alts = st.get("alternatives") or {}
    base = alts.get("async" if st.get("is_async") else "thread") or {}
    cpu = num(base.get("call_cpu_s"))
    A = min(1.0, cpu / t) if finite(cpu) else math.nan
    label, line, signals = label_of_call(t, A, num(st.get("gil_fraction")), "its own share of the fused call")
    st["classification"] = label
    st["mix"] = label_mix(signals)
    st["evidence"]["signals"].pop("share_mix", None)
    st["evidence"]["signals"].update(signals)
    st["evidence"]["summary"].insert(0, line)


def _limit(kind: str, lines: list[str], sr: StageRows, best: dict, gil: dict) -> dict[str, Any]:
    """``limit``: what holds the stage back at its best setting, in one phrase (None: nothing stands out)."""
    k = LIMIT_OF.get(kind)
    if kind == "unknown" and gil.get("saturated") and gil.get("serializer") == "other":
        k = "serialised"
    if kind == "io-bound" and not _still_rising(sr.curve(best["harness"], best["executor"])):
        k = None  # it waits and scales: nothing holds it back within the grid
    return {
        "kind": k,
        "at": f"{best['executor']} x {best['concurrency']}",
        "text": (f"limited by {LIMIT_WORDS[k]}" if k else "no single limit stands out")
        + (f": {lines[0]}" if lines else ""),
    }


# ------------------------------------------------------------------ per stage
def analyze_stage(
    rows_for_one_stage: pd.DataFrame,
    *,
    cores: int,
    free_threaded: bool = False,
    n_boot: int = 200,
    gil_probe: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Analyse the rows of one stage (all harnesses, executors, roles).

    ``gil_probe``: the stage's direct GIL reading, if one was taken (see
    :func:`stagebench.analysis._gil.estimate_gil`).

    Returns the stage entry of ``summary.json`` (``index`` and ``type`` are
    ``None``; :func:`summarize` fills them from ``run.json``). Never raises for
    odd rows: stages with no successful point get ``status`` and ``reason``.
    """
    if cores < 1:
        raise ValueError(f"cores must be >= 1, got {cores}")
    df = rows_for_one_stage if isinstance(rows_for_one_stage, pd.DataFrame) else pd.DataFrame(rows_for_one_stage)
    sr = StageRows(df)
    names = [n for n in sr.all["stage"].unique() if n]
    entry: dict[str, Any] = {
        "name": names[0] if names else "",
        "index": None,
        "type": None,
        "status": "ok",
        "reason": "",
        "classification": "unknown",
        "limit": None,
        "gil_fraction": None,
        "gil_fraction_interval": None,
        "evidence": {"summary": [], "signals": {}},
        "fit": {},
        "recommended": None,
        "best": None,
        "ceiling_qps": None,
        "cpu_s_per_item": None,
        "gil_s_per_item": None,
        # extensions
        "harness": None,
        "stage_s_per_item": None,
        "harness_gil_s_per_item": None,
        "alternatives": {},
        "head_to_head": None,
        "gil": None,
        "problems": _problems(sr),
        "levels_measured": {},
        "curves": {},
        "payload_bytes": None,
        "page_faults": {},
    }
    status, reason = _stage_status(sr)
    entry["status"], entry["reason"] = status, reason
    payload = sr.payload_bytes()
    entry["payload_bytes"] = payload if finite(payload) else None
    entry["page_faults"] = {
        ex: {k: (v if finite(v) else None) for k, v in d.items()} for ex, d in sr.page_faults().items()
    }
    if status != "ok":
        entry["evidence"]["summary"].append(f"not measured: {status} ({reason})")
        entry["evidence"]["summary"].extend(entry["problems"])
        return entry

    for curve in sr.curves():
        entry["fit"][curve.key] = fit_scaling(
            [p.concurrency for p in curve],
            [p.qps for p in curve],
            [p.qps_low for p in curve],
            [p.qps_high for p in curve],
            [p.n_batches for p in curve],
            n_boot=n_boot,
        )
        entry["levels_measured"][curve.key] = curve.levels
        entry["curves"][curve.key] = [
            {
                **p.as_dict(),
                "cores_used": p.cores_used,
                "cpu_s_per_item": p.cpu_s_per_item,
                "latency_p50_ms": p.latency_p50_ms,
            }
            for p in curve
        ]

    gil = estimate_gil(sr, cores=cores, fits=entry["fit"], free_threaded=free_threaded, probe=gil_probe)
    entry["gil"] = {
        k: gil.get(k) for k in ("pinned", "source", "saturated", "serializer", "harness", "executor", "notes")
    }
    # how often a call lets the GIL go (the probe's reading; its stand-in does the same: _replay)
    entry["gil"]["releases_per_call"] = (gil_probe or {}).get("releases")
    entry["gil_fraction"] = gil["fraction"]
    entry["gil_fraction_interval"] = gil["interval"]
    entry["gil_s_per_item"] = gil["gil_s_per_item"]
    entry["stage_s_per_item"] = gil["stage_s_per_item"]
    entry["evidence"]["signals"].update(gil["signals"])

    harness = sr.recommendation_harness()
    assert harness is not None  # status ok: there are ok rows, so a harness with a curve
    entry["harness"] = harness
    recommended, best, bests, paired = _recommend(sr, harness)
    entry["recommended"], entry["best"] = recommended, best
    entry["head_to_head"] = paired
    for e, p in bests.items():
        alt = _point_dict(p, harness, e)
        alt["cpu_s_per_item"] = p.cpu_s_per_item if finite(p.cpu_s_per_item) else None
        alt["call_cpu_s"] = p.call_cpu_ms / 1e3 if finite(p.call_cpu_ms) else None
        alt["gc_s_per_item"] = _own_gc(sr, harness, e, p)
        alt["harness_gil_s_per_item"] = _main_gil_overhead(sr, harness, e, p.concurrency)
        entry["alternatives"][e] = alt

    # recommended and best are None only when no curve of this harness is of a known executor (rows
    # not written by stagebench); indexing them then fails, as it always did.
    rp = sr.curve(harness, recommended["executor"]).at(recommended["concurrency"])  # type: ignore[index]
    assert rp is not None  # the recommended point is a point of this curve (_recommend)
    ceil = sr.ceiling(harness, recommended["executor"], recommended["concurrency"])  # type: ignore[index]
    entry["ceiling_qps"] = ceil.qps if ceil is not None else None
    entry["cpu_s_per_item"] = rp.cpu_s_per_item if finite(rp.cpu_s_per_item) else None
    entry["harness_gil_s_per_item"] = _main_gil_overhead(
        sr,
        harness,
        recommended["executor"],  # type: ignore[index]
        recommended["concurrency"],  # type: ignore[index]
    )

    label, lines, nature_signals = _nature(sr, gil)
    kind, limit_lines, limit_signals = _limit_rules(sr, harness, best, bests, gil, cores)  # type: ignore[arg-type]
    entry["classification"] = label
    entry["mix"] = label_mix(nature_signals)
    entry["limit"] = _limit(kind, limit_lines, sr, best, gil)  # type: ignore[arg-type]
    entry["evidence"]["signals"].update(limit_signals)
    entry["evidence"]["signals"].update(nature_signals)
    summary = entry["evidence"]["summary"]
    summary.extend(lines)
    summary.append(f"at its best alone ({entry['limit']['at']}): {entry['limit']['text']}")
    if gil["fraction"] is not None:
        lo, hi = gil["interval"]
        kind = (
            "read by a counter thread next to the stage"
            if gil.get("source") == "probe"
            else "inferred from the curves"
            if gil["pinned"]
            else "bounded only"
        )
        summary.append(
            f"GIL share {gil['fraction']:.2f} (interval {lo:.2f}-{hi:.2f}, {kind}; not a direct measurement)"
        )
    summary.extend(gil["notes"])
    summary.append(
        f"recommended: {recommended['executor']} x {recommended['concurrency']} -> "  # type: ignore[index]
        f"{fmt_q(recommended['qps'])} items/s ({recommended['why']})"  # type: ignore[index]
    )
    summary.extend(entry["problems"])
    return entry


def _main_gil_overhead(sr: StageRows, harness: str, executor: str, concurrency: int) -> float:
    """Per-item GIL time the harness spends in the main process for this setting.

    Thread and async stages: the no-op ceiling of the same setting. Process
    stages schedule, pickle and unpickle every item in the main process (the
    event loop or driver, the pool's feeder and manager threads): their process
    no-op ceiling is limited by that serial work, so its time per item
    (:func:`harness_gil_s`: 1/throughput or CPU per item, whichever is
    smaller) stands for it. Charging only the thread ceiling's scheduling
    cost, as before, left the IPC out: a pipeline with one process stage ran
    at 277 items/s where that predicted 503. Without a process ceiling, the
    thread ceiling at the same concurrency is the fallback.
    """
    if executor == "process":
        ceil = sr.ceiling(harness, "process", concurrency)
        return harness_gil_s(ceil if ceil is not None else sr.ceiling(harness, "thread", concurrency))
    return harness_gil_s(sr.ceiling(harness, executor, concurrency))


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


def _cores(prov: Mapping[str, Any]) -> int:
    for key in ("usable_cores", "cpu_count"):
        v = prov.get(key)
        if isinstance(v, (int, float)) and v >= 1:
            return int(v)
    return usable_cores()


def _run_warnings(df: pd.DataFrame, stages: list[dict], meta: Mapping[str, Any], cores: int) -> list[str]:
    from stagebench.runs._provenance import load_warnings

    out: list[str] = []
    status = meta.get("status")
    if status in ("interrupted", "terminated", "running"):
        how = {"interrupted": "interrupted (Ctrl-C)", "terminated": "terminated (SIGTERM)"}.get(
            str(status), "not finished (killed, or still running)"
        )
        out.append(f"the diagnosis was cut short: {how}; this summary covers the points measured before it")
    for st in meta.get("stages") or []:
        if st.get("inputs_cut"):
            out.append(f"{st.get('name')}: {st['inputs_cut']}")
    prov = meta.get("provenance") or {}
    if prov:
        out.extend(load_warnings(prov, meta.get("provenance_after")))
    if prov.get("free_threaded"):
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
    for st in stages:
        for key, fit in (st.get("fit") or {}).items():
            w = fit.get("warning") or ""
            if "poor fit" in w:
                poor.append(f"{st['name']} ({key}, R² {fit['r2']:.2f})")
            elif w:
                few.append(f"{st['name']} ({key})")
    # one line each: the per-curve details stay in each stage's fit entry
    if few:
        out.append(f"curve fits are indicative only (fewer than 4 concurrency levels): {', '.join(few)}")
    if poor:
        out.append(f"poor fit: the USL does not describe these curves well: {', '.join(poor)}")
    return out


def _run_context(rows: Any, meta: dict | None) -> tuple[dict, pd.DataFrame, int, bool, dict | None]:
    """What every pipeline analysis of a run reads first: (meta, rows with string stage names, cores,
    free-threaded, SPDL's no-op pipeline cost or None)."""
    meta = dict(meta or {})
    prov = meta.get("provenance") or {}
    df = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows)
    if "stage" not in df.columns:
        df = df.assign(stage=pd.Series(dtype=str))
    df = df.assign(stage=df["stage"].fillna("").astype(str))
    return meta, df, _cores(prov), bool(prov.get("free_threaded")), pipeline_overhead(meta.get("pipeline_overhead"))


def _fixed(overhead: dict | None) -> float:
    """SPDL's per-item cost a pipeline pays once (source, sink, consumer), 0 where it was not measured."""
    return float((overhead or {}).get("fixed_s_per_item") or 0.0)


def _stage_entries(
    df: pd.DataFrame, meta: dict, cores: int, free_threaded: bool, stage_cache: dict | None
) -> list[dict]:
    """Each declared stage's analysis (:func:`analyze_stage`) with its place in the pipeline, in pipeline order."""
    declared = list(meta.get("stages") or [])
    names = [str(s.get("name", "")) for s in declared]
    for extra in df["stage"].unique():
        if extra and extra not in names:
            names.append(extra)
            declared.append({"name": extra})
    stages: list[dict] = []
    for i, (name, decl) in enumerate(zip(names, declared)):
        part = df[df["stage"] == name]
        key = (name, cores, free_threaded, len(part))
        if stage_cache is not None and key in stage_cache:
            entry = copy.deepcopy(stage_cache[key])
        else:
            entry = (
                analyze_stage(part, cores=cores, free_threaded=free_threaded, gil_probe=decl.get("gil_probe"))
                if len(part)
                else _unmeasured(name)
            )
            if stage_cache is not None:
                stage_cache[key] = copy.deepcopy(entry)
        entry["name"] = name
        entry["index"] = decl.get("index", i)
        entry["type"] = decl.get("type", "pipe")
        entry["is_async"] = bool(decl.get("is_async", False))
        entry["items_per_input"] = float(decl.get("items_per_input") or 1.0)
        for field in ("user_executor", "user_concurrency"):
            if field in decl:
                entry[field] = decl[field]
        if decl.get("head_to_head_skipped") and entry.get("recommended"):
            entry["head_to_head_skipped"] = decl["head_to_head_skipped"]
            entry["recommended"]["why"] += f"; {decl['head_to_head_skipped']}"
        stages.append(entry)
    for name in unfuse(stages, meta):  # fused measurements counted once: in the bounds, the joint choice, the replay
        _relabel_unfused(next(st for st in stages if st["name"] == name))
    return stages


def process_headroom_of_run(
    rows: pd.DataFrame, meta: dict, pending: dict[str, list[int]], *, stage_cache: dict | None = None
) -> dict[str, dict]:
    """:func:`stagebench.analysis._joint.process_headroom` on a diagnosis's rows so far (its thread points)."""
    from stagebench.analysis._joint import process_headroom

    meta, df, cores, free_threaded, overhead = _run_context(rows, meta)
    stages = _stage_entries(df, meta, cores, free_threaded, stage_cache)
    return process_headroom(stages, pending, cores=cores, free_threaded=free_threaded, fixed=_fixed(overhead))


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
    from stagebench.analysis._joint import recommend_jointly
    from stagebench.core._measure import empty_row
    from stagebench.core._paired import HOST_PHASES

    meta, df, cores, free_threaded, overhead = _run_context(rows, meta)
    fixed = _fixed(overhead)
    demand = num_or_none((meta.get("settings") or {}).get("target_rate"))
    cache = stage_cache if stage_cache is not None else {}
    _stage_entries(df, meta, cores, free_threaded, cache)  # every stage as measured, analysed once
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
                    {**empty_row(name, "paired", ex, harness, c), "status": "ok", "qps": q, "qps_low": q, "qps_high": q}
                    for ex, c, q in (tw, pw, pw, tw)  # one round, T P P T: two pairs
                ]
            )
            mine = {k: v for k, v in cache.items() if k[0] != name}  # this stage analysed afresh each time
            stages = _stage_entries(pd.concat([df, fake], ignore_index=True), meta, cores, free_threaded, mine)
            recommend_jointly(stages, cores=cores, free_threaded=free_threaded, fixed=fixed, demand=demand)
            picks.append(
                {
                    st["name"]: (st["recommended"]["executor"], st["recommended"]["concurrency"])
                    for st in stages
                    if st.get("recommended")
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


def job_candidates_of_run(rows: Any, meta: dict, demand: Mapping[str, Any] | float | None) -> Any:
    """The settings to run the user's loop with (:func:`stagebench.analysis._pipeline_job.job_candidates`);
    ``demand``: the trainer's record (its rate and interval) or a rate."""
    from stagebench.analysis._pipeline_job import job_candidates
    from stagebench.model._rate import Rate

    rate = Rate.from_json(demand) if isinstance(demand, Mapping) else (Rate(float(demand)) if demand else None)
    meta, df, cores, free_threaded, overhead = _run_context(rows, meta)
    stages = _stage_entries(df, meta, cores, free_threaded, None)
    return job_candidates(stages, meta, demand=rate, cores=cores, free_threaded=free_threaded, fixed=_fixed(overhead))


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
    from stagebench._version import __version__
    from stagebench.analysis._findings import build_findings
    from stagebench.analysis._job import alone_scope, decide_job, trainer_summary
    from stagebench.analysis._joint import recommend_jointly
    from stagebench.analysis._pipeline_job import apply_job_pick
    from stagebench.analysis._predict import apply_replay, predict_pipeline
    from stagebench.runs._schema import SUMMARY_SCHEMA_VERSION

    meta, df, cores, free_threaded, overhead = _run_context(rows, meta)
    stages = _stage_entries(df, meta, cores, free_threaded, stage_cache)
    # the stages' settings chosen together (each stage's own best alone is kept beside it)
    target = (meta.get("settings") or {}).get("target_rate")
    joint = recommend_jointly(
        stages,
        cores=cores,
        free_threaded=free_threaded,
        fixed=_fixed(overhead),
        demand=num_or_none(target),
    )
    prediction = (
        predict_pipeline(stages, cores=cores, free_threaded=free_threaded, overhead=overhead) if stages else None
    )
    prediction = apply_replay(prediction, meta.get("replay"))
    speed = cpu_speed(meta.get("cpu_speed"))
    validation = _validation(meta.get("validation"), prediction, df, stages)
    # the CPU's speed first: on a host that changes it, it outweighs every other noise source
    warnings = _speed_warnings(speed) + _run_warnings(StageRows(df).all, stages, meta, cores)
    if prediction and prediction.get("caveat"):
        warnings.append(prediction["caveat"])
    raw_val = meta.get("validation")
    failed = raw_val.get("failed") if isinstance(raw_val, Mapping) else None
    if validation is None and isinstance(raw_val, Mapping) and raw_val.get("error") and not failed:
        warnings.append(f"the whole-pipeline validation run did not complete: {raw_val['error']}")
    not_isolated = list(meta.get("not_isolated") or [])
    yours = yours_verdict(meta.get("yours"), validation, stages)
    # the training job, where it ran with the user's loop: its pick becomes every stage's recommendation
    # (after the prediction and the whole-pipeline runs, which were made at the isolated choice)
    job = decide_job(meta.get("job"), meta.get("trainer"), unit="items/s")
    if job is not None and job["status"] == "decided":
        job["changed"] = apply_job_pick(stages, job)
    findings = build_findings(
        stages,
        prediction=prediction,
        validation=validation,
        warnings=warnings,
        not_isolated=not_isolated,
        cores=cores,
        page_fault=meta.get("page_fault"),
        yours=yours,
        job=job,
    )
    return {
        "schema_version": SUMMARY_SCHEMA_VERSION,
        "kind": "pipeline",
        "stagebench_version": __version__,
        "provenance": meta.get("provenance") or {},
        "settings": meta.get("settings") or {},
        # a pipeline that delivers nothing has no throughput to predict: that, not the prediction, is the verdict
        "verdict": f"validation failed: {failed}"
        if failed
        else str(job["text"])
        if job is not None and job["status"] == "decided"
        else _verdict(stages, prediction, validation, not_isolated),
        "validation_failed": failed,
        "warnings": warnings,
        "cores": cores,
        "stages": stages,
        "not_isolated": not_isolated,
        "joint": joint,
        "prediction": prediction,
        "validation": validation,
        "recommended_vs_yours": yours,
        "trainer": trainer_summary(meta.get("trainer"), job),
        "job": job,
        "scope": alone_scope(
            "the pipeline",
            meta.get("trainer"),
            meta.get("settings") or {},
            planned=(meta.get("settings") or {}).get("trainer") == "measure",
        ),
        "demand": demand_verdict(
            (meta.get("settings") or {}).get("target_rate"), validation, prediction, meta.get("trainer"), job
        ),
        "cpu_speed": speed,
        "findings": findings,
    }


def demand_verdict(
    target: Any,
    validation: Mapping[str, Any] | None,
    prediction: Mapping[str, Any] | None,
    trainer: Mapping[str, Any] | None = None,
    job: Mapping[str, Any] | None = None,
) -> dict | None:
    """Whether the pipeline keeps up with the training step's demand, and what the job did.

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
    trainer = trainer or {}
    measured = not (finite(target) and float(target) > 0) and finite(trainer.get("samples_per_s"))
    if measured:
        target = trainer["samples_per_s"]
    if not finite(target) or not float(target) > 0:
        return None
    need = float(target)
    whose = (
        f"your training step, measured: {fmt_q(need)} items/s"
        + (
            f" ({fmt_q(trainer['samples_per_s_low'])}-{fmt_q(trainer['samples_per_s_high'])})"
            if finite(trainer.get("samples_per_s_low")) and finite(trainer.get("samples_per_s_high"))
            else ""
        )
        if measured
        else f"the {fmt_q(need)} items/s the trainer needs"
    )
    wp = trainer.get("with_pipeline") or {}
    waited = (
        f"; run together, your loop waited for data {wp['data_wait_share']:.0%} of each step"
        if measured and finite(wp.get("data_wait_share"))
        else ""
    )
    val = validation or {}
    pred = prediction or {}
    if finite(val.get("qps")):
        capacity, low, high, source = val["qps"], val.get("qps_low"), val.get("qps_high"), "measured"
    elif pred.get("method") == "replay" and finite(pred.get("qps")):
        capacity, low, high, source = pred["qps"], pred.get("qps_low"), pred.get("qps_high"), "replayed"
    else:
        return {
            "target_rate": need,
            "capacity": None,
            "source": None,
            "verdict": "inconclusive",
            "demand_source": "measured" if measured else "stated",
            "text": f"inconclusive: the whole pipeline was neither run nor replayed, so its capacity against "
            f"{whose} is not known{waited}",
        }
    capacity = float(capacity)
    ratio = capacity / need
    base = {
        "target_rate": need,
        "capacity": capacity,
        "capacity_low": low,
        "capacity_high": high,
        "source": source,
        "ratio": ratio,
    }
    if job is not None and job.get("status") == "decided" and job.get("bound"):
        return {
            **base,
            "verdict": job["bound"],
            "demand_source": "measured" if measured else "stated",
            "data_wait_share": job.get("data_wait_share"),
            "job_samples_per_s": job.get("samples_per_s"),
            "text": f"{job['bound']}: your job ran {fmt_q(job['samples_per_s'])} items/s at the recommended "
            f"settings, {job['data_wait_share']:.0%} of each step waiting for data, against {whose}; the "
            f"pipeline alone gave {fmt_q(capacity)} items/s ({source}) at the isolated sweep's pick",
        }
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
    return {
        **base,
        "verdict": verdict,
        "demand_source": "measured" if measured else "stated",
        "data_wait_share": wp.get("data_wait_share") if measured else None,
        "text": f"{verdict}: the pipeline {text} ({fmt_q(capacity)} items/s {source} at the recommended "
        f"settings against {whose}, {ratio:.2f}x){waited}{not_run}",
    }


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
    from stagebench.analysis._pipeline_job import settings_cost
    from stagebench.model._evidence import Option, Ratio, decide
    from stagebench.model._rate import Rate

    if not recommended_rates or not your_rates:
        return None
    pooled = rates or (
        Rate(sum(recommended_rates) / len(recommended_rates)),
        Rate(sum(your_rates) / len(your_rates)),
    )
    full_yours = {**recommended, **yours}
    pairs = list(zip(recommended_rates, your_rates))

    def ratio(a: str, b: str) -> Ratio | None:
        return Ratio.of_pairs(pairs if a == "recommended" else [(y, x) for x, y in pairs])

    options = [
        Option("recommended", settings_cost(recommended), pooled[0]),
        Option("yours", settings_cost(full_yours), pooled[1]),
    ]
    return decide(options, yours="yours", ratio=ratio)


def yours_verdict(yours: Any, validation: Mapping[str, Any] | None, stages: list[dict]) -> dict | None:
    """The recommended settings against the user's own, both run for real in turns (``run.json["yours"]``),
    by the rule of :mod:`stagebench.model._evidence` on their windows' ratio.

    ``recommended``: faster than yours beyond noise; ``cheaper``: fewer workers, and within 5% of
    yours, shown; ``yours``: yours faster beyond noise (keep them); ``could not tell``: the windows in
    turns could not tell them apart, so yours are kept (the ratio's interval, and how many rounds
    would settle it); ``same``: the user's settings are the recommended ones; ``inconclusive``: one
    of the two runs has no number; ``not run``: neither was run (quick mode,
    ``STAGEBENCH_VALIDATE=off``). ``changes`` lists each stage whose setting differs (its name, the
    user's and the recommended setting); ``decision`` is the rule's record.
    """
    from stagebench.analysis._pipeline_job import user_choice
    from stagebench.model._rate import Rate

    if not isinstance(yours, Mapping):
        return None
    if yours.get("same"):
        return {"verdict": "same", "changes": [], "text": "your settings are the recommended ones"}
    changes = []
    recommended: dict[str, tuple[str, int]] = {}
    mine: dict[str, tuple[str, int]] = {}
    for st in stages:
        point, own = st.get("recommended") or {}, user_setting(st)
        if point.get("executor") and finite(point.get("concurrency")) and (st.get("type") or "pipe") == "pipe":
            recommended[str(st["name"])] = (str(point["executor"]), int(point["concurrency"]))
        if (c := user_choice(st)) is not None:
            mine[str(st["name"])] = c
        if own and point.get("executor") and own != f"{point['executor']} x {point['concurrency']}":
            changes.append(
                {"stage": st["name"], "yours": own, "recommended": f"{point['executor']} x {point['concurrency']}"}
            )
    out: dict[str, Any] = {
        "qps": yours.get("qps"),
        "qps_low": yours.get("qps_low"),
        "qps_high": yours.get("qps_high"),
        "settings": yours.get("settings"),
        "changes": changes,
    }
    val = validation or {}
    if yours.get("not_run"):
        out.update(
            verdict="not run",
            text=f"not checked against your settings ({yours['not_run']}): keep yours until a full diagnosis "
            "runs both in turns",
        )
        return out
    if not finite(yours.get("qps")) or not finite(val.get("qps")):
        which = "your settings" if not finite(yours.get("qps")) else "the recommended settings"
        err = yours.get("error") if not finite(yours.get("qps")) else val.get("error")
        out.update(
            verdict="inconclusive",
            text=f"inconclusive: the run at {which} gave no number" + (f" ({err})" if err else ""),
        )
        return out
    r_rate, m_rate = Rate.from_json(val, "qps"), Rate.from_json(yours, "qps")
    assert r_rate is not None and m_rate is not None  # both finite above
    figures = f"{r_rate.text('items/s')} with the recommended settings, {m_rate.text()} with yours"
    from stagebench.model._evidence import Ratio

    rec_w, your_w = list(val.get("window_rates") or []), list(yours.get("window_rates") or [])
    d = versus_yours_decision(rec_w, your_w, recommended, mine, (r_rate, m_rate))
    x = Ratio.of_pairs(list(zip(rec_w, your_w)))  # the recommended over yours, round by round
    if d is None or x is None:  # saved before the windows were kept: no ratio in turns to decide on
        out.update(
            verdict="could not tell",
            ratio=r_rate.value / m_rate.value if m_rate.value > 0 else None,
            text=f"keep yours: the runs kept no windows in turns to compare them by; {figures}",
        )
        return out
    from stagebench.model._evidence import EQUIVALENT, PRACTICAL_ROUNDS

    if d.advice == "change":
        verdict, text = "recommended", f"the recommended settings are faster beyond noise, {x.text('yours')}: {figures}"
    elif d.advice == "cheaper":
        verdict, text = (
            "cheaper",
            f"the recommended settings are as fast within {1 - EQUIVALENT:.0%} with fewer workers, "
            f"{x.text('yours')}: {figures}",
        )
    elif x.below(1.0):
        verdict, text = (
            "yours",
            f"your settings are faster beyond noise: keep them; the recommended ran {x.text('yours')}: {figures}",
        )
    elif d.settled:  # yours the fastest, the recommended costlier: nothing it could gain once the rounds say so
        verdict, text = (
            "yours",
            f"keep yours: the recommended settings use more workers and were not shown faster, {x.text('yours')}: "
            f"{figures}",
        )
    else:
        more = (
            f"; about {d.rounds_to_settle - x.rounds} more rounds in turns would settle it at the spread seen"
            if d.rounds_to_settle is not None and 0 < d.rounds_to_settle - x.rounds <= PRACTICAL_ROUNDS
            else "; at the spread seen, no practical number of rounds would settle it"
        )
        verdict, text = (
            "could not tell",
            f"keep yours: the runs could not tell the recommended settings from yours, {x.text('yours')}{more}; "
            f"{figures}",
        )
    out.update(verdict=verdict, ratio=x.value, ratio_low=x.low, ratio_high=x.high, decision=d.to_json(), text=text)
    return out


def _unmeasured(name: str) -> dict[str, Any]:
    from stagebench.runs._schema import STAGE_COLUMNS

    entry = analyze_stage(pd.DataFrame(columns=list(STAGE_COLUMNS)), cores=1)
    entry.update(name=name, status="skipped", reason="not measured: no rows for this stage")
    entry["evidence"]["summary"] = ["not measured: no rows for this stage"]
    return entry


def _validation(
    val: Any, prediction: dict | None, rows: pd.DataFrame | None = None, stages: list[dict] | None = None
) -> dict | None:
    if not isinstance(val, Mapping) or not finite(val.get("qps")):
        return None
    out = dict(val)
    pred = (prediction or {}).get("qps")
    measured = float(val["qps"])
    # relative error of the prediction against the measurement: +0.10 = predicted 10% too high
    out["error_vs_prediction"] = (
        (pred - measured) / measured if pred is not None and finite(pred) and measured > 0 else None
    )
    replay = (prediction or {}).get("replay") or {}
    out["interference"] = _interference(val.get("stage_latency"), rows, stages or [], replay.get("stage_latency"))
    return out


def _interference(
    lat: Any, rows: pd.DataFrame | None, stages: list[dict], replay_lat: Any = None
) -> list[dict[str, Any]]:
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
    if not isinstance(lat, Mapping) or rows is None or not len(rows):
        return []
    out = []
    for st in stages:
        name, rec = st.get("name"), st.get("recommended") or {}
        got = lat.get(name)
        if not isinstance(got, Mapping) or not finite(got.get("p50_ms")) or not rec:
            continue
        hit = rows[
            (rows["stage"] == name)
            & (rows["role"] == "stage")
            & (rows["status"] == "ok")
            & (rows["harness"] == rec.get("harness"))
            & (rows["executor"] == rec.get("executor"))
            & (rows["concurrency"] == rec.get("concurrency"))
        ]
        alone = float(hit["latency_p50_ms"].iloc[0]) if len(hit) else math.nan
        stood = (replay_lat or {}).get(name) if isinstance(replay_lat, Mapping) else None
        rep = float(stood["p50_ms"]) if isinstance(stood, Mapping) and finite(stood.get("p50_ms")) else math.nan
        out.append(
            {
                "stage": name,
                "in_pipeline_p50_ms": float(got["p50_ms"]),
                "calls": got.get("calls"),
                "alone_p50_ms": alone if finite(alone) else None,
                "ratio": float(got["p50_ms"]) / alone if finite(alone) and alone > 0 else None,
                "replay_p50_ms": rep if finite(rep) else None,
                "vs_replay": float(got["p50_ms"]) / rep if finite(rep) and rep > 0 else None,
            }
        )
    return out


# ------------------------------------------------------------------ the CPU's speed
_SPEED_SPREAD = 1.25  # sweep probes further apart than this: warn
_SPEED_SHIFT = 0.10  # validation this far from the sweeps' median: say so


def cpu_speed(raw: Any) -> dict[str, Any] | None:
    """The core's speed during the sweeps and the validation run, from ``run.json["cpu_speed"]``.

    ``sweep_ns``: a fixed Python loop's CPU ns per iteration after each measured
    point; ``validation_ns``: before and after the validation run (see
    :mod:`stagebench.core._speed`). Lower is faster.
    """
    if not isinstance(raw, Mapping):
        return None
    sweep = [float(x) for x in raw.get("sweep_ns") or [] if finite(x) and float(x) > 0]
    val = [float(x) for x in raw.get("validation_ns") or [] if finite(x) and float(x) > 0]
    if not sweep:
        return None
    out: dict[str, Any] = {
        "sweep_ns_median": float(np.median(sweep)),
        "sweep_ns_min": min(sweep),
        "sweep_ns_max": max(sweep),
        "probes": len(sweep),
        "validation_ns": float(np.mean(val)) if val else None,
        "validation_ns_probes": val,
    }
    out["sweep_spread"] = out["sweep_ns_max"] / out["sweep_ns_min"]
    return out


def _speed_warnings(speed: dict | None) -> list[str]:
    if not speed:
        return []
    out = []
    if speed["sweep_spread"] > _SPEED_SPREAD:
        out.append(
            f"the CPU's speed changed during the sweeps: a fixed Python loop took {speed['sweep_ns_min']:.0f}-"
            f"{speed['sweep_ns_max']:.0f} ns per iteration ({speed['sweep_spread']:.1f}x; a shared host's other "
            "tenants do this): CPU-bound points measured at different moments can differ by that much"
        )
    v, m = speed.get("validation_ns"), speed["sweep_ns_median"]
    if finite(v) and abs(m / v - 1) > _SPEED_SHIFT:
        # Only said, not corrected: scaling the prediction by this ratio made it worse in 2 of
        # 3 benchmark pipelines (the speed flips within the validation window itself).
        out.append(
            f"the CPU ran at another speed around the validation run than during the sweeps ({v:.0f} vs a "
            f"median {m:.0f} ns per loop): the measured pipeline and the prediction compare different moments"
        )
    return out


#: A pipeline that runs this many times under the lowest bound of its measured stages is bound by none of them.
FAR_UNDER_BOUNDS = 1.5
#: Over this share of the GIL an item needs being the pipeline's own scheduling, the scheduling is what binds.
SCHEDULING_BINDS = 0.5


def _verdict(
    stages: list[dict],
    prediction: dict | None,
    validation: Mapping[str, Any] | None = None,
    not_isolated: list[dict] | None = None,
) -> str:
    """What binds the pipeline, in one line: what binds the *measured* pipeline where it was run.

    Where the pipeline (measured, else replayed) runs well under every bound its measured stages
    set (:data:`FAR_UNDER_BOUNDS`), none of them binds it: the line names the parts that could not
    run alone, or the pipeline's own scheduling; where the GIL binds and most of what it holds per
    item is the pipeline's own scheduling, that is named rather than the stage holding the most.
    """
    ok = [s for s in stages if s["status"] == "ok"]
    if not ok:
        return "no stage could be measured: see the stage reasons and warnings"
    failed = [s["name"] for s in stages if s["status"] != "ok"]
    if prediction is None or not finite(prediction.get("qps")):
        return "no prediction could be made: see the stage reasons"
    name = prediction["bottleneck"]
    st = next((s for s in ok if s["name"] == name), None)
    cls = st["classification"] if st else "unknown"
    q = fmt_q(prediction["qps"])
    val = validation or {}
    runs, how = (num(val.get("qps")), "measured") if finite(val.get("qps")) else (num(prediction["qps"]), "predicted")
    lowest = num(prediction.get("bounds_qps"))
    sched = num(prediction.get("scheduling_gil_s_per_item"))
    gil_bound = num((prediction.get("bounds") or {}).get("gil"))
    if finite(runs, lowest) and lowest > FAR_UNDER_BOUNDS * runs:
        parts = [str(x.get("name")) for x in not_isolated or []]
        what = (
            f"the parts that could not run alone bind ({', '.join(parts)}: under not isolated)"
            if parts
            else "the stages together bind (the pipeline's scheduling: hand-offs, and the cores and GIL they share)"
        )
        line = (
            f"{what}: the pipeline runs at {fmt_q(runs)} items/s ({how}), {lowest / runs:.1f}x under "
            f"the lowest bound of its measured stages ({prediction.get('binding')}, {fmt_q(lowest)} items/s)"
        )
    elif prediction["binding"] == "gil" and finite(sched, gil_bound) and sched > SCHEDULING_BINDS / gil_bound:
        line = (
            f"the GIL binds, held mostly by the pipeline's own scheduling ({fmt_ms(sched)} of the "
            f"{fmt_ms(1.0 / gil_bound)} each item needs): predicted {q} items/s; of the stages, {name} holds it "
            f"longest ({cls})"
        )
    # A shared resource that binds is the bottleneck, not the stage that uses most of it: SPDL's
    # pipeline_definitions.py read "normalize_to_lists is the bottleneck" for a stage 4.5x faster
    # alone than the pipeline, and named another stage run to run (the two held the GIL alike).
    elif prediction["binding"] == "gil" and name is None:
        line = f"the GIL binds: predicted {q} items/s; no stage's own Python holds it: the pipeline's scheduling does"
    elif prediction["binding"] == "gil":
        line = f"the GIL binds: predicted {q} items/s; {name} holds it longest ({cls})"
    elif prediction["binding"] == "cores" and name is None:
        line = f"the cores bind: predicted {q} items/s; the pipeline's own work uses them"
    elif prediction["binding"] == "cores":
        line = f"the cores bind: predicted {q} items/s; {name} uses the most CPU ({cls})"
    else:
        line = f"{name} is the bottleneck: {cls}; predicted {q} items/s (its own capacity binds)"
    if failed:
        line += f"; not measured: {', '.join(failed)}"
    return line
