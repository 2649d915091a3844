"""A finding: one diagnosis in words, with the numbers it rests on; the same shape for every kind of run."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stagebench.model._json import Written, dict_of

__all__ = ["Finding", "SEVERITIES", "by_severity"]

#: Most important first: what the report and the terminal list first.
SEVERITIES = ("high", "medium", "low", "info")


@dataclass(frozen=True, slots=True)
class Finding(Written):
    """What was found, why it matters (``detail``), where (``stage``: None for the loader, the job or the
    whole pipeline), and the figures it rests on (``evidence``)."""

    severity: str
    title: str
    detail: str
    stage: str | None = None
    evidence: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity: unknown {self.severity!r}; allowed: {', '.join(SEVERITIES)}")

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Finding:
        return cls(
            severity=str(d.get("severity") or "info"),
            title=str(d.get("title") or ""),
            detail=str(d.get("detail") or ""),
            stage=d.get("stage"),
            evidence=dict_of(d.get("evidence")),
        )


def by_severity(findings: Sequence[Finding]) -> list[Finding]:
    """``findings`` most important first, in their order within a severity."""
    return sorted(findings, key=lambda f: SEVERITIES.index(f.severity))
