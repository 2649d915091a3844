"""Job runs: the user's own training loop on the real loader or pipeline, at each candidate setting, in turns.

The user's question is what their training *job* does: the loader (capacity I) and the training
step (demand T) on one host. Its throughput is at most min(I, T), and less where the two compete
for the cores, where loading is serial with the step (``num_workers=0`` adds the load to every
step), or where the copy to the device waits on pageable memory. None of that shows in a loader
measured alone, so each setting the advice may name is run with the user's loop: :class:`JobRuns`
hands the loop the real loader's (or pipeline's) batches at each candidate in turn, and times each
step's wait for its batch (the data wait) and the loop body after it.

One *slice* is one candidate, opened fresh:

1. Open: build the loader, start its workers. Not counted; the time to the first batch is kept.
2. Warm-up: ``max(WARMUP_STEPS, round_steps)`` steps. Workers start together and deliver their first
   batches in a burst, which the loop drains faster than the loader's pace.
3. Counted: whole groups of steps (:func:`group_steps`: whole rounds of the workers, since a DataLoader
   delivers in order, one batch per worker in turn; a window that ends inside a round would count a
   burst, not the pace), at least :data:`MIN_SLICE_STEPS` steps and :data:`MIN_SLICE_S` seconds, at
   most ``max_slice_s``.

Slices take turns. Round 1 runs every candidate in priority order (the user's own first, then what
the isolated sweep picked: a loop that stops early has run those); later rounds run what the
decision still hinges on (``contenders``, from the analysis: round 2 everything not already clearly
behind, in reverse order, so that a steady drift of the machine favours none; then only the
candidates whose comparison is open), up to ``max_rounds``, all within ``budget_s``. A loop that stops
(``break``, an exception) ends the runs where they are: what was measured is kept, and
:meth:`JobRuns.record` says what did not run.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from stagebench.core._steps import WARMUP_STEPS

__all__ = ["Candidate", "JobRuns", "MIN_SLICE_STEPS", "MIN_SLICE_S", "GROUP_MIN_STEPS", "MAX_ROUNDS", "group_steps"]

#: Fewest counted steps of a slice: two groups of four (the interval needs two groups per slice).
MIN_SLICE_STEPS = 8
#: Shortest counted window of a slice, seconds: a loop of 1 ms steps needs more than 8 of them.
MIN_SLICE_S = 0.3
#: Fewest steps in one batch-mean group (whole rounds of the workers above this).
GROUP_MIN_STEPS = 4
#: Most rounds of slices: two for every candidate, two more for the ones the decision hinges on.
MAX_ROUNDS = 4


def group_steps(round_steps: int) -> int:
    """Steps per batch-mean group: whole rounds of the workers, at least :data:`GROUP_MIN_STEPS`."""
    r = max(1, int(round_steps))
    return r * math.ceil(GROUP_MIN_STEPS / r)


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """One setting to run the user's loop with."""

    key: str
    """Stable identifier (the setting, compactly)."""
    label: str
    """The setting as the user writes it (``num_workers=4, prefetch_factor=2``)."""
    settings: Mapping[str, Any]
    """The setting, JSON-able: loader knobs, or stage name -> [executor, concurrency]."""
    origin: tuple[str, ...]
    """Why it is a candidate: ``yours``, ``feeds``, ``above``, ``best``, ``pinned`` (the analysis words them)."""
    cost: tuple[float, ...]
    """What it costs, compared in order: workers and threads first, then the rest (memory)."""
    round_steps: int = 1
    """Batches per round of its workers (a DataLoader's num_workers; 1 where delivery has no rounds)."""
    alone: Mapping[str, Any] | None = None
    """The loader or pipeline alone at this setting, where measured (samples/s and interval)."""

    def as_meta(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "label": self.label,
            "settings": dict(self.settings),
            "origin": list(self.origin),
            "cost": list(self.cost),
            "round_steps": self.round_steps,
            "group_steps": group_steps(self.round_steps),
            "alone": dict(self.alone) if self.alone else None,
        }


#: Opens a candidate: a context manager giving the function that returns its next batch (EOFError: no more).
Opener = Callable[[Candidate], AbstractContextManager[Callable[[], Any]]]


class JobRuns:
    """Runs the user's loop on each candidate in turns; :meth:`record` is ``run.json["job"]``."""

    def __init__(
        self,
        candidates: list[Candidate],
        *,
        items_per_step: float,
        say: Callable[[str], None],
        max_slice_s: float,
        budget_s: float,
        max_rounds: int = MAX_ROUNDS,
        clock: Callable[[], float] = time.perf_counter,
        what: str = "the real loader",
    ) -> None:
        self.candidates = list(candidates)
        self.what = what  # what the loop runs on, in messages
        self.items_per_step = items_per_step
        self.say = say
        self.max_slice_s = max_slice_s
        self.budget_s = budget_s
        self.max_rounds = max_rounds
        self.clock = clock
        self.slices: list[dict[str, Any]] = []
        self.rounds = 0
        self.stopped: str | None = None  # why the runs ended before their plan
        self.steps_handed = 0
        self._t0: float | None = None
        self._t_end: float | None = None

    def run(self, open_candidate: Opener, contenders: Callable[[dict[str, Any]], list[str]]) -> Iterator[Any]:
        """Yield batches to the user's loop, slice after slice (module docstring)."""
        self._t0 = self.clock()
        order = {c.key: i for i, c in enumerate(self.candidates)}
        labels = "; ".join(c.label for c in self.candidates)  # a label holds commas of its own
        self.say(
            f"job: your loop runs on {self.what} at {len(self.candidates)} setting(s) in turns "
            f"(at most {self.budget_s:g} s): {labels}"
        )
        try:
            for rnd in range(1, self.max_rounds + 1):
                if rnd == 1:
                    todo = list(self.candidates)
                else:
                    keys = contenders(self.record())  # most important first
                    todo = sorted((c for c in self.candidates if c.key in keys), key=lambda c: order[c.key])
                    if rnd % 2 == 0:
                        todo.reverse()
                    if self._estimate(todo) > self.budget_s - (self.clock() - self._t0):
                        # not all of them fit: the ones the decision hinges on most come first
                        todo = sorted(todo, key=lambda c: keys.index(c.key))
                if not todo:
                    break
                self.rounds = rnd
                for cand in todo:
                    if self.clock() - self._t0 >= self.budget_s:
                        self.stopped = f"the job runs' budget of {self.budget_s:g} s was spent (STAGEBENCH_JOB_S)"
                        return
                    yield from self._slice(cand, rnd, open_candidate)
        finally:
            self._t_end = self.clock()

    def _estimate(self, todo: list[Candidate]) -> float:
        """Seconds the slices of ``todo`` will take, from each one's earlier slices (start-up included)."""
        walls: dict[str, list[float]] = {}
        for s in self.slices:
            walls.setdefault(s["candidate"], []).append(s["wall_s"])
        everyone = [w for ws in walls.values() for w in ws]
        typical = sum(everyone) / len(everyone) if everyone else 0.0
        return sum(sum(walls[c.key]) / len(walls[c.key]) if c.key in walls else typical for c in todo)

    def _slice(self, cand: Candidate, rnd: int, open_candidate: Opener) -> Iterator[Any]:
        rec: dict[str, Any] = {
            "candidate": cand.key,
            "round": rnd,
            "status": "ok",
            "reason": "",
            "startup_s": None,
            "warmup_steps": 0,
            "waits": [],
            "bodies": [],
            "partial": False,
            "wall_s": 0.0,
        }
        self.slices.append(rec)
        warm = max(WARMUP_STEPS, cand.round_steps)
        group = group_steps(cand.round_steps)
        t_open = self.clock()
        try:
            with open_candidate(cand) as get_item:
                i, counted_s = 0, 0.0
                while True:
                    t0 = self.clock()
                    try:
                        item = get_item()
                    except EOFError:
                        rec["status"], rec["reason"] = "ended", "the loader or pipeline ended"
                        break
                    t1 = self.clock()
                    if i == 0:
                        rec["startup_s"] = t1 - t_open
                    self.steps_handed += 1
                    try:
                        yield item
                    except GeneratorExit:
                        rec["partial"] = True
                        self.stopped = f"your loop stopped after {self.steps_handed} steps of the job runs"
                        raise
                    t2 = self.clock()
                    i += 1
                    if i <= warm:
                        rec["warmup_steps"] += 1
                        continue
                    rec["waits"].append(t1 - t0)
                    rec["bodies"].append(t2 - t1)
                    counted_s += t2 - t0
                    n = len(rec["waits"])
                    whole = n % group == 0
                    if whole and n >= MIN_SLICE_STEPS and counted_s >= MIN_SLICE_S:
                        break
                    if counted_s >= self.max_slice_s and (whole or n < group):
                        break
                    if counted_s >= 2 * self.max_slice_s:  # a round that never completes: stop anyway
                        break
        except Exception as e:  # the loader raised or a worker died: this slice fails, the runs go on
            rec["status"], rec["reason"] = "failed", f"{type(e).__name__}: {e}"[:300]
            self.say(f"job: {cand.label} failed: {rec['reason']}")
        finally:
            rec["wall_s"] = self.clock() - t_open

    def record(self) -> dict[str, Any]:
        """What ran, as ``run.json["job"]`` stores it (per-step times to the microsecond)."""
        end = self._t_end if self._t_end is not None else self.clock()
        return {
            "items_per_step": self.items_per_step,
            "candidates": [c.as_meta() for c in self.candidates],
            "slices": [
                {
                    **{k: v for k, v in s.items() if k not in ("waits", "bodies")},
                    "waits": [round(x, 6) for x in s["waits"]],
                    "bodies": [round(x, 6) for x in s["bodies"]],
                }
                for s in self.slices
            ],
            "rounds": self.rounds,
            "max_rounds": self.max_rounds,
            "budget_s": self.budget_s,
            "max_slice_s": self.max_slice_s,
            "seconds": (end - self._t0) if self._t0 is not None else 0.0,
            "steps_handed": self.steps_handed,
            "stopped": self.stopped,
            "what": self.what,
        }
