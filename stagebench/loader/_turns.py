"""Loader settings measured again in turns, each loader opened once and kept open between its windows.

The rule every piece of advice follows (:mod:`stagebench.model._evidence`) decides on windows measured
in turns: one window of each setting per round, so that a round's windows saw the same moments of the
host, whose speed moves 1.4-1.7x in phases of seconds. Opening a loader costs its workers' start-up
(seconds where the dataset is shipped to spawned workers, or workers import much), so each setting's
loader is built once, for the first window, and kept open, suspended, between its turns:

1. **Open** (first turn): build it and warm it up as any point (:func:`stagebench.loader._point`'s
   protocol: every worker delivered, then the minimum warm-up), then time a window.
2. **Suspend**: the consumer stops taking batches; the workers fill their queues and idle.
3. **Resume** (later turns): take what the workers queued meanwhile (a DataLoader holds
   ``num_workers x prefetch_factor`` batches in flight; other loaders, what arrives at once), then
   one round of the workers, then time a window. Windows close on the same rules as any point's
   (sequential stopping), at ±10% (:data:`~stagebench.core._config.PAIRED_PRECISION`) where a point's
   is ±5%: a window in turns is one sample of a ratio whose interval comes from the rounds.

A round runs the settings in alternating order (A B C, then C B A), so that a steady drift of the
host favours none. Rounds go on while the rule is not settled, at most ``tie_rounds``. Each window is
a row with ``search_phase`` ``paired`` and its round in ``turn``, written as it is measured; the
analysis reads the rounds back from them, so ``stagebench report`` rebuilds the same decision.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from stagebench.core._config import in_turns_precision
from stagebench.loader._config import LoaderFactory, LoaderSweepConfig
from stagebench.loader._point import (
    _POLL_S,
    _Consumer,
    _empty_row,
    _failed,
    _failure,
    _fill,
    _Plan,
    _quiet_sigchld,
    _SpdlErrors,
    _supervise,
    _teardown,
    timed_window,
)
from stagebench.runs._knobs import LoaderKnobs, normalize_knobs

__all__ = ["run_turns"]

#: A batch queued while its loader waited arrives within this of the one before it.
_QUEUED_GAP_S = 0.005


@dataclass
class _Held:
    """One setting's loader, open between its turns."""

    eff: LoaderKnobs
    shown: dict[str, Any]
    notes: list[str]
    cons: _Consumer
    errors: _SpdlErrors
    windows: int = 0


def _wait_for(cons: _Consumer, n: int, deadline: float, errors: _SpdlErrors) -> bool:
    """Until ``n`` events have arrived (False: a failure, the loader ended, or the deadline)."""
    while len(cons.events) < n:
        if _failure(cons, errors) or cons.finished or time.perf_counter() > deadline:
            return False
        time.sleep(_POLL_S)
    return True


def _resume(h: _Held, cfg: LoaderSweepConfig, backend: str, deadline: float) -> bool:
    """Open the gate, take what the workers queued while suspended, then one round of them."""
    cons = h.cons
    n0 = len(cons.events)
    cons.gate.set()
    if h.eff.num_workers > 0:
        if backend == "torch":  # each batch taken sends one index: the depth of the queue is known
            if not _wait_for(cons, n0 + h.eff.num_workers * (h.eff.prefetch_factor or 2), deadline, h.errors):
                return False
        else:  # what arrives at once was queued
            while True:
                n = len(cons.events)
                if not _wait_for(cons, n + 1, deadline, h.errors):
                    return False
                if n > n0 and cons.events[-1].t - cons.events[-2].t > _QUEUED_GAP_S:
                    break
    # one round of the workers, at least the minimum warm-up of a resumed loader
    t_warm = time.perf_counter()
    if not _wait_for(cons, len(cons.events) + max(1, h.eff.num_workers), deadline, h.errors):
        return False
    while time.perf_counter() - t_warm < min(cfg.warmup_s, 0.1):
        time.sleep(_POLL_S)
    return True


def _window(
    factory: LoaderFactory,
    knobs: LoaderKnobs,
    held: dict[tuple, _Held],
    *,
    name: str,
    backend: str,
    batch_size: int | None,
    cfg: LoaderSweepConfig,
    cuda: bool,
    turn: int,
) -> dict[str, Any]:
    """One window of ``knobs`` in turn ``turn``: its loader opened on the first, resumed after."""
    eff, shown, notes = normalize_knobs(knobs, backend, cuda=cuda)
    key = (eff.num_workers, eff.prefetch_factor, eff.persistent_workers, eff.pin_memory)
    row = _empty_row(name, backend, eff, shown, "paired", notes)
    row["turn"] = turn
    t_begin = time.perf_counter()
    deadline = t_begin + cfg.timeout_s
    plan = _Plan(stall=False, throughput=True, batch_size=batch_size, floor=None)
    h = held.get(key)
    with _quiet_sigchld():
        try:
            if h is None:
                cons = _Consumer(factory, eff)
                errors = _SpdlErrors()
                errors.attach()
                h = held[key] = _Held(eff, shown, notes, cons, errors)
                cons.start()
                outcome, hung = _supervise(cons, eff, cfg, deadline, row, errors, plan)
            else:
                row["startup_s"] = 0.0
                if _resume(h, cfg, backend, deadline):
                    row["warmup_s"] = time.perf_counter() - t_begin
                    outcome, hung = timed_window(h.cons, eff, cfg, deadline, row, h.errors, plan)
                else:
                    fail = _failure(h.cons, h.errors, check_workers=True)
                    row["status"], row["reason"] = fail or ("timeout", "the loader stalled after its turn resumed")
                    outcome, hung = None, fail is None
        except KeyboardInterrupt:
            close_held(held)
            raise
        h.cons.gate.clear()
        if row["status"] == "ok" and h.errors.records:
            _failed(h.cons, h.errors, row)
        _fill(row, h.cons, outcome, eff, batch_size, cfg)
        if h.windows:  # not the first: no start-up in this window, whatever the events before it
            row["time_to_first_batch_s"] = math.nan
        h.windows += 1
        if row["status"] != "ok":  # a broken loader is not resumed: its turns end here
            for note in _teardown(h.cons, hung=hung):
                row["notes"] = f"{row['notes']}; {note}" if row["notes"] else note
            h.errors.detach()
            held.pop(key, None)
    row["elapsed_s"] = time.perf_counter() - t_begin
    return row


def close_held(held: dict[tuple, _Held]) -> None:
    """Tear down every loader kept open (never raises)."""
    for h in list(held.values()):
        try:
            _teardown(h.cons, hung=False)
        finally:
            h.errors.detach()
    held.clear()


def run_turns(
    factory: LoaderFactory,
    next_settings: Callable[[], list[LoaderKnobs]],
    record: Callable[[dict[str, Any]], Any],
    *,
    name: str,
    backend: str,
    batch_size: int | None,
    cfg: LoaderSweepConfig,
    cuda: bool,
    max_rounds: int,
    first_turn: int = 1,
) -> int:
    """Rounds in turns while ``next_settings()`` (asked before each round, from the rows so far) names
    settings to compare, at most ``max_rounds``; each window's row goes to ``record`` as it lands.
    Returns the rounds run."""
    held: dict[tuple, _Held] = {}
    rounds = 0
    cfg = replace(cfg, precision=in_turns_precision(cfg.precision))  # a window in turns: one sample of a ratio
    try:
        for i in range(max_rounds):
            todo = next_settings()
            if not todo:
                break
            if i % 2:
                todo = todo[::-1]
            for knobs in todo:
                record(
                    _window(
                        factory,
                        knobs,
                        held,
                        name=name,
                        backend=backend,
                        batch_size=batch_size,
                        cfg=cfg,
                        cuda=cuda,
                        turn=first_turn + i,
                    )
                )
            rounds += 1
    finally:
        close_held(held)
    return rounds
