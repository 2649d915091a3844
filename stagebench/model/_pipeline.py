"""The whole pipeline's sections of a summary: the prediction, the run that checks it, your settings against
the recommended ones, the demand, the CPU's speed, the joint choice of settings, and a loader search's cost.

Each is written once, as a dict, by :mod:`stagebench.analysis` and read by the verdicts and every report
(terminal, HTML, comparison, plots). Read through these types, a section's fields are named in one place,
with the default a missing key reads as, instead of each reader restating the key and its fallback.
Numbers are kept as written (an int stays an int, a NaN stays a NaN: the readers test them with
``finite``); a key that holds no number reads as None. ``to_json`` gives the dict back with the keys the
analysis writes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from stagebench.model._evidence import Decision, Ratio
from stagebench.model._json import (
    Coercions,
    Read,
    Written,
    flag,
    integer,
    items,
    mapping,
    maps,
    number,
    nums,
    text,
    texts,
)
from stagebench.model._rate import Rate

__all__ = [
    "StageChoice",
    "StandIn",
    "Prediction",
    "Interference",
    "WholeRun",
    "VersusYours",
    "Demand",
    "CpuSpeed",
    "Joint",
    "JointReplays",
    "Search",
]


#: :func:`stagebench.model._json.text`, for a class body where a field of that name hides it
_text = text


@dataclass(frozen=True, slots=True)
class StageChoice(Read):
    """One stage's setting a whole-pipeline figure was made at: its executor and concurrency, and the
    harness its alone figures were measured in (None where not recorded)."""

    stage: str | None = None
    executor: str | None = None
    concurrency: int | None = None
    harness: str | None = None

    READ: ClassVar[Coercions] = {"stage": text, "executor": text, "concurrency": integer, "harness": text}


@dataclass(frozen=True, slots=True)
class StandIn(Read):
    """What the replay ran in place of one stage, per call: its GIL-held CPU, GIL-free CPU and waiting
    (seconds), how many times it let go of the GIL, at the stage's executor and concurrency; what the
    replayed prediction rests on. ``to_json`` gives back what was read."""

    name: str = "?"
    executor: str = "?"
    concurrency: float | None = None
    gil_s: float | None = None
    free_s: float | None = None
    wait_s: float | None = None
    releases: int = 1
    note: str = ""
    _json: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    READ: ClassVar[Coercions] = {
        "name": str,
        "executor": str,
        "releases": lambda r: int(r) if isinstance(r, (int, float)) else 1,
        "note": lambda v: str(v or ""),
        **dict.fromkeys(("concurrency", "gil_s", "free_s", "wait_s"), number),
    }


@dataclass(frozen=True, slots=True)
class Prediction(Read):
    """What the whole pipeline is predicted to run at (``summary["prediction"]``), from the stages measured
    alone: the bounds (``bounds``: each of ``stages``, ``gil``, ``cores``; the lowest, ``bounds_qps``, set
    by ``binding``), the replay with stand-ins where it ran (``method: "replay"``, then ``qps`` is its
    rate), the settings it was made at, and what moving the bottleneck to processes would lift (``lift``).
    Built by :func:`stagebench.analysis._predict.predict_pipeline` with its keys in the order the summary
    lists them; ``to_json`` gives them back."""

    qps: float | None = None
    qps_low: float | None = None
    qps_high: float | None = None
    binding: str | None = None
    bottleneck: str | None = None
    bounds: Mapping[str, Any] = field(default_factory=dict)
    bounds_qps: float | None = None
    naive_qps: float | None = None
    method: str | None = None
    explanation: str | None = None
    caveat: str | None = None
    fixed_s_per_item: float | None = None
    scheduling_gil_s_per_item: float | None = None
    lift: Mapping[str, Any] | None = None
    replay: Mapping[str, Any] | None = None
    settings: tuple[StageChoice, ...] = ()
    stages: tuple[Mapping[str, Any], ...] = ()
    missing: tuple[str, ...] = ()
    unit: str | None = None
    keys: tuple[str, ...] = field(default=(), compare=False, repr=False)
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    READ: ClassVar[Coercions] = {
        "settings": lambda v: tuple(StageChoice.from_json(x) for x in maps(v)),
        **dict.fromkeys(
            ("qps", "qps_low", "qps_high", "bounds_qps", "naive_qps", "fixed_s_per_item", "scheduling_gil_s_per_item"),
            number,
        ),
        **dict.fromkeys(("binding", "bottleneck", "method", "explanation", "caveat", "unit"), text),
        "bounds": lambda v: dict(mapping(v) or {}),  # a new dict, {} where it is none
        "lift": mapping,
        "replay": mapping,
        "stages": maps,
        "missing": texts,
    }

    @property
    def stand_ins(self) -> tuple[StandIn, ...]:
        """What the replay ran in place of each stage (none where it did not run)."""
        return tuple(StandIn.from_json(x) for x in (self.replay or {}).get("stand_ins") or () if isinstance(x, Mapping))

    @property
    def rate(self) -> Rate | None:
        """``qps`` with its interval (None where it is no rate)."""
        return Rate.of(self.qps, self.qps_low, self.qps_high)


@dataclass(frozen=True, slots=True)
class Interference(Read):
    """One timed stage's median call inside the measured pipeline against alone at the same setting
    (``ratio``) and against its stand-in's inside the replay (``vs_replay``); None where not measured."""

    stage: str | None = None
    in_pipeline_p50_ms: float | None = None
    calls: float | None = None
    alone_p50_ms: float | None = None
    ratio: float | None = None
    replay_p50_ms: float | None = None
    vs_replay: float | None = None

    READ: ClassVar[Coercions] = {
        "stage": text,
        **dict.fromkeys(("in_pipeline_p50_ms", "calls", "alone_p50_ms", "ratio", "replay_p50_ms", "vs_replay"), number),
    }


@dataclass(frozen=True, slots=True)
class WholeRun(Read):
    """One whole pipeline run over the cached source items (``run.json["replay"]``, ``["validation"]``,
    ``["yours"]``), built by :func:`stagebench.pipeline._wholerun.run_pipelines`: its rate in source items
    per second with its interval and each counted window's, the sink's and the source's rates, the settings
    it ran at, its latencies, and how it took turns with the others; ``error`` where it gave no number. At
    the user's settings: ``same`` where they are the recommended ones, ``not_run`` (why) where the real
    pipeline was not run. The validation run is ``summary["validation"]`` too, where the analysis adds its
    error against the prediction and how much slower each stage's call ran inside it than alone
    (``interference``). Its keys are kept in the order they were set, so ``to_json`` gives back what was
    built or read."""

    qps: float | None = None
    qps_low: float | None = None
    qps_high: float | None = None
    error: str | None = None
    window_rates: tuple[float, ...] = ()
    seconds: float | None = None
    sink_qps: float | None = None
    sink_items: int | None = None
    items_per_sink_item: float | None = None
    source_qps: float | None = None
    source_items: int | None = None
    warmup_s: float | None = None
    settings: Any = None
    windows: int | None = None
    latency_s: float | None = None
    counted_latency_s: tuple[float | None, ...] = ()
    stage_latency: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    """Per timed stage: its median call (``p50_ms``) and the calls completed in the windows."""
    ranks: int | None = None
    rank_min_qps: float | None = None
    rank_max_qps: float | None = None
    wall_s: float | None = None
    """Seconds the whole runs in turns took (one call, shared by the runs that took turns in it)."""
    settle_s: float | None = None
    extra_rounds: int | None = None
    first_round_windows: int | None = None
    """How many of its counted windows, the first ones, it counted in the first round in turns: the one
    round every run took part in. The replay ran in that round only."""
    interleaved_with: str | list[str] | None = None
    stand_ins: tuple[Mapping[str, float | str], ...] = ()
    """The replay's stand-ins, as :class:`StandIn` reads them."""
    error_vs_prediction: float | None = None
    """The validation run's: the prediction over the rate it is read against (``qps_with_replay`` where
    there is one, else ``qps``), less one: +0.10 predicted 10% too high."""
    qps_with_replay: float | None = None
    """The validation run's rate over its windows in the round the replay took part in, where the
    prediction is the replay's and later rounds counted more: the prediction is read against it, not
    against rounds it did not share, as the host's speed moves between rounds."""
    interference: tuple[Interference, ...] = ()
    failed: str | None = None
    same: bool = False
    not_run: str | None = None
    keys: tuple[str, ...] = field(default=(), compare=False, repr=False)
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    READ: ClassVar[Coercions] = {
        "same": bool,
        **dict.fromkeys(("not_run", "error"), lambda v: str(v) if v else None),  # "" or 0: none
        **dict.fromkeys(
            ("qps", "qps_low", "qps_high", "seconds", "error_vs_prediction", "qps_with_replay", "wall_s"), number
        ),
        "window_rates": nums,
        "stand_ins": maps,
        "settings": maps,
        "interference": lambda v: tuple(Interference.from_json(x) for x in maps(v)),
    }

    @property
    def rate(self) -> Rate | None:
        """``qps`` with its interval (None where the run gave no rate)."""
        return Rate.of(self.qps, self.qps_low, self.qps_high)


@dataclass(frozen=True, slots=True)
class VersusYours(Read):
    """The recommended settings against yours (``summary["recommended_vs_yours"]``), both run in turns:
    ``verdict`` (``same``, ``recommended``, ``cheaper``, ``yours``, ``could not tell``, ``inconclusive``,
    ``not run``), its ``text``, your run's rate, the recommended over yours round by round (``ratio``),
    the stages whose setting differs (``changes``) and the rule's record (``decision``). Built by
    :func:`stagebench.analysis._verdicts.yours_verdict` with its keys in the order the summary lists them."""

    verdict: str | None = None
    text: str | None = None
    changes: tuple[Mapping[str, Any], ...] = ()
    qps: float | None = None
    qps_low: float | None = None
    qps_high: float | None = None
    settings: Any = None
    ratio: float | None = None
    ratio_low: float | None = None
    ratio_high: float | None = None
    decision: Decision | None = None
    keys: tuple[str, ...] = field(default=(), compare=False, repr=False)
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    READ: ClassVar[Coercions] = {
        **dict.fromkeys(("verdict", "text"), _text),
        "changes": maps,
        **dict.fromkeys(("qps", "qps_low", "qps_high", "ratio", "ratio_low", "ratio_high"), number),
        "decision": Decision.from_json,
    }

    @property
    def versus_yours(self) -> Ratio | None:
        """The decision's ratio of the recommended over yours in turns (None where none was recorded)."""
        return None if self.decision is None else self.decision.versus_yours


@dataclass(frozen=True, slots=True)
class Demand(Read):
    """Whether the pipeline keeps up with the training step (``summary["demand"]``): the demand
    (``target_rate``, stated or measured: ``demand_source``), the pipeline's capacity (measured or
    replayed: ``source``), their ratio, the ``verdict`` and its ``text``; where the job ran, what it
    measured (``job_samples_per_s``, ``data_wait_share``). The fields are in the order the summary lists
    them; the capacity's interval, the ratio and the data wait are written where there is a capacity."""

    target_rate: float | None = None
    capacity: float | None = None
    capacity_low: float | None = None
    capacity_high: float | None = None
    source: str | None = None
    ratio: float | None = None
    verdict: str | None = None
    demand_source: str | None = None
    data_wait_share: float | None = None
    job_samples_per_s: float | None = None
    text: str | None = None

    READ: ClassVar[Coercions] = {
        **dict.fromkeys(("verdict", "text", "source", "demand_source"), _text),
        **dict.fromkeys(
            (
                "target_rate",
                "capacity",
                "capacity_low",
                "capacity_high",
                "ratio",
                "data_wait_share",
                "job_samples_per_s",
            ),
            number,
        ),
    }
    _WITH_CAPACITY = ("capacity_low", "capacity_high", "ratio", "data_wait_share")
    OPTIONAL = frozenset((*_WITH_CAPACITY, "job_samples_per_s"))
    BESIDE = dict.fromkeys(_WITH_CAPACITY, "capacity")


@dataclass(frozen=True, slots=True)
class CpuSpeed(Written):
    """The core's speed during the sweeps and around the validation run (``summary["cpu_speed"]``): a fixed
    Python loop's ns per iteration, lower is faster; ``sweep_spread`` is the slowest probe over the fastest.
    The fields are in the order the summary lists them, so ``to_json`` writes them so."""

    sweep_ns_median: float
    sweep_ns_min: float
    sweep_ns_max: float
    probes: int
    validation_ns: float | None = None
    validation_ns_probes: tuple[float, ...] = ()
    sweep_spread: float = 1.0

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> CpuSpeed | None:
        """None where no sweep probe was kept (what the analysis writes then)."""
        d = mapping(d) or {}
        if number(d.get("sweep_ns_median")) is None:
            return None
        return cls(
            sweep_ns_median=float(d["sweep_ns_median"]),
            sweep_ns_min=float(d.get("sweep_ns_min") or d["sweep_ns_median"]),
            sweep_ns_max=float(d.get("sweep_ns_max") or d["sweep_ns_median"]),
            sweep_spread=float(d.get("sweep_spread") or 1.0),
            probes=int(d.get("probes") or 0),
            validation_ns=number(d.get("validation_ns")),
            validation_ns_probes=nums(d.get("validation_ns_probes")),
        )


def _executors(v: Any) -> dict[str, str]:
    """Executors by stage name, as written; {} where there are none."""
    return {str(k): str(x) for k, x in v.items()} if isinstance(v, Mapping) else {}


@dataclass(frozen=True, slots=True)
class Joint(Read):
    """The settings chosen for the whole pipeline together (``summary["joint"]``): the pace the bounds
    allow at the chosen executors (``pace``), the bounds at the chosen settings (``qps``, set by
    ``binding``), how many executor assignments were scored, the stages set differently from their own
    best (``changed``), the demand they were cut to feed (``for_demand``), and its ``text``. The fields
    are in the order the summary lists them, so ``to_json`` writes them so."""

    pace: float | None = None
    qps: float | None = None
    binding: str | None = None
    assignments: int | None = None
    exhaustive: bool | None = None
    changed: tuple[str, ...] = ()
    for_demand: float | None = None
    runner_up: Mapping[str, str] | None = None
    """The bounds' best executor assignment, by stage name, where the pick is a cheaper one they put more than
    5% under it; None otherwise. The diagnosis replays both before its whole runs (:class:`JointReplays`)."""
    runner_up_pace: float | None = None
    """The bounds' pace at :attr:`runner_up` (each stage at its fastest)."""
    text: str | None = None

    READ: ClassVar[Coercions] = {
        **dict.fromkeys(("qps", "pace", "for_demand", "runner_up_pace"), number),
        **dict.fromkeys(("binding", "text"), _text),
        "assignments": integer,
        "exhaustive": flag,
        "changed": texts,
        "runner_up": lambda v: _executors(v) or None,
    }
    OPTIONAL = frozenset({"runner_up", "runner_up_pace"})


#: :attr:`JointReplays.chosen`: the replays kept the cheaper pick, or chose the bounds' best assignment
KEPT, RUNNER_UP = "pick", "runner_up"


@dataclass(frozen=True, slots=True)
class JointReplays(Read):
    """The replays that settle the joint choice (``run.json["joint_replays"]``), where the bounds' best executor
    assignment and the cheaper one picked (within :data:`stagebench.analysis._joint.TRUSTED` of it) differ by
    more than 5%: the pipeline with stand-ins at each one's settings, in turns, before the whole runs. The
    bounds leave out what the stages cost each other (hand-offs, waits for the GIL), which the replay runs;
    the runner-up is chosen only where its replay is faster beyond noise (its interval above the pick's)."""

    executors: Mapping[str, str] = field(default_factory=dict)
    """The runner-up's executors, by stage name (:attr:`Joint.runner_up`)."""
    pick: WholeRun = field(default_factory=WholeRun)
    runner_up: WholeRun = field(default_factory=WholeRun)
    chosen: str | None = None
    """:data:`KEPT` or :data:`RUNNER_UP`."""

    READ: ClassVar[Coercions] = {
        "executors": _executors,
        **dict.fromkeys(("pick", "runner_up"), WholeRun.from_json),
        "chosen": _text,
    }

    @property
    def prefer(self) -> dict[str, str] | None:
        """The executors the joint choice takes from the replays, by stage; None where it keeps its pick."""
        return dict(self.executors) if self.chosen == RUNNER_UP and self.executors else None

    @staticmethod
    def choose(pick: WholeRun, runner_up: WholeRun) -> str:
        """:data:`RUNNER_UP` where its replay is faster than the pick's beyond noise (their intervals apart),
        else :data:`KEPT`: the cheaper pick stays where the replays cannot tell them apart, or one failed."""
        if pick.qps_high is not None and runner_up.qps_low is not None and runner_up.qps_low > pick.qps_high:
            return RUNNER_UP
        return KEPT


@dataclass(frozen=True, slots=True)
class Search(Read):
    """What a loader run's search of the settings grid cost (``summary["search"]``): its ``strategy``, the
    points it measured of the full grid's, its seconds, the grid's estimated seconds and the time saved,
    and why any part of it stopped early (``stopped``)."""

    strategy: str | None = None
    points_measured: float | None = None  # a count, kept as written
    full_grid_points: float | None = None
    seconds: float | None = None
    estimated_full_grid_seconds: float | None = None
    time_saved_s: float | None = None
    stopped: tuple[Any, ...] = ()

    READ: ClassVar[Coercions] = {
        "strategy": text,
        **dict.fromkeys(
            ("points_measured", "full_grid_points", "seconds", "estimated_full_grid_seconds", "time_saved_s"), number
        ),
        "stopped": items,
    }
