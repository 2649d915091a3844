"""Whole-pipeline throughput from the isolated stages, with the GIL and the cores shared.

Stages measured alone each had the machine to themselves. Together they share it, so the pipeline
(in source items per second) is bounded by

(a) **each stage's capacity** at its recommended setting,
(b) **the cores**: ``cores / Σ CPU seconds per item`` over all stages,
(c) **the GIL**: ``1 / Σ GIL-held seconds per item`` over the stages in the main process (thread and
    async executors), plus the scheduling each stage costs the main process (its harness's GIL
    time, from its no-op ceiling). SPDL's one-stage no-op ceiling includes the source, sink and
    consumer, which a k-stage pipeline pays once: that fixed part (from no-op pipelines of one and
    three stages) is charged once, each stage only its increment.

The GIL term matters because stages that each run fast alone can still share one GIL. The bounds
are the explanation; the number is the replay's when there is one (:func:`apply_replay`,
:mod:`stagebench.pipeline._replay`), because the bounds leave out what the stages cost each other.
Without a replay the prediction is the smallest bound.

Stages that follow a batching step see fewer inputs than the source yields: ``items_per_input``
(source items per stage input) converts every per-input quantity to per-source-item.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from stagebench._numbers import SourceItems, finite, fmt_ms_each, fmt_q, num_or_none
from stagebench.model._pipeline import Prediction, StageChoice, WholeRun
from stagebench.model._stage import HeadToHead, StageEntry, StageSetting, changed, keyed

__all__ = ["predict_pipeline", "apply_replay", "stage_load", "pipeline_bounds", "Bounds", "StageLoad"]

_MAIN_PROCESS = ("thread", "async")


def _names(xs: list[str]) -> str:
    return xs[0] if len(xs) == 1 else ", ".join(xs[:-1]) + " and " + xs[-1]


def _shares(loads: list[StageLoad], times: Sequence[str]) -> str:
    """Each stage with its time per item, as formatted (in the sentence's one unit)."""
    return ", ".join(f"{d.stage} {t}" for d, t in zip(loads, times))


@dataclass(frozen=True, slots=True)
class StageLoad:
    """One stage's per-source-item demands at one setting (:func:`stage_load`): what the bounds add up,
    and what ``summary["prediction"]["stages"]`` lists (:meth:`to_json`, its fields in order)."""

    stage: str
    executor: str
    concurrency: int
    capacity: float
    """Source items/s the stage delivers alone at this setting."""
    cpu_s_per_item: float | None
    gil_s_per_item: float
    """The main process's GIL per item: the stage's own (on threads or the event loop) and its harness's."""
    harness_gil_s_per_item: float
    own_gil_known: bool
    spdl: bool
    """Measured inside SPDL: SPDL's fixed per-item cost was taken out of its figures."""
    items_per_call: float = 1.0
    """Source items one call of the stage stands for (an aggregate's group): what the items it hands on
    are worth. Not listed in the prediction (the stage entry's ``items_per_input`` is)."""

    def to_json(self) -> dict[str, Any]:
        """The load as the prediction lists it."""
        d = dataclasses.asdict(self)
        del d["items_per_call"]
        return d


def stage_load(st: StageEntry, setting: dict, fixed: float = 0.0) -> StageLoad:
    """Per-source-item demands of one stage (``st``) at one ``setting`` (a recommended or alternative
    setting's figures), as a :class:`StageLoad`.

    ``fixed``: SPDL's per-item cost that the whole pipeline pays once (source,
    sink, consumer); it is inside every spdl-harness measurement of the stage,
    so it is taken out here and charged once by :func:`_bounds`.
    """
    k = st.items_per_input
    ex = setting["executor"]
    cpu = setting.get("cpu_s_per_item")
    own_gil = st.gil_s_per_item
    harness_gil = setting.get("harness_gil_s_per_item") or 0.0
    spdl = (setting.get("harness") or st.harness) == "spdl"
    if spdl and fixed > 0:
        harness_gil = max(0.0, harness_gil - fixed)
        if cpu is not None and finite(cpu):
            cpu = max(0.0, cpu - fixed)
    if ex in _MAIN_PROCESS:
        gil = ((own_gil or 0.0) + harness_gil) / k
    else:
        gil = harness_gil / k
    return StageLoad(
        stage=st.name,
        executor=ex,
        concurrency=setting["concurrency"],
        capacity=setting["qps"] * k,
        cpu_s_per_item=cpu / k if cpu is not None and finite(cpu) else None,
        gil_s_per_item=gil,
        harness_gil_s_per_item=harness_gil / k,
        own_gil_known=own_gil is not None or ex not in _MAIN_PROCESS,
        spdl=spdl,
        items_per_call=k,
    )


@dataclass(frozen=True, slots=True)
class Bounds:
    """What a pipeline of stage loads can deliver (:func:`pipeline_bounds`), in source items/s."""

    qps: float
    """The lowest of the three bounds: what the pipeline is predicted to deliver."""
    binding: str
    """Which bound is the lowest: ``"stage"``, ``"gil"`` or ``"cores"``."""
    stage: float
    """The slowest stage's capacity."""
    cores: float
    """The cores over the CPU one item needs (inf where it needs none)."""
    gil: float
    """The GILs over the GIL time one item needs (inf where it needs none, or without a GIL)."""
    cap_stage: str
    """The slowest stage."""
    cpu_sum: float
    gil_sum: float
    fixed: float
    """SPDL's per-item cost, charged once per source item (0 where no stage was measured in SPDL):
    :func:`pipeline_bounds`."""

    @property
    def binding_words(self) -> str:
        """What binds, in words: "decode's capacity", "the GIL", "the cores"."""
        if self.binding == "stage":
            return f"{self.cap_stage}'s capacity"
        return {"gil": "the GIL", "cores": "the cores"}[self.binding]


def pipeline_bounds(
    loads: list[StageLoad], cores: float, free_threaded: bool, fixed: float = 0.0, ranks: int = 1
) -> Bounds:
    """The bounds of a pipeline of ``loads`` (:func:`stage_load`) on ``cores`` (``free_threaded``: no GIL;
    ``fixed``: SPDL's per-item cost, charged once): its slowest stage, the cores, the GIL.

    ``ranks``: the host's ranks, each running the pipeline in its own process (a ranked diagnosis's
    figures are the host's): each has a GIL of its own, so the GIL bound is theirs together."""
    cap = min(loads, key=lambda d: d.capacity)
    # ``fixed`` is measured on a no-op pipeline that hands the sink and the consumer every source item.
    # After an aggregate they see one item per group: the source's part is paid per source item, theirs
    # per group, and the split is not measured. ``fixed / k`` (k: source items per item the sink gets)
    # is the least the pipeline can pay, so the GIL and cores bounds stay upper limits.
    once = fixed / max(1.0, loads[-1].items_per_call) if any(d.spdl for d in loads) else 0.0
    cpu_sum = sum(d.cpu_s_per_item for d in loads if d.cpu_s_per_item is not None) + once
    gil_sum = sum(d.gil_s_per_item for d in loads) + once
    b_stage = cap.capacity
    b_cores = cores / cpu_sum if cpu_sum > 0 else math.inf
    b_gil = ranks / gil_sum if gil_sum > 0 and not free_threaded else math.inf
    bounds = {"stage": b_stage, "cores": b_cores, "gil": b_gil}
    binding = min(bounds, key=lambda k: (bounds[k], ("stage", "gil", "cores").index(k)))
    return Bounds(
        qps=bounds[binding],
        binding=binding,
        stage=b_stage,
        cores=b_cores,
        gil=b_gil,
        cap_stage=cap.stage,
        cpu_sum=cpu_sum,
        gil_sum=gil_sum,
        fixed=once,
    )


def _setting(st: StageEntry, executor: str | None = None) -> dict | None:
    """The stage's recommended setting (``executor`` None) or its best on ``executor``, as a load reads it."""
    if executor is None:
        rec = st.recommended
        if rec is None:
            return None
        alt = st.alternative(str(rec.executor))
        # the entry's own figure where it has the key (None included), else the alternative's
        harness_gil = (
            st.harness_gil_s_per_item
            if "harness_gil_s_per_item" in st.keys
            else (alt.harness_gil_s_per_item if alt is not None else None)
        )
        return {**rec.to_json(), "cpu_s_per_item": st.cpu_s_per_item, "harness_gil_s_per_item": harness_gil}
    alt = st.alternative(executor)
    return alt.to_json() if alt is not None else None


def predict_pipeline(
    stage_summaries: Sequence[StageEntry],
    *,
    cores: float,
    free_threaded: bool = False,
    overhead: dict | None = None,
    ranks: int = 1,
    cores_bound: str = "",
) -> Prediction:
    """Predict the pipeline's throughput from per-stage summaries (:func:`analyze_stage` entries).

    Returns ``qps`` (source items/s), ``binding`` (``"stage" | "cores" |
    "gil"``), ``bottleneck`` (the stage that binds, or the largest consumer of
    the binding resource), ``explanation`` (plain words, with what would lift
    the bound), ``bounds`` (``stages``, ``cores``, ``gil``; ``None`` for a
    bound that does not apply), ``naive_qps`` (the minimum of the stage
    capacities), ``settings`` and ``stages`` (each stage's per-item demands).
    Stages that were not measured are left out and listed in ``missing``.

    ``overhead``: SPDL's ``fixed_s_per_item`` (what the pipeline pays once per
    item: source, sink, consumer) from :func:`stagebench.analysis._pipeline.pipeline_overhead`.
    It is taken out of each spdl-measured stage's cost and charged once. Without
    it (older runs) each stage is charged its whole one-stage cost, which
    over-counts the fixed part for every stage after the first: the GIL and
    cores bounds are then pessimistic, and ``caveat`` says so.

    ``cores_bound``: where a quota or an allocation sets ``cores``, in words; the cores bound names it.
    """
    if not cores > 0:  # a quota can give less than one CPU
        raise ValueError(f"cores must be > 0, got {cores}")
    fixed = float((overhead or {}).get("fixed_s_per_item") or 0.0)
    entries = list(stage_summaries)
    loads, missing, settings = _measured(entries, fixed)
    out = _unpredicted(settings, loads, missing)
    if not loads:
        return changed(out, explanation="no stage was measured, so nothing can be predicted")

    b = pipeline_bounds(loads, cores, free_threaded, fixed, ranks)
    out = _record_bounds(out, b, overhead)
    p = _Pipeline(
        entries=entries,
        by_name={st.name: st for st in entries},
        loads=loads,
        b=b,
        cores=cores,
        free_threaded=free_threaded,
        fixed=fixed,
        ranks=ranks,
        cores_bound=cores_bound,
    )
    if b.binding == "gil":
        out, parts = _gil_binds(p, out)
    elif b.binding == "cores":
        out, parts = _cores_bind(p, out)
    else:
        out, parts = _stage_binds(p, out)
    bound_key = "stages" if b.binding == "stage" else b.binding
    others = {k: v for k, v in out.bounds.items() if v is not None and k != bound_key}
    if others:
        parts.append("other bounds: " + ", ".join(f"{k} {fmt_q(v)}" for k, v in others.items()))
    if missing:
        parts.append(f"not counted (not measured): {_names(missing)}")
    caveat = _caveat(loads, settings, overhead)
    if caveat:
        parts.append(caveat)
    return changed(out, caveat=caveat, explanation="; ".join(parts))


def _measured(entries: list[StageEntry], fixed: float) -> tuple[list[StageLoad], list[str], list[StageChoice]]:
    """``(loads, missing, settings)``: the measured stages' demands at their recommended settings, the
    names of the stages left out (not measured), and the settings the demands were read at."""
    loads: list[StageLoad] = []
    missing: list[str] = []
    settings: list[StageChoice] = []
    for st in entries:
        s = _setting(st) if st.ok else None
        if s is None:
            missing.append(st.name if "name" in st.keys else "?")
            continue
        loads.append(stage_load(st, s, fixed))
        settings.append(
            StageChoice(stage=st.name, executor=s["executor"], concurrency=s["concurrency"], harness=s.get("harness"))
        )
    return loads, missing, settings


def _unpredicted(settings: list[StageChoice], loads: list[StageLoad], missing: list[str]) -> Prediction:
    """The prediction, none predicted yet: every key in the order the prediction lists them."""
    return keyed(
        Prediction,
        qps=None,
        binding=None,
        bottleneck=None,
        explanation="",
        unit="source items/s",
        bounds={"stages": None, "cores": None, "gil": None},
        naive_qps=None,
        settings=tuple(settings),
        stages=tuple(d.to_json() for d in loads),
        missing=tuple(missing),
        lift=None,
        caveat=None,
        fixed_s_per_item=None,
        method="bounds",
        bounds_qps=None,
        replay=None,
    )


def _record_bounds(out: Prediction, b: Bounds, overhead: dict | None) -> Prediction:
    """``out`` with the bounds' number, what binds and each bound (``None`` for one that does not apply)."""
    return changed(
        out,
        # the measured per-item cost (what is charged per source item is in the explanation)
        fixed_s_per_item=(float(overhead.get("fixed_s_per_item") or 0.0) if b.fixed > 0 else 0.0) if overhead else None,
        qps=b.qps,
        bounds_qps=b.qps,
        binding=b.binding,
        naive_qps=b.stage,
        bounds={
            "stages": b.stage,
            "cores": b.cores if math.isfinite(b.cores) else None,
            "gil": b.gil if math.isfinite(b.gil) else None,
        },
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class _Pipeline:
    """The measured stages and the bounds they set, as each binding limit's explanation reads them."""

    entries: list[StageEntry]
    by_name: dict[str, StageEntry]
    """The stage entries by stage name."""
    loads: list[StageLoad]
    """The measured stages' per-item demands (:func:`stage_load`)."""
    b: Bounds
    """The bounds (:func:`pipeline_bounds`)."""
    cores: float
    free_threaded: bool
    fixed: float
    """SPDL's per-item cost the pipeline pays once."""
    ranks: int = 1
    """The host's ranks, each a GIL of its own (:func:`pipeline_bounds`)."""
    cores_bound: str = ""
    """Where a quota or an allocation sets the cores, in words (empty: the affinity mask does)."""


def _spread(p: _Pipeline, fixed: str) -> str:
    """Where the once-paid cost (``fixed``, per sink item, formatted) is spread over an aggregate's groups
    (:func:`pipeline_bounds`), in words."""
    k = p.loads[-1].items_per_call
    return (
        f": {fixed} per item the sink gets, spread over its {k:.3g} source items, the least it costs" if k > 1 else ""
    )


def _gil_binds(p: _Pipeline, out: Prediction) -> tuple[Prediction, list[str]]:
    """The GIL binds: its parts (the stages' own Python and the pipeline's own scheduling) and what
    would lift it; ``out`` with its ``scheduling_gil_s_per_item``, ``bottleneck`` and ``lift``.

    The bottleneck is the stage with the most Python of its own in the main process; where no stage
    holds the GIL (every stage None-returning, or unmeasured), the scheduling alone binds.
    """
    loads, b = p.loads, p.b
    holders = sorted((d for d in loads if d.gil_s_per_item > 0), key=lambda d: -d.gil_s_per_item)
    main = [d for d in holders if d.executor in _MAIN_PROCESS and (p.by_name[d.stage].gil_s_per_item or 0) > 0]
    # the parts add up to the total: each stage's own Python in the main process, and the pipeline's
    # own per-item scheduling (every stage's harness part, and what it pays once per item)
    sched = sum(d.harness_gil_s_per_item for d in loads) + b.fixed
    owns = sorted(
        ((d.stage, d.gil_s_per_item - d.harness_gil_s_per_item) for d in loads),
        key=lambda x: -x[1],
    )
    owns = [(n, g) for n, g in owns if g > 0]
    out = changed(
        out, scheduling_gil_s_per_item=sched, bottleneck=owns[0][0] if owns else holders[0].stage if holders else None
    )
    whose = "the main process's GIL" if p.ranks == 1 else f"its rank's main process's GIL ({p.ranks} ranks, a GIL each)"
    # one sentence, one unit: the total, its parts, each stage's, the once-paid cost and what it is per sink item
    total, own_sum, by_pipeline, once, per_sink, *each = fmt_ms_each(
        b.gil_sum, sum(g for _, g in owns), sched, b.fixed, p.fixed, *(g for _, g in owns)
    )
    parts = [
        f"the GIL binds: one item needs {total} of {whose}: "
        + (
            f"{own_sum} of its stages' own Python (" + ", ".join(f"{n} {t}" for (n, _), t in zip(owns, each)) + ")"
            if owns
            else "none of it the stages' own Python"
        )
        + (f" and {by_pipeline} of the pipeline's own scheduling" if sched > 0 else "")
        + (f" ({once} of that paid once: source, sink, consumer{_spread(p, per_sink)})" if b.fixed > 0 else "")
        + f"; so at most {fmt_q(b.qps)} items/s, below the slowest stage alone "
        f"({b.cap_stage}, {fmt_q(b.stage)} items/s)"
    ]
    lift = _lift_by_processes(main, loads, p.entries, p.cores, p.free_threaded, p.fixed, b.gil, p.ranks)
    if lift:
        out = changed(out, lift=lift)
        parts.append(lift["text"])
    elif main:
        parts.append(_unmeasured_move(p, main[0]))
    return out, parts


def _unmeasured_move(p: _Pipeline, top: StageLoad) -> str:
    """What moving the largest GIL holder out of the main process would lift the GIL bound to, where
    it was not measured on processes: the bound without its own Python."""
    st = p.by_name[top.stage]
    own = (st.gil_s_per_item or 0.0) / st.items_per_input
    rest = p.b.gil_sum - own
    lifted = f"{fmt_q(p.ranks / rest)} items/s" if rest > 0 else "no limit"
    return (
        f"moving {top.stage}'s Python out of the main process (a process executor; not measured for it) "
        f"or shrinking it would lift the GIL bound, up to {lifted} without it"
    )


def _cores_bind(p: _Pipeline, out: Prediction) -> tuple[Prediction, list[str]]:
    """The cores bind: the stages' CPU per item, the largest user the bottleneck (``out`` with it)."""
    b = p.b
    cores = f"{p.cores} cores ({p.cores_bound})" if p.cores_bound else f"{p.cores} cores"
    users = sorted((d for d in p.loads if d.cpu_s_per_item), key=lambda d: -(d.cpu_s_per_item or 0.0))
    total, *each = fmt_ms_each(b.cpu_sum, *(d.cpu_s_per_item or 0.0 for d in users))
    return changed(out, bottleneck=users[0].stage if users else None), [
        f"the cores bind: one item needs {total} of CPU across the stages "
        + (
            f"({_shares(users, each)}); {cores} give at most {fmt_q(b.qps)} items/s. "
            f"More cores, or less work in {users[0].stage}, would lift it"
            if users
            else f"(the pipeline's own); {cores} give at most {fmt_q(b.qps)} items/s"
        )
    ]


def _stage_binds(p: _Pipeline, out: Prediction) -> tuple[Prediction, list[str]]:
    """A stage's capacity binds: that stage (the bottleneck, ``out`` with it) and what lifts it."""
    name = p.b.cap_stage
    st = p.by_name[name]
    d = next(x for x in p.loads if x.stage == name)
    parts = [
        f"{name} binds: at {d.executor} x {d.concurrency} it delivers {fmt_q(d.capacity)} items/s "
        f"({st.classification if 'classification' in st.keys else 'unknown'})"
    ]
    hint = _stage_hint(st)
    if hint:
        parts.append(hint)
    return changed(out, bottleneck=name), parts


def _caveat(loads: list[StageLoad], settings: list[StageChoice], overhead: dict | None) -> str | None:
    """Why the bounds may be off, or None: SPDL's fixed per-item cost not measured (charged once per
    stage), or stages measured on the direct harness (SPDL's own scheduling not counted)."""
    caveats: list[str] = []
    n_spdl = sum(1 for d in loads if d.spdl)
    if overhead is None and n_spdl > 1:
        caveats.append(
            "SPDL's fixed per-item cost (source, sink, consumer) was not measured separately (an older run): "
            "each stage is charged a whole one-stage pipeline's cost, so the GIL and cores bounds count that "
            "fixed part once per stage and the prediction is low for multi-stage pipelines"
        )
    direct = [str(c.stage) for c in settings if c.harness == "direct"]
    if direct:
        # The direct harness costs microseconds per item; an SPDL pipeline spends
        # a fraction of a millisecond of main-process Python per item and stage.
        caveats.append(
            f"{_names(direct)} {'was' if len(direct) == 1 else 'were'} measured without SPDL (direct harness): "
            "SPDL's own per-item scheduling in the main process is not counted, so the real pipeline will be "
            "slower than predicted; measure with the spdl harness for a closer prediction"
        )
    return "; ".join(caveats) if caveats else None


def _stage_hint(st: StageEntry) -> str:
    cls = st.classification
    rec = st.recommended or StageSetting()
    if cls == "io-bound" and "still rising" in (rec.why or ""):
        return f"it was still scaling at concurrency {rec.concurrency}: raise its concurrency"
    if (st.limit.kind if st.limit is not None else None) == "ipc" and rec.executor == "process":
        return "moving items between processes limits it: return smaller outputs or use shared memory"
    return {
        "io-bound": "it waits: more concurrency lifts it until the cores or the GIL bind",
        "overhead-bound": "its work per item is smaller than the per-item overhead: batch items into larger calls",
        "gil-bound": "it holds the GIL: a process executor lifts it",
        "cpu-bound": "it uses the cores: more cores or less work per item lifts it",
        "ipc-bound": "moving items between processes limits it: return smaller outputs or use shared memory",
    }.get(cls or "", "")


#: A move to processes "lifts" the GIL bound only if it raises it by more than this factor.
_LIFT_MIN = 1.05


def _lift_by_processes(main, loads, entries, cores, free_threaded, fixed=0.0, gil_now=math.inf, ranks=1) -> dict | None:
    """Move the largest GIL holder that was measured on processes; recompute the bounds.

    Where the stage had a head-to-head (threads and processes measured in
    turns, :mod:`._paired`), its capacity on processes is its thread capacity
    times the head-to-head's ratio rather than the process curve's point,
    which was measured at another moment: the same evidence the
    recommendation followed, so the two never disagree about the stage.

    ``lifts`` is False where the move would not raise the GIL bound above ``gil_now`` by
    :data:`_LIFT_MIN`: handing a cheap stage's items to processes can cost the main process more
    GIL (pickling, the pool's queues) than the stage's own Python did, and the text says so.
    """
    by_name: dict[str, StageEntry] = {st.name: st for st in entries}
    for d in main:
        st = by_name[d.stage]
        proc = _setting(st, "process")
        if not proc:
            continue
        h2h, turns = st.head_to_head or HeadToHead(), ""
        thread = _setting(st, "thread")
        if (
            h2h.decisive
            and h2h.ratio
            and thread
            and (h2h.process.concurrency if h2h.process is not None else None) == proc["concurrency"]
        ):
            proc = {**proc, "qps": thread["qps"] * h2h.ratio}
            turns = (
                f" (its capacity there: {h2h.ratio:.2f}x its threads', measured in turns, "
                f"{SourceItems(st.items_per_input).q(proc['qps'])} items/s)"
            )
        new = [(stage_load(st, proc, fixed) if x.stage == d.stage else x) for x in loads]
        nb = pipeline_bounds(new, cores, free_threaded, fixed, ranks)
        gil_bound = nb.gil
        lifts = gil_bound > _LIFT_MIN * gil_now
        if not lifts:
            text = (
                f"moving {d.stage} to processes (x {proc['concurrency']}){turns} would not lift the GIL bound "
                f"({fmt_q(gil_bound)} items/s against {fmt_q(gil_now)} now): handing its items to processes costs "
                "the main process as much of the GIL as its own Python does"
            )
        else:
            text = (
                f"moving {d.stage} to processes (x {proc['concurrency']}){turns} lifts the GIL bound to "
                + (f"{fmt_q(gil_bound)} items/s" if math.isfinite(gil_bound) else "no limit")
                # No throughput for the changed pipeline: the bounds leave out what stages cost each other,
                # and nothing replayed this change.
                + "; then "
                + nb.binding_words
                + " would set the bounds (not replayed: no throughput is claimed for the change)"
            )
        return {
            "stage": d.stage,
            "executor": "process",
            "concurrency": proc["concurrency"],
            "gil_bound": gil_bound if math.isfinite(gil_bound) else None,
            "qps": nb.qps,
            "binding": nb.binding,
            "head_to_head_ratio": h2h.ratio if turns else None,
            "lifts": lifts,
            "text": text,
        }
    return None


def apply_replay(prediction: Prediction | None, replay: WholeRun | None) -> Prediction | None:
    """The prediction with the replay's throughput as its number (``method: "replay"``).

    ``replay``: ``run.json["replay"]`` (:meth:`Diagnosis._replay`): ``qps``,
    ``qps_low``, ``qps_high``, ``seconds``, ``stand_ins``, ``stage_latency``
    (the stand-ins' median call inside the replay), or ``error``. The
    bounds stay as they are (``bounds``, ``bounds_qps``, ``binding``): they say
    *what* binds; the replay says how far below the bounds the stages' mutual
    costs put the pipeline. A failed replay leaves the bounds' number and
    records why in ``replay``.
    """
    if prediction is None or replay is None:
        return prediction
    q, written = replay.qps, replay.to_json()
    keep = ("qps", "qps_low", "qps_high", "seconds", "stand_ins", "stage_latency", "error")
    record = {k: written[k] for k in keep if k in written}
    bq = prediction.qps
    if q is None or not finite(q) or not q > 0 or bq is None or not finite(bq):
        return changed(prediction, replay=record)
    q, bq = float(q), float(bq)
    if q > bq:
        # Each bound is an upper limit on the pipeline (a stage's capacity alone, the cores over the CPU an
        # item needs, the GIL over the GIL it holds): a replay above one has not cost what the stages cost
        # alone, and its number is not the prediction. Above it beyond its own interval, its stand-ins did
        # not stand in; within it, the replay and the bounds agree within the replay's noise.
        low, high = num_or_none(replay.qps_low), num_or_none(replay.qps_high)
        band = f" ({fmt_q(low)}-{fmt_q(high)})" if low is not None and high is not None else ""
        why = (
            "its stand-ins did not cost what the stages cost alone, so it does not stand in for them here"
            if low is not None and low > bq
            else "within the replay's noise"
        )
        record["above_bounds"] = f"the replay read {fmt_q(q)} items/s{band}, above the bounds: {why}"
        return changed(
            prediction,
            replay=record,
            explanation=f"predicted {fmt_q(bq)} items/s, what the bounds allow ({prediction.binding} binds); "
            f"{record['above_bounds']}; " + str(prediction.explanation),
        )
    rel = (
        f"{q / bq:.0%} of the bounds' {fmt_q(bq)}: the stages' hand-offs, waits for the GIL and shared cores "
        "cost the rest"
        if q < bq
        else f"the bounds allow {fmt_q(bq)}"
    )
    return changed(
        prediction,
        replay=record,
        method="replay",
        qps=q,
        qps_low=replay.qps_low,
        qps_high=replay.qps_high,
        explanation=f"predicted {fmt_q(q)} items/s: the pipeline replayed with a stand-in for each stage (its "
        "GIL-held CPU, GIL-free CPU and waiting per call, as measured alone) at the recommended settings ran at "
        f"that rate ({rel}); " + str(prediction.explanation),
    )
