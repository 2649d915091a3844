"""The leader's side of a ranked measurement: whatever it opens to measure, every other rank opens too.

Where a host runs several ranks of a data-parallel job (torchrun's ``--nproc-per-node``), each with its
own loader or pipeline, a setting measured by one process that owns every core is wrong by the number of
ranks. So the leader (local rank 0) measures as on one rank, and each thing it opens to measure (a
loader at some knobs, a stage at some executor and concurrency, the whole pipeline at some settings) is
*mirrored*: each follower opens its own (its dataset, its shard, its inputs: :mod:`stagebench.core._follow`)
and runs it while the leader's runs, waiting where the leader's waits (a loader suspended between its
turns). A window opens only once every rank's copy is ready (warmed up, or drained what it queued while
it waited: :meth:`Mirror.ready`); after it, each follower reckons its own arrivals over the leader's window
(one host: one ``time.perf_counter()`` clock), and the host's rate is the sum
(:class:`stagebench.model._ranks.HostRate`). The leader reads the followers' processes itself (their CPU
counts in a window's cores); a follower tells only what the leader cannot see: its arrivals, its workers,
its faults, each when asked.

What each command opens (``what``) and how a follower runs it belong to the kind of run; this module is
the leader's half of the talk. It never raises where it only tells (telling happens in tear-downs that
must finish): a rank lost while telling is raised at the next question.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

from stagebench._errors import RankLost
from stagebench.core._ranks import HostGroup, leading
from stagebench.model._ranks import Answer

__all__ = ["Mirror", "Ready", "mirror", "MirroredGate"]

#: The longest the leader waits for a follower's answer about a window (the window itself is over).
_ANSWER_S = 30.0


class Ready:
    """The leader's question "is your copy ready?", asked once: poll :meth:`done` (it never blocks); then
    each follower's workers and the first fault any of them met."""

    def __init__(self, group: HostGroup, n: int) -> None:
        self.group, self.n = group, n
        self.got: dict[int, Answer] = {}
        self._checked = 0.0

    def done(self) -> bool:
        """Whether every follower answered; :class:`RankLost` where one is lost meanwhile."""
        if len(self.got) < len(self.group.followers):
            self.got.update(self.group.answers(self.n))
            now = time.perf_counter()
            if len(self.got) < len(self.group.followers) and now - self._checked > 0.25:
                self._checked = now
                self.group.check()
        return len(self.got) == len(self.group.followers)

    @property
    def failure(self) -> tuple[str, str] | None:
        """(status, reason) of the first follower whose copy failed, else None."""
        return _failure(self.got)

    @property
    def pids(self) -> list[int]:
        return [p for r in sorted(self.got) for p in self.got[r].pids]


def _failure(got: Mapping[int, Answer]) -> tuple[str, str] | None:
    """(status, reason) of the first follower whose copy failed, else None."""
    for r in sorted(got):
        if (err := got[r].error) is not None:
            return err[0], f"local rank {r}: {err[1]}"
    return None


class Mirror:
    """Tells the followers what the leader opens, gates and closes, and asks what theirs did."""

    def __init__(self, group: HostGroup) -> None:
        self.group = group
        self._next = 0
        self._gates: dict[int, int] = {}  # an open thing -> the number of its latest opening
        self.lost: RankLost | None = None

    @property
    def processes(self) -> list[int]:
        """The followers' own processes (a window's cores count theirs and their workers')."""
        return [self.group.pids[r] for r in self.group.followers]

    # --------------------------------------------------------------- telling (never raises)
    def tell(self, op: str, **args: Any) -> None:
        """A command to every follower; a rank lost meanwhile is raised at the next question."""
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

    # --------------------------------------------------------------- asking
    def _send(self, op: str, **args: Any) -> int:
        if self.lost is not None:
            raise self.lost
        return self.group.send(op, **args)

    def ready(self, cid: int) -> Ready:
        """Ask whether every follower's ``cid`` is ready for a window: warmed up, or, after it waited, drained
        what it queued since its latest opening (each answers once it is, or has failed)."""
        return Ready(self.group, self._send("ready", cid=cid, seq=self._gates.get(cid, 0)))

    def counts(self, cid: int, t0: float) -> list[int]:
        """What each follower's ``cid`` delivered since ``t0`` (by local rank); a follower whose copy failed
        counts nothing."""
        got = self.group.replies(self._send("count", cid=cid, t0=t0), time.perf_counter() + _ANSWER_S)
        return [got[r].n for r in self.group.followers]

    def rates(
        self, cid: int, t0: float, t1: float, how: Mapping[str, Any]
    ) -> tuple[list[Mapping[str, Any]], tuple[str, str] | None]:
        """What each follower's ``cid`` delivered over the leader's window [t0, t1], the kind's record of it as
        written (by local rank; ``how``: what the kind's reckoning of a window takes besides its ends), and
        the first fault a follower met."""
        n = self._send("rates", cid=cid, t0=t0, t1=t1, how=how)
        got = self.group.replies(n, time.perf_counter() + _ANSWER_S)
        return [got[r].rates for r in self.group.followers], _failure(got)


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


class MirroredGate(threading.Event):
    """The gate of something the leader opened to measure (a loader, a whole pipeline: set, it runs;
    clear, it waits for its turn), told to the followers as it opens and closes once the thing has its
    number in the talk (``cid``); before that, or on one rank, a plain event."""

    def __init__(self) -> None:
        super().__init__()
        self.mirror: Mirror | None = None
        self.cid: int | None = None

    def set(self) -> None:
        super().set()
        if self.mirror is not None and self.cid is not None:
            self.mirror.gate(self.cid, True)

    def clear(self) -> None:
        super().clear()
        if self.mirror is not None and self.cid is not None:
            self.mirror.gate(self.cid, False)
