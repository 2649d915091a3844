"""One loader setting measured: the protocol behind every loader point.

A data loader is measured the way a training loop uses it: a fresh loader per
setting, iterated by a consumer that takes batches as fast as they come. The
protocol, and why each step is there:

1. Build the loader and call ``iter()`` in a consumer thread. The thread, not the
   caller, blocks on ``next()``: a hung worker (or a hung ``__getitem__`` with
   ``num_workers=0``) can then be timed out and torn down instead of hanging the
   sweep.
2. Warm up until every worker process has delivered a batch. Batches carry the
   pid of the process that collated them out of band (the collate function is
   wrapped; the user's batch is untouched), so "every worker started" is
   observed, not assumed.
3. Time a window over inter-arrival times: a batch arrives at one instant, so
   throughput is samples over the span between arrivals (no counting error of a
   whole batch at the window edges). In-order delivery makes arrivals come in
   rounds of the workers, so the span covers whole rounds (:func:`window_rate`),
   and the interval comes from batch means over consecutive groups of whole
   rounds.
4. After the window: CPU counters of main process + workers (explicit pids,
   never a scan of /proc during the window), then PSS/USS of the same processes
   while the workers are alive.
5. The epoch boundary: the measured epoch is ended on purpose (the sampler is
   wrapped), then short epochs follow; the stall is the time from the last batch
   of one epoch to the first batch of the next, with this point's
   ``persistent_workers`` setting.
6. Tear down: ``_shutdown_workers()`` (torch) or closing the generator (SPDL),
   then SIGKILL for any worker of ours still alive.
"""

from __future__ import annotations

import datetime as _dt
import logging
import math
import os
import signal
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple

from stagebench._numbers import num
from stagebench.core._mirror import MirroredGate, Ready, mirror
from stagebench.core._sizes import approx_nbytes
from stagebench.loader._config import LoaderFactory, LoaderSweepConfig
from stagebench.loader._mirror import WHAT, knobs_json
from stagebench.model._knobs import LoaderKnobs
from stagebench.model._ranks import HostRate, WindowShare
from stagebench.runs._knobs import normalize_knobs

__all__ = [
    "BatchTag",
    "TaggedCollate",
    "TimedInit",
    "startup_split",
    "EpochControl",
    "BuiltLoader",
    "shut_down",
    "measure_loader_point",
    "timed_window",
    "Window",
    "window_rate",
    "workers_beyond_cores_unwarned",
]

_POLL_S = 0.005


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
            try:
                info = torch.utils.data.get_worker_info()
                worker = -1 if info is None else int(info.id)
                threads = int(torch.get_num_threads())
            except Exception:
                pass
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


class _Event(NamedTuple):
    t: float
    epoch: int
    pid: int | None
    n: int | None
    threads: int
    worker: int = -1
    born: tuple[float | None, float | None, float | None, float] | None = None


def _cuda_available() -> bool:
    torch: Any = sys.modules.get("torch")
    if torch is None:
        try:
            import torch
        except ImportError:
            return False
    try:
        return bool(torch.cuda.is_available())
    except Exception:
        return False


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
    is_crash = crash or any(m in message for m in _CRASH_MARKERS)
    if exc is not None:
        from concurrent.futures.process import BrokenProcessPool

        is_crash = is_crash or isinstance(exc, BrokenProcessPool)
    if is_crash:
        killed = any(m in message for m in ("Killed", "SIGKILL", "signal: 9", "terminated abruptly"))
        hint = " (out of memory? the kernel's OOM killer sends SIGKILL)" if killed else ""
        return "crashed", f"a worker process died: {message}{hint}"[:400]
    return "failed", f"the loader raised: {message}"[:400]


def shut_down(it: Any, built: BuiltLoader | None) -> None:
    """Stop a loader's iterator and its workers, then the factory's own clean-up; never raises."""
    try:
        if it is not None:
            shutdown = getattr(it, "_shutdown_workers", None)
            if callable(shutdown):
                shutdown()
            elif callable(getattr(it, "close", None)):
                it.close()  # a generator (SPDL): leaves its pipeline and process pool
    except BaseException:  # teardown of a broken loader must not raise
        pass
    try:
        if built is not None and built.close is not None:
            built.close()
    except BaseException:  # teardown of a broken loader must not raise
        pass


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
            self.cid = self.mirror.open(WHAT, knobs=knobs_json(self.knobs), warmup_s=self.warmup_s)
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
            try:
                procs += list((getattr(frame.f_locals.get("executor"), "_processes", None) or {}).values())
            except Exception:
                pass
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
        me = os.getpid()
        pids = {e.pid for e in self.events[:4096] if e.pid is not None and e.pid != me}
        for w in self._worker_procs():
            pid = getattr(w, "pid", None)
            if pid:
                pids.add(int(pid))
        pids.discard(me)
        return sorted(pids)


def _kill_workers(pids: Iterable[int]) -> int:
    """SIGKILL the given workers if they are still our children. Returns how many."""
    import psutil

    me = os.getpid()
    n = 0
    for pid in pids:
        try:
            p = psutil.Process(pid)
            if p.ppid() != me or p.status() == psutil.STATUS_ZOMBIE:
                continue
            os.kill(pid, signal.SIGKILL)
            n += 1
        except (psutil.Error, ProcessLookupError, PermissionError):
            continue
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
    import multiprocessing

    multiprocessing.active_children()  # reaps the children that exited
    return notes


def _empty_row(name: str, backend: str, eff: LoaderKnobs, shown: dict, phase: str, notes: list[str]) -> dict[str, Any]:
    from stagebench.runs._schema import LOADER_COLUMNS

    row: dict[str, Any] = {c: math.nan for c in LOADER_COLUMNS}
    row.update(
        loader=name,
        backend=backend,
        num_workers=eff.num_workers,
        prefetch_factor=eff.prefetch_factor if eff.prefetch_factor is not None else math.nan,
        persistent_workers=shown["persistent_workers"],
        pin_memory=shown["pin_memory"],
        status="ok",
        reason="",
        search_phase=phase,
        notes="; ".join(notes),
        workers_seen=0,
        started_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds"),
    )
    return row


def _add_note(row: dict[str, Any], note: str) -> None:
    row["notes"] = f"{row['notes']}; {note}" if row.get("notes") else note


def measure_loader_point(
    factory: LoaderFactory,
    knobs: LoaderKnobs,
    *,
    name: str = "loader",
    backend: str = "torch",
    batch_size: int | None = None,
    config: LoaderSweepConfig | None = None,
    phase: str = "",
    cuda: bool | None = None,
    stall: bool | None = None,
    throughput: bool = True,
    cannot_matter_below: float | None = None,
    during: Callable[[Any], None] | None = None,
) -> dict[str, Any]:
    """Measure one loader setting on a fresh loader; returns one row (:data:`LOADER_COLUMNS`).

    ``stall``: measure the epoch-boundary stall after the window (``None``: as
    ``config.epoch_stall`` says; a search passes where ``stall_at`` wants it). ``throughput=False``: no window, only the
    stall (the search's last step, at its pick). ``cannot_matter_below``: samples/s; a window
    whose interval lies wholly under it closes at the minimum (it cannot be the answer). ``during``:
    with ``throughput=False``, called with the warm consumer before the stall (:class:`_Plan`).
    Never raises for the loader's own faults (a raising or dying worker, a hang):
    they become ``status``/``reason``. ``KeyboardInterrupt`` propagates after
    the loader and its workers are torn down.
    """
    cfg = config or LoaderSweepConfig()
    cuda = _cuda_available() if cuda is None else cuda
    if stall is None:
        stall = cfg.epoch_stall
    eff, shown, notes = normalize_knobs(knobs, backend, cuda=cuda)
    row = _empty_row(name, backend, eff, shown, phase, notes)
    t_begin = time.perf_counter()
    deadline = t_begin + cfg.timeout_s
    errors = _SpdlErrors()
    cons = _Consumer(factory, eff, cfg.warmup_s)
    errors.attach()
    outcome = None
    hung = False
    plan = _Plan(stall=stall, throughput=throughput, batch_size=batch_size, floor=cannot_matter_below, during=during)
    with _quiet_sigchld():
        try:
            cons.start()
            outcome, hung = _supervise(cons, eff, cfg, deadline, row, errors, plan)
        except KeyboardInterrupt:
            _teardown(cons, hung=True)
            errors.detach()
            raise
        t_down = time.perf_counter()
        try:
            for note in _teardown(cons, hung=hung):
                _add_note(row, note)
        finally:
            errors.detach()
        row["teardown_s"] = time.perf_counter() - t_down
    if row["status"] == "ok":  # a fault during the epoch-stall phase (the consumer's, or SPDL's)
        _failed(cons, errors, row)
    _fill(row, cons, outcome, eff, batch_size, cfg)
    row["elapsed_s"] = time.perf_counter() - t_begin
    return row


@contextmanager
def workers_beyond_cores_unwarned() -> Iterator[None]:
    """Silence torch's warning that num_workers exceeds the cores ("might get DataLoader running slow or
    even freeze"), which it gives when a DataLoader is built and again each time it is iterated: the
    sweep and the job runs go there on purpose, measure what it costs, and say so in their findings."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=r"This DataLoader will create \d+ worker processes", category=UserWarning
        )
        yield


@contextmanager
def _quiet_sigchld() -> Iterator[None]:
    """Keep torch's SIGCHLD handler from raising in the main thread during a point.

    Once any DataLoader iterator was created on the main thread, torch keeps a
    process-wide SIGCHLD handler that raises ``RuntimeError: DataLoader worker
    ... is killed`` wherever the main thread happens to be (here: in the
    supervisor's sleep, or its teardown). The sweep detects dead workers itself
    and records the point as crashed, so the handler is set aside meanwhile.
    """
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGCHLD"):
        yield
        return
    previous = signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGCHLD, previous)


def _failure(cons: _Consumer, errors: _SpdlErrors, check_workers: bool = False) -> tuple[str, str] | None:
    if cons.error is not None:
        return cons.error
    if errors.records:
        return _classify(errors.records[0])
    if check_workers:
        dead = cons.dead_worker()
        if dead:
            return _classify(dead, crash=True)
    return None


def _failed(cons: _Consumer, errors: _SpdlErrors, row: dict[str, Any], *, check_workers: bool = False) -> bool:
    """Whether the loader has failed (:func:`_failure`); where it has, ``row``'s status and reason say how."""
    fail = _failure(cons, errors, check_workers=check_workers)
    if fail:
        row["status"], row["reason"] = fail
    return fail is not None


class Window(NamedTuple):
    """A steady-state window: when it opened and closed, the process tree's CPU and I/O at each end
    (:class:`stagebench.core._resources.TreeSnapshot`: every rank's processes in a ranked sweep), and the
    memory read as it closed (MB: ``main``, ``pss``, ``uss``, ``workers``: this rank's)."""

    t0: float
    t1: float
    opened: Any
    closed: Any
    memory_mb: dict[str, float]
    #: a ranked sweep: each other rank's share of the same window (:func:`window_share`), by local rank; ()
    #: on one rank
    others: tuple[WindowShare | None, ...] = ()
    #: a ranked sweep: the slices every rank's share is cut into
    slices: int = 0


class _Plan(NamedTuple):
    """What one point measures besides its warm-up (:func:`measure_loader_point`)."""

    stall: bool
    throughput: bool
    batch_size: int | None
    floor: float | None
    #: Called with the warm consumer before the stall (a stall-only point): the memory pass at the pick
    #: rides on the workers the stall starts anyway (:func:`stagebench.loader._costs.memory_pass`).
    during: Callable[[Any], None] | None = None
    #: A window in turns: it closes at its shortest (``min_window_s``, ``min_batches`` and three rounds of the
    #: workers) wherever ``precision`` may close a window at all (:func:`stagebench.loader._turns.run_turns`).
    shortest: bool = False


#: Seconds between two checks of a window's interval (each reads the arrivals so far).
_CHECK_S = 0.05


def _polls(cons: _Consumer, errors: _SpdlErrors, row: dict[str, Any], *, check_workers_every: int) -> Iterator[float]:
    """The time at each poll of a warm-up or a window, until the loader fails (:func:`_failed` puts its
    status and reason in ``row``, and the polls end). Its worker processes are checked every
    ``check_workers_every`` polls (reading each one's state costs more than a poll)."""
    polls = 0
    while True:
        now = time.perf_counter()
        polls += 1
        if _failed(cons, errors, row, check_workers=polls % check_workers_every == 0):
            return
        yield now


def _supervise(cons, eff, cfg, deadline, row, errors, plan: _Plan):
    """Warm-up, window, memory, epoch stall. Returns (outcome or None, hung)."""
    expected = max(1, eff.num_workers)
    t_start = time.perf_counter()
    seen: set = set()
    scanned = 0
    # --- warm-up: every worker delivered, and the minimum time passed
    for now in _polls(cons, errors, row, check_workers_every=20):
        if cons.finished:
            row.update(status="failed", reason="the loader ended before warm-up was over (an empty dataset?)")
            return None, False
        ev = cons.events
        n = len(ev)
        for e in ev[scanned:n]:
            if e.epoch == 0:
                seen.add(e.pid if e.pid is not None else scanned)
            scanned += 1
        # untagged batches: count arrivals (torch delivers in order, round-robin)
        all_seen = len(seen) >= expected
        if all_seen and math.isnan(row["startup_s"]):
            row["startup_s"] = now - cons.t_begin  # built, started, every worker delivered
        warm = cfg.warmup_s if plan.throughput else 0.0  # the stall alone needs no steady state
        if n >= 2 and now - t_start >= warm and (all_seen or n >= 4 * expected + 2) and cons.others_ready():
            if not all_seen:
                _add_note(row, f"only {len(seen)} of {expected} workers delivered during warm-up")
                row["startup_s"] = now - cons.t_begin
            row["warmup_s"] = now - cons.t_begin - row["startup_s"]
            break
        if now >= deadline:
            row.update(
                status="timeout",
                reason=f"no steady state within {cfg.timeout_s:g}s: {n} batch(es) arrived, "
                f"{len(seen)} of {expected} workers delivered (a hung worker or a very slow start)",
            )
            return None, True
        time.sleep(_POLL_S)
    else:  # the loader failed (its status and reason are in the row)
        return None, False
    row["workers_seen"] = len(seen) if cons.events and cons.events[0].pid is not None else math.nan

    if not plan.throughput:  # the stall only (the search's pick): no window
        if plan.during is not None:
            plan.during(cons)
        hung = plan.stall and _measure_stall(cons, eff, cfg, deadline, row, errors, time.perf_counter())
        return None, hung

    outcome, hung = timed_window(cons, eff, cfg, deadline, row, errors, plan)
    if outcome is None:
        return None, hung
    # --- epoch stall
    return outcome, plan.stall and _measure_stall(cons, eff, cfg, deadline, row, errors, outcome.t1)


def timed_window(cons, eff, cfg, deadline, row, errors, plan: _Plan):
    """One steady-state window of ``cons``'s arrivals, then its CPU and memory. Returns (the
    :class:`Window` or None, hung).

    It closes once its interval is within ``cfg.precision`` (after ``cfg.min_window_s``; a window in turns,
    ``plan.shortest``, once it has an interval at all after ``cfg.turn_window_s``), or once the interval lies wholly under ``plan.floor``
    (it cannot be the answer), or at ``cfg.budget_s``.
    """
    from stagebench.core._resources import TreeSnapshot, tree_memory_mb

    mirror = cons.mirror if cons.cid is not None else None
    t0 = time.perf_counter()
    i0 = len(cons.events)
    # a ranked sweep: the host's cores, every rank's processes (one host: the leader reads them itself)
    pids = cons.worker_pids() + ([] if mirror is None else mirror.processes + cons.others_pids)
    snap0 = TreeSnapshot.take(pids, opening=True)
    min_gaps = max(cfg.min_batches, 3 * max(2, eff.num_workers))
    # a window in turns: at least the turn's window, whatever its precision or the search's budget (one
    # round's ratio must outlast the host's stalls)
    end = t0 + (max(cfg.budget_s, cfg.turn_window_s) if plan.shortest else cfg.budget_s)
    reserve = min(5.0, 0.1 * cfg.timeout_s)
    next_check = t0 + (max(cfg.min_window_s, cfg.turn_window_s) if plan.shortest else cfg.min_window_s)

    def enough(got: int) -> bool:
        """This rank's window holds what timing it needs, and (asked only then) every other rank's too."""
        return got >= min_gaps and (mirror is None or min(mirror.counts(cons.cid, t0)) > min_gaps)

    for now in _polls(cons, errors, row, check_workers_every=5):
        got = len(cons.events) - i0 - 1
        if now >= end and enough(got):
            break
        if got >= min_gaps and now >= next_check and (cfg.precision > 0 or plan.floor):
            next_check = now + _CHECK_S
            if _settled(cons.events, t0, now, eff, cfg, plan) and enough(got):
                break
        if now >= deadline - reserve:
            last = cons.events[-1].t if cons.events else t0
            if got < 1 or now - last > max(1.0, 0.5 * (now - t0)):
                row.update(
                    status="timeout", reason=f"the loader stalled: no batch for {now - last:.1f}s (a hung worker?)"
                )
                return None, True
            _add_note(row, f"window cut at the point's deadline after {got} batches")
            break
        time.sleep(min(0.02, max(0.0, end - now)) or _POLL_S)
    else:  # the loader failed (its status and reason are in the row)
        return None, False
    t1 = time.perf_counter()
    snap1 = TreeSnapshot.take(pids)
    # memory, read while the workers are alive and the window is closed
    mem = tree_memory_mb(cons.worker_pids())
    others: tuple[WindowShare | None, ...] = ()
    slices = 0
    if mirror is not None:  # each other rank's share of this same window, cut as this rank's will be
        rnd = max(1, eff.num_workers)
        slices = share_slices(cons.events, t0, t1, rnd=rnd, max_groups=cfg.max_groups)
        got_rates, failed = mirror.rates(
            cons.cid, t0, t1, {"rnd": rnd, "batch_size": plan.batch_size, "slices": slices}
        )
        if failed is not None:  # a rank's loader failed during the window: the host has no figure for it
            row["status"], row["reason"] = failed
            return None, False
        others = tuple(WindowShare.from_json(d) for d in got_rates)
    return Window(t0, t1, snap0, snap1, mem, others, slices), False


def _settled(
    events: Sequence[_Event], t0: float, now: float, eff: LoaderKnobs, cfg: LoaderSweepConfig, plan: _Plan
) -> bool:
    """Whether the window may close now: its interval within ``cfg.precision``, or wholly under the floor."""
    got = window_rate(
        list(events),
        t0,
        now,
        rnd=max(1, eff.num_workers),
        batch_size=plan.batch_size,
        max_groups=cfg.max_groups,
        confidence=cfg.confidence,
    )
    rate, lo, hi = got.get("samples_per_s"), got.get("samples_per_s_low"), got.get("samples_per_s_high")
    if not rate or lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return False
    if cfg.precision > 0 and (plan.shortest or (hi - lo) / 2 <= cfg.precision * rate):
        return True
    return plan.floor is not None and hi < plan.floor


def _measure_stall(cons, eff, cfg, deadline, row, errors, t1) -> bool:
    """Run to epoch boundaries, its seconds in ``row["stall_phase_s"]`` (the point's time split).
    Returns True when the loader hung doing so."""
    t_stall = time.perf_counter()
    try:
        return _run_to_epoch_ends(cons, eff, cfg, deadline, row, errors, t1)
    finally:
        row["stall_phase_s"] = time.perf_counter() - t_stall


def _run_to_epoch_ends(cons, eff, cfg, deadline, row, errors, t1) -> bool:
    ctl = cons.control
    if ctl is not None:
        cons.stall_batches = cfg.stall_epoch_batches or max(4, 2 * eff.num_workers)
        cons.max_epochs = 1 + cfg.stall_epochs
        ctl.end()
        while not cons.finished:
            if _failure(cons, errors):
                return False
            if time.perf_counter() >= deadline:
                last = cons.events[-1].t if cons.events else t1
                _add_note(row, "epoch stall not measured: the epochs did not end before the point's deadline")
                if time.perf_counter() - last > 1.0:
                    row.update(
                        status="timeout",
                        reason=f"the loader stalled at an epoch end: no batch for {time.perf_counter() - last:.1f}s",
                    )
                    return True
                return False
            time.sleep(0.01)
        return False
    # No epoch control: wait for a natural boundary if one is near.
    start_epoch = cons.events[-1].epoch if cons.events else 0
    wait = cfg.stall_wait_s
    try:
        per_epoch = len(cons.loader)
        in_epoch = sum(1 for e in cons.events if e.epoch == start_epoch)
        rate = _rough_batch_rate(cons.events)
        if rate > 0:
            est = max(0, per_epoch - in_epoch) / rate
            if est > wait:
                _add_note(row, f"epoch stall not measured: the epoch ends in about {est:.0f}s (> stall_wait_s)")
                return False
    except TypeError:
        pass
    until = min(deadline, time.perf_counter() + wait)
    while time.perf_counter() < until:
        if _failure(cons, errors) or cons.finished:
            return False
        ev = cons.events
        if ev and ev[-1].epoch > start_epoch:
            return False
        time.sleep(0.01)
    if not any(e.epoch > 0 for e in cons.events):
        _add_note(row, f"epoch stall not measured: no epoch ended within {wait:g}s")
    return False


def _rough_batch_rate(events: list[_Event]) -> float:
    tail = events[-50:]
    if len(tail) < 2 or tail[-1].t <= tail[0].t:
        return 0.0
    return (len(tail) - 1) / (tail[-1].t - tail[0].t)


def window_rate(
    events: Sequence[_Event],
    t0: float,
    t1: float,
    *,
    rnd: int,
    batch_size: int | None,
    max_groups: int,
    confidence: float,
) -> dict[str, Any]:
    """Throughput and its interval from the arrivals inside [t0, t1], over whole rounds of the workers.

    Torch delivers batches in order, worker by worker, so with ``rnd`` workers of
    equal speed the arrivals come in clumps of ``rnd``: a window that opens on a
    clump's first arrival and closes on a clump's last spans one round less
    than the batches it counts. Counting over ``rnd``-multiples of gaps (batch
    j to batch j + m*rnd: the same worker, m of its periods apart) removes that
    edge: 4 workers sleeping 40 ms a batch read 8% high over a 0.4 s window
    when the span ran clump to clump. The batch-means groups are whole rounds
    too. Returns ``n_batches``, ``n_samples``, ``samples_per_s``,
    ``batches_per_s`` and, with two groups or more, ``cv``,
    ``samples_per_s_low`` / ``samples_per_s_high``; an empty dict when no gap
    lies in the window.
    """
    import numpy as np

    gaps: list[float] = []
    samples: list[float] = []
    k_in_epoch = 0
    prev = None
    for e in events:
        k_in_epoch = 0 if prev is None or e.epoch != prev.epoch else k_in_epoch + 1
        # After an epoch restart all workers deliver at once: skip the first round.
        if (
            prev is not None
            and prev.t >= t0
            and e.t <= t1
            and e.epoch == prev.epoch
            and (e.epoch == 0 or k_in_epoch >= rnd)
        ):
            gaps.append(e.t - prev.t)
            n_batch = e.n if e.n is not None else batch_size
            samples.append(float(n_batch) if n_batch is not None else math.nan)
        prev = e
    rounds = len(gaps) // rnd
    nb = rounds * rnd if rounds else len(gaps)  # fewer gaps than a round: all of them (min_gaps prevents it)
    g = np.asarray(gaps[:nb], dtype=float)
    s = np.asarray(samples[:nb], dtype=float)
    span = float(g.sum())
    if nb == 0 or span <= 0:
        return {}
    n = float(s.sum())
    # seconds per sample: the rate is its inverse, so the inverted bounds bracket the rate exactly
    spi = span / n if n > 0 else math.inf
    out: dict[str, Any] = {
        "n_batches": nb,
        "n_samples": n,
        "samples_per_s": 1.0 / spi if n > 0 else n,
        "batches_per_s": nb / span,
    }
    # Batch means over consecutive groups of whole rounds: each group's rate, and the interval around the
    # pooled rate on the log scale (stagebench.model._rate.Rate.around: it stays positive and finite)
    k = min(max_groups, nb // max(2, rnd))
    if k >= 2 and np.isfinite(s).all():
        from stagebench.model._rate import Rate

        parts = [np.arange(r[0] * rnd, (r[-1] + 1) * rnd) for r in np.array_split(np.arange(rounds), k)]
        per = [float(s[p].sum() / g[p].sum()) for p in parts if g[p].sum() > 0 and s[p].sum() > 0]
        mean = sum(per) / len(per) if per else math.nan
        if len(per) >= 2 and mean > 0:
            out["cv"] = float(np.std(per, ddof=1)) / mean
            r = Rate.around(out["samples_per_s"], per, confidence)
            if r.low is not None and r.high is not None:
                out["samples_per_s_low"], out["samples_per_s_high"] = r.low, r.high
    return out


def share_slices(events: Sequence[_Event], t0: float, t1: float, *, rnd: int, max_groups: int) -> int:
    """How many slices a ranked window is cut into (every rank's share the same): as many as this rank's
    arrivals in it hold two rounds of its workers each, at most ``max_groups``; 1 (no interval) below two."""
    arrivals = sum(1 for e in events if t0 <= e.t <= t1)
    return max(1, min(max_groups, arrivals // (2 * max(1, rnd))))


def window_share(
    events: Sequence[_Event], t0: float, t1: float, now: float, *, rnd: int, batch_size: int | None, slices: int
) -> WindowShare:
    """This rank's share of a ranked window [t0, t1] cut into ``slices`` equal slices (the host's rate
    sums every rank's: :meth:`stagebench.model._ranks.HostRate.over_window`).

    Each arrival's batch is spread over the gap before it, so a slice holds the part of each gap that falls
    in it, and counts those seconds. The gaps :func:`window_rate` leaves out (an epoch's restart, its first
    round) count neither samples nor seconds. The gap after the last arrival, still open at ``now`` (when
    this is asked, after the window closed), counts as one batch arriving ``now``: a rank stalled at the
    window's end is counted so, not left out.
    """
    n_slices = max(1, slices)
    width = (t1 - t0) / n_slices
    samples = [0.0] * n_slices
    seconds = [0.0] * n_slices

    def spread(a: float, b: float, n: float) -> None:
        lo, hi = max(a, t0), min(b, t1)
        if hi <= lo or b <= a:
            return
        first, last = int((lo - t0) // width), min(n_slices - 1, int((hi - t0) // width))
        for i in range(max(0, first), last + 1):
            s0 = t0 + i * width
            part = max(0.0, min(hi, s0 + width) - max(lo, s0))
            samples[i] += n * part / (b - a)
            seconds[i] += part

    prev: _Event | None = None
    k_in_epoch = 0
    for e in events:
        k_in_epoch = 0 if prev is None or e.epoch != prev.epoch else k_in_epoch + 1
        if prev is not None and e.t > t0 and e.epoch == prev.epoch and (e.epoch == 0 or k_in_epoch >= rnd):
            spread(prev.t, e.t, float(e.n if e.n is not None else batch_size or 1))
        if e.t > t1:
            break
        prev = e
    else:
        if prev is not None and prev.t < t1 and now > prev.t:
            spread(prev.t, now, float(prev.n if prev.n is not None else batch_size or 1))
    return WindowShare(tuple(samples), tuple(seconds))


def startup_split(events: Sequence[_Event], t_iter: float, wall_offset: float) -> dict[str, float]:
    """Where the time to each worker's first batch went, from the stamps on the first batches
    (:class:`TimedInit`, :class:`TaggedCollate`): medians over the workers, and the last worker's start.

    ``workers_start_s``: from ``iter()`` until the worker reached its ``worker_init_fn``, in two parts:
    ``workers_created_s``, until its process was created (the main process starting the workers before
    it: under spawn or forkserver it pickles the dataset for each and hands it over, waiting, where the
    copy does not fit the pipe, until that worker has read it), and ``worker_boot_s``, from there (the
    process's own imports, and loading the dataset shipped to it); ``worker_init_s``: the user's
    ``worker_init_fn``; ``first_batch_work_s``: fetching and collating its first batch (torch sends no
    index before every worker has started: a wait for the others is in it); ``first_delivery_s``: from
    there to the batch reaching the loop. Empty without stamps (no workers).
    """
    import statistics

    if not math.isfinite(t_iter):
        return {}
    start = t_iter + wall_offset
    born = [(e.born, e.t + wall_offset) for e in events[:4096] if e.epoch == 0 and e.born is not None]
    if not born:
        return {}
    out = {"first_delivery_s": statistics.median(max(0.0, t - b[3]) for b, t in born)}
    if all(b[1] is not None and b[2] is not None for b, _ in born):
        starts = [num(b[1]) - start for b, _ in born]
        out.update(
            workers_start_s=statistics.median(starts),
            workers_start_last_s=max(starts),
            worker_init_s=statistics.median(num(b[2]) - num(b[1]) for b, _ in born),
            first_batch_work_s=statistics.median(b[3] - num(b[2]) for b, _ in born),
        )
    created = [(b[0], b[1], b[3]) for b, _ in born if b[0] is not None]
    if len(created) < len(born):
        return out
    # a worker's creation read to the kernel's tick: never below iter()
    out["workers_created_s"] = statistics.median(max(0.0, c - start) for c, _, _ in created)
    if "workers_start_s" in out:
        out["worker_boot_s"] = statistics.median(num(i) - max(c, start) for c, i, _ in created)
    else:  # no worker_init_fn to time by: from its creation to its first batch, whole
        out["worker_unsplit_s"] = statistics.median(d - max(c, start) for c, _, d in created)
    return out


def _host_figures(
    row: dict[str, Any], mine: WindowShare, others: tuple[WindowShare | None, ...], confidence: float
) -> None:
    """A ranked window's row: ``samples_per_s`` and its interval are the host's (the sum over its ranks of
    their shares of the window, :meth:`stagebench.model._ranks.HostRate.over_window`), with the slowest and
    fastest rank's beside them."""
    rates = HostRate.over_window([mine, *others], confidence)
    host = rates.host
    row["ranks"] = len(rates.ranks)
    if host is None or rates.slowest is None or rates.fastest is None:
        missing = [r for r, x in enumerate(rates.ranks) if x is None]
        if row["status"] == "ok":
            row.update(
                status="failed",
                reason=f"local rank(s) {', '.join(map(str, missing))} delivered no batch in the window",
            )
        return
    row["batches_per_s"] = row["batches_per_s"] * host.value / row["samples_per_s"]  # this rank's batch size
    row["samples_per_s"] = host.value
    row["samples_per_s_low"] = math.nan if host.low is None else host.low
    row["samples_per_s_high"] = math.nan if host.high is None else host.high
    row["rank_min_samples_per_s"] = rates.slowest.value
    row["rank_max_samples_per_s"] = rates.fastest.value


def _fill(
    row, cons: _Consumer, outcome: Window | None, eff: LoaderKnobs, batch_size: int | None, cfg: LoaderSweepConfig
) -> None:
    """Throughput, interval, stall, cores and memory from the consumer's events."""
    import numpy as np

    ev = list(cons.events)
    if ev:
        row["time_to_first_batch_s"] = ev[0].t - cons.t_begin
        row.update(startup_split(ev, cons.t_iter, cons.wall_offset))
    me = os.getpid()
    threads = [e.threads for e in ev[:4096] if e.threads >= 0 and (e.pid != me or eff.num_workers == 0)]
    if threads:
        row["worker_threads"] = max(threads)

    # epoch boundaries: last batch of epoch k -> first batch of epoch k+1
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    for e in ev:
        first.setdefault(e.epoch, e.t)
        last[e.epoch] = e.t
    stalls = [first[k] - last[k - 1] for k in sorted(first) if k >= 1 and (k - 1) in last]
    if stalls:
        row["epoch_stall_s"] = float(np.mean(stalls))

    if outcome is None:
        return
    t0, t1, snap0, snap1, mem = outcome.t0, outcome.t1, outcome.opened, outcome.closed, outcome.memory_mb
    window = t1 - t0
    row["window_s"] = window
    got = window_rate(
        ev,
        t0,
        t1,
        rnd=max(1, eff.num_workers),
        batch_size=batch_size,
        max_groups=cfg.max_groups,
        confidence=cfg.confidence,
    )
    row.update(got)
    if not got.get("samples_per_s"):
        if row["status"] == "ok":
            row.update(status="failed", reason="no batches arrived in the steady-state window")
        return
    if outcome.others:
        rnd = max(1, eff.num_workers)
        mine = window_share(ev, t0, t1, time.perf_counter(), rnd=rnd, batch_size=batch_size, slices=outcome.slices)
        _host_figures(row, mine, outcome.others, cfg.confidence)
    row["cores_used"] = snap1.cpu_since(snap0) / window
    row["disk_read_mb_s"] = snap1.read_bytes_since(snap0) / window / 2**20
    row["mem_main_mb"] = mem["main"]
    row["mem_pss_mb"] = mem["pss"]
    row["mem_uss_mb"] = mem["uss"]
    row["mem_workers_mb"] = mem["workers"]
