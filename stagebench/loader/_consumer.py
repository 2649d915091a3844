"""The consumer thread that iterates a loader, and its tear-down.

The thread, not the caller, blocks on ``next()``: a hung worker (or a hung ``__getitem__`` with
``num_workers=0``) can then be timed out and torn down instead of hanging the sweep. Tear-down is
``_shutdown_workers()`` (torch) or closing the generator (SPDL), then SIGKILL for any worker of ours
still alive. Errors SPDL's pipeline logs instead of raising are collected (:class:`_SpdlErrors`) and
read as the loader's failure.
"""

from __future__ import annotations

import contextlib
import logging
import math
import multiprocessing
import os
import signal
import threading
import time
import weakref
from collections.abc import Iterable
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict
from typing import Any

import psutil

from stagebench.core._mirror import MirroredGate, Ready, mirror
from stagebench.core._sizes import approx_nbytes
from stagebench.loader._built import BatchTag, BuiltLoader, EpochControl, shut_down
from stagebench.loader._config import LoaderFactory
from stagebench.loader._mirror import WHAT
from stagebench.loader._window import _Event
from stagebench.model._knobs import LoaderKnobs

__all__: list[str] = []


class _SpdlErrors(logging.Handler):
    """Collects errors that SPDL's pipeline logs instead of raising.

    SPDL's loader drops a batch whose task failed (its pipeline tolerates any
    number of failures) and only logs it; a training loop would silently see
    fewer batches. The sweep treats such a point as failed, like torch does.
    """

    def __init__(self) -> None:
        super().__init__(level=logging.ERROR)
        self.records: list[str] = []
        self._logger = logging.getLogger("spdl")

    def emit(self, record: logging.LogRecord) -> None:
        if len(self.records) >= 5:
            return
        if record.exc_info and record.exc_info[1] is not None:
            e = record.exc_info[1]
            self.records.append(f"{type(e).__name__}: {_first_and_last_line(str(e))}")
        else:
            self.records.append(record.getMessage()[:300])

    def attach(self) -> None:
        self._logger.addHandler(self)

    def detach(self) -> None:
        self._logger.removeHandler(self)


def _first_and_last_line(msg: str) -> str:
    lines = [ln.strip() for ln in msg.strip().splitlines() if ln.strip()]
    if not lines:
        return ""
    if len(lines) == 1:
        return lines[0][:300]
    return f"{lines[0]} ... {lines[-1]}"[:300]


_CRASH_MARKERS = ("exited unexpectedly", "killed by signal", "terminated abruptly", "BrokenProcessPool")


def _classify(message: str, exc: BaseException | None = None, *, crash: bool = False) -> tuple[str, str]:
    """(status, reason) for an error seen by the consumer."""
    if crash or isinstance(exc, BrokenProcessPool) or any(m in message for m in _CRASH_MARKERS):
        killed = any(m in message for m in ("Killed", "SIGKILL", "signal: 9", "terminated abruptly"))
        hint = " (out of memory? the kernel's OOM killer sends SIGKILL)" if killed else ""
        return "crashed", f"a worker process died: {message}{hint}"[:400]
    return "failed", f"the loader raised: {message}"[:400]


#: Every consumer of this process, while it lives: a new one's workers fork the whole process.
_CONSUMERS: weakref.WeakSet[_Consumer] = weakref.WeakSet()


#: The longest a new loader waits for another consumer to finish the batch it was taking as its gate closed.
_PARK_S = 30.0


def _others_parked(new: _Consumer) -> None:
    """Wait until every other consumer whose gate is closed has finished the batch it was taking, before
    ``new``'s loader starts its workers: a worker is a fork of this whole process, and a consumer without
    workers runs the user's ``__getitem__`` in its own thread, which holds locks (torch's default random
    generator's, in any dataset that draws random numbers) for as long as a call. A fork made while one
    was held leaves it held in the worker for ever: a worker stuck in ``torch.manual_seed`` before its first
    batch (torchvision's ``FakeData`` draws with the default generator on every item)."""
    _CONSUMERS.add(new)
    end = time.perf_counter() + _PARK_S
    for c in list(_CONSUMERS):
        if c is not new and not c.gate.is_set():
            c.parked.wait(max(0.0, end - time.perf_counter()))


class _Consumer(threading.Thread):
    """Builds the loader and takes batches as fast as they come, epoch after epoch."""

    def __init__(self, factory: LoaderFactory, knobs: LoaderKnobs, warmup_s: float = 0.0) -> None:
        super().__init__(name="stagebench-loader-consumer", daemon=True)
        self.factory = factory
        self.knobs = knobs
        self.warmup_s = warmup_s  # a ranked sweep's followers warm their loaders up as long
        self.events: list[_Event] = []
        self.t_begin = math.nan
        self.t_iter = math.nan
        self.wall_offset = 0.0
        # set: the next batch's size is read (a walk over its tensors, not a copy), into batch_mb: what
        # each batch in flight takes in shared memory (/dev/shm) on its way; only where asked (the memory
        # pass): a batch of an unknown type is sized by pickling it
        self.size_next_batch = False
        self.batch_mb = math.nan
        self.built: BuiltLoader | None = None
        self.loader: Any = None
        self.iterator: Any = None
        self.error: tuple[str, str] | None = None
        self.stop_requested = False
        self.max_epochs: int | None = None
        self.stall_batches = 4
        # set: the last of ``max_epochs`` runs on until stopped, for a pass on the workers it starts afresh
        self.open_last = False
        self.finished = False
        # open: batches are taken as they come; closed (a loader waiting for its turn, :mod:`_turns`): the
        # consumer takes none, and the loader's workers fill their queues and idle
        self.gate = MirroredGate()
        self.gate.set()
        # set while it waits at its closed gate, between two batches: no call of the user's is in flight
        self.parked = threading.Event()
        # a ranked sweep's leader: every rank opens a loader at these knobs, and follows its gate
        self.mirror = mirror()
        self.cid: int | None = None
        #: a ranked sweep: the other ranks' answer whether their copies are ready (:meth:`others_ready`), and
        #: their workers as they last said
        self.asked: Ready | None = None
        self.others_pids: list[int] = []

    def start(self) -> None:
        if self.mirror is not None:
            self.cid = self.mirror.open(WHAT, knobs=asdict(self.knobs), warmup_s=self.warmup_s)
            self.gate.mirror, self.gate.cid = self.mirror, self.cid
        super().start()

    def others_ready(self) -> bool:
        """Whether every other rank's copy of this loader is ready for a window (warmed up, or drained after
        its latest opening): asked once per opening, then polled. A copy that failed fails this loader:
        its fault becomes :attr:`error`, with the rank's number. True on one rank."""
        if self.mirror is None or self.cid is None:
            return True
        if self.asked is None:
            self.asked = self.mirror.ready(self.cid)
        if not self.asked.done():
            return False
        failed = self.asked.failure
        if failed is not None and self.error is None:
            self.error = failed
        self.others_pids = self.asked.pids
        return True

    @property
    def control(self) -> EpochControl | None:
        return self.built.control if self.built is not None else None

    def run(self) -> None:
        try:
            self.t_begin = time.perf_counter()
            self.wall_offset = time.time() - self.t_begin  # perf_counter to the clock every process shares
            built: Iterable | BuiltLoader = self.factory(self.knobs)
            if not isinstance(built, BuiltLoader):
                built = BuiltLoader(loader=built)
            self.built = built
            self.loader = built.loader
            if built.control is not None:
                built.control.cycle()
            epoch = 0
            events = self.events
            _others_parked(self)
            while not self.stop_requested:
                if epoch == 0:
                    self.t_iter = time.perf_counter()  # the workers start here (torch: at iter())
                it = iter(self.loader)
                self.iterator = it
                ended = True
                n_before = len(events)
                while True:
                    if not self.gate.is_set():
                        self.parked.set()
                    self.gate.wait()
                    self.parked.clear()
                    if self.stop_requested:
                        ended = False
                        break
                    try:
                        batch = next(it)
                    except StopIteration:
                        break
                    t = time.perf_counter()
                    if self.size_next_batch:
                        self.batch_mb = approx_nbytes(getattr(batch, "batch", batch)) / 2**20
                        self.size_next_batch = False
                    if isinstance(batch, BatchTag):
                        events.append(_Event(t, epoch, batch.pid, batch.n, batch.threads, batch.worker, batch.born))
                    else:
                        events.append(_Event(t, epoch, None, None, -1))
                    del batch
                    if self.stop_requested:
                        ended = False
                        break
                if not ended:
                    break
                if len(events) == n_before:
                    raise RuntimeError(
                        "an epoch yielded no batches (an empty dataset, or fewer samples than one "
                        "batch with drop_last=True?)"
                    )
                epoch += 1
                if self.max_epochs is not None and epoch >= self.max_epochs:
                    break
                if built.control is not None:
                    last = self.open_last and self.max_epochs is not None and epoch == self.max_epochs - 1
                    if last:
                        built.control.cycle()
                    else:
                        built.control.limit(self.stall_batches)
        except BaseException as e:  # the point records it; nothing escapes the thread
            self.error = _classify(f"{type(e).__name__}: {_first_and_last_line(str(e))}", e)
        finally:
            self._close()
            self.finished = True
            self.parked.set()

    def _close(self) -> None:
        it, self.iterator = self.iterator, None
        shut_down(it, self.built)

    def _worker_procs(self) -> list[Any]:
        it = self.iterator
        procs = list(getattr(it, "_workers", None) or ())
        frame = getattr(it, "gi_frame", None)
        if frame is not None:
            with contextlib.suppress(Exception):
                procs += list((getattr(frame.f_locals.get("executor"), "_processes", None) or {}).values())
        return procs

    def dead_worker(self) -> str | None:
        """A worker of the live iterator that died, described; None if all live.

        torch notices a dead worker only after its 5 s status-check interval, and
        SPDL only when its pool breaks: this sees it at once. ``exitcode`` polls
        with waitpid (no /proc read).
        """
        it = self.iterator
        if it is None or getattr(it, "_shutdown", False) or self.stop_requested:
            return None
        for w in self._worker_procs():
            try:
                code = w.exitcode
            except Exception:
                continue
            if code is None or code == 0:
                continue
            if code < 0:
                try:
                    sig = signal.Signals(-code).name
                except ValueError:
                    sig = f"signal {-code}"
                return f"worker pid {w.pid} was killed by {sig}"
            return f"worker pid {w.pid} exited with code {code}"
        return None

    def made_by_live_workers(self) -> int:
        """The batches the live iterator's workers made so far: a worker of an earlier epoch's iterator is
        gone (workers that are not persistent start again at every epoch)."""
        live = {getattr(w, "pid", None) for w in self._worker_procs()} - {None}
        return sum(1 for e in list(self.events) if e.pid in live)

    def worker_pids(self) -> list[int]:
        """Worker pids known without touching /proc: tags, torch's iterator, SPDL's pool."""
        pids = {e.pid for e in self.events[:4096] if e.pid is not None}
        pids |= {int(w.pid) for w in self._worker_procs() if getattr(w, "pid", None)}
        pids.discard(os.getpid())
        return sorted(pids)


def _kill_workers(pids: Iterable[int]) -> int:
    """SIGKILL the given workers if they are still our children. Returns how many."""
    me = os.getpid()
    n = 0
    for pid in pids:
        with contextlib.suppress(psutil.Error, ProcessLookupError, PermissionError):  # a worker gone already
            p = psutil.Process(pid)
            if p.ppid() == me and p.status() != psutil.STATUS_ZOMBIE:
                os.kill(pid, signal.SIGKILL)
                n += 1
    return n


def _teardown(cons: _Consumer, hung: bool) -> list[str]:
    """Stop the consumer and make sure no worker of this point survives it."""
    notes: list[str] = []
    if cons.mirror is not None and cons.cid is not None:
        cons.mirror.close(cons.cid)
        cons.cid = cons.gate.cid = None
    cons.stop_requested = True
    cons.gate.set()  # a consumer waiting for its turn wakes up to stop
    ctl = cons.control
    if ctl is not None:
        ctl.end()
    known = set(cons.worker_pids())
    cons.join(0.3 if hung else 15.0)
    if cons.is_alive():
        known |= set(cons.worker_pids())
        if _kill_workers(known):
            notes.append("hung workers killed")
        # torch checks worker liveness every 5 s while it waits for a batch
        cons.join(8.0)
    if cons.is_alive():
        notes.append(
            "the loading thread is still blocked"
            + (" (num_workers=0 loads in this process: it cannot be killed)" if cons.knobs.num_workers == 0 else "")
            + "; later points may be perturbed"
        )
    if _kill_workers(known):
        notes.append("leftover workers killed")

    multiprocessing.active_children()  # reaps the children that exited
    return notes
