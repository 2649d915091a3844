"""Run directories for report and comparison tests: synthetic rows and real measured ones.

Two kinds, for two jobs:

* ``synthetic_*``: rows with known numbers, written in milliseconds. Known-answer
  tests read values back out of the report (the recommended point, an interval,
  a hostile stage name) and byte-identity tests need inputs that never change.
* ``measure_run``: a few tiny stages measured for real with ``sweep_stage``, so
  the report is also exercised on rows the instrument produced (NaNs, skipped
  points, ceiling rows, odd latencies) rather than only on rows we imagined.

The summaries built here follow docs/contracts.md; they stand in for
``_analysis.summarize`` / ``_loader.summarize_loader`` where a test must not
depend on those modules' numbers.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import pandas as pd

from stagebench.runs._results import RunDir
from stagebench.runs._schema import LOADER_COLUMNS, STAGE_COLUMNS

HOSTILE = "<img src=x onerror=alert(1)>"
SCRIPT_BREAKOUT = "</script><script>alert(1)</script>"


PROVENANCE = {
    "taken_at": "2024-01-01T00:00:00+00:00",
    "hostname": "bench-a",
    "platform": "Linux-6.1-x86_64",
    "cpu_model": "Test CPU @ 2.0GHz",
    "cpu_count": 2,
    "cpu_affinity": [0, 1],
    "usable_cores": 2,
    "memory_total_gb": 8.0,
    "memory_available_gb": 6.0,
    "python": "3.11.2",
    "python_implementation": "CPython",
    "free_threaded": False,
    "libraries": {"stagebench": "0.1.0", "spdl": "0.8.0", "torch": "2.13.0"},
    "env": {"OMP_NUM_THREADS": "1"},
    "load_avg": [0.2, 0.3, 0.3],
}


def usl(c: float, lam: float, sigma: float, kappa: float) -> float:
    return lam * c / (1 + sigma * (c - 1) + kappa * c * (c - 1))


# --------------------------------------------------------------------------- synthetic pipeline


def _row(
    stage: str,
    role: str,
    executor: str,
    c: int,
    qps: float,
    *,
    harness: str = "direct",
    status: str = "ok",
    reason: str = "",
    cores: float = 1.0,
    lat_ms: float = 1.0,
) -> dict[str, Any]:
    row: dict[str, Any] = {k: math.nan for k in STAGE_COLUMNS}
    ok = status == "ok"
    row.update(
        stage=stage,
        role=role,
        executor=executor,
        harness=harness,
        concurrency=c,
        status=status,
        reason=reason,
        error_example="",
        n_errors=0,
        workers_seen=c if ok else 0,
        started_at="2024-01-01T00:00:00.000+00:00",
        elapsed_s=1.0,
    )
    if ok:
        row.update(
            qps=qps,
            qps_low=qps * 0.95,
            qps_high=qps * 1.05,
            qps_cv=0.04,
            n_items=qps * 0.5,
            window_s=0.5,
            warmup_s=0.1,
            n_batches=8,
            latency_p50_ms=lat_ms,
            latency_p90_ms=lat_ms * 1.3,
            latency_p99_ms=lat_ms * 2.0,
            cpu_s_per_item=cores / qps,
            cores_used=cores,
            mem_peak_mb=100.0 + 40 * c * (executor == "process"),
            mem_pss_mb=90.0 + 30 * c * (executor == "process"),
            disk_read_mb_s=0.0,
            read_mb_s=0.0,
            payload_bytes=120.0,
        )
    return row


#: stage -> (executor -> (lambda, sigma, kappa)): the "true" curves of the synthetic stages.
SYNTH_CURVES = {
    "decode": {"thread": (1000.0, 0.9, 0.0), "process": (950.0, 0.05, 0.01)},
    HOSTILE: {"thread": (500.0, 0.0, 0.0), "process": (480.0, 0.0, 0.002)},
}
GRID = (1, 2, 4, 8)


def synthetic_rows() -> pd.DataFrame:
    rows = []
    for stage, curves in SYNTH_CURVES.items():
        for ex, (lam, s, k) in curves.items():
            for c in GRID:
                q = usl(c, lam, s, k)
                rows.append(
                    _row(
                        stage,
                        "stage",
                        ex,
                        c,
                        q,
                        cores=min(c, 2) * (0.9 if stage == "decode" else 0.05),
                        lat_ms=1000.0 * c / q,
                    )
                )
                rows.append(
                    _row(
                        stage,
                        "ceiling",
                        ex,
                        c,
                        20000.0 * (c**0.3) if ex == "thread" else 6000.0 * c**0.8,
                        cores=1.0,
                        lat_ms=0.05,
                    )
                )
    # a point the instrument could not measure, and a crash: the report must list both with reasons
    rows.append(
        _row(
            "decode",
            "stage",
            "process",
            16,
            math.nan,
            status="crashed",
            reason="a worker process died (SIGKILL): out of memory?",
        )
    )
    rows.append(
        _row(
            HOSTILE,
            "stage",
            "thread",
            16,
            math.nan,
            status="skipped",
            reason="not measured: timeout at concurrency 8 (<b>no steady state</b>)",
        )
    )
    return pd.DataFrame(rows, columns=list(STAGE_COLUMNS))


def synthetic_meta(*, hostname: str = "bench-a") -> dict[str, Any]:
    prov = dict(PROVENANCE, hostname=hostname)
    return {
        "schema_version": 1,
        "kind": "pipeline",
        "created_at": "2024-01-01T00:00:00+00:00",
        "command": "python train.py",
        "provenance": prov,
        "provenance_after": prov,
        "settings": {
            "budget_s": 0.5,
            "concurrency": list(GRID),
            "executors": ["thread", "process"],
            "harnesses": ["direct"],
        },
        "stages": [
            {
                "name": "decode",
                "index": 1,
                "type": "pipe",
                "is_async": False,
                "user_executor": "thread",
                "user_concurrency": 4,
            },
            {
                "name": HOSTILE,
                "index": 2,
                "type": "pipe",
                "is_async": False,
                "user_executor": "default",
                "user_concurrency": 1,
            },
        ],
        "not_isolated": [{"name": SCRIPT_BREAKOUT, "reason": "path variant: <runs in a subprocess region>"}],
    }


def synthetic_summary(rows: pd.DataFrame, meta: dict[str, Any]) -> dict[str, Any]:
    """A pipeline summary in the docs/contracts.md shape, numbers taken from the synthetic truth."""
    stages = []
    for st in meta["stages"]:
        name = st["name"]
        curves = SYNTH_CURVES[name]
        sub = rows[(rows.stage == name) & (rows.role == "stage") & (rows.status == "ok")]
        best = sub.loc[sub.qps.idxmax()]
        near = sub[sub.qps >= 0.95 * best.qps].sort_values(["concurrency", "executor"]).iloc[0]
        fit = {}
        for ex, (lam, s, k) in curves.items():
            fit[f"direct/{ex}"] = {
                "model": "usl",
                "lambda": lam,
                "sigma": s,
                "kappa": k,
                "sigma_interval": [s * 0.8, s * 1.2],
                "kappa_interval": [0.0, k * 2],
                "amdahl_serial_fraction": s,
                "amdahl_interval": [s * 0.8, s * 1.2],
                "peak_concurrency": (math.sqrt((1 - s) / k) if k > 0 else None),
                "r2": 0.99,
                "levels": 4,
                "warning": None,
            }
        gil = 0.92 if name == "decode" else 0.03
        stages.append(
            {
                "name": name,
                "index": st["index"],
                "type": "pipe",
                "status": "ok",
                "classification": "gil-bound" if name == "decode" else "io-bound",
                "gil_fraction": gil,
                "gil_fraction_interval": [gil - 0.05, min(1.0, gil + 0.05)],
                "evidence": {
                    "summary": [
                        f"threads flat at {usl(8, *curves['thread']):.0f} items/s while processes scale",
                        "cores used stays near 1 on threads",
                    ],
                    "signals": {
                        "thread_vs_process": {
                            "value": 0.3,
                            "interval": [0.25, 0.35],
                            "label": "thread/process QPS at c=8 <not a direct GIL measurement>",
                        }
                    },
                },
                "fit": fit,
                "recommended": {
                    "executor": near.executor,
                    "concurrency": int(near.concurrency),
                    "qps": float(near.qps),
                    "qps_low": float(near.qps_low),
                    "qps_high": float(near.qps_high),
                    "harness": "direct",
                    "why": "smallest concurrency within 5% of the best",
                },
                "best": {
                    "executor": best.executor,
                    "concurrency": int(best.concurrency),
                    "qps": float(best.qps),
                    "qps_low": float(best.qps_low),
                    "qps_high": float(best.qps_high),
                    "harness": "direct",
                },
                "ceiling_qps": 20000.0,
                "cpu_s_per_item": 0.0009,
                "gil_s_per_item": 0.0009 * gil,
            }
        )
    pred = min(s["recommended"]["qps"] for s in stages)
    return {
        "schema_version": 1,
        "kind": "pipeline",
        "stagebench_version": "0.1.0",
        "provenance": meta["provenance"],
        "settings": meta["settings"],
        "verdict": f"decode is the bottleneck: GIL-bound; predicted {pred:.0f} items/s (the stage binds)",
        "warnings": ["the machine was busy before the run (1-min load 1.50 on 2 cores): <timings may be low>"],
        "stages": stages,
        "not_isolated": meta["not_isolated"],
        "prediction": {
            "qps": pred,
            "binding": "stage",
            "bottleneck": "decode",
            "explanation": "decode on processes caps the pipeline",
            "naive_qps": pred,
            "method": "replay",
            "bounds_qps": pred * 1.2,
            "replay": {
                "qps": pred,
                "qps_low": pred * 0.95,
                "qps_high": pred * 1.05,
                "seconds": 2.0,
                "stand_ins": [
                    {
                        "name": HOSTILE,
                        "executor": "thread",
                        "concurrency": 16,
                        "gil_s": 0.0001,
                        "free_s": 0.0,
                        "wait_s": 0.01,
                        "note": "",
                    },
                    {
                        "name": "decode",
                        "executor": "process",
                        "concurrency": 8,
                        "gil_s": 0.0003,
                        "free_s": 0.0009,
                        "wait_s": 0.0,
                        "note": "process: its work runs outside the main process's GIL",
                    },
                ],
            },
            "bounds": {"stages": pred, "cores": 9000.0, "gil": 1 / 0.00003},
            "settings": [
                {
                    "stage": s["name"],
                    "executor": s["recommended"]["executor"],
                    "concurrency": s["recommended"]["concurrency"],
                }
                for s in stages
            ],
        },
        "validation": {
            "qps": pred * 0.93,
            "qps_low": pred * 0.9,
            "qps_high": pred * 0.96,
            "seconds": 2.0,
            "error_vs_prediction": -0.07,
        },
        "findings": [
            {
                "severity": "high",
                "title": "decode holds the GIL 92% of its time",
                "stage": "decode",
                "detail": "use a process executor; expected 3.4x at 4 processes",
                "evidence": {},
            },
            {
                "severity": "info",
                "title": f"{HOSTILE} waits",
                "stage": HOSTILE,
                "detail": "io-bound: threads are enough",
                "evidence": {},
            },
        ],
    }


def write_run(
    path: Path, rows: pd.DataFrame, meta: dict[str, Any], summary: dict[str, Any] | None, columns=STAGE_COLUMNS
) -> Path:
    rd = RunDir.create(path)
    rd.write_meta(meta)
    with rd.writer(columns) as w:
        for r in rows.to_dict("records"):
            w.write(r)
    if summary is not None:
        rd.write_summary(summary)
    return rd.path


def synthetic_run(path: Path, *, hostname: str = "bench-a", scale: float = 1.0) -> Path:
    """A complete pipeline run dir (rows, run.json, summary.json); ``scale`` multiplies every QPS."""
    rows = synthetic_rows()
    for col in ("qps", "qps_low", "qps_high"):
        rows[col] = rows[col] * scale
    meta = synthetic_meta(hostname=hostname)
    summary = synthetic_summary(rows, meta)
    return write_run(path, rows, meta, summary)


# --------------------------------------------------------------------------- synthetic loader


def loader_truth(nw: int, pf: int, scale: float = 1.0) -> float:
    """samples/s: workers help up to 2 cores, prefetch a little, then IPC costs."""
    base = 300.0 if nw == 0 else 300.0 * min(nw, 2) * (1.0 + 0.05 * (pf - 1)) / (1 + 0.05 * max(0, nw - 2))
    return base * scale


def synthetic_loader_rows(scale: float = 1.0, backend: str = "torch") -> pd.DataFrame:
    rows = []
    for nw in (0, 1, 2, 4):
        for pf in (None,) if nw == 0 else (2, 4):
            q = loader_truth(nw, pf or 1, scale)
            rows.append(
                {
                    "loader": "imagenet",
                    "backend": backend,
                    "num_workers": nw,
                    "prefetch_factor": pf,
                    "persistent_workers": nw > 0,
                    "pin_memory": "not applicable",
                    "status": "ok",
                    "reason": "",
                    "samples_per_s": q,
                    "samples_per_s_low": q * 0.96,
                    "samples_per_s_high": q * 1.04,
                    "batches_per_s": q / 32,
                    "cv": 0.03,
                    "time_to_first_batch_s": 0.05 + 0.4 * nw,
                    "epoch_stall_s": 0.3 * nw,
                    "n_batches": 10,
                    "window_s": 1.0,
                    "cores_used": min(nw, 2) + 0.3,
                    "mem_pss_mb": 200.0 + 80 * nw,
                    "mem_uss_mb": 180.0 + 70 * nw,
                    "mem_main_mb": 200.0,
                    "mem_workers_mb": 80.0 * nw,
                    "disk_read_mb_s": 12.0,
                    "search_phase": "workers" if pf in (None, 2) else "prefetch",
                    "started_at": "2024-01-01T00:00:00+00:00",
                    "elapsed_s": 2.0,
                }
            )
    rows.append(
        {k: math.nan for k in LOADER_COLUMNS}
        | {
            "loader": "imagenet",
            "backend": backend,
            "num_workers": 8,
            "prefetch_factor": 2,
            "persistent_workers": True,
            "pin_memory": "not applicable",
            "status": "failed",
            "reason": "worker killed (OOM?)",
            "search_phase": "workers",
            "started_at": "2024-01-01T00:00:00+00:00",
            "elapsed_s": 3.0,
        }
    )
    return pd.DataFrame(rows, columns=list(LOADER_COLUMNS))


def synthetic_loader_meta(*, hostname: str = "bench-a", backend: str = "torch", label: str | None = None) -> dict:
    prov = dict(PROVENANCE, hostname=hostname)
    meta = {
        "schema_version": 1,
        "kind": "loader",
        "created_at": "2024-01-01T00:00:00+00:00",
        "command": "stagebench sweep loader=imagenet",
        "provenance": prov,
        "provenance_after": prov,
        "settings": {"budget_s": 1.0, "strategy": "adaptive"},
        "loader": {"name": "imagenet", "backend": backend, "batch_size": 32},
        "stages": [],
        "not_isolated": [],
    }
    if label:
        meta["label"] = label
    return meta


def synthetic_loader_summary(rows: pd.DataFrame, meta: dict) -> dict:
    ok = rows[rows.status == "ok"]
    best = ok.loc[ok.samples_per_s.idxmax()]
    near = ok[ok.samples_per_s >= 0.95 * best.samples_per_s].sort_values(["num_workers", "prefetch_factor"]).iloc[0]

    def knobs(r):  # the shape _loader_findings._public gives: knobs and the point's measurements
        return {
            "num_workers": int(r.num_workers),
            "prefetch_factor": None if pd.isna(r.prefetch_factor) else int(r.prefetch_factor),
            "persistent_workers": bool(r.persistent_workers),
            "pin_memory": r.pin_memory,
            "samples_per_s": float(r.samples_per_s),
            "samples_per_s_low": float(r.samples_per_s_low),
            "samples_per_s_high": float(r.samples_per_s_high),
            "batches_per_s": float(r.batches_per_s),
            "mem_pss_mb": float(r.mem_pss_mb),
            "cores_used": float(r.cores_used),
            "time_to_first_batch_s": float(r.time_to_first_batch_s),
            "epoch_stall_s": float(r.epoch_stall_s),
        }

    return {
        "schema_version": 1,
        "kind": "loader",
        "stagebench_version": "0.1.0",
        "provenance": meta["provenance"],
        "settings": meta["settings"],
        "loader": meta["loader"],
        "verdict": f"use num_workers={int(near.num_workers)}: {near.samples_per_s:.0f} samples/s",
        "warnings": [],
        "recommended": knobs(near) | {"why": "cheapest within 5% of the best"},
        "best": knobs(best),
        "points": ok.to_dict("records"),
        "search": {
            "strategy": "adaptive",
            "points_measured": len(rows),
            "seconds": 20.0,
            "full_grid_points": 20,
            "estimated_full_grid_seconds": 55.0,
            "time_saved_s": 35.0,
        },
        "target": None,
        "findings": [
            {
                "severity": "medium",
                "title": "workers start slowly",
                "detail": "use persistent_workers=True",
                "stage": None,
                "evidence": {},
            }
        ],
        "transforms": [],
    }


def synthetic_loader_run(
    path: Path, *, hostname: str = "bench-a", backend: str = "torch", scale: float = 1.0, label: str | None = None
) -> Path:
    rows = synthetic_loader_rows(scale, backend)
    meta = synthetic_loader_meta(hostname=hostname, backend=backend, label=label)
    return write_run(path, rows, meta, synthetic_loader_summary(rows, meta), columns=LOADER_COLUMNS)


# --------------------------------------------------------------------------- real measurements


def spin_loop(x: int) -> int:
    """Fixed pure-Python work (holds the GIL): a calibrated loop count, not a wall-clock spin."""
    acc = 0
    for i in range(6000):
        acc += i * x
    return acc


def sleep_2ms(x: int) -> int:
    time.sleep(0.002)
    return x


def mixed(x: int) -> int:
    acc = 0
    for i in range(2000):
        acc += i
    time.sleep(0.001)
    return x + acc


def measure_run(path: Path, *, budget_s: float = 0.25, with_sleep: bool = False) -> Path:
    """Measure tiny stages for real into a pipeline run dir (no summary.json).

    A GIL-holding loop and a mixed stage under the hostile name; ``with_sleep`` adds
    a sleep stage (a third of the time more)."""
    from stagebench import MeasureConfig, SweepConfig, collect_provenance, sweep_stage

    rd = RunDir.create(path)
    measure = MeasureConfig(budget_s=budget_s, warmup_s=0.05, timeout_s=20.0, max_batches=6)
    cfg = SweepConfig(
        executors=("thread", "process"),
        concurrency=GRID,
        harnesses=("direct",),
        ceiling=True,
        measure=measure,
        ceiling_budget_s=0.15,
    )
    stages = [("spin_loop", spin_loop), (HOSTILE, mixed)]
    if with_sleep:
        stages.insert(0, ("sleep_2ms", sleep_2ms))
    meta = {
        "schema_version": 1,
        "kind": "pipeline",
        "created_at": "2024-01-01T00:00:00+00:00",
        "command": "tests/_fixtures.py measure_run",
        "provenance": collect_provenance(),
        "settings": {
            "budget_s": budget_s,
            "concurrency": list(GRID),
            "executors": list(cfg.executors),
            "harnesses": list(cfg.harnesses),
        },
        "stages": [
            {
                "name": n,
                "index": i + 1,
                "type": "pipe",
                "is_async": False,
                "user_executor": "default",
                "user_concurrency": 1,
            }
            for i, (n, _) in enumerate(stages)
        ],
        "not_isolated": [],
    }
    rd.write_meta(meta)
    inputs = list(range(64))
    with rd.writer(STAGE_COLUMNS) as w:
        for name, fn in stages:
            sweep_stage(fn, inputs, name=name, config=cfg, writer=w)
    meta["provenance_after"] = collect_provenance()
    rd.write_meta(meta)
    return rd.path


def simple_summary(rows: pd.DataFrame, meta: dict) -> dict:
    """A contract-shaped pipeline summary computed naively from real rows (no analysis module needed).

    Fits USL by least squares so the report's fitted-curve drawing sees real parameters.
    """
    import numpy as np
    from scipy.optimize import curve_fit

    stages = []
    for st in meta["stages"]:
        name = st["name"]
        sub = rows[(rows.stage == name) & (rows.role == "stage") & (rows.status == "ok")]
        if sub.empty:
            stages.append(
                {
                    "name": name,
                    "index": st["index"],
                    "type": st["type"],
                    "status": "failed",
                    "classification": "unknown",
                    "gil_fraction": None,
                    "fit": {},
                    "evidence": {},
                }
            )
            continue
        best = sub.loc[sub.qps.idxmax()]
        near = sub[sub.qps >= 0.95 * best.qps].sort_values(["concurrency", "executor"], ascending=[True, False]).iloc[0]
        fit = {}
        for (h, ex), g in sub.groupby(["harness", "executor"]):
            c, q = g.concurrency.to_numpy(float), g.qps.to_numpy(float)
            try:
                p, _ = curve_fit(usl, c, q, p0=[q[0], 0.1, 0.0], bounds=([0, 0, 0], [np.inf, 1, 1]))
                fit[f"{h}/{ex}"] = {
                    "model": "usl",
                    "lambda": p[0],
                    "sigma": p[1],
                    "kappa": p[2],
                    "levels": len(c),
                    "r2": None,
                    "warning": None,
                }
            except Exception as e:  # a failed fit is something the report must show, not hide
                fit[f"{h}/{ex}"] = {"model": "usl", "warning": f"fit failed: {e}"}
        ceil = rows[(rows.stage == name) & (rows.role == "ceiling") & (rows.status == "ok")]

        def pt(r):
            return {
                "executor": r.executor,
                "concurrency": int(r.concurrency),
                "qps": float(r.qps),
                "qps_low": float(r.qps_low),
                "qps_high": float(r.qps_high),
                "harness": r.harness,
            }

        stages.append(
            {
                "name": name,
                "index": st["index"],
                "type": st["type"],
                "status": "ok",
                "classification": "unknown",
                "gil_fraction": None,
                "gil_fraction_interval": None,
                "evidence": {"summary": ["naive test summary: no analysis"], "signals": {}},
                "fit": fit,
                "recommended": pt(near) | {"why": "smallest concurrency within 5% of the best"},
                "best": pt(best),
                "ceiling_qps": float(ceil.qps.max()) if len(ceil) else None,
                "cpu_s_per_item": float(near.cpu_s_per_item),
                "gil_s_per_item": None,
            }
        )
    ok = [s for s in stages if s.get("recommended")]
    pred = min(s["recommended"]["qps"] for s in ok)
    neck = min(ok, key=lambda s: s["recommended"]["qps"])["name"]
    return {
        "schema_version": 1,
        "kind": "pipeline",
        "stagebench_version": "0.1.0",
        "provenance": meta["provenance"],
        "settings": meta["settings"],
        "verdict": f"{neck} is the bottleneck; predicted {pred:.0f} items/s (naive test summary)",
        "warnings": [],
        "stages": stages,
        "not_isolated": meta.get("not_isolated", []),
        "prediction": {
            "qps": pred,
            "binding": "stage",
            "bottleneck": neck,
            "explanation": "min of stages",
            "bounds": {"stages": pred, "cores": None, "gil": None},
            "naive_qps": pred,
            "settings": [
                {
                    "stage": s["name"],
                    "executor": s["recommended"]["executor"],
                    "concurrency": s["recommended"]["concurrency"],
                }
                for s in ok
            ],
        },
        "validation": None,
        "findings": [],
    }
