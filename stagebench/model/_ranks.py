"""The ranks of a data-parallel job on one host, and a window measured on all of them at once.

A data-parallel job runs one loader (or pipeline) per rank, every rank's on the same cores, memory and
``/dev/shm``. A setting measured for one loader that owns the host is wrong by the number of ranks, so
a host's ranks are measured together: every rank runs the same setting over the same window, and the
host's rate is the sum of theirs. :class:`Ranks` is who they are (what the launcher set), and
:class:`HostRate` one window's rates, each rank's and their sum, from each rank's :class:`WindowShare`
of it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stagebench.model._json import Read, Written, each
from stagebench.model._rate import Rate

__all__ = ["Ranks", "HostRate", "WindowShare", "Command", "Answer"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Ranks(Read):
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
class WindowShare(Written):
    """What one rank delivered over the leader's window, cut into equal slices: the samples each slice
    holds (an arrival counted in the fraction of the gap before it that falls in the slice) and the seconds
    it counts (a gap the rank's own rate leaves out, an epoch's restart, is not counted). Every rank's
    slices are the same seconds of the host."""

    samples: tuple[float, ...]
    seconds: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.samples) != len(self.seconds):
            raise ValueError("a window share has as many slices of samples as of seconds")

    def slice_rates(self) -> list[float | None]:
        """Each slice's rate, None where it counts no seconds."""
        return [n / s if s > 0 else None for n, s in zip(self.samples, self.seconds)]

    def rate(self, confidence: float) -> Rate | None:
        """The rank's rate over the window (all its samples over all its seconds) with the interval its
        slices give; None where it counts no seconds or no samples."""
        secs, n = sum(self.seconds), sum(self.samples)
        if not secs > 0 or not n > 0:
            return None
        return Rate.around(n / secs, [r for r in self.slice_rates() if r is not None], confidence)

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> WindowShare | None:
        if not isinstance(d, Mapping):
            return None
        try:
            return cls(tuple(float(x) for x in d["samples"]), tuple(float(x) for x in d["seconds"]))
        except (KeyError, TypeError, ValueError):
            return None


@dataclass(frozen=True, slots=True)
class HostRate:
    """One window measured on every rank of a host at once: each rank's rate (local rank order; None where
    a rank's window held too few arrivals to time) and the host's, their sum (None where a rank has none)."""

    ranks: tuple[Rate | None, ...]
    host: Rate | None

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
        """The host's rate from each rank's over the window. Its interval sums the ranks' ends: their
        windows are the same seconds of the same host, so their errors move together (a slow phase slows
        every rank), and the sum of the ends is the widest that can make; where a rank has no interval,
        neither has the sum."""
        ranks = tuple(rates)
        if not ranks or any(r is None for r in ranks):
            return cls(ranks, None)
        got = [r for r in ranks if r is not None]
        value = sum(r.value for r in got)
        if any(r.low is None or r.high is None for r in got):
            return cls(ranks, Rate(value))
        return cls(ranks, Rate(value, sum(r.low or 0.0 for r in got), sum(r.high or 0.0 for r in got)))

    @classmethod
    def over_window(cls, shares: Sequence[WindowShare | None], confidence: float) -> HostRate:
        """The host's rate from each rank's share of the window, slice by slice. Where one rank stalls
        (its process held off the cores for a moment) the others run faster in the same seconds: each
        slice's host rate, the sum of the ranks' in it, holds both, so the host's interval comes from the
        host's slices, not from ranks whose errors cancel. A rank's rate counts the seconds it stalled in
        the window (a rate over its own arrivals alone would leave them out, and read a stalled rank's
        catch-up as its speed)."""
        ranks = tuple(s.rate(confidence) if s is not None else None for s in shares)
        if not ranks or any(r is None for r in ranks):
            return cls(ranks, None)
        value = sum(r.value for r in ranks if r is not None)
        per_rank = [s.slice_rates() for s in shares if s is not None]
        slices = [sum(x for x in col if x is not None) for col in zip(*per_rank) if all(x is not None for x in col)]
        return cls(ranks, Rate.around(value, slices, confidence))


@dataclass(frozen=True, slots=True, kw_only=True)
class Command(Read):
    """One of the leader's commands to the other ranks of its host, numbered ``n`` (its replies' key): ``op``
    and the fields that op takes, the others at their defaults (the ops: :mod:`stagebench.core._follow`,
    :mod:`stagebench.job._lockstep`). JSON only in the store between the ranks."""

    op: str
    n: int = 0
    cid: int = -1
    what: str = ""
    spec: Mapping[str, Any] = field(default_factory=dict)
    open: bool = False
    seq: int = 0
    t0: float = 0.0
    t1: float = 0.0
    how: Mapping[str, Any] = field(default_factory=dict)
    code: int = 0
    index: int = 0
    source: str = ""
    s: int = 0
    i: int = 0
    key: str = ""
    settings: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class Answer(Read):
    """A follower's answer to the leader's question about a thing it opened: its workers (``pids``: is it
    ready), what it delivered since a moment (``n``) or over a window (``rates``: the kind's record of it,
    as written), and ``error``, (status, reason) where its copy failed. JSON only in the store between
    the ranks."""

    error: tuple[str, str] | None = None
    pids: tuple[int, ...] = ()
    n: int = 0
    rates: Mapping[str, Any] = field(default_factory=dict)

    READ = {"error": lambda v: (str(v[0]), str(v[1])) if v else None, "pids": each(int)}
