"""Diagnostic mode: an unmodified training script, diagnosed instead of trained.

``SPDL_PIPELINE_DIAGNOSTIC_MODE=1 python train.py`` (or ``stagebench diagnose
train.py ARGS``): SPDL's ``build_pipeline`` hands the pipeline config to
``spdl.pipeline._profile._build_pipeline_diagnostic_mode``; :func:`patch_spdl`
replaces that function so the user gets a stand-in pipeline. Its first
iteration runs :func:`diagnose_pipeline` and exits: the training loop body
never runs.

The diagnosis, in order (each step for a reason):

1. Validate settings, split the pipeline into stages (:mod:`._isolate`) and
   create the run directory *before any work*: a typo in an environment
   variable or an unwritable folder must not cost the user a source read.
2. Write ``run.json`` first, so a run killed halfway is still identifiable.
3. Read the source once; run each stage once over the previous stage's
   outputs (cached on disk by :mod:`._stage_cache`), then sweep it alone:
   thread / process (async: the event loop) x the concurrency grid, through
   stagebench's workers and through a one-stage SPDL pipeline, each with its
   no-op ceiling (thread/async ceilings once per run, shared by the stages;
   process ceilings with the stage's own items, shared only by stages whose
   items pickle to at most 16 KiB).
   Rows are on disk the moment they are measured.
   With two or more stages, also measure SPDL no-op pipelines of one and three
   identity stages (thread x 4) into ``run.json["pipeline_overhead"]``
   (``one_stage``/``three_stage``: ``status``, ``qps``, ``cpu_s_per_item``,
   ...): the one-stage ceiling includes the source, sink and consumer, which
   a k-stage pipeline pays once; the prediction charges that fixed part once
   and only the per-stage increment per stage. Not rows of ``results.csv``:
   they belong to no stage.
4. Run the whole pipeline once with the recommended settings over the cached
   source items (the validation run): isolated curves predict, this checks.
5. Summarize, write the report, print a short table, exit 0.

Worker processes inherit the environment. The variable is set to ``0`` as
soon as a diagnosis starts, so no worker (and none of the one-stage SPDL
pipelines built while sweeping) ever starts a diagnosis of its own.

This module is imported while ``spdl`` is being imported (from the
post-import hook), so its top level imports only the standard library.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any

from stagebench._numbers import finite, num
from stagebench.pipeline._settings import SAMPLE_OUTPUTS, DiagnoseSettings, SettingsError
from stagebench.pipeline._state import MODE_VAR, State, Terminated, on_sigterm
from stagebench.pipeline._validate import choices_of
from stagebench.runs._outcome import COMPLETE, FAILED, INTERNAL, INTERRUPTED, PARTIAL, TERMINATED
from stagebench.runs._schema import RESULTS_SCHEMA_VERSION, SUMMARY_SCHEMA_VERSION

__all__ = [
    "DiagnoseError",
    "diagnose_pipeline",
]


class DiagnoseError(Exception):
    """The diagnosis could not run; ``code`` is the exit status to use."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


# ---------------------------------------------------------------------------- settings


# ---------------------------------------------------------------------------- SPDL hook


# ---------------------------------------------------------------------------- the diagnosis
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
# Where SPDL's no-op pipelines are measured (harness, executor, concurrency): 4 threads, SPDL's
# smallest default pool (what a rebuilt pipeline gets). With one thread every hop queues behind
# the previous one and a stage costs about as much as the whole one-stage pipeline (275 us of 345
# measured), which is not what a pipeline running stages at concurrency 4-16 pays.
_NOOP_AT = ("spdl", "thread", 4)


def _held_bytes(items: list) -> int:
    """What the source items hold, from a sample of them (sizing all of a large set costs as much as reading it)."""
    from stagebench.core._sizes import approx_nbytes

    if not items:
        return 0
    step = max(1, len(items) // 20)
    sample = items[::step]
    return int(sum(approx_nbytes(x) for x in sample) / len(sample) * len(items))


def _sweep_config(stage: Any, settings: DiagnoseSettings):
    from stagebench.core._config import SweepConfig

    measure = settings.measure_config()
    if stage.type in ("aggregate", "disaggregate"):
        # SPDL runs these inline on its event loop: no executor, no concurrency to choose.
        return SweepConfig(executors=("thread",), concurrency=(1,), harnesses=settings.harnesses, measure=measure)
    return SweepConfig(
        executors=settings.executors,
        concurrency=settings.concurrency,
        harnesses=settings.harnesses,
        measure=measure,
        process_flat_levels=settings.process_flat_levels,
        process_ceilings=settings.process_ceilings,
        paired_rounds=settings.paired_rounds,
    )


#: Share of its call a stage computes from which its GIL share is worth reading with the probe (~0.35 s a
#: stage); not the analysis's compute-bound threshold (analysis/_labels._COMPUTE_BOUND): a different question.
_PROBE_MIN_COMPUTE = 0.15


def _computes(rows: list[dict[str, Any]]) -> bool:
    """Whether a sync stage's thread points show it computing at least 15% of its call.

    The spdl harness times the calling thread's CPU during the call
    (``call_cpu_ms``); the direct harness adds almost nothing to the stage's
    own cores used at the lowest level.
    """
    pts = [r for r in rows if r["role"] == "stage" and r["executor"] == "thread" and r["status"] == "ok"]
    if not pts:
        return False
    c0 = min(r["concurrency"] for r in pts)
    for r in pts:
        if r["concurrency"] != c0:
            continue
        cpu, p50, used = (num(r.get(k)) for k in ("call_cpu_ms", "latency_p50_ms", "cores_used"))
        if r["harness"] == "spdl" and finite(cpu) and finite(p50) and p50 > 0:
            share = cpu / p50
        elif r["harness"] == "direct" and finite(used):
            share = used / c0
        else:
            continue
        if share >= _PROBE_MIN_COMPUTE:
            return True
    return False


def _skipped_rows(
    stage: Any, settings: DiagnoseSettings, reason: str, *, executor: str | None = None, ceilings: bool = False
) -> list[dict[str, Any]]:
    """Rows for points not measured: the stage's (and with ``ceilings``, its ceiling's), of ``executor`` or all."""
    from stagebench.core._measure import empty_row
    from stagebench.core._sweep import plan_points

    rows = []
    for role, harness, ex, c in plan_points(stage.fn, _sweep_config(stage, settings)):
        if (role != "stage" and not ceilings) or (executor is not None and ex != executor):
            continue
        row = empty_row(stage.name, role, ex, harness, c)
        row.update(status="skipped", reason=reason, elapsed_s=0.0)
        rows.append(row)
    return rows


def diagnose_pipeline(
    cfg: Any,
    *,
    out: str | os.PathLike | None = None,
    settings: DiagnoseSettings | None = None,
    command: list[str] | None = None,
    show_table: bool = True,
    report: bool = True,
    num_threads: int | None = None,
    session: dict[str, Any] | None = None,
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
    from stagebench.pipeline._isolate import PlanError, plan_pipeline
    from stagebench.runs._results import RunDir, RunDirInUseError, UnwritableOutputError, default_run_dir

    try:
        settings = settings or DiagnoseSettings.from_env()
    except SettingsError as e:
        raise DiagnoseError(str(e), 2) from None
    try:
        plan = plan_pipeline(cfg)
    except PlanError as e:
        raise DiagnoseError(str(e), 2) from None
    plan.num_threads = num_threads
    run_path = (
        Path(out)
        if out is not None
        else Path(settings.output_dir)
        if settings.output_dir
        else default_run_dir("diagnose")
    )
    try:
        run = RunDir.create(run_path, fresh=True)
    except (UnwritableOutputError, RunDirInUseError) as e:
        where = " (STAGEBENCH_OUTPUT_DIR)" if out is None and settings.output_dir else ""
        raise DiagnoseError(f"{e}{where}", 2) from None
    cache_dir: Path | None
    if (settings.cache_dir or "").lower() in ("off", "none", "0", "false", "no"):
        cache_dir = None
    else:
        from stagebench.pipeline._stage_cache import CacheDirError, default_cache_dir, private_dir

        cache_dir = Path(settings.cache_dir) if settings.cache_dir else default_cache_dir()
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
            ).run()
    finally:
        if saved is None:
            os.environ.pop(MODE_VAR, None)
        else:
            os.environ[MODE_VAR] = saved


class _Diagnosis:
    """One diagnosis run: holds the run directory, the metadata and the progress display."""

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
        session: dict[str, Any] | None = None,
    ) -> None:
        from stagebench.core._progress import Progress
        from stagebench.runs._provenance import collect_provenance

        self.plan, self.run_dir, self.settings, self.cache_dir = plan, run, settings, cache_dir
        self.show_table, self.write_report = show_table, write_report
        self.session = session
        self.phases: dict[str, float] = {}  # seconds per phase of the diagnosis (run.json "phases_s")
        self.blocked: str | None = None  # why later stages could not be measured
        self.items_per_sink_item: float | None = None
        self.progress = Progress(desc="stagebench")
        # thread/async no-op ceilings do not depend on the stage: measured once per run
        self.shared_ceilings: dict[tuple[str, str, int], dict[str, Any]] = {}
        self.process_sweeps: list[Any] = []  # stages whose process points wait for the level-by-level pass
        self.analysis_cache: dict = {}  # each stage analysed once, before and after the whole-pipeline runs
        self.internal_error: str | None = None  # our bug in the analysis or the report: the run says so
        self.unwritten: str | None = None  # a file that could not be written (a full disk): the run says so
        # the core's speed after every point (see _speed): the stage curves were measured at these
        self.sweep_speeds: list[float] = []
        # per stage, the probes after its thread / async points: what its stand-in's CPU amounts were read at
        self.stage_speeds: dict[str, list[float]] = {}
        self.meta: dict[str, Any] = {
            "schema_version": RESULTS_SCHEMA_VERSION,
            "kind": "pipeline",
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "command": command,
            "status": "running",
            "provenance": collect_provenance(),
            "settings": {**settings.as_meta(), "cache_dir": str(cache_dir) if cache_dir else None},
            "stages": [s.as_meta() for s in plan.stages],
            "not_isolated": list(plan.not_isolated),
            "num_threads": plan.num_threads,  # the user's build_pipeline(num_threads=...), when known
            "sink_buffer": plan.sink_buffer,  # the user's add_sink(buffer_size), for the snippet
            "validation": None,
        }
        env = self.meta["provenance"].setdefault("env", {})
        if mode_value is None:
            env.pop(MODE_VAR, None)
        else:
            env[MODE_VAR] = mode_value  # what the user set, not the 0 we set for workers
        self.run_dir.write_meta(self.meta)

    def say(self, text: str) -> None:
        self.progress.message(text)

    @contextlib.contextmanager
    def _phase(self, name: str):
        """Add the block's wall time to ``self.phases[name]``."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.phases[name] = self.phases.get(name, 0.0) + time.perf_counter() - t0

    def _stage_meta(self, name: str) -> dict[str, Any]:
        return next(s for s in self.meta["stages"] if s["name"] == name)

    # ------------------------------------------------------------------ main
    def run(self) -> dict[str, Any]:
        try:
            return self._run()
        except KeyboardInterrupt as e:
            self.meta["status"] = (TERMINATED if isinstance(e, Terminated) else INTERRUPTED).status
            self.run_dir.write_meta(self.meta)
            self._report_what_was_kept()
            raise
        except DiagnoseError as e:
            self.meta.update(status="failed", error=str(e))
            self.run_dir.write_meta(self.meta)
            raise
        except MemoryError:
            # The points themselves fail alone (core/_measure); this is what comes after them, in a process
            # a stage left without memory. One line, and the rows are safe on disk for a later rebuild.
            why = (
                f"out of memory after measuring (a stage may keep what it allocates, or a memory limit is set); "
                f"the rows are in {self.run_dir.path}: `stagebench report {self.run_dir.path}` rebuilds the rest"
            )
            self.meta.update(status="failed", error=why)
            self.run_dir.write_meta(self.meta)
            raise DiagnoseError(why, 1) from None
        finally:
            self.progress.close()

    def _run(self) -> dict[str, Any]:
        from stagebench.core._spdl_harness import deferred_teardown
        from stagebench.core._sweep import plan_points
        from stagebench.pipeline._isolate import SourceError, read_source
        from stagebench.runs._provenance import collect_provenance

        plan, settings = self.plan, self.settings
        names = ", ".join(repr(s.name) for s in plan.stages)
        self.say(f"diagnosing {len(plan.stages)} stage(s) of the pipeline: {names}")
        self.say(f"run directory: {self.run_dir.path}")
        for ni in plan.not_isolated:
            self.say(f"not isolated: {ni['name']!r}: {ni['reason']}")
        total = sum(len(plan_points(s.fn, _sweep_config(s, settings))) for s in plan.stages)
        self.progress.set_total(total)
        self.say(
            f"{total} points, {settings.budget_s:g} s each (+ warm-up); grid {list(settings.concurrency)}, "
            f"executors {', '.join(settings.executors)}, harnesses {', '.join(settings.harnesses)}"
        )
        t_begin = time.perf_counter()
        try:
            with self._phase("source"):
                src = read_source(plan, settings.num_items, timeout_s=max(60.0, settings.timeout_s))
        except SourceError as e:
            raise DiagnoseError(str(e), 1) from None
        self.say(f"read {len(src.items)} source items in {src.seconds:.1f} s")
        if src.note:
            self.say(src.note)
        held = _held_bytes(src.items)
        if held > _SOURCE_WARN_BYTES:
            self.say(
                f"warning: the {len(src.items)} source items hold {held / 2**30:.1f} GiB in memory for the whole "
                f"diagnosis (and each stage's outputs as much again); fewer items: "
                f"SPDL_PIPELINE_DIAGNOSTIC_MODE_NUM_ITEMS"
            )
        self.meta["source"] = {"items": len(src.items), "asked": src.asked, "note": src.note, "bytes": held}
        self.run_dir.write_meta(self.meta)
        # Heavy imports the first point would otherwise pay for while tearing down.
        from stagebench.core._stats import mean_interval

        mean_interval([1.0, 2.0], 0.95)
        # what one page fault costs here (a direct mapping: malloc's state is left as it is)
        import mmap

        from stagebench.core._resources import page_fault_cost_s

        self.meta["page_fault"] = {"cost_s": page_fault_cost_s(), "page_bytes": mmap.PAGESIZE}
        # And what reading the rows back needs, now: a stage that exhausts memory would leave none to load it.
        import pandas  # noqa: F401

        # One deferred tear-down for every stage's points: none waits for the SPDL tear-downs of the
        # points before it (the GIL probe does, _probe_gil), and the last ones finish while the first
        # summary is computed, not in a wait of their own; all have finished before the whole runs.
        with deferred_teardown():
            self._sweep_all(src.items)
            self.meta["cpu_speed"] = {"sweep_ns": self.sweep_speeds}
            rows = self._rows()
            summary = self._summarize(rows)
        if self.blocked:
            self.meta["validation"] = {
                "qps": None,
                "error": f"skipped: {self.blocked}",
                "failed": f"the pipeline delivers nothing: {self.blocked}",
            }
        elif settings.validation_window_s > 0:
            from stagebench.pipeline._validate import replay_and_validate

            with self._phase("whole_pipeline_runs"):
                replay, validation, yours, speeds = replay_and_validate(
                    plan,
                    settings,
                    src.items,
                    summary,
                    stage_speeds=self.stage_speeds,
                    items_per_sink_item=self.items_per_sink_item or 1.0,
                    say=self.say,
                    log_error=self._log_error,
                )
            self.meta.setdefault("cpu_speed", {}).update(speeds)
            self.meta["replay"] = replay
            if yours is not None:
                self.meta["yours"] = yours
            if validation is not None:
                failed = _delivered_nothing(validation)
                if failed:
                    validation["failed"] = failed
                self.meta["validation"] = validation
        self.meta["provenance_after"] = collect_provenance()
        # measured in full: the summary reads it so (a run cut short is warned of); the outcome follows below
        self.meta["status"] = COMPLETE.status
        self.meta["phases_s"] = _phases(self.phases, rows, time.perf_counter() - t_begin)
        self.run_dir.write_meta(self.meta)
        report = None
        with self._phase("analysis_and_report"):
            summary = self._summarize(rows)
            try:
                self.run_dir.write_summary(summary)
                report = self._report(summary) if self.write_report else None
            except OSError as e:  # a full disk, a permission: the rows are safe; said, and the exit code says it
                self.unwritten = f"{type(e).__name__}: {e}"
        self.meta["status"] = self._status(summary)
        if self.internal_error:
            self.meta["error"] = self.internal_error
        elif self.unwritten:
            self.meta["error"] = f"a file could not be written: {self.unwritten}"
        self.meta["phases_s"] = _phases(self.phases, rows, time.perf_counter() - t_begin)
        try:
            self.run_dir.write_meta(self.meta)
        except OSError as e:
            self.unwritten = self.unwritten or f"run.json: {type(e).__name__}: {e}"
        if self.show_table:
            from stagebench.report._terminal import format_table

            print(format_table(summary, report), end="", flush=True)
        where = self.run_dir.path
        if self.meta["status"] == INTERNAL.status:
            self.say(
                f"internal error: {self.internal_error} (the traceback is in {where / 'error.log'}); the rows are in "
                f"{where}, with a minimal summary and report beside them"
            )
        elif self.meta["status"] == PARTIAL.status:
            self.say(f"error: a file could not be written ({self.unwritten}); the rows are in {where}")
        elif self.meta["status"] == COMPLETE.status:
            self.say(f"done; report: {report}" if report else f"done; results in {where}")
        if self.session is not None:
            self.session.update(
                plan=plan,
                source_items=src.items,
                choices=choices_of(summary),
                items_per_sink_item=self.items_per_sink_item or 1.0,
                run_dir=self.run_dir.path,
            )
        return summary

    def _rows(self):
        from stagebench.runs._results import read_rows

        return read_rows(self.run_dir.results_csv)

    # ------------------------------------------------------------------ stages
    def _sweep_all(self, source_items: list) -> None:
        from stagebench.pipeline._isolate import (
            Fused,
            Passthrough,
            compute_outputs,
            measure_inputs,
            run_passthrough,
        )
        from stagebench.pipeline._stage_cache import StageCache, callable_key, chain_key, items_key
        from stagebench.runs._schema import STAGE_COLUMNS

        settings = self.settings
        cache = StageCache(self.cache_dir, max_disk_mb=10 * settings.cache_max_mb)
        max_bytes = settings.cache_max_mb * 2**20
        n_source = len(source_items)
        inputs, (in_key, unhashable) = source_items, items_key(source_items)
        src_problem = self._announce_source(source_items, unhashable)
        came_from: str | None = None  # the step whose outputs are the current inputs (None: the source)
        src_fraction = 1.0  # share of the source items the current inputs derive from
        blocked: str | None = None
        prev: tuple[Any, list, float | None, bool, list[str]] | None = None  # see _fresh_source
        with self.run_dir.writer(STAGE_COLUMNS) as writer:
            for step in self.plan.steps:
                if isinstance(step, Passthrough):
                    prev = None  # its outputs come from a whole segment: nothing to fuse a stage after it with
                    if blocked:
                        continue
                    try:
                        inputs, pmeta = run_passthrough(step, inputs, timeout_s=max(60.0, settings.timeout_s))
                    except KeyboardInterrupt:
                        raise
                    except Exception as e:
                        blocked = (
                            f"not measured: {', '.join(step.names)} (run as a whole) failed: {type(e).__name__}: {e}"
                        )
                        self.say(blocked)
                        continue
                    # keyed by content: SPDL may emit them in any order, and the segment
                    # itself cannot be fingerprinted (it may hold executors)
                    in_key = items_key(inputs)[0]
                    came_from = ", ".join(repr(n) for n in step.names)
                    self.say(f"ran {came_from} as a whole: {len(inputs)} outputs")
                    if not inputs:
                        blocked = f"not measured: {', '.join(step.names)} produced no outputs"
                    continue
                smeta = self._stage_meta(step.name)
                if blocked:
                    smeta.update(status="not_measured", reason=blocked)
                    self.meta["not_isolated"].append({"name": step.name, "reason": blocked})
                    for row in _skipped_rows(step, settings, blocked):
                        writer.write(row)
                        self.progress.done(row)
                    self.run_dir.write_meta(self.meta)
                    continue
                fn_key, unstable = callable_key(step.key_source)
                key = chain_key(step.type, step.drop_last, fn_key, max_bytes, in_key)
                started = time.perf_counter()
                with self._phase("first_pass"):
                    cached = cache.get_or_compute(
                        key,
                        functools.partial(
                            compute_outputs, step, inputs, max_bytes=max_bytes, stall_s=settings.timeout_s
                        ),
                    )
                ometa = cached.meta or {}
                self.plan.sample_outputs[step.name] = list(cached.items[:SAMPLE_OUTPUTS])  # for its stand-in
                self._report_outputs(step, inputs, cached, ometa, unstable, time.perf_counter() - started)
                if ometa.get("crashed"):
                    # It kills the process that runs it: its thread points would run it in this one.
                    reason = (
                        f"not measured: a worker process died running it on its first pass ({ometa['crashed']}); "
                        "on threads it would end this process too"
                    )
                    smeta.update(status="not_measured", reason=reason)
                    for row in _skipped_rows(step, settings, reason):
                        writer.write(row)
                        self.progress.done(row)
                    self.run_dir.write_meta(self.meta)
                    blocked = f"not measured: the earlier stage {step.name!r} crashed its worker process"
                    continue
                minputs = measure_inputs(step, inputs, ometa)
                # Source items one call of this stage stands for (after a batch: the batch size); the
                # analysis turns per-call figures into per-source-item ones with it. From what the stage
                # really received and grouped, never from how many inputs it was measured on: the outputs
                # cap can stop a stage part-way, and its calls do not stand for more items because of that.
                per_input = n_source * src_fraction / len(inputs) if inputs else 0.0
                per_call = sum(len(g) for g in minputs) / len(minputs) if step.type == "aggregate" and minputs else 1
                cut = (
                    f"measured on the first {len(minputs)} of its {len(inputs)} inputs: their outputs reached "
                    f"STAGEBENCH_CACHE_MAX_MB ({settings.cache_max_mb:g} MB)"
                    if ometa.get("capped") and step.type != "aggregate"
                    else None
                )
                if cut:
                    self.say(f"{step.name!r}: {cut}")
                smeta.update(
                    status="measured",
                    n_inputs=len(minputs),
                    n_outputs=len(cached.items),
                    items_per_input=per_input * per_call if minputs else None,
                    inputs_cut=cut,
                    cache="hit" if cached.hit else ("off" if self.cache_dir is None else "computed"),
                    caching_errors=ometa.get("n_errors", 0),
                    caching_error_example=ometa.get("error_example", ""),
                    outputs_mb=round(ometa.get("bytes", 0) / 2**20, 3),
                )
                self.run_dir.write_meta(self.meta)
                measured, sweep_inputs = step, minputs
                if minputs and self._consumes(step, minputs[0], ometa, smeta, prev):
                    assert prev is not None  # _consumes says so only when there is a stage to fuse with
                    measured = replace(step, fn=Fused(prev[0].fn, step.fn))
                    sweep_inputs = prev[1]
                    smeta["items_per_input"] = prev[2]
                if minputs:
                    self._sweep_stage(measured, sweep_inputs, writer, came_from, src_problem)
                else:
                    reason = "no inputs to measure it on" + (
                        " (the aggregator emitted nothing)" if step.type == "aggregate" else ""
                    )
                    smeta.update(status="not_measured", reason=reason)
                    for row in _skipped_rows(step, settings, reason):
                        writer.write(row)
                        self.progress.done(row)
                if ometa.get("capped") and ometa.get("n_inputs"):
                    src_fraction *= ometa.get("n_run", 0) / ometa["n_inputs"]
                if not cached.items:
                    if ometa.get("crashed"):
                        why = f"a worker process died on its first pass ({ometa['crashed']})"
                    elif ometa.get("n_errors"):
                        why = f"every item raised ({ometa.get('error_example', '')})"
                    elif ometa.get("stalled"):
                        why = f"no item finished within {settings.timeout_s:g} s"
                    else:
                        why = "every output was None (dropped)"
                    blocked = f"not measured: the earlier stage {step.name!r} produced no outputs: {why}"
                prev = _fresh_source(step, minputs, cached.items, ometa, smeta, prev)
                inputs, in_key, came_from = cached.items, key, repr(step.name)
            # SPDL's no-op pipeline, inside the deferred tear-down too (its own would wait again); before
            # the process points: the bounds that rule them out charge it once per item
            self._measure_overhead(source_items)
            if self.process_sweeps:
                from stagebench.core._sweep import sweep_process_points

                self._rule_out_processes()
                sweep_process_points(self.process_sweeps, paired_needless=self._paired_needless)
                self.process_sweeps.clear()  # their inputs can go
        self.blocked = blocked
        # what one item at the sink stands for, in source items (batches: the batch size)
        self.items_per_sink_item = (n_source * src_fraction / len(inputs)) if inputs else None
        self.meta["items_per_sink_item"] = self.items_per_sink_item

    def _consumes(self, step: Any, item: Any, ometa: dict, smeta: dict, prev: tuple | None) -> bool:
        """Whether ``step`` consumes its inputs and is to be measured fused with the stage before it.

        Only a sync pipe on threads can tell (a process gets a fresh copy of each input), and only
        after a first pass without errors. Says so, and why, in either case.
        """
        from stagebench.pipeline._isolate import consumes_inputs

        if step.type != "pipe" or step.many or step.is_async or ometa.get("n_errors"):
            return False
        why = consumes_inputs(step.fn, item, timeout_s=self.settings.timeout_s)
        if why is None:
            return False
        smeta["consumes_inputs"] = why
        if prev is None or not prev[1]:
            self.say(
                f"{step.name!r}: calling it again on an input fails ({why}): it consumes its inputs, and no "
                "stage before it can give it fresh ones; its points will fail"
            )
            return False
        smeta["fused_with"] = prev[0].name
        # every stage the fused call also runs: the analysis takes their work out of this one's (analysis/_fused)
        smeta["fused_chain"] = list(prev[4])
        self.say(
            f"{step.name!r}: calling it again on an input fails ({why}): it consumes its inputs; measured fused "
            f"with {prev[0].name!r}, on fresh outputs of it each call (its rows are the pair's throughput)"
        )
        return True

    def _announce_source(self, source_items: list, unhashable: str | None) -> str | None:
        """Say once, before any stage runs, what source items that cannot be pickled rule out.

        Returns why a process pool cannot take them (None when it can, or when
        no process points are planned).
        """
        from stagebench.core._pickling import pickle_problem

        problem = pickle_problem(source_items, cloud=True) if "process" in self.settings.executors else None
        uncached = "; stage outputs are not cached between runs" if unhashable and self.cache_dir else ""
        if problem:
            self.say(
                f"source items cannot be pickled ({problem}): process executors are skipped for stages "
                f"that receive them; {self._the_others()}{uncached}"
            )
        elif uncached:
            self.say(f"{unhashable}{uncached}")
        return problem

    def _on_row(self, inputs: list, row: dict[str, Any]) -> None:
        """After each row of a stage's sweep: the CPU's speed, and SPDL's no-op pipeline next to its ceiling."""
        self._probe_speed(row)
        if (
            row.get("role") == "ceiling"
            and (row.get("harness"), row.get("executor"), row.get("concurrency")) == _NOOP_AT
            and row.get("status") == "ok"
            and row.get("elapsed_s")  # measured now, not a copy shared with a later stage
        ):
            self._measure_overhead(inputs, one_stage=row)

    def _probe_speed(self, row: dict[str, Any]) -> None:
        from stagebench.core._speed import cpu_speed_ns

        if row.get("elapsed_s"):  # measured, not a skipped or shared row
            self.sweep_speeds.append(round(cpu_speed_ns(), 2))
            if row.get("role") == "stage" and row.get("executor") in ("thread", "async"):
                self.stage_speeds.setdefault(row["stage"], []).append(self.sweep_speeds[-1])

    def _sweep_stage(
        self, step: Any, inputs: list, writer: Any, came_from: str | None, src_problem: str | None
    ) -> None:
        """Sweep one stage; process points are skipped with one reason when its inputs cannot be pickled.

        Only the first input is checked per point when measuring, so inputs
        that pickle only in part would otherwise start a pool, fail, and be
        recorded as failures of the stage.
        """
        from dataclasses import replace

        from stagebench.core._pickling import pickle_problem
        from stagebench.core._sweep import StageSweep, plan_points

        cfg = _sweep_config(step, self.settings)
        planned = {ex for _, _, ex, _ in plan_points(step.fn, cfg)}
        problem = pickle_problem(inputs, cloud=True) if "process" in planned else None

        def sweep(config: Any) -> None:
            # threads and the event loop now; process points later, every stage's
            # level by level on one pool (_sweep.sweep_process_points, after the last stage)
            s = StageSweep(
                step.fn,
                inputs,
                name=step.name,
                config=config,
                writer=writer,
                progress=self.progress,
                shared_ceilings=self.shared_ceilings,
                on_row=functools.partial(self._on_row, inputs),
            )
            # the lowest thread level first: the probe needs it (_computes), and what it reads
            # may end the thread curve early (a GIL-free stage whose cores are busy) and rule out
            # process points (_sweep._threads_cores_bound, _sweep._cores_bind)
            pts = [p for p in s.points if p[2] != "process"]
            first = next(((h, ex, c) for role, h, ex, c in pts if role == "stage" and ex == "thread"), None)
            head = [p for p in pts if p[1:] == first] if first else []
            s.run(head, None)
            with self._phase("gil_probes"):
                reading = self._probe_gil(step, inputs, s.rows)
            if reading and finite(reading.get("high")):
                s.gil_high = float(reading["high"])
            s.run([p for p in pts if p not in head], None)
            if s.process_pending():
                self.process_sweeps.append(s)
            else:  # ruled out by its thread curve: the skipped rows now, and its inputs need not be kept
                s.run(s.remaining("process"), None)

        if not problem:
            sweep(cfg)
            return
        if came_from is not None or not src_problem:  # the source's own message covered the first stage
            self.say(
                f"{step.name!r}: its inputs (the outputs of {came_from or 'the source'}) cannot be pickled "
                f"({problem}): process executors are skipped for it; {self._the_others('it is')}"
            )
        kept = tuple(ex for ex in cfg.executors if ex != "process")
        if kept:
            sweep(replace(cfg, executors=kept))
        else:
            self._stage_meta(step.name).update(
                status="not_measured",
                reason=f"inputs cannot be pickled ({problem}) and STAGEBENCH_EXECUTORS allows only process",
            )
        for row in _skipped_rows(
            step,
            self.settings,
            f"inputs cannot be pickled for a process pool: {problem}",
            executor="process",
            ceilings=True,
        ):
            writer.write(row)
            self.progress.done(row)

    def _probe_gil(self, step: Any, inputs: list, rows: list[dict[str, Any]]) -> dict[str, Any] | None:
        """Read the stage's GIL share directly (stagebench.pipeline._gilprobe) when it computes enough for it to matter.

        After its first thread point, with SPDL's tear-downs finished: the probe
        sets the switch interval and reads CPU clocks, so nothing else may run.
        A stage that computes less than 15% of its call (waits) holds the GIL
        at most that share, which the curves bound well; the probe (~0.35 s)
        is for the others.
        """
        if self.settings.gil_probe == "off" or not _computes(rows):
            return None
        from stagebench.core._spdl_harness import settle
        from stagebench.pipeline._gilprobe import probe_gil

        settle()  # the thread points' SPDL tear-downs, still finishing in the background
        reading = probe_gil(step.fn, inputs[:32], timeout_s=self.settings.timeout_s)
        self._stage_meta(step.name)["gil_probe"] = reading
        if "error" in reading:
            self.say(f"{step.name!r}: no GIL probe: {reading['error']}")
        self.run_dir.write_meta(self.meta)
        return reading

    def _the_others(self, what: str = "they are") -> str:
        """What becomes of the points that are not process points."""
        if any(ex != "process" for ex in self.settings.executors):
            return "thread/async points are measured"
        return f"STAGEBENCH_EXECUTORS allows only process, so {what} not measured"

    def _measure_overhead(self, items: list, one_stage: dict[str, Any] | None = None) -> None:
        """SPDL's per-item cost of a pipeline (:meth:`_pipeline_overhead`), once.

        Right after the thread no-op ceiling at thread x 4 (``one_stage``, from
        :meth:`_on_row`): that ceiling is the one-stage no-op pipeline, so only the
        three-stage one is measured, next to it in time (their difference is the
        per-stage cost, and host phases apart would enter it). Otherwise (a grid
        without 4, a thread curve that ended before it) both, after the thread
        points and before any process point.
        """
        if "pipeline_overhead" in self.meta or "spdl" not in self.settings.harnesses or len(self.plan.stages) < 2:
            return
        with self._phase("pipeline_overhead"):
            self.meta["pipeline_overhead"] = self._pipeline_overhead(items, one_stage)
        self.run_dir.write_meta(self.meta)

    def _user_process_stages(self) -> set[str]:
        """The stages the user's own script runs on processes: their process points check that setting."""
        return {st.name for st in self.plan.stages if st.user_executor == "process"}

    def _rule_out_processes(self) -> None:
        """Skip the process points of stages whose processes could not change the pipeline's settings.

        After every stage's thread points, before any process point: the bounds the
        joint recommendation maximises, with each such stage's processes at their
        most optimistic (:func:`stagebench.analysis._joint.process_headroom`). A
        stage whose processes could raise them by no more than the 5% within which
        settings count as equal is not measured on processes: another stage, the
        cores or the GIL binds the pipeline whatever this one runs on (``cpu_free``:
        its sha256 stage binds at ~700 items/s; its 1 ms wait and its 0.2 ms of
        Python reach 3,000 and 2,500 on threads alone). Stages the user runs on
        processes are measured on them, and ``STAGEBENCH_PROCESS_FLAT_LEVELS=0``
        measures every stage's.
        """
        from stagebench.analysis._pipeline import process_headroom_of_run
        from stagebench.core._paired import WITHIN_BEST

        mine = self._user_process_stages()
        sweeps = [s for s in self.process_sweeps if s.cfg.process_flat_levels and s.name not in mine]
        if not sweeps or len(self.plan.stages) < 2:
            return
        pending = {s.name: sorted({p[3] for p in s.remaining("process")}) for s in sweeps}
        with self._phase("process_headroom"):
            try:
                head = process_headroom_of_run(self._rows(), self.meta, pending, stage_cache=self.analysis_cache)
            except Exception as e:  # an analysis bug must not cost the measurements: measure them all
                self._log_error("process headroom", e)
                return
        for s in sweeps:
            h = head.get(s.name)
            if h is None or not h["gain"] * WITHIN_BEST <= 1.0:
                continue
            why = (
                f"not measured: on processes this stage could not change the pipeline's settings: even at "
                f"their best (each worker as fast as one thread alone, no IPC, its GIL time out of the main "
                f"process) the bounds give the pipeline {h['best']:,.0f} items/s against {h['on_threads']:,.0f} "
                f"with it on threads (set by {h['binding']}); "
                "process_flat_levels=0 or STAGEBENCH_PROCESS_FLAT_LEVELS=0 measures them"
            )
            for harness in dict.fromkeys(p[1] for p in s.remaining("process")):
                s.stopped[("stage", harness, "process")] = s.stopped[("ceiling", harness, "process")] = why
            s.run(s.remaining("process"), None)  # their skipped rows, with the reason
            self.process_sweeps.remove(s)

    def _paired_needless(self, sweeps: Any) -> dict[str, str]:
        """The planned head-to-heads whose result could not change the pipeline's settings, and why.

        Called with every stage's curves measured, before any head-to-head
        (:func:`stagebench.analysis._pipeline.paired_needless_of_run`). ``gil_mix``'s
        ``mixed`` (processes 1.26x threads on its curves, 8 windows, ~2.3 s): at 0.9x or
        1.76x the cores would bind the pipeline either way. A stage the user runs on
        processes keeps its head-to-head: it is their setting that it checks; so does every stage
        with ``STAGEBENCH_PROCESS_FLAT_LEVELS=0`` (measure everything).
        """
        from stagebench.analysis._pipeline import paired_needless_of_run

        mine = self._user_process_stages()
        planned = {
            s.name: p
            for s in sweeps
            if s.name not in mine and s.cfg.process_flat_levels  # 0: measure everything
            for p in [s.paired_plan()]
            if p
        }
        if not planned or len(self.plan.stages) < 2:
            return {}
        with self._phase("head_to_head_needed"):
            try:
                needless = paired_needless_of_run(self._rows(), self.meta, planned, stage_cache=self.analysis_cache)
            except Exception as e:  # an analysis bug must not cost the head-to-heads: run them
                self._log_error("head-to-head needed", e)
                return {}
        for name, why in needless.items():
            self._stage_meta(name)["head_to_head_skipped"] = why
            self.say(f"{name!r}: {why}")
        if needless:
            self.run_dir.write_meta(self.meta)
        return needless

    def _pipeline_overhead(self, items: list, one_stage: dict[str, Any] | None = None) -> dict[str, Any]:
        """SPDL's no-op cost with one and with three pipes (thread x 4, same statistics).

        A one-stage ceiling includes the source, the sink and the consumer
        thread, which a k-stage pipeline pays once; half the difference between
        the two no-op pipelines is what each further stage adds (two stages
        apart, not one: the increment is small next to the noise of one point). The prediction
        charges the first once and the second per stage. ``one_stage``: the
        thread no-op ceiling at x 4 just measured (the same pipeline, in the
        ceiling's shorter window), which is then not measured again.
        """
        from stagebench.core._measure import identity, measure_stage
        from stagebench.core._spdl_harness import deferred_teardown

        cfg = self.settings.measure_config()
        cfg = cfg.for_noop(cfg.budget_s)  # a no-op, steady at once; the whole budget: a difference is read
        harness, executor, c = _NOOP_AT
        out: dict[str, Any] = {"harness": harness, "executor": executor, "concurrency": c}
        keys = ("status", "qps", "cpu_s_per_item", "qps_low", "qps_high", "reason")

        def fields(row: dict[str, Any]) -> dict[str, Any]:
            return {k: (v if not isinstance(v, float) or finite(v) else None) for k in keys for v in [row.get(k)]}

        if one_stage is not None:
            out["one_stage"] = {**fields(one_stage), "from": f"the {executor} no-op ceiling at x {c}"}
        with deferred_teardown():
            for key, extra in (("one_stage", 0), ("three_stage", 2)):
                if key in out:
                    continue
                row = measure_stage(
                    identity,
                    items,
                    executor=executor,
                    concurrency=c,
                    config=cfg,
                    name="(pipeline)",
                    role="ceiling",
                    harness=harness,
                    spdl_extra_pipes=extra,
                )
                out[key] = fields(row)
        self.say(
            "SPDL no-op pipeline: "
            + ", ".join(
                f"{k.replace('_', ' ')} {out[k]['qps']:,.0f} items/s"
                for k in ("one_stage", "three_stage")
                if finite(out[k]["qps"])
            )
        )
        return out

    def _report_outputs(
        self, step: Any, inputs: list, cached: Any, ometa: dict, unstable: str | None, seconds: float
    ) -> None:
        n_out, mb = len(cached.items), ometa.get("bytes", 0) / 2**20
        if cached.hit:
            self.say(f"{step.name!r}: {n_out} outputs ({mb:.1f} MB) loaded from the cache {self.cache_dir}")
        else:
            self.say(
                f"{step.name!r}: ran once over {len(inputs)} inputs in {seconds:.1f} s -> {n_out} outputs ({mb:.1f} MB)"
            )
        if unstable:
            self.say(f"{step.name!r}: outputs not cached between runs: {unstable}")
        if cached.note:
            self.say(f"{step.name!r}: {cached.note}")
        if ometa.get("n_errors"):
            rest = "later stages use the outputs of the others" if n_out else "later stages cannot be measured"
            self.say(
                f"{step.name!r}: {ometa['n_errors']} of {ometa.get('n_run', len(inputs))} inputs raised "
                f"({ometa.get('error_example', '')}); {rest}"
            )
        if ometa.get("capped"):
            self.say(
                f"{step.name!r}: outputs reached the cache cap STAGEBENCH_CACHE_MAX_MB={self.settings.cache_max_mb:g}: "
                f"kept {n_out} outputs from the first {ometa.get('n_run')} of {len(inputs)} inputs; "
                "the rest were dropped (raise the cap to keep more)"
            )
        if ometa.get("crashed"):
            self.say(f"{step.name!r}: a worker process died on its first pass: {ometa['crashed']}")
        if ometa.get("process_note"):
            self.say(f"{step.name!r}: {ometa['process_note']}")
        if ometa.get("stalled"):
            self.say(
                f"{step.name!r}: no item finished within {self.settings.timeout_s:g} s; "
                f"kept the {n_out} outputs computed before that"
            )

    # ------------------------------------------------------------------ summary & report
    def _summarize(self, rows: Any) -> dict[str, Any]:
        from stagebench.analysis._pipeline import summarize

        try:
            return summarize(rows, self.meta, stage_cache=self.analysis_cache)
        except Exception as e:  # our bug, on rows a run produced: a minimal summary, and the run says so
            self._log_error("analysis", e)
            self.internal_error = f"the analysis failed: {type(e).__name__}: {e}"
            return _fallback_summary(rows, self.meta, self.internal_error)

    def _report(self, summary: dict[str, Any]) -> Path:
        from stagebench.report._render import write_report

        try:
            return Path(write_report(self.run_dir.path))
        except OSError:
            raise  # a write that failed: not a bug of the report (the caller says it)
        except Exception as e:
            self._log_error("report", e)
            self.internal_error = self.internal_error or f"the report failed: {type(e).__name__}: {e}"
            return _fallback_report(self.run_dir.path, summary)

    def _status(self, summary: dict[str, Any]) -> str:
        """run.json's status at the end (:mod:`stagebench.runs._outcome`): the first of failed, internal error,
        partial that holds, else complete."""
        if summary.get("validation_failed"):
            return str(FAILED.status)
        if self.internal_error:
            return str(INTERNAL.status)
        if self.unwritten:
            return str(PARTIAL.status)
        return str(COMPLETE.status)

    def _report_what_was_kept(self) -> None:
        """After Ctrl-C or SIGTERM: the summary and report of the rows measured so far, where there are any.

        A second Ctrl-C stops this too; nothing here may hide the interrupt itself."""
        try:
            rows = self._rows()
            if not len(rows):
                return
            summary = self._summarize(rows)
            self.run_dir.write_summary(summary)
            if self.write_report:
                self._report(summary)
        except (Exception, KeyboardInterrupt):
            return

    def _log_error(self, what: str, exc: BaseException) -> None:
        with open(self.run_dir.path / "error.log", "a", encoding="utf-8") as f:
            f.write(f"--- {what} ---\n{''.join(traceback.format_exception(exc))}\n")

    # ------------------------------------------------------------------ replay and validation runs


def _phases(timed: dict[str, float], rows: Any, total: float) -> dict[str, float]:
    """Seconds per phase: the timed blocks, the points by role (their rows' own ``elapsed_s``), the rest.

    Stage points, no-op ceilings and head-to-head rounds run interleaved, stage by stage, so they
    are added up from the rows rather than timed as blocks; ``other`` is what remains of ``total``
    (starting pools, the GIL speed probe, writing rows, waiting between points).
    """
    out = {k: round(v, 2) for k, v in timed.items()}
    if len(rows) and "role" in rows and "elapsed_s" in rows:
        by_role = rows.groupby("role")["elapsed_s"].sum()
        names = {"stage": "stage_points", "ceiling": "ceilings", "paired": "head_to_head"}
        for role, seconds in by_role.items():
            out[names.get(str(role), f"{role}_points")] = round(float(seconds), 2)
    out["other"] = round(max(0.0, total - sum(out.values())), 2)
    out["total"] = round(total, 2)
    return out


def _fresh_source(
    step: Any, minputs: list, outputs: list, ometa: dict[str, Any], smeta: dict[str, Any], prev: tuple | None
) -> tuple[Any, list, float | None, bool, list[str]] | None:
    """What gives the next stage fresh inputs, should it consume them: (a stage, its inputs, items per
    call, whether its i-th output is its i-th input's, the names of the stages that call runs).

    After a plain one-to-one pipe: that pipe over its own inputs. After an aggregate whose inputs came
    from such a pipe with nothing dropped (so the i-th output is the i-th input's): the pipe over each
    group's inputs, then the aggregate (decode -> batch -> convert, where convert takes ownership of the
    decoded frames). Anything else: nothing, and a consuming stage after it says its points will fail.
    """
    from stagebench.pipeline._isolate import MapThen

    if step.type == "pipe" and not step.many:
        aligned = len(outputs) == len(minputs) and not ometa.get("n_errors") and not ometa.get("n_dropped")
        return (step, minputs, smeta.get("items_per_input"), aligned, [step.name])
    if step.type == "aggregate" and prev is not None and prev[3] and ometa.get("groups"):
        base = prev[1]
        if all(b <= len(base) for _, b in ometa["groups"]):
            groups = [list(base[a:b]) for a, b in ometa["groups"]]
            chain = [*prev[4], step.name]
            return (replace(step, fn=MapThen(prev[0].fn, step.fn)), groups, smeta.get("items_per_input"), False, chain)
    return None


def _delivered_nothing(validation: dict[str, Any]) -> str | None:
    """Why the real pipeline's run is a failed validation, or None: it must deliver items to the sink.

    A prediction next to a pipeline that delivers nothing is not a result: the run ends with exit code 1.
    One that drew items from its source but was slower than the window is working: no number, no failure.
    """
    if validation.get("source_items"):
        return None
    if validation.get("qps") is None:
        return f"the real pipeline delivered no measurable throughput ({validation.get('error') or 'no items'})"
    if not validation.get("sink_items"):
        return f"the real pipeline delivered no items to the sink in {num(validation.get('seconds')):.1f} s"
    return None


# ---------------------------------------------------------------------------- fallbacks
def _fallback_summary(rows: Any, meta: dict[str, Any], why: str) -> dict[str, Any]:
    """FALLBACK, used only when the analysis raised (a bug of ours): the rows must still be reported.

    Honest and minimal: per stage the best measured point, classification
    ``unknown``, and no recommendation: recommending is the analysis's rule
    (:func:`stagebench.analysis._pipeline.summarize`), not one to keep a second
    copy of here. No GIL estimate, no prediction. ``why`` is kept in ``summary["error"]``.
    """
    from stagebench._version import __version__

    stages = []
    for st in meta.get("stages", []):
        d = rows[(rows["stage"] == st["name"]) & (rows["role"] == "stage")] if len(rows) else rows
        ok = d[(d["status"] == "ok") & d["qps"].notna()] if len(d) else d
        entry: dict[str, Any] = {
            "name": st["name"],
            "index": st["index"],
            "type": st["type"],
            "status": "ok" if len(ok) else (str(d["status"].iloc[0]) if len(d) else "not_measured"),
            "classification": "unknown",
            "gil_fraction": None,
            "gil_fraction_interval": None,
            "evidence": {"summary": [f"{why}: minimal summary"], "signals": {}},
            "fit": {},
            "recommended": None,
            "best": None,
            "ceiling_qps": None,
            "cpu_s_per_item": None,
            "gil_s_per_item": None,
        }
        if len(ok):
            best = ok.loc[ok["qps"].idxmax()]
            entry["best"] = {
                "executor": best["executor"],
                "concurrency": int(best["concurrency"]),
                "qps": float(best["qps"]),
                "qps_low": best["qps_low"],
                "qps_high": best["qps_high"],
                "harness": best["harness"],
            }
        stages.append(entry)
    return {
        "schema_version": SUMMARY_SCHEMA_VERSION,
        "kind": "pipeline",
        "stagebench_version": __version__,
        "provenance": meta.get("provenance"),
        "settings": meta.get("settings"),
        "verdict": f"minimal summary ({why}): the best measured point of each stage, no recommendation",
        "warnings": [f"{why}: classification, GIL fraction and prediction were not computed"],
        "stages": stages,
        "not_isolated": meta.get("not_isolated", []),
        "prediction": None,
        "validation": meta.get("validation"),
        "findings": [],
        "fallback": True,
        "error": why,
    }


def _fallback_report(run_dir: Path, summary: dict[str, Any]) -> Path:
    """FALLBACK, used only while ``stagebench.report._render`` is unavailable: a plain, escaped table."""
    import html
    import json

    from stagebench.report._terminal import format_table

    body = html.escape(format_table(summary))
    data = html.escape(json.dumps(summary, indent=2, default=str))
    path = run_dir / "report.html"
    path.write_text(
        "<!doctype html><meta charset='utf-8'><title>stagebench diagnosis</title>"
        "<h1>stagebench diagnosis (minimal report)</h1>"
        f"<pre>{body}</pre><details><summary>summary.json</summary><pre>{data}</pre></details>\n",
        encoding="utf-8",
    )
    return path


# ---------------------------------------------------------------------------- stagebench diagnose
