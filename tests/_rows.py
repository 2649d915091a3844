"""Synthetic measurement rows from the physics the analysis assumes (for unit tests).

A stage takes ``gil_ms`` holding the GIL, ``free_cpu_ms`` computing without it
and ``wait_ms`` waiting, per item. Then, with ``cores`` cores and a harness
that holds the GIL ``overhead_ms`` per item on threads:

- threads:   min(c / t, 1 / (g + h), cores / (cpu + h))
- processes: min(c / (t + ipc latency), cores / (cpu + ipc CPU), process ceiling)
- ceilings:  threads 1 / h (one core), processes the given ``process_ceiling``

Rows carry every STAGE_COLUMNS key, a symmetric interval of ``noise`` and a
batch CV, like the measurement core's rows. Real measurements are noisier;
the known-answer tests on real stages live next to the unit tests.
"""

from __future__ import annotations

import math

import pandas as pd

from stagebench.analysis._stage import analyze_stage
from stagebench.runs._schema import STAGE_COLUMNS

__all__ = ["analyzed", "model_rows", "row"]


def analyzed(rows, **kw):
    """:func:`analyze_stage`'s entry of ``rows`` as ``summary.json`` holds it."""
    return analyze_stage(rows, **kw).to_json()


def row(
    stage: str,
    executor: str,
    concurrency: int,
    qps: float,
    *,
    role: str = "stage",
    harness: str = "direct",
    status: str = "ok",
    reason: str = "",
    noise: float = 0.03,
    cores_used: float = math.nan,
    cpu_s_per_item: float = math.nan,
    latency_ms: float = math.nan,
    payload_bytes: float = 100.0,
    window_s: float = 1.0,
) -> dict:
    r = {c: math.nan for c in STAGE_COLUMNS}
    ok = status == "ok"
    r.update(
        stage=stage,
        role=role,
        executor=executor,
        harness=harness,
        concurrency=concurrency,
        status=status,
        reason=reason,
        error_example="",
        n_errors=0,
        workers_seen=concurrency if ok else 0,
        qps=qps if ok else math.nan,
        qps_low=qps * (1 - noise) if ok else math.nan,
        qps_high=qps * (1 + noise) if ok else math.nan,
        qps_cv=noise / 2 if ok else math.nan,
        n_items=qps * window_s if ok else math.nan,
        n_batches=10 if ok else math.nan,
        window_s=window_s,
        cores_used=cores_used,
        cpu_s_per_item=cpu_s_per_item,
        latency_p50_ms=latency_ms,
        payload_bytes=payload_bytes,
        started_at="2024-01-01T00:00:00",
        elapsed_s=window_s + 0.2,
    )
    return r


def model_rows(
    stage: str,
    *,
    gil_ms: float,
    wait_ms: float,
    free_cpu_ms: float = 0.0,
    cores: int = 2,
    levels: tuple[int, ...] = (1, 2, 4, 8, 16),
    executors: tuple[str, ...] = ("thread", "process"),
    harness: str = "direct",
    overhead_ms: float = 0.005,
    ipc_ms: float = 0.2,
    process_ceiling: float = 3000.0,
    ceiling: bool = True,
    noise: float = 0.03,
    payload_bytes: float = 100.0,
) -> pd.DataFrame:
    g, w, n, h, ipc = gil_ms / 1e3, wait_ms / 1e3, free_cpu_ms / 1e3, overhead_ms / 1e3, ipc_ms / 1e3
    t = g + w + n
    cpu = g + n
    rows = []
    for ex in executors:
        for c in levels:
            if ex in ("thread", "async"):
                lane = t + h
                q = min(c / lane, 1 / (g + h), cores / (cpu + h))
                cpu_item = cpu + h
                lat = max(t, c / q - h) * 1e3
            else:
                lane = t + ipc
                q = min(c / lane, cores / (cpu + ipc), process_ceiling)
                cpu_item = cpu + ipc
                lat = c / q * 1e3
            rows.append(
                row(
                    stage,
                    ex,
                    c,
                    q,
                    harness=harness,
                    noise=noise,
                    cores_used=q * cpu_item,
                    cpu_s_per_item=cpu_item,
                    latency_ms=lat,
                    payload_bytes=payload_bytes,
                )
            )
            if ceiling:
                if ex in ("thread", "async"):
                    cq, ccpu = 1 / h, h
                else:
                    cq, ccpu = min(c / ipc, process_ceiling), ipc
                rows.append(
                    row(
                        stage,
                        ex,
                        c,
                        cq,
                        role="ceiling",
                        harness=harness,
                        noise=noise,
                        cores_used=min(cq * ccpu, cores),
                        cpu_s_per_item=ccpu,
                        latency_ms=0.001,
                        payload_bytes=payload_bytes,
                    )
                )
    return pd.DataFrame(rows, columns=list(STAGE_COLUMNS))
