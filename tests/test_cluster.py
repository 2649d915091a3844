"""Sweeps on a cluster: a real one-node Slurm on localhost, submitit, and the launcher configs.

The ``slurm`` fixture runs tests/cluster/start_slurm.sh once per session: it installs
Debian's slurm-wlm and munge if missing and starts munged, slurmctld and slurmd with
a state folder outside the checkout (/tmp/stagebench-slurm). Where Slurm cannot start
(not root, no apt-get, a daemon that fails) every test that needs it is skipped with
the script's reason, which ``-ra`` prints in the summary. The daemons are left
running afterwards: idle they cost nothing, and the next session reuses them
(tests/cluster/stop_slurm.sh stops them).
"""

from __future__ import annotations

import csv
import datetime as dt
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stagebench.sweep._cluster import launcher_kind, launcher_warnings

HERE = Path(__file__).resolve().parent
START = HERE / "cluster" / "start_slurm.sh"
STATE = Path(os.environ.get("STAGEBENCH_SLURM_DIR", "/tmp/stagebench-slurm"))


@pytest.fixture(scope="session")
def slurm():
    """SLURM_CONF for a running one-node cluster, or a skip that says why there is none."""
    if shutil.which("bash") is None:
        pytest.skip("Slurm cannot start here: no bash to run tests/cluster/start_slurm.sh")
    env = {**os.environ, "STAGEBENCH_SLURM_DIR": str(STATE)}
    try:
        p = subprocess.run(["bash", str(START)], capture_output=True, text=True, env=env, timeout=900)
    except subprocess.TimeoutExpired:
        pytest.skip("Slurm cannot start here: tests/cluster/start_slurm.sh ran for more than 15 minutes")
    sys.stderr.write(p.stderr)
    if p.returncode != 0:
        lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
        reason = next((ln for ln in lines if "cannot" in ln or "failed" in ln), lines[-1] if lines else "")
        pytest.skip(f"Slurm cannot start here (start_slurm.sh exit {p.returncode}): {reason}")
    conf = STATE / "slurm.conf"
    with pytest.MonkeyPatch.context() as mp:
        # Every Slurm client (sinfo, sbatch, submitit's calls) finds this cluster through it.
        mp.setenv("SLURM_CONF", str(conf))
        yield conf


def _where_am_i() -> dict:
    return {
        "hostname": socket.gethostname(),
        "job_id": os.environ.get("SLURM_JOB_ID"),
        "python": os.path.normpath(sys.executable),
        "prefix": sys.prefix,
        "cores": len(os.sched_getaffinity(0)),
    }


@pytest.mark.cluster
def test_slurm_node_is_up_and_runs_a_batch_job(slurm, tmp_path):
    state = subprocess.run(["sinfo", "-h", "-o", "%P %T %c"], capture_output=True, text=True, check=True).stdout
    assert "local*" in state, state
    out = tmp_path / "job.out"
    # --wait: sbatch returns when the job has ended, with its exit code.
    subprocess.run(
        ["sbatch", "--wait", "--exclusive", "-o", str(out), "--wrap", "echo host=$(hostname -s) job=$SLURM_JOB_ID"],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    text = out.read_text()
    assert f"host={socket.gethostname().split('.')[0]}" in text, text
    assert "job=" in text and "job=\n" not in text, text


@pytest.mark.cluster
def test_submitit_runs_a_python_function_on_slurm(slurm, tmp_path):
    import cloudpickle
    import submitit

    # By value: the job must not depend on importing this test module from its cwd.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ex = submitit.AutoExecutor(folder=tmp_path / "submitit", cluster="slurm")
    ex.update_parameters(timeout_min=5, slurm_additional_parameters={"exclusive": True})
    job = ex.submit(_where_am_i)
    got = job.result()  # submitit pickles the call and runs it with this interpreter
    assert got["job_id"] == job.job_id
    assert got["hostname"] == socket.gethostname()
    assert got["python"] == os.path.normpath(sys.executable)
    assert got["prefix"] == sys.prefix  # this venv, with stagebench in it
    # An exclusive job has every core of the node.
    assert got["cores"] == len(os.sched_getaffinity(0))


def _note_sigterm(marker: str) -> str | None:
    from stagebench.sweep._cluster import watch_termination

    with watch_termination() as seen:
        Path(marker).write_text("watching")
        deadline = time.monotonic() + 60
        while seen.signal is None and time.monotonic() < deadline:
            time.sleep(0.1)
    return seen.signal


@pytest.mark.cluster
def test_a_cancelled_job_knows_it_was_stopped(slurm, tmp_path):
    """scancel sends SIGTERM, which submitit's job process ignores; the watch notes it."""
    import cloudpickle
    import submitit

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ex = submitit.AutoExecutor(folder=tmp_path / "submitit", cluster="slurm")
    ex.update_parameters(timeout_min=5)
    marker = tmp_path / "watching"
    job = ex.submit(_note_sigterm, str(marker))
    _wait_for("the job to start watching", marker.exists, 120)
    subprocess.run(["scancel", str(job.job_id)], check=True, timeout=30)
    # No sacct here, so submitit cannot see a job that died without a result: poll for it.
    _wait_for("the job's result", job.paths.result_pickle.exists, 60)
    assert job.result() == "SIGTERM"


def _conf_dir() -> Path:
    """The conf/ that ships with the installed package (the checkout's one in a dev install)."""
    from stagebench.sweep._app import config_dir

    return config_dir()


def _launcher(*overrides: str):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(_conf_dir()), version_base="1.3"):
        cfg = compose(config_name=None, overrides=list(overrides), return_hydra_config=True)
    return cfg.hydra.launcher


def test_slurm_launcher_defaults_are_for_timing():
    launcher = _launcher("hydra/launcher=slurm")
    assert launcher_kind(launcher) == "submitit_slurm"
    assert launcher.additional_parameters.exclusive is True
    assert launcher.cpus_per_task is None  # the exclusive node's cores are all the job's
    assert launcher.timeout_min == 60 and launcher.array_parallelism == 8
    assert launcher_warnings(launcher) == []
    # Every key of the plugin's schema is still there to override, with its types.
    over = _launcher(
        "hydra/launcher=slurm",
        "hydra.launcher.partition=gpu",
        "hydra.launcher.account=me",
        "hydra.launcher.timeout_min=30",
    )
    assert (over.partition, over.account, over.timeout_min) == ("gpu", "me", 30)


def test_shared_machines_are_warned_about():
    shared = _launcher("hydra/launcher=slurm", "~hydra.launcher.additional_parameters.exclusive")
    assert "share nodes" in launcher_warnings(shared)[0]
    assert "share nodes" in launcher_warnings(_launcher("hydra/launcher=submitit_slurm"))[0]
    user = _launcher("hydra/launcher=slurm", "hydra.launcher.additional_parameters.exclusive=user")
    assert "your own jobs" in launcher_warnings(user)[0]
    local = _launcher("hydra/launcher=submitit_local")
    assert launcher_kind(local) == "submitit_local"
    assert "at once" in launcher_warnings(local)[0]
    assert "at once" in launcher_warnings(_launcher("hydra/launcher=joblib"))[0]
    assert launcher_warnings(_launcher("hydra/launcher=joblib", "hydra.launcher.n_jobs=1")) == []
    basic = _launcher()
    assert launcher_kind(basic) == "basic" and launcher_warnings(basic) == []


# --------------------------------------------------------------------------- sweeps through Slurm

# One point per job, tiny budgets: the subject is where jobs run, not the loader.
_TINY = [
    "loader=synthetic",
    "loader.num_items=128",
    "loader.sample_shape=[3,16,16]",
    "sweep.timeout_s=60",
    "progress=false",
]


def _needs_sweep_app() -> None:
    if importlib.util.find_spec("stagebench.sweep._app") is None:
        pytest.skip("the sweep app (stagebench.sweep._app, issue 7) is not installed")


def _stagebench(*args: str) -> list[str]:
    # The console script's module form: the same interpreter and install as this test.
    return [sys.executable, "-m", "stagebench", *args]


def _jobs(sweep: Path) -> list[Path]:
    return sorted((d for d in sweep.iterdir() if (d / ".hydra").is_dir()), key=lambda d: int(d.name.split("-")[0]))


def _comparison(sweep: Path) -> dict[str, dict]:
    with open(sweep / "comparison.csv", newline="", encoding="utf-8") as f:
        return {Path(r["run_dir"]).name: r for r in csv.DictReader(f)}


def _wait_for(what: str, check, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


@pytest.mark.cluster
@pytest.mark.slow
def test_sweep_runs_each_job_on_slurm_and_compares_them(slurm, tmp_path):
    _needs_sweep_app()
    sweep = tmp_path / "sweep"
    p = subprocess.run(
        _stagebench(
            "sweep",
            "-m",
            "hydra/launcher=slurm",
            *_TINY,
            "sweep.num_workers=[0]",
            "sweep.budget_s=0.3",
            "loader.batch_size=8,16",
            f"hydra.sweep.dir={sweep}",
        ),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]

    jobs = _jobs(sweep)
    assert [d.name.split("-")[0] for d in jobs] == ["0", "1"]
    slurm_ids, spans = set(), []
    for d in jobs:
        status = json.loads((d / "job_status.json").read_text())
        assert status["status"] == "ok", status
        prov = json.loads((d / "run.json").read_text())["provenance"]
        # The machine each job ran on, and the Slurm job it ran as.
        assert prov["hostname"] == socket.gethostname()
        assert prov["env"].get("SLURM_JOB_PARTITION") == "local", prov["env"]
        slurm_ids.add(prov["env"]["SLURM_JOB_ID"])
        start = dt.datetime.fromisoformat(status["started_at"]).timestamp()  # whole seconds
        spans.append((start, start + status["elapsed_s"]))
    assert len(slurm_ids) == 2, slurm_ids
    # Exclusive nodes, one node: the second job started after the first ended
    # (1 s slack: started_at is truncated to the second). Shared nodes would overlap.
    spans.sort()
    assert spans[1][0] >= spans[0][1] - 1.0, spans

    # hydra/launcher=slurm reached sbatch: one array, whole nodes, its time limit.
    scripts = list((sweep / ".submitit").glob("*/*_submission.sh"))
    assert len(scripts) == 1, scripts
    text = scripts[0].read_text()
    assert "#SBATCH --exclusive" in text and "#SBATCH --time=60" in text and "#SBATCH --array=0-1%2" in text

    # The comparison, written by the submitting process once both jobs had ended.
    rows = _comparison(sweep)
    assert set(rows) == {d.name for d in jobs}
    for r in rows.values():
        assert r["status"] == "ok" and float(r["best"]) > 0, r
        assert r["hostname"] == socket.gethostname()
    assert (sweep / "comparison.html").is_file()
    assert (sweep / "comparison.csv").stat().st_mtime >= max((d / "job_status.json").stat().st_mtime for d in jobs)
    assert f"comparison: {sweep / 'comparison.html'}" in p.stdout


@pytest.mark.cluster
@pytest.mark.slow
def test_report_rebuilds_the_comparison_after_cancelled_jobs(slurm, tmp_path):
    _needs_sweep_app()
    sweep = tmp_path / "sweep"
    log = open(tmp_path / "sweep.log", "w")
    # Job 0 is cancelled after its first row, while it measures its second point;
    # job 1 finishes; job 2 is cancelled while it waits for the node.
    sub = subprocess.Popen(
        _stagebench(
            "sweep",
            "-m",
            "hydra/launcher=slurm",
            *_TINY,
            "sweep.num_workers=[0,1]",
            "sweep.budget_s=4,0.3,0.31",
            f"hydra.sweep.dir={sweep}",
        ),
        cwd=tmp_path,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:

        def first_row_of_job0():
            results = next(sweep.glob("0-*/results.csv"), None)
            return results is not None and len(results.read_text().splitlines()) >= 2

        _wait_for("job 0's first measured row", first_row_of_job0, 180)
        array = next(d.name for d in (sweep / ".submitit").iterdir() if d.name.isdigit())
        subprocess.run(["scancel", f"{array}_0", f"{array}_2"], check=True, timeout=30)
        _wait_for("job 1 to finish", lambda: next(sweep.glob("1-*/job_status.json"), None), 180)
        _wait_for(
            "the sweep's jobs to leave the queue",
            lambda: subprocess.run(["squeue", "-h", "-j", array], capture_output=True, text=True).stdout.strip() == "",
            60,
        )
    finally:
        # With accounting (real clusters) submitit sees the cancellation and the sweep
        # exits with an error; without it (this cluster) the sweep waits: Ctrl-C, as a user would.
        if sub.poll() is None:
            sub.send_signal(signal.SIGINT)
            try:
                sub.wait(30)
            except subprocess.TimeoutExpired:
                sub.kill()
                sub.wait()
        log.close()

    jobs = _jobs(sweep)
    assert [d.name.split("-")[0] for d in jobs] == ["0", "1"], "job 2 was cancelled before it started"
    logs = "".join(p.read_text(errors="replace") for p in (sweep / ".submitit").glob(f"{array}_0/*.err"))
    assert "CANCELLED" in logs, "job 0 was not cancelled while it ran"
    r = subprocess.run(_stagebench("report", str(sweep)), cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = _comparison(sweep)
    by_job = {name.split("-")[0]: row for name, row in rows.items()}
    assert by_job["1"]["status"] == "ok" and float(by_job["1"]["best"]) > 0, by_job["1"]
    assert "0" in by_job, list(rows)

    # Job 0 was stopped mid-sweep: its rows cover part of its grid, so it is listed as failed, never compared.
    status0 = jobs[0] / "job_status.json"
    if status0.exists():  # absent when the job was killed before its finally ran
        assert json.loads(status0.read_text())["status"] == "failed"
    assert by_job["0"]["status"] == "failed" and by_job["0"]["best"] == "", by_job["0"]
    assert "SIGTERM" in by_job["0"]["reason"] or "did not finish" in by_job["0"]["reason"], by_job["0"]
    # Job 2 left no folder; the sweep's multirun.yaml still lists it.
    never = [row for row in rows.values() if "budget_s=0.31" in row["label"]]
    assert len(never) == 1 and never[0]["status"] == "failed" and "never started" in never[0]["reason"], never


@pytest.mark.slow
def test_submitit_local_runs_the_sweep_on_this_machine(tmp_path):
    _needs_sweep_app()
    sweep = tmp_path / "sweep"
    p = subprocess.run(
        _stagebench(
            "sweep",
            "-m",
            "hydra/launcher=submitit_local",
            *_TINY,
            "sweep.num_workers=[0]",
            "sweep.budget_s=0.3",
            "loader.batch_size=8,16",
            f"hydra.sweep.dir={sweep}",
        ),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    jobs = _jobs(sweep)
    assert len(jobs) == 2
    for d in jobs:
        assert json.loads((d / "job_status.json").read_text())["status"] == "ok"
        # Each job ran in its own process, started by submitit, not by this test's interpreter.
        assert (sweep / ".submitit").is_dir()
    rows = _comparison(sweep)
    assert set(rows) == {d.name for d in jobs} and all(r["status"] == "ok" for r in rows.values())
    # Jobs side by side on one machine: the sweep says their timings distort each other.
    assert "side by side" in p.stderr or "at once" in p.stderr, p.stderr[-2000:]


def test_watch_termination_notes_the_signal_and_keeps_the_previous_handler():
    from stagebench.sweep._cluster import watch_termination

    calls = []
    before = signal.signal(signal.SIGTERM, lambda signum, frame: calls.append(signum))
    try:
        with watch_termination() as seen:
            assert seen.signal is None and seen.reason() == ""
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)  # handlers run between bytecodes of the main thread
        assert seen.signal == "SIGTERM" and "stopped by SIGTERM" in seen.reason()
        assert calls == [signal.SIGTERM]  # what the process did on SIGTERM, it still does
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        with watch_termination() as ignored:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
        assert ignored.signal == "SIGTERM"  # noted, and still ignored: we are alive
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN  # restored on exit
    finally:
        signal.signal(signal.SIGTERM, before)
