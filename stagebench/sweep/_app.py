"""``stagebench sweep``: the Hydra app that sweeps loader configurations.

One Hydra job = one loader configuration (``conf/loader/*.yaml`` plus
overrides). The job builds the loader (:mod:`stagebench.sweep._builtin_loaders`),
hands a factory to the loader sweep (:func:`stagebench.loader._sweep.run_loader_sweep`),
which sweeps num_workers x prefetch_factor x ... and writes the job's run
directory; the job's output folder *is* that run directory, next to Hydra's
``.hydra/``. A multirun (``-m``) ends with ``comparison.csv`` and
``comparison.html`` in the sweep folder, written by :class:`SweepCallback`.

Why the app is shaped like this:

* Hydra owns its command line (``-m``, ``--cfg``, ``--info``, ``--help``,
  ``--config-dir``): :func:`main` puts ``argv`` into ``sys.argv`` around the
  ``@hydra.main`` call, so every Hydra flag works and tests inject argv.
* Hydra reports a bad override with several lines (and for a wrong value
  only "Error merging override", without the allowed values). :func:`main`
  therefore composes every job's config first with Hydra's own config loader
  and turns a failure into one line that names the key and what is allowed
  (:func:`describe_error`), exit code 2, no traceback.
* Hydra skips the end-of-sweep callback when a job raises, so a job never
  raises: it records ``job_status.json`` (ok / failed + reason) in a
  ``finally`` and returns. The comparison then covers every job, failed
  ones included, and ``stagebench report SWEEP_DIR`` can rebuild it.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import difflib
import importlib.resources
import json
import logging
import os
import sys
import time
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import hydra
from hydra.core.config_search_path import SearchPathQuery
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, MissingConfigException
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import OmegaConf
from omegaconf.errors import (
    ConfigAttributeError,
    ConfigKeyError,
    MissingMandatoryValue,
    OmegaConfBaseException,
    ValidationError,
)

from stagebench._errors import StagebenchError
from stagebench._numbers import finite
from stagebench.core._progress import Progress
from stagebench.loader._sweep import LoaderSweepConfig, run_loader_sweep
from stagebench.report._run import FailedJob
from stagebench.runs._jobs import JOB_STATUS
from stagebench.runs._results import to_jsonable, write_atomically
from stagebench.runs._schema import RESULTS_SCHEMA_VERSION
from stagebench.sweep._cluster import launcher_warnings, watch_termination
from stagebench.sweep._hydra_internal import args_parser, config_loader, config_search_path, split_sweep
from stagebench.sweep._multirun import collect_jobs
from stagebench.sweep._schema import LOADER_SCHEMAS, StagebenchSweepConfig, SweepSettings, register_configs, to_settings

__all__ = [
    "main",
    "config_dir",
    "ConfigError",
    "JobStatus",
    "describe_error",
    "loader_sweep_config",
    "run_job",
    "SweepCallback",
]

log = logging.getLogger(__name__)

CONFIG_NAME = "config"
#: Where a multirun tells its jobs which keys it sweeps (the jobs' labels).
_SWEEP_KEYS = "hydra.job.env_set.STAGEBENCH_SWEEP_KEYS"
#: Composing more combinations than this up front costs seconds; beyond it every
#: value of every sweep override is still checked once.
_MAX_FULL_PRODUCT = 64

# Outcomes seen by this process: run() reads them for its exit code. Jobs of a
# local basic launcher run in this process; other launchers report through the
# job_status.json files that SweepCallback reads.
_JOB_OUTCOMES: list[JobStatus] = []


@dataclass(slots=True)
class _SweepOutcome:
    """What the end of a multirun found (None until the end-of-sweep callback ran): the jobs that
    finished and failed."""

    ok: int | None = None
    failed: int | None = None

    def clear(self) -> None:
        self.ok = self.failed = None


_SWEEP_OUTCOME = _SweepOutcome()
_SWEEP_TOTAL: dict[str, int] = {}


class ConfigError(Exception):
    """A config that cannot run: a one-line message naming the key and what is allowed."""


def config_dir() -> Path:
    """The folder holding ``config.yaml``.

    Installed from a wheel, ``conf/`` ships inside the package
    (``stagebench/conf``); in an editable checkout it sits next to the package.
    """
    shipped = Path(str(importlib.resources.files("stagebench"))) / "conf"
    if (shipped / f"{CONFIG_NAME}.yaml").is_file():
        return shipped
    checkout = Path(__file__).resolve().parents[2] / "conf"  # stagebench/sweep/_app.py -> the repository
    if (checkout / f"{CONFIG_NAME}.yaml").is_file():
        return checkout
    raise FileNotFoundError(
        f"stagebench's Hydra configs are missing (looked in {shipped} and {checkout}); reinstall stagebench"
    )


# --------------------------------------------------------------------------- validation


def _config_loader(extra_config_dir: str | None, primary_dir: str | None = None):
    """Hydra's config loader over the same search path ``@hydra.main`` builds."""
    register_configs()
    search_path = config_search_path(primary_dir or str(config_dir()))
    if extra_config_dir is not None:
        abs_dir = os.path.abspath(extra_config_dir)
        if not os.path.isdir(abs_dir):
            raise ConfigError(f"--config-dir: folder {abs_dir!r} does not exist")
        # Same placement as Hydra's own --config-dir handling.
        search_path.prepend(
            provider="command-line", path=f"file://{abs_dir}", anchor=SearchPathQuery(provider="schema")
        )
    return config_loader(search_path)


def _job_combinations(parsed: list, multirun: bool) -> list[list[str]]:
    """The override lists of the jobs a (multi)run would launch."""
    plain = [f"{o.get_key_element()}={o.get_value_element_as_str()}" for o in parsed if not o.is_sweep_override()]
    if not multirun:
        return [[o.input_line for o in parsed]]
    try:
        combos = split_sweep(parsed)
    except HydraException:
        # A sweeper plugin's own syntax (interval(...), ...): check what we can.
        return [plain]
    if len(combos) <= _MAX_FULL_PRODUCT:
        return combos
    # Too many to compose: every value of every sweep override, once each.
    out: list[list[str]] = []
    for o in parsed:
        if o.is_sweep_override() and o.is_discrete_sweep():
            key = o.get_key_element()
            others = [p for p in plain if not p.startswith(f"{key}=")]
            for val in o.sweep_string_iterator():
                out.append(others + [f"{key}={val}"])
    return out or [plain]


@dataclasses.dataclass(frozen=True, slots=True)
class _Composed:
    """What composing every job's config of a command found: how many jobs, and its overrides by kind.

    The keys travel on into each job's ``override_dirname`` and its label in comparisons.
    """

    jobs: int
    fixed: list[str]
    """Keys overridden with one value."""
    exclude: list[str]
    """The config's ``hydra.job.config.override_dirname.exclude_keys``."""
    varying: list[str]
    """Keys swept over several values."""


def _validate(
    overrides: Sequence[str],
    *,
    multirun: bool,
    config_name: str | None,
    extra_config_dir: str | None,
    config_path: str | None,
) -> _Composed:
    """Compose the config of every job the command would run; raises :class:`ConfigError` with one line for the
    first that fails."""
    loader = _config_loader(extra_config_dir, config_path)
    try:
        parsed = OverridesParser.create(config_loader=loader).parse_overrides(list(overrides))
    except HydraException as e:
        raise ConfigError(describe_error(e)) from None
    # The search space of an optimising sweeper (hydra.sweeper.params.<key>=choice(...)) is the
    # sweeper's to read: its jobs get plain values of those keys, which are checked below.
    space = [o for o in parsed if str(o.key_or_group).startswith("hydra.sweeper.params.")]
    combos = _job_combinations([o for o in parsed if o not in space], multirun)
    exclude: list[str] = []
    for i, combo in enumerate(combos):
        try:
            cfg = loader.load_configuration(
                config_name=config_name or CONFIG_NAME, overrides=combo, run_mode=RunMode.RUN
            )
            if i == 0:
                keys = OmegaConf.select(cfg, "hydra.job.config.override_dirname.exclude_keys", default=None)
                exclude = [str(k) for k in keys] if keys is not None else []
            loader_sweep_config(to_settings(cfg).sweep)
        except (HydraException, OmegaConfBaseException, ValueError, AssertionError) as e:
            # AssertionError: OmegaConf's, for a key under a node that is null (a plugin's config)
            msg = describe_error(e)
            if multirun and len(combos) > 1:
                msg += f"  [job overrides: {' '.join(combo)}]"
            raise ConfigError(msg) from None
    fixed = [o.key_or_group for o in parsed if not o.is_sweep_override() and not o.is_hydra_override()]
    varying = [o.key_or_group for o in parsed if o.is_sweep_override() and not o.is_hydra_override()]
    return _Composed(jobs=len(combos), fixed=fixed, exclude=exclude, varying=varying)


def _schema_keys(cls: Any, prefix: str) -> list[str]:
    return [f"{prefix}{f.name}" for f in dataclasses.fields(cls)]


def _all_keys() -> list[str]:
    keys = set(_schema_keys(StagebenchSweepConfig, "")) | set(_schema_keys(SweepSettings, "sweep."))
    for cls in LOADER_SCHEMAS.values():
        keys |= set(_schema_keys(cls, "loader."))
    return sorted(keys)


def _did_you_mean(word: str, choices: Sequence[str]) -> str:
    leaf = word.rsplit(".", 1)[-1]
    by_leaf = {c.rsplit(".", 1)[-1]: c for c in choices}
    hits = difflib.get_close_matches(word, choices, n=1, cutoff=0.75)
    if not hits:
        hits = [by_leaf[h] for h in difflib.get_close_matches(leaf, list(by_leaf), n=1, cutoff=0.75)]
    return f"; did you mean {hits[0]!r}?" if hits else ""


def _enum_of(object_type: Any, key: str) -> list[str] | None:
    """Allowed names when ``key`` of ``object_type`` is an Enum field."""
    if not dataclasses.is_dataclass(object_type):
        return None
    try:
        hints = typing.get_type_hints(object_type)
    except Exception:  # an unresolvable annotation: no enum to list
        return None
    t = hints.get(key)
    for arg in (t, *typing.get_args(t)):
        if isinstance(arg, type) and issubclass(arg, Enum):
            return [m.name for m in arg]
    return None


def describe_error(exc: BaseException) -> str:
    """One line for a config error: the key, what was wrong, what is allowed."""
    if isinstance(exc, MissingConfigException):
        missing = exc.missing_cfg_file or ""
        group, _, option = missing.rpartition("/")
        options = sorted(exc.options or [])
        if group and options:
            return f"{group}={option}: no such option; available: {', '.join(options)}" + _did_you_mean(
                option, options
            ).replace("'", "")
        return _first_lines(str(exc))
    cause = _omegaconf_cause(exc) or exc
    text = str(exc)
    origin = text.split("'", 2)[1] if text.startswith("In '") and text.count("'") >= 2 else ""
    where_from = f" in {origin}.yaml" if origin and origin != CONFIG_NAME else ""
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and getattr(cause, "full_key", None):
        key = str(cause.full_key)
        where, _, leaf = key.rpartition(".")
        obj_type = getattr(cause, "object_type", None)
        allowed = [f.name for f in dataclasses.fields(obj_type)] if dataclasses.is_dataclass(obj_type) else []
        kind = ""
        elsewhere = ""
        if where == "loader":
            names = [n for n, c in LOADER_SCHEMAS.items() if c is obj_type]
            kind = f" ({names[0]} loader schema)" if names else ""
            owners = [n for n, c in LOADER_SCHEMAS.items() if leaf in _schema_keys(c, "")]
            if owners:
                elsewhere = f"; {leaf!r} is a key of the {' and '.join(owners)} loader{'s' if len(owners) > 1 else ''}"
        msg = f"unknown key {key!r}{kind}{where_from}"
        if allowed:
            msg += f"; allowed keys in {where or 'the config'}: {', '.join(allowed)}"
        return msg + (elsewhere or _did_you_mean(key, _all_keys()))
    if isinstance(cause, MissingMandatoryValue) and getattr(cause, "full_key", None):
        return f"{cause.full_key}: required, has no value; set it with {cause.full_key}=..."
    if isinstance(cause, ValidationError) and getattr(cause, "full_key", None):
        key = str(cause.full_key)
        leaf = key.rsplit(".", 1)[-1]
        choices = _enum_of(getattr(cause, "object_type", None), leaf)
        first = str(cause).splitlines()[0]
        if choices:
            value = getattr(cause, "value", None)
            shown = f"{value!r}" if value is not None else first
            return f"{key}: invalid value {shown}; allowed: {', '.join(choices)}"
        return f"{key}: {first}"
    if isinstance(exc, ValueError):
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    text = str(exc)
    if text.startswith("Ambiguous value for argument"):
        arg = text.split("'", 2)[1] if text.count("'") >= 2 else text
        return f"{arg}: several values sweep only with -m (stagebench sweep -m ...); a list value is key=[a,b]"
    return _first_lines(text)


def _omegaconf_cause(exc: BaseException) -> BaseException | None:
    """The OmegaConf error behind a Hydra error (it names the key), if any."""
    seen: set[int] = set()
    c: BaseException | None = exc
    while c is not None and id(c) not in seen:
        seen.add(id(c))
        if isinstance(c, OmegaConfBaseException) and getattr(c, "full_key", None):
            return c
        c = c.__cause__ or c.__context__
    return None


def _first_lines(text: str) -> str:
    lines = []
    for line in text.strip().splitlines():
        if line.startswith("Config search path") or line.strip().startswith("provider="):
            break
        if line.strip():
            lines.append(line.strip())
    return " ".join(lines) or "invalid configuration"


# --------------------------------------------------------------------------- the job


def _one_line(e: BaseException) -> str:
    """The first line of an error; its type too unless it is a user error that names its key."""
    text = str(e).strip().splitlines()
    if not text:
        return type(e).__name__
    if isinstance(e, (ValueError, FileNotFoundError, StagebenchError)):
        return text[0]
    return f"{type(e).__name__}: {text[0]}"


def loader_sweep_config(sweep: Any) -> Any:
    """``sweep.*`` as the loader sweep's ``LoaderSweepConfig`` (its own checks run here too).

    Raises ``ValueError`` naming the ``sweep.`` key.
    """
    kwargs: dict[str, Any] = {
        "strategy": sweep.strategy.name,
        "budget_s": float(sweep.budget_s),
        "timeout_s": float(sweep.timeout_s),
        "epoch_stall": bool(sweep.epoch_stall),
        "transforms": bool(sweep.transforms),
    }
    # A list on the command line is a set of values to try: order and repeats carry no meaning.
    if sweep.num_workers is not None:
        kwargs["num_workers"] = tuple(sorted({int(n) for n in sweep.num_workers}))
    if sweep.max_workers is not None:
        kwargs["max_workers"] = int(sweep.max_workers)
    if sweep.prefetch_factor is not None:
        kwargs["prefetch_factors"] = tuple(sorted({int(n) for n in sweep.prefetch_factor}))
        # values asked for are searched (alone, the adaptive search keeps one: loaders/_sweep.search_prefetch)
        kwargs["search_prefetch"] = len(kwargs["prefetch_factors"]) > 1
    if sweep.persistent_workers is not None:
        kwargs["persistent_workers"] = tuple(dict.fromkeys(bool(b) for b in sweep.persistent_workers))
    if sweep.memory_budget_mb is not None:
        kwargs["memory_budget_mb"] = float(sweep.memory_budget_mb)
    try:
        return LoaderSweepConfig(**kwargs)
    except ValueError as e:
        msg = str(e).replace("prefetch_factors", "prefetch_factor")
        raise ValueError(msg if msg.startswith("sweep.") else f"sweep.{msg}") from None


@dataclass(slots=True, kw_only=True)
class JobStatus:
    """What one job of a sweep records in ``job_status.json``, filled in as the job runs.

    ``loader``, ``kind`` and ``backend`` are known once the job's config is read;
    ``verdict``, ``best`` and ``recommended`` once its sweep finished (``finished``); ``elapsed_s`` when it
    ends. The file holds the keys known, in this order.
    """

    status: str = "failed"
    reason: str = "interrupted before the job finished"
    job_num: int | None = None
    overrides: list[str] = field(default_factory=list)
    label: str = ""
    launcher: str | None = None
    host: str = ""
    started_at: str = ""
    run_dir: str = ""
    loader: str | None = None
    kind: str | None = None
    backend: str | None = None
    finished: bool = False
    verdict: str | None = None
    best: Mapping[str, Any] | None = None
    recommended: Mapping[str, Any] | None = None
    elapsed_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        """``job_status.json``: the keys known, in the order the job learns them."""
        head = ("status", "reason", "job_num", "overrides", "label", "launcher", "host", "started_at", "run_dir")
        out: dict[str, Any] = {"schema_version": RESULTS_SCHEMA_VERSION, **{k: getattr(self, k) for k in head}}
        if self.loader is not None:
            out.update(loader=self.loader, kind=self.kind, backend=self.backend)
        if self.finished:
            out.update(verdict=self.verdict, best=self.best, recommended=self.recommended)
        if self.elapsed_s is not None:
            out["elapsed_s"] = self.elapsed_s
        return out


def _write_status(job_dir: Path, status: JobStatus) -> None:
    try:
        job_dir.mkdir(parents=True, exist_ok=True)
        write_atomically(job_dir / JOB_STATUS, json.dumps(to_jsonable(status.to_json()), indent=2) + "\n")
    except OSError as e:  # the job's folder is gone or read-only: say so, keep the outcome in memory
        print(f"stagebench sweep: cannot write {job_dir / JOB_STATUS}: {e}", file=sys.stderr)


def run_job(
    cfg: Any,
    *,
    job_dir: Path,
    overrides: Sequence[str] = (),
    job_num: int | None = None,
    launcher: str | None = None,
    label: str | None = None,
) -> JobStatus:
    """Run one loader configuration; never raises (except on Ctrl-C).

    Writes ``job_dir`` as a run directory plus ``job_status.json``, and
    returns the job's status. ``label`` names the job in comparisons (in a
    multirun: the overrides that differ between jobs).
    """
    t0 = time.perf_counter()
    status = JobStatus(
        job_num=job_num,
        overrides=list(overrides),
        label=label if label is not None else " ".join(overrides),
        launcher=launcher,
        host=os.uname().nodename,
        started_at=_dt.datetime.now().isoformat(timespec="seconds"),
        run_dir=str(job_dir),
    )
    progress: Any = None
    with watch_termination() as term:
        try:
            settings = to_settings(cfg)
            progress = _job_progress(settings, status, job_dir)
            _run_sweep(cfg, settings, job_dir=job_dir, status=status, label=label, progress=progress)
        except KeyboardInterrupt:
            status.reason = "interrupted (Ctrl-C)"
            raise
        except Exception as e:  # recorded, not raised: see the module docstring
            status.reason = _one_line(e)
            # The traceback goes to the job's log file only (the terminal shows warnings and up).
            log.info("job failed", exc_info=True)
            print(f"stagebench sweep: job failed: {status.reason}", file=sys.stderr)
        finally:
            if term.signal is not None:  # told to stop (scancel, time limit): the result is not whole
                why = term.reason()
                status.reason = why if status.status == "ok" else f"{why}; {status.reason}"
                status.status = "failed"
            status.elapsed_s = round(time.perf_counter() - t0, 3)
            _write_status(job_dir, status)
            _JOB_OUTCOMES.append(status)
            if progress is not None:
                progress.close()
    return status


def _job_progress(settings: Any, status: JobStatus, job_dir: Path) -> Any:
    """The job's progress display, after one line saying which job this is and where it writes."""
    lc = settings.loader
    status.loader, status.kind, status.backend = lc.name, lc.kind, lc.backend.name
    total = _SWEEP_TOTAL.get("jobs")
    num = status.job_num
    prefix = "" if num is None else f"job {num + 1}{f'/{total}' if total else ''}: "
    progress = Progress(desc=f"{prefix}{lc.name}/{lc.backend.name}", enabled=settings.progress)
    progress.message(f"{prefix}{status.label or lc.name} -> {job_dir}")
    return progress


def _run_sweep(cfg: Any, settings: Any, *, job_dir: Path, status: JobStatus, label: str | None, progress: Any) -> None:
    """The job's work: build the loader (generating data on first use), sweep it; fills ``status``."""
    # torch: imported by the job that builds the loader, not by the sweep's parent checking its configs
    from stagebench.sweep._builtin_loaders import build_loader

    lc = settings.loader
    spec = build_loader(lc, progress=progress)
    summary = run_loader_sweep(
        spec.factory,
        name=lc.name,
        backend=lc.backend.name,
        batch_size=lc.batch_size,
        run_dir=job_dir,
        config=loader_sweep_config(settings.sweep),
        target_rate=settings.sweep.target_rate,
        extra_meta={
            **({"label": label} if label else {}),
            "hydra": {
                "overrides": status.overrides,
                "job_num": status.job_num,
                "launcher": status.launcher,
                "loader_config": OmegaConf.to_container(cfg.loader, resolve=True, enum_to_str=True),
            },
            "dataset": spec.info,
            "loader": spec.factory.describe() if hasattr(spec.factory, "describe") else {},
        },
        progress=progress,
    )
    status.status, status.reason, status.finished = "ok", "", True
    status.verdict, status.best, status.recommended = (summary.get(k) for k in ("verdict", "best", "recommended"))


def _task(cfg: Any) -> float | None:
    """The ``@hydra.main`` task: one job. Module-level so launchers can pickle it.

    Returns the job's objective: its best measured samples/s, or None for a job that
    failed. Hydra's sweepers read it (``hydra/sweeper=optuna`` with ``direction:
    maximize`` searches loader configurations with no extra code; a failed job is a
    failed trial); the exit status is computed from the jobs' outcomes, not from it.
    """
    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    status = run_job(
        cfg,
        job_dir=Path(hc.runtime.output_dir),
        overrides=list(hc.overrides.task),
        job_num=int(hc.job.num) if multirun else None,
        # HydraConfig.get() returns a DictConfig; hydra types it as its HydraConf schema
        launcher=str(OmegaConf.select(hc, "launcher._target_", default="")) or None,  # type: ignore[arg-type]
        label=_job_label(list(hc.overrides.task), str(hc.job.env_set.get("STAGEBENCH_SWEEP_KEYS", "")))
        if multirun
        else None,
    )
    if not multirun and status.status == "ok":
        report = Path(hc.runtime.output_dir) / "report.html"
        print(f"run directory: {hc.runtime.output_dir}")
        if report.exists():
            print(f"report: {report}")
        if status.verdict:
            print(status.verdict)
    return _objective(status)


def _objective(status: JobStatus) -> float | None:
    """The best samples/s of an ok job (what a sweeper maximises), else None."""
    best = status.best or {}
    value = best.get("samples_per_s") if isinstance(best, dict) else None
    if status.status != "ok" or value is None or not finite(value):
        return None
    return float(value)


def _job_label(overrides: Sequence[str], swept: str) -> str:
    """The overrides of the swept keys: what tells this job from the others of its sweep."""
    keys = {k for k in swept.split(",") if k}
    picked = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") in keys]
    return ", ".join(picked)


# --------------------------------------------------------------------------- multirun


def _count_jobs(task_overrides: Sequence[str]) -> int | None:
    try:
        parsed = OverridesParser.create().parse_overrides(list(task_overrides))
        return len(split_sweep(parsed))
    except Exception:  # a sweeper plugin's syntax: the count is unknown, not an error
        return None


class SweepCallback(Callback):
    """Progress over jobs, a launcher warning, and the comparison at the end of a multirun."""

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        _SWEEP_OUTCOME.clear()
        total = _count_jobs(list(config.hydra.overrides.task))
        if total:
            _SWEEP_TOTAL["jobs"] = total
        for warning in launcher_warnings(config.hydra.launcher):
            print(f"stagebench sweep: warning: {warning}", file=sys.stderr)
        if config.get("progress", True):
            n = f"{total} jobs" if total else "jobs"
            print(f"[stagebench] sweep: {n} -> {config.hydra.sweep.dir}", file=sys.stderr, flush=True)

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        jobs = collect_jobs(sweep_dir)
        ok = [Path(j["run_dir"]) for j in jobs if j.get("status") == "ok"]
        not_ok = [j for j in jobs if j.get("status") != "ok"]
        _SWEEP_OUTCOME.ok, _SWEEP_OUTCOME.failed = len(ok), len(not_ok)
        _print_jobs(jobs)
        try:
            # matplotlib and scipy load at the sweep's end, inside this try: a comparison that fails leaves the jobs
            from stagebench.report._compare import write_comparison

            failed = [
                FailedJob(
                    str(j.get("label") or j.get("loader") or j["name"]),
                    str(j.get("reason", "")),
                    str(j["run_dir"]),
                    tuple(j.get("overrides", [])),
                )
                for j in not_ok
            ]
            path = write_comparison(ok, sweep_dir, title=f"stagebench sweep {sweep_dir.name}", failed=failed)
            print(f"comparison: {path}")
        except Exception as e:  # the jobs' run directories are intact; `stagebench report` retries
            print(
                f"stagebench sweep: comparison not written ({_one_line(e)}); "
                f"rebuild it with: stagebench report {sweep_dir}",
                file=sys.stderr,
            )


def _print_jobs(jobs: list[dict[str, Any]]) -> None:
    if not jobs:
        print("stagebench sweep: no job folders found", file=sys.stderr)
        return
    print(f"{'job':>4}  {'status':<7} {'samples/s':>10}  {'recommended':<28} configuration")
    for j in jobs:
        num = "" if j.get("job_num") is None else str(j["job_num"])
        rec = j.get("recommended") or {}
        best = j.get("best") or {}
        rate = best.get("samples_per_s")
        rate_s = f"{rate:,.0f}" if isinstance(rate, (int, float)) else "-"
        knobs = f"num_workers={rec.get('num_workers')} prefetch={rec.get('prefetch_factor')}" if rec else "-"
        what = j.get("label") or " ".join(j.get("overrides") or []) or j.get("loader") or j.get("name", "")
        if j.get("status") != "ok":
            what += f"  ({j.get('reason', '')})"
        print(f"{num:>4}  {j.get('status', '?'):<7} {rate_s:>10}  {knobs:<28} {what}")


# --------------------------------------------------------------------------- entry point


def main(argv: list[str]) -> int:
    """``stagebench sweep ARGS``: Hydra's command line, validated first; returns the exit code.

    0: every job succeeded (or nothing ran: --help, --cfg, --info). 1: a job
    failed (its reason is in its job_status.json and the comparison). 2: the
    command or config is invalid (one line on stderr, nothing ran).
    """
    _JOB_OUTCOMES.clear()
    _SWEEP_OUTCOME.clear()
    _SWEEP_TOTAL.clear()
    parser = args_parser()
    parser.prog = "stagebench sweep"
    try:
        args = parser.parse_args(list(argv))
    except SystemExit as e:  # argparse usage error or --version: it printed already
        return _exit_code(e)
    if args.config_path is not None and not os.path.isabs(args.config_path):
        # Hydra would resolve it against this module's folder; users mean their cwd.
        absolute = os.path.abspath(args.config_path)
        argv = [absolute if a == args.config_path else a for a in argv]
        args.config_path = absolute
    informational = args.help or args.hydra_help or args.shell_completion or args.info is not None
    if not informational:
        try:
            composed = _validate(
                args.overrides,
                multirun=bool(args.multirun),
                config_name=args.config_name,
                extra_config_dir=args.config_dir,
                config_path=args.config_path,
            )
        except ConfigError as e:
            print(f"stagebench sweep: error: {e}", file=sys.stderr)
            return 2
        if args.multirun:
            _SWEEP_TOTAL["jobs"] = composed.jobs
            argv = [*argv, *_dirname_override(args.overrides, composed.fixed, composed.exclude)]
            if composed.varying:
                # Travels with each job's config (any launcher): the job's label in comparisons.
                argv.append(f"+{_SWEEP_KEYS}='{','.join(composed.varying)}'")
    saved = sys.argv
    sys.argv = ["stagebench sweep", *argv]
    try:
        register_configs()
        hydra.main(version_base="1.3", config_path=str(config_dir()), config_name=CONFIG_NAME)(_task)()
        code = 0
    except SystemExit as e:
        code = _exit_code(e)
    finally:
        sys.argv = saved
    if code != 0 or informational or args.cfg is not None:
        return code
    if args.multirun:
        failed = _SWEEP_OUTCOME.failed
        if failed is None:  # the end-of-sweep callback did not run
            return 1
        if failed:
            print(
                f"stagebench sweep: {failed} of {failed + (_SWEEP_OUTCOME.ok or 0)} jobs failed",
                file=sys.stderr,
            )
            return 1
        return 0
    return 0 if _JOB_OUTCOMES and all(o.status == "ok" for o in _JOB_OUTCOMES) else 1


def _dirname_override(overrides: Sequence[str], fixed: list[str], exclude: list[str]) -> list[str]:
    """Name job folders by what differs between the jobs only.

    Keys given one value are the same in every job; leaving them out of
    ``override_dirname`` turns ``3-loader.backend=torch,loader.num_items=256,...``
    into ``3-loader.backend=torch``. Every job's full overrides stay in its
    ``.hydra/overrides.yaml``. A user who sets the exclusions themselves wins.
    """
    key = "hydra.job.config.override_dirname.exclude_keys"
    if not fixed or any(o.lstrip("+~").startswith(key) for o in overrides):
        return []
    keys = list(dict.fromkeys([*exclude, *fixed]))
    return [f"{key}=[{','.join(keys)}]"]


def _exit_code(e: SystemExit) -> int:
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code
    print(e.code, file=sys.stderr)
    return 1
