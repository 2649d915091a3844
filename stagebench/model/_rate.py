"""A rate with its 95% interval: what every throughput stagebench shows or decides on is.

Why the interval is built on the log scale. A rate's batch means on a busy host spread widely (a
group of steps that waited for a core reads at a fraction of the others), and the symmetric
``mean ± t·s/√n`` then reaches below zero.
A rate is positive and its errors multiply (a slower moment scales every item), so its interval is
``point · exp(± t · s / (√n · mean))``: the standard error relative to the mean (the delta method
for the log of the mean), turned back into a rate. It equals the symmetric interval where the
spread is small, stays positive where it is large, and contains the point always.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stagebench._numbers import fmt_q

__all__ = ["Rate", "t_quantile", "CONFIDENCE"]

#: Two-sided confidence of every interval stagebench states.
CONFIDENCE = 0.95


@functools.lru_cache(maxsize=512)  # the same few (p, df) pairs, asked at every check of every window
def t_quantile(p: float, df: int) -> float:
    """Student-t quantile. ``scipy.special.stdtrit`` is what ``scipy.stats.t.ppf`` computes, without
    importing ``scipy.stats`` (over a second, which every diagnosis and every ``stagebench report`` would pay).
    ``core._stats`` re-exports it for the measurement's intervals: one copy."""
    # scipy loads at the first interval: the model is imported by processes that never state one
    from scipy.special import stdtrit

    return float(stdtrit(df, p))


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(frozen=True, slots=True)
class Rate:
    """A throughput (items, samples or steps per second) and its 95% interval, None where unknown."""

    value: float
    low: float | None = None
    high: float | None = None

    def __post_init__(self) -> None:
        if not _finite(self.value) or self.value < 0:
            raise ValueError(f"a rate is a finite number >= 0, got {self.value!r}")
        if (self.low is None) != (self.high is None):
            raise ValueError("a rate's interval has both ends or neither")
        if self.low is not None and self.high is not None and not (0 <= self.low <= self.value <= self.high):
            raise ValueError(
                f"a rate's interval must hold it and stay >= 0: {self.low!r} <= {self.value!r} <= {self.high!r}"
            )

    @classmethod
    def around(cls, point: float, samples: Sequence[float], confidence: float = CONFIDENCE) -> Rate:
        """``point`` with the interval its batch-mean ``samples`` give, on the log scale (module docstring).

        ``point`` is the measurement (all items over all seconds), which need not be the samples' plain
        mean; fewer than two finite samples, or a zero mean, leave the interval unknown.
        """
        xs = [float(x) for x in samples if _finite(x)]
        if not _finite(point) or point < 0:
            raise ValueError(f"a rate is a finite number >= 0, got {point!r}")
        n = len(xs)
        mean = sum(xs) / n if n else 0.0
        if n < 2 or mean <= 0 or point == 0:
            return cls(float(point))
        sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
        half = t_quantile(0.5 + confidence / 2, n - 1) * sd / math.sqrt(n) / mean
        if not math.isfinite(half):
            return cls(float(point))
        return cls(float(point), point * math.exp(-half), point * math.exp(half))

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None, key: str = "samples_per_s") -> Rate | None:
        """The rate stored under ``key``, ``key_low`` and ``key_high`` (None where ``key`` holds no number).

        Rows written before the log-scale interval may hold a negative or inverted lower end: an end
        that cannot belong to a rate is read as unknown, never shown.
        """
        if not isinstance(d, Mapping):
            return None
        return cls.of(d.get(key), d.get(f"{key}_low"), d.get(f"{key}_high"))

    @classmethod
    def of(cls, value: Any, low: Any = None, high: Any = None) -> Rate | None:
        """The rate a record's three figures state, read as :meth:`from_json` reads them (None where
        ``value`` is no number >= 0; ends that cannot belong to it read as unknown)."""
        if not _finite(value) or value < 0:
            return None
        v = float(value)
        if _finite(low) and _finite(high) and 0 <= low <= v <= high:
            return cls(v, float(low), float(high))
        return cls(v)

    def to_json(self, key: str = "samples_per_s") -> dict[str, float | None]:
        return {key: self.value, f"{key}_low": self.low, f"{key}_high": self.high}

    @property
    def known(self) -> bool:
        """Whether the interval is known."""
        return self.low is not None and self.high is not None

    def scaled(self, k: float) -> Rate:
        """The same rate in other units (steps/s to samples/s: ``k`` samples a step)."""
        return Rate(
            self.value * k,
            None if self.low is None else self.low * k,
            None if self.high is None else self.high * k,
        )

    def overlaps(self, other: Rate) -> bool:
        """Whether the two intervals overlap (False where either is unknown). Overlap is not equivalence:
        it says only that these two readings could not tell the rates apart."""
        if self.low is None or self.high is None or other.low is None or other.high is None:
            return False
        return self.low <= other.high and other.low <= self.high

    def text(self, unit: str = "") -> str:
        """``252 items/s (214-291)``; ``(no interval)`` where it is unknown."""
        u = f" {unit}" if unit else ""
        if self.low is None or self.high is None:
            return f"{fmt_q(self.value)}{u} (no interval)"
        return f"{fmt_q(self.value)}{u} ({fmt_q(self.low)}-{fmt_q(self.high)})"
