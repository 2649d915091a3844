"""Turn an SPDL ``PipelineConfig`` into stages that can each run alone.

A stage measured alone needs three things: a callable that maps one cached
input to its output(s), the inputs (the previous stage's outputs, computed
once here), and what the user configured (executor, concurrency) so the report
can compare. This module provides them, following SPDL's own semantics so the
cached outputs are what the real pipeline would hand to the next stage:

- a pipe whose op returns ``None`` drops the item; a (sync or async) generator
  op emits every yielded item;
- an aggregate feeds items to its :class:`~spdl.pipeline.defs.Aggregator` in
  order and emits whatever ``accumulate`` returns (plus ``flush`` at the end
  unless ``drop_last``). Measured alone, one input is the *group* of items that
  produced one output, so its throughput is outputs (batches) per second;
- a disaggregate emits the elements of each incoming list.

What cannot run alone (path variants, ``.to()`` worker regions, fused
subprocess stages) runs as a real SPDL segment to feed later stages and is
listed with the reason. A merged source is read as a real SPDL pipeline.

The plan also rebuilds the pipeline at chosen settings (:func:`build_validation_config`):
this is the one module that reads a config's private attributes. The callables it
measures stages with live in :mod:`._calls` (a process worker unpickles them); the
first pass that runs them, in :mod:`._first_pass`.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import inspect
import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import cloudpickle
from spdl.pipeline import build_pipeline
from spdl.pipeline.defs import (
    AggregateConfig,
    Collate,
    DisaggregateConfig,
    MergeConfig,
    PathVariantsConfig,
    PipeConfig,
    PipelineConfig,
    PlacementConfig,
    SinkConfig,
    SourceConfig,
)

from stagebench._spdl_private import (
    MODE_VAR,
    is_async_callable,
    is_asyncgen_callable,
    is_process_pool,
    main_process_class,
    pipe_args_class,
    pipe_type,
)
from stagebench.core._executors import close_pool, process_pool
from stagebench.pipeline._calls import (
    AggregateGroup,
    AsyncGenDrain,
    collate,
    disaggregate,
    drain_generator,
    install,
    installed_call,
)
from stagebench.pipeline._replay import StandIn

__all__ = [
    "Stage",
    "Passthrough",
    "Plan",
    "PlanError",
    "plan_pipeline",
    "real_pipeline",
    "build_validation_config",
    "default_threads",
]


class PlanError(Exception):
    """The pipeline cannot be diagnosed at all (no stages, nothing isolatable)."""


# ------------------------------------------------------------------ the plan
@dataclass(frozen=True, slots=True, kw_only=True)
class Stage:
    """One stage that runs alone on cached inputs."""

    name: str
    """Unique name (the user's; ``name (2)`` when two stages share one)."""
    index: int
    """Position in the pipeline's list of stages."""
    type: str
    """``pipe``, ``aggregate`` or ``disaggregate``; the defaults below are how SPDL runs the last two:
    inline, in order, one call at a time."""
    is_async: bool = False
    ordered: bool = True
    user_executor: str = "default"
    """What the user configured: ``thread``, ``process``, ``default`` (SPDL's shared
    thread pool) or ``async``."""
    user_concurrency: int = 1
    fn: Callable
    """The measured callable: one input (a group, for aggregates) -> one output."""
    many: bool
    """``fn`` returns a list whose elements are the stage's outputs."""
    config: Any
    """The SPDL stage config it came from."""
    key_source: Any
    """What identifies the stage's code for the cache (the op, or the aggregator)."""
    proto: Any = None
    """Pristine aggregator (aggregates only)."""
    drop_last: bool = False

    def fresh_aggregator(self) -> Any:
        """An aggregate's own aggregator, nothing accumulated: a copy of :attr:`proto` (aggregators are
        stateful, and the user's must stay untouched for the runs after)."""
        return copy.deepcopy(self.proto) if self.proto is not None else self.config.op

    def as_meta(self) -> dict[str, Any]:
        keys = ("name", "index", "type", "is_async", "user_executor", "user_concurrency", "ordered")
        return {k: getattr(self, k) for k in keys}


@dataclass(frozen=True, slots=True, kw_only=True)
class Passthrough:
    """Stages that cannot run alone: run together as a real SPDL segment."""

    names: tuple[str, ...]
    index: int
    reason: str
    configs: tuple


@dataclass(slots=True, kw_only=True)
class Plan:
    source: Any
    steps: list  # Stage | Passthrough, in pipeline order
    not_isolated: list[dict[str, str]] = field(default_factory=list)
    sink_buffer: int = 3
    source_is_merge: bool = False
    #: a few real outputs of each measured stage, by name: what its stand-in returns in the replay,
    #: so that the steps after it (disaggregate, aggregate, stages run as themselves) get items of
    #: the right kind
    sample_outputs: dict[str, list] = field(default_factory=dict)
    #: the user's ``build_pipeline(num_threads=...)``: SPDL's shared thread pool, where stages without
    #: an executor of their own run (None: not known, e.g. a config handed to ``diagnose_pipeline``)
    num_threads: int | None = None

    @property
    def stages(self) -> list[Stage]:
        return [s for s in self.steps if isinstance(s, Stage)]


def _executor_kind(op: Any, executor: Any) -> str:
    if is_async_callable(op):
        return "async"
    if executor is None:
        return "default"
    if is_process_pool(executor) or "process" in type(executor).__name__.lower():
        return "process"
    return "thread"


def _pipe_stage(cfg: Any, name: str, index: int) -> Stage:
    op = cfg._args.op
    call = getattr(op, "__call__", None)
    target = call if inspect.ismethod(call) else op  # as SPDL's convert_to_async does
    fn: Callable[..., Any]
    if is_asyncgen_callable(op):
        fn, many = AsyncGenDrain(op), True
    elif inspect.isgeneratorfunction(target):
        fn, many = functools.partial(drain_generator, op), True
    else:
        fn, many = op, False
    kind = _executor_kind(op, cfg._args.executor)
    return Stage(
        name=name,
        index=index,
        type="pipe",
        is_async=kind == "async",
        ordered=cfg._type == pipe_type().OrderedPipe,
        user_executor=kind,
        user_concurrency=int(cfg._args.concurrency),
        fn=fn,
        many=many,
        config=cfg,
        key_source=op,
    )


def _aggregate_stage(cfg: Any, name: str, index: int) -> Stage:
    op = cfg.op
    try:
        proto = copy.deepcopy(op)  # before anything accumulates into it
    except Exception:
        proto = op
    fn = collate if type(op) is Collate else AggregateGroup(proto)
    return Stage(
        name=name,
        index=index,
        type="aggregate",
        fn=fn,
        many=False,
        config=cfg,
        key_source=op,
        proto=proto,
        drop_last=bool(cfg.drop_last),
    )


def _name_of(cfg: Any) -> str:
    """A stage config's name, or its type's where it has none."""
    return str(getattr(cfg, "name", type(cfg).__name__))


def plan_pipeline(cfg: Any) -> Plan:
    """Split ``cfg`` into stages that run alone and segments that cannot.

    Raises :class:`PlanError` when there is nothing to diagnose.
    """
    _MainProcess = main_process_class()

    pipes = list(cfg.pipes)
    if not pipes:
        raise PlanError("the pipeline has no stages (only a source and a sink): nothing to diagnose")
    plan = Plan(
        source=cfg.src,
        steps=[],
        sink_buffer=int(cfg.sink.buffer_size),
        source_is_merge=isinstance(cfg.src, MergeConfig),
    )
    if plan.source_is_merge:
        plan.not_isolated += [
            {
                "name": _name_of(p),
                "reason": f"a stage of merged source pipeline {k + 1}: it ran as part of reading the source",
            }
            for k, sub in enumerate(cfg.src.pipeline_configs)
            for p in sub.pipes
        ]
    used: dict[str, int] = {}

    def unique(name: str) -> str:
        name = str(name)
        used[name] = used.get(name, 0) + 1
        return name if used[name] == 1 else f"{name} ({used[name]})"

    i = 0
    while i < len(pipes):
        p = pipes[i]
        index = len(plan.steps)
        if isinstance(p, PlacementConfig):
            if isinstance(p.target, _MainProcess):
                i += 1  # a closing marker with no open region changes nothing
                continue
            j = i + 1
            while j < len(pipes) and not (
                isinstance(pipes[j], PlacementConfig) and isinstance(pipes[j].target, _MainProcess)
            ):
                j += 1
            segment = tuple(pipes[i : j + 1])
            inner = [unique(_name_of(q)) for q in segment if not isinstance(q, PlacementConfig)]
            reason = (
                f"inside a .to({type(p.target).__name__.lstrip('_')}) region: SPDL runs the region as one "
                "nested pipeline in worker processes, so its stages cannot run alone; the region ran "
                "as a whole to feed later stages"
            )
            for n in inner:
                plan.not_isolated.append({"name": n, "reason": reason})
            plan.steps.append(Passthrough(names=tuple(inner), index=index, reason=reason, configs=segment))
            i = j + 1
            continue
        if isinstance(p, PipeConfig):
            plan.steps.append(_pipe_stage(p, unique(p.name), index))
        elif isinstance(p, AggregateConfig):
            plan.steps.append(_aggregate_stage(p, unique(p.name), index))
        elif isinstance(p, DisaggregateConfig):
            plan.steps.append(
                Stage(
                    name=unique(p.name),
                    index=index,
                    type="disaggregate",
                    fn=disaggregate,
                    many=True,
                    config=p,
                    key_source=disaggregate,
                )
            )
        else:
            name = unique(_name_of(p))
            if isinstance(p, PathVariantsConfig):
                reason = (
                    "path variants: a router sends each item down one of several paths, so "
                    "no single function can run alone; it ran as a whole to feed later stages"
                )
            else:
                reason = (
                    f"{type(p).__name__.lstrip('_')}: a fused subprocess region, not a single "
                    "function; it ran as a whole to feed later stages"
                )
            plan.not_isolated.append({"name": name, "reason": reason})
            plan.steps.append(Passthrough(names=(name,), index=index, reason=reason, configs=(p,)))
        i += 1
    if not plan.stages:
        names = ", ".join(d["name"] for d in plan.not_isolated)
        raise PlanError(f"no stage of the pipeline can run alone ({names}): nothing to diagnose")
    return plan


def real_pipeline(cfg: Any, num_threads: int) -> Any:
    """A real (not diagnostic) SPDL pipeline built from ``cfg`` on ``num_threads`` threads: diagnostic mode
    is off while it is built, so it is the user's pipeline, not a stand-in."""
    prev = os.environ.get(MODE_VAR)
    os.environ[MODE_VAR] = "0"
    try:
        return build_pipeline(cfg, num_threads=num_threads)
    finally:
        if prev is not None and prev != "0":
            os.environ[MODE_VAR] = prev


# ------------------------------------------------------------------ validation pipeline
@dataclass(eq=False)
class _PoolOp:
    """Async op that runs the installed stage in a process pool, as the process harness does."""

    pool: Any

    async def __call__(self, item: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.pool, installed_call, item)


@dataclass(eq=False)
class _PoolGenOp:
    """Same, for generator stages: the worker returns the list, the op yields its elements."""

    pool: Any

    async def __call__(self, item: Any):
        for x in await asyncio.get_running_loop().run_in_executor(self.pool, installed_call, item):
            yield x


def _timed_op(op: Callable, spans: list) -> Callable | None:
    """``op`` recording (start, end) of every call into ``spans``; None when it cannot be wrapped.

    Plain functions and coroutine functions only: wrapping a generator
    function would time the creation of the generator, not the work, and the
    process ops time the pool round trip, which is not the stage alone.
    """
    now = time.perf_counter
    if inspect.iscoroutinefunction(op) or inspect.iscoroutinefunction(getattr(op, "__call__", None)):

        async def timed_async(item: Any) -> Any:
            t0 = now()
            try:
                return await op(item)
            finally:
                spans.append((t0, now()))

        return timed_async
    if inspect.isgeneratorfunction(op) or inspect.isasyncgenfunction(op) or not callable(op):
        return None

    def timed(item: Any) -> Any:
        t0 = now()
        try:
            return op(item)
        finally:
            spans.append((t0, now()))  # list.append is atomic under the GIL: many threads may write

    return timed


def build_validation_config(
    plan: Plan,
    choices: dict[str, tuple[str, int]],
    source: Iterable[Any],
    timings: dict[str, list] | None = None,
    stand_ins: dict[str, StandIn] | None = None,
) -> tuple[Any, list[Callable[[], None]], list[dict]]:
    """The whole pipeline with each stage's chosen (executor, concurrency).

    ``choices`` maps stage name to ``(executor, concurrency)``; stages not in it
    keep the user's settings. ``source`` is the iterable of source items.
    Returns the config, callables that release the pools it created, and the
    settings actually used. With ``timings``, thread and async stages record
    the (start, end) of every call under their name: how long each stage takes
    per item *inside* the pipeline, to compare with the stage alone. With
    ``stand_ins`` (name -> :class:`stagebench.pipeline._replay.StandIn`), those stages
    run their stand-in instead of their own code (the replay), on threads, or
    on the event loop for async ones; stages that yield several items per
    input keep their own code.
    """
    _PipeArgs, _PipeType = pipe_args_class(), pipe_type()

    closers: list[Callable[[], None]] = []
    used: list[dict] = []
    pipes: list = []

    def thread_pool(workers: int, prefix: str) -> ThreadPoolExecutor:
        pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=prefix)
        closers.append(functools.partial(pool.shutdown, wait=False, cancel_futures=True))
        return pool

    for step in plan.steps:
        if isinstance(step, Passthrough):
            pipes.extend(step.configs)
            continue
        cfg = step.config
        if step.type != "pipe":  # an aggregate (with a fresh aggregator) or a disaggregate: run inline
            if step.type == "aggregate":
                cfg = AggregateConfig(name=cfg.name, op=step.fresh_aggregator(), drop_last=cfg.drop_last)
            pipes.append(cfg)
            used.append({"stage": step.name, "executor": "inline", "concurrency": 1})
            continue
        ex, c = choices.get(step.name, (None, step.user_concurrency))
        op = cfg._args.op
        executor = None
        stand = (stand_ins or {}).get(step.name) if not step.many else None
        if stand is not None:
            # its stand-in, on threads (a process stage's work stands in as GIL-free CPU)
            # or on the event loop; never timed: it is not the stage
            op, c = stand.op(plan.sample_outputs.get(step.name)), stand.concurrency
            if callable(close := getattr(op, "close", None)):
                closers.append(close)
            ex = "async" if stand.executor == "async" else "thread"
            if ex == "thread":
                executor = thread_pool(c, "stagebench-replay")
        elif step.is_async or ex == "async":
            ex = "async"
        elif ex == "process" and not (step.many and cfg._type == _PipeType.OrderedPipe):
            pool = process_pool(c, install, (cloudpickle.dumps(step.fn),))
            closers.append(functools.partial(close_pool, pool))
            op = _PoolGenOp(pool) if step.many else _PoolOp(pool)
        elif ex in ("thread", "process"):
            ex = "thread"
            executor = thread_pool(c, "stagebench-validate")
        else:  # keep what the user configured
            ex, c, executor = step.user_executor, step.user_concurrency, cfg._args.executor
        # the real stage's op, or its stand-in (the replay's calls are compared with the validation's)
        if timings is not None and ex in ("thread", "async") and (op is cfg._args.op or stand is not None):
            spans: list = []
            timed = _timed_op(op, spans)
            if timed is not None:
                op = timed
                timings[step.name] = spans
        pipes.append(
            PipeConfig(
                name=cfg.name,
                _type=cfg._type,
                _args=_PipeArgs(op=op, executor=executor, concurrency=int(c)),
                _max_failures=cfg._max_failures,
            )
        )
        used.append(
            {
                "stage": step.name,
                "executor": ex,
                "concurrency": int(c),
                **({"stand_in": True} if stand is not None else {}),
            }
        )
    cfg = PipelineConfig(src=SourceConfig(source), pipes=pipes, sink=SinkConfig(max(1, plan.sink_buffer)))
    return cfg, closers, used


def default_threads(plan: Plan) -> int:
    """Threads of SPDL's shared pool for ``plan``'s pipeline rebuilt: the user's, else enough for its stages.

    The user's ``num_threads`` where it is known: the runs at the user's own settings then
    run as the user's program does. Otherwise enough for every stage that uses the pool
    (passthrough segments and stages without an executor of their own) at its concurrency:
    never fewer threads than the user's settings ask for.
    """
    if plan.num_threads:
        return int(plan.num_threads)
    conc = [
        q._args.concurrency
        for s in plan.steps
        if isinstance(s, Passthrough)
        for q in s.configs
        if isinstance(q, PipeConfig)
    ]
    conc += [s.user_concurrency for s in plan.stages if s.user_executor == "default" and s.type == "pipe"]
    return int(max([4, *conc]))
