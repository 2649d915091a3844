"""The loader as the sweep builds it: batches tagged with where they were made, epochs under control.

The collate function is wrapped (:class:`TaggedCollate`) so that each batch carries the pid of the
process that made it out of band, the user's batch untouched: "every worker started" is then
observed, not assumed. The worker init function is timed (:class:`TimedInit`) and the sampler wrapped
(:class:`EpochControl`) so that an epoch ends where the protocol asks. :func:`shut_down` stops a
loader and its workers whatever state it is in.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = ["BatchTag", "TaggedCollate", "TimedInit", "EpochControl", "BuiltLoader", "shut_down", "context_name"]


# ------------------------------------------------------------ measurement protocol
class BatchTag(NamedTuple):
    """A batch with where it was made, attached by :class:`TaggedCollate`.

    A namedtuple on purpose: torch's pin-memory thread rebuilds namedtuples
    field by field, so ``batch`` is pinned exactly as the user's batch would be.
    ``born``: on a worker's first batch only, when (``time.time()``: one clock for every process of
    the host) the worker's process was created (None where /proc cannot say), reached its
    ``worker_init_fn``, left it, and finished that batch; the middle two None where no
    :class:`TimedInit` ran (SPDL's loader takes no ``worker_init_fn``).
    """

    batch: Any
    pid: int
    worker: int
    n: int
    threads: int
    born: tuple[float | None, float | None, float | None, float] | None = None


#: When this worker process reached and left its worker_init_fn (:class:`TimedInit`), and whether its
#: first batch went out. A module global: each worker process has its own copy.
_BORN: dict[str, float] = {}


class TimedInit:
    """Wraps the user's ``worker_init_fn`` (or none): notes, in the worker, when the worker reached it
    (its process started, imported, received the dataset) and when it returned. What the script runs is
    unchanged: the user's function is called as before, with the same argument."""

    def __init__(self, fn: Callable[[int], Any] | None) -> None:
        self.fn = fn

    def __call__(self, worker_id: int) -> None:
        _BORN.clear()
        _BORN["init"] = time.time()
        age = _process_age_s()
        if age is not None:
            _BORN["created"] = _BORN["init"] - age
        try:
            if self.fn is not None:
                self.fn(worker_id)
        finally:
            _BORN["ready"] = time.time()


def _process_age_s() -> float | None:
    """Seconds since this process was created (forked: a spawned worker's exec keeps its fork time), from
    /proc at the kernel's clock tick (10 ms): when the main process got round to starting this worker."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime, in ticks since boot
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started)
    except (OSError, ValueError, IndexError, AttributeError):
        return None


class TaggedCollate:
    """Wraps the user's collate function; returns a :class:`BatchTag` around its batch.

    Runs where collation runs (the worker), so the tag names the process that
    made the batch and the torch thread count it ran with. The extra work is a
    few attribute reads per batch.
    """

    def __init__(self, collate_fn: Callable, batched: bool) -> None:
        self.collate_fn = collate_fn
        self.batched = batched
        # pickled into each worker with it: a call in another process is a worker's
        self._home = os.getpid()

    def __call__(self, samples: Any) -> BatchTag:
        out = self.collate_fn(samples)
        n = len(samples) if self.batched and hasattr(samples, "__len__") else 1
        worker, threads = -1, -1
        torch = sys.modules.get("torch")
        if torch is not None:
            with contextlib.suppress(Exception):
                info = torch.utils.data.get_worker_info()
                worker = -1 if info is None else int(info.id)
                threads = int(torch.get_num_threads())
        born: tuple[float | None, float | None, float | None, float] | None = None
        if "sent" not in _BORN and "ready" in _BORN:  # this worker's first batch: when it was born, and done
            _BORN["sent"] = 1.0
            born = (_BORN.get("created"), _BORN["init"], _BORN["ready"], time.time())
        elif "sent" not in _BORN and os.getpid() != self._home:  # a worker no TimedInit ran in (SPDL's)
            _BORN["sent"] = 1.0
            now, age = time.time(), _process_age_s()
            born = (None if age is None else now - age, None, None, now)
        return BatchTag(out, os.getpid(), worker, n, threads, born)


class EpochControl:
    """Wraps the user's (batch) sampler so the measurement decides where epochs end.

    ``cycle()``: the epoch runs on (the user's sampler is restarted when it is
    exhausted), so the window never straddles an epoch boundary. ``limit(n)``: an
    epoch of n yields. ``end()``: the epoch ends at the next request for an
    index; batches already in flight are still delivered. Iterated in the main
    process by both torch and SPDL, so plain attributes suffice.
    """

    def __init__(self, inner: Iterable) -> None:
        self.inner = inner
        self._cycle = False
        self._limit: int | None = None
        self._end = False

    def cycle(self) -> None:
        self._cycle, self._limit, self._end = True, None, False

    def limit(self, n: int) -> None:
        self._cycle, self._limit, self._end = True, int(n), False

    def end(self) -> None:
        self._end = True

    def __iter__(self):
        n = 0
        while True:
            yielded = False
            for x in self.inner:
                if self._end or (self._limit is not None and n >= self._limit):
                    return
                yield x
                n += 1
                yielded = True
            if not self._cycle or not yielded:
                return

    def __len__(self) -> int:
        if self._limit is not None:
            return self._limit
        return len(self.inner)  # type: ignore[arg-type]


@dataclass(slots=True, kw_only=True)
class BuiltLoader:
    """What a factory may return instead of a bare loader: the loader plus the hooks
    that make the measurement exact (epoch control, worker tags, clean-up)."""

    loader: Iterable
    control: EpochControl | None = None
    close: Callable[[], None] | None = None


def context_name(ctx: Any) -> str | None:
    """The start method a ``multiprocessing_context`` names (a name, or a context), None for none."""
    if ctx is None or isinstance(ctx, str):
        return ctx
    get = getattr(ctx, "get_start_method", None)
    return str(get()) if callable(get) else type(ctx).__name__


def _cuda_available() -> bool:
    torch: Any = sys.modules.get("torch")
    if torch is None:
        try:
            import torch  # a dependency that may be missing: no torch, no CUDA
        except ImportError:
            return False
    try:
        return bool(torch.cuda.is_available())
    except Exception:
        return False


def shut_down(it: Any, built: BuiltLoader | None) -> None:
    """Stop a loader's iterator and its workers, then the factory's own clean-up; never raises."""
    with contextlib.suppress(BaseException):  # teardown of a broken loader must not raise
        if it is not None:
            shutdown = getattr(it, "_shutdown_workers", None)
            if callable(shutdown):
                shutdown()
            elif callable(getattr(it, "close", None)):
                it.close()  # a generator (SPDL): leaves its pipeline and process pool
    with contextlib.suppress(BaseException):
        if built is not None and built.close is not None:
            built.close()
