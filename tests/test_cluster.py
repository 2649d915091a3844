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

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from stagebench._cluster import launcher_kind, launcher_warnings

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
        check=True, capture_output=True, text=True, timeout=120,
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


def _conf_dir() -> Path:
    """The conf/ that ships with the installed package (the checkout's one in a dev install)."""
    import stagebench

    shipped = Path(stagebench.__file__).resolve().parent / "conf"
    return shipped if shipped.is_dir() else HERE.parent / "conf"


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
    over = _launcher("hydra/launcher=slurm", "hydra.launcher.partition=gpu", "hydra.launcher.account=me",
                     "hydra.launcher.timeout_min=30")
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
