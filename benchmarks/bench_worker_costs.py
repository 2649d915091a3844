"""What each worker costs: the first batch against the sum of its parts, and what measuring it costs a sweep.

The dataset is the issue's (38): an ImageNet-like folder of file paths held as a Python list of str
(``--paths``, 1.5M by default: a ~90 MB pickle), read by a torch DataLoader whose workers start by
``forkserver`` (Python 3.14's default on Linux; ``spawn`` on macOS and Windows behaves the same here),
batch 256, shuffled.

1. **The first batch against the sum of its parts**, at 1, 2 and 4 workers, each measured as a sweep
   point measures it (``measure_loader_point``, no epoch stall), big and bare (1,000 paths: nothing
   worth shipping) in turns. torch asks no worker for a batch before every worker has started, so the
   first batch is the last worker's start (``workers_start_last_s``: waiting to be created, then its
   own boot), its ``worker_init_fn``, the first batch's own work (the bare loader's, where no worker
   waits for the others) and its delivery; the sum is set against the first batch as the main
   process's clock reads it (from building the loader). Target: within 25%.

   The shipping is set against it too: the estimate from pickling and loading the user's objects
   (:func:`stagebench.loader._costs.shipping_cost`, ``num_workers x pickle_s + unpickle_s``) and what
   the dataset added to the last worker's start (big against bare).
2. **What the measurement costs a sweep**: the loader searched at stagebench's defaults
   (``LoaderSweepConfig(transforms=False)``, ``num_workers`` 0, 1, 2, 4), the shipping measurement and
   the memory pass timed inside it (``run.json["worker_costs"]``), against the sweep's own time.
   Target: under 10%.

``--smoke``: 2,000 paths, one worker and one turn in part 1, num_workers 0 and 1 with short windows in
part 2: that the script runs to the end (``tests/test_bench_smoke.py``), not a figure to read.

Usage: python benchmarks/bench_worker_costs.py [--paths 1500000] [--smoke] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from _common import SMOKE_SWEEP, machine_line, write_json
from torch.utils.data import Dataset

from stagebench import LoaderKnobs, LoaderSweepConfig, run_loader_sweep
from stagebench.loader._costs import shipping_cost
from stagebench.loader._intercept import make_loader_factory
from stagebench.loader._point import measure_loader_point

SUM_TARGET = 0.25
COST_TARGET = 0.10
LEVELS = (1, 2, 4)
#: --smoke: the sweep's short windows and memory pass, and one round of its tie-break
SMOKE_CFG = SMOKE_SWEEP


class Paths(Dataset):
    """An ImageNet-like folder: file paths held as a Python list of str (or, ``as_numpy``, bytes array)."""

    def __init__(self, n: int, as_numpy: bool = False) -> None:
        paths = [f"/datasets/imagenet/train/n{i % 1000:08d}/n{i % 1000:08d}_{i:07d}.JPEG" for i in range(n)]
        self.paths: list[str] | np.ndarray = np.array(paths).astype("S") if as_numpy else paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([len(self.paths[i])], dtype=torch.float32)


def _factory(n: int):
    return make_loader_factory(Paths(n), batch_size=256, shuffle=True, multiprocessing_context="forkserver")


def first_batches(n: int, levels: tuple[int, ...] = LEVELS, turns: int = 2) -> list[dict]:
    big, bare = _factory(n), _factory(1000)
    ship = shipping_cost(big, backend="torch")
    cfg = LoaderSweepConfig(budget_s=0.5, timeout_s=120, transforms=False)
    out = []
    for nw in levels:
        knobs = LoaderKnobs(num_workers=nw, prefetch_factor=2)
        rows: dict[str, list[dict]] = {"bare": [], "big": []}
        order = (("bare", bare), ("big", big), ("big", big), ("bare", bare))  # in turns
        for which, f in order[: 2 * turns]:
            rows[which].append(measure_loader_point(f, knobs, config=cfg, cuda=False, stall=False).as_row())
        for i, (row, base) in enumerate(zip(rows["big"], rows["bare"])):
            parts = {
                "workers_start_last_s": row["workers_start_last_s"],
                "worker_init_s": row["worker_init_s"],
                "own_work_s": base["first_batch_work_s"],
                "first_delivery_s": row["first_delivery_s"],
            }
            total = sum(parts.values())
            measured = row["time_to_first_batch_s"]
            out.append(
                {
                    "num_workers": nw,
                    "turn": i + 1,
                    "measured_first_batch_s": measured,
                    **parts,
                    "workers_created_s": row.get("workers_created_s"),
                    "worker_boot_s": row.get("worker_boot_s"),
                    "sum_of_parts_s": total,
                    "sum_error": (total - measured) / measured,
                    "shipping_estimate_s": nw * ship.pickle_s + ship.unpickle_s,
                    "shipping_added_s": row["workers_start_last_s"] - base["workers_start_last_s"],
                }
            )
    return [{"shipping": {k: getattr(ship, k) for k in ("start_method", "mb", "pickle_s", "unpickle_s")}}, *out]


def sweep_cost(n: int, smoke: bool = False) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        summary = run_loader_sweep(
            _factory(n),
            name="paths",
            backend="torch",
            batch_size=256,
            config=LoaderSweepConfig(num_workers=(0, 1), transforms=False, **SMOKE_CFG)
            if smoke
            else LoaderSweepConfig(num_workers=(0, 1, 2, 4), transforms=False),
            run_dir=Path(tmp) / "run",
        )
        total = time.perf_counter() - t
        meta = json.loads((Path(tmp) / "run" / "run.json").read_text())
    wc = meta.get("worker_costs") or {}
    mem = wc.get("memory") or {}
    # the shipping measurement, and a memory pass of its own, are in wc["seconds"]; a pass on the stall
    # point's workers is timed in mem["seconds"]
    extra = wc.get("seconds", 0.0) + (mem.get("seconds", 0.0) if wc.get("memory_on_stall_point") else 0.0)
    return {
        "sweep_s": total,
        "worker_costs_s": extra,
        "share": extra / total,
        "pick": summary["recommended"],
        "verdict": summary["verdict"],
        "findings": [f["title"] for f in summary["findings"]],
    }


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--paths", type=int, default=1_500_000)
    ap.add_argument("--smoke", action="store_true", help="2,000 paths, few workers, short windows: does it run (tests)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.smoke:
        args.paths = 2000
    print(machine_line())
    levels, turns = ((1,), 1) if args.smoke else (LEVELS, 2)
    ship, *rows = first_batches(args.paths, levels, turns)
    s = ship["shipping"]
    print(
        f"\n{args.paths:,} paths under {s['start_method']}: {s['mb']:.1f} MB pickled, "
        f"{s['pickle_s']:.2f} s to pickle, {s['unpickle_s']:.2f} s to load"
    )
    print(
        f"{'workers':>7} {'first batch':>11} {'last start':>10} {'(created':>8} {'boot)':>6} {'init':>5} "
        f"{'work':>5} {'deliv':>5} {'sum':>6} {'err':>5} {'ship est':>8} {'added':>6}"
    )
    for r in rows:
        print(
            f"{r['num_workers']:>7} {r['measured_first_batch_s']:>10.2f}s {r['workers_start_last_s']:>9.2f}s "
            f"{r['workers_created_s']:>7.2f}s {r['worker_boot_s']:>5.2f}s {r['worker_init_s']:>4.2f}s "
            f"{r['own_work_s']:>4.2f}s {r['first_delivery_s']:>4.2f}s {r['sum_of_parts_s']:>5.2f}s "
            f"{r['sum_error']:>+5.0%} {r['shipping_estimate_s']:>7.2f}s {r['shipping_added_s']:>5.2f}s"
        )
    within = sum(abs(r["sum_error"]) <= SUM_TARGET for r in rows)
    print(f"sum of the parts within {SUM_TARGET:.0%} of the first batch: {within} of {len(rows)}")
    cost = sweep_cost(args.paths, args.smoke)
    print(
        f"\nsweep at the defaults: {cost['sweep_s']:.1f} s, of which the worker costs {cost['worker_costs_s']:.1f} s "
        f"({cost['share']:.0%}; target under {COST_TARGET:.0%})\n  {cost['verdict']}"
    )
    for f in cost["findings"]:
        print(f"  - {f}")
    if args.json:
        write_json(
            args.json,
            {
                "paths": args.paths,
                "shipping": s,
                "first_batch": rows,
                "sum_within_target": within,
                "sweep": cost,
                "targets": {"sum_error": SUM_TARGET, "sweep_share": COST_TARGET},
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
