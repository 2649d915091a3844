"""What a diagnosis measures, read from the environment: one frozen, validated settings object.

Imported while ``spdl`` is being imported (from the post-import hook), so its
top level imports only the standard library.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from stagebench._settings import QUICK, SETTINGS, SettingsError, check, read_env, setting
from stagebench.core import _resources
from stagebench.core._config import MeasureConfig, powers_of_two
from stagebench.runs._ranks import per_host

__all__ = ["DiagnoseSettings", "SAMPLE_OUTPUTS"]


SAMPLE_OUTPUTS = 8  # real outputs kept per stage for its stand-in in the replay (_replay.StandIn.op)


def _default(key: str) -> Any:
    return setting(key).default


def _default_grid() -> tuple[int, ...]:
    """Powers of two up to 16, or up to the usable cores when there are more (then the core count
    itself is the top level): a process curve needs a worker per core to show where the cores end,
    and the plateau rule stops a flat curve early, so the extra levels cost little where they say nothing."""
    # a fractional quota's cores, rounded up: the level past them is the one that shows where they end
    return powers_of_two(max(16, math.ceil(_resources.usable_cores())))


@dataclass(frozen=True, slots=True, kw_only=True)
class DiagnoseSettings:
    """What a diagnosis measures; read from the environment by :meth:`from_env`. Each field is the setting of
    the same key in :data:`stagebench._settings.SETTINGS`, which says what it means and checks its value."""

    num_items: int | None = _default("num_items")
    output_dir: str | None = None
    budget_s: float = _default("budget_s")
    min_window_s: float = _default("min_window_s")
    precision: float = _default("precision")
    concurrency: tuple[int, ...] = field(default_factory=_default_grid)
    executors: tuple[str, ...] = _default("executors")
    harnesses: tuple[str, ...] = _default("harnesses")
    warmup_s: float = _default("warmup_s")
    timeout_s: float = _default("timeout_s")
    validation_s: float | None = None
    validate: str = _default("validate")
    cache_dir: str | None = None
    cache_max_mb: float = _default("cache_max_mb")
    process_flat_levels: int = _default("process_flat_levels")
    process_ceilings: str = _default("process_ceilings")
    paired_rounds: int = _default("paired_rounds")
    target_rate: float | None = None
    quick: str = _default("quick")
    trainer: str = _default("trainer")
    trainer_s: float = _default("trainer_s")
    job_s: float | None = _default("job_s")
    gil_probe: str = _default("gil_probe")
    rank_wait_s: float = _default("rank_wait_s")
    nproc_per_node: int | None = _default("nproc_per_node")

    def __post_init__(self) -> None:
        for s in SETTINGS:
            if s.key != "max_concurrency":
                check(s.key, getattr(self, s.key))
        if not self.timeout_s > self.budget_s + self.warmup_s:
            raise SettingsError(
                f"STAGEBENCH_TIMEOUT_S ({self.timeout_s:g}) must be larger than budget + warm-up "
                f"({self.budget_s + self.warmup_s:g} s)"
            )

    def measure_config(self) -> Any:
        """How each stage point is measured (:class:`stagebench.MeasureConfig`), from these settings."""
        return MeasureConfig(
            budget_s=self.budget_s,
            min_window_s=self.min_window_s,
            precision=self.precision,
            warmup_s=self.warmup_s,
            timeout_s=self.timeout_s,
        )

    @property
    def validation_window_s(self) -> float:
        return max(1.0, self.budget_s) if self.validation_s is None else self.validation_s

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> DiagnoseSettings:
        """Settings from the environment; :class:`SettingsError` on a bad value (nothing run yet)."""
        kw = read_env(os.environ if environ is None else environ)
        if kw.get("quick") == "on":  # the quick preset, under whatever the user set
            for key, value in QUICK.items():
                if key not in kw and not (key == "concurrency" and "max_concurrency" in kw):
                    kw[key] = value
        top = kw.pop("max_concurrency", None)
        if top is not None:
            if "concurrency" in kw:
                raise SettingsError(
                    "set one of STAGEBENCH_CONCURRENCY (a list) and STAGEBENCH_MAX_CONCURRENCY (a maximum), not both"
                )
            kw["concurrency"] = powers_of_two(top)
        if kw.get("output_dir"):  # a job of several hosts: each host's local rank 0 writes its own
            kw["output_dir"] = per_host(str(kw["output_dir"]), environ)
        return cls(**kw)

    def as_meta(self) -> dict[str, Any]:
        d = asdict(self)
        d["concurrency"] = list(self.concurrency)
        d["validation_s"] = self.validation_window_s
        return d
