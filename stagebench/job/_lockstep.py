"""The job phase on every rank of a host: the leader's loop decides, every rank's loop runs the same steps.

A data-parallel loop steps in lockstep (DDP's all-reduce waits for every rank), so every rank's loop must
be handed the same number of batches, from the same setting, step by step: a rank that ended a slice a
step early would leave the others waiting in an all-reduce. So the leader (local rank 0) runs the job
phase as on one rank (:mod:`stagebench.job._phase`: the step alone, then the job runs in turns until the
rule settles) and tells, before each batch it hands its loop, where that batch comes from: a cached batch,
or a candidate's loader or pipeline (opened, drained, paused and closed where the leader's is). Each
follower hands its own loop its own batch from the same source (its own loader at the same setting, over
its own shard). The leader's figures are the job's: its steps are every rank's steps.

Before the first step of each slice the leader waits until every follower has handed the step before it,
so that a job whose loop has no collective of its own still runs each setting on every rank at once.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Generator, Iterator, Mapping
from contextlib import AbstractContextManager, ExitStack
from typing import Any

from stagebench._errors import RankLost
from stagebench._signals import ignore_sigterm
from stagebench.core._jobrun import Candidate, Feed, Opener
from stagebench.core._ranks import HostGroup
from stagebench.runs._outcome import RANK_LOST

__all__ = ["Lockstep", "follow_job"]

#: The longest the leader waits for a follower to reach a slice's start (a follower's step may be slow).
_REACH_S = 600.0


class Lockstep:
    """The leader's side: says where each batch of its loop comes from, before it hands it."""

    def __init__(self, group: HostGroup) -> None:
        self.group = group
        self.step = 0  # steps handed so far
        self.source: str | None = None

    def begin(self) -> None:
        """The job phase starts: the followers leave the sweep's commands for this phase's."""
        self.group.send("job")

    def cached(self, settings: Mapping[str, Any]) -> None:
        """The batches of the step alone come from a loader or pipeline at ``settings`` on every rank."""
        self.group.send("cached", settings=dict(settings))

    def cached_step(self, i: int) -> None:
        self._step("cached", i=i)

    def _step(self, source: str, **args: Any) -> None:
        if source != self.source and self.step:  # a slice's first step: every rank at the same place
            self._reached(self.step - 1)
        self.source = source
        self.group.send("step", source=source, s=self.step, **args)
        self.step += 1

    def _reached(self, step: int) -> None:
        followers = self.group.followers

        def ready() -> bool:
            return all(self.group.reached(r) >= step for r in followers)

        self.group.wait_until(ready, time.perf_counter() + _REACH_S, "reach the same step")

    def opener(self, open_candidate: Opener) -> Opener:
        """``open_candidate`` told to the followers: where the leader opens, drains, pauses, closes and
        takes a candidate's batch, each follower does the same with its own."""

        @contextlib.contextmanager
        def opened(cand: Candidate) -> Iterator[Feed]:
            self.group.send("open", key=cand.key, settings=dict(cand.settings))
            try:
                with open_candidate(cand) as got:
                    feed = got if isinstance(got, Feed) else Feed(get=got)
                    yield self._told(cand.key, feed)
            finally:
                self.group.send("close", key=cand.key)

        return opened

    def _told(self, key: str, feed: Feed) -> Feed:
        def get() -> Any:
            self._step(key)
            return feed.get()

        def drain() -> int:
            self.group.send("drain", key=key)
            return feed.drain() if feed.drain is not None else 0

        def pause() -> int:
            self.group.send("pause", key=key)
            return feed.pause() if feed.pause is not None else 0

        return Feed(
            get=get,
            drain=None if feed.drain is None else drain,
            pause=None if feed.pause is None else pause,
        )


def follow_job(
    group: HostGroup,
    open_setting: Callable[[Mapping[str, Any]], AbstractContextManager[Any]],
    cached_batches: Callable[[Mapping[str, Any]], list[Any]],
    say: Callable[[str], None],
    end: Callable[[int], None],
) -> Generator[Any, None, None]:
    """A follower's job phase, as the generator its loop iterates: each batch from the source the leader
    names, from this rank's own loader or pipeline (``open_setting(settings)``: a context giving its
    :class:`Feed`; ``cached_batches(settings)``: this rank's cached batches). Ends the program with the
    leader's exit code: ``SystemExit`` from the loop's ``for``, or ``end(code)`` where the loop stopped
    early (as the leader's does: :func:`stagebench.job._phase.trainer_phases`)."""
    feeds: dict[str, tuple[Feed, ExitStack]] = {}
    try:
        code = yield from _steps(group, feeds, open_setting, cached_batches)
    except GeneratorExit:  # this rank's loop stopped, as the leader's did at the same step: its code follows
        _close(feeds)
        code = _wait_end(group)
        ignore_sigterm()
        group.bye()
        end(code)
        return
    except RankLost as e:
        _close(feeds)
        say(f"local rank {group.rank}: {e}")
        group.bye()
        raise SystemExit(RANK_LOST.exit_code) from None
    _close(feeds)
    ignore_sigterm()  # leaving with the leader's code, whatever torch's launcher does to the last ranks
    group.bye()
    raise SystemExit(code)


def _steps(
    group: HostGroup,
    feeds: dict[str, tuple[Feed, ExitStack]],
    open_setting: Callable[[Mapping[str, Any]], AbstractContextManager[Any]],
    cached_batches: Callable[[Mapping[str, Any]], list[Any]],
) -> Generator[Any, None, int]:
    """The leader's commands of the job phase, carried out here, until its ``end``; returns its code."""
    cached: list[Any] = []
    while True:
        cmd = group.wait_command()
        op = cmd.op
        if op == "step":
            source = cmd.source
            item = cached[cmd.i % len(cached)] if source == "cached" else feeds[source][0].get()
            group.reach(cmd.s)
            yield item
        elif op == "cached":
            cached = cached_batches(cmd.settings)
        elif op == "open":
            stack = ExitStack()
            got = stack.enter_context(open_setting(cmd.settings))
            feeds[cmd.key] = (got if isinstance(got, Feed) else Feed(get=got), stack)
        elif op in ("drain", "pause") and cmd.key in feeds:
            act = getattr(feeds[cmd.key][0], op)
            if act is not None:
                act()
        elif op == "close" and cmd.key in feeds:
            feeds.pop(cmd.key)[1].close()
        elif op == "end":
            return cmd.code


def _close(feeds: dict[str, tuple[Feed, ExitStack]]) -> None:
    for _, stack in feeds.values():
        with contextlib.suppress(Exception):
            stack.close()
    feeds.clear()


def _wait_end(group: HostGroup) -> int:
    """The leader's exit code, after this rank's loop stopped early (the leader writes its figures first)."""
    try:
        while True:
            cmd = group.wait_command()
            if cmd.op == "end":
                return cmd.code
    except RankLost:
        return RANK_LOST.exit_code
