"""An ordinary data-parallel training script for the ranked tests: each rank its own DataLoader.

Run by torch's launcher (``python -m torch.distributed.run --standalone --nproc-per-node 2``). Each item
sleeps ``RANKED_SLEEP`` seconds (a known answer: n workers deliver n/d samples/s on any core count).
``RANKED_DDP=1``: the model is wrapped in DDP over gloo (every step an all-reduce). ``RANKED_FAULT``:
``raise1`` (rank 1's dataset raises on every item) or ``die1`` (rank 1's own process ends, exit 7, after
``RANKED_DIE_AFTER`` items it loaded itself, without workers). Each rank writes the steps its loop body ran to ``RANKED_STEPS/<rank>``.
"""

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).parent))
from loader_datasets import SleepDataset

RANK = int(os.environ.get("LOCAL_RANK", "0"))
FAULT = os.environ.get("RANKED_FAULT", "")


class RankData(SleepDataset):
    calls = 0

    def __getitem__(self, i: int):
        if RANK == 1 and FAULT == "raise1":
            raise ValueError("rank 1's shard is corrupt")
        RankData.calls += 1
        in_main = torch.utils.data.get_worker_info() is None  # the rank's own process, not a worker of its loader
        if (
            RANK == 1
            and FAULT == "die1"
            and in_main
            and RankData.calls > int(os.environ.get("RANKED_DIE_AFTER", "100"))
        ):
            os._exit(7)
        return super().__getitem__(i)


def main() -> None:
    ddp = os.environ.get("RANKED_DDP") == "1"
    if ddp:
        dist.init_process_group("gloo")
    ds = RankData(n=96, d=float(os.environ.get("RANKED_SLEEP", "0.005")))
    loader = DataLoader(ds, batch_size=4, num_workers=int(os.environ.get("RANKED_WORKERS", "0")))
    model: torch.nn.Module = torch.nn.Linear(4, 1)
    if ddp:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    steps = 0
    out = os.environ.get("RANKED_STEPS")
    for _ in range(1000):
        for x in loader:
            loss = model(x).sum()
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
