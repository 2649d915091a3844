"""A ranked loader sweep's words: the knobs each loader the leader opens is opened at on every other rank
(:mod:`stagebench.core._mirror` says why and how).
"""

from __future__ import annotations

from typing import Any

from stagebench.model._knobs import LoaderKnobs

__all__ = ["knobs_json", "knobs_of_json", "WHAT"]

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
