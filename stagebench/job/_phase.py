"""The job phase, shared by DataLoader and SPDL pipeline diagnoses (``STAGEBENCH_TRAINER=measure``).

:func:`trainer_phases` is the generator the user's loop iterates instead of their loader:

1. **The step alone** on cached batches, as the loader delivers them (pinned when it pins on a host
   with a CUDA device: a step that copies pageable memory to the device waits for the driver to
   stage it, so it reads slower than the job will run), until its rate is known to ±3%
   (:class:`stagebench.core._steps.TrainerProbe`): the demand, written to ``run.json["trainer"]``.
2. **The job**: the analysis names the candidates from the isolated sweep and that demand (yours,
   the cheapest that feeds it, a step above, the fastest alone, less those the isolated sweep rules
   out); the loop runs on the real loader or pipeline at each, in turns, until the comparisons
   settle (:class:`stagebench.core._jobrun.JobRuns`), and ``run.json["job"]`` keeps every step's
   wait and body.
3. The summary, the report and a few lines on the terminal, then the program ends.

A loop that stops early (``break``, an exception) ends the phase it is in: what was measured is
written, and the summary says what did not run. Each kind adapts it: :mod:`stagebench.loader._trainer`
(a DataLoader built by the sweep's factory) and :mod:`stagebench.pipeline._trainer` (the user's
pipeline rebuilt at each setting).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Generator
from dataclasses import KW_ONLY, dataclass
from pathlib import Path
from typing import Any

from stagebench._numbers import fmt_ms
from stagebench.analysis._job import contenders, futile
from stagebench.core._jobrun import JobRuns, Ladder, Opener
from stagebench.core._steps import TrainerProbe
from stagebench.model._rate import Rate
from stagebench.runs._results import RunDir

__all__ = ["JobPlan", "finish_trainer", "trainer_phases", "end_from_close", "job_budget_s"]


#: The job runs' budget where STAGEBENCH_JOB_S is not set: this many of the user's steps, ...
AUTO_STEPS = 150
#: ... at least this many seconds (fast steps: enough rounds for a 5% question on this host's noise) ...
AUTO_MIN_S = 60.0
#: ... and at most this many (a step of seconds: the user is told what more would settle).
AUTO_MAX_S = 300.0


def job_budget_s(stated: float | None, steps_per_s: float | None) -> float:
    """Seconds the job runs may take: the stated STAGEBENCH_JOB_S, else :data:`AUTO_STEPS` of the step.

    Why in steps: a comparison in turns needs rounds, and a round of slices lasts some steps of each
    setting; a 1 s step given the 60 s that suit a 50 ms one would run two rounds and settle nothing.
    """
    if stated is not None:
        return float(stated)
    if not steps_per_s or steps_per_s <= 0:
        return AUTO_MIN_S
    return min(AUTO_MAX_S, max(AUTO_MIN_S, AUTO_STEPS / steps_per_s))


@dataclass(frozen=True)
class JobPlan:
    """What the job phase needs besides the loop: the candidates (from the demand) and how to open one."""

    candidates: Callable[[Rate | None], Ladder]
    open_candidate: Opener
    _: KW_ONLY
    items_per_step: float
    max_slice_s: float
    budget_s: float | None
    """Seconds at most; None: :func:`job_budget_s` of the measured step."""
    what: str


def _write(run_dir: Any, probe: TrainerProbe, runs: JobRuns | None) -> None:
    rd = RunDir(run_dir)
    meta = rd.read_meta()
    meta["trainer"] = probe.result().as_run()
    if runs is not None:
        meta["job"] = runs.record().to_json()
    rd.write_meta(meta)


def finish_trainer(run_dir: Any, probe: TrainerProbe, runs: JobRuns | None, say: Callable[[str], None]) -> int:
    """Write the trainer's and the job's figures, the summary and the report again; say the answer."""
    # pandas, jinja2 and matplotlib load here, at the end: the DataLoader hook imports this module at its start
    from stagebench.analysis._summary import summarize_run
    from stagebench.report._render import write_report
    from stagebench.report._terminal import job_lines

    _write(run_dir, probe, runs)
    summary = summarize_run(run_dir)
    RunDir(run_dir).write_summary(summary)
    write_report(run_dir)
    res = probe.result()
    if res.samples_per_s is None or res.steps_per_s is None:
        say(f"trainer: not measured: {res.unmeasured_why}")
        if summary.get("scope"):
            say(f"scope: {summary['scope']}")
    else:
        say(
            f"trainer: your step takes {fmt_ms(1.0 / res.steps_per_s)}: {res.samples_per_s:,.1f} items/s "
            f"on cached batches ({res.steps} steps)"
        )
    for line in job_lines(summary):
        say(line)
    if res.samples_per_s is not None and (summary.get("job") or {}).get("status") != "decided":
        # the table printed before the loop ran was the loader's or the pipeline's alone; with the step
        # measured the verdict can differ from it, and the last word a user reads is the one that holds
        say(f"verdict for your job: {summary.get('verdict')}")
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
    runs: JobRuns | None = None
    try:
        yield from probe.alone_phase(cached())
        _write(run_dir, probe, None)
        demand = probe.result()
        if probe.error is None and demand.samples_per_s is not None:
            ladder = plan.candidates(demand.rate)
            if ladder.run:
                runs = JobRuns(
                    ladder.run,
                    items_per_step=plan.items_per_step,
                    say=probe.say,
                    max_slice_s=plan.max_slice_s,
                    budget_s=job_budget_s(plan.budget_s, demand.steps_per_s),
                    what=plan.what,
                    keep_open=ladder.keep_open,
                    skipped=ladder.skipped,
                )
                yield from runs.run(plan.open_candidate, contenders, futile)
    except GeneratorExit:
        if runs is None:
            n = probe.steps_handed
            probe.stopped_early = f"your loop stopped after taking {n} cached batch{'' if n == 1 else 'es'}"
        finish_trainer(run_dir, probe, runs, probe.say)
        end(0)
        return 0
    return finish_trainer(run_dir, probe, runs, probe.say)
