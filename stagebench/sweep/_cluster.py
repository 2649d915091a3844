"""Where a sweep's jobs run, and what that does to their timings.

A loader throughput is a property of a configuration *on a machine with nothing
else running*. Hydra launchers differ in exactly that: the basic launcher runs jobs
one after another; joblib and submitit's local executor start them all at once on
this machine, where they compete for its cores; Slurm puts them wherever the
scheduler likes, next to other users' jobs unless the nodes are exclusive. This
module reads the chosen launcher's config and says, in one line each, why the
numbers of such a sweep may not mean what they seem, so the sweep can print it
before it spends the time (the Hydra app's ``on_multirun_start``).

It reads the config only (the launcher's ``_target_`` and a few keys): nothing is
imported, nothing is submitted, so it is cheap and safe to call on any config.

A job on Slurm can also end early: ``scancel``, the time limit and preemption all
send SIGTERM to every process of the job, then SIGKILL after the cluster's KillWait
(30 s by default). submitit's job process logs and ignores the SIGTERM, but the
loader's worker processes die of it, so the points measured in that window fail
with the loader's error (an ``EOFError`` from a dead worker) and the job may even
finish and call itself done. :func:`watch_termination` notes the signal, without
changing what the process does on it, so the job can record that it was stopped.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

__all__ = ["launcher_kind", "launcher_warnings", "Termination", "watch_termination"]

_KINDS = {
    "BasicLauncher": "basic",
    "JoblibLauncher": "joblib",
    "LocalLauncher": "submitit_local",
    "SlurmLauncher": "submitit_slurm",
}


def launcher_kind(launcher: Mapping[str, Any]) -> str:
    """``basic``, ``joblib``, ``submitit_local``, ``submitit_slurm`` or ``other`` from ``hydra.launcher``."""
    target = str(launcher.get("_target_") or "")
    cls = target.rsplit(".", 1)[-1]
    if cls in _KINDS and ("hydra" in target):
        return _KINDS[cls]
    return "other"


def _exclusive(launcher: Mapping[str, Any]) -> Any:
    extra = launcher.get("additional_parameters") or {}
    return extra.get("exclusive") if isinstance(extra, Mapping) else None


def launcher_warnings(launcher: Mapping[str, Any]) -> list[str]:
    """One line per reason this launcher's jobs may distort each other's timings.

    ``launcher`` is the composed ``hydra.launcher`` node (a DictConfig or a dict).
    Empty for the basic launcher and for Slurm with exclusive nodes.
    """
    kind = launcher_kind(launcher)
    if kind == "joblib":
        n_jobs = launcher.get("n_jobs")
        if n_jobs == 1:
            return []
        return [
            f"hydra/launcher=joblib runs jobs at once on this machine (n_jobs={n_jobs}): they compete "
            "for its cores and each job's throughput is lower than it would be alone; for timings use "
            "the default launcher (one job after another) or hydra.launcher.n_jobs=1"
        ]
    if kind == "submitit_local":
        return [
            "hydra/launcher=submitit_local starts every job at once on this machine: they compete for "
            "its cores and each job's throughput is lower than it would be alone; use it to try a "
            "Slurm set-up locally, and the default launcher (one job after another) for timings"
        ]
    if kind == "submitit_slurm":
        exclusive = _exclusive(launcher)
        if exclusive is True or exclusive == "":
            return []
        if exclusive in ("user", "mcs"):
            return [
                f"Slurm nodes are shared among your own jobs (exclusive={exclusive}): jobs of this sweep "
                "may run side by side and distort each other's timings; use hydra/launcher=slurm "
                "(whole nodes) for timings"
            ]
        return [
            "Slurm jobs may share nodes with other jobs (no --exclusive): a neighbour's load changes "
            "the throughput measured; use hydra/launcher=slurm (exclusive nodes) or "
            "+hydra.launcher.additional_parameters.exclusive=true"
        ]
    return []


@dataclass(slots=True)
class Termination:
    """What :func:`watch_termination` saw: the first terminating signal, if any."""

    signal: str | None = None
    """Its name (``SIGTERM``), or None when none arrived."""

    at: float | None = None
    """When it arrived (``time.time()``)."""

    def reason(self) -> str:
        """One line for a job's status, empty when no signal arrived."""
        if self.signal is None:
            return ""
        when = time.strftime("%H:%M:%S", time.localtime(self.at)) if self.at else "?"
        return (
            f"stopped by {self.signal} at {when} (on Slurm: scancel, the time limit or preemption); "
            "points measured after it are not valid, those before it are on disk"
        )


@contextmanager
def watch_termination(signals: tuple[int, ...] = (signal.SIGTERM,)) -> Iterator[Termination]:
    """Note a terminating signal that arrives while the block runs.

    The handler that was installed before still runs (submitit's logs and ignores
    SIGTERM; Python's default ends the process), so the process behaves as it did:
    the note only lets the job say why it ended or why its last points failed.
    Outside the main thread (where Python cannot install handlers) nothing is watched.
    """
    seen = Termination()
    if threading.current_thread() is not threading.main_thread():
        yield seen
        return
    previous: dict[int, Any] = {}

    def note(signum: int, frame: Any) -> None:
        if seen.signal is None:
            seen.signal = signal.Signals(signum).name
            seen.at = time.time()
        before = previous.get(signum)
        if callable(before):
            before(signum, frame)
        elif before == signal.SIG_IGN:
            return
        else:  # the default action (or a handler installed outside Python): let it happen
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    for sig in signals:
        previous[sig] = signal.signal(sig, note)
    try:
        yield seen
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
