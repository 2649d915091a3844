"""Start-up overhead of having stagebench installed, with the variable unset.

stagebench activates diagnostic mode from ``stagebench_activate.pth``, which
``site`` executes at every interpreter start. This measures exactly that work:
``site.addpackage`` on our .pth (variable unset) against an empty .pth, in
process, many times; and whole-interpreter start-up (``python -c pass``) with
and without the variable set, for context. Target: under 1 ms.

``--smoke``: 2,000 ``addpackage`` calls and 5 interpreter starts instead of 20,000 and 30: that the
script runs to the end (``tests/test_bench_smoke.py``), not a figure to read.

Usage: python benchmarks/bench_startup.py [--smoke] [--json OUT]
"""

from __future__ import annotations

import argparse
import os
import site
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from _common import write_json


def _addpackage_cost(pth_dir: str, name: str, n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        site.addpackage(pth_dir, name, set())
    return (time.perf_counter() - t) / n


def _interpreter_start(env: dict, n: int) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="a few calls and starts: does it run (tests)")
    ap.add_argument("--json", default=None)
    ns = ap.parse_args(argv)
    purelib = sysconfig.get_paths()["purelib"]
    ours = Path(purelib) / "stagebench_activate.pth"
    if not ours.exists():
        print(f"stagebench_activate.pth not found in {purelib}: is stagebench installed?")
        return 1
    env = {k: v for k, v in os.environ.items() if k != "SPDL_PIPELINE_DIAGNOSTIC_MODE"}
    os.environ.pop("SPDL_PIPELINE_DIAGNOSTIC_MODE", None)
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "empty.pth").write_text("")
        (Path(d) / "ours.pth").write_text(ours.read_text())
        n = 2000 if ns.smoke else 20000
        empty = _addpackage_cost(d, "empty.pth", n)
        ourcost = _addpackage_cost(d, "ours.pth", n)
    pth_us = (ourcost - empty) * 1e6
    starts = 5 if ns.smoke else 30
    start_unset = _interpreter_start(env, starts)
    start_set = _interpreter_start({**env, "SPDL_PIPELINE_DIAGNOSTIC_MODE": "1"}, starts)
    print(
        f"processing our .pth (variable unset): {ourcost * 1e6:.1f} us (empty .pth {empty * 1e6:.1f} us): "
        f"+{pth_us:.1f} us   target < 1000 us: {'yes' if pth_us < 1000 else 'NO'}"
    )
    print(
        f"python -c pass, median of {starts}: variable unset {start_unset * 1e3:.1f} ms, "
        f"set {start_set * 1e3:.1f} ms (set installs the import hook)"
    )
    write_json(
        ns.json,
        {
            "benchmark": "startup",
            "pth_overhead_us": pth_us,
            "interpreter_start_unset_ms": start_unset * 1e3,
            "interpreter_start_set_ms": start_set * 1e3,
            "target_us": 1000,
            "met": pth_us < 1000,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
