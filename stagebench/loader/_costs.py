"""What each worker costs beyond throughput: the dataset shipped to it (:func:`shipping_cost`), its memory
over an epoch (:func:`memory_pass`) and the batches in flight against ``/dev/shm`` (:func:`shm_headroom`);
what each reads, and how: docs/loaders.md#what-each-worker-costs.

A forked worker shares the parent's pages until it writes to them, and reading a Python object writes its
reference count: a worker reading a Python list copies, page by page, the part of it the worker touches
(copy-on-read), so its private memory grows through the epoch, and a page once copied stays copied (what
bounds the growth). Shipping is timed with ``ForkingPickler``, as ``multiprocessing`` does, on the user's
own objects, in the main process, without changing them.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import os
import pickle
import random
import shutil
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from multiprocessing.reduction import ForkingPickler
from typing import Any

import psutil

from stagebench.loader._built import context_name
from stagebench.model._loader import Largest, MemorySample, Shipping, Shm, WorkerMemory

__all__ = ["start_method", "shipping_cost", "memory_pass", "largest_container", "copy_bound_mb", "shm_headroom"]

#: The pickling of a dataset is timed this many times (fewer when one takes over SLOW_PICKLE_S).
_REPEATS = 3
SLOW_PICKLE_S = 0.5
# The fewest batches a worker makes in the pass before its growth is extrapolated to the epoch: below it
# the median of a few readings cannot tell a step (an arena taken) from a trend, and the line stretches
# them over thousands of batches, to an interval wider than any memory.
MIN_BATCHES = 10
#: The fewest readings of a pass (:func:`memory_pass`): three growths between them for their median. A pass
#: ends at its ``seconds`` only once it has them: a loaded host stretches each reading (0.27 s apart at a
#: 0.25 s interval), and a pass with three readings reads nothing.
MIN_READINGS = 4


def start_method(factory: Any) -> str:
    """The start method the loader's workers use: the loader's own ``multiprocessing_context``, else
    the interpreter's default (what torch uses)."""
    own = context_name(getattr(factory, "multiprocessing_context", None))
    return own or str(multiprocessing.get_start_method(allow_none=False))


def largest_container(obj: Any) -> Largest | None:
    """The dataset's largest list, tuple, dict or array attribute (one level down), its length and what
    its items are: where most of a dataset's Python objects usually sit (a list of paths, of tuples)."""
    best: tuple[int, str, Any] | None = None
    for name, value in list(vars(obj).items()) if hasattr(obj, "__dict__") else []:
        try:
            n = len(value)
        except TypeError:
            continue
        if isinstance(value, (str, bytes)) or n < 1:
            continue
        if best is None or n > best[0]:
            best = (n, name, value)
    if best is None:
        return None
    n, name, value = best
    kind = type(value).__name__
    first = None
    with contextlib.suppress(StopIteration, TypeError, AttributeError):
        first = next(iter(value.values() if isinstance(value, dict) else value))
    numpy = type(value).__module__.startswith("numpy")
    return Largest(
        attr=name,
        items=n,
        container=kind,
        item=type(first).__name__ if first is not None else None,
        python_objects=not numpy,
        objects_mb=_deep_mb(value, n) if not numpy else None,
    )


def copy_bound_mb(largest: Largest | None, dataset: Any) -> float | None:
    """The most a worker can copy reading the dataset, from its largest container: the memory of that
    container's Python objects, where it is the dataset's index (at least one item per sample). A smaller
    container (FakeData's 3-int ``image_size``) says nothing of what a worker reads: no bound then, rather
    than one that would cap an epoch's growth at what the pass saw."""
    if largest is None or not largest.python_objects or largest.objects_mb is None or largest.items is None:
        return None
    try:
        samples = len(dataset)
    except TypeError:  # an IterableDataset: no count of samples to hold the container against
        return None
    return float(largest.objects_mb) if largest.items >= samples else None


def _deep_mb(value: Any, n: int, sample: int = 2000) -> float | None:
    """The memory a container's Python objects take, from a sample of its items (each item with what it
    holds, one level down): what a worker reading all of it could copy at most, page by page."""
    try:
        items = list(value.items()) if isinstance(value, dict) else value
        picks = items if n <= sample else [items[i] for i in random.Random(0).sample(range(n), sample)]
    except (TypeError, KeyError, IndexError):
        return None

    def size(x: Any) -> int:
        own = sys.getsizeof(x)
        if isinstance(x, (tuple, list)):
            own += sum(sys.getsizeof(y) for y in x)
        return own

    per = sum(size(x) for x in picks) / max(1, len(picks))
    return (sys.getsizeof(value) + per * n) / 2**20


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def shipping_cost(factory: Any, *, backend: str) -> Shipping | None:
    """What shipping the dataset (with the collate and init functions) to one worker costs, measured on
    the user's objects: ``mb`` pickled, ``pickle_s`` (the main process, once per worker) and
    ``unpickle_s`` (each worker), medians of up to three, with their range; ``shipped`` False under
    fork (nothing is pickled). None where the factory holds no dataset."""
    ds = getattr(factory, "dataset", None)
    if ds is None:
        return None
    method = start_method(factory)
    shipped = method != "fork" or backend == "spdl_pytorch"
    # SPDL's loader pickles the dataset once, into shared memory, and each worker loads it from there;
    # torch's pickles it once per worker, in the main process, as each worker is started
    out = Shipping(
        start_method=method, shipped=shipped, pickled_once=backend == "spdl_pytorch", largest=largest_container(ds)
    )
    objs = (ds, getattr(factory, "collate_fn", None), getattr(factory, "worker_init_fn", None))
    dumps, loads, blob = [], [], b""
    try:
        for _ in range(_REPEATS):
            td, blob = _timed(lambda: bytes(ForkingPickler.dumps(objs)))
            tl, _ = _timed(lambda: pickle.loads(blob))  # noqa: B023 - called at once, in this iteration
            dumps.append(td)
            loads.append(tl)
            if td + tl > SLOW_PICKLE_S:
                break
    except Exception as e:  # a dataset that cannot be pickled cannot be shipped either: torch would fail too
        return replace(out, error=f"{type(e).__name__}: {e}"[:300])
    return replace(
        out,
        mb=len(blob) / 2**20,
        pickle_s=statistics.median(dumps),
        pickle_s_range=(min(dumps), max(dumps)),
        unpickle_s=statistics.median(loads),
        unpickle_s_range=(min(loads), max(loads)),
        repeats=len(dumps),
    )


def memory_pass(
    cons: Any,
    *,
    num_workers: int,
    epoch_batches: int | None,
    seconds: float,
    interval_s: float = 0.25,
    cap_mb: float | None = None,
) -> WorkerMemory | None:
    """Each worker's private memory over a pass of ``seconds``, longer only until it has :data:`MIN_READINGS`
    readings (module docstring). ``cap_mb``: the most a worker can copy (the Python objects of the dataset
    it reads), bounding the extrapolation.

    ``cons``: a started, warm consumer (:class:`stagebench.loader._consumer._Consumer`): its ``events``
    carry the process that made each batch, its ``worker_pids()`` the workers; the caller tears it
    down. Returns a :class:`WorkerMemory` (None without workers, or too few readings): the samples,
    ``growth_mb_per_batch`` (a worker's, pooled over the workers: least
    squares through each worker's first sample, with a 95% interval), ``batches_per_worker``, and
    ``epoch_growth_mb`` with ``extrapolated``: the growth over a worker's share of the epoch.
    """
    pids = cons.worker_pids()
    if not pids:
        return None
    procs = {}
    for pid in pids:
        with contextlib.suppress(psutil.Error):  # a worker gone already
            procs[pid] = psutil.Process(pid)

    def read() -> dict[int, float]:
        out = {}
        for pid, p in procs.items():
            with contextlib.suppress(psutil.Error, AttributeError):
                info = p.memory_full_info()
                out[pid] = (info.uss or info.pss) / 2**20
        return out

    def made() -> dict[int, int]:  # by the workers read: an earlier epoch's, gone, made batches too
        return dict(Counter(e.pid for e in list(cons.events) if e.pid in procs))

    # A pass in which every worker made its whole share of the epoch has read the epoch's growth, not
    # extrapolated it: it ends there (a small dataset's pass, a fraction of a second), with at least
    # MIN_READINGS readings for the median of the growth between them. MIN_BATCHES bounds an
    # extrapolation, and a whole share needs none: a share of 2 batches a worker is not run for 10.
    enough = math.ceil(epoch_batches / max(1, num_workers)) if epoch_batches else None
    samples: list[MemorySample] = []
    t0 = time.perf_counter()
    while True:
        mem, n = read(), made()
        samples.append(MemorySample(time.perf_counter() - t0, mem, n))
        if cons.finished or (time.perf_counter() - t0 >= seconds and len(samples) >= MIN_READINGS):
            break
        first = samples[0].batches
        if (
            enough is not None
            and len(samples) >= MIN_READINGS
            and all(n.get(pid, 0) - first.get(pid, 0) >= enough for pid in procs)
        ):
            break
        time.sleep(interval_s)
    return _growth(samples, num_workers=num_workers, epoch_batches=epoch_batches, cap_mb=cap_mb)


def _growth(
    samples: Sequence[MemorySample], *, num_workers: int, epoch_batches: int | None, cap_mb: float | None = None
) -> WorkerMemory | None:
    """Growth per batch: the median of each worker's growth per batch between consecutive readings.

    The median, not a line through all readings: a worker's memory also moves in steps (an allocator
    taking a new arena, a buffer: 40 MB at once in one reading of a numpy-backed dataset, flat before and
    after), and a line through a step reads it as growth all along. Copy-on-read grows at every reading.
    The 95% interval is the order-statistic one of the median."""
    rates: list[float] = []
    early: list[float] = []  # the rates read in the pass's first half
    late: list[float] = []  # and in its second
    for i, (prev, cur) in enumerate(zip(samples, samples[1:]), start=1):
        for pid, mb in cur.uss_mb.items():
            if pid in prev.uss_mb and pid in prev.batches and pid in cur.batches:
                made = cur.batches[pid] - prev.batches[pid]
                if made > 0:
                    rates.append((mb - prev.uss_mb[pid]) / made)
                    (late if 2 * i > len(samples) else early).append(rates[-1])
    if len(rates) < 3:
        return None
    slope, low_rate, high_rate = _median_interval(rates)
    first, last = samples[0].uss_mb, samples[-1].uss_mb
    done = statistics.median(samples[-1].batches.values()) if samples[-1].batches else 0.0
    share = epoch_batches / max(1, num_workers) if epoch_batches else None
    read = WorkerMemory(
        num_workers=num_workers,
        samples=tuple(samples),
        growth_mb_per_batch=slope,
        growth_mb_per_batch_low=low_rate,
        growth_mb_per_batch_high=high_rate,
        batches_per_worker=done,
        epoch_batches_per_worker=share,
        start_mb=statistics.median(first.values()) if first else None,
        end_mb=statistics.median(last.values()) if last else None,
    )
    grown = max(0.0, (read.end_mb or 0.0) - (read.start_mb or 0.0))
    # a worker copies at most the pages of what it reads: the Python objects it reads bound the growth
    bound = None if cap_mb is None else max(cap_mb, grown)
    if share is not None and done < MIN_BATCHES <= share:
        return replace(read, too_few_batches=True)  # the growth per batch stands; the epoch's is not read off it
    if share is not None and done < share and len(late) >= 3 and _median_interval(late)[1] <= 0:
        # no growth beyond noise in the pass's second half: it levelled off (docs/loaders.md)
        return _epoch(read, grown, grown, grown, extrapolated=False, stopped_growing=True)
    if share is not None and done < share and _slowing(early, late):
        # what the pass grew, then its second half's rate over the rest (an upper reading: the rate keeps
        # falling); the median rate over the epoch would read a copy-on-read of shuffled reads low
        rest = share - done
        mid, high = grown + statistics.median(late) * rest, grown + max(late) * rest
        if bound is not None:
            mid, high = min(mid, bound), min(high, bound)
        bounded = bound if bound is not None and mid >= bound else None
        return _epoch(read, grown, mid, high, extrapolated=True, slowing=True, bounded_by_mb=bounded)
    if share is None:
        return read
    lo, hi = low_rate * share, high_rate * share
    mid = slope * share
    if bound is None:
        low, high = lo, hi
    elif mid > bound:  # the line runs past the bound: the epoch's growth lies between what the pass saw and it
        low, mid, high = grown, bound, bound
    else:
        low, high = min(lo, bound), min(hi, bound)
    bounded = bound if bound is not None and slope * share > bound else None
    return _epoch(read, low, mid, high, extrapolated=done < share, bounded_by_mb=bounded)


def _epoch(read: WorkerMemory, low: float, mid: float, high: float, **more: Any) -> WorkerMemory:
    """``read`` with the epoch's growth (``mid``, between ``low`` and ``high``) and what ``more`` says of it."""
    return replace(read, epoch_growth_mb=mid, epoch_growth_mb_low=low, epoch_growth_mb_high=high, **more)


def _slowing(early: list[float], late: list[float]) -> bool:
    """Growth that slows as the pass goes: every reading grew (a copy-on-read touches new pages at each;
    an arena taken is a step, flat around it), and the second half's median rate is under half the first's."""
    return (
        len(early) >= 2
        and len(late) >= 2
        and min(early + late) > 0
        and statistics.median(late) < 0.5 * statistics.median(early)
    )


def _median_interval(xs: list[float]) -> tuple[float, float, float]:
    """The median of ``xs`` with the 95% order-statistic interval around it (no assumption on their spread)."""
    xs = sorted(xs)
    n = len(xs)
    k = 1.96 * math.sqrt(n) / 2
    lo_i, hi_i = max(0, math.floor(n / 2 - k) - 1), min(n - 1, math.ceil(n / 2 + k))
    return statistics.median(xs), xs[lo_i], xs[hi_i]


SHM = "/dev/shm"


def shm_headroom(batch_mb: float, num_workers: int, prefetch_factor: int, ranks: int = 1) -> Shm | None:
    """The shared memory the batches in flight take against what ``/dev/shm`` has free; None where there
    is no ``/dev/shm`` (macOS, Windows) or the batch's size is unknown. ``ranks``: the host's ranks, each
    with its loader's batches in flight in the same ``/dev/shm``."""
    if not (math.isfinite(batch_mb) and batch_mb > 0 and num_workers > 0) or not os.path.isdir(SHM):
        return None
    try:
        usage = shutil.disk_usage(SHM)
    except OSError:
        return None
    flight = num_workers * max(1, prefetch_factor) * ranks
    return Shm(
        path=SHM,
        free_mb=usage.free / 2**20,
        total_mb=usage.total / 2**20,
        batch_mb=batch_mb,
        batches_in_flight=flight,
        in_flight_mb=flight * batch_mb,
        ranks=ranks if ranks > 1 else None,
    )
