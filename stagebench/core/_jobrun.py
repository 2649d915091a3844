"""Job runs: the user's own training loop on the real loader or pipeline, at each candidate setting, in turns.

The user's question is what their training *job* does: the loader (capacity I) and the training
step (demand T) on one host. Its throughput is at most min(I, T), and less where the two compete
for the cores, where loading is serial with the step (``num_workers=0`` adds the load to every
step), or where the copy to the device waits on pageable memory. None of that shows in a loader
measured alone, so each setting the advice may name is run with the user's loop: :class:`JobRuns`
hands the loop the real loader's (or pipeline's) batches at each candidate in turn, and times each
step's wait for its batch (the data wait) and the loop body after it.

One *slice* is one candidate's turn:

1. Open (first turn only): build the loader, start its workers. Not counted; the time to the first
   batch is kept. With ``keep_open`` (the default where the memory allows it) the loader then stays
   open between its turns, suspended: its workers fill their queues and idle, and the next turn
   drains what they queued (:class:`Feed`) instead of paying their start-up again. A slow step
   (0.5 s and more) would otherwise pay a worker start-up of seconds at every slice.
2. Warm-up: ``max(WARMUP_STEPS, round_steps)`` steps on a fresh loader (workers start together and
   deliver their first batches in a burst, which the loop drains faster than the loader's pace);
   ``max(RESUMED_WARMUP_STEPS, round_steps)`` on a resumed one, whose queue was drained.
3. Counted: whole groups of steps (:func:`group_steps`: whole rounds of the workers, since a DataLoader
   delivers in order, one batch per worker in turn; a window that ends inside a round would count a
   burst, not the pace), at least :data:`MIN_SLICE_STEPS` steps and :data:`MIN_SLICE_S` seconds, or
   one group once :data:`SLOW_SLICE_S` are counted (slow steps), at most ``max_slice_s``.

Slices take turns, round after round (docs/method.md#rounds-in-turns). Round 1 runs every candidate in
priority order (the user's own first, then what the isolated sweep picked: a loop that stops early has
run those); later rounds run what the decision still hinges on (``contenders``, from the analysis),
until it settles or ``budget_s`` is spent. A loop that stops (``break``, an exception) ends the runs
where they are: what was measured is kept, and :meth:`JobRuns.record` says what did not run.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, ExitStack
from dataclasses import KW_ONLY, dataclass, field, fields
from typing import Any

from stagebench.core._rounds import in_turns
from stagebench.core._steps import WARMUP_STEPS
from stagebench.model._evidence import MAX_LOOKS
from stagebench.model._job import JobCandidate, JobRecord, JobSkipped, JobSlice
from stagebench.model._rate import Rate

__all__ = [
    "Candidate",
    "JobSetting",
    "Feed",
    "JobRuns",
    "Ladder",
    "MIN_SLICE_STEPS",
    "MIN_SLICE_S",
    "GROUP_MIN_STEPS",
    "MAX_ROUNDS",
    "RESUMED_WARMUP_STEPS",
    "drain_queued",
    "group_steps",
]

#: Fewest counted steps of a slice: two groups of four (the interval needs two groups per slice).
MIN_SLICE_STEPS = 8
#: Shortest counted window of a slice, seconds: a loader delivers in bursts (rounds of its workers, a
#: pipeline's batches), and a slice of a few of them reads them, not the pace: shorter slices give
#: round-to-round ratios that spread far more.
MIN_SLICE_S = 1.0
#: A slice of slow steps may end after one group once it has counted this long: the decision reads
#: the rounds' ratios, and more rounds of a 1 s step tell more than longer slices of it.
SLOW_SLICE_S = 3.0
#: Fewest steps in one batch-mean group (whole rounds of the workers above this).
GROUP_MIN_STEPS = 4
#: Most rounds of slices; the budget (STAGEBENCH_JOB_S) ends them first, or the decision settling. The
#: rule's per-look confidence holds over this many looks.
MAX_ROUNDS = MAX_LOOKS
#: Warm-up steps of a resumed loader's turn, its queue drained: the workers are busy on fresh batches.
RESUMED_WARMUP_STEPS = 2


def group_steps(round_steps: int) -> int:
    """Steps per batch-mean group: whole rounds of the workers, at least :data:`GROUP_MIN_STEPS`."""
    r = max(1, int(round_steps))
    return r * math.ceil(GROUP_MIN_STEPS / r)


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSetting:
    """A setting the job runs may try, of either kind: what a kind offers
    (:class:`stagebench.analysis._ladder.Rung`) and what runs (:class:`Candidate`) both are."""

    key: str
    """Stable identifier (the setting, compactly)."""
    label: str
    """The setting as the user writes it (``num_workers=4, prefetch_factor=2``)."""
    settings: Mapping[str, Any]
    """The setting, JSON-able: loader knobs, or stage name -> [executor, concurrency]."""
    cost: tuple[float, ...]
    """What it costs, compared in order: workers and threads first, then the rest (memory)."""
    round_steps: int = 1
    """Batches per round of its workers (a DataLoader's num_workers; 1 where delivery has no rounds)."""

    def setting(self) -> dict[str, Any]:
        """Its :class:`JobSetting` fields, to build another kind of setting from it."""
        return {f.name: getattr(self, f.name) for f in fields(JobSetting)}


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate(JobSetting):
    """One setting to run the user's loop with."""

    origin: tuple[str, ...]
    """Why it is a candidate: ``yours``, ``feeds``, ``above``, ``best``, ``pinned`` (the analysis words them)."""
    alone: Rate | None = None
    """The loader or pipeline alone at this setting, where measured."""
    alone_as: str | None = None
    """The setting the alone figure was measured at, where it differs in words."""

    def as_record(self) -> JobCandidate:
        """The candidate as the job's record holds it."""
        return JobCandidate(
            **{**self.setting(), "settings": dict(self.settings)},
            origin=self.origin,
            group_steps=group_steps(self.round_steps),
            alone=self.alone,
            alone_as=self.alone_as if self.alone is not None else None,
        )


@dataclass(frozen=True, slots=True)
class Ladder:
    """The settings to run with the user's loop: those to run, most important first; those the isolated
    sweep already rules out (``label`` and ``why``, said in the verdict); and whether the loaders may stay
    open between their turns (their memory fits the host together)."""

    run: list[Candidate]
    skipped: list[JobSkipped] = field(default_factory=list)
    keep_open: bool = True


@dataclass(frozen=True, slots=True)
class Feed:
    """An opened candidate: ``get()`` returns its next batch (EOFError: no more). Where the loader is kept
    open between its turns: ``drain()`` as its turn comes again (it takes what the loader queued while
    waiting, and returns how many), ``pause()`` as its turn ends (a pipeline closes its source and empties,
    so that its next turn starts from a known state)."""

    get: Callable[[], Any]
    drain: Callable[[], int] | None = None
    pause: Callable[[], int] | None = None


#: A queued item comes within this; one slower than it was being made (the queue is empty).
DRAIN_FAST_S = 0.005
#: The most a drain by timing takes (a loader faster than DRAIN_FAST_S a batch never looks empty).
DRAIN_MAX_S = 0.5


def drain_queued(
    get: Callable[[], Any],
    *,
    count: int | None = None,
    fast_s: float = DRAIN_FAST_S,
    max_s: float = DRAIN_MAX_S,
    clock: Callable[[], float] = time.perf_counter,
) -> int:
    """Take what a suspended loader queued while it waited for its turn; returns how many items.

    ``count``: the queue's depth where the loader's structure gives it (a DataLoader keeps
    ``num_workers x prefetch_factor`` batches in flight). Otherwise items are taken while each comes
    within ``fast_s`` (it was queued, not made), for at most ``max_s``. An ended loader ends the drain.
    """
    n = 0
    t_end = clock() + max_s
    try:
        while count is None or n < count:
            t = clock()
            get()
            n += 1
            if count is None and (clock() - t > fast_s or clock() > t_end):
                break
    except EOFError:
        pass
    return n


#: Opens a candidate: a context manager giving its :class:`Feed` (or a bare ``get`` function).
Opener = Callable[[Candidate], AbstractContextManager[Any]]


def _load_avg() -> float | None:
    """The host's 1-min load average (runnable tasks, ours included): what a busy host looked like."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def _cores() -> int:
    """The cores the host's load average is read against: the process's affinity mask, not a CPU quota's
    share of them (the load counts the host's runnable tasks, whatever group they are in)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


@dataclass(eq=False)
class JobRuns:
    """Runs the user's loop on each candidate in turns; :meth:`record` is ``run.json["job"]``."""

    candidates: list[Candidate]
    _: KW_ONLY
    items_per_step: float
    say: Callable[[str], None]
    max_slice_s: float
    budget_s: float
    max_rounds: int = MAX_ROUNDS
    clock: Callable[[], float] = time.perf_counter
    what: str = "the real loader"  # what the loop runs on, in messages
    keep_open: bool = True
    skipped: list[JobSkipped] = field(default_factory=list)  # ruled out by the isolated sweep
    slices: list[JobSlice] = field(default_factory=list, init=False)
    rounds: int = field(default=0, init=False)
    settled: bool = field(default=False, init=False)
    stopped: str | None = field(default=None, init=False)  # why the runs ended before the decision settled
    steps_handed: int = field(default=0, init=False)
    load: list[float | None] = field(default_factory=list, init=False)  # 1-min load average at start and end
    _t0: float | None = field(default=None, init=False)
    _t_end: float | None = field(default=None, init=False)
    _open: dict[str, Feed] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.candidates = list(self.candidates)  # the caller's list stays as it was
        self.skipped = list(self.skipped)

    def run(
        self,
        open_candidate: Opener,
        contenders: Callable[[JobRecord], list[str]],
        futile: Callable[[JobRecord, float], str | None] | None = None,
    ) -> Iterator[Any]:
        """Yield batches to the user's loop, slice after slice (module docstring). ``futile(record,
        seconds_left)``: why more rounds within the time left cannot settle the decision (the runs stop
        there), or None."""
        t0 = self._t0 = self.clock()
        self.load = [_load_avg()]
        labels = "; ".join(c.label for c in self.candidates)  # a label holds commas of its own
        self.say(
            f"job: your loop runs on {self.what} at {len(self.candidates)} setting(s) in turns, until the "
            f"comparisons settle (at most {self.budget_s:.0f} s): {labels}"
        )
        keys: list[str] = []  # what the decision hinges on, most important first

        def settings(i: int) -> list[Candidate]:  # none once settled or futile
            if i == 0:
                return self.candidates
            keys[:] = contenders(self.record())
            if not keys:
                self.settled = True
                return []
            if futile is not None and (why := futile(self.record(), self.budget_s - (self.clock() - t0))):
                self.stopped = why
                return []
            return [c for c in self.candidates if c.key in keys]  # in priority order

        with ExitStack() as held:
            try:
                for rnd, todo in in_turns(settings, self.max_rounds, start=1):
                    if rnd > 1 and self._estimate(todo) > self.budget_s - (self.clock() - self._t0):
                        # not all of them fit: the ones the decision hinges on most come first
                        todo = sorted(todo, key=lambda c: keys.index(c.key))
                    self.rounds = rnd
                    for cand in todo:
                        if self.clock() - self._t0 >= self.budget_s:
                            self.stopped = (
                                f"the job runs' budget of {self.budget_s:.0f} s was spent before the comparisons "
                                "settled (STAGEBENCH_JOB_S)"
                            )
                            return
                        yield from self._slice(cand, rnd, open_candidate, held)
                if not self.settled and self.stopped is None:  # all max_rounds ran
                    if contenders(self.record()):
                        self.stopped = f"the job runs stopped after {self.max_rounds} rounds, not settled"
                    else:
                        self.settled = True
            finally:
                self._t_end = self.clock()
                self.load.append(_load_avg())

    def _estimate(self, todo: list[Candidate]) -> float:
        """Seconds the slices of ``todo`` will take, from each one's latest slice (start-up included only
        where the loader is opened afresh for each)."""
        walls = {str(s.candidate): s.wall_s for s in self.slices}
        everyone = list(walls.values())
        typical = sum(everyone) / len(everyone) if everyone else 0.0
        return sum(walls.get(c.key, typical) for c in todo)

    def _feed(self, cand: Candidate, open_candidate: Opener, held: ExitStack) -> tuple[Feed, bool]:
        """The candidate's feed and whether it was resumed (opened in an earlier turn and kept open)."""
        if cand.key in self._open:
            return self._open[cand.key], True
        got = held.enter_context(open_candidate(cand))
        feed = got if isinstance(got, Feed) else Feed(get=got)
        if self.keep_open:
            self._open[cand.key] = feed
        return feed, False

    def _slice(self, cand: Candidate, rnd: int, open_candidate: Opener, held: ExitStack) -> Iterator[Any]:
        at = len(self.slices)
        self.slices.append(JobSlice(cand.key, rnd))  # the slice as it stands: written in full as it ends
        status, reason, startup_s, resumed, drained, partial, emptied = "ok", "", None, False, 0, False, None
        i = warm = 0  # steps handed, of which the first ``warm`` warm the loader up
        waits: list[float] = []
        bodies: list[float] = []
        group = group_steps(cand.round_steps)
        t_open = self.clock()
        with ExitStack() as own:  # a loader opened for this slice alone closes after it
            try:
                feed, resumed = self._feed(cand, open_candidate, held if self.keep_open else own)
                if resumed and feed.drain is not None:
                    drained = feed.drain()
                # a resumed loader whose queue was drained: its workers are at work; one emptied while it
                # waited (a pipeline) refills from nothing, as a fresh one does
                light = resumed and feed.pause is None
                warm = max(RESUMED_WARMUP_STEPS if light else WARMUP_STEPS, cand.round_steps)
                counted_s = 0.0
                while True:
                    t0 = self.clock()
                    try:
                        item = feed.get()
                    except EOFError:
                        status, reason = "ended", "the loader or pipeline ended"
                        break
                    t1 = self.clock()
                    if i == 0 and not resumed:
                        startup_s = t1 - t_open
                    self.steps_handed += 1
                    try:
                        yield item
                    except GeneratorExit:
                        partial = True
                        self.stopped = f"your loop stopped after {self.steps_handed} steps of the job runs"
                        raise
                    t2 = self.clock()
                    i += 1
                    if i <= warm:
                        continue
                    waits.append(t1 - t0)
                    bodies.append(t2 - t1)
                    counted_s += t2 - t0
                    n = len(waits)
                    whole = n % group == 0
                    if whole and n >= MIN_SLICE_STEPS and counted_s >= MIN_SLICE_S:
                        break
                    if whole and counted_s >= SLOW_SLICE_S:
                        break
                    if counted_s >= self.max_slice_s and (whole or n < group):
                        break
                    if counted_s >= 2 * self.max_slice_s:  # a round that never completes: stop anyway
                        break
                if self.keep_open and feed.pause is not None:
                    emptied = feed.pause()
            except Exception as e:  # the loader raised or a worker died: this slice fails, the runs go on
                status, reason = "failed", f"{type(e).__name__}: {e}"[:300]
                self._open.pop(cand.key, None)  # not resumed after a failure: opened afresh next time
                self.say(f"job: {cand.label} failed: {reason}")
            finally:  # per-step times to the microsecond
                self.slices[at] = JobSlice(
                    candidate=cand.key,
                    round=rnd,
                    status=status,
                    reason=reason,
                    startup_s=startup_s,
                    resumed=resumed,
                    drained=drained,
                    warmup_steps=min(i, warm),
                    partial=partial,
                    wall_s=self.clock() - t_open,
                    emptied=emptied,
                    waits=tuple(round(x, 6) for x in waits),
                    bodies=tuple(round(x, 6) for x in bodies),
                )

    def record(self) -> JobRecord:
        """What ran, as ``run.json["job"]`` stores it (per-step times to the microsecond)."""
        end = self._t_end if self._t_end is not None else self.clock()
        return JobRecord(
            items_per_step=self.items_per_step,
            candidates=tuple(c.as_record() for c in self.candidates),
            skipped=tuple(self.skipped),
            slices=tuple(self.slices),
            rounds=self.rounds,
            max_rounds=self.max_rounds,
            budget_s=self.budget_s,
            max_slice_s=self.max_slice_s,
            keep_open=self.keep_open,
            settled=self.settled,
            seconds=(end - self._t0) if self._t0 is not None else 0.0,
            steps_handed=self.steps_handed,
            stopped=self.stopped,
            what=self.what,
            load_avg=tuple(self.load),
            cores=_cores(),
        )
