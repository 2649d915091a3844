"""SPDL's own cost per item of a pipeline as the diagnosis measures it: ``run.json["pipeline_overhead"]``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from stagebench.model._json import Written

__all__ = ["NoopPipeline", "PipelineOverhead", "NOOP_KEYS"]

#: The columns of a no-op pipeline's point that the record keeps, in its order.
NOOP_KEYS = ("status", "qps", "cpu_s_per_item", "qps_low", "qps_high", "reason")


@dataclass(frozen=True, slots=True)
class NoopPipeline(Written):
    """One no-op pipeline's point: its status and rate as measured, a figure not measured None (not NaN),
    and, for a point taken from elsewhere, where it comes from (``extra["from"]``, written after the rest)."""

    status: str | None
    qps: float | None
    cpu_s_per_item: float | None
    qps_low: float | None
    qps_high: float | None
    reason: str | None
    extra: Mapping[str, str] = field(default_factory=dict)
    keys: tuple[str, ...] = NOOP_KEYS


@dataclass(frozen=True, slots=True)
class PipelineOverhead(Written):
    """The no-op pipelines of one and of three identity stages, measured at ``harness`` x ``executor`` x
    ``concurrency``: their difference is what each further stage adds, the rest what the pipeline pays once."""

    harness: str
    executor: str
    concurrency: int
    one_stage: NoopPipeline
    three_stage: NoopPipeline
