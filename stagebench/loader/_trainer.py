"""``STAGEBENCH_TRAINER=measure`` on a DataLoader: the job phase (:mod:`stagebench.job._phase`) on loaders
built by the sweep's factory, one per candidate setting, kept open between its turns where they fit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

from stagebench.core._jobrun import Feed, Ladder, drain_queued
from stagebench.core._steps import CACHED_BATCHES, TrainerProbe
from stagebench.job._phase import JobPlan, trainer_phases

__all__ = ["loader_trainer_phases"]


def loader_trainer_phases(
    factory: Any,
    run_dir: Path,
    *,
    cached_knobs: Any,
    seconds: float,
    job_s: float | None,
    say: Callable[[str], None],
    end: Callable[[int], None],
) -> Generator[Any, None, int]:
    """Both phases on DataLoaders built by the sweep's ``factory``; returns the exit code.

    ``cached_knobs``: the setting whose batches the step is measured on (the user's pin_memory on a
    host with a CUDA device: the batches are then what the loop will receive).
    """
    from stagebench.model._knobs import LoaderKnobs

    probe = TrainerProbe(
        seconds=seconds,
        items_per_batch=float(factory.batch_size),
        say=say,
        pinned=bool(cached_knobs.pin_memory) if _has_cuda(run_dir) else None,
    )

    def cached() -> list:
        batches = []
        with _opened(factory, cached_knobs) as feed:
            for _ in range(CACHED_BATCHES):
                try:
                    batches.append(feed.get())
                except EOFError:
                    break
        return batches

    def candidates(demand: dict[str, Any]) -> Ladder:
        from stagebench.analysis._loader import job_candidates
        from stagebench.runs._results import RunDir, read_rows

        rd = RunDir(run_dir)
        return job_candidates(read_rows(rd.results_csv), rd.read_meta(), demand)

    plan = JobPlan(
        candidates,
        lambda cand: _opened(factory, LoaderKnobs(**cand.settings)),
        items_per_step=float(factory.batch_size),
        max_slice_s=seconds,
        budget_s=job_s,
        what="the real loader",
    )
    return (yield from trainer_phases(probe, cached, plan, run_dir, end))


def _has_cuda(run_dir: Path) -> bool:
    from stagebench.runs._results import RunDir

    return bool((RunDir(run_dir).read_meta().get("settings") or {}).get("cuda"))


@contextlib.contextmanager
def _opened(factory: Any, knobs: Any) -> Iterator[Feed]:
    """A fresh loader at ``knobs`` whose epochs never end; yields its :class:`Feed` (the next user batch, and
    the drain of what its workers queued while it waited for its turn)."""
    from stagebench.loader._sweep import BatchTag, BuiltLoader, shut_down, workers_beyond_cores_unwarned

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
