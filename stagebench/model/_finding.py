"""A finding: one diagnosis in words, with the numbers it rests on; the same shape for every kind of run."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from stagebench.model._json import Coercions, Read, dict_of

__all__ = ["Finding", "SEVERITIES", "by_severity"]

#: Most important first: what the report and the terminal list first.
SEVERITIES = ("high", "medium", "low", "info")


@dataclass(frozen=True, slots=True)
class Finding(Read):
    """What was found, why it matters (``detail``), where (``stage``: None for the loader, the job or the
    whole pipeline), and the figures it rests on (``evidence``)."""

    severity: str = "info"
    title: str = ""
    detail: str = ""
    stage: str | None = None
    evidence: Mapping[str, Any] = field(default_factory=dict)

    READ: ClassVar[Coercions] = {
        "severity": lambda v: str(v or "info"),
        **dict.fromkeys(("title", "detail"), lambda v: str(v or "")),
        "evidence": dict_of,
    }

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity: unknown {self.severity!r}; allowed: {', '.join(SEVERITIES)}")


def by_severity(findings: Sequence[Finding]) -> list[Finding]:
    """``findings`` most important first, in their order within a severity."""
    return sorted(findings, key=lambda f: SEVERITIES.index(f.severity))
