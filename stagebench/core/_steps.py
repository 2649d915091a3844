"""The user's training step, timed between its ``next()`` calls on cached batches: the step's demand.

Used by ``STAGEBENCH_TRAINER=measure`` for SPDL pipelines (:mod:`stagebench.pipeline._trainer`)
and for DataLoaders (:mod:`stagebench.loader._trainer`): each hands the user's loop cached batches
through :meth:`TrainerProbe.alone_phase` (the step alone: the time from handing a batch to the
loop's next ``next()``); the job runs that follow are :mod:`stagebench.core._jobrun`'s.

Why the phase is sized by precision, not by seconds: the loops users bring often stop after a few
hundred steps (a smoke test, a ``max_steps``), and the job runs after this phase need most of
them. So the phase stops as soon as the step's rate is known to :data:`STEP_PRECISION` (its 95%
interval from chunk means), after :data:`MIN_COUNTED` counted steps; ``seconds`` is only its most.
A GPU loop that syncs only every k steps has uneven steps: its interval stays wide until the
chunks span the syncs, so it runs longer, as it should.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from stagebench.model._job import StepAlone
from stagebench.model._rate import CONFIDENCE, Rate

__all__ = ["WARMUP_STEPS", "CACHED_BATCHES", "MIN_COUNTED", "STEP_PRECISION", "TrainerProbe", "step_rate"]

WARMUP_STEPS = 3  # steps of each phase not counted: a compile, the first CUDA step, the first batches arriving
_MIN_STEPS = 2  # counted steps below this give no figure
CACHED_BATCHES = 16  # real batches the first phase hands the loop (cycled)
_CHUNKS = 5  # batch means for the interval
#: Counted steps before the cached phase may stop on precision: five chunks of two steps at least.
MIN_COUNTED = 10
#: Half-width of the step rate's 95% interval, as a share of the rate, at which the cached phase stops.
STEP_PRECISION = 0.03
_CHECK_EVERY = 5  # counted steps between two precision checks (each costs a t quantile)
#: Seconds of the clock between two checks of the step's precision (each reads every step so far).
_CHECK_S = 0.05


def step_rate(durations: list[float]) -> tuple[float | None, float | None, float | None]:
    """Steps per second over ``durations`` (seconds per step), with a 95% interval from chunk means."""
    if len(durations) < _MIN_STEPS or sum(durations) <= 0:
        return None, None, None
    rate = len(durations) / sum(durations)
    # in plain Python, not numpy: the DataLoader hook imports this module at interpreter start
    n = min(_CHUNKS, len(durations))
    size, extra = divmod(len(durations), n)  # consecutive chunks, the first ``extra`` one step longer
    ends = [i * size + min(i, extra) for i in range(n + 1)]
    means = [(b - a) / t for a, b in zip(ends, ends[1:]) if (t := sum(durations[a:b])) > 0]
    if len(means) < 2:
        return rate, None, None
    interval = Rate.around(rate, means, CONFIDENCE)  # on the log scale: a rate's interval never reaches below zero
    return rate, interval.low, interval.high


class TrainerProbe:
    """Hands the user's loop cached batches and times its steps; one instance per diagnosis."""

    def __init__(
        self,
        *,
        seconds: float,
        items_per_batch: float,
        say: Callable[[str], None],
        clock: Callable[[], float] = time.perf_counter,
        precision: float = STEP_PRECISION,
        pinned: bool | None = None,
    ) -> None:
        self.seconds = seconds  # the most the phase runs, counted steps only
        self.items_per_batch = items_per_batch
        self.say = say
        self.clock = clock
        self.precision = precision
        self.pinned = pinned  # whether the cached batches are in page-locked memory (None: not known / no device)
        self.alone: list[float] = []  # step durations of the loop body on cached batches
        self.stopped_by: str | None = None  # "precision" or "time": what ended the phase
        self.stopped_early: str | None = None
        self.error: str | None = None
        self.steps_handed = 0  # every batch handed to the loop, warm-up included
        #: called with the cached batch's index before each is handed: a ranked job tells its other ranks
        #: (:class:`stagebench.job._lockstep.Lockstep`)
        self.tell: Callable[[int], None] | None = None

    def alone_phase(self, batches: list) -> Iterator[Any]:
        """Yield cached batches until the step's rate is known to ``precision`` (or ``seconds`` of counted steps)."""
        if not batches:
            self.error = "no batch reached the sink to hand the loop"
            return
        self.say(
            f"trainer: your loop runs on {len(batches)} cached batches until its step is known to "
            f"±{self.precision:.0%} (at most {self.seconds:g} s; the first {WARMUP_STEPS} steps not counted)"
        )
        i, counted = 0, 0.0
        t_begin: float | None = None  # the first counted step's start (warm-up steps, compiles, not in it)
        next_check = 0.0
        while True:
            if self.tell is not None:
                self.tell(i)
            t = self.clock()
            self.steps_handed += 1
            yield batches[i % len(batches)]
            now = self.clock()
            dt = now - t
            if i >= WARMUP_STEPS:
                if t_begin is None:
                    t_begin = t
                self.alone.append(dt)
                counted += dt
                n = len(self.alone)
                # at most ``seconds`` of counted steps, and of the clock: a loop of microseconds a step spends
                # most of its time outside its body (handing batches, the checks), and its 10 s of counted
                # steps took minutes
                if counted >= self.seconds or now - t_begin >= self.seconds:
                    self.stopped_by = "time"
                    return
                # the check reads every step so far: every few steps, and no more often than _CHECK_S
                if n >= MIN_COUNTED and n % _CHECK_EVERY == 0 and now >= next_check:
                    next_check = now + _CHECK_S
                    if self._precise():
                        self.stopped_by = "precision"
                        return
            i += 1

    def _precise(self) -> bool:
        rate, lo, hi = step_rate(self.alone)
        return rate is not None and lo is not None and hi is not None and (hi - lo) / 2 <= self.precision * rate

    def result(self) -> StepAlone:
        """The demand, measured on cached batches (``run.json["trainer"]``: :meth:`StepAlone.as_run`)."""
        steps, lo, hi = step_rate(self.alone)
        k = self.items_per_batch
        error = self.error
        if steps is None and not error:
            error = f"{len(self.alone)} of its steps counted, {_MIN_STEPS} needed (the first {WARMUP_STEPS} are not counted)"
        return StepAlone(
            steps_per_s=steps,
            steps_per_s_low=lo,
            steps_per_s_high=hi,
            items_per_step=k,
            samples_per_s=steps * k if steps is not None else None,
            samples_per_s_low=lo * k if lo is not None else None,
            samples_per_s_high=hi * k if hi is not None else None,
            steps=len(self.alone),
            seconds=sum(self.alone),
            warmup_steps=WARMUP_STEPS,
            precision=self.precision,
            stopped_by=self.stopped_by,
            pinned=self.pinned,
            error=error,
            stopped_early=self.stopped_early,
        )
