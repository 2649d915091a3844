"""Stage names are the user's: any string goes through rows, analysis, reports and CSV unchanged and inert.

Generated names (unicode, HTML, formula prefixes, NA words, digits, whitespace,
quotes) go through the real analysis and a rebuilt report; a handful of them
also through a real diagnosis of a pipeline whose stages carry them.
"""

from __future__ import annotations

import csv
import html
import json
import random
import re
import subprocess
import sys
import textwrap

import _fixtures as fx
import _rows
import pandas as pd
import pytest

from stagebench.runs._results import read_rows
from stagebench.sweep._rebuild import rebuild

PIECES = [
    "NA",
    "N/A",
    "None",
    "null",
    "nan",
    "NaN",
    "#N/A",
    "<NA>",
    "",
    " ",
    "007",
    "01",
    "1e3",
    "-0",
    "0x1F",
    "=1+1",
    "+SUM(A1)",
    "-2",
    "@cmd",
    "\t=x",
    "'",
    '"',
    "<script>alert(1)</script>",
    "</script>",
    "<!--",
    "&amp;",
    "<b>",
    "{{ 7*7 }}",
    "${x}",
    "%s",
    "\\",
    "décodé",
    "画像",
    "🙂",
    "\u202e",
    "a,b",
    "a\nb",
    ";",
    "|",
]


def _names(n: int) -> list[str]:
    rng = random.Random(7)
    out: list[str] = []
    seen: set[str] = set()
    while len(out) < n:
        name = "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 3)))
        if name.strip() and name not in seen:  # a stage has a name; two stages do not share one
            seen.add(name)
            out.append(name)
    return out


NAMES = _names(200)


def _run(path, names):
    rows = pd.concat(
        [_rows.model_rows(n, gil_ms=0.2, wait_ms=1.0, levels=(1, 2, 4), executors=("thread",)) for n in names]
    )
    meta = {
        "kind": "pipeline",
        "provenance": {"usable_cores": 2, "cpu_count": 2},
        "settings": {"budget_s": 0.5, "concurrency": [1, 2, 4], "executors": ["thread"], "harnesses": ["direct"]},
        "stages": [{"name": n, "index": i + 1, "type": "pipe", "is_async": False} for i, n in enumerate(names)],
        "not_isolated": [],
    }
    return fx.write_run(path, rows, meta, None)


def _visible_text(page: str) -> str:
    """The page without its escaped data island and data: URIs: what a browser would render as markup."""
    page = re.sub(r'<script type="application/json"[^>]*>.*?</script>', "", page, flags=re.S)
    return re.sub(r'(src|href)="data:[^"]*"', "", page)


def test_two_hundred_names_survive_rows_analysis_and_a_rebuilt_report(tmp_path):
    run = _run(tmp_path / "run", NAMES)
    assert read_rows(run)["stage"].drop_duplicates().tolist() == NAMES
    report = rebuild(run).read_text(encoding="utf-8")
    summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    assert [s["name"] for s in summary["stages"]] == NAMES
    markup = _visible_text(report)
    assert "<script>alert(1)</script>" not in markup and "</script><" not in markup
    assert markup.count("<script") == 0  # the report carries no script of its own, and none of the names'
    shown = html.unescape(markup)
    missing = [n for n in NAMES if n not in shown]
    assert not missing, f"names not shown as text: {missing[:5]}"
    with open(run / "results.csv", newline="", encoding="utf-8") as f:
        stages = [r["stage"] for r in csv.DictReader(f)]
    assert not [s for s in stages if s[:1] in ("=", "+", "-", "@", "\t", "\r")]


HOSTILE = ["NA", "007", "=1+1", "<script>x</script>", "None", "画像 🙂"]

SCRIPT = textwrap.dedent(
    """
    import time
    from spdl.pipeline import PipelineBuilder

    def make(k):
        def stage(x):
            time.sleep(0.001)
            return x
        return stage

    names = {names!r}
    b = PipelineBuilder().add_source(range(1000))
    for i, n in enumerate(names):
        b = b.pipe(make(i), name=n)
    pipeline = b.add_sink(10).build(num_threads=2)
    with pipeline.auto_stop():
        for _ in pipeline:
            raise SystemExit("trained: the diagnosis did not stop the loop")
    """
)


@pytest.mark.slow
def test_a_real_diagnosis_of_stages_with_hostile_names(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT.format(names=HOSTILE))
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "SPDL_PIPELINE_DIAGNOSTIC_MODE": "1",
        "SPDL_PIPELINE_DIAGNOSTIC_MODE_NUM_ITEMS": "20",
        "STAGEBENCH_OUTPUT_DIR": str(tmp_path / "run"),
        "STAGEBENCH_BUDGET_S": "0.2",
        "STAGEBENCH_WARMUP_S": "0.05",
        "STAGEBENCH_CONCURRENCY": "1,2",
        "STAGEBENCH_EXECUTORS": "thread",
        "STAGEBENCH_HARNESSES": "direct",
        "STAGEBENCH_VALIDATION_S": "0.5",
        "STAGEBENCH_GIL_PROBE": "off",
        "STAGEBENCH_CACHE_DIR": "off",
    }
    r = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    run = tmp_path / "run"
    summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    assert [s["name"] for s in summary["stages"]] == HOSTILE
    assert all(s["status"] == "ok" for s in summary["stages"])
    assert read_rows(run)["stage"].drop_duplicates().tolist() == HOSTILE
    assert "<script>x</script>" not in _visible_text(rebuild(run).read_text(encoding="utf-8"))
