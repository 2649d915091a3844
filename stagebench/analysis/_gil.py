"""How much of a stage's per-item time holds the GIL, from several labelled signals.

Nothing here measures the GIL directly: CPython exposes no counter for it.
The estimate is inferred from the curves, with this physics. An item takes
t = g + r seconds alone: g while holding the GIL (Python bytecode), r without
it (sleeping, waiting on I/O, or C code that releases the GIL). Threads at
concurrency c then deliver about

    min(c / t,  1 / g,  cores / cpu_per_item)

items/s, while processes lose the 1 / g cap (each has its own GIL) and pay
for moving data instead. The GIL fraction is f = g / t.

The signals, each reported with its label and role:

``cpu_share``
    CPU seconds per item / seconds per item, at the lowest thread level (the
    harness's own share, from the no-op ceiling, removed). Pure Python runs
    only while holding the GIL, so for Python-plus-waiting this *is* f. It is
    read within one point, so a machine whose speed drifts between points
    does not bias it. It reads high when C code computes without the GIL
    (detected: threads then burn more than one core, which GIL-held work
    cannot), and low when other programs take the cores (a descheduled
    thread still holds the GIL).
``cpu_share_for_load``
    ``cpu_share`` divided by the share of a core that the direct harness's
    one-thread no-op ceiling (pure Python that never waits) got right after:
    a correction for other programs taking the cores, shown only when the
    machine was busy. Only a correction: the load moves between the two
    windows, and a thread waking from a wait gets a core sooner than a busy one.
``thread_plateau``
    g <= 1 / (peak thread throughput) minus the harness's per-item GIL time,
    so f <= that / t: always an upper bound. It becomes an estimate when the
    thread curve has flattened well below linear scaling without using the
    cores, i.e. something inside the process serialises the threads.
``cpu_share_at_plateau``
    ``cpu_share`` divided by the cores the threads use on the plateau. When
    the GIL is saturated by pure Python the plateau uses exactly the one core
    the machine lets it have, so this corrects ``cpu_share`` for other load.
``threads_vs_processes``
    Throughput of processes over threads at the same concurrency. Processes
    significantly faster (intervals apart) confirm that the threads' limit
    lives inside one process: the GIL, or a lock.
``serial_fraction``
    Amdahl serial fraction of the thread curve against the process curve's.
    A thread curve capped at 1 / g has σ ≈ g / t; a larger σ than the
    processes' says the serial part is specific to threads.

Why this combination: the signals fail in different ways (drifting machine
speed, other load, GIL-free C code, locks that are not the GIL), so the
estimate is the median of those that the data says are valid, and the
interval spans them. A serialised thread curve with almost no CPU is a lock
or an external limit, not the GIL, and is reported as such. When only upper
bounds exist (GIL-free CPU that fills the cores) the fraction is not pinned
down by the data; the interval says so and the point is its midpoint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np

from stagebench._numbers import SourceItems, finite
from stagebench.core._curves import Curve, Point, StageRows
from stagebench.model._json import Written
from stagebench.model._stage import GilEstimate, keyed

__all__ = ["estimate_gil", "harness_gil_s", "harness_cpu_s", "SIGNAL_LABELS"]

#: What each signal is, in words shown next to its value.
SIGNAL_LABELS = {
    "cpu_share": "CPU time / time per item on one thread (= GIL share for pure Python on an idle machine; "
    "high when C code computes without the GIL, low when other programs take the cores)",
    "cpu_share_for_load": "CPU share divided by the share of a core a busy no-op thread got at the same "
    "concurrency (corrects for other programs taking the cores; a correction, not a reading)",
    "cpu_share_at_plateau": "CPU share divided by the cores the threads use on their plateau "
    "(corrects the CPU share for other load when the GIL is saturated)",
    "thread_plateau": "peak thread throughput caps GIL time per item at 1/peak: an upper bound on the "
    "GIL share, an estimate when the thread curve flattens without using the cores",
    "threads_vs_processes": "process / thread throughput at equal concurrency (above 1 beyond noise: the "
    "threads' limit is inside one process, the GIL or a lock)",
    "serial_fraction": "Amdahl serial fraction of the thread curve, against the process curve's",
    "gil_probe": "share of its time the stage held the GIL while a pure-Python counter thread ran next to it "
    "(the counter's CPU time, scaled by the share of a core it gets alone, is its own GIL time; "
    "reads high by the GIL's hand-offs and when the machine's load changes mid-round)",
}

_GIL_FREE_CORES = 1.2  # threads above this many cores: part of their CPU runs without the GIL
_CORES_LIMITED = 0.75  # share of the cores at which a curve counts as limited by them
_SUBLINEAR = 0.75  # peak below this share of linear scaling: the curve has flattened
_TICK_S = 0.02  # CPU counters tick at 10 ms, read twice per window
_STEAL_NOTABLE = 0.05  # a window whose CPUs the host took more than this share of: CPU shares read over the rest
_VAGUE = 0.3  # a curves' interval wider than this: a probe reading inside it decides


def harness_gil_s(ceiling: Point | SimpleNamespace | None) -> float:
    """GIL time per item spent by the harness itself (0 when its ceiling was not measured).

    ``ceiling``: a point, or anything with its ``qps`` and ``cpu_s_per_item`` (a no-op pipeline's reading).

    The no-op ceiling on threads is limited by the harness's own Python; its CPU
    per item (or 1/throughput, whichever is smaller) is that time.
    """
    if ceiling is None or not ceiling.qps > 0:
        return 0.0
    wall = getattr(ceiling, "lanes", 1.0) / ceiling.qps  # one rank's: each rank its own harness and GIL
    cpu = ceiling.cpu_s_per_item
    return min(wall, cpu) if finite(cpu) and cpu > 0 else wall


def harness_cpu_s(ceiling: Point | None) -> float:
    if ceiling is None or not finite(ceiling.cpu_s_per_item):
        return 0.0
    return max(0.0, ceiling.cpu_s_per_item)


def _slowdown(sr: StageRows, H: str, E: str, p: Point, p0: Point, cpu_share: float) -> float:
    """CPU per item of the stage at ``p`` over that at the lowest level ``p0`` (1: same speed).

    Signals that compare times read at different points (the plateau against
    the lowest level) assume the machine ran at one speed, which a shared host
    does not. The same work's CPU per item measures the speed, for stages whose
    time is mostly CPU (CPU share >= 0.5; below that the per-item CPU is small
    and wake-ups dominate it). Ratios outside [0.5, 2] are not a speed change
    but a different regime: no correction.
    """
    if not (finite(cpu_share) and cpu_share >= 0.5):
        return 1.0
    c_p = p.cpu_s_per_item - harness_cpu_s(sr.ceiling(H, E, p.concurrency))
    c_0 = p0.cpu_s_per_item - harness_cpu_s(sr.ceiling(H, E, p0.concurrency))
    if not (finite(c_p) and finite(c_0)) or c_p <= 0 or c_0 <= 0:
        return 1.0
    k = c_p / c_0
    return k if 0.5 <= k <= 2.0 else 1.0


@dataclass(frozen=True, slots=True)
class _Signal(Written):
    """One figure the estimate read on the way: its value and interval, what it says in words (``label``),
    its ``role`` in the estimate, the GIL fraction it implies and the ``detail`` behind it. Its
    :meth:`to_json` is the estimate's ``signals`` entry, these keys in this order."""

    value: Any
    interval: Any
    label: str
    role: str
    implied_fraction: Any
    implied_interval: Any
    detail: str


def _signal(value, interval, label_key, role, implied=None, implied_interval=None, detail="") -> _Signal:
    return _Signal(value, interval, SIGNAL_LABELS[label_key], role, implied, implied_interval, detail)


def _reading(value: float, interval: list[float], label_key: str, role: str, detail: str) -> _Signal:
    """A signal that reads the GIL share itself: the fraction it implies is its own value and interval."""
    return _signal(value, interval, label_key, role, value, interval, detail)


def _choose(sr: StageRows) -> tuple[str, str] | None:
    """Harness and thread-like executor to read the GIL from (direct first: least overhead)."""
    for h in ("direct", "spdl"):
        for e in ("thread", "async"):
            if sr.curve(h, e):
                return h, e
    return None


def _clip01(x: float) -> float:
    # a fraction of time lives in [0, 1]; signals that overshoot (noise) are brought back
    return float(min(1.0, max(0.0, x)))


@dataclass(frozen=True)
class _Reading:
    """A valid estimate and what it was read from: ``"cpu"`` (the stage's CPU time within one
    point) or ``"plateau"`` (the thread curve's peak point against its lowest level)."""

    value: float
    lo: float
    hi: float
    reads: str
    votes: bool = True  # False: it spans the interval only (a raw reading its correction replaces)


@dataclass(frozen=True)
class _Lowest:
    """The lowest thread level of the curve the GIL is read from, and the stage's time per item there.

    Every signal turns a time per item into a share by dividing by ``t`` (``t_lo``
    and ``t_hi`` from the throughput interval), so they all read this one level.
    """

    harness: str
    executor: str
    p0: Point
    c0: int
    ceiling: Point | None  # the harness's no-op ceiling at c0 (None when not measured)
    t: float
    t_lo: float
    t_hi: float


@dataclass(frozen=True)
class _CpuShare:
    """The ``cpu_share`` reading (NaN when no CPU time was measured), and whether threads used GIL-free CPU."""

    value: float
    lo: float
    hi: float
    gil_free: bool


@dataclass(frozen=True)
class _Plateau:
    """The ``thread_plateau`` reading: the peak thread point, the share it bounds, and what flattened the curve."""

    peak: Point
    harness_gil: float  # the harness's own GIL time per item at the peak's concurrency
    value: float
    lo: float
    hi: float
    saturated: bool
    serializer: str | None  # "gil", "other", or None when the curve did not flatten below the cores

    @property
    def gil_saturated(self) -> bool:
        return self.saturated and self.serializer == "gil"


@dataclass(frozen=True)
class _Estimate:
    """The fraction's point and interval, whether the data pin it down, and which source decided it."""

    point: float
    lo: float
    hi: float
    pinned: bool
    source: str


def _lowest(sr: StageRows, H: str, E: str, T: Curve) -> _Lowest:
    """The stage's own seconds per item at the thread curve's lowest level, the harness's time removed."""
    p0 = T.points[0]
    c0 = p0.concurrency
    ceil0 = sr.ceiling(H, E, c0)
    lane = c0 * p0.lanes / p0.qps  # seconds per item per lane (Little's law in a closed loop), one rank's
    t = lane - harness_gil_s(ceil0)  # the harness's own time per item is not the stage's
    p50 = p0.latency_p50_ms / 1e3 if finite(p0.latency_p50_ms) else math.nan
    if finite(p50) and p50 > 0 and t < min(p50, lane):
        t = min(p50, lane)  # never subtract more harness time than the call itself leaves
    if not t > 0:
        t = lane
    return _Lowest(
        harness=H,
        executor=E,
        p0=p0,
        c0=c0,
        ceiling=ceil0,
        t=t,
        t_lo=t * p0.qps / p0.high,
        t_hi=t * p0.qps / p0.low,
    )


def _host_left(p: Point) -> float:
    """The share of the CPUs' time the host left this VM in ``p``'s window: 1 unless it took more than
    :data:`_STEAL_NOTABLE` (steal). Every CPU share read in a window is read over it."""
    steal = p.steal_share
    return 1 - steal if finite(steal) and _STEAL_NOTABLE < steal < 1 else 1.0


def _cpu_share(T: Curve, low: _Lowest, signals: dict[str, _Signal], notes: list[str], src: SourceItems) -> _CpuShare:
    """The ``cpu_share`` signal: CPU per item over time per item at the lowest level, read within one point.

    Over the time the host left this VM: where it took the CPUs for a share ``s`` of the window (steal),
    a thread computing throughout ran ``1 - s`` of it, and the rest would read as waiting.
    """
    p0, t = low.p0, low.t
    # the cores the threads wanted: under a CPU quota those it held back count (threads that queue for the
    # GIL want one core between them, whatever the quota lets them use)
    # one rank's process, where several ran at once: each its own GIL
    top = max((p for p in T if finite(p.cores_used)), key=lambda p: p.rank_cores_wanted, default=None)
    u_max = top.rank_cores_wanted if top is not None else math.nan
    gil_free = finite(u_max) and u_max > _GIL_FREE_CORES
    own = p0.call_cpu_ms / 1e3 if finite(p0.call_cpu_ms) else math.nan
    if not (finite(own) or finite(p0.cpu_s_per_item)):
        return _CpuShare(math.nan, math.nan, math.nan, gil_free)
    if finite(own):
        # the calling thread's own CPU per call, read at nanosecond resolution: nothing of the harness
        # to subtract, and nothing of the process's other threads (a library's workers still spinning)
        cpu, tick = own, 0.0
    else:
        cpu = max(0.0, p0.cpu_s_per_item - harness_cpu_s(low.ceiling))
        tick = _TICK_S / p0.n_items if finite(p0.n_items) and p0.n_items > 0 else 0.0
    A, A_lo, A_hi = cpu / t, max(0.0, cpu - tick) / low.t_hi, (cpu + tick) / low.t_lo
    if gil_free:
        assert top is not None  # gil_free reads it
        role = "upper bound"
        held = top.cores_throttled
        a_rank = " in each rank's process" if top.lanes > 1 else ""
        detail = (
            f"threads used up to {u_max:.2f} cores{a_rank}, more than GIL-held work can: "
            if not (finite(held) and held > 0)
            else f"threads wanted {u_max:.2f} cores{a_rank} at concurrency {top.concurrency} "
            f"({top.cores_used / top.lanes:.2f} used, {held / top.lanes:.2f} more the CPU quota held back), "
            "more than GIL-held work can: "
        ) + "part of the CPU runs without the GIL, so this overstates the GIL share"
    else:
        role = "estimate"
        on_cpu, per_item = src.ms_each(cpu, t)
        detail = f"{on_cpu} CPU in {per_item} per item at {low.executor} concurrency {low.c0}"
    left = _host_left(p0)
    if left < 1:
        A, A_lo, A_hi = (min(1.0, x / left) for x in (A, A_lo, A_hi))
        detail += f", over the {left:.0%} of it the host left this VM"
        notes.append(
            f"the host took {1 - left:.0%} of this VM's CPU time while the stage's own CPU was read (steal): "
            "its CPU share is read over the rest"
        )
    signals["cpu_share"] = _reading(A, [A_lo, A_hi], "cpu_share", role, detail)
    return _CpuShare(A, A_lo, A_hi, gil_free)


def _cpu_share_for_load(low: _Lowest, share: _CpuShare, signals: dict[str, _Signal], notes: list[str]) -> None:
    """The ``cpu_share_for_load`` signal and its note, when a busy no-op thread got well under a core."""
    # The direct harness's no-op ceiling on one thread is pure Python that never
    # waits: the cores it got say how much of a core a busy thread could get
    # around that moment. Below 1, other programs were taking the CPU, and a
    # thread that holds the GIL keeps holding it while it waits for a core.
    ceil0 = low.ceiling
    avail = math.nan
    if low.harness == "direct" and ceil0 is not None and finite(ceil0.cores_used) and ceil0.cores_used > 0:
        # GIL-bound: at most one core at any concurrency; over the time the host left this VM, as the CPU
        # share it corrects already is (else the host's steal would be divided out twice)
        avail = min(1.0, ceil0.cores_used / ceil0.lanes / _host_left(ceil0))  # a busy thread of one rank
    if not (finite(avail) and 0.2 <= avail < 0.95 and not share.gil_free):
        return
    # Only a correction: the load fluctuates between the two windows, and a
    # thread that wakes from waiting gets the CPU sooner than a busy one.
    Ac = [min(1.0, x / avail) for x in (share.value, share.lo, share.hi)]
    signals["cpu_share_for_load"] = _reading(
        Ac[0],
        Ac[1:],
        "cpu_share_for_load",
        "estimate",
        f"CPU share {share.value:.2f} / {avail:.2f} of a core that a busy no-op thread got at concurrency {low.c0}",
    )
    notes.append(
        f"a busy no-op thread got only {avail:.2f} of a core around this measurement (other load): "
        "CPU-based signals read low and the estimate is less certain"
    )


def _thread_plateau(
    sr: StageRows,
    T: Curve,
    low: _Lowest,
    share: _CpuShare,
    cores: float,
    signals: dict[str, _Signal],
    src: SourceItems,
) -> _Plateau:
    """The ``thread_plateau`` signal: the bound the peak thread throughput puts on GIL time per item.

    It is an estimate only when the curve flattened well below linear scaling
    without reaching the cores and the stage uses enough CPU for the GIL to be
    what serialises it; otherwise an upper bound.
    """
    p0, c0 = low.p0, low.c0
    pm = T.best()
    assert pm is not None  # _choose picks only a curve with points
    h_m = harness_gil_s(sr.ceiling(low.harness, low.executor, pm.concurrency))
    # GIL time read at the plateau, at the lowest level's machine speed
    k_m = _slowdown(sr, low.harness, low.executor, pm, p0, share.value)
    r = pm.lanes  # a time per item off a rate is one rank's
    B = (r / pm.qps - h_m) / low.t / k_m
    B_lo, B_hi = (r / pm.high - h_m) / low.t_hi / k_m, (r / pm.low - h_m) / low.t_lo / k_m
    # Flattened: some level's whole interval lies well below linear scaling from
    # the lowest level (a noisy point that merely dips does not count).
    sublinear = any(p.high < _SUBLINEAR * p.concurrency * p0.qps / c0 for p in T.points[1:])
    rising = False
    if len(T) >= 2 and pm is T.points[-1]:
        prev = T.points[-2]
        ideal = pm.concurrency / prev.concurrency
        rising = pm.qps > prev.qps * (1 + 0.3 * (ideal - 1)) and pm.low > prev.high
    cores_limited = finite(pm.cores_used) and pm.cores_used >= _CORES_LIMITED * cores
    saturated = sublinear and not rising and not cores_limited
    serializer = None
    if len(T) >= 2:
        why = _plateau_detail(
            pm, c0, k_m, cores, saturated=saturated, cores_limited=cores_limited, rising=rising, src=src
        )
        if saturated:
            A = share.value
            serializer = "gil" if (not finite(A) or share.gil_free or A >= 0.5 * B) else "other"
            if serializer == "other":
                why += (
                    f"; yet the stage uses little CPU ({A:.0%} of its time): a lock or an external limit, not the GIL"
                )
        role = "estimate" if serializer == "gil" else "upper bound"
        signals["thread_plateau"] = _reading(B, [B_lo, B_hi], "thread_plateau", role, why)
    return _Plateau(pm, h_m, B, B_lo, B_hi, bool(saturated), serializer)


def _plateau_detail(
    pm: Point,
    c0: int,
    k_m: float,
    cores: float,
    *,
    saturated: bool,
    cores_limited: bool,
    rising: bool,
    src: SourceItems,
) -> str:
    """In words, what limited the thread curve at its peak ``pm``."""
    cm = pm.concurrency
    if saturated:
        why = (
            f"threads flatten at {src.rate(pm.qps):,.0f} items/s (concurrency {cm}) using "
            f"{pm.cores_used:.2f} of {cores} cores: something inside the process serialises them"
        )
        if k_m != 1.0:
            why += (
                f"; the same work took {k_m:.2f}x the CPU per item there as at concurrency {c0} "
                "(the machine's speed changed), so its time per item is scaled back by that"
            )
        return why
    if cores_limited:
        return f"threads reach the cores ({pm.cores_used:.2f} of {cores}) before any serial limit shows"
    if rising:
        return f"threads still scale at the top of the grid ({cm}): the cap has not been reached"
    return f"threads scale close to linearly up to {cm}: no serial limit reached"


def _cpu_share_at_plateau(share: _CpuShare, plateau: _Plateau, signals: dict[str, _Signal]) -> _Reading | None:
    """The ``cpu_share_at_plateau`` signal, when the GIL saturates the threads on at most about one core."""
    u = plateau.peak.cores_used / plateau.peak.lanes  # one rank's process: its GIL's core
    if not (
        plateau.gil_saturated
        and finite(share.value)
        and not share.gil_free
        and finite(u)
        and 0.3 < u <= _GIL_FREE_CORES
    ):
        return None
    A2, lo, hi = share.value / u, share.lo / u, share.hi / u
    detail = f"CPU share {share.value:.2f} / {u:.2f} cores used on the plateau"
    signals["cpu_share_at_plateau"] = _reading(A2, [lo, hi], "cpu_share_at_plateau", "estimate", detail)
    return _Reading(A2, lo, hi, "plateau")


def _threads_vs_processes(
    sr: StageRows,
    T: Curve,
    low: _Lowest,
    share: _CpuShare,
    plateau: _Plateau,
    signals: dict[str, _Signal],
    notes: list[str],
    src: SourceItems,
) -> _Reading | None:
    """The ``threads_vs_processes`` signal, at the level where processes gain most over threads.

    Returns the GIL share the threads' throughput there implies, when processes
    are faster beyond noise and the serialiser is not a lock.
    """
    H, E, t = low.harness, low.executor, low.t
    P = sr.curve(H, "process")
    common = [(pt, pp) for pt in T if (pp := P.at(pt.concurrency)) is not None] if P else []
    if not common:
        return None
    est = None
    pt, pp = max(common, key=lambda ab: ab[1].qps / ab[0].qps)
    ratio = pp.qps / pt.qps
    r_int = [pp.low / pt.high, pp.high / pt.low]
    faster = pp.low > pt.high
    c = pt.concurrency
    if faster and plateau.serializer != "other":
        k_c = _slowdown(sr, H, E, pt, low.p0, share.value)
        h_c = harness_gil_s(sr.ceiling(H, E, c))
        r = pt.lanes  # a time per item off a rate is one rank's
        imp = (r / pt.qps - h_c) / t / k_c
        imp_int = [(r / pt.high - h_c) / low.t_hi / k_c, (r / pt.low - h_c) / low.t_lo / k_c]
        est = _Reading(imp, imp_int[0], imp_int[1], "plateau")
        detail = (
            f"at concurrency {c} processes deliver {src.rate(pp.qps):,.0f} items/s, threads {src.rate(pt.qps):,.0f}: "
            "the threads' cap lives inside one process"
        )
        role = "estimate" if plateau.gil_saturated else "check"
    else:
        imp, imp_int, role = None, None, "check"
        if faster:
            detail = (
                f"at concurrency {c} processes beat threads ({src.rate(pp.qps):,.0f} vs {src.rate(pt.qps):,.0f}) "
                "but the stage uses little CPU: a lock, not the GIL"
            )
        else:
            detail = (
                f"at concurrency {c} processes {'trail' if pp.high < pt.low else 'match'} threads "
                f"({src.rate(pp.qps):,.0f} vs {src.rate(pt.qps):,.0f} items/s): no sign of a per-process cap here"
            )
    signals["threads_vs_processes"] = _signal(ratio, r_int, "threads_vs_processes", role, imp, imp_int, detail)
    if plateau.gil_saturated and not faster and not any(q.low > p.high for p, q in common):
        notes.append(
            "threads flatten below the cores yet processes do no better: other load on the machine or a "
            "resource shared between processes may be the limit; the GIL evidence is weaker"
        )
    return est


def _serial_fraction(
    fits: dict[str, dict], low: _Lowest, plateau: _Plateau, signals: dict[str, _Signal]
) -> _Reading | None:
    """The ``serial_fraction`` signal from the curve fits; returns it as an estimate when usable.

    Usable when the threads' serial fraction lies above the processes' (the
    serial part is specific to threads) and the serialiser is not a lock, or,
    with no process curve to compare, when the GIL saturates the threads.
    """
    fT, fP = fits.get(f"{low.harness}/{low.executor}"), fits.get(f"{low.harness}/process")
    if not (fT and fT.get("amdahl_serial_fraction") is not None):
        return None
    sT, sT_int = fT["amdahl_serial_fraction"], fT.get("amdahl_interval")
    sP = fP.get("amdahl_serial_fraction") if fP else None
    sP_int = fP.get("amdahl_interval") if fP else None
    if sP is not None and sT_int and sP_int:
        apart = sT_int[0] > sP_int[1]
        detail = f"threads σ = {sT:.2f}, processes σ = {sP:.2f}: " + (
            "the serial part is specific to threads" if apart else "no clear difference"
        )
        usable = apart and plateau.serializer != "other"
    else:
        detail = f"threads σ = {sT:.2f} (no process curve to compare)"
        usable = plateau.gil_saturated
    signals["serial_fraction"] = _signal(
        sT,
        sT_int,
        "serial_fraction",
        "estimate" if (usable and plateau.gil_saturated) else "check",
        sT if usable else None,
        (sT_int if usable else None),
        detail,
    )
    lo, hi = sT_int or [sT, sT]
    return _Reading(sT, lo, hi, "plateau") if usable else None


def _valid_estimates(
    share: _CpuShare,
    plateau: _Plateau,
    on_plateau: list[_Reading],
    multi: bool,
    signals: dict[str, _Signal],
    notes: list[str],
) -> list[_Reading]:
    """The signals the data says are valid estimates, in signal order.

    The CPU share counts unless part of the CPU is GIL-free; the plateau and
    the signals read on it (``on_plateau``) count when the GIL saturates the
    threads. Threads that scaled past what the CPU share allows bring the
    plateau in too. ``multi``: the thread curve has two levels or more.
    """
    ests: list[_Reading] = []
    if finite(share.value) and not share.gil_free:
        # Where other load was measured, the CPU share corrected for it is the stage's reading; the raw
        # one reads low by the core it lost, and stays as the interval's low end (the load fluctuates
        # between the two windows, so the correction can overshoot).
        corrected = "cpu_share_for_load" in signals
        ests.append(_Reading(share.value, share.lo, share.hi, "cpu", votes=not corrected))
        if corrected:
            sig = signals["cpu_share_for_load"]
            lo, hi = sig.interval
            ests.append(_Reading(sig.value, lo, hi, "cpu"))
    if plateau.gil_saturated:
        ests.append(_Reading(plateau.value, plateau.lo, plateau.hi, "plateau"))
        ests += on_plateau
    elif ests and multi and share.lo > plateau.hi:
        # threads scaled further than the CPU share allows
        notes.append(
            "threads scaled further than the CPU share allows: the machine's speed changed during the sweep, "
            "or part of the CPU runs without the GIL; both signals are used"
        )
        ests.append(_Reading(plateau.value, plateau.lo, plateau.hi, "plateau"))
    return ests


def _vote(groups: dict[str, list[_Reading]]) -> float:
    """The point the valid readings give: the CPU share where it is a direct reading, else the groups' median.

    Where the plateau reads at or above the stage's CPU time (within their noise), the CPU share decides:
    it reads the held share within one point, and the plateau's excess is what the threads lost handing
    the GIL over (a waiting thread wakes only when the holder lets go) or the host's speed between two
    points. Where the plateau reads below the CPU share beyond their noise, threads did more than the
    CPU share allows (part of the CPU runs without the GIL, or the host sped up): both groups vote.
    """
    cpu, plateau = groups.get("cpu", []), groups.get("plateau", [])
    below = cpu and plateau and np.median([e.hi for e in plateau]) < np.median([e.lo for e in cpu])
    if cpu and not below:
        return float(np.median([e.value for e in cpu]))
    return float(np.median([np.median([e.value for e in g]) for g in groups.values()]))


def _combine(ests: list[_Reading], share: _CpuShare, plateau: _Plateau, multi: bool, notes: list[str]) -> _Estimate:
    """The curves' estimate: one vote for each thing the valid signals read, spanned by their intervals.

    The signals read two things: the stage's CPU time within one point (``cpu_share`` and its
    correction for load) and the thread curve's peak point against its lowest level
    (``thread_plateau``, ``cpu_share_at_plateau``, which divides by the cores used at the peak,
    ``threads_vs_processes``, ``serial_fraction``). Signals that read the same thing share its errors,
    so each group gives its median, and :func:`_vote` says which groups decide the point: readings of
    one plateau do not outvote the stage's own CPU time. Why: they compare two points measured seconds
    apart, and a host that changed speed in between moves them together.

    Where the plateau only bounds the share from above, the interval stops at that bound, unless a
    valid reading lies above it: then the two disagree (the host's speed changed, or part of the CPU
    runs without the GIL), and the interval spans both.

    With no valid signal only upper bounds remain: the interval runs from 0 to
    the tightest, and the point is its midpoint.
    """
    if ests:
        groups: dict[str, list[_Reading]] = {}
        for e in ests:
            if e.votes:
                groups.setdefault(e.reads, []).append(e)
        point = _vote(groups)
        lo = min(e.lo for e in ests)
        hi = max(e.hi for e in ests)
        if not plateau.gil_saturated and multi and all(e.value <= plateau.hi for e in ests if e.votes):
            hi = min(hi, max(plateau.hi, point))  # the plateau bound holds where no reading lies above it
        return _Estimate(point, lo, hi, pinned=True, source="curves")
    bounds = [b for b in (plateau.hi if multi else math.nan, share.hi) if finite(b)]
    upper = _clip01(min(bounds)) if bounds else 1.0
    notes.append(
        f"the data bound the GIL share only from above (≤ {upper:.2f}): part of the CPU runs without the "
        f"GIL and the threads were limited by the cores before any GIL cap showed; "
        f"more cores would pin it down"
    )
    return _Estimate(upper / 2, 0.0, upper, pinned=False, source="curves")


def _gil_probe(
    probe: dict[str, Any] | None, curves: _Estimate, signals: dict[str, _Signal], notes: list[str]
) -> _Estimate:
    """The ``gil_probe`` signal, and the estimate once the probe has had its say (see :func:`estimate_gil`)."""
    if not (probe and probe.get("share") is not None):
        if probe and probe.get("error"):
            # said, not hidden: a reader of a vague verdict should know a direct reading was tried
            notes.append(f"no direct GIL reading: {probe['error']}")
        return curves
    ps, p_lo, p_hi = (float(probe[k]) for k in ("share", "low", "high"))
    point, lo, hi, pinned = curves.point, curves.lo, curves.hi, curves.pinned
    below = pinned and p_hi < lo
    vague = pinned and hi - lo > _VAGUE and lo <= ps <= hi  # consistent, and far more precise
    decides = below or vague or not pinned
    signals["gil_probe"] = _reading(
        ps,
        [p_lo, p_hi],
        "gil_probe",
        "estimate" if decides else "check",
        f"median of {probe.get('rounds', '?')} rounds at a {1e3 * float(probe.get('switch_interval_s', 0.0005)):g} ms "
        "switch interval (interval: quartiles)",
    )
    if not decides:
        return curves
    cap = hi if not pinned else 1.0  # a bound from the curves still holds
    if vague:
        notes.append(
            f"the curves leave the GIL share anywhere in {lo:.2f}-{hi:.2f}; a counter thread next "
            f"to the stage read {ps:.2f} ({p_lo:.2f}-{p_hi:.2f}), which is used"
        )
    elif below:
        notes.append(
            f"the curves put the GIL share at {point:.2f} ({lo:.2f}-{hi:.2f}), but a counter thread next "
            f"to the stage kept the GIL for all but {ps:.2f} of its time: the threads were limited by "
            "something else (the cores, memory); the probe's reading is used"
        )
    else:
        notes[:] = [n for n in notes if "only from above" not in n]
        notes.append(
            f"the curves bound the GIL share only from above (≤ {hi:.2f}); a counter thread next to the "
            f"stage read {ps:.2f} ({p_lo:.2f}-{p_hi:.2f})"
            + (", capped at that bound" if ps > hi else "")
            + ", which is used"
        )
    return _Estimate(min(ps, cap), min(p_lo, cap), min(p_hi, cap), pinned=True, source="probe")


def estimate_gil(
    sr: StageRows,
    *,
    cores: float,
    fits: dict[str, dict] | None = None,
    free_threaded: bool = False,
    probe: dict[str, Any] | None = None,
    src: SourceItems = SourceItems(),
) -> GilEstimate:
    """The GIL fraction of one stage, its interval, and every signal behind it.

    ``fits`` are the stage's curve fits keyed ``"harness/executor"`` (for the
    serial-fraction signal). Returns a :class:`GilEstimate`: ``fraction`` and ``interval`` (``None``
    when no thread or event-loop point was measured), ``pinned`` (False when
    only bounds exist), ``gil_s_per_item``, ``stage_s_per_item``,
    ``saturated`` (the thread curve flattened below the cores),
    ``serializer`` (``"gil"``, ``"other"`` or ``None``), ``harness``,
    ``executor``, ``signals`` and plain-words ``notes``.

    ``probe``: a reading of :func:`stagebench.pipeline._gilprobe.probe_gil` (``share``,
    ``low``, ``high``), shown as the ``gil_probe`` signal. It decides the
    fraction where the curves only bound it, where they leave it wider open
    than 0.3 and the reading falls inside, and where it reads below the
    curves' whole interval: its errors push it up (hand-offs, a busy
    machine), so a low reading is evidence the curves cannot give on few
    cores (C code that releases the GIL flattens at the cores as GIL-bound
    code flattens at the GIL). Above the curves it is only a check.
    ``source`` says which decided. ``src``: the unit of the signals' details (source items, after a
    batching step); the figures stay per call.
    """
    fits = fits or {}
    notes: list[str] = []
    signals: dict[str, _Signal] = {}
    chosen = _choose(sr)
    if chosen is None:
        notes.append(
            "no thread or event-loop point was measured: the GIL share cannot be inferred "
            "(process workers each have their own GIL)"
        )
        return keyed(GilEstimate, signals={}, notes=tuple(notes))
    H, E = chosen
    T = sr.curve(H, E)
    if free_threaded:
        notes.append("free-threaded Python: there is no GIL; the fraction measures how much threads serialise")

    low = _lowest(sr, H, E, T)
    if low.c0 > 1:
        notes.append(f"the lowest thread level measured is {low.c0}, not 1: per-item time is inferred from it")

    share = _cpu_share(T, low, signals, notes, src)
    if "cpu_share" in signals:
        _cpu_share_for_load(low, share, signals, notes)
    plateau = _thread_plateau(sr, T, low, share, cores, signals, src)
    at_plateau = _cpu_share_at_plateau(share, plateau, signals)
    processes = _threads_vs_processes(sr, T, low, share, plateau, signals, notes, src)
    serial = _serial_fraction(fits, low, plateau, signals)

    multi = len(T) >= 2
    on_plateau = [e for e in (at_plateau, processes, serial) if e is not None]
    curves = _combine(_valid_estimates(share, plateau, on_plateau, multi, signals, notes), share, plateau, multi, notes)
    est = _gil_probe(probe, curves, signals, notes)
    point = _clip01(est.point)
    g = point * low.t
    if multi:
        # Threads reached the peak, so per-item GIL time cannot exceed 1/peak (minus
        # the harness's share): a physical bound that holds even when t drifted.
        g = min(g, max(0.0, plateau.peak.lanes / plateau.peak.qps - plateau.harness_gil))
    return keyed(
        GilEstimate,
        fraction=point,
        interval=(_clip01(min(est.lo, point)), _clip01(max(est.hi, point))),
        pinned=est.pinned,
        source=est.source,
        gil_s_per_item=g,
        stage_s_per_item=low.t,
        saturated=plateau.saturated,
        serializer=plateau.serializer,
        harness=H,
        executor=E,
        signals={name: sig.to_json() for name, sig in signals.items()},
        notes=tuple(notes),
    )
