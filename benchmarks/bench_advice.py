"""Is the advice worth taking? The user's settings, each stage's own best and the joint choice, run whole.

For the demo pipeline and the reference pipelines (``_common.PIPELINES``), with
stagebench's **default** settings (nothing set: what a user runs):

1. diagnose the pipeline (in this process, as diagnostic mode does), or, with ``--summaries DIR``, take
   the advice of the diagnosis at the defaults already in ``DIR/<pipeline>-default/summary.json``
   (``run_all`` hands on ``bench_diagnosis``'s runs, minutes old, on the same code: a whole
   ``make bench`` does not diagnose the same pipelines at the same settings twice);
2. run the real pipeline three ways, in turns (Y A J J A Y, twice; the same
   warm-up and counting for each: :func:`stagebench.pipeline._wholerun.run_pipelines`):
   - **yours**: the settings written in the pipeline's code;
   - **alone**: each stage at its own best setting measured alone
     (``recommended_alone`` where the joint choice differs, else ``recommended``);
   - **joint**: the recommended settings (chosen together for the pipeline);
3. print each with its 95% interval, and whether joint beats the others beyond noise
   (intervals apart), ties, or loses.

Target (issue 21): joint at least as fast as yours within noise on every pipeline.
Workers and threads each setting uses are printed too: the joint choice should
get there with fewer.

``--smoke``: the demo pipeline only (64 images), diagnosed in quick mode (``STAGEBENCH_QUICK=on``), and
0.3 s windows after 0.2 s of warm-up: that the script runs to the end (``tests/test_bench_smoke.py``),
not a figure to read.

The exit status is 1 where a run of the real pipeline failed (the JSON is written all the same).

Usage: python benchmarks/bench_advice.py [--pipelines demo,gil_mix,...] [--window 6] [--summaries DIR] [--smoke]
       [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import PIPELINES, diagnosis_run, fmt_q, machine_line, write_json  # noqa: E402

SOURCE_ITEMS = 1_000_000  # range(): lazy


def _demo_config(tmp: Path, images: int = 200):
    from spdl.pipeline import PipelineBuilder

    from stagebench.pipeline._demo import DEMO_SCRIPT

    sys.path.insert(0, str(DEMO_SCRIPT.parent))
    import demo_train  # the bundled example: the same stages and settings as its main()

    paths = demo_train.make_dataset(tmp / "images", images)
    read, decode, augment, collate = demo_train.make_stages(0.004)
    return (
        PipelineBuilder()
        .add_source(paths)
        .pipe(read, concurrency=8, name="read")
        .pipe(decode, concurrency=4, name="decode")
        .pipe(augment, concurrency=4, name="augment")
        .aggregate(16)
        .pipe(collate, name="collate")
        .add_sink(4)
        .get_config()
    )


def _workers(settings: list[dict]) -> int:
    return sum(int(s.get("concurrency") or 0) for s in settings if s.get("executor") not in ("inline",))


def _verdict(a: dict, b: dict) -> str:
    """a against b: 'faster' / 'slower' beyond noise, else 'tie'."""
    if a.get("qps") is None or b.get("qps") is None:
        return "n/a"
    if a["qps_low"] > b["qps_high"]:
        return f"faster ({a['qps'] / b['qps']:.2f}x)"
    if a["qps_high"] < b["qps_low"]:
        return f"slower ({a['qps'] / b['qps']:.2f}x)"
    return f"tie ({a['qps'] / b['qps']:.2f}x)"


def bench_one(
    name: str, cfg, run_dir: Path, window_s: float, *, smoke: bool = False, summaries: Path | None = None
) -> dict:
    from stagebench.pipeline._diagnose import diagnose_pipeline
    from stagebench.pipeline._first_pass import read_source
    from stagebench.pipeline._isolate import plan_pipeline
    from stagebench.pipeline._settings import DiagnoseSettings
    from stagebench.pipeline._wholerun import run_pipelines

    # the defaults: what a user runs (--smoke: the quick preset)
    settings = DiagnoseSettings.from_env({"STAGEBENCH_QUICK": "on"} if smoke else {})
    given = diagnosis_run(summaries, name, "default") / "summary.json" if summaries is not None and not smoke else None
    if given is not None and given.is_file():
        summary = json.loads(given.read_text())
        print(f"\n{name}: the advice of {given}")
    else:
        summary = diagnose_pipeline(cfg, out=run_dir, settings=settings, show_table=False, report=False)
    joint, alone = {}, {}
    for st in summary.get("stages") or []:
        rec = st.get("recommended") or {}
        own = st.get("recommended_alone") or rec
        if st.get("type", "pipe") != "pipe" or not rec:
            continue
        joint[st["name"]] = (rec["executor"], int(rec["concurrency"]))
        alone[st["name"]] = (own["executor"], int(own["concurrency"]))
    plan = plan_pipeline(cfg)
    items = read_source(plan, settings.num_items).items
    k = float(
        next((s.get("items_per_input") for s in reversed(summary["stages"]) if s.get("items_per_input")), 1.0) or 1.0
    )
    out = run_pipelines(
        plan,
        items,
        joint,
        {"yours": None, "alone": None, "joint": None},
        warmup_s=0.2 if smoke else 1.0,
        window_s=window_s,
        timeout_s=60,
        items_per_sink_item=k,
        own_choices={"yours": {}, "alone": alone},
    )
    out = {r: res.to_json() for r, res in out.items()}  # each run's result as run.json holds it
    rec_vs = summary.get("recommended_vs_yours") or {}
    row = {
        "pipeline": name,
        "runs": {
            r: {key: out[r].get(key) for key in ("qps", "qps_low", "qps_high", "error")}
            | {"workers": _workers(out[r].get("settings") or [])}
            for r in out
        },
        "joint_vs_yours": _verdict(out["joint"], out["yours"]),
        "joint_vs_alone": _verdict(out["joint"], out["alone"]),
        "diagnosis_said": rec_vs.get("verdict"),
        "changed_by_joint": (summary.get("joint") or {}).get("changed"),
    }
    print(f"\n{name}")
    for r in ("yours", "alone", "joint"):
        x = out[r]
        q = (
            f"{fmt_q(x['qps'], 0)} ({fmt_q(x['qps_low'], 0)}-{fmt_q(x['qps_high'], 0)}) items/s"
            if x.get("qps") is not None
            else f"failed: {x.get('error')}"
        )
        used = ", ".join(
            f"{u['stage']} {u['executor'][0]}x{u['concurrency']}"
            for u in out[r].get("settings") or []
            if u.get("executor") != "inline"
        )
        row["runs"][r]["settings"] = used
        print(f"   {r:6s} {q:32s} workers+threads {row['runs'][r]['workers']:3d}: {used}")
    print(f"   joint vs yours: {row['joint_vs_yours']}; joint vs alone: {row['joint_vs_alone']}")
    print(f"   (the diagnosis itself said: {row['diagnosis_said']}; set apart from alone: {row['changed_by_joint']})")
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pipelines", default="demo," + ",".join(PIPELINES))
    ap.add_argument("--window", type=float, default=6.0, help="seconds of counting per setting")
    ap.add_argument(
        "--summaries",
        type=Path,
        default=None,
        help="take each pipeline's advice from DIR/<pipeline>-default/summary.json where there (bench_diagnosis's "
        "runs at the defaults); diagnose the others",
    )
    ap.add_argument("--smoke", action="store_true", help="the demo, quick mode, 0.3 s windows: does it run (tests)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.smoke:
        args.pipelines, args.window = "demo", 0.3
    print(machine_line())
    print(
        f"stagebench {'quick mode' if args.smoke else 'defaults'}; three settings of the real pipeline run whole, in turns"
    )
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.pipelines.split(","):
            cfg = (
                _demo_config(Path(tmp), 64 if args.smoke else 200) if name == "demo" else PIPELINES[name](SOURCE_ITEMS)
            )
            run_dir = Path(tmp) / f"run-{name}"
            rows.append(bench_one(name, cfg, run_dir, args.window, smoke=args.smoke, summaries=args.summaries))
    ok = sum(1 for r in rows if not r["joint_vs_yours"].startswith(("slower", "n/a")))
    failed = [f"{r['pipeline']} {k}" for r in rows for k, run in r["runs"].items() if run.get("qps") is None]
    print(f"\njoint at least as fast as yours (within noise) on {ok} of {len(rows)} pipelines")
    write_json(args.json, {"pipelines": rows, "joint_not_slower": ok, "of": len(rows), "failed": failed})
    if failed:
        print(f"FAILED: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
