"""The ``spdl`` harness: the stage inside a one-stage SPDL pipeline.

The ``direct`` harness answers "how fast can this function go"; this one
answers "how fast will it go in my pipeline", SPDL's per-item scheduling
overhead included. It reuses the direct harness's records and window logic:
the pipe runs a thin wrapper that timestamps each call, so throughput comes
from the same fractional counting, and the sink is drained by a consumer
thread (a real pipeline's consumer is the training loop).

Ending a point: when the window closes the source stops yielding and the
pipe finishes what is in flight. The point ends (``wait_idle``) when every
item the source gave SPDL has been through the stage: no call is running.
SPDL's own end of stream and tear-down come after that and cost ~0.2 s of
nothing (its consumer side and its event loop both poll every 0.1 s), once per
point: a sweep's dozens of points would wait seconds for it. So they finish
in the background, on the consumer thread, while the next point warms up;
:func:`deferred_teardown` (around a sweep) allows that and waits for all of
them at its end.

Executors: ``thread`` uses the pipeline's own thread pool (``num_threads`` =
concurrency, as a user would build it); ``process`` passes a standard-library process pool (:class:`~._executors.WorkerPool`)
(cloudpickle, so lambdas and ``__main__`` functions work) as the pipe's
executor; ``async`` pipes the coroutine function directly.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor
from typing import Any

from stagebench._memory import describe
from stagebench.core._executors import _LEAKED, Runner, WorkerPool, WorkerReply, identity

__all__ = ["SpdlRunner", "deferred_teardown", "quiet_spdl_log", "settle"]

# Runners whose pipeline is still shutting down (see the module docstring).
_STOPPING: list["SpdlRunner"] = []
_STOPPING_LOCK = threading.Lock()


_QUIET = {"depth": 0, "level": logging.NOTSET}
_QUIET_LOCK = threading.Lock()


def _quiet_spdl(on: bool) -> None:
    """SPDL's log off while any of our pipelines runs or shuts down (nested: points overlap in tear-down).

    SPDL logs each dropped item; our pipelines' failures are measured, not
    the user's business to read in a log. The level comes back when the last
    one is gone: others (the loader sweep) read SPDL's log.
    """
    log = logging.getLogger("spdl")
    with _QUIET_LOCK:
        if on:
            if _QUIET["depth"] == 0:
                _QUIET["level"] = log.level
                log.setLevel(logging.CRITICAL)
            _QUIET["depth"] += 1
        else:
            _QUIET["depth"] -= 1
            if _QUIET["depth"] == 0:
                log.setLevel(_QUIET["level"])


@contextlib.contextmanager
def quiet_spdl_log() -> Iterator[None]:
    """:func:`_quiet_spdl` around a block (a whole-pipeline run)."""
    _quiet_spdl(True)
    try:
        yield
    finally:
        _quiet_spdl(False)


_DEFER = {"depth": 0}


@contextlib.contextmanager
def deferred_teardown() -> Iterator[None]:
    """Points measured inside end without waiting for SPDL's tear-down; on leaving the outermost, wait for all.

    Outside it (a single ``measure_stage`` call) a point returns with its
    pipeline fully stopped. Nested inside another (a diagnosis wraps all its
    stages' sweeps in one) it waits for nothing. What needs every tear-down
    finished first (the GIL probe, which reads the process's CPU clocks) calls
    :func:`settle` itself.
    """
    _DEFER["depth"] += 1
    try:
        yield
    finally:
        _DEFER["depth"] -= 1
        if not _DEFER["depth"]:
            settle()


def settle(timeout: float = 5.0) -> bool:
    """Wait until every finished point's SPDL pipeline has shut down; False if one is still going."""
    deadline = time.monotonic() + timeout
    with _STOPPING_LOCK:
        pending = list(_STOPPING)
    for r in pending:
        r._done.wait(max(0.0, deadline - time.monotonic()))
    with _STOPPING_LOCK:
        _STOPPING[:] = [r for r in _STOPPING if not r._done.is_set()]
        return not _STOPPING


class SpdlRunner(Runner):
    def __init__(
        self,
        fn: Callable,
        inputs: Sequence,
        concurrency: int,
        executor: str,
        pool: WorkerPool | None = None,
        extra_pipes: int = 0,
    ) -> None:
        super().__init__(fn, inputs, concurrency)
        self.executor = executor
        # identity pipes before the timed one: a k-stage no-op pipeline, which
        # separates SPDL's fixed cost (source, sink, consumer) from its per-stage cost
        self.extra_pipes = int(extra_pipes)
        self._source_ended = threading.Event()
        self._n_yielded = 0
        self._drained = threading.Event()  # the consumer read to the end: no call is in flight
        self._done = threading.Event()  # and SPDL's tear-down has finished
        # process: a pool kept across points (see WorkerPool), or one of our own
        self._own_pool = executor == "process" and pool is None
        self._workers = WorkerPool(fn) if self._own_pool else pool
        self._call: Callable | None = None
        if executor == "process":
            assert self._workers is not None  # the given pool, or our own
            self._call = self._workers.call_for(fn)
        self._pool: Executor | None = None
        self._outstanding: set = set()

    # ---- sources and wrapped ops -------------------------------------------------
    def _source(self):
        inputs, n, stop = self.inputs, len(self.inputs), self._stop.is_set
        i = 0
        try:
            while not stop():
                yield inputs[i % n]
                i += 1  # after the resume: i counts the items SPDL took
        finally:
            self._n_yielded = i
            self._source_ended.set()

    def _calls_done(self) -> int:
        return sum(len(lane) for lane in list(self.lanes.values()))

    def _op(self) -> Callable:
        fn, record, now = self.fn, self.record, time.perf_counter
        if self.executor == "async":
            # All coroutines run on SPDL's one loop thread: one lane is single-writer.
            async def timed_async(item: Any) -> None:
                t0 = now()
                try:
                    await fn(item)
                except Exception as e:
                    record("loop", t0, now(), False, describe(e))
                else:
                    record("loop", t0, now(), True, None)

            return timed_async
        if self.executor == "thread":
            cpu_now = time.thread_time

            def timed(item: Any) -> None:
                # The calling thread's CPU during the call: the stage's own work (its
                # Python and the C code it runs, GIL-free or not), none of SPDL's.
                # Two clock reads (~1 us) next to SPDL's ~0.5 ms per item.
                t0, c0 = now(), cpu_now()
                try:
                    fn(item)
                except Exception as e:
                    record(threading.get_ident(), t0, now(), False, describe(e))
                else:
                    c1 = cpu_now()
                    record(threading.get_ident(), t0, now(), True, None, cpu=c1 - c0)

            return timed

        # process: the pipe awaits the pool; the call is timed from the event loop's
        # side (submit to result), like the direct harness's process latencies.
        pool, call, outstanding = self._pool, self._call, self._outstanding
        assert pool is not None and call is not None  # process: start() made the pool, __init__ the call

        async def timed_process(item: Any) -> None:
            t0 = now()
            try:
                # submit + wrap_future is run_in_executor, keeping the pool-side future:
                # SPDL cancels the awaiting task at shutdown, the call runs on regardless
                fut = pool.submit(call, item)
                outstanding.add(fut)
                fut.add_done_callback(outstanding.discard)
                reply = WorkerReply.of(await asyncio.wrap_future(fut))
            except Exception as e:
                self.pool_failed(e, self._workers)
                raise
            # completions are handled on the loop thread: single writer per lane
            record(reply.pid, t0, now(), reply.ok, reply.error)

        return timed_process

    # ---- lifecycle ---------------------------------------------------------------
    def start(self) -> None:
        # spdl loads where a pipeline is built: the stagebench harness runs without it
        from spdl.pipeline import PipelineBuilder

        if self.executor == "process":
            assert self._workers is not None  # set for processes in __init__
            self._pool = self._workers.executor(self.concurrency)
        self._threads_before = set(threading.enumerate())
        builder: PipelineBuilder[Any, Any] = PipelineBuilder().add_source(self._source())
        for i in range(self.extra_pipes):
            builder = builder.pipe(identity, concurrency=self.concurrency, name=f"noop{i}")
        builder = builder.pipe(self._op(), concurrency=self.concurrency, name="stage").add_sink(
            max(2, self.concurrency)
        )
        # our wrapper never lets the stage's own errors through: SPDL's log is
        # off until this pipeline is gone (_unquiet, after its tear-down)
        _quiet_spdl(True)
        self._quieted = True
        self._pipeline = builder.build(num_threads=max(1, self.concurrency), max_failures=0)
        self._consumer = threading.Thread(target=self._consume, name="stagebench-sink", daemon=True)
        self._consumer.start()

    def _consume(self) -> None:
        try:
            with self._pipeline.auto_stop():
                # No break on stop: the source ends, and reading to the end means
                # every call that was in flight has returned (the point is idle).
                for _ in self._pipeline:
                    pass
                self._drained.set()
        except Exception as e:
            if self.fatal is None and not self._stop.is_set():
                self.pool_failed(e, self._workers)
        finally:
            self._drained.set()
            self._unquiet()
            self._done.set()

    def expected_workers(self) -> int:
        # SPDL's loop hands items to whichever thread/process is free; with a cheap
        # stage one worker can serve everything, so requiring all c to deliver could
        # wait forever. Processes must all have started (their pids), threads and
        # tasks need only a first item each batch of the pipe's queue.
        return self.concurrency if self.executor == "process" else 1

    def worker_pids(self) -> list[int]:
        if self._pool is None:
            return []
        assert self._workers is not None  # the pool was made from it (start)
        return self._workers.pids()

    def _unquiet(self) -> None:
        with _QUIET_LOCK:
            quieted, self._quieted = getattr(self, "_quieted", False), False
        if quieted:
            _quiet_spdl(False)

    def wait_idle(self, timeout: float) -> bool:
        # Idle: every item the source gave SPDL has been through the stage. The
        # consumer's end of the stream says the same thing ~0.1 s later (SPDL
        # finds the end by polling its output queue every 0.1 s).
        deadline = time.monotonic() + timeout
        while not self._drained.is_set():
            if self._source_ended.is_set() and self._calls_done() >= self._n_yielded:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._drained.wait(min(0.001, left))
        return True

    def abort(self) -> None:
        super().abort()
        started = hasattr(self, "_consumer")
        done = started and self.wait_idle(2.0)
        if started and not done:
            try:
                self._pipeline.stop()
            except Exception:
                pass
            self._unquiet()  # a hung call may keep the consumer forever
            # A call that never returns keeps its thread, in SPDL's own (non-daemon) thread pool, which
            # the interpreter would join at exit, forever: said, so that the command ends anyway.
            _LEAKED.extend(t for t in threading.enumerate() if t not in self._threads_before and t.is_alive())
        if not started:
            self._unquiet()  # no consumer thread will
        elif done and not self._done.is_set():
            if _DEFER["depth"]:
                with _STOPPING_LOCK:  # SPDL's tear-down finishes in the background (module docstring)
                    _STOPPING.append(self)
            else:
                self._done.wait(2.0)
        if self._pool is None:
            return
        assert self._workers is not None  # the pool was made from it (start)

        # a healthy pool serves the next point once its calls have returned; a
        # worker still busy (hung) or dead is killed with the pool
        _, busy = cf.wait(list(self._outstanding), timeout=5.0 if done else 0.0)
        if self._own_pool or self.fatal is not None or not done or busy:
            self._workers.discard()
