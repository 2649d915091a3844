"""An ordinary data-parallel training script, as a user writes one: JPEG decoding in each rank's DataLoader,
DistributedSampler, a small CNN under DDP over gloo, one torch thread a rank.

    torchrun --standalone --nproc-per-node 2 ddp_jpeg_train.py --data /tmp/ddp-jpegs --workers 2

``--timing FILE``: local rank 0 writes the host's samples/s (every rank's) after the first ``--skip`` steps.
``--loader-only``: the loop takes the batches and trains nothing (the loaders alone, every rank's at once).
Used by ``benchmarks/bench_ranks.py``; not part of stagebench.
"""

import argparse
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from PIL import Image
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


def make_data(root: Path, n: int) -> None:
    if (root / "done").exists():
        return
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        h, w = int(rng.integers(200, 320)), int(rng.integers(240, 400))
        base = rng.integers(0, 255, (h // 16 + 1, w // 16 + 1, 3)).astype(np.uint8)
        img = np.kron(base, np.ones((16, 16, 1), np.uint8))[:h, :w]
        img = np.clip(img + rng.normal(0, 25, img.shape), 0, 255).astype(np.uint8)
        Image.fromarray(img).save(root / f"{i:05d}.jpg", quality=90)
    (root / "done").write_text("ok")


class JpegFolder(Dataset):
    def __init__(self, root: Path) -> None:
        self.files = sorted(root.glob("*.jpg"))

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        with Image.open(self.files[i]) as im:
            im = im.convert("RGB").resize((96, 96))
            x = torch.from_numpy(np.asarray(im, dtype=np.uint8).copy()).permute(2, 0, 1).float().div_(255)
        return x, i % 10


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 16, 3, stride=2)
        self.c2 = nn.Conv2d(16, 32, 3, stride=2)
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        x = F.relu(self.c1(x))
        x = F.relu(self.c2(x))
        return self.fc(x.mean((2, 3)))


def host_rate(root: Path, *, workers: int, batch_size: int, epochs: int, skip: int, loader_only: bool) -> float:
    """One run of the loop: the host's samples/s (every rank's) after the first ``skip`` steps."""
    distributed = dist.is_initialized()
    ds = JpegFolder(root)
    sampler = DistributedSampler(ds) if distributed else None
    loader = DataLoader(
        ds,
        batch_size=batch_size,
        sampler=sampler,
        shuffle=sampler is None,
        num_workers=workers,
        drop_last=True,
    )
    model: nn.Module = Net()
    if distributed:
        model = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    step, seen, t0 = 0, 0, None
    for epoch in range(epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        for x, y in loader:
            if not loader_only:
                loss = F.cross_entropy(model(x), torch.as_tensor(y))
                opt.zero_grad()
                loss.backward()
                opt.step()
            step += 1
            if step == skip:
                t0 = time.perf_counter()
            elif step > skip:
                seen += x.shape[0]
    rate = torch.tensor([seen / (time.perf_counter() - t0) if t0 is not None else 0.0], dtype=torch.float64)
    if distributed:
        dist.all_reduce(rate)  # the host's samples/s: every rank's
    return float(rate.item())


def start(data: str, images: int) -> Path:
    """One torch thread a rank, the process group under torchrun, the data made once (by rank 0)."""
    torch.set_num_threads(1)
    distributed = "LOCAL_RANK" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    root = Path(data)
    if not distributed or dist.get_rank() == 0:
        make_data(root, images)
    if distributed:
        dist.barrier()
    return root


def finish() -> None:
    if dist.is_initialized():
        dist.barrier()  # no rank tears gloo down while another still talks to it
        dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="/tmp/ddp-jpegs")
    p.add_argument("--images", type=int, default=1200)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--skip", type=int, default=5)
    p.add_argument("--timing", default="")
    p.add_argument("--loader-only", action="store_true")
    args = p.parse_args()
    root = start(args.data, args.images)
    rate = host_rate(
        root,
        workers=args.workers,
        batch_size=args.batch_size,
        epochs=args.epochs,
        skip=args.skip,
        loader_only=args.loader_only,
    )
    if args.timing and (not dist.is_initialized() or dist.get_rank() == 0):
        Path(args.timing).write_text(f"{rate}\n")
    finish()


if __name__ == "__main__":
    main()
