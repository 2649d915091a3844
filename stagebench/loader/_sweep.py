"""Loader sweeps: which num_workers / prefetch_factor / persistent_workers / pin_memory to use.

:func:`run_loader_sweep` sets up a run (its directory, provenance, memory budget, the host's ranks),
runs the search over settings (:mod:`stagebench.loader._search`, each point measured by the protocol
of :mod:`stagebench.loader._point`), and writes the summary.
"""

from __future__ import annotations

import datetime as _dt
import math
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from stagebench._errors import RankLost, Terminated
from stagebench._signals import ending
from stagebench.analysis._loader import summarize_loader
from stagebench.core._progress import Progress
from stagebench.core._ranks import alone, leading
from stagebench.core._resources import tree_pss_mb
from stagebench.loader._built import _cuda_available
from stagebench.loader._config import LoaderFactory, LoaderSweepConfig
from stagebench.loader._costs import copy_bound_mb, largest_container, start_method
from stagebench.loader._point import workers_beyond_cores_unwarned
from stagebench.loader._search import _adaptive, _in_turns, _levels, _measure_yours, _Sweep, _worker_costs, plan_grid
from stagebench.loader._transforms import isolate_transforms
from stagebench.model._knobs import LoaderKnobs
from stagebench.model._limits import HostLimits
from stagebench.model._meta import RunMeta
from stagebench.runs._knobs import KNOWN_BACKENDS
from stagebench.runs._limits import job_memory_mb
from stagebench.runs._outcome import COMPLETE, FAILED, PARTIAL, interrupted_outcome
from stagebench.runs._provenance import collect_provenance
from stagebench.runs._results import RowWriter, RunDir, read_rows
from stagebench.runs._schema import LOADER_COLUMNS, RESULTS_SCHEMA_VERSION

__all__ = ["LoaderSweepConfig", "run_loader_sweep"]


def _memory_budget(cfg: LoaderSweepConfig, limits: HostLimits | None, ranks: int = 1) -> tuple[float, str]:
    """The memory one rank's loader may hold, its main process and workers together, and where it came
    from: the main process's PSS and its share of ``memory_share`` of the memory the job can use (what a
    cgroup's limit leaves where it leaves less than the host has available, else the host's available
    memory), split between the host's ``ranks`` (each runs a loader as large)."""
    if cfg.memory_budget_mb is not None:
        return float(cfg.memory_budget_mb), "memory_budget_mb"
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
    env_as_given: Mapping[str, str | None] | None = None,
) -> dict[str, Any]:
    """Sweep a loader's knobs and write the run directory; returns the summary.

    ``factory(knobs)`` must build a fresh loader each call. ``batch_size`` turns
    batches into samples where the batches are not tagged (tagged batches count
    their real samples). ``target_rate``: samples/s the trainer consumes.
    Writes ``run.json`` first, ``results.csv`` row by row, then ``summary.json``
    and ``report.html``. ``KeyboardInterrupt`` propagates after the summary of
    the rows measured so far is written. ``env_as_given``: variables the caller changed for the sweep, with
    the values the user gave them (None: unset), which the provenance records (the diagnostic mode's, set
    to 0 while a caught DataLoader is swept).
    """
    cfg = config or LoaderSweepConfig()
    _check_arguments(factory, name=name, backend=backend, batch_size=batch_size, target_rate=target_rate)
    # Imported now, not inside the first point's time; and before the run opens, where a Ctrl-C
    # during this second-long import leaves no run.json saying "running" and no rows without a report.
    from scipy import special  # noqa: F401

    run = _open_run(
        run_dir,
        cfg,
        name=name,
        backend=backend,
        batch_size=batch_size,
        target_rate=target_rate,
        extra_meta=extra_meta,
        env_as_given=env_as_given,
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
    env_as_given: Mapping[str, str | None] | None = None,
) -> _Run:
    """Create the run directory and write its ``run.json`` (status ``running``): the machine, the settings
    and the plan of the search, with ``extra_meta`` merged in (its ``loader`` into the loader's own)."""
    rd = RunDir.create(run_dir, fresh=True)
    prov = collect_provenance(env_as_given)
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
            **asdict(cfg),
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
    (torch's launcher terminates the others once one rank ended with a code other than 0). From here on the
    run is ending, and a further SIGTERM does nothing (:func:`stagebench._signals.ending`)."""
    ending()
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
    rd, meta = run.dir, run.meta
    meta["provenance_after"] = collect_provenance()
    meta["status"] = interrupted_outcome(interrupted).status if interrupted is not None else "running"
    rd.write_meta(meta)
    try:
        rows = read_rows(rd.results_csv)
        summary = summarize_loader(rows, meta)
        unwritten = None
        try:
            rd.write_summary(summary)
        except OSError as e:
            unwritten = f"summary.json not written: {type(e).__name__}: {e}"
        # the report of what was measured: after an interrupt too, from the rows kept
        unwritten = unwritten or _write_report(rd.path, progress)
    except KeyboardInterrupt as e:  # while closing: the run ends by it, and run.json says so, not "running"
        cut = interrupted or _rank_lost(e)
        meta["status"] = interrupted_outcome(cut).status
        rd.write_meta(meta)
        raise cut from None
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
        from stagebench.report._render import write_report  # start-up cost: pandas and jinja2, only for the report
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
