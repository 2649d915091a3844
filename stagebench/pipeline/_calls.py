"""The callables a stage is measured and rebuilt with, which a process worker unpickles.

A worker imports this module to run one of them, so it imports nothing beyond the standard library
and cloudpickle (which a worker has loaded to unpickle anything): a worker's start must not pay for
SPDL or the diagnosis.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import cloudpickle

__all__ = [
    "drain_generator",
    "AsyncGenDrain",
    "disaggregate",
    "collate",
    "AggregateGroup",
    "Fused",
    "MapThen",
    "install",
    "installed_call",
]


def drain_generator(op: Callable, item: Any) -> list:
    """A sync generator ``op`` run to the end on ``item``: the list of what SPDL emits for that input."""
    return list(op(item))


@dataclass(eq=False)
class AsyncGenDrain:
    """An async generator op, drained into a list (a coroutine the event loop can time)."""

    op: Callable

    async def __call__(self, item: Any) -> list:
        return [x async for x in self.op(item)]


def disaggregate(batch: Any) -> list:
    """What SPDL's disaggregate emits for one batch: its elements, as a list."""
    return list(batch)


def collate(group: Sequence) -> list:
    """What :class:`spdl.pipeline.defs.Collate` emits for one full ``group``: its items, as a list."""
    return list(group)


@dataclass(eq=False)
class AggregateGroup:
    """One aggregator output from the group of inputs that produced it.

    A fresh copy of the aggregator per call: aggregators are stateful, and the
    sweep runs calls concurrently.
    """

    proto: Any

    def __call__(self, group: Sequence) -> Any:
        agg = copy.deepcopy(self.proto)
        out = None
        for x in group:
            r = agg.accumulate(x)
            if r is not None:
                out = r
        return out if out is not None else agg.flush()


@dataclass(frozen=True)
class Fused:
    """Two stages as one call: ``then(first(x))``, for a stage measured on fresh outputs of the one before."""

    first: Callable
    then: Callable

    def __call__(self, x: Any) -> Any:
        return self.then(self.first(x))


@dataclass(frozen=True)
class MapThen:
    """A group's inputs through a stage one by one, then the group through an aggregate: ``then([each(x) ...])``."""

    each: Callable
    then: Callable

    def __call__(self, group: Any) -> Any:
        return self.then([self.each(x) for x in group])


_INSTALLED: Callable | None = None


def install(fn_bytes: bytes) -> None:
    """Pool initializer: the stage pickled in ``fn_bytes``, unpickled once per worker (cloudpickle: lambdas
    work) for :func:`installed_call`."""
    global _INSTALLED
    _INSTALLED = cloudpickle.loads(fn_bytes)


def installed_call(item: Any) -> Any:
    """The installed stage called on ``item``; returns its output. The pool's initializer
    (:func:`install`) sets the stage before any call, so the timed path checks nothing."""
    return _INSTALLED(item)  # type: ignore[misc]
