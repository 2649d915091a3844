"""Accuracy on known-answer stages: the truth, stagebench, and SPDL's built-in profiler, in one run.

Stages (``tests/_stages.py``: fixed work, never "spin until the clock says so"):
sleep 2 ms and 10 ms; a pure-Python spin of 2 ms (holds the GIL); spin 1 ms +
sleep 3 ms; hashlib over about 2 ms of bytes (CPU that releases the GIL).
Threads over a concurrency grid; the spin also on processes.

The truth: a reference loop at the same moment. Every point is bracketed by
the plainest closed loop that runs the stage with c lanes and no stagebench
code on the path, counted for half a budget right before and right after the
point (``_common.plain_threads_qps``: c threads; ``_common.plain_pool_qps``: c
spawned workers of a standard-library ``ProcessPoolExecutor``, one thread
keeping c items in flight as SPDL's event loop does). The truth is the mean of
the two readings and ``drift`` how far they moved apart: the machine's own
noise during that point. A point whose reference moved by more than the
target (5%) is measured again, up to ``--attempts`` times in all: the truth at
that moment is not known to within the target. The steadiest attempt is
judged; every attempt is saved (``attempts``). The rule reads the reference
only, never stagebench's reading. Why not first principles alone: this VM's cores change speed by about
2x in phases of seconds (``stagebench/_speed.py``), so a CPU-bound stage's own
cost, timed a few seconds away from the point, is not its cost during the
point (a 2 ms spin ran at 4.7 ms per call in one run's slow phase, and at 4
threads a plain loop read 309 items/s in one phase and 550 in the next).

The first-principles model is printed next to it (``model``, and the error
against it), as a cross-check that does not depend on any loop. Per-item costs
are measured in a plain loop in one thread (``_common.direct_cost``) right
before and after each point: t = wall time per item, cpu = CPU time per item,
g = t of the stage's spin alone (the GIL-held part; 0 for sleep and hashlib).
The harness's own costs come from its no-op stage in the same run: o =
per-item latency on that executor, 1 / (no-op ceiling at concurrency 1), and h
= CPU seconds per no-op item at the same concurrency. c lanes on k usable
cores then deliver

    threads:    min(c / (t + o),  1 / g,  k / (cpu + h))    (one GIL: g serialises)
    processes:  min(c / (t + o),  k / (cpu + h))            (a GIL per worker)

It is exact away from the knees of the min and with the cores free. It leaves
out waking threads (64 threads sleeping 2 ms wake 32,000 times a second, each
taking the GIL, which the hot no-op ceiling never pays), and it is wrong for
processes on this VM by more than the target: timed inside the worker the 2 ms
spin took 2.06-2.69 ms, a round trip after 2 ms of idling cost 0.65-1.2 ms
where the hot no-op's cost 0.5 ms, and at c >= k the model read 25-40% high (c
workers and the parent's dispatching share k cores).

stagebench: ``measure_stage`` (direct harness), ``--budget`` s window per point.
SPDL: ``spdl.pipeline.profile_pipeline`` on a one-stage pipeline, with SPDL's
default 1000 inputs; it profiles threads at concurrency 1, 4, 8, 16, 32 only
(other levels: n/a), timing each run from pipeline start to the last item.

Target: stagebench within 5% of the truth wherever the truth is below half of
the harness's no-op ceiling at that executor and concurrency.

``--smoke``: the 2 ms spin at one thread and one process and the spin + sleep stage at one thread,
0.2 s windows, one attempt, SPDL's profiler on 50 inputs: that the script runs to the end
(``tests/test_bench_smoke.py``), not a figure to read.

Usage: python benchmarks/bench_accuracy.py [--budget 1.0] [--spdl-inputs 1000] [--smoke] [--json OUT]
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import sys
from concurrent.futures import ProcessPoolExecutor

from _common import (
    _stages,
    direct_cost,
    fmt_pct,
    fmt_q,
    load_now,
    machine_line,
    plain_pool_qps,
    plain_threads_qps,
    rel_error,
    spdl_profile,
    usable_cores,
    write_json,
)

from stagebench import MeasureConfig, measure_stage
from stagebench.core._measure import identity

TARGET = 0.05
STEADY = TARGET  # a reference that moved more than this across a point does not pin the truth to the target


def _reference_pool(fn, c: int) -> ProcessPoolExecutor:
    """A standard-library pool of ``c`` spawned workers, each started and warm before it is timed."""
    pool = ProcessPoolExecutor(c, mp_context=multiprocessing.get_context("spawn"))
    for f in [pool.submit(fn, i) for i in range(4 * c)]:
        f.result()
    return pool


# (label, stage, spin-only twin giving g or None, thread levels, process levels)
def _cases():
    S = _stages
    return [
        ("sleep 2ms", S.Sleep(2.0), None, (1, 4, 16, 64), ()),
        ("sleep 10ms", S.Sleep(10.0), None, (1, 4, 16, 64), ()),
        ("spin 2ms (GIL)", S.Spin(2.0), "self", (1, 4, 16), (1, 2, 4)),
        ("spin 1ms+sleep 3ms", S.SpinSleep(1.0, 3.0), S.Spin(1.0), (1, 2, 16), ()),
        ("hashlib 2ms (no GIL)", S.HashCPU(2.0), None, (1, 2, 4), ()),
    ]


def truth_qps(executor: str, c: int, *, t: float, g: float, cpu: float, o: float, h: float, cores: int) -> float:
    """The truth model of the module docstring."""
    bounds = [c / (t + o)]
    if cpu + h > 0:
        bounds.append(cores / (cpu + h))
    if executor == "thread" and g > 0:
        bounds.append(1.0 / g)
    return min(bounds)


def _costs(fn, twin) -> tuple[float, float, float]:
    """(t, cpu, g) per item, timed directly."""
    cost = direct_cost(fn, seconds=0.3)
    g = cost.wall_s if twin == "self" else (direct_cost(twin, seconds=0.2).wall_s if twin is not None else 0.0)
    return cost.wall_s, cost.cpu_s, g


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=1.0, help="window per stagebench point, seconds")
    ap.add_argument("--spdl-inputs", type=int, default=1000, help="num_inputs for SPDL's profiler (its default)")
    ap.add_argument(
        "--attempts",
        type=int,
        default=3,
        help=f"tries per point while the reference moves by more than {STEADY:.0%} across it",
    )
    ap.add_argument("--json", default=None, help="write the table as JSON here")
    ap.add_argument("--only", default=None, help="run only the stages whose label contains this (e.g. 'spin 1ms')")
    ap.add_argument("--smoke", action="store_true", help="two stages at c=1, 0.2 s, one attempt: does it run (tests)")
    ns = ap.parse_args(argv)
    if ns.smoke:
        ns.budget, ns.attempts, ns.spdl_inputs = 0.2, 1, 50
    cores = usable_cores()
    cfg = MeasureConfig(budget_s=ns.budget, warmup_s=0.2, timeout_s=60)
    ceil_cfg = MeasureConfig(budget_s=max(0.3, ns.budget / 2), warmup_s=0.2, timeout_s=60)
    inputs = list(range(64))
    print(f"accuracy: {machine_line()}", flush=True)
    cases = [c for c in _cases() if ns.only is None or ns.only in c[0]]
    if ns.smoke:  # a stage with a spin twin of its own, one with another, and both executors
        cases = [(lb, fn, tw, th[:1], pr[:1]) for lb, fn, tw, th, pr in cases if lb.startswith("spin")]

    # the ceilings always cover c = 1 (the harness's latency o comes from it)
    levels = {
        "thread": sorted({1, *(c for *_, th, _p in cases for c in th)}),
        "process": sorted({1, *(c for *_, pr in cases for c in pr)}),
    }
    ceiling, h = {}, {}
    for ex, cs in levels.items():
        for c in cs:
            r = measure_stage(identity, inputs, executor=ex, concurrency=c, config=ceil_cfg).as_row()
            ceiling[(ex, c)] = r["qps"]
            h[(ex, c)] = r["cpu_s_per_item"] if math.isfinite(r["cpu_s_per_item"]) else 0.0
    o = {ex: 1.0 / ceiling[(ex, 1)] for ex in levels}
    print("no-op ceiling: " + ", ".join(f"{ex} c={c} {fmt_q(q, 0)}" for (ex, c), q in ceiling.items()), flush=True)
    print(
        f"harness latency o: thread {o['thread'] * 1e6:.1f} us, process {o['process'] * 1e6:.0f} us; "
        f"harness CPU per item h: process "
        + ", ".join(f"c={c} {h[('process', c)] * 1e6:.0f} us" for c in levels["process"])
        + "\n"
    )

    rows = []
    print(
        f"{'stage':>20} {'exec':>7} {'c':>3} {'truth':>9} {'drift%':>6} {'stagebench':>10} {'err%':>6} "
        f"{'ci95':>19} {'ceiling':>9} {'spdl_prof':>9} {'spdl_err%':>9}  within_target"
    )
    for label, fn, twin, th_levels, pr_levels in cases:
        spdl = spdl_profile(fn, name=label, num_inputs=ns.spdl_inputs)
        for ex, cs in (("thread", th_levels), ("process", pr_levels)):
            for c in cs:
                pool = _reference_pool(fn, c) if ex == "process" else None

                def reference() -> float:
                    if pool:
                        return plain_pool_qps(pool, fn, c, ns.budget / 2)
                    return plain_threads_qps(fn, c, ns.budget / 2)

                attempts = []
                try:
                    # Again while the reference moved by more than the target between its two
                    # readings: the truth at that moment is not known to within the target. The
                    # rule looks at the reference only, never at stagebench's reading.
                    while True:
                        before = _costs(fn, twin)
                        ref_a = reference()
                        r = measure_stage(fn, inputs, executor=ex, concurrency=c, config=cfg, name=label).as_row()
                        ref_b = reference()
                        after = _costs(fn, twin)
                        drift = abs(ref_b - ref_a) / ((ref_a + ref_b) / 2)
                        attempts.append(dict(before=before, after=after, ref_a=ref_a, ref_b=ref_b, r=r, drift=drift))
                        if drift <= STEADY or len(attempts) >= ns.attempts:
                            break
                finally:
                    if pool:
                        pool.shutdown()
                # the steadiest reference decides (the last one, unless an earlier one moved less)
                used = min(reversed(attempts), key=lambda a: a["drift"])
                before, after, ref_a, ref_b, r, drift = (
                    used[k] for k in ("before", "after", "ref_a", "ref_b", "r", "drift")
                )
                t, cpu, g = ((a + b) / 2 for a, b in zip(before, after))
                model = truth_qps(ex, c, t=t, g=g, cpu=cpu, o=o[ex], h=h[(ex, c)], cores=cores)
                truth = (ref_a + ref_b) / 2
                q = r["qps"] if r["status"] == "ok" else math.nan
                err = rel_error(q, truth)
                model_err = rel_error(q, model)
                sp = spdl.get(c) if ex == "thread" else None
                sp_err = rel_error(sp, truth)
                eligible = truth < 0.5 * ceiling[(ex, c)]
                ok = (err is not None and abs(err) <= TARGET) if eligible else None
                rows.append(
                    dict(
                        stage=label,
                        executor=ex,
                        c=c,
                        truth=truth,
                        truth_source="reference loop",
                        model=model,
                        model_rel_error=model_err,
                        reference=[ref_a, ref_b],
                        t_ms=t * 1e3,
                        g_ms=g * 1e3,
                        cpu_ms=cpu * 1e3,
                        drift=drift,
                        o_us=o[ex] * 1e6,
                        h_us=h[(ex, c)] * 1e6,
                        qps=q,
                        qps_low=r["qps_low"],
                        qps_high=r["qps_high"],
                        cores_used=r["cores_used"],
                        status=r["status"],
                        rel_error=err,
                        ceiling=ceiling[(ex, c)],
                        spdl_qps=sp,
                        spdl_rel_error=sp_err,
                        eligible=eligible,
                        within_target=ok,
                        load=load_now(),
                        attempts=[
                            dict(
                                reference=[a["ref_a"], a["ref_b"]],
                                drift=a["drift"],
                                qps=a["r"]["qps"] if a["r"]["status"] == "ok" else None,
                            )
                            for a in attempts
                        ],
                    )
                )
                print(
                    f"{label:>20} {ex:>7} {c:3d} {fmt_q(truth)} {fmt_pct(drift)} {fmt_q(q, 10)} {fmt_pct(err)} "
                    f"[{fmt_q(r['qps_low'], 8)},{fmt_q(r['qps_high'], 8)}] {fmt_q(ceiling[(ex, c)])} "
                    f"{fmt_q(sp)} {fmt_pct(sp_err, 9)}  "
                    + ("yes" if ok else ("NO" if ok is False else "n/a (near ceiling)"))
                    + f"  (reference {ref_a:,.0f} then {ref_b:,.0f}; model {model:,.0f}: {fmt_pct(model_err, 0).strip()}%)"
                    + (
                        f"  attempt {attempts.index(used) + 1} of {len(attempts)} (references moved "
                        + ", ".join(f"{a['drift']:.0%}" for a in attempts)
                        + ")"
                        if len(attempts) > 1
                        else ""
                    )
                    + ("" if r["status"] == "ok" else f"  {r['status']}: {r['reason']}"),
                    flush=True,
                )

    elig = [r for r in rows if r["eligible"] and r["rel_error"] is not None]
    worst = max((abs(r["rel_error"]) for r in elig), default=math.nan)
    met = sum(1 for r in elig if r["within_target"])
    steady = [r for r in elig if r["drift"] <= STEADY]
    met_steady = sum(1 for r in steady if r["within_target"])
    vs_model = [r for r in elig if r["model_rel_error"] is not None]
    met_model = sum(1 for r in vs_model if abs(r["model_rel_error"]) <= TARGET)
    paired = [r for r in rows if r["spdl_rel_error"] is not None and r["rel_error"] is not None]
    sb_mean = sum(abs(r["rel_error"]) for r in paired) / len(paired) if paired else math.nan
    sp_mean = sum(abs(r["spdl_rel_error"]) for r in paired) / len(paired) if paired else math.nan
    print(
        f"\nstagebench within {TARGET:.0%} at {met} of {len(elig)} eligible points; worst error {worst * 100:.1f}%; "
        f"at points whose reference moved <= {STEADY:.0%}: {met_steady} of {len(steady)}"
    )
    print(f"against the first-principles model instead: {met_model} of {len(vs_model)} within {TARGET:.0%}")
    print(
        f"mean |error| where both measured ({len(paired)} points): stagebench {sb_mean * 100:.1f}%, "
        f"SPDL profile_pipeline {sp_mean * 100:.1f}%"
    )
    print(f"({machine_line()})")
    write_json(
        ns.json,
        {
            "benchmark": "accuracy",
            "target_rel_error": TARGET,
            "budget_s": ns.budget,
            "spdl_num_inputs": ns.spdl_inputs,
            "cores": cores,
            "ceiling": {f"{e}/{c}": q for (e, c), q in ceiling.items()},
            "rows": rows,
            "eligible_points": len(elig),
            "within_target": met,
            "worst_rel_error": worst,
            "steady_threshold": STEADY,
            "attempts_max": ns.attempts,
            "points_measured_again": sum(1 for r in rows if len(r["attempts"]) > 1),
            "steady_points": len(steady),
            "within_target_steady": met_steady,
            "within_target_vs_model": met_model,
            "mean_abs_error_stagebench": sb_mean,
            "mean_abs_error_spdl": sp_mean,
            "met": bool(elig) and met == len(elig),
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
