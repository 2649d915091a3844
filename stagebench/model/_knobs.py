"""One loader setting: the four knobs a training script passes to its DataLoader.

:class:`LoaderKnobs` is what the loader sweep runs (the effective knobs, after a backend's rules:
:func:`stagebench.runs._knobs.normalize_knobs`), the key by which it keeps a setting's loader open and its
readings, and what the analysis compares: two rows ran the same setting where their knobs are equal
(:meth:`LoaderKnobs.from_row`), and of two settings as fast the one of lower :meth:`LoaderKnobs.cost` is
advised.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stagebench.model._json import whole

__all__ = ["LoaderKnobs", "NOT_APPLICABLE", "KNOBS"]

#: What a knob that does not exist for a backend or host shows (not "n/a": pandas reads "n/a" back as NaN).
NOT_APPLICABLE = "not applicable"
#: The four knobs, in their order, as the DataLoader, the rows and run.json name them.
KNOBS = ("num_workers", "prefetch_factor", "persistent_workers", "pin_memory")


@dataclass(frozen=True, slots=True, kw_only=True)
class LoaderKnobs:
    """One loader setting: the knobs a training script passes to its DataLoader."""

    num_workers: int = 0
    """Worker processes; 0 loads in the main process."""

    prefetch_factor: int | None = None
    """Batches in flight per worker; ``None``: the backend's default (2), or not
    applicable with 0 workers."""

    persistent_workers: bool = False
    """Keep workers alive between epochs (torch only)."""

    pin_memory: bool = False
    """Copy batches into page-locked memory (only meaningful with a CUDA device)."""

    def __post_init__(self) -> None:
        if isinstance(self.num_workers, bool) or not isinstance(self.num_workers, int) or self.num_workers < 0:
            raise ValueError(f"num_workers must be an integer >= 0, got {self.num_workers!r}")
        pf = self.prefetch_factor
        if pf is not None and (isinstance(pf, bool) or not isinstance(pf, int) or pf < 1):
            raise ValueError(f"prefetch_factor must be None or an integer >= 1, got {pf!r}")
        for key in ("persistent_workers", "pin_memory"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"{key} must be True or False, got {getattr(self, key)!r}")

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> LoaderKnobs:
        """The setting a row (or a point pooled from rows, or a summary's point) ran: a whole number read as
        a float is whole; a knob that did not apply (``None``, NaN, ``"not applicable"``) is off."""
        nw = whole(row["num_workers"])
        if nw is None or nw < 0:
            raise ValueError(f"a loader row's num_workers must be a whole number >= 0, got {row['num_workers']!r}")
        pf = whole(row.get("prefetch_factor"))
        return cls(
            num_workers=nw,
            prefetch_factor=pf if pf is not None and pf >= 1 else None,
            persistent_workers=row.get("persistent_workers") is True,
            pin_memory=row.get("pin_memory") is True,
        )

    def cost(self) -> tuple[float, ...]:
        """What the setting costs, compared in order: worker processes, then batches in flight, persistent
        workers, pinned memory (of settings as fast, the cheapest is advised)."""
        return (
            float(self.num_workers),
            float(self.prefetch_factor or 0),
            float(self.persistent_workers),
            float(self.pin_memory),
        )

    def label(self, *, as_call: bool = False, flags: bool = True) -> str:
        """The setting in words: the one text every place that names a loader setting writes.

        By default the short form that keys a setting in the job runs and the progress line
        (``workers=2 prefetch=2 persistent pin``, ``prefetch=-`` where it does not apply). ``as_call``: as the
        DataLoader's own arguments, what the findings and verdicts say (``num_workers=2, prefetch_factor=2,
        persistent_workers=True, pin_memory=True``; a knob that is off or does not apply, prefetch without workers
        included, is left out).
        ``flags=False``: the workers and their prefetch alone, where the text is about the workers.
        """
        pf = self.prefetch_factor
        if as_call:
            parts = [f"num_workers={self.num_workers}"] + ([f"prefetch_factor={pf}"] if self.num_workers and pf else [])
            if flags:
                parts += ["persistent_workers=True"] if self.persistent_workers else []
                parts += ["pin_memory=True"] if self.pin_memory else []
            return ", ".join(parts)
        text = f"workers={self.num_workers} prefetch={'-' if pf is None else pf}"
        if flags:
            text += f"{' persistent' if self.persistent_workers else ''}{' pin' if self.pin_memory else ''}"
        return text
