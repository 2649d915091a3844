"""Shared pieces of the benchmarks: known-answer stages, direct timing, SPDL's profiler, output.

The known-answer stages are the test suite's (``tests/_stages.py``: fixed
work, calibrated once per process; picklable, so process workers run the same
work). ``tests/`` goes on ``sys.path`` rather than being imported by file
location, so that process workers, which inherit the path, can unpickle the
stages by reference.

:func:`direct_cost` times a stage in a plain loop in this thread, with no
harness at all: the per-item costs every truth model starts from are measured
independently of the instrument under test. :func:`spdl_profile` is SPDL's own
public profiler, run as SPDL's diagnostic mode runs it.

Reference pipelines (:data:`PIPELINES`) are the ones the diagnosis and
prediction benchmarks share; each is a function building a fresh
``PipelineConfig`` over ``n`` source items.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "tests") not in sys.path:
    sys.path.insert(0, str(ROOT / "tests"))

import _stages  # noqa: E402  (tests/_stages.py: the known-answer stages)

#: Where stagebench's child processes run. ``python -m stagebench`` imports from the current folder
#: first: from the repository's root that is the source tree, not the installed package users run, and
#: where bytecode is not written (PYTHONDONTWRITEBYTECODE=1 here) every run compiles its 150 modules
#: again: 0.2 s more start-up a diagnosis (1.5 against 1.3 s of imports, three runs each).
USER_CWD = tempfile.gettempdir()

#: Where ``bench_diagnosis`` keeps its stagebench runs, one folder ``<pipeline>-<mode>`` each (their
#: reports, for a look); ``bench_advice`` takes the defaults' advice from there under ``run_all``.
DIAGNOSIS_RUNS = ROOT / "reports" / "bench-runs" / "diagnosis"


def diagnosis_run(runs: Path, pipeline: str, mode: str) -> Path:
    """The folder of ``bench_diagnosis``'s stagebench run of ``pipeline`` in ``mode`` under ``runs``."""
    return runs / f"{pipeline}-{mode}"


__all__ = [
    "ROOT",
    "USER_CWD",
    "DIAGNOSIS_RUNS",
    "diagnosis_run",
    "_stages",
    "DirectCost",
    "direct_cost",
    "plain_threads_qps",
    "plain_pool_qps",
    "spdl_profile",
    "rel_error",
    "machine_line",
    "load_now",
    "usable_cores",
    "write_json",
    "fmt_pct",
    "fmt_q",
    "PIPELINES",
    "PIPELINE_NOTES",
    "LABEL_TRUTH",
    "SPDL_DEFAULT_NUM_INPUTS",
]

#: SPDL's own default number of source items for its diagnostic mode.
SPDL_DEFAULT_NUM_INPUTS = 1000


@dataclass(frozen=True, slots=True)
class DirectCost:
    """Per-item costs of a stage timed in a plain loop in one thread (no harness)."""

    wall_s: float
    """Mean wall time per item: what one lane of a closed loop can do at best."""
    cpu_s: float
    """Mean CPU time of this thread per item (GIL-releasing C code included)."""
    items: int


#: --smoke for a loader sweep (bench_loader_search, bench_worker_costs): short windows and memory pass, one
#: round of the tie-break; that the script runs to the end, not a figure to read
SMOKE_SWEEP: dict[str, Any] = {
    "budget_s": 0.3,
    "min_window_s": 0.1,
    "warmup_s": 0.1,
    "min_batches": 4,
    "tie_rounds": 1,
    "memory_pass_s": 0.5,
}


def direct_cost(fn: Callable[[Any], Any], seconds: float = 0.4, min_items: int = 20) -> DirectCost:
    """Time ``fn`` over a plain loop for about ``seconds`` (at least ``min_items`` calls).

    The mean, not the median: throughput is items over total time, so a rare
    slow call (a preemption on a busy machine) counts as much as it costs.
    """
    fn(0)  # first call: lazily built buffers, imports
    n = 0
    c0, t0 = time.thread_time(), time.perf_counter()
    while n < min_items or time.perf_counter() - t0 < seconds:
        fn(n)
        n += 1
    wall = time.perf_counter() - t0
    cpu = time.thread_time() - c0
    return DirectCost(wall_s=wall / n, cpu_s=cpu / n, items=n)


def plain_threads_qps(fn: Callable[[Any], Any], lanes: int, seconds: float, warmup: float = 0.2) -> float:
    """Items/s of the plainest closed loop on threads: ``lanes`` threads, each calling ``fn`` again as soon as it returns.

    The reference the thread points are held to (``bench_accuracy``), counted
    at the same moment as the point (right before and right after), so the
    host's speed phases, which move a CPU-bound stage's own cost by up to 2x
    within seconds, are the same for both. No stagebench code on the path:
    each thread logs (start, end) and an item counts by the share of it that
    falls in the window, which opens after ``warmup`` and once every thread has
    finished an item.
    """
    import threading

    stop = threading.Event()
    logs: list[list[tuple[float, float]]] = [[] for _ in range(lanes)]

    def lane(k: int) -> None:
        log, i, now = logs[k], k, time.perf_counter
        while not stop.is_set():
            t0 = now()
            fn(i)
            log.append((t0, now()))
            i += lanes

    threads = [threading.Thread(target=lane, args=(k,), daemon=True) for k in range(lanes)]
    for t in threads:
        t.start()
    time.sleep(warmup)
    while not all(logs):
        time.sleep(0.005)
    a = time.perf_counter()
    time.sleep(seconds)
    b = time.perf_counter()
    stop.set()
    for t in threads:
        t.join()
    n = sum((min(e, b) - max(s, a)) / (e - s) for log in logs for s, e in log if e > a and s < b and e > s)
    return n / (b - a)


def plain_pool_qps(pool: Any, fn: Callable[[Any], Any], lanes: int, seconds: float) -> float:
    """Items/s of the plainest closed loop on ``pool``: ``lanes`` items in flight, each replaced as it completes.

    The reference the process points are held to (``bench_accuracy``): what a
    standard-library pool delivers for ``fn`` with c workers, no stagebench
    code on the path. One thread keeps the c items in flight, as SPDL's event
    loop does (c threads each waiting on one item read up to 16% lower at c = 4
    on 2 cores: their wake-ups compete with the workers for the cores). Items in
    flight when the window closes are waited for; the wall time runs to the last.
    """
    import concurrent.futures as cf

    stop = time.perf_counter() + seconds
    t0 = time.perf_counter()
    pending = {pool.submit(fn, i) for i in range(lanes)}
    n, k = 0, lanes
    while pending:
        done, pending = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
        n += len(done)
        if time.perf_counter() < stop:
            for _ in done:
                pending.add(pool.submit(fn, k))
                k += 1
    return n / (time.perf_counter() - t0)


def spdl_profile(fn: Callable[[Any], Any], *, name: str, num_inputs: int = SPDL_DEFAULT_NUM_INPUTS) -> dict[int, float]:
    """QPS per concurrency from ``spdl.pipeline.profile_pipeline`` (concurrency 1, 4, 8, 16, 32)."""
    from spdl.pipeline import profile_pipeline
    from spdl.pipeline.defs import Pipe, PipelineConfig, SinkConfig, SourceConfig

    logging.getLogger("spdl").setLevel(logging.ERROR)
    cfg = PipelineConfig(src=SourceConfig(range(num_inputs)), pipes=[Pipe(fn, name=name)], sink=SinkConfig(10))
    results = profile_pipeline(cfg, num_inputs=num_inputs)
    return {s.concurrency: float(s.qps) for s in results[0].stats}


def rel_error(measured: float | None, truth: float | None) -> float | None:
    if measured is None or truth is None or not (math.isfinite(measured) and math.isfinite(truth)) or truth <= 0:
        return None
    return (measured - truth) / truth


def second_tenant() -> Any:
    """A process spinning on one core, as a shared host's other tenant, until this benchmark's process
    is gone: it checks its parent, so a benchmark killed with no chance to clean up leaves no spinner
    behind to slow every later run (one did, for ten minutes of timings)."""
    import subprocess

    spin = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    pass\n"
    return subprocess.Popen([sys.executable, "-c", spin])


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def machine_line() -> str:
    """Cores and load average now: every table is read against the load it ran under."""
    la = os.getloadavg()
    return f"{usable_cores()} usable cores, load average {la[0]:.1f} {la[1]:.1f} {la[2]:.1f}"


def load_now() -> float:
    return round(os.getloadavg()[0], 2)


def write_json(path: str | os.PathLike | None, data: dict[str, Any]) -> None:
    if not path:
        return
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)

    def clean(x: Any) -> Any:  # NaN/inf are not JSON
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return x

    p.write_text(json.dumps(clean(data), indent=2) + "\n")


def fmt_pct(x: float | None, width: int = 6) -> str:
    return f"{x * 100:{width}.1f}" if x is not None else f"{'n/a':>{width}}"


def fmt_q(x: float | None, width: int = 9) -> str:
    if x is None or not math.isfinite(x):
        return f"{'n/a':>{width}}"
    return f"{x:{width},.0f}" if x >= 100 else f"{x:{width}.1f}"


# ------------------------------------------------------------------ reference pipelines
def _pipeline(n: int, stages: list[tuple[str, Callable[[Any], Any], int]]):
    from spdl.pipeline.defs import Pipe, PipelineConfig, SinkConfig, SourceConfig

    return PipelineConfig(
        src=SourceConfig(range(n)),
        pipes=[Pipe(fn, concurrency=c, name=name) for name, fn, c in stages],
        sink=SinkConfig(32),
    )


def gil_mix(n: int):
    """The issue's GIL example: 1 ms GIL-holding, 5 ms sleep, 0.5 ms GIL + 2 ms sleep."""
    S = _stages
    return _pipeline(
        n, [("tokenize", S.Spin(1.0), 4), ("fetch", S.Sleep(5.0), 16), ("mixed", S.SpinSleep(0.5, 2.0), 8)]
    )


def sleep_chain(n: int):
    """Waiting only (reads, remote calls): 2 ms, 10 ms and 1 ms sleeps."""
    S = _stages
    return _pipeline(n, [("list", S.Sleep(2.0), 4), ("download", S.Sleep(10.0), 16), ("stat", S.Sleep(1.0), 2)])


def cpu_free(n: int):
    """CPU that releases the GIL: a 1 ms read, 2 ms of hashlib, 0.2 ms of Python."""
    S = _stages
    return _pipeline(n, [("read", S.Sleep(1.0), 4), ("checksum", S.HashCPU(2.0), 2), ("label", S.Spin(0.2), 1)])


def _trivial(item: Any) -> Any:
    return item


def mixed6(n: int):
    """A training script's six stages: a 4 ms read, 1.5 ms of Python, 0.5 ms Python + 2 ms wait, an async 3 ms await, ~1 ms of sha256, a trivial step."""
    S = _stages
    return _pipeline(
        n,
        [
            ("read", S.Sleep(4.0), 8),
            ("parse", S.Spin(1.5), 2),
            ("lookup", S.SpinSleep(0.5, 2.0), 4),
            ("fetch", S.AsyncSleep(3.0), 8),
            ("checksum", S.HashCPU(1.0), 2),
            ("tag", _trivial, 1),
        ],
    )


PIPELINES: dict[str, Callable[[int], Any]] = {
    "gil_mix": gil_mix,
    "sleep_chain": sleep_chain,
    "cpu_free": cpu_free,
    "mixed6": mixed6,
}
PIPELINE_NOTES = {k: (f.__doc__ or "").strip() for k, f in PIPELINES.items()}

#: The true label of each known-answer stage (docs/verdicts.md: the largest share of its call; overhead-bound
#: where its call is shorter than the harness's cost per item). cpu_free's 0.2 ms of Python is left out:
#: its call is about SPDL's own cost per item (0.2-0.3 ms here), so either of two labels is right.
LABEL_TRUTH: dict[str, dict[str, str]] = {
    "gil_mix": {"tokenize": "gil-bound", "fetch": "io-bound", "mixed": "io-bound"},
    "sleep_chain": {"list": "io-bound", "download": "io-bound", "stat": "io-bound"},
    "cpu_free": {"read": "io-bound", "checksum": "cpu-bound"},
    "mixed6": {
        "read": "io-bound",
        "parse": "gil-bound",
        "lookup": "io-bound",
        "fetch": "io-bound",
        "checksum": "cpu-bound",
        "tag": "overhead-bound",
    },
}
