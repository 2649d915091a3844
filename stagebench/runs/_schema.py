"""The data contract: names and allowed values of the tidy result rows.

One row is one measured point. Every analysis, report and summary is a pure
function of these rows, so `stagebench report RUN_DIR` can rebuild anything
from `results.csv` alone. Changing a column name is a breaking change of the
results schema; bump :data:`RESULTS_SCHEMA_VERSION` when you do.
"""

from __future__ import annotations

__all__ = [
    "RESULTS_SCHEMA_VERSION",
    "SUMMARY_SCHEMA_VERSION",
    "EXECUTORS",
    "HARNESSES",
    "STATUSES",
    "ROLES",
    "STAGE_COLUMNS",
]

RESULTS_SCHEMA_VERSION = 1
SUMMARY_SCHEMA_VERSION = 1

#: How a stage is run: a pool of threads, a pool of processes, or c coroutines
#: in flight on one event loop.
EXECUTORS = ("thread", "process", "async")

#: Which harness drove the stage: stagebench's own closed-loop workers
#: (``direct``), or a one-stage SPDL pipeline (``spdl``, what a real pipeline
#: can deliver, including SPDL's per-item overhead).
HARNESSES = ("direct", "spdl")

#: ``ok``: measured. ``failed``: every item raised (or the run raised).
#: ``timeout``: no steady state before the point's deadline (a hang).
#: ``crashed``: a worker process died. ``skipped``: cannot run this way
#: (cannot be pickled, a coroutine on a process pool, ...), with the reason.
STATUSES = ("ok", "failed", "timeout", "crashed", "skipped")

#: ``stage``: the user's function. ``ceiling``: an identity stage over the same
#: inputs through the same harness and executor: the most the harness can
#: deliver for this payload (per-item overhead and, for processes, IPC).
#: ``paired``: the stage again, threads and processes in turns at their best
#: levels (windows in the order T P P T), when the curves alone would pick
#: processes by less than 1.5x; the recommendation follows it
#: (:mod:`stagebench.core._paired`). Not part of any curve.
ROLES = ("stage", "ceiling", "paired")

#: Columns of a stage-measurement row, in order (``results.csv``), with what each holds
#: (``docs/schema.md`` is generated from these).
STAGE_COLUMN_DOCS: dict[str, str] = {
    "stage": "user-given stage name (any string)",
    "role": "ROLES",
    "executor": "EXECUTORS",
    "harness": "HARNESSES",
    "concurrency": "workers / tasks in flight",
    "status": "STATUSES",
    "reason": 'why not ok ("" when ok)',
    "qps": "successful items per second in the steady-state window",
    "qps_low": "95% confidence interval (batch means, Student t)",
    "qps_high": "upper end of the interval",
    "qps_cv": "coefficient of variation of the batch means",
    "n_items": "successful items completed in the window (fractional count)",
    "n_errors": "items that raised in the window",
    "error_example": "one exception message, when any item raised",
    "window_s": "length of the timed window",
    "warmup_s": "time from start until every worker had delivered",
    "n_batches": "batches behind the interval",
    "latency_p50_ms": "per-item latency (call to return; processes: submit to result)",
    "latency_p90_ms": "90th percentile latency",
    "latency_p99_ms": "99th percentile latency",
    "latency_mean_ms": "Little's law: c in flight / mean latency is the most c callers can deliver",
    "cpu_s_per_item": "CPU seconds (process + workers) per successful item",
    "minor_faults_per_item": "pages the kernel mapped and zeroed (process + workers) per item; NaN off Linux",
    "gc_s_per_item": "seconds this process's cyclic garbage collector ran per item (it holds the GIL)",
    "gc_full_s_per_item": "of those, its full collections' (each walks every object the process holds)",
    "gc_young_per_item": "young collections per item: each one the collector's threshold (700 by default) more containers",
    "cores_used": "CPU seconds / wall seconds in the window",
    "mem_peak_mb": "peak of summed RSS of the process and its workers (sampled)",
    "mem_pss_mb": "PSS of the process and its workers at window end (no double count)",
    "disk_read_mb_s": "bytes read from storage per second (psutil read_bytes)",
    "read_mb_s": "bytes read through read() per second, page cache included",
    "call_cpu_ms": "mean CPU of the calling thread per call: the stage's own work (spdl harness, threads only)",
    "steal_share": "share of the CPUs' time the host took from this VM in the window (steal; NaN: not reported)",
    "cores_throttled": "cores' worth of time the CPU quota held the process's group back in the window (NaN: no quota)",
    "payload_bytes": "mean pickled size of one input item",
    "workers_seen": "distinct workers that delivered before the window opened",
    "started_at": "ISO time the point started",
    "elapsed_s": "wall time of the whole point, start-up and tear-down included",
    "ranks": "the host's ranks that ran this point at once, each the stage on its own inputs (torchrun's local "
    "world size); empty: one process. Where set, qps, its interval, cores_used, cpu_s_per_item and "
    "minor_faults_per_item are the host's (the sum over the ranks; the interval sums the ranks' ends), the "
    "latency, memory and n_* columns local rank 0's",
    "rank_min_qps": "a ranked row: the slowest rank's items per second in the same window",
    "rank_max_qps": "a ranked row: the fastest rank's",
}
STAGE_COLUMNS = tuple(STAGE_COLUMN_DOCS)

#: Columns of a loader-sweep row, in order (``results.csv`` of a ``kind: "loader"`` run).
#: One row is one loader setting (knobs after normalisation), measured on a fresh loader.
LOADER_COLUMN_DOCS: dict[str, str] = {
    "loader": "user-given loader name",
    "backend": "torch | spdl_pytorch | a custom backend name",
    "num_workers": "worker processes actually used (after normalisation)",
    "prefetch_factor": "batches in flight per worker; empty when it does not apply (0 workers)",
    "persistent_workers": 'True / False, or "not applicable" where the backend has no such knob',
    "pin_memory": 'True / False, or "not applicable" where no CUDA device is present',
    "status": "STATUSES",
    "reason": 'why not ok ("" when ok)',
    "samples_per_s": "steady-state samples per second delivered to the consumer",
    "samples_per_s_low": "confidence interval (batch means over inter-arrival times)",
    "samples_per_s_high": "upper end of the interval",
    "batches_per_s": "steady-state batches per second",
    "cv": "coefficient of variation of the batch means",
    "time_to_first_batch_s": "loader construction + iter() + first batch",
    "epoch_stall_s": "last batch of epoch k to first batch of epoch k+1 (mean)",
    "n_batches": "batches behind the steady-state figure",
    "window_s": "length of the steady-state window",
    "cores_used": "CPU seconds of main process + workers / wall seconds in the window",
    "mem_pss_mb": "PSS of main process + workers after the window (no double count)",
    "mem_uss_mb": "USS of main process + workers (memory freed if they exited)",
    "mem_main_mb": "PSS of the main process",
    "mem_workers_mb": "PSS of the workers",
    "disk_read_mb_s": "bytes read from storage per second (main + workers)",
    "search_phase": "num_workers | prefetch_factor | persistent_workers | pin_memory | grid | user | paired "
    "(a window in turns with the settings the pick hinges on, each loader kept open) | epoch_stall (the stall "
    "alone, at the pick)",
    "started_at": "ISO time the point started",
    "elapsed_s": "wall time of the whole point, start-up and tear-down included",
    "n_samples": "samples behind the steady-state figure",
    "workers_seen": "distinct worker processes that delivered before the window opened",
    "worker_threads": "torch intra-op threads inside a worker (what the backend set there)",
    "startup_s": "build + iter() + until every worker delivered its first batch",
    "warmup_s": "from then until the window opened",
    "stall_phase_s": "time spent measuring the epoch stall (short epochs after the window)",
    "teardown_s": "time to stop the loader and its workers, on the row after which it stopped (empty where it was kept open for later windows)",
    "notes": 'normalisations and caveats of this point ("; "-separated)',
    "turn": "search_phase paired: the round of the windows in turns it belongs to (1, 2, ...); empty otherwise",
    "workers_start_s": "from iter() until a worker reached its worker_init_fn (median over the workers): its "
    "process started, its imports, the dataset shipped to it",
    "workers_start_last_s": "the same for the last worker to get there",
    "workers_created_s": "of workers_start_s, until the worker's process was created (the main process starting "
    "the workers before it; under spawn or forkserver, pickling the dataset for each)",
    "worker_boot_s": "of workers_start_s, from the process's creation (its imports, loading the dataset shipped to it)",
    "worker_init_s": "the user's worker_init_fn (median over the workers)",
    "first_batch_work_s": "fetching and collating a worker's first batch (median over the workers)",
    "first_delivery_s": "from a worker's first batch made to it reaching the loop (median over the workers)",
    "worker_unsplit_s": "where no worker_init_fn can be timed (SPDL's loader): from a worker's process created to "
    "its first batch made, whole (imports, the dataset loaded, the batch's work)",
    "ranks": "the host's ranks that ran this setting at once, each its own loader (torchrun's local world size); "
    "empty: one process. Where set, samples_per_s, its interval, batches_per_s and cores_used are the host's "
    "(the sum over the ranks; the interval sums the ranks' ends), the memory and n_* columns local rank 0's",
    "rank_min_samples_per_s": "a ranked row: the slowest rank's samples per second in the same window (a "
    "data-parallel step waits for it)",
    "rank_max_samples_per_s": "a ranked row: the fastest rank's",
}
LOADER_COLUMNS = tuple(LOADER_COLUMN_DOCS)
#: The columns only a ranked window fills (the host's ranks measured together).
RANK_COLUMNS = ("ranks", "rank_min_samples_per_s", "rank_max_samples_per_s")
__all__ += ["LOADER_COLUMNS", "STAGE_COLUMN_DOCS", "LOADER_COLUMN_DOCS", "RANK_COLUMNS"]
