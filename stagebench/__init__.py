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

from stagebench._version import __version__

# Not `from typing import TYPE_CHECKING`: importing typing costs ~10 ms, and this
# package is imported at interpreter start whenever diagnostic mode is on.
TYPE_CHECKING = False

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
    "MeasureConfig": ("stagebench.core._config", "MeasureConfig"),
    "SweepConfig": ("stagebench.core._config", "SweepConfig"),
    "measure_stage": ("stagebench.core._measure", "measure_stage"),
    "sweep_stage": ("stagebench.core._sweep", "sweep_stage"),
    "DiagnoseSettings": ("stagebench.pipeline._settings", "DiagnoseSettings"),
    "diagnose_pipeline": ("stagebench.pipeline._diagnose", "diagnose_pipeline"),
    "LoaderKnobs": ("stagebench.model._knobs", "LoaderKnobs"),
    "LoaderSweepConfig": ("stagebench.loader._sweep", "LoaderSweepConfig"),
    "run_loader_sweep": ("stagebench.loader._sweep", "run_loader_sweep"),
    "sweep_dataset": ("stagebench.loader._intercept", "sweep_dataset"),
    "summarize_run": ("stagebench.analysis._summary", "summarize_run"),
    "write_report": ("stagebench.report._render", "write_report"),
    "rebuild_report": ("stagebench.sweep._rebuild", "rebuild"),
    "compare_runs": ("stagebench.report._compare", "compare_runs"),
    "RunDir": ("stagebench.runs._results", "RunDir"),
    "read_rows": ("stagebench.runs._results", "read_rows"),
    "collect_provenance": ("stagebench.runs._provenance", "collect_provenance"),
}


def __getattr__(name: str) -> object:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'stagebench' has no attribute {name!r}")
    # `import stagebench` runs at every interpreter start (the .pth): importlib loads at the first name asked for
    import importlib

    mod, attr = target
    value = getattr(importlib.import_module(mod), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # for type checkers and IDEs only
    from stagebench.analysis._summary import summarize_run
    from stagebench.core._config import MeasureConfig, SweepConfig
    from stagebench.core._measure import measure_stage
    from stagebench.core._sweep import sweep_stage
    from stagebench.loader._intercept import sweep_dataset
    from stagebench.loader._sweep import LoaderSweepConfig, run_loader_sweep
    from stagebench.model._knobs import LoaderKnobs
    from stagebench.pipeline._diagnose import diagnose_pipeline
    from stagebench.pipeline._settings import DiagnoseSettings
    from stagebench.report._compare import compare_runs
    from stagebench.report._render import write_report
    from stagebench.runs._provenance import collect_provenance
    from stagebench.runs._results import RunDir, read_rows
    from stagebench.sweep._rebuild import rebuild as rebuild_report
