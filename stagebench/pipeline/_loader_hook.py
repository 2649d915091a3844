"""The DataLoader hook of diagnostic mode: the first DataLoader a script iterates is swept instead.

Installed once per process, by ``stagebench diagnose`` before the script runs and by the variable's
activation as soon as torch's DataLoader module is imported (:func:`stagebench.pipeline._spdl_hook.install`):
importing the loader sweep at interpreter start would cost every program torch's import time.
"""

from __future__ import annotations

from typing import Any

from stagebench._settings import SettingsError
from stagebench.loader._intercept import diagnose_first_loader
from stagebench.loader._sweep import LoaderSweepConfig
from stagebench.pipeline._settings import DiagnoseSettings
from stagebench.pipeline._state import State, say

__all__ = ["install_loader_hook"]


def install_loader_hook(settings: DiagnoseSettings | None = None) -> None:
    """PyTorch users: the first DataLoader the script iterates is swept instead, unless an SPDL pipeline
    is diagnosed first (its start removes this hook: ``State.on_start``). Once per process: both
    ``stagebench diagnose`` and the variable's activation (when torch's DataLoader module is imported)
    call it. ``settings``: read from the environment where not given (one line and exit 2 where bad)."""
    if State.loader_hook is not None:
        return
    if settings is None:
        try:
            settings = DiagnoseSettings.from_env()
        except SettingsError as e:
            say(f"error: {e}")
            raise SystemExit(2) from None
    State.loader_hook = remove = diagnose_first_loader(
        settings.output_dir, config=_loader_config(settings), target_rate=settings.target_rate
    )
    State.on_start.append(remove)


def _loader_config(settings: DiagnoseSettings) -> Any:
    """The same budgets for a caught DataLoader as for pipeline stages (one set of knobs)."""
    return LoaderSweepConfig(
        budget_s=max(settings.budget_s, 0.5),  # batches are slower than items: keep a few per window
        warmup_s=settings.warmup_s,
        timeout_s=max(settings.timeout_s, 2 * settings.budget_s + 1),
        transform_budget_s=max(0.2, settings.budget_s / 2),
        transform_executors=tuple(e for e in settings.executors if e in ("thread", "process")) or ("thread",),
    )
