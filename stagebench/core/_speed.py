"""How fast this machine runs Python right now: a fixed loop's CPU time per iteration.

Why it is measured: on shared virtual machines a core's speed changes by up to
about 2x within seconds (other tenants on the same physical core, frequency
changes): a fixed loop can alternate between two speeds every few seconds. CPU-bound throughputs
measured at different moments then differ by that much whatever the
instrument does: the stage sweeps and the whole-pipeline validation run are
such moments. The diagnosis probes the speed after every point and around the
validation run, warns when it moved, and compares the prediction with the
validation at the validation's speed.

``time.thread_time`` counts only this thread's CPU time, so waiting for a core
(other load) does not change the reading: only the speed of the core does.
The median of several short trials keeps a preemption inside one trial from
counting.
"""

from __future__ import annotations

import statistics
import time

__all__ = ["cpu_speed_ns", "speed_loop", "speed_work"]

_LOOPS = 20_000  # about 0.6-1.1 ms a trial here: shorter than a scheduler time slice


def speed_loop(n: int) -> int:
    """The fixed loop whose speed is probed (the replay's stand-ins run it as their GIL-held work)."""
    x = 0
    for i in range(n):
        x += i
    return x


def speed_work(n: int) -> None:
    """``n`` iterations of the probed loop, in runs of the probe's own length: each iteration then costs what
    the probe read. One run of ``n`` does not: its sum outgrows a one-digit int (2**30) after about 46,000
    iterations, and each iteration after that costs more (a 1.5 ms stand-in ran 7% longer than the stage
    whose CPU it was built from, the same loop)."""
    for _ in range(n // _LOOPS):
        speed_loop(_LOOPS)
    speed_loop(n % _LOOPS)


def cpu_speed_ns(trials: int = 9) -> float:
    """Median CPU nanoseconds per iteration of a fixed pure-Python loop (lower is faster)."""
    ts = []
    for _ in range(trials):
        t0 = time.thread_time_ns()
        speed_loop(_LOOPS)
        ts.append(time.thread_time_ns() - t0)
    return statistics.median(ts) / _LOOPS
