"""How a loader sweep chooses and measures its points: :class:`LoaderSweepConfig`, validated once."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from stagebench._settings import (
    DEMAND_HEADROOM,
    LOADER_MIN_WINDOW_S,
    LOADER_TIE_ROUNDS,
    LOADER_TURN_GAP_SPAN,
    LOADER_WINDOW_S,
    PRECISION,
    check,
)
from stagebench.model._knobs import LoaderKnobs
from stagebench.runs._schema import EXECUTORS

__all__ = ["LoaderSweepConfig", "LoaderFactory", "STRATEGIES"]

STRATEGIES = ("adaptive", "grid")

# --------------------------------------------------------------------------- knobs


#: A callable that builds a FRESH loader for the given knobs; iterating the loader
#: yields batches (one iteration = one epoch). It may return a :class:`BuiltLoader`
#: to give the measurement epoch control and worker tags.
LoaderFactory = Callable[[LoaderKnobs], Iterable]


@dataclass(frozen=True, slots=True, kw_only=True)
class LoaderSweepConfig:
    """How a loader sweep chooses and measures its points."""

    strategy: str = "adaptive"
    """``adaptive`` (num_workers upwards until no gain, then the other knobs at
    the best) or ``grid`` (every combination)."""

    num_workers: tuple[int, ...] | None = None
    """num_workers levels, ascending. ``None``: 0, 1, 2, 4, ... up to ``max_workers``."""

    max_workers: int | None = None
    """Highest num_workers tried. ``None``: twice the usable cores, because a
    loader that waits (network, disk, sleep) keeps scaling past the core count
    while its workers sit idle; beyond 2x the search costs more than it tells."""

    prefetch_factors: tuple[int, ...] = (1, 2, 4)
    """prefetch_factor values. The num_workers phase uses 2 (torch's default)
    when listed, else the first."""

    persistent_workers: tuple[bool, ...] = (False, True)
    """persistent_workers values (torch only; SPDL's loader has no such knob)."""

    pin_memory: tuple[bool, ...] = (False, True)
    """pin_memory values; ``True`` is measured only where CUDA is available."""

    budget_s: float = LOADER_WINDOW_S
    """Longest steady-state window per point, in seconds. It grows (up to the point's
    timeout) until at least three groups of arrivals fit, so a slow loader never
    gets an interval it has not earned."""

    precision: float = PRECISION
    """Sequential stopping: a window closes, after ``min_window_s``, once its 95% interval is
    within this share of its throughput (the stage points' rule). The num_workers search's windows,
    where rounds in turns follow (``tie_rounds`` > 0), close at ±10% (``PAIRED_PRECISION``, as a stage's head-to-head) or at this if
    looser: they only screen which settings the turns compare; a window in a round in turns closes at
    its shortest, as soon as it has an interval (the rounds' spread decides). 0: every window runs
    ``budget_s``."""

    min_window_s: float = LOADER_MIN_WINDOW_S
    """Shortest window before it may close on precision."""

    turn_gap_span: float = LOADER_TURN_GAP_SPAN
    """A window of a setting in a round in turns lasts at least this many times its longest wait between two
    arrivals, so that one stall of the host moves its round's ratio by a bounded share; a window without
    one closes at its shortest (``stagebench._settings.LOADER_TURN_GAP_SPAN``). At most ``turn_budget_s``."""

    turn_budget_s: float = LOADER_WINDOW_S
    """Longest window of a setting in a round in turns, whatever ``budget_s`` (the zero-code sweep's windows
    share the stage points' 0.5 s): what a stall may stretch it to, as long as a sweep's loader point."""

    stall_at: str = "pick"
    """Where the epoch-boundary stall is measured: ``pick`` (once, at the recommendation, after
    the search: the only decision it enters is persistent_workers there; two short epochs with
    restarting workers cost each point two start-ups) or ``every`` (at every point)."""

    search_prefetch: bool = False
    """Adaptive search: also measure ``prefetch_factors`` at the best num_workers. Off by
    default: a loader measured alone is drained as fast as it delivers, so a deeper queue has
    nothing to smooth, and the pick would take the higher of noisy numbers. The search
    keeps the script's own (``yours``), else 2. Its effect on a bursty trainer shows in a job run."""

    yours: LoaderKnobs | None = None
    """The training script's own setting. It is measured after the search, kept where the
    measurements cannot tell it from a cheaper or faster one (the tie-break), and the adaptive
    search measures at its ``prefetch_factor`` and, on a host with a CUDA device, its
    ``pin_memory``: pinning pays off only with the copy to the device, which a loader measured
    alone never makes, so the search could only see its cost; a job run with the user's loop
    judges it (:mod:`stagebench.loader._trainer`)."""

    tie_rounds: int = LOADER_TIE_ROUNDS
    """Decisions on evidence: the settings the pick hinges on (yours, the fastest, the cheapest near
    it) are measured again in turns, one window of each per round, their loaders kept open
    (:mod:`stagebench.loader._turns`), until the rule of :mod:`stagebench.model._evidence` is
    settled, at most this many rounds. Readings measured apart decide nothing, so without these
    rounds yours is kept (or, without a setting of yours, the fastest is used). 0: off."""

    warmup_s: float = 0.3
    """Minimum warm-up; the window also waits until every worker delivered."""

    timeout_s: float = 60.0
    """Deadline of one point (build, warm-up, window, epoch stall). A loader that
    delivers nothing by then is recorded as ``timeout`` and torn down."""

    min_batches: int = 8
    """Fewest batches behind a throughput figure (more with many workers)."""

    max_groups: int = 10
    """Batch-means groups for the interval."""

    confidence: float = 0.95
    """Two-sided confidence level of the interval."""

    min_gain: float = 0.05
    """Adaptive search: a step improves only if it beats the best so far by this
    share AND by more than the intervals' half-widths."""

    patience: int = 2
    """Adaptive search: steps without improvement before num_workers stops rising."""

    within_best: float = 0.05
    """Recommendation: cheapest setting within this share of the best throughput."""

    headroom: float = DEMAND_HEADROOM
    """With a target rate: the loader must deliver target x (1 + headroom)."""

    memory_budget_mb: float | None = None
    """PSS of main process + workers allowed. ``None``: the main process's PSS now
    plus ``memory_share`` of the RAM available at the start."""

    memory_share: float = 0.5
    """Share of available RAM the loader may use when ``memory_budget_mb`` is None:
    half leaves room for the model, the optimizer, a CUDA context and page cache."""

    epoch_stall: bool = True
    """Measure the stall at an epoch boundary (short extra epochs per point)."""

    stall_epochs: int = 1
    """Short epochs after the measured one: boundaries behind the stall figure. One: a restart's
    cost varies little between boundaries, and each costs a start-up of the workers."""

    stall_epoch_batches: int | None = None
    """Batches in a short epoch. ``None``: max(4, 2 x num_workers)."""

    stall_wait_s: float = 5.0
    """Loaders without epoch control: longest wait for a natural epoch boundary."""

    worker_costs: bool = True
    """What each worker costs beyond throughput (:mod:`stagebench.loader._costs`): the dataset shipped to
    it (under spawn or forkserver) and, at the pick, its memory over a pass of ``memory_pass_s``."""

    memory_pass_s: float = 2.0
    """Seconds of the memory pass at the pick: each worker's private memory read as it loads (0: off). A
    pass runs on past it until it has four readings (every 0.25 s), the fewest its median needs."""

    transforms: bool = True
    """Measure each transform of a composed ``dataset.transform`` as a stage."""

    transform_items: int = 16
    """Cached inputs per transform."""

    transform_budget_s: float = 0.5
    """Window per transform point."""

    transform_max_concurrency: int | None = None
    """Highest concurrency for transforms. ``None``: the usable cores."""

    transform_executors: tuple[str, ...] = ("thread", "process")
    """Executors for transforms: threads against processes is the GIL evidence;
    process points cost a pool start each (seconds on a busy machine)."""

    extra_points: tuple[LoaderKnobs, ...] = ()
    """Settings measured after the search (e.g. the script's own setting)."""

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy: unknown {self.strategy!r}; allowed: {', '.join(STRATEGIES)}")
        if self.num_workers is not None:
            nw = tuple(self.num_workers)
            if not nw or any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in nw):
                raise ValueError(f"num_workers must be integers >= 0, got {self.num_workers!r}")
            if list(nw) != sorted(set(nw)):
                raise ValueError(f"num_workers must be ascending and distinct, got {self.num_workers!r}")
        if self.max_workers is not None and (not isinstance(self.max_workers, int) or self.max_workers < 1):
            raise ValueError(f"max_workers must be None or an integer >= 1, got {self.max_workers!r}")
        if not self.prefetch_factors or any(
            isinstance(p, bool) or not isinstance(p, int) or p < 1 for p in self.prefetch_factors
        ):
            raise ValueError(f"prefetch_factors must be integers >= 1, got {self.prefetch_factors!r}")
        for key in ("persistent_workers", "pin_memory"):
            vals = getattr(self, key)
            if not vals or any(not isinstance(v, bool) for v in vals):
                raise ValueError(f"{key} must be a non-empty tuple of True/False, got {vals!r}")
        check("budget_s", self.budget_s, "budget_s")
        check("warmup_s", self.warmup_s, "warmup_s")
        check("precision", self.precision, "precision")
        if not 0 < self.min_window_s <= self.budget_s:
            raise ValueError(f"min_window_s must be in (0, budget_s={self.budget_s:g}], got {self.min_window_s}")
        if not self.turn_gap_span >= 1:
            raise ValueError(f"turn_gap_span must be at least 1, got {self.turn_gap_span}")
        if not self.turn_budget_s > 0:
            raise ValueError(f"turn_budget_s must be above 0, got {self.turn_budget_s}")
        if self.stall_at not in ("pick", "every"):
            raise ValueError(f"stall_at: unknown {self.stall_at!r}; allowed: pick, every")
        if self.yours is not None and not isinstance(self.yours, LoaderKnobs):
            raise ValueError(f"yours must be None or LoaderKnobs, got {type(self.yours).__name__}")
        if isinstance(self.tie_rounds, bool) or not isinstance(self.tie_rounds, int) or self.tie_rounds < 0:
            raise ValueError(f"tie_rounds must be an integer >= 0, got {self.tie_rounds!r}")
        if not self.timeout_s > self.budget_s + self.warmup_s:
            raise ValueError(
                f"timeout_s ({self.timeout_s}) must be larger than budget_s + warmup_s "
                f"({self.budget_s + self.warmup_s})"
            )
        _at_least(self, min_batches=2, max_groups=2)
        if not 0.5 < self.confidence < 1:
            raise ValueError(f"confidence must be in (0.5, 1), got {self.confidence}")
        for key in ("min_gain", "within_best", "headroom"):
            v = getattr(self, key)
            if not 0 <= v < 1:
                raise ValueError(f"{key} must be in [0, 1), got {v}")
        _at_least(self, patience=1)
        if self.memory_budget_mb is not None and not self.memory_budget_mb > 0:
            raise ValueError(f"memory_budget_mb must be None or > 0, got {self.memory_budget_mb}")
        if not 0 < self.memory_share <= 1:
            raise ValueError(f"memory_share must be in (0, 1], got {self.memory_share}")
        _at_least(self, stall_epochs=1)
        if self.stall_epoch_batches is not None and self.stall_epoch_batches < 1:
            raise ValueError(f"stall_epoch_batches must be None or >= 1, got {self.stall_epoch_batches}")
        _at_least(self, stall_wait_s=0, memory_pass_s=0, transform_items=1)
        if not self.transform_budget_s > 0:
            raise ValueError(f"transform_budget_s must be > 0, got {self.transform_budget_s}")
        if self.transform_max_concurrency is not None and self.transform_max_concurrency < 1:
            raise ValueError(f"transform_max_concurrency must be None or >= 1, got {self.transform_max_concurrency}")

        if not self.transform_executors or any(e not in EXECUTORS for e in self.transform_executors):
            raise ValueError(
                f"transform_executors: unknown in {self.transform_executors!r}; allowed: {', '.join(EXECUTORS)}"
            )
        for k in self.extra_points:
            if not isinstance(k, LoaderKnobs):
                raise ValueError(f"extra_points must hold LoaderKnobs, got {type(k).__name__}")

    def fewest_batches(self, num_workers: int) -> int:
        """The fewest batches a window times at ``num_workers``: ``min_batches``, and three rounds of the
        workers (at least two), so that every worker's period shows in it."""
        return max(self.min_batches, 3 * max(2, num_workers))

    def default_prefetch(self) -> int:
        if self.yours is not None and self.yours.prefetch_factor is not None:
            return self.yours.prefetch_factor
        return 2 if 2 in self.prefetch_factors else self.prefetch_factors[0]


def _at_least(cfg: LoaderSweepConfig, **lows: float) -> None:
    """Each setting named at or above its lowest value, in the order named; raises ValueError for the first not."""
    for key, low in lows.items():
        if getattr(cfg, key) < low:
            raise ValueError(f"{key} must be >= {low}, got {getattr(cfg, key)}")
