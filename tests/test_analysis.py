"""Per-stage verdicts and the pipeline summary, on model rows and on awkward real-world rows."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pandas as pd
import pytest
from _rows import analyzed, model_rows, row

from stagebench._numbers import fmt_cores, fmt_ms, fmt_q
from stagebench.analysis._findings import build_findings
from stagebench.analysis._labels import CLASSIFICATIONS
from stagebench.analysis._pipeline import summarize
from stagebench.model._pipeline import Prediction, WholeRun
from stagebench.model._stage import StageEntry, changed
from stagebench.runs._results import RunDir, read_rows, to_jsonable
from stagebench.runs._schema import STAGE_COLUMNS

STAGE_KEYS = {
    "name",
    "index",
    "type",
    "status",
    "classification",
    "gil_fraction",
    "gil_fraction_interval",
    "evidence",
    "fit",
    "recommended",
    "best",
    "ceiling_qps",
    "cpu_s_per_item",
    "gil_s_per_item",
}


def _found(found) -> list[dict]:
    """A stage's findings as the summary writes them."""
    return [x.finding.to_json() for x in found]


def _meta(*names, **extra):
    return {
        "provenance": {"usable_cores": 2, "load_avg": [0.1, 0.1, 0.1], "hostname": "h"},
        "settings": {"budget_s": 1},
        "stages": [{"name": n, "index": i, "type": "pipe"} for i, n in enumerate(names)],
        **extra,
    }


# ------------------------------------------------------------------ classification
def test_sleep_stage_is_io_bound_and_recommended_at_the_top_of_the_grid():
    st = analyzed(model_rows("sleep", gil_ms=0.0, wait_ms=5.0), cores=2)
    assert st["classification"] == "io-bound"
    assert st["recommended"]["concurrency"] == 16
    assert st["recommended"]["executor"] == "thread"  # processes are as good within noise, threads preferred
    assert "still rising" in st["recommended"]["why"]


def test_the_still_scaling_finding_names_the_top_of_the_curve_not_the_pipelines_smaller_setting():
    """Found in a quick report: 'still scaling at concurrency 2 (654 items/s), the largest level
    measured' for a stage measured up to 4 (1,032), because the joint advice had cut it to 2."""
    from stagebench.analysis._findings import _stage_findings

    st = analyzed(model_rows("sleep", gil_ms=0.0, wait_ms=5.0), cores=2)
    top = st["recommended"]
    cut = {**st, "recommended_alone": top, "recommended": {**top, "concurrency": 2, "qps": top["qps"] / 8}}
    (f,) = [
        f
        for f in _found(_stage_findings(StageEntry.from_json(cut), None, 2, Prediction(qps=50.0)))
        if "raise its concurrency" in f["title"]
    ]
    assert f"still scaling at concurrency {top['concurrency']} " in f["detail"]


def test_gil_holding_stage_is_gil_bound_and_recommended_on_processes():
    st = analyzed(model_rows("spin", gil_ms=4.0, wait_ms=0.0), cores=2)
    assert st["classification"] == "gil-bound"
    assert st["recommended"]["executor"] == "process"
    assert st["recommended"]["concurrency"] == 2  # the smallest level within 5% of the best
    assert any("GIL" in line for line in st["evidence"]["summary"])


def test_gil_free_cpu_stage_is_cpu_bound_and_prefers_threads_within_noise():
    st = analyzed(model_rows("hash", gil_ms=0.02, wait_ms=0.0, free_cpu_ms=4.0, ipc_ms=0.01), cores=2)
    assert st["classification"] == "cpu-bound"
    assert st["recommended"]["executor"] == "thread"
    assert "within noise" in st["recommended"]["why"]
    assert st["recommended"]["concurrency"] == 2


def test_tiny_work_is_overhead_bound():
    # 2 us of work per item, harness overhead 20 us: the no-op ceiling dominates
    st = analyzed(model_rows("tiny", gil_ms=0.002, wait_ms=0.0, overhead_ms=0.02, executors=("thread",)), cores=2)
    assert st["classification"] == "overhead-bound"
    assert st["ceiling_qps"] == pytest.approx(50_000, rel=0.01)
    assert st["evidence"]["signals"]["ceiling_share"]["value"] >= 0.8


def test_a_stage_read_above_its_own_no_op_ceiling_is_said_to_be_at_it_not_given_as_a_share_over_100():
    """The demo's aggregate read 4,413 items/s against a 3,701 ceiling measured seconds apart: noise, not 119%."""
    rows = pd.DataFrame(
        [
            row("agg", "thread", 1, 4413.0, noise=0.02, cores_used=1.0, cpu_s_per_item=2.2e-4, latency_ms=0.2),
            row("agg", "thread", 1, 3701.0, role="ceiling", noise=0.02, cores_used=1.0, cpu_s_per_item=2.6e-4),
        ]
    )
    st = analyzed(rows, cores=2)
    said = " ".join(st["evidence"]["summary"])
    assert st["classification"] == "overhead-bound" and "is at the direct harness's no-op ceiling" in said
    assert "it read 19% above it" in said and "119%" not in said


def test_a_stage_that_computes_a_little_next_to_a_costly_harness_is_overhead_bound_not_io_bound():
    """The demo's aggregate(collate(16)) step as a fresh clone measured it: 0.18 us of Python a call, at
    80% of the SPDL ceiling (just short of the near-the-ceiling rule). It computes 84% of its call alone,
    so it does not wait, yet it read "io-bound: it waits", with the probe's GIL share of 1.0 beside it."""
    rows = pd.DataFrame(
        [
            row("agg", "thread", 1, 1.546e6, noise=0.19, cores_used=0.977, cpu_s_per_item=6.32e-7, latency_ms=1.8e-4),
            row(
                "agg",
                "thread",
                1,
                2.036e6,
                role="ceiling",
                noise=0.13,
                cores_used=0.977,
                cpu_s_per_item=4.80e-7,
                latency_ms=9.1e-5,
            ),
            row(
                "agg",
                "thread",
                1,
                1434.0,
                harness="spdl",
                noise=0.115,
                cores_used=0.936,
                cpu_s_per_item=6.53e-4,
                latency_ms=5.9e-3,
            ),
            row(
                "agg",
                "thread",
                1,
                1798.0,
                role="ceiling",
                harness="spdl",
                noise=0.067,
                cores_used=1.072,
                cpu_s_per_item=5.96e-4,
                latency_ms=3.8e-3,
            ),
        ]
    )
    for probe in ({"share": 1.0, "low": 0.907, "high": 1.0}, None):
        st = analyzed(rows, cores=2, gil_probe=probe)
        assert st["classification"] == "overhead-bound", st["evidence"]["summary"]
        # its own call (0.18 us) is shorter than the direct harness's no-op per item (0.49 us)
        assert "its own call takes 0.18 µs per item, less than the 0.491 µs" in st["evidence"]["summary"][0]
    # a stage that waits with as few cores of its own stays io-bound (the sleep through SPDL below)


def test_spdls_own_grouping_step_gets_no_batch_your_work_advice():
    """The demo's aggregate step, overhead-bound at 5,187 items/s against a predicted 471, got 'batch its
    work' (it is the batching step, SPDL's code): none when far from binding, grouping advice when it binds."""
    from _rows import model_rows

    from stagebench.analysis._findings import _stage_findings

    st = analyzed(model_rows("agg", gil_ms=0.002, wait_ms=0.0, overhead_ms=0.02, executors=("thread",)), cores=2)
    assert st["classification"] == "overhead-bound"
    pipe = dict(st, type="pipe")
    batch = [
        f
        for f in _found(_stage_findings(StageEntry.from_json(pipe), "x", 2, Prediction(qps=100.0)))
        if "batch its work" in f["title"]
    ]
    # the batched throughput was never run: the advice states no figure for it (it once said "8 items: about ...")
    assert batch and "about k-fold" in batch[0]["detail"] and "items: about" not in batch[0]["detail"]
    agg = dict(st, type="aggregate")
    assert not any(
        "overhead-bound" in f["title"]
        for f in _found(_stage_findings(StageEntry.from_json(agg), "x", 2, Prediction(qps=100.0)))
    )
    binds = [
        f
        for f in _found(_stage_findings(StageEntry.from_json(agg), "agg", 2, Prediction(qps=st["recommended"]["qps"])))
        if "overhead" in f["title"]
    ]
    assert binds and "fewer, larger items" in binds[0]["title"] and "batch its work" not in binds[0]["title"]


def test_a_probe_that_reads_pure_python_says_the_stage_computes_where_its_cpu_share_is_noise():
    """The same step in this session's fresh-clone demo: its CPU share (own CPU over call time, at 0.12 us
    a call) read 0.42, the probe 0.97, and it was called "io-bound, it waits" at 76% of the SPDL ceiling."""
    rows = pd.DataFrame(
        [
            row("agg", "thread", 1, 2.848e6, noise=0.25, cores_used=0.990, cpu_s_per_item=3.475e-7, latency_ms=1.2e-4),
            row(
                "agg",
                "thread",
                1,
                3.394e6,
                role="ceiling",
                noise=0.2,
                cores_used=1.009,
                cpu_s_per_item=2.974e-7,
                latency_ms=7.0e-5,
            ),
            row(
                "agg",
                "thread",
                1,
                4085.0,
                harness="spdl",
                noise=0.22,
                cores_used=1.079,
                cpu_s_per_item=2.642e-4,
                latency_ms=2.8e-3,
            ),
            row(
                "agg",
                "thread",
                1,
                5388.0,
                role="ceiling",
                harness="spdl",
                noise=0.02,
                cores_used=1.078,
                cpu_s_per_item=2.001e-4,
                latency_ms=1.8e-3,
            ),
        ]
    )
    st = analyzed(rows, cores=2, gil_probe={"share": 0.97, "low": 0.85, "high": 1.0})
    assert st["classification"] == "overhead-bound", st["evidence"]["summary"]
    assert "its own call takes 0.12 µs per item, less than" in st["evidence"]["summary"][0]
    # its call is shorter than the harness's no-op, whatever the probe or the CPU share (0.42, noise at 0.12 us)
    # read: it was called "io-bound, it waits" on the CPU share alone
    for probe in (None, {"share": 0.05, "low": 0.0, "high": 0.1}):
        assert analyzed(rows, cores=2, gil_probe=probe)["classification"] == "overhead-bound"


def test_process_best_at_the_process_ceiling_is_gil_bound_and_limited_by_ipc():
    # GIL-bound on threads (what it is, on any core count); processes capped by a low IPC ceiling (what
    # limits its best setting: a second fact, issue 31)
    st = analyzed(model_rows("big", gil_ms=2.0, wait_ms=0.0, process_ceiling=700.0, ipc_ms=0.1), cores=4)
    assert st["best"]["executor"] == "process"
    assert st["classification"] == "gil-bound"
    assert st["limit"]["kind"] == "ipc" and st["limit"]["at"].startswith("process")


def test_large_payload_costing_more_cpu_than_the_work_is_limited_by_ipc():
    rows = []
    for c in (1, 2, 4):
        rows.append(
            row("copy", "thread", c, 300.0, cores_used=0.3, cpu_s_per_item=1e-3, latency_ms=3.3 * c, payload_bytes=4e6)
        )
        rows.append(
            row(
                "copy",
                "process",
                c,
                600.0 * c / 2 + 300,
                cores_used=1.5,
                cpu_s_per_item=5e-3,
                latency_ms=3.0,
                payload_bytes=4e6,
            )
        )
    st = analyzed(pd.DataFrame(rows), cores=8)
    assert st["best"]["executor"] == "process"
    assert st["limit"]["kind"] == "ipc" and "KiB" in st["limit"]["text"]


@pytest.mark.parametrize("g,w,n", [(0, 4, 0), (0.8, 3.2, 0), (2, 2, 0), (4, 0, 0), (0.02, 0, 4)])
def test_classification_is_one_of_the_documented_labels(g, w, n):
    st = analyzed(model_rows("s", gil_ms=g, wait_ms=w, free_cpu_ms=n), cores=2)
    assert st["classification"] in CLASSIFICATIONS
    assert STAGE_KEYS <= set(st)


# ------------------------------------------------------------------ recommendation
def test_recommendation_is_the_smallest_measured_level_within_5_percent():
    rows = [row("s", "thread", c, q) for c, q in ((1, 100.0), (2, 190.0), (4, 380.0), (8, 396.0), (16, 400.0))]
    st = analyzed(pd.DataFrame(rows), cores=2)
    assert st["recommended"]["concurrency"] == 4  # 380 >= 0.95 * 400
    assert st["best"]["concurrency"] == 16


def test_recommendation_never_leaves_the_measured_range():
    rows = [row("s", "thread", c, 100.0 * c) for c in (3, 6, 12)]
    st = analyzed(pd.DataFrame(rows), cores=2)
    assert st["recommended"]["concurrency"] in (3, 6, 12)


def test_threads_beyond_noise_of_processes_are_not_dropped_for_processes():
    rows = [row("s", "thread", c, q, noise=0.01) for c, q in ((1, 100.0), (2, 150.0))]
    rows += [row("s", "process", c, q, noise=0.01) for c, q in ((1, 90.0), (2, 180.0))]
    st = analyzed(pd.DataFrame(rows), cores=2)
    assert st["recommended"]["executor"] == "process"
    assert "beats thread beyond noise" in st["recommended"]["why"]


def test_spdl_harness_is_used_for_the_recommendation_when_present():
    direct = model_rows("s", gil_ms=0.0, wait_ms=4.0)
    spdl = model_rows("s", gil_ms=0.0, wait_ms=4.0, harness="spdl", overhead_ms=0.3)
    st = analyzed(pd.concat([direct, spdl]), cores=2)
    assert st["recommended"]["harness"] == "spdl"
    assert set(st["fit"]) == {"direct/thread", "direct/process", "spdl/thread", "spdl/process"}
    assert st["gil"]["harness"] == "direct"  # the GIL is read where the harness adds least


# ------------------------------------------------------------------ robustness
def test_all_points_failed_gives_a_failed_stage_with_the_reason():
    rows = [row("bad", "thread", 1, 0.0, status="failed", reason="every item raised: ValueError: boom")]
    rows += [
        row("bad", "thread", c, 0.0, status="skipped", reason="not measured: failed at concurrency 1") for c in (2, 4)
    ]
    st = analyzed(pd.DataFrame(rows), cores=2)
    assert st["status"] == "failed"
    assert "boom" in st["reason"]
    assert st["recommended"] is None and st["classification"] == "unknown"


def test_skipped_process_rows_and_nan_columns_are_tolerated():
    rows = model_rows("s", gil_ms=1.0, wait_ms=3.0, executors=("thread",))
    rows["mem_pss_mb"] = math.nan
    rows["latency_p50_ms"] = math.nan
    skipped = pd.DataFrame(
        [
            row("s", "process", c, 0.0, status="skipped", reason="cannot be pickled for a process pool: PicklingError")
            for c in (1, 2)
        ]
    )
    st = analyzed(pd.concat([rows, skipped]), cores=2)
    assert st["status"] == "ok"
    assert st["recommended"]["executor"] == "thread"
    assert any("cannot be pickled" in p for p in st["problems"])


def test_crashed_high_levels_do_not_hide_the_measured_ones():
    rows = model_rows("s", gil_ms=4.0, wait_ms=0.0, levels=(1, 2, 4))
    crashed = pd.DataFrame([row("s", "process", 8, 0.0, status="crashed", reason="a worker process died")])
    st = analyzed(pd.concat([rows, crashed]), cores=2)
    assert st["status"] == "ok"
    assert any("crashed" in p for p in st["problems"])


def test_async_only_stage():
    rows = model_rows("fetch", gil_ms=0.05, wait_ms=10.0, executors=("async",), levels=(1, 4, 16, 64))
    st = analyzed(rows, cores=2)
    assert st["recommended"]["executor"] == "async"
    assert st["classification"] == "io-bound"
    assert st["gil_fraction"] < 0.05


def test_single_level_stage_gets_a_recommendation_and_a_fit_warning():
    st = analyzed(model_rows("s", gil_ms=1.0, wait_ms=1.0, levels=(4,)), cores=2)
    assert st["recommended"]["concurrency"] == 4
    assert "one concurrency level" in st["fit"]["direct/thread"]["warning"]


def test_rows_read_back_from_csv_give_the_same_verdict(tmp_path):
    rows = model_rows("s", gil_ms=2.0, wait_ms=2.0)
    run = RunDir.create(tmp_path / "run")
    w = run.writer(STAGE_COLUMNS)
    for r in rows.to_dict("records"):
        w.write(r)
    w.close()
    back = read_rows(run.path)
    a, b = analyzed(rows, cores=2), analyzed(back, cores=2)
    assert a["classification"] == b["classification"]
    assert a["gil_fraction"] == pytest.approx(b["gil_fraction"], rel=1e-6)
    assert a["recommended"] == b["recommended"]


# ------------------------------------------------------------------ summary
def _pipeline_rows(executors=("thread",)):
    """The issue's example pipeline through the spdl harness (0.3 ms of SPDL time per item and stage)."""
    kw = dict(harness="spdl", overhead_ms=0.3, executors=executors)
    return pd.concat(
        [
            model_rows("gil", gil_ms=1.0, wait_ms=0.0, **kw),
            model_rows("sleep", gil_ms=0.0, wait_ms=5.0, **kw),
            model_rows("mixed", gil_ms=0.5, wait_ms=2.0, **kw),
        ],
        ignore_index=True,
    )


def test_summary_follows_the_contract_and_is_strict_json():
    meta = _meta("gil", "sleep", "mixed", not_isolated=[{"name": "branch", "reason": "path variant"}])
    s = summarize(_pipeline_rows(), meta)
    for key in (
        "schema_version",
        "kind",
        "stagebench_version",
        "provenance",
        "settings",
        "verdict",
        "warnings",
        "stages",
        "not_isolated",
        "prediction",
        "validation",
        "findings",
    ):
        assert key in s
    assert s["kind"] == "pipeline" and s["schema_version"] == 1
    assert [st["name"] for st in s["stages"]] == ["gil", "sleep", "mixed"]
    for st in s["stages"]:
        assert STAGE_KEYS <= set(st)
        fit = next(iter(st["fit"].values()))
        assert {
            "model",
            "sigma",
            "kappa",
            "sigma_interval",
            "kappa_interval",
            "amdahl_serial_fraction",
            "amdahl_interval",
            "peak_concurrency",
            "r2",
            "levels",
            "warning",
        } <= set(fit)
        assert {"executor", "concurrency", "qps", "qps_low", "qps_high", "harness", "why"} <= set(st["recommended"])
    p = s["prediction"]
    assert {"qps", "binding", "bottleneck", "explanation", "bounds", "naive_qps", "settings"} <= set(p)
    assert set(p["bounds"]) >= {"stages", "cores", "gil"}
    for f in s["findings"]:
        assert {"severity", "title", "detail", "stage", "evidence"} <= set(f)
    assert "\n" not in s["verdict"]
    json.dumps(to_jsonable(s), allow_nan=False)


def test_summary_verdict_names_the_gil_when_it_binds():
    s = summarize(_pipeline_rows(), _meta("gil", "sleep", "mixed"))
    assert s["prediction"]["binding"] == "gil"
    # the GIL is the bottleneck; the stage that holds it longest is named as such, not as the bottleneck
    neck = s["prediction"]["bottleneck"]
    assert s["verdict"].startswith("the GIL binds: predicted ") and f"; {neck} holds it longest (" in s["verdict"]
    assert "is the bottleneck" not in s["verdict"]
    assert s["prediction"]["qps"] < s["prediction"]["naive_qps"]
    # the run-wide GIL finding ranks among the high-severity ones
    assert s["findings"][0]["severity"] == "high"
    assert any("binds the pipeline" in f["title"] for f in s["findings"])


def test_findings_are_ranked_by_severity():
    s = summarize(_pipeline_rows(("thread", "process")), _meta("gil", "sleep", "mixed"))
    order = ["high", "medium", "low", "info"]
    ranks = [order.index(f["severity"]) for f in s["findings"]]
    assert ranks == sorted(ranks)
    proc = [f for f in s["findings"] if f["stage"] == "gil" and "process executor" in f["title"]]
    assert proc and "expected" in proc[0]["detail"] and "x" in proc[0]["detail"]


def test_a_stage_that_faults_in_fresh_memory_gets_a_finding_with_the_numbers():
    rows = _pipeline_rows(("thread", "process"))
    mixed = rows["stage"] == "mixed"
    rows.loc[mixed & (rows["executor"] == "process"), "minor_faults_per_item"] = 2500.0
    rows.loc[mixed & (rows["executor"] == "thread"), "minor_faults_per_item"] = 3.0
    rows.loc[mixed, "cpu_s_per_item"] = 0.005
    rows.loc[~mixed, "minor_faults_per_item"] = 2.0
    meta = _meta("gil", "sleep", "mixed", page_fault={"cost_s": 1.8e-6, "page_bytes": 4096})
    s = summarize(rows, meta)
    st = {x["name"]: x for x in s["stages"]}["mixed"]
    assert st["page_faults"]["process"]["per_item"] == 2500 and st["page_faults"]["thread"]["per_item"] == 3
    f = [f for f in s["findings"] if "page faults" in f["title"]]
    assert [x["stage"] for x in f] == ["mixed"]
    d = f[0]["detail"]
    # 2,500 faults x 1.8 us = 4.5 ms of the 5 ms: most of its CPU; the thread points, calm, are named
    assert "2,500 minor page faults per call on process" in d and "9.8 MiB" in d and "most of its 5 ms" in d
    assert "MALLOC_TRIM_THRESHOLD_" in d and "Its thread points took 3 per call" in d
    # without the machine's cost per fault, or when faults are a small share of the CPU: no finding
    assert not [f for f in summarize(rows, _meta("gil", "sleep", "mixed"))["findings"] if "page faults" in f["title"]]
    rows.loc[mixed, "cpu_s_per_item"] = 0.5
    assert not [f for f in summarize(rows, meta)["findings"] if "page faults" in f["title"]]


def test_a_stage_that_keeps_the_collector_busy_gets_a_finding():
    rows = _pipeline_rows()
    gil = rows["stage"] == "gil"
    rows.loc[gil & (rows["role"] == "stage"), "gc_s_per_item"] = 0.3e-3
    rows.loc[gil & (rows["role"] == "ceiling"), "gc_s_per_item"] = 0.05e-3  # the harness's own share
    rows.loc[gil & (rows["role"] == "stage"), "cpu_s_per_item"] = 1.25e-3
    rows.loc[~gil, "gc_s_per_item"] = 0.0
    s = summarize(rows, _meta("gil", "sleep", "mixed"))
    st = {x["name"]: x for x in s["stages"]}["gil"]
    assert st["alternatives"]["thread"]["gc_s_per_item"] == pytest.approx(0.25e-3)  # beyond the harness's
    f = [f for f in s["findings"] if "garbage collection" in f["title"]]
    assert [x["stage"] for x in f] == ["gil"] and f[0]["title"] == "gil spends 20% of its CPU in garbage collection"
    assert "0.25 ms per item" in f[0]["detail"] and "gc.freeze()" in f[0]["detail"]
    # which collections the time went to says which remedy comes first
    stage_rows = gil & (rows["role"] == "stage")
    rows.loc[stage_rows, "gc_full_s_per_item"] = 0.28e-3
    rows.loc[gil & (rows["role"] == "ceiling"), "gc_full_s_per_item"] = 0.03e-3
    f = [f for f in summarize(rows, _meta("gil", "sleep", "mixed"))["findings"] if "garbage collection" in f["title"]]
    assert "100% of it went to full collections" in f[0]["detail"] and "gc.freeze()" in f[0]["detail"]
    assert f[0]["evidence"]["gc_full_s_per_item"] == pytest.approx(0.25e-3)  # beyond the harness's, as the total
    rows.loc[stage_rows, "gc_full_s_per_item"] = 0.08e-3
    f = [f for f in summarize(rows, _meta("gil", "sleep", "mixed"))["findings"] if "garbage collection" in f["title"]]
    d = f[0]["detail"]
    assert "80% of it went to young collections" in d and "would save only the 20% in full collections" in d
    assert d.index("arrays instead of lists of lists") < d.index("gc.freeze()")
    # a collector share under a tenth of the stage's CPU is not worth a finding
    rows.loc[gil & (rows["role"] == "stage"), "cpu_s_per_item"] = 5e-3
    assert not [
        f for f in summarize(rows, _meta("gil", "sleep", "mixed"))["findings"] if "garbage collection" in f["title"]
    ]


# ------------------------------------------------------------------ units of a grouped stage
def _texts(entry: dict) -> list[str]:
    """Every text a stage's analysis writes: its summary, its limit, its signals' details."""
    ev = entry["evidence"]
    details = [str(v.get("detail") or "") for v in ev["signals"].values()]
    return [*ev["summary"], entry["limit"]["text"], entry["recommended"]["why"], *details]


def _figure(text: str, fig: str) -> bool:
    """``fig`` in ``text`` as a whole number (not part of a larger one)."""
    return re.search(rf"(?<![\d,.]){re.escape(fig)}(?![\d,.])", text) is not None


def test_a_grouped_stages_texts_are_in_source_items_as_its_card_is():
    """A call of a stage after a batch of 16 stands for 16 source items: its texts say rates x 16 and
    times / 16, the unit of the report's tables, plots and prediction; its figures stay per call."""
    rows = model_rows("collate", gil_ms=0.05, wait_ms=0.2, free_cpu_ms=2.0, cores=2)
    per_call = analyzed(rows, cores=2)
    grouped = analyzed(rows, cores=2, items_per_input=16.0)

    # the model is unchanged: only the words move (the summary, the limit, the recommendation's why)
    def figures(e: dict) -> dict:
        return {k: v for k, v in e.items() if k not in ("evidence", "limit")} | {
            "recommended": {k: v for k, v in e["recommended"].items() if k != "why"}
        }

    assert figures(grouped) == figures(per_call)
    assert grouped["evidence"]["signals"].keys() == per_call["evidence"]["signals"].keys()
    rec, cpu = grouped["recommended"]["qps"], grouped["cpu_s_per_item"]
    line = next(x for x in grouped["evidence"]["summary"] if x.startswith("recommended:"))
    assert line.startswith(f"recommended: thread x 4 -> {fmt_q(rec * 16)} items/s (16 items a call; ")
    assert f"({fmt_ms(cpu / 16)} CPU per item, {fmt_q(rec * 16)} items/s)" in grouped["limit"]["text"]
    # no text of it gives the per-call rate or CPU, as the ungrouped stage's do
    for fig in (fmt_q(rec), fmt_ms(cpu)):
        assert any(_figure(t, fig) for t in _texts(per_call))
        assert not [t for t in _texts(grouped) if _figure(t, fig)]
    # and so do its findings
    entry = changed(StageEntry.from_json(grouped), name="collate", items_per_input=16.0)
    found = build_findings([entry], prediction=None, validation=None, warnings=[], not_isolated=[], cores=2)
    cores = next(f for f in found if f.title == "collate is limited by the cores")
    assert cores.detail.startswith(f"{fmt_q(rec * 16)} items/s at thread x 4, {cpu / 16 * 1e3:.3g} ms CPU per item")


def test_an_ungrouped_stages_texts_are_as_read():
    """One item a call: the texts are the per-call figures themselves (the goldens hold them byte for byte)."""
    rows = model_rows("decode", gil_ms=0.05, wait_ms=0.2, free_cpu_ms=2.0, cores=2)
    one = analyzed(rows, cores=2)
    assert analyzed(rows, cores=2, items_per_input=1.0) == one
    line = next(x for x in one["evidence"]["summary"] if x.startswith("recommended:"))
    assert line.startswith(f"recommended: thread x 4 -> {fmt_q(one['recommended']['qps'])} items/s (thread beats")


def test_stage_without_rows_and_extra_stages_in_rows():
    rows = model_rows("a", gil_ms=0.0, wait_ms=2.0)
    extra = model_rows("zzz", gil_ms=0.0, wait_ms=2.0)
    s = summarize(pd.concat([rows, extra]), _meta("a", "missing"))
    names = [st["name"] for st in s["stages"]]
    assert names == ["a", "missing", "zzz"]
    missing = s["stages"][1]
    assert missing["status"] == "skipped"
    assert "missing" in s["prediction"]["missing"]


def test_validation_is_copied_with_its_error_against_the_prediction():
    meta = _meta(
        "gil", "sleep", "mixed", validation={"qps": 400.0, "qps_low": 380.0, "qps_high": 420.0, "seconds": 3.0}
    )
    s = summarize(_pipeline_rows(), meta)
    v = s["validation"]
    assert v["qps"] == 400.0 and v["seconds"] == 3.0
    assert v["error_vs_prediction"] == pytest.approx((s["prediction"]["qps"] - 400.0) / 400.0)
    assert summarize(_pipeline_rows(), _meta("gil", "sleep", "mixed"))["validation"] is None


def test_the_prediction_is_read_against_the_round_the_replay_took_part_in():
    """The replay ran in the first round in turns only; the validation run took three rounds more, in which
    the host ran slower: the error is read against the first round's windows, not the drift after it."""
    replay = {"qps": 140.0, "qps_low": 130.0, "qps_high": 150.0, "seconds": 1.0, "stand_ins": []}
    rates = [150.0, 150.0, 100.0, 100.0, 100.0]  # equal windows: 120 over all five
    val = {"qps": 120.0, "qps_low": 100.0, "qps_high": 140.0, "seconds": 2.5, "window_rates": rates}
    s = summarize(
        _pipeline_rows(), _meta("gil", "sleep", "mixed", validation={**val, "first_round_windows": 2}, replay=replay)
    )
    assert s["prediction"]["method"] == "replay" and s["prediction"]["qps"] == 140.0
    v = s["validation"]
    assert v["qps"] == 120.0 and v["qps_with_replay"] == pytest.approx(150.0)
    assert v["error_vs_prediction"] == pytest.approx(140.0 / 150.0 - 1)
    confirms = next(f for f in s["findings"] if f["title"] == "the whole-pipeline run confirms the prediction")
    assert confirms["detail"].startswith("measured 120 items/s (150 in the round the replay took part in, read")
    assert confirms["detail"].endswith("vs predicted 140: the prediction 7% low")
    # one round only (or no record of rounds): the error is read against the whole run
    for one in ({**val, "first_round_windows": 5}, val):
        w = summarize(_pipeline_rows(), _meta("gil", "sleep", "mixed", validation=one, replay=replay))["validation"]
        assert w["error_vs_prediction"] == pytest.approx(140.0 / 120.0 - 1) and w.get("qps_with_replay") is None


def test_empty_rows_give_an_honest_summary():
    s = summarize(pd.DataFrame(columns=list(STAGE_COLUMNS)), _meta())
    assert s["stages"] == [] and s["prediction"] is None
    assert "no stage" in s["verdict"]


def test_busy_machine_and_noise_become_warnings_and_findings():
    rows = model_rows("s", gil_ms=1.0, wait_ms=3.0, noise=0.4)
    meta = _meta("s")
    meta["provenance"]["load_avg"] = [3.5, 3.0, 2.0]
    s = summarize(rows, meta)
    assert any("busy" in w for w in s["warnings"])
    assert any("noisy" in w or "wider than" in w for w in s["warnings"])
    assert any(f["title"].startswith("the machine was busy") for f in s["findings"])


def test_free_threaded_build_is_warned_and_has_no_gil_bound():
    meta = _meta("gil", "sleep", "mixed")
    meta["provenance"]["free_threaded"] = True
    s = summarize(_pipeline_rows(), meta)
    assert any("free-threaded" in w for w in s["warnings"])
    assert s["prediction"]["bounds"]["gil"] is None


def test_gil_saturated_only_together_with_spdls_own_python_limits_a_waiting_stage():
    # alone on the direct harness the stage never saturates the GIL (levels up to 4);
    # in SPDL its 0.5 ms plus SPDL's 0.3 ms per item cap threads at 1,250 items/s
    direct = model_rows("mixed", gil_ms=0.5, wait_ms=2.0, levels=(1, 2, 4), executors=("thread",))
    spdl = model_rows(
        "mixed", gil_ms=0.5, wait_ms=2.0, harness="spdl", overhead_ms=0.3, levels=(1, 2, 4, 8), executors=("thread",)
    )
    st = analyzed(pd.concat([direct, spdl]), cores=4)
    assert not st["gil"]["saturated"]
    # it waits 80% of its call (io-bound, what it is); at its best in SPDL the GIL, with SPDL's own Python, limits it
    assert st["classification"] == "io-bound"
    assert st["limit"]["kind"] == "gil" and "keeps the GIL" in st["limit"]["text"]


def test_a_validation_run_that_failed_becomes_a_warning_not_a_number():
    meta = _meta("gil", "sleep", "mixed", validation={"qps": None, "error": "RuntimeError: pipeline stalled"})
    s = summarize(_pipeline_rows(), meta)
    assert s["validation"] is None
    assert any("pipeline stalled" in w for w in s["warnings"])


def test_fixes_on_stages_far_from_the_bottleneck_rank_low():
    s = summarize(_pipeline_rows(), _meta("gil", "sleep", "mixed"))
    # the sleep waits (io-bound) and at its best reaches the harness's ceiling: said, ranked low, it is far
    sleep = [f for f in s["findings"] if f["stage"] == "sleep" and "harness's per-item ceiling" in f["title"]]
    assert sleep and sleep[0]["severity"] == "low"
    assert "far from limiting the pipeline" in sleep[0]["detail"]
    assert not any(f["stage"] == "sleep" and "raise its concurrency" in f["title"] for f in s["findings"])


def _yours_run(qps, low, high, windows):
    return {"qps": qps, "qps_low": low, "qps_high": high, "settings": [], "seconds": 3.0, "window_rates": windows}


#: The validation run's windows in turns with the user's (480 items/s, four slices).
VALIDATION_WINDOWS = [478.0, 485.0, 476.0, 481.0]


@pytest.mark.parametrize(
    "yours, verdict, severity",
    [
        # 480 (470-490) against 250 in every round: 1.92x, beyond noise
        (_yours_run(250.0, 240.0, 260.0, [249.0, 252.0, 248.0, 251.0]), "recommended", "high"),
        # windows in turns that swing either way: the runs cannot tell them apart, and yours stay
        (_yours_run(470.0, 450.0, 495.0, [430.0, 520.0, 440.0, 490.0]), "could not tell", "info"),
        # the user's are faster in every round
        (_yours_run(560.0, 550.0, 570.0, [561.0, 559.0, 560.0, 562.0]), "yours", "info"),
        ({"qps": None, "error": "RuntimeError: boom"}, "inconclusive", "info"),
        ({"qps": None, "not_run": "quick mode: the real pipeline was not run"}, "not run", "info"),
    ],
)
def test_the_users_own_settings_are_set_against_the_recommended_ones_as_measured(yours, verdict, severity):
    """No per-stage "change your setting" finding any more: one finding, from running both settings in turns."""
    meta = _meta("spin")
    meta["stages"][0].update(user_executor="thread", user_concurrency=8)
    meta["validation"] = {
        "qps": 480.0,
        "qps_low": 470.0,
        "qps_high": 490.0,
        "seconds": 3.0,
        "settings": [],
        "window_rates": VALIDATION_WINDOWS,
    }
    meta["yours"] = yours
    s = summarize(model_rows("spin", gil_ms=4.0, wait_ms=0.0), meta)
    assert s["recommended_vs_yours"]["verdict"] == verdict
    assert s["recommended_vs_yours"]["changes"] == [
        {"stage": "spin", "yours": "thread x 8", "recommended": "process x 2"}
    ], "the recommended setting is the stage's measured best: processes x 2 for a 4 ms GIL-holding spin"
    mine = [f for f in s["findings"] if "yours" in f["evidence"]]
    assert len(mine) == 1 and mine[0]["severity"] == severity
    assert not [f for f in s["findings"] if f["title"].startswith("spin: change")]
    if verdict == "recommended":
        assert "1.92x" in mine[0]["title"] and "spin: thread x 8 -> process x 2" in mine[0]["detail"]
    if verdict == "yours":
        assert "keep them" in s["recommended_vs_yours"]["text"]
    if verdict == "could not tell":
        text = s["recommended_vs_yours"]["text"]
        assert text.startswith("keep yours: the runs could not tell the recommended settings from yours, ")
        assert "x yours (" in text and "over 4 rounds in turns" in text
    if verdict == "not run":  # quick mode says it did not check, never that yours were beaten
        assert s["recommended_vs_yours"]["text"].startswith("not checked against your settings (quick mode")
        assert "not checked" in mine[0]["title"] + mine[0]["detail"]


@pytest.mark.parametrize(
    ("mine", "verdict", "said"),
    [
        # yours on 8 threads, the recommended on 2 processes: a process costs more than any number of threads
        (("thread", 8), "yours", "use more worker processes (2 against 0 of yours) and were not shown faster"),
        # yours on 4 processes: the recommended 2 are cheaper, and as fast within 5%
        (("process", 4), "cheaper", "as fast within 5% with fewer worker processes (2 against 4 of yours)"),
    ],
)
def test_worker_processes_cost_more_than_threads_against_yours(mine, verdict, said):
    """Found on gil_mix: 8 processes beside 12 threads were "as fast within 5% with fewer workers" than 28
    threads, and advised. A pipeline's cost counts its worker processes first."""
    meta = _meta("spin")
    meta["stages"][0].update(user_executor=mine[0], user_concurrency=mine[1])
    windows = [478.0, 485.0, 476.0, 481.0, 479.0]
    meta["validation"] = {"qps": 480.0, "qps_low": 475.0, "qps_high": 485.0, "seconds": 2.5, "window_rates": windows}
    meta["yours"] = _yours_run(480.0, 475.0, 485.0, [479.0, 483.0, 477.0, 480.0, 480.0])
    s = summarize(model_rows("spin", gil_ms=4.0, wait_ms=0.0), meta)
    y = s["recommended_vs_yours"]
    assert y["changes"] == [{"stage": "spin", "yours": f"{mine[0]} x {mine[1]}", "recommended": "process x 2"}]
    assert y["verdict"] == verdict and said in y["text"], y["text"]


def test_settings_that_are_the_users_own_are_not_run_twice():
    meta = _meta("spin")
    meta["yours"] = {"same": True}
    s = summarize(model_rows("spin", gil_ms=4.0, wait_ms=0.0), meta)
    assert s["recommended_vs_yours"]["verdict"] == "same" and not [f for f in s["findings"] if "yours" in f["evidence"]]


# ------------------------------------------------------------------ the harness's own CPU, still-rising curves
def _wait_stage_through_spdl():
    """A 4 ms storage wait measured like the example's ``read`` stage: the direct harness costs nothing, SPDL
    spends about 0.5 ms of CPU per item scheduling it (its no-op ceiling), the stage itself about 0.08 ms."""
    rows = []
    for c in (1, 2, 4, 8):
        q = c / 4.2e-3  # the wait scales linearly with the threads
        rows.append(row("read", "thread", c, q, cores_used=q * 0.08e-3, cpu_s_per_item=0.08e-3, latency_ms=4.2))
        rows.append(
            row("read", "thread", c, 2.5e6, role="ceiling", cores_used=1.0, cpu_s_per_item=4e-7, latency_ms=1e-4)
        )
        # through SPDL: 0.5 ms of scheduling CPU per item on top of the stage's own 0.1 ms
        qs = {1: 218.0, 2: 443.0, 4: 834.0, 8: 1381.0}[c]
        cpu = 0.6e-3 if c < 8 else 0.81e-3
        rows.append(
            row("read", "thread", c, qs, harness="spdl", cores_used=qs * cpu, cpu_s_per_item=cpu, latency_ms=4.2)
        )
        rows.append(
            row(
                "read",
                "thread",
                c,
                2100.0,
                role="ceiling",
                harness="spdl",
                cores_used=1.12,
                cpu_s_per_item=0.53e-3,
                latency_ms=1e-3,
            )
        )
    return pd.DataFrame(rows)


def test_wait_stage_whose_cores_are_mostly_the_harness_is_io_bound():
    st = analyzed(_wait_stage_through_spdl(), cores=2)
    assert st["recommended"]["harness"] == "spdl" and st["best"]["concurrency"] == 8
    assert st["classification"] == "io-bound"
    assert "98% waiting" in st["evidence"]["summary"][0]
    line = st["limit"]["text"]
    # both numbers: the stage's own cores ((0.81 - 0.53) ms x 1,381/s = 0.39) and the total with the harness (1.12)
    assert "0.39" in line and "1.12" in line


def test_wait_stage_without_a_ceiling_is_judged_by_its_own_call():
    """Its label reads the call itself (CPU of the calling thread over the call's time), not the cores the
    process used with the harness in it: without a ceiling to subtract, 1.12 of 2 cores said nothing."""
    rows = _wait_stage_through_spdl()
    st = analyzed(rows[rows["role"] == "stage"], cores=2)
    assert st["classification"] == "io-bound"


def _nap_rows(top_qps: float, cpu_s_per_item: float) -> pd.DataFrame:
    """A 10 ms sleep on threads at 1-16 (linear up to 8, ``top_qps`` at 16), with its no-op ceilings."""
    rows = []
    for c, q in ((1, 95.0), (2, 190.0), (4, 378.0), (8, 750.0), (16, top_qps)):
        rows.append(
            row(
                "nap",
                "thread",
                c,
                q,
                noise=0.02,
                cores_used=q * cpu_s_per_item,
                cpu_s_per_item=cpu_s_per_item,
                latency_ms=10.5,
            )
        )
        rows.append(
            row("nap", "thread", c, 2.5e6, role="ceiling", cores_used=1.0, cpu_s_per_item=4e-7, latency_ms=1e-4)
        )
    return pd.DataFrame(rows)


def test_still_rising_thread_curve_with_a_small_gil_share_is_not_gil_bound():
    # a 10 ms sleep whose wake-ups cost 0.6 ms of CPU per item: GIL share ~0.06, threads near-linear up to 16
    st = analyzed(_nap_rows(1480.0, 0.6e-3), cores=2)
    assert 0.03 < st["gil_fraction"] < 0.1
    assert st["classification"] != "gil-bound"
    assert st["classification"] == "io-bound"
    assert any("still rising" in line for line in st["evidence"]["summary"])


def test_flattened_thread_curve_with_the_gil_busy_stays_gil_bound():
    # the same stage where the curve did flatten at the top: the GIL-busy rule still applies
    st = analyzed(_nap_rows(820.0, 1.1e-3), cores=2)
    assert st["classification"] == "io-bound"  # a 10 ms sleep waits, on any core count
    assert st["limit"]["kind"] == "gil"  # and at the top of its curve the GIL busy is what limits it


def test_a_gil_share_the_curves_only_bound_does_not_make_the_gil_the_limit():
    """SPDL's imagenet_classification decode (FFmpeg, GIL-free) on 2 cores, its rows as measured: the curves
    bound its GIL share from above only (<= 0.68), so its GIL time per item is the bound's midpoint. Read as a
    measurement, that midpoint kept the GIL "81% busy" at thread x 2 and named the GIL the limit, beside a
    label that gave the share as only bounded. At thread x 2 it uses 1.98 of the 2 cores: the cores."""
    rows = pd.read_csv(Path(__file__).resolve().parent / "data" / "rows" / "ffmpeg_decode.csv")
    st = analyzed(rows, cores=2, items_per_input=32.0)
    assert st["classification"] == "cpu-bound" and not st["gil"]["pinned"]
    assert st["limit"]["kind"] == "cores" and st["limit"]["at"] == "thread x 2", st["limit"]
    assert "gil_busy_at_best" not in st["evidence"]["signals"]


def test_a_gil_bound_stage_at_its_best_on_processes_is_not_limited_by_the_gil():
    """1 ms of Python a call on 2 cores: the GIL flattens its threads at 1,000 items/s, and processes, each
    with its own GIL, reach 1,667 on both cores. At its best (process x 2) the cores hold it back; the
    demo's augment read "alone at process x 4: limited by the GIL" with a line about its threads."""
    st = analyzed(model_rows("aug", gil_ms=1.0, wait_ms=0.0, harness="spdl"), cores=2)
    assert st["classification"] == "gil-bound" and st["recommended"]["executor"] == "process"
    assert st["limit"]["kind"] == "cores" and st["limit"]["at"] == "process x 2", st["limit"]
    # where the threads stay best, the GIL that flattens them is still the limit
    st = analyzed(model_rows("aug", gil_ms=1.0, wait_ms=0.0, harness="spdl", process_ceiling=900.0), cores=2)
    assert st["limit"]["kind"] == "gil" and st["limit"]["at"] == "thread x 1", st["limit"]


def test_a_process_stage_charges_the_main_process_its_process_ceilings_time_per_item():
    # Pickling, the pipe and loky's threads run in the main process for every item: the
    # process no-op ceiling (1,000 items/s, 0.6 ms CPU per item here) is that cost, far above
    # the thread ceiling's scheduling (5 µs), and the pipeline's GIL bound must see it.
    df = pd.DataFrame(model_rows("tok", gil_ms=2.0, wait_ms=0.0, process_ceiling=1000.0, ipc_ms=0.6))
    st = analyzed(df, cores=2)
    assert st["recommended"]["executor"] == "process"
    assert st["harness_gil_s_per_item"] == pytest.approx(0.6e-3, rel=0.05)  # min(1/qps, CPU per item)
    no_proc_ceiling = df[~((df["role"] == "ceiling") & (df["executor"] == "process"))]
    assert analyzed(no_proc_ceiling, cores=2)["harness_gil_s_per_item"] < 1e-4  # the thread ceiling's


def test_a_cpu_whose_speed_changed_during_the_run_is_a_warning_with_the_numbers():
    val = {"qps": 200.0, "qps_low": 190.0, "qps_high": 210.0, "seconds": 2.0}
    meta = _meta("gil", "sleep", "mixed", validation=val)
    meta["cpu_speed"] = {"sweep_ns": [30.0, 31.0, 55.0, 30.5, 30.0], "validation_ns": [54.0, 56.0]}
    s = summarize(_pipeline_rows(), meta)
    assert s["cpu_speed"]["sweep_spread"] == pytest.approx(55 / 30)
    assert s["cpu_speed"]["sweep_ns_median"] == 30.5 and s["cpu_speed"]["validation_ns"] == 55.0
    assert any(
        "the CPU's speed changed during the sweeps: a fixed Python loop took 30-55 ns" in w for w in s["warnings"]
    )
    assert any("another speed around the validation run" in w for w in s["warnings"])
    # the prediction itself is not rescaled (that made it worse on real pipelines)
    assert s["prediction"]["qps"] == summarize(_pipeline_rows(), _meta("gil", "sleep", "mixed"))["prediction"]["qps"]
    # the same speed throughout: nothing to warn about
    meta["cpu_speed"] = {"sweep_ns": [30.0, 31.0, 30.5], "validation_ns": [30.2, 30.8]}
    s = summarize(_pipeline_rows(), meta)
    assert not any("CPU's speed" in w or "another speed" in w for w in s["warnings"])


def test_stage_calls_timed_inside_the_validation_run_are_compared_with_the_stage_alone():
    rows = _pipeline_rows()
    first = summarize(rows, _meta("gil", "sleep", "mixed"))
    alone = {}
    for st in first["stages"]:
        rec = st["recommended"]
        hit = rows[
            (rows["stage"] == st["name"])
            & (rows["role"] == "stage")
            & (rows["harness"] == rec["harness"])
            & (rows["executor"] == rec["executor"])
            & (rows["concurrency"] == rec["concurrency"])
        ]
        alone[st["name"]] = float(hit["latency_p50_ms"].iloc[0])
    lat = {"gil": {"p50_ms": 2.5 * alone["gil"], "calls": 300}, "sleep": {"p50_ms": alone["sleep"], "calls": 300}}
    val = {"qps": 100.0, "qps_low": 95.0, "qps_high": 105.0, "seconds": 2.0, "stage_latency": lat}
    s = summarize(rows, _meta("gil", "sleep", "mixed", validation=val))
    got = {x["stage"]: x for x in s["validation"]["interference"]}
    assert set(got) == {"gil", "sleep"}  # mixed was not timed (e.g. a process stage)
    assert got["gil"]["ratio"] == pytest.approx(2.5) and got["sleep"]["ratio"] == pytest.approx(1.0)
    differs = next(f for f in s["findings"] if f["title"] == "the whole-pipeline run differs from the prediction")
    assert "gil took 2.5x as long per call as alone" in differs["detail"] and "sleep took" not in differs["detail"]
    assert all(x["replay_p50_ms"] is None and x["vs_replay"] is None for x in got.values())  # no replay here


def test_stage_calls_inside_the_validation_run_are_set_against_their_stand_ins_inside_the_replay():
    rows = _pipeline_rows()
    lat = {"gil": {"p50_ms": 5.0, "calls": 300}, "sleep": {"p50_ms": 4.0, "calls": 300}}
    replay = {
        "qps": 140.0,
        "qps_low": 130.0,
        "qps_high": 150.0,
        "seconds": 2.0,
        "stand_ins": [],
        "stage_latency": {"gil": {"p50_ms": 2.5, "calls": 400}, "sleep": {"p50_ms": 4.2, "calls": 400}},
    }
    val = {"qps": 100.0, "qps_low": 95.0, "qps_high": 105.0, "seconds": 2.0, "stage_latency": lat}
    s = summarize(rows, _meta("gil", "sleep", "mixed", validation=val, replay=replay))
    got = {x["stage"]: x for x in s["validation"]["interference"]}
    assert got["gil"]["replay_p50_ms"] == 2.5 and got["gil"]["vs_replay"] == pytest.approx(2.0)
    assert got["sleep"]["vs_replay"] == pytest.approx(4.0 / 4.2)
    assert s["prediction"]["replay"]["stage_latency"]["gil"]["calls"] == 400
    differs = next(f for f in s["findings"] if f["title"] == "the whole-pipeline run differs from the prediction")
    # the stage the replay was optimistic about is named with both numbers; one within 20% is not
    assert "gil's calls took 5 ms in the pipeline and its stand-in's 2.5 ms in the replay (2.0x)" in differs["detail"]
    assert "sleep's calls" not in differs["detail"]


@pytest.mark.parametrize(
    ("measured", "target", "verdict"),
    [(1000.0, 800.0, "trainer-bound"), (1000.0, 950.0, "balanced"), (1000.0, 1200.0, "data-bound")],
)
def test_the_trainers_demand_against_the_measured_pipeline(measured, target, verdict):
    from stagebench.analysis._verdicts import demand_verdict

    d = demand_verdict(target, WholeRun(qps=measured, qps_low=0.9 * measured, qps_high=1.1 * measured), None)
    assert d.verdict == verdict and d.source == "measured" and d.capacity == measured
    assert verdict in d.text


def test_the_demand_verdict_is_inconclusive_without_a_run_or_a_replay():
    from stagebench.analysis._verdicts import demand_verdict

    assert demand_verdict(None, WholeRun(qps=10.0), None) is None  # no demand stated: no verdict
    bounds_only = Prediction(qps=500.0, method="bounds")
    assert demand_verdict(100.0, None, bounds_only).verdict == "inconclusive"
    replayed = demand_verdict(100.0, None, Prediction(qps=500.0, method="replay"))
    assert replayed.verdict == "trainer-bound" and replayed.source == "replayed"


def _stage_bound(replay_qps: float, replay_low: float) -> tuple[Prediction, str]:
    from stagebench.analysis._predict import apply_replay
    from stagebench.analysis._verdicts import pipeline_verdict

    stages = [{"name": "decode", "status": "ok", "classification": "cpu-bound"}]
    bounds = Prediction(
        qps=12.6,
        binding="stages",
        bottleneck="decode",
        bounds={"stages": 12.6, "cores": 13.1, "gil": 16.0},
        bounds_qps=12.6,
        method="bounds",
        explanation="the bounds",
    )
    replay = {"qps": replay_qps, "qps_low": replay_low, "qps_high": replay_qps * 1.1}
    prediction = apply_replay(bounds, WholeRun.from_json(replay))
    assert prediction is not None
    return prediction, pipeline_verdict(
        [StageEntry.from_json(st) for st in stages], prediction, WholeRun(qps=13.8, qps_low=10.1, qps_high=18.9)
    )


def test_no_prediction_is_above_its_bottleneck_stage_alone_and_a_replay_above_it_is_said_beside_it():
    """SPDL's performance_analysis.py (video decode on 2 cores) read "predicted 17 items/s (its own capacity
    binds)" beside a table giving that stage 12.6 items/s; its imagenet_classification.py, 759 against a cores
    bound of 645 (issue 60). A pipeline runs no faster than its slowest stage alone, nor than the cores or the
    GIL allow: the prediction is the bound, and the replay's reading is said beside it, with why."""
    above, line = _stage_bound(17.4, 13.9)  # above beyond its interval: its stand-ins did not stand in
    assert above.qps == 12.6 and above.method == "bounds", above
    assert line.startswith("decode is the bottleneck: cpu-bound; predicted 13 items/s (its own capacity binds"), line
    assert "the replay read 17 items/s (14-19), above the bounds: its stand-ins did not cost what" in line, line
    noisy, line = _stage_bound(13.1, 12.0)  # above within its interval
    assert noisy.qps == 12.6 and "above the bounds: within the replay's noise" in line, line
    below, line = _stage_bound(12.0, 10.9)
    assert below.qps == 12.0 and below.method == "replay", below
    assert (
        line == "decode is the bottleneck: cpu-bound; predicted 12 items/s (its own capacity binds: 13 items/s alone)"
    )


def test_a_duration_in_prose_is_in_milliseconds_below_a_second_and_in_seconds_from_one():
    """ImageNet under torchrun printed "your step takes 1.15e+03 ms"."""
    from stagebench._numbers import fmt_ms

    assert fmt_ms(0.00456) == "4.56 ms" and fmt_ms(0.102) == "102 ms" and fmt_ms(1.1523) == "1.15 s"
    assert fmt_ms(7.04e-8) == "0.0704 µs" and fmt_ms(3e-7) == "0.3 µs" and fmt_ms(0.0) == "0 ms"
    assert fmt_ms(9.9e-6) == "9.9 µs" and fmt_ms(1e-5) == "0.01 ms"
    assert fmt_cores(1.0) == "1 core" and fmt_cores(2.0) == "2 cores" and fmt_cores(1.5) == "1.5 cores"
    # two durations set side by side read in one unit: "0.3 µs ... less than the 24.3 µs", not "0.0243 ms"
    assert fmt_ms(24.3e-6, unit_of=3e-7) == "24.3 µs" and fmt_ms(0.5, unit_of=2.0) == "0.5 s"


def test_durations_in_one_sentence_read_in_one_unit():
    """SPDL's pipeline_definitions: "one item needs 0.256 ms of the main process's GIL: 2.01 µs of its stages'
    own Python (normalize_to_lists 1.27 µs, disaggregate 0.734 µs) and 0.254 ms of the pipeline's own
    scheduling": the sum in µs and ms at once."""
    from stagebench._numbers import SourceItems, fmt_ms_each

    assert fmt_ms_each(256e-6, 2.01e-6, 0.734e-6, 254e-6) == ["256 µs", "2.01 µs", "0.734 µs", "254 µs"]
    # the largest a millisecond or more: ms throughout, not "1.2e+03 µs"
    assert fmt_ms_each(5e-6, 1.2e-3) == ["0.005 ms", "1.2 ms"]
    # a trivial grouped stage's part beside millisecond stages: in ms, and still no exponent
    assert fmt_ms_each(5e-11, 1.23e-8, 1.2e-3) == ["0.00000005 ms", "0.0000123 ms", "1.2 ms"]
    assert fmt_ms_each(50e-6, 500e-6) == ["0.05 ms", "0.5 ms"]
    # at a second and up each its own; zeros and NaN take no part in the choice
    assert fmt_ms_each(1.5, 0.02) == ["1.5 s", "20 ms"]
    assert fmt_ms_each(0.0, 3e-6, math.nan) == ["0 µs", "3 µs", "nan µs"]
    # a grouped stage's call over its 16 items (0.05 µs) beside the harness's no-op (24.3 µs an item)
    src = SourceItems(16.0)
    own, h = 0.8e-6, 388.8e-6  # per call
    assert src.ms_each(own, h) == ["0.05 µs", "24.3 µs"]
    assert src.ms(h) == "0.0243 ms"


@pytest.mark.parametrize(
    "kind, ms",
    [("spin", {"gil_ms": 4.0, "wait_ms": 0.0}), ("sleep", {"gil_ms": 0.3, "wait_ms": 5.0})],
)
def test_two_ranks_read_each_ranks_time_per_item_not_the_hosts(kind, ms):
    """A torchrun job's SPDL pipeline, 2 ranks: the rows' rates are the host's (the sum over the ranks), and
    every time per item read off a rate (Little's law, 1/peak, a ceiling's 1/rate) was half a rank's. The
    replay's stand-ins then ran twice as fast (1,413 items/s against a bound of 756), and a GIL share
    divided by that time read high. Each rank runs its own pipeline, at its own rate, under its own GIL."""
    one = model_rows(kind, **ms)
    two = one.copy()
    for col in ("qps", "qps_low", "qps_high", "cores_used"):
        two[col] = two[col] * 2  # the host's: both ranks at once; CPU per item and latency as one rank's
    two["ranks"] = 2
    a, b = analyzed(one, cores=4), analyzed(two, cores=4)
    assert b["stage_s_per_item"] == pytest.approx(a["stage_s_per_item"], rel=1e-9)
    assert b["gil_fraction"] == pytest.approx(a["gil_fraction"], abs=1e-9)
    assert b["classification"] == a["classification"]
    assert b["recommended"]["qps"] == pytest.approx(2 * a["recommended"]["qps"])  # the host's rate, as shown


def test_a_process_stage_s_ipc_is_the_median_of_ceiling_pairs_at_the_same_concurrency():
    """The main process's cost of moving an item to a worker and back is the same at every concurrency; each
    pair of no-op ceilings differs by the host's speed between its readings (gil_mix: 0.13-0.24 ms at most
    levels, -0.02 at one). The process ceiling at 1 waits on the round trip: not a pair."""
    rows = model_rows("s", gil_ms=1.0, wait_ms=2.0, harness="spdl", ceiling=False)
    thread_ms = {1: 0.26, 2: 0.35, 4: 0.39, 8: 0.43}
    process_ms = {1: 0.67, 2: 0.50, 4: 0.52, 8: 0.41}
    ceilings = [
        row("s", ex, c, 1e3 / ms, role="ceiling", harness="spdl", cores_used=1.2, cpu_s_per_item=1.2 * ms / 1e3)
        for ex, table in (("thread", thread_ms), ("process", process_ms))
        for c, ms in table.items()
    ]
    st = analyzed(pd.concat([rows, pd.DataFrame(ceilings)], ignore_index=True), cores=2)
    # pairs from 2: 0.15, 0.13, -0.02 ms; their median
    assert st["alternatives"]["process"]["ipc_s_per_item"] == pytest.approx(0.13e-3)
    assert "ipc_s_per_item" not in st["alternatives"]["thread"]
