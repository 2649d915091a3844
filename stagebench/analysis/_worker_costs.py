"""What each worker costs beyond throughput, in the loader summary: the start-up split per setting, the
dataset shipped to each worker, each worker's memory over an epoch, and the findings they call for.

A pure function of the rows (the start-up split: ``workers_start_s`` with ``workers_created_s`` and
``worker_boot_s``, ``worker_init_s``, ``first_batch_work_s``, ``first_delivery_s``; under SPDL's loader
``workers_created_s``, ``worker_unsplit_s`` and ``first_delivery_s``) and ``run.json["worker_costs"]``
(:mod:`stagebench.loader._costs`). A finding fires only on a number past a named threshold:

* **shipping**: the workers are started by spawn or forkserver, and the pickled dataset is over
  :data:`SHIP_MB`, or shipping it takes over :data:`SHIP_S` a worker, or the workers were created one
  after another (:func:`_queued`: a copy over the pipe's 64 KiB makes the main process wait for each
  worker's imports before it starts the next);
* **shared memory**: the batches in flight (``num_workers x prefetch_factor`` of them, each passed
  through ``/dev/shm``) take over :data:`SHM_SHARE` of the space free there; high where they do not fit;
* **memory over an epoch**: a worker's private memory grows over :data:`GROWTH_MB` over its share of
  an epoch, beyond noise (the growth's interval above zero); high where the pick's workers together
  would not fit the memory available. Where a cgroup's memory limit sets that memory, the finding says
  how many such workers its room holds (:func:`workers_that_fit`), and the pick has no more: the OOM
  killer ends a job that passes the limit.
"""

from __future__ import annotations

import math
from dataclasses import replace

from stagebench._numbers import finite, num
from stagebench.model._finding import Finding
from stagebench.model._loader import (
    Largest,
    LoaderRow,
    Shipping,
    Shm,
    StartupSplit,
    WorkerCosts,
    WorkerMemory,
)
from stagebench.model._meta import RunMeta

__all__ = [
    "worker_costs_summary",
    "worker_cost_findings",
    "beside_the_pick",
    "workers_that_fit",
    "SHIP_MB",
    "SHIP_S",
    "GROWTH_MB",
    "QUEUED",
    "SHM_SHARE",
]

#: A pickled dataset this large (MB) is worth a finding: each worker receives a copy.
SHIP_MB = 10.0
#: Shipping it this long (s, pickling in the main process and loading in the worker) is worth one too.
SHIP_S = 0.2
#: A worker's private memory growing this much (MB) over an epoch is worth a finding.
GROWTH_MB = 50.0
#: The batches in flight taking this share of /dev/shm's free space are worth a finding.
SHM_SHARE = 0.5


def worker_costs_summary(m: RunMeta, pts: list[LoaderRow]) -> WorkerCosts | None:
    """``summary.json["worker_costs"]``: the start-up split of every setting with workers (one per number
    of workers, its first measurement), the shipping and the memory pass as measured; None without them."""
    startup: list[StartupSplit] = []
    seen: set[int] = set()
    for p in pts:
        nw, split = p.num_workers, p.startup
        if nw == 0 or nw in seen or not (finite(split.workers_start_s) or finite(split.worker_unsplit_s)):
            continue
        seen.add(nw)
        startup.append(replace(split, setting=p.knobs.label(as_call=True, flags=False), num_workers=nw))
    startup.sort(key=lambda r: r.num_workers or 0)
    # run.json's record, as measured: the summary carries it whole, after the start-up split
    if not startup and m.worker_costs is None:
        return None
    wc = replace(m.worker_costs or WorkerCosts(), startup=tuple(startup))
    mem, avail, ranks = wc.memory, wc.available_mb, m.ranks
    if mem is not None and mem.epoch_growth_mb is not None and finite(mem.epoch_growth_mb) and finite(avail):
        # every rank's workers grow alike, in the memory the host's ranks share
        total = float(mem.epoch_growth_mb) * int(mem.num_workers or 0) * ranks
        fits = total < num(avail)
        more = replace(mem, all_workers_mb=total, fits=fits, ranks=ranks if ranks > 1 else None)
        wc = replace(wc, memory=replace(more, workers_fit=workers_that_fit(wc, ranks)))
    return wc


def workers_that_fit(wc: WorkerCosts, ranks: int = 1) -> int | None:
    """Under a cgroup's memory limit, how many workers a rank's loader may have for its room to hold every
    rank's over an epoch: the memory the limit left once the loaders were closed over each worker's growth
    times the host's ``ranks`` (the same rule as ``fits``). None where the host's memory set the room (there
    a pick that passes it is said beside the pick, not dropped), or no growth was read."""
    mem = wc.memory
    if wc.memory_limit is None or mem is None or not finite(mem.epoch_growth_mb, wc.available_mb):
        return None
    growth = num(mem.epoch_growth_mb)
    if growth <= 0:
        return None
    return int(num(wc.available_mb) // (growth * ranks))


def _room_words(wc: WorkerCosts) -> str:
    """The memory the workers grow into, in words: what a cgroup's limit leaves, or the host's available."""
    lim = wc.memory_limit
    if lim is None:
        return f"the {wc.available_mb:,.0f} MB available"
    return (
        f"the {wc.available_mb:,.0f} MB the container's memory limit leaves ({lim.limit_mb:,.0f} MB, "
        f"{lim.file} of cgroup {lim.group})"
    )


#: Workers waiting this share of their boot, median, to be created were started one after another.
QUEUED = 0.5


def _queued(startup: tuple[StartupSplit, ...]) -> StartupSplit | None:
    """The setting with the most workers whose workers were created one after another (their median wait to
    be created over :data:`QUEUED` of their boot), or None: where a large copy serialises the start."""
    rows = [
        r
        for r in startup
        if (r.num_workers or 0) > 1
        and finite(r.workers_created_s)
        and finite(r.worker_boot_s)
        and num(r.workers_created_s) > QUEUED * num(r.worker_boot_s)
    ]
    return max(rows, key=lambda r: r.num_workers or 0) if rows else None


def worker_cost_findings(wc: WorkerCosts | None, pick: LoaderRow | None) -> list[Finding]:
    """The findings what each worker costs (:func:`worker_costs_summary`) calls for at ``pick`` (module
    docstring), with their numbers; none without it."""
    if wc is None:
        return []
    return [
        *_shipping_findings(wc, pick or LoaderRow()),
        *_shm_findings(wc.shm or Shm()),
        *_growth_findings(wc),
    ]


def _shipping_findings(wc: WorkerCosts, pick: LoaderRow) -> list[Finding]:
    """What shipping the dataset to each worker adds to its start, where it is large or slow."""
    ship = wc.shipping or Shipping()
    largest = ship.largest or Largest()
    what = (
        f" ({largest.items:,} {largest.item or 'item'}s in its {largest.container} `{largest.attr}`)"
        if largest.items
        else ""
    )
    # what shipping adds to one worker's start: SPDL's loader pickles once for all of them
    each = num(ship.unpickle_s) + (0.0 if ship.pickled_once else num(ship.pickle_s))
    # SPDL passes the shared memory's name, not the copy, down the pipe: no queue from it
    queued = _queued(wc.startup) if ship.shipped and not ship.pickled_once else None
    if not (ship.shipped and (num(ship.mb) >= SHIP_MB or each >= SHIP_S or queued is not None)):
        return []
    nw = pick.num_workers
    persistent = pick.persistent_workers is True
    once = ship.pickled_once is True
    detail = (
        (
            f"Each worker receives a pickled copy of your dataset{what}, {ship.mb:,.1f} MB: SPDL's loader "
            f"pickles it once into shared memory ({ship.pickle_s:.2f} s) and each worker loads it "
            f"({ship.unpickle_s:.2f} s; timed here, in the main process: a worker, importing beside it, "
            "takes longer)"
            if once
            else f"Under {ship.start_method}, each worker receives a pickled copy of your dataset{what}, "
            f"{ship.mb:,.1f} MB: the main process pickles it for each worker in turn "
            f"({ship.pickle_s:.2f} s each) and each worker loads it ({ship.unpickle_s:.2f} s; timed here, "
            "in the main process: a spawned worker, importing beside it, takes longer)"
            + (f", {nw * num(ship.pickle_s):.1f} s before the last of {nw} workers starts" if nw > 1 else "")
        )
        + ". "
        + (
            "persistent_workers=True, as recommended, pays it once per run."
            if persistent
            else "persistent_workers=True would pay it once per run instead of at every epoch."
        )
    )
    if largest.python_objects and largest.item in ("str", "tuple", "list", "dict"):
        detail += (
            f" Held as a numpy array (or a memory-mapped file) instead of a Python {largest.container}, "
            "the same data pickles as one buffer, without a Python object per item."
        )
    title = f"Each worker receives a {ship.mb:,.0f} MB copy of your dataset: at least {each:.2f} s of its start"
    if queued is not None:
        title = (
            f"Each worker receives a {ship.mb:,.0f} MB copy of your dataset: the workers start one after "
            f"another, the last {queued.workers_start_last_s:.1f} s after iter() at num_workers="
            f"{queued.num_workers}"
        )
        detail += (
            f" At num_workers={queued.num_workers} a worker waited {queued.workers_created_s:.1f} s "
            f"(median) for the main process to create it and took {queued.worker_boot_s:.1f} s to boot: "
            f"a copy this large does not fit the pipe to the worker, so the main process waits until each "
            "worker has imported what it needs and read its copy before it starts the next; the first batch "
            "waits for the last."
        )
    return [
        Finding(
            "medium" if each >= 1.0 or num(ship.mb) >= 100 or queued is not None else "low",
            title,
            detail,
            evidence={
                "start_method": ship.start_method,
                "mb": ship.mb,
                "pickle_s": ship.pickle_s,
                "unpickle_s": ship.unpickle_s,
            },
        )
    ]


def _growth_findings(wc: WorkerCosts) -> list[Finding]:
    """Each worker's memory growth over an epoch, where it is beyond noise and large."""
    ship = wc.shipping or Shipping()
    largest = ship.largest or Largest()
    mem = wc.memory or WorkerMemory()
    growth, low = num(mem.epoch_growth_mb), num(mem.epoch_growth_mb_low)
    if math.isfinite(growth) and growth >= GROWTH_MB and (not math.isfinite(low) or low > 0):
        nw = mem.num_workers or 0
        how = (
            f"extrapolated from {mem.batches_per_worker:,.0f} batches a worker to the epoch's "
            f"{mem.epoch_batches_per_worker:,.0f}"
            + (
                f", bounded by the ~{mem.bounded_by_mb:,.0f} MB the Python objects it reads take (a page once "
                "copied stays copied: the growth slows as the epoch goes on)"
                if mem.bounded_by_mb
                else " (what the pass grew, then the rate of its second half, where the growth had slowed)"
                if mem.slowing
                else " (linearly)"
            )
            if mem.extrapolated
            else f"what it grew over its first {mem.batches_per_worker:,.0f} batches, after which the pass showed no "
            "growth beyond noise (not extrapolated)"
            if mem.stopped_growing
            else f"over a whole epoch ({mem.batches_per_worker:,.0f} batches a worker)"
        )
        detail = (
            f"At num_workers={nw}, each worker's private memory grew {mem.growth_mb_per_batch:,.2f} MB a batch "
            f"({num(mem.start_mb):,.0f} to {num(mem.end_mb):,.0f} MB over its first "
            f"{mem.batches_per_worker:,.0f} batches): ~{growth:,.0f} MB over an epoch, {how}."
        )
        if largest.python_objects and (largest.items or 0) >= 100_000 and ship.start_method == "fork":
            detail += (
                f" Reading `{largest.attr}`, a Python {largest.container} of {largest.items:,} "
                f"{largest.item or 'item'}s, writes reference counts into pages shared with the main process "
                "(copy-on-read): numpy arrays or a memory-mapped file keep them shared. (A full garbage "
                "collection in a worker writes into every object the main process holds as well: gc.freeze() "
                "before the workers start keeps those pages shared.)"
            )
        fits = mem.fits
        ranks = mem.ranks or 1
        fit = workers_that_fit(wc, ranks)
        every = (
            f"the {nw} workers" if ranks == 1 else f"the host's {ranks} ranks' {nw} workers each ({ranks * nw} in all)"
        )
        if fits is False:
            detail += (
                f" Together {every} would take ~{mem.all_workers_mb:,.0f} MB more, over "
                f"{_room_words(wc)}: fewer workers, or the fix above, before a long run."
            )
        if fit is not None:
            detail += (
                f" At most {fit} such worker{'' if fit == 1 else 's'}{'' if ranks == 1 else ' a rank'} fit in "
                f"{_room_words(wc)} over an epoch; the OOM killer ends the job past it, so no pick has more."
            )
        return [
            Finding(
                "high" if fits is False else "medium",
                f"Each worker's memory grows ~{growth:,.0f} MB over an epoch",
                detail,
                evidence={
                    "num_workers": mem.num_workers,
                    "growth_mb_per_batch": mem.growth_mb_per_batch,
                    "epoch_growth_mb": mem.epoch_growth_mb,
                    "extrapolated": mem.extrapolated,
                    "all_workers_mb": mem.all_workers_mb,
                    **({} if fit is None else {"workers_fit": fit}),
                },
            )
        ]
    return []


def _shm_findings(shm: Shm) -> list[Finding]:
    need, free = num(shm.in_flight_mb), num(shm.free_mb)
    if not (math.isfinite(need) and math.isfinite(free)) or need < SHM_SHARE * free:
        return []
    fits = need <= free
    every = "" if not shm.ranks else f" x {shm.ranks} ranks"
    detail = (
        f"Each batch ({num(shm.batch_mb):,.1f} MB) goes from its worker to the main process through "
        f"shared memory, and {shm.batches_in_flight} are in flight at the recommended setting "
        f"(num_workers x prefetch_factor{every}): ~{need:,.0f} MB of the {free:,.0f} MB free in {shm.path} "
        f"({num(shm.total_mb):,.0f} MB in all). "
        + (
            'A worker that cannot write its batch there fails the run ("bus error", "insufficient shared memory"). '
            if not fits
            else "Other processes on the host share it. "
        )
        + "In a container, raise it (docker run --shm-size, or an emptyDir with medium Memory); "
        "else fewer workers or a smaller prefetch_factor."
    )
    title = (
        f"The batches in flight need ~{need:,.0f} MB of shared memory, more than the {free:,.0f} MB free"
        if not fits
        else f"The batches in flight take {need / free:.0%} of the shared memory free ({free:,.0f} MB)"
    )
    return [Finding("medium" if fits else "high", title, detail, evidence=shm.to_json())]


def beside_the_pick(wc: WorkerCosts | None, pick: LoaderRow | None) -> str:
    """What the verdict states beside ``pick`` from what each worker costs (:func:`worker_costs_summary`): a
    memory growth the pick's workers would not fit the host with, with how many would; batches in flight
    that do not fit /dev/shm; and a shipped dataset paid again at every epoch's start. Empty where none
    holds, or without either. The pick itself stands on throughput in turns: these are costs it does not see."""
    if wc is None or pick is None:
        return ""
    said = ""
    mem = wc.memory or WorkerMemory()
    if mem.fits is False and finite(mem.epoch_growth_mb) and finite(wc.available_mb):
        growth, avail, ranks = num(mem.epoch_growth_mb), num(wc.available_mb), mem.ranks or 1
        fit = int(avail // (growth * ranks)) if growth > 0 else 0
        whose = "its one worker" if mem.num_workers == 1 else f"each of its {mem.num_workers or 0} workers"
        said += (
            f"; memory: {whose} grows ~{growth:,.0f} MB over an epoch, "
            f"~{mem.all_workers_mb:,.0f} MB together"
            + ("" if ranks == 1 else f" on the host's {ranks} ranks")
            + " against "
            + (f"{avail:,.0f} MB available" if wc.memory_limit is None else _room_words(wc))
            + (f" (at most {fit} such workers{'' if ranks == 1 else ' a rank'} fit)" if fit >= 1 else "")
        )
    shm = wc.shm or Shm()
    need, free = num(shm.in_flight_mb), num(shm.free_mb)
    if math.isfinite(need) and math.isfinite(free) and need > free:
        said += (
            f"; shared memory: its {shm.batches_in_flight} batches in flight need ~{need:,.0f} MB, "
            f"{free:,.0f} MB free in {shm.path}"
        )
    ship = wc.shipping or Shipping()
    each = num(ship.unpickle_s) + (0.0 if ship.pickled_once else num(ship.pickle_s))
    nw = pick.num_workers
    if ship.shipped and nw > 0 and pick.persistent_workers is not True and each >= SHIP_S:
        workers = "its worker" if nw == 1 else f"its {nw} workers"
        said += (
            f"; each epoch starts {workers} anew, each receiving the {num(ship.mb):,.0f} MB dataset "
            f"({each:.2f} s a worker; persistent_workers=True pays it once)"
        )
    return said
