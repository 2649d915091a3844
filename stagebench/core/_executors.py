"""Closed-loop runners: c workers, each taking the next cached input as soon as
it finishes the previous one, recording (start, end, ok, worker, error) per item.

A closed loop with exactly c items in flight is what "concurrency c" means in
an SPDL pipe (c tasks in flight) and in a worker pool. The runners record
timestamps from ``time.perf_counter`` (CLOCK_MONOTONIC on Linux), taken in the
driving process so that process-pool latencies include the IPC they cost.

Runners never raise for the stage's own errors: those are records with
``ok=False``. A dead worker process is a fatal condition (:attr:`fatal`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import inspect
import os
import signal
import threading
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from multiprocessing.connection import wait
from typing import Any

from stagebench._memory import describe, ran_out_of_memory

__all__ = [
    "Lane",
    "Runner",
    "ThreadRunner",
    "AsyncRunner",
    "ProcessRunner",
    "WorkerPool",
    "WorkerReply",
    "identity",
    "async_identity",
    "is_coroutine_callable",
    "make_runner",
    "leaked_threads",
    "exit_may_hang",
    "pool_failure",
]


class Lane:
    """One worker's item log. Written by one thread only, so no lock.

    Successes go into two ``array('d')`` (16 bytes an item): a no-op ceiling
    stage logs hundreds of thousands of items a second, and a list of tuples
    would both slow the harness and inflate the memory it reports for the stage.
    """

    __slots__ = ("starts", "ends", "fails", "cpu")

    def __init__(self) -> None:
        self.starts = array("d")
        self.ends = array("d")
        self.fails: list[tuple[float, float, str]] = []
        # the calling thread's CPU seconds per successful call, where the harness
        # times it (the spdl harness's thread executor); empty elsewhere
        self.cpu = array("d")

    def __len__(self) -> int:
        return len(self.ends) + len(self.fails)


def identity(x: Any) -> Any:
    """The no-op stage behind every harness ceiling."""
    return x


async def async_identity(x: Any) -> Any:
    return x


# Threads of timed-out points that are still inside the user's function. Python
# cannot kill a thread; we say so instead of pretending it is gone.
_LEAKED: list[threading.Thread] = []


def leaked_threads() -> int:
    """Worker threads abandoned by earlier points that are still running."""
    return sum(t.is_alive() for t in _LEAKED)


def exit_may_hang() -> bool:
    """Whether the interpreter's exit may wait forever for a thread: a hung stage's, or, in a process that
    ran out of memory, one stuck in ``Thread.start()`` for a thread that could not start (under ``ulimit
    -v`` CPython creates it and waits for it forever)."""
    return bool(leaked_threads() or ran_out_of_memory())


def pool_failure(exc: BaseException, pool: "WorkerPool | None") -> tuple[str, str]:
    """(status, reason) for an error a process pool raised rather than the stage: ``crashed`` or ``failed``.

    A broken pool (a worker died: the standard library's ``BrokenProcessPool``,
    loky's ``TerminatedWorkerError``) is ``crashed``, with the workers' exit
    codes where known. Anything else (an item or an output that cannot be
    pickled) is ``failed``. Decided by the exception's type, not its message,
    which could misfile an unrelated error.
    """
    if any(t.__name__ in ("TerminatedWorkerError", "BrokenProcessPool") for t in type(exc).__mro__):
        return "crashed", pool.died() if pool is not None else "a worker process died"
    return "failed", describe(exc)


def is_coroutine_callable(fn: Callable) -> bool:
    """True for ``async def`` functions, partials of them, and objects with ``async __call__``."""
    while isinstance(fn, partial):
        fn = fn.func
    if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
        return True
    call = getattr(fn, "__call__", None)
    return call is not None and not inspect.isfunction(fn) and inspect.iscoroutinefunction(call)


class Runner:
    """Common state: records, the stop flag, and a fatal error if any."""

    def __init__(self, fn: Callable, inputs: Sequence, concurrency: int) -> None:
        if not inputs:
            raise ValueError("no inputs to run the stage on")
        self.fn = fn
        self.inputs = inputs
        self.concurrency = concurrency
        self.lanes: dict[Any, Lane] = {}
        self.fatal: str | None = None
        self.fatal_status: str | None = None
        self._stop = threading.Event()

    def lane(self, key: Any) -> Lane:
        # dict.setdefault is atomic under the GIL; each lane then has one writer.
        return self.lanes.setdefault(key, Lane())

    def record(self, key: Any, t0: float, t1: float, ok: bool, err: str | None, cpu: float | None = None) -> None:
        """One call's log; ``cpu``: the calling thread's CPU seconds, where the harness timed it."""
        lane = self.lane(key)
        if ok:
            if cpu is not None:
                lane.cpu.append(cpu)  # before starts/ends: a reader slicing to len(ends) finds it
            lane.starts.append(t0)
            lane.ends.append(t1)
        else:
            lane.fails.append((t0, t1, err or ""))

    def delivered_workers(self) -> int:
        return sum(1 for lane in list(self.lanes.values()) if len(lane))

    def worker_pids(self) -> list[int]:
        """Processes other than this one that run the stage (none for threads)."""
        return []

    def expected_workers(self) -> int:
        """Distinct workers that must deliver before the window opens."""
        return self.concurrency

    def start(self) -> None:
        raise NotImplementedError

    def request_stop(self) -> None:
        self._stop.set()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no item is in flight; False when the timeout passed first."""
        raise NotImplementedError

    def abort(self) -> None:
        """Release workers; kill them where that is possible."""
        self._stop.set()

    def pool_failed(self, exc: BaseException, pool: WorkerPool | None) -> None:
        """An error of the process pool's own, not the stage's, ends the point (:func:`pool_failure`)."""
        self.fatal_status, self.fatal = pool_failure(exc, pool)
        self._stop.set()


class ThreadRunner(Runner):
    """c daemon threads; worker i takes inputs i, i+c, i+2c, ... cyclically.

    Daemon threads (not ThreadPoolExecutor, whose workers are joined at exit) so a
    hung stage cannot keep the interpreter alive after the sweep ends.
    """

    def start(self) -> None:
        # Every thread starts blocked on `go`: Thread.start() waits for the new
        # thread to run, and with earlier workers already holding the GIL in a
        # tight loop that hand-off convoys.
        self._go = threading.Event()
        self._threads = [
            threading.Thread(target=self._work, args=(w,), name=f"stagebench-w{w}", daemon=True)
            for w in range(self.concurrency)
        ]
        for t in self._threads:
            t.start()
        self._go.set()

    def _work(self, wid: int) -> None:
        fn, inputs, n, step = self.fn, self.inputs, len(self.inputs), self.concurrency
        lane, now, stop, cpu_now = self.lane(wid), time.perf_counter, self._stop.is_set, time.thread_time
        self._go.wait()
        starts, ends, fails, cpus = lane.starts.append, lane.ends.append, lane.fails.append, lane.cpu.append
        i = wid
        while not stop():
            item = inputs[i % n]
            i += step
            # this thread's CPU during the call, as the spdl harness reads it: the stage's own,
            # none of the harness's or the process's other threads' (~0.3 us a call)
            t0, c0 = now(), cpu_now()
            try:
                fn(item)
            except Exception as e:  # the stage's error is data, not a harness failure
                fails((t0, now(), describe(e)))
            else:
                c1, t1 = cpu_now(), now()
                cpus(c1 - c0)  # before starts/ends: a reader slicing to len(ends) finds it
                starts(t0)
                ends(t1)

    def wait_idle(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)

    def abort(self) -> None:
        super().abort()
        _LEAKED.extend(t for t in getattr(self, "_threads", []) if t.is_alive())


class AsyncRunner(Runner):
    """c tasks in flight on one event loop, in its own thread (as SPDL runs coroutines)."""

    def start(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stagebench-loop", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._main_task = self._loop.create_task(self._main())
            self._loop.run_until_complete(self._main_task)
        except BaseException:  # cancelled by abort
            pass
        finally:
            self._done.set()

    async def _main(self) -> None:
        await asyncio.gather(*(self._lane(w) for w in range(self.concurrency)))

    async def _lane(self, wid: int) -> None:
        fn, inputs, n, step = self.fn, self.inputs, len(self.inputs), self.concurrency
        lane, now, stop = self.lane(wid), time.perf_counter, self._stop.is_set
        i = wid
        while not stop():
            item = inputs[i % n]
            i += step
            t0 = now()
            try:
                await fn(item)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                lane.fails.append((t0, now(), describe(e)))
            else:
                t1 = now()
                lane.starts.append(t0)
                lane.ends.append(t1)
            # A coroutine that never suspends (the no-op ceiling, or a stage that
            # awaits nothing) would otherwise keep this lane running forever and
            # starve the other c-1 lanes; SPDL runs each item as its own task, so
            # every item gives the loop a turn there too.
            await asyncio.sleep(0)

    def wait_idle(self, timeout: float) -> bool:
        return self._done.wait(timeout)

    def abort(self) -> None:
        super().abort()
        if not self._done.is_set():
            task = getattr(self, "_main_task", None)
            if task is not None:
                self._loop.call_soon_threadsafe(task.cancel)
            if not self._done.wait(1.0):
                _LEAKED.append(self._thread)  # the loop is blocked inside the stage


# ---------------------------------------------------------------- processes
_WORKER_FNS: list[tuple[Callable | None, str | None]] = []  # per stage: (the stage, why it did not load)


def _worker_init(*fn_bytes: bytes) -> None:
    """Runs once per worker, before it takes a call: unpickle the pool's stages (cloudpickle) and keep them.

    Loading here rather than at a stage's first call keeps imports out of the
    points: a worker that is still importing takes no item, while one that
    took an item and then imported for a second stalled a point's window.
    """
    global _WORKER_FNS
    # process pools only: thread and async executors never load it
    import cloudpickle

    _WORKER_FNS = []
    for b in fn_bytes:
        try:
            _WORKER_FNS.append((cloudpickle.loads(b), None))
        except Exception as e:  # e.g. the module defining it is not importable there
            _WORKER_FNS.append((None, f"cannot load the stage in a worker process: {describe(e)}"))


@dataclass(frozen=True, slots=True)
class WorkerReply:
    """What one call on a worker process (:meth:`WorkerPool.call_for`) sent back to the driver.

    Read from the call's result with :meth:`of`. On the wire it is a plain ``(pid, ok, error,
    output)`` tuple: the reply crosses the process boundary once per item, and a dataclass's pickle
    (its class by name, its fields walked on both sides) cost a no-op item several microseconds
    more; a worker that imported another copy of stagebench (one installed beside the working tree)
    still sends a reply this side reads.
    """

    pid: int
    """The worker process that ran the call: its lane."""
    ok: bool
    """Whether the stage returned (False: it raised, or could not be loaded in the worker)."""
    error: str | None
    """Why not, where not ``ok``."""
    output: Any
    """What the stage returned (None where not ``ok``): it travels back, as from a real process-pool stage."""

    @classmethod
    def of(cls, wire: tuple[int, bool, str | None, Any]) -> WorkerReply:
        """The reply a call's result (:func:`_worker_call`, :func:`_worker_noop`) holds."""
        return cls(*wire)


def _worker_call(i: int, item: Any) -> tuple[int, bool, str | None, Any]:
    """Run the pool's stage ``i`` on ``item``: a :class:`WorkerReply` on the wire."""
    fn, err = _WORKER_FNS[i] if i < len(_WORKER_FNS) else (None, "stage not initialised")
    if fn is None:
        return (os.getpid(), False, err, None)
    try:
        out = fn(item)
    except Exception as e:
        return (os.getpid(), False, describe(e), None)
    return (os.getpid(), True, None, out)


def _worker_noop(item: Any) -> tuple[int, bool, None, Any]:
    """The no-op ceiling on the stage's own workers: the same IPC both ways, no work."""
    return (os.getpid(), True, None, item)


_QUEUE_WORKERS = 64  # a pool's call queue holds this many workers' calls (+1): enough to grow into


def process_pool(workers: int, initializer: Callable, initargs: Sequence[bytes]) -> cf.ProcessPoolExecutor:
    """A standard-library process pool whose workers start with loky's context (see :class:`WorkerPool`)."""
    # process pools only: thread and async executors never load it
    from loky.backend.context import ctx_loky

    # loky's own context, named: `import joblib` re-registers the process-wide
    # "loky" context as joblib's older vendored copy
    return cf.ProcessPoolExecutor(
        max_workers=workers, mp_context=ctx_loky, initializer=initializer, initargs=tuple(initargs)
    )


def _pool_pids(ex: Any) -> list[int]:
    """The worker pids of a standard-library process pool (none when it is shut down or missing)."""
    try:
        return list(getattr(ex, "_processes", None) or {})
    except RuntimeError:  # dict changed size while the pool spawns
        return []


def close_pool(ex: cf.ProcessPoolExecutor) -> None:
    """Kill a process pool's workers and shut it down without waiting for a call in flight."""
    kill_and_reap(_pool_pids(ex))  # first: the pool's own shutdown would wait for a hung worker's call
    ex.shutdown(wait=False, cancel_futures=True)


def _dead_codes(procs: Any) -> str:
    procs = list((procs or {}).values())
    # A dead worker's exit status shows a moment after the pool reports itself broken:
    # its sentinel may not have fired yet, and the pool's own thread reaps it too, so
    # our poll can find the pid already reaped (ECHILD: exitcode None) before that
    # thread has stored the code, and the crash would read "a worker process died" with
    # no code. So wait up to 1 s for a sentinel, then for the fired ones' codes. Only on
    # this path: the caller knows a worker died.
    silent = (None, 0, -signal.SIGTERM)  # not yet known, clean, or the pool's own kill of the others
    pending = {p.sentinel: p for p in procs if getattr(p, "_popen", None) is not None and p.exitcode is None}
    if pending and all(getattr(p, "exitcode", None) in silent for p in procs):
        deadline = time.monotonic() + 1.0
        for sentinel in wait(list(pending), timeout=1.0):
            p = pending[sentinel]  # dead: its code shows once a reaper has stored it
            while p.exitcode is None and time.monotonic() < deadline:
                time.sleep(0.01)
    codes = set()
    for p in procs:
        code = getattr(p, "exitcode", None)
        if code in silent:
            continue
        try:
            codes.add(f"{signal.Signals(-code).name}({code})" if code < 0 else str(code))
        except ValueError:
            codes.add(str(code))
    return "{" + ", ".join(sorted(codes)) + "}" if codes else ""


class WorkerPool:
    """A process pool kept across the points of a sweep, for one stage or several.

    Starting a worker means a fresh interpreter that imports the stage's
    modules, which would dominate a diagnosis if every point started its own
    pool. A sweep measures levels in ascending order, so the pool *grows* to c
    workers at level c: every point still runs on exactly c workers, the stage
    and its no-op ceiling share them (:func:`_worker_noop`: the same IPC, no
    work), and going down in c starts a fresh pool (unless :attr:`keep_larger`).
    A point that ends with a dead, hung or busy worker discards the pool
    (:meth:`discard` kills it); the next point starts clean.

    Several stages (``WorkerPool(f, g, h)``) share the workers when their
    process points are measured level by level: the pool grows to the top
    level once for all of them. Every worker then holds all of them, so a
    stage's worker memory includes the others'; the sweep shares a pool only
    among stages that pickle small (see ``_sweep._pools``).

    The pool is the standard library's ``concurrent.futures.ProcessPoolExecutor``,
    the one the report tells users to pass to SPDL, so the IPC measured is
    theirs. Its workers start with loky's context: a fresh interpreter like
    ``spawn``, but without re-running the user's ``__main__`` (``spawn`` and
    ``forkserver`` would run an unguarded ``train.py`` again in every worker),
    and without ``fork``'s copies of the threads and locks of a process that
    has SPDL and torch loaded. Stages travel with cloudpickle, once per worker
    (:func:`_worker_init`); each call ships the item with standard pickle, as
    the user's pool would.

    Growing uses the standard library's private ``_max_workers`` and
    ``_spawn_process``, as its own submit does; the call queue is sized for
    :data:`_QUEUE_WORKERS` workers from the start, since it cannot grow. Where
    those are missing (another Python), the pool is replaced instead.
    """

    def __init__(self, *fns: Callable, fn_bytes: Sequence[bytes] | None = None) -> None:
        if not fns:
            raise ValueError("WorkerPool: no stage to run")
        self.fns = fns
        self._fn_bytes = tuple(fn_bytes) if fn_bytes is not None else None  # already pickled by the caller
        self._ex: Any = None
        self._procs: dict | None = None  # pid -> Process of the current pool
        self.size = self._capacity = 0
        self.starts = 0  # fresh pools started; read by tests and the benchmark
        #: When set, a point that asks for fewer workers than the pool has runs on the larger pool
        #: instead of a fresh one (:meth:`executor`): for windows that read throughput only.
        self.keep_larger = False

    @property
    def fn_bytes(self) -> tuple[bytes, ...]:
        """The stages, pickled once (raises what cloudpickle raises for one that cannot be)."""
        if self._fn_bytes is None:
            # process pools only: thread and async executors never load it
            import cloudpickle

            self._fn_bytes = tuple(cloudpickle.dumps(f) for f in self.fns)
        return self._fn_bytes

    def call_for(self, fn: Callable) -> Callable:
        """The worker-side call that runs ``fn``: one of the pool's stages or the no-op ceiling."""
        for i, f in enumerate(self.fns):
            if f is fn:
                return partial(_worker_call, i)
        if fn is identity:
            return _worker_noop
        raise ValueError(f"this pool runs {', '.join(repr(getattr(f, '__name__', f)) for f in self.fns)}, not {fn!r}")

    def executor(self, workers: int) -> Any:
        """The pool with exactly ``workers`` workers, all started (grown, or started fresh).

        With :attr:`keep_larger`, a pool that already has more workers is kept as it is: at most
        ``workers`` calls are in flight, so the others wait on the queue and cost no CPU, and a
        fresh pool would cost its start-up. Its memory and worker count are then the larger
        pool's, which is why only windows that are read for their throughput use it.
        """
        shrink = workers < self.size and not self.keep_larger
        if self._ex is not None and (shrink or getattr(self._ex, "_broken", False)):
            self.discard()
        if self._ex is not None and workers > self.size and not self._grow(workers):
            self.discard()
        if self._ex is None:
            self._capacity = max(workers, _QUEUE_WORKERS)
            self._ex = process_pool(self._capacity, _worker_init, self.fn_bytes)
            # the same dict; shutdown drops the pool's reference to it
            self._procs = getattr(self._ex, "_processes", None)
            self.starts += 1
            if not self._grow(workers):  # another Python: a pool of exactly this size, started on demand
                self._ex.shutdown(wait=False)
                self._ex = process_pool(workers, _worker_init, self.fn_bytes)
                self._procs = getattr(self._ex, "_processes", None)
                self.size = self._capacity = workers
        return self._ex

    def _grow(self, n: int) -> bool:
        """Set the pool to ``n`` workers and start the missing ones now (before the point's warm-up)."""
        ex = self._ex
        lock, spawn = getattr(ex, "_shutdown_lock", None), getattr(ex, "_spawn_process", None)
        procs = getattr(ex, "_processes", None)
        if lock is None or spawn is None or procs is None or not hasattr(ex, "_max_workers"):
            return False
        if n > self._capacity:
            return False  # the call queue was sized for fewer: a fresh pool
        with lock:
            ex._max_workers = n
            while len(procs) < n:
                spawn()
        self.size = n
        return True

    def pids(self) -> list[int]:
        return _pool_pids(self._ex)

    def died(self) -> str:
        """The reason recorded when a worker of this pool died: with its exit codes (other than 0 and the
        pool's own SIGTERM) where they are known."""
        codes = _dead_codes(self._procs)
        return f"a worker process died{f' (exit codes {codes})' if codes else ''}"

    def discard(self) -> None:
        """Kill the workers now (a hung one must be gone before the next point is timed)."""
        ex, self._ex, self.size = self._ex, None, 0
        if ex is not None:
            close_pool(ex)

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.discard()


class ProcessRunner(Runner):
    """c calls in flight on a :class:`WorkerPool` of c workers.

    A pool passed in is left running for the next point unless this point ended
    badly; without one, the runner starts and kills its own.
    """

    def __init__(
        self, fn: Callable, inputs: Sequence, concurrency: int, pool: WorkerPool, own_pool: bool = False
    ) -> None:
        super().__init__(fn, inputs, concurrency)
        self.pool = pool
        self._own_pool = own_pool
        self._call = pool.call_for(fn)
        self._idle = threading.Event()

    def start(self) -> None:
        self._ex = self.pool.executor(self.concurrency)
        self._driver = threading.Thread(target=self._drive, name="stagebench-driver", daemon=True)
        self._driver.start()

    def _drive(self) -> None:
        inputs, n, call = self.inputs, len(self.inputs), self._call
        now = time.perf_counter
        pending: dict[cf.Future, float] = {}
        i = 0
        try:
            while True:
                while not self._stop.is_set() and len(pending) < self.concurrency:
                    fut = self._ex.submit(call, inputs[i % n])
                    pending[fut] = now()
                    i += 1
                if not pending:
                    break
                done, _ = cf.wait(pending, timeout=0.05, return_when=cf.FIRST_COMPLETED)
                t1 = now()
                for fut in done:
                    t0 = pending.pop(fut)
                    exc = fut.exception()
                    if exc is not None:
                        self.pool_failed(exc, self.pool)
                        return
                    reply = WorkerReply.of(fut.result())
                    self.record(reply.pid, t0, t1, reply.ok, reply.error)
        except Exception as e:  # the pool broke while submitting
            self.pool_failed(e, self.pool)
        finally:
            self._idle.set()

    def worker_pids(self) -> list[int]:
        return self.pool.pids()

    def wait_idle(self, timeout: float) -> bool:
        return self._idle.wait(timeout)

    def abort(self) -> None:
        super().abort()
        # A hung or runaway worker must not outlive its point; a healthy, idle
        # pool serves the next one.
        if self._own_pool or self.fatal is not None or not self._idle.is_set():
            self.pool.discard()


def kill_and_reap(pids: list[int], timeout: float = 5.0) -> None:
    """SIGKILL the given worker processes and wait for them.

    A pool's own shutdown waits for its workers' calls, or kills them later from its manager thread;
    a worker hung in the stage must be gone before the next point is timed.
    """
    # only where a pool's workers are killed: psutil loads there
    import psutil

    procs = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            p.kill()
            procs.append(p)
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=timeout)


def make_runner(
    executor: str, fn: Callable, inputs: Sequence, concurrency: int, pool: WorkerPool | None = None
) -> Runner:
    """The runner for one point; ``pool`` (processes only) is reused, else one is started for the point."""
    if executor == "thread":
        return ThreadRunner(fn, inputs, concurrency)
    if executor == "async":
        return AsyncRunner(fn, inputs, concurrency)
    if executor == "process":
        if pool is None:
            return ProcessRunner(fn, inputs, concurrency, WorkerPool(fn), own_pool=True)
        return ProcessRunner(fn, inputs, concurrency, pool)
    raise ValueError(f"executor: unknown {executor!r}; allowed: thread, process, async")
