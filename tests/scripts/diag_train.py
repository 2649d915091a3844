"""An unmodified 'training script' for the diagnostic-mode tests.

It builds an SPDL pipeline with a sleep stage (waits: scales with concurrency),
a GIL-holding stage (a fixed pure-Python loop count: threads cannot scale it),
an async stage and a lambda, then trains: the loop body writes a marker file,
so a test can tell whether the loop ran. It knows nothing about stagebench.
"""

import argparse
import asyncio
import time
from pathlib import Path

from spdl.pipeline import PipelineBuilder

LOOPS = 40_000  # fixed work (about 2-4 ms of pure Python): never a wall-clock spin


def wait_io(x):
    time.sleep(0.01)
    return x


def hold_gil(x):
    acc = 0
    for i in range(LOOPS):
        acc += i ^ x
    return x


async def fetch(x):
    await asyncio.sleep(0.005)
    return x


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--marker", required=True)
    p.add_argument("--items", type=int, default=1000)
    p.add_argument(
        "--mode", default="normal", choices=["normal", "empty", "raising-source", "short-source", "failing-stage"]
    )
    args = p.parse_args()

    def source():
        for i in range(args.items):
            if args.mode == "raising-source" and i == 3:
                raise ValueError("cannot open shard 3")
            yield i

    def broken(x):
        raise RuntimeError(f"corrupt record {x}")

    b = PipelineBuilder().add_source(source())
    if args.mode == "failing-stage":
        b = b.pipe(broken, concurrency=2, name="broken").pipe(wait_io, name="after-broken")
    elif args.mode != "empty":
        b = (
            b.pipe(wait_io, concurrency=4, name="sleep io")
            .pipe(hold_gil, concurrency=2, name="gil")
            .pipe(fetch, concurrency=8)
            .pipe(lambda x: x + 1, concurrency=1)
        )
    pipeline = b.add_sink(4).build(num_threads=4)

    marker = Path(args.marker)
    with pipeline.auto_stop():
        for step, item in enumerate(pipeline):
            marker.write_text(f"trained on {step + 1} items\n")
    print(f"training done: {marker.read_text().strip()}")


if __name__ == "__main__":
    main()
