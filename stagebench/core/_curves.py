"""Measured rows of one stage, as throughput curves: one per harness x executor.

The analysis reasons about curves (throughput against concurrency) and the
no-op ceiling under each point, never about raw CSV rows. This module is the
one place that turns rows into that shape, tolerating what real rows contain:
strings where numbers should be (a CSV read back), NaN, statuses other than
``ok``, repeated levels.

Why repeated levels collapse to the median row: a level measured twice (a
re-run, an adaptive search) should count once in a recommendation, and the
median is an actual measured row (its interval and resources belong to it),
unlike a mean of rows.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import pandas as pd

from stagebench._numbers import finite, num

__all__ = ["Point", "Curve", "StageRows"]

_NUMERIC = (
    "concurrency",
    "qps",
    "qps_low",
    "qps_high",
    "qps_cv",
    "n_items",
    "n_errors",
    "window_s",
    "n_batches",
    "latency_p50_ms",
    "latency_p90_ms",
    "latency_p99_ms",
    "cpu_s_per_item",
    "cores_used",
    "mem_peak_mb",
    "mem_pss_mb",
    "payload_bytes",
    "workers_seen",
    "elapsed_s",
    "call_cpu_ms",
    "steal_share",
    "cores_throttled",
    "minor_faults_per_item",
    "gc_s_per_item",
    "gc_full_s_per_item",
    "gc_young_per_item",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Point:
    """One successfully measured point (status ok, throughput > 0)."""

    concurrency: int
    qps: float
    qps_low: float
    qps_high: float
    qps_cv: float
    n_items: float
    n_batches: float
    window_s: float
    cores_used: float
    cpu_s_per_item: float
    latency_p50_ms: float
    payload_bytes: float
    mem_pss_mb: float
    call_cpu_ms: float = math.nan
    """The calling thread's CPU per call (spdl harness, threads): the stage's own work."""
    gc_s_per_item: float = math.nan
    """Seconds this process's cyclic garbage collector ran per item (holding the GIL)."""
    gc_full_s_per_item: float = math.nan
    """Of them, its full collections' (each walks every object the process holds)."""
    gc_young_per_item: float = math.nan
    """Young collections per item: each one the collector's threshold of containers more alive."""
    steal_share: float = math.nan
    """The share of the CPUs' time the host took from this VM in the window (steal)."""
    cores_throttled: float = math.nan
    """The cores' worth of time the CPU quota held the process back in the window (NaN: no quota)."""
    ranks: float = math.nan
    """The host's ranks that ran the point at once (NaN: one process): its rates are their sum."""

    @property
    def lanes(self) -> float:
        """What a rate of the point is divided by for one rank's (1 on one process): a time per item read off
        a rate (Little's law, a ceiling's 1/rate) is one rank's, each rank a process and a GIL of its own,
        and the host's rate is the sum over them."""
        return self.ranks if finite(self.ranks) and self.ranks >= 1 else 1.0

    @property
    def cores_wanted(self) -> float:
        """The cores the point's threads and workers wanted: those used, and those a CPU quota held back."""
        held = self.cores_throttled
        return self.cores_used + (held if finite(held) else 0.0)

    @property
    def rank_cores_wanted(self) -> float:
        """:attr:`cores_wanted` of one rank's process (the host's over :attr:`lanes`): what its one GIL allows."""
        return self.cores_wanted / self.lanes

    @property
    def has_interval(self) -> bool:
        return finite(self.qps_low, self.qps_high) and self.qps_high >= self.qps_low

    @property
    def low(self) -> float:
        """Lower end of the interval (the value itself when there is none)."""
        return self.qps_low if self.has_interval else self.qps

    @property
    def high(self) -> float:
        return self.qps_high if self.has_interval else self.qps

    def overlaps(self, other: "Point") -> bool:
        """True when the two throughput intervals overlap (equal within noise)."""
        return self.low <= other.high and other.low <= self.high

    def as_dict(self) -> dict[str, Any]:
        return {"concurrency": self.concurrency, "qps": self.qps, "qps_low": self.qps_low, "qps_high": self.qps_high}


@dataclass(frozen=True, slots=True)
class Curve:
    """Points of one harness x executor, ascending concurrency, one per level."""

    harness: str
    executor: str
    points: tuple[Point, ...]

    def __bool__(self) -> bool:
        return bool(self.points)

    def __iter__(self) -> Iterator[Point]:
        return iter(self.points)

    def __len__(self) -> int:
        return len(self.points)

    @property
    def levels(self) -> list[int]:
        return [p.concurrency for p in self.points]

    def at(self, concurrency: int) -> Point | None:
        for p in self.points:
            if p.concurrency == concurrency:
                return p
        return None

    def best(self) -> Point | None:
        return max(self.points, key=lambda p: p.qps) if self.points else None

    @property
    def key(self) -> str:
        return f"{self.harness}/{self.executor}"


def _point(row: pd.Series) -> Point:
    g = {f.name: num(row.get(f.name)) for f in fields(Point)}
    return Point(concurrency=int(g.pop("concurrency")), **g)


def _curve(df: pd.DataFrame, harness: str, executor: str) -> Curve:
    pts = []
    for _, grp in df.groupby("concurrency", sort=True):
        grp = grp.sort_values("qps", kind="stable")
        pts.append(_point(grp.iloc[len(grp) // 2]))  # the median row (upper median)
    return Curve(harness, executor, tuple(pts))


def _curves(df: pd.DataFrame) -> dict[tuple[str, str], Curve]:
    """One curve per harness x executor, in the rows' order."""
    return {(h, e): _curve(grp, h, e) for (h, e), grp in df.groupby(["harness", "executor"], sort=False)}


class StageRows:
    """The rows of one stage, split into ok curves and ceilings, with the rest kept for reasons."""

    def __init__(self, rows: pd.DataFrame) -> None:
        df = rows.reset_index(drop=True)  # concatenated frames repeat index labels
        for col in ("stage", "role", "executor", "harness", "status", "reason", "error_example"):
            if col not in df.columns:
                df[col] = ""
            df[col] = df[col].fillna("").astype(str)
        df.loc[df["role"] == "", "role"] = "stage"
        df.loc[df["status"] == "", "status"] = "ok"
        for col in _NUMERIC:
            df[col] = pd.to_numeric(df[col], errors="coerce") if col in df.columns else np.nan
        self.all = df
        ok = (df["status"] == "ok") & (df["qps"] > 0) & (df["concurrency"] >= 1)
        self.ok = df[ok & (df["role"] == "stage")]
        self.ceiling_ok = df[ok & (df["role"] == "ceiling")]
        self.stage_rows = df[df["role"] == "stage"]
        self._paired = df[df["role"] == "paired"]  # head-to-head windows, in measuring order (see _paired)
        self._curves = _curves(self.ok)
        self._ceilings = _curves(self.ceiling_ok)

    def curve(self, harness: str, executor: str) -> Curve:
        return self._curves.get((harness, executor)) or Curve(harness, executor, ())

    def curves(self) -> list[Curve]:
        order = {"direct": 0, "spdl": 1, "thread": 0, "async": 1, "process": 2}
        return sorted(self._curves.values(), key=lambda c: (order.get(c.harness, 9), order.get(c.executor, 9)))

    def harnesses(self) -> list[str]:
        return sorted({h for h, _ in self._curves}, key=lambda h: {"direct": 0, "spdl": 1}.get(h, 9))

    def ceiling(self, harness: str, executor: str, concurrency: int) -> Point | None:
        c = self._ceilings.get((harness, executor))
        return c.at(concurrency) if c else None

    def ceiling_levels(self, harness: str, executor: str) -> list[int]:
        """The concurrencies at which the no-op ceiling of ``harness``/``executor`` measured."""
        c = self._ceilings.get((harness, executor))
        return c.levels if c else []

    def paired_rows(self, harness: str) -> pd.DataFrame:
        """The head-to-head windows of ``harness`` (role ``paired``, any status), in measuring order."""
        return self._paired[self._paired["harness"] == harness]

    def recommendation_harness(self) -> str | None:
        """The harness the recommendation reads: ``spdl`` when measured (what the pipeline delivers), else the first."""
        hs = self.harnesses()
        if not hs:
            return None
        return "spdl" if "spdl" in hs else hs[0]

    def not_ok(self) -> pd.DataFrame:
        """Stage rows that did not measure (any status but ok, or ok with no items)."""
        sr = self.stage_rows
        return sr[~sr.index.isin(self.ok.index)]

    def payload_bytes(self) -> float:
        vals = self.all["payload_bytes"].dropna()
        return float(vals.median()) if len(vals) else math.nan

    def page_faults(self) -> dict[str, dict[str, float]]:
        """Per executor, the medians over the stage's measured points of minor page faults and CPU per item.

        Medians over every level and harness: how much fresh memory a call
        touches does not depend on concurrency, while single windows vary.
        Executors whose points have no fault counts (off Linux) are left out.
        """
        out: dict[str, dict[str, float]] = {}
        for ex, grp in self.ok.groupby("executor", sort=False):
            f = grp["minor_faults_per_item"].dropna()
            if len(f):
                cpu = grp.loc[f.index, "cpu_s_per_item"].dropna()
                out[str(ex)] = {
                    "per_item": float(f.median()),
                    "points": int(len(f)),
                    "cpu_s_per_item": float(cpu.median()) if len(cpu) else math.nan,
                }
        return out
