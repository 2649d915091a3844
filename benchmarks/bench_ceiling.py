"""The harness ceiling: the highest QPS each harness can measure (a no-op stage).

A stage whose measured QPS is near these figures is overhead-bound: the harness
(or the pipeline it stands for), not the stage, is what is being measured. We
print the no-op QPS for stagebench's direct harness (threads, processes, async)
and for a one-stage SPDL pipeline (the ``spdl`` harness), per concurrency.

``--smoke``: 0.1 s windows at concurrency 1 and 4 only: that the script runs to the end
(``tests/test_bench_smoke.py``), not a figure to read.

Usage: python benchmarks/bench_ceiling.py [--budget 1.0] [--smoke] [--json OUT]
"""

from __future__ import annotations

import argparse
import sys

from _common import write_json

from stagebench import MeasureConfig, measure_stage
from stagebench.core._executors import async_identity, identity


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=1.0)
    ap.add_argument("--smoke", action="store_true", help="0.1 s windows, concurrency 1 and 4: does it run (tests)")
    ap.add_argument("--json", default=None)
    ns = ap.parse_args(argv)
    budget, warmup, levels = (0.1, 0.05, (1, 4)) if ns.smoke else (ns.budget, 0.3, (1, 4, 16))
    cfg = MeasureConfig(budget_s=budget, warmup_s=warmup, timeout_s=60)
    inputs = list(range(256))
    rows = []
    print(f"{'harness':>8} {'executor':>8} {'c':>3} {'noop_qps':>12} {'ci95':>25} {'cores':>6}")
    for harness in ("direct", "spdl"):
        for executor in ("thread", "process", "async"):
            fn = async_identity if executor == "async" else identity
            for c in levels:
                r = measure_stage(fn, inputs, executor=executor, concurrency=c, config=cfg, harness=harness).as_row()
                rows.append(
                    {
                        k: r[k]
                        for k in (
                            "harness",
                            "executor",
                            "concurrency",
                            "status",
                            "qps",
                            "qps_low",
                            "qps_high",
                            "cores_used",
                            "latency_p50_ms",
                        )
                    }
                )
                print(
                    f"{harness:>8} {executor:>8} {c:3d} {r['qps']:12,.0f} "
                    f"[{r['qps_low']:11,.0f},{r['qps_high']:11,.0f}] {r['cores_used']:6.2f}"
                    + ("" if r["status"] == "ok" else f"  {r['status']}: {r['reason']}"),
                    flush=True,
                )
    write_json(ns.json, {"benchmark": "ceiling", "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
