"""The loader sweep's typed records (model/_loader.py) read what the sweep and the summary write, and give it back."""

from __future__ import annotations

import json
import math
from dataclasses import replace

from stagebench.model._knobs import LoaderKnobs
from stagebench.model._loader import LoaderPoint, WorkerCosts

SAMPLES = [
    {"t": 0.25 * i, "uss_mb": {"11": 100.0 + i, "12": 101.0 + i}, "batches": {"11": i, "12": i}} for i in range(4)
]
SHIPPED = {
    "start_method": "spawn",
    "shipped": True,
    "pickled_once": False,
    "largest": {
        "attr": "items",
        "items": 300_000,
        "container": "list",
        "item": "tuple",
        "python_objects": True,
        "objects_mb": 40.2,
    },
    "mb": 25.3,
    "pickle_s": 0.31,
    "pickle_s_range": [0.3, 0.33],
    "unpickle_s": 0.2,
    "unpickle_s_range": [0.19, 0.22],
    "repeats": 3,
}
MEMORY = {
    "num_workers": 2,
    "samples": SAMPLES,
    "growth_mb_per_batch": 1.5,
    "growth_mb_per_batch_low": 1.2,
    "growth_mb_per_batch_high": 1.8,
    "batches_per_worker": 10,
    "epoch_batches_per_worker": 5000.0,
    "start_mb": 100.0,
    "end_mb": 115.0,
    "epoch_growth_mb": 7000.0,
    "epoch_growth_mb_low": 6000.0,
    "epoch_growth_mb_high": 8000.0,
    "extrapolated": True,
    "bounded_by_mb": None,
    "seconds": 2.1,
}
SHM = {
    "path": "/dev/shm",
    "free_mb": 60.0,
    "total_mb": 64.0,
    "batch_mb": 16.0,
    "batches_in_flight": 8,
    "in_flight_mb": 128.0,
}


def test_worker_costs_give_back_what_the_sweep_wrote():
    """Every shape the sweep writes (shipped, under fork, unpicklable; the epoch's growth read or too few
    batches for it) reads and writes back key for key, in order."""
    few = {
        k: v
        for k, v in MEMORY.items()
        if not k.startswith("epoch_growth") and k not in ("extrapolated", "bounded_by_mb", "seconds")
    }
    for recorded in (
        {
            "available_mb": 12000.5,
            "shipping": SHIPPED,
            "memory_on_stall_point": True,
            "memory": MEMORY,
            "shm": SHM,
            "seconds": 3.3,
        },
        {"available_mb": 1.0, "shipping": {"start_method": "fork", "shipped": False, "largest": None}},
        {
            "shipping": {
                "start_method": "spawn",
                "shipped": True,
                "pickled_once": True,
                "largest": None,
                "error": "TypeError: x",
            }
        },
        {"memory": {**few, "too_few_batches": True, "seconds": 1.0}},
    ):
        costs = WorkerCosts.from_json(json.loads(json.dumps(recorded)))
        back = costs.to_json()
        assert back.pop("startup") == []
        assert json.dumps(back) == json.dumps(recorded)
    costs = WorkerCosts.from_json({"memory": MEMORY, "shipping": SHIPPED})
    assert costs.memory is not None and costs.memory.samples is not None and len(costs.memory.samples) == 4
    assert costs.shipping is not None and costs.shipping.largest is not None and costs.shipping.largest.items == 300_000
    assert "samples" not in replace(costs.memory, samples=None).to_json()


def test_a_loader_point_reads_a_row_a_summary_or_a_frame_record_alike():
    """A pooled row (NaN where empty, knobs as floats from a frame) and the same point read back from
    summary.json (null where empty) read as the same knobs; numbers keep the value they were read with."""
    row = {
        "num_workers": 4.0,
        "prefetch_factor": 2.0,
        "persistent_workers": True,
        "pin_memory": "not applicable",
        "samples_per_s": 250.0,
        "samples_per_s_low": 240.0,
        "samples_per_s_high": 260.0,
        "mem_pss_mb": math.nan,
        "epoch_stall_s": 0.5,
        "workers_start_s": 0.2,
        "status": "ok",
        "reason": "",
        "measurements": 2,
    }
    p = LoaderPoint.from_json(row)
    q = LoaderPoint.from_json({**row, "num_workers": 4, "prefetch_factor": 2, "mem_pss_mb": None})
    # the analysis's key: pinning that did not apply is off, as LoaderKnobs.from_row reads it from any row
    assert p.knobs == q.knobs == LoaderKnobs(num_workers=4, prefetch_factor=2, persistent_workers=True)
    assert p.samples_per_s is not None and (p.samples_per_s.low, p.samples_per_s.high) == (240.0, 260.0)
    assert math.isnan(p.mem_pss_mb or 0.0) and q.mem_pss_mb is None
    assert p.startup.workers_start_s == 0.2 and p.measurements == 2 and p.ok
    empty = LoaderPoint.from_json(None)
    assert empty.samples_per_s is None and empty.status == "ok" and empty.knobs is None
    assert LoaderPoint.from_json({"samples_per_s": math.nan}).rate is None


def test_loader_knobs_read_from_rows_name_one_setting_whatever_the_row_was_read_from():
    """Rows written by the sweep, read back from results.csv (floats, NaN) or from a summary ("not
    applicable") name the same setting: the key by which readings pool and rounds pair."""
    import pytest

    written = {"num_workers": 2, "prefetch_factor": 2, "persistent_workers": False, "pin_memory": False}
    from_csv = {"num_workers": 2.0, "prefetch_factor": 2.0, "persistent_workers": False, "pin_memory": "not applicable"}
    assert (
        LoaderKnobs.from_row(written) == LoaderKnobs.from_row(from_csv) == LoaderKnobs(num_workers=2, prefetch_factor=2)
    )
    none = {"num_workers": 0, "prefetch_factor": math.nan, "persistent_workers": "not applicable", "pin_memory": False}
    assert LoaderKnobs.from_row(none) == LoaderKnobs()
    # of settings as fast the cheaper is advised: workers first, then batches in flight, then the flags
    pf4 = LoaderKnobs(num_workers=2, prefetch_factor=4)
    keep = LoaderKnobs(num_workers=2, prefetch_factor=2, persistent_workers=True)
    assert LoaderKnobs().cost() < LoaderKnobs.from_row(written).cost() < keep.cost() < pf4.cost()
    with pytest.raises(ValueError, match="num_workers"):
        LoaderKnobs.from_row({"num_workers": None})


def test_a_loader_row_is_read_once_with_python_types_and_written_back_in_the_columns_order():
    """A row as measured and as read back from results.csv (True as a string, an empty prefetch_factor as NaN)
    is one LoaderRow; written back, its keys are the columns' (a ranked window's only where it has them), then
    what pooling and the pick add."""
    from dataclasses import replace

    from stagebench.model._loader import LoaderRow
    from stagebench.runs._schema import LOADER_COLUMNS, RANK_COLUMNS

    measured = {"num_workers": 2, "prefetch_factor": 2, "persistent_workers": True, "samples_per_s": 250.0}
    from_csv = {"num_workers": 2.0, "prefetch_factor": 2.0, "persistent_workers": "True", "samples_per_s": 250.0}
    row = LoaderRow.from_row(measured)
    assert row == LoaderRow.from_row(from_csv)
    assert row.knobs == LoaderKnobs(num_workers=2, prefetch_factor=2, persistent_workers=True)
    assert row.pin_memory == "not applicable" and row.status == "ok" and row.ok and row.ranks is None
    assert math.isnan(row.mem_pss_mb) and row.loader == "" and row.rate is not None and row.rate.value == 250.0
    assert list(row.to_json()) == [c for c in LOADER_COLUMNS if c not in RANK_COLUMNS]
    ranked = LoaderRow.from_row({**measured, "ranks": 2.0, "rank_min_samples_per_s": 120.0})
    assert ranked.ranks == 2 and list(ranked.to_json()) == list(LOADER_COLUMNS)
    pooled = replace(row, measurements=2, readings=(240.0, 260.0), why="the fastest")
    assert list(pooled.to_json())[-3:] == ["measurements", "readings", "why"]
    assert pooled.to_json()["readings"] == [240.0, 260.0]
    assert LoaderRow.from_row({"num_workers": 0, "prefetch_factor": math.nan}).knobs == LoaderKnobs()
