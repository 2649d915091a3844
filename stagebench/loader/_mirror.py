"""A ranked loader sweep's words: the knobs each loader the leader opens is opened at on every other rank
(:mod:`stagebench.core._mirror` says why and how), and a window's rates read back as the host's.
"""

from __future__ import annotations

from typing import Any

from stagebench.model._knobs import LoaderKnobs
from stagebench.model._ranks import HostRate
from stagebench.model._rate import Rate

__all__ = ["knobs_json", "knobs_of_json", "rate_of", "host_rate", "WHAT"]

#: What the followers open: a loader of their own, at the leader's knobs.
WHAT = "loader"


def knobs_json(knobs: LoaderKnobs) -> dict[str, Any]:
    return {
        "num_workers": knobs.num_workers,
        "prefetch_factor": knobs.prefetch_factor,
        "persistent_workers": knobs.persistent_workers,
        "pin_memory": knobs.pin_memory,
    }


def knobs_of_json(d: dict[str, Any]) -> LoaderKnobs:
    return LoaderKnobs(**d)


def rate_of(d: dict[str, Any]) -> Rate | None:
    """The rate :func:`stagebench.loader._point.window_rate` measured, None where it timed none."""
    value = d.get("samples_per_s")
    if not isinstance(value, (int, float)) or value <= 0:
        return None
    lo, hi = d.get("samples_per_s_low"), d.get("samples_per_s_high")
    if isinstance(lo, (int, float)) and isinstance(hi, (int, float)):
        return Rate(float(value), float(lo), float(hi))
    return Rate(float(value))


def host_rate(leader: dict[str, Any], others: list[dict[str, Any]]) -> HostRate:
    """A window's rates on every rank, the leader's first (each as ``window_rate`` reckons a window)."""
    return HostRate.of([rate_of(leader), *(rate_of(o) for o in others)])
