"""A direct reading of a stage's GIL share: a pure-Python counter thread runs next to it.

The curves cannot tell a stage whose C code releases the GIL (hashing, decoding, numpy) and flattens at
the cores from a GIL-bound one that flattens at the GIL. The method, its corrections and its known
answers: docs/verdicts.md (the probe).

How: the stage runs back to back in one thread, alone for a short window and then for the same window
next to a counter thread that spins in pure Python. The counter only runs Python, so its CPU time is
the time it held the GIL; the stage held it for the rest of the window. Per call::

    held  = (window - counter CPU) / calls with the counter
    share = held / (window / calls alone)

At a 0.5 ms switch interval (the stage gets the GIL back soon after asking), with the cyclic garbage
collector paused (a collection lands in either window by chance), the median over a few short
alternating rounds. A counter that holds the GIL without a core would read as GIL the stage held: its
pauses in which it did not block count as its own (``spinner_lost``), its CPU time is scaled by the
share of a core it gets alone (``spinner_core``), and a round whose counter waited for a core over 10%
of it is dropped (``core_wait``, from Linux's schedstat). ``releases``: how often a call lets the GIL
go (:func:`_one_round`). The stage runs in a thread the diagnosis abandons after ``timeout_s``, so a
stage that hangs on the probe's inputs cannot stop the diagnosis.
"""

from __future__ import annotations

import gc
import resource
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from stagebench._memory import describe, memory_short
from stagebench.core._executors import _LEAKED

__all__ = ["probe_gil"]

_SWITCH_S = 0.0005
_MIN_WINDOW_S = 0.03
_BUDGET_S = 0.4  # all rounds together, alone + with the counter
_MIN_ROUNDS, _MAX_ROUNDS = 3, 5
_MAX_CALL_S = 0.1  # slower calls would need > 1.2 s (3 rounds of 2 x 2 calls): not probed
_SOLO_S = 0.005  # the spinner alone before each round: the share of a core it gets
_MIN_CORE = 0.3  # below this the correction would be mostly noise
_MAX_WAIT = 0.1  # a round whose spinner waited for a core longer than this share of it is dropped
_GAP_S = 1e-4  # a pause of the spinner this long is a GIL wait, a wait for a core or time taken


class _Abandoned(Exception):
    """The caller gave up waiting (a hung stage): stop at the next call boundary."""


class _Busy(Exception):
    """Too few clean rounds: the spinner kept waiting for a core."""

    def __init__(self, why: str, core_wait: float) -> None:
        super().__init__(why)
        self.core_wait = core_wait


def _spin_counter(stop: threading.Event, abandon: threading.Event, ready: threading.Event, lost: list[float]) -> None:
    """Spin in pure Python; add to ``lost[0]`` the pauses it did not block in (see the module's docstring)."""
    clock, usage = time.perf_counter, _thread_usage()
    blocks = usage() if usage else 0
    ready.set()
    last = clock()
    while not (stop.is_set() or abandon.is_set()):
        for _ in range(50):
            pass
        now = clock()
        if now - last > _GAP_S and usage:
            b = usage()
            if b == blocks:  # no voluntary switch: it held the GIL, the machine took its core
                lost[0] += now - last
            blocks = b
            now = clock()
        last = now


def _thread_usage() -> Callable[[], int] | None:
    """The calling thread's count of voluntary context switches, as a function; None where unsupported."""
    try:
        who = resource.RUSAGE_THREAD  # Linux only
        resource.getrusage(who)
    except (ImportError, AttributeError, OSError):
        return None
    return lambda: resource.getrusage(who).ru_nvcsw


def _calls(fn: Callable, items: Sequence, window_s: float, abandon: threading.Event) -> tuple[float, int]:
    """Wall seconds and calls of ``fn`` back to back over ``items`` for at least ``window_s``."""
    n, k = len(items), 0
    t0 = time.perf_counter()
    while True:
        if abandon.is_set():
            raise _Abandoned
        fn(items[k % n])
        k += 1
        el = time.perf_counter() - t0
        if el >= window_s:
            return el, k


def _core_wait_s(tid: int | None) -> float | None:
    """Seconds a thread has spent runnable but waiting for a core (Linux's schedstat), or None."""
    try:
        with open(f"/proc/self/task/{tid}/schedstat") as f:
            return int(f.read().split()[1]) / 1e9  # fields: CPU ns, wait ns, timeslices
    except (OSError, ValueError, IndexError):
        return None


@dataclass(frozen=True, slots=True)
class _Round:
    """One clean round's readings (see the module's docstring)."""

    share: float  # the stage's GIL share of its call
    core: float  # the share of a core the spinner got alone
    wait: float | None  # the share of the stage's window the spinner waited for a core (None off Linux)
    lost: float  # the share of the window the spinner held the GIL without a core
    releases: float | None  # times per call the stage let the GIL go and had to wait to take it back (None off Linux)


def _one_round(fn: Callable, items: Sequence, window: float, abandon: threading.Event) -> _Round | float:
    """A round: the stage alone, then the spinner alone, then both; its readings, or its core wait if not clean."""
    usage = _thread_usage()  # the stage's thread: this one
    blocks = usage or (lambda: 0)
    b0 = blocks()
    w_a, k_a = _calls(fn, items, window, abandon)
    b1 = blocks()
    stop, ready, lost = threading.Event(), threading.Event(), [0.0]
    t = threading.Thread(
        target=_spin_counter, args=(stop, abandon, ready, lost), name="stagebench-gil-probe", daemon=True
    )
    t.start()
    ready.wait()
    assert t.ident is not None  # set by start()
    clock = time.pthread_getcpuclockid(t.ident)  # the counter's CPU time, read from this thread
    try:
        # the spinner alone first: the share of a core it gets when it holds the GIL
        # (below 1 when the machine takes the core away in slices too short to see as pauses)
        s0, c0, l0 = time.perf_counter(), time.clock_gettime(clock), lost[0]
        time.sleep(_SOLO_S)
        s1, c1, l1 = time.perf_counter(), time.clock_gettime(clock), lost[0]
        q1 = _core_wait_s(t.native_id)
        b2 = blocks()
        w, k = _calls(fn, items, window, abandon)
        b3 = blocks()
        counter_cpu, counter_lost = time.clock_gettime(clock) - c1, lost[0] - l1
        q2 = _core_wait_s(t.native_id)
    finally:
        stop.set()  # never leave a spinner running: it would slow everything measured after
        t.join()
    wait = (q2 - q1) / w if q1 is not None and q2 is not None else None
    if wait is not None and wait > _MAX_WAIT:
        return wait
    core = min(1.0, max(_MIN_CORE, (c1 - c0 + l1 - l0) / (s1 - s0)))
    counter_gil = min(counter_cpu / core + counter_lost, w)
    held = (w - counter_gil) / k
    releases = None
    if usage:
        # Blocks beyond the stage's own (a sleep blocks alone too) are waits for the GIL. Each time
        # the stage takes the GIL back from the spinner it blocks twice: a wait that times out after
        # a switch interval (its request to the spinner) and a wait for the spinner to hand it over.
        # It takes it back after each release and after each time it was made to hand it over,
        # once a switch interval it held it. While the spinner holds the GIL without a core (taken
        # by the machine), the waiting stage times out once an interval more: the machine's waits.
        offcore = max(0.0, counter_gil - counter_cpu) / k
        waits = (b3 - b2) / k - (b1 - b0) / k_a - offcore / _SWITCH_S
        releases = max(0.0, waits / 2 - max(0.0, held) / _SWITCH_S)
    return _Round(share=held / (w_a / k_a), core=core, wait=wait, lost=counter_lost / w, releases=releases)


def _rounds(fn: Callable, items: Sequence, call_s: float, abandon: threading.Event) -> list[_Round]:
    """The clean rounds, up to twice as many tried as wanted (see the module's docstring)."""
    window = max(_MIN_WINDOW_S, 2 * call_s)
    n = max(_MIN_ROUNDS, min(_MAX_ROUNDS, int(_BUDGET_S / (2 * window))))
    clean: list[_Round] = []
    dropped: list[float] = []
    for _ in range(2 * n):
        if len(clean) >= n:
            break
        r = _one_round(fn, items, window, abandon)
        if isinstance(r, _Round):
            clean.append(r)
        else:
            dropped.append(r)
    if len(clean) < _MIN_ROUNDS:
        raise _Busy(
            f"not probed: the machine was busy (in {len(dropped)} of {len(dropped) + len(clean)} rounds "
            f"the probe's spinner waited for a core {statistics.median(dropped):.0%} of the time: "
            "other programs, or the stage's own threads, were using the cores)",
            statistics.median(dropped),
        )
    return clean


def probe_gil(fn: Callable, items: Sequence, *, timeout_s: float = 30.0) -> dict[str, Any]:
    """The share of its time ``fn`` holds the GIL, read by a counter thread next to it.

    Returns ``{"share", "low", "high", "rounds", "seconds", "switch_interval_s",
    "spinner_core", "core_wait", "spinner_lost", "releases"}`` (``low``/``high``: the lower and upper
    quartile over rounds; ``share`` their median, clipped to 0..1;
    ``spinner_core``: the median share of a core the spinner got alone;
    ``core_wait``: the median share of a round the spinner waited for a core,
    ``None`` off Linux; ``spinner_lost``: the median share of a round it held
    the GIL without a core, counted as its own; ``releases``: the median times
    per call the stage let the GIL go and waited to take it back, ``None``
    off Linux; see the module's docstring) or ``{"error": why}`` when
    the stage raised, hung, there is nothing to run it on or no memory left, and
    ``{"error": why, "core_wait"}`` when the machine was too busy for three
    clean rounds.
    """
    items = list(items)
    if not items:
        return {"error": "no inputs to probe with"}
    short = memory_short()  # its threads would fail to start, or hang starting
    if short:
        return {"error": f"not probed: {short}"}
    result: dict[str, Any] = {}
    old = sys.getswitchinterval()
    gc_was = gc.isenabled()
    abandon = threading.Event()

    def work() -> None:
        t0 = time.perf_counter()
        try:
            _calls(fn, items, 0.0, abandon)  # warm: a first call imports, fills caches
            w, k = _calls(fn, items, 0.01, abandon)
            if w / k > _MAX_CALL_S:
                result["error"] = (
                    f"not probed: a call takes {w / k:.2g} s; the probe runs only stages whose "
                    f"calls take under {_MAX_CALL_S:g} s (it needs a dozen calls)"
                )
                return
            sys.setswitchinterval(_SWITCH_S)
            gc.disable()  # a collection inside one window and not the other is read as GIL (module docstring)
            rounds = _rounds(fn, items, w / k, abandon)
        except _Abandoned:
            return
        except _Busy as e:
            result.update(error=str(e), core_wait=round(e.core_wait, 3))
            return
        except Exception as e:  # recorded, the diagnosis goes on
            result["error"] = f"the stage raised during the GIL probe: {describe(e)}"
            return
        finally:
            sys.setswitchinterval(old)
            if gc_was:
                gc.enable()
        shares = [r.share for r in rounds]
        waits = [r.wait for r in rounds]
        rel = [r.releases for r in rounds]
        qs = statistics.quantiles(shares, n=4) if len(shares) >= 2 else [shares[0]] * 3
        clip = lambda x: min(1.0, max(0.0, x))
        result.update(
            share=clip(statistics.median(shares)),
            low=clip(qs[0]),
            high=clip(qs[2]),
            rounds=len(rounds),
            seconds=round(time.perf_counter() - t0, 3),
            switch_interval_s=_SWITCH_S,
            spinner_core=round(statistics.median(r.core for r in rounds), 3),
            core_wait=None if None in waits else round(statistics.median(cast("list[float]", waits)), 3),
            spinner_lost=round(statistics.median(r.lost for r in rounds), 3),
            releases=None if None in rel else round(statistics.median(cast("list[float]", rel)), 1),
        )

    t = threading.Thread(target=work, name="stagebench-gil-probe-stage", daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        abandon.set()  # its spinner stops now; the stage's thread at its next call boundary
        sys.setswitchinterval(old)
        if gc_was:
            gc.enable()
        _LEAKED.append(t)  # the diagnosis exits without waiting for it
        return {"error": f"the stage did not return within {timeout_s:g} s during the GIL probe"}
    return result
