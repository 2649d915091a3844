import os
import sys

from stagebench import collect_provenance
from stagebench.runs._provenance import is_free_threaded, load_warnings


def test_provenance_records_machine_interpreter_libraries_and_knobs(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    p = collect_provenance()
    assert p["cpu_count"] == os.cpu_count()
    assert p["usable_cores"] == len(os.sched_getaffinity(0)) == len(p["cpu_affinity"])
    assert p["memory_total_gb"] > 0
    assert p["python"] == ".".join(map(str, sys.version_info[:3]))
    assert p["free_threaded"] is is_free_threaded()
    assert p["libraries"]["spdl"] and p["libraries"]["torch"] and p["libraries"]["numpy"]
    assert p["env"]["OMP_NUM_THREADS"] == "3"
    assert len(p["load_avg"]) == 3


def test_busy_machine_is_warned_about():
    quiet = {"usable_cores": 2, "load_avg": [0.2, 0.1, 0.1], "hostname": "a"}
    busy = {"usable_cores": 2, "load_avg": [3.5, 2.0, 1.0], "hostname": "a"}
    assert load_warnings(quiet, quiet) == []
    (w,) = load_warnings(busy, busy)
    assert "busy" in w and "3.50" in w
