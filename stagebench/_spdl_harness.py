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

from ._executors import Runner, _describe, _worker_call, _worker_init

__all__ = ["SpdlRunner"]


def _identity(x: Any) -> Any:
    return x


class SpdlRunner(Runner):
    def __init__(self, fn: Callable, inputs: Sequence, concurrency: int, executor: str,
                 fn_bytes: bytes | None = None, extra_pipes: int = 0) -> None:
        super().__init__(fn, inputs, concurrency)
        self.executor = executor
        # identity pipes before the timed one: a k-stage no-op pipeline, which
        # separates SPDL's fixed cost (source, sink, consumer) from its per-stage cost
        self.extra_pipes = int(extra_pipes)
        self._fn_bytes = fn_bytes
        self._done = threading.Event()
        self._pool = None

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
            def timed(item: Any) -> None:
                t0 = now()
                try:
                    fn(item)
                except Exception as e:
                    record(threading.get_ident(), t0, now(), False, _describe(e))
                else:
                    record(threading.get_ident(), t0, now(), True, None)
            return timed

        # process: the pipe awaits the pool; the call is timed from the event loop's
        # side (submit to result), like the direct harness's process latencies.
        pool = self._pool

        async def timed_process(item: Any) -> None:
            import asyncio

            t0 = now()
            try:
                pid, ok, err, _ = await asyncio.get_running_loop().run_in_executor(pool, _worker_call, item)
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
            from loky import ProcessPoolExecutor

            self._pool = ProcessPoolExecutor(
                max_workers=self.concurrency, initializer=_worker_init, initargs=(self._fn_bytes,)
            )
        builder = PipelineBuilder().add_source(self._source())
        for i in range(self.extra_pipes):
            builder = builder.pipe(_identity, concurrency=self.concurrency, name=f"noop{i}")
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
        try:
            return list(getattr(self._pool, "_processes", None) or {})
        except RuntimeError:
            return []

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
        if not self._done.wait(2.0):
            try:
                self._pipeline.stop()
            except Exception:
                pass
        if self._pool is not None:
            from ._executors import kill_and_reap

            pids = self.worker_pids()
            self._pool.shutdown(wait=False, kill_workers=True)
            kill_and_reap(pids)

