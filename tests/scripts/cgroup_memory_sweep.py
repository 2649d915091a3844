"""The loader sweep of a copy-on-read dataset, for the real-cgroup memory test (tests/test_cgroups.py).

It builds the dataset (a Python list of tuples: each forked worker that reads it copies the pages it
touches), prints the bound on what a worker copies as one JSON line, waits for a line on stdin (the test
sets the group's memory limit then), and sweeps; the run directory is the first argument.
"""

import json
import sys
import time

import torch
from torch.utils.data import Dataset

import stagebench
from stagebench.loader._config import LoaderSweepConfig
from stagebench.loader._costs import copy_bound_mb, largest_container


class Records(Dataset):
    """``n`` (int, float, str) tuples in a list; an item waits 0.5 ms, so that workers add throughput."""

    def __init__(self, n: int) -> None:
        self.index = [(i, i * 0.5, f"k{i}") for i in range(n)]

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> torch.Tensor:
        a, b = self.index[i][:2]
        time.sleep(0.0005)
        return torch.tensor([a, b], dtype=torch.float64)


def main() -> None:
    run_dir, n = sys.argv[1], int(sys.argv[2])
    ds = Records(n)
    print(json.dumps({"bound_mb": copy_bound_mb(largest_container(ds), ds)}), flush=True)
    sys.stdin.readline()
    cfg = LoaderSweepConfig(budget_s=0.3, transforms=False, memory_share=1.0, tie_rounds=2, memory_pass_s=1.5)
    stagebench.sweep_dataset(
        ds, run_dir=run_dir, config=cfg, batch_size=64, shuffle=True, multiprocessing_context="fork"
    )


if __name__ == "__main__":
    main()
