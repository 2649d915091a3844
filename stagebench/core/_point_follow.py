"""A stage point as a follower of a ranked diagnosis runs it: the leader's stage, executor, concurrency and
harness, on this rank's own inputs of that stage.

The leader measures its point as on one rank (:func:`stagebench.core._measure.measure_stage`); each
follower runs the same stage at the same setting at the same time (:mod:`stagebench.core._mirror` says
why), through the same runners, warmed up by the same rule (every worker delivered, then the warm-up),
and reckons the leader's window over its own lanes as the leader does (:func:`window_rate`). A process
point runs on a pool this rank keeps per stage across the points, grown by level as the leader's is, so
that its warm-up costs what the leader's does.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from stagebench.core._config import MeasureConfig
from stagebench.core._executors import (
    Runner,
    WorkerPool,
    async_identity,
    identity,
    is_coroutine_callable,
    make_runner,
)
from stagebench.core._measure import window_rate
from stagebench.core._spdl_harness import SpdlRunner
from stagebench.core._stage_draft import WindowRate

__all__ = ["PointRun", "Pools"]


class Pools:
    """This rank's process pools, one per stage (by name), kept across its points; closed at the end."""

    def __init__(self) -> None:
        self._by: dict[str, WorkerPool] = {}

    def of(self, name: str, fn: Callable) -> WorkerPool:
        pool = self._by.get(name)
        if pool is None:
            pool = self._by[name] = WorkerPool(fn)
        return pool

    def close(self) -> None:
        for pool in self._by.values():
            pool.discard()
        self._by.clear()


class PointRun:
    """One of the leader's points on this rank (a :class:`stagebench.core._follow.Mirrored`)."""

    def __init__(self, runner: Runner, warmup_s: float) -> None:
        self.runner = runner
        self.warmup_s = warmup_s
        self.t_start = time.perf_counter()

    @classmethod
    def open(
        cls, spec: Mapping[str, Any], resolve: Callable[[str], tuple[Callable, Sequence[Any]]], pools: Pools
    ) -> PointRun:
        """``resolve(stage)``: this rank's callable and inputs of the leader's stage (its no-op ceiling's too)."""
        name, role, executor = str(spec["stage"]), str(spec["role"]), str(spec["executor"])
        stage, inputs = resolve(name)
        fn = stage
        if role == "ceiling":  # its no-op, on the stage's own pool where it runs on processes (as the leader's)
            fn = async_identity if is_coroutine_callable(stage) else identity
        c = int(spec["concurrency"])
        pool = pools.of(name, stage) if executor == "process" else None
        runner: Runner
        if spec["harness"] == "spdl":
            runner = SpdlRunner(fn, inputs, c, executor, pool, extra_pipes=int(spec.get("extra_pipes") or 0))
        else:
            runner = make_runner(executor, fn, inputs, c, pool)
        runner.start()
        return cls(runner, float(spec["warmup_s"]))

    def ready(self, seq: int) -> bool:
        r = self.runner
        if r.fatal is not None:
            return True
        return r.delivered_workers() >= r.expected_workers() and time.perf_counter() - self.t_start >= self.warmup_s

    def error(self) -> tuple[str, str] | None:
        r = self.runner
        return None if r.fatal is None else (r.fatal_status or "failed", r.fatal)

    def pids(self) -> list[int]:
        return self.runner.worker_pids()

    def count(self, t0: float) -> int:
        return sum(sum(1 for e in list(lane.ends) if e >= t0) for lane in list(self.runner.lanes.values()))

    def gate(self, opened: bool, seq: int) -> None:
        """A point does not wait between windows: it runs from its opening to its close."""

    def rates(self, t0: float, t1: float, how: Mapping[str, Any]) -> WindowRate:
        return window_rate(self.runner.lanes, t0, t1, MeasureConfig(**how))

    def close(self) -> None:
        try:
            self.runner.request_stop()
            self.runner.wait_idle(2.0)
        except Exception:  # a tear-down's fault: the leader's own point says what its stage did
            pass
        finally:
            self.runner.abort()
