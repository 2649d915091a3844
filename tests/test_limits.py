"""The cores and the memory the job can use (runs/_limits, model/_limits), read from fixture trees (issue 59).

Each tree is a root with ``proc/self/cgroup``, ``proc/self/mountinfo`` and the cgroup files under the
mount points mountinfo names, laid out as the kernel lays them out; the reader takes the root.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stagebench.model._limits import HostLimits
from stagebench.runs._limits import cpu_quota, memory_limit, read_limits, read_oom_kills, slurm_cpus, usable_cores

V2_MOUNTINFO = "30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
V1_MOUNTINFO = (
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n"
    "34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset\n"
    "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
)
NO_LIMIT_V1 = "9223372036854771712"


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def _v2(root: Path, path: str, groups: dict[str, dict[str, str]]) -> Path:
    """A v2 tree: the process at ``path``; ``groups`` maps a group's path to its files."""
    files = {"proc/self/cgroup": f"0::{path}\n", "proc/self/mountinfo": V2_MOUNTINFO}
    for g, fs in groups.items():
        for name, text in fs.items():
            files[f"sys/fs/cgroup{g.rstrip('/')}/{name}"] = text
    return _write(root, files)


def _v1(root: Path, path: str, cpu: dict[str, dict[str, str]], memory: dict[str, dict[str, str]]) -> Path:
    """A v1 tree (with an empty unified hierarchy beside it, as systemd's hybrid mode mounts it)."""
    files = {
        "proc/self/cgroup": f"12:memory:{path}\n4:cpu,cpuacct:{path}\n3:cpuset:/\n0::/\n",
        "proc/self/mountinfo": V1_MOUNTINFO,
        "sys/fs/cgroup/unified/cgroup.controllers": "",
    }
    for ctl, groups in (("cpu,cpuacct", cpu), ("memory", memory)):
        for g, fs in groups.items():
            for name, text in fs.items():
                files[f"sys/fs/cgroup/{ctl}{g.rstrip('/')}/{name}"] = text
    return _write(root, files)


# ------------------------------------------------------------------ cgroup v2
def test_v2_cpu_max_reads_as_cpus_and_max_reads_as_no_quota(tmp_path):
    root = _v2(tmp_path / "a", "/job", {"/": {}, "/job": {"cpu.max": "150000 100000\n"}})
    q = cpu_quota(root)
    assert q is not None and (q.cpus, q.group, q.file) == (1.5, "/job", "cpu.max")
    assert cpu_quota(_v2(tmp_path / "b", "/job", {"/": {}, "/job": {"cpu.max": "max 100000\n"}})) is None


def test_v2_nested_groups_take_the_smallest_quota_wherever_it_is_on_the_path(tmp_path):
    groups = {
        "/": {},
        "/kubepods": {"cpu.max": "400000 100000\n"},
        "/kubepods/pod1": {"cpu.max": "50000 100000\n"},  # the parent's 0.5 CPU caps its child's 3
        "/kubepods/pod1/ctr": {"cpu.max": "300000 100000\n"},
    }
    q = cpu_quota(_v2(tmp_path, "/kubepods/pod1/ctr", groups))
    assert q is not None and (q.cpus, q.group) == (0.5, "/kubepods/pod1")


def test_v2_memory_takes_max_or_a_lower_high_less_what_the_group_uses(tmp_path):
    mib = 2**20
    groups = {
        "/": {},
        "/job": {
            "memory.max": f"{4096 * mib}\n",
            "memory.high": f"{3072 * mib}\n",
            "memory.current": f"{1000 * mib}\n",
            "memory.stat": f"anon {800 * mib}\ninactive_file {200 * mib}\nactive_file 0\n",
        },
    }
    m = memory_limit(_v2(tmp_path / "a", "/job", groups))
    # the inactive file pages are dropped before anything is killed: 1000 - 200 MB in use
    assert m is not None and (m.limit_mb, m.file, m.used_mb, m.free_mb) == (3072, "memory.high", 800, 2272)
    assert memory_limit(_v2(tmp_path / "b", "/job", {"/job": {"memory.max": "max\n", "memory.high": "max\n"}})) is None


def test_v2_oom_kills_and_throttling_are_read_where_they_are(tmp_path):
    groups = {
        "/job": {
            "cpu.max": "100000 100000\n",
            "cpu.stat": "usage_usec 9\nnr_periods 40\nnr_throttled 12\nthrottled_usec 250000\n",
            "memory.events": "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n",
        }
    }
    lim = read_limits(_v2(tmp_path, "/job", groups), env={}, affinity=2)
    assert lim.throttling is not None
    assert (lim.throttling.periods, lim.throttling.throttled, lim.throttling.throttled_s) == (40, 12, 0.25)
    assert lim.oom is not None and lim.oom.kills == 1 and lim.oom.path.endswith("job/memory.events")
    assert read_oom_kills(lim.oom.path) == 1


# ------------------------------------------------------------------ cgroup v1
def test_v1_quota_nested_groups_and_the_no_limit_value(tmp_path):
    cpu = {
        "/": {"cpu.cfs_quota_us": "-1\n", "cpu.cfs_period_us": "100000\n"},
        "/outer": {"cpu.cfs_quota_us": "150000\n", "cpu.cfs_period_us": "100000\n"},
        "/outer/inner": {"cpu.cfs_quota_us": "-1\n", "cpu.cfs_period_us": "100000\n"},
    }
    memory = {
        "/": {"memory.limit_in_bytes": NO_LIMIT_V1 + "\n"},
        "/outer": {"memory.limit_in_bytes": NO_LIMIT_V1 + "\n"},
        "/outer/inner": {
            "memory.limit_in_bytes": f"{512 * 2**20}\n",
            "memory.usage_in_bytes": f"{100 * 2**20}\n",
            "memory.stat": f"cache 0\ntotal_inactive_file {36 * 2**20}\n",
            "memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
        },
    }
    root = _v1(tmp_path, "/outer/inner", cpu, memory)
    q = cpu_quota(root)
    assert q is not None and (q.cpus, q.group, q.file) == (1.5, "/outer", "cpu.cfs_quota_us")
    m = memory_limit(root)
    assert m is not None and (m.limit_mb, m.used_mb, m.group) == (512, 64, "/outer/inner")
    lim = read_limits(root, env={}, affinity=2)
    assert (lim.cores, lim.cores_source) == (1.5, "quota")
    assert lim.oom is not None and lim.oom.kills == 2
    assert lim.cores_bound() == "1.5 CPUs by the container's quota, of 2"
    # the host has more than 448 MB available: the limit binds
    assert (lim.memory_source, lim.memory_mb) == ("cgroup", 448)


def test_v1_the_group_that_leaves_the_least_binds_not_the_smallest_limit(tmp_path):
    """A parent with a larger limit whose other children use most of it leaves less than the child's own."""
    mib = 2**20
    memory = {
        "/": {},
        "/p": {"memory.limit_in_bytes": f"{2000 * mib}", "memory.usage_in_bytes": f"{1900 * mib}"},
        "/p/c": {"memory.limit_in_bytes": f"{1000 * mib}", "memory.usage_in_bytes": f"{10 * mib}"},
    }
    m = memory_limit(_v1(tmp_path, "/p/c", {}, memory))
    assert m is not None and (m.group, m.free_mb) == ("/p", 100)


def test_a_group_behind_a_namespaced_mount_is_read_relative_to_the_mounts_root(tmp_path):
    """A container whose cgroup mount shows the hierarchy from its own group down (mountinfo's root field)."""
    files = {
        "proc/self/cgroup": "0::/docker/abc\n",
        "proc/self/mountinfo": "30 23 0:26 /docker/abc /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
        "sys/fs/cgroup/cpu.max": "200000 100000\n",
    }
    q = cpu_quota(_write(tmp_path, files))
    assert q is not None and (q.cpus, q.group) == (2.0, "/")


def test_missing_and_unreadable_files_mean_no_limit_never_an_error(tmp_path):
    assert cpu_quota(tmp_path) is None and memory_limit(tmp_path) is None  # no /proc at all
    garbage = _v2(tmp_path / "g", "/job", {"/job": {"cpu.max": "lots\n", "memory.max": "-\n", "memory.events": "x"}})
    lim = read_limits(garbage, env={}, affinity=3)
    assert (lim.cores, lim.cores_source, lim.quota, lim.memory_limit, lim.oom) == (3, "affinity", None, None, None)
    assert lim.cores_bound() == "" and lim.memory_bound() == ""
    assert read_oom_kills(tmp_path / "nowhere") is None


# ------------------------------------------------------------------ Slurm and the one figure
def test_slurm_cpus_per_task_wins_over_cpus_on_node_and_only_inside_a_job():
    job = {"SLURM_JOB_ID": "7", "SLURM_CPUS_ON_NODE": "8", "SLURM_CPUS_PER_TASK": "4"}
    assert slurm_cpus(job) == (4, "SLURM_CPUS_PER_TASK")
    assert slurm_cpus({"SLURM_JOB_ID": "7", "SLURM_CPUS_ON_NODE": "8"}) == (8, "SLURM_CPUS_ON_NODE")
    assert slurm_cpus({"SLURM_CPUS_PER_TASK": "4"}) is None  # a variable left over outside a job
    assert slurm_cpus({"SLURM_JOB_ID": "7", "SLURM_CPUS_PER_TASK": "four"}) is None


def test_the_cores_are_the_smallest_candidate_ties_to_the_affinity(tmp_path):
    root = _v2(tmp_path, "/job", {"/job": {"cpu.max": "400000 100000\n"}})
    slurm = {"SLURM_JOB_ID": "1", "SLURM_CPUS_PER_TASK": "3"}
    assert usable_cores(root, env=slurm, affinity=16) == 3
    lim = read_limits(root, env=slurm, affinity=16)
    assert (lim.cores_source, lim.slurm_cpus, lim.slurm_variable) == ("slurm", 3, "SLURM_CPUS_PER_TASK")
    assert lim.cores_bound() == "3 CPUs by the Slurm allocation (SLURM_CPUS_PER_TASK), of 16"
    assert read_limits(root, env=slurm, affinity=2).cores_source == "affinity"
    # a quota equal to the mask does not bind: the words stay as without one
    assert read_limits(root, env={}, affinity=4).cores_bound() == ""


def test_the_record_reads_back_as_written_and_an_old_run_has_none(tmp_path):
    root = _v2(tmp_path, "/job", {"/job": {"cpu.max": "100000 100000\n", "memory.max": f"{2**30}\n"}})
    lim = read_limits(root, env={}, affinity=2)
    assert HostLimits.from_json(lim.to_json()) == lim
    assert lim.cores_bound() == "1.0 CPU by the container's quota, of 2"
    assert HostLimits.from_json(None) is None and HostLimits.from_json({"cores_source": "quota"}) is None


def test_this_process_reads_without_error():
    lim = read_limits()
    assert lim.cores > 0 and lim.memory_mb is not None and lim.memory_mb > 0
    assert lim.affinity is not None and lim.cores <= lim.affinity


def test_provenance_records_the_limits_and_the_report_shows_where_the_cores_came_from(tmp_path):
    from stagebench.model._meta import Provenance
    from stagebench.report._html import provenance_items
    from stagebench.runs._provenance import collect_provenance

    p = collect_provenance()
    assert p["usable_cores"] == p["limits"]["cores"]
    items = dict(provenance_items(Provenance.from_json(p)))
    assert "usable of" in items["cores"] and "(" in items["cores"]
    q = dict(p, usable_cores=1.0)
    q["limits"] = read_limits(_v2(tmp_path, "/job", {"/job": {"cpu.max": "100000 100000\n"}}), env={}, affinity=2)
    q["limits"] = q["limits"].to_json()
    cores = dict(provenance_items(Provenance.from_json(q)))["cores"]
    assert (
        cores.startswith("1.0 usable of") and "1.0 CPU by the container's quota, of 2: cpu.max of cgroup /job" in cores
    )


@pytest.mark.parametrize("quota", ["0 100000", "100000 0", "-1 100000"])
def test_a_quota_that_is_no_count_is_no_quota(tmp_path, quota):
    assert cpu_quota(_v2(tmp_path, "/job", {"/job": {"cpu.max": quota}})) is None


def test_a_quota_that_throttled_the_run_is_warned_about_and_one_that_did_not_is_not(tmp_path):
    from stagebench.runs._provenance import load_warnings

    def reading(name: str, throttled: int, usec: int) -> dict:
        stat = f"nr_periods {100 + throttled}\nnr_throttled {throttled}\nthrottled_usec {usec}\n"
        root = _v2(tmp_path / name, "/job", {"/job": {"cpu.max": "100000 100000\n", "cpu.stat": stat}})
        lim = read_limits(root, env={}, affinity=2)
        return {"usable_cores": lim.cores, "load_avg": [0.1] * 3, "hostname": "h", "limits": lim.to_json()}

    before, quiet, busy = reading("a", 5, 1000), reading("b", 5, 1000), reading("c", 305, 12_501_000)
    assert load_warnings(before, quiet) == []
    (w,) = load_warnings(before, busy)
    assert w.startswith("the container's CPU quota (1.0 CPU, cgroup /job) throttled the run in 300 of 300 scheduling")
    assert "(12.5 s waiting for the next)" in w and "the quota, not the GIL" in w
    # the host's load is set against the cores the process could run on, not the quota's 1 CPU
    assert load_warnings(dict(before, load_avg=[0.8, 0.1, 0.1])) == []


def test_a_run_that_never_finished_is_said_killed_by_the_oom_killer_where_its_cgroup_counted_it(tmp_path):
    """run.json records the group's oom_kill count at the start; `stagebench report` on a run still
    `running` compares it with the count now, says what it found, keeps it in run.json, and the summary
    says it. Where the count did not grow, it says the run ended without finishing."""
    import json

    from stagebench.sweep._rebuild import rebuild

    def run(name: str, kills_now: int) -> Path:
        events = tmp_path / name / "memory.events"
        events.parent.mkdir(parents=True)
        events.write_text(f"oom 0\noom_kill {kills_now}\n")
        d = tmp_path / name / "run"
        d.mkdir()
        prov = {"usable_cores": 2, "cpu_count": 2, "load_avg": [0.1] * 3, "hostname": "h"}
        prov["limits"] = {"cores": 2, "oom": {"path": str(events), "kills": 0}}
        prov["limits"]["memory_limit"] = {"limit_mb": 2344.0, "group": "/g", "file": "memory.max", "used_mb": 823.0}
        meta = {"kind": "loader", "status": "running", "provenance": prov, "settings": {"usable_cores": 2}}
        (d / "run.json").write_text(json.dumps(meta))
        (d / "results.csv").write_text("")
        return d

    said: list[str] = []
    killed = run("killed", 1)
    rebuild(killed, say=said.append)
    (line,) = said
    assert "killed by the OOM killer at its cgroup's memory limit (2,344 MB, memory.max of /g): its cgroup's " in line
    assert "oom_kill count went from 0 to 1" in line
    meta = json.loads((killed / "run.json").read_text())
    assert meta["status"] == "running" and meta["ended"]["by"] == "oom" and meta["ended"]["oom_kills"] == [0, 1]
    summary = json.loads((killed / "summary.json").read_text())
    assert any(w.startswith("the sweep was cut short: killed by the OOM killer") for w in summary["warnings"])
    said.clear()
    rebuild(run("signalled", 0), say=said.append)
    (line,) = said
    assert "it ended without finishing, and its cgroup shows no OOM kill" in line
