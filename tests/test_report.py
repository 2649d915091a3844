"""The run report: sections, known values read back, escaping, determinism, rebuild."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from html import unescape
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote

import _fixtures as fx
import numpy as np
import pandas as pd
import pytest

from stagebench._errors import StagebenchError
from stagebench.model._meta import RunMeta
from stagebench.model._stage import StageEntry
from stagebench.model._summary import Summary
from stagebench.report import _render, _snippets
from stagebench.report._plots import usl_curve
from stagebench.report._stage_plots import stage_throughput_svg
from stagebench.runs._results import read_rows
from stagebench.sweep import _multirun, _rebuild


class _Page(HTMLParser):
    """Collects what the tests inspect: tags with attributes, ids, script bodies."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.ids: set[str] = set()
        self.scripts: list[tuple[dict, str]] = []
        self._in_script: dict | None = None
        self._buf: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append((tag, a))
        if "id" in a:
            self.ids.add(a["id"])
        if tag == "script":
            self._in_script, self._buf = a, []

    def handle_data(self, data):
        if self._in_script is not None:
            self._buf.append(data)

    def handle_endtag(self, tag):
        if tag == "script" and self._in_script is not None:
            self.scripts.append((self._in_script, "".join(self._buf)))
            self._in_script = None


def parse(html: str) -> _Page:
    p = _Page()
    p.feed(html)
    return p


def svgs(page: _Page) -> list[str]:
    out = []
    for tag, a in page.tags:
        if tag == "img":
            src = a.get("src", "")
            assert src.startswith("data:image/svg+xml;charset=utf-8,"), src[:60]
            out.append(unquote(src.split(",", 1)[1]))
    return out


@pytest.fixture()
def pipeline_run(tmp_path: Path) -> Path:
    return fx.synthetic_run(tmp_path / "run")


@pytest.fixture(scope="module")
def pipeline_report(tmp_path_factory) -> tuple[Path, str]:
    """One synthetic pipeline report shared by the read-only tests (rendering costs about a second)."""
    run = fx.synthetic_run(tmp_path_factory.mktemp("shared") / "run")
    return run, _render.write_report(run).read_text()


@pytest.fixture()
def loader_run(tmp_path: Path) -> Path:
    return fx.synthetic_loader_run(tmp_path / "loader")


@pytest.fixture()
def fake_summaries(monkeypatch):
    """summarize_run without the analysis modules: the contract-shaped fixtures."""

    def summarize(run_dir: Path) -> dict:
        meta = json.loads((Path(run_dir) / "run.json").read_text())
        rows = read_rows(run_dir)
        if meta["kind"] == "loader":
            return fx.synthetic_loader_summary(rows, meta)
        if set(rows["stage"]) <= set(fx.SYNTH_CURVES):
            return fx.synthetic_summary(rows, meta)
        return fx.simple_summary(rows, meta)

    monkeypatch.setattr(_render, "summarize_run", summarize)
    return summarize


# --------------------------------------------------------------------------- pipeline report


def test_pipeline_report_has_every_section_and_the_known_recommendation(pipeline_report) -> None:
    _, html = pipeline_report
    page = parse(html)
    for sec in (
        "summary",
        "verdict",
        "recommended",
        "overview",
        "findings",
        "stages",
        "stage-1",
        "stage-2",
        "not-isolated",
        "provenance",
        "data",
        "summary-data",
        "csv-download",
    ):
        assert sec in page.ids, sec
    # decode: threads flat near 1000/s, processes reach ~3.98k at 8: the summary recommends process x 8
    assert "process × 8" in html
    assert "ProcessPoolExecutor(max_workers=8)" in html
    assert "decode is the bottleneck" in html
    # the crashed point is listed with its reason, the noise warning is shown
    assert "a worker process died (SIGKILL): out of memory?" in html
    assert "the machine was busy before the run" in html
    # provenance
    assert "Test CPU @ 2.0GHz" in html and "bench-a" in html
    # one throughput plot and one resource plot per stage, plus the overview
    assert len(svgs(page)) == 5
    # the replay's stand-ins, which the predicted number rests on, and the bounds beside it
    assert "What the replay ran in place of each stage" in html and "process × 8" in html
    assert "replayed with stand-ins (bounds: " in html


def test_hostile_names_appear_as_text_everywhere(pipeline_report) -> None:
    _, html = pipeline_report
    page = parse(html)
    # no tag came from user text: every img is ours (a data: SVG), nothing carries an event handler
    assert not any(k.startswith("on") for _, a in page.tags for k in a)
    assert [t for t, a in page.tags if t == "img" and not a.get("src", "").startswith("data:image/svg+xml")] == []
    # the only script is the inert JSON island of the summary
    assert [a.get("type") for a, _ in page.scripts] == ["application/json"]
    assert "<img src=x" not in html and "</script><script>" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html
    # the island and the CSV download round-trip the hostile strings exactly
    rows = csv_rows(page)
    summary = json.loads(page.scripts[0][1])
    assert fx.HOSTILE in {r["stage"] for r in rows} and fx.HOSTILE in {st["name"] for st in summary["stages"]}
    assert summary["not_isolated"][0]["name"] == fx.SCRIPT_BREAKOUT
    # inside the SVGs the name is escaped text and the documents are well-formed XML without script
    svg_texts = svgs(page)
    for svg in svg_texts:
        root = ET.fromstring(svg)
        assert not [e for e in root.iter() if e.tag.endswith("script")]
        assert not any(k.startswith("on") for e in root.iter() for k in e.attrib)
    labels = "".join("".join(ET.fromstring(s).itertext()) for s in svg_texts)
    assert fx.HOSTILE in labels  # drawn as a label (overview y axis), as text


def csv_rows(page: _Page) -> list[dict]:
    """The rows of the page's CSV download link, parsed."""
    import csv
    import io

    link = next(a for t, a in page.tags if t == "a" and a.get("id") == "csv-download")
    return list(csv.DictReader(io.StringIO(unquote(link["href"].split(",", 1)[1]))))


def test_the_csv_download_is_the_saved_rows_and_the_summary_island_the_summary(pipeline_report) -> None:
    pipeline_run, html = pipeline_report
    page = parse(html)
    link = next(a for t, a in page.tags if t == "a" and a.get("id") == "csv-download")
    assert link["download"] == "results.csv" and link["href"].startswith("data:text/csv;charset=utf-8,")
    assert unquote(link["href"].split(",", 1)[1]).encode("utf-8") == (pipeline_run / "results.csv").read_bytes()
    assert len(csv_rows(page)) == len(read_rows(pipeline_run))
    island = json.loads(page.scripts[0][1])
    saved = json.loads((pipeline_run / "summary.json").read_text())
    assert island["verdict"] == saved["verdict"] and [s["name"] for s in island["stages"]] == [
        s["name"] for s in saved["stages"]
    ]
    # the per-stage curves, fits and evidence are drawn and listed in the page: not copied into the island
    assert not {"curves", "fit", "evidence"} & set(island["stages"][0])


def test_the_measured_tile_reads_the_prediction_against_the_round_the_replay_took_part_in(pipeline_run: Path) -> None:
    """Where the validation run took more rounds than the replay, the tile sets the prediction against the
    round both ran (summary's ``qps_with_replay``), and says so; without it, against the whole run."""
    path = pipeline_run / "summary.json"
    summary = json.loads(path.read_text())
    pred = summary["prediction"]["qps"]
    summary["validation"] |= {"qps": pred * 0.8, "qps_with_replay": pred * 1.1}
    path.write_text(json.dumps(summary))
    text = " ".join(unescape(_render.write_report(pipeline_run).read_text()).split())
    assert "+10% vs predicted in the round the replay took part in (" in text
    del summary["validation"]["qps_with_replay"]
    path.write_text(json.dumps(summary))
    text = " ".join(unescape(_render.write_report(pipeline_run).read_text()).split())
    assert "-20% vs predicted" in text and "in the round the replay took part in" not in text


def test_no_external_references(pipeline_report, loader_run: Path) -> None:
    for html in (pipeline_report[1], _render.write_report(loader_run).read_text()):
        page = parse(html)
        for tag, a in page.tags:
            for k in ("src", "href"):
                v = a.get(k)
                if v is not None:
                    assert v.startswith(("data:", "#")), (tag, v[:80])
        # a CSS url() or @import would fetch too; inside the SVGs url(#id) names one of their own elements
        assert "@import" not in html and not re.findall(r"url\((?!#|%23)", html)


def test_same_rows_give_the_same_bytes_even_in_another_process(pipeline_report, tmp_path: Path) -> None:
    pipeline_run, html = pipeline_report
    first = html.encode("utf-8")
    assert _render.write_report(pipeline_run).read_bytes() == first
    # A fresh interpreter with another hash seed (set and dict orders, matplotlib ids) must agree.
    env = dict(os.environ, PYTHONHASHSEED="12345")
    code = "import sys; from stagebench.report._render import write_report; write_report(sys.argv[1])"
    subprocess.run([sys.executable, "-c", code, str(pipeline_run)], check=True, env=env, cwd=tmp_path)
    assert (pipeline_run / "report.html").read_bytes() == first


def test_rebuild_recomputes_the_summary_and_reproduces_the_report(pipeline_run: Path, fake_summaries) -> None:
    first = _render.write_report(pipeline_run).read_bytes()
    summary_path = pipeline_run / "summary.json"
    original = json.loads(summary_path.read_text())
    summary_path.write_text(json.dumps({**original, "verdict": "stale"}))
    out = _rebuild.rebuild(pipeline_run)
    assert out == pipeline_run / "report.html"
    assert json.loads(summary_path.read_text())["verdict"] == original["verdict"]
    assert out.read_bytes() == first


def test_report_without_analysis_still_shows_the_rows(pipeline_run: Path, monkeypatch) -> None:
    (pipeline_run / "summary.json").unlink()

    def broken(run_dir):
        raise ModuleNotFoundError("No module named 'stagebench.analysis._pipeline'")

    monkeypatch.setattr(_render, "summarize_run", broken)
    html = _render.write_report(pipeline_run).read_text()
    assert "the analysis could not run" in html
    assert "stage-2" in parse(html).ids
    assert len(svgs(parse(html))) == 4  # the stage plots come from rows alone
    assert not (pipeline_run / "summary.json").exists()  # nothing derived from a failed analysis


def test_mathtext_and_long_names_do_not_break_plots() -> None:
    rows = fx.synthetic_rows()
    rows = rows[rows.stage == "decode"].copy()
    rows["stage"] = "cost $x$ \\frac{" + "y" * 200
    svg = stage_throughput_svg(
        rows, StageEntry.from_json({"recommended": {"executor": "process", "concurrency": 8, "qps": 3979.0}})
    )
    assert svg and "<svg" in svg


def test_a_comparison_of_many_runs_keeps_its_axes() -> None:
    """Thirty runs: the legend beside the axes once outgrew the figure, and the layout gave up with a
    warning (axes 'collapsed to zero')."""
    import warnings

    from stagebench.report._compare_plots import Curve, compare_curves_svg

    series = [Curve(f"run{i}", [1, 2, 4], [1.0 + i, 2.0 + i, 3.0 + i]) for i in range(30)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        svg = compare_curves_svg(series, xlabel="concurrency", ylabel="items/s", log2_x=True)
    assert svg and "run29" in svg


def test_usl_curve_known_answer() -> None:
    c = np.array([1, 2, 4, 8, 16], float)
    truth = fx.usl(c, 950.0, 0.05, 0.01)
    np.testing.assert_allclose(usl_curve(c, {"lambda": 950.0, "sigma": 0.05, "kappa": 0.01}), truth)
    # without lambda: the least-squares scale through exact points recovers it
    pts = pd.DataFrame({"concurrency": c, "qps": truth})
    np.testing.assert_allclose(usl_curve(c, {"sigma": 0.05, "kappa": 0.01}, pts), truth, rtol=1e-9)
    assert usl_curve(c, {"sigma": None, "kappa": 0.0}) is None


# --------------------------------------------------------------------------- loader report


def test_loader_report_sections_snippet_and_failures(loader_run: Path) -> None:
    html = _render.write_report(loader_run).read_text()
    page = parse(html)
    for sec in ("summary", "loader", "findings", "provenance", "data", "summary-data"):
        assert sec in page.ids, sec
    assert "stages" not in page.ids and "rows" not in page.ids
    # throughput, heat map, start-up/memory
    assert len(svgs(page)) == 3
    # recommended by the fixture's truth: 2 workers, prefetch 4 (690 samples/s)
    # only settings reach the snippet: no measurements, no knob that does not apply (pin_memory here)
    assert re.search(
        r"DataLoader\(\s*dataset, batch_size=32,\s*num_workers=2, prefetch_factor=4, "
        r"persistent_workers=True,\s*\)",
        html,
    )
    assert "worker killed (OOM?)" in html
    assert "690 samples/s" in html


def test_loader_transforms_get_stage_cards(loader_run: Path) -> None:
    """A loader's transforms measured as stages (transforms.csv + summary transforms) render like stages."""
    rows = fx.synthetic_rows()
    rows.to_csv(loader_run / "transforms.csv", index=False)
    summary = json.loads((loader_run / "summary.json").read_text())
    summary["transforms"] = fx.synthetic_summary(rows, fx.synthetic_meta())["stages"]
    (loader_run / "summary.json").write_text(json.dumps(summary))
    html = _render.write_report(loader_run).read_text()
    page = parse(html)
    assert {"transforms", "transform-1", "transform-2", "transform-rows"} <= page.ids
    assert len(svgs(page)) == 3 + 2 * 2
    assert json.loads(next(b for a, b in page.scripts if a.get("id") == "transform-rows"))[0]["stage"] == "decode"
    assert "&lt;img src=x onerror=alert(1)&gt;" in html and "<img src=x" not in html


def test_loader_snippet_without_workers_drops_worker_only_knobs() -> None:
    snip = _snippets.loader_snippet(
        Summary.from_json(
            {
                "loader": {"backend": "torch", "batch_size": 8},
                "recommended": {
                    "num_workers": 0,
                    "prefetch_factor": 2,
                    "persistent_workers": True,
                    "pin_memory": False,
                },
            }
        )
    )
    assert "prefetch_factor" not in snip and "persistent_workers=False" in snip
    spdl = _snippets.loader_snippet(
        Summary.from_json(
            {"loader": {"backend": "spdl_pytorch"}, "recommended": {"num_workers": 4, "prefetch_factor": 2}}
        )
    )
    assert "get_pytorch_dataloader(" in spdl and "num_workers=4" in spdl


def pad_collate(batch):  # a text dataset's padding collate: the snippet must keep it
    return batch


def test_loader_snippet_is_your_own_call_with_only_the_knobs_changed() -> None:
    """The DataLoader snippet keeps collate_fn, shuffle, sampler, batch_size=None and drop_last as the user
    wrote them (the last round's dropped them, and batch_size=None became 1); only the knobs change."""
    import torch
    from torch.utils.data import WeightedRandomSampler

    from stagebench.loader._intercept import make_loader_factory

    data = list(range(32))
    recommended = {"num_workers": 2, "prefetch_factor": 2, "persistent_workers": True, "pin_memory": True}
    f = make_loader_factory(data, batch_size=None, shuffle=True, collate_fn=pad_collate, pin_memory=True, num_workers=8)
    snip = _snippets.loader_snippet(Summary.from_json({"loader": f.describe(), "recommended": recommended}))
    lines = [ln.strip() for ln in snip.splitlines()]
    for kept in ("batch_size=None,", "shuffle=True,", "collate_fn=pad_collate,", "pin_memory=True,  # as yours"):
        assert kept in lines, (kept, snip)
    assert "num_workers=2,  # was 8" in lines and "persistent_workers=True,  # was False" in lines
    compile(snip, "snippet", "exec")  # it is Python
    g = make_loader_factory(
        data, batch_size=4, drop_last=True, sampler=WeightedRandomSampler(torch.ones(32), 32), num_workers=0
    )
    snip = _snippets.loader_snippet(Summary.from_json({"loader": g.describe(), "recommended": recommended}))
    lines = [ln.strip() for ln in snip.splitlines()]
    assert "batch_size=4," in lines and "drop_last=True," in lines and "shuffle=True," not in lines
    # a sampler made in the call has no name: the argument's, said to be a guess; never `...` (an Ellipsis)
    assert (
        "sampler=sampler,  # yours: WeightedRandomSampler; the name is a guess: use the one your script gives it"
        in lines
    )
    assert "collate_fn" not in snip
    compile(snip, "snippet", "exec")
    # the DDP script's `train_sampler = DistributedSampler(...)`: the snippet passes it by that name
    train_sampler = WeightedRandomSampler(torch.ones(32), 32)
    h = make_loader_factory(data, batch_size=4, sampler=train_sampler, collate_fn=lambda b: b, num_workers=0)
    lines = [
        ln.strip()
        for ln in _snippets.loader_snippet(
            Summary.from_json({"loader": h.describe(), "recommended": recommended})
        ).splitlines()
    ]
    assert "sampler=train_sampler,  # yours: WeightedRandomSampler" in lines and lines[3] == "data,"
    assert any(ln.startswith("collate_fn=collate_fn,  # yours: function; the name is a guess") for ln in lines), lines


def test_pipeline_snippet_handles_every_executor_and_odd_names() -> None:
    summary = {
        "stages": [
            {"name": "decode", "type": "pipe", "recommended": {"executor": "process", "concurrency": 4}},
            {"name": "fetch", "type": "pipe", "recommended": {"executor": "async", "concurrency": 16}},
            {"name": "my stage!", "type": "pipe", "recommended": {"executor": "thread", "concurrency": 2}},
            {"name": "batch", "type": "aggregate"},
        ]
    }
    snip = _snippets.pipeline_snippet(Summary.from_json(summary), RunMeta())
    assert ".pipe(decode, concurrency=4, executor=ProcessPoolExecutor(max_workers=4))" in snip
    assert ".pipe(fetch, concurrency=16)\n" in snip
    assert ".pipe(fn, concurrency=2, executor=ThreadPoolExecutor(max_workers=2))  # stage 'my stage!'" in snip
    assert "# .aggregate(...)" in snip
    compile(
        snip.replace("buffer_size=...", "buffer_size=1").replace("num_threads=...", "num_threads=1"),
        "<snippet>",
        "exec",
    )  # it is valid Python


# --------------------------------------------------------------------------- rebuild: sweeps and errors


def test_rebuild_sweep_dir_compares_jobs_and_lists_the_failed_one(tmp_path: Path, fake_summaries) -> None:
    sweep = tmp_path / "multirun"
    fx.synthetic_loader_run(sweep / "0", backend="torch")
    fx.synthetic_loader_run(sweep / "1", backend="spdl_pytorch", scale=1.3)
    (sweep / "2" / ".hydra").mkdir(parents=True)
    (sweep / "2" / ".hydra" / "overrides.yaml").write_text("- loader.backend=spdl_pipeline\n")
    (sweep / "2" / "stagebench.log").write_text("[INFO] start\n[ERROR] ValueError: bad root\n")
    for d in ("0", "1"):
        (sweep / d / ".hydra").mkdir()
        (sweep / d / ".hydra" / "overrides.yaml").write_text(
            f"- loader.backend={'torch' if d == '0' else 'spdl_pytorch'}\n"
        )
    out = _rebuild.rebuild(sweep)
    assert out == sweep / "comparison.html"
    assert (sweep / "0" / "report.html").is_file() and (sweep / "1" / "report.html").is_file()
    html = out.read_text()
    assert "loader.backend=spdl_pytorch wins" in html
    assert "loader.backend=spdl_pipeline" in html and "ValueError: bad root" in html
    csv = pd.read_csv(sweep / "comparison.csv")
    assert list(csv["status"]) == ["ok", "ok", "failed"]


def _multirun_yaml(sweep: Path, task: list[str], *, sweeper: dict | None = None, ours: bool = True) -> None:
    """The parts of Hydra's SWEEP_DIR/multirun.yaml that `stagebench report` reads."""
    import yaml

    hydra = {
        "sweeper": sweeper
        or {
            "_target_": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper",
            "max_batch_size": None,
            "params": None,
        },
        "overrides": {"hydra": ["hydra.mode=MULTIRUN"], "task": task},
    }
    if ours:
        hydra["callbacks"] = {"stagebench": {"_target_": "stagebench.sweep._app.SweepCallback"}}
    sweep.mkdir(parents=True, exist_ok=True)
    (sweep / "multirun.yaml").write_text(yaml.safe_dump({"hydra": hydra, "progress": False}))


def _fake_job(
    sweep: Path,
    num: int,
    overrides: list[str],
    *,
    scale: float,
    status: str | None,
    reason: str = "",
    swept: str = "sweep.budget_s",
) -> Path:
    """A job folder as the sweep app leaves it: .hydra/overrides.yaml, rows, and job_status.json unless None."""
    label = ", ".join(o for o in overrides if o.startswith(swept + "="))
    d = fx.synthetic_loader_run(sweep / f"{num}-{label}", backend="torch", scale=scale)
    (d / ".hydra").mkdir()
    (d / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    if status is not None:
        (d / "job_status.json").write_text(
            json.dumps(
                {
                    "schema_version": 1,
                    "status": status,
                    "reason": reason,
                    "job_num": num,
                    "overrides": overrides,
                    "label": label,
                    "run_dir": str(d),
                }
            )
        )
    return d


def test_rebuild_sweep_lists_unfinished_jobs_as_failed_never_as_winner(tmp_path: Path, fake_summaries) -> None:
    sweep = tmp_path / "multirun"
    _multirun_yaml(sweep, ["loader=synthetic", "sweep.budget_s=1,2,3,4,5", "progress=false"])
    jobs = [["loader=synthetic", f"sweep.budget_s={b}", "progress=False"] for b in (1, 2, 3, 4, 5)]
    # The unfinished jobs measured the fastest points: compared as they are, they would win.
    _fake_job(sweep, 0, jobs[0], scale=1.0, status="ok")
    _fake_job(
        sweep,
        1,
        jobs[1],
        scale=1.5,
        status="failed",
        reason="stopped by SIGTERM (Slurm scancel or time limit?) before the job finished",
    )
    _fake_job(sweep, 2, jobs[2], scale=2.0, status=None)  # killed before its finally could run
    # job 3 was cancelled while it waited for a node: no folder at all
    _fake_job(sweep, 4, jobs[4], scale=1.1, status="ok")

    out = _rebuild.rebuild(sweep)
    html = out.read_text()
    csv = pd.read_csv(sweep / "comparison.csv", keep_default_na=False)
    by_label = {r["label"]: r for r in csv.to_dict("records")}
    assert set(by_label) == {f"sweep.budget_s={b}" for b in (1, 2, 3, 4, 5)}
    assert [by_label[f"sweep.budget_s={b}"]["status"] for b in (1, 2, 3, 4, 5)] == [
        "ok",
        "failed",
        "failed",
        "failed",
        "ok",
    ]
    assert "stopped by SIGTERM" in by_label["sweep.budget_s=2"]["reason"]
    assert "not compared" in by_label["sweep.budget_s=2"]["reason"]  # it has rows; they are not used
    assert "no job_status.json: the job did not finish" in by_label["sweep.budget_s=3"]["reason"]
    assert "never started" in by_label["sweep.budget_s=4"]["reason"]
    assert by_label["sweep.budget_s=4"]["run_dir"] == ""
    # the winner is the best FINISHED job; the failed ones have no figures of merit
    assert "sweep.budget_s=5 wins" in html
    assert by_label["sweep.budget_s=5"]["test"] == "winner"
    for b in (2, 3, 4):
        assert by_label[f"sweep.budget_s={b}"]["best"] == ""
    assert "3 job(s) produced no results" in html


def test_a_users_own_hydra_app_is_judged_by_its_results(tmp_path: Path, fake_summaries) -> None:
    """No stagebench callback in multirun.yaml, no job_status.json: job folders with rows are runs."""
    sweep = tmp_path / "multirun"
    _multirun_yaml(sweep, ["sweep.budget_s=1,2,3"], ours=False)
    _fake_job(sweep, 0, ["sweep.budget_s=1"], scale=1.0, status=None)
    _fake_job(sweep, 1, ["sweep.budget_s=2"], scale=1.2, status=None)
    runs, failed = _multirun.find_run_dirs(sweep)
    assert [r.name for r in runs] == ["0-sweep.budget_s=1", "1-sweep.budget_s=2"]
    assert [(f.name, f.path) for f in failed] == [("sweep.budget_s=3", "")]


def test_sweep_plan_follows_hydras_basic_sweeper(tmp_path: Path) -> None:
    sweep = tmp_path / "s"
    _multirun_yaml(
        sweep,
        ["loader=synthetic", "loader.backend=torch,spdl_pytorch", "sweep.persistent_workers=[false]"],
        sweeper={
            "_target_": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper",
            "params": {"sweep.budget_s": "1,2"},
        },
    )
    plan = _multirun.sweep_plan(sweep)
    # params first, then the command line; job numbers in product order, values as jobs record them
    assert plan is not None and plan.jobs == [
        ["sweep.budget_s=1", "loader=synthetic", "loader.backend=torch", "sweep.persistent_workers=[False]"],
        ["sweep.budget_s=1", "loader=synthetic", "loader.backend=spdl_pytorch", "sweep.persistent_workers=[False]"],
        ["sweep.budget_s=2", "loader=synthetic", "loader.backend=torch", "sweep.persistent_workers=[False]"],
        ["sweep.budget_s=2", "loader=synthetic", "loader.backend=spdl_pytorch", "sweep.persistent_workers=[False]"],
    ]
    assert plan.count == 4 and plan.stagebench is True
    assert _multirun.sweep_plan(tmp_path) is None


def test_other_sweepers_compare_the_job_count(tmp_path: Path, fake_summaries) -> None:
    sweep = tmp_path / "optuna"
    _multirun_yaml(
        sweep,
        ["sweep.budget_s=interval(1,5)"],
        sweeper={"_target_": "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper", "n_trials": 4},
    )
    _fake_job(sweep, 0, ["sweep.budget_s=1.5"], scale=1.0, status="ok")
    _fake_job(sweep, 1, ["sweep.budget_s=2.5"], scale=1.1, status="ok")
    runs, failed = _multirun.find_run_dirs(sweep)
    assert len(runs) == 2
    assert [f.name for f in failed] == ["2 jobs"]
    assert "planned 4 jobs and 2 left a folder" in failed[0].reason


def test_rebuild_rejects_a_folder_without_runs(tmp_path: Path) -> None:
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    with pytest.raises(StagebenchError, match="neither a run directory"):
        _rebuild.rebuild(tmp_path / "empty")
    with pytest.raises(FileNotFoundError):
        _rebuild.rebuild(tmp_path / "missing")


def test_cli_report_command(pipeline_run: Path, fake_summaries, capsys) -> None:
    from stagebench._cli import main

    assert main(["report", str(pipeline_run)]) == 0
    assert "report:" in capsys.readouterr().out
    assert main(["report", str(pipeline_run / "nope")]) == 2


# --------------------------------------------------------------------------- real measured rows


@pytest.fixture(scope="session")
def measured_run(tmp_path_factory) -> Path:
    """Two tiny stages measured for real (about 30 s on a 2-core machine, more when it is busy)."""
    return fx.measure_run(tmp_path_factory.mktemp("measured") / "run")


@pytest.mark.slow
def test_report_on_really_measured_rows(measured_run: Path, tmp_path: Path, fake_summaries) -> None:
    run = tmp_path / "run"
    shutil.copytree(measured_run, run)
    out = _rebuild.rebuild(run)
    html = out.read_text()
    page = parse(html)
    assert {"stage-1", "stage-2"} <= page.ids
    assert len(svgs(page)) == 1 + 2 * 2
    rows = csv_rows(page)
    assert len(rows) == len(read_rows(run)) == 2 * 2 * 4 * 2  # stages x executors x levels x (stage, ceiling)
    assert "&lt;img src=x onerror=alert(1)&gt;" in html and "<img src=x" not in html
    assert _rebuild.rebuild(run).read_bytes() == out.read_bytes()


@pytest.mark.slow
def test_real_analysis_rebuild_is_deterministic(measured_run: Path, tmp_path: Path) -> None:
    """With the real analysis module: same rows, same summary.json and report.html, twice."""
    pytest.importorskip("stagebench.analysis._pipeline")
    run = tmp_path / "run"
    shutil.copytree(measured_run, run)
    first = _rebuild.rebuild(run).read_bytes()
    summary = (run / "summary.json").read_bytes()
    assert _rebuild.rebuild(run).read_bytes() == first
    assert (run / "summary.json").read_bytes() == summary


def test_stage_rates_are_in_source_items_after_a_batch(tmp_path):
    """After a batch of 16, a stage's calls/s times 16 is what it feeds the pipeline: the table says
    items/s in the unit of the bound lines, with the calls/s as a side note."""
    import _rows

    from stagebench._numbers import SourceItems, fmt_q
    from stagebench.report._html import rate_text

    rows = pd.concat(
        [
            _rows.model_rows("decode", gil_ms=0.2, wait_ms=2.0, levels=(1, 2), executors=("thread",)),
            _rows.model_rows("collate", gil_ms=0.1, wait_ms=1.0, levels=(1, 2), executors=("thread",)),
        ]
    )
    meta = {
        "kind": "pipeline",
        "provenance": {"usable_cores": 2, "cpu_count": 2},
        "settings": {"concurrency": [1, 2], "executors": ["thread"], "harnesses": ["direct"]},
        "stages": [
            {"name": "decode", "index": 1, "type": "pipe", "items_per_input": 1.0},
            {"name": "collate", "index": 3, "type": "pipe", "items_per_input": 16.0},
        ],
        "not_isolated": [],
    }
    run = fx.write_run(tmp_path / "run", rows, meta, None)
    html = _rebuild.rebuild(run).read_text()
    summary = json.loads((run / "summary.json").read_text())
    collate = next(s for s in summary["stages"] if s["name"] == "collate")
    per_call = collate["recommended"]["qps"]
    assert rate_text(per_call * 16) in html and "calls/s × 16" in html
    # the card's CPU per item and its evidence are per source item too: one unit in the card
    card = html[html.index('id="stage-2"') :]  # decode is stage-1
    cpu, gil = SourceItems(16).ms_each(collate["cpu_s_per_item"], collate["gil_s_per_item"])
    assert f"<dt>CPU per item</dt><dd>{cpu}, of which {gil} holding the GIL</dd>" in card
    alone = collate["best"]["qps"]  # the evidence recommends for the stage alone
    assert f"-&gt; {fmt_q(alone * 16)} items/s (16 items a call; " in card


def test_each_stage_card_tables_its_points_and_quick_mode_does_not_plot_resources(pipeline_report, tmp_path) -> None:
    from stagebench.report._html import rate_text
    from stagebench.report._render import write_report

    _, html = pipeline_report
    q8 = fx.usl(8, *fx.SYNTH_CURVES["decode"]["process"])
    row = f'<tr><td>process</td><td>direct</td><td class="num">8</td><td class="num">{rate_text(q8)}</td>'
    card = html[html.index('id="stage-1"') : html.index('id="stage-2"')]
    # every measured point of decode (4 thread and 4 process levels; the crashed one is not a point)
    assert "Points measured (8)" in card and row in card and '<td class="num">1.8</td>' in card
    assert "Quick mode" not in html

    run = fx.synthetic_run(tmp_path / "quick")
    meta = json.loads((run / "run.json").read_text())
    meta["settings"]["quick"] = "on"
    (run / "run.json").write_text(json.dumps(meta))
    quick = write_report(run).read_text()
    # a throughput plot per stage and the overview; the resource figures' numbers are in the tables
    assert len(svgs(parse(quick))) == 3
    assert quick.count("cores used, latency and memory are in the points table below") == 2
    assert "<details open><summary>Points measured (8)</summary>" in quick


@pytest.mark.parametrize("advice", ["keep yours", "cheaper", "change"])
def test_the_snippets_first_line_says_what_the_runs_in_turns_showed(advice):
    """Issue 36: every "as fast" carries its ratio's interval; "keep yours" claims nothing the runs did not show
    (the demo's snippet said "your settings are as fast as any run" beside rivals the runs could not tell)."""
    example = Path(__file__).resolve().parent.parent / "reports" / "example"
    summary = json.loads((example / "summary.json").read_text())
    meta = json.loads((example / "run.json").read_text())
    summary["job"] = {**summary["job"], "advice": advice}
    head = _snippets.pipeline_snippet(Summary.from_json(summary), RunMeta.from_json(meta)).splitlines()[0]
    if advice == "keep yours":
        assert "as fast" not in head and "no setting run was shown faster than yours" in head
    else:
        assert re.search(r": \d\.\d\dx yours \(\d\.\d\d-\d\.\d\d over \d+ rounds in turns\)$", head), head
