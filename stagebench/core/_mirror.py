"""The leader's side of a ranked measurement: whatever it opens to measure, every other rank opens too.

Where a host runs several ranks of a data-parallel job (torchrun's ``--nproc-per-node``), each with its
own loader or pipeline, a setting measured by one process that owns every core is wrong by the number of
ranks. So the leader (local rank 0) measures as on one rank, and each thing it opens to measure (a
loader at some knobs, a stage at some executor and concurrency, the whole pipeline at some settings) is
*mirrored*: each follower opens its own (its dataset, its shard, its cached inputs: :mod:`stagebench.core._follow`)
and runs it while the leader's runs, waiting where the leader's waits (a loader suspended between its
turns). A window opens only once every rank's copy has warmed up, or drained what it queued while it
waited; after it, each follower times its own arrivals over the leader's window (one host: one
``time.perf_counter()`` clock), and the host's rate is the sum (:class:`stagebench.model._ranks.HostRate`).
The leader reads the followers' processes itself (their CPU counts in a window's cores); a follower
reports only what the leader cannot see: its arrivals, its workers, its faults.

What each command opens (``what``) and how a follower runs it belong to the kind of run; this module is
the leader's half of the talk, and it never raises where it tells (telling happens in tear-downs that
must finish): a rank lost while telling is raised at the next read.
"""

from __future__ import annotations

import time
from typing import Any

from stagebench._errors import RankLost
from stagebench.core._ranks import HostGroup, leading

__all__ = ["Mirror", "mirror", "STATE_TTL_S"]

#: The followers' states are read at most this often (a read costs one look at the store per rank).
STATE_TTL_S = 0.002
#: A lost rank is looked for (its process, its beat) this often while states are read.
_CHECK_S = 0.25


class Mirror:
    """Tells the followers what the leader opens, gates and closes, and reads back what theirs did."""

    def __init__(self, group: HostGroup) -> None:
        self.group = group
        self._next = 0
        self._gates: dict[int, int] = {}  # an open thing -> the number of its latest opening
        self._states: dict[int, dict[str, Any]] = {}
        self._read_at = -1.0
        self._checked_at = 0.0
        self.lost: RankLost | None = None

    @property
    def ranks(self) -> int:
        return self.group.size

    # --------------------------------------------------------------- telling (never raises)
    def tell(self, op: str, **args: Any) -> None:
        """A command to every follower; a rank lost meanwhile is raised at the next read."""
        if self.lost is not None:
            return
        try:
            self.group.send(op, **args)
        except RankLost as e:
            self.lost = e

    def open(self, what: str, **spec: Any) -> int:
        """The leader opens ``what`` (a kind's name for it) at ``spec``: each follower opens its own; returns
        its number, by which the rest of the talk names it."""
        cid = self._next
        self._next += 1
        self._gates[cid] = 0
        self.tell("open", cid=cid, what=what, spec=spec)
        return cid

    def gate(self, cid: int, opened: bool) -> None:
        """The leader's ``cid`` runs again (``opened``) or waits for its turn."""
        if opened:
            self._gates[cid] = self._gates.get(cid, 0) + 1
        self.tell("gate", cid=cid, open=opened, seq=self._gates.get(cid, 0))

    def close(self, cid: int) -> None:
        self._gates.pop(cid, None)
        self.tell("close", cid=cid)

    # --------------------------------------------------------------- reading
    def states(self) -> dict[int, dict[str, Any]]:
        """Each follower's latest state (what it opened, by number); :class:`RankLost` where a rank is lost."""
        if self.lost is not None:
            raise self.lost
        now = time.perf_counter()
        if now - self._checked_at > _CHECK_S:
            self._checked_at = now
            self.group.check()
        if now - self._read_at > STATE_TTL_S:
            self._states = {r: self.group.state(r) for r in self.group.followers}
            self._read_at = now
        return self._states

    def each(self, cid: int) -> list[dict[str, Any]]:
        """Each follower's state of ``cid`` ({} where it has not said any yet), by local rank."""
        return [((s.get("open") or {}).get(str(cid)) or {}) for s in self.states().values()]

    def warm(self, cid: int) -> bool:
        """Whether every follower's ``cid`` has warmed up (each of its workers delivered)."""
        return all(c.get("warm") for c in self.each(cid))

    def resumed(self, cid: int) -> bool:
        """Whether every follower's ``cid`` drained what it queued since its latest opening."""
        seq = self._gates.get(cid, 0)
        return all(int(c.get("resumed", -1)) >= seq for c in self.each(cid))

    def arrivals(self, cid: int) -> list[int]:
        """What each follower's ``cid`` delivered so far (batches, items)."""
        return [int(c.get("n", 0)) for c in self.each(cid)]

    def failure(self, cid: int) -> tuple[str, str] | None:
        """(status, reason) of the first follower whose ``cid`` failed, else None."""
        for r, s in self.states().items():
            got = ((s.get("open") or {}).get(str(cid)) or {}).get("error")
            if got:
                return str(got[0]), f"local rank {r}: {got[1]}"
        return None

    def worker_pids(self, cid: int) -> list[int]:
        """The worker processes of each follower's ``cid``."""
        return [int(p) for c in self.each(cid) for p in c.get("pids") or ()]

    def pids(self, cid: int) -> list[int]:
        """The followers' processes and the workers of their ``cid``: what a window's cores count."""
        return [self.group.pids[r] for r in self.group.followers] + self.worker_pids(cid)

    def rates(self, cid: int, t0: float, t1: float, how: dict[str, Any]) -> list[dict[str, Any]]:
        """What each follower's ``cid`` delivered over the leader's window [t0, t1], by local rank (``how``:
        what the kind's reckoning of a window takes besides its ends)."""
        n = self.group.send("rates", cid=cid, t0=t0, t1=t1, how=how)
        got = self.group.replies(n, time.perf_counter() + 30.0)
        return [got[r] for r in self.group.followers]


_MIRRORS: dict[int, Mirror] = {}


def mirror() -> Mirror | None:
    """The mirror of the ranked run this process leads now (:func:`stagebench.core._ranks.lead`), else None."""
    group = leading()
    if group is None:
        return None
    got = _MIRRORS.get(id(group))
    if got is None or got.group is not group:
        got = _MIRRORS[id(group)] = Mirror(group)
    return got
