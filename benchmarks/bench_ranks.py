"""A data-parallel job of N ranks on one host: stagebench's picks against the plain truth in turns (issue 57).

The script is an ordinary DDP one (``benchmarks/ddp_jpeg_train.py``: JPEG decoding in each rank's
DataLoader, DistributedSampler, a small CNN over gloo, one torch thread a rank), run by torch's own
launcher. The truth is the script's own loop, without stagebench, at each ``num_workers`` a rank, in turns
(each round every setting once, alternating direction): the loaders alone (the loop takes the batches
and trains nothing) and the DDP job, each as the host's samples/s (every rank's). All in one launch
(``ddp_truth.py``): 24 launches cost ~5 s of start-up each, which no rate counts.

Set beside the truth:

- stagebench's loader-alone pick, ``torchrun ... -m stagebench diagnose ddp_jpeg_train.py`` (``--runs`` times);
- its job pick, the same with ``--trainer`` (``--runs`` times);
- the advice one loader that owns the host gets (the same script on one rank: what rank 0 alone was
  told before ranks were measured together; ``--runs`` times);
- the rule of thumb ``cpu_count // ranks``.

Each pick's truth is given as a share of the best truth (the target: 95%, or the user's own setting kept
with "could not tell" where the truth ties within 5%). Also the diagnosis's wall time on N ranks against
one, the median of ``--runs`` each (aim: at most 1.2x, since the ranks are measured at the same time).

``--smoke``: 160 images, the truth one round at num_workers 2 (yours: the pick a diagnosis makes most
often, so its share is computed), and each diagnosis once in quick mode with a short trainer and job phase
(``SMOKE_ENV``): that the script runs to the end (``tests/test_bench_smoke.py``), not a figure to read.

Usage: python benchmarks/bench_ranks.py [--ranks 2] [--rounds 3] [--runs 3] [--workers 0 1 2 3] [--smoke] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import USER_CWD, fmt_q, machine_line, usable_cores, write_json

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "ddp_jpeg_train.py"
TRUTH = HERE / "ddp_truth.py"
TARGET = 0.95
#: The user's own setting the script is diagnosed at (its --workers).
YOURS = 2
#: --smoke: the diagnoses' settings (the quick preset, short trainer and job phases)
SMOKE_ENV = {"STAGEBENCH_QUICK": "on", "STAGEBENCH_TRAINER_S": "0.5", "STAGEBENCH_JOB_S": "2"}
#: --smoke: the script's data (its --images; the default is 1,200) and warm-up steps (--skip)
SMOKE_DATA = ["--images", "160", "--skip", "1"]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("STAGEBENCH_", "SPDL_PIPELINE_DIAGNOSTIC"))}


#: what every run of the script gets besides its own arguments (--smoke: SMOKE_DATA)
DATA_ARGS: list[str] = []
#: what every diagnosis gets in its environment (--smoke: SMOKE_ENV)
DIAGNOSE_ENV: dict[str, str] = {}


def _launch(ranks: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", *args]


def truth(ranks: int, data: Path, workers: list[int], rounds: int, tmp: Path) -> dict[str, dict[int, list[float]]]:
    """The script's plain truth at each setting in turns, in one launch (``ddp_truth.py``)."""
    out = tmp / "truth.json"
    args = [str(TRUTH), "--data", str(data), "--workers", *map(str, workers), "--rounds", str(rounds)]
    args += ["--epochs", "2", "--out", str(out), *DATA_ARGS]
    for _ in range(3):
        out.unlink(missing_ok=True)
        r = subprocess.run(_launch(ranks, *args), env=_env(), capture_output=True, text=True, timeout=1800)
        # torch's gloo at times aborts a rank at exit ("terminate called without an active exception"); the
        # rates are written once every run is over, so a file written is a truth measured to the end
        if out.exists():
            got = json.loads(out.read_text())
            return {k: {int(w): v for w, v in got[k].items()} for k in ("alone", "job")}
        print(f"  (the truth's launch ended {r.returncode} before its rates: {r.stderr.strip()[-200:]!r}; run again)")
    raise RuntimeError("the truth's launch failed 3 times")


def diagnose(ranks: int, data: Path, out: Path, *, trainer: bool) -> tuple[dict, float]:
    cmd = _launch(ranks, "-m", "stagebench", "diagnose", "--out", str(out))
    cmd += ["--trainer"] if trainer else []
    cmd += [str(SCRIPT), "--data", str(data), "--workers", str(YOURS), "--epochs", "1000", *DATA_ARGS]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=_env() | DIAGNOSE_ENV, capture_output=True, text=True, timeout=1800, cwd=USER_CWD)
    if r.returncode != 0:  # what it printed last, not a bare exit status
        tail = "\n".join((r.stdout + r.stderr).splitlines()[-20:])
        raise RuntimeError(f"stagebench diagnose on {ranks} rank(s) ended {r.returncode}:\n{tail}")
    return json.loads((out / "summary.json").read_text()), time.perf_counter() - t0


def picked(summary: dict) -> int:
    return int(summary["recommended"]["num_workers"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2, 3])
    ap.add_argument("--smoke", action="store_true", help="few images, one run each, quick: does it run (tests)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.smoke:
        args.rounds, args.runs, args.workers = 1, 1, [YOURS]
        DATA_ARGS[:] = SMOKE_DATA
        DIAGNOSE_ENV.update(SMOKE_ENV)
    print(machine_line() + f"; {args.ranks} ranks on this host")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        data = tmp / "jpegs"
        true = truth(args.ranks, data, args.workers, args.rounds, tmp)
        med = {k: {w: statistics.median(v) for w, v in true[k].items()} for k in true}
        print(f"\ntruth, host samples/s (median of {args.rounds} rounds in turns; each run's in brackets):")
        print(f"  {'num_workers a rank':>20} " + " ".join(f"{w:>22}" for w in args.workers))
        for k in ("alone", "job"):
            cells = [
                f"{fmt_q(med[k][w], 5)} ({', '.join(fmt_q(x, 1).strip() for x in true[k][w])})" for w in args.workers
            ]
            print(f"  {'loaders alone' if k == 'alone' else 'the DDP job':>20} " + " ".join(f"{c:>22}" for c in cells))
        best = {k: max(med[k], key=lambda w: med[k][w]) for k in med}
        results: dict = {"truth": {k: {str(w): v for w, v in true[k].items()} for k in true}, "picks": {}}

        def share(k: str, w: int) -> float | None:
            return med[k][w] / med[k][best[k]] if w in med[k] else None

        rows = []
        alone_s, ranked_s = [], []
        for i in range(args.runs):
            s, secs = diagnose(args.ranks, data, tmp / f"alone{i}", trainer=False)
            ranked_s.append(secs)
            rows.append(("stagebench, loader alone", picked(s), "alone", s["verdict"]))
        for i in range(args.runs):
            s, _ = diagnose(args.ranks, data, tmp / f"job{i}", trainer=True)
            rows.append(("stagebench --trainer", picked(s), "job", (s.get("job") or {}).get("text") or s["verdict"]))
        for i in range(args.runs):  # as many as on N ranks: the wall-time ratio's two sides are medians alike
            one, secs = diagnose(1, data, tmp / f"one{i}", trainer=False)
            alone_s.append(secs)
            rows.append(("one loader owning the host", picked(one), "alone", one["verdict"]))
        thumb = max(1, usable_cores() // args.ranks)
        rows.append(("cpu_count // ranks", thumb, "alone", ""))
        print(
            f"\npicks (num_workers a rank; yours: {YOURS}), each one's truth as a share of the best "
            f"(loaders alone: {best['alone']}, the job: {best['job']}):"
        )
        for who, w, k, verdict in rows:
            a, j = share("alone", w), share("job", w)
            mark = "meets" if (j if k == "job" else a) is not None and (j if k == "job" else a) >= TARGET else "MISSES"
            kept = w == YOURS and "could not tell" in verdict
            print(
                f"  {who:>28}: {w}  loaders alone {a:.1%}, the job {j:.1%}  "
                f"{'keeps yours, could not tell' if kept and mark == 'MISSES' else mark} the {TARGET:.0%} target"
                if a is not None and j is not None
                else f"  {who:>28}: {w} (not in the truth's settings)"
            )
            results["picks"].setdefault(who, []).append(
                {"num_workers": w, "alone_share": a, "job_share": j, "verdict": verdict}
            )
        ratio = statistics.median(ranked_s) / statistics.median(alone_s)
        print(
            f"\ndiagnosis wall time: {args.ranks} ranks {statistics.median(ranked_s):.1f} s (median of {len(ranked_s)}), "
            f"one rank {statistics.median(alone_s):.1f} s: {ratio:.2f}x (aim: at most 1.2x)"
        )
        results.update(wall_s_ranked=ranked_s, wall_s_one=alone_s, wall_ratio=ratio, ranks=args.ranks)
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
