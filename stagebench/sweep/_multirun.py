"""A sweep folder: which jobs finished, which failed, and which never started.

Read from the jobs' own records (``job_status.json``, :mod:`stagebench.runs._jobs`)
and from Hydra's ``multirun.yaml``: ``stagebench report SWEEP_DIR`` and the
comparison at the end of a sweep both read a sweep folder through here.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stagebench.report._run import FailedJob
from stagebench.runs._jobs import JOB_STATUS, job_label, job_overrides
from stagebench.runs._results import RESULTS, is_run_dir, read_rows

__all__ = ["collect_jobs", "find_run_dirs", "sweep_plan", "SweepPlan", "MULTIRUN_CONFIG"]


def _natural_key(p: Path) -> tuple:
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p.name))


def _run_dirs_in(d: Path) -> list[Path]:
    """``d`` when it is a run directory, else the run directories one level below it."""
    if is_run_dir(d):
        return [d]
    return sorted((p for p in d.iterdir() if p.is_dir() and is_run_dir(p)), key=_natural_key)


def _n_rows(d: Path) -> int:
    if not (d / RESULTS).is_file():
        return 0
    try:
        return len(read_rows(d))
    except Exception:  # an unreadable file has no rows to speak of
        return 0


def find_run_dirs(sweep_dir: Path) -> tuple[list[Path], list[FailedJob]]:
    """Run directories under a sweep directory, and the jobs that did not finish.

    Hydra job folders are read through the sweep app's own record
    (:func:`stagebench.sweep._multirun.collect_jobs`): a job is compared only when its
    ``job_status.json`` says ``ok``. A job stopped mid-sweep (Slurm's scancel or
    time limit: status ``failed``) keeps the rows it measured, but they cover part
    of its grid and could name a wrong winner, so the job is listed as failed with
    its own reason. In a stagebench sweep a job folder without ``job_status.json``
    did not finish (killed hard, or still running). A job that never started
    leaves no folder at all; those come from the sweep's ``multirun.yaml``
    (:func:`sweep_plan`). Other subfolders (and folders one level below them) that
    are run directories are compared as they are: ``stagebench report`` also
    works on a folder of plain runs, or on a user's own Hydra app.
    """
    sweep_dir = Path(sweep_dir)
    runs: list[Path] = []
    failed: list[FailedJob] = []
    plan = sweep_plan(sweep_dir)
    jobs = collect_jobs(sweep_dir)
    # Only stagebench's sweep app promises a job_status.json; a user's own Hydra app does not.
    ours = bool(plan and plan.stagebench) or any((Path(j["run_dir"]) / JOB_STATUS).is_file() for j in jobs)
    judged: set[Path] = set()
    for j in jobs:
        d = Path(j["run_dir"])
        has_status = (d / JOB_STATUS).is_file()
        if not (has_status or ours):
            continue
        judged.add(d)
        if j.get("status") == "ok":
            inner = _run_dirs_in(d)
            if inner:
                runs.extend(inner)
                continue
            reason = f"{JOB_STATUS} says ok but the folder has no results (run.json, results.csv)"
        elif not has_status:
            reason = f"no {JOB_STATUS}: the job did not finish (killed, or still running)"
        else:
            reason = str(j.get("reason") or "the job failed without saying why")
        n = _n_rows(d)
        reason += (
            f"; rows it measured before it stopped: {n}, not compared (they cover part of its sweep)"
            if n
            else _log_hint(d)
        )
        failed.append(FailedJob(str(j.get("label") or job_label(d)), reason, str(d), tuple(job_overrides(d))))
    for d in sorted((p for p in sweep_dir.iterdir() if p.is_dir() and not p.name.startswith(".")), key=_natural_key):
        if d in judged:
            continue
        inner = _run_dirs_in(d)
        if inner:
            runs.extend(inner)
        elif (d / ".hydra").is_dir():
            failed.append(
                FailedJob(
                    job_label(d),
                    "no results: the job failed or was interrupted before measuring" + _log_hint(d),
                    str(d),
                )
            )
    if plan is not None:
        failed.extend(_never_started(plan, [Path(j["run_dir"]) for j in jobs]))
    return runs, failed


MULTIRUN_CONFIG = "multirun.yaml"  # Hydra writes it into the sweep folder before it launches a job


@dataclass(frozen=True, slots=True)
class SweepPlan:
    """The jobs a Hydra multirun set out to run: each job's overrides in job-number order (None where the
    sweeper's list cannot be rebuilt), their count (None where unknown), and whether the sweep is
    stagebench's own (its callback promises a ``job_status.json`` in every job folder)."""

    jobs: list[list[str]] | None = None
    count: int | None = None
    stagebench: bool = False


def sweep_plan(sweep_dir: Path) -> SweepPlan | None:
    """The jobs a Hydra multirun set out to run, from ``SWEEP_DIR/multirun.yaml``; None without one.

    Args: the sweep folder. Returns: its :class:`SweepPlan`. The job list is rebuilt the way Hydra's basic sweeper
    builds it (``hydra.sweeper.params`` then ``hydra.overrides.task``, the cartesian
    product of the sweep values), so it matches each job's recorded overrides. For
    another sweeper (Optuna, ...) only ``n_trials``, where it has one, gives the count.
    """
    path = Path(sweep_dir) / MULTIRUN_CONFIG
    if not path.is_file():
        return None
    try:
        import yaml  # a sweep folder's plan only: `stagebench report RUN` of one run never reads one

        cfg = yaml.safe_load(path.read_text(encoding="utf-8"))
    except Exception:  # an unreadable plan: no never-started jobs to list
        return None
    hydra = (cfg or {}).get("hydra") if isinstance(cfg, dict) else None
    if not isinstance(hydra, dict):
        return None
    callbacks = hydra.get("callbacks") or {}
    ours = any(
        isinstance(c, dict) and str(c.get("_target_", "")).startswith("stagebench.")
        for c in (callbacks.values() if isinstance(callbacks, dict) else [])
    )
    sweeper = hydra.get("sweeper") or {}
    task = (hydra.get("overrides") or {}).get("task") or []
    if str(sweeper.get("_target_", "")).endswith(".BasicSweeper"):
        params = sweeper.get("params") or {}
        args = [f"{k}={v}" for k, v in params.items()] + [str(t) for t in task]
        try:
            # hydra: a sweep folder's job list only, not `stagebench report RUN` of one run
            from hydra.core.override_parser.overrides_parser import OverridesParser

            from stagebench.sweep._hydra_internal import split_sweep

            jobs = split_sweep(OverridesParser.create().parse_overrides(args))
        except Exception:  # syntax that needs the app's config (glob): count unknown
            return SweepPlan(stagebench=ours)
        return SweepPlan(jobs, len(jobs), ours)
    if isinstance(sweeper.get("n_trials"), int):
        return SweepPlan(count=sweeper["n_trials"], stagebench=ours)
    return SweepPlan(stagebench=ours)


def _never_started(plan: SweepPlan, job_dirs: Sequence[Path]) -> list[FailedJob]:
    """The planned jobs that left no folder."""
    found = [job_overrides(d) for d in job_dirs]
    combos = plan.jobs
    why = "never started: no job folder (cancelled before it started, or still queued)"
    if combos is not None and all(found):
        left = Counter(tuple(sorted(f)) for f in found)
        keys = [c.split("=", 1)[0] for c in combos[0]] if combos else []
        differ = [i for i, _ in enumerate(keys) if len({c[i] for c in combos if len(c) > i}) > 1]
        out = []
        for num, combo in enumerate(combos):
            k = tuple(sorted(combo))
            if left[k] > 0:
                left[k] -= 1
                continue
            name = ", ".join(combo[i] for i in differ if i < len(combo)) or " ".join(combo) or f"job {num}"
            out.append(FailedJob(name, f"{why}; job {num}: {' '.join(combo)}", overrides=tuple(combo), job_num=num))
        return out
    count = plan.count
    if count is not None and count > len(job_dirs):
        n = count - len(job_dirs)
        return [
            FailedJob(
                f"{n} job{'s' if n != 1 else ''}",
                f"{why}; the sweep planned {count} jobs and {len(job_dirs)} left a folder",
            )
        ]
    return []


def _log_hint(job_dir: Path) -> str:
    logs = sorted(job_dir.glob("*.log"))
    for log in logs:
        try:
            lines = [ln.strip() for ln in log.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
        except OSError:
            continue
        errs = [ln for ln in lines if "error" in ln.lower()]
        if errs:
            return f"; last error in {log.name}: {errs[-1][:300]}"
    return f"; see {logs[0].name}" if logs else ""


def collect_jobs(sweep_dir: Path) -> list[dict[str, Any]]:
    """``job_status.json`` of every job folder under ``sweep_dir``, by job number.

    A job folder without one (killed before its ``finally`` ran, or not yet
    started) is reported as failed, so no job silently disappears.
    """
    jobs: list[dict[str, Any]] = []
    if not sweep_dir.is_dir():
        return jobs
    for sub in sorted(p for p in sweep_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
        status_file = sub / JOB_STATUS
        if status_file.is_file():
            try:
                st = json.loads(status_file.read_text(encoding="utf-8"))
            except (OSError, ValueError) as e:
                st = {"status": "failed", "reason": f"unreadable {JOB_STATUS}: {e}"}
        elif (sub / ".hydra").is_dir():
            st = {"status": "failed", "reason": "the job ended without a status (killed?)"}
        else:
            continue
        st["run_dir"] = str(sub)
        st.setdefault("name", sub.name)
        jobs.append(st)
    jobs.sort(key=lambda s: (s.get("job_num") is None, s.get("job_num") or 0, s["run_dir"]))
    return jobs
