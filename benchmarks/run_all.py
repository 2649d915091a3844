"""Run every benchmark (benchmarks/bench_*.py) and write one JSON per benchmark.

Each script prints its own table and accepts ``--json OUT``. Results land in
``reports/benchmarks/<name>.json`` with the machine's provenance, so the
figures in the README can be traced to a run. Benchmarks measure; they never
assert. Run on a quiet machine: other load shows up in the figures.

``--smoke`` hands ``--smoke`` to each script (its quickest mode: does it run, no figure to read;
``tests/test_bench_smoke.py``); ``--out DIR`` writes the JSONs there instead of ``reports/benchmarks/``.

``bench_diagnosis`` runs first, and ``bench_advice`` takes the advice of its runs at the defaults
(:data:`HANDED_ON`) rather than diagnosing the same pipelines again.

Usage: python benchmarks/run_all.py [--smoke] [--out DIR] [NAME ...]   (default: all)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from _common import DIAGNOSIS_RUNS

HERE = Path(__file__).resolve().parent
OUT = HERE.parent / "reports" / "benchmarks"
#: Run before the others (which go in name order).
FIRST = ("diagnosis",)
#: What a benchmark takes from another that ran to the end in the same call (not in --smoke): bench_advice
#: the advice of bench_diagnosis's runs at the defaults, so that the same diagnosis is not run twice.
HANDED_ON = {"advice": ("diagnosis", ["--summaries", str(DIAGNOSIS_RUNS)])}


def main(argv: list[str]) -> int:
    from stagebench import collect_provenance

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", metavar="NAME", help="run the benchmarks whose name contains one of these")
    ap.add_argument("--smoke", action="store_true", help="each script in its quickest mode (no figure to read)")
    ap.add_argument("--out", type=Path, default=OUT, help="where the JSONs go (default: reports/benchmarks)")
    ns = ap.parse_args(argv)
    ns.out.mkdir(parents=True, exist_ok=True)
    scripts = sorted(HERE.glob("bench_*.py"), key=lambda p: (p.stem.removeprefix("bench_") not in FIRST, p.stem))
    if ns.names:
        scripts = [s for s in scripts if any(a in s.stem for a in ns.names)]
    failed, done = [], set()
    t_all = time.perf_counter()
    for script in scripts:
        name = script.stem.removeprefix("bench_")
        out = ns.out / f"{name}.json"
        print(f"\n=== {name} ===", flush=True)
        out.unlink(missing_ok=True)  # a script that writes nothing must not pass on an earlier run's file
        t = time.perf_counter()
        source, given = HANDED_ON.get(name, ("", []))
        extra = given if source in done and not ns.smoke else []
        rc = subprocess.call(
            [sys.executable, str(script), *(["--smoke"] if ns.smoke else []), *extra, "--json", str(out)]
        )
        took = time.perf_counter() - t
        if rc != 0 or not out.exists():
            failed.append(name)
            print(f"--- {name} FAILED (exit {rc})", flush=True)
            continue
        data = json.loads(out.read_text())
        data.update(seconds=round(took, 1), provenance=collect_provenance())
        out.write_text(json.dumps(data, indent=2) + "\n")
        done.add(name)
        print(f"--- {name}: {took:.0f}s -> {out}", flush=True)
    print(f"\nall benchmarks: {time.perf_counter() - t_all:.0f}s; failed: {failed or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
