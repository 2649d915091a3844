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

import math
import os
import runpy
import statistics
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "DiagnoseSettings",
    "DiagnoseError",
    "SettingsError",
    "ENV_VARS",
    "patch_spdl",
    "diagnose_pipeline",
    "run_validation",
    "run_script",
]

_MODE_VAR = "SPDL_PIPELINE_DIAGNOSTIC_MODE"

#: Every environment variable diagnostic mode reads, with what it means (the README table).
ENV_VARS: dict[str, str] = {
    "SPDL_PIPELINE_DIAGNOSTIC_MODE": "1 (or true/on/yes): diagnose the first SPDL pipeline the script iterates, then exit",
    "SPDL_PIPELINE_DIAGNOSTIC_MODE_NUM_ITEMS": "source items read once and cached (default 200)",
    "LOCAL_RANK": "only local rank 0 diagnoses; other ranks exit 0 quietly",
    "STAGEBENCH_OUTPUT_DIR": "the run directory (default: a new folder under ./reports/)",
    "STAGEBENCH_BUDGET_S": "length of each point's timed window, seconds (default 1.0)",
    "STAGEBENCH_CONCURRENCY": "concurrency grid, e.g. 1,2,4,8 (default 1,2,4,8,16; up to the core count above 16 cores)",
    "STAGEBENCH_MAX_CONCURRENCY": "grid of powers of two up to this (alternative to STAGEBENCH_CONCURRENCY)",
    "STAGEBENCH_EXECUTORS": "executors for sync stages: thread,process (default both; async stages use the event loop)",
    "STAGEBENCH_HARNESSES": "direct (stagebench's workers), spdl (a one-stage SPDL pipeline); default direct,spdl",
    "STAGEBENCH_WARMUP_S": "minimum warm-up before each window, seconds (default 0.3)",
    "STAGEBENCH_TIMEOUT_S": "deadline of one point; a stage that has not delivered by then is a hang (default 30)",
    "STAGEBENCH_VALIDATION_S": "window of the whole-pipeline validation run, seconds (default max(2, 2 x budget); 0: skip)",
    "STAGEBENCH_CACHE_DIR": "where stage outputs are cached (default <parent of run dir>/.stagebench-cache; off: no cache)",
    "STAGEBENCH_CACHE_MAX_MB": "most MB of one stage's outputs kept; later items are dropped, with a message (default 1024)",
    "STAGEBENCH_PROCESS_FLAT_LEVELS": "stop a process curve after this many levels in a row without gain (default 2; 0: every level, and processes even where threads already scale linearly or reach the harness ceiling)",
    "STAGEBENCH_PROCESS_CEILINGS": "near_best (default: a process no-op ceiling only after points within 5% of the best so far) or all",
    "STAGEBENCH_PAIRED_ROUNDS": "rounds of the threads-vs-processes head-to-head (T P P T each) run when the curves alone "
                                "would pick processes by less than 1.5x (default 2; 0: the curves decide)",
    "STAGEBENCH_GIL_PROBE": "auto (default: a counter thread reads the GIL share of each sync stage that computes at least "
                            "15% of its call, ~0.5 s each) or off",
}

_TRUE = ("1", "true", "TRUE", "on", "ON", "yes", "YES")


class SettingsError(ValueError):
    """A bad setting: one line naming the variable and the allowed values."""


class DiagnoseError(Exception):
    """The diagnosis could not run; ``code`` is the exit status to use."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


# ---------------------------------------------------------------------------- settings
_SAMPLE_OUTPUTS = 8  # real outputs kept per stage for its stand-in in the replay (_replay.StandIn.op)


def _default_grid() -> tuple[int, ...]:
    """Powers of two up to 16, or up to the usable cores when there are more (then the core count
    itself is the top level): a process curve needs a worker per core to show where the cores end,
    and the plateau rule stops a flat curve early, so the extra levels cost little where they say nothing."""
    from . import _resources
    from ._config import powers_of_two

    return powers_of_two(max(16, _resources.usable_cores()))


@dataclass(frozen=True, slots=True, kw_only=True)
class DiagnoseSettings:
    """What a diagnosis measures; read from the environment by :meth:`from_env`."""

    num_items: int = 200
    """Source items read once and cached. 200 is enough for a stable window
    (inputs are cycled) while keeping decoded images in memory modest."""
    output_dir: str | None = None
    budget_s: float = 1.0
    concurrency: tuple[int, ...] = field(default_factory=_default_grid)
    executors: tuple[str, ...] = ("thread", "process")
    harnesses: tuple[str, ...] = ("direct", "spdl")
    warmup_s: float = 0.3
    timeout_s: float = 30.0
    validation_s: float | None = None
    """Counting window of each whole-pipeline run (the replay, the validation run).
    ``None``: max(2, 2 x budget_s). ``0``: neither runs (the prediction is the bounds alone)."""
    validate: str = "on"
    """``on``: the real pipeline runs at the recommended settings, taking turns with the
    replay, and its measured throughput is set against the prediction. ``off``: the
    replay alone (the prediction without its check), which saves about half of the
    whole-pipeline runs' time (3-4 s of a diagnosis at the default window). On by
    default: the measured number is the one a user can hold the recommendation to,
    and the only check of the prediction on the user's own pipeline."""
    cache_dir: str | None = None
    """``None``: ``<parent of run dir>/.stagebench-cache``; ``"off"``: no disk cache."""
    cache_max_mb: float = 1024.0
    process_flat_levels: int = 2
    """See :attr:`stagebench.SweepConfig.process_flat_levels`."""
    process_ceilings: str = "near_best"
    """See :attr:`stagebench.SweepConfig.process_ceilings`."""
    paired_rounds: int = 2
    """See :attr:`stagebench.SweepConfig.paired_rounds`."""
    gil_probe: str = "auto"
    """``auto``: read the GIL share of stages that compute (see :mod:`stagebench._gilprobe`); ``off``: curves only."""

    def __post_init__(self) -> None:
        from ._schema import HARNESSES

        if self.num_items < 1:
            raise SettingsError(f"SPDL_PIPELINE_DIAGNOSTIC_MODE_NUM_ITEMS must be a positive integer, got {self.num_items}")
        if not (self.budget_s > 0 and math.isfinite(self.budget_s)):
            raise SettingsError(f"STAGEBENCH_BUDGET_S must be a number of seconds > 0, got {self.budget_s}")
        if not self.concurrency or any(c < 1 for c in self.concurrency) or list(self.concurrency) != sorted(set(self.concurrency)):
            raise SettingsError(f"STAGEBENCH_CONCURRENCY must be ascending distinct positive integers, e.g. 1,2,4,8; got {self.concurrency}")
        bad = [e for e in self.executors if e not in ("thread", "process")] or (not self.executors and ["(empty)"])
        if bad:
            raise SettingsError(f"STAGEBENCH_EXECUTORS: unknown {bad[0]!r}; allowed: thread, process (comma-separated)")
        bad = [h for h in self.harnesses if h not in HARNESSES] or (not self.harnesses and ["(empty)"])
        if bad:
            raise SettingsError(f"STAGEBENCH_HARNESSES: unknown {bad[0]!r}; allowed: {', '.join(HARNESSES)} (comma-separated)")
        if not self.warmup_s >= 0:
            raise SettingsError(f"STAGEBENCH_WARMUP_S must be >= 0, got {self.warmup_s}")
        if not self.timeout_s > self.budget_s + self.warmup_s:
            raise SettingsError(
                f"STAGEBENCH_TIMEOUT_S ({self.timeout_s:g}) must be larger than budget + warm-up "
                f"({self.budget_s + self.warmup_s:g} s)"
            )
        if self.validation_s is not None and not (self.validation_s >= 0 and math.isfinite(self.validation_s)):
            raise SettingsError(f"STAGEBENCH_VALIDATION_S must be >= 0 seconds (0: skip), got {self.validation_s}")
        if not self.cache_max_mb > 0:
            raise SettingsError(f"STAGEBENCH_CACHE_MAX_MB must be a number of MB > 0, got {self.cache_max_mb}")
        if self.process_flat_levels < 0:
            raise SettingsError(f"STAGEBENCH_PROCESS_FLAT_LEVELS must be an integer >= 0 (0: every level), "
                                f"got {self.process_flat_levels}")
        if self.paired_rounds < 0:
            raise SettingsError(f"STAGEBENCH_PAIRED_ROUNDS must be an integer >= 0 (0: no head-to-head), "
                                f"got {self.paired_rounds}")
        if self.process_ceilings not in ("near_best", "all"):
            raise SettingsError(f"STAGEBENCH_PROCESS_CEILINGS must be one of near_best, all; got {self.process_ceilings!r}")
        if self.gil_probe not in ("auto", "off"):
            raise SettingsError(f"STAGEBENCH_GIL_PROBE must be one of auto, off; got {self.gil_probe!r}")
        if self.validate not in ("on", "off"):
            raise SettingsError(f"STAGEBENCH_VALIDATE must be one of on, off; got {self.validate!r}")

    @property
    def validation_window_s(self) -> float:
        return max(2.0, 2 * self.budget_s) if self.validation_s is None else self.validation_s

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "DiagnoseSettings":
        """Settings from the environment; :class:`SettingsError` on a bad value (nothing run yet)."""
        env = os.environ if environ is None else environ
        kw: dict[str, Any] = {}

        def number(var: str, kind: type, what: str) -> Any:
            raw = env.get(var, "").strip()
            if not raw:
                return None
            try:
                v = kind(raw)
            except ValueError:
                raise SettingsError(f"{var} must be {what}, got {raw!r}") from None
            if isinstance(v, float) and not math.isfinite(v):
                raise SettingsError(f"{var} must be {what}, got {raw!r}")
            return v

        def names(var: str) -> tuple[str, ...] | None:
            raw = env.get(var, "").strip()
            if not raw:
                return None
            return tuple(dict.fromkeys(p.strip().lower() for p in raw.split(",") if p.strip()))

        for var, key, kind, what in (
            ("SPDL_PIPELINE_DIAGNOSTIC_MODE_NUM_ITEMS", "num_items", int, "a positive integer"),
            ("STAGEBENCH_BUDGET_S", "budget_s", float, "a number of seconds > 0"),
            ("STAGEBENCH_WARMUP_S", "warmup_s", float, "a number of seconds >= 0"),
            ("STAGEBENCH_TIMEOUT_S", "timeout_s", float, "a number of seconds"),
            ("STAGEBENCH_VALIDATION_S", "validation_s", float, "a number of seconds >= 0 (0: skip)"),
            ("STAGEBENCH_CACHE_MAX_MB", "cache_max_mb", float, "a number of MB > 0"),
            ("STAGEBENCH_PROCESS_FLAT_LEVELS", "process_flat_levels", int, "an integer >= 0 (0: every level)"),
            ("STAGEBENCH_PAIRED_ROUNDS", "paired_rounds", int, "an integer >= 0 (0: no head-to-head)"),
        ):
            v = number(var, kind, what)
            if v is not None:
                kw[key] = v
        grid = env.get("STAGEBENCH_CONCURRENCY", "").strip()
        top = env.get("STAGEBENCH_MAX_CONCURRENCY", "").strip()
        if grid and top:
            raise SettingsError("set one of STAGEBENCH_CONCURRENCY (a list) and STAGEBENCH_MAX_CONCURRENCY (a maximum), not both")
        if grid:
            try:
                kw["concurrency"] = tuple(int(p) for p in grid.split(",") if p.strip())
            except ValueError:
                raise SettingsError(f"STAGEBENCH_CONCURRENCY must be comma-separated positive integers, e.g. 1,2,4,8; got {grid!r}") from None
        elif top:
            m = number("STAGEBENCH_MAX_CONCURRENCY", int, "a positive integer")
            if m < 1:
                raise SettingsError(f"STAGEBENCH_MAX_CONCURRENCY must be a positive integer, got {top!r}")
            from ._config import powers_of_two

            kw["concurrency"] = powers_of_two(m)
        for var, key in (("STAGEBENCH_EXECUTORS", "executors"), ("STAGEBENCH_HARNESSES", "harnesses")):
            v = names(var)
            if v is not None:
                kw[key] = v
        if env.get("STAGEBENCH_OUTPUT_DIR", "").strip():
            kw["output_dir"] = env["STAGEBENCH_OUTPUT_DIR"].strip()
        if env.get("STAGEBENCH_CACHE_DIR", "").strip():
            kw["cache_dir"] = env["STAGEBENCH_CACHE_DIR"].strip()
        if env.get("STAGEBENCH_PROCESS_CEILINGS", "").strip():
            kw["process_ceilings"] = env["STAGEBENCH_PROCESS_CEILINGS"].strip().lower()
        if env.get("STAGEBENCH_GIL_PROBE", "").strip():
            kw["gil_probe"] = env["STAGEBENCH_GIL_PROBE"].strip().lower()
        if env.get("STAGEBENCH_VALIDATE", "").strip():
            kw["validate"] = env["STAGEBENCH_VALIDATE"].strip().lower()
        return cls(**kw)

    def as_meta(self) -> dict[str, Any]:
        d = asdict(self)
        d["concurrency"] = list(self.concurrency)
        d["validation_s"] = self.validation_window_s
        return d


def _local_rank() -> int:
    raw = os.environ.get("LOCAL_RANK", "0").strip() or "0"
    try:
        return int(raw)
    except ValueError:
        raise SettingsError(f"LOCAL_RANK must be an integer, got {raw!r}") from None


# ---------------------------------------------------------------------------- SPDL hook
class _State:
    """What happened in this process (run_script reports on it)."""

    started = False
    finished = False
    code: int | None = None
    run_dir: Path | None = None
    original_mode: str | None = None  # the variable's value before a diagnosis set it to 0
    on_start: list = []  # called once when a pipeline diagnosis starts (run_script sets it)
    in_process = False  # run_script is running the script: it, not the interpreter's exit, ends the diagnosis


def patch_spdl(profile_module: Any) -> None:
    """Make SPDL's diagnostic mode build stagebench's stand-in pipeline.

    Called by the post-import hook when ``spdl.pipeline._profile`` is imported.
    Must stay cheap: it runs inside the user's ``import spdl``.
    """
    current = getattr(profile_module, "_build_pipeline_diagnostic_mode", None)
    if getattr(current, "_stagebench", False):
        return

    def _build_pipeline_diagnostic_mode(cfg: Any) -> Any:
        return _build_standin(cfg)

    _build_pipeline_diagnostic_mode._stagebench = True  # type: ignore[attr-defined]
    _build_pipeline_diagnostic_mode._spdl_original = current  # type: ignore[attr-defined]
    profile_module._build_pipeline_diagnostic_mode = _build_pipeline_diagnostic_mode


def _say(text: str) -> None:
    print(f"stagebench: {text}", file=sys.stderr, flush=True)


def _build_standin(cfg: Any) -> Any:
    try:
        settings = DiagnoseSettings.from_env()
    except SettingsError as e:
        _say(f"error: {e}")
        raise SystemExit(2) from None
    return _standin_class()(cfg, settings)


_STANDIN: type | None = None


def _standin_class() -> type:
    """A :class:`spdl.pipeline.Pipeline` look-alike (``isinstance`` checks still pass)."""
    global _STANDIN
    if _STANDIN is not None:
        return _STANDIN
    from spdl.pipeline import Pipeline

    class DiagnosticPipeline(Pipeline):
        """Stands in for the user's pipeline: iterating it runs the diagnosis, then exits."""

        def __init__(self, cfg: Any, settings: DiagnoseSettings) -> None:  # no super(): nothing to start
            self._stagebench_cfg = cfg
            self._stagebench_settings = settings

        def __str__(self) -> str:
            return f"stagebench diagnostic pipeline for\n{self._stagebench_cfg!r}"

        def start(self, *, timeout: float | None = None, **kwargs: Any) -> None:
            pass

        def stop(self, *, timeout: float | None = None, **kwargs: Any) -> None:
            pass

        @contextmanager
        def auto_stop(self, *, timeout: float | None = None):
            yield

        def get_item(self, *, timeout: float | None = None) -> Any:
            _diagnose_and_exit(self._stagebench_cfg, self._stagebench_settings)

        def _get_item_nowait(self) -> Any:
            _diagnose_and_exit(self._stagebench_cfg, self._stagebench_settings)

        def get_iterator(self, *, timeout: float | None = None):
            return self._stagebench_iter()

        def __iter__(self):
            return self._stagebench_iter()

        def _stagebench_iter(self):
            _diagnose_and_exit(self._stagebench_cfg, self._stagebench_settings)
            yield  # pragma: no cover - never reached: the diagnosis exits

    _STANDIN = DiagnosticPipeline
    return _STANDIN


def _exit(code: int) -> None:
    """End the program with ``code``, promptly.

    ``SystemExit`` normally; ``os._exit`` when raising would not end the
    program: the diagnosis ran in a thread other than the main one (SystemExit
    would only end that thread), or a hung stage left a thread that the
    interpreter would wait for at exit. Under :func:`run_script` (the
    ``stagebench diagnose`` command, or a test or notebook calling it) a
    leaked thread is its caller's business: ``os._exit`` there would end the
    caller's process too (a test session would stop, silently, with code 0),
    so ``SystemExit`` reaches ``run_script`` and the command exits promptly
    itself (``_cli.console``).
    """
    from ._executors import leaked_threads

    _State.finished, _State.code = True, code
    sys.stdout.flush()
    sys.stderr.flush()
    if threading.current_thread() is not threading.main_thread() or (leaked_threads() and not _State.in_process):
        os._exit(code)
    raise SystemExit(code)


def _diagnose_and_exit(cfg: Any, settings: DiagnoseSettings) -> None:
    try:
        rank = _local_rank()
    except SettingsError as e:
        _say(f"error: {e}")
        _exit(2)
    if rank != 0:
        _exit(0)  # as SPDL does: only local rank 0 diagnoses; the others leave quietly
    _State.started = True
    for hook in _State.on_start:
        hook()  # e.g. remove the DataLoader hook: this run diagnoses the pipeline
    _State.on_start = []
    _State.original_mode = os.environ.get(_MODE_VAR)
    # Worker processes inherit the environment; none of them may diagnose.
    os.environ[_MODE_VAR] = "0"
    try:
        diagnose_pipeline(cfg, settings=settings)
    except DiagnoseError as e:
        _say(f"error: {e}")
        _exit(e.code)
    except KeyboardInterrupt:
        where = f" in {_State.run_dir}" if _State.run_dir else ""
        _say(f"interrupted; the rows measured so far are on disk{where}")
        _exit(130)
    except Exception as e:  # our bug, not the user's: show where it happened
        traceback.print_exc()
        _say(f"internal error while diagnosing: {type(e).__name__}: {e}")
        _exit(1)
    _exit(0)


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


def _sweep_config(stage: Any, settings: DiagnoseSettings):
    from ._config import MeasureConfig, SweepConfig

    measure = MeasureConfig(budget_s=settings.budget_s, warmup_s=settings.warmup_s, timeout_s=settings.timeout_s)
    if stage.type in ("aggregate", "disaggregate"):
        # SPDL runs these inline on its event loop: no executor, no concurrency to choose.
        return SweepConfig(executors=("thread",), concurrency=(1,), harnesses=settings.harnesses, measure=measure)
    return SweepConfig(executors=settings.executors, concurrency=settings.concurrency,
                       harnesses=settings.harnesses, measure=measure, process_flat_levels=settings.process_flat_levels,
                       process_ceilings=settings.process_ceilings, paired_rounds=settings.paired_rounds)


_COMPUTES = 0.15  # share of its call a stage computes, from which its GIL share is worth reading directly


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
        cpu, p50, used = (r.get(k) for k in ("call_cpu_ms", "latency_p50_ms", "cores_used"))
        if r["harness"] == "spdl" and _finite(cpu) and _finite(p50) and p50 > 0:
            share = cpu / p50
        elif r["harness"] == "direct" and _finite(used):
            share = used / c0
        else:
            continue
        if share >= _COMPUTES:
            return True
    return False


def _skipped_rows(stage: Any, settings: DiagnoseSettings, reason: str, *, executor: str | None = None,
                  ceilings: bool = False) -> list[dict[str, Any]]:
    """Rows for points not measured: the stage's (and with ``ceilings``, its ceiling's), of ``executor`` or all."""
    from ._measure import empty_row
    from ._sweep import plan_points

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
) -> dict[str, Any]:
    """Diagnose an SPDL ``PipelineConfig``: sweep each stage alone, validate, report.

    ``report=False`` skips ``report.html`` (``stagebench report RUN_DIR`` writes it
    later). Returns the summary (``summary.json``). Raises :class:`DiagnoseError` when
    the diagnosis cannot run (its ``code``: 2 for a bad setting or pipeline, 1
    for a source that fails) and ``KeyboardInterrupt`` after saving the rows.
    """
    from ._isolate import PlanError, plan_pipeline
    from ._results import RunDir, RunDirInUseError, UnwritableOutputError, default_run_dir

    try:
        settings = settings or DiagnoseSettings.from_env()
    except SettingsError as e:
        raise DiagnoseError(str(e), 2) from None
    try:
        plan = plan_pipeline(cfg)
    except PlanError as e:
        raise DiagnoseError(str(e), 2) from None
    run_path = Path(out) if out is not None else Path(settings.output_dir) if settings.output_dir else default_run_dir("diagnose")
    try:
        run = RunDir.create(run_path, fresh=True)
    except (UnwritableOutputError, RunDirInUseError) as e:
        where = " (STAGEBENCH_OUTPUT_DIR)" if out is None and settings.output_dir else ""
        raise DiagnoseError(f"{e}{where}", 2) from None
    cache_dir: Path | None
    if (settings.cache_dir or "").lower() in ("off", "none", "0", "false", "no"):
        cache_dir = None
    else:
        cache_dir = Path(settings.cache_dir) if settings.cache_dir else run.path.resolve().parent / ".stagebench-cache"
        problem = _unwritable(cache_dir, "STAGEBENCH_CACHE_DIR")
        if problem:
            raise DiagnoseError(problem, 2)
    _State.run_dir = run.path
    original = _State.original_mode if _State.started else os.environ.get(_MODE_VAR)
    # Pool workers inherit the environment, and the one-stage SPDL pipelines built
    # while sweeping go through build_pipeline: neither may start a diagnosis.
    saved = os.environ.get(_MODE_VAR)
    os.environ[_MODE_VAR] = "0"
    try:
        return _Diagnosis(plan, run, settings, cache_dir, command or list(sys.argv), show_table,
                          mode_value=original, write_report=report).run()
    finally:
        if saved is None:
            os.environ.pop(_MODE_VAR, None)
        else:
            os.environ[_MODE_VAR] = saved


class _Diagnosis:
    """One diagnosis run: holds the run directory, the metadata and the progress display."""

    def __init__(self, plan: Any, run: Any, settings: DiagnoseSettings, cache_dir: Path | None,
                 command: list[str], show_table: bool, mode_value: str | None = None,
                 write_report: bool = True) -> None:
        from ._progress import Progress
        from ._provenance import collect_provenance

        self.plan, self.run_dir, self.settings, self.cache_dir = plan, run, settings, cache_dir
        self.show_table, self.write_report = show_table, write_report
        self.blocked: str | None = None  # why later stages could not be measured
        self.items_per_sink_item: float | None = None
        self.progress = Progress(desc="stagebench")
        # thread/async no-op ceilings do not depend on the stage: measured once per run
        self.shared_ceilings: dict[tuple[str, str, int], dict[str, Any]] = {}
        self.process_sweeps: list[Any] = []  # stages whose process points wait for the level-by-level pass
        self.analysis_cache: dict = {}  # each stage analysed once, before and after the whole-pipeline runs
        # the core's speed after every point (see _speed): the stage curves were measured at these
        self.sweep_speeds: list[float] = []
        # per stage, the probes after its thread / async points: what its stand-in's CPU amounts were read at
        self.stage_speeds: dict[str, list[float]] = {}
        self.meta: dict[str, Any] = {
            "schema_version": 1,
            "kind": "pipeline",
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "command": command,
            "status": "running",
            "provenance": collect_provenance(),
            "settings": {**settings.as_meta(), "cache_dir": str(cache_dir) if cache_dir else None},
            "stages": [s.as_meta() for s in plan.stages],
            "not_isolated": list(plan.not_isolated),
            "validation": None,
        }
        env = self.meta["provenance"].setdefault("env", {})
        if mode_value is None:
            env.pop(_MODE_VAR, None)
        else:
            env[_MODE_VAR] = mode_value  # what the user set, not the 0 we set for workers
        self.run_dir.write_meta(self.meta)

    def say(self, text: str) -> None:
        self.progress.message(text)

    def _stage_meta(self, name: str) -> dict[str, Any]:
        return next(s for s in self.meta["stages"] if s["name"] == name)

    # ------------------------------------------------------------------ main
    def run(self) -> dict[str, Any]:
        try:
            return self._run()
        except KeyboardInterrupt:
            self.meta["status"] = "interrupted"
            self.run_dir.write_meta(self.meta)
            raise
        except DiagnoseError as e:
            self.meta.update(status="failed", error=str(e))
            self.run_dir.write_meta(self.meta)
            raise
        finally:
            self.progress.close()

    def _run(self) -> dict[str, Any]:
        from ._isolate import SourceError, read_source
        from ._provenance import collect_provenance
        from ._sweep import plan_points

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
        try:
            src = read_source(plan, settings.num_items, timeout_s=max(60.0, settings.timeout_s))
        except SourceError as e:
            raise DiagnoseError(str(e), 1) from None
        self.say(f"read {len(src.items)} source items in {src.seconds:.1f} s")
        if src.note:
            self.say(src.note)
        self.meta["source"] = {"items": len(src.items), "asked": src.asked, "note": src.note}
        self.run_dir.write_meta(self.meta)
        # Heavy imports the first point would otherwise pay for while tearing down.
        from ._stats import mean_interval

        mean_interval([1.0, 2.0], 0.95)
        # what one page fault costs here (a direct mapping: malloc's state is left as it is)
        import mmap

        from ._resources import page_fault_cost_s

        self.meta["page_fault"] = {"cost_s": page_fault_cost_s(), "page_bytes": mmap.PAGESIZE}

        self._sweep_all(src.items)
        self.meta["cpu_speed"] = {"sweep_ns": self.sweep_speeds}
        if "spdl" in settings.harnesses and len(plan.stages) > 1:
            self.meta["pipeline_overhead"] = self._pipeline_overhead(src.items)
            self.run_dir.write_meta(self.meta)
        rows = self._rows()
        summary = self._summarize(rows)
        if self.blocked:
            self.meta["validation"] = {"qps": None, "error": f"skipped: {self.blocked}"}
        elif settings.validation_window_s > 0:
            replay, validation = self._replay_and_validate(src.items, summary)
            self.meta["replay"] = replay
            if validation is not None:
                self.meta["validation"] = validation
        self.meta["provenance_after"] = collect_provenance()
        self.meta["status"] = "complete"
        self.run_dir.write_meta(self.meta)
        summary = self._summarize(rows)
        self.run_dir.write_summary(summary)
        report = self._report(summary) if self.write_report else None
        if self.show_table:
            from ._terminal import format_table

            print(format_table(summary, report), end="", flush=True)
        self.say(f"done; report: {report}" if report else f"done; results in {self.run_dir.path}")
        return summary

    def _rows(self):
        from ._results import read_rows

        return read_rows(self.run_dir.results_csv)

    # ------------------------------------------------------------------ stages
    def _sweep_all(self, source_items: list) -> None:
        from ._isolate import Passthrough, compute_outputs, measure_inputs, run_passthrough
        from ._schema import STAGE_COLUMNS
        from ._stage_cache import StageCache, callable_key, chain_key, items_key
        from ._sweep import sweep_stage

        settings = self.settings
        cache = StageCache(self.cache_dir, max_disk_mb=10 * settings.cache_max_mb)
        max_bytes = settings.cache_max_mb * 2**20
        n_source = len(source_items)
        inputs, (in_key, unhashable) = source_items, items_key(source_items)
        src_problem = self._announce_source(source_items, unhashable)
        came_from: str | None = None  # the step whose outputs are the current inputs (None: the source)
        src_fraction = 1.0  # share of the source items the current inputs derive from
        blocked: str | None = None
        with self.run_dir.writer(STAGE_COLUMNS) as writer:
            for step in self.plan.steps:
                if isinstance(step, Passthrough):
                    if blocked:
                        continue
                    try:
                        inputs, pmeta = run_passthrough(step, inputs, timeout_s=max(60.0, settings.timeout_s))
                    except KeyboardInterrupt:
                        raise
                    except Exception as e:
                        blocked = f"not measured: {', '.join(step.names)} (run as a whole) failed: {type(e).__name__}: {e}"
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
                cached = cache.get_or_compute(
                    key, lambda s=step, x=inputs: compute_outputs(s, x, max_bytes=max_bytes, stall_s=settings.timeout_s)
                )
                ometa = cached.meta or {}
                self.plan.sample_outputs[step.name] = list(cached.items[:_SAMPLE_OUTPUTS])  # for its stand-in
                self._report_outputs(step, inputs, cached, ometa, unstable, time.perf_counter() - started)
                minputs = measure_inputs(step, inputs, ometa)
                smeta.update(
                    status="measured", n_inputs=len(minputs), n_outputs=len(cached.items),
                    # source items per input of this stage (after a batch: the batch size);
                    # the analysis turns per-input figures into per-source-item ones with it
                    items_per_input=(n_source * src_fraction / len(minputs)) if minputs else None,
                    cache="hit" if cached.hit else ("off" if self.cache_dir is None else "computed"),
                    caching_errors=ometa.get("n_errors", 0), caching_error_example=ometa.get("error_example", ""),
                    outputs_mb=round(ometa.get("bytes", 0) / 2**20, 3),
                )
                self.run_dir.write_meta(self.meta)
                if minputs:
                    self._sweep_stage(step, minputs, writer, came_from, src_problem)
                else:
                    reason = "no inputs to measure it on" + (f" (the aggregator emitted nothing)" if step.type == "aggregate" else "")
                    smeta.update(status="not_measured", reason=reason)
                    for row in _skipped_rows(step, settings, reason):
                        writer.write(row)
                        self.progress.done(row)
                if ometa.get("capped") and ometa.get("n_inputs"):
                    src_fraction *= ometa.get("n_run", 0) / ometa["n_inputs"]
                if not cached.items:
                    if ometa.get("n_errors"):
                        why = f"every item raised ({ometa.get('error_example', '')})"
                    elif ometa.get("stalled"):
                        why = f"no item finished within {settings.timeout_s:g} s"
                    else:
                        why = "every output was None (dropped)"
                    blocked = f"not measured: the earlier stage {step.name!r} produced no outputs: {why}"
                inputs, in_key, came_from = cached.items, key, repr(step.name)
            if self.process_sweeps:
                from ._sweep import sweep_process_points

                sweep_process_points(self.process_sweeps)
                self.process_sweeps.clear()  # their inputs can go
        self.blocked = blocked
        # what one item at the sink stands for, in source items (batches: the batch size)
        self.items_per_sink_item = (n_source * src_fraction / len(inputs)) if inputs else None
        self.meta["items_per_sink_item"] = self.items_per_sink_item

    def _announce_source(self, source_items: list, unhashable: str | None) -> str | None:
        """Say once, before any stage runs, what source items that cannot be pickled rule out.

        Returns why a process pool cannot take them (None when it can, or when
        no process points are planned).
        """
        from ._pickling import pickle_problem

        problem = pickle_problem(source_items, cloud=True) if "process" in self.settings.executors else None
        uncached = "; stage outputs are not cached between runs" if unhashable and self.cache_dir else ""
        if problem:
            self.say(f"source items cannot be pickled ({problem}): process executors are skipped for stages "
                     f"that receive them; {self._the_others()}{uncached}")
        elif uncached:
            self.say(f"{unhashable}{uncached}")
        return problem

    def _probe_speed(self, row: dict[str, Any]) -> None:
        from ._speed import cpu_speed_ns

        if row.get("elapsed_s"):  # measured, not a skipped or shared row
            self.sweep_speeds.append(round(cpu_speed_ns(), 2))
            if row.get("role") == "stage" and row.get("executor") in ("thread", "async"):
                self.stage_speeds.setdefault(row["stage"], []).append(self.sweep_speeds[-1])

    def _sweep_stage(self, step: Any, inputs: list, writer: Any, came_from: str | None,
                     src_problem: str | None) -> None:
        """Sweep one stage; process points are skipped with one reason when its inputs cannot be pickled.

        Only the first input is checked per point when measuring, so inputs
        that pickle only in part would otherwise start a pool, fail, and be
        recorded as failures of the stage.
        """
        from dataclasses import replace

        from ._pickling import pickle_problem
        from ._spdl_harness import deferred_teardown
        from ._sweep import StageSweep, plan_points

        cfg = _sweep_config(step, self.settings)
        planned = {ex for _, _, ex, _ in plan_points(step.fn, cfg)}
        problem = pickle_problem(inputs, cloud=True) if "process" in planned else None

        def sweep(config: Any) -> None:
            # threads and the event loop now; process points later, every stage's
            # level by level on one pool (_sweep.sweep_process_points, after the last stage)
            s = StageSweep(step.fn, inputs, name=step.name, config=config, writer=writer, progress=self.progress,
                           shared_ceilings=self.shared_ceilings, on_row=self._probe_speed)
            with deferred_teardown():
                s.run([p for p in s.points if p[2] != "process"], None)
            self._probe_gil(step, inputs, s.rows)
            if s.process_pending():
                self.process_sweeps.append(s)
            else:  # ruled out by its thread curve: the skipped rows now, and its inputs need not be kept
                s.run(s.remaining("process"), None)

        if not problem:
            sweep(cfg)
            return
        if came_from is not None or not src_problem:  # the source's own message covered the first stage
            self.say(f"{step.name!r}: its inputs (the outputs of {came_from or 'the source'}) cannot be pickled "
                     f"({problem}): process executors are skipped for it; {self._the_others('it is')}")
        kept = tuple(ex for ex in cfg.executors if ex != "process")
        if kept:
            sweep(replace(cfg, executors=kept))
        else:
            self._stage_meta(step.name).update(status="not_measured", reason=f"inputs cannot be pickled ({problem}) "
                                               "and STAGEBENCH_EXECUTORS allows only process")
        for row in _skipped_rows(step, self.settings, f"inputs cannot be pickled for a process pool: {problem}",
                                 executor="process", ceilings=True):
            writer.write(row)
            self.progress.done(row)

    def _probe_gil(self, step: Any, inputs: list, rows: list[dict[str, Any]]) -> None:
        """Read the stage's GIL share directly (stagebench._gilprobe) when it computes enough for it to matter.

        After its thread points, with SPDL's tear-downs finished: the probe
        sets the switch interval and reads CPU clocks, so nothing else may run.
        A stage that computes less than 15% of its call (waits) holds the GIL
        at most that share, which the curves bound well; the probe (~0.5 s)
        is for the others.
        """
        if self.settings.gil_probe == "off" or not _computes(rows):
            return
        from ._gilprobe import probe_gil

        reading = probe_gil(step.fn, inputs[:32], timeout_s=self.settings.timeout_s)
        self._stage_meta(step.name)["gil_probe"] = reading
        if "error" in reading:
            self.say(f"{step.name!r}: no GIL probe: {reading['error']}")
        self.run_dir.write_meta(self.meta)

    def _the_others(self, what: str = "they are") -> str:
        """What becomes of the points that are not process points."""
        if any(ex != "process" for ex in self.settings.executors):
            return "thread/async points are measured"
        return f"STAGEBENCH_EXECUTORS allows only process, so {what} not measured"

    def _pipeline_overhead(self, source_items: list) -> dict[str, Any]:
        """SPDL's no-op cost with one and with three pipes (thread x 4, same window and statistics).

        A one-stage ceiling includes the source, the sink and the consumer
        thread, which a k-stage pipeline pays once; half the difference between
        the two no-op pipelines is what each further stage adds (two stages
        apart, not one: the increment is small next to the noise of one point). The prediction
        charges the first once and the second per stage.
        """
        from ._config import MeasureConfig
        from ._measure import identity, measure_stage
        from ._spdl_harness import deferred_teardown

        s = self.settings
        cfg = MeasureConfig(budget_s=s.budget_s, warmup_s=s.warmup_s, timeout_s=s.timeout_s)
        # 4 threads, SPDL's smallest default pool (what a rebuilt pipeline gets): with one
        # thread every hop queues behind the previous one and a stage costs about as
        # much as the whole one-stage pipeline (275 us of 345 measured), which is not
        # what a pipeline running stages at concurrency 4-16 pays
        c = 4
        out: dict[str, Any] = {"harness": "spdl", "executor": "thread", "concurrency": c}
        with deferred_teardown():
            for key, extra in (("one_stage", 0), ("three_stage", 2)):
                row = measure_stage(identity, source_items, executor="thread", concurrency=c, config=cfg,
                                    name="(pipeline)", role="ceiling", harness="spdl", spdl_extra_pipes=extra)
                out[key] = {k: (v if not isinstance(v, float) or _finite(v) else None) for k in
                            ("status", "qps", "cpu_s_per_item", "qps_low", "qps_high", "reason") for v in [row.get(k)]}
        self.say("SPDL no-op pipeline: " + ", ".join(
            f"{k.replace('_', ' ')} {out[k]['qps']:,.0f} items/s" for k in ("one_stage", "three_stage")
            if _finite(out[k]["qps"])))
        return out

    def _report_outputs(self, step: Any, inputs: list, cached: Any, ometa: dict, unstable: str | None,
                        seconds: float) -> None:
        n_out, mb = len(cached.items), ometa.get("bytes", 0) / 2**20
        if cached.hit:
            self.say(f"{step.name!r}: {n_out} outputs ({mb:.1f} MB) loaded from the cache {self.cache_dir}")
        else:
            self.say(f"{step.name!r}: ran once over {len(inputs)} inputs in {seconds:.1f} s -> {n_out} outputs ({mb:.1f} MB)")
        if unstable:
            self.say(f"{step.name!r}: outputs not cached between runs: {unstable}")
        if cached.note:
            self.say(f"{step.name!r}: {cached.note}")
        if ometa.get("n_errors"):
            rest = ("later stages use the outputs of the others" if n_out
                    else "later stages cannot be measured")
            self.say(f"{step.name!r}: {ometa['n_errors']} of {ometa.get('n_run', len(inputs))} inputs raised "
                     f"({ometa.get('error_example', '')}); {rest}")
        if ometa.get("capped"):
            self.say(
                f"{step.name!r}: outputs reached the cache cap STAGEBENCH_CACHE_MAX_MB={self.settings.cache_max_mb:g}: "
                f"kept {n_out} outputs from the first {ometa.get('n_run')} of {len(inputs)} inputs; "
                "the rest were dropped (raise the cap to keep more)"
            )
        if ometa.get("stalled"):
            self.say(f"{step.name!r}: no item finished within {self.settings.timeout_s:g} s; "
                     f"kept the {n_out} outputs computed before that")

    # ------------------------------------------------------------------ summary & report
    def _summarize(self, rows: Any) -> dict[str, Any]:
        try:
            from ._analysis import summarize
        except ImportError:
            return _fallback_summary(rows, self.meta, "analysis engine unavailable")
        try:
            return summarize(rows, self.meta, stage_cache=self.analysis_cache)
        except Exception as e:
            self._log_error("analysis", e)
            self.say(f"the analysis failed ({type(e).__name__}: {e}); wrote a minimal summary instead "
                     f"(details in {self.run_dir.path / 'error.log'}; rebuild with `stagebench report`)")
            return _fallback_summary(rows, self.meta, f"the analysis failed: {type(e).__name__}: {e}")

    def _report(self, summary: dict[str, Any]) -> Path:
        try:
            from ._report import write_report
        except ImportError:
            return _fallback_report(self.run_dir.path, summary)
        try:
            return Path(write_report(self.run_dir.path))
        except Exception as e:
            self._log_error("report", e)
            self.say(f"the report failed ({type(e).__name__}: {e}); wrote a minimal one instead")
            return _fallback_report(self.run_dir.path, summary)

    def _log_error(self, what: str, exc: BaseException) -> None:
        with open(self.run_dir.path / "error.log", "a", encoding="utf-8") as f:
            f.write(f"--- {what} ---\n{''.join(traceback.format_exception(exc))}\n")

    # ------------------------------------------------------------------ replay and validation runs
    def _replay_and_validate(self, source_items: list, summary: dict[str, Any]) -> tuple[dict, dict | None]:
        """The replay (the prediction, :mod:`stagebench._replay`) and the validation run, taking turns.

        Both at the recommended settings, with the same warm-up and counting
        time; interleaved so that both see the same moments of the machine
        (:mod:`stagebench._wholerun`). A failure is the result's ``error``.
        With ``validate="off"`` the replay runs alone and the validation is
        None (not run, by request: no warning).
        """
        from ._replay import plan_stand_ins
        from ._speed import cpu_speed_ns
        from ._wholerun import run_pipelines

        from ._isolate import Passthrough

        choices = _choices(summary)
        # The warm-up is for pools that start lazily, on their first items: worker
        # processes take ~1 s here. Thread pools start at once, so a pipeline without
        # processes (none recommended, none of the user's own, no segment run as is)
        # is warm once items have reached the sink for 0.5 s.
        procs = (any(ex == "process" for ex, _ in choices.values())
                 or any(isinstance(st, Passthrough) or st.user_executor == "process" for st in self.plan.steps))
        window, warm = self.settings.validation_window_s, max(1.0 if procs else 0.5, self.settings.budget_s)
        speeds = {name: statistics.median(v) for name, v in self.stage_speeds.items() if v}
        self.meta.setdefault("cpu_speed", {})["stage_ns"] = speeds
        stand_ins = plan_stand_ins(summary.get("stages") or [], speeds)
        validate = self.settings.validate == "on"
        runs: dict[str, Any] = {}
        if stand_ins:
            runs["replay"] = stand_ins
        if validate:
            runs["validation"] = None  # the real stages
        if len(runs) == 2:
            self.say(f"replay and validation, taking turns: the pipeline with stand-ins for {len(stand_ins)} "
                     f"stage(s) and the real one, recommended settings, {warm:g} s warm-up each + {window:g} s "
                     "of counting each, in slices")
        elif stand_ins:
            self.say(f"replay: the pipeline with stand-ins for {len(stand_ins)} stage(s), recommended settings, "
                     f"{warm:g} s warm-up + {window:g} s window (no validation run: STAGEBENCH_VALIDATE=off)")
        elif validate:
            self.say(f"validation: the whole pipeline with the recommended settings, {warm:g} s warm-up + "
                     f"{window:g} s window")
        else:
            return {"qps": None, "error": "no stage could be stood in (none measured)"}, None
        before = cpu_speed_ns()
        try:
            out = run_pipelines(self.plan, source_items, choices, runs, warmup_s=warm, window_s=window,
                                timeout_s=self.settings.timeout_s, items_per_sink_item=self.items_per_sink_item or 1.0)
            if validate:  # the speed the measured number was read at
                self.meta.setdefault("cpu_speed", {})["validation_ns"] = [round(before, 2), round(cpu_speed_ns(), 2)]
        except KeyboardInterrupt:
            raise
        except Exception as e:
            self._log_error("replay and validation", e)
            out = {k: {"qps": None, "error": f"{type(e).__name__}: {e}"} for k in runs}
        validation = out.get("validation")
        if stand_ins:
            replay = out["replay"]
            replay["stand_ins"] = [s.as_dict() for s in stand_ins.values()]
        else:
            replay = {"qps": None, "error": "no stage could be stood in (none measured)"}
        if replay.get("qps") is not None:
            self.say(f"replay: {replay['qps']:,.1f} items/s")
        elif stand_ins:
            self.say(f"replay failed: {replay.get('error')}")
        if validation is not None and validation.get("qps") is not None:
            self.say(f"validation: {validation['qps']:,.1f} items/s ({validation['sink_qps']:,.1f} sink items/s "
                     f"at the sink; {validation['source_qps']:,.1f} items/s drawn from the source)")
        elif validation is not None:
            self.say(f"validation run failed: {validation.get('error')}")
        return replay, validation


def _choices(summary: dict[str, Any]) -> dict[str, tuple[str, int]]:
    """Each stage's recommended (executor, concurrency), by name."""
    choices: dict[str, tuple[str, int]] = {}
    for st in summary.get("stages") or []:
        rec = st.get("recommended") or {}
        if rec.get("executor") and _finite(rec.get("concurrency")):
            choices[str(st.get("name"))] = (str(rec["executor"]), int(rec["concurrency"]))
    return choices


def _finite(x: Any) -> bool:
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def run_validation(plan: Any, source_items: list, choices: dict[str, tuple[str, int]], *,
                   warmup_s: float, window_s: float, timeout_s: float,
                   items_per_sink_item: float = 1.0, stand_ins: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run the whole pipeline alone over the cached source items and time what reaches the sink.

    One run of :func:`stagebench._wholerun.run_pipelines` (its result's keys):
    the real stages, or with ``stand_ins`` the replay. The diagnosis runs the
    two together, taking turns.
    """
    from ._wholerun import run_pipelines

    name = "replay" if stand_ins else "validation"
    return run_pipelines(plan, source_items, choices, {name: stand_ins}, warmup_s=warmup_s, window_s=window_s,
                         timeout_s=timeout_s, items_per_sink_item=items_per_sink_item)[name]


# ---------------------------------------------------------------------------- fallbacks
def _fallback_summary(rows: Any, meta: dict[str, Any], why: str) -> dict[str, Any]:
    """FALLBACK, used only while ``stagebench._analysis`` is unavailable or failed.

    Honest and minimal: per stage the best measured point, the recommendation
    (smallest concurrency within 5% of the best QPS), classification
    ``unknown``. No GIL estimate, no prediction. ``why`` (the error, when the
    analysis raised) is kept in ``summary["error"]``.
    """
    from . import __version__

    stages = []
    for st in meta.get("stages", []):
        d = rows[(rows["stage"] == st["name"]) & (rows["role"] == "stage")] if len(rows) else rows
        ok = d[(d["status"] == "ok") & d["qps"].notna()] if len(d) else d
        entry: dict[str, Any] = {
            "name": st["name"], "index": st["index"], "type": st["type"],
            "status": "ok" if len(ok) else (str(d["status"].iloc[0]) if len(d) else "not_measured"),
            "classification": "unknown", "gil_fraction": None, "gil_fraction_interval": None,
            "evidence": {"summary": [f"{why}: minimal summary"], "signals": {}},
            "fit": {}, "recommended": None, "best": None, "ceiling_qps": None,
            "cpu_s_per_item": None, "gil_s_per_item": None,
        }
        if len(ok):
            best = ok.loc[ok["qps"].idxmax()]
            near = ok[ok["qps"] >= 0.95 * best["qps"]].copy()
            near["_pref"] = near["executor"].map({"thread": 0, "async": 0, "process": 1}).fillna(2)
            rec = near.sort_values(["concurrency", "_pref", "qps"], ascending=[True, True, False]).iloc[0]

            def point(r: Any) -> dict[str, Any]:
                return {"executor": r["executor"], "concurrency": int(r["concurrency"]), "qps": float(r["qps"]),
                        "qps_low": r["qps_low"], "qps_high": r["qps_high"], "harness": r["harness"]}

            entry["best"] = point(best)
            entry["recommended"] = {**point(rec), "why": "smallest concurrency within 5% of the best measured QPS"}
        stages.append(entry)
    return {
        "schema_version": 1, "kind": "pipeline", "stagebench_version": __version__,
        "provenance": meta.get("provenance"), "settings": meta.get("settings"),
        "verdict": f"minimal summary ({why}): see the per-stage recommendations",
        "warnings": [f"{why}: classification, GIL fraction and prediction were not computed"],
        "stages": stages, "not_isolated": meta.get("not_isolated", []), "prediction": None,
        "validation": meta.get("validation"), "findings": [], "fallback": True, "error": why,
    }


def _fallback_report(run_dir: Path, summary: dict[str, Any]) -> Path:
    """FALLBACK, used only while ``stagebench._report`` is unavailable: a plain, escaped table."""
    import html
    import json

    from ._terminal import format_table

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
def run_script(script: str, args: list[str], *, out: str | None) -> int:
    """Run ``script`` with ``args`` as ``__main__`` in diagnostic mode; return the exit code."""
    from . import _activate

    path = Path(script)
    if not path.is_file():
        _say(f"error: script not found: {script}")
        return 2
    saved_env = {k: os.environ.get(k) for k in (_MODE_VAR, "STAGEBENCH_OUTPUT_DIR")}
    if out is not None:
        os.environ["STAGEBENCH_OUTPUT_DIR"] = out
    try:
        settings = DiagnoseSettings.from_env()
        _local_rank()
    except SettingsError as e:
        _say(f"error: {e}")
        _restore_env(saved_env)
        return 2
    if settings.output_dir:
        # Before the script runs: its own start-up may take minutes, and then
        # neither the pipeline nor a caught DataLoader could use this folder.
        from ._results import RunDir, RunDirInUseError, UnwritableOutputError

        try:
            RunDir.create(settings.output_dir, fresh=True)
        except (UnwritableOutputError, RunDirInUseError) as e:
            _say(f"error: {e}")
            _restore_env(saved_env)
            return 2
    os.environ[_MODE_VAR] = "1"
    was_installed = _activate.installed()
    _activate.install()
    _State.started = _State.finished = False
    _State.code = None
    # PyTorch users: the first DataLoader the script iterates is swept instead,
    # unless an SPDL pipeline is diagnosed first.
    from ._loader_intercept import diagnose_first_loader, loader_was_caught

    _State.on_start = [diagnose_first_loader(settings.output_dir, config=_loader_config(settings))]
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = [str(path), *args]
    sys.path.insert(0, str(path.resolve().parent))
    code: int
    raised: str | None = None
    _State.in_process = True
    try:
        runpy.run_path(str(path), run_name="__main__")
        code = 0
    except SystemExit as e:
        code = _exit_code(e.code)
    except KeyboardInterrupt:
        _say("interrupted")
        code = 130
    except Exception as e:  # noqa: BLE001 - the script's own error: shown as Python shows it, then said
        _print_script_traceback(e, str(path))
        raised, code = f"{type(e).__name__}: {e}", 1
    finally:
        _State.in_process = False
        sys.argv, sys.path[:] = saved_argv, saved_path
        _restore_env(saved_env)
        if not was_installed:  # in-process callers (tests, notebooks) get their import system back
            _activate.uninstall()
    for hook in _State.on_start:
        hook()
    _State.on_start = []
    if _State.finished and _State.code is not None:
        return _State.code
    if loader_was_caught():
        return code
    if not _State.started:
        how = f"raised {raised}" if raised else f"finished (exit code {code})"
        _say(f"error: {script} {how} without iterating an SPDL pipeline or a DataLoader: nothing was diagnosed")
        return code or 1
    return code


def _print_script_traceback(exc: BaseException, filename: str) -> None:
    """The traceback of an exception the user's script raised, from the script's own frame on.

    What ``python script.py`` would print: stagebench's and runpy's frames
    above it are how the script was started, not where it went wrong.
    """
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != filename:
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb or exc.__traceback__, file=sys.stderr)


def _loader_config(settings: DiagnoseSettings) -> Any:
    """The same budgets for a caught DataLoader as for pipeline stages (one set of knobs)."""
    from ._loader import LoaderSweepConfig

    return LoaderSweepConfig(
        budget_s=max(settings.budget_s, 0.5),  # batches are slower than items: keep a few per window
        warmup_s=settings.warmup_s,
        timeout_s=max(settings.timeout_s, 2 * settings.budget_s + 1),
        transform_budget_s=max(0.2, settings.budget_s / 2),
        transform_executors=tuple(e for e in settings.executors if e in ("thread", "process")) or ("thread",),
    )


def _exit_code(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    print(value, file=sys.stderr)
    return 1


def _restore_env(saved: dict[str, str | None]) -> None:
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
