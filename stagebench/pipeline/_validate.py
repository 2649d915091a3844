"""The diagnosis's whole-pipeline phase: the replay, the validation run and the run at the user's settings.

After the stages are measured alone and their settings chosen together, three whole pipelines run
over the cached source items (:mod:`stagebench.pipeline._wholerun` takes them in turns): the replay
with stand-ins (the prediction, :mod:`stagebench.pipeline._replay`), the real stages at the
recommended settings (the validation run: the truth the prediction is held to), and the real
stages at the user's own settings (what the recommendation is checked against). A phase of its
own, like :mod:`stagebench.pipeline._stages` before it: it needs the plan, the settings and
the first summary, and gives back four plain results.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stagebench._memory import describe
from stagebench._numbers import finite
from stagebench._settings import WHOLE_RUN_ROUNDS
from stagebench.analysis._verdicts import versus_yours_decision
from stagebench.core._speed import cpu_speed_ns
from stagebench.model._meta import CpuReadings
from stagebench.model._pipeline import KEPT, RUNNER_UP, JointReplays, WholeRun
from stagebench.model._stage import changed, keyed, own_choice
from stagebench.model._summary import Summary
from stagebench.pipeline._replay import StandIn, plan_stand_ins
from stagebench.pipeline._wholerun import SLICES, run_pipelines

__all__ = [
    "replay_and_validate",
    "replay_runner_up",
    "WholePipelines",
    "choices_of",
    "yours_of",
    "EXTRA_ROUNDS",
]

#: Rounds in turns of the recommended settings against yours beyond the first forth and back, while the
#: rule of :mod:`stagebench.model._evidence` cannot tell them apart (two rounds show only a large change),
#: up to ``WHOLE_RUN_ROUNDS`` in all. Each costs two slices of the validation window and their settles.
EXTRA_ROUNDS = WHOLE_RUN_ROUNDS - SLICES


def yours_of(plan: Any) -> dict[str, tuple[str, int]]:
    """Each pipe stage's own (executor, concurrency) in the user's config, by name (:func:`own_choice`)."""
    return {st.name: c for st in plan.stages if (c := own_choice(st.user_executor, st.user_concurrency, st.type))}


def choices_of(summary: Summary) -> dict[str, tuple[str, int]]:
    """Each stage's recommended (executor, concurrency), by name (its best point in a fallback summary)."""
    choices: dict[str, tuple[str, int]] = {}
    for st in summary.stages:
        rec = st.recommended or (st.best if summary.fallback else None)
        if rec is not None and rec.executor and finite(rec.concurrency):
            choices[st.name] = (str(rec.executor), int(rec.concurrency or 0))
    return choices


@dataclass(frozen=True)
class _WholeRuns:
    """The whole pipelines :func:`replay_and_validate` runs in turns, and the settings they run at."""

    runs: dict[str, dict[str, StandIn] | None]  # by name: the replay's stand-ins, or None for the real stages
    stand_ins: dict[str, StandIn]
    choices: dict[str, tuple[str, int]]  # the recommended settings
    yours: dict[str, tuple[str, int]]  # the user's own
    differs: bool  # whether the user's settings differ from the recommended ones
    validate: bool  # whether the real pipeline runs (``validate="on"``)
    warm: float
    window: float


@dataclass(frozen=True, slots=True)
class WholePipelines:
    """What the whole-pipeline phase gives back: one ``run.json`` entry each (``replay``, ``validation``,
    ``yours``), named so that the diagnosis cannot file one result under another's key."""

    replay: WholeRun
    """The replay with stand-ins (the prediction); its ``error`` where none could run."""
    validation: WholeRun | None
    """The real stages at the recommended settings; None: not run (``validate="off"``, or no replay)."""
    yours: WholeRun | None
    """The real stages at the user's settings (``same`` where those are the recommended ones); None: not run."""
    cpu_speed: CpuReadings
    """To merge into ``run.json["cpu_speed"]``: what each stage's stand-in was read at, and the speed around
    the validation run."""


def _stage_speeds(stage_speeds: dict[str, list[float]]) -> dict[str, float]:
    """Each stage's core speed for its stand-in: the median of the probes after its points."""
    return {name: statistics.median(v) for name, v in stage_speeds.items() if v}


def _warm_and_window(settings: Any) -> tuple[float, float]:
    """A whole run's warm-up and counting window (s). Warm once items have reached the sink for 0.5 s
    (_wholerun.WholePipelineRun.warm), pools included: a process pool starts its c workers together, on its
    first c calls, so the first item arrives once they have started. A window under 1 s (quick mode's
    replay) gets a warm-up as much shorter."""
    window = settings.validation_window_s
    return 0.5 * min(1.0, window), window


def replay_and_validate(
    plan: Any,
    settings: Any,
    source_items: list,
    summary: Summary,
    *,
    stage_speeds: dict[str, list[float]],
    items_per_sink_item: float,
    say: Callable[[str], None],
    log_error: Callable[[str, BaseException], None],
) -> WholePipelines:
    """The replay, the validation run and the user's own settings, taking turns.

    The replay (the prediction) and the validation run at the recommended settings; the real
    pipeline at the user's own settings next to them, so that the recommendation is checked
    against what the user has, not only against its own prediction. All with the same warm-up
    and counting time, interleaved so that all see the same moments of the machine. A failure is
    the result's ``error``. With ``validate="off"`` the replay runs alone: no real run, the
    validation and the user's run are None (not run, by request: no warning). Where the user's
    settings are the recommended ones, the user's run is ``{"same": True}``: one run is both.
    """
    speeds = _stage_speeds(stage_speeds)
    whole = _whole_runs(plan, settings, summary, plan_stand_ins(summary.stages, speeds, summary.cores))
    if not whole.runs:  # no stage could be stood in, and no validation run
        return WholePipelines(replay=_no_replay(), validation=None, yours=None, cpu_speed=CpuReadings(stage_ns=speeds))
    _say_whole_runs(whole, say)
    out, around = _run_whole(plan, settings, source_items, whole, items_per_sink_item, log_error)
    return WholePipelines(
        replay=_replay_result(out, whole.stand_ins, say),
        validation=_validation_result(out, say),
        yours=_yours_result(out, whole, settings, say),
        cpu_speed=CpuReadings(stage_ns=speeds, validation_ns=around),
    )


def replay_runner_up(
    plan: Any,
    settings: Any,
    source_items: list,
    pick: Summary,
    runner_up: Summary,
    *,
    stage_speeds: dict[str, list[float]],
    items_per_sink_item: float,
    say: Callable[[str], None],
    log_error: Callable[[str, BaseException], None],
) -> JointReplays:
    """The pipeline with stand-ins at the joint's cheaper pick and at its runner-up (each summary's
    recommended settings), in turns, with the replay's warm-up and window: which one the joint takes
    (:meth:`JointReplays.choose`). A replay that cannot run is its ``error``; the pick is then kept."""
    speeds = _stage_speeds(stage_speeds)
    runs: dict[str, dict[str, StandIn] | None] = {
        KEPT: plan_stand_ins(pick.stages, speeds, pick.cores),
        RUNNER_UP: plan_stand_ins(runner_up.stages, speeds, runner_up.cores),
    }
    executors = dict(pick.joint.runner_up or {}) if pick.joint is not None else {}
    if not all(runs.values()):  # a replay with no stand-in would be the real pipeline: nothing to settle it with
        none = keyed(WholeRun, qps=None, error="no stage could be stood in")
        return JointReplays(executors=executors, pick=none, runner_up=none, chosen=KEPT)
    warm, window = _warm_and_window(settings)
    now = choices_of(pick)
    moved = ", ".join(f"{k} on {v}" for k, v in executors.items() if k in now and now[k][0] != v)
    say(
        f"the bounds put a cheaper assignment of executors within reach of their best ({moved}): both replayed "
        f"with stand-ins, taking turns, {warm:g} s warm-up + {window:g} s of counting each, in slices"
    )
    try:
        out = run_pipelines(
            plan,
            source_items,
            now,
            runs,
            warmup_s=warm,
            window_s=window,
            timeout_s=settings.timeout_s,
            items_per_sink_item=items_per_sink_item,
            own_choices={RUNNER_UP: choices_of(runner_up)},
            precise=False,  # it acts only on a difference beyond the interval: no 20 arrivals a slice
        )
    except KeyboardInterrupt:
        raise
    except Exception as e:
        log_error("the joint's replays", e)
        out = {k: keyed(WholeRun, qps=None, error=describe(e)) for k in runs}
    mine = out.get(KEPT) or keyed(WholeRun, qps=None, error="not run")
    theirs = out.get(RUNNER_UP) or keyed(WholeRun, qps=None, error="not run")
    chosen = JointReplays.choose(mine, theirs)
    if mine.qps is not None and theirs.qps is not None:
        say(
            f"replays: {theirs.qps:,.1f} items/s at the bounds' best, {mine.qps:,.1f} at the cheaper pick: "
            + ("the best taken (faster beyond noise)" if chosen == RUNNER_UP else "the cheaper kept")
        )
    else:
        say(f"replays failed ({mine.error or theirs.error}): the cheaper pick kept")
    return JointReplays(executors=executors, pick=mine, runner_up=theirs, chosen=chosen)


def _whole_runs(plan: Any, settings: Any, summary: Summary, stand_ins: dict[str, StandIn]) -> _WholeRuns:
    """Which whole pipelines run: the replay where a stage could be stood in, the real stages where
    validation is on, and the user's settings beside them where they differ from the recommended ones."""
    choices = choices_of(summary)
    warm, window = _warm_and_window(settings)
    validate = settings.validate == "on"
    yours = yours_of(plan)
    differs = any(name in yours and yours[name] != c for name, c in choices.items())
    runs: dict[str, dict[str, StandIn] | None] = {}
    if stand_ins:
        runs["replay"] = stand_ins
    if validate:
        runs["validation"] = None  # the real stages
        if differs:
            runs["yours"] = None  # the real stages, at the user's settings
    return _WholeRuns(runs, stand_ins, choices, yours, differs, validate, warm, window)


def _say_whole_runs(whole: _WholeRuns, say: Callable[[str], None]) -> None:
    """Say what is about to run (``whole.runs``, not empty)."""
    stand_ins, warm, window = whole.stand_ins, whole.warm, whole.window
    if len(whole.runs) > 1:
        say(
            f"{' and '.join(whole.runs)}, taking turns: the pipeline "
            + (f"with stand-ins for {len(stand_ins)} stage(s) and the real one, " if stand_ins else "")
            + "at the recommended settings"
            + (" and at yours" if whole.differs else "")
            + f", {warm:g} s warm-up each + {window:g} s of counting each, in slices"
        )
    elif stand_ins:
        say(
            f"replay: the pipeline with stand-ins for {len(stand_ins)} stage(s), recommended settings, "
            f"{warm:g} s warm-up + {window:g} s window (no validation run: STAGEBENCH_VALIDATE=off)"
        )
    else:  # the validation run alone
        say(f"validation: the whole pipeline with the recommended settings, {warm:g} s warm-up + {window:g} s window")


def _run_whole(
    plan: Any,
    settings: Any,
    source_items: list,
    whole: _WholeRuns,
    items_per_sink_item: float,
    log_error: Callable[[str, BaseException], None],
) -> tuple[dict[str, WholeRun], tuple[float, ...] | None]:
    """Run ``whole.runs`` in turns (:func:`stagebench.pipeline._wholerun.run_pipelines`): each one's
    result by name, a failure each one's ``error``; and, with validation, the CPU speed before and after
    it (None without, or where the runs failed)."""
    before = cpu_speed_ns()
    around: tuple[float, ...] | None = None

    def more(rates: dict[str, list[float]]) -> bool:
        """Whether the recommended settings against yours still need rounds in turns (the rule is open)."""
        if "validation" not in rates or "yours" not in rates:
            return False
        d = versus_yours_decision(rates["validation"], rates["yours"], whole.choices, whole.yours)
        return d is not None and d.worth_more_rounds(WHOLE_RUN_ROUNDS)

    try:
        out = run_pipelines(
            plan,
            source_items,
            whole.choices,
            whole.runs,
            warmup_s=whole.warm,
            window_s=whole.window,
            timeout_s=settings.timeout_s,
            items_per_sink_item=items_per_sink_item,
            own_choices={"yours": {}},  # no choice: every stage keeps the user's settings
            more=more if "yours" in whole.runs else None,
            max_extra_rounds=EXTRA_ROUNDS,
        )
        if whole.validate:  # the speed the measured number was read at
            around = (round(before, 2), round(cpu_speed_ns(), 2))
    except KeyboardInterrupt:
        raise
    except Exception as e:
        log_error("replay and validation", e)
        out = {k: keyed(WholeRun, qps=None, error=describe(e)) for k in whole.runs}
    return out, around


def _no_replay() -> WholeRun:
    """The replay's result where no stage could be stood in."""
    return keyed(WholeRun, qps=None, error="no stage could be stood in (none measured)")


def _replay_result(out: dict[str, WholeRun], stand_ins: dict[str, StandIn], say: Callable[[str], None]) -> WholeRun:
    """The replay's result, with the stand-ins it ran with, and said."""
    if stand_ins:
        replay = changed(out["replay"], stand_ins=tuple(s.as_dict() for s in stand_ins.values()))
    else:
        replay = _no_replay()
    if replay.qps is not None:
        say(f"replay: {replay.qps:,.1f} items/s")
    elif stand_ins:
        say(f"replay failed: {replay.error}")
    return replay


def _validation_result(out: dict[str, WholeRun], say: Callable[[str], None]) -> WholeRun | None:
    """The validation run's result, said; None where it did not run."""
    validation = out.get("validation")
    if validation is not None and validation.qps is not None:
        say(
            f"validation: {validation.qps:,.1f} items/s ({validation.sink_qps:,.1f} sink items/s "
            f"at the sink; {validation.source_qps:,.1f} items/s drawn from the source)"
        )
    elif validation is not None:
        say(f"validation run failed: {validation.error}")
    return validation


def _yours_result(
    out: dict[str, WholeRun], whole: _WholeRuns, settings: Any, say: Callable[[str], None]
) -> WholeRun | None:
    """The run at the user's settings: ``same`` where they are the recommended ones, why it did not run
    where the real pipeline did not, else its result, said."""
    if not whole.differs:
        return keyed(WholeRun, same=True)
    if not whole.validate:  # said, so that the report does not read as if yours had been beaten
        why = "quick mode" if settings.quick == "on" else "STAGEBENCH_VALIDATE=off"
        return keyed(WholeRun, qps=None, not_run=f"{why}: the real pipeline was not run")
    if "yours" not in whole.runs:
        return None
    mine = out.get("yours") or keyed(WholeRun, qps=None, error="not run")
    if mine.qps is not None:
        say(f"your settings: {mine.qps:,.1f} items/s")
    else:
        say(f"the run at your settings failed: {mine.error}")
    return mine
