"""Cost and prediction of a full diagnosis: stagebench's diagnostic mode vs SPDL's built-in profile.

Three reference pipelines (``_common.PIPELINES``: the issue's GIL example, a
sleep-dominated one, one doing CPU work that releases the GIL), each diagnosed
twice in the same run, each time in a fresh interpreter (start-up and imports
count: that is what a user waits for):

- **SPDL**: ``spdl.pipeline.profile_pipeline(cfg, 1000)``, exactly what
  ``SPDL_PIPELINE_DIAGNOSTIC_MODE=1`` runs without stagebench (1000 is its
  default ``SPDL_PIPELINE_DIAGNOSTIC_MODE_NUM_ITEMS``): each stage alone on
  threads at concurrency 32, 16, 8, 4, 1, one QPS each, logged.
- **stagebench**: ``stagebench diagnose bench_diagnosis.py --child ...`` (the
  unmodified script builds and iterates the pipeline; diagnostic mode takes
  over). Settings, chosen to be fair to SPDL (see ``STAGEBENCH_ENV``): five
  concurrency levels per executor as SPDL has (stagebench's default grid 1, 2,
  4, 8, 16: 32 processes on a small machine is not a setting anyone should
  use), threads *and* processes, each stage measured inside a one-stage SPDL
  pipeline as SPDL does (harness ``spdl``), a ``--budget`` window per point,
  its default 200 source items, no stage cache (a first diagnosis), the
  default validation run (the whole pipeline at the recommended settings).

Cost: wall time of each, and what each produced (points, executors,
intervals, verdicts, report). Target: stagebench no slower than SPDL while
covering processes, intervals, verdicts and the report.

Prediction: stagebench's predicted whole-pipeline throughput (the replay: the
pipeline run with stand-ins built from the isolated measurements), the bounds
it is explained by (the stages, the cores and the GIL), the naive minimum of
the stage capacities, and the throughput measured by its validation run.
Target: within 15%.

``--lean`` (not part of ``make bench``): stagebench without the two checks a
user can turn off, the threads-vs-processes head-to-head
(``STAGEBENCH_PAIRED_ROUNDS=0``) and the validation run
(``STAGEBENCH_VALIDATE=off``; the replay still predicts): what those checks
cost. There is no prediction error then: nothing measured to hold it to.

Usage: python benchmarks/bench_diagnosis.py [--budget 0.3] [--pipelines gil_mix,...] [--lean] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import PIPELINE_NOTES, PIPELINES, ROOT, SPDL_DEFAULT_NUM_INPUTS, fmt_pct, fmt_q, machine_line, write_json  # noqa: E402

COST_TARGET = 1.0  # stagebench seconds / SPDL seconds
PRED_TARGET = 0.15
SOURCE_ITEMS = 1_000_000  # range(): lazy; more than either tool reads


def stagebench_env(budget: float, lean: bool = False) -> dict[str, str]:
    env = {
        "STAGEBENCH_CONCURRENCY": "1,2,4,8,16",
        "STAGEBENCH_EXECUTORS": "thread,process",
        "STAGEBENCH_HARNESSES": "spdl",
        "STAGEBENCH_BUDGET_S": f"{budget:g}",
        "STAGEBENCH_WARMUP_S": "0.1",
        "STAGEBENCH_CACHE_DIR": "off",
        "SPDL_PIPELINE_DIAGNOSTIC_MODE_NUM_ITEMS": "200",
    }
    if lean:  # the two checks a user can turn off: the head-to-head and the validation run
        env.update(STAGEBENCH_PAIRED_ROUNDS="0", STAGEBENCH_VALIDATE="off")
    return env


# ------------------------------------------------------------------ children
def _child_pipeline(name: str) -> int:
    """The 'training script': build the pipeline and iterate it (diagnostic mode takes over)."""
    from spdl.pipeline import build_pipeline

    pipeline = build_pipeline(PIPELINES[name](SOURCE_ITEMS), num_threads=8)
    with pipeline.auto_stop():
        for _ in pipeline:
            pass
    return 0


def _child_spdl(name: str, result: str) -> int:
    import logging

    from spdl.pipeline import profile_pipeline

    logging.basicConfig(level=logging.INFO)  # SPDL's diagnostic mode reports through logging only
    t0 = time.perf_counter()
    results = profile_pipeline(PIPELINES[name](SOURCE_ITEMS), num_inputs=SPDL_DEFAULT_NUM_INPUTS)
    Path(result).write_text(
        json.dumps(
            {
                "seconds_inside": time.perf_counter() - t0,
                "stages": {
                    r.name: [
                        {"concurrency": s.concurrency, "qps": s.qps, "occupancy": s.occupancy_rate} for s in r.stats
                    ]
                    for r in results
                },
            }
        )
    )
    return 0


# ------------------------------------------------------------------ parent
def _run(cmd: list[str], env: dict[str, str], log: Path) -> tuple[int, float]:
    t0 = time.perf_counter()
    with open(log, "w") as f:
        rc = subprocess.call(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
    return rc, time.perf_counter() - t0


def _tail(log: Path, n: int = 15) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-n:])


def _stagebench_products(run_dir: Path) -> dict:
    import pandas as pd

    summary = json.loads((run_dir / "summary.json").read_text())
    rows = pd.read_csv(run_dir / "results.csv")
    stage = rows[rows["role"] == "stage"]
    ok = stage[stage["status"] == "ok"]
    with_iv = ok[ok["qps_low"].notna() & ok["qps_high"].notna()]
    report = run_dir / "report.html"
    pred = summary.get("prediction") or {}
    val = summary.get("validation") or {}
    meta = json.loads((run_dir / "run.json").read_text())
    vmeta = meta.get("validation") or {}
    replay_alone = not vmeta and meta.get("replay")  # STAGEBENCH_VALIDATE=off (--lean)
    spent = {
        f"{e} {({'ceiling': 'ceilings', 'paired': 'head-to-head'}).get(r, 'points')}": round(float(t), 1)
        for (e, r), t in rows.groupby(["executor", "role"])["elapsed_s"].sum().items()
    }
    if replay_alone:
        spent["replay"] = round(float(meta["replay"].get("wall_s") or 0), 1)
    else:
        spent["replay + validation (taking turns)"] = round(float(vmeta.get("wall_s") or 0), 1)
    return {
        "time_spent_s": spent,
        "points": int(len(ok)),
        "ceiling_points": int(((rows["role"] == "ceiling") & (rows["status"] == "ok")).sum()),
        "executors": sorted(ok["executor"].unique().tolist()),
        "intervals": int(len(with_iv)),
        "verdict": summary.get("verdict"),
        "findings": len(summary.get("findings") or []),
        "stages": [
            {
                "name": s["name"],
                "classification": s.get("classification"),
                "gil_fraction": s.get("gil_fraction"),
                "recommended": s.get("recommended"),
            }
            for s in summary.get("stages") or []
        ],
        "report": str(report) if report.exists() else None,
        "report_kb": round(report.stat().st_size / 1024, 1) if report.exists() else None,
        "predicted_qps": pred.get("qps"),
        "binding": pred.get("binding"),
        "naive_qps": pred.get("naive_qps"),
        "method": pred.get("method"),
        "bounds_qps": pred.get("bounds_qps"),
        "bounds": pred.get("bounds"),
        "explanation": pred.get("explanation"),
        "measured_qps": val.get("qps"),
        "measured_low": val.get("qps_low"),
        "measured_high": val.get("qps_high"),
        "validation_error": val.get("error"),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=0.3, help="stagebench window per point, seconds")
    ap.add_argument("--pipelines", default=",".join(PIPELINES), help=f"comma-separated: {', '.join(PIPELINES)}")
    ap.add_argument("--runs-dir", default=None, help="where stagebench's run directories go (reports for a look)")
    ap.add_argument("--json", default=None)
    ap.add_argument(
        "--lean",
        action="store_true",
        help="stagebench without its two checks (STAGEBENCH_PAIRED_ROUNDS=0, STAGEBENCH_VALIDATE=off): "
        "what they cost; no prediction error (nothing measured to hold the prediction to)",
    )
    ap.add_argument("--child", choices=("pipeline", "spdl"), help=argparse.SUPPRESS)
    ap.add_argument("--pipeline", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ns = ap.parse_args(argv)
    if ns.child == "pipeline":
        return _child_pipeline(ns.pipeline)
    if ns.child == "spdl":
        return _child_spdl(ns.pipeline, ns.result)

    names = [n for n in ns.pipelines.split(",") if n]
    bad = [n for n in names if n not in PIPELINES]
    if bad:
        print(f"--pipelines: unknown {bad[0]!r}; allowed: {', '.join(PIPELINES)}")
        return 2
    runs = Path(ns.runs_dir or ROOT / "reports" / "bench-runs" / ("diagnosis-lean" if ns.lean else "diagnosis"))
    runs.mkdir(parents=True, exist_ok=True)
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("STAGEBENCH_", "SPDL_PIPELINE_DIAGNOSTIC"))}
    sb_settings = stagebench_env(ns.budget, ns.lean)
    sb_env = {**base_env, **sb_settings}
    print(f"diagnosis: {machine_line()}")
    print("stagebench settings: " + " ".join(f"{k}={v}" for k, v in sb_settings.items()))
    print(
        f"SPDL settings: profile_pipeline(cfg, num_inputs={SPDL_DEFAULT_NUM_INPUTS}) (its diagnostic-mode default)\n",
        flush=True,
    )
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            res = Path(tmp) / f"{name}-spdl.json"
            rc_sp, t_sp = _run(
                [
                    sys.executable,
                    str(Path(__file__).resolve()),
                    "--child",
                    "spdl",
                    "--pipeline",
                    name,
                    "--result",
                    str(res),
                ],
                base_env,
                Path(tmp) / f"{name}-spdl.log",
            )
            spdl = json.loads(res.read_text()) if rc_sp == 0 and res.exists() else None
            if spdl is None:
                print(f"{name}: SPDL profile failed (exit {rc_sp}):\n{_tail(Path(tmp) / f'{name}-spdl.log')}")
            run_dir = runs / name
            shutil.rmtree(run_dir, ignore_errors=True)
            log = runs / f"{name}.log"
            rc_sb, t_sb = _run(
                [
                    sys.executable,
                    "-m",
                    "stagebench",
                    "diagnose",
                    "--out",
                    str(run_dir),
                    str(Path(__file__).resolve()),
                    "--child",
                    "pipeline",
                    "--pipeline",
                    name,
                ],
                sb_env,
                log,
            )
            sb = _stagebench_products(run_dir) if rc_sb == 0 and (run_dir / "summary.json").exists() else None
            if sb is None:
                print(f"{name}: stagebench diagnose failed (exit {rc_sb}):\n{_tail(log)}")
            results.append(_report_one(name, t_sp, spdl, t_sb, sb))

    ok = [r for r in results if r["spdl_seconds"] and r["stagebench_seconds"] and r["stagebench"] and r["spdl"]]
    cost_met = sum(1 for r in ok if r["cost_ratio"] <= COST_TARGET)
    pred = [r for r in results if r["prediction_error"] is not None]
    pred_met = sum(1 for r in pred if abs(r["prediction_error"]) <= PRED_TARGET)
    print(
        f"cost: stagebench no slower than SPDL on {cost_met} of {len(ok)} pipelines; "
        f"prediction within {PRED_TARGET:.0%} on {pred_met} of {len(pred)} (naive within "
        f"{PRED_TARGET:.0%} on {sum(1 for r in pred if r['naive_error'] is not None and abs(r['naive_error']) <= PRED_TARGET)})"
    )
    print(f"reports: {runs}/<pipeline>/report.html   ({machine_line()})")
    write_json(
        ns.json,
        {
            "benchmark": "diagnosis",
            "variant": "lean" if ns.lean else "default",
            "budget_s": ns.budget,
            "stagebench_env": sb_settings,
            "spdl_num_inputs": SPDL_DEFAULT_NUM_INPUTS,
            "cost_target_ratio": COST_TARGET,
            "prediction_target_rel_error": PRED_TARGET,
            "pipelines": results,
            "cost_met": cost_met,
            "prediction_met": pred_met,
            "met": bool(ok) and cost_met == len(ok) and bool(pred) and pred_met == len(pred) == len(results),
        },
    )
    return 0


def _report_one(name: str, t_sp: float, spdl: dict | None, t_sb: float, sb: dict | None) -> dict:
    print(f"== {name}: {PIPELINE_NOTES[name]}")
    sp_points = sum(len(v) for v in spdl["stages"].values()) if spdl else None
    print(f"   {'':>10} {'seconds':>8} {'points':>7} {'executors':>15} {'intervals':>9}  verdict / report")
    if spdl:
        print(f"   {'SPDL':>10} {t_sp:8.1f} {sp_points:7d} {'thread':>15} {0:9d}  none (log lines only)")
    if sb:
        print(
            f"   {'stagebench':>10} {t_sb:8.1f} {sb['points']:7d} {','.join(sb['executors']):>15} "
            f"{sb['intervals']:9d}  report.html ({sb['report_kb']} KB), {sb['findings']} findings, "
            f"+{sb['ceiling_points']} no-op ceiling points"
        )
        rest = t_sb - sum(sb["time_spent_s"].values())
        print(
            "   stagebench's time: "
            + ", ".join(f"{k} {v:.1f} s" for k, v in sb["time_spent_s"].items())
            + f", the rest (start-up, imports, source, caching, analysis, report) {rest:.1f} s"
        )
        print(f"   verdict: {sb['verdict']}")
        for st in sb["stages"]:
            rec = st["recommended"] or {}
            sp_best = max(spdl["stages"].get(st["name"], []), key=lambda s: s["qps"], default=None) if spdl else None
            gf = st["gil_fraction"]
            print(
                f"     {st['name']:>10}: {st['classification']:<14} GIL {(f'{gf:.2f}' if gf is not None else 'n/a'):>4}"
                f"  recommended {rec.get('executor')} x {rec.get('concurrency')} -> {fmt_q(rec.get('qps'), 0)}/s"
                + (
                    f"   (SPDL's best: threads x {sp_best['concurrency']} -> {fmt_q(sp_best['qps'], 0)}/s)"
                    if sp_best
                    else ""
                )
            )
    pred_err = naive_err = bounds_err = None
    if sb and sb["measured_qps"]:
        m = sb["measured_qps"]
        pred_err = (sb["predicted_qps"] - m) / m if sb["predicted_qps"] else None
        naive_err = (sb["naive_qps"] - m) / m if sb["naive_qps"] else None
        bounds_err = (sb["bounds_qps"] - m) / m if sb.get("bounds_qps") else None
        print(
            f"   prediction ({sb.get('method')}): {fmt_q(sb['predicted_qps'], 0)}/s; the bounds "
            f"{fmt_q(sb.get('bounds_qps'), 0)}/s ({sb['binding']} binds); naive min of stages "
            f"{fmt_q(sb['naive_qps'], 0)}/s; measured (validation run) {fmt_q(m, 0)}/s "
            f"[{fmt_q(sb['measured_low'], 0)}, {fmt_q(sb['measured_high'], 0)}]: error {fmt_pct(pred_err, 0)}% "
            f"(bounds {fmt_pct(bounds_err, 0)}%, naive {fmt_pct(naive_err, 0)}%)  "
            + ("within target" if pred_err is not None and abs(pred_err) <= PRED_TARGET else "OUTSIDE target")
        )
    elif sb and sb["measured_qps"] is None and sb["validation_error"] is None:
        print(f"   prediction ({sb.get('method')}): {fmt_q(sb['predicted_qps'], 0)}/s; no validation run (asked for)")
    elif sb:
        print(f"   no validation measurement: {sb['validation_error']}")
    ratio = t_sb / t_sp if (spdl and sb) else None
    if ratio is not None:
        print(f"   cost: stagebench / SPDL = {ratio:.2f}  " + ("(no slower)" if ratio <= COST_TARGET else "(SLOWER)"))
    print(flush=True)
    return {
        "pipeline": name,
        "what": PIPELINE_NOTES[name],
        "spdl_seconds": t_sp if spdl else None,
        "stagebench_seconds": t_sb if sb else None,
        "cost_ratio": ratio,
        "spdl": spdl
        and {
            "points": sp_points,
            "executors": ["thread"],
            "intervals": 0,
            "verdicts": 0,
            "report": None,
            "stages": spdl["stages"],
            "seconds_inside": spdl["seconds_inside"],
        },
        "stagebench": sb,
        "prediction_error": pred_err,
        "naive_error": naive_err,
        "bounds_error": bounds_err,
    }


if __name__ == "__main__":
    sys.exit(main())
