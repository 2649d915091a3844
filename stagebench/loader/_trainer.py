"""``STAGEBENCH_TRAINER=measure`` on a DataLoader: the job phase (:mod:`stagebench.job._phase`) on loaders
built by the sweep's factory, one per candidate setting, kept open between its turns where they fit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from stagebench.analysis._loader_job import job_candidates
from stagebench.core._jobrun import Feed, Ladder, drain_queued
from stagebench.core._ranks import HostGroup
from stagebench.core._steps import CACHED_BATCHES, TrainerProbe
from stagebench.job._lockstep import Lockstep, follow_job
from stagebench.job._phase import JobPlan, end_from_close, trainer_phases
from stagebench.loader._built import BatchTag, BuiltLoader, shut_down
from stagebench.loader._point import workers_beyond_cores_unwarned
from stagebench.model._knobs import LoaderKnobs
from stagebench.model._rate import Rate
from stagebench.runs._results import RunDir, read_rows

__all__ = ["loader_trainer_phases", "follower_trainer_phases"]


def loader_trainer_phases(
    factory: Any,
    run_dir: Path,
    *,
    cached_knobs: Any,
    seconds: float,
    job_s: float | None,
    say: Callable[[str], None],
    end: Callable[[int], None],
    group: HostGroup | None = None,
) -> Generator[Any, None, int]:
    """Both phases on DataLoaders built by the sweep's ``factory``; returns the exit code.

    ``cached_knobs``: the setting whose batches the step is measured on (the user's pin_memory on a
    host with a CUDA device: the batches are then what the loop will receive). ``group``: the host's
    ranks, where it runs several: every rank's loop runs the same steps (:mod:`stagebench.job._lockstep`),
    and the job's figures are the host's samples (a step takes a batch on every rank).
    """
    ranks = 1 if group is None else group.size
    lock = None if group is None else Lockstep(group)
    probe = TrainerProbe(
        seconds=seconds,
        items_per_batch=float(factory.batch_size * ranks),
        say=say,
        pinned=bool(cached_knobs.pin_memory) if _has_cuda(run_dir) else None,
    )

    def cached() -> list:
        if lock is not None:
            lock.cached(asdict(cached_knobs))
            probe.tell = lock.cached_step
        return _cached_batches(factory, cached_knobs)

    def candidates(demand: Rate | None) -> Ladder:
        rd = RunDir(run_dir)
        return job_candidates(read_rows(rd.results_csv), rd.read_meta(), demand)

    def open_candidate(cand: Any) -> Any:
        return _opened(factory, LoaderKnobs(**cand.settings))

    plan = JobPlan(
        candidates,
        open_candidate if lock is None else lock.opener(open_candidate),
        items_per_step=float(factory.batch_size * ranks),
        max_slice_s=seconds,
        budget_s=job_s,
        what="the real loader" if group is None else f"the real loader of each of the host's {ranks} ranks",
    )
    if lock is not None:
        lock.begin()
    return (yield from trainer_phases(probe, cached, plan, run_dir, end))


def follower_trainer_phases(group: HostGroup, factory: Any, say: Callable[[str], None]) -> Generator[Any, None, None]:
    """A follower's job phase on DataLoaders built by its own ``factory``: its loop handed its own batches
    from the setting the leader names, step by step (:func:`stagebench.job._lockstep.follow_job`)."""
    return follow_job(
        group,
        lambda settings: _opened(factory, LoaderKnobs(**settings)),
        lambda settings: _cached_batches(factory, LoaderKnobs(**settings)),
        say,
        end_from_close,
    )


def _cached_batches(factory: Any, knobs: Any) -> list:
    """The step alone's batches: :data:`CACHED_BATCHES` of a loader at ``knobs``, as it delivers them."""
    batches = []
    with _opened(factory, knobs) as feed:
        for _ in range(CACHED_BATCHES):
            try:
                batches.append(feed.get())
            except EOFError:
                break
    return batches


def _has_cuda(run_dir: Path) -> bool:
    return bool((RunDir(run_dir).read_meta().get("settings") or {}).get("cuda"))


@contextlib.contextmanager
def _opened(factory: Any, knobs: Any) -> Iterator[Feed]:
    """A fresh loader at ``knobs`` whose epochs never end; yields its :class:`Feed` (the next user batch, and
    the drain of what its workers queued while it waited for its turn)."""
    with workers_beyond_cores_unwarned():  # torch warns when the loader is built, and again at each iter()
        built = factory(knobs)
    if not isinstance(built, BuiltLoader):
        built = BuiltLoader(loader=built)
    if built.control is not None:
        built.control.cycle()  # one epoch for the whole slice: a job slice measures steps, not boundaries
    state: dict[str, Any] = {"it": None}

    def fresh() -> Any:
        with workers_beyond_cores_unwarned():  # not around the user's steps: only torch's own calls
            state["it"] = iter(built.loader)
        return state["it"]

    def get() -> Any:
        it = state["it"] if state["it"] is not None else fresh()
        try:
            item = next(it)
        except StopIteration:  # an iterable dataset that ends: a new epoch, with what that costs
            try:
                item = next(fresh())
            except StopIteration:
                raise EOFError("the loader yields no batches") from None
        return item.batch if isinstance(item, BatchTag) else item  # the user's own batch, out of the sweep's tag

    def drain() -> int:
        if knobs.num_workers == 0:
            return 0  # nothing is made ahead without workers
        if getattr(factory, "backend", "torch") == "torch":  # each batch taken sends one index: the depth is known
            return drain_queued(get, count=knobs.num_workers * (knobs.prefetch_factor or 2))
        return drain_queued(get)

    try:
        yield Feed(get=get, drain=drain)
    finally:
        shut_down(state["it"], built)
