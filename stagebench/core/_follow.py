"""A follower's side of a ranked measurement: the leader's commands, carried out on this rank's own copies.

Each rank other than local rank 0 catches its own loader or pipeline as the leader does, then searches
nothing itself: it opens what the leader opens (:mod:`stagebench.core._mirror`), runs it while the
leader's runs and lets it wait while the leader's waits, closes it where the leader closes its own, and
times its own arrivals over each window the leader asks about. It tells the leader, as they change, what
each thing it opened delivered, whether it warmed up or drained, its workers and its faults. How a
thing is opened and run is the kind's (a :class:`Mirrored` made by an opener it hands :func:`follow`);
the talk is here, once. Nothing here writes a file: the leader writes the run directory for the host.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from stagebench.core._ranks import POLL_S, HostGroup

__all__ = ["Mirrored", "Followed", "follow"]

#: How often a follower rewrites its state while it changes (the leader reads it as it polls).
_STATE_S = 0.005
#: How often the worker processes of what it opened are looked at for one that died (a waitpid each).
_WORKERS_S = 0.1


class Mirrored(Protocol):
    """One thing a follower opened at the leader's word (a loader, a stage's runner, a whole pipeline)."""

    def look(self, now: float, check_workers: bool) -> None:
        """Bring its state up to date (warm-up, drain, faults; workers where ``check_workers``)."""

    def state(self) -> dict[str, Any]:
        """``n`` (delivered), ``warm``, ``resumed`` (the latest opening drained), ``error`` ([status,
        reason] or None), ``pids`` (its workers)."""

    def gate(self, opened: bool, seq: int) -> None:
        """Run again (``opened``, the ``seq``-th opening) or wait."""

    def rates(self, t0: float, t1: float, how: Mapping[str, Any]) -> dict[str, Any]:
        """What it delivered over [t0, t1], as the kind reckons a window."""

    def close(self) -> None:
        """Stop and tear down; never raises."""


@dataclass(frozen=True)
class Followed:
    """Why :func:`follow` returned: the leader's exit code (``end``), or a command of the leader's that
    belongs to the caller (``cmd``: the next phase begins)."""

    code: int | None = None
    cmd: dict[str, Any] | None = None


def follow(
    group: HostGroup,
    opener: Callable[[str, Mapping[str, Any]], Mirrored],
    *,
    until: tuple[str, ...] = (),
    between: Callable[[], None] | None = None,
    kept: dict[int, Mirrored] | None = None,
) -> Followed:
    """Carry out the leader's commands until it ends, or sends a command of ``until`` (returned to the
    caller, whose phase it is); :class:`stagebench._errors.RankLost` where the leader is lost.

    ``opener(what, spec)`` opens this rank's copy of what the leader opened. ``between``: called while no
    command waits (a caller's own bookkeeping). ``kept``: what stays open across calls (a phase that
    returns and comes back); what is open when the leader ends is closed.
    """
    mine: dict[int, Mirrored] = {} if kept is None else kept
    said: dict[str, Any] | None = None
    last_said = last_check = last_workers = 0.0
    try:
        while True:
            cmd = group.command()
            if cmd is not None:
                op, cid = cmd["op"], int(cmd.get("cid", -1))
                if op == "end":
                    return Followed(code=int(cmd["code"]))
                if op in until:
                    return Followed(cmd=cmd)
                if op == "open":
                    mine[cid] = opener(str(cmd["what"]), cmd.get("spec") or {})
                elif op == "gate" and cid in mine:
                    mine[cid].gate(bool(cmd["open"]), int(cmd["seq"]))
                elif op == "close" and cid in mine:
                    mine.pop(cid).close()
                elif op == "rates":
                    got = mine[cid].rates(cmd["t0"], cmd["t1"], cmd["how"]) if cid in mine else {}
                    group.reply(cmd["n"], json.loads(json.dumps(got, default=float)))
                continue
            now = time.perf_counter()
            workers = now - last_workers > _WORKERS_S
            if workers:
                last_workers = now
            for m in mine.values():
                m.look(now, workers)
            state = {"open": {str(cid): m.state() for cid, m in mine.items()}}
            if (state != said and now - last_said >= _STATE_S) or now - last_said > 0.5:
                group.publish(state)
                said, last_said = state, now
            if now - last_check > 0.25:
                last_check = now
                group.check()
            if between is not None:
                between()
            time.sleep(POLL_S)
    finally:
        if kept is None:
            for m in mine.values():
                m.close()
            mine.clear()
