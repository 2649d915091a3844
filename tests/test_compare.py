"""Comparisons: significance known answers, winner and margin, failed jobs, machines, escaping."""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path
from urllib.parse import unquote

import _fixtures as fx
import pandas as pd
import pytest
from scipy import stats
from test_report import parse, svgs

from stagebench._errors import StagebenchError
from stagebench.report._compare import Estimate, compare_runs, difference, write_comparison
from stagebench.report._run import FailedJob


def _estimate(mean: float, sd: float, n: int) -> Estimate:
    half = stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
    return Estimate(value=mean, low=mean - half, high=mean + half, n=n)


def test_welch_p_value_matches_scipy_from_the_intervals_alone() -> None:
    a, b = _estimate(1000.0, 40.0, 10), _estimate(950.0, 80.0, 6)
    d = difference(a, b)
    ref = stats.ttest_ind_from_stats(1000.0, 40.0, 10, 950.0, 80.0, 6, equal_var=False)
    assert d.p == pytest.approx(ref.pvalue, rel=1e-9)
    assert d.pct == pytest.approx(1000 / 950 - 1)
    assert d.significant is bool(ref.pvalue < 0.05) is False  # p ~ 0.2: not significant
    assert d.test == "Welch's t on batch means"


def test_clear_and_unclear_differences() -> None:
    assert difference(_estimate(1300, 20, 10), _estimate(1000, 20, 10)).significant is True
    assert difference(_estimate(1010, 50, 8), _estimate(1000, 50, 8)).significant is False


def test_without_batch_counts_falls_back_to_interval_overlap_and_says_so() -> None:
    d = difference(Estimate(value=110, low=105, high=115), Estimate(value=100, low=95, high=104))
    assert d.p is None and d.significant is True and d.test == "95% intervals do not overlap"
    d = difference(Estimate(value=102, low=97, high=107), Estimate(value=100, low=95, high=104))
    assert d.significant is False and d.test == "95% intervals overlap"
    d = difference(Estimate(value=102), Estimate(value=100))
    assert d.significant is None and d.test == "no interval: untested"


def test_estimate_rejects_bad_confidence() -> None:
    with pytest.raises(ValueError, match="confidence"):
        Estimate(value=1.0, confidence=1.5)


def test_loader_comparison_names_the_winner_margin_and_failed_job(tmp_path: Path) -> None:
    a = fx.synthetic_loader_run(tmp_path / "a", backend="torch", label="torch")
    b = fx.synthetic_loader_run(tmp_path / "b", backend="spdl_pytorch", scale=1.3, label="spdl")
    out = write_comparison(
        [a, b], tmp_path / "cmp", title="loaders", failed=[FailedJob("spdl_pipeline", "ImportError: no spdl")]
    )
    html = out.read_text()
    page = parse(html)
    for sec in ("summary", "best", "curves", "failed", "runs", "data", "rows"):
        assert sec in page.ids, sec
    # 690 * 1.3 = 897 vs 690: +30%, intervals +-4% over 10 batches: clearly significant
    assert "spdl wins: 897 samples/s vs 690 for torch (+30%); significant (Welch" in html
    assert "ImportError: no spdl" in html
    assert "different kinds of machine" not in html
    csv = pd.read_csv(tmp_path / "cmp" / "comparison.csv")
    assert list(csv["label"]) == ["torch", "spdl", "spdl_pipeline"]
    assert list(csv["status"]) == ["ok", "ok", "failed"]
    assert csv.loc[1, "best"] == pytest.approx(897.0)
    assert csv.loc[0, "vs_winner_pct"] == pytest.approx((690 / 897 - 1) * 100, rel=1e-4)
    assert bool(csv.loc[0, "significant_vs_winner"]) is True
    assert csv.loc[0, "recommended_setting"] == "num_workers=2, prefetch_factor=4, persistent_workers=True"
    # the download link carries exactly the CSV file
    link = next(a for t, a in page.tags if t == "a" and a.get("id") == "csv-download")
    assert unquote(link["href"].split(",", 1)[1]).encode() == (tmp_path / "cmp" / "comparison.csv").read_bytes()
    # best-throughput bars and the overlaid curves
    assert len(svgs(page)) == 2
    # relative links to each run's report only when it exists
    assert 'href="../a/report.html"' not in html


def test_within_noise_is_reported_as_such(tmp_path: Path) -> None:
    a = fx.synthetic_run(tmp_path / "a")
    b = fx.synthetic_run(tmp_path / "b", scale=1.02)
    html = write_comparison([a, b], tmp_path / "cmp", title="pipelines").read_text()
    # per stage: 2% apart with +-5% intervals over 8 batches
    assert "within noise" in html
    # one overlay per stage
    assert len(svgs(parse(html))) == 1 + 2


def _set_provenance(run: Path, **changes) -> Path:
    """Edit a run's recorded machine (run.json and summary.json agree, as a real run's do)."""
    for name in ("run.json", "summary.json"):
        f = run / name
        data = json.loads(f.read_text())
        prov = data["provenance"]
        for key, value in changes.items():
            if key in ("torch", "spdl"):
                prov["libraries"][key] = value
            else:
                prov[key] = value
        f.write_text(json.dumps(data))
    return run


def test_identical_nodes_with_different_hostnames_do_not_warn(tmp_path: Path) -> None:
    # A sweep spread over identical cluster nodes; memory totals a little apart, as such nodes report them.
    a = _set_provenance(fx.synthetic_loader_run(tmp_path / "a", hostname="node-001"), memory_total_gb=251.4)
    b = _set_provenance(fx.synthetic_loader_run(tmp_path / "b", hostname="node-017", scale=1.1), memory_total_gb=250.1)
    html = write_comparison([a, b], tmp_path / "cmp", title="x").read_text()
    assert "different kinds of machine" not in html
    # the hosts are still named, in the runs table and the CSV
    assert "node-001" in html and "node-017" in html
    csv = pd.read_csv(tmp_path / "cmp" / "comparison.csv")
    assert sorted(csv["hostname"]) == ["node-001", "node-017"]
    assert list(csv["memory_total_gb"]) == [251.4, 250.1]


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"cpu_model": "Other CPU @ 3.1GHz"}, "cpu_model"),
        ({"usable_cores": 4, "cpu_count": 4}, "usable_cores"),
        ({"memory_total_gb": 8.0 * 1.05}, "memory_total_gb"),  # 5% more: beyond the tolerance
        ({"python": "3.12.4"}, "python"),
        ({"free_threaded": True}, "free_threaded"),
        ({"torch": "2.5.1"}, "torch"),
        ({"spdl": "0.9.0"}, "spdl"),
    ],
)
def test_a_different_kind_of_machine_warns_and_names_what_differs(tmp_path: Path, change, key) -> None:
    a = fx.synthetic_loader_run(tmp_path / "a", hostname="bench-a")
    b = _set_provenance(fx.synthetic_loader_run(tmp_path / "b", hostname="bench-a", scale=1.1), **change)
    html = write_comparison([a, b], tmp_path / "cmp", title="x").read_text()
    assert f"different kinds of machine ({key} differ)" in html


def test_machine_kind_ignores_what_a_run_did_not_record() -> None:
    from stagebench.model._meta import Provenance
    from stagebench.report._compare import machine_kind_differences

    full = dict(fx.PROVENANCE)
    old = {k: v for k, v in full.items() if k not in ("usable_cores", "memory_total_gb", "free_threaded", "libraries")}
    provs = [Provenance.from_json(p) for p in (full, old, dict(full, hostname="elsewhere"))]
    assert machine_kind_differences(provs) == []
    # usable_cores falls back to cpu_count where it is missing: 4 cores is not 2
    assert machine_kind_differences([provs[0], Provenance.from_json(dict(old, cpu_count=4))]) == ["usable_cores"]


def test_hostile_labels_stay_text(tmp_path: Path) -> None:
    a = fx.synthetic_loader_run(tmp_path / "a", label=fx.HOSTILE)
    b = fx.synthetic_loader_run(tmp_path / "b", label=fx.SCRIPT_BREAKOUT, scale=1.1)
    html = write_comparison(
        [a, b], tmp_path / "cmp", title=fx.HOSTILE, failed=[FailedJob(fx.HOSTILE, fx.SCRIPT_BREAKOUT)]
    ).read_text()
    page = parse(html)
    assert "<img src=x" not in html and "</script><script>" not in html
    assert not any(k.startswith("on") for _, a in page.tags for k in a)
    assert [a.get("type") for a, _ in page.scripts] == ["application/json"]
    rows = json.loads(page.scripts[0][1])
    assert {r["label"] for r in rows} >= {fx.HOSTILE, fx.SCRIPT_BREAKOUT}
    assert any(fx.HOSTILE in "".join(ET.fromstring(v).itertext()) for v in svgs(page))  # legend text


def test_same_runs_same_bytes(tmp_path: Path) -> None:
    a = fx.synthetic_loader_run(tmp_path / "a", label="a")
    b = fx.synthetic_loader_run(tmp_path / "b", label="b", scale=0.9)
    first = write_comparison([a, b], tmp_path / "cmp", title="t").read_bytes()
    assert write_comparison([a, b], tmp_path / "cmp", title="t").read_bytes() == first


def test_unreadable_run_becomes_a_failed_row(tmp_path: Path) -> None:
    a = fx.synthetic_loader_run(tmp_path / "a", label="a")
    out = write_comparison([a, tmp_path / "nothing-here"], tmp_path / "cmp", title="t")
    csv = pd.read_csv(out.parent / "comparison.csv")
    assert list(csv["status"]) == ["ok", "failed"]
    assert "not a run directory" in csv.loc[1, "reason"]


def test_compare_runs_checks_its_inputs_and_defaults_its_output(tmp_path: Path, monkeypatch) -> None:
    with pytest.raises(StagebenchError, match="not a run directory"):
        compare_runs([tmp_path])
    a = fx.synthetic_loader_run(tmp_path / "a", label="first")
    b = fx.synthetic_loader_run(tmp_path / "b", label="second", scale=1.2)
    monkeypatch.chdir(tmp_path)
    out = compare_runs([a, b])
    assert out.parent.parent.resolve() == (tmp_path / "reports").resolve()
    assert "comparison: first vs second" in out.read_text()


def test_cli_compare(tmp_path: Path, capsys) -> None:
    from stagebench._cli import main

    a = fx.synthetic_loader_run(tmp_path / "a", label="a")
    b = fx.synthetic_loader_run(tmp_path / "b", label="b", scale=1.2)
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "o")]) == 0
    assert (tmp_path / "o" / "comparison.csv").is_file()
    assert "comparison:" in capsys.readouterr().out
    assert main(["compare", str(tmp_path / "missing")]) == 2


def test_labels_show_only_the_overrides_that_differ(tmp_path: Path) -> None:
    from stagebench.runs._jobs import short_labels

    dirs = []
    for i, backend in enumerate(("torch", "spdl_pytorch")):
        d = fx.synthetic_loader_run(tmp_path / str(i), backend=backend)
        (d / ".hydra").mkdir()
        (d / ".hydra" / "overrides.yaml").write_text(
            f"- loader=imagenet\n- loader.backend={backend}\n- sweep.budget_s=0.5\n"
        )
        dirs.append(d)
    assert short_labels(dirs, [None, None]) == ["loader.backend=torch", "loader.backend=spdl_pytorch"]
    # the sweep app's own label (job_status.json) and run.json's label take precedence
    (dirs[0] / "job_status.json").write_text(json.dumps({"status": "ok", "label": "torch baseline"}))
    assert short_labels(dirs, [None, "mine"]) == ["torch baseline", "mine"]
    html = write_comparison(dirs, tmp_path / "cmp", title="t").read_text()
    assert "torch baseline" in html and "sweep.budget_s" not in html.split('id="rows"')[0]


def test_all_jobs_failed_still_writes_both_files(tmp_path: Path) -> None:
    out = write_comparison([], tmp_path / "cmp", title="t", failed=[FailedJob("a", "boom"), FailedJob("b", "bang")])
    assert "No run with results to compare" in out.read_text()
    csv = pd.read_csv(tmp_path / "cmp" / "comparison.csv")
    assert list(csv["reason"]) == ["boom", "bang"]
