"""Run every benchmark (benchmarks/bench_*.py) and write one JSON per benchmark.

Each script prints its own table and accepts ``--json OUT``. Results land in
``reports/benchmarks/<name>.json`` with the machine's provenance, so the
figures in the README can be traced to a run. Benchmarks measure; they never
assert. Run on a quiet machine: other load shows up in the figures.

Usage: python benchmarks/run_all.py [NAME ...]   (default: all)
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE.parent / "reports" / "benchmarks"


def main(argv: list[str]) -> int:
    from stagebench import collect_provenance

    OUT.mkdir(parents=True, exist_ok=True)
    scripts = sorted(HERE.glob("bench_*.py"))
    if argv:
        scripts = [s for s in scripts if any(a in s.stem for a in argv)]
    failed = []
    t_all = time.perf_counter()
    for script in scripts:
        name = script.stem.removeprefix("bench_")
        out = OUT / f"{name}.json"
        print(f"\n=== {name} ===", flush=True)
        t = time.perf_counter()
        rc = subprocess.call([sys.executable, str(script), "--json", str(out)])
        took = time.perf_counter() - t
        if rc != 0 or not out.exists():
            failed.append(name)
            print(f"--- {name} FAILED (exit {rc})", flush=True)
            continue
        data = json.loads(out.read_text())
        data.update(seconds=round(took, 1), provenance=collect_provenance())
        out.write_text(json.dumps(data, indent=2) + "\n")
        print(f"--- {name}: {took:.0f}s -> {out.relative_to(HERE.parent)}", flush=True)
    print(f"\nall benchmarks: {time.perf_counter() - t_all:.0f}s; failed: {failed or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
