"""The search over loader settings: each point measured once, written as it lands, and said.

:class:`_Sweep` measures a setting (on a loader it keeps open for the turns, or a fresh one), writes its
row to results.csv at once, and never measures one setting twice; under a memory limit it does not
start a setting predicted to pass it. :func:`_adaptive` walks num_workers 0, 1, 2, 4, ... until
throughput stops improving beyond noise for two steps, then (when asked) prefetch_factor at the best,
then the script's own setting, then the settings the pick hinges on in turns
(:mod:`stagebench.loader._turns`), then the epoch stall at the pick. :func:`plan_grid` is the plain grid.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from stagebench.analysis._loader import loader_pick
from stagebench.analysis._loader_pick import recommend, turns_to_run
from stagebench.analysis._loader_rows import near_fastest, normalize_row, user_point
from stagebench.core._config import CANNOT_MATTER, in_turns_precision, powers_of_two
from stagebench.loader._config import LoaderFactory, LoaderSweepConfig
from stagebench.loader._costs import (
    MIN_BATCHES,
    copy_bound_mb,
    largest_container,
    memory_pass,
    shipping_cost,
    shm_headroom,
)
from stagebench.loader._draft import PointDraft
from stagebench.loader._point import measure_loader_point
from stagebench.loader._turns import HeldLoaders, run_turns
from stagebench.model._knobs import LoaderKnobs
from stagebench.model._loader import LoaderRow, Shipping, WorkerMemory
from stagebench.model._meta import RunMeta
from stagebench.runs._knobs import normalize_knobs
from stagebench.runs._limits import job_memory_mb, read_limits

if TYPE_CHECKING:
    from stagebench.core._progress import Progress
    from stagebench.runs._results import RowWriter

__all__ = ["plan_grid"]


# ------------------------------------------------------------------------ search
def _levels(cfg: LoaderSweepConfig, backend: str, usable_cores: float) -> tuple[int, ...]:
    if cfg.num_workers is not None:
        levels = tuple(cfg.num_workers)
    else:
        # twice the cores, a fractional quota's rounded up: workers that wait need more of them than cores
        cap = cfg.max_workers or math.ceil(2 * max(1, usable_cores))
        levels = (0, *powers_of_two(cap))
    if backend == "spdl_pytorch":
        levels = tuple(n for n in levels if n > 0) or (1,)
    return levels


def plan_grid(
    cfg: LoaderSweepConfig, backend: str, *, cuda: bool, usable_cores: float
) -> list[tuple[LoaderKnobs, LoaderKnobs, list[str]]]:
    """Every combination, normalised and de-duplicated: (requested, effective, notes)."""
    pins = cfg.pin_memory if cuda else (False,)
    out: dict[LoaderKnobs, tuple[LoaderKnobs, LoaderKnobs, list[str]]] = {}
    for nw, pf, pw, pin in itertools.product(
        _levels(cfg, backend, usable_cores), cfg.prefetch_factors, cfg.persistent_workers, pins
    ):
        req = LoaderKnobs(num_workers=nw, prefetch_factor=pf, persistent_workers=pw, pin_memory=pin)
        eff, _, notes = normalize_knobs(req, backend, cuda=cuda)
        out.setdefault(eff, (req, eff, notes))
    return list(out.values())


def _improves(row: LoaderRow, best: LoaderRow, min_gain: float) -> bool:
    s, b = row.samples_per_s, best.samples_per_s
    if not math.isfinite(s):
        return False

    def half(r: LoaderRow) -> float:
        lo, hi = r.samples_per_s_low, r.samples_per_s_high
        return (hi - lo) / 2 if math.isfinite(lo) and math.isfinite(hi) else 0.0

    return s - b > max(min_gain * b, half(row), half(best))


@dataclass(eq=False)
class _Sweep:
    """Measures points, writes each row as it lands, and never measures one setting twice."""

    factory: LoaderFactory
    _: KW_ONLY
    name: str
    backend: str
    batch_size: int
    cfg: LoaderSweepConfig
    cuda: bool
    writer: RowWriter
    progress: Progress | None
    budget_mb: float = math.inf  # main process and workers together (_memory_budget)
    epoch_batches: int | None = None  # batches in an epoch, where the loader says
    #: where a cgroup's memory limit sets the budget, in words (empty: the host's memory does). There the
    #: OOM killer ends the job the moment it passes the limit, so no setting starts that is predicted to
    #: pass the budget, whichever phase asks for it, and each worker's growth over an epoch is counted
    limit_words: str = ""
    #: each worker's growth over an epoch that the predictions count under a memory limit, until the memory
    #: pass reads it: the Python objects a forked worker reads and so copies (NaN: none expected)
    growth_bound_mb: float = math.nan
    #: settings the sweep did not start, and why (they go with the search's stops into run.json)
    stops: list[str] = field(default_factory=list, init=False)
    #: the rows measured, as read (each written to results.csv as measured)
    rows: list[LoaderRow] = field(default_factory=list, init=False)
    by_key: dict[LoaderKnobs, LoaderRow] = field(default_factory=dict, init=False)  # by effective knobs
    memory: WorkerMemory | None = field(default=None, init=False)  # the memory pass at the pick, once read
    batch_mb: float = field(default=math.nan, init=False)  # a batch's size, read with the memory pass
    held: HeldLoaders = field(init=False)  # loaders kept open after their point, for the turns and the stall

    def __post_init__(self) -> None:
        self.held = HeldLoaders(
            self.factory, name=self.name, backend=self.backend, batch_size=self.batch_size, cuda=self.cuda
        )

    def point(self, knobs: LoaderKnobs, phase: str, *, again: bool = False, **how: Any) -> LoaderRow:
        """Measure a setting once (``again``: measure it anew, as the tie-break does); ``how``: for
        :func:`measure_loader_point` (``stall``, ``throughput``, ``during``). A window without the stall
        runs on a loader kept open after it (:meth:`prune` says which stay); the stall alone runs on the
        setting's open loader where there is one."""
        eff, _, _ = normalize_knobs(knobs, self.backend, cuda=self.cuda)
        throughput = how.get("throughput", True)
        if eff in self.by_key and not again and throughput:
            return self.by_key[eff]
        if self.limit_words and eff not in self.held.open and (why := self.over_budget(eff.num_workers)):
            # under a memory limit a setting predicted to pass it is not started, in any phase: said, not measured
            said = f"{eff.label(as_call=True, flags=False)} not started: {why}"
            if said not in self.stops:
                self.stops.append(said)
            return LoaderRow(status="skipped", reason=said, num_workers=eff.num_workers)
        if self.progress is not None:
            self.progress.start(f"{self.name} | {eff.label()}{'' if throughput else ' (stall)'}")
        how = {"stall": self.cfg.epoch_stall and self.cfg.stall_at == "every", **how}
        floor = self.floor() if phase == "num_workers" else None
        cfg = self.cfg
        if phase == "num_workers" and cfg.tie_rounds > 0:
            # A screen: the settings near the fastest are compared in turns after it, so its windows close at
            # ±10% (a stage's head-to-head's precision), not at the ±5% that decides nothing here.
            cfg = replace(cfg, precision=in_turns_precision(cfg.precision))
        row: PointDraft | None = None
        if throughput and not how["stall"]:
            self.make_room(knobs)
            row = self.held.window(knobs, cfg, phase=phase, floor=floor)
        elif not throughput and how["stall"]:
            row = self.held.stall(knobs, cfg, phase=phase, during=how.get("during"))
        if row is None:
            self.make_room(knobs)
            row = self.fresh(knobs, phase, config=cfg, cannot_matter_below=floor, **how)
        read = self.record(row, phase)
        if throughput:
            self.by_key.setdefault(eff, read)
        self.prune()
        return read

    def fresh(
        self, knobs: LoaderKnobs, phase: str = "", *, config: LoaderSweepConfig | None = None, **how: Any
    ) -> PointDraft:
        """A point on a fresh loader, closed after it (:func:`measure_loader_point`; not recorded)."""
        return measure_loader_point(
            self.factory,
            knobs,
            name=self.name,
            backend=self.backend,
            batch_size=self.batch_size,
            config=config or self.cfg,
            phase=phase,
            cuda=self.cuda,
            **how,
        )

    def prune(self) -> None:
        """Keep open only the loaders the turns may ask for (:func:`stagebench.analysis._loader_pick.turns_to_run`
        takes at most three): yours, the fastest so far, then those near it (:func:`near_fastest`, the
        decision's own rule), cheapest first, as the decision takes them. The others' workers would only
        hold memory, and a loader closed here that the turns then ask for pays its start-up again."""
        ok = [(k, r) for k, r in self.by_key.items() if r.ok]
        if not ok:
            self.held.close()
            return
        fastest, top = max(ok, key=lambda kr: kr[1].samples_per_s)
        mine = self.held.key(self.cfg.yours) if self.cfg.yours is not None else None
        near = sorted((k for k, r in ok if near_fastest(r, top)), key=LoaderKnobs.cost)
        keys = [k for k in dict.fromkeys([mine, fastest, *near]) if k in self.held.open]
        self.held.keep(set(keys[:_MAX_HELD]))

    def held_mb(self) -> float:
        """The memory the workers of the loaders kept open hold (as their windows read it)."""
        mbs = (self.by_key[k].mem_workers_mb for k in self.held.open if k in self.by_key)
        return sum(x for x in mbs if math.isfinite(x))

    def predicted_mb(self, num_workers: int) -> float:
        """The main process and ``num_workers`` workers, from the latest point measured ok with workers: each
        worker holds about the same memory (its copy of the dataset object, its batches in flight). NaN
        before any such point.

        Under a memory limit, as the cgroup charges it: a page the workers share with the main process is
        charged once, so the point's memory (its PSS, every page once) and each further worker's private
        pages (:func:`_private_mb`), and each worker's growth over an epoch (:meth:`growth_mb`): a point's
        short window ends before its workers have copied what they read."""
        last = next((r for r in reversed(self.rows) if r.ok and r.num_workers > 0), None)
        if last is None:
            return math.nan
        k = last.num_workers
        private = _private_mb(last) if self.limit_words else math.nan
        if math.isfinite(private):
            return float(last.mem_pss_mb + (num_workers - k) * private + num_workers * self.growth_mb())
        return float(last.mem_main_mb + num_workers * last.mem_workers_mb / k)

    def growth_mb(self) -> float:
        """Each worker's growth over an epoch: the memory pass's reading once made, else the bound on what a
        forked worker copies (:attr:`growth_bound_mb`), else 0."""
        read = None if self.memory is None else self.memory.epoch_growth_mb
        if read is not None and math.isfinite(read):
            return max(0.0, float(read))
        return self.growth_bound_mb if math.isfinite(self.growth_bound_mb) else 0.0

    def over_budget(self, num_workers: int) -> str | None:
        """Why ``num_workers`` workers would pass the memory budget, predicted before they start; None where
        they would not, or nothing predicts it yet."""
        predicted = self.predicted_mb(num_workers)
        if not (num_workers > 0 and math.isfinite(predicted) and predicted > self.budget_mb):
            return None
        grow = self.growth_mb() if self.limit_words else 0.0
        return (
            f"about {predicted:,.0f} MB predicted"
            + (f" (each worker ~{grow:,.0f} MB more over an epoch, copy-on-read)" if grow > 0 else "")
            + f", over the memory budget of {self.budget_mb:,.0f} MB"
            + (f" ({self.limit_words})" if self.limit_words else "")
        )

    def make_room(self, knobs: LoaderKnobs) -> None:
        """Close the loaders kept open where a new loader's workers, predicted before they start, would not
        fit the memory budget beside theirs: the loaders kept open give way to the next point, whichever
        phase asks for it (num_workers, prefetch_factor, yours, the grid, the turns, a stall on a fresh loader)."""
        eff = self.held.key(knobs)
        if not self.held.open or eff in self.held.open:
            return
        predicted = self.predicted_mb(eff.num_workers)
        if math.isfinite(predicted) and predicted + self.held_mb() > self.budget_mb:
            self.held.close()

    def record(self, point: PointDraft, phase: str) -> LoaderRow:
        """Keep a measured point: written to results.csv at once, and said; returns its row as read."""
        row = point.as_row()
        read = normalize_row(row)
        self.rows.append(read)
        self.writer.write(row)
        if self.progress is not None:
            # the stall point measures the pause at an epoch's start, not a throughput
            rate, unit = (
                (point.epoch_stall_s, "s pause at each epoch start")
                if phase == "epoch_stall"
                else (point.samples_per_s, "samples/s")
            )
            label = f"{self.name} | {self.backend} {read.knobs.label()}" + (" (in turns)" if phase == "paired" else "")
            self.progress.done(label, point.status, rate, point.reason, unit)
        return read

    def memory_hook(self, knobs: LoaderKnobs) -> Callable[[Any], None] | None:
        """The memory pass at ``knobs``, run on the stall point's warm workers (saves starting them again:
        a fifth of a small sweep); None where it is off."""
        if not (self.cfg.worker_costs and self.cfg.memory_pass_s > 0):
            return None
        eff, _, _ = normalize_knobs(knobs, self.backend, cuda=self.cuda)

        def during(cons: Any) -> None:
            _memory_at(self, cons, eff.num_workers)

        return during

    def floor(self) -> float | None:
        """Samples/s under which a window cannot be the answer (CANNOT_MATTER of the best lower end so far)."""
        lows = [r.samples_per_s_low for r in self.rows if r.ok and math.isfinite(r.samples_per_s_low)]
        return CANNOT_MATTER * max(lows) if lows else None


def _private_mb(row: LoaderRow) -> float:
    """Each worker's private memory at a point, from its tree's PSS and USS: the pages counted in the PSS but
    in no process's USS are shared, and a forked worker's PSS holds its share of those it shares with the
    main process (k of the k + 1 sharers' shares for k workers); what is left is its own. NaN where USS was
    not read (0: psutil could not read it)."""
    k, pss, uss, workers = row.num_workers, row.mem_pss_mb, row.mem_uss_mb, row.mem_workers_mb
    if not (k > 0 and math.isfinite(uss) and uss > 0 and math.isfinite(workers)):
        return math.nan
    shared = max(0.0, pss - uss)
    return max(0.0, workers - k / (k + 1) * shared) / k


#: Loaders the search keeps open at most: as many as the turns compare.
_MAX_HELD = 3


def _adaptive(sw: _Sweep, levels: tuple[int, ...]) -> list[str]:
    """num_workers upwards, then (when asked) prefetch_factor at the best, then the tie-break, then
    the epoch stall at the pick (or, with ``stall_at="every"``, persistence and pinning as before)."""

    cfg, budget_mb = sw.cfg, sw.budget_mb
    stops: list[str] = []
    pf0 = cfg.default_prefetch()
    pin0 = bool(cfg.yours.pin_memory) if sw.cuda and cfg.yours is not None else False
    best: LoaderRow | None = None
    stale = 0
    for nw in levels:
        over = sw.over_budget(nw)  # before forking them
        if over:
            stops.append(f"num_workers stopped before {nw}: {over}")
            break
        row = sw.point(
            LoaderKnobs(num_workers=nw, prefetch_factor=pf0 if nw > 0 else None, pin_memory=pin0), "num_workers"
        )
        if row.status == "skipped":  # not started: over the budget (said in sw.stops)
            break
        if row.status == "failed":
            stops.append(f"stopped: the loader failed at num_workers={nw} ({row.reason})")
            return stops
        if row.status in ("crashed", "timeout"):
            stops.append(f"num_workers stopped at {nw}: {row.status}; continuing with fewer workers")
            break
        if not row.ok:
            continue
        if math.isfinite(row.mem_pss_mb) and row.mem_pss_mb > budget_mb:
            stops.append(
                f"num_workers stopped at {nw}: {row.mem_pss_mb:,.0f} MB, over the memory budget of {budget_mb:,.0f} MB"
            )
            break
        if best is None or _improves(row, best, cfg.min_gain):
            stale = 0
        else:
            stale += 1
        if best is None or row.samples_per_s > best.samples_per_s:
            best = row
        if stale >= cfg.patience:
            stops.append(f"num_workers stopped at {nw}: no gain beyond noise for {cfg.patience} steps")
            break
    if best is None:
        return stops
    if best.num_workers > 0 and (cfg.search_prefetch or cfg.stall_at == "every"):
        for pf in cfg.prefetch_factors:
            sw.point(LoaderKnobs(num_workers=best.num_workers, prefetch_factor=pf, pin_memory=pin0), "prefetch_factor")
    _measure_yours(sw)  # before the turns, which may keep the script's own
    _in_turns(sw, cfg.yours)
    # the pick as the summary makes it, yours kept where the turns did not show another better: the stall and
    # the memory pass run there (ImageNet --dummy's ran at 4 workers, then the memory pass again at yours, 2)
    mine = _yours_point(sw, cfg.yours)
    rec = recommend(sw.rows, budget_mb=budget_mb, within_best=cfg.within_best, user=mine, max_rounds=cfg.tie_rounds)
    if cfg.stall_at == "every":  # the protocol before: persistence measured as a point, then pinning
        if rec is not None and rec.num_workers > 0 and sw.backend != "spdl_pytorch" and True in cfg.persistent_workers:
            sw.point(
                LoaderKnobs(
                    num_workers=rec.num_workers,
                    prefetch_factor=rec.prefetch_factor,
                    persistent_workers=True,
                    pin_memory=pin0,
                ),
                "persistent_workers",
            )
            rec = recommend(sw.rows, budget_mb=budget_mb, within_best=cfg.within_best, max_rounds=cfg.tie_rounds)
    elif cfg.epoch_stall and rec is not None and rec.num_workers > 0:
        # the stall decides one thing, persistent_workers at the pick (analysis/_loader_pick._kept_knobs): measured there
        # alone, once, instead of restarting epochs after every point's window
        knobs = LoaderKnobs(num_workers=rec.num_workers, prefetch_factor=rec.prefetch_factor, pin_memory=pin0)
        at_pick = sw.point(knobs, "epoch_stall", stall=True, throughput=False, during=sw.memory_hook(knobs))
        if (
            sw.epoch_batches is None
            and sw.backend != "spdl_pytorch"
            and True in cfg.persistent_workers
            and math.isfinite(at_pick.epoch_stall_s)
        ):
            # no epoch length to weigh the stall against: what persistent workers save decides instead. Where no
            # epoch ended within stall_wait_s (a stream that does not end), persistent workers meet none either:
            # another stall_wait_s would show only that again
            sw.point(replace(knobs, persistent_workers=True), "epoch_stall", stall=True, throughput=False)
    if rec is not None and sw.cuda and True in cfg.pin_memory and cfg.yours is None:
        sw.point(
            LoaderKnobs(
                num_workers=rec.num_workers,
                prefetch_factor=rec.prefetch_factor,
                persistent_workers=rec.persistent_workers is True,
                pin_memory=True,
            ),
            "pin_memory",
        )
    return stops


def _measure_yours(sw: _Sweep) -> None:
    """The extra points asked for and the script's own setting, measured after the search (phase ``user``)."""
    for extra in (*sw.cfg.extra_points, *([sw.cfg.yours] if sw.cfg.yours is not None else [])):
        sw.point(extra, "user")


def _in_turns(sw: _Sweep, user: LoaderKnobs | None) -> None:
    """Measure the settings the pick hinges on again, in turns, their loaders kept open, until the rule of
    :mod:`stagebench.model._evidence` is settled (:mod:`stagebench.loader._turns`), at most ``tie_rounds``
    rounds; the analysis reads the rows (``search_phase`` ``paired``, their round in ``turn``)."""
    cfg = sw.cfg
    if cfg.tie_rounds <= 0:
        return

    def next_settings() -> list[LoaderKnobs]:
        mine = _yours_point(sw, user)
        todo = [
            p.knobs
            for p in turns_to_run(
                sw.rows, budget_mb=sw.budget_mb, within_best=cfg.within_best, user=mine, max_rounds=cfg.tie_rounds
            )
        ]
        for knobs in todo:  # a setting whose loader was closed opens again in this round: room for it first
            sw.make_room(knobs)
        return todo

    if sw.progress is not None:
        sw.progress.message("in turns: the settings the pick hinges on, each loader kept open between its windows")
    run_turns(sw.held, next_settings, lambda row: sw.record(row, "paired"), cfg=cfg, max_rounds=cfg.tie_rounds)


def _memory_at(sw: _Sweep, cons: Any, num_workers: int) -> None:
    """Each worker's memory over a pass of ``memory_pass_s`` on ``cons``'s warm workers, bounded by the
    memory of the Python objects the dataset holds (:func:`stagebench.loader._costs.memory_pass`), in
    ``sw.memory`` (None where it reads nothing) with a batch's size in ``sw.batch_mb``."""
    sw.memory = None
    if cons.made_by_live_workers() > MIN_BATCHES * max(1, num_workers):
        # a loader kept open for the rounds in turns: its workers' early growth (a copy-on-read) is behind
        # them, and the pass would miss it; it reads workers that have just started, on a point of its own
        return
    if sw.progress is not None:
        sw.progress.message(
            f"memory over a pass: each worker's private memory at num_workers={num_workers} "
            f"for up to {sw.cfg.memory_pass_s:g} s"
        )
    ds = getattr(sw.factory, "dataset", None)
    t0 = time.perf_counter()
    largest = largest_container(ds) if ds is not None else None
    cons.size_next_batch = True  # a batch's size, for the shared memory the batches in flight take
    mem = memory_pass(
        cons,
        num_workers=num_workers,
        epoch_batches=sw.epoch_batches,
        seconds=sw.cfg.memory_pass_s,
        cap_mb=copy_bound_mb(largest, ds),
    )
    if mem is not None:
        sw.memory, sw.batch_mb = replace(mem, seconds=time.perf_counter() - t0), cons.batch_mb


def _worker_costs(sw: _Sweep, meta: dict[str, Any]) -> dict[str, Any]:
    """What each worker costs beyond throughput (:mod:`stagebench.loader._costs`): the dataset shipped to it,
    and each worker's memory over a pass at the pick's num_workers: read during the stall point where the
    search ran one, else in a pass of its own. ``seconds``: what this added to the sweep (the stall
    point's share is in its row's ``stall_phase_s``)."""
    t0 = time.perf_counter()
    cfg = sw.cfg
    # the memory the job can use now, its loaders closed: what a cgroup's limit leaves, where that is less
    # than the host has available; the limit itself beside it, for the findings to name
    limits = read_limits()
    out: dict[str, Any] = {"available_mb": job_memory_mb(limits)}
    if limits.memory_source == "cgroup" and limits.memory_limit is not None:
        out["memory_limit"] = limits.memory_limit.to_json()
    ship = shipping_cost(sw.factory, backend=sw.backend)
    if ship is not None:  # under fork nothing is shipped: said, not measured
        kept = ship if ship.shipped else Shipping(start_method=ship.start_method, shipped=False, largest=ship.largest)
        out["shipping"] = kept.to_json()
    # the pick as the summary makes it, against the script's own setting: a setting of yours that is kept
    # where the search alone favoured another has its workers' memory read too
    rec = loader_pick(sw.rows, RunMeta.from_json(meta))
    if sw.memory is not None and rec is not None and sw.memory.num_workers != rec.num_workers:
        sw.memory = None  # read at another num_workers than the pick's: read again at the pick's
    out["memory_on_stall_point"] = sw.memory is not None  # its seconds then sit in the stall point's row
    if sw.memory is None and rec is not None and rec.num_workers > 0 and cfg.memory_pass_s > 0:
        # no stall point at the pick (epoch_stall off, or the protocol before): a point of its own, no window
        # and no stall, whose warm workers the pass reads (its row is not a measurement: not recorded)
        knobs = LoaderKnobs(num_workers=rec.num_workers, prefetch_factor=rec.prefetch_factor)
        sw.fresh(knobs, stall=False, throughput=False, during=sw.memory_hook(knobs))
    if sw.memory is not None:
        out["memory"] = sw.memory.to_json()
        if rec is not None:
            # every rank's batches in flight share /dev/shm
            shm = shm_headroom(
                sw.batch_mb, int(rec.num_workers), rec.prefetch_factor or 2, RunMeta.from_json(meta).ranks
            )
            if shm is not None:
                out["shm"] = shm.to_json()
    out["seconds"] = time.perf_counter() - t0
    return out


def _yours_point(sw: _Sweep, user: LoaderKnobs | None) -> LoaderRow | None:
    """The point measured at the script's own setting so far, read as the summary will read it (before run.json
    holds the setting: the backend and CUDA decide which knobs apply); None without a setting of yours."""
    if user is None:
        return None
    meta = RunMeta.from_json(
        {"loader": {"user_knobs": asdict(user), "backend": sw.backend}, "settings": {"cuda": sw.cuda}}
    )
    return user_point(sw.rows, meta)
