"""How a run ends (runs/_outcome): each outcome's exit code, run.json status, last line and files (issue 39)."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from _signals import start_interruptible, wait_for_rows

from stagebench._cli import main
from stagebench.runs._outcome import FAILED, INTERRUPTED, OUTCOMES, PARTIAL

ROOT = Path(__file__).resolve().parents[1]
HOST16 = Path(__file__).resolve().parent / "data" / "host16"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STAGEBENCH_", "SPDL_PIPELINE_DIAGNOSTIC"))}
    env.update(extra)
    return env


def test_the_docs_table_of_outcomes_is_the_codes():
    """docs/faults.md lists every outcome with its exit code and run.json status, as runs/_outcome has them."""
    text = (ROOT / "docs" / "faults.md").read_text()
    for o in OUTCOMES:
        row = next((ln for ln in text.splitlines() if ln.startswith(f"| {o.name} |")), None)
        assert row is not None, o.name
        assert f"| {o.exit_code} |" in row and (f"`{o.status}`" in row if o.status else "| — |" in row), row


# --------------------------------------------------------------------------- damaged rows
@pytest.mark.parametrize("frac", [0.13, 0.21, 0.34, 0.42, 0.5, 0.61, 0.72, 0.85, 0.93, 0.999])
def test_a_results_csv_cut_anywhere_never_rebuilds_silently(tmp_path, capsys, frac):
    """A results.csv cut at a byte offset (the run stopped while writing it, a copy cut short) either rebuilds to
    the same summary, or exits non-zero naming the damaged line: never exit 0 with figures that moved."""
    run = tmp_path / "run"
    shutil.copytree(HOST16 / "demo", run)
    assert main(["report", str(run)]) == 0
    whole = json.loads((run / "summary.json").read_text())
    data = (run / "results.csv").read_bytes()
    (run / "results.csv").write_bytes(data[: int(len(data) * frac)])
    code = main(["report", str(run)])
    err = capsys.readouterr().err
    cut = json.loads((run / "summary.json").read_text())
    if code == 0:
        assert cut == whole
    else:
        assert code == 2 and "results.csv: damaged: line " in err and "cut short" in err, err
        assert cut["damaged_rows"] and cut["warnings"][0].startswith("results.csv is damaged: line ")
    assert not list(run.glob("*.tmp"))


def _copy_with_cell(src: Path, dest: Path, line: int, column: str, value: str) -> Path:
    """A copy of run ``src`` at ``dest`` whose results.csv has ``value`` in ``column`` on ``line`` (1: the header)."""
    import csv

    shutil.copytree(src, dest)
    with open(dest / "results.csv", newline="") as f:
        rows = list(csv.reader(f))
    rows[line - 1][rows[0].index(column)] = value
    with open(dest / "results.csv", "w", newline="") as f:
        csv.writer(f).writerows(rows)
    return dest


def test_a_row_with_a_word_where_a_number_belongs_is_named_and_left_out(tmp_path, capsys):
    run = _copy_with_cell(HOST16 / "demo", tmp_path / "run", 6, "qps", "fast")
    assert main(["report", str(run)]) == 2
    assert "line 6: qps='fast' is not a number: left out" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["-1", "2.5"])
def test_a_loader_row_whose_num_workers_no_run_writes_is_named_and_left_out(tmp_path, capsys, value):
    """A hand-edited results.csv with a count of workers no run writes ends in one line naming it, not an
    internal error: the analysis keys a loader row by its knobs."""
    run = _copy_with_cell(HOST16 / "resnet_loader_run1", tmp_path / "run", 3, "num_workers", value)
    assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err
    assert "line 3: num_workers=" in err and "is not a whole number >= 0: left out" in err, err
    assert "internal error" not in err


# --------------------------------------------------------------------------- failed, internal error, partial
LOADER_RAISES = textwrap.dedent(
    """
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Corrupt(Dataset):
        def __len__(self):
            return 4096

        def __getitem__(self, i):
            if i % 97 == 0:
                raise OSError(f"corrupt record {i}")
            return torch.zeros(4)

    for batch in DataLoader(Corrupt(), batch_size=32, shuffle=True, num_workers=1):
        pass
    """
)


def test_a_loader_that_raises_exits_failed_and_names_where_the_rows_are(tmp_path):
    (tmp_path / "train.py").write_text(LOADER_RAISES)
    out = tmp_path / "run"
    r = subprocess.run(
        [sys.executable, "-m", "stagebench", "diagnose", "--out", str(out), "train.py"],
        cwd=tmp_path,
        env=_env(STAGEBENCH_BUDGET_S="0.3", STAGEBENCH_TIMEOUT_S="20"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == FAILED.exit_code, r.stderr[-2000:]
    last = r.stderr.strip().splitlines()[-1]
    assert "no loader setting could be measured: the loader raised: OSError: corrupt record" in last
    assert str(out) in last
    assert json.loads((out / "run.json").read_text())["status"] == "failed"
    assert (out / "report.html").is_file()
    # nothing was picked: no line says what "the pick" is for
    assert json.loads((out / "summary.json").read_text())["scope"] is None and "scope:" not in r.stdout
    assert "* recommended" not in r.stdout and "full grid about 0s" not in r.stdout  # no key to marks, no estimate


def test_an_analysis_that_fails_on_saved_rows_is_an_internal_error_not_a_traceback(tmp_path, capsys, monkeypatch):
    import stagebench.analysis._summary as summary_mod

    run = tmp_path / "run"
    shutil.copytree(HOST16 / "demo", run)

    def broken(*a, **k):
        raise IndexError("list index out of range")

    monkeypatch.setattr(summary_mod, "summarize_run", broken)
    import stagebench.report._render as render_mod

    monkeypatch.setattr(render_mod, "summarize_run", broken)
    code = main(["report", str(run)])
    err = capsys.readouterr().err
    assert code == 3 and "internal error: IndexError: list index out of range" in err
    assert "Traceback" not in err and "list index out of range" in (run / "error.log").read_text()


def test_the_fallback_summary_reports_each_stage_in_the_one_shape_of_an_entry():
    """When the analysis fails, each stage still gets a full entry (the analysis's own shape), with its best
    measured point and no recommendation."""
    from stagebench.model._stage import StageEntry
    from stagebench.pipeline._finish import fallback_summary
    from stagebench.runs._results import read_rows

    run = HOST16 / "demo"
    meta = json.loads((run / "run.json").read_text())
    s = fallback_summary(read_rows(run / "results.csv"), meta, "IndexError: x")
    assert s["fallback"] and [st["name"] for st in s["stages"]] == [st["name"] for st in meta["stages"]]
    for st in s["stages"]:
        assert tuple(st) == StageEntry.empty("").keys and st["recommended"] is None
        assert st["classification"] == "unknown" and st["evidence"]["summary"] == ["IndexError: x: minimal summary"]
    assert any(st["best"] and st["best"]["qps"] > 0 for st in s["stages"])


def _limit_writes(limit: int):
    def pre() -> None:
        import resource

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of a kill
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return pre


def test_a_write_that_fails_leaves_no_temporary_file_and_exits_partial(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(HOST16 / "demo", run)
    r = subprocess.run(
        [sys.executable, "-m", "stagebench", "report", str(run)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=_limit_writes(20_000),
    )
    assert r.returncode == PARTIAL.exit_code, r.stderr[-2000:]
    assert "a file could not be written" in r.stderr and "File too large" in r.stderr
    assert f"the rows are untouched in {run}" in r.stderr
    assert not list(run.glob("*.tmp"))


# --------------------------------------------------------------------------- out of memory
LEAK_SCRIPT = textwrap.dedent(
    """
    import os
    from spdl.pipeline import PipelineBuilder

    KEPT = []  # a cache that never evicts: what every call allocates stays
    MB = int(os.environ["LEAK_MB"])

    def decode(x):
        KEPT.append(bytearray(MB << 20))
        return x

    p = PipelineBuilder().add_source(range(1000)).pipe(decode, concurrency=2).add_sink(4).build(num_threads=4)
    with p.auto_stop():
        for _ in p:
            pass
    """
)

#: Address space a diagnosis gets beyond what its imports map: enough to read the source, run a first pass and
#: start points (a diagnosis that leaks nothing maps ~500 MB more here), not enough for the leak.
_ROOM_MB = 600


@functools.cache
def _imports_mb() -> int:
    """The address space (VmPeak) of an interpreter that imported what a diagnosis imports first."""
    code = (
        "import spdl.pipeline, pandas, stagebench._cli, stagebench.pipeline._diagnose\n"
        "print(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmPeak')))"
    )
    r = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=120)
    return int(r.stdout.strip()) // 1024


def _limit_address_space(mb: int):
    def pre() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (mb << 20, mb << 20))  # what `ulimit -v` sets

    return pre


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmPeak from /proc (Linux)")
@pytest.mark.parametrize("how", ["command", "variable"])
@pytest.mark.parametrize("leak_mb", [4, 32], ids=["in-the-points", "in-the-first-pass"])
def test_a_stage_that_keeps_what_it_allocates_under_ulimit_v_ends_failed_with_a_finished_run(tmp_path, leak_mb, how):
    """Issue 59: under ``ulimit -v`` a leaking stage gave, in 1 run of 2, a raw traceback of stagebench's internals
    ending in loky's SemLock ENOMEM, "internal error" (exit 3), run.json still `running`, no summary or report.
    Out of memory is an outcome: one line naming it, exit 1, run.json `failed` with the reason, the summary and
    the report of the rows kept. At 4 MB a call the first pass fits and the points run out; at 32 MB the first
    pass does, and its outputs are not cached. Both ways in: ``stagebench diagnose`` and the variable."""
    (tmp_path / "train.py").write_text(LEAK_SCRIPT)
    out, cache = tmp_path / "run", tmp_path / "cache"
    if how == "command":
        argv, mode = ["-m", "stagebench", "diagnose", "--out", str(out), "train.py"], {}
    else:
        argv, mode = ["train.py"], {"SPDL_PIPELINE_DIAGNOSTIC_MODE": "1", "STAGEBENCH_OUTPUT_DIR": str(out)}
    r = subprocess.run(
        [sys.executable, *argv],
        cwd=tmp_path,
        env=_env(
            **mode,
            LEAK_MB=str(leak_mb),
            STAGEBENCH_BUDGET_S="0.2",
            STAGEBENCH_WARMUP_S="0.05",
            STAGEBENCH_TIMEOUT_S="5",
            STAGEBENCH_CONCURRENCY="1,2,4",
            STAGEBENCH_VALIDATION_S="0.5",
            STAGEBENCH_CACHE_DIR=str(cache),
            SPDL_PIPELINE_DIAGNOSTIC_MODE_NUM_ITEMS="40",
        ),
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=_limit_address_space(_imports_mb() + _ROOM_MB),
    )
    if r.returncode == -signal.SIGABRT and "Fatal Python error" in r.stderr:
        # A known defect, left open (the closing note of 2026-11-29): CPython itself aborts under the limit,
        # in the stage sweep, before stagebench can say anything ("_PyErr_NormalizeException: Cannot recover
        # from MemoryErrors while normalizing exceptions"): 2 runs of this case in a fresh clone's venv, 0 of
        # about 140 in another. The fix is to stop a point before the process reaches RLIMIT_AS, as the
        # sweep stops before a cgroup's limit. Marked, not hidden: the line CPython gave is in the report.
        why = next(ln for ln in r.stderr.splitlines() if "Fatal Python error" in ln)
        pytest.xfail(f"CPython aborted under ulimit -v: {why}")
    assert r.returncode == FAILED.exit_code, r.stderr[-3000:]
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("stagebench: error: ") and "out of memory" in last and str(out) in last, last
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == FAILED.status and "out of memory" in meta["error"], meta.get("error")
    assert (out / "summary.json").is_file() and (out / "report.html").is_file()
    json.loads((out / "summary.json").read_text())  # whole, not cut short
    rows = (out / "results.csv").read_text()
    assert "out of memory" in rows  # the points say why they failed, or were not run
    stage = meta["stages"][0]
    if leak_mb == 32:
        assert stage["caching_error_example"] == "out of memory: MemoryError", stage
        assert stage["cache"] == "computed" and not list(cache.rglob("output.pkl")), stage


# --------------------------------------------------------------------------- interrupted
SWEEP_SCRIPT = textwrap.dedent(
    """
    import time
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Slow(Dataset):
        def __len__(self):
            return 4096

        def __getitem__(self, i):
            time.sleep(0.002)
            return torch.zeros(4)

    for batch in DataLoader(Slow(), batch_size=8, num_workers=1):
        pass
    """
)


def _start_loader_sweep(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    """``stagebench diagnose`` of :data:`SWEEP_SCRIPT`, started as from a terminal; (the process, its run dir)."""
    (tmp_path / "train.py").write_text(SWEEP_SCRIPT)
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "stagebench", "diagnose", "--out", str(out), "train.py"]
    return start_interruptible(argv, cwd=tmp_path, env=_env(STAGEBENCH_BUDGET_S="1", STAGEBENCH_TIMEOUT_S="20")), out


@pytest.mark.parametrize("rows_before", [0, 2, 4])
def test_ctrl_c_during_a_loader_sweep_keeps_rows_writes_a_report_and_says_where(tmp_path, rows_before):
    """SIGINT at three moments of a loader sweep: status interrupted, the rows, a report of them, and a line
    naming both."""
    p, out = _start_loader_sweep(tmp_path)
    wait_for_rows(out / "results.csv", rows_before)
    time.sleep(0.2)  # inside the next point
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == INTERRUPTED.exit_code, err[-2000:]
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "interrupted"
    assert (out / "report.html").is_file() and (out / "summary.json").is_file()
    last = err.strip().splitlines()[-1]
    assert last.startswith("stagebench: interrupted; the rows measured so far are in ")
    assert f"a report of them: {out / 'report.html'}" in last


def test_sigterms_while_an_interrupted_loader_sweep_saves_do_not_cut_the_saving_short(tmp_path):
    """Ctrl-C, then SIGTERM after SIGTERM while the rows are saved: under torch's launcher a rank that saw
    another rank go ends by that, and the launcher terminates it a moment later. The run still ends as the
    first interrupt said, with its status, summary and report written (a status left at "running" was seen)."""
    p, out = _start_loader_sweep(tmp_path)
    wait_for_rows(out / "results.csv", 2)
    p.send_signal(signal.SIGINT)
    for _ in range(10):  # the saving (the summary, pandas and the report) takes longer than these 0.3 s
        time.sleep(0.03)
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    assert p.returncode == INTERRUPTED.exit_code, err[-2000:]
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "interrupted"
    assert (out / "report.html").is_file() and (out / "summary.json").is_file()


@pytest.mark.parametrize("rows_before", [2, 5, -1])
def test_ctrl_c_during_a_pipeline_diagnosis_keeps_rows_writes_a_report_and_says_where(tmp_path, rows_before):
    """SIGINT at three moments of a diagnosis (early in the sweeps, later, and in the whole-pipeline runs)."""
    script = Path(__file__).resolve().parent / "scripts" / "diag_train.py"
    out = tmp_path / "run"
    p = start_interruptible(
        [sys.executable, str(script), "--marker", str(tmp_path / "m")],
        cwd=tmp_path,
        env=_env(
            SPDL_PIPELINE_DIAGNOSTIC_MODE="1",
            STAGEBENCH_OUTPUT_DIR=str(out),
            STAGEBENCH_EXECUTORS="thread",
            STAGEBENCH_HARNESSES="direct",
            STAGEBENCH_BUDGET_S="0.5",
            STAGEBENCH_WARMUP_S="0.1",
            STAGEBENCH_TIMEOUT_S="15",
            STAGEBENCH_VALIDATION_S="3",
            STAGEBENCH_CACHE_DIR="off",
            SPDL_PIPELINE_DIAGNOSTIC_MODE_NUM_ITEMS="40",
        ),
        stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 180
    said = ""
    if rows_before >= 0:
        wait_for_rows(out / "results.csv", rows_before, timeout=180)
    else:
        # The whole-pipeline runs, by the line that starts them: three runs of 0.5 s warm-up and 3 s of
        # counting follow it. A wait on time alone (for run.json's CPU speed, then 0.5 s) let a loaded
        # clone's signal land after them, while the report was written, and the diagnosis end complete.
        assert p.stderr is not None
        for line in p.stderr:
            said += line
            if "taking turns" in line or time.monotonic() > deadline:
                break
        assert "taking turns" in said, said[-2000:]
        time.sleep(0.5)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    err = said + err
    assert p.returncode == INTERRUPTED.exit_code, err[-2000:]
    assert json.loads((out / "run.json").read_text())["status"] == "interrupted"
    assert (out / "report.html").is_file()
    last = err.strip().splitlines()[-1]
    assert re.search(r"interrupted; the rows measured so far are on disk in .*, and a report of them: ", last), last


def test_a_ctrl_c_that_lands_in_a_finalizer_still_ends_the_diagnosis_interrupted():
    """Python prints and drops an exception raised in a __del__ ("Exception ignored in: BaseEventLoop.__del__"):
    a Ctrl-C that landed there let a diagnosis run on to 'complete', exit 0 (1 fresh-clone run of 2). The
    handler keeps it, and the diagnosis raises it again between its phases."""
    from stagebench._signals import Signalled, on_sigterm, raise_if_signalled

    class Finalized:
        def __del__(self) -> None:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)  # the handler runs here, inside __del__, and its KeyboardInterrupt is dropped

    # A script run from a terminal starts with Python's own Ctrl-C handler, which on_sigterm replaces. A
    # suite started in the background without job control (nohup, `cmd &` in a script, some CI runners)
    # has SIGINT ignored (tests/_signals.py): a fresh clone's make test under nohup saw the signal raise
    # nothing at all. The test sets the terminal's starting point itself, and puts back what it found.
    found = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with on_sigterm():
            Finalized()  # collected at once; nothing propagates to here
            with pytest.raises(KeyboardInterrupt):
                raise_if_signalled()
        with on_sigterm():  # the next diagnosis starts clean
            assert Signalled.kind is None
            raise_if_signalled()
    finally:
        signal.signal(signal.SIGINT, found)
