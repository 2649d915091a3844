"""Datasets with known answers for the loader-sweep tests (importable by worker processes).

* SleepDataset: each item sleeps ``d`` seconds (sleep releases the GIL and the
  CPU), so n workers deliver n/d samples/s and num_workers=0 delivers 1/d.
* TensorDataset-like ``CheapDataset``: in-memory tensors; moving batches between
  processes costs more than making them, so workers are slower than none.
* Faulty datasets: raise on one item, kill their worker, or hang.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import torch
from torch.utils.data import Dataset


class SleepDataset(Dataset):
    def __init__(self, n: int = 64, d: float = 0.01, transform=None) -> None:
        self.n = n
        self.d = d
        self.transform = transform

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        time.sleep(self.d)
        x = torch.full((4,), float(i))
        if self.transform is not None:
            x = self.transform(x)
        return x


class CheapDataset(Dataset):
    def __init__(self, n: int = 4096, dim: int = 256) -> None:
        self.data = torch.randn(n, dim)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int):
        return self.data[i]


class RaisingDataset(SleepDataset):
    def __getitem__(self, i: int):
        if i == 5:
            raise ValueError("item 5 is corrupt")
        return super().__getitem__(i)


def _in_worker(main_pid: int) -> bool:
    return os.getpid() != main_pid


def _worker_count() -> int:
    """Worker processes of this loader, as torch tells the worker itself.

    (Counting the parent's children is wrong in a test session: earlier tests
    leave other children, such as loky's reusable workers.)
    """
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    return info.num_workers if info is not None else 0


class KillWorkerDataset(SleepDataset):
    """Simulates the OOM killer: when the loader runs >= kill_at workers, a worker SIGKILLs itself."""

    def __init__(self, n: int = 64, d: float = 0.005, kill_at: int = 2) -> None:
        super().__init__(n, d)
        self.kill_at = kill_at
        self.main_pid = os.getpid()

    def __getitem__(self, i: int):
        if i % 8 == 7 and _in_worker(self.main_pid) and _worker_count() >= self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().__getitem__(i)


class HangingDataset(SleepDataset):
    """Hangs forever on item 3 inside a worker process."""

    def __init__(self, n: int = 64, d: float = 0.01) -> None:
        super().__init__(n, d)
        self.main_pid = os.getpid()

    def __getitem__(self, i: int):
        if i == 3 and _in_worker(self.main_pid):
            time.sleep(3600)
        return super().__getitem__(i)


def slow_worker_init(worker_id: int) -> None:
    """Worker start-up cost (an index, a connection): makes the epoch-boundary stall known."""
    time.sleep(0.4)


class Compose:
    """A torchvision-like Compose."""

    def __init__(self, transforms) -> None:
        self.transforms = transforms

    def __call__(self, x):
        for t in self.transforms:
            x = t(x)
        return x


def sleepy_transform(x):
    time.sleep(0.004)
    return x


def scale_transform(x):
    return x * 2.0


def make_sleep_dataset():
    """For 'module:factory' paths."""
    return SleepDataset(n=64, d=0.01)


#: A lock a dataset holds through each of its items, as torch's default random generator is held through
#: each draw (:class:`LockHoldingDataset`, :func:`lock_taking_worker_init`).
HELD = threading.Lock()


class LockHoldingDataset(SleepDataset):
    """Holds :data:`HELD` through each item (``d`` seconds): a worker forked meanwhile inherits it held."""

    def __getitem__(self, i: int):
        with HELD:
            return super().__getitem__(i)


def lock_taking_worker_init(worker_id: int) -> None:
    """Takes :data:`HELD` in a worker: one forked while another thread held it never gets it."""
    if not HELD.acquire(timeout=3.0):
        raise RuntimeError("the lock was held when this worker was forked")
    HELD.release()
