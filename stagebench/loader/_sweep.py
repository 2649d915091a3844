"""Loader sweeps: which num_workers / prefetch_factor / persistent_workers / pin_memory to use.

Each point is one setting measured on a fresh loader (:mod:`stagebench.loader._point`: the
protocol). The search over settings (:func:`run_loader_sweep`) is adaptive by default:
num_workers 0, 1, 2, 4, ... until throughput stops improving beyond noise for two
steps, then (when asked) prefetch_factor at the best, then the script's own setting, then the
settings the pick hinges on measured again in turns with their loaders kept open
(:mod:`stagebench.loader._turns`) until the rule of :mod:`stagebench.model._evidence` is settled,
then the epoch stall at the pick. A plain grid is available for comparison.
"""

from __future__ import annotations

import datetime as _dt
import itertools
import math
import sys
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stagebench._errors import RankLost, Terminated
from stagebench.analysis._loader import near_fastest, summarize_loader
from stagebench.core._config import CANNOT_MATTER, in_turns_precision, powers_of_two
from stagebench.core._ranks import alone, leading
from stagebench.loader._config import STRATEGIES, LoaderFactory, LoaderSweepConfig
from stagebench.loader._point import (
    BatchTag,
    BuiltLoader,
    EpochControl,
    TaggedCollate,
    _cuda_available,
    measure_loader_point,
    shut_down,
    timed_window,
    window_rate,
    workers_beyond_cores_unwarned,
)
from stagebench.loader._turns import HeldLoaders
from stagebench.model._knobs import LoaderKnobs
from stagebench.model._limits import HostLimits
from stagebench.model._meta import RunMeta
from stagebench.runs._knobs import KNOWN_BACKENDS, normalize_knobs
from stagebench.runs._outcome import COMPLETE, FAILED, PARTIAL, interrupted_outcome

if TYPE_CHECKING:
    from stagebench.core._progress import Progress
    from stagebench.runs._results import RowWriter, RunDir

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
    "timed_window",
    "workers_beyond_cores_unwarned",
    "STRATEGIES",
]


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
    rows: list[dict[str, Any]] = field(default_factory=list, init=False)
    by_key: dict[LoaderKnobs, dict[str, Any]] = field(default_factory=dict, init=False)  # by effective knobs
    memory: dict[str, Any] | None = field(default=None, init=False)  # the memory pass at the pick, once read
    held: HeldLoaders = field(init=False)  # loaders kept open after their point, for the turns and the stall

    def __post_init__(self) -> None:
        self.held = HeldLoaders(
            self.factory, name=self.name, backend=self.backend, batch_size=self.batch_size, cuda=self.cuda
        )

    def point(self, knobs: LoaderKnobs, phase: str, *, again: bool = False, **how: Any) -> dict[str, Any]:
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
            pf = f", prefetch_factor={eff.prefetch_factor}" if eff.num_workers and eff.prefetch_factor else ""
            said = f"num_workers={eff.num_workers}{pf} not started: {why}"
            if said not in self.stops:
                self.stops.append(said)
            return {"status": "skipped", "reason": said, "num_workers": eff.num_workers}
        if self.progress is not None:
            self.progress.start(f"{self.name} | {eff.label()}{'' if throughput else ' (stall)'}")
        how = {"stall": self.cfg.epoch_stall and self.cfg.stall_at == "every", **how}
        floor = self.floor() if phase == "num_workers" else None
        cfg = self.cfg
        if phase == "num_workers" and cfg.tie_rounds > 0:
            # A screen: the settings near the fastest are compared in turns after it, so its windows close at
            # ±10% (a stage's head-to-head's precision), not at the ±5% that decides nothing here. On the slow-start
            # bench the windows at 2 and 4 workers ran their whole 2 s at ±5%, 0.3-1.8 s at ±10%.
            cfg = replace(cfg, precision=in_turns_precision(cfg.precision))
        row: dict[str, Any] | None = None
        if throughput and not how["stall"]:
            self.make_room(knobs)
            row = self.held.window(knobs, cfg, phase=phase, floor=floor)
        elif not throughput and how["stall"]:
            row = self.held.stall(knobs, cfg, phase=phase, during=how.get("during"))
        if row is None:
            self.make_room(knobs)
            row = self.fresh(knobs, phase, config=cfg, cannot_matter_below=floor, **how)
        if throughput:
            self.by_key.setdefault(eff, row)
        self.record(row, phase)
        self.prune()
        return row

    def fresh(
        self, knobs: LoaderKnobs, phase: str = "", *, config: LoaderSweepConfig | None = None, **how: Any
    ) -> dict[str, Any]:
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
        """Keep open only the loaders the turns may ask for (:func:`stagebench.analysis._loader.turns_to_run`
        takes at most three): yours, the fastest so far, then those near it (:func:`near_fastest`, the
        decision's own rule), cheapest first, as the decision takes them. The others' workers would only
        hold memory, and a loader closed here that the turns then ask for pays its start-up again."""
        ok = [(k, r) for k, r in self.by_key.items() if _ok(r)]
        if not ok:
            self.held.close()
            return
        fastest, top = max(ok, key=lambda kr: kr[1]["samples_per_s"])
        mine = self.held.key(self.cfg.yours) if self.cfg.yours is not None else None
        near = sorted((k for k, r in ok if near_fastest(r, top)), key=LoaderKnobs.cost)
        keys = [k for k in dict.fromkeys([mine, fastest, *near]) if k in self.held.open]
        self.held.keep(set(keys[:_MAX_HELD]))

    def held_mb(self) -> float:
        """The memory the workers of the loaders kept open hold (as their windows read it)."""
        mbs = (self.by_key[k].get("mem_workers_mb") for k in self.held.open if k in self.by_key)
        return sum(x for x in mbs if isinstance(x, float) and math.isfinite(x))

    def predicted_mb(self, num_workers: int) -> float:
        """The main process and ``num_workers`` workers, from the latest point measured ok with workers: each
        worker holds about the same memory (its copy of the dataset object, its batches in flight). NaN
        before any such point.

        Under a memory limit, as the cgroup charges it: a page the workers share with the main process is
        charged once, so the point's memory (its PSS, every page once) and each further worker's private
        pages (:func:`_private_mb`), and each worker's growth over an epoch (:meth:`growth_mb`): a point's
        short window ends before its workers have copied what they read."""
        last = next((r for r in reversed(self.rows) if _ok(r) and r["num_workers"] > 0), None)
        if last is None:
            return math.nan
        k = last["num_workers"]
        private = _private_mb(last) if self.limit_words else math.nan
        if math.isfinite(private):
            return float(last["mem_pss_mb"] + (num_workers - k) * private + num_workers * self.growth_mb())
        return float(last["mem_main_mb"] + num_workers * last["mem_workers_mb"] / k)

    def growth_mb(self) -> float:
        """Each worker's growth over an epoch: the memory pass's reading once made, else the bound on what a
        forked worker copies (:attr:`growth_bound_mb`), else 0."""
        read = (self.memory or {}).get("epoch_growth_mb")
        if isinstance(read, (int, float)) and math.isfinite(read):
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

    def record(self, row: dict[str, Any], phase: str) -> dict[str, Any]:
        """Keep a measured row: written to results.csv at once, and said."""
        self.rows.append(row)
        self.writer.write(row)
        if self.progress is not None:
            # the stall point measures the pause at an epoch's start, not a throughput
            rate_key, unit = (
                ("epoch_stall_s", "s pause at each epoch start")
                if phase == "epoch_stall"
                else ("samples_per_s", "samples/s")
            )
            label = f"{self.name} | {self.backend} {_label_of(row)}" + (" (in turns)" if phase == "paired" else "")
            self.progress.done(row, label=label, rate_key=rate_key, unit=unit)
        return row

    def memory_hook(self, knobs: LoaderKnobs) -> Callable[[Any], None] | None:
        """The memory pass at ``knobs``, run on the stall point's warm workers (saves starting them again:
        a fifth of a small sweep); None where it is off."""
        if not (self.cfg.worker_costs and self.cfg.memory_pass_s > 0):
            return None
        eff, _, _ = normalize_knobs(knobs, self.backend, cuda=self.cuda)

        def during(cons: Any) -> None:
            self.memory = _memory_at(self, cons, eff.num_workers)

        return during

    def floor(self) -> float | None:
        """Samples/s under which a window cannot be the answer (CANNOT_MATTER of the best lower end so far)."""
        lows = [r["samples_per_s_low"] for r in self.rows if _ok(r) and isinstance(r.get("samples_per_s_low"), float)]
        lows = [x for x in lows if math.isfinite(x)]
        return CANNOT_MATTER * max(lows) if lows else None


def _private_mb(row: dict[str, Any]) -> float:
    """Each worker's private memory at a point, from its tree's PSS and USS: the pages counted in the PSS but
    in no process's USS are shared, and a forked worker's PSS holds its share of those it shares with the
    main process (k of the k + 1 sharers' shares for k workers); what is left is its own. NaN where USS was
    not read (0: psutil could not read it)."""
    k, pss, uss, workers = row["num_workers"], row["mem_pss_mb"], row.get("mem_uss_mb"), row["mem_workers_mb"]
    if not (k > 0 and isinstance(uss, float) and math.isfinite(uss) and uss > 0 and math.isfinite(workers)):
        return math.nan
    shared = max(0.0, pss - uss)
    return max(0.0, workers - k / (k + 1) * shared) / k


#: Loaders the search keeps open at most: as many as the turns compare.
_MAX_HELD = 3


def _label_of(row: dict[str, Any]) -> str:
    """The knobs of a measured row, as :meth:`LoaderKnobs.label` writes them."""
    return LoaderKnobs(
        num_workers=int(row["num_workers"]),
        prefetch_factor=_pf(row),
        persistent_workers=row.get("persistent_workers") is True,
        pin_memory=row.get("pin_memory") is True,
    ).label()


def _ok(row: dict[str, Any]) -> bool:
    s = row.get("samples_per_s")
    return row.get("status") == "ok" and isinstance(s, float) and math.isfinite(s) and s > 0


def _adaptive(sw: _Sweep, levels: tuple[int, ...]) -> list[str]:
    """num_workers upwards, then (when asked) prefetch_factor at the best, then the tie-break, then
    the epoch stall at the pick (or, with ``stall_at="every"``, persistence and pinning as before)."""
    from stagebench.analysis._loader import recommend

    cfg, budget_mb = sw.cfg, sw.budget_mb
    stops: list[str] = []
    pf0 = cfg.default_prefetch()
    pin0 = bool(cfg.yours.pin_memory) if sw.cuda and cfg.yours is not None else False
    best: dict[str, Any] | None = None
    stale = 0
    for nw in levels:
        over = sw.over_budget(nw)  # before forking them
        if over:
            stops.append(f"num_workers stopped before {nw}: {over}")
            break
        row = sw.point(
            LoaderKnobs(num_workers=nw, prefetch_factor=pf0 if nw > 0 else None, pin_memory=pin0), "num_workers"
        )
        if row["status"] == "skipped":  # not started: over the budget (said in sw.stops)
            break
        if row["status"] == "failed":
            stops.append(f"stopped: the loader failed at num_workers={nw} ({row['reason']})")
            return stops
        if row["status"] in ("crashed", "timeout"):
            stops.append(f"num_workers stopped at {nw}: {row['status']}; continuing with fewer workers")
            break
        if not _ok(row):
            continue
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
    _measure_yours(sw)  # before the turns, which may keep the script's own
    _in_turns(sw, cfg.yours)
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
        sw.point(knobs, "epoch_stall", stall=True, throughput=False, during=sw.memory_hook(knobs))
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


def _in_turns(sw: _Sweep, user: LoaderKnobs | None) -> None:
    """Measure the settings the pick hinges on again, in turns, their loaders kept open, until the rule of
    :mod:`stagebench.model._evidence` is settled (:mod:`stagebench.loader._turns`), at most ``tie_rounds``
    rounds; the analysis reads the rows (``search_phase`` ``paired``, their round in ``turn``)."""
    from stagebench.analysis._loader import normalize_row, turns_to_run, user_point
    from stagebench.loader._turns import run_turns

    cfg = sw.cfg
    if cfg.tie_rounds <= 0:
        return
    meta_user = _user_meta(user, sw)

    def next_settings() -> list[LoaderKnobs]:
        rows = [normalize_row(r) for r in sw.rows]
        mine = user_point(rows, meta_user) if meta_user else None
        todo = [
            _knobs_of(p)
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


def _memory_at(sw: _Sweep, cons: Any, num_workers: int) -> dict[str, Any] | None:
    """Each worker's memory over a pass of ``memory_pass_s`` on ``cons``'s warm workers, bounded by the
    memory of the Python objects the dataset holds (:func:`stagebench.loader._costs.memory_pass`)."""
    from stagebench.loader._costs import MIN_BATCHES, copy_bound_mb, largest_container, memory_pass

    if cons.made_by_live_workers() > MIN_BATCHES * max(1, num_workers):
        # a loader kept open for the rounds in turns: its workers' early growth is behind them (a
        # 1.5M-record list's, at 303 MB 223 batches in and flat after, read "0.4 MB over an epoch" of the
        # ~280 MB each grew); the pass reads workers that have just started, on a point of its own
        return None
    if sw.progress is not None:
        sw.progress.message(
            f"memory over a pass: each worker's private memory at num_workers={num_workers} "
            f"for up to {sw.cfg.memory_pass_s:g} s"
        )
    ds = getattr(sw.factory, "dataset", None)
    t0 = time.perf_counter()
    largest = (largest_container(ds) if ds is not None else None) or {}
    cons.size_next_batch = True  # a batch's size, for the shared memory the batches in flight take
    mem = memory_pass(
        cons,
        num_workers=num_workers,
        epoch_batches=sw.epoch_batches,
        seconds=sw.cfg.memory_pass_s,
        cap_mb=copy_bound_mb(largest, ds),
    )
    if mem is None:
        return None
    return {"num_workers": num_workers, **mem, "batch_mb": cons.batch_mb, "seconds": time.perf_counter() - t0}


def _worker_costs(sw: _Sweep, meta: dict[str, Any]) -> dict[str, Any]:
    """What each worker costs beyond throughput (:mod:`stagebench.loader._costs`): the dataset shipped to it,
    and each worker's memory over a pass at the pick's num_workers: read during the stall point where the
    search ran one, else in a pass of its own. ``seconds``: what this added to the sweep (the stall
    point's share is in its row's ``stall_phase_s``)."""
    from stagebench.analysis._loader import loader_pick
    from stagebench.loader._costs import shipping_cost, shm_headroom
    from stagebench.runs._limits import job_memory_mb, read_limits

    t0 = time.perf_counter()
    cfg = sw.cfg
    # the memory the job can use now, its loaders closed: what a cgroup's limit leaves, where that is less
    # than the host has available; the limit itself beside it, for the findings to name
    limits = read_limits()
    out: dict[str, Any] = {"available_mb": job_memory_mb(limits)}
    if limits.memory_source == "cgroup" and limits.memory_limit is not None:
        out["memory_limit"] = limits.memory_limit.to_json()
    ship = shipping_cost(sw.factory, backend=sw.backend)
    if ship is not None and ship.get("shipped"):
        out["shipping"] = ship
    elif ship is not None:  # under fork nothing is shipped: said, not measured
        out["shipping"] = {"start_method": ship["start_method"], "shipped": False, "largest": ship.get("largest")}
    # the pick as the summary makes it, against the script's own setting: a kept num_workers=2 whose
    # search alone favoured 0 read no worker's memory (a 1.5M-record list, copy-on-read, unsaid)
    rec = loader_pick(sw.rows, meta)
    if sw.memory is not None and rec is not None and sw.memory.get("num_workers") != rec["num_workers"]:
        sw.memory = None  # read at another num_workers than the pick's: read again at the pick's
    out["memory_on_stall_point"] = sw.memory is not None  # its seconds then sit in the stall point's row
    if sw.memory is None and rec is not None and rec["num_workers"] > 0 and cfg.memory_pass_s > 0:
        # no stall point at the pick (epoch_stall off, or the protocol before): a point of its own, no window
        # and no stall, whose warm workers the pass reads (its row is not a measurement: not recorded)
        knobs = LoaderKnobs(num_workers=rec["num_workers"], prefetch_factor=_pf(rec))
        sw.fresh(knobs, stall=False, throughput=False, during=sw.memory_hook(knobs))
    if sw.memory is not None:
        out["memory"] = dict(sw.memory)
        batch_mb = out["memory"].pop("batch_mb", math.nan)
        if rec is not None:
            # every rank's batches in flight share /dev/shm
            shm = shm_headroom(batch_mb, int(rec["num_workers"]), _pf(rec) or 2, RunMeta.from_json(meta).ranks)
            if shm is not None:
                out["shm"] = shm
    out["seconds"] = time.perf_counter() - t0
    return out


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


def _memory_budget(cfg: LoaderSweepConfig, limits: HostLimits | None, ranks: int = 1) -> tuple[float, str]:
    """The memory one rank's loader may hold, its main process and workers together, and where it came
    from: the main process's PSS and its share of ``memory_share`` of the memory the job can use (what a
    cgroup's limit leaves where it leaves less than the host has available, else the host's available
    memory), split between the host's ``ranks`` (each runs a loader as large)."""
    if cfg.memory_budget_mb is not None:
        return float(cfg.memory_budget_mb), "memory_budget_mb"
    from stagebench.core._resources import tree_pss_mb
    from stagebench.runs._limits import job_memory_mb

    room = job_memory_mb(limits)
    bound = "" if limits is None else limits.memory_bound()
    source = f"main process PSS + {cfg.memory_share:g} x " + (f"the {bound}" if bound else "available RAM at start")
    if ranks > 1:
        source += f", split between the host's {ranks} ranks"
    return tree_pss_mb(()) + cfg.memory_share * room / ranks, source


def _growth_bound_mb(factory: LoaderFactory, backend: str) -> float:
    """What each forked worker may copy over an epoch (the Python objects its dataset reads:
    :func:`stagebench.loader._costs.copy_bound_mb`); NaN where the workers are not forked, the dataset holds
    no such objects, or SPDL's loader copies the dataset into each worker at its start."""
    from stagebench.loader._costs import copy_bound_mb, largest_container, start_method

    ds = getattr(factory, "dataset", None)
    if ds is None or backend == "spdl_pytorch" or start_method(factory) != "fork":
        return math.nan
    try:
        bound = copy_bound_mb(largest_container(ds), ds)
    except Exception:  # a dataset we cannot size bounds nothing; the sweep goes on
        return math.nan
    return math.nan if bound is None else float(bound)


# ------------------------------------------------------------------------ the run
@dataclass(frozen=True)
class _Run:
    """A sweep's run directory, its ``run.json`` as written so far, and what the search plans with."""

    dir: RunDir
    meta: dict[str, Any]
    cuda: bool
    budget_mb: float
    #: where a cgroup's memory limit sets the budget, in words (empty: the host's memory does)
    limit_words: str
    levels: tuple[int, ...]
    grid: list[tuple[LoaderKnobs, LoaderKnobs, list[str]]]
    epoch_batches: int | None  # batches in an epoch, where the loader says (``extra_meta["loader"]``)


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
    from stagebench.runs._results import RowWriter
    from stagebench.runs._schema import LOADER_COLUMNS

    cfg = config or LoaderSweepConfig()
    _check_arguments(factory, name=name, backend=backend, batch_size=batch_size, target_rate=target_rate)
    # Imported now, not inside the first point's time; and before the run opens, where a Ctrl-C
    # during this second-long import leaves no run.json saying "running" and no rows without a report.
    from scipy import special  # noqa: F401

    run = _open_run(
        run_dir, cfg, name=name, backend=backend, batch_size=batch_size, target_rate=target_rate, extra_meta=extra_meta
    )
    own_progress = progress is None
    if own_progress:
        progress = Progress(desc=f"loader {name}")
    progress.set_total(len(run.grid) if cfg.strategy == "grid" else len(run.levels) + len(cfg.prefetch_factors) + 2)
    sw = _Sweep(
        factory,
        name=name,
        backend=backend,
        batch_size=batch_size,
        cfg=cfg,
        cuda=run.cuda,
        writer=RowWriter(run.dir.results_csv, LOADER_COLUMNS),
        progress=progress,
        budget_mb=run.budget_mb,
        epoch_batches=run.epoch_batches,
        limit_words=run.limit_words,
        growth_bound_mb=_growth_bound_mb(factory, backend) if run.limit_words else math.nan,
    )
    interrupted = _search(sw, run)
    if interrupted is None:  # what is measured beside the search wants a search that ran to its end
        interrupted = _measure_beside(sw, run)
    summary, unwritten = _close_run(run, interrupted, progress)
    if own_progress:
        progress.close()
    if interrupted is not None:  # raised again, of its own kind (a rank lost ends the run as its own outcome)
        report = run.dir.path / "report.html"
        where = f"the rows measured so far are in {run.dir.path}" + (
            f", and a report of them: {report}" if report.is_file() and not unwritten else ""
        )
        raise type(interrupted)(f"{interrupted}; {where}" if str(interrupted) else where)
    if unwritten:
        summary["unwritten"] = unwritten  # the caller says it and exits with PARTIAL's code
    return summary


def _check_arguments(factory: Any, *, name: Any, backend: Any, batch_size: Any, target_rate: Any) -> None:
    """Raise ValueError for an argument of :func:`run_loader_sweep` it cannot sweep with, before anything is written."""
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


def _open_run(
    run_dir: Path | str,
    cfg: LoaderSweepConfig,
    *,
    name: str,
    backend: str,
    batch_size: int,
    target_rate: float | None,
    extra_meta: dict[str, Any] | None,
) -> _Run:
    """Create the run directory and write its ``run.json`` (status ``running``): the machine, the settings
    and the plan of the search, with ``extra_meta`` merged in (its ``loader`` into the loader's own)."""
    from stagebench.runs._provenance import collect_provenance
    from stagebench.runs._results import RunDir
    from stagebench.runs._schema import RESULTS_SCHEMA_VERSION

    rd = RunDir.create(run_dir, fresh=True)
    prov = collect_provenance()
    limits = HostLimits.from_json(prov.get("limits"))
    cuda = _cuda_available()
    ranks = RunMeta.from_json({"provenance": prov}).ranks
    budget_mb, budget_source = _memory_budget(cfg, limits, ranks)
    usable = prov.get("usable_cores") or 1
    # the host's ranks share its cores: each rank's num_workers are searched up to twice its share
    share = usable / ranks
    levels = _levels(cfg, backend, share)
    grid = plan_grid(cfg, backend, cuda=cuda, usable_cores=share)
    loader_meta: dict[str, Any] = {"name": name, "backend": backend, "batch_size": batch_size}
    meta: dict[str, Any] = {
        "schema_version": RESULTS_SCHEMA_VERSION,
        "kind": "loader",
        "status": "running",
        "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": list(sys.argv),
        "provenance": prov,
        "settings": {
            **cfg.to_dict(),
            "memory_budget_mb": budget_mb,
            "memory_budget_source": budget_source,
            "cuda": cuda,
            "usable_cores": usable,
            **({"ranks": ranks, "cores_per_rank": share} if ranks > 1 else {}),
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
    words = limits.memory_bound() if limits is not None and cfg.memory_budget_mb is None else ""
    return _Run(rd, meta, cuda, budget_mb, words, levels, grid, epoch_batches=loader_meta.get("epoch_batches"))


def _search(sw: _Sweep, run: _Run) -> KeyboardInterrupt | None:
    """The search, by ``cfg.strategy``, its rows written as they land; then ``run.json["search"]``: how it
    went and why it stopped. Returns the interrupt that cut it short, if one did (Ctrl-C, SIGTERM, a rank lost)."""
    cfg = sw.cfg
    t_search = time.perf_counter()
    stops: list[str] = []
    interrupted: KeyboardInterrupt | None = None
    try:
        with workers_beyond_cores_unwarned():
            if cfg.strategy == "grid":
                for req, _eff, _notes in run.grid:
                    sw.point(req, "grid")
                _measure_yours(sw)
                _in_turns(sw, cfg.yours)
            else:
                stops = _adaptive(sw, run.levels)
    except KeyboardInterrupt as e:
        interrupted = _rank_lost(e)
    finally:
        sw.held.close(hung=interrupted is not None)  # on Ctrl-C, without waiting for the workers
        sw.writer.close()
    seconds = time.perf_counter() - t_search
    stops = [*stops, *(s for s in sw.stops if s not in stops)]
    run.meta["search"] = {
        "strategy": cfg.strategy,
        "seconds": seconds,
        "stopped": stops,
        "interrupted": interrupted is not None,
    }
    return interrupted


def _rank_lost(e: KeyboardInterrupt) -> KeyboardInterrupt:
    """The interrupt as the run ends by it: SIGTERM where a rank of a ranked sweep is gone is that rank lost
    (torch's launcher terminates the others once one rank ended with a code other than 0)."""
    group = leading()
    if isinstance(e, Terminated) and group is not None:
        try:
            why = group.lost()
        except RankLost as lost:
            return lost
        if why is not None:
            return RankLost(why)
    return e


def _measure_beside(sw: _Sweep, run: _Run) -> KeyboardInterrupt | None:
    """What is measured beside the search, each where asked, into ``run.json``:
    what each worker costs, then the transforms alone. Returns the interrupt that cut them short, if one
    did (then ``run.json["search"]["interrupted"]`` says so too)."""
    try:
        if sw.cfg.worker_costs:
            _worker_costs_into(sw, run)
        if sw.cfg.transforms:
            _transforms_into(sw, run)
    except KeyboardInterrupt as e:
        run.meta["search"]["interrupted"] = True
        return _rank_lost(e)
    return None


def _worker_costs_into(sw: _Sweep, run: _Run) -> None:
    """``run.json["worker_costs"]`` (:func:`_worker_costs`); where it fails, a warning instead."""
    try:
        with workers_beyond_cores_unwarned():  # its own memory pass may start the pick's workers again
            run.meta["worker_costs"] = _worker_costs(sw, run.meta)
    except Exception as e:  # a measurement beside the sweep: its failure loses none of the sweep's rows
        said = f"what each worker costs was not measured: {type(e).__name__}: {e}"[:300]
        run.meta.setdefault("warnings", []).append(said)
        if sw.progress is not None:
            sw.progress.message(said)


def _transforms_into(sw: _Sweep, run: _Run) -> None:
    """``run.json["transforms"]``: the dataset's transforms measured alone, where the factory has a dataset.

    In a ranked sweep on local rank 0 alone, the other ranks waiting: what each transform costs an item
    is the question, not what the host delivers, and the other ranks' loaders hold no transforms of theirs
    to run as stages (each entry's ``note`` says so)."""
    ds = getattr(sw.factory, "dataset", None)
    if ds is not None:
        from stagebench.loader._transforms import isolate_transforms

        ranked = leading() is not None
        with alone():
            got = isolate_transforms(ds, run_dir=run.dir.path, config=sw.cfg, progress=sw.progress)
        if ranked:
            for t in got:
                t["note"] = "; ".join(x for x in (t.get("note"), "measured on local rank 0 alone") if x)
        run.meta["transforms"] = got


def _close_run(run: _Run, interrupted: KeyboardInterrupt | None, progress: Any) -> tuple[dict[str, Any], str | None]:
    """Write ``run.json``, ``summary.json`` and ``report.html`` from the rows kept (after an interrupt too),
    then the run's final status. Returns (the summary, why a file could not be written, or None)."""
    from stagebench.runs._provenance import collect_provenance
    from stagebench.runs._results import read_rows

    rd, meta = run.dir, run.meta
    meta["provenance_after"] = collect_provenance()
    meta["status"] = interrupted_outcome(interrupted).status if interrupted is not None else "running"
    rd.write_meta(meta)
    rows = read_rows(rd.results_csv)
    summary = summarize_loader(rows, meta)
    unwritten = None
    try:
        rd.write_summary(summary)
    except OSError as e:
        unwritten = f"summary.json not written: {type(e).__name__}: {e}"
    # the report of what was measured: after an interrupt too, from the rows kept
    unwritten = unwritten or _write_report(rd.path, progress)
    if interrupted is None:
        meta["status"] = (
            PARTIAL.status if unwritten else FAILED.status if summary.get("recommended") is None else COMPLETE.status
        )
        try:
            rd.write_meta(meta)
        except OSError as e:
            unwritten = unwritten or f"run.json not written: {type(e).__name__}: {e}"
    return summary, unwritten


def _write_report(path: Path, progress: Any) -> str | None:
    """Write report.html; returns why it could not be written (a full disk, ...), else None."""
    try:
        from stagebench.report._render import write_report
    except ImportError:
        progress.message("report.html not written: the report module is not available in this install")
        return None
    try:
        write_report(path)
    except OSError as e:  # the rows and summary are already safe on disk
        return f"report.html not written: {type(e).__name__}: {e}"
    except Exception as e:  # stagebench's own bug in the report: the rows and summary are safe, said
        progress.message(f"report.html not written: internal error: {type(e).__name__}: {e}")
    return None
