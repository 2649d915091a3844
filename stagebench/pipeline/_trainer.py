"""``STAGEBENCH_TRAINER=measure`` for an SPDL pipeline: the job phase (:mod:`stagebench.job._phase`) on the pipeline.

The diagnosis does not exit after the report: the stand-in pipeline the user's loop iterates hands it
first cached real batches (the pipeline's own output at the recommended settings, collected once:
:func:`collect_batches`), then the real pipeline rebuilt at each candidate setting
(:mod:`stagebench.analysis._pipeline_job`) over the cached source items. On a CPU-only machine the
loop and the pipeline share the cores: these runs are where that shows. Then ``run.json`` gets
``trainer`` and ``job``, the summary and report are written again (the job's pick is the
recommendation), and the program exits as a diagnosis does.

Opt-in, because the loop body then runs: it may write checkpoints or logs, or step an optimiser on
repeated batches. Everything here runs in the user's main thread, between their ``next()`` calls.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Generator, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Any

from stagebench.analysis._pipeline import job_candidates_of_run
from stagebench.core._jobrun import Candidate, Feed, Ladder
from stagebench.core._ranks import HostGroup
from stagebench.core._spdl_harness import quiet_spdl_log
from stagebench.core._steps import CACHED_BATCHES, TrainerProbe
from stagebench.job._lockstep import Lockstep, follow_job
from stagebench.job._phase import JobPlan, trainer_phases
from stagebench.model._rate import Rate
from stagebench.pipeline._isolate import build_validation_config, default_threads, real_pipeline
from stagebench.pipeline._run import Session
from stagebench.runs._results import RunDir, read_rows

__all__ = ["collect_batches", "run_trainer_phases", "open_candidate", "follower_trainer_phases"]


@contextlib.contextmanager
def _running(plan: Any, source_items: list, choices: Mapping, gate: threading.Event | None = None) -> Iterator[Any]:
    """The user's pipeline at ``choices`` (stage name -> (executor, concurrency), or a candidate's lists),
    started over the cached source items (cycled); stopped after.

    ``gate``: while it is clear, the source draws no item (SPDL's source thread waits), so the stages
    finish what they hold and idle: a pipeline waiting for its turn in the job runs.
    """
    stop = threading.Event()

    def cycle():
        while True:
            for item in source_items:
                if gate is not None:
                    gate.wait()
                if stop.is_set():
                    return
                yield item

    chosen = {name: (str(ex), int(c)) for name, (ex, c) in choices.items()}
    cfg, closers, _ = build_validation_config(plan, chosen, cycle())
    pipeline = real_pipeline(cfg, default_threads(plan))
    with quiet_spdl_log():
        pipeline.start()
        try:
            yield pipeline
        finally:
            stop.set()
            if gate is not None:
                gate.set()  # a source waiting for its turn wakes up to stop
            with contextlib.suppress(Exception):
                pipeline.stop(timeout=10)
            for close in closers:
                with contextlib.suppress(Exception):
                    close()


#: A pipeline whose source is closed is empty once no item reaches the sink for this long.
EMPTY_AFTER_S = 0.2


def empty_pipeline(pipeline: Any, quiet_s: float = EMPTY_AFTER_S, most_s: float = 10.0) -> int:
    """Take what reaches the sink of a pipeline whose source is closed, until none comes for ``quiet_s``
    (at most ``most_s``); returns how many items."""
    n, t_end = 0, time.perf_counter() + most_s
    while time.perf_counter() < t_end:
        try:
            pipeline.get_item(timeout=quiet_s)
        except (TimeoutError, EOFError):
            break
        n += 1
    return n


def collect_batches(plan: Any, source_items: list, choices: Mapping, n: int, timeout_s: float) -> list:
    """The first ``n`` items the real pipeline delivers at ``choices`` (its sink's batches)."""
    out: list = []
    with _running(plan, source_items, choices) as pipeline:
        deadline = time.perf_counter() + timeout_s
        while len(out) < n and time.perf_counter() < deadline:
            try:
                out.append(pipeline.get_item(timeout=max(0.1, deadline - time.perf_counter())))
            except (TimeoutError, EOFError):
                break
    return out


def run_trainer_phases(
    session: Session,
    settings: Any,
    say: Callable[[str], None],
    end: Callable[[int], None],
    group: HostGroup | None = None,
) -> Generator[Any, None, int]:
    """Both phases, as a generator the stand-in pipeline's iterator delegates to; returns the exit code.

    ``session``: what :func:`stagebench.pipeline._diagnose.diagnose_pipeline` left for this
    (the plan, the cached source items, the recommended choices, the run directory).
    ``end``: how to end the program when the user's loop stops early (the generator is
    then being closed, where an exception raised would be ignored). ``group``: the host's ranks, where
    it runs several: every rank's loop runs the same steps (:mod:`stagebench.job._lockstep`).
    """
    ranks = 1 if group is None else group.size
    k = float(session.items_per_sink_item)
    lock = None if group is None else Lockstep(group)
    # a ranked job: a step takes a batch on every rank, and the job's figures are the host's items
    probe = TrainerProbe(seconds=settings.trainer_s, items_per_batch=k * ranks, say=say)
    plan, items, run_dir = session.plan, session.source_items, session.run_dir
    assert run_dir is not None, "the diagnosis fills the session before the job phase"

    def candidates(demand: Rate | None) -> Ladder:
        rd = RunDir(run_dir)
        return job_candidates_of_run(read_rows(rd.results_csv), rd.read_meta(), demand)

    def opened(cand: Candidate) -> AbstractContextManager[Feed]:
        return open_candidate(plan, items, cand.settings, settings.timeout_s)

    def cached() -> list:
        if lock is not None:
            lock.cached({name: list(v) for name, v in session.choices.items()})
            probe.tell = lock.cached_step
        return collect_batches(plan, items, session.choices, CACHED_BATCHES, settings.timeout_s)

    job = JobPlan(
        candidates,
        opened if lock is None else lock.opener(opened),
        items_per_step=k * ranks,
        max_slice_s=settings.trainer_s,
        budget_s=settings.job_s,
        what="the real pipeline" if group is None else f"the real pipeline of each of the host's {ranks} ranks",
    )
    if lock is not None:
        lock.begin()
    return (yield from trainer_phases(probe, cached, job, run_dir, end))


@contextlib.contextmanager
def open_candidate(plan: Any, items: list, settings: Mapping[str, Any], timeout_s: float) -> Iterator[Feed]:
    """The user's pipeline at a candidate's ``settings`` (stage name -> [executor, concurrency]), as a
    :class:`Feed` the job runs take batches from, pause (its source closes and what the stages hold is
    taken) and resume."""
    gate = threading.Event()
    gate.set()
    with _running(plan, items, settings, gate) as pipeline:

        def get() -> Any:
            return pipeline.get_item(timeout=timeout_s)

        def pause() -> int:
            """Waiting for its turn: the source closes and what the stages hold is taken, so that the next
            turn starts from an empty pipeline (its items spread over every stage's queue: no timing of
            the sink alone tells where they end)."""
            gate.clear()
            return empty_pipeline(pipeline)

        def resume() -> int:
            gate.set()
            return 0

        yield Feed(get=get, drain=resume, pause=pause)


def follower_trainer_phases(
    group: HostGroup, plan: Any, items: list, timeout_s: float, say: Callable[[str], None], end: Callable[[int], None]
) -> Generator[Any, None, None]:
    """A follower's job phase on its own pipeline: its loop handed its own batches from the setting the
    leader names, step by step (:func:`stagebench.job._lockstep.follow_job`)."""
    return follow_job(
        group,
        lambda s: open_candidate(plan, items, s, timeout_s),
        lambda s: collect_batches(plan, items, s, CACHED_BATCHES, timeout_s),
        say,
        end,
    )
