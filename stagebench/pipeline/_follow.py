"""A follower's part in a ranked SPDL diagnosis: the leader's points and whole pipelines, on this rank's own data.

Each rank other than local rank 0 builds its own pipeline config (its source, its shard) as the leader
does, then searches nothing itself (:mod:`stagebench.core._follow` is the talk). It walks its pipeline as
the leader walks its own, step for step at the leader's word (``source``, then ``stage`` before each
step's first pass), so that each stage's inputs here are this rank's own outputs of the stage before it,
computed at the same moment as the leader's: the same code (:func:`stagebench.pipeline._stages.first_pass`,
a consuming stage fused with the one before it as the leader fuses it). Then it runs what the leader
measures at the same time: each stage point on this rank's inputs of that stage
(:class:`stagebench.core._point_follow.PointRun`), each whole pipeline (the replay with the leader's
stand-ins, the real pipeline at the recommended settings and at yours: :class:`WholeRun`), and, where the
leader runs your loop, the job phase step for step (:func:`stagebench.job._lockstep.follow_job`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from stagebench.core._executors import identity
from stagebench.core._follow import Followed, follow
from stagebench.core._measure import POINT
from stagebench.core._point_follow import PointRun, Pools
from stagebench.core._ranks import HostGroup
from stagebench.model import _pipeline as model
from stagebench.model._stage import keyed
from stagebench.pipeline._calls import Fused
from stagebench.pipeline._first_pass import measure_inputs, read_source, run_passthrough
from stagebench.pipeline._isolate import Passthrough, plan_pipeline
from stagebench.pipeline._replay import StandIn
from stagebench.pipeline._settings import DiagnoseSettings
from stagebench.pipeline._stage_cache import StageCache, cache_folder, items_key
from stagebench.pipeline._stages import Cursor, advance, consumes_why, first_pass
from stagebench.pipeline._wholerun import WHOLE, WholePipelineRun

__all__ = ["follow_pipeline", "Walk", "WholeRun"]


class Walk:
    """This rank's pipeline walked stage by stage at the leader's word: each stage's inputs, as measured."""

    def __init__(self, plan: Any, settings: DiagnoseSettings) -> None:
        self.plan, self.settings = plan, settings
        self.source_items: list = []
        self.cur: Cursor | None = None
        self.inputs: dict[str, tuple[Callable, Sequence[Any]]] = {}  # stage -> (the callable measured, its inputs)
        # the leader's folder (one user's), or none where the leader keeps none
        self.cache = StageCache(cache_folder(settings.cache_dir), max_disk_mb=10 * settings.cache_max_mb)

    def read_source(self) -> None:
        self.source_items = read_source(
            self.plan, self.settings.num_items, timeout_s=max(60.0, self.settings.timeout_s)
        ).items
        self.cur = Cursor(inputs=self.source_items, key=items_key(self.source_items)[0])

    def step(self, index: int) -> None:
        """The plan's ``index``-th step, as the leader's walk takes it (without what it says and records)."""
        cur, step = self.cur, self.plan.steps[index]
        if cur is None or cur.blocked:
            return
        timeout_s = self.settings.timeout_s
        if isinstance(step, Passthrough):
            cur.prev = None
            cur.inputs = run_passthrough(step, cur.inputs, timeout_s=max(60.0, timeout_s))
            cur.key, cur.came_from = items_key(cur.inputs)[0], ", ".join(step.names)
            cur.blocked = None if cur.inputs else "no outputs"
            return
        cached, key, _ = first_pass(step, cur, self.cache, self.settings, self.plan)
        first = cached.first
        if first.crashed:
            cur.blocked = "crashed"
            return
        minputs = measure_inputs(step, cur.inputs, first)
        measured, sweep_inputs = step.fn, minputs
        if minputs and cur.prev is not None and cur.prev.inputs and consumes_why(step, minputs[0], first, timeout_s):
            measured, sweep_inputs = Fused(cur.prev.stage.fn, step.fn), cur.prev.inputs
        if sweep_inputs:
            self.inputs[step.name] = (measured, sweep_inputs)
        advance(step, cur, cached, key, minputs, None, timeout_s)

    def resolve(self, name: str) -> tuple[Callable, Sequence[Any]]:
        """The callable and inputs this rank measures for the leader's stage ``name``; a name that is no
        stage of the plan (SPDL's own no-op pipeline) runs the no-op over the source items."""
        got = self.inputs.get(name)
        if got is not None:
            return got
        if any(getattr(s, "name", None) == name for s in self.plan.steps):
            raise LookupError(f"this rank has no inputs for stage {name!r} (its stage before gave none)")
        return identity, self.source_items


class WholeRun:
    """One of the leader's whole-pipeline runs on this rank (a :class:`stagebench.core._follow.Mirrored`):
    this rank's pipeline at the leader's settings (with the leader's stand-ins in the replay), warmed up
    by the same rule, its source opened and closed with the leader's, its sink counted over the leader's
    windows."""

    def __init__(self, run: Any, warmup_s: float, timeout_s: float) -> None:
        self.run, self.warmup_s, self.timeout_s = run, warmup_s, timeout_s
        self.warm = False

    @classmethod
    def open(cls, spec: Mapping[str, Any], plan: Any, source_items: list) -> WholeRun:
        choices = {name: (str(ex), int(c)) for name, (ex, c) in (spec.get("choices") or {}).items()}
        stand_ins = spec.get("stand_ins")
        made = None if stand_ins is None else {name: StandIn(**d) for name, d in stand_ins.items()}
        run = WholePipelineRun(str(spec["name"]), plan, source_items, choices, made, float(spec["items_per_sink_item"]))
        run.start()
        run.open_for_warm_up()
        return cls(run, float(spec["warmup_s"]), float(spec["timeout_s"]))

    def ready(self, seq: int) -> bool:
        """Warm by the leader's whole runs' rule (``seq`` 0); the leader's turns settle by time, so an
        opening after its warm-up asks nothing more."""
        if seq == 0 and not self.warm:
            self.warm = self.run.warm(self.warmup_s, self.timeout_s)
        return self.warm or seq > 0

    def error(self) -> tuple[str, str] | None:
        return None if self.run.error is None else ("failed", self.run.error)

    def pids(self) -> list[int]:
        return []

    def count(self, t0: float) -> int:
        return sum(1 for a in list(self.run.arrivals) if a >= t0)

    def gate(self, opened: bool, seq: int) -> None:
        if opened:
            self.run.gate.set()
        else:
            self.run.gate.clear()

    def rates(self, t0: float, t1: float, how: Mapping[str, Any]) -> model.WholeRun:
        self.run.windows = [tuple(w) for w in how["windows"]]
        res = self.run.result(float(how["items_per_sink_item"]))
        return keyed(model.WholeRun, qps=res.qps, qps_low=res.qps_low, qps_high=res.qps_high)

    def close(self) -> None:
        self.run.close()


def follow_pipeline(
    group: HostGroup, cfg: Any, settings: DiagnoseSettings, num_threads: int | None
) -> tuple[Followed, Walk | None]:
    """This follower's part in the leader's diagnosis, until the leader ends or starts its job phase;
    returns how it ended and this rank's walk (its plan and source items, for the job phase)."""
    plan = plan_pipeline(cfg)
    plan.num_threads = num_threads
    walk = Walk(plan, settings)
    pools = Pools()

    def opener(what: str, spec: Mapping[str, Any]) -> Any:
        if what == POINT:
            return PointRun.open(spec, walk.resolve, pools)
        if what == WHOLE:
            return WholeRun.open(spec, plan, walk.source_items)
        raise ValueError(f"a pipeline diagnosis's follower cannot open {what!r}")

    mine: dict[int, Any] = {}
    steps = {"source": lambda cmd: walk.read_source(), "stage": lambda cmd: walk.step(cmd.index)}
    try:
        while True:
            done = follow(group, opener, until=("source", "stage", "job"), kept=mine)
            if done.cmd is None or done.cmd.op == "job":
                return done, walk
            steps[done.cmd.op](done.cmd)
    finally:
        for m in mine.values():
            m.close()
        pools.close()
