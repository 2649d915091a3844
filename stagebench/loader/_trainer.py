"""``STAGEBENCH_TRAINER=measure``: the user's own loop measured, then run at the candidate settings.

Shared by DataLoader and SPDL pipeline diagnoses. :func:`trainer_phases` is the generator the user's
loop iterates instead of their loader:

1. **The step alone** on cached batches, as the loader delivers them (pinned when it pins on a host
   with a CUDA device: a step that copies pageable memory to the device waits for the driver to
   stage it, so it reads slower than the job will run), until its rate is known to ±3%
   (:class:`stagebench.core._steps.TrainerProbe`): the demand, written to ``run.json["trainer"]``.
2. **The job**: the analysis names the candidates from the isolated sweep and that demand (yours,
   the cheapest that feeds it, a step above, the fastest alone); the loop runs on the real loader or
   pipeline at each, in turns (:class:`stagebench.core._jobrun.JobRuns`), and ``run.json["job"]``
   keeps every step's wait and body.
3. The summary, the report and a few lines on the terminal, then the program ends.

A loop that stops early (``break``, an exception) ends the phase it is in: what was measured is
written, and the summary says what did not run. :func:`loader_trainer_phases` adapts this to a
DataLoader (a fresh loader per slice, built by the sweep's factory).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Generator, Iterator
from dataclasses import KW_ONLY, dataclass
from pathlib import Path
from typing import Any

from stagebench.core._jobrun import Candidate, JobRuns, Opener
from stagebench.core._steps import CACHED_BATCHES, TrainerProbe

__all__ = ["finish_trainer", "trainer_phases", "loader_trainer_phases", "end_from_close", "JobPlan"]


@dataclass(frozen=True)
class JobPlan:
    """What the job phase needs besides the loop: the candidates (from the demand) and how to open one."""

    candidates: Callable[[dict[str, Any]], list[Candidate]]
    open_candidate: Opener
    _: KW_ONLY
    items_per_step: float
    max_slice_s: float
    budget_s: float
    what: str


def _write(run_dir: Any, probe: TrainerProbe, runs: JobRuns | None) -> None:
    from stagebench.runs._results import RunDir

    rd = RunDir(run_dir)
    meta = rd.read_meta()
    meta["trainer"] = probe.result()
    if runs is not None:
        meta["job"] = runs.record()
    rd.write_meta(meta)


def finish_trainer(run_dir: Any, probe: TrainerProbe, runs: JobRuns | None, say: Callable[[str], None]) -> int:
    """Write the trainer's and the job's figures, the summary and the report again; say the answer."""
    from stagebench.analysis._summary import summarize_run
    from stagebench.report._render import write_report
    from stagebench.report._terminal import job_lines
    from stagebench.runs._results import RunDir

    _write(run_dir, probe, runs)
    summary = summarize_run(run_dir)
    RunDir(run_dir).write_summary(summary)
    write_report(run_dir)
    res = probe.result()
    if res["samples_per_s"] is None:
        say(f"trainer: no demand measured ({res['error']})")
    else:
        say(
            f"trainer: your step takes {1e3 / res['steps_per_s']:.3g} ms: {res['samples_per_s']:,.1f} items/s "
            f"on cached batches ({res['steps']} steps)"
        )
    for line in job_lines(summary):
        say(line)
    say(f"report: {Path(run_dir) / 'report.html'}")
    return 0


def end_from_close(code: int, *, in_process: bool = False) -> None:
    """End the program from a generator being closed (the user's loop stopped early).

    An exception raised there is ignored when the close comes from the generator being
    collected, and the program would go on to train for real. ``in_process``: under
    ``run_script``, whose caller's process must not end: ``SystemExit`` then.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    if in_process:
        raise SystemExit(code)
    os._exit(code)


def trainer_phases(
    probe: TrainerProbe,
    cached: Callable[[], list],
    plan: JobPlan,
    run_dir: Any,
    end: Callable[[int], None],
) -> Generator[Any, None, int]:
    """Both phases, as a generator the user's loop iterates; returns the exit code.

    ``cached()``: the batches of the first phase. What was measured is written after the first
    phase (should the loop fail on the live batches) and at the end; a loop that stops early
    ends the program through ``end`` once it is written.
    """
    from stagebench.analysis._job import contenders

    runs: JobRuns | None = None
    try:
        yield from probe.alone_phase(cached())
        _write(run_dir, probe, None)
        demand = probe.result()
        if probe.error is None and demand["samples_per_s"] is not None:
            candidates = plan.candidates(demand)
            if candidates:
                runs = JobRuns(
                    candidates,
                    items_per_step=plan.items_per_step,
                    say=probe.say,
                    max_slice_s=plan.max_slice_s,
                    budget_s=plan.budget_s,
                    what=plan.what,
                )
                yield from runs.run(plan.open_candidate, contenders)
    except GeneratorExit:
        if runs is None:
            probe.stopped_early = f"your loop stopped after {probe.steps_handed} steps on cached batches"
        finish_trainer(run_dir, probe, runs, probe.say)
        end(0)
        return 0
    return finish_trainer(run_dir, probe, runs, probe.say)


def loader_trainer_phases(
    factory: Any,
    run_dir: Path,
    *,
    cached_knobs: Any,
    seconds: float,
    job_s: float,
    say: Callable[[str], None],
    end: Callable[[int], None],
) -> Generator[Any, None, int]:
    """Both phases on DataLoaders built by the sweep's ``factory``; returns the exit code.

    ``cached_knobs``: the setting whose batches the step is measured on (the user's pin_memory on a
    host with a CUDA device: the batches are then what the loop will receive).
    """
    from stagebench.runs._knobs import LoaderKnobs

    probe = TrainerProbe(
        seconds=seconds,
        items_per_batch=float(factory.batch_size),
        say=say,
        pinned=bool(cached_knobs.pin_memory) if _has_cuda(run_dir) else None,
    )

    def cached() -> list:
        batches = []
        with _opened(factory, cached_knobs) as get:
            for _ in range(CACHED_BATCHES):
                try:
                    batches.append(get())
                except EOFError:
                    break
        return batches

    def candidates(demand: dict[str, Any]) -> list[Candidate]:
        from stagebench.analysis._loader import job_candidates
        from stagebench.runs._results import RunDir, read_rows

        rd = RunDir(run_dir)
        return job_candidates(read_rows(rd.results_csv), rd.read_meta(), demand["samples_per_s"])

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
def _opened(factory: Any, knobs: Any) -> Iterator[Callable[[], Any]]:
    """A fresh loader at ``knobs`` whose epochs never end; yields the function returning its next user batch."""
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

    try:
        yield get
    finally:
        shut_down(state["it"], built)
