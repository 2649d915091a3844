"""A loader point as it is measured: one record that the protocol, the windows in turns and the search fill."""

from __future__ import annotations

import datetime as _dt
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stagebench.model._knobs import LoaderKnobs
from stagebench.model._loader import with_note
from stagebench.runs._schema import LOADER_COLUMNS

__all__ = ["PointDraft"]

_NAN = math.nan


@dataclass(slots=True)
class PointDraft:
    """One loader setting being measured, filled step by step (warm-up, window, stall, tear-down).

    The fields are ``results.csv``'s loader columns in their order (:data:`LOADER_COLUMNS`); a figure not
    measured is NaN, and one measured keeps the type it was read as (a count an int), so :meth:`as_row`
    gives the row the writer writes. A point that fails says so in ``status`` and ``reason``.
    """

    loader: str
    backend: str
    num_workers: int
    prefetch_factor: float  # NaN where it does not apply (no workers)
    persistent_workers: bool | str
    pin_memory: bool | str
    status: str = "ok"
    reason: str = ""
    samples_per_s: float = _NAN
    samples_per_s_low: float = _NAN
    samples_per_s_high: float = _NAN
    batches_per_s: float = _NAN
    cv: float = _NAN
    time_to_first_batch_s: float = _NAN
    epoch_stall_s: float = _NAN
    n_batches: float = _NAN
    window_s: float = _NAN
    cores_used: float = _NAN
    mem_pss_mb: float = _NAN
    mem_uss_mb: float = _NAN
    mem_main_mb: float = _NAN
    mem_workers_mb: float = _NAN
    disk_read_mb_s: float = _NAN
    search_phase: str = ""
    started_at: str = ""
    elapsed_s: float = _NAN
    n_samples: float = _NAN
    workers_seen: float = 0
    worker_threads: float = _NAN
    startup_s: float = _NAN
    warmup_s: float = _NAN
    stall_phase_s: float = _NAN
    teardown_s: float = _NAN
    notes: str = ""
    turn: float = _NAN
    workers_start_s: float = _NAN
    workers_start_last_s: float = _NAN
    workers_created_s: float = _NAN
    worker_boot_s: float = _NAN
    worker_init_s: float = _NAN
    first_batch_work_s: float = _NAN
    first_delivery_s: float = _NAN
    worker_unsplit_s: float = _NAN
    ranks: float = _NAN
    rank_min_samples_per_s: float = _NAN
    rank_max_samples_per_s: float = _NAN

    @classmethod
    def start(
        cls,
        name: str,
        backend: str,
        eff: LoaderKnobs,
        shown: Mapping[str, bool | str],
        phase: str,
        notes: Sequence[str],
    ) -> PointDraft:
        """A point of ``eff`` (the knobs the loader runs; ``shown``: its flags as the row shows them) about to
        be measured in ``phase``, started now, with the normalisation's ``notes``."""
        return cls(
            loader=name,
            backend=backend,
            num_workers=eff.num_workers,
            prefetch_factor=eff.prefetch_factor if eff.prefetch_factor is not None else _NAN,
            persistent_workers=shown["persistent_workers"],
            pin_memory=shown["pin_memory"],
            search_phase=phase,
            notes="; ".join(notes),
            started_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds"),
        )

    def fail(self, status: str, reason: str) -> None:
        """The point ends as ``status`` (failed, timeout, crashed), ``reason`` saying why."""
        self.status, self.reason = status, reason

    def note(self, note: str) -> None:
        """Add a caveat to the point's notes."""
        self.notes = with_note(self.notes, note)

    def set(self, figures: Mapping[str, float]) -> None:
        """Set the columns a window's or a start-up's figures name (each one of :data:`LOADER_COLUMNS`)."""
        for name, value in figures.items():
            setattr(self, name, value)

    def as_row(self) -> dict[str, Any]:
        """The point as ``results.csv``'s row: every loader column, in order."""
        return {name: getattr(self, name) for name in LOADER_COLUMNS}
