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
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["launcher_kind", "launcher_warnings"]

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
