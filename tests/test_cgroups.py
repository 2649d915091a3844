"""Known answers on real cgroups made by the test (issue 59): a CPU quota and a memory limit, set with the
kernel's own files, against what a diagnosis and a loader sweep inside them say.

Each test makes a child group of this process's own (cgroup v1, as root: tests/_cgroups.py), starts the
run inside it, and removes it afterwards; where cgroups cannot be written it skips, saying why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from _cgroups import cannot_write, child_group, in_groups, read_int
from _machine import quiet_machine

SCRIPTS = Path(__file__).resolve().parent / "scripts"


def _env(**extra: str) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("STAGEBENCH_", "SPDL_PIPELINE_DIAGNOSTIC"))}
    e.pop("LOCAL_RANK", None)
    return {**e, **extra}


@pytest.mark.slow
def test_under_a_1_cpu_quota_a_cpu_bound_stage_flattens_at_1_and_names_the_quota_a_gil_bound_one_is_unchanged(
    tmp_path,
):
    if why := cannot_write("cpu"):
        pytest.skip(why)
    out = tmp_path / "run"
    env = _env(
        SPDL_PIPELINE_DIAGNOSTIC_MODE="1",
        SPDL_PIPELINE_DIAGNOSTIC_MODE_NUM_ITEMS="40",
        STAGEBENCH_OUTPUT_DIR=str(out),
        STAGEBENCH_BUDGET_S="0.5",
        STAGEBENCH_WARMUP_S="0.1",
        STAGEBENCH_TIMEOUT_S="15",
        STAGEBENCH_VALIDATION_S="0",
        STAGEBENCH_CONCURRENCY="1,2",
        STAGEBENCH_EXECUTORS="thread",
        STAGEBENCH_HARNESSES="direct",
        XDG_CACHE_HOME=str(tmp_path / "xdg"),
    )
    quota = {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "100000"}  # 1 CPU
    mask = len(os.sched_getaffinity(0))
    if mask < 2:
        pytest.skip("one core: a 1-CPU quota does not bind")
    # the quota binds only where the host has the cores to run past it: other load would hold the threads
    # back before the quota does, and nothing would be throttled
    with quiet_machine(needed=1.8), child_group("cpu", "quota", quota) as g:
        argv = in_groups([g], [sys.executable, str(SCRIPTS / "quota_train.py")])
        r = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    limits = summary["provenance"]["limits"]
    assert (limits["cores"], limits["cores_source"], limits["quota"]["group"]) == (1.0, "quota", f"/{g.name}")
    assert summary["cores"] == 1.0
    stages = {s["name"]: s for s in summary["stages"]}
    hashing, gil = stages["hash"], stages["gil"]
    (curve,) = [pts for key, pts in hashing["curves"].items() if "thread" in key]
    at = {p["concurrency"]: p for p in curve}
    # GIL-free work on 2 threads gets the quota's one CPU between them: no more than one thread's rate
    assert at[2]["qps"] < 1.25 * at[1]["qps"], curve
    assert at[2]["cores_used"] < 1.15, curve
    # its two threads wanted more than the one CPU they got: the quota held them back, not the GIL
    assert (
        at[2]["cores_used"]
        + (
            pd.read_csv(out / "results.csv")
            .query("stage == 'hash' and role == 'stage' and concurrency == 2")["cores_throttled"]
            .iloc[0]
        )
        > 1.2
    )
    assert hashing["classification"] == "cpu-bound", hashing["evidence"]["summary"]
    assert hashing["limit"]["text"].startswith(f"limited by the cores: 1.0 CPU by the container's quota, of {mask}")
    assert gil["classification"] == "gil-bound", gil["evidence"]["summary"]
    assert any("the container's CPU quota (1.0 CPU" in w and "throttled the run" in w for w in summary["warnings"])


@pytest.mark.slow
def test_under_a_memory_limit_that_holds_2_workers_but_not_4_the_finding_says_how_many_and_the_pick_has_no_more(
    tmp_path,
):
    if why := cannot_write("memory"):
        pytest.skip(why)
    run = tmp_path / "run"
    with child_group("memory", "limit") as g:
        argv = in_groups([g], [sys.executable, str(SCRIPTS / "cgroup_memory_sweep.py"), str(run), "1000000"])
        p = subprocess.Popen(
            argv, cwd=tmp_path, env=_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        assert p.stdout is not None and p.stdin is not None
        bound = json.loads(p.stdout.readline())["bound_mb"]
        # the group's working set now (the file pages it can drop left out, as the kernel would), and room
        # for 3.5 workers' copy of the list (a worker reading all of it over an epoch copies it all): 2 or 3
        # fit once the main process has grown by a little, 4 do not
        inactive = next(
            int(line.split()[1])
            for line in (g / "memory.stat").read_text().splitlines()
            if line.startswith("total_inactive_file ")
        )
        used = read_int(g / "memory.usage_in_bytes") - inactive
        (g / "memory.limit_in_bytes").write_text(str(used + int(3.5 * bound * 2**20)))
        try:
            _, err = p.communicate(b"go\n", timeout=600)
        finally:
            p.kill()
        kills = next(
            int(line.split()[1])
            for line in (g / "memory.oom_control").read_text().splitlines()
            if line.startswith("oom_kill ")
        )
    assert p.returncode == 0 and kills == 0, (p.returncode, kills, err.decode()[-3000:])
    summary = json.loads((run / "summary.json").read_text())
    assert summary["provenance"]["limits"]["memory_source"] == "cgroup"
    fit = summary["worker_costs"]["memory"]["workers_fit"]
    assert 2 <= fit < 4, summary["worker_costs"]["memory"]
    (growth,) = [f for f in summary["findings"] if f["title"].startswith("Each worker's memory grows")]
    assert f"At most {fit} such workers fit in the " in growth["detail"]
    assert "the container's memory limit leaves" in growth["detail"]
    assert summary["recommended"]["num_workers"] <= fit
    measured = pd.read_csv(run / "results.csv")
    assert measured["num_workers"].max() < 4  # the sweep did not start a setting the limit cannot hold
    assert any("memory budget" in s and "container's memory limit" in s for s in summary["search"]["stopped"])
