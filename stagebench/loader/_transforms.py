"""Each transform of a dataset's composed ``transform``, measured as a pipeline stage.

A loader sweep says how fast the whole ``__getitem__`` runs; when it is slow,
the question is which transform. A ``Compose``-like transform (an object with
a ``.transforms`` list, or a plain list/tuple of callables) is split into its
steps and each step is swept with :func:`stagebench.sweep_stage` on cached
inputs, exactly like a pipeline stage, so the same analysis (GIL-bound,
CPU-bound, ...) applies.

Inputs are cached honestly: the first step is temporarily replaced by a
recorder that keeps its input and then runs the step, ``dataset[i]`` is called
for a few indices (so whatever ``__getitem__`` does before the transform --
reading, decoding -- happens as usual), and the step is put back. Each later
step's inputs are the previous step's outputs on those items.

Rows go to ``RUN_DIR/transforms.csv`` (STAGE_COLUMNS, the pipeline row format);
the analysed stages go to run.json ``transforms`` and summary.json ``transforms``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stagebench.core._config import MeasureConfig, SweepConfig, powers_of_two
from stagebench.core._resources import usable_cores
from stagebench.runs._provenance import is_free_threaded
from stagebench.runs._results import TRANSFORMS_CSV, RowWriter
from stagebench.runs._schema import STAGE_COLUMNS

__all__ = ["find_transforms", "capture_transform_inputs", "isolate_transforms", "TRANSFORMS_CSV"]


def _steps_of(t: Any) -> list[Callable] | None:
    for steps in (getattr(t, "transforms", None), t):  # a Compose-like object, or a plain list of callables
        if isinstance(steps, (list, tuple)) and steps and all(callable(s) for s in steps):
            return list(steps)
    return None


def find_transforms(dataset: Any) -> tuple[Any, list[Callable]] | None:
    """(object holding ``.transform``, its steps), looking through wrappers such as Subset."""
    obj = dataset
    for _ in range(4):
        if obj is None:
            return None
        t = getattr(obj, "transform", None)
        if t is not None:
            steps = _steps_of(t)
            return (obj, steps) if steps else None
        obj = getattr(obj, "dataset", None)
    return None


def _step_name(fn: Callable) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


class _Recorder:
    def __init__(self, fn: Callable) -> None:
        self.fn = fn
        self.inputs: list[Any] = []

    def __call__(self, x: Any) -> Any:
        self.inputs.append(x)
        return self.fn(x)


def capture_transform_inputs(dataset: Any, holder: Any, n_items: int) -> list[Any]:
    """Inputs of the first transform step for up to ``n_items`` items of ``dataset``."""
    t = holder.transform
    if isinstance(getattr(t, "transforms", None), (list, tuple)):
        seq_owner, attr = t, "transforms"  # a Compose-like object
    else:
        seq_owner, attr = holder, "transform"  # a plain list/tuple of callables
    original = getattr(seq_owner, attr)
    rec = _Recorder(original[0])
    replaced = [rec, *original[1:]]
    setattr(seq_owner, attr, type(original)(replaced) if isinstance(original, tuple) else replaced)
    try:
        size = len(dataset)
        idx = sorted({i * size // n_items for i in range(min(n_items, size))})
        for i in idx:
            dataset[i]
    finally:
        setattr(seq_owner, attr, original)
    return rec.inputs


def isolate_transforms(dataset: Any, *, run_dir: Path, config: Any, progress: Any = None) -> list[dict[str, Any]]:
    """Sweep each composed transform of ``dataset``; returns pipeline-style stage summaries ([] if none)."""
    found = find_transforms(dataset)
    if found is None or not hasattr(dataset, "__getitem__"):
        return []
    try:
        len(dataset)
    except TypeError:
        return []
    holder, steps = found

    try:
        inputs = capture_transform_inputs(dataset, holder, config.transform_items)
    except Exception as e:  # the loader sweep stands without this
        return [_failed("transform", 0, f"could not capture transform inputs: {type(e).__name__}: {e}")]
    if not inputs:
        return []

    cores = usable_cores()
    maxc = config.transform_max_concurrency or max(1, math.ceil(cores))  # a fractional quota's cores, rounded up
    sweep_cfg = SweepConfig(
        executors=tuple(config.transform_executors),
        concurrency=powers_of_two(maxc),
        measure=MeasureConfig(
            budget_s=config.transform_budget_s,
            warmup_s=min(0.2, config.warmup_s),
            timeout_s=max(10.0, 20 * config.transform_budget_s),
        ),
    )
    from stagebench.core._sweep import sweep_stage  # start-up cost: numpy, only with transforms

    out: list[dict[str, Any]] = []
    names: dict[str, int] = {}
    with RowWriter(Path(run_dir) / TRANSFORMS_CSV, STAGE_COLUMNS) as writer:
        for k, fn in enumerate(steps):
            base = _step_name(fn)
            names[base] = names.get(base, 0) + 1
            name = base if names[base] == 1 else f"{base}#{names[base]}"
            if progress is not None:
                progress.message(f"transform {k}: {name} on {len(inputs)} cached inputs")
            df = sweep_stage(fn, inputs, name=name, config=sweep_cfg, writer=writer, progress=progress)
            out.append(_analyse(df, name, k, cores))
            try:
                inputs = [fn(x) for x in inputs]
            except Exception as e:  # a transform that fails on real outputs: the rest are reported as not measured
                why = f"not measured: the previous transform raised {type(e).__name__}: {e}"
                out += [_failed(_step_name(rest), j, why) for j, rest in enumerate(steps[k + 1 :], start=k + 1)]
                break
    return out


def _failed(name: str, index: int, note: str) -> dict[str, str | int]:
    """The entry of a transform that was not measured, ``note`` saying why."""
    return {"name": name, "index": index, "type": "pipe", "status": "failed", "classification": "unknown", "note": note}


def _analyse(df: Any, name: str, index: int, cores: float) -> dict[str, Any]:
    """The pipeline analysis of one stage's rows; a plain best-point summary where the analysis fails."""
    from stagebench.analysis._stage import analyze_stage  # start-up cost: pandas, only with transforms

    try:
        res = dict(analyze_stage(df, cores=cores, free_threaded=is_free_threaded()).to_json())
    except Exception as e:  # fall back to the plain summary below
        note = f"analysis failed: {type(e).__name__}: {e}"
    else:
        res.setdefault("name", name)
        res["index"] = index
        res.setdefault("type", "pipe")
        return res
    stage_rows = df[(df["role"] == "stage") & (df["status"] == "ok")]
    ceil_rows = df[(df["role"] == "ceiling") & (df["status"] == "ok")]
    best = None
    if len(stage_rows):
        r = stage_rows.loc[stage_rows["qps"].idxmax()]
        best = {
            k: (r[k].item() if hasattr(r[k], "item") else r[k])
            for k in ("executor", "concurrency", "qps", "qps_low", "qps_high", "harness")
        }
    status = "ok" if best is not None else (str(df["status"].iloc[0]) if len(df) else "failed")
    return {
        "name": name,
        "index": index,
        "type": "pipe",
        "status": status,
        "classification": "unknown",
        "best": best,
        "recommended": None,
        "ceiling_qps": float(ceil_rows["qps"].max()) if len(ceil_rows) else math.nan,
        "cpu_s_per_item": float(stage_rows["cpu_s_per_item"].median()) if len(stage_rows) else math.nan,
        "note": note,
    }
