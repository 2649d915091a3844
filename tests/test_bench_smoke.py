"""Every benchmark runs to the end: a refactor of stagebench cannot break one silently.

Each ``benchmarks/bench_*.py`` (found by glob, as ``benchmarks/run_all.py`` finds them, so a new one is
covered without a line here) runs in a fresh interpreter from the repository root in its quickest mode,
``--smoke`` (each script's docstring says what it shrinks), with ``--json`` into the test's own folder,
never into ``reports/benchmarks/``. The test holds each to what it claims: exit status 0, its JSON
written and strict JSON (no NaN), and nothing written under ``reports/benchmarks/`` or
``reports/bench-runs/``. It asserts nothing about the figures: they are a loaded two-core machine's, from
windows far too short to mean anything.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
SCRIPTS = sorted(BENCH.glob("bench_*.py"))
#: What else lives in benchmarks/ and is not a benchmark: the runner and the scripts the benchmarks run.
HELPERS = {"run_all.py", "ddp_jpeg_train.py", "ddp_truth.py"}
#: Where real runs keep their figures and reports: a smoke run must leave them as they were.
KEPT = (ROOT / "reports" / "benchmarks", ROOT / "reports" / "bench-runs")
#: Seconds one script may take in --smoke: 0.2-70 s each on the loaded 2-core VM (bench_ranks the longest:
#: three diagnoses under torchrun); the whole file took 149-181 s in three runs.
TIMEOUT_S = 240


def _no_nan(name: str) -> float:
    raise ValueError(f"{name} in the JSON: not JSON (write it with _common.write_json)")


def _files(dirs: tuple[Path, ...]) -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for d in dirs if d.exists() for p in d.rglob("*") if p.is_file()}


def _changed(before: dict[Path, int]) -> list[str]:
    after = _files(KEPT)
    return sorted(str(p.relative_to(ROOT)) for p in set(before) | set(after) if before.get(p) != after.get(p))


def _run(cmd: list[str], timeout: float) -> tuple[int | None, str, float]:
    """(exit status, or None past the timeout; stdout and stderr; seconds). Its whole process group is
    ended at the timeout: benchmarks start workers, ranks and diagnoses of their own."""
    t0 = time.perf_counter()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STAGEBENCH_", "SPDL_PIPELINE_DIAGNOSTIC"))}
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
        rc: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        rc = None
    return rc, out, time.perf_counter() - t0


def test_every_script_in_benchmarks_is_a_benchmark_or_a_named_helper():
    """A benchmark not named bench_*.py would be left out of `make bench` and of this test."""
    others = {p.name for p in BENCH.glob("*.py")} - {p.name for p in SCRIPTS} - HELPERS
    assert not {n for n in others if not n.startswith("_")}, "name a benchmark bench_*.py, or list a helper in HELPERS"
    assert SCRIPTS, "no benchmarks/bench_*.py found"


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_benchmark_runs_to_the_end_in_smoke_mode(script: Path, tmp_path: Path):
    out = tmp_path / f"{script.stem}.json"
    before = _files(KEPT)
    rc, log, took = _run([sys.executable, str(script), "--smoke", "--json", str(out)], TIMEOUT_S)
    tail = "\n".join(log.splitlines()[-40:])
    print(f"{script.name} --smoke: {took:.1f} s")
    assert rc is not None, f"{script.name} --smoke ran past {TIMEOUT_S} s:\n{tail}"
    assert rc == 0, f"{script.name} --smoke ended {rc} after {took:.1f} s:\n{tail}"
    assert out.is_file(), f"{script.name} --smoke wrote no {out.name}:\n{tail}"
    data = json.loads(out.read_text(), parse_constant=_no_nan)
    assert isinstance(data, dict) and data, f"{script.name}: its JSON is not a non-empty object"
    assert not _changed(before), f"{script.name} --smoke wrote under reports/: {_changed(before)}"


def test_run_all_passes_smoke_and_writes_where_told(tmp_path: Path):
    """`make bench`'s runner: --smoke and --out reach each script, the provenance is added to its JSON."""
    before = _files(KEPT)
    rc, log, took = _run([sys.executable, str(BENCH / "run_all.py"), "--smoke", "--out", str(tmp_path), "startup"], 120)
    assert rc == 0, f"run_all.py ended {rc} after {took:.1f} s:\n{log[-3000:]}"
    data = json.loads((tmp_path / "startup.json").read_text(), parse_constant=_no_nan)
    assert data["benchmark"] == "startup" and "provenance" in data and "seconds" in data
    assert not _changed(before), f"run_all.py --smoke --out wrote under reports/: {_changed(before)}"


def test_run_all_runs_the_diagnosis_first_and_hands_its_runs_to_the_advice(tmp_path: Path, monkeypatch):
    """bench_advice takes bench_diagnosis's runs at the defaults (``--summaries``) only where that one ran to
    the end in the same call, and never in --smoke; the scripts' own runs are stood in for here."""
    sys.path.insert(0, str(BENCH))
    try:
        import run_all
    finally:
        sys.path.remove(str(BENCH))
    calls: list[list[str]] = []
    failing: set[str] = set()

    def call(cmd: list[str]) -> int:
        calls.append(cmd)
        name = Path(cmd[1]).stem.removeprefix("bench_")
        if name in failing:
            return 1
        Path(cmd[cmd.index("--json") + 1]).write_text(json.dumps({"benchmark": name}))
        return 0

    monkeypatch.setattr(run_all.subprocess, "call", call)

    def advice_args(*argv: str) -> list[str]:
        calls.clear()
        run_all.main([*argv, "--out", str(tmp_path), "diagnosis", "advice", "accuracy"])
        names = [Path(c[1]).stem for c in calls]
        assert names == ["bench_diagnosis", "bench_accuracy", "bench_advice"], names
        return calls[-1][2:]

    given = ["--summaries", str(run_all.DIAGNOSIS_RUNS)]
    assert advice_args()[: len(given)] == given
    assert "--summaries" not in advice_args("--smoke")
    failing.add("diagnosis")
    assert "--summaries" not in advice_args()
