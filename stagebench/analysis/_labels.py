"""What limits a stage: its label (what limits the stage itself, from its call alone) and its limit (what holds back its best setting).

The label is one decision table over the stage's call at its lowest thread (or event-loop) level, the
same on any core count (:func:`nature`): shorter than the harness's cost per item, ``overhead-bound``;
else the largest share of the call, decided with the GIL share's noise (:func:`label_of_call`). The
limit is a second, separate fact (:func:`limit_rules`): the harness's ceiling, IPC on processes, the
GIL busy, the cores, a curve still rising, a lock; or nothing that stands out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stagebench._numbers import SourceItems, finite, fmt_above, fmt_share_of, num
from stagebench.analysis._gil import harness_gil_s
from stagebench.core._curves import Curve, Point, StageRows
from stagebench.model._stage import GilEstimate, StageEntry, StageLimit, StageSetting, changed, keyed

__all__ = [
    "CLASSIFICATIONS",
    "LIMIT_OF",
    "LIMIT_SHORT",
    "LIMIT_WORDS",
    "SHARE_NOISE",
    "TIE_ORDER",
    "label_of_call",
    "label_mix",
    "limit_rules",
    "limit_of",
    "nature",
    "relabel_unfused",
    "still_rising",
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
_LARGE_PAYLOAD = 64 * 1024  # bytes an item moves between processes, above which IPC may cost more than the work


# ------------------------------------------------------------------ classification
def still_rising(curve: Curve | None, src: SourceItems = SourceItems()) -> str | None:
    """Why the curve has not flattened at its largest measured level, or None (its rates in ``src``'s unit).

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
            f"still rising at the top of the grid ({src.q(top.qps)} items/s at {curve.executor} concurrency "
            f"{top.concurrency}, {top.qps / prev.qps:.2f}x the {src.q(prev.qps)} at {prev.concurrency})"
        )
    efficiency = top.qps / (top.concurrency * p0.qps / p0.concurrency)
    if efficiency >= _EFFICIENT:
        return (
            f"still rising at the top of the grid ({src.q(top.qps)} items/s at {curve.executor} concurrency "
            f"{top.concurrency}, {efficiency:.0%} of linear scaling)"
        )
    return None


#: A verdict of one limit rule: ``(kind, lines)``, the kind one of :data:`LIMIT_OF`'s keys.
_Verdict = tuple[str, list[str]]


@dataclass(frozen=True, slots=True, kw_only=True)
class _AtBest:
    """The stage at its best setting, as every limit rule reads it; the rules add to ``signals``. Its
    lines state rates and times per source item (``src``)."""

    sr: StageRows
    harness: str
    ex: str
    c: int
    bp: Point
    ceil: Point | None
    bests: dict[str, Point]
    gil: GilEstimate
    cores: float
    signals: dict[str, dict]
    src: SourceItems

    @property
    def u(self) -> float:
        """Cores used at the best point."""
        return self.bp.cores_used


def limit_rules(
    sr: StageRows,
    harness: str,
    best: StageSetting,
    bests: dict[str, Point],
    gil: GilEstimate,
    cores: float,
    src: SourceItems = SourceItems(),
) -> tuple[str, list[str], dict[str, dict]]:
    """What limits the stage at its best setting: the first of the rules below that holds, in order.

    ``(kind, lines, signals)``, the kind one of :data:`LIMIT_OF`'s keys. The rules: near the harness's
    no-op ceiling (the harness, or IPC on processes); a large payload whose transfer costs more CPU
    than the work; a GIL that flattens the thread curve; the GIL busy at the best point; the cores
    full; threads serialised by something other than the GIL; and last, the stage's own work (the
    harness's pace, waiting, or nothing that stands out). ``src``: the unit of the lines' rates and times.
    """
    ex, c = best.executor, best.concurrency
    assert ex is not None and c is not None  # ``best`` is a measured point (_recommend)
    bp = sr.curve(harness, ex).at(c)
    assert bp is not None  # ``best`` is a point of this curve (_recommend)
    at = _AtBest(
        sr=sr,
        harness=harness,
        ex=ex,
        c=c,
        bp=bp,
        ceil=sr.ceiling(harness, ex, c),
        bests=bests,
        gil=gil,
        cores=cores,
        signals={},
        src=src,
    )
    _record_best(at)
    verdict = _near_ceiling(at) or _large_payload(at) or _gil_flattens(at)
    rising_note: str | None = None
    if verdict is None:
        verdict, rising_note = _gil_busy_at_best(at)
    verdict = verdict or _cores_full(at) or _serialised(at) or _own_work(at, rising_note)
    return verdict[0], verdict[1], at.signals


def _record_best(at: _AtBest) -> None:
    """The best point's signals every verdict shows: its cores used, and its share of the no-op ceiling."""
    if finite(at.u):
        at.signals["cores_used_at_best"] = {
            "value": at.u,
            "interval": None,
            "label": f"cores used at the best point ({at.ex} concurrency {at.c}), of {at.cores} usable",
        }
    if at.ceil is not None:
        at.signals["ceiling_share"] = {
            "value": at.bp.qps / at.ceil.qps,
            "interval": None,
            "label": f"best throughput / no-op ceiling of the {at.harness} harness at {at.ex} concurrency {at.c}",
        }


def _near_ceiling(at: _AtBest) -> _Verdict | None:
    """Near the harness's no-op ceiling: the harness's cost per item is the limit, or on processes
    that do not fill the cores, moving items between them (processes that fill the cores are held
    back by the cores, not the transfer)."""
    if at.ceil is None:
        return None
    ex, c, bp, ceil, harness, src = at.ex, at.c, at.bp, at.ceil, at.harness, at.src
    share = bp.qps / ceil.qps
    near = share >= _NEAR_CEILING
    if near and ex != "process":
        return (
            "overhead-bound",
            [
                f"{src.q(bp.qps)} items/s at {ex} concurrency {c} is {fmt_share_of(share)} the {harness} harness's "
                f"no-op ceiling ({src.q(ceil.qps)} items/s{fmt_above(share)}): the per-item work is smaller than the "
                "per-item overhead"
            ],
        )
    if near and not (finite(at.u) and at.u >= _CPU_BOUND * at.cores):
        return (
            "ipc-bound",
            [
                f"on processes it reaches {src.q(bp.qps)} items/s at concurrency {c}, {fmt_share_of(share)} the "
                f"process no-op ceiling ({src.q(ceil.qps)} items/s{fmt_above(share)}): moving items between "
                "processes is the limit"
            ],
        )
    return None


def _large_payload(at: _AtBest) -> _Verdict | None:
    """On processes with a large payload: IPC, where moving an item costs more CPU than the work on threads."""
    payload = at.sr.payload_bytes()
    if not (at.ex == "process" and finite(payload) and payload >= _LARGE_PAYLOAD):
        return None
    pt = at.sr.curve(at.harness, "thread").at(at.c)
    if pt is None or not finite(pt.cpu_s_per_item, at.bp.cpu_s_per_item):
        return None
    ipc_cpu = at.bp.cpu_s_per_item - pt.cpu_s_per_item
    src = at.src
    if ipc_cpu > pt.cpu_s_per_item:
        ipc, work = src.ms_each(ipc_cpu, pt.cpu_s_per_item)
        return (
            "ipc-bound",
            [
                f"each item moves {src.per_item(payload) / 1024:,.0f} KiB between processes; that costs "
                f"{ipc} of CPU per item, more than the work itself ({work} on threads)"
            ],
        )
    return None


def _gil_flattens(at: _AtBest) -> _Verdict | None:
    """The GIL estimate says the GIL serialises the threads and their curve has flattened: the GIL.

    A GIL that binds caps the thread curve; one still rising at the top of the grid has not met it,
    whatever small GIL share its CPU suggests. The rule reads the GIL estimate's curve. Measured
    through SPDL, a curve also flattens on SPDL's own per-item Python (its event loop holds the GIL
    to schedule every item): where the stage holds it less than half as long, the harness is the limit.
    Not where the best point is on processes: the rules after this one say what holds them back.
    """
    gil, harness, src = at.gil, at.harness, at.src
    if at.ex == "process":
        # Best on processes, each with its own GIL: the GIL that flattens the threads does not hold it back
        # there (the demo's augment read "alone at process x 4: limited by the GIL")
        return None
    gil_curve = at.sr.curve(gil.harness or harness, gil.executor or "thread")
    tb = at.bests.get(gil.executor or "thread")
    if not (gil.saturated and gil.serializer == "gil" and tb is not None and not still_rising(gil_curve)):
        return None
    f = gil.fraction
    g_own = gil.gil_s_per_item
    h = harness_gil_s(at.sr.ceiling(gil.harness or harness, gil.executor or "thread", tb.concurrency))
    held, whole, by_harness = src.ms_each(num(gil.gil_s_per_item), num(gil.stage_s_per_item), h)
    lines = [
        f"{gil.executor}s flatten at {src.q(tb.qps)} items/s (concurrency {tb.concurrency}, "
        f"{tb.cores_used:.2f} of {at.cores} cores): the stage holds the GIL about {f:.0%} of each item "
        f"({held} of {whole})"
    ]
    if g_own is not None:
        # The harness's own Python holds the same GIL: a stage that holds it 4% of its call can meet it at
        # 16 threads together with SPDL's scheduling (the demo's read: 41% its own, 100% with the harness's)
        where = f"where the {gil.executor}s flatten (concurrency {tb.concurrency})"
        busy = _record_gil_busy(at, tb, g_own, h, where, "verdict")
    if g_own is not None and h > 0 and g_own < _OWN_GIL_SHARE * h:
        return (
            "overhead-bound",
            [
                lines[0] + f", under half of the {by_harness} the harness's own per-item Python holds it: "
                "the per-item scheduling is the limit"
            ],
        )
    if g_own is not None and h > 0:
        lines[0] += f"; with the harness's {by_harness} an item, the GIL is held about {busy:.0%} of the time"
    pb = at.bests.get("process")
    if pb is not None:
        lines.append(f"processes, each with its own GIL, reach {src.q(pb.qps)} items/s (concurrency {pb.concurrency})")
    return "gil-bound", lines


def _record_gil_busy(at: _AtBest, p: Point, g: float, h: float, where: str, role: str) -> float:
    """The share of the time the GIL is held at ``p`` (the stage's own ``g`` and the harness's ``h`` an
    item, times one rank's rate: its GIL, not the host's), recorded as the ``gil_busy_at_best`` signal."""
    busy = p.qps / p.lanes * (g + h)
    at.signals["gil_busy_at_best"] = {
        "value": busy,
        "interval": None,
        "label": f"share of the time the GIL is held {where}: throughput x (the stage's own GIL time + the "
        "harness's per item)",
        "role": role,
    }
    return busy


def _gil_busy_at_best(at: _AtBest) -> tuple[_Verdict | None, str | None]:
    """The GIL busy at the best point itself (threads or async): ``(verdict, rising note)``.

    The busy share is the stage's own GIL time plus the harness's per item, times the throughput: it
    catches a GIL that saturates only together with SPDL's own Python, at the top of the curve. A
    verdict rests on this share, not on the stage's own GIL share (which can be small). A busy GIL on
    a curve still rising is no verdict: the note says so, for the last rule's lines. Nor is a share
    the curves only bound from above (``gil.pinned`` false): the rules after this one decide.
    """
    ex, c, bp, gil, src = at.ex, at.c, at.bp, at.gil, at.src
    g = gil.gil_s_per_item
    if not (ex in ("thread", "async") and g is not None and not gil.serializer == "other"):
        return None, None
    if not gil.pinned:
        # The curves bound the stage's GIL share only from above: its GIL time per item is the bound's
        # midpoint, a guess, and so is a busy share read from it. A verdict on it named the GIL beside a
        # label that gave the share as only bounded (an FFmpeg decode "81% busy" where the cores bind).
        return None, None
    rising = still_rising(at.sr.curve(at.harness, ex), src)
    h = harness_gil_s(at.sr.ceiling(at.harness, ex, c))
    busy = _record_gil_busy(at, bp, g, h, f"at the best point ({ex} concurrency {c})", "check")
    rate = f"{src.q(bp.qps / bp.lanes)} items/s" + (" a rank" if bp.lanes > 1 else "")
    own, by_harness = src.ms_each(g, h)
    line = (
        f"at {ex} concurrency {c}, {rate} x ({own} of the stage's own Python + {by_harness} "
        f"of the harness's) keeps the GIL {busy:.0%} busy"
    )
    if busy >= _NEAR_CEILING and rising:
        return None, f"{line}, yet the curve is {rising}: the GIL is not the limit yet"
    if busy >= _NEAR_CEILING:
        at.signals["gil_busy_at_best"]["role"] = "verdict"  # the verdict rests on it
        if g >= _OWN_GIL_SHARE * h:
            return ("gil-bound", [line + ": the GIL is the limit"]), None
        return ("overhead-bound", [line + ": mostly the harness's own per-item Python, the GIL is the limit"]), None
    return None, None


def _cores_full(at: _AtBest) -> _Verdict | None:
    """The cores: most of them used, or throughput x CPU per item near all of them."""
    u, cpu, cores = at.u, at.bp.cpu_s_per_item, at.cores
    if (finite(u) and u >= _CPU_BOUND * cores) or (finite(cpu) and cpu > 0 and at.bp.qps >= 0.8 * cores / cpu):
        return (
            "cpu-bound",
            [
                f"at {at.ex} concurrency {at.c} it uses {u:.2f} of {cores} cores ({at.src.ms(cpu)} CPU per item, "
                f"{at.src.q(at.bp.qps)} items/s): the cores are the limit"
            ],
        )
    return None


def _serialised(at: _AtBest) -> _Verdict | None:
    """Threads that flatten with little CPU and not on the GIL: something else serialises them."""
    gil = at.gil
    if gil.saturated and gil.serializer == "other":
        return (
            "unknown",
            [
                f"{gil.executor}s flatten using little CPU per item: something other than the GIL serialises them "
                "(a lock, or an external limit such as a disk or a server)"
            ],
        )
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class _OwnCores:
    """The cores the stage uses for its own work at its best point, the harness's scheduling taken out."""

    own_u: float
    """Cores for its own work (all the cores used where the harness's part is unknown)."""
    used: str
    """The cores used, in words."""
    own_cpu: float
    """Its own CPU per item (NaN where the harness's part is unknown)."""


def _own_cores(at: _AtBest) -> _OwnCores:
    """The stage's own cores at its best point, recorded as a signal where they can be read.

    The harness's per-item scheduling (its no-op ceiling's CPU per item at the same setting) is CPU
    the stage would not spend in any other harness: a stage that waits is judged on its own cores,
    both numbers shown.
    """
    u, cpu, cores, ceil, harness = at.u, at.bp.cpu_s_per_item, at.cores, at.ceil, at.harness
    if not (finite(u, cpu) and ceil is not None and finite(ceil.cpu_s_per_item) and ceil.cpu_s_per_item > 0):
        return _OwnCores(own_u=u, used=f"{u:.2f} of {cores} cores", own_cpu=math.nan)
    own_cpu = max(0.0, cpu - ceil.cpu_s_per_item)
    own_u = own_cpu * at.bp.qps
    at.signals["own_cores_at_best"] = {
        "value": own_u,
        "interval": None,
        "label": f"cores used by the stage itself at the best point: (CPU per item - the {harness} harness's "
        f"no-op CPU per item) x throughput, of {cores} usable",
    }
    own, by_harness = at.src.ms_each(own_cpu, ceil.cpu_s_per_item)
    used = (
        f"{own_u:.2f} of {cores} cores for its own work ({own} CPU per item; {u:.2f} cores with "
        f"the {harness} harness's own per-item scheduling, {by_harness} per item)"
    )
    return _OwnCores(own_u=own_u, used=used, own_cpu=own_cpu)


def _computing_share(gil: GilEstimate) -> Any:
    """The share of its call the stage computes when alone (None or NaN: unknown).

    The probe's GIL share is Python running, so computing, read directly; it is taken where it
    says more than the CPU share, which for a sub-microsecond call is a difference of two per-item
    CPU readings and reads low.
    """
    alone = gil.signal_value("cpu_share")
    probed = gil.signal_value("gil_probe")
    if finite(probed) and probed >= _COMPUTE_BOUND and not (finite(alone) and alone >= probed):
        alone = probed
    return alone


def _own_work(at: _AtBest, rising_note: str | None) -> _Verdict:
    """The last rule, on the stage's own work: the harness's pace, waiting, or nothing that stands out.

    Few cores of its own do not make a stage that computes a waiting one: a stage that computes most
    of its call when alone, with less work per item than the harness's own scheduling, is paced by the
    harness. A stage that waits (few cores of its own, scaling) is limited by its concurrency.
    ``rising_note`` (a busy GIL on a curve still rising) follows the verdict's line.
    """
    ex, c, bp, ceil, cores, src = at.ex, at.c, at.bp, at.ceil, at.cores, at.src
    p0 = at.sr.curve(at.harness, ex).points[0]
    linear_share = bp.qps / (bp.concurrency * p0.qps / p0.concurrency)
    own = _own_cores(at)
    lines = [rising_note] if rising_note else []
    alone = _computing_share(at.gil)
    computes = finite(alone) and alone >= _COMPUTE_BOUND
    # own_cpu is finite only with a ceiling; the explicit test is for the type checker
    if computes and ceil is not None and finite(own.own_cpu) and own.own_cpu < ceil.cpu_s_per_item:
        mine, by_harness = src.ms_each(own.own_cpu, ceil.cpu_s_per_item)
        lines.insert(
            0,
            f"at {ex} concurrency {c} it delivers {src.q(bp.qps)} items/s, {bp.qps / ceil.qps:.0%} of the "
            f"{at.harness} harness's no-op ceiling; its own work ({mine} CPU per item; it computes "
            f"{alone:.0%} of its call alone) is less than the harness's per-item scheduling "
            f"({by_harness}): the overhead sets the pace",
        )
        return "overhead-bound", lines
    if finite(own.own_u) and own.own_u < _IO_CORES * cores and (c > cores or linear_share >= 0.75) and not computes:
        lines.insert(
            0,
            f"at {ex} concurrency {c} it delivers {src.q(bp.qps)} items/s ({linear_share:.0%} of linear scaling) "
            f"using only {own.used}: it waits (I/O, sleep, GIL-free waiting)",
        )
        return "io-bound", lines
    lines.insert(0, f"at {ex} concurrency {c}: {src.q(bp.qps)} items/s, {own.used}; no single limit stands out")
    return "unknown", lines


#: What limits a stage at its best setting, from :func:`limit_rules`' verdict on it: the second fact,
#: beside the stage's own nature (:func:`nature`), that is the same on any core count.
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


def nature(sr: StageRows, gil: GilEstimate, src: SourceItems = SourceItems()) -> tuple[str, list[str], dict[str, dict]]:
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
    time, the label is ``unknown`` with what would settle it. The lines' times are per source item (``src``).
    """
    signals: dict[str, dict] = {}
    H, E = gil.harness, gil.executor
    t = num(gil.stage_s_per_item)
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
    h = c0 * ceil0.lanes / ceil0.qps if ceil0 is not None and finite(ceil0.qps) and ceil0.qps > 0 else math.nan
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
            call, by_harness = src.ms_each(own, h)
            return (
                "overhead-bound",
                [
                    f"its own call takes {call} per item, less than the {by_harness} the {H} harness spends "
                    f"per item on a no-op ({E} concurrency {c0}): scheduling an item costs more than the stage"
                ],
                signals,
            )
    A = num(gil.signal_value("cpu_share"))
    f = gil.fraction
    if f is not None and not gil.pinned and gil.interval:
        f = gil.interval[0]  # only bounded: "holds the GIL for most of its work" needs evidence, not a midpoint
    if not finite(A) and f is None:
        return (
            "unknown",
            [
                "neither the CPU of its call nor its GIL share could be read (no CPU counters at its lowest "
                "level): the GIL probe (STAGEBENCH_GIL_PROBE=auto) settles it"
            ],
            signals,
        )
    label, line, share_signals = label_of_call(own, A, num(f), f"{E} concurrency {c0}", src)
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


def label_of_call(
    own: float, A: float, f: float, where: str, src: SourceItems = SourceItems()
) -> tuple[str, str, dict[str, dict]]:
    """The table's last three rows (:func:`nature`): the largest share of the call; its line and signals.

    ``own``: the call's time (per source item in the line, ``src``); ``A``: its CPU share (NaN: unknown); ``f``: its GIL share (NaN:
    unknown, taken as none). Decided with the GIL share's noise: where the largest share changes as
    ``f`` moves by :data:`SHARE_NOISE` either way, the shares are within their noise of each other,
    the tie rule gives the label (:data:`TIE_ORDER`), and the line says it is a mix (``signals["mix"]``
    lists the labels the noise allows).
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
        f"of each item's {src.ms(own)}: {shares['io-bound']:.0%} waiting, {shares['gil-bound']:.0%} holding the "
        f"GIL, {shares['cpu-bound']:.0%} computing without it ({where}): {what}"
    )
    return label, line, signals


def label_mix(signals: Mapping[str, Any]) -> tuple[str, ...]:
    """The labels a stage's shares allow within their noise (more than one: a mix), from its signals."""
    return tuple((signals.get("share_mix") or {}).get("labels") or ())


def relabel_unfused(e: StageEntry) -> StageEntry:
    """A stage measured fused, labelled again from its own share of the call (analysis/_fused)."""
    t = num(e.stage_s_per_item)
    if not finite(t) or not t > 0 or e.classification == "overhead-bound":
        return e
    base = e.alternative("async" if e.is_async else "thread")
    cpu = num(base.call_cpu_s if base is not None else None)
    A = min(1.0, cpu / t) if finite(cpu) else math.nan
    label, line, signals = label_of_call(
        t, A, num(e.gil_fraction), "its own share of the fused call", SourceItems(e.items_per_input)
    )
    ev = e.evidence
    kept = {k: v for k, v in ev.signals.items() if k != "share_mix"}
    evidence = changed(ev, signals={**kept, **signals}, summary=(line, *ev.summary))
    return changed(e, classification=label, mix=label_mix(signals), evidence=evidence)


def limit_of(
    kind: str, lines: list[str], sr: StageRows, best: StageSetting, gil: GilEstimate, *, cores_bound: str = ""
) -> StageLimit:
    """``limit``: what holds the stage back at its best setting, in one phrase (None: nothing stands out).

    A limit of the cores that a quota or an allocation sets names it first (``cores_bound``, e.g. "1.0 CPU
    by the container's quota, of 2"): the cores that ran out are not the host's."""
    k = LIMIT_OF.get(kind)
    if kind == "unknown" and gil.saturated and gil.serializer == "other":
        k = "serialised"
    if kind == "io-bound" and not still_rising(sr.curve(str(best.harness), str(best.executor))):
        k = None  # it waits and scales: nothing holds it back within the grid
    head = f"limited by {LIMIT_WORDS[k]}" if k else "no single limit stands out"
    if k == "cores" and cores_bound:
        text = f"{head}: {cores_bound}" + (f"; {lines[0]}" if lines else "")
    else:
        text = head + (f": {lines[0]}" if lines else "")
    return keyed(StageLimit, kind=k, at=f"{best.executor} x {best.concurrency}", text=text)
