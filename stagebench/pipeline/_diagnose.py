"""Diagnostic mode: an unmodified training script, diagnosed instead of trained.

``SPDL_PIPELINE_DIAGNOSTIC_MODE=1 python train.py`` (or ``stagebench diagnose train.py ARGS``): SPDL's
``build_pipeline`` hands the pipeline config to ``spdl.pipeline._profile._build_pipeline_diagnostic_mode``,
which :func:`patch_spdl` replaces so the user gets a stand-in pipeline. Its first iteration runs
:func:`diagnose_pipeline` and exits: the training loop body never runs.

The diagnosis, in order:

1. Validate settings, split the pipeline into stages (:mod:`._isolate`) and create the run directory
   *before any work*: a typo or an unwritable folder must not cost the user a source read.
2. Write ``run.json`` first, so a run killed halfway is still identifiable.
3. Read the source once; run each stage once over the previous stage's outputs (cached by
   :mod:`._stage_cache`), then sweep it alone, with its no-op ceilings; rows are on disk as measured.
   With two or more stages, also measure SPDL no-op pipelines of one and three identity stages
   (``run.json["pipeline_overhead"]``), so the prediction charges the source, sink and consumer once.
4. Run the whole pipeline with the recommended settings (the validation run): the isolated curves
   predict, this checks.
5. Summarize, write the report, print a short table, exit 0.

The variable is set to ``0`` as soon as a diagnosis starts, so no worker process (nor any one-stage
SPDL pipeline built while sweeping) starts a diagnosis of its own. The stand-in (:mod:`._standin`)
imports this module when a pipeline is built, never at interpreter start.
"""

from __future__ import annotations

import mmap
import os
import sys
import time
from pathlib import Path
from typing import Any

from stagebench._memory import (
    CAUSE,
    MemoryReserve,
    end_quiet,
    memory_short,
    out_of_memory,
    quiet_after_out_of_memory,
    quieted,
)
from stagebench._settings import SettingsError
from stagebench._signals import ending, on_sigterm, raise_if_signalled
from stagebench._spdl_private import MODE_VAR
from stagebench.core._mirror import mirror
from stagebench.core._progress import Progress
from stagebench.core._resources import page_fault_cost_s
from stagebench.core._sizes import approx_nbytes
from stagebench.core._spdl_harness import deferred_teardown
from stagebench.core._stats import mean_interval
from stagebench.core._sweep import plan_points
from stagebench.model._meta import PageFault
from stagebench.model._pipeline import RUNNER_UP, JointReplays
from stagebench.model._stage import changed
from stagebench.model._summary import Summary
from stagebench.pipeline._finish import (
    delivered_nothing,
    phases_of,
    report_what_was_kept,
    status_of,
    summarize_run,
    write_run_report,
)
from stagebench.pipeline._first_pass import SourceError, read_source
from stagebench.pipeline._isolate import PlanError, plan_pipeline
from stagebench.pipeline._run import Run, Session
from stagebench.pipeline._settings import DiagnoseSettings
from stagebench.pipeline._stage_cache import CacheDirError, cache_folder, private_dir
from stagebench.pipeline._stages import StagesPhase, sweep_config
from stagebench.pipeline._state import State
from stagebench.pipeline._validate import choices_of, replay_and_validate, replay_runner_up
from stagebench.report._terminal import format_table
from stagebench.runs._outcome import COMPLETE, FAILED, INTERNAL, PARTIAL, interrupted_outcome
from stagebench.runs._provenance import collect_provenance
from stagebench.runs._ranks import per_host
from stagebench.runs._results import RunDir, RunDirInUseError, UnwritableOutputError, default_run_dir
from stagebench.runs._schema import RESULTS_SCHEMA_VERSION

__all__ = [
    "DiagnoseError",
    "diagnose_pipeline",
]


class DiagnoseError(Exception):
    """The diagnosis could not run; ``code`` is the exit status to use."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def _unwritable(path: Path, var: str) -> str | None:
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".stagebench-write-test-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        return f"cannot write the {var} folder {str(path)!r}: {e.strerror or e}"
    return None


#: Source items held above this are said before the sweeps start: the diagnosis keeps them (and
#: each stage's outputs) in memory throughout, and a user should learn it before, not from the OOM killer.
_SOURCE_WARN_BYTES = 2 * 2**30


def _held_bytes(items: list) -> int:
    """What the source items hold, from a sample of them (sizing all of a large set costs as much as reading it)."""
    if not items:
        return 0
    sample = items[:: max(1, len(items) // 20)]
    return int(sum(approx_nbytes(x) for x in sample) / len(sample) * len(items))


def diagnose_pipeline(
    cfg: Any,
    *,
    out: str | os.PathLike | None = None,
    settings: DiagnoseSettings | None = None,
    command: list[str] | None = None,
    show_table: bool = True,
    report: bool = True,
    num_threads: int | None = None,
    session: Session | None = None,
) -> dict[str, Any]:
    """Diagnose an SPDL ``PipelineConfig``: sweep each stage alone, validate, report.

    ``report=False`` skips ``report.html`` (``stagebench report RUN_DIR`` writes it
    later). ``num_threads``: the user's ``build_pipeline(num_threads=...)`` (SPDL's
    shared thread pool), for the whole-pipeline runs; unknown, they size it for the
    stages that use it. ``session``: filled with what the trainer's measurement needs
    after the diagnosis (``plan``, ``source_items``, ``choices``, ``items_per_sink_item``,
    ``run_dir``: :mod:`stagebench.pipeline._trainer`). Returns the summary (``summary.json``). Raises :class:`DiagnoseError` when
    the diagnosis cannot run (its ``code``: 2 for a bad setting or pipeline, 1
    for a source that fails) and ``KeyboardInterrupt`` after saving the rows.
    """
    try:
        settings = settings or DiagnoseSettings.from_env()
    except SettingsError as e:
        raise DiagnoseError(str(e), 2) from None
    try:
        plan = plan_pipeline(cfg)
    except PlanError as e:
        raise DiagnoseError(str(e), 2) from None
    plan.num_threads = num_threads
    run_path = Path(out if out is not None else settings.output_dir or default_run_dir(per_host("diagnose")))
    try:
        run = RunDir.create(run_path, fresh=True)
    except (UnwritableOutputError, RunDirInUseError) as e:
        where = " (STAGEBENCH_OUTPUT_DIR)" if out is None and settings.output_dir else ""
        raise DiagnoseError(f"{e}{where}", 2) from None
    cache_dir = cache_folder(settings.cache_dir)
    if cache_dir is not None:
        try:
            private_dir(cache_dir)
        except CacheDirError as e:
            raise DiagnoseError(f"{e} (STAGEBENCH_CACHE_DIR)" if settings.cache_dir else str(e), 2) from None
        problem = _unwritable(cache_dir, "STAGEBENCH_CACHE_DIR")
        if problem:
            raise DiagnoseError(problem, 2)
    State.run_dir = run.path
    original = State.original_mode if State.started else os.environ.get(MODE_VAR)
    # Pool workers inherit the environment, and the one-stage SPDL pipelines built
    # while sweeping go through build_pipeline: neither may start a diagnosis.
    saved = os.environ.get(MODE_VAR)
    os.environ[MODE_VAR] = "0"
    try:
        with on_sigterm():
            return _Diagnosis(
                plan,
                run,
                settings,
                cache_dir,
                command or list(sys.argv),
                show_table,
                mode_value=original,
                write_report=report,
                session=session,
            ).run_all()
    finally:
        if saved is None:
            os.environ.pop(MODE_VAR, None)
        else:
            os.environ[MODE_VAR] = saved


class _Diagnosis:
    """One diagnosis run, phase after phase (module docstring): the source, the stages alone
    (:mod:`._stages`), the whole pipeline (:mod:`._validate`), the summary, report and outcome
    (:mod:`._finish`); what they share is a :class:`~stagebench.pipeline._run.Run`."""

    def __init__(
        self,
        plan: Any,
        run: Any,
        settings: DiagnoseSettings,
        cache_dir: Path | None,
        command: list[str],
        show_table: bool,
        mode_value: str | None = None,
        write_report: bool = True,
        session: Session | None = None,
    ) -> None:
        self.show_table, self.write_report = show_table, write_report
        self.session = session
        meta: dict[str, Any] = {
            "schema_version": RESULTS_SCHEMA_VERSION,
            "kind": "pipeline",
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "command": command,
            "status": "running",
            # the mode as the user set it, not the 0 set for the workers
            "provenance": collect_provenance(env_as_given={MODE_VAR: mode_value}),
            "settings": {**settings.as_meta(), "cache_dir": str(cache_dir) if cache_dir else None},
            "stages": [s.as_meta() for s in plan.stages],
            "not_isolated": list(plan.not_isolated),
            "num_threads": plan.num_threads,  # the user's build_pipeline(num_threads=...), when known
            "sink_buffer": plan.sink_buffer,  # the user's add_sink(buffer_size), for the snippet
            "validation": None,
        }
        self.run = Run(plan, run, settings, cache_dir, Progress(desc="stagebench"), meta)
        self.run.write_meta()
        # room for the summary and the report, given back at the end: a stage that keeps what it allocates
        # may leave none, and the run must still end with them
        self.reserve = MemoryReserve()
        quiet_after_out_of_memory()

    def run_all(self) -> dict[str, Any]:
        run = self.run
        try:
            return self._run()
        except KeyboardInterrupt as e:
            ending()  # a rank lost, then torch's launcher's SIGTERM a moment later: the saving goes on
            run.meta["status"] = interrupted_outcome(e).status
            run.write_meta()
            report_what_was_kept(run, self.write_report)
            raise
        except DiagnoseError as e:
            if run.meta["status"] != FAILED.status:  # the end of a run that ran out of memory has said why
                run.meta.update(status=FAILED.status, error=str(e))
                run.write_meta()
            raise
        except Exception as e:
            # A point, a first pass, the GIL probe and the whole-pipeline runs each fail alone for want of
            # memory; this is what escaped them, in a process a stage left without memory (a pool that
            # could not start, the rows read back). No bug of ours: the run ends failed, with the
            # summary and report of the rows kept, the reserve given back for them.
            what = out_of_memory(e)
            if what is None:
                raise
            self.reserve.release()
            why = f"out of memory ({what}): {CAUSE}"
            run.meta.update(status=FAILED.status, error=why)
            count, first = quieted()
            if count:  # kept off the terminal, kept here
                run.meta["not_printed_after_out_of_memory"] = {"count": count, "first": first}
            run.write_meta()
            report_what_was_kept(run, self.write_report)
            report = run.run_dir.path / "report.html"
            said = f", and a report of them: {report}" if report.is_file() else ""
            raise DiagnoseError(
                f"{why}; the rows measured so far are in {run.run_dir.path}{said}", FAILED.exit_code
            ) from None
        finally:
            self.reserve.release()
            run.progress.close()
            end_quiet()

    def _run(self) -> dict[str, Any]:
        run = self.run
        t_begin = time.perf_counter()
        src = self._read_source()
        _warm_up_imports()
        # what one page fault costs here, read on a direct mapping (malloc's state is left as it is)
        run.meta["page_fault"] = PageFault(page_fault_cost_s(), mmap.PAGESIZE).to_json()
        stages = StagesPhase(run)
        # One deferred tear-down for every stage's points: none waits for the SPDL tear-downs of the
        # points before it (the GIL probe does, StagesPhase._probe_gil), and the last ones finish while the
        # first summary is computed, not in a wait of their own; all have finished before the whole runs.
        with deferred_teardown():
            stages.sweep_all(src.items)
            run.meta["cpu_speed"] = {"sweep_ns": stages.sweep_speeds}
            # Decided here, before the reserve is given back: once it is, the reserve's room would read as
            # memory come back, and the whole pipeline would run the stage that took it all again.
            run.out_of_memory = memory_short()
            if run.out_of_memory:
                # what is left of the run is its end: the reserve is for it, from the rows read back on (pandas'
                # C parser crashed this process reading them with no memory left)
                self.reserve.release()
            rows = run.rows()
            summary = summarize_run(run, rows)
        raise_if_signalled()  # a Ctrl-C Python dropped in a finalizer (an event loop's __del__)
        self._whole_pipeline(stages, src.items, Summary.from_json(summary))
        raise_if_signalled()
        summary, typed, report = self._finish(rows, t_begin)
        if run.out_of_memory:  # its last line is the caller's, as every failed run's is
            said = f", and a report of them: {report}" if report else ""
            raise DiagnoseError(f"{run.meta['error']}; the rows are in {run.run_dir.path}{said}", FAILED.exit_code)
        if self.session is not None:
            self.session.plan, self.session.source_items = run.plan, src.items
            self.session.choices = choices_of(typed)
            self.session.items_per_sink_item = stages.items_per_sink_item or 1.0
            self.session.run_dir = run.run_dir.path
        return summary

    def _read_source(self) -> Any:
        """Say what will be measured, then read the source once (a failing source ends the run, exit 1)."""
        run, plan, settings = self.run, self.run.plan, self.run.settings
        names = ", ".join(repr(s.name) for s in plan.stages)
        run.say(f"diagnosing {len(plan.stages)} stage(s) of the pipeline: {names}")
        run.say(f"run directory: {run.run_dir.path}")
        for ni in plan.not_isolated:
            run.say(f"not isolated: {ni['name']!r}: {ni['reason']}")
        total = sum(len(plan_points(s.fn, sweep_config(s, settings))) for s in plan.stages)
        run.progress.set_total(total)
        run.say(
            f"{total} points, {settings.budget_s:g} s each (+ warm-up); grid {list(settings.concurrency)}, "
            f"executors {', '.join(settings.executors)}, harnesses {', '.join(settings.harnesses)}"
        )
        ranked = mirror()
        if ranked is not None:  # a ranked diagnosis: every other rank reads its own source at the same time
            ranked.tell("source")
        try:
            with run.phase("source"):
                src = read_source(plan, settings.num_items, timeout_s=max(60.0, settings.timeout_s))
        except SourceError as e:
            raise DiagnoseError(str(e), 1) from None
        if src.more:
            run.say(src.more)
        run.say(f"read {len(src.items)} source items in {src.seconds:.1f} s")
        if src.note:
            run.say(src.note)
        held = _held_bytes(src.items)
        if held > _SOURCE_WARN_BYTES:
            run.say(
                f"warning: the {len(src.items)} source items hold {held / 2**30:.1f} GiB in memory for the whole "
                f"diagnosis (and each stage's outputs as much again); fewer items: "
                f"SPDL_PIPELINE_DIAGNOSTIC_MODE_NUM_ITEMS"
            )
        run.meta["source"] = {"items": len(src.items), "asked": src.asked, "note": src.note, "bytes": held}
        run.write_meta()
        return src

    def _whole_pipeline(self, stages: StagesPhase, source_items: list, summary: Summary) -> None:
        """The whole pipeline at the recommended settings and at yours (:mod:`._validate`), or why not: the
        stages delivered nothing, or this process has no memory left for it."""
        run, settings = self.run, self.run.settings
        if stages.blocked:
            run.meta["validation"] = {
                "qps": None,
                "error": f"skipped: {stages.blocked}",
                "failed": f"the pipeline delivers nothing: {stages.blocked}",
            }
            return
        if settings.validation_window_s <= 0:
            return
        if run.out_of_memory:  # it would run out too (the stage that took it all runs again), or hang starting
            run.meta["validation"] = {"qps": None, "error": f"skipped: {run.out_of_memory}"}
            return
        summary = self._settle_joint(stages, source_items, summary)
        with run.phase("whole_pipeline_runs"):
            whole = replay_and_validate(
                run.plan,
                settings,
                source_items,
                summary,
                stage_speeds=stages.stage_speeds,
                items_per_sink_item=stages.items_per_sink_item or 1.0,
                say=run.say,
                log_error=run.log_error,
            )
        # the stage that runs out of memory alone runs out in the whole pipeline too, where SPDL keeps its
        # errors to itself: a process still short of memory after these runs ran out in them
        run.out_of_memory = memory_short()
        run.meta.setdefault("cpu_speed", {}).update(whole.cpu_speed.to_json())
        run.meta["replay"] = whole.replay.to_json()
        if whole.yours is not None:
            run.meta["yours"] = whole.yours.to_json()
        if whole.validation is not None:
            failed = delivered_nothing(whole.validation)
            validation = changed(whole.validation, failed=failed) if failed else whole.validation
            run.meta["validation"] = validation.to_json()

    def _settle_joint(self, stages: StagesPhase, source_items: list, summary: Summary) -> Summary:
        """Where the joint choice left a runner-up (the bounds' best executor assignment, more than 5% over
        the cheaper one picked), both replayed in turns (:func:`replay_runner_up`); the summary the whole runs
        then run at: the runner-up's where its replay was faster beyond noise. ``run.json["joint_replays"]``
        records them, and every later summary reads its choice from there."""
        run = self.run
        joint = summary.joint
        if joint is None or not joint.runner_up:
            return summary
        with run.phase("joint_replays"):
            # the summary as if the runner-up were chosen (its stages' settings and stand-ins), read with a
            # choice no replay has made yet: taken out again at once, so that nothing cut short reads it
            run.meta["joint_replays"] = JointReplays(executors=joint.runner_up, chosen=RUNNER_UP).to_json()
            rows = run.rows()
            try:
                runner_up = Summary.from_json(summarize_run(run, rows))
            finally:
                del run.meta["joint_replays"]
            replays = replay_runner_up(
                run.plan,
                run.settings,
                source_items,
                summary,
                runner_up,
                stage_speeds=stages.stage_speeds,
                items_per_sink_item=stages.items_per_sink_item or 1.0,
                say=run.say,
                log_error=run.log_error,
            )
            run.meta["joint_replays"] = replays.to_json()
            run.write_meta()
            # kept: the summary the whole runs take is the one before (the replays change only the joint's text,
            # which the summary at the end reads from run.json)
            return runner_up if replays.prefer else summary

    def _finish(self, rows: Any, t_begin: float) -> tuple[dict[str, Any], Summary, Path | None]:
        """The summary (as written, and read), the report, run.json's status, the terminal table and the last
        line."""
        run = self.run
        self.reserve.release()  # what it kept aside is for this: the summary and the report
        run.meta["provenance_after"] = collect_provenance()
        # measured in full: the summary reads it so (a run cut short is warned of); the outcome follows below
        run.meta["status"] = COMPLETE.status
        run.meta["phases_s"] = phases_of(run.phases, rows, time.perf_counter() - t_begin)
        run.write_meta()
        report = None
        with run.phase("analysis_and_report"):
            summary = summarize_run(run, rows)
            try:
                run.run_dir.write_summary(summary)
                report = write_run_report(run, summary) if self.write_report else None
            except OSError as e:  # a full disk, a permission: the rows are safe; said, and the exit code says it
                run.unwritten = f"{type(e).__name__}: {e}"
        typed = Summary.from_json(summary)
        run.meta["status"] = status_of(run, typed)
        if run.out_of_memory:
            run.meta["error"] = f"{run.out_of_memory}: {CAUSE}"
        elif run.internal_error:
            run.meta["error"] = run.internal_error
        elif run.unwritten:
            run.meta["error"] = f"a file could not be written: {run.unwritten}"
        run.meta["phases_s"] = phases_of(run.phases, rows, time.perf_counter() - t_begin)
        try:
            run.write_meta()
        except OSError as e:
            run.unwritten = run.unwritten or f"run.json: {type(e).__name__}: {e}"
        if self.show_table:
            print(format_table(summary, report), end="", flush=True)
        self._last_line(report)
        return summary, typed, report

    def _last_line(self, report: Path | None) -> None:
        run = self.run
        where = run.run_dir.path
        if run.meta["status"] == INTERNAL.status:
            run.say(
                f"internal error: {run.internal_error} (the traceback is in {where / 'error.log'}); the rows are in "
                f"{where}, with a minimal summary and report beside them"
            )
        elif run.meta["status"] == PARTIAL.status:
            run.say(f"error: a file could not be written ({run.unwritten}); the rows are in {where}")
        elif run.meta["status"] == COMPLETE.status:
            run.say(f"done; report: {report}" if report else f"done; results in {where}")


def _warm_up_imports() -> None:
    """Heavy imports the first point would otherwise pay for while tearing down; and what reading the rows
    back needs, now: a stage that exhausts memory would leave none to load it."""
    import pandas  # noqa: F401

    mean_interval([1.0, 2.0], 0.95)
