"""An ordinary data-parallel SPDL script for the ranked tests: each rank its own pipeline over its shard.

Run by torch's launcher under diagnostic mode. The first stage sleeps ``RANKED_SLEEP`` seconds an item (a
known answer: c in flight deliver c/d items/s on any core count); then a short pure-Python stage and a
batch. ``RANKED_DDP=1``: the loop trains a model under DDP over gloo (every step an all-reduce). Each rank
writes the steps its loop body ran to ``RANKED_STEPS/<rank>``.
"""

import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from spdl.pipeline import PipelineBuilder

RANK = int(os.environ.get("RANK", "0"))
SLEEP = float(os.environ.get("RANKED_SLEEP", "0.01"))


def wait_io(x):
    time.sleep(SLEEP)
    return x


def python_work(x):
    acc = 0
    for i in range(2000):
        acc += i ^ x
    return x


def main() -> None:
    ddp = os.environ.get("RANKED_DDP") == "1"
    if ddp:
        dist.init_process_group("gloo")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    pipeline = (
        PipelineBuilder()
        .add_source(range(RANK, 10**7, world))
        .pipe(wait_io, concurrency=2, name="sleep")
        .pipe(python_work, concurrency=1, name="python")
        .aggregate(4)
        .add_sink(4)
        .build(num_threads=4)
    )
    model: torch.nn.Module = torch.nn.Linear(4, 1)
    if ddp:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    out = os.environ.get("RANKED_STEPS")
    steps = 0
    with pipeline.auto_stop():
        for batch in pipeline:
            loss = model(torch.tensor(batch, dtype=torch.float32)).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps += 1
            if out:
                Path(out, str(RANK)).write_text(str(steps))
    if ddp:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
