"""The one rule every piece of advice follows: change the user's setting only on evidence.

A setting other than the user's is advised only where windows measured **in turns** (the two
settings' windows at the same moments of the host, round after round) show it

* **faster beyond noise**: the interval of its rate over yours lies above 1; or
* **cheaper and equivalent**: it costs less, and the interval of its rate over yours lies above
  :data:`EQUIVALENT` (it gives up at most 5%);

and it is itself shown as good as the fastest setting measured (its ratio to the best above
:data:`EQUIVALENT`). A setting that moves the loading into the training process from yours, beside it
(``num_workers=0`` against workers), is held to more: shown faster by over 5%, never "cheaper"
(:attr:`Option.in_step`). Two intervals that overlap are not equivalence: they only say the readings could
not tell the settings apart. Otherwise the user's setting is kept, and the decision names the
setting the runs could not tell from it, with the ratio's interval and how many more rounds would
settle it at the spread seen (:meth:`Ratio.rounds_to_clear`).

Why in turns, and why the ratio per round, on the log scale: docs/method.md#rounds-in-turns.

Without a setting of the user's (a Hydra sweep, a loader given no knobs), the pick is the cheapest
setting shown as good as the best; else the cheapest that the rounds in turns put within 5% of the best
(the geometric mean of its ratio, with an interval), where none showed the costlier one faster (nothing
of the user's is changed, and a costlier setting is taken only where shown faster: otherwise two settings
the runs cannot tell apart take turns being the pick); else the best. A pick that is the fastest by its readings alone is
compared in turns with any costlier setting not yet compared with it, until their ratio has an
interval: one window each, seconds apart, would otherwise decide on the larger of two noisy readings
(the JPEG loader's 2 workers read 409 and 439 samples/s where 4 read 420 and 387; in turns 4 ran
ahead 5-10% in each of three rounds).

Why a ratio's interval is wider than 95%, and how much (:func:`look_confidence`): every comparison in
turns (the job runs, the loader's rounds, the pipeline's recommended against yours) checks the rule after
each round and stops once it is settled. A 95% interval looked at after each of 40 rounds wrongly clears
a bound about 14% of the time on one side, not 2.5%: each look is one more chance for a lucky run of
rounds. Each comparison's per-look level is the lowest that keeps that chance under 2.5% a side over
the looks its own cap allows, as one 95% interval's at one look (a simulation in
``tests/test_evidence.py`` checks each): 99.5% for the job runs' up to :data:`MAX_LOOKS`, 99% for the
loader's up to 8 rounds, 98% for the pipeline's up to 5. A level fitted to 40 looks on a comparison
that can look 3 times claims a quarter as often as it may, and its three rounds' interval is twice as
wide as it needs to be (t at 2 degrees of freedom: 14.1 at 99.5%, 7.0 at 98%): rounds that settle
nothing. A clear difference still settles within a few rounds; a small one takes more, and the budget's
end keeps yours.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from stagebench.model._json import ReadIfGiven, dict_of, items
from stagebench.model._rate import Rate, t_quantile

__all__ = [
    "EQUIVALENT",
    "MIN_ROUNDS",
    "MAX_LOOKS",
    "LOOK_CONFIDENCE",
    "look_confidence",
    "PRACTICAL_ROUNDS",
    "WIDEST",
    "Ratio",
    "Option",
    "Decision",
    "decide",
    "settling_bounds",
    "more_rounds_text",
    "ADVICE",
]

#: A cheaper setting is equivalent when the interval of its rate over the other's lies above this.
EQUIVALENT = 0.95
#: Fewest rounds (pairs of windows in turns) behind a ratio with an interval. Two rounds give a valid
#: t-interval, but the runs look after every round and stop once settled, and two rounds that agree by
#: chance (the demo's job runs: 0.975x and 0.985x) would settle a 5% question on a spread no one saw.
MIN_ROUNDS = 3
#: Most rounds a comparison in turns runs (and looks at): the job runs' cap; the loader's and the
#: pipeline's rounds stop far sooner.
MAX_LOOKS = 40
#: Two-sided confidence of a ratio's interval at each look: over up to :data:`MAX_LOOKS` looks, a wrong
#: claim on one side stays under 2.5% (module docstring), as a single 95% interval's.
LOOK_CONFIDENCE = 0.995
#: The per-look levels for fewer looks, by the most rounds a comparison runs (:func:`look_confidence`):
#: the lowest that a simulation (the test's) keeps under 2.5% a side at that cap: 2.2% at 5 rounds
#: (97.5% would read 2.7%), 1.8% at 8 (98.3% would read 2.9%).
_LEVELS = ((5, 0.98), (8, 0.99))


def look_confidence(max_rounds: int) -> float:
    """The per-look confidence of a comparison that runs at most ``max_rounds`` rounds in turns and looks
    after each from :data:`MIN_ROUNDS` (module docstring)."""
    return next((level for cap, level in _LEVELS if max_rounds <= cap), LOOK_CONFIDENCE)


#: What a decision advises: ``keep yours``, ``cheaper`` (as fast within 5%, shown, and cheaper),
#: ``change`` (faster beyond noise), ``use`` (no setting of the user's to compare), ``none`` (nothing ran).
ADVICE = ("keep yours", "cheaper", "change", "use", "none")
_MAX_ROUNDS_ESTIMATE = 1000
#: Before a ratio has an interval (two rounds), its spread is one difference, so whether more rounds are
#: worth running is read at the low end of the spreads two such rounds allow: this one-sided lower bound
#: (about 0.61 of the spread seen). Only a comparison that even that spread could not settle within its cap
#: stops there, and stopping keeps yours (:meth:`Decision.worth_more_rounds`).
EARLY_SPREAD_LEVEL = 0.90
#: More rounds than this to settle a comparison is no advice: the verdicts say the two cannot be told apart.
PRACTICAL_ROUNDS = 40
#: A ratio whose interval spans more than this (high over low: the span of 0.5x-2x) is not printed in a
#: verdict line: three rounds at 0.01-37x say nothing a reader can use (issue 60); the report's details give it.
WIDEST = 4.0


def _spread_low(sd: float, rounds: int) -> float:
    """The lower :data:`EARLY_SPREAD_LEVEL` bound of a spread ``sd`` read from ``rounds`` rounds (chi-square)."""
    from scipy.special import chdtri  # as t_quantile: scipy.stats is not imported for one quantile

    df = rounds - 1
    return sd * math.sqrt(df / float(chdtri(df, 1 - EARLY_SPREAD_LEVEL)))


def more_rounds_text(n: int | None) -> str:
    """What more rounds in turns would do (``n``: :meth:`Decision.rounds_more`), in the verdicts' words."""
    if n is None:
        return "at the spread seen, no practical number of rounds would settle it"
    return f"about {n} more round{'' if n == 1 else 's'} in turns would settle it at the spread seen"


@dataclass(frozen=True, slots=True)
class Ratio:
    """One setting's rate over another's, from windows measured in turns: the geometric mean of the
    rounds' ratios and its interval at ``confidence`` a look (None below :data:`MIN_ROUNDS`)."""

    value: float
    low: float | None
    high: float | None
    rounds: int
    log_sd: float | None = None
    """Spread of the rounds' log ratios (what :meth:`rounds_to_clear` extrapolates from)."""
    confidence: float = LOOK_CONFIDENCE
    """The interval's level (:func:`look_confidence`), which :meth:`rounds_to_clear` extrapolates at."""

    @classmethod
    def of_pairs(
        cls,
        pairs: Sequence[tuple[float, float]],
        confidence: float = LOOK_CONFIDENCE,
        min_rounds: int = MIN_ROUNDS,
    ) -> Ratio | None:
        """From (this setting's rate, the other's rate) per round; rounds where either is not a positive
        number are left out. None without a usable round; no interval below ``min_rounds`` rounds (at
        least two: a t-interval needs a spread)."""
        logs = [
            math.log(a / b)
            for a, b in pairs
            if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a > 0 and b > 0
            if math.isfinite(a) and math.isfinite(b)
        ]
        n = len(logs)
        if not n:
            return None
        m = sum(logs) / n
        sd = math.sqrt(sum((x - m) ** 2 for x in logs) / (n - 1)) if n > 1 else None
        if n < max(min_rounds, 2) or sd is None:
            # no interval yet, but from two rounds a spread (what decides whether more rounds are worth it)
            return cls(math.exp(m), None, None, n, sd, confidence)
        half = t_quantile(0.5 + confidence / 2, n - 1) * sd / math.sqrt(n)
        return cls(math.exp(m), math.exp(m - half), math.exp(m + half), n, sd, confidence)

    def above(self, bound: float) -> bool:
        """Shown above ``bound``: the whole interval lies above it."""
        return self.low is not None and self.low > bound

    def below(self, bound: float) -> bool:
        """Shown below ``bound``: the whole interval lies below it."""
        return self.high is not None and self.high < bound

    def rounds_to_clear(self, bound: float, spread: float | None = None) -> int | None:
        """Rounds in all for the interval to clear ``bound`` on the side the ratio lies, were the ratio and
        its spread to stay as seen (or be ``spread``), at its own level (None: the ratio sits on the bound,
        no spread is known yet, or it would take over a thousand rounds)."""
        confidence = self.confidence
        sd = self.log_sd if spread is None else spread
        if sd is None or bound <= 0:
            return None
        gap = abs(math.log(self.value) - math.log(bound))
        if gap <= 0:
            return None
        if sd == 0:
            return max(self.rounds, MIN_ROUNDS)
        for n in range(MIN_ROUNDS, _MAX_ROUNDS_ESTIMATE):
            if t_quantile(0.5 + confidence / 2, n - 1) * sd / math.sqrt(n) < gap:
                return max(n, self.rounds + 1)
        return None

    def rounds_to_settle(self, bounds: Sequence[float], spread: float | None = None) -> int | None:
        """Rounds in all for the interval to clear the nearest of ``bounds`` (:func:`settling_bounds`), as
        :meth:`rounds_to_clear` reads each; None where it reads none."""
        ends = [n for b in bounds if (n := self.rounds_to_clear(b, spread)) is not None]
        return min(ends) if ends else None

    @property
    def wide(self) -> bool:
        """The interval spans more than :data:`WIDEST` (the span of 0.5x-2x) and holds 1: a ratio that
        decides nothing and that no one can read as evidence. (One as wide that clears 1 decided, and the
        verdict gives it: the decision rests on it.)"""
        return (
            self.low is not None
            and self.high is not None
            and self.low < 1 < self.high
            and (self.low <= 0 or self.high / self.low > WIDEST)
        )

    def text(self, of: str = "") -> str:
        """The ratio as a verdict line gives it: ``0.83x yours (0.74-0.93 over 4 rounds in turns)`` with
        ``of="yours"``; where its interval is :attr:`wide`, not the ratio but that (:meth:`detail` gives
        it, for the report's details): ``its ratio to yours spans more than 0.5x-2x over 3 rounds in turns``."""
        if self.wide:
            to = f" to {of}" if of else ""
            return f"its ratio{to} spans more than 0.5x-2x over {self._rounds()}"
        return self.detail(of)

    def detail(self, of: str = "") -> str:
        """The ratio with its interval, however wide (the report's details)."""
        r = self._rounds()
        head = f"{self.value:.2f}x" + (f" {of}" if of else "")
        if self.low is None or self.high is None:
            return f"{head} (no interval: {r})"
        return f"{head} ({_bound(self.low)}-{_bound(self.high)} over {r})"

    def _rounds(self) -> str:
        return f"{self.rounds} round{'s' if self.rounds != 1 else ''} in turns"

    def to_json(self) -> dict[str, Any]:
        return {"ratio": self.value, "ratio_low": self.low, "ratio_high": self.high, "rounds": self.rounds}

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> Ratio | None:
        if not isinstance(d, Mapping) or not isinstance(d.get("ratio"), (int, float)):
            return None
        lo, hi = d.get("ratio_low"), d.get("ratio_high")
        return cls(float(d["ratio"]), lo, hi, int(d.get("rounds") or 0))


def _bound(x: float) -> str:
    """An interval's end at two digits, or as many more (up to four) as show which side of the rule's
    margins (0.95, 1, 1/0.95) it lies: "0.95" cannot say whether an end lies above or below 0.95, and the
    verdict turns on that. An end on a margin to four digits is shown at two (there is no side to show)."""
    for digits in (2, 3, 4):
        s = f"{x:.{digits}f}"
        if not any(s == f"{m:.{digits}f}" for m in (EQUIVALENT, 1.0, 1 / EQUIVALENT)):
            return s
    return f"{x:.2f}"


@dataclass(frozen=True, slots=True)
class Option:
    """A setting in a decision: its key, its cost (compared in order: workers first), its pooled rate."""

    key: str
    cost: tuple[float, ...]
    rate: Rate | None
    """Over all its windows; None where none measured."""
    in_step: bool = False
    """Loads on the training process itself (a DataLoader's ``num_workers=0``): against a setting of yours
    that loads beside it, it must be shown faster by more than 5% (:data:`EQUIVALENT`), never merely as
    fast and cheaper, because then every fetch waits in the step's own time, and a reading in turns of a
    few minutes does not see the epochs where the data or the host is slower (the knob guide's T4)."""


class _Costed(Protocol):
    @property
    def cost(self) -> tuple[float, ...]: ...
    @property
    def in_step(self) -> bool: ...


def settling_bounds(c: _Costed, ref: _Costed, *, ref_is_yours: bool, margin: float = EQUIVALENT) -> tuple[float, ...]:
    """The bounds whose clearing by ``c``'s ratio to ``ref`` settles their comparison: shown more than 5% faster
    (or not) for a setting that loads in the training process against yours beside it; shown within the margin
    (or under it) for a cheaper one; shown faster, or under 5% faster, for a costlier one. One source for the
    rule (:func:`decide`) and for what the runs say more rounds would settle."""
    if ref_is_yours and c.in_step and not ref.in_step:
        return (1 / margin,)
    return (margin,) if c.cost < ref.cost else (1.0, 1 / margin)


@dataclass(frozen=True, slots=True)
class Decision(ReadIfGiven):
    """What the rule decided among some settings, and what it rests on; read from any mapping (an empty
    one as no advice), written with ``settled`` after ``open``."""

    advice: str = "none"
    """One of :data:`ADVICE`."""
    pick: str | None = None
    best: str | None = None
    """The fastest by its pooled rate (what the others are held to)."""
    yours: str | None = None
    as_good: tuple[str, ...] = ()
    """Shown, in turns, within 5% of the best (the best itself included)."""
    open: tuple[str, ...] = ()
    """Settings whose comparison is still open: measuring them more could change the pick."""
    versus_yours: Ratio | None = None
    """The pick over yours where it changes yours; where yours is kept, the rival over yours."""
    rival: str | None = None
    """Yours kept while the runs could not tell this setting from it (None: nothing open)."""
    rounds_to_settle: int | None = None
    """Rounds in all that would settle the rival at the spread seen (None: not known)."""
    rounds_to_settle_early: int | None = None
    """Before the rival's ratio against yours has an interval (two rounds): rounds in all that would settle
    it at the low end of the spread those rounds allow (:data:`EARLY_SPREAD_LEVEL`); None otherwise, or
    where even that would take over a thousand rounds."""
    reasons: Mapping[str, str] = field(default_factory=dict)
    """Per setting not picked, why, in a few words."""
    others: Mapping[str, Ratio | None] = field(default_factory=dict)
    """The settings still open beside the rival, each over the same reference as the rival's ratio (None:
    never in the same rounds): the verdict names them too, so a faster reading left open is not unsaid."""

    READ = {
        "advice": lambda v: str(v or "none"),
        "as_good": items,
        "open": items,
        "versus_yours": Ratio.from_json,
        "reasons": dict_of,
        "others": lambda v: {str(k): Ratio.from_json(x) for k, x in (v or {}).items()},
    }

    @classmethod
    def holds(cls, d: Mapping[str, Any]) -> bool:
        return True

    @property
    def settled(self) -> bool:
        return not self.open

    def worth_more_rounds(self, max_rounds: int) -> bool:
        """Whether more rounds in turns, up to ``max_rounds`` in all, could settle this: it is open, and either
        the rival's ratio has no interval yet or the spread seen settles it within ``max_rounds``. Rounds that
        cannot settle it within the cap only cost time; stopping them makes no claim, so the rule's error rate
        is unchanged, and the verdict says the runs could not tell and how many rounds would."""
        if self.settled:
            return False
        x = self.versus_yours
        if self.rival is None or x is None or x.log_sd is None:
            return True
        if x.low is None:  # two rounds against yours: stop only where even a spread at their low end could not
            if self.yours is None:  # without yours, stopping would pick by the larger of two readings
                return True
            n = self.rounds_to_settle_early
            return n is not None and n <= max_rounds
        return self.rounds_to_settle is not None and self.rounds_to_settle <= max_rounds

    def rounds_more(self, ran: int) -> int | None:
        """Rounds beyond the ``ran`` run that would settle the rival at the spread seen, where that is a
        practical number (1 to :data:`PRACTICAL_ROUNDS`); None where it is not, or is not known."""
        if self.rounds_to_settle is None:
            return None
        n = self.rounds_to_settle - ran
        return n if 0 < n <= PRACTICAL_ROUNDS else None

    def to_json(self) -> dict[str, Any]:
        return {
            "advice": self.advice,
            "pick": self.pick,
            "best": self.best,
            "yours": self.yours,
            "as_good": list(self.as_good),
            "open": list(self.open),
            "settled": self.settled,
            "versus_yours": self.versus_yours.to_json() if self.versus_yours else None,
            "rival": self.rival,
            "rounds_to_settle": self.rounds_to_settle,
            **({"rounds_to_settle_early": self.rounds_to_settle_early} if self.rounds_to_settle_early else {}),
            "reasons": dict(self.reasons),
            **({"others": {k: r.to_json() if r else None for k, r in self.others.items()}} if self.others else {}),
        }


RatioOf = Callable[[str, str], "Ratio | None"]


def _within(x: Ratio | None, margin: float) -> bool:
    """Whether the rounds in turns put a ratio within ``margin`` (its geometric mean), with an interval."""
    return x is not None and x.low is not None and x.value >= margin


def decide(options: Sequence[Option], *, yours: str | None, ratio: RatioOf, margin: float = EQUIVALENT) -> Decision:
    """The pick among ``options`` by the rule (module docstring).

    ``ratio(a, b)``: a's rate over b's from their windows in turns (None: never measured in the same
    rounds). Ties of cost go to the option listed first.
    """
    ran = [o for o in options if o.rate is not None and o.rate.value > 0]
    if not ran:
        return Decision(yours=yours)
    order = {o.key: i for i, o in enumerate(options)}
    best = max(ran, key=lambda o: (o.rate.value if o.rate else 0.0, -order[o.key]))
    me = next((o for o in ran if o.key == yours), None)

    def shown_above(a: Option, b: Option, bound: float) -> bool:
        x = ratio(a.key, b.key)
        return a.key == b.key or (x is not None and x.above(bound))

    def shown_below(a: Option, b: Option, bound: float) -> bool:
        x = ratio(a.key, b.key)
        return a.key != b.key and x is not None and x.below(bound)

    def cheapest(opts: list[Option]) -> Option:
        return min(opts, key=lambda o: (o.cost, order[o.key]))

    def into_step(c: Option) -> bool:
        """``c`` would move the loading into the training process from yours, beside it."""
        return me is not None and c.in_step and not me.in_step

    def beats_yours(c: Option) -> bool:
        if me is None:
            return True
        if into_step(c):
            return shown_above(c, me, 1 / margin)
        return shown_above(c, me, 1.0) or (c.cost < me.cost and shown_above(c, me, margin))

    def why_not(c: Option) -> str | None:
        """Why ``c`` cannot be the pick, where its runs show it (None: they do not)."""
        if shown_below(c, best, margin):
            return f"shown under {margin:.0%} of the fastest"
        if me is not None and into_step(c) and shown_below(c, me, 1 / margin):
            return "loads in the training process, and shown at most 5% faster than yours"
        if me is not None and c.cost < me.cost and shown_below(c, me, margin):
            return f"cheaper than yours, but shown under {margin:.0%} of it"
        if me is not None and c.cost >= me.cost and shown_below(c, me, 1 / margin):
            # a costlier setting must show a gain beyond noise; this one is shown to gain under 5%
            return "no cheaper than yours, and shown at most 5% faster"
        return None

    good = [o for o in ran if shown_above(o, best, margin)]
    # yours shown within 5% of the fastest: only a cheaper setting can improve on it
    mine_good = me is not None and me in good
    shown = [c for c in good if beats_yours(c) and c is not me and (not mine_good or (me and c.cost < me.cost))]
    if me is None:
        pick, advice = cheapest(good), "use"
        if pick is best:
            # no setting of yours to keep: a costlier setting is taken over a cheaper one only where the rounds
            # in turns show it faster. A cheaper one whose rounds put it within the margin of the fastest, not
            # shown either way, is the pick: otherwise two settings the runs cannot tell apart would take turns
            # being the pick by the larger of two noisy rates (the slow-start bench: 2 then 4 workers)
            ties = [c for c in ran if c.cost < best.cost and _within(ratio(c.key, best.key), margin)]
            if ties:
                pick = cheapest(ties)
    elif shown:
        pick = cheapest(shown)
        advice = "change" if shown_above(pick, me, 1.0) else "cheaper"
    else:
        pick, advice = me, "keep yours"
    # still open: an option that could yet become the pick, were its comparisons to settle. Only one
    # cheaper than the pick can replace it (the pick is the cheapest shown, or yours shown as good as the
    # fastest); where yours is kept without that, any can.
    reasons: dict[str, str] = {}
    open_: list[Option] = []
    tie = pick is not me and pick not in good  # a cheaper pick within the margin of the fastest, not shown
    for c in ran:
        if c is pick or c is me:
            continue
        if tie and c is best:  # more rounds could show the fastest faster than the pick
            open_.append(c)
            continue
        if pick is not me and c.cost >= pick.cost:
            # a costlier setting cannot be the pick unless it is the fastest; where the pick is the fastest
            # only by its readings (never in turns with this one), that closes once the rounds give an
            # interval, as for yours below: otherwise the larger of two noisy readings would decide
            if pick is not best:
                continue
            x = ratio(c.key, pick.key)
            if x is not None and x.low is not None:
                continue
        if pick is me and mine_good and c.cost >= me.cost:
            x = ratio(c.key, me.key)
            # yours as good as the fastest: a costlier setting cannot be the pick; but where yours is the
            # fastest only by its readings, that closes the question once the rounds give an interval
            if me is not best or (x is not None and x.low is not None):
                continue
        reason = why_not(c)
        if reason is not None:
            reasons[c.key] = reason
        elif not (c in good and beats_yours(c)):
            open_.append(c)
    rival, versus, rounds, early = None, None, None, None
    others: dict[str, Ratio | None] = {}
    if me is not None and pick is not me:
        versus = ratio(pick.key, me.key)
    elif open_:
        first = cheapest(open_)
        ref = me if me is not None else pick if first is best else best
        rival, versus = first.key, ratio(first.key, ref.key)
        others = {c.key: ratio(c.key, ref.key) for c in open_ if c is not first}
        if versus is not None:
            bounds = settling_bounds(first, ref, ref_is_yours=ref is me, margin=margin)
            rounds = versus.rounds_to_settle(bounds)
            if ref is me and versus.low is None and versus.log_sd is not None:
                early = versus.rounds_to_settle(bounds, _spread_low(versus.log_sd, versus.rounds))
    return Decision(
        advice=advice,
        pick=pick.key,
        best=best.key,
        yours=yours,
        as_good=tuple(o.key for o in good),
        open=tuple(o.key for o in open_),
        versus_yours=versus,
        rival=rival,
        rounds_to_settle=rounds,
        rounds_to_settle_early=early,
        reasons=reasons,
        others=others,
    )
