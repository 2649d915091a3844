"""The ranks of a data-parallel job on one host, and a window measured on all of them at once.

A data-parallel job runs one loader (or pipeline) per rank, every rank's on the same cores, memory and
``/dev/shm``. A setting measured for one loader that owns the host is wrong by the number of ranks, so
a host's ranks are measured together: every rank runs the same setting over the same window, and the
host's rate is the sum of theirs. :class:`Ranks` is who they are (what the launcher set), and
:class:`HostRate` one window's rates, each rank's and their sum.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stagebench.model._json import Written, read
from stagebench.model._rate import Rate

__all__ = ["Ranks", "HostRate"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Ranks(Written):
    """This process's place in a data-parallel job, as its launcher set it (``LOCAL_RANK``,
    ``LOCAL_WORLD_SIZE``, ``RANK``, ``WORLD_SIZE``, ``GROUP_RANK``); one rank of one host without one.
    ``provenance.ranks`` in run.json."""

    local_rank: int = 0
    local_world_size: int = 1
    """The ranks on this host: they share its cores, memory and /dev/shm."""
    rank: int = 0
    world_size: int = 1
    node: int = 0
    """This host's index among the job's hosts (torchrun's ``GROUP_RANK``)."""
    launcher: str | None = None
    """What started the ranks, where it says (``torchrun``, ``slurm``), else None."""

    def __post_init__(self) -> None:
        if self.local_world_size < 1 or not 0 <= self.local_rank < self.local_world_size:
            raise ValueError(f"local rank {self.local_rank} of {self.local_world_size} is not a rank of this host")
        if self.world_size < self.local_world_size or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} of {self.world_size} is not a rank of the job")

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> Ranks:
        return read(cls, d)

    @property
    def ranked(self) -> bool:
        """Whether this host runs more than one rank (then they are measured together)."""
        return self.local_world_size > 1

    @property
    def leader(self) -> bool:
        """Whether this process measures and writes for the host (its local rank 0)."""
        return self.local_rank == 0

    @property
    def nodes(self) -> int:
        """The job's hosts, where every host runs as many ranks as this one."""
        return max(1, math.ceil(self.world_size / self.local_world_size))


@dataclass(frozen=True, slots=True)
class HostRate:
    """One window measured on every rank of a host at once: each rank's rate (local rank order; None where
    a rank's window held too few arrivals to time) and the host's, their sum."""

    ranks: tuple[Rate | None, ...]

    @property
    def host(self) -> Rate | None:
        """The sum over the ranks, None where a rank has no rate. Its interval sums the ranks' ends: their
        windows are the same seconds of the same host, so their errors move together (a slow phase slows
        every rank), and the sum of the ends is the widest that can make; where a rank has no interval,
        neither has the sum."""
        if not self.ranks or any(r is None for r in self.ranks):
            return None
        rates = [r for r in self.ranks if r is not None]
        value = sum(r.value for r in rates)
        if any(r.low is None or r.high is None for r in rates):
            return Rate(value)
        return Rate(value, sum(r.low or 0.0 for r in rates), sum(r.high or 0.0 for r in rates))

    @property
    def slowest(self) -> Rate | None:
        """The slowest rank's rate (a data-parallel step waits for it), None where a rank has none."""
        rates = [r for r in self.ranks if r is not None]
        return min(rates, key=lambda r: r.value) if rates and len(rates) == len(self.ranks) else None

    @property
    def fastest(self) -> Rate | None:
        rates = [r for r in self.ranks if r is not None]
        return max(rates, key=lambda r: r.value) if rates and len(rates) == len(self.ranks) else None

    @classmethod
    def of(cls, rates: Sequence[Rate | None]) -> HostRate:
        return cls(tuple(rates))
