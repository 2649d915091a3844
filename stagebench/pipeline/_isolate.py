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

Everything here runs stages in *this* process: daemon threads (a hung stage
must not keep the interpreter alive) or an event loop in its own thread (the
user may already be inside one).
"""

from __future__ import annotations

import asyncio
import copy
import functools
import inspect
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from stagebench._memory import describe, out_of_memory, said_out_of_memory
from stagebench._spdl_private import (
    MODE_VAR,
    is_async_callable,
    is_asyncgen_callable,
    is_process_pool,
    main_process_class,
    pipe_args_class,
    pipe_type,
)
from stagebench.core._sizes import approx_nbytes

__all__ = [
    "Stage",
    "Passthrough",
    "Plan",
    "PlanError",
    "SourceError",
    "plan_pipeline",
    "read_source",
    "compute_outputs",
    "unfinished",
    "measure_inputs",
    "run_passthrough",
    "build_validation_config",
]


class PlanError(Exception):
    """The pipeline cannot be diagnosed at all (no stages, nothing isolatable)."""


class SourceError(Exception):
    """Reading the pipeline's source failed."""


# ------------------------------------------------------------------ measured callables
def _drain_generator(op: Callable, item: Any) -> list:
    """A sync generator op, run to the end: what SPDL emits for one input."""
    return list(op(item))


class _AsyncGenDrain:
    """An async generator op, drained into a list (a coroutine the event loop can time)."""

    def __init__(self, op: Callable) -> None:
        self.op = op

    async def __call__(self, item: Any) -> list:
        return [x async for x in self.op(item)]


def _disaggregate(batch: Any) -> list:
    return list(batch)


def _collate(group: Sequence) -> list:
    """What :class:`spdl.pipeline.defs.Collate` emits for one full group."""
    return list(group)


class _AggregateGroup:
    """One aggregator output from the group of inputs that produced it.

    A fresh copy of the aggregator per call: aggregators are stateful, and the
    sweep runs calls concurrently.
    """

    def __init__(self, proto: Any) -> None:
        self.proto = proto

    def __call__(self, group: Sequence) -> Any:
        agg = copy.deepcopy(self.proto)
        out = None
        for x in group:
            r = agg.accumulate(x)
            if r is not None:
                out = r
        return out if out is not None else agg.flush()


# ------------------------------------------------------------------ the plan
@dataclass(frozen=True, slots=True, kw_only=True)
class Stage:
    """One stage that runs alone on cached inputs."""

    name: str
    """Unique name (the user's; ``name (2)`` when two stages share one)."""
    index: int
    """Position in the pipeline's list of stages."""
    type: str
    """``pipe``, ``aggregate`` or ``disaggregate``."""
    is_async: bool
    ordered: bool
    user_executor: str
    """What the user configured: ``thread``, ``process``, ``default`` (SPDL's shared
    thread pool) or ``async``. Aggregate and disaggregate run inline: ``default``."""
    user_concurrency: int
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

    def as_meta(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "index": self.index,
            "type": self.type,
            "is_async": self.is_async,
            "user_executor": self.user_executor,
            "user_concurrency": self.user_concurrency,
            "ordered": self.ordered,
        }


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
    #: the right kind (a stand-in that passed its input on broke a disaggregate after a stage
    #: returning lists: nothing reached the sink)
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
        fn, many = _AsyncGenDrain(op), True
    elif inspect.isgeneratorfunction(target):
        fn, many = functools.partial(_drain_generator, op), True
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


def _inline_stage(
    cfg: Any,
    name: str,
    index: int,
    *,
    kind: str,
    fn: Callable,
    many: bool,
    key_source: Any,
    proto: Any = None,
    drop_last: bool = False,
) -> Stage:
    """An aggregate or disaggregate stage: SPDL runs it inline, in order, one call at a time."""
    return Stage(
        name=name,
        index=index,
        type=kind,
        is_async=False,
        ordered=True,
        user_executor="default",
        user_concurrency=1,
        fn=fn,
        many=many,
        config=cfg,
        key_source=key_source,
        proto=proto,
        drop_last=drop_last,
    )


def _aggregate_stage(cfg: Any, name: str, index: int) -> Stage:
    from spdl.pipeline.defs import Collate

    op = cfg.op
    try:
        proto = copy.deepcopy(op)  # before anything accumulates into it
    except Exception:
        proto = op
    fn = _collate if type(op) is Collate else _AggregateGroup(proto)
    return _inline_stage(
        cfg, name, index, kind="aggregate", fn=fn, many=False, key_source=op, proto=proto, drop_last=bool(cfg.drop_last)
    )


def _region_reason(target: Any) -> str:
    return (
        f"inside a .to({type(target).__name__.lstrip('_')}) region: SPDL runs the region as one "
        "nested pipeline in worker processes, so its stages cannot run alone; the region ran "
        "as a whole to feed later stages"
    )


def plan_pipeline(cfg: Any) -> Plan:
    """Split ``cfg`` into stages that run alone and segments that cannot.

    Raises :class:`PlanError` when there is nothing to diagnose.
    """
    from spdl.pipeline.defs import (
        AggregateConfig,
        DisaggregateConfig,
        MergeConfig,
        PathVariantsConfig,
        PipeConfig,
        PlacementConfig,
    )

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
        for k, sub in enumerate(cfg.src.pipeline_configs):
            for p in sub.pipes:
                plan.not_isolated.append(
                    {
                        "name": str(getattr(p, "name", type(p).__name__)),
                        "reason": f"a stage of merged source pipeline {k + 1}: it ran as part of reading the source",
                    }
                )
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
            inner = [
                unique(getattr(q, "name", type(q).__name__)) for q in segment if not isinstance(q, PlacementConfig)
            ]
            reason = _region_reason(p.target)
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
                _inline_stage(
                    p, unique(p.name), index, kind="disaggregate", fn=_disaggregate, many=True, key_source=_disaggregate
                )
            )
        else:
            name = unique(getattr(p, "name", type(p).__name__))
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


# ------------------------------------------------------------------ running things
def _real_pipeline(cfg: Any, num_threads: int):
    """Build a real (not diagnostic) SPDL pipeline."""
    from spdl.pipeline import build_pipeline

    prev = os.environ.get(MODE_VAR)
    os.environ[MODE_VAR] = "0"
    try:
        return build_pipeline(cfg, num_threads=num_threads)
    finally:
        if prev is not None and prev != "0":
            os.environ[MODE_VAR] = prev


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceRead:
    items: list
    asked: int
    note: str | None = None
    seconds: float = 0.0


def read_source(plan: Plan, n: int, *, timeout_s: float = 600.0) -> SourceRead:
    """The first ``n`` items of the source (fewer if it ends sooner, with a note).

    Raises :class:`SourceError` when the source raises or yields nothing.
    """
    t0 = time.perf_counter()
    items: list = []
    try:
        if plan.source_is_merge:
            from spdl.pipeline.defs import PipelineConfig, SinkConfig

            pipeline = _real_pipeline(PipelineConfig(src=plan.source, pipes=[], sink=SinkConfig(8)), 4)
            with pipeline.auto_stop():
                for item in pipeline.get_iterator(timeout=timeout_s):
                    items.append(item)
                    if len(items) >= n:
                        break
        else:
            src = plan.source.source
            if hasattr(src, "__aiter__") and not hasattr(src, "__iter__"):

                async def take() -> None:
                    async for item in src:
                        items.append(item)
                        if len(items) >= n:
                            break

                _run_in_loop_thread(take)
            else:
                for item in src:
                    items.append(item)
                    if len(items) >= n:
                        break
    except KeyboardInterrupt:
        raise
    except Exception as e:
        raise SourceError(f"the pipeline's source raised {describe(e)} after {len(items)} item(s)") from e
    if not items:
        raise SourceError("the pipeline's source yielded no items: nothing to diagnose")
    note = None
    if len(items) < n:
        note = (
            f"the source yielded {len(items)} items, fewer than the {n} asked "
            "(SPDL_PIPELINE_DIAGNOSTIC_MODE_NUM_ITEMS); diagnosing with those"
        )
    return SourceRead(items=items, asked=n, note=note, seconds=time.perf_counter() - t0)


def _run_in_loop_thread(coro_fn: Callable[[], Any]) -> Any:
    """Run a coroutine on a fresh event loop in a daemon thread (the caller may be in a loop)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = asyncio.run(coro_fn())
        except BaseException as e:  # re-raised in the caller
            box["error"] = e

    t = threading.Thread(target=run, name="stagebench-cache-loop", daemon=True)
    t.start()
    while t.is_alive():
        t.join(0.1)  # short joins keep Ctrl-C responsive in the main thread
    if "error" in box:
        raise box["error"]
    return box.get("value")


class _ProgressStall(Exception):
    pass


def _map_ordered(
    fn: Callable,
    inputs: Sequence,
    *,
    is_async: bool,
    workers: int,
    accept: Callable[[int, bool, Any], bool],
    stall_s: float,
) -> int:
    """Apply ``fn`` to inputs with ``workers`` in flight, feeding results in input order
    to ``accept(index, ok, value)`` until it returns False. Returns how many inputs ran and had
    their outputs accepted.

    Stops (with the results so far) when no item finished for ``stall_s`` seconds.
    """
    n = len(inputs)
    results: list[Any] = [None] * n
    done = [False] * n
    state: dict[str, Any] = {"next": 0, "stop": False}
    lock = threading.Lock()
    cond = threading.Condition(lock)

    def take() -> int | None:
        with lock:
            if state["stop"] or state["next"] >= n:
                return None
            i = state["next"]
            state["next"] += 1
            return i

    def put(i: int, ok: bool, value: Any) -> None:
        with cond:
            results[i] = (ok, value)
            done[i] = True
            cond.notify_all()

    if is_async:

        async def lane() -> None:
            while (i := take()) is not None:
                try:
                    put(i, True, await fn(inputs[i]))
                except Exception as e:
                    put(i, False, e)

        async def main() -> None:
            await asyncio.gather(*(lane() for _ in range(workers)))

        def loop() -> None:
            try:
                asyncio.run(main())
            except Exception as e:  # out of memory outside the stage's call (a result kept, a task)
                state["failed"] = e

        runners = [threading.Thread(target=loop, name="stagebench-cache-loop", daemon=True)]
    else:

        def work() -> None:
            try:
                while (i := take()) is not None:
                    try:
                        put(i, True, fn(inputs[i]))
                    except Exception as e:
                        put(i, False, e)
            except Exception as e:  # out of memory outside the stage's call (a result kept, a lock)
                state["failed"] = e

        runners = [threading.Thread(target=work, name=f"stagebench-cache-{k}", daemon=True) for k in range(workers)]
    k = 0
    last = time.monotonic()
    try:
        for t in runners:
            t.start()
        while k < n:
            with cond:
                while not done[k]:
                    cond.wait(0.1)
                    if done[k]:
                        break
                    if "failed" in state:  # a worker died outside the stage's call: the pass cannot finish
                        raise state["failed"]
                    if time.monotonic() - last > stall_s or not any(t.is_alive() for t in runners):
                        return k
            last = time.monotonic()
            ok, value = results[k]
            results[k] = None  # hand the reference over; keep memory to one copy
            k += 1
            if not accept(k - 1, ok, value):
                # this input's outputs were refused (the cap): it is not among the inputs run, so the
                # inputs counted and the outputs kept stand for the same source items
                return k - 1
        return k
    finally:
        state["stop"] = True


def compute_outputs(
    stage: Stage, inputs: Sequence, *, max_bytes: float, stall_s: float = 60.0, workers: int | None = None
) -> tuple[list, dict[str, Any]]:
    """Run the stage once over ``inputs``; return its outputs and what happened.

    Outputs beyond ``max_bytes`` are not kept (the inputs that would produce them
    are not run). The meta dict records: ``n_inputs``, ``n_run`` (inputs run),
    ``n_errors``, ``error_example``, ``n_dropped`` (outputs ``None``: dropped as
    SPDL does), ``n_outputs``, ``bytes``, ``capped`` (the byte cap stopped it),
    ``stalled`` (no item finished within ``stall_s``), ``out_of_memory`` (the
    first call that ran out of memory, where one did), ``seconds`` and, for
    aggregates, ``groups``: ``[start, end)`` input ranges of each output.
    Running out of memory outside the stage's calls (a worker thread that cannot
    start, a pool's semaphore) is raised.
    """
    t0 = time.perf_counter()
    meta: dict[str, Any] = {
        "n_inputs": len(inputs),
        "n_errors": 0,
        "error_example": "",
        "n_dropped": 0,
        "capped": False,
        "stalled": False,
    }
    outputs: list = []
    size = 0

    def keep(value: Any) -> bool:
        nonlocal size
        b = approx_nbytes(value)
        if outputs and size + b > max_bytes:
            meta["capped"] = True
            return False
        outputs.append(value)
        size += b
        return True

    def raised(e: BaseException) -> None:
        meta["n_errors"] += 1
        meta["error_example"] = meta["error_example"] or describe(e)
        # a worker process's failure arrives as the line it wrote
        what = out_of_memory(e) or said_out_of_memory(str(e) if isinstance(e, _StageRaised) else "")
        if what and not meta.get("out_of_memory"):
            meta["out_of_memory"] = what

    if stage.type == "aggregate":
        agg = copy.deepcopy(stage.proto) if stage.proto is not None else stage.config.op
        groups: list[list[int]] = []
        start = 0
        n_run = 0
        for i, x in enumerate(inputs):
            n_run = i + 1
            try:
                r = agg.accumulate(x)
            except Exception as e:
                raised(e)
                continue
            if r is not None:
                if not keep(r):
                    n_run = start  # the group that would overflow is not used
                    break
                groups.append([start, i + 1])
                start = i + 1
        else:
            if not stage.drop_last and start < len(inputs):
                try:
                    r = agg.flush()
                except Exception as e:
                    r = None
                    raised(e)
                if r is not None and keep(r):
                    groups.append([start, len(inputs)])
        meta["groups"] = groups
        meta["n_run"] = n_run
    else:

        def accept(_i: int, ok: bool, value: Any) -> bool:
            if not ok:
                raised(value)
                return True
            vals = value if stage.many else [value]
            for v in vals:
                if v is None:
                    meta["n_dropped"] += 1
                elif not keep(v):
                    return False
            return True

        is_async = _is_coro(stage.fn)
        w = workers or max(1, min(16 if is_async else 8, stage.user_concurrency))
        if stage.user_executor == "process" and not is_async:
            # The user runs it on processes: a native crash there (a segfault in a C extension,
            # os._exit) would end this process if run on its threads, taking the diagnosis, its
            # rows and the user's terminal state with it. On worker processes it is a failure.
            n_run = _map_on_processes(stage.fn, inputs, workers=w, accept=accept, stall_s=stall_s, meta=meta)
        else:
            n_run = _map_ordered(stage.fn, inputs, is_async=is_async, workers=w, accept=accept, stall_s=stall_s)
        if n_run < len(inputs) and not (meta["capped"] or meta.get("crashed") or meta.get("process_error")):
            meta["stalled"] = True
        meta["n_run"] = n_run
    meta.update(n_outputs=len(outputs), bytes=size, seconds=time.perf_counter() - t0)
    return outputs, meta


def unfinished(meta: dict[str, Any]) -> str | None:
    """Why a first pass (:func:`compute_outputs`' meta) tells of this run rather than of the stage, or None.

    Such outputs are not kept for the next run, which runs the stage again: a pass that stopped (no
    item finished in time, a worker process died, the pool broke), ran out of memory, or raised on
    every input may go otherwise next time, and a cache would serve its few or no outputs for good.
    Errors on some inputs (corrupt records) are the stage's own answer on them, and are kept.
    """
    if meta.get("out_of_memory"):
        return f"it ran out of memory ({meta['out_of_memory']})"
    if meta.get("stalled"):
        return "it timed out (no item finished within STAGEBENCH_TIMEOUT_S)"
    if meta.get("crashed"):
        return f"a worker process died ({meta['crashed']})"
    if meta.get("process_error"):
        return f"its process pool failed ({meta['process_error']})"
    if meta.get("n_errors") and meta["n_errors"] >= meta.get("n_run", 0):
        return f"every input raised ({meta.get('error_example', '')})"
    return None


def _map_on_processes(
    fn: Callable,
    inputs: Sequence,
    *,
    workers: int,
    accept: Callable[[int, bool, Any], bool],
    stall_s: float,
    meta: dict[str, Any],
) -> int:
    """:func:`_map_ordered` with the calls on ``workers`` processes (a :class:`WorkerPool`, as the sweep's).

    A worker that dies stops the pass: the inputs before it keep their outputs, and the meta's
    ``crashed`` says how it died (with the exit code where known).
    """
    from stagebench.core._executors import WorkerPool, WorkerReply, pool_failure

    pool = WorkerPool(fn)
    try:
        _ = pool.fn_bytes  # pickled once, here: a stage that cannot be has only this process's threads
    except Exception as e:
        if out_of_memory(e):
            raise  # it tells nothing of whether the stage pickles
        meta["process_note"] = f"ran on threads: the stage cannot be pickled ({type(e).__name__})"
        return _map_ordered(fn, inputs, is_async=False, workers=workers, accept=accept, stall_s=stall_s)
    ex, remote = pool.executor(workers), pool.call_for(fn)

    def call(x: Any) -> Any:
        reply = WorkerReply.of(ex.submit(remote, x).result())
        if not reply.ok:
            raise _StageRaised(reply.error or "the stage raised")
        return reply.output

    def checked(i: int, ok: bool, value: Any) -> bool:
        if not ok and not isinstance(value, _StageRaised):  # the pool broke, not the stage's call
            status, reason = pool_failure(value, pool)
            meta["crashed" if status == "crashed" else "process_error"] = reason
            return False
        keep = accept(i, ok, value)
        if isinstance(value, _StageRaised) and meta["error_example"] == describe(value):
            meta["error_example"] = str(value)  # the worker's own "ValueError: ..." line
        return keep

    with pool:
        return _map_ordered(call, inputs, is_async=False, workers=workers, accept=checked, stall_s=stall_s)


def consumes_inputs(fn: Callable, item: Any, *, timeout_s: float) -> str | None:
    """Why ``fn`` fails when called again on an input it has seen (it consumes its inputs), or None.

    SPDL's ``convert_frames`` takes ownership of the frames it is given: the first call on a
    decoded item works, every later one raises. The sweep calls a stage on its cached inputs many
    times, so such a stage would fail at every point. Two calls on one input that the first pass
    handled without error tell it; a call that does not return within ``timeout_s`` tells nothing.
    """
    errors: list[str] = []

    def twice() -> None:
        for _ in range(2):
            try:
                fn(item)
            except Exception as e:
                errors.append(describe(e))
                return

    probe = threading.Thread(target=twice, name="stagebench-repeat-probe", daemon=True)
    probe.start()
    probe.join(timeout_s)
    return errors[0] if errors else None


@dataclass(frozen=True)
class Fused:
    """Two stages as one call: ``then(first(x))``, for a stage measured on fresh outputs of the one before."""

    first: Callable
    then: Callable

    def __call__(self, x: Any) -> Any:
        return self.then(self.first(x))


@dataclass(frozen=True)
class MapThen:
    """A group's inputs through a stage one by one, then the group through an aggregate: ``then([each(x) ...])``."""

    each: Callable
    then: Callable

    def __call__(self, group: Any) -> Any:
        return self.then([self.each(x) for x in group])


class _StageRaised(Exception):
    """The stage raised inside a worker process; the message is the worker's description of it."""


def _is_coro(fn: Callable) -> bool:
    from stagebench.core._executors import is_coroutine_callable

    return is_coroutine_callable(fn)


def measure_inputs(stage: Stage, inputs: Sequence, meta: dict[str, Any]) -> list:
    """What the sweep feeds the stage: its inputs, or the groups for an aggregate."""
    if stage.type == "aggregate":
        return [list(inputs[a:b]) for a, b in meta.get("groups", [])]
    return list(inputs[: meta.get("n_run", len(inputs))]) if meta.get("capped") else list(inputs)


def run_passthrough(
    step: Passthrough, inputs: Sequence, *, num_threads: int = 8, timeout_s: float = 600.0
) -> tuple[list, dict[str, Any]]:
    """Run a segment that cannot be isolated as a real SPDL pipeline over ``inputs``."""
    from spdl.pipeline.defs import PipelineConfig, SinkConfig, SourceConfig

    t0 = time.perf_counter()
    cfg: PipelineConfig[Any] = PipelineConfig(
        src=SourceConfig(list(inputs)), pipes=list(step.configs), sink=SinkConfig(8)
    )
    pipeline = _real_pipeline(cfg, num_threads)
    outputs = []
    with pipeline.auto_stop():
        for item in pipeline.get_iterator(timeout=timeout_s):
            outputs.append(item)
    return outputs, {
        "n_inputs": len(inputs),
        "n_outputs": len(outputs),
        "n_run": len(inputs),
        "seconds": time.perf_counter() - t0,
    }


# ------------------------------------------------------------------ validation pipeline
_INSTALLED: Callable | None = None


def _install(fn_bytes: bytes) -> None:
    """Pool initializer: unpickle the stage once per worker (cloudpickle: lambdas work)."""
    global _INSTALLED
    import cloudpickle

    _INSTALLED = cloudpickle.loads(fn_bytes)


def _installed_call(item: Any) -> Any:
    # set by the pool's initializer (_install) before any call; no check in the timed path
    return _INSTALLED(item)  # type: ignore[misc]


class _PoolOp:
    """Async op that runs the installed stage in a process pool, as the process harness does."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool

    async def __call__(self, item: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.pool, _installed_call, item)


class _PoolGenOp:
    """Same, for generator stages: the worker returns the list, the op yields its elements."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool

    async def __call__(self, item: Any):
        for x in await asyncio.get_running_loop().run_in_executor(self.pool, _installed_call, item):
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
    stand_ins: dict[str, Any] | None = None,
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
    from concurrent.futures import ThreadPoolExecutor

    import cloudpickle
    from spdl.pipeline.defs import (
        AggregateConfig,
        PipeConfig,
        PipelineConfig,
        SinkConfig,
        SourceConfig,
    )

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
        if step.type == "aggregate":
            proto = copy.deepcopy(step.proto) if step.proto is not None else cfg.op
            pipes.append(AggregateConfig(name=cfg.name, op=proto, drop_last=cfg.drop_last))
            used.append({"stage": step.name, "executor": "inline", "concurrency": 1})
            continue
        if step.type == "disaggregate":
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
            from stagebench.core._executors import close_pool, process_pool

            pool = process_pool(c, _install, (cloudpickle.dumps(step.fn),))
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
    """Threads of SPDL's shared pool for a rebuilt pipeline: the user's, else enough for its stages.

    The user's ``num_threads`` where it is known: the runs at the user's own settings then
    run as the user's program does. Otherwise enough for every stage that uses the pool
    (passthrough segments and stages without an executor of their own) at its concurrency:
    never fewer threads than the user's settings ask for.
    """
    from spdl.pipeline.defs import PipeConfig

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
