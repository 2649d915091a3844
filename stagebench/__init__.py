"""stagebench: how each stage of a data-loading pipeline scales, and why.

The public API is small and imported lazily: ``import stagebench`` costs
almost nothing (diagnostic mode is activated from a ``.pth`` file at every
interpreter start, so the package must stay light).

Measuring::

    import stagebench
    row = stagebench.measure_stage(fn, inputs, executor="process", concurrency=4)
    df = stagebench.sweep_stage(fn, inputs, config=stagebench.SweepConfig())
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "MeasureConfig",
    "SweepConfig",
    "measure_stage",
    "sweep_stage",
    "collect_provenance",
    "read_rows",
    "RunDir",
    "__version__",
]

_LAZY = {
    "MeasureConfig": "._config",
    "SweepConfig": "._config",
    "measure_stage": "._measure",
    "sweep_stage": "._sweep",
    "collect_provenance": "._provenance",
    "read_rows": "._results",
    "RunDir": "._results",
}


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'stagebench' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(mod, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # for type checkers and IDEs only
    from ._config import MeasureConfig, SweepConfig
    from ._measure import measure_stage
    from ._provenance import collect_provenance
    from ._results import RunDir, read_rows
    from ._sweep import sweep_stage
