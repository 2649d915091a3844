"""How much of the machine is free right now, measured rather than guessed.

Scaling claims ("two processes do 1.3x the work of one") need two free cores.
On a machine that other programs keep busy they cannot be checked at all, and a
test that fails there says nothing about stagebench. We measure the free cores
directly (the load average lags by a minute and counts our own past tests) and
skip with the figure when there are too few.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

_SPIN = "import time,sys\nt=time.monotonic()\nwhile time.monotonic()-t<{s}: pass\nprint(time.process_time())"


def free_cores(seconds: float = 0.5) -> float:
    """CPU seconds that N busy processes (N = usable cores) got per wall second."""
    n = len(os.sched_getaffinity(0))
    procs = [
        subprocess.Popen([sys.executable, "-S", "-c", _SPIN.format(s=seconds)], stdout=subprocess.PIPE, text=True)
        for _ in range(n)
    ]
    cpu = sum(float(p.communicate()[0]) for p in procs)
    return cpu / seconds


def require_free_cores(needed: float) -> float:
    got = free_cores()
    if got < needed:
        pytest.skip(f"machine too busy to test scaling: {got:.2f} free cores measured, {needed} needed")
    return got


class quiet_machine:
    """Context: skip (with the figures) if the machine was busy before or after the block.

    Other programs can take the cores while a scaling measurement runs; checking
    both sides brackets the measurement without disturbing it.
    """

    def __init__(self, needed: float) -> None:
        self.needed = needed

    def __enter__(self) -> "quiet_machine":
        require_free_cores(self.needed)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        after = free_cores()
        if after < self.needed:
            pytest.skip(
                f"machine became busy during the scaling measurement: "
                f"{after:.2f} free cores afterwards, {self.needed} needed"
            )
        return False


#: A 95% interval wider than this share of its value, either side, says the machine did not keep
#: time during the point (quiet runs here stay within +-10%; the bad phases read +-45% to +-96%).
NOISY_HALF_WIDTH = 0.25


def noisy_points(points, value: str = "qps") -> str | None:
    """The points (a DataFrame with ``value``, ``value_low``, ``value_high``) whose interval is wider
    than +-``NOISY_HALF_WIDTH`` of their value, as a table for the skip message; None if none is.

    Known answers use it to stand down only when their outcome differs *and* this reading explains
    it: a wide interval is the machine's doing, and the rules under test rightly refuse to decide on it.
    """
    if not {value, f"{value}_low", f"{value}_high"} <= set(points.columns):
        return None
    half = (points[f"{value}_high"] - points[f"{value}_low"]) / 2
    wide = points[half > NOISY_HALF_WIDTH * points[value]]
    if wide.empty:
        return None
    return (
        f"the machine did not keep time: a point's 95% interval is wider than +-{NOISY_HALF_WIDTH:.0%} of its "
        f"value\n" + wide[[value, f"{value}_low", f"{value}_high"]].to_string()
    )
