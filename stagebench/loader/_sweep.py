"""Loader sweeps: which num_workers / prefetch_factor / persistent_workers / pin_memory to use.

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

The search over settings (:func:`run_loader_sweep`) is adaptive by default:
num_workers 0, 1, 2, 4, ... until throughput stops improving beyond noise for two
steps, then prefetch_factor at the best, then persistent_workers and pin_memory
at the recommended setting. A plain grid is available for comparison.
"""

from __future__ import annotations

import datetime as _dt
import itertools
import logging
import math
import os
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

from stagebench._settings import DEMAND_HEADROOM, LOADER_MIN_WINDOW_S, LOADER_WINDOW_S, PRECISION, check
from stagebench.analysis._loader import summarize_loader
from stagebench.core._config import powers_of_two
from stagebench.runs._knobs import KNOWN_BACKENDS, LoaderKnobs, normalize_knobs

__all__ = [
    "LoaderKnobs",
    "LoaderSweepConfig",
    "LoaderFactory",
    "BuiltLoader",
    "EpochControl",
    "TaggedCollate",
    "BatchTag",
    "normalize_knobs",
    "measure_loader_point",
    "window_rate",
    "plan_grid",
    "run_loader_sweep",
    "shut_down",
    "workers_beyond_cores_unwarned",
]

STRATEGIES = ("adaptive", "grid")
_PHASES = (
    "num_workers",
    "prefetch_factor",
    "persistent_workers",
    "pin_memory",
    "grid",
    "user",
    "paired",
    "epoch_stall",
)

_POLL_S = 0.005


# --------------------------------------------------------------------------- knobs


#: A callable that builds a FRESH loader for the given knobs; iterating the loader
#: yields batches (one iteration = one epoch). It may return a :class:`BuiltLoader`
#: to give the measurement epoch control and worker tags.
LoaderFactory = Callable[[LoaderKnobs], Iterable]


@dataclass(frozen=True, slots=True, kw_only=True)
class LoaderSweepConfig:
    """How a loader sweep chooses and measures its points."""

    strategy: str = "adaptive"
    """``adaptive`` (num_workers upwards until no gain, then the other knobs at
    the best) or ``grid`` (every combination)."""

    num_workers: tuple[int, ...] | None = None
    """num_workers levels, ascending. ``None``: 0, 1, 2, 4, ... up to ``max_workers``."""

    max_workers: int | None = None
    """Highest num_workers tried. ``None``: twice the usable cores, because a
    loader that waits (network, disk, sleep) keeps scaling past the core count
    while its workers sit idle; beyond 2x the search costs more than it tells."""

    prefetch_factors: tuple[int, ...] = (1, 2, 4)
    """prefetch_factor values. The num_workers phase uses 2 (torch's default)
    when listed, else the first."""

    persistent_workers: tuple[bool, ...] = (False, True)
    """persistent_workers values (torch only; SPDL's loader has no such knob)."""

    pin_memory: tuple[bool, ...] = (False, True)
    """pin_memory values; ``True`` is measured only where CUDA is available."""

    budget_s: float = LOADER_WINDOW_S
    """Longest steady-state window per point, in seconds. It grows (up to the point's
    timeout) until at least three groups of arrivals fit, so a slow loader never
    gets an interval it has not earned."""

    precision: float = PRECISION
    """Sequential stopping: a window closes, after ``min_window_s``, once its 95% interval is
    within this share of its throughput (the stage points' rule). 0: every window runs
    ``budget_s`` (the protocol before, kept for comparisons)."""

    min_window_s: float = LOADER_MIN_WINDOW_S
    """Shortest window before it may close on precision."""

    stall_at: str = "pick"
    """Where the epoch-boundary stall is measured: ``pick`` (once, at the recommendation, after
    the search: the only decision it enters is persistent_workers there; two short epochs with
    restarting workers cost each point two start-ups) or ``every`` (at every point, as before)."""

    search_prefetch: bool = False
    """Adaptive search: also measure ``prefetch_factors`` at the best num_workers. Off by
    default: a loader measured alone is drained as fast as it delivers, so a deeper queue has
    nothing to smooth (on the 16-core H200 host, prefetch 1, 2 and 4 read within each other's
    intervals at 16 and 32 workers, and the pick took the higher noisy number). The search
    keeps the script's own (``yours``), else 2. Its effect on a bursty trainer shows in a job run."""

    yours: LoaderKnobs | None = None
    """The training script's own setting. It is measured after the search, kept where the
    measurements cannot tell it from a cheaper or faster one (the tie-break), and the adaptive
    search measures at its ``prefetch_factor`` and, on a host with a CUDA device, its
    ``pin_memory``: pinning pays off only with the copy to the device, which a loader measured
    alone never makes, so the search could only see its cost; a job run with the user's loop
    judges it (:mod:`stagebench.loader._trainer`)."""

    tie_rounds: int = 2
    """Decisions on evidence: where the pick hinges on two settings whose intervals overlap
    (the cheaper is more than ``within_best`` below the faster, yet inside its noise), both are
    measured again in turns (a round: cheaper, faster, faster, cheaper), up to this many rounds,
    until their ratio separates or is declared a tie. 0: off."""

    warmup_s: float = 0.3
    """Minimum warm-up; the window also waits until every worker delivered."""

    timeout_s: float = 60.0
    """Deadline of one point (build, warm-up, window, epoch stall). A loader that
    delivers nothing by then is recorded as ``timeout`` and torn down."""

    min_batches: int = 8
    """Fewest batches behind a throughput figure (more with many workers)."""

    max_groups: int = 10
    """Batch-means groups for the interval."""

    confidence: float = 0.95
    """Two-sided confidence level of the interval."""

    min_gain: float = 0.05
    """Adaptive search: a step improves only if it beats the best so far by this
    share AND by more than the intervals' half-widths."""

    patience: int = 2
    """Adaptive search: steps without improvement before num_workers stops rising."""

    within_best: float = 0.05
    """Recommendation: cheapest setting within this share of the best throughput."""

    headroom: float = DEMAND_HEADROOM
    """With a target rate: the loader must deliver target x (1 + headroom)."""

    memory_budget_mb: float | None = None
    """PSS of main process + workers allowed. ``None``: the main process's PSS now
    plus ``memory_share`` of the RAM available at the start."""

    memory_share: float = 0.5
    """Share of available RAM the loader may use when ``memory_budget_mb`` is None:
    half leaves room for the model, the optimizer, a CUDA context and page cache."""

    epoch_stall: bool = True
    """Measure the stall at an epoch boundary (short extra epochs per point)."""

    stall_epochs: int = 1
    """Short epochs after the measured one: boundaries behind the stall figure. One: a restart's
    cost varies little between boundaries, and each costs a start-up of the workers (it was 2)."""

    stall_epoch_batches: int | None = None
    """Batches in a short epoch. ``None``: max(4, 2 x num_workers)."""

    stall_wait_s: float = 5.0
    """Loaders without epoch control: longest wait for a natural epoch boundary."""

    transforms: bool = True
    """Measure each transform of a composed ``dataset.transform`` as a stage."""

    transform_items: int = 16
    """Cached inputs per transform."""

    transform_budget_s: float = 0.5
    """Window per transform point."""

    transform_max_concurrency: int | None = None
    """Highest concurrency for transforms. ``None``: the usable cores."""

    transform_executors: tuple[str, ...] = ("thread", "process")
    """Executors for transforms: threads against processes is the GIL evidence;
    process points cost a pool start each (seconds on a busy machine)."""

    extra_points: tuple[LoaderKnobs, ...] = ()
    """Settings measured after the search (e.g. the script's own setting)."""

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy: unknown {self.strategy!r}; allowed: {', '.join(STRATEGIES)}")
        if self.num_workers is not None:
            nw = tuple(self.num_workers)
            if not nw or any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in nw):
                raise ValueError(f"num_workers must be integers >= 0, got {self.num_workers!r}")
            if list(nw) != sorted(set(nw)):
                raise ValueError(f"num_workers must be ascending and distinct, got {self.num_workers!r}")
        if self.max_workers is not None and (not isinstance(self.max_workers, int) or self.max_workers < 1):
            raise ValueError(f"max_workers must be None or an integer >= 1, got {self.max_workers!r}")
        if not self.prefetch_factors or any(
            isinstance(p, bool) or not isinstance(p, int) or p < 1 for p in self.prefetch_factors
        ):
            raise ValueError(f"prefetch_factors must be integers >= 1, got {self.prefetch_factors!r}")
        for key in ("persistent_workers", "pin_memory"):
            vals = getattr(self, key)
            if not vals or any(not isinstance(v, bool) for v in vals):
                raise ValueError(f"{key} must be a non-empty tuple of True/False, got {vals!r}")
        check("budget_s", self.budget_s, "budget_s")
        check("warmup_s", self.warmup_s, "warmup_s")
        check("precision", self.precision, "precision")
        if not 0 < self.min_window_s <= self.budget_s:
            raise ValueError(f"min_window_s must be in (0, budget_s={self.budget_s:g}], got {self.min_window_s}")
        if self.stall_at not in ("pick", "every"):
            raise ValueError(f"stall_at: unknown {self.stall_at!r}; allowed: pick, every")
        if self.yours is not None and not isinstance(self.yours, LoaderKnobs):
            raise ValueError(f"yours must be None or LoaderKnobs, got {type(self.yours).__name__}")
        if isinstance(self.tie_rounds, bool) or not isinstance(self.tie_rounds, int) or self.tie_rounds < 0:
            raise ValueError(f"tie_rounds must be an integer >= 0, got {self.tie_rounds!r}")
        if not self.timeout_s > self.budget_s + self.warmup_s:
            raise ValueError(
                f"timeout_s ({self.timeout_s}) must be larger than budget_s + warmup_s "
                f"({self.budget_s + self.warmup_s})"
            )
        if self.min_batches < 2:
            raise ValueError(f"min_batches must be >= 2, got {self.min_batches}")
        if self.max_groups < 2:
            raise ValueError(f"max_groups must be >= 2, got {self.max_groups}")
        if not 0.5 < self.confidence < 1:
            raise ValueError(f"confidence must be in (0.5, 1), got {self.confidence}")
        for key in ("min_gain", "within_best", "headroom"):
            v = getattr(self, key)
            if not 0 <= v < 1:
                raise ValueError(f"{key} must be in [0, 1), got {v}")
        if self.patience < 1:
            raise ValueError(f"patience must be >= 1, got {self.patience}")
        if self.memory_budget_mb is not None and not self.memory_budget_mb > 0:
            raise ValueError(f"memory_budget_mb must be None or > 0, got {self.memory_budget_mb}")
        if not 0 < self.memory_share <= 1:
            raise ValueError(f"memory_share must be in (0, 1], got {self.memory_share}")
        if self.stall_epochs < 1:
            raise ValueError(f"stall_epochs must be >= 1, got {self.stall_epochs}")
        if self.stall_epoch_batches is not None and self.stall_epoch_batches < 1:
            raise ValueError(f"stall_epoch_batches must be None or >= 1, got {self.stall_epoch_batches}")
        if self.stall_wait_s < 0:
            raise ValueError(f"stall_wait_s must be >= 0, got {self.stall_wait_s}")
        if self.transform_items < 1:
            raise ValueError(f"transform_items must be >= 1, got {self.transform_items}")
        if not self.transform_budget_s > 0:
            raise ValueError(f"transform_budget_s must be > 0, got {self.transform_budget_s}")
        if self.transform_max_concurrency is not None and self.transform_max_concurrency < 1:
            raise ValueError(f"transform_max_concurrency must be None or >= 1, got {self.transform_max_concurrency}")
        from stagebench.runs._schema import EXECUTORS

        if not self.transform_executors or any(e not in EXECUTORS for e in self.transform_executors):
            raise ValueError(
                f"transform_executors: unknown in {self.transform_executors!r}; allowed: {', '.join(EXECUTORS)}"
            )
        for k in self.extra_points:
            if not isinstance(k, LoaderKnobs):
                raise ValueError(f"extra_points must hold LoaderKnobs, got {type(k).__name__}")

    def default_prefetch(self) -> int:
        if self.yours is not None and self.yours.prefetch_factor is not None:
            return self.yours.prefetch_factor
        return 2 if 2 in self.prefetch_factors else self.prefetch_factors[0]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["extra_points"] = [asdict(k) for k in self.extra_points]
        d["yours"] = asdict(self.yours) if self.yours is not None else None
        return d


# ------------------------------------------------------------ measurement protocol
class BatchTag(NamedTuple):
    """A batch with where it was made, attached by :class:`TaggedCollate`.

    A namedtuple on purpose: torch's pin-memory thread rebuilds namedtuples
    field by field, so ``batch`` is pinned exactly as the user's batch would be.
    """

    batch: Any
    pid: int
    worker: int
    n: int
    threads: int


class TaggedCollate:
    """Wraps the user's collate function; returns a :class:`BatchTag` around its batch.

    Runs where collation runs (the worker), so the tag names the process that
    made the batch and the torch thread count it ran with. The extra work is a
    few attribute reads per batch.
    """

    def __init__(self, collate_fn: Callable, batched: bool) -> None:
        self.collate_fn = collate_fn
        self.batched = batched

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
        return BatchTag(out, os.getpid(), worker, n, threads)


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


def _key(k: LoaderKnobs) -> tuple:
    return (k.num_workers, k.prefetch_factor, k.persistent_workers, k.pin_memory)


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


class _Consumer(threading.Thread):
    """Builds the loader and takes batches as fast as they come, epoch after epoch."""

    def __init__(self, factory: LoaderFactory, knobs: LoaderKnobs) -> None:
        super().__init__(name="stagebench-loader-consumer", daemon=True)
        self.factory = factory
        self.knobs = knobs
        self.events: list[_Event] = []
        self.t_begin = math.nan
        self.built: BuiltLoader | None = None
        self.loader: Any = None
        self.iterator: Any = None
        self.error: tuple[str, str] | None = None
        self.stop_requested = False
        self.max_epochs: int | None = None
        self.stall_batches = 4
        self.finished = False

    @property
    def control(self) -> EpochControl | None:
        return self.built.control if self.built is not None else None

    def run(self) -> None:
        try:
            self.t_begin = time.perf_counter()
            built: Iterable | BuiltLoader = self.factory(self.knobs)
            if not isinstance(built, BuiltLoader):
                built = BuiltLoader(loader=built)
            self.built = built
            self.loader = built.loader
            if built.control is not None:
                built.control.cycle()
            epoch = 0
            events = self.events
            while not self.stop_requested:
                it = iter(self.loader)
                self.iterator = it
                ended = True
                n_before = len(events)
                for batch in it:
                    t = time.perf_counter()
                    if isinstance(batch, BatchTag):
                        events.append(_Event(t, epoch, batch.pid, batch.n, batch.threads))
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
    cons.stop_requested = True
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
) -> dict[str, Any]:
    """Measure one loader setting on a fresh loader; returns one row (:data:`LOADER_COLUMNS`).

    ``stall``: measure the epoch-boundary stall after the window (``None``: as
    ``config.epoch_stall`` says; a search passes where ``stall_at`` wants it). ``throughput=False``: no window, only the
    stall (the search's last step, at its pick). ``cannot_matter_below``: samples/s; a window
    whose interval lies wholly under it closes at the minimum (it cannot be the answer).
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
    cons = _Consumer(factory, eff)
    errors.attach()
    outcome = None
    hung = False
    plan = _Plan(stall=stall, throughput=throughput, batch_size=batch_size, floor=cannot_matter_below)
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
    if row["status"] == "ok" and cons.error is not None:
        row["status"], row["reason"] = cons.error  # raised during the epoch-stall phase
    if row["status"] == "ok" and errors.records:
        row["status"], row["reason"] = _classify(errors.records[0])
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


class _Plan(NamedTuple):
    """What one point measures besides its warm-up (:func:`measure_loader_point`)."""

    stall: bool
    throughput: bool
    batch_size: int | None
    floor: float | None


#: Seconds between two checks of a window's interval (each reads the arrivals so far).
_CHECK_S = 0.05
#: A window whose interval lies wholly under this share of the best so far cannot be the answer.
CANNOT_MATTER = 0.8


def _supervise(cons, eff, cfg, deadline, row, errors, plan: _Plan):
    """Warm-up, window, memory, epoch stall. Returns (outcome or None, hung)."""
    expected = max(1, eff.num_workers)
    t_start = time.perf_counter()
    seen: set = set()
    scanned = 0
    # --- warm-up: every worker delivered, and the minimum time passed
    polls = 0
    while True:
        now = time.perf_counter()
        polls += 1
        fail = _failure(cons, errors, check_workers=polls % 20 == 0)
        if fail:
            row["status"], row["reason"] = fail
            return None, False
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
        if n >= 2 and now - t_start >= warm and (all_seen or n >= 4 * expected + 2):
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
    row["workers_seen"] = len(seen) if cons.events and cons.events[0].pid is not None else math.nan

    from stagebench.core._resources import TreeSnapshot, tree_memory_mb

    if not plan.throughput:  # the stall only (the search's pick): no window
        hung = plan.stall and _measure_stall(cons, eff, cfg, deadline, row, errors, time.perf_counter())
        return None, hung

    # --- window: it closes once its interval is within cfg.precision (after cfg.min_window_s), or once
    # the interval lies wholly under the floor (it cannot be the answer), or at cfg.budget_s
    t0 = time.perf_counter()
    i0 = len(cons.events)
    pids = cons.worker_pids()
    snap0 = TreeSnapshot.take(pids, opening=True)
    min_gaps = max(cfg.min_batches, 3 * max(2, eff.num_workers))
    end = t0 + cfg.budget_s
    reserve = min(5.0, 0.1 * cfg.timeout_s)
    next_check = t0 + cfg.min_window_s
    while True:
        now = time.perf_counter()
        polls += 1
        fail = _failure(cons, errors, check_workers=polls % 5 == 0)
        if fail:
            row["status"], row["reason"] = fail
            return None, False
        got = len(cons.events) - i0 - 1
        if now >= end and got >= min_gaps:
            break
        if got >= min_gaps and now >= next_check and (cfg.precision > 0 or plan.floor):
            next_check = now + _CHECK_S
            if _settled(cons.events, t0, now, eff, cfg, plan):
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
    t1 = time.perf_counter()
    snap1 = TreeSnapshot.take(pids)

    # --- memory, read while the workers are alive and the window is closed
    pids = cons.worker_pids()
    mem = tree_memory_mb(pids)
    outcome = (t0, t1, snap0, snap1, mem)

    # --- epoch stall
    return outcome, plan.stall and _measure_stall(cons, eff, cfg, deadline, row, errors, t1)


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
    if cfg.precision > 0 and (hi - lo) / 2 <= cfg.precision * rate:
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

    from stagebench.core._stats import interval_about

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
    # Batch means on seconds per sample over consecutive groups of whole rounds,
    # centred on span / samples (groups may differ by a round, so their plain
    # mean is not exactly it); inverted, the bounds contain samples / span.
    k = min(max_groups, nb // max(2, rnd))
    if k >= 2 and np.isfinite(s).all():
        parts = [np.arange(r[0] * rnd, (r[-1] + 1) * rnd) for r in np.array_split(np.arange(rounds), k)]
        per = [g[p].sum() / s[p].sum() for p in parts if s[p].sum() > 0]
        lo, hi, cv = interval_about(spi, per, confidence)
        out["cv"] = cv
        if math.isfinite(hi) and hi > 0:
            out["samples_per_s_low"] = 1.0 / hi
        if math.isfinite(lo) and lo > 0:
            out["samples_per_s_high"] = 1.0 / lo
        elif math.isfinite(lo):
            out["samples_per_s_high"] = math.inf
    return out


def _fill(row, cons: _Consumer, outcome, eff: LoaderKnobs, batch_size: int | None, cfg: LoaderSweepConfig) -> None:
    """Throughput, interval, stall, cores and memory from the consumer's events."""
    import numpy as np

    ev = list(cons.events)
    if ev:
        row["time_to_first_batch_s"] = ev[0].t - cons.t_begin
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
    t0, t1, snap0, snap1, mem = outcome
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
    row["cores_used"] = snap1.cpu_since(snap0) / window
    row["disk_read_mb_s"] = snap1.read_bytes_since(snap0) / window / 2**20
    row["mem_main_mb"] = mem["main"]
    row["mem_pss_mb"] = mem["pss"]
    row["mem_uss_mb"] = mem["uss"]
    row["mem_workers_mb"] = mem["workers"]


# ------------------------------------------------------------------------ search
def _levels(cfg: LoaderSweepConfig, backend: str, usable_cores: int) -> tuple[int, ...]:
    if cfg.num_workers is not None:
        levels = tuple(cfg.num_workers)
    else:
        cap = cfg.max_workers or 2 * max(1, usable_cores)
        levels = (0, *powers_of_two(cap))
    if backend == "spdl_pytorch":
        levels = tuple(n for n in levels if n > 0) or (1,)
    return levels


def plan_grid(
    cfg: LoaderSweepConfig, backend: str, *, cuda: bool, usable_cores: int
) -> list[tuple[LoaderKnobs, LoaderKnobs, list[str]]]:
    """Every combination, normalised and de-duplicated: (requested, effective, notes)."""
    pins = cfg.pin_memory if cuda else (False,)
    out: dict[tuple, tuple[LoaderKnobs, LoaderKnobs, list[str]]] = {}
    for nw, pf, pw, pin in itertools.product(
        _levels(cfg, backend, usable_cores), cfg.prefetch_factors, cfg.persistent_workers, pins
    ):
        req = LoaderKnobs(num_workers=nw, prefetch_factor=pf, persistent_workers=pw, pin_memory=pin)
        eff, _, notes = normalize_knobs(req, backend, cuda=cuda)
        if _key(eff) not in out:
            out[_key(eff)] = (req, eff, notes)
    return list(out.values())


def _improves(row: dict, best: dict, min_gain: float) -> bool:
    s, b = row["samples_per_s"], best["samples_per_s"]
    if not (isinstance(s, float) and math.isfinite(s)):
        return False

    def half(r):
        lo, hi = r.get("samples_per_s_low"), r.get("samples_per_s_high")
        if isinstance(lo, float) and isinstance(hi, float) and math.isfinite(lo) and math.isfinite(hi):
            return (hi - lo) / 2
        return 0.0

    return s - b > max(min_gain * b, half(row), half(best))


class _Sweep:
    """Measures points, writes each row as it lands, and never measures one setting twice."""

    def __init__(self, factory, *, name, backend, batch_size, cfg, cuda, writer, progress, epoch_batches=None) -> None:
        self.factory = factory
        self.epoch_batches: int | None = epoch_batches  # batches in an epoch, where the loader says
        self.name = name
        self.backend = backend
        self.batch_size = batch_size
        self.cfg = cfg
        self.cuda = cuda
        self.writer = writer
        self.progress = progress
        self.rows: list[dict[str, Any]] = []
        self.by_key: dict[tuple, dict[str, Any]] = {}

    def point(self, knobs: LoaderKnobs, phase: str, *, again: bool = False, **how: Any) -> dict[str, Any]:
        """Measure a setting once (``again``: measure it anew, as the tie-break does); ``how``: for
        :func:`measure_loader_point` (``stall``, ``throughput``)."""
        eff, _, _ = normalize_knobs(knobs, self.backend, cuda=self.cuda)
        if _key(eff) in self.by_key and not again and how.get("throughput", True):
            return self.by_key[_key(eff)]
        if self.progress is not None:
            self.progress.start(f"{self.name} | {eff.label()}{'' if how.get('throughput', True) else ' (stall)'}")
        row = measure_loader_point(
            self.factory,
            knobs,
            name=self.name,
            backend=self.backend,
            batch_size=self.batch_size,
            config=self.cfg,
            phase=phase,
            cuda=self.cuda,
            cannot_matter_below=self.floor() if phase == "num_workers" else None,
            **{"stall": self.cfg.epoch_stall and self.cfg.stall_at == "every", **how},
        )
        self.rows.append(row)
        if how.get("throughput", True):
            self.by_key.setdefault(_key(eff), row)
        self.writer.write(row)
        if self.progress is not None:
            # the stall point measures the pause at an epoch's start, not a throughput
            rate_key, unit = (
                ("epoch_stall_s", "s pause at each epoch start")
                if phase == "epoch_stall"
                else ("samples_per_s", "samples/s")
            )
            self.progress.done(row, label=f"{self.name} | {self.backend} {eff.label()}", rate_key=rate_key, unit=unit)
        return row

    def floor(self) -> float | None:
        """Samples/s under which a window cannot be the answer (CANNOT_MATTER of the best lower end so far)."""
        lows = [r["samples_per_s_low"] for r in self.rows if _ok(r) and isinstance(r.get("samples_per_s_low"), float)]
        lows = [x for x in lows if math.isfinite(x)]
        return CANNOT_MATTER * max(lows) if lows else None


def _ok(row: dict[str, Any]) -> bool:
    s = row.get("samples_per_s")
    return row.get("status") == "ok" and isinstance(s, float) and math.isfinite(s) and s > 0


def _adaptive(sw: _Sweep, levels: tuple[int, ...], budget_mb: float) -> list[str]:
    """num_workers upwards, then (when asked) prefetch_factor at the best, then the tie-break, then
    the epoch stall at the pick (or, with ``stall_at="every"``, persistence and pinning as before)."""
    from stagebench.analysis._loader import recommend

    cfg = sw.cfg
    stops: list[str] = []
    pf0 = cfg.default_prefetch()
    pin0 = bool(cfg.yours.pin_memory) if sw.cuda and cfg.yours is not None else False
    best: dict[str, Any] | None = None
    last: dict[str, Any] | None = None  # the latest ok point with workers: memory per worker
    stale = 0
    for nw in levels:
        if last is not None:
            # Each worker holds about the same memory (its copy of the dataset
            # object, its batches in flight): predict before forking them.
            predicted = last["mem_main_mb"] + nw * last["mem_workers_mb"] / last["num_workers"]
            if math.isfinite(predicted) and predicted > budget_mb:
                stops.append(
                    f"num_workers stopped before {nw}: about {predicted:,.0f} MB predicted, "
                    f"over the memory budget of {budget_mb:,.0f} MB"
                )
                break
        row = sw.point(
            LoaderKnobs(num_workers=nw, prefetch_factor=pf0 if nw > 0 else None, pin_memory=pin0), "num_workers"
        )
        if row["status"] == "failed":
            stops.append(f"stopped: the loader failed at num_workers={nw} ({row['reason']})")
            return stops
        if row["status"] in ("crashed", "timeout"):
            stops.append(f"num_workers stopped at {nw}: {row['status']}; continuing with fewer workers")
            break
        if not _ok(row):
            continue
        if nw > 0:
            last = row
        if math.isfinite(row["mem_pss_mb"]) and row["mem_pss_mb"] > budget_mb:
            stops.append(
                f"num_workers stopped at {nw}: {row['mem_pss_mb']:,.0f} MB, over the memory budget "
                f"of {budget_mb:,.0f} MB"
            )
            break
        if best is None or _improves(row, best, cfg.min_gain):
            stale = 0
        else:
            stale += 1
        if best is None or row["samples_per_s"] > best["samples_per_s"]:
            best = row
        if stale >= cfg.patience:
            stops.append(f"num_workers stopped at {nw}: no gain beyond noise for {cfg.patience} steps")
            break
    if best is None:
        return stops
    if best["num_workers"] > 0 and (cfg.search_prefetch or cfg.stall_at == "every"):
        for pf in cfg.prefetch_factors:
            sw.point(
                LoaderKnobs(num_workers=best["num_workers"], prefetch_factor=pf, pin_memory=pin0), "prefetch_factor"
            )
    _measure_yours(sw)  # before the tie-break, which may keep the script's own
    _tie_break(sw, budget_mb, cfg.yours)
    rec = recommend(sw.rows, budget_mb=budget_mb, within_best=cfg.within_best)
    if cfg.stall_at == "every":  # the protocol before: persistence measured as a point, then pinning
        if (
            rec is not None
            and rec["num_workers"] > 0
            and sw.backend != "spdl_pytorch"
            and True in cfg.persistent_workers
        ):
            sw.point(
                LoaderKnobs(
                    num_workers=rec["num_workers"], prefetch_factor=_pf(rec), persistent_workers=True, pin_memory=pin0
                ),
                "persistent_workers",
            )
            rec = recommend(sw.rows, budget_mb=budget_mb, within_best=cfg.within_best)
    elif cfg.epoch_stall and rec is not None and rec["num_workers"] > 0:
        # the stall decides one thing, persistent_workers at the pick (analysis/_loader._kept_knobs): measured there
        # alone, once, instead of restarting epochs after every point's window
        knobs = LoaderKnobs(num_workers=rec["num_workers"], prefetch_factor=_pf(rec), pin_memory=pin0)
        sw.point(knobs, "epoch_stall", stall=True, throughput=False)
        if sw.epoch_batches is None and sw.backend != "spdl_pytorch" and True in cfg.persistent_workers:
            # no epoch length to weigh the stall against: what persistent workers save decides instead
            sw.point(replace(knobs, persistent_workers=True), "epoch_stall", stall=True, throughput=False)
    if rec is not None and sw.cuda and True in cfg.pin_memory and cfg.yours is None:
        sw.point(
            LoaderKnobs(
                num_workers=rec["num_workers"],
                prefetch_factor=_pf(rec),
                persistent_workers=rec.get("persistent_workers") is True,
                pin_memory=True,
            ),
            "pin_memory",
        )
    return stops


def _measure_yours(sw: _Sweep) -> None:
    """The extra points asked for and the script's own setting, measured after the search (phase ``user``)."""
    for extra in (*sw.cfg.extra_points, *([sw.cfg.yours] if sw.cfg.yours is not None else [])):
        sw.point(extra, "user")


def _tie_break(sw: _Sweep, budget_mb: float, user: LoaderKnobs | None) -> None:
    """Measure the two settings the pick rests on again, in turns, while they are not told apart.

    Rounds of cheaper, faster, faster, cheaper (:mod:`stagebench.analysis._loader_evidence`), at
    most ``tie_rounds``; the analysis reads the rows (``search_phase`` ``paired``) and pools them.
    """
    from stagebench.analysis._loader import normalize_row, tie_to_break, user_point
    from stagebench.analysis._loader_evidence import paired_verdict, setting_key

    cfg = sw.cfg
    if cfg.tie_rounds <= 0:
        return
    meta_user = _user_meta(user, sw)
    pair = tie_to_break(
        sw.rows,
        budget_mb=budget_mb,
        within_best=cfg.within_best,
        user=user_point([normalize_row(r) for r in sw.rows], meta_user) if meta_user else None,
    )
    if pair is None:
        return
    knobs = [_knobs_of(p) for p in pair]
    keys = [setting_key(p) for p in pair]
    for _ in range(cfg.tie_rounds):
        for k in (knobs[0], knobs[1], knobs[1], knobs[0]):
            sw.point(k, "paired", again=True)
        v = paired_verdict([normalize_row(r) for r in sw.rows], keys[0], keys[1], cfg.within_best)
        if v is not None and v["winner"] != "tie":
            return


def _user_meta(user: LoaderKnobs | None, sw: _Sweep) -> dict[str, Any] | None:
    if user is None:
        return None
    return {
        "loader": {"user_knobs": asdict(user), "backend": sw.backend},
        "settings": {"cuda": sw.cuda},
    }


def _knobs_of(p: dict[str, Any]) -> LoaderKnobs:
    """The knobs of a normalised point."""
    return LoaderKnobs(
        num_workers=int(p["num_workers"]),
        prefetch_factor=_pf(p),
        persistent_workers=p["persistent_workers"] is True,
        pin_memory=p["pin_memory"] is True,
    )


def _pf(row: dict[str, Any]) -> int | None:
    pf = row.get("prefetch_factor")
    return int(pf) if isinstance(pf, (int, float)) and math.isfinite(pf) else None


def _memory_budget(cfg: LoaderSweepConfig) -> float:
    if cfg.memory_budget_mb is not None:
        return float(cfg.memory_budget_mb)
    import psutil

    from stagebench.core._resources import tree_pss_mb

    return tree_pss_mb(()) + cfg.memory_share * psutil.virtual_memory().available / 2**20


def run_loader_sweep(
    factory: LoaderFactory,
    *,
    name: str,
    backend: str,
    batch_size: int,
    run_dir: Path | str,
    config: LoaderSweepConfig | None = None,
    target_rate: float | None = None,
    extra_meta: dict[str, Any] | None = None,
    progress: Any = None,
) -> dict[str, Any]:
    """Sweep a loader's knobs and write the run directory; returns the summary.

    ``factory(knobs)`` must build a fresh loader each call. ``batch_size`` turns
    batches into samples where the batches are not tagged (tagged batches count
    their real samples). ``target_rate``: samples/s the trainer consumes.
    Writes ``run.json`` first, ``results.csv`` row by row, then ``summary.json``
    and ``report.html``. ``KeyboardInterrupt`` propagates after the summary of
    the rows measured so far is written.
    """
    from stagebench.core._progress import Progress
    from stagebench.runs._provenance import collect_provenance
    from stagebench.runs._results import RowWriter, RunDir, read_rows
    from stagebench.runs._schema import LOADER_COLUMNS, RESULTS_SCHEMA_VERSION

    cfg = config or LoaderSweepConfig()
    if not callable(factory):
        raise ValueError(f"factory must be callable (knobs -> a fresh loader), got {type(factory).__name__}")
    if not isinstance(name, str) or not name:
        raise ValueError("name must be a non-empty string")
    if not isinstance(backend, str) or not backend:
        raise ValueError(f"backend must be a non-empty string (known: {', '.join(KNOWN_BACKENDS)})")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    if target_rate is not None and not (isinstance(target_rate, (int, float)) and target_rate > 0):
        raise ValueError(f"target_rate must be None or a number > 0 (samples/s), got {target_rate!r}")

    rd = RunDir.create(run_dir, fresh=True)
    prov = collect_provenance()
    cuda = _cuda_available()
    budget_mb = _memory_budget(cfg)
    usable = int(prov.get("usable_cores") or 1)
    levels = _levels(cfg, backend, usable)
    grid = plan_grid(cfg, backend, cuda=cuda, usable_cores=usable)
    loader_meta: dict[str, Any] = {"name": name, "backend": backend, "batch_size": batch_size}
    meta: dict[str, Any] = {
        "schema_version": RESULTS_SCHEMA_VERSION,
        "kind": "loader",
        "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": list(sys.argv),
        "provenance": prov,
        "settings": {
            **cfg.to_dict(),
            "memory_budget_mb": budget_mb,
            "memory_budget_source": "memory_budget_mb"
            if cfg.memory_budget_mb is not None
            else f"main process PSS + {cfg.memory_share:g} x available RAM at start",
            "cuda": cuda,
            "usable_cores": usable,
            "num_workers_levels": list(levels),
            "full_grid_points": len(grid),
            "target_rate": target_rate,
        },
        "loader": loader_meta,
        "not_isolated": [],
    }
    for k, v in (extra_meta or {}).items():
        if k == "loader" and isinstance(v, dict):
            loader_meta.update(v)
        else:
            meta[k] = v
    rd.write_meta(meta)

    own_progress = progress is None
    if own_progress:
        progress = Progress(desc=f"loader {name}")
    progress.set_total(len(grid) if cfg.strategy == "grid" else len(levels) + len(cfg.prefetch_factors) + 2)
    writer = RowWriter(rd.results_csv, LOADER_COLUMNS)
    sw = _Sweep(
        factory,
        name=name,
        backend=backend,
        batch_size=batch_size,
        cfg=cfg,
        cuda=cuda,
        writer=writer,
        progress=progress,
        epoch_batches=loader_meta.get("epoch_batches"),
    )
    from scipy import special  # noqa: F401 - imported now, not inside the first point's time

    t_search = time.perf_counter()
    stops: list[str] = []
    interrupted = False
    try:
        with workers_beyond_cores_unwarned():
            if cfg.strategy == "grid":
                for req, _eff, _notes in grid:
                    sw.point(req, "grid")
                _measure_yours(sw)
            else:
                stops = _adaptive(sw, levels, budget_mb)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        writer.close()
    seconds = time.perf_counter() - t_search
    meta["search"] = {"strategy": cfg.strategy, "seconds": seconds, "stopped": stops, "interrupted": interrupted}

    if not interrupted and cfg.transforms:
        ds = getattr(factory, "dataset", None)
        if ds is not None:
            from stagebench.loader._transforms import isolate_transforms

            try:
                meta["transforms"] = isolate_transforms(ds, run_dir=rd.path, config=cfg, progress=progress)
            except KeyboardInterrupt:
                interrupted = True
                meta["search"]["interrupted"] = True
    meta["provenance_after"] = collect_provenance()
    rd.write_meta(meta)
    rows = read_rows(rd.results_csv)
    summary = summarize_loader(rows, meta)
    rd.write_summary(summary)
    if not interrupted:
        _write_report(rd.path, progress)
    if own_progress:
        progress.close()
    if interrupted:
        raise KeyboardInterrupt
    return summary


def _write_report(path: Path, progress: Any) -> None:
    try:
        from stagebench.report._render import write_report
    except ImportError:
        progress.message("report.html not written: the report module is not available in this install")
        return
    try:
        write_report(path)
    except Exception as e:  # the rows and summary are already safe on disk
        progress.message(f"report.html not written: {type(e).__name__}: {e}")
