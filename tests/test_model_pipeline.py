"""The whole pipeline's summary sections read into their types and back to the same dicts (issue 37)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stagebench.model._pipeline import (
    CpuSpeed,
    Demand,
    Joint,
    Prediction,
    Search,
    VersusYours,
    WholeRun,
)
from stagebench.model._summary import Summary

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "data" / "golden"
RUN_JSON = {
    "example": ROOT / "reports" / "example" / "run.json",
    "host16-demo": ROOT / "tests" / "data" / "host16" / "demo" / "run.json",
}
SECTIONS = {
    "prediction": Prediction,
    "validation": WholeRun,
    "recommended_vs_yours": VersusYours,
    "demand": Demand,
    "cpu_speed": CpuSpeed,
    "joint": Joint,
    "search": Search,
}


@pytest.mark.parametrize("name", sorted(p.name for p in GOLDEN.iterdir()))
def test_each_section_of_a_saved_summary_reads_back_to_the_same_dict(name):
    summary = json.loads((GOLDEN / name / "summary.json").read_text())
    assert Summary.from_json(summary).to_json() == summary
    for key, cls in SECTIONS.items():
        if summary.get(key) is not None:
            typed = cls.from_json(summary[key])
            assert typed is not None and typed.to_json() == summary[key], key
    replay = (summary.get("prediction") or {}).get("replay") or {}
    stand_ins = Prediction.from_json(summary.get("prediction")).stand_ins
    assert [s.to_json() for s in stand_ins] == replay.get("stand_ins", [])


@pytest.mark.parametrize("name", sorted(RUN_JSON))
def test_the_run_at_your_settings_reads_back_to_the_same_record(name):
    yours = json.loads(RUN_JSON[name].read_text())["yours"]
    assert WholeRun.from_json(yours).to_json() == yours


def test_a_missing_section_reads_as_its_defaults():
    s = Summary.from_json({"kind": "pipeline"})
    assert s.prediction.qps is None and s.prediction.settings == () and s.prediction.bounds == {}
    assert s.validation.qps is None and s.validation.window_rates == ()
    assert s.recommended_vs_yours.verdict is None and s.recommended_vs_yours.versus_yours is None
    assert s.demand.text is None and s.cpu_speed is None and s.search is None
    assert s.warnings == () and s.findings == [] and s.stages == []


def test_a_quota_s_fraction_of_a_core_reads_as_the_cores_the_run_had():
    """A cgroup quota of 1.5 cores is the summary's ``cores``: the replay bounds a stage's own threads by it
    (it read None where only an int counted, and the bound fell away)."""
    assert Summary.from_json({"kind": "pipeline", "cores": 1.5}).cores == 1.5
    assert Summary.from_json({"kind": "pipeline", "cores": 2}).cores == 2
    assert Summary.from_json({"kind": "pipeline", "cores": "2"}).cores is None
