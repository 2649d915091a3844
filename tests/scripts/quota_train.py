"""A training script for the real-cgroup tests (tests/test_cgroups.py): two known-answer stages.

``hash`` computes sha256 over 1 MiB (C code that releases the GIL: it scales with the cores, and under a
CPU quota it flattens at the quota); ``gil`` runs a fixed pure-Python loop (it holds the GIL: threads
cannot scale it, whatever the cores). It knows nothing about stagebench or cgroups.
"""

import hashlib

from spdl.pipeline import PipelineBuilder

BLOB = bytes(1 << 20)
LOOPS = 40_000  # fixed work (about 2-4 ms of pure Python): never a wall-clock spin


def hash_blob(x):
    hashlib.sha256(BLOB).digest()
    return x


def hold_gil(x):
    acc = 0
    for i in range(LOOPS):
        acc += i ^ x
    return x


def main() -> None:
    b = PipelineBuilder().add_source(range(1000))
    b = b.pipe(hash_blob, concurrency=2, name="hash").pipe(hold_gil, concurrency=2, name="gil")
    pipeline = b.add_sink(4).build(num_threads=4)
    with pipeline.auto_stop():
        for _ in pipeline:
            pass


if __name__ == "__main__":
    main()
