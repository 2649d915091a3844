"""This process's ranks, read from what the launcher set: torchrun's variables, the ones any launcher sets."""

from __future__ import annotations

import os
from collections.abc import Mapping

from stagebench._settings import SettingsError
from stagebench.model._ranks import Ranks

__all__ = ["ranks_from_env", "per_host", "no_job_across_hosts"]


def _whole(environ: Mapping[str, str], name: str, default: int) -> int:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise SettingsError(f"{name} must be an integer, got {raw!r}") from None


def ranks_from_env(environ: Mapping[str, str] | None = None) -> Ranks:
    """The ranks ``environ`` (the process's environment by default) describes.

    ``LOCAL_RANK`` without ``LOCAL_WORLD_SIZE`` (a launcher that does not say how many ranks share the
    host): local rank 0 reads as one rank alone; another cannot find its host's others, and is refused.
    Raises :class:`SettingsError` for a value that is not a rank.
    """
    env = os.environ if environ is None else environ
    local_rank = _whole(env, "LOCAL_RANK", 0)
    if "LOCAL_WORLD_SIZE" not in env and local_rank != 0:
        raise SettingsError(
            f"LOCAL_RANK is {local_rank} but LOCAL_WORLD_SIZE is not set: the ranks of a host are measured "
            "together, and each needs both (torchrun sets both)"
        )
    local_size = _whole(env, "LOCAL_WORLD_SIZE", 1)
    world = _whole(env, "WORLD_SIZE", local_size)
    rank = _whole(env, "RANK", local_rank)
    if "TORCHELASTIC_RUN_ID" in env:
        launcher: str | None = "torchrun"
    elif "SLURM_JOB_ID" in env and "SLURM_LOCALID" in env:
        launcher = "slurm"
    else:
        launcher = None
    try:
        return Ranks(
            local_rank=local_rank,
            local_world_size=local_size,
            rank=rank,
            world_size=max(world, local_size),
            node=_whole(env, "GROUP_RANK", 0),
            launcher=launcher,
        )
    except ValueError as e:
        raise SettingsError(f"the launcher's ranks: {e}") from None


def per_host(name: str, environ: Mapping[str, str] | None = None) -> str:
    """``name`` of a run directory as this host writes it: where the job spans several hosts, each host's
    local rank 0 writes a directory of its own (``-node<k>``), so that hosts sharing a file system never
    write one folder; ``name`` itself on one host (or where the ranks cannot be read: refused elsewhere)."""
    try:
        ranks = ranks_from_env(environ)
    except SettingsError:
        return name
    return f"{name}-node{ranks.node}" if ranks.nodes > 1 else name


def no_job_across_hosts(environ: Mapping[str, str] | None = None) -> str | None:
    """Why your loop is not run (``STAGEBENCH_TRAINER=measure``) in a job of several hosts, else None.

    Each host's ranks are diagnosed by that host's local rank 0, which decides alone when each setting's
    turn ends; a data-parallel loop's all-reduce spans every host, and hosts that ended their turns at
    other steps would leave the others waiting in it. One host's ranks run in step (torchrun --nnodes 1)."""
    try:
        ranks = ranks_from_env(environ)
    except SettingsError:
        return None
    if ranks.nodes <= 1:
        return None
    return (
        f"your loop is not run (STAGEBENCH_TRAINER=measure): this job spans {ranks.nodes} hosts, and each host's "
        "turns in your loop would end at steps of their own while its all-reduce waits on every host; run "
        "--trainer on one host's ranks (torchrun --nnodes 1): the advice is per rank"
    )
