"""The first pass: the source read once, and each stage run once over its inputs as SPDL would run it.

The outputs are the next stage's inputs and what the stage is swept on (cached on disk by
:mod:`._stage_cache`). What the pass did (inputs run, errors, where it stopped) is a
:class:`FirstPass`, stored with the outputs. A segment that cannot run alone runs as a real SPDL
pipeline (:func:`run_passthrough`).

Everything here runs stages in *this* process: daemon threads (a hung stage must not keep the
interpreter alive) or an event loop in its own thread (the user may already be inside one), or,
for a stage the user runs on processes, a worker pool (a native crash there must not end this one).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from spdl.pipeline.defs import PipelineConfig, SinkConfig, SourceConfig

from stagebench._memory import describe, out_of_memory, said_out_of_memory
from stagebench._settings import NUM_ITEMS, NUM_ITEMS_MAX
from stagebench.core._executors import WorkerPool, WorkerReply, is_coroutine_callable, pool_failure
from stagebench.core._sizes import approx_nbytes
from stagebench.pipeline._isolate import Passthrough, Plan, Stage, real_pipeline

__all__ = [
    "FirstPass",
    "SourceError",
    "SourceRead",
    "read_source",
    "items_to_read",
    "batch_size",
    "compute_outputs",
    "unfinished",
    "measure_inputs",
    "consumes_inputs",
    "run_passthrough",
]


class SourceError(Exception):
    """Reading the pipeline's source failed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FirstPass:
    """What a stage's first pass did, stored with its outputs in the stage cache.

    The stages phase reads it to say what happened, to choose the inputs the sweep feeds the stage
    (:func:`measure_inputs`), and to write the stage's figures into ``run.json``.
    """

    n_inputs: int
    #: inputs run (fewer than ``n_inputs`` where the byte cap or a stall stopped the pass)
    n_run: int
    n_outputs: int = 0
    #: the outputs' size (:func:`stagebench.core._sizes.approx_nbytes`)
    bytes: int = 0
    seconds: float = 0.0
    n_errors: int = 0
    #: the first error, as :func:`stagebench._memory.describe` (or the worker) writes it
    error_example: str = ""
    #: outputs ``None``: dropped, as SPDL does
    n_dropped: int = 0
    #: the byte cap stopped the pass
    capped: bool = False
    #: no item finished within the pass's ``stall_s``
    stalled: bool = False
    #: the first call that ran out of memory, where one did
    out_of_memory: str | None = None
    #: how a worker process died (with its exit code where known)
    crashed: str | None = None
    #: how the process pool failed otherwise
    process_error: str | None = None
    #: why a stage the user runs on processes ran on threads
    process_note: str | None = None
    #: an aggregate's ``[start, end)`` input range of each output
    groups: tuple[tuple[int, int], ...] | None = None
    #: an aggregate's one output is the short group flushed where the cached items end: no whole one formed
    flushed: bool = False


@dataclass(slots=True)
class _Tally:
    """What a first pass counts as it runs; :class:`FirstPass` once it ends."""

    n_errors: int = 0
    error_example: str = ""
    n_dropped: int = 0
    capped: bool = False
    out_of_memory: str | None = None
    crashed: str | None = None
    process_error: str | None = None
    process_note: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceRead:
    """The source's first items, as many as asked where it has them, and how long reading them took."""

    items: list
    asked: int
    note: str | None = None
    seconds: float = 0.0
    #: why it asked for more than the default number, where it did (:func:`items_to_read`)
    more: str | None = None


def batch_size(stage: Stage) -> int | None:
    """The inputs ``stage``, an aggregate, takes to emit an output: a copy of its op fed placeholders (0)
    until it does. None where it raises on them or emits nothing within :data:`NUM_ITEMS_MAX`."""
    try:
        agg = stage.fresh_aggregator()
        for i in range(1, NUM_ITEMS_MAX + 1):
            if agg.accumulate(0) is not None:
                return i
    except Exception:  # an aggregator that reads its items: its size does not show this way
        return None
    return None


def items_to_read(plan: Plan, asked: int | None) -> tuple[int, str | None]:
    """How many source items to read, and why where it is not what the user asked: ``asked`` where set;
    else :data:`NUM_ITEMS`, or two whole batches of each aggregate whose size shows where that is more (at
    most :data:`NUM_ITEMS_MAX`). 200 items before batches of 256 make only the short batch SPDL flushes at
    the end, which an epoch has once, and the stages after it would be measured on that alone."""
    if asked is not None:
        return asked, None
    need, per, biggest = 0, 1, None
    for step in plan.steps:
        if isinstance(step, Stage) and step.type == "aggregate" and (k := batch_size(step)) is not None:
            per *= k
            if 2 * per > need:
                need, biggest = 2 * per, step.name
    n = min(need, NUM_ITEMS_MAX)
    if n <= NUM_ITEMS:
        return NUM_ITEMS, None
    return n, (
        f"reading {n} source items, not {NUM_ITEMS}: "
        + ("two whole batches" if n == need else "as many as read unasked")
        + f" of {biggest!r} (SPDL_PIPELINE_DIAGNOSTIC_MODE_NUM_ITEMS sets it)"
    )


def read_source(plan: Plan, asked: int | None, *, timeout_s: float = 600.0) -> SourceRead:
    """The first ``asked`` items of ``plan``'s source (None: as many as :func:`items_to_read` says; fewer
    if it ends sooner, with a note), as a :class:`SourceRead`; ``timeout_s``: the longest wait for an item
    of a merged source (read as a real SPDL pipeline).

    Raises :class:`SourceError` when the source raises or yields nothing.
    """
    n, more = items_to_read(plan, asked)
    t0 = time.perf_counter()
    items: list = []
    try:
        if plan.source_is_merge:
            pipeline = real_pipeline(PipelineConfig(src=plan.source, pipes=[], sink=SinkConfig(8)), 4)
            with pipeline.auto_stop():
                items.extend(itertools.islice(pipeline.get_iterator(timeout=timeout_s), n))
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
                items.extend(itertools.islice(src, n))  # those read before a raise are kept: said with it
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
    return SourceRead(items=items, asked=n, note=note, seconds=time.perf_counter() - t0, more=more)


def _run_in_loop_thread(coro_fn: Callable[[], Any]) -> None:
    """Run a coroutine on a fresh event loop in a daemon thread (the caller may be in a loop)."""
    error: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(coro_fn())
        except BaseException as e:  # re-raised in the caller
            error.append(e)

    t = threading.Thread(target=run, name="stagebench-cache-loop", daemon=True)
    t.start()
    while t.is_alive():
        t.join(0.1)  # short joins keep Ctrl-C responsive in the main thread
    if error:
        raise error[0]


@dataclass(slots=True)
class _Feed:
    """Where :func:`_map_ordered`'s workers stand: the next input to take, whether to stop taking, and
    what failed outside the stage's calls (the pass cannot finish then)."""

    next: int = 0
    stop: bool = False
    failed: BaseException | None = None


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
    state = _Feed()
    cond = threading.Condition()

    def take() -> int | None:
        with cond:
            if state.stop or state.next >= n:
                return None
            i = state.next
            state.next += 1
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
                state.failed = e

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
                state.failed = e

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
                    if state.failed is not None:  # a worker died outside the stage's call: the pass cannot finish
                        raise state.failed
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
        state.stop = True


def compute_outputs(
    stage: Stage, inputs: Sequence, *, max_bytes: float, stall_s: float = 60.0, workers: int | None = None
) -> tuple[list, FirstPass]:
    """Run the stage once over ``inputs``; return its outputs and what happened (:class:`FirstPass`).

    Outputs beyond ``max_bytes`` are not kept (the inputs that would produce them are not run); no
    item finishing within ``stall_s`` stops the pass. ``workers``: calls in flight (the default
    follows the user's concurrency). Running out of memory outside the stage's calls (a worker
    thread that cannot start, a pool's semaphore) is raised.
    """
    t0 = time.perf_counter()
    tally = _Tally()
    outputs: list = []
    size = 0

    def keep(value: Any) -> bool:
        nonlocal size
        b = approx_nbytes(value)
        if outputs and size + b > max_bytes:
            tally.capped = True
            return False
        outputs.append(value)
        size += b
        return True

    def raised(e: BaseException) -> None:
        tally.n_errors += 1
        tally.error_example = tally.error_example or describe(e)
        # a worker process's failure arrives as the line it wrote
        what = out_of_memory(e) or said_out_of_memory(str(e) if isinstance(e, _StageRaised) else "")
        if what and not tally.out_of_memory:
            tally.out_of_memory = what

    groups: tuple[tuple[int, int], ...] | None = None
    stalled = flushed = False
    if stage.type == "aggregate":
        n_run, groups, flushed = _aggregate(stage, inputs, keep, raised)
    else:

        def accept(_i: int, ok: bool, value: Any) -> bool:
            if not ok:
                raised(value)
                return True
            vals = value if stage.many else [value]
            for v in vals:
                if v is None:
                    tally.n_dropped += 1
                elif not keep(v):
                    return False
            return True

        is_async = is_coroutine_callable(stage.fn)
        w = workers or max(1, min(16 if is_async else 8, stage.user_concurrency))
        if stage.user_executor == "process" and not is_async:
            # The user runs it on processes: a native crash there (a segfault in a C extension,
            # os._exit) would end this process if run on its threads, taking the diagnosis, its
            # rows and the user's terminal state with it. On worker processes it is a failure.
            n_run = _map_on_processes(stage.fn, inputs, workers=w, accept=accept, stall_s=stall_s, tally=tally)
        else:
            n_run = _map_ordered(stage.fn, inputs, is_async=is_async, workers=w, accept=accept, stall_s=stall_s)
        stalled = n_run < len(inputs) and not (tally.capped or tally.crashed or tally.process_error)
    return outputs, FirstPass(
        n_inputs=len(inputs),
        n_run=n_run,
        n_outputs=len(outputs),
        bytes=size,
        seconds=time.perf_counter() - t0,
        stalled=stalled,
        groups=groups,
        flushed=flushed,
        **asdict(tally),
    )


def _aggregate(
    stage: Stage, inputs: Sequence, keep: Callable[[Any], bool], raised: Callable[[BaseException], None]
) -> tuple[int, tuple[tuple[int, int], ...], bool]:
    """An aggregate's pass, in order as SPDL runs it: (inputs run, each output's ``[start, end)`` inputs,
    whether the one output is a flushed short group).

    Without ``drop_last`` SPDL flushes a short last group where its source ends. The cached items end where
    the cache does, not where an epoch does: over an epoch that group comes once, and in the whole-pipeline
    runs (a source that cycles) never. So it is flushed only where no full group formed (a cache smaller
    than a batch); measured, the calls after it read as batches of 28.6 where every batch holds 32.
    """
    agg = stage.fresh_aggregator()
    groups: list[tuple[int, int]] = []
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
            groups.append((start, i + 1))
            start = i + 1
    else:
        if not stage.drop_last and start < len(inputs) and not groups:
            try:
                r = agg.flush()
            except Exception as e:
                r = None
                raised(e)
            if r is not None and keep(r):
                groups.append((start, len(inputs)))
                return n_run, tuple(groups), True
    return n_run, tuple(groups), False


def unfinished(first: FirstPass) -> str | None:
    """Why a first pass tells of this run rather than of the stage, or None.

    Such outputs are not kept for the next run, which runs the stage again: a pass that stopped (no
    item finished in time, a worker process died, the pool broke), ran out of memory, or raised on
    every input may go otherwise next time, and a cache would serve its few or no outputs for good.
    Errors on some inputs (corrupt records) are the stage's own answer on them, and are kept.
    """
    if first.out_of_memory:
        return f"it ran out of memory ({first.out_of_memory})"
    if first.stalled:
        return "it timed out (no item finished within STAGEBENCH_TIMEOUT_S)"
    if first.crashed:
        return f"a worker process died ({first.crashed})"
    if first.process_error:
        return f"its process pool failed ({first.process_error})"
    if first.n_errors and first.n_errors >= first.n_run:
        return f"every input raised ({first.error_example})"
    return None


def _map_on_processes(
    fn: Callable,
    inputs: Sequence,
    *,
    workers: int,
    accept: Callable[[int, bool, Any], bool],
    stall_s: float,
    tally: _Tally,
) -> int:
    """:func:`_map_ordered` with the calls on ``workers`` processes (a :class:`WorkerPool`, as the sweep's).

    A worker that dies stops the pass: the inputs before it keep their outputs, and the tally's
    ``crashed`` says how it died (with the exit code where known).
    """
    pool = WorkerPool(fn)
    try:
        _ = pool.fn_bytes  # pickled once, here: a stage that cannot be has only this process's threads
    except Exception as e:
        if out_of_memory(e):
            raise  # it tells nothing of whether the stage pickles
        tally.process_note = f"ran on threads: the stage cannot be pickled ({type(e).__name__})"
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
            if status == "crashed":
                tally.crashed = reason
            else:
                tally.process_error = reason
            return False
        keep = accept(i, ok, value)
        if isinstance(value, _StageRaised) and tally.error_example == describe(value):
            tally.error_example = str(value)  # the worker's own "ValueError: ..." line
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


class _StageRaised(Exception):
    """The stage raised inside a worker process; the message is the worker's description of it."""


def measure_inputs(stage: Stage, inputs: Sequence, first: FirstPass) -> list:
    """What the sweep feeds ``stage`` after its ``first`` pass over ``inputs``: the inputs it ran, or for an
    aggregate the groups that made its outputs."""
    if stage.type == "aggregate":
        return [list(inputs[a:b]) for a, b in first.groups or ()]
    return list(inputs[: first.n_run]) if first.capped else list(inputs)


def run_passthrough(step: Passthrough, inputs: Sequence, *, num_threads: int = 8, timeout_s: float = 600.0) -> list:
    """The outputs of ``step``, a segment that cannot be isolated, run as a real SPDL pipeline over ``inputs`` on
    ``num_threads`` threads (``timeout_s``: the longest wait for one output)."""
    cfg: PipelineConfig[Any] = PipelineConfig(
        src=SourceConfig(list(inputs)), pipes=list(step.configs), sink=SinkConfig(8)
    )
    pipeline = real_pipeline(cfg, num_threads)
    with pipeline.auto_stop():
        return list(pipeline.get_iterator(timeout=timeout_s))
