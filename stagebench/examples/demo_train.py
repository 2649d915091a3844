"""A small image-classification "training script" built on an SPDL pipeline.

This is an ordinary user script: it knows nothing about stagebench. Run it as
is and it trains (a stand-in model: each step takes ``--step-ms``, as a forward
and backward pass on an accelerator would, and the loop prints a loss). Run it
with ``SPDL_PIPELINE_DIAGNOSTIC_MODE=1`` (or ``stagebench diagnose``, or
``stagebench demo``) and, with stagebench installed, the pipeline is diagnosed
instead; the loop runs only where the diagnosis is asked to measure the
training step (``STAGEBENCH_TRAINER=measure``, which ``stagebench demo`` sets).

The pipeline has the shape of a real image loader, with stages that are
limited by different things:

- ``read``: fetch the encoded bytes. Training data usually lives on network
  storage; ``--storage-latency-ms`` simulates its per-request latency (a
  sleep), so this stage waits and scales with concurrency.
- ``decode``: JPEG decode and resize with Pillow (C code that releases the GIL).
- ``augment``: a hand-written pure-Python colour jitter over a grid of pixels
  (holds the GIL for all of its work, as Python-level augmentations do).
- ``batch`` (aggregate) and ``collate``: stack a batch and normalise with numpy.

The images are generated on first use (deterministic, Pillow + numpy).
"""

from __future__ import annotations

import argparse
import io
import random
import time
from pathlib import Path

import numpy as np
from PIL import Image
from spdl.pipeline import PipelineBuilder

SIZE = 128  # training resolution
GRID = 40  # augment touches a GRID x GRID lattice of pixels in pure Python


def make_dataset(root: Path, n: int, seed: int = 0) -> list[Path]:
    """n JPEGs of varied size and content under root (kept between runs)."""
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        path = root / f"img_{i:05d}.jpg"
        paths.append(path)
        if path.exists():
            continue
        rng = np.random.default_rng(seed * 100_003 + i)
        w, h = int(rng.integers(200, 360)), int(rng.integers(160, 300))
        base = rng.integers(0, 256, size=(h // 8 + 1, w // 8 + 1, 3), dtype=np.uint8)
        img = Image.fromarray(base).resize((w, h), Image.Resampling.BILINEAR)
        grain = rng.integers(-12, 13, size=(h, w, 3))
        arr = np.clip(np.asarray(img, dtype=np.int16) + grain, 0, 255).astype(np.uint8)
        tmp = path.with_suffix(".tmp")
        Image.fromarray(arr).save(tmp, format="JPEG", quality=90)
        tmp.replace(path)
    return paths


def make_stages(latency_s: float):
    def read(path: Path) -> bytes:
        time.sleep(latency_s)  # network storage round trip
        return path.read_bytes()

    def decode(data: bytes) -> np.ndarray:
        img: Image.Image = Image.open(io.BytesIO(data))
        img.draft("RGB", (SIZE * 2, SIZE * 2))
        img = img.convert("RGB").resize((SIZE, SIZE), Image.Resampling.BILINEAR)
        return np.asarray(img)

    def augment(img: np.ndarray) -> np.ndarray:
        # Colour jitter written the way quick research code often is: Python
        # loops over pixels. Fixed work per image, all of it under the GIL.
        step = SIZE // GRID
        rows = img[::step, ::step].tolist()
        gain = [1.0 + 0.1 * ((i * 7919) % 11 - 5) / 5 for i in range(3)]
        total = 0.0
        for row in rows:
            for px in row:
                for ch in range(3):
                    v = px[ch] * gain[ch]
                    total += v if v < 255.0 else 255.0
        brightness = total / (len(rows) * len(rows[0]) * 3 * 255.0)
        return img if brightness > 0.02 else img[::-1]

    def collate(batch: list[np.ndarray]) -> np.ndarray:
        x = np.stack(batch).astype(np.float32) / 255.0
        return (x - 0.45) / 0.225

    return read, decode, augment, collate


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="stagebench-demo-data", help="image folder (generated if missing)")
    p.add_argument("--images", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--storage-latency-ms", type=float, default=4.0)
    p.add_argument("--step-ms", type=float, default=100.0, help="time of one training step (the stand-in model)")
    args = p.parse_args()

    paths = make_dataset(Path(args.data), args.images)
    read, decode, augment, collate = make_stages(args.storage_latency_ms / 1000)

    for epoch in range(args.epochs):
        random.Random(epoch).shuffle(paths)
        builder: PipelineBuilder[Path, np.ndarray] = PipelineBuilder()
        pipeline = (
            builder.add_source(paths)
            .pipe(read, concurrency=8, name="read")
            .pipe(decode, concurrency=4, name="decode")
            .pipe(augment, concurrency=4, name="augment")
            .aggregate(args.batch_size)
            .pipe(collate, name="collate")
            .add_sink(4)
            .build(num_threads=8)
        )
        t0 = time.perf_counter()
        seen = 0
        with pipeline.auto_stop():
            for step, batch in enumerate(pipeline):
                seen += len(batch)
                loss = float(np.abs(batch).mean())  # the "model"
                time.sleep(args.step_ms / 1000)  # its forward and backward pass, on an accelerator
                if step % 50 == 0:
                    print(f"epoch {epoch} step {step:4d} loss {loss:.4f}", flush=True)
        dt = time.perf_counter() - t0
        print(f"epoch {epoch}: {seen} images in {dt:.1f} s ({seen / dt:.0f} images/s)", flush=True)


if __name__ == "__main__":
    main()
