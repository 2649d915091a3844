"""Accuracy on sleep stages: the truth, stagebench, and SPDL's built-in profiler, in one run.

For a stage that sleeps d seconds, concurrency c can sustain c / d_eff items/s,
where d_eff is the per-item time the harness really sees at c=1 (sleep plus the
call itself). We print, per (d, c): the truth, stagebench's QPS (direct
harness) with its relative error and interval, the harness ceiling (no-op
stage) and ``spdl.pipeline.profile_pipeline``'s QPS for the same stage (SPDL
only profiles c in {1, 4, 8, 16, 32}).

Target: stagebench within 5% wherever the truth is below half the ceiling.

Usage: python benchmarks/bench_sleep_accuracy.py [--budget 1.0] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from functools import partial
from pathlib import Path

from stagebench import MeasureConfig, measure_stage
from stagebench._measure import identity


def sleep_stage(x, d):
    time.sleep(d)
    return x


def spdl_profile(fn, n_items: int) -> dict[int, float]:
    """QPS per concurrency from SPDL's own profiler (its public API)."""
    from spdl.pipeline import profile_pipeline
    from spdl.pipeline.defs import Pipe, PipelineConfig, SinkConfig, SourceConfig

    logging.getLogger("spdl").setLevel(logging.ERROR)
    cfg = PipelineConfig(src=SourceConfig(range(n_items)), pipes=[Pipe(fn, name="sleep")], sink=SinkConfig(10))
    results = profile_pipeline(cfg, num_inputs=n_items)
    return {s.concurrency: s.qps for s in results[0].stats}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=1.0, help="window per point, seconds")
    ap.add_argument("--json", default=None, help="write the table as JSON here")
    ns = ap.parse_args(argv)
    cfg = MeasureConfig(budget_s=ns.budget, warmup_s=0.2, timeout_s=30)
    inputs = list(range(256))
    ceiling = {c: measure_stage(identity, inputs, executor="thread", concurrency=c, config=cfg)["qps"]
               for c in (1, 4, 16, 64)}
    rows = []
    print(f"{'d_ms':>5} {'c':>3} {'truth':>9} {'stagebench':>11} {'err%':>6} {'ci95':>17} "
          f"{'ceiling':>9} {'spdl_prof':>9} {'spdl_err%':>9}  within_target")
    for d in (0.002, 0.010):
        fn = partial(sleep_stage, d=d)
        base = measure_stage(fn, inputs, executor="thread", concurrency=1, config=cfg)
        d_eff = 1.0 / base["qps"]
        # enough items that SPDL's run at c=32 lasts a moment; its timing includes start-up
        spdl = spdl_profile(fn, n_items=int(min(2000, 64 / d_eff)))
        for c in (1, 4, 16, 64):
            row = base if c == 1 else measure_stage(fn, inputs, executor="thread", concurrency=c, config=cfg)
            truth = c / d_eff
            err = (row["qps"] - truth) / truth
            sp = spdl.get(c)
            sp_err = (sp - truth) / truth if sp else None
            eligible = truth < 0.5 * ceiling[c]
            ok = abs(err) <= 0.05 if eligible else None
            rows.append(dict(d_ms=d * 1e3, c=c, truth=truth, qps=row["qps"], qps_low=row["qps_low"],
                             qps_high=row["qps_high"], rel_error=err, ceiling=ceiling[c], spdl_qps=sp,
                             spdl_rel_error=sp_err, eligible=eligible, within_target=ok))
            print(f"{d*1e3:5.0f} {c:3d} {truth:9.1f} {row['qps']:11.1f} {err*100:6.1f} "
                  f"[{row['qps_low']:7.1f},{row['qps_high']:7.1f}] {ceiling[c]:9.0f} "
                  f"{(f'{sp:9.1f}' if sp else '      n/a')} {(f'{sp_err*100:9.1f}' if sp else '      n/a')}  "
                  f"{'yes' if ok else ('NO' if ok is False else 'n/a (near ceiling)')}")
    worst = max((abs(r["rel_error"]) for r in rows if r["eligible"]), default=float("nan"))
    print(f"\nworst stagebench error where truth < ceiling/2: {worst*100:.1f}% (target 5%)")
    if ns.json:
        Path(ns.json).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.json).write_text(json.dumps({"benchmark": "sleep_accuracy", "rows": rows,
                                             "worst_rel_error": worst}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
