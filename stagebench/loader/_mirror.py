"""A ranked loader sweep's words: what the followers open, a loader of their own at the leader's knobs (sent
as ``dataclasses.asdict`` of its :class:`~stagebench.model._knobs.LoaderKnobs`; :mod:`stagebench.core._mirror`
says why and how).
"""

from __future__ import annotations

__all__ = ["WHAT"]

#: What the followers open: a loader of their own, at the leader's knobs.
WHAT = "loader"
