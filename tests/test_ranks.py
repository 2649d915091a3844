"""A data-parallel job's ranks on one host, measured together (issue 57).

Units: the ranks read from the launcher's variables, a window's host rate, the store the ranks meet in.
Then the whole path under torch's own launcher (two ranks of a script whose DataLoader sleeps a known
time per item): every rank runs each setting at once, the host's rate is the sum of the ranks', local
rank 0 alone writes the run directory, every rank exits with the same code, a rank that fails or dies
ends them all within a bounded time with its rows kept, and ``--trainer`` runs every rank's loop, DDP's
all-reduce included, step for step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from stagebench._errors import StagebenchError
from stagebench._settings import SettingsError
from stagebench.model._ranks import HostRate, Ranks
from stagebench.model._rate import Rate
from stagebench.runs._outcome import FAILED, RANK_LOST
from stagebench.runs._ranks import ranks_from_env

SCRIPTS = Path(__file__).parent / "scripts"
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")


# ------------------------------------------------------------------ units
def test_the_ranks_are_read_from_the_launchers_variables():
    env = {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "RANK": "3", "WORLD_SIZE": "4", "GROUP_RANK": "1"}
    r = ranks_from_env({**env, "TORCHELASTIC_RUN_ID": "x"})
    assert (r.local_rank, r.local_world_size, r.rank, r.world_size, r.node, r.launcher) == (1, 2, 3, 4, 1, "torchrun")
    assert r.ranked and not r.leader and r.nodes == 2
    one = ranks_from_env({})
    assert not one.ranked and one.leader and one == Ranks()
    assert ranks_from_env({"LOCAL_RANK": "0"}) == Ranks()  # a launcher that does not say the host's size
    with pytest.raises(SettingsError, match="LOCAL_WORLD_SIZE is not set"):
        ranks_from_env({"LOCAL_RANK": "1"})
    with pytest.raises(SettingsError, match="LOCAL_RANK must be an integer"):
        ranks_from_env({"LOCAL_RANK": "one", "LOCAL_WORLD_SIZE": "2"})
    with pytest.raises(SettingsError, match="not a rank of this host"):
        ranks_from_env({"LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"})
    assert Ranks.from_json(r.to_json()) == r


def test_the_hosts_rate_is_the_sum_of_its_ranks_and_its_interval_the_sum_of_their_ends():
    rates = HostRate.of([Rate(100.0, 90.0, 110.0), Rate(80.0, 70.0, 95.0)])
    assert rates.host == Rate(180.0, 160.0, 205.0)
    assert rates.slowest == Rate(80.0, 70.0, 95.0) and rates.fastest == Rate(100.0, 90.0, 110.0)
    assert HostRate.of([Rate(100.0, 90.0, 110.0), Rate(80.0)]).host == Rate(180.0)  # one rank without interval
    assert HostRate.of([Rate(100.0), None]).host is None  # a rank that timed nothing: no host rate


def _arrivals(times, n=16, epoch=0):
    from stagebench.loader._window import _Event

    return [_Event(t, epoch, 1, n, 1) for t in times]


def test_a_ranks_share_of_the_window_counts_the_seconds_it_stalled():
    """Issue 57, seen on the 2-core VM: one rank's process held off the cores for 0.8 s while the other ran
    on both; each rank's rate over its own arrivals read the stalled rank's catch-up as its speed (host
    2,116 samples/s where the truth is 1,460). A share spreads each batch over the gap before it."""
    from stagebench.loader._window import window_share

    steady = _arrivals([i * 0.02 for i in range(200)])  # 50 batches/s = 800 samples/s
    share = window_share(steady, 1.0, 2.0, 4.0, rnd=1, batch_size=16, slices=5)
    assert share.rate(0.95).value == pytest.approx(800.0)
    assert sum(share.seconds) == pytest.approx(1.0)
    # stalled from 1.1 to 1.9, then three batches in 30 ms: 8 + 1 (the gap over the stall) + 3 + 2 batches
    stalled = _arrivals([*(i * 0.02 for i in range(56)), 1.9, 1.91, 1.92, *(1.94 + i * 0.02 for i in range(10))])
    got = window_share(stalled, 1.0, 2.0, 4.0, rnd=1, batch_size=16, slices=5)
    assert got.rate(0.95).value < 300.0  # not the ~800-1600 its arrivals alone, gap by gap, read
    # an epoch's restart counts neither samples nor seconds (window_rate leaves it out too)
    restart = _arrivals([i * 0.02 for i in range(60)]) + _arrivals([1.6 + i * 0.02 for i in range(40)], epoch=1)
    r = window_share(restart, 1.0, 2.0, 4.0, rnd=1, batch_size=16, slices=5)
    assert sum(r.seconds) < 0.9 and r.rate(0.95).value == pytest.approx(800.0, rel=0.05)
    # a rank with no arrival since 1.5, asked at 2.5: the open gap is a batch arriving at 2.5
    tail = _arrivals([i * 0.02 for i in range(76)])
    t = window_share(tail, 1.0, 2.0, 2.5, rnd=1, batch_size=16, slices=5)
    assert sum(t.seconds) == pytest.approx(1.0) and t.rate(0.95).value < 500.0


def test_the_hosts_rate_over_a_window_holds_one_ranks_stall_and_the_others_speed_in_the_same_slices():
    """Where one rank stalls, the other runs faster in the same seconds: the host's slices sum both, so its
    interval is the host's, not two ranks' whose errors cancel."""
    from stagebench.model._ranks import WindowShare

    a = WindowShare((16.0, 16.0, 2.0, 16.0), (0.1, 0.1, 0.1, 0.1))  # stalled in the third slice
    b = WindowShare((16.0, 16.0, 30.0, 16.0), (0.1, 0.1, 0.1, 0.1))  # ... while this one ran on both cores
    rates = HostRate.over_window([a, b], 0.95)
    assert rates.host is not None and rates.host.value == pytest.approx(320.0)  # 32 samples every 0.1 s
    assert rates.host.low == pytest.approx(320.0) and rates.host.high == pytest.approx(320.0)
    assert rates.slowest.value == pytest.approx(125.0) and rates.fastest.value == pytest.approx(195.0)
    assert rates.slowest.high > 1.5 * rates.slowest.low  # each rank alone is noisy
    assert HostRate.over_window([a, None], 0.95).host is None
    assert HostRate.over_window([a, WindowShare((0.0,), (0.3,))], 0.95).host is None  # delivered nothing
    assert WindowShare.from_json(a.to_json()) == a and WindowShare.from_json({"samples": [1]}) is None


def test_the_ranks_meet_only_in_a_directory_no_one_else_may_write(tmp_path, monkeypatch):
    from stagebench.core._ranks import store_dir

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    d = store_dir()
    assert d.parent == tmp_path and (d.stat().st_mode & 0o777) == 0o700
    d.chmod(0o777)
    with pytest.raises(StagebenchError, match="no one else may write"):
        store_dir()


_MEET = textwrap.dedent(
    """
    import os, sys, time
    from stagebench.core._ranks import HostGroup
    from stagebench.model._ranks import Answer
    from stagebench.runs._ranks import ranks_from_env
    from stagebench._errors import RankLost
    mode = sys.argv[1]
    ranks = ranks_from_env()
    try:
        g = HostGroup.join(ranks, kind="loader", wait_s=float(os.environ.get("WAIT_S", "20")))
    except RankLost as e:
        print("LOST", e, flush=True)
        sys.exit(5)
    if g.leader:
        try:
            for i in range(20):
                n = g.send("ping", i=i)
                assert g.replies(n, time.perf_counter() + 20)[1].n == i
            print("PINGED", flush=True)
            if mode == "die":
                n = g.send("ping", i=99)
                g.replies(n, time.perf_counter() + 60)
        except RankLost as e:
            print("LOST", e, flush=True)
            g.end(5)
            sys.exit(5)
        g.end(3)
        sys.exit(0)
    while True:
        cmd = g.wait_command()
        if cmd.op == "end":
            g.bye()
            sys.exit(cmd.code)
        if mode == "die" and cmd.i == 99:
            os._exit(9)
        g.reply(cmd.n, Answer(n=cmd.i))
    """
)


def _pair(tmp_path: Path, mode: str, *, ranks: tuple[int, ...] = (0, 1), **env: str) -> list[subprocess.Popen]:
    """Ranks of one host started by this process (their launcher), each running :data:`_MEET`."""
    script = tmp_path / "meet.py"
    script.write_text(_MEET)
    base = {**os.environ, "LOCAL_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": uuid.uuid4().hex, **env}
    return [
        subprocess.Popen(
            [sys.executable, str(script), mode],
            env={**base, "LOCAL_RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in ranks
    ]


def test_the_ranks_meet_talk_and_end_with_the_leaders_code(tmp_path):
    procs = _pair(tmp_path, "ok")
    outs = [p.communicate(timeout=60)[0] for p in procs]
    assert "PINGED" in outs[0], outs
    assert [p.returncode for p in procs] == [0, 3], outs  # the follower ends with the code the leader said


def test_a_rank_that_dies_ends_the_others_within_seconds(tmp_path):
    procs = _pair(tmp_path, "die")
    t0 = time.monotonic()
    leader = procs[0].communicate(timeout=60)[0]
    assert time.monotonic() - t0 < 30
    procs[1].wait(timeout=10)
    assert procs[0].returncode == 5 and procs[1].returncode == 9
    assert "LOST local rank 1" in leader and "ended" in leader, leader


def test_a_rank_that_never_arrives_ends_the_leader_after_the_wait(tmp_path):
    (leader,) = _pair(tmp_path, "ok", ranks=(0,), WAIT_S="1.5")
    out = leader.communicate(timeout=60)[0]
    assert leader.returncode == 5
    assert "local rank(s) 1 of 2 did not reach their loader or pipeline within 1.5 s" in out, out


# ------------------------------------------------------------------ under torch's launcher
_LAUNCH = textwrap.dedent(
    """
    import runpy, sys
    from stagebench.loader._sweep import LoaderSweepConfig
    from stagebench.loader._intercept import diagnose_first_loader
    cfg = LoaderSweepConfig(strategy="grid", num_workers=(0, 2), prefetch_factors=(2,),
                            persistent_workers=(False,), budget_s=0.4, warmup_s=0.1, timeout_s=20,
                            tie_rounds=2, transforms=False, memory_pass_s=0.5)
    diagnose_first_loader(sys.argv[1], config=cfg)
    sys.argv = [{script!r}]
    runpy.run_path({script!r}, run_name="__main__")
    """
)


def _torchrun(tmp_path: Path, *, timeout: float = 240, **env: str) -> tuple[subprocess.CompletedProcess, Path, float]:
    """The ranked script, two ranks under torch's launcher, each catching its loader as diagnostic mode does."""
    launch = tmp_path / "launch.py"
    launch.write_text(_LAUNCH.format(script=str(SCRIPTS / "ranked_train.py")))
    out = tmp_path / "run"
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(launch), str(out)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp_path,
    )
    return proc, out, time.monotonic() - t0


def _exit_codes(stderr: str) -> list[int]:
    """Each rank's exit code, as torch's launcher reports a failure (it says nothing where all ended 0)."""
    import re

    return [int(c) for c in re.findall(r"exitcode\s*:\s*(-?\d+)", stderr)]


@pytest.mark.slow
def test_every_rank_runs_each_setting_at_once_and_the_host_rate_is_their_sum(tmp_path):
    steps = tmp_path / "steps"
    steps.mkdir()
    proc, out, _ = _torchrun(tmp_path, RANKED_SLEEP="0.005", RANKED_STEPS=str(steps), RANKED_WORKERS="2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not list(steps.iterdir()), "a loop body ran"
    rows = [json.loads(json.dumps(r)) for r in json.loads((out / "summary.json").read_text())["points"]]
    by = {r["num_workers"]: r for r in rows}
    # the known answer: each rank's n workers deliver n/d samples/s (num_workers=0: 1/d), and the host twice that
    for nw, per_rank in ((0, 1 / 0.005), (2, 2 / 0.005)):
        r = by[nw]
        assert r["ranks"] == 2
        assert 0.75 * 2 * per_rank <= r["samples_per_s"] <= 1.1 * 2 * per_rank, r
        assert 0.75 * per_rank <= r["rank_min_samples_per_s"] <= r["rank_max_samples_per_s"] <= 1.1 * per_rank, r
        assert r["samples_per_s_low"] <= r["samples_per_s"] <= r["samples_per_s_high"]
    meta = json.loads((out / "run.json").read_text())
    assert meta["provenance"]["ranks"]["local_world_size"] == 2 and meta["settings"]["ranks"] == 2
    text = proc.stdout
    assert "2 ranks on this host" in text and "a rank" in text
    assert "num_workers=2 a rank: 2 ranks x 2 workers = 4 worker processes" in text, text
    # local rank 0 alone wrote: one run directory, nothing else in the working folder
    assert sorted(p.name for p in tmp_path.iterdir()) == ["launch.py", "run", "steps"]


@pytest.mark.slow
def test_a_rank_whose_loader_raises_ends_every_rank_with_the_same_code_and_the_rows_kept(tmp_path):
    proc, out, seconds = _torchrun(tmp_path, RANKED_FAULT="raise1")
    assert seconds < 60
    assert proc.returncode != 0
    assert set(_exit_codes(proc.stderr)) <= {FAILED.exit_code}, proc.stderr[-2000:]
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == FAILED.status
    rows = (out / "results.csv").read_text()
    assert "local rank 1: the loader raised: ValueError: rank 1's shard is corrupt" in rows
    # torch's launcher reports a rank that ended with a code other than 0 with its own traceback; none of ours
    import re

    assert not [f for f in re.findall(r'File "([^"]+)"', proc.stderr) if "stagebench" in f], proc.stderr[-3000:]


@pytest.mark.slow
def test_a_rank_that_dies_ends_every_rank_within_a_minute_and_the_rows_are_kept(tmp_path):
    proc, out, seconds = _torchrun(tmp_path, RANKED_FAULT="die1", RANKED_DIE_AFTER="150")
    assert seconds < 60
    assert proc.returncode != 0
    assert (out / "results.csv").exists() and (out / "run.json").exists()
    meta = json.loads((out / "run.json").read_text())
    # the leader saw it go (its store or its process) and ended as a rank lost, or torch's launcher ended it
    assert meta["status"] in (RANK_LOST.status, "terminated"), (meta["status"], proc.stderr[-3000:])


@pytest.mark.slow
def test_the_trainer_runs_every_ranks_loop_step_for_step_under_ddp(tmp_path):
    steps = tmp_path / "steps"
    steps.mkdir()
    proc, out, _ = _torchrun(
        tmp_path,
        RANKED_DDP="1",
        RANKED_STEPS=str(steps),
        STAGEBENCH_TRAINER="measure",
        STAGEBENCH_TRAINER_S="1",
        STAGEBENCH_JOB_S="6",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ran = {p.name: int(p.read_text()) for p in steps.iterdir()}
    assert set(ran) == {"0", "1"} and ran["0"] == ran["1"] and ran["0"] > 20, ran  # the same steps on both
    summary = json.loads((out / "summary.json").read_text())
    assert summary["job"] is not None and summary["job"]["candidates"], summary["job"]
    meta = json.loads((out / "run.json").read_text())
    # a step takes a batch on every rank: the job's samples are the host's
    assert meta["job"]["items_per_step"] == 2 * 4


# ------------------------------------------------------------------ an SPDL pipeline under torch's launcher
def _spdl_torchrun(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path / "run"
    quick = {
        "SPDL_PIPELINE_DIAGNOSTIC_MODE": "1",
        "STAGEBENCH_OUTPUT_DIR": str(out),
        "STAGEBENCH_CONCURRENCY": "1,2",
        "STAGEBENCH_EXECUTORS": "thread",
        "STAGEBENCH_GIL_PROBE": "off",
        "STAGEBENCH_CACHE_DIR": "off",
        "SPDL_PIPELINE_DIAGNOSTIC_MODE_NUM_ITEMS": "100",
    }
    script = SCRIPTS / "ranked_spdl.py"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(script)],
        env={**os.environ, **quick, **env},
        capture_output=True,
        text=True,
        timeout=400,
        cwd=tmp_path,
    )
    return proc, out


@pytest.mark.slow
def test_an_spdl_pipelines_stages_run_on_every_rank_at_once_and_the_host_rate_is_their_sum(tmp_path):
    proc, out = _spdl_torchrun(tmp_path, RANKED_SLEEP="0.01")
    assert proc.returncode == 0, proc.stderr[-3000:]
    import pandas as pd

    rows = pd.read_csv(out / "results.csv")
    sleep = rows[(rows.stage == "sleep") & (rows.role == "stage") & (rows.status == "ok")]
    assert set(sleep.concurrency) == {1, 2}
    for _, r in sleep.iterrows():
        per_rank = r.concurrency / 0.01  # the known answer: c in flight, 10 ms each
        assert r.ranks == 2
        assert 0.75 * 2 * per_rank <= r.qps <= 1.1 * 2 * per_rank, r.to_dict()
        assert 0.75 * per_rank <= r.rank_min_qps <= r.rank_max_qps <= 1.1 * per_rank, r.to_dict()
    meta = json.loads((out / "run.json").read_text())
    assert meta["validation"]["ranks"] == 2 and meta["validation"]["qps"] > 0  # the whole pipeline on both ranks
    assert "2 ranks on this host" in proc.stdout
    assert "nothing was diagnosed" not in proc.stderr  # torch's launcher says nothing of its own


@pytest.mark.slow
@pytest.mark.parametrize("how", ["option", "variable"])
def test_a_single_process_script_runs_as_n_ranks_through_torchs_launcher(tmp_path, how):
    """``stagebench diagnose --nproc-per-node 2 script.py`` (or ``STAGEBENCH_NPROC_PER_NODE=2`` with the
    variable): the script's loader on two ranks, diagnosed together; one run directory, exit 0."""
    out = tmp_path / "run"
    env = {**os.environ, "STAGEBENCH_BUDGET_S": "0.3", "STAGEBENCH_TIMEOUT_S": "20", "RANKED_WORKERS": "1"}
    script = str(SCRIPTS / "ranked_train.py")
    if how == "option":
        cmd = [sys.executable, "-m", "stagebench", "diagnose", "--nproc-per-node", "2", "--out", str(out), script]
    else:
        env.update(SPDL_PIPELINE_DIAGNOSTIC_MODE="1", STAGEBENCH_NPROC_PER_NODE="2", STAGEBENCH_OUTPUT_DIR=str(out))
        cmd = [sys.executable, script]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "as 2 ranks on this host" in proc.stderr
    meta = json.loads((out / "run.json").read_text())
    assert meta["provenance"]["ranks"]["local_world_size"] == 2
    assert meta["provenance"]["ranks"]["launcher"] == "torchrun"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_a_bad_nproc_per_node_is_refused_naming_it(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "stagebench", "diagnose", "--nproc-per-node", "0", str(SCRIPTS / "ranked_train.py")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert "--nproc-per-node must be a positive integer" in proc.stderr, proc.stderr
