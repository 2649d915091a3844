"""A follower's side of a ranked measurement: the leader's commands, carried out on this rank's own copies.

Each rank other than local rank 0 catches its own loader or pipeline as the leader does, then searches
nothing itself: it opens what the leader opens (:mod:`stagebench.core._mirror`), runs it while the
leader's runs and lets it wait while the leader's waits, closes it where the leader closes its own, and
answers the leader's questions: is it ready (warmed up, or drained what it queued while it waited), what
has it delivered since a moment, what did it deliver over a window. How a thing is opened and run is the
kind's (a :class:`Mirrored` made by an opener it hands :func:`follow`); the talk is here, once.

A follower is quiet while it waits: it blocks on the store for the leader's next command (the socket's
wait holds no GIL), and looks at its own copies only while the leader waits for it to be ready, which no
window spans: every poll would take the GIL from its own stage. Nothing here writes a file: the leader
writes the run directory.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from stagebench.core._ranks import HostGroup
from stagebench.model._ranks import Answer, Command

__all__ = ["Mirrored", "Record", "Failed", "Followed", "follow"]

#: How often a follower looks at a copy the leader waits on to be ready.
_READY_POLL_S = 0.005


class Record(Protocol):
    """What a copy delivered over a window, as its kind reckons it; sent to the leader as its ``to_json``."""

    def to_json(self) -> Mapping[str, Any]: ...


class Mirrored(Protocol):
    """One thing a follower opened at the leader's word (a loader, a stage's runner, a whole pipeline)."""

    def ready(self, seq: int) -> bool:
        """Whether it is ready for a window: warmed up (``seq`` 0), or drained what it queued before its
        ``seq``-th opening. True where it failed (:meth:`error` says how)."""

    def error(self) -> tuple[str, str] | None:
        """(status, reason) where it failed."""

    def pids(self) -> list[int]:
        """Its worker processes."""

    def count(self, t0: float) -> int:
        """What it delivered since ``t0``."""

    def gate(self, opened: bool, seq: int) -> None:
        """Run again (``opened``, the ``seq``-th opening) or wait."""

    def rates(self, t0: float, t1: float, how: Mapping[str, Any]) -> Record | None:
        """What it delivered over [t0, t1], as the kind reckons a window (None: nothing to reckon)."""

    def close(self) -> None:
        """Stop and tear down; never raises."""


@dataclass
class Failed:
    """A copy that could not be opened: it answers every question with why."""

    why: tuple[str, str]

    def ready(self, seq: int) -> bool:
        return True

    def error(self) -> tuple[str, str] | None:
        return self.why

    def pids(self) -> list[int]:
        return []

    def count(self, t0: float) -> int:
        return 0

    def gate(self, opened: bool, seq: int) -> None:
        pass

    def rates(self, t0: float, t1: float, how: Mapping[str, Any]) -> Record | None:
        return None

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class Followed:
    """Why :func:`follow` returned: the leader's exit code (``end``), or a command of the leader's that
    belongs to the caller (``cmd``: the next phase begins)."""

    code: int | None = None
    cmd: Command | None = None


def _reply(group: HostGroup, cmd: Command, m: Mirrored | None, **got: Any) -> None:
    """Answer the leader's question ``cmd`` about ``m`` (``got``: the :class:`Answer`'s fields)."""
    error = m.error() if m is not None else ("failed", "not open on this rank")
    group.reply(cmd.n, Answer(error=error, **got))


def _until_ready(group: HostGroup, m: Mirrored, seq: int) -> None:
    """Wait until ``m`` is ready, or the leader stopped waiting for it (its next command is there: a point
    it timed out, a loader it closed) or is lost (:class:`stagebench._errors.RankLost`)."""
    checked = time.perf_counter()
    while not m.ready(seq):
        if group.pending():
            return
        now = time.perf_counter()
        if now - checked > 0.25:
            checked = now
            group.check()
        time.sleep(_READY_POLL_S)


def follow(
    group: HostGroup,
    opener: Callable[[str, Mapping[str, Any]], Mirrored],
    *,
    until: tuple[str, ...] = (),
    kept: dict[int, Mirrored] | None = None,
) -> Followed:
    """Carry out the leader's commands until it ends, or sends a command of ``until`` (returned to the
    caller, whose phase it is); :class:`stagebench._errors.RankLost` where the leader is lost.

    ``opener(what, spec)`` opens this rank's copy of what the leader opened (one that raises is a
    :class:`Failed` copy: the leader's point then fails with its reason). ``kept``: what stays open across
    calls (a phase that returns and comes back); without it, what is open when this returns is closed.
    """
    mine: dict[int, Mirrored] = {} if kept is None else kept
    try:
        while True:
            cmd = group.wait_command()
            op, cid = cmd.op, cmd.cid
            m = mine.get(cid)
            if op == "end":
                return Followed(code=cmd.code)
            if op in until:
                return Followed(cmd=cmd)
            if op == "open":
                try:
                    mine[cid] = opener(cmd.what, cmd.spec)
                except Exception as e:  # the leader's point fails with it, said; the talk goes on
                    mine[cid] = Failed(("failed", f"{type(e).__name__}: {e}"[:300]))
            elif op == "gate" and m is not None:
                m.gate(cmd.open, cmd.seq)
            elif op == "close" and m is not None:
                mine.pop(cid).close()
            elif op == "ready":
                if m is not None:
                    _until_ready(group, m, cmd.seq)
                _reply(group, cmd, m, pids=m.pids() if m is not None else ())
            elif op == "count":
                _reply(group, cmd, m, n=m.count(cmd.t0) if m is not None else 0)
            elif op == "rates":
                got = m.rates(cmd.t0, cmd.t1, cmd.how) if m is not None else None
                rates = got.to_json() if got is not None else {}
                _reply(group, cmd, m, rates=json.loads(json.dumps(rates, default=float)))
    finally:
        if kept is None:
            for x in mine.values():
                x.close()
            mine.clear()
