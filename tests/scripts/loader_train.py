"""A tiny unmodified "training script": builds a DataLoader and loops over it.

Used by tests/test_loader_intercept.py: under stagebench's loader hook the loop
body must never run (it would write MARKER), the first loader iterated is
swept instead, and the process exits 0.
"""

import os
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).parent))
from loader_datasets import Compose, SleepDataset, scale_transform, sleepy_transform


def seed_worker(worker_id: int) -> None:
    torch.manual_seed(worker_id)


def main() -> None:
    marker = Path(os.environ["LOADER_TRAIN_MARKER"])
    ds = SleepDataset(n=48, d=0.005, transform=Compose([sleepy_transform, scale_transform]))
    val = DataLoader(SleepDataset(n=8, d=0.0), batch_size=2)  # built, never iterated: not the one caught
    if os.environ.get("LOADER_TRAIN_SPDL"):  # SPDL's PyTorch-style loader: it builds an SPDL pipeline inside
        from spdl.dataloader import get_pytorch_dataloader

        loader = get_pytorch_dataloader(ds, batch_size=6, num_workers=3)
    else:
        loader = DataLoader(ds, batch_size=6, shuffle=True, num_workers=3, worker_init_fn=seed_worker, drop_last=True)
    for epoch in range(2):
        for batch in loader:
            marker.write_text("the loop body ran")
            torch.sin(batch).sum()
    del val


if __name__ == "__main__":
    main()
