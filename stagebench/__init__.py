"""stagebench: how each stage of a data-loading pipeline scales, and why.

The public API is small and imported lazily: ``import stagebench`` costs
almost nothing (diagnostic mode is activated from a ``.pth`` file at every
interpreter start, so the package must stay light).

Measuring::

    import stagebench
    row = stagebench.measure_stage(fn, inputs, executor="process", concurrency=4)
    df = stagebench.sweep_stage(fn, inputs, config=stagebench.SweepConfig())

Diagnosing a pipeline, sweeping a loader, reporting::

    summary = stagebench.diagnose_pipeline(builder.get_config(), out="reports/mine")
    summary = stagebench.sweep_dataset(dataset, backend="torch", batch_size=32, run_dir="reports/dl")
    stagebench.rebuild_report("reports/mine")
"""

from __future__ import annotations

# Not `from typing import TYPE_CHECKING`: importing typing costs ~10 ms, and this
# package is imported at interpreter start whenever diagnostic mode is on.
TYPE_CHECKING = False

__version__ = "0.1.0"

__all__ = [
    # measuring one stage
    "MeasureConfig",
    "SweepConfig",
    "measure_stage",
    "sweep_stage",
    # diagnosing an SPDL pipeline
    "DiagnoseSettings",
    "diagnose_pipeline",
    # loader sweeps
    "LoaderKnobs",
    "LoaderSweepConfig",
    "run_loader_sweep",
    "sweep_dataset",
    # analysis, reports, comparisons
    "summarize_run",
    "write_report",
    "rebuild_report",
    "compare_runs",
    # run directories and provenance
    "RunDir",
    "read_rows",
    "collect_provenance",
    "__version__",
]

_LAZY = {
    "MeasureConfig": ("._config", "MeasureConfig"),
    "SweepConfig": ("._config", "SweepConfig"),
    "measure_stage": ("._measure", "measure_stage"),
    "sweep_stage": ("._sweep", "sweep_stage"),
    "DiagnoseSettings": ("._diagnose", "DiagnoseSettings"),
    "diagnose_pipeline": ("._diagnose", "diagnose_pipeline"),
    "LoaderKnobs": ("._loader", "LoaderKnobs"),
    "LoaderSweepConfig": ("._loader", "LoaderSweepConfig"),
    "run_loader_sweep": ("._loader", "run_loader_sweep"),
    "sweep_dataset": ("._loader", "sweep_dataset"),
    "summarize_run": ("._report", "summarize_run"),
    "write_report": ("._report", "write_report"),
    "rebuild_report": ("._report", "rebuild"),
    "compare_runs": ("._compare", "compare_runs"),
    "RunDir": ("._results", "RunDir"),
    "read_rows": ("._results", "read_rows"),
    "collect_provenance": ("._provenance", "collect_provenance"),
}


def __getattr__(name: str) -> object:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'stagebench' has no attribute {name!r}")
    import importlib

    mod, attr = target
    value = getattr(importlib.import_module(mod, __name__), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # for type checkers and IDEs only
    from ._compare import compare_runs
    from ._config import MeasureConfig, SweepConfig
    from ._diagnose import DiagnoseSettings, diagnose_pipeline
    from ._loader import LoaderKnobs, LoaderSweepConfig, run_loader_sweep, sweep_dataset
    from ._measure import measure_stage
    from ._provenance import collect_provenance
    from ._report import rebuild as rebuild_report
    from ._report import summarize_run, write_report
    from ._results import RunDir, read_rows
    from ._sweep import sweep_stage
