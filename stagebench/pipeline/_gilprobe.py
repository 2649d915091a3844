"""A direct reading of a stage's GIL share: a pure-Python counter thread runs next to it.

Why: the curves bound a stage's GIL share well when the stage is pure Python
or waits, but on a machine with few cores a stage whose C code releases the
GIL (hashing, decoding, numpy) flattens at the cores just as a GIL-bound one
flattens at the GIL. On 2 cores the curves put a SHA-256 stage, which holds
the GIL ~0% of its time, at 0.61 [0.44, 0.75] in one diagnosis and 0.33 in
another; its stand-in then held the GIL and the replay read 21% low.

How: the stage runs back to back in one thread, alone for a short window and
then for the same window next to a counter thread that spins in pure Python.
The counter only ever runs Python, so its CPU time is the time it held the
GIL; the stage held it for the rest of the window. Per call::

    held  = (window - counter CPU) / calls with the counter
    share = held / (window / calls alone)

The switch interval is set to 0.5 ms during the probe (and restored), so the
stage gets the GIL back within 0.5 ms of asking instead of 5 ms and its
GIL-free work runs at its own pace next to the counter. The cyclic garbage
collector is paused for the rounds too (reference counting still frees
what a call drops): a collection is pure Python holding the GIL, and
which window it lands in is chance, so it reads as GIL the stage held or
the spinner's time. In a process holding 300k tracked objects (a training
script's), a pure-Python augment stage read 0.89 (0.79-1.0 over 8 probes)
with the collector on and 0.97 (0.87-1.0) with it off; collate and a
spin+sleep stage did not move. A stage that hangs leaves it paused until
``timeout_s``. Stages whose
calls take over 0.1 s are not probed (it needs a dozen calls). The median over
several short alternating rounds keeps a shared host's speed phases (tens of
milliseconds) out of it.

A counter that holds the GIL but not a core (the machine took it away:
other VMs, other programs) would read as GIL the stage held. Two corrections:

- The spinner times its own loop. A pause over 0.1 ms in which it did not
  block (its count of voluntary context switches, ``getrusage`` per
  thread, did not move) is time it held the GIL without a core: the
  hypervisor took the core mid-round, or an interrupt or another program
  did. That time is counted as the spinner's (``spinner_lost``: its median
  share of a round; 0-2% on a quiet machine, where a sleeping stage read
  ~0.01 high from it before). A pause in which it blocked is a wait for the
  GIL, and stays the stage's. Off Linux there is no per-thread count and
  no pause is counted.
- Each round first lets the spinner run alone for 5 ms; the share of a
  core it got there (``spinner_core``, net of the pauses above) scales its
  CPU time up to its GIL time. That corrects a steady loss in slices too
  short to see as pauses.

Neither covers programs in this machine competing for the cores during
the round: a spinner woken to take the GIL may then wait for a core with
the GIL free, and that pause holds a block, so it stays the stage's. Those show as the spinner's wait for a core, which Linux counts
per thread (``run_delay`` in
``/proc/<pid>/task/<tid>/schedstat``; 0-2% of a round on a quiet machine,
~50% beside a busy process). It cannot be subtracted: a spinner that waits
for a core while the stage holds the GIL and one that waits while the stage
computes without it look the same (adding the wait back read a pure-Python
stage at 0.2). So a round whose spinner waited over 10% of it is dropped,
and a probe that cannot get three clean rounds in twice its budget reports
the machine busy instead of a share; the curves decide then. Where
``schedstat`` is missing (not Linux) every round counts and
``core_wait`` is ``None``.

How often a call lets the GIL go (``releases``, for the replay's stand-ins:
:mod:`stagebench.pipeline._replay`): each time the stage's C code drops the GIL, the
spinner takes it, and the stage blocks to take it back. So the stage
thread's voluntary context switches per call next to the spinner, less
those it makes alone (its own sleeps and reads) and one per switch interval
the spinner held the GIL without a core (the stage, waiting, times out that
often), are its waits to take the GIL back: two each (a wait that times out,
which asks the spinner for it, then the wait for the hand-over). Half of them,
less one per switch interval of GIL it held (the spinner makes a holder hand
it over that often), count the releases (Linux only: ``getrusage`` per thread).

A release counts only where the spinner takes the GIL during it, so the
count is a lower bound with a long tail. On a machine that takes the
spinner's core (``spinner_core`` under about 0.9), a release shorter than
the spinner's wait to run goes unseen.

What it is not: the hand-offs of the GIL count as the stage's (a stage that
reacquires the GIL often reads a little high), and time taken from the
*stage's* thread while it holds the GIL is the stage's too (its calls grow
longer; the spinner waits, blocked). That one cannot be told apart from a
C call that holds the GIL (it shows as pauses of a few ms with several GIL
timeouts in them). The median over rounds keeps such moments out
unless they fill half the rounds. The stage runs in a thread of its own that the
diagnosis abandons after ``timeout_s`` (a stage that hangs on the probe's
inputs cannot stop the diagnosis).
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
