"""Consistency rules over real run directories: the findings, the verdict, the snippet and the settings agree.

Each rule is a function of a run directory's ``summary.json`` (and its report's
snippet) that lists what breaks it; the tests apply them to a diagnosis of the
known-answer reference stages run here, and to the committed example report.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from _stages import Sleep, Spin, SpinSleep
from spdl.pipeline import PipelineBuilder

from stagebench.pipeline._diagnose import diagnose_pipeline
from stagebench.pipeline._settings import DiagnoseSettings
from stagebench.report._render import pipeline_snippet

EXAMPLE = Path(__file__).resolve().parent.parent / "reports" / "example"


def _texts(summary: dict) -> list[str]:
    """Every sentence a user reads: the verdict, warnings, findings, the explanation, the stages' reasons."""
    out = [summary.get("verdict") or ""]
    out += [str(w) for w in summary.get("warnings") or []]
    out += [f"{f.get('title')}. {f.get('detail')}" for f in summary.get("findings") or []]
    out.append(str((summary.get("prediction") or {}).get("explanation") or ""))
    for key in ("recommended_vs_yours", "demand", "joint"):
        out.append(str((summary.get(key) or {}).get("text") or ""))
    for st in summary.get("stages") or []:
        out += [str(x) for x in (st.get("evidence") or {}).get("summary") or []]
        out.append(str((st.get("recommended") or {}).get("why") or ""))
    return out


def rule_findings_follow_the_recommendation(summary: dict) -> list[str]:
    """A finding that says "use a process executor" for a stage whose recommendation is threads (or the
    reverse) contradicts the snippet."""
    rec = {st["name"]: (st.get("recommended") or {}).get("executor") for st in summary.get("stages") or []}
    bad = []
    for f in summary.get("findings") or []:
        title, stage = f.get("title") or "", f.get("stage")
        if stage in rec and "use a process executor" in title and rec[stage] != "process":
            bad.append(f"{title!r} while {stage} is recommended on {rec[stage]}")
    return bad


def rule_shares_are_at_most_100_percent(summary: dict) -> list[str]:
    """A share of time (GIL busy, CPU in garbage collection, data wait) never exceeds 100%."""
    bad = []
    for text in _texts(summary):
        for m in re.finditer(r"(?<![+\-\d.])(\d+(?:\.\d+)?)% (?:busy|of (?:its|each|an|the))", text):
            if float(m.group(1)) > 100:
                bad.append(m.group(0) + f" in {text[:120]!r}")
    return bad


def rule_no_throughput_for_an_unchecked_change(summary: dict) -> list[str]:
    """No sentence states what the pipeline would reach after a change nothing ran (issue 21)."""
    pattern = re.compile(r"(pipeline would (then )?reach|would lift the pipeline to|lifts the pipeline to)")
    return [t[:160] for t in _texts(summary) if pattern.search(t)]


def rule_snippet_sets_the_recommended_settings(summary: dict, meta: dict) -> list[str]:
    snippet = pipeline_snippet(summary, meta)
    bad = []
    for st in summary.get("stages") or []:
        rec = st.get("recommended") or {}
        if (st.get("type") or "pipe") != "pipe" or not rec.get("executor") or not st["name"].isidentifier():
            continue
        line = next((ln for ln in snippet.splitlines() if f".pipe({st['name']}" in ln), "")
        if f"concurrency={rec['concurrency']}" not in line:
            bad.append(f"{st['name']}: snippet line {line.strip()!r}, recommended {rec}")
        if rec["executor"] == "process" and "ProcessPoolExecutor" not in line:
            bad.append(f"{st['name']}: recommended on processes, snippet {line.strip()!r}")
    return bad


def rule_advice_against_yours_is_measured(summary: dict) -> list[str]:
    """'change your settings' only where the recommended settings were measured faster beyond noise."""
    y = summary.get("recommended_vs_yours") or {}
    bad = []
    for f in summary.get("findings") or []:
        if (f.get("title") or "").startswith("change your settings") and y.get("verdict") != "recommended":
            bad.append(f"{f['title']!r} with verdict {y.get('verdict')!r}")
    if y.get("verdict") == "recommended" and not (y.get("qps_high") or 0) < (
        (summary.get("validation") or {}).get("qps_low") or 0
    ):
        bad.append(f"called faster, but the intervals overlap: {y.get('text')}")
    return bad


RULES = [
    rule_findings_follow_the_recommendation,
    rule_shares_are_at_most_100_percent,
    rule_no_throughput_for_an_unchecked_change,
    rule_advice_against_yours_is_measured,
]


def _check(run: Path) -> list[str]:
    summary = json.loads((run / "summary.json").read_text())
    meta = json.loads((run / "run.json").read_text())
    broken = [f"{r.__name__}: {b}" for r in RULES for b in r(summary)]
    broken += [
        f"rule_snippet_sets_the_recommended_settings: {b}"
        for b in rule_snippet_sets_the_recommended_settings(summary, meta)
    ]
    return broken


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
    """The GIL example (a 1 ms GIL holder, a 5 ms wait, 0.5 ms of GIL then a 2 ms wait), diagnosed."""
    tokenize, fetch, mixed = Spin(1.0), Sleep(5.0), SpinSleep(0.5, 2.0)
    cfg = (
        PipelineBuilder()
        .add_source(range(10**6))
        .pipe(tokenize, concurrency=4, name="tokenize")
        .pipe(fetch, concurrency=16, name="fetch")
        .pipe(mixed, concurrency=8, name="mixed")
        .add_sink(8)
        .get_config()
    )
    settings = DiagnoseSettings(
        num_items=60,
        budget_s=0.3,
        warmup_s=0.1,
        timeout_s=15,
        concurrency=(1, 2, 4, 8),
        harnesses=("spdl",),
        validation_s=1.5,
        cache_dir="off",
    )
    out = tmp_path_factory.mktemp("consistency") / "run"
    diagnose_pipeline(cfg, out=out, settings=settings, show_table=False, report=True)
    return out


def test_the_rules_hold_on_a_diagnosis_of_the_reference_stages(reference_run):
    assert _check(reference_run) == []
    summary = json.loads((reference_run / "summary.json").read_text())
    assert summary["recommended_vs_yours"]["verdict"] in (
        "recommended",
        "as good",
        "yours",
        "same",
        "inconclusive",
        "not run",
    )


@pytest.mark.skipif(not (EXAMPLE / "summary.json").is_file(), reason="no committed example report")
def test_the_rules_hold_on_the_example_report():
    assert _check(EXAMPLE) == []


def test_the_rules_catch_what_they_are_for():
    """Each rule fails on a summary that breaks it: the rules are not vacuous."""
    st = {"name": "aug", "type": "pipe", "recommended": {"executor": "thread", "concurrency": 2}}
    bad = {
        "verdict": "x",
        "stages": [st],
        "findings": [
            {"title": "aug holds the GIL 90% of its time: use a process executor", "detail": "", "stage": "aug"},
            {"title": "change your settings: 1.5x", "detail": "", "stage": None},
        ],
        "warnings": ["the GIL is 103% busy at the best point"],
        "prediction": {"explanation": "moving aug to processes: the pipeline would then reach about 390 items/s"},
        "recommended_vs_yours": {"verdict": "as good"},
    }
    for rule in RULES:
        assert rule(bad), rule.__name__
    assert rule_snippet_sets_the_recommended_settings(
        {"stages": [st], "prediction": {"settings": [{"stage": "aug", "executor": "thread", "concurrency": 8}]}}, {}
    )
