"""The pipeline's recommended settings, chosen together rather than stage by stage.

Each stage's own recommendation (:func:`stagebench.analysis._stage.analyze_stage`) is its best point
*alone*. In the pipeline the stages share the cores and the main process's GIL, and the slowest sets
the pace, so a stage's extra threads only compete with the stage that binds. So the recommendation is
chosen jointly, with the bounds of :mod:`._predict` over the points each stage was measured at:

1. **Executors.** Every assignment of each stage's measured executors, each stage at its fastest
   point on that executor, scored by the bounds' throughput (up to :data:`_EXHAUSTIVE` assignments;
   beyond that, one stage at a time switched while the score improves). Among those within
   :data:`TRUSTED` of the best: fewest stages on processes (memory, pickling, start-up), then the
   most stages on their own choice. The bounds leave out what the stages cost each other, so a small
   gain they promise is not evidence. Where the cheaper pick is more than 5% under the best, that best is
   the ``runner_up``: the diagnosis replays both in turns before its whole runs
   (:class:`~stagebench.model._pipeline.JointReplays`), and a second call takes the runner-up's executors
   where its replay was faster beyond noise (a GIL-bound stage on threads loses more to hand-offs than the
   GIL bound counts).
2. **Concurrency.** With the assignment's pace P known, each stage gets the smallest measured level
   whose capacity alone is at least P x (1 + :data:`SPARE`): a margin for what the stages cost each
   other (a thread waking from a wait queues for the GIL behind the others). A stage with no such
   level is (near) the one that binds and keeps its own rule. A waiting stage (labelled io-bound) on
   threads or async whose own level, in the user's config, keeps up with that margin keeps it: its
   threads mostly wait, so fewer of them free no core and no GIL time, and a cut there never
   measured faster in turns (on ``bench_advice``'s cpu_free a 1 ms wait cut from 4 threads to 1-2 ran
   the pipeline at 0.79-0.85x and "could not tell"): a change the comparison with the user's settings
   could not show is not one to make.
3. The bounds at the chosen settings explain the joint prediction; the diagnosis replays and runs the
   pipeline at these settings next to the user's (:mod:`stagebench.pipeline._diagnose`), and the
   advice is the number measured, never this search's score.

A stage with a decisive head-to-head has its process curve scaled by its ratio, as
:func:`._predict._lift_by_processes` does: the head-to-head ran in turns, the curves seconds apart.
Each changed stage keeps its alone recommendation under ``recommended_alone`` and says why it
differs in ``recommended["why"]``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from stagebench._numbers import SourceItems, finite, fmt_q, num
from stagebench._settings import DEMAND_HEADROOM
from stagebench.analysis._predict import pipeline_bounds, stage_load
from stagebench.core._paired import WITHIN_BEST
from stagebench.model._pipeline import Joint, JointReplays
from stagebench.model._stage import HeadToHead, StageEntry, StageSetting, changed, keyed

__all__ = ["recommend_jointly", "process_headroom"]

#: Capacity alone a stage keeps above the pipeline's pace when its workers are cut (module docstring).
SPARE = 0.5
#: An executor assignment scored within this share of the best counts as its equal (module docstring).
TRUSTED = 0.8
_EXHAUSTIVE = 4096  # executor assignments tried exhaustively (2^12 stages with two executors)
_SETTING = ("executor", "concurrency", "qps", "qps_low", "qps_high", "harness")  # a recommendation's figures


def _options(st: StageEntry) -> dict[str, list[dict]]:
    """Per executor, the stage's measured settings in its recommendation harness, lowest level first."""
    harness = st.harness
    h2h = st.head_to_head
    out: dict[str, list[dict]] = {}
    for ex, alt in st.alternatives.items():
        points = [p for p in st.curve(f"{harness}/{ex}") if finite(p.qps) and num(p.qps) > 0]
        if not points:
            continue
        scale = 1.0
        if ex == "process" and h2h is not None and h2h.decisive and finite(h2h.ratio):
            scale = _h2h_scale(st, h2h)
        out[ex] = [
            {
                "executor": ex,
                "concurrency": int(p.concurrency or 0),
                "qps": num(p.qps) * scale,
                "qps_low": float(p.qps_low or num(p.qps)) * scale,
                "qps_high": float(p.qps_high or num(p.qps)) * scale,
                "harness": harness,
                "cpu_s_per_item": p.cpu_s_per_item if finite(p.cpu_s_per_item) else None,
                "harness_gil_s_per_item": alt.harness_gil_s_per_item,
            }
            for p in sorted(points, key=lambda p: int(p.concurrency or 0))
        ]
    return out


def _h2h_scale(st: StageEntry, h2h: HeadToHead) -> float:
    """How much the process curve's point at the head-to-head's level is off the head-to-head's reading."""
    harness = st.harness
    t_level = h2h.thread.concurrency if h2h.thread is not None else None
    p_level = h2h.process.concurrency if h2h.process is not None else None
    t = next((p for p in st.curve(f"{harness}/thread") if p.concurrency == t_level), None)
    p = next((p for p in st.curve(f"{harness}/process") if p.concurrency == p_level), None)
    if t is None or p is None or not finite(t.qps) or not finite(p.qps) or not num(p.qps) > 0:
        return 1.0
    return num(t.qps) * num(h2h.ratio) / num(p.qps)


def _measured(stages: Sequence[StageEntry]) -> tuple[list[tuple[int, StageEntry]], dict[str, dict[str, list[dict]]]]:
    """The measured stages with a recommendation and a measured setting, each with its place in ``stages``,
    and every measured stage's options (:func:`_options`)."""
    measured = [(i, e) for i, e in enumerate(stages) if e.ok and e.recommended is not None]
    options = {e.name: _options(e) for _, e in measured}
    return [(i, e) for i, e in measured if options[e.name]], options


def _own(e: StageEntry) -> StageSetting:
    """The stage's own recommendation (the stages :func:`_measured` keeps have one)."""
    assert e.recommended is not None
    return e.recommended


def _fastest(settings: list[dict]) -> dict:
    return max(settings, key=lambda s: s["qps"])


def _own_rule(settings: list[dict]) -> dict:
    """The stage's own rule on one executor: the smallest level within 5% of its best."""
    best = _fastest(settings)["qps"]
    return next(s for s in settings if s["qps"] >= WITHIN_BEST * best)


def recommend_jointly(
    stages: list[StageEntry],
    *,
    cores: float,
    free_threaded: bool,
    fixed: float = 0.0,
    demand: float | None = None,
    ranks: int = 1,
    replays: JointReplays | None = None,
) -> Joint | None:
    """Choose every measured stage's (executor, concurrency) for the pipeline; update the stage entries.

    ``stages``: the ``summary.json`` stage entries (:func:`analyze_stage` plus name and
    ``items_per_input``), each changed one replaced by its copy: ``recommended`` becomes the joint choice, the
    stage's own choice moves to ``recommended_alone`` where they differ, and the per-item
    CPU and scheduling figures follow the chosen point. ``fixed``: SPDL's per-item cost
    paid once by the pipeline (:func:`stagebench.analysis._pipeline.pipeline_overhead`).

    Returns ``None`` with no measured stage, else a :class:`Joint`: ``pace`` (the bounds' throughput at the
    chosen executors, each at its fastest), ``qps`` (the bounds at the chosen settings),
    ``binding``, ``assignments`` (how many executor assignments were scored),
    ``exhaustive``, ``changed`` (stage names whose choice differs from their own) and
    ``text``.

    ``demand``: the training step's source items/s (``STAGEBENCH_TARGET_RATE``). Where it
    is below the pace, the stages are cut to what feeds the trainer with
    :data:`stagebench._settings.DEMAND_HEADROOM` to spare instead: the cheapest settings
    that keep up, which the validation run then measures against the demand.

    ``replays``: the diagnosis's replays of the pick and the runner-up (:class:`JointReplays`), where a
    first call left a ``runner_up`` (the bounds' best assignment, more than 5% over a cheaper pick): the
    runner-up's executors are taken where its replay was faster beyond noise, and the text says so.
    """
    measured, options = _measured(stages)
    ok = [e for _, e in measured]
    if not ok:
        return None

    def score(assign: tuple[str, ...]) -> float:
        loads = [stage_load(st, _fastest(options[st.name][ex]), fixed) for st, ex in zip(ok, assign)]
        return float(pipeline_bounds(loads, cores, free_threaded, fixed, ranks).qps)

    own = tuple(
        str(_own(st).executor) if _own(st).executor in options[st.name] else next(iter(options[st.name])) for st in ok
    )
    execs = [list(options[st.name]) for st in ok]
    exhaustive = math.prod(len(e) for e in execs) <= _EXHAUSTIVE
    if exhaustive:
        scored = {assign: score(assign) for assign in itertools.product(*execs)}
    else:  # one stage at a time, from the stages' own choices, while the score improves
        current = own
        scored = {current: score(current)}
        improved = True
        while improved:
            improved = False
            for i, alts in enumerate(execs):
                for ex in alts:
                    trial = current[:i] + (ex,) + current[i + 1 :]
                    if trial not in scored:
                        scored[trial] = score(trial)
                    if scored[trial] > scored[current] / WITHIN_BEST:
                        current, improved = trial, True
    top = max(scored.values())
    near = [a for a, q in scored.items() if q >= TRUSTED * top]
    cheaper = min(
        near,
        key=lambda a: (a.count("process"), sum(x != y for x, y in zip(a, own)), -scored[a]),
    )
    best = max(scored, key=lambda a: scored[a])
    # the bounds put the cheaper pick more than 5% under their best: only a replay of both can say whether
    # what they leave out (hand-offs, waits for the GIL) takes that back
    runner_up = best if cheaper != best and scored[cheaper] < WITHIN_BEST * top else None
    prefer = replays.prefer if replays is not None else None
    taken = tuple(prefer.get(st.name, "") for st in ok) if prefer else None
    pick = runner_up if runner_up is not None and taken == runner_up else cheaper
    pace = scored[pick]
    feeds = demand is not None and demand > 0 and demand * (1 + DEMAND_HEADROOM) < pace
    target = demand * (1 + DEMAND_HEADROOM) if feeds and demand is not None else pace
    need = target * (1 + SPARE)

    moved: list[str] = []
    waiting: list[str] = []  # waiting stages kept at the user's own level (_waiting_yours)
    loads = []
    for (i, e), ex in zip(measured, pick):
        k = e.items_per_input
        settings = options[e.name][ex]
        enough = next((s for s in settings if s["qps"] * k >= need), None)
        kept = _waiting_yours(e, settings, enough, need)
        chosen = kept or (enough if enough is not None else _own_rule(settings))
        if kept is not None:
            waiting.append(e.name)
        loads.append(stage_load(e, chosen, fixed))
        alone = _own(e)
        if (chosen["executor"], chosen["concurrency"]) == (alone.executor, alone.concurrency):
            continue
        moved.append(e.name)
        why = _why(e, chosen, alone, enough is not None, target, scored, pick, own, kept=kept is not None) + (
            f"; the trainer needs {fmt_q(float(demand or 0))} items/s, below the pipeline's pace" if feeds else ""
        )
        said = f"in the pipeline: {chosen['executor']} x {chosen['concurrency']} ({why})"
        stages[i] = changed(
            e,
            recommended_alone=e.recommended,
            recommended=keyed(StageSetting, **{k2: chosen[k2] for k2 in _SETTING}, why=why),
            cpu_s_per_item=chosen["cpu_s_per_item"],
            harness_gil_s_per_item=chosen["harness_gil_s_per_item"],
            # ceiling_qps stays: the no-op ceiling at the stage's own best setting (recommended_alone)
            evidence=changed(e.evidence, summary=(*e.evidence.summary, said)),
        )
    b = pipeline_bounds(loads, cores, free_threaded, fixed, ranks)
    binding = b.binding_words
    text = (
        f"settings chosen for the whole pipeline: {len(scored)} executor assignment(s) scored with the bounds"
        + ("" if exhaustive else " (one stage switched at a time: too many to try all)")
        + f"; the pace is {fmt_q(pace)} items/s (set by {binding}); each stage gets the fewest workers "
        f"that keep up with it with {SPARE:.0%} to spare"
        + (f"; set differently from their own best: {', '.join(moved)}" if moved else "; every stage as alone")
        + (f"; waiting stages that keep up at your own level keep it: {', '.join(waiting)}" if waiting else "")
        + (f"; cut to feed the trainer's {fmt_q(float(demand or 0))} items/s (+{DEMAND_HEADROOM:.0%})" if feeds else "")
        + _replayed(replays, runner_up, cheaper, ok)
    )
    return Joint(
        pace=pace,
        qps=float(b.qps),
        binding=b.binding,
        assignments=len(scored),
        exhaustive=exhaustive,
        changed=tuple(moved),
        for_demand=demand if feeds else None,
        runner_up=None if runner_up is None else {st.name: ex for st, ex in zip(ok, runner_up)},
        runner_up_pace=None if runner_up is None else scored[runner_up],
        text=text,
    )


def _waiting_yours(e: StageEntry, settings: list[dict], enough: dict | None, need: float) -> dict | None:
    """The user's own level of a waiting stage where it keeps up with ``need`` above the cut ``enough``
    (module docstring, 2), else None: on the same executor, not processes (each costs memory and start-up),
    measured, the stage labelled io-bound."""
    yours = e.user_choice
    if enough is None or yours is None or e.classification != "io-bound":
        return None
    ex, level = yours
    if ex == "process" or ex != enough["executor"] or level <= enough["concurrency"]:
        return None
    at = next((s for s in settings if s["concurrency"] == level), None)
    return at if at is not None and at["qps"] * e.items_per_input >= need else None


def _replayed(
    replays: JointReplays | None,
    runner_up: tuple[str, ...] | None,
    cheaper: tuple[str, ...],
    ok: list[StageEntry],
) -> str:
    """What the replays of the cheaper pick and the runner-up found, for the joint's text ("" where none ran)."""
    if runner_up is None:
        return ""
    moved = ", ".join(f"{st.name} on {ex} rather than {c}" for st, ex, c in zip(ok, runner_up, cheaper) if ex != c)
    mine, theirs = (replays.pick.rate, replays.runner_up.rate) if replays is not None else (None, None)
    if replays is None or mine is None or theirs is None:
        return f"; the bounds' best assignment ({moved}) was not replayed against the cheaper one"
    said = (
        "faster beyond noise: its executors are taken"
        if replays.prefer
        else "not faster beyond noise: the cheaper one is kept"
    )
    return (
        f"; the bounds' best assignment ({moved}) replayed at {theirs.text('items/s')} against the cheaper "
        f"one's {mine.text('items/s')}, in turns: {said}"
    )


def _why(
    st: StageEntry,
    chosen: dict,
    alone: StageSetting,
    keeps_up: bool,
    pace: float,
    scored: dict[tuple[str, ...], float],
    pick: tuple[str, ...],
    own: tuple[str, ...],
    *,
    kept: bool = False,
) -> str:
    """Why the joint choice differs from the stage's own, in one sentence (``kept``: the user's own level
    of a waiting stage, :func:`_waiting_yours`)."""
    src = SourceItems(st.items_per_input)
    parts = []
    if chosen["executor"] != alone.executor:
        with_own = scored.get(own)
        parts.append(
            f"{chosen['executor']} rather than {alone.executor}: the bounds give the pipeline "
            f"{fmt_q(scored[pick])} items/s this way"
            + (f" against {fmt_q(with_own)} with every stage on its own executor" if with_own else "")
        )
    if kept:
        parts.append(
            f"your {chosen['executor']} x {chosen['concurrency']} ({src.q(chosen['qps'])} items/s alone) keeps up "
            f"with the pipeline's pace of {fmt_q(pace)} items/s with {SPARE:.0%} to spare: kept, since its threads "
            "mostly wait and fewer of them would free no core"
        )
    elif keeps_up:
        parts.append(
            f"{chosen['executor']} x {chosen['concurrency']} ({src.q(chosen['qps'])} items/s alone) keeps up "
            f"with the pipeline's pace of {fmt_q(pace)} items/s with {SPARE:.0%} to spare"
        )
    else:
        parts.append(f"concurrency {chosen['concurrency']}, the smallest within 5% of {chosen['executor']}'s best")
    parts.append(f"alone it would be set to {alone.executor} x {alone.concurrency} ({src.q(num(alone.qps))} items/s)")
    return "; ".join(parts)


def process_headroom(
    stages: Sequence[StageEntry],
    pending: dict[str, list[int]],
    *,
    cores: float,
    free_threaded: bool,
    fixed: float = 0.0,
    ranks: int = 1,
) -> dict[str, dict]:
    """How much each stage in ``pending`` could raise the pipeline's bounds on processes, before they are measured.

    ``stages``: the stage entries analysed from the thread points so far (the
    ``summary.json`` entries); ``pending``: stage name -> the process levels still
    to measure. Each pending stage's processes are taken at their most optimistic:
    at level c, c workers each as fast as one thread alone (its lowest thread
    level's rate per thread), its least CPU per item of any thread level, no IPC and
    none of its own GIL time in the main process. The bounds' best pipeline (the
    score :func:`recommend_jointly` maximises: every executor assignment) is
    computed with the stage free to take processes and with it held on threads, in
    two worlds: the other pending stages at their optimistic processes, and all of
    them on threads. Returns name -> ``gain`` (the larger ratio of the two worlds:
    1.0 when processes for this stage cannot raise the pipeline's bounds at all),
    ``best`` and ``on_threads`` (that world's two figures) and ``binding`` (what
    binds there with the stage on threads). Real processes are no faster than
    these, so a stage whose gain is within the 5% the recommendation treats as
    equal (:data:`WITHIN_BEST`) cannot change the pipeline's settings by being
    measured on them. Empty when there are too many assignments to try them all.
    """
    measured, options = _measured(stages)
    ok = [e for _, e in measured]
    optimistic = {st.name: _optimistic_processes(pending[st.name], options[st.name]) for st in ok
                  if st.name in pending}  # fmt: skip
    optimistic = {k: v for k, v in optimistic.items() if v}
    names = [st.name for st in ok]
    if not optimistic or math.prod(len(options[n]) + (n in optimistic) for n in names) > _EXHAUSTIVE:
        return {}

    def best(free: set[str], held: str) -> tuple[float, str]:
        """The bounds' best pipeline with the ``free`` stages' optimistic processes allowed, ``held`` on threads."""
        choices = []
        for st in ok:
            n = st.name
            alts = [(ex, _fastest(opts)) for ex, opts in options[n].items()]
            if n in optimistic and n in free and n != held:
                alts.append(("process", _fastest(optimistic[n])))
            choices.append([stage_load(st, setting, fixed) for _, setting in alts])
        top, binding = -math.inf, ""
        for loads in itertools.product(*choices):
            b = pipeline_bounds(list(loads), cores, free_threaded, fixed, ranks)
            if b.qps > top:
                top = float(b.qps)
                binding = b.binding_words
        return top, binding

    out: dict[str, dict] = {}
    for n in optimistic:
        worst: dict | None = None
        for others in (set(optimistic), {n}):
            with_it, _ = best(others, held="")
            held, binding = best(others, held=n)
            gain = with_it / held if held > 0 else math.inf
            if worst is None or gain > worst["gain"]:
                worst = {"gain": gain, "best": with_it, "on_threads": held, "binding": binding}
        assert worst is not None
        out[n] = worst
    return out


def _optimistic_processes(levels: list[int], options: dict[str, list[dict]]) -> list[dict]:
    """The stage's processes at their best imaginable (:func:`process_headroom`), one setting per level."""
    threads = options.get("thread") or []
    if not threads or not levels:
        return []
    low = threads[0]
    per_worker = low["qps"] / low["concurrency"]
    cpus = [t["cpu_s_per_item"] for t in threads if t["cpu_s_per_item"] is not None]
    return [
        {
            **low,
            "executor": "process",
            "concurrency": c,
            "qps": per_worker * c,
            "cpu_s_per_item": min(cpus) if cpus else None,
            # the thread executor's own cost in the main process: no pickling, no result queue
            "harness_gil_s_per_item": low.get("harness_gil_s_per_item"),
        }
        for c in sorted(levels)
    ]
