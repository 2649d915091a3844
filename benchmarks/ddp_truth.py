"""The plain truth of ``ddp_jpeg_train.py`` at several ``num_workers`` in one launch of torchrun, in turns.

    torchrun --standalone --nproc-per-node 2 ddp_truth.py --data D --workers 0 1 2 3 --rounds 3 --out F

Each round runs every setting once (alternating direction), each setting the loaders alone and then the DDP
job, each the script's own loop (:func:`ddp_jpeg_train.host_rate`: a fresh DataLoader, its workers started
each epoch, and a fresh model), as a plain run of the script at that setting does. What a launch apart would
add is torchrun's and the ranks' start-up (~5 s a launch here), which no rate counts. Local rank 0 writes
``{"alone": {w: [rates]}, "job": {w: [rates]}}`` (the host's samples/s) to ``--out``.
Used by ``benchmarks/bench_ranks.py``; not part of stagebench.
"""

import argparse
import json
from pathlib import Path

import torch.distributed as dist
from ddp_jpeg_train import finish, host_rate, start


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--images", type=int, default=1200)
    p.add_argument("--workers", type=int, nargs="+", required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--skip", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    root = start(args.data, args.images)
    got: dict[str, dict[int, list[float]]] = {k: {w: [] for w in args.workers} for k in ("alone", "job")}
    for r in range(args.rounds):
        for w in args.workers if r % 2 == 0 else args.workers[::-1]:
            for kind in ("alone", "job"):
                rate = host_rate(
                    root,
                    workers=w,
                    batch_size=args.batch_size,
                    epochs=args.epochs,
                    skip=args.skip,
                    loader_only=kind == "alone",
                )
                got[kind][w].append(rate)
    if not dist.is_initialized() or dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps(got))
    finish()


if __name__ == "__main__":
    main()
