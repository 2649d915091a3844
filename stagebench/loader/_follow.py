"""A follower's part in a ranked loader sweep: each of the leader's loaders, opened here at the same knobs.

The talk is :mod:`stagebench.core._follow`'s; what is loader's is here: a loader built by this rank's own
factory (its dataset, its sampler's shard) and taken from by a consumer as the leader's points take from
theirs (:class:`stagebench.loader._consumer._Consumer`), warmed up by the same rule as the leader's points
(every worker delivered, then the warm-up), drained as the leader's resumed loaders drain (what the
workers queued while suspended, then one round of them), and its window reckoned as the leader's.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from stagebench.core._follow import Followed, follow
from stagebench.core._ranks import HostGroup
from stagebench.loader._consumer import _Consumer, _SpdlErrors, _teardown
from stagebench.loader._mirror import WHAT
from stagebench.loader._point import _failure, _quiet_sigchld, workers_beyond_cores_unwarned
from stagebench.loader._window import window_share
from stagebench.model._knobs import LoaderKnobs
from stagebench.model._ranks import WindowShare

__all__ = ["follow_loaders"]


@dataclass(eq=False)
class _Loader:
    """One of the leader's loaders, as this rank runs it (a :class:`stagebench.core._follow.Mirrored`)."""

    cons: _Consumer
    errors: _SpdlErrors
    knobs: LoaderKnobs
    warmup_s: float
    t_start: float
    seen: set[Any] = field(default_factory=set)
    scanned: int = 0
    seq: int = 0  # the latest opening of its gate
    drain_to: int | None = None  # arrivals at which the latest opening's drain is done
    fault: tuple[str, str] | None = None

    @classmethod
    def open(cls, factory: Any, spec: Mapping[str, Any]) -> _Loader:
        knobs = LoaderKnobs(**spec["knobs"])
        cons = _Consumer(factory, knobs)
        errors = _SpdlErrors()
        errors.attach()
        cons.start()
        return cls(cons, errors, knobs, float(spec["warmup_s"]), time.perf_counter())

    def ready(self, seq: int) -> bool:
        """Warmed up by the leader's points' rule (``seq`` 0: every worker delivered, then the warm-up), or
        drained after the ``seq``-th opening by the leader's resumed loaders' rule."""
        if self.error() is not None:
            return True
        events = self.cons.events
        n = len(events)
        if seq == 0:
            expected = max(1, self.knobs.num_workers)
            for e in events[self.scanned : n]:
                if e.epoch == 0:
                    self.seen.add(e.pid if e.pid is not None else self.scanned)
                self.scanned += 1
            all_seen = len(self.seen) >= expected
            return (
                n >= 2 and time.perf_counter() - self.t_start >= self.warmup_s and (all_seen or n >= 4 * expected + 2)
            )
        return self.seq >= seq and self.drain_to is not None and n >= self.drain_to

    def error(self) -> tuple[str, str] | None:
        if self.fault is None:
            self.fault = _failure(self.cons, self.errors, check_workers=True)
        return self.fault

    def pids(self) -> list[int]:
        return self.cons.worker_pids()

    def count(self, t0: float) -> int:
        return sum(1 for e in list(self.cons.events) if e.t >= t0)

    def gate(self, opened: bool, seq: int) -> None:
        if opened:
            nw = self.knobs.num_workers
            queued = nw * (self.knobs.prefetch_factor or 2) if nw > 0 else 0
            self.seq, self.drain_to = seq, len(self.cons.events) + queued + max(1, nw)
            self.cons.gate.set()
        else:
            self.cons.gate.clear()

    def rates(self, t0: float, t1: float, how: Mapping[str, Any]) -> WindowShare:
        return window_share(list(self.cons.events), t0, t1, time.perf_counter(), **how)

    def close(self) -> None:
        try:
            with contextlib.suppress(Exception):  # a teardown's fault: the leader's own point says what its loader did
                _teardown(self.cons, hung=False)
        finally:
            self.errors.detach()


def follow_loaders(group: HostGroup, factory: Any) -> Followed:
    """This follower's part in the leader's sweep, until the leader ends or starts its job phase."""

    def opener(what: str, spec: Mapping[str, Any]) -> _Loader:
        if what != WHAT:
            raise ValueError(f"a loader sweep's follower cannot open {what!r}")
        return _Loader.open(factory, spec)

    with _quiet_sigchld(), workers_beyond_cores_unwarned():
        return follow(group, opener, until=("job",))
