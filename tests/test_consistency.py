"""Consistency rules over real run directories: the findings, the verdict, the snippet and the settings agree.

Each rule is a function of a run directory's ``summary.json`` (and its report's
snippet) that lists what breaks it; the tests apply them to a diagnosis of the
known-answer reference stages run here, and to the committed example report.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from _stages import Sleep, Spin, SpinSleep
from spdl.pipeline import PipelineBuilder

from stagebench.model._meta import RunMeta
from stagebench.model._summary import Summary
from stagebench.pipeline._diagnose import diagnose_pipeline
from stagebench.pipeline._settings import DiagnoseSettings
from stagebench.report._snippets import loader_snippet, pipeline_snippet

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
    snippet = pipeline_snippet(Summary.from_json(summary), RunMeta.from_json(meta))
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
    # faster means shown in turns: the ratio's interval above 1 (the rule of model/_evidence)
    if y.get("verdict") == "recommended" and not (y.get("ratio_low") or 0) > 1:
        bad.append(f"called faster, but the ratio in turns does not show it: {y.get('text')}")
    if y.get("verdict") == "cheaper" and not (y.get("ratio_low") or 0) > 0.95:
        bad.append(f"called as fast, but the ratio in turns does not show it within 5%: {y.get('text')}")
    return bad


_KNOB_ADVICE = re.compile(
    r"\b(?:[Ss]et|[Uu]se|sets)\s+(num_workers|prefetch_factor|persistent_workers|pin_memory)=(\w+)"
)


def rule_loader_findings_follow_the_snippet(summary: dict) -> list[str]:
    """No finding of a loader run advises a knob value the recommendation (the snippet) does not have
    (issue 30: "Set persistent_workers=True" next to ``persistent_workers=False,  # was True``)."""
    rec = summary.get("recommended") or {}
    if summary.get("kind") != "loader" or not rec:
        return []
    bad = []
    for f in summary.get("findings") or []:
        for m in _KNOB_ADVICE.finditer(f"{f.get('title')}. {f.get('detail')}"):
            knob, value = m.group(1), m.group(2)
            have = rec.get(knob)
            if knob == "num_workers" and int(value) != int(have or 0):
                bad.append(f"{m.group(0)!r} while the recommendation has num_workers={have}")
            elif knob in ("persistent_workers", "pin_memory") and str(have) != value:
                bad.append(f"{m.group(0)!r} while the recommendation has {knob}={have}")
    return bad


def rule_the_job_pick_is_the_recommendation(summary: dict) -> list[str]:
    """Where the training job ran with the user's loop, its pick is what the summary recommends, and the
    verdict's figure is the job's."""
    job = summary.get("job") or {}
    if job.get("status") != "decided":
        return []
    pick = next(c for c in job["candidates"] if c["key"] == job["pick"])
    bad = []
    if summary.get("kind") == "loader":
        rec = summary.get("recommended") or {}
        for k, v in pick["settings"].items():
            if k == "prefetch_factor" and not pick["settings"].get("num_workers"):
                continue
            if k == "pin_memory" and rec.get(k) == "not applicable" and v is False:
                continue
            if rec.get(k) != v:
                bad.append(f"job pick {k}={v!r}, recommended {rec.get(k)!r}")
    else:
        for st in summary.get("stages") or []:
            want = pick["settings"].get(st["name"])
            rec = st.get("recommended") or {}
            if want and [rec.get("executor"), rec.get("concurrency")] != list(want):
                bad.append(f"{st['name']}: job pick {want}, recommended {rec}")
    if job["text"] not in (summary.get("verdict") or ""):
        bad.append(f"verdict {summary.get('verdict')!r} is not the job's {job['text']!r}")
    return bad


def _negatives(node: object, path: str = "") -> list[str]:
    out: list[str] = []
    if isinstance(node, dict):
        for k, v in node.items():
            key = str(k)
            rate_like = key.endswith(("_low", "_high")) or "per_s" in key or key.startswith("qps")
            if rate_like and isinstance(v, (int, float)) and not isinstance(v, bool) and v < 0:
                out.append(f"{path}.{key} = {v}")
            out += _negatives(v, f"{path}.{key}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _negatives(v, f"{path}[{i}]")
    return out


def rule_no_rate_below_zero(summary: dict) -> list[str]:
    """No rate or end of a rate's interval below zero, anywhere in a summary or its terminal table
    (issue 36: a busy host printed "6.38 samples/s (-0.237-13)")."""
    from stagebench.report._kinds import kind_of

    bad = _negatives(summary)
    try:
        text = kind_of(summary.get("kind")).table(summary)
    except (KeyError, TypeError):  # a partial summary made up for a rule's own test: the numbers were checked
        text = ""
    bad += [m.group(0) for m in re.finditer(r"\(-\d[\d,.]*[-–]", text)]
    return bad


def rule_a_waiting_pick_names_the_setting_that_waited_less(summary: dict) -> list[str]:
    """Words that hold together: a job verdict that advises a setting whose loop waits for data (data-bound,
    or a wait it shows as 1% or more) names any measured setting whose loop waited far less, and why that
    one is not the pick."""
    from stagebench.analysis._job import SHOWN_WAIT

    job = summary.get("job") or {}
    if job.get("status") != "decided":
        return []
    pick = next(c for c in job["candidates"] if c["key"] == job["pick"])
    wait = (pick.get("job") or {}).get("data_wait_share") or 0.0
    if job.get("bound") != "data-bound" and wait < SHOWN_WAIT:
        return []
    calm = [
        c
        for c in job["candidates"]
        if c["key"] != job["pick"] and c.get("job") and c["job"].get("data_wait_share", 1.0) < 0.5 * wait
    ]
    named = job["text"]
    return [
        f"a pick that waits {wait:.0%} beside {c['label']!r}, which waited less, unnamed"
        for c in calm
        if c["label"] not in named and not (c["key"] == job.get("yours") and "; yours waited" in named)
    ]


RULES = [
    rule_no_rate_below_zero,
    rule_a_waiting_pick_names_the_setting_that_waited_less,
    rule_findings_follow_the_recommendation,
    rule_shares_are_at_most_100_percent,
    rule_no_throughput_for_an_unchecked_change,
    rule_advice_against_yours_is_measured,
    rule_loader_findings_follow_the_snippet,
    rule_the_job_pick_is_the_recommendation,
]


def rule_the_snippet_pastes_as_is(snippet: str) -> list[str]:
    """Every line of code in a snippet runs as pasted: no ``...`` placeholder outside a comment."""
    return [ln for ln in snippet.splitlines() if "..." in ln.split("#", 1)[0]]


def _check(run: Path) -> list[str]:
    summary = json.loads((run / "summary.json").read_text())
    meta = json.loads((run / "run.json").read_text())
    broken = [f"{r.__name__}: {b}" for r in RULES for b in r(summary)]
    if summary.get("kind") == "loader":
        snippet = loader_snippet(Summary.from_json(summary))
    else:
        snippet = pipeline_snippet(Summary.from_json(summary), RunMeta.from_json(meta))
        broken += [
            f"rule_snippet_sets_the_recommended_settings: {b}"
            for b in rule_snippet_sets_the_recommended_settings(summary, meta)
        ]
    broken += [f"rule_the_snippet_pastes_as_is: {b}" for b in rule_the_snippet_pastes_as_is(snippet)]
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
        "cheaper",
        "could not tell",
        "yours",
        "same",
        "inconclusive",
        "not run",
    )


HOST16 = Path(__file__).resolve().parent / "data" / "host16"


@pytest.mark.parametrize("name", ["demo", "resnet_loader_run1", "resnet_loader_run2"])
def test_the_rules_hold_on_16_core_rows(tmp_path, name):
    """Rows from a 16-core host with an H200 (tests/data/host16), rebuilt here: the analysis of more cores."""
    from stagebench.sweep._rebuild import rebuild

    run = tmp_path / name
    shutil.copytree(HOST16 / name, run)
    rebuild(run)
    assert _check(run) == []


def test_16_core_loader_rows_keep_the_scripts_pinning_and_say_the_job_was_not_run(tmp_path):
    """The ResNet-50 script on an H200 host pins its batches; the rows predate the job runs (issue 30)."""
    from stagebench.sweep._rebuild import rebuild

    run = tmp_path / "resnet"
    shutil.copytree(HOST16 / "resnet_loader_run1", run)
    rebuild(run)
    s = json.loads((run / "summary.json").read_text())
    # yours is kept: these rows hold no windows in turns, and readings apart are not evidence of a change
    assert s["recommended"]["pin_memory"] is True and s["recommended"]["why"].startswith("your setting, kept")
    assert "they were not measured in turns" in s["recommended"]["why"]
    assert s["recommended"]["persistent_workers"] is True
    assert "the job: inconclusive: no setting was run with your loop" in s["verdict"]
    snippet = loader_snippet(Summary.from_json(s))
    assert "pin_memory=True,  # as yours" in snippet and "persistent_workers=True,  # as yours" in snippet


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
        "validation": {"qps": 6.38, "qps_low": -0.237, "qps_high": 13.0},
    }
    bad_loader = {
        "kind": "loader",
        "verdict": "keep yours",
        "recommended": {"num_workers": 2, "persistent_workers": False},
        "findings": [{"title": "Workers restart", "detail": "Set persistent_workers=True."}],
        "job": {
            "status": "decided",
            "pick": "a",
            "text": "use a",
            "bound": "data-bound",
            "candidates": [
                {
                    "key": "a",
                    "label": "a",
                    "settings": {"num_workers": 4, "persistent_workers": False},
                    "job": {"data_wait_share": 0.4},
                },
                {"key": "b", "label": "b", "settings": {"num_workers": 8}, "job": {"data_wait_share": 0.0}},
            ],
        },
    }
    for rule in RULES:
        assert rule(bad) or rule(bad_loader), rule.__name__
    assert rule_the_snippet_pastes_as_is("    .build(num_threads=...)\n    # .aggregate(...) keep")
    assert rule_snippet_sets_the_recommended_settings(
        {"stages": [st], "prediction": {"settings": [{"stage": "aug", "executor": "thread", "concurrency": 8}]}}, {}
    )
