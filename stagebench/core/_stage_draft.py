"""A stage point as it is measured: one record that the protocol, the window and a ranked point's host fill."""

from __future__ import annotations

import datetime as _dt
import math
from dataclasses import dataclass
from typing import Any

from stagebench.model._json import Read
from stagebench.runs._schema import STAGE_COLUMNS

__all__ = ["StageDraft", "WindowRate"]

_NAN = math.nan


@dataclass(slots=True)
class StageDraft:
    """One stage point being measured, filled step by step (warm-up, window, counters, tear-down).

    The fields are ``results.csv``'s stage columns in their order (:data:`STAGE_COLUMNS`); a figure not
    measured is NaN, and one measured keeps the type it was read as (a count an int), so :meth:`as_row`
    gives the row the writer writes. A point that fails says so in ``status`` and ``reason``.
    """

    stage: str
    role: str
    executor: str
    harness: str
    concurrency: int
    status: str = "ok"
    reason: str = ""
    qps: float = _NAN
    qps_low: float = _NAN
    qps_high: float = _NAN
    qps_cv: float = _NAN
    n_items: float = _NAN
    n_errors: int = 0
    error_example: str = ""
    window_s: float = _NAN
    warmup_s: float = _NAN
    n_batches: float = _NAN
    latency_p50_ms: float = _NAN
    latency_p90_ms: float = _NAN
    latency_p99_ms: float = _NAN
    latency_mean_ms: float = _NAN
    cpu_s_per_item: float = _NAN
    minor_faults_per_item: float = _NAN
    gc_s_per_item: float = _NAN
    gc_full_s_per_item: float = _NAN
    gc_young_per_item: float = _NAN
    cores_used: float = _NAN
    mem_peak_mb: float = _NAN
    mem_pss_mb: float = _NAN
    disk_read_mb_s: float = _NAN
    read_mb_s: float = _NAN
    call_cpu_ms: float = _NAN
    steal_share: float = _NAN
    cores_throttled: float = _NAN
    payload_bytes: float = _NAN
    workers_seen: int = 0
    started_at: str = ""
    elapsed_s: float = _NAN
    ranks: float = _NAN
    rank_min_qps: float = _NAN
    rank_max_qps: float = _NAN

    @classmethod
    def start(cls, stage: str, role: str, executor: str, harness: str, concurrency: int) -> StageDraft:
        """A point of ``stage`` (its ``role``) at ``executor`` x ``concurrency`` through ``harness``, started now."""
        return cls(
            stage=stage,
            role=role,
            executor=executor,
            harness=harness,
            concurrency=int(concurrency),
            started_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds"),
        )

    def fail(self, status: str, reason: str) -> None:
        """The point ends as ``status`` (skipped, failed, timeout, crashed), ``reason`` saying why."""
        self.status, self.reason = status, reason

    def note(self, note: str) -> None:
        """Add a caveat to the point's reason."""
        self.reason = f"{self.reason}; {note}" if self.reason else note

    def as_row(self) -> dict[str, Any]:
        """The point as ``results.csv``'s row: every stage column, in order."""
        return {name: getattr(self, name) for name in STAGE_COLUMNS}


@dataclass(frozen=True, slots=True)
class WindowRate(Read):
    """What one rank of a ranked point delivered over the leader's window: items per second, its interval,
    the items counted (None: not in the rank's answer). Sent between ranks as its ``to_json``."""

    qps: float | None = None
    qps_low: float | None = None
    qps_high: float | None = None
    n_items: float | None = None
