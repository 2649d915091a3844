"""The user's training loop, timed between its ``next()`` calls: the training step's demand and its data wait.

Used by ``STAGEBENCH_TRAINER=measure`` for SPDL pipelines (:mod:`stagebench.pipeline._trainer`)
and for DataLoaders (:mod:`stagebench.loader._trainer`): each hands the user's loop batches
through :class:`TrainerProbe`'s generators, first cached ones (the step alone: the time from
handing a batch to the loop's next ``next()``), then from the real loader (the wait for each batch
and the loop body after it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["WARMUP_STEPS", "CACHED_BATCHES", "TrainerProbe"]

WARMUP_STEPS = 3  # steps of each phase not counted: a compile, the first CUDA step, the first batches arriving
_MIN_STEPS = 2  # counted steps below this give no figure
CACHED_BATCHES = 16  # real batches the first phase hands the loop (cycled)
_CHUNKS = 5  # batch means for the interval


def _rate(durations: list[float]) -> tuple[float | None, float | None, float | None]:
    """Steps per second over ``durations`` (seconds per step), with a 95% interval from chunk means."""
    import numpy as np

    from stagebench.core._stats import interval_about

    if len(durations) < _MIN_STEPS or sum(durations) <= 0:
        return None, None, None
    rate = len(durations) / sum(durations)
    chunks = [c for c in np.array_split(np.asarray(durations), min(_CHUNKS, len(durations))) if c.sum() > 0]
    lo, hi, _ = interval_about(rate, [len(c) / c.sum() for c in chunks], 0.95)
    return rate, (lo if np.isfinite(lo) else None), (hi if np.isfinite(hi) else None)


class TrainerProbe:
    """Hands the user's loop batches and times its steps; one instance per diagnosis."""

    def __init__(
        self,
        *,
        seconds: float,
        items_per_batch: float,
        say: Callable[[str], None],
        clock: Callable[[], float] = time.perf_counter,
        live: str = "the real pipeline",
    ) -> None:
        self.seconds = seconds
        self.items_per_batch = items_per_batch
        self.say = say
        self.clock = clock
        self.live = live  # what the second phase runs on, in messages
        self.alone: list[float] = []  # step durations of the loop body on cached batches
        self.bodies: list[float] = []  # on the real pipeline: the loop body's part of each step
        self.waits: list[float] = []  # and the wait for the batch
        self.stopped_early: str | None = None
        self.error: str | None = None

    # ------------------------------------------------------------------ phase 1
    def alone_phase(self, batches: list) -> Iterator[Any]:
        """Yield cached batches until ``seconds`` of counted steps; time each step of the loop body."""
        if not batches:
            self.error = "no batch reached the sink to hand the loop"
            return
        self.say(
            f"trainer: your loop runs on {len(batches)} cached batches for {self.seconds:g} s "
            f"(the first {WARMUP_STEPS} steps not counted)"
        )
        i, counted = 0, 0.0
        while counted < self.seconds:
            t = self.clock()
            yield batches[i % len(batches)]
            dt = self.clock() - t
            if i >= WARMUP_STEPS:
                self.alone.append(dt)
                counted += dt
            i += 1

    # ------------------------------------------------------------------ phase 2
    def real_phase(self, get_item: Callable[[], Any]) -> Iterator[Any]:
        """Yield the real pipeline's batches; time the wait for each and the loop body after it."""
        self.say(f"trainer: your loop runs on {self.live} at the recommended settings for {self.seconds:g} s")
        i, t_begin = 0, None
        while True:
            t0 = self.clock()
            try:
                item = get_item()
            except EOFError:
                self.stopped_early = "the pipeline ended"
                return
            t1 = self.clock()
            yield item
            t2 = self.clock()
            if i >= WARMUP_STEPS:
                t_begin = t0 if t_begin is None else t_begin
                self.waits.append(t1 - t0)
                self.bodies.append(t2 - t1)
                if t2 - t_begin >= self.seconds:
                    return
            i += 1

    # ------------------------------------------------------------------ result
    def result(self) -> dict[str, Any]:
        """``run.json["trainer"]``: the demand (alone) and the data wait (on the real pipeline)."""
        steps, lo, hi = _rate(self.alone)
        k = self.items_per_batch
        out: dict[str, Any] = {
            "steps_per_s": steps,
            "steps_per_s_low": lo,
            "steps_per_s_high": hi,
            "items_per_step": k,
            "samples_per_s": steps * k if steps is not None else None,
            "samples_per_s_low": lo * k if lo is not None else None,
            "samples_per_s_high": hi * k if hi is not None else None,
            "steps": len(self.alone),
            "seconds": sum(self.alone),
            "warmup_steps": WARMUP_STEPS,
            "error": self.error,
            "stopped_early": self.stopped_early,
        }
        total = sum(self.waits) + sum(self.bodies)
        if len(self.waits) >= _MIN_STEPS and total > 0:
            out["with_pipeline"] = {
                "steps": len(self.waits),
                "seconds": total,
                "data_wait_share": sum(self.waits) / total,
                "samples_per_s": len(self.waits) / total * k,
            }
        else:
            out["with_pipeline"] = None
        if out["samples_per_s"] is None and not out["error"]:
            out["error"] = f"fewer than {_MIN_STEPS} counted steps (the loop stopped after {len(self.alone)})"
        return out
