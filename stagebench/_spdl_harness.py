"""The ``spdl`` harness: the stage inside a one-stage SPDL pipeline.

The ``direct`` harness answers "how fast can this function go"; this one
answers "how fast will it go in my pipeline", SPDL's per-item scheduling
overhead included. It reuses the direct harness's records and window logic:
the pipe runs a thin wrapper that timestamps each call, so throughput comes
from the same fractional counting, and the sink is drained by a consumer
thread (a real pipeline's consumer is the training loop).

Executors: ``thread`` uses the pipeline's own thread pool (``num_threads`` =
concurrency, as a user would build it); ``process`` passes a loky process pool
(cloudpickle, so lambdas and ``__main__`` functions work) as the pipe's
executor; ``async`` pipes the coroutine function directly.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ._executors import Runner, WorkerPool, _describe, identity

__all__ = ["SpdlRunner"]


class SpdlRunner(Runner):
    def __init__(self, fn: Callable, inputs: Sequence, concurrency: int, executor: str,
                 pool: WorkerPool | None = None, extra_pipes: int = 0) -> None:
        super().__init__(fn, inputs, concurrency)
        self.executor = executor
        # identity pipes before the timed one: a k-stage no-op pipeline, which
        # separates SPDL's fixed cost (source, sink, consumer) from its per-stage cost
        self.extra_pipes = int(extra_pipes)
        self._done = threading.Event()
        # process: a pool kept across points (see WorkerPool), or one of our own
        self._own_pool = executor == "process" and pool is None
        self._workers = WorkerPool(fn) if self._own_pool else pool
        self._call = self._workers.call_for(fn) if executor == "process" else None
        self._pool = None
        self._outstanding: set = set()

    # ---- sources and wrapped ops -------------------------------------------------
    def _source(self):
        inputs, n, stop = self.inputs, len(self.inputs), self._stop.is_set
        i = 0
        while not stop():
            yield inputs[i % n]
            i += 1

    def _op(self) -> Callable:
        fn, record, now = self.fn, self.record, time.perf_counter
        if self.executor == "async":
            # All coroutines run on SPDL's one loop thread: one lane is single-writer.
            async def timed_async(item: Any) -> None:
                t0 = now()
                try:
                    await fn(item)
                except Exception as e:
                    record("loop", t0, now(), False, _describe(e))
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
                    record(threading.get_ident(), t0, now(), False, _describe(e))
                else:
                    c1 = cpu_now()
                    record(threading.get_ident(), t0, now(), True, None, cpu=c1 - c0)
            return timed

        # process: the pipe awaits the pool; the call is timed from the event loop's
        # side (submit to result), like the direct harness's process latencies.
        pool, call, outstanding = self._pool, self._call, self._outstanding

        async def timed_process(item: Any) -> None:
            import asyncio

            t0 = now()
            try:
                # submit + wrap_future is run_in_executor, keeping the pool-side future:
                # SPDL cancels the awaiting task at shutdown, the call runs on regardless
                fut = pool.submit(call, item)
                outstanding.add(fut)
                fut.add_done_callback(outstanding.discard)
                pid, ok, err, _ = await asyncio.wrap_future(fut)
            except Exception as e:
                self._pool_error(e)
                raise
            # completions are handled on the loop thread: single writer per lane
            record(pid, t0, now(), ok, err)
        return timed_process

    def _pool_error(self, exc: BaseException) -> None:
        name = type(exc).__name__
        if name in ("TerminatedWorkerError", "BrokenProcessPool"):
            self.fatal_status, self.fatal = "crashed", "a worker process died"
        else:
            self.fatal_status, self.fatal = "failed", _describe(exc)
        self._stop.set()

    # ---- lifecycle ---------------------------------------------------------------
    def start(self) -> None:
        from spdl.pipeline import PipelineBuilder

        if self.executor == "process":
            self._pool = self._workers.executor(self.concurrency)
        builder = PipelineBuilder().add_source(self._source())
        for i in range(self.extra_pipes):
            builder = builder.pipe(identity, concurrency=self.concurrency, name=f"noop{i}")
        builder = builder.pipe(self._op(), concurrency=self.concurrency, name="stage").add_sink(max(2, self.concurrency))
        # SPDL logs each dropped item; our wrapper never lets the stage's own errors
        # through, so anything logged is the harness's business, not the user's.
        # The level is restored in abort(): others (the loader sweep) read SPDL's log.
        spdl_log = logging.getLogger("spdl")
        self._saved_log_level = spdl_log.level
        spdl_log.setLevel(logging.CRITICAL)
        self._pipeline = builder.build(num_threads=max(1, self.concurrency), max_failures=0)
        self._consumer = threading.Thread(target=self._consume, name="stagebench-sink", daemon=True)
        self._consumer.start()

    def _consume(self) -> None:
        try:
            with self._pipeline.auto_stop():
                for _ in self._pipeline:
                    if self._stop.is_set():
                        break
        except Exception as e:
            if self.fatal is None and not self._stop.is_set():
                self._pool_error(e)
        finally:
            self._done.set()

    def expected_workers(self) -> int:
        # SPDL's loop hands items to whichever thread/process is free; with a cheap
        # stage one worker can serve everything, so requiring all c to deliver could
        # wait forever. Processes must all have started (their pids), threads and
        # tasks need only a first item each batch of the pipe's queue.
        if self.executor == "process":
            return self.concurrency
        return 1

    def worker_pids(self) -> list[int]:
        return self._workers.pids() if self._pool is not None else []

    def wait_idle(self, timeout: float) -> bool:
        return self._done.wait(timeout)

    def abort(self) -> None:
        super().abort()
        try:
            self._abort_pipeline()
        finally:
            if hasattr(self, "_saved_log_level"):
                logging.getLogger("spdl").setLevel(self._saved_log_level)

    def _abort_pipeline(self) -> None:
        done = self._done.wait(2.0)
        if not done:
            try:
                self._pipeline.stop()
            except Exception:
                pass
        if self._pool is None:
            return
        import concurrent.futures as cf

        # a healthy pool serves the next point once its calls have returned; a
        # worker still busy (hung) or dead is killed with the pool
        _, busy = cf.wait(list(self._outstanding), timeout=5.0 if done else 0.0)
        if self._own_pool or self.fatal is not None or not done or busy:
            self._workers.discard()

