"""Frozen, validated settings for measuring one point and for a sweep."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from stagebench._settings import MIN_WINDOW_S, PRECISION, STAGE_WINDOW_S, WARMUP_S, check
from stagebench.runs._schema import EXECUTORS, HARNESSES

__all__ = ["CANNOT_MATTER", "PAIRED_PRECISION", "MeasureConfig", "SweepConfig", "in_turns_precision", "powers_of_two"]

#: A point whose interval lies wholly under this share of the best lower end measured so far closes at
#: the minimum window: it can be neither the best nor within 5% of it, so a tighter interval would
#: change no advice (its rate is as unbiased as a longer window's; only its interval is wider). The 20%
#: margin keeps points whose own noise, or the host's phases between two windows, could still carry
#: them near the best: a loader setting that reads within it of the fastest is compared in turns.
#: Stage points and loader points alike.
CANNOT_MATTER = 0.8
#: Interval half-width at which a stage's head-to-head window closes, and a loader's num_workers screen
#: before its rounds in turns: each is one sample of a ratio whose interval comes from the rounds (the
#: host's phases between rounds, not the window's own noise), so ±10% will do. A loader's
#: window in a round closes at its shortest (:mod:`stagebench.loader._turns`): its start-up is paid once,
#: so a round costs only its windows.
PAIRED_PRECISION = 0.10


def in_turns_precision(precision: float) -> float:
    """The precision a window measured in turns closes at: :data:`PAIRED_PRECISION` or looser; 0 (always the
    whole budget) stays 0."""
    return max(precision, PAIRED_PRECISION) if precision > 0 else precision


def powers_of_two(maximum: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to ``maximum`` (``maximum`` itself included if not a power)."""
    if maximum < 1:
        raise ValueError(f"max concurrency must be >= 1, got {maximum}")
    levels = [1 << k for k in range(int(math.log2(maximum)) + 1)]
    if levels[-1] != maximum:
        levels.append(maximum)
    return tuple(levels)


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasureConfig:
    """How one point (stage x executor x concurrency) is measured."""

    budget_s: float = STAGE_WINDOW_S
    """Longest steady-state window, in seconds (it closes earlier under
    ``precision``). The window grows (up to ``timeout_s``) only when items are
    so slow that fewer than three batches of at least two item-latencies each
    would fit: a slow stage never gets an interval it has not earned."""

    min_window_s: float = MIN_WINDOW_S
    """Shortest window, in seconds, when ``precision`` may close it early (capped
    by ``budget_s``). Long enough for ten batches of a stage up to ~10 ms per
    item; a window shorter than ten batches of two latencies never closes early."""

    precision: float = PRECISION
    """Sequential stopping: from ``min_window_s`` on, the window closes as soon
    as the half-width of its batch-means interval is within this share of the
    throughput (checked every quarter of ``min_window_s``, on the items
    recorded so far). A steady stage (waiting, I/O) is done in the minimum;
    one whose rate moves gets the whole ``budget_s``. 0: always ``budget_s``.
    Checks read the records, so a point above ~100k items in its window (a
    no-op ceiling) is not checked: copying its records would slow it."""

    below: float | None = None
    """Sequential stopping for a point that cannot matter: from ``min_window_s``
    on, the window also closes once its interval's upper end is under this
    rate (items/s). The sweep sets it to a share of the stage's best lower end
    so far (:data:`CANNOT_MATTER`): such a point cannot be
    the stage's best nor within 5% of it, so it gets the interval it has, not a
    tighter one. None: only ``precision`` closes a window early."""

    warmup_s: float = WARMUP_S
    """Minimum warm-up before the window opens. The window also waits until every
    worker has delivered at least one item (processes started, caches filled)."""

    timeout_s: float = 60.0
    """Hard deadline for the whole point. A stage that has not reached steady
    state by then is recorded as ``timeout`` and its workers are cleaned up."""

    max_batches: int = 10
    """Batches for the batch-means confidence interval."""

    confidence: float = 0.95
    """Two-sided confidence level of ``qps_low``/``qps_high``."""

    sample_interval_s: float = 0.1
    """How often memory is sampled during the window."""

    def for_noop(self, budget_s: float | None = None) -> MeasureConfig:
        """How a no-op is measured (a harness ceiling, SPDL's no-op pipelines) next to stages measured with this.

        A no-op reaches its steady rate at once: half the minimum window and
        half the warm-up (after its workers' first items, which it still
        waits for), at the same precision: the replay charges a process stage
        the difference of two ceilings (docs/method.md). ``budget_s``: half of
        this budget, at least 0.2 s.
        """
        return replace(
            self,
            budget_s=budget_s or max(0.2, self.budget_s / 2),
            min_window_s=self.min_window_s / 2,
            warmup_s=self.warmup_s / 2,
        )

    def __post_init__(self) -> None:
        check("budget_s", self.budget_s, "budget_s")
        check("warmup_s", self.warmup_s, "warmup_s")
        check("min_window_s", self.min_window_s, "min_window_s")
        check("precision", self.precision, "precision")
        if not self.timeout_s > self.budget_s:
            raise ValueError(f"timeout_s ({self.timeout_s}) must be larger than budget_s ({self.budget_s})")
        if self.max_batches < 3:
            raise ValueError(f"max_batches must be >= 3, got {self.max_batches}")
        if not 0.5 < self.confidence < 1:
            raise ValueError(f"confidence must be in (0.5, 1), got {self.confidence}")
        if not self.sample_interval_s > 0:
            raise ValueError(f"sample_interval_s must be > 0, got {self.sample_interval_s}")


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepConfig:
    """Which points a stage sweep measures."""

    executors: tuple[str, ...] = ("thread", "process")
    """Executors to sweep. Coroutine functions always run on ``async``."""

    concurrency: tuple[int, ...] = powers_of_two(32)
    """Concurrency levels, ascending."""

    harnesses: tuple[str, ...] = ("direct",)
    """``direct`` (stagebench's workers) and/or ``spdl`` (a one-stage SPDL pipeline)."""

    ceiling: bool = True
    """Also measure the identity stage over the same inputs (the harness ceiling)."""

    measure: MeasureConfig = field(default_factory=MeasureConfig)

    ceiling_budget_s: float | None = None
    """Window for ceiling points; ``None`` uses half of ``measure.budget_s``
    (an identity stage reaches steady state quickly)."""

    process_flat_levels: int = 2
    """Stop a process curve after this many consecutive levels that do not
    raise its best throughput beyond noise (each higher level starts more
    interpreters, and a plateau does not come back up on processes). With a
    value above 0, no process point is measured where the thread curve shows
    that processes cannot win, and a GIL-free stage's thread curve ends once
    more threads get no more (:mod:`stagebench.core._sweep`). 0 measures every
    level."""

    process_ceilings: str = "near_best"
    """Which levels of a process curve get their no-op ceiling: ``"near_best"``
    measures it only after a stage point within 5% of the best so far (the
    recommendation and the verdicts read the ceiling at the best level and at
    the smallest level within 5% of it, and both always qualify), ``"all"`` at
    every level. A process ceiling ships the stage's own items, so it cannot be
    shared between stages like the thread ones."""

    paired_rounds: int = 2
    """Rounds of the head-to-head (:mod:`stagebench.core._paired`): when the curves
    alone would recommend processes by less than 1.5x, both executors are
    measured again at their best levels in turns, T P P T per round, and the
    recommendation follows that paired result. 0: no head-to-head (the curves
    decide, as measured seconds apart)."""

    def __post_init__(self) -> None:
        if self.process_ceilings not in ("near_best", "all"):
            raise ValueError(f"process_ceilings: unknown value {self.process_ceilings!r}; allowed: near_best, all")

        for ex in self.executors:
            if ex not in EXECUTORS:
                raise ValueError(f"executors: unknown executor {ex!r}; allowed: {', '.join(EXECUTORS)}")
        for h in self.harnesses:
            if h not in HARNESSES:
                raise ValueError(f"harnesses: unknown harness {h!r}; allowed: {', '.join(HARNESSES)}")
        if not self.concurrency or any(c < 1 for c in self.concurrency):
            raise ValueError(f"concurrency must be positive integers, got {self.concurrency}")
        if self.process_flat_levels < 0:
            raise ValueError(f"process_flat_levels must be >= 0 (0: every level), got {self.process_flat_levels}")
        if self.paired_rounds < 0:
            raise ValueError(f"paired_rounds must be >= 0 (0: no head-to-head), got {self.paired_rounds}")
        if list(self.concurrency) != sorted(set(self.concurrency)):
            raise ValueError(f"concurrency must be ascending and distinct, got {self.concurrency}")
