"""Every saved run rebuilds to the same summary.json and the same terminal text (issue 37).

The analysis and the report are pure functions of saved rows; a change that only restructures the
code (types, modules) must not move one figure or one word of what a saved run rebuilds to. The
expected files live in ``tests/data/golden/<run>/``; where a change is meant to change them, rebuild
them with ``STAGEBENCH_UPDATE_GOLDEN=1 pytest tests/test_golden.py`` and read the diff before
committing it.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pytest

from stagebench.report._kinds import kind_of
from stagebench.sweep._rebuild import rebuild

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).resolve().parent / "data" / "golden"
RUNS = {
    "example": ROOT / "reports" / "example",
    "host16-demo": ROOT / "tests" / "data" / "host16" / "demo",
    "host16-resnet1": ROOT / "tests" / "data" / "host16" / "resnet_loader_run1",
    "host16-resnet2": ROOT / "tests" / "data" / "host16" / "resnet_loader_run2",
}
#: Keys that say which stagebench wrote the file, not what the rows say.
VOLATILE = ("stagebench_version",)


def _terminal(summary: dict) -> str:
    return kind_of(summary.get("kind")).table(summary)


def _same(a: object, b: object, path: str = "") -> list[str]:
    """Where two JSON values differ (floats to 1e-9 relative: the same arithmetic, another libm)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            if k in VOLATILE:
                continue
            if k not in a or k not in b:
                out.append(f"{path}.{k}: only in {'expected' if k in a else 'rebuilt'}")
            else:
                out += _same(a[k], b[k], f"{path}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items expected, {len(b)} rebuilt"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _same(x, y, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, (int, float)) and not isinstance(b, bool):
        return [] if math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) else [f"{path}: {a!r} expected, {b!r} rebuilt"]
    return [] if a == b else [f"{path}: {a!r} expected, {b!r} rebuilt"]


@pytest.mark.parametrize("name", sorted(RUNS))
def test_a_saved_run_rebuilds_to_the_same_summary_and_terminal_text(tmp_path, name):
    run = tmp_path / name
    shutil.copytree(RUNS[name], run, ignore=shutil.ignore_patterns("report.html", "screenshot.png", "summary.json"))
    rebuild(run)
    summary = json.loads((run / "summary.json").read_text())
    text = _terminal(summary)
    want = GOLDEN / name
    if os.environ.get("STAGEBENCH_UPDATE_GOLDEN"):
        want.mkdir(parents=True, exist_ok=True)
        (want / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
        (want / "terminal.txt").write_text(text)
        pytest.skip("golden files rewritten")
    expected = json.loads((want / "summary.json").read_text())
    diffs = _same(expected, summary)
    assert not diffs, "\n".join(diffs[:20])
    assert text == (want / "terminal.txt").read_text()


def test_the_report_says_which_gil_shares_the_probe_read_directly(tmp_path):
    """The host16 demo: three stages' GIL shares were read by the probe, the others inferred from the curves;
    each stage card says which (it said "not measured directly" of every one)."""
    import html
    import re

    from stagebench.model._stage import StageEntry

    run = tmp_path / "demo"
    shutil.copytree(RUNS["host16-demo"], run, ignore=shutil.ignore_patterns("report.html", "screenshot.png"))
    page = html.unescape(rebuild(run).read_text())
    stages = [StageEntry.from_json(s) for s in json.loads((run / "summary.json").read_text())["stages"]]
    direct = {s.name for s in stages if s.gil_read_directly}
    inferred = {s.name for s in stages if s.gil_fraction is not None and not s.gil_read_directly}
    assert direct and inferred
    cards = re.findall(r'<article class="card stage".*?</article>', page, flags=re.S)
    said = {}
    for card in cards:
        name = re.search(r"<h3>.*?</span> (.*?)(?: <span|</h3>)", card, flags=re.S)
        if name and "GIL held" in card:
            said[name.group(1)] = "read directly" in card, "not measured directly" in card
    assert {n for n, (d, _) in said.items() if d} == direct
    assert {n for n, (_, i) in said.items() if i} == inferred
