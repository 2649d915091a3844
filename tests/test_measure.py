"""Known-answer tests of the measuring instrument (issue 2).

Each test names a stage whose true throughput is known from first principles
and checks stagebench finds it, with tolerances that hold on a loaded 2-core
machine: sleeping scales with concurrency whatever the load; a GIL-holding loop
cannot scale on threads whatever the load.
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import math
import os
import random
import threading
import time
from dataclasses import replace
from functools import partial

import numpy as np
import pytest
from _machine import quiet_machine

from stagebench import MeasureConfig, measure_stage

CORES = len(os.sched_getaffinity(0))
FAST = MeasureConfig(budget_s=0.8, warmup_s=0.2, timeout_s=30)


def sleep_stage(x, d=0.02):
    time.sleep(d)
    return x


async def async_sleep_stage(x, d=0.02):
    await asyncio.sleep(d)
    return x


def python_loop(x, n=30_000):
    """Fixed pure-Python work: holds the GIL for its whole duration."""
    s = 0
    for i in range(n):
        s += i * i
    return s


_BLOB = os.urandom(4 << 20)


def sha_stage(x):
    """hashlib releases the GIL for buffers over 2 KiB: CPU work that threads can parallelise."""
    return hashlib.sha256(_BLOB).digest()


def _speedup(first, later):
    """How much faster the CPU ran the same fixed work at ``later`` than at ``first``.

    From the CPU seconds per item of the same stage: on a shared VM a core's speed
    changes by up to ~2x within seconds (stagebench/_speed.py), and comparisons of
    CPU-bound throughput between two points must be made at one speed.
    """
    return first.cpu_s_per_item / later.cpu_s_per_item


def _ok(row):
    assert row.status == "ok", (row.status, row.reason)
    return row


# ---------------------------------------------------------------- known answers
@pytest.mark.parametrize("executor,fn", [("thread", sleep_stage), ("async", async_sleep_stage)])
def test_sleep_stage_matches_c_over_d(executor, fn):
    inputs = list(range(64))
    base = _ok(measure_stage(fn, inputs, executor=executor, concurrency=1, config=FAST))
    d_eff = 1.0 / base.qps  # the per-item time the harness really sees at c=1
    lat0 = base.latency_mean_ms / 1e3
    # Little's law on each row's own latency: c calls in flight for `lat` seconds each. A gap the
    # harness leaves between calls, or items it miscounts, break it, and that always fails.
    assert abs(d_eff - lat0) / lat0 < 0.05, (d_eff, lat0)
    # The machine's own timekeeping is not the harness's: on a fresh clone, in a phase when the demo
    # ran at a third of its usual rate, a 20 ms sleep took 36.7 ms alone; at another moment sleepers
    # were woken late at c=32 (p90 25 ms; 1,371 items/s against 1,526). Then c/d_eff is not the answer,
    # and the test stands down with the figures, only when the known answer missed.
    if not 0.019 < lat0 < 0.025:
        pytest.skip(f"the machine did not keep time: a 20 ms sleep took {lat0 * 1e3:.1f} ms alone")
    for c in (4, 16, 32):
        row = _ok(measure_stage(fn, inputs, executor=executor, concurrency=c, config=FAST))
        truth = c / d_eff
        lat = row.latency_mean_ms / 1e3
        assert abs(row.qps - c / lat) / (c / lat) < 0.05, (c, row.qps, c / lat)
        if abs(row.qps - truth) / truth >= 0.10 and not 0.95 < lat / lat0 < 1.05:
            pytest.skip(
                f"the machine's sleeps changed length: calls took {lat * 1e3:.1f} ms (mean) at c={c} against "
                f"{lat0 * 1e3:.1f} ms at c=1, so {row['qps']:,.0f} items/s against c/d = {truth:,.0f}"
            )
        assert abs(row.qps - truth) / truth < 0.10, (c, row.qps, truth)
        assert row.qps_low <= row.qps <= row.qps_high
        # sleeping uses (almost) no CPU: io-bound evidence must be visible
        assert row.cores_used < 0.6, row.cores_used
        assert row.latency_p50_ms == pytest.approx(d_eff * 1e3, rel=0.25)


def test_gil_holding_loop_does_not_scale_on_threads():
    inputs = list(range(32))
    one = _ok(measure_stage(python_loop, inputs, executor="thread", concurrency=1, config=FAST))
    eight = _ok(measure_stage(python_loop, inputs, executor="thread", concurrency=8, config=FAST))
    # On a busy machine one thread may get only part of a core, while eight GIL
    # waiters win more scheduler share (CFS is fair per thread). The claim that
    # holds under any load: eight threads do no better than one thread would
    # with a whole core to itself.
    one_full_core = one.qps / min(1.0, one.cores_used)
    # ... at the same CPU speed: this VM's cores flip between two speeds ~1.8x apart within
    # seconds, and the same fixed loop's CPU per item says which one each point ran at
    speed = _speedup(one, eight)
    assert eight.qps <= 1.3 * one_full_core * speed, (one.qps, one.cores_used, eight.qps, speed)
    # one interpreter, one GIL: never much more than one core busy
    assert eight.cores_used < 1.35, eight.cores_used


@pytest.mark.skipif(CORES < 2, reason="needs 2 cores to scale")
def test_gil_holding_loop_scales_on_processes():
    # ~10 ms items: the parent's per-item dispatch (IPC) must not take the second core
    heavy = partial(python_loop, n=150_000)
    inputs = list(range(32))
    with quiet_machine(1.6):
        one = _ok(measure_stage(heavy, inputs, executor="process", concurrency=1, config=FAST))
        two = _ok(measure_stage(heavy, inputs, executor="process", concurrency=2, config=FAST))
    assert two.qps >= 1.3 * one.qps * _speedup(one, two), (one.qps, two.qps, _speedup(one, two))
    assert two.cores_used > 1.3, two.cores_used
    assert two.workers_seen == 2


@pytest.mark.skipif(CORES < 2, reason="needs 2 cores to scale")
def test_gil_releasing_cpu_stage_scales_on_threads():
    inputs = list(range(8))
    with quiet_machine(1.6):
        one = _ok(measure_stage(sha_stage, inputs, executor="thread", concurrency=1, config=FAST))
        two = _ok(measure_stage(sha_stage, inputs, executor="thread", concurrency=2, config=FAST))
    assert two.qps >= 1.3 * one.qps * _speedup(one, two), (one.qps, two.qps, _speedup(one, two))
    assert two.cores_used > 1.3


_OWN_CPU: list[float] = []


def self_timed_loop(x):
    """The loop, recording when it ended (wall clock) and the CPU time its own thread spent on it (the truth)."""
    t = time.thread_time()
    python_loop(x)
    _OWN_CPU.append((time.time(), time.thread_time() - t))


def test_cpu_per_item_matches_the_stages_own_cpu_time():
    # On a shared VM the CPU time of fixed work changes within seconds (this one flips
    # between ~30 and ~55 ns per loop iteration), so the truth is what the stage's thread
    # recorded for the items of the same window: those that ended inside it, placed by the point's
    # start, warm-up and window. (The last window_s before the last item read items that ended after
    # the window too, and 1 run in 20 fell 11% under its truth: the host's speed had moved between.)
    _OWN_CPU.clear()
    row = _ok(measure_stage(self_timed_loop, list(range(16)), executor="thread", concurrency=1, config=FAST))
    w0 = datetime.datetime.fromisoformat(row.started_at).timestamp() + row.warmup_s
    inside = [cpu for end, cpu in _OWN_CPU if w0 < end <= w0 + row.window_s]
    assert len(inside) >= 10, (len(inside), len(_OWN_CPU))
    truth = float(np.mean(inside))
    # the harness adds its own bookkeeping, never removes any
    assert truth * 0.9 <= row.cpu_s_per_item <= truth * 1.3, (row.cpu_s_per_item, truth)
    assert row.cores_used < 1.3


def touch_fresh_pages(x, mib=4):
    """Maps 4 MiB afresh and writes one byte per page: the kernel faults in every page, each call,
    whatever state malloc is in (the mapping bypasses it)."""
    import mmap

    m = mmap.mmap(-1, mib << 20)
    for off in range(0, mib << 20, mmap.PAGESIZE):
        m[off] = 1
    m.close()
    return x


def _faults_per_call(fn, calls=20):
    import resource

    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for i in range(calls):
        fn(i)
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / calls


@pytest.mark.parametrize("executor", ["thread", "process"])
def test_page_faults_per_item_count_the_fresh_pages_a_call_touches(executor):
    truth = _faults_per_call(touch_fresh_pages)  # 1,024 with 4 KiB pages; fewer where huge pages serve it
    row = _ok(measure_stage(touch_fresh_pages, list(range(16)), executor=executor, concurrency=1, config=FAST))
    # the harness adds a few faults of its own (and, on processes, the item's round trip), never removes any
    assert truth * 0.9 <= row.minor_faults_per_item <= truth * 1.3 + 20, (row.minor_faults_per_item, truth)
    quiet = _ok(
        measure_stage(partial(sleep_stage, d=0.005), list(range(16)), executor=executor, concurrency=1, config=FAST)
    )
    assert 0 <= quiet.minor_faults_per_item < 50


def collect_garbage(x):
    """A full collection per call: what a stage leaving many containers behind triggers now and then."""
    import gc

    gc.collect()
    return x


def young_garbage(x):
    """3,000 containers a call, alive through it: young collections that promote what they find alive, and
    so, now and then, a full collection of everything the process holds."""
    held = [[i] for i in range(3000)]
    return x if held else None


def test_gc_full_collections_are_told_from_the_young_ones():
    """The known answer is gc.freeze(): it takes every object alive now out of the collector's walks, so the
    same stage's full collections (which walk them all) shrink to nothing while its young ones stay."""
    import gc

    keep = [[i] for i in range(100_000)]  # a heap a full collection walks: a few ms each
    walked = _ok(measure_stage(young_garbage, list(range(16)), executor="thread", concurrency=1, config=FAST))
    gc.freeze()
    try:
        frozen = _ok(measure_stage(young_garbage, list(range(16)), executor="thread", concurrency=1, config=FAST))
    finally:
        gc.unfreeze()
    # here, beside a heap of 100,000 lists: 86-88% of 0.30-0.35 ms an item in full collections, against 3% of
    # 0.05 ms once frozen
    assert walked.gc_full_s_per_item >= 0.6 * walked.gc_s_per_item, (walked.gc_full_s_per_item, walked.gc_s_per_item)
    assert frozen.gc_full_s_per_item <= 0.4 * frozen.gc_s_per_item, (frozen.gc_full_s_per_item, frozen.gc_s_per_item)
    assert frozen.gc_s_per_item < 0.5 * walked.gc_s_per_item, (frozen.gc_s_per_item, walked.gc_s_per_item)
    del keep


def test_gc_seconds_per_item_are_the_collections_the_stage_ran():
    import gc

    keep = [[i] for i in range(100_000)]  # a heap worth collecting: a few ms per full collection

    def one_collection() -> float:
        t0 = time.perf_counter()
        for _ in range(10):
            gc.collect()
        return (time.perf_counter() - t0) / 10

    before = one_collection()
    row = _ok(measure_stage(collect_garbage, list(range(16)), executor="thread", concurrency=1, config=FAST))
    after = one_collection()
    # The truth is read on both sides of the measurement: this host's speed moves up to 2x in phases of
    # seconds (a full test session's heap makes one collection tens of ms: a few calls per window), and a
    # reading taken before only read 1.64x under the window in one run. The harness's own young
    # collections add a little.
    lo, hi = min(before, after), max(before, after)
    assert 0.5 * lo <= row.gc_s_per_item <= 2.0 * hi + 2e-4, (row.gc_s_per_item, before, after)
    # a full collection per call: the full collections are the time (the harness's young ones a sliver)
    assert row.gc_full_s_per_item >= 0.9 * row.gc_s_per_item, (row.gc_full_s_per_item, row.gc_s_per_item)
    quiet = _ok(
        measure_stage(partial(sleep_stage, d=0.005), list(range(16)), executor="thread", concurrency=1, config=FAST)
    )
    assert 0 <= quiet.gc_s_per_item < 0.1 * lo
    del keep


def test_page_fault_cost_is_a_plausible_time():
    from stagebench.core._resources import page_fault_cost_s

    cost = page_fault_cost_s(mb=8)
    if cost is None:  # said, not passed silently: nothing to check on this host
        pytest.skip("no fault was counted (no getrusage, or transparent huge pages served the mapping)")
    # a fresh 4 KiB page: tens of nanoseconds at the very least, and far below a tenth of a millisecond
    assert 2e-8 < cost < 1e-4, cost


# ---------------------------------------------------------------- callables users write
class Scale:
    def __init__(self, k):
        self.k = k

    def __call__(self, x):
        return x * self.k


@pytest.mark.parametrize(
    "fn",
    [lambda x: x + 1, partial(sleep_stage, d=0.001), Scale(3)],
    ids=["lambda", "partial", "callable-object"],
)
def test_user_callables_run_in_processes(fn):
    row = _ok(measure_stage(fn, list(range(16)), executor="process", concurrency=2, config=FAST))
    assert row.qps > 0 and row.n_errors == 0


# ---------------------------------------------------------------- faults
def every_third_raises(x):
    if x % 3 == 0:
        raise ValueError(f"bad item {x}")
    time.sleep(0.002)
    return x


def always_raises(x):
    raise RuntimeError("decoder exploded")


def hangs(x):
    time.sleep(3600)


class HangsAndTellsPid:
    """Hangs after writing its worker's pid, so a test can check that exact process is gone."""

    def __init__(self, folder):
        self.folder = str(folder)

    def __call__(self, x):
        with open(os.path.join(self.folder, f"{os.getpid()}.pid"), "w"):
            pass
        time.sleep(3600)


def dies(x):
    os._exit(13)


@pytest.mark.parametrize("executor", ["thread", "process"])
def test_partial_errors_are_counted_and_throughput_counts_successes(executor):
    row = _ok(measure_stage(every_third_raises, list(range(30)), executor=executor, concurrency=2, config=FAST))
    assert row.n_errors > 0
    assert "ValueError: bad item" in row.error_example
    assert row.qps > 0


@pytest.mark.parametrize("executor", ["thread", "process"])
def test_always_raising_stage_is_failed_with_message(executor):
    row = measure_stage(always_raises, list(range(8)), executor=executor, concurrency=2, config=FAST)
    assert row.status == "failed"
    assert "RuntimeError: decoder exploded" in row.reason


@pytest.mark.parametrize("executor", ["thread", "process"])
def test_hanging_stage_times_out_and_is_cleaned_up(executor, tmp_path):
    cfg = MeasureConfig(budget_s=0.3, warmup_s=0.1, timeout_s=2.0)
    t = time.perf_counter()
    row = measure_stage(HangsAndTellsPid(tmp_path), list(range(4)), executor=executor, concurrency=2, config=cfg)
    assert row.status == "timeout"
    assert time.perf_counter() - t < 15
    if executor == "process":
        import psutil

        pids = [int(p.stem) for p in tmp_path.glob("*.pid")]
        assert pids, "the stage never started in a worker"
        # the workers that were stuck in the stage are gone when measure_stage returns
        alive = [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
        assert not alive, alive


@pytest.mark.parametrize("harness", ["direct", "spdl"])
def test_crashing_worker_is_recorded_with_exit_code(harness):
    row = measure_stage(dies, list(range(4)), executor="process", concurrency=2, config=FAST, harness=harness)
    assert row.status == "crashed", row
    assert "13" in row.reason


def test_a_pool_error_is_a_crash_by_its_type_not_its_message():
    from concurrent.futures.process import BrokenProcessPool

    from stagebench.core._executors import pool_failure

    class TerminatedWorkerError(Exception):  # loky's, matched by name (loky is not imported for it)
        pass

    class MyBroken(BrokenProcessPool):
        pass

    for exc in (
        BrokenProcessPool("A process in the process pool was terminated abruptly"),
        TerminatedWorkerError("worker exited"),
        MyBroken("x"),
    ):
        status, reason = pool_failure(exc, None)
        assert (status, reason) == ("crashed", "a worker process died"), exc
    status, reason = pool_failure(ValueError("unterminated string in the item"), None)
    assert status == "failed" and "ValueError" in reason


def test_unpicklable_stage_is_skipped_with_reason():
    lock = threading.Lock()

    def uses_lock(x):
        with lock:
            return x

    row = measure_stage(uses_lock, [1, 2], executor="process", concurrency=1, config=FAST)
    assert row.status == "skipped"
    assert "pickle" in row.reason


def test_coroutine_on_process_pool_is_skipped():
    row = measure_stage(async_sleep_stage, [1], executor="process", concurrency=1, config=FAST)
    assert row.status == "skipped"
    assert "coroutine" in row.reason


def test_rejects_unknown_executor_with_allowed_values():
    with pytest.raises(ValueError, match="allowed: thread, process, async"):
        measure_stage(sleep_stage, [1], executor="gpu")


# ---------------------------------------------------------------- window mechanics
def test_slow_stage_gets_a_window_long_enough_for_an_interval():
    slow = partial(sleep_stage, d=0.25)
    cfg = MeasureConfig(budget_s=0.5, warmup_s=0.1, timeout_s=20)
    row = _ok(measure_stage(slow, [1, 2], executor="thread", concurrency=1, config=cfg))
    assert row.window_s >= 1.4  # extended: 3 batches of 2 latencies
    assert row.n_batches >= 3
    assert row.qps == pytest.approx(4.0, rel=0.1)
    assert math.isfinite(row.qps_low) and row.qps_low < row.qps


def _jumpy_stage(x):
    """1 ms, or 50 ms one call in ten: over 2 s at c=2 its batch rates vary by ~30% (interval ~20%).

    Sequential stopping looks at the interval ~28 times: a stage varying ~17% a batch (20 ms one call in
    five) read within 5% at one of them, by chance, in 1 fresh-clone run (a window of 1.94 s); ten
    batches read that close with a chance of ~1 in 400 at the last look (chi-square, 9 degrees of
    freedom). At ~30%, ~1 in 30,000; earlier looks, over shorter batches, vary more."""
    time.sleep(0.05 if random.random() < 0.1 else 0.001)
    return x


def test_a_steady_point_closes_its_window_early_and_a_jumpy_one_does_not():
    # sequential stopping: a 4 ms wait at c=2 is steady (its interval is tight at once) and
    # closes its window after the minimum; a stage whose calls take 1 or 50 ms at random does not get
    # within 5% and runs the whole budget; precision 0 always does
    cfg = MeasureConfig(budget_s=2.0, min_window_s=0.25, precision=0.05, warmup_s=0.1, timeout_s=30)
    steady = _ok(measure_stage(partial(sleep_stage, d=0.004), range(8), concurrency=2, config=cfg))
    assert steady.window_s < 1.0
    assert steady.qps == pytest.approx(2 / 0.004, rel=0.15)  # sleeps overshoot by up to ~0.1 ms each
    assert (steady.qps_high - steady.qps_low) / 2 <= 0.05 * steady.qps
    jumpy = _ok(measure_stage(_jumpy_stage, range(8), concurrency=2, config=cfg))
    assert jumpy.window_s >= 2.0
    full = MeasureConfig(budget_s=0.6, min_window_s=0.25, precision=0, warmup_s=0.1, timeout_s=30)
    assert _ok(measure_stage(partial(sleep_stage, d=0.004), range(8), concurrency=2, config=full)).window_s >= 0.6


def test_a_point_that_cannot_matter_closes_at_the_minimum_window():
    # the jumpy stage never reaches 5%, so it runs its budget; told that only a rate above 10x its
    # own would matter (``below``: the sweep's share of the stage's best so far), it closes once its
    # interval lies under that, at the minimum window, and its throughput is measured all the same
    cfg = MeasureConfig(budget_s=1.5, min_window_s=0.25, precision=0.05, warmup_s=0.1, timeout_s=30)
    full = _ok(measure_stage(_jumpy_stage, range(8), concurrency=2, config=cfg))
    assert full.window_s >= 1.5
    cut = _ok(measure_stage(_jumpy_stage, range(8), concurrency=2, config=replace(cfg, below=10 * full.qps)))
    assert cut.window_s < 0.75 and cut.qps_high < 10 * full.qps
    # measured all the same: a rate of the same stage. A 0.25 s window holds about eight of the 50 ms
    # calls (Poisson: +-35%), so it reads up to ~2x the full window's rate (1.6x and 1.8x in 2 of 5 clones'
    # runs, against a bound of 1.5x); 3x apart would be a different measurement, not noise
    assert full.qps / 3 < cut.qps < 3 * full.qps
    # a bar the interval does not clear changes nothing
    low = _ok(measure_stage(_jumpy_stage, range(8), concurrency=2, config=replace(cfg, below=0.1 * full.qps)))
    assert low.window_s >= 1.5


def test_spdl_harness_leaves_the_spdl_loggers_level_as_it_found_it():
    # the loader sweep reads SPDL's log to see failed items: a harness that
    # silenced it for good broke every loader sweep that ran after it
    import logging

    log = logging.getLogger("spdl")
    before = log.level
    _ok(measure_stage(sleep_stage, list(range(8)), executor="thread", concurrency=1, config=FAST, harness="spdl"))
    assert log.level == before


def test_nested_deferred_teardowns_wait_once_at_the_outermost():
    # a diagnosis wraps every stage's sweep in one: SPDL's ~0.1 s tear-downs are waited for once,
    # not at the end of each stage (only settle() prunes the list of pending tear-downs)
    from stagebench.core import _spdl_harness as h

    with h.deferred_teardown():
        with h.deferred_teardown():
            _ok(
                measure_stage(
                    sleep_stage, list(range(8)), executor="thread", concurrency=1, config=FAST, harness="spdl"
                )
            )
        assert h._STOPPING  # the inner scope did not wait
    assert not h._STOPPING  # the outermost did, until the tear-down had finished


# ---------------------------------------------------------------- a pool kept across points
def _hang_on_negative(x):
    if x < 0:
        time.sleep(60)
    time.sleep(0.005)
    return x


def test_a_pool_grows_across_levels_and_runs_the_stage_and_its_ceiling():
    from stagebench.core._executors import WorkerPool
    from stagebench.core._measure import identity

    inputs = list(range(20))
    with WorkerPool(sleep_stage) as pool:
        r1 = _ok(measure_stage(sleep_stage, inputs, executor="process", concurrency=1, config=FAST, pool=pool))
        first = set(pool.pids())
        r2 = _ok(measure_stage(sleep_stage, inputs, executor="process", concurrency=4, config=FAST, pool=pool))
        grown = set(pool.pids())
        ceil = _ok(
            measure_stage(identity, inputs, executor="process", concurrency=4, config=FAST, pool=pool, role="ceiling")
        )
        assert pool.starts == 1 and first < grown and len(grown) == 4 and set(pool.pids()) == grown
        # every point runs on exactly c workers, all of which delivered
        assert (r1.workers_seen, r2.workers_seen, ceil.workers_seen) == (1, 4, 4)
        assert ceil.qps > 2 * r2.qps  # no work: only the IPC

        # a grown pool measures what a fresh one does (20 ms sleeps at c=4 are 4x c=1 in both). On a
        # quiet machine they agree within 3%, beside two busy processes within 6%; on this VM on a
        # noisy day two such short points differed by 18% (146 vs 179/s), and CI once read a fresh
        # pool at 87/s right after the grown one's 158/s (its c=1 point also ran 12% slow). So one
        # pair that disagrees by over 25% is measured again in turns, and the median of three
        # pairs decides: a grown pool that is really slower loses every pair. Running on fewer
        # workers than asked is caught above (workers_seen), not by this comparison.
        def pair(grown_row=None):
            g = grown_row or _ok(
                measure_stage(sleep_stage, inputs, executor="process", concurrency=4, config=FAST, pool=pool)
            )
            f = _ok(measure_stage(sleep_stage, inputs, executor="process", concurrency=4, config=FAST))
            assert f.workers_seen == 4
            return g.qps / f.qps, (round(g.qps), round(f.qps))

        pairs = [pair(r2)]
        if abs(pairs[0][0] - 1) >= 0.25:
            pairs += [pair(), pair()]
        ratios = sorted(p[0] for p in pairs)
        assert abs(ratios[len(ratios) // 2] - 1) < 0.25, (r1.qps, [p[1] for p in pairs])
        assert pool.starts == 1 and set(pool.pids()) == grown  # the pairs ran on the same grown pool
        # going down in c starts afresh rather than measuring 2 of 4 workers
        _ok(measure_stage(sleep_stage, inputs, executor="process", concurrency=2, config=FAST, pool=pool))
        assert pool.starts == 2 and len(pool.pids()) == 2 and not set(pool.pids()) & grown
    assert pool.pids() == []


def test_a_head_to_head_window_going_down_a_level_keeps_the_larger_pool_and_c_calls_in_flight():
    """keep_larger: no fresh pool, and still only c calls at a time (a 20 ms sleep at c=1 reads ~50/s, not 4x)."""
    from stagebench.core._executors import WorkerPool

    inputs = list(range(20))
    with WorkerPool(sleep_stage) as pool:
        _ok(measure_stage(sleep_stage, inputs, executor="process", concurrency=4, config=FAST, pool=pool))
        grown = set(pool.pids())
        pool.keep_larger = True
        one = _ok(measure_stage(sleep_stage, inputs, executor="process", concurrency=1, config=FAST, pool=pool))
        assert pool.starts == 1 and set(pool.pids()) == grown
        # one call in flight: at most one 20 ms sleep's rate (50/s), where four workers would allow 200/s
        assert 25 < one.qps <= 55, one.qps


def test_process_points_run_on_the_standard_library_pool_without_rerunning_an_unguarded_main(tmp_path):
    """The pool users are told to pass to SPDL; its workers must not run the user's script again."""
    import subprocess
    import sys

    script = tmp_path / "train.py"
    marker = tmp_path / "runs.txt"
    script.write_text(
        "import concurrent.futures as cf, os\n"
        f"open({str(marker)!r}, 'a').write(f'{{os.getpid()}}\\n')  # unguarded top level, as in many train.py\n"
        "from stagebench import MeasureConfig, measure_stage\n"
        "from stagebench.core._executors import WorkerPool\n"
        "def double(x):\n"
        "    return 2 * x\n"
        "with WorkerPool(double) as pool:\n"
        "    assert isinstance(pool.executor(2), cf.ProcessPoolExecutor)\n"
        "    row = measure_stage(double, list(range(8)), executor='process', concurrency=2,\n"
        "                        config=MeasureConfig(budget_s=0.2, warmup_s=0.05, timeout_s=20), pool=pool)\n"
        "print(row.status, row.workers_seen)\n"
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["ok", "2"]
    assert len(marker.read_text().split()) == 1, "a worker ran the script's top level again"


def test_a_point_with_a_hung_worker_discards_the_pool():
    from stagebench.core._executors import WorkerPool

    cfg = MeasureConfig(budget_s=0.3, warmup_s=0.1, timeout_s=3)
    with WorkerPool(_hang_on_negative) as pool:
        row = measure_stage(_hang_on_negative, [-1, 1, 2], executor="process", concurrency=2, config=cfg, pool=pool)
        assert row.status == "timeout" or "still running" in row.reason, (row.status, row.reason)
        assert pool.pids() == []  # killed, not left to hang the next point
        ok = _ok(measure_stage(_hang_on_negative, [1, 2], executor="process", concurrency=2, config=cfg, pool=pool))
        assert ok.workers_seen == 2 and pool.starts == 2


def test_a_pool_refuses_a_stage_it_does_not_run():
    from stagebench.core._executors import WorkerPool

    with WorkerPool(sleep_stage) as pool, pytest.raises(ValueError, match="this pool runs"):
        measure_stage(python_loop, [1], executor="process", concurrency=1, config=FAST, pool=pool)


class _OwnCpu:
    """Spins ``spin_ms`` then sleeps ``sleep_ms``, recording each call's own thread CPU (the truth)."""

    def __init__(self, spin_ms: float, sleep_ms: float) -> None:
        self.spin_s, self.sleep_s = spin_ms / 1e3, sleep_ms / 1e3
        self.cpu: list[float] = []

    def __call__(self, item):
        c0 = time.thread_time()
        while time.thread_time() - c0 < self.spin_s:
            pass
        time.sleep(self.sleep_s)
        self.cpu.append(time.thread_time() - c0)  # list.append is atomic: many threads write
        return item


def test_thread_harnesses_read_the_stages_own_cpu_per_call():
    cfg = MeasureConfig(budget_s=0.4, warmup_s=0.1, timeout_s=30)
    stage = _OwnCpu(1.0, 2.0)
    row = measure_stage(stage, list(range(50)), executor="thread", concurrency=2, harness="spdl", config=cfg)
    assert row.status == "ok"
    truth_ms = float(np.mean(stage.cpu)) * 1e3  # ~1 ms of spin, whatever the CPU's speed
    assert row.call_cpu_ms == pytest.approx(truth_ms, rel=0.25)
    # the process's CPU per item also holds SPDL's own scheduling: clearly more than the call's
    assert row.cpu_s_per_item * 1e3 > row.call_cpu_ms + 0.1
    # a stage that only waits uses almost none of its own
    nap = measure_stage(
        _OwnCpu(0.0, 2.0), list(range(50)), executor="thread", concurrency=2, harness="spdl", config=cfg
    )
    assert nap.call_cpu_ms < 0.2
    # the direct harness's threads time it too (the GIL share's cpu_share reads it); processes do not
    direct = measure_stage(stage, list(range(50)), executor="thread", concurrency=2, config=cfg)
    assert direct.call_cpu_ms == pytest.approx(float(np.mean(stage.cpu)) * 1e3, rel=0.25)
    proc = measure_stage(_OwnCpu(0.0, 1.0), list(range(50)), executor="process", concurrency=1, config=cfg)
    assert math.isnan(proc.call_cpu_ms)


@pytest.mark.parametrize("error", [MemoryError(), RuntimeError("can't start new thread")])
def test_running_out_of_memory_while_measuring_is_a_failed_point(monkeypatch, error):
    """A stage that keeps what it allocates can leave none for the harness (a record, a thread's stack):
    the point fails with the reason, it does not end the sweep as an 'internal error'."""
    from stagebench.core import _measure

    def no_memory(*args, **kwargs):
        raise error

    monkeypatch.setattr(_measure, "make_runner", no_memory)
    row = _measure.measure_stage(lambda x: x, list(range(10)), executor="thread", concurrency=2)
    assert row.status == "failed" and "out of memory while measuring" in row.reason


def test_a_process_pool_whose_semaphore_cannot_be_made_is_a_point_failed_for_memory(monkeypatch):
    """Under ``ulimit -v`` the pool's queue lock (loky's SemLock) fails with ENOMEM: issue 59 saw it end the
    diagnosis as an internal error with a traceback. The point fails, named as memory."""
    import errno

    from stagebench.core import _executors

    def no_semaphore(*args, **kwargs):
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    monkeypatch.setattr(_executors, "process_pool", no_semaphore)
    row = measure_stage(lambda x: x, list(range(10)), executor="process", concurrency=1)
    assert row.status == "failed", row.reason
    assert "out of memory while measuring this point (OSError: [Errno 12] Cannot allocate memory)" in row.reason


def test_running_out_of_memory_while_pickling_the_stage_is_not_an_unpicklable_stage(monkeypatch):
    """Issue 59: the same run called the failure "cannot be pickled for a process pool: MemoryError"."""
    import cloudpickle

    def no_memory(*args, **kwargs):
        raise MemoryError()

    monkeypatch.setattr(cloudpickle, "dumps", no_memory)
    row = measure_stage(lambda x: x, list(range(10)), executor="process", concurrency=1)
    assert row.status == "failed" and "out of memory while measuring this point (MemoryError)" in row.reason
    assert "pickled" not in row.reason


class _Leaks:
    """A stage that keeps what it allocates: its calls run out of memory from the ``after``-th on."""

    def __init__(self, after: int) -> None:
        self.after, self.calls = after, 0

    def __call__(self, x):
        self.calls += 1
        if self.calls > self.after:
            raise MemoryError()
        time.sleep(0.001)
        return x


def test_a_point_whose_calls_ran_out_of_memory_failed_and_keeps_its_figures():
    """A rate read while the stage's calls fail for want of memory is not the stage's: the point failed, with the
    reason, and its figures as measured."""
    cfg = MeasureConfig(budget_s=0.3, warmup_s=0.05, timeout_s=5.0)
    row = measure_stage(_Leaks(after=60), list(range(20)), executor="thread", concurrency=1, config=cfg)
    assert row.status == "failed" and row.reason.startswith("out of memory: "), row.reason
    assert "of its calls in the window ran out (MemoryError)" in row.reason
    assert row.n_errors > 0 and row.error_example == "out of memory: MemoryError"
    assert row.window_s > 0 and row.qps >= 0  # the window as measured stays in the row


def test_a_point_in_a_process_still_out_of_memory_is_not_started(monkeypatch):
    """After running out, a point starts only where 64 MB can be mapped: a thread that cannot start would hang it."""
    from stagebench import _memory
    from stagebench.core import _measure

    def never(*args, **kwargs):
        raise AssertionError("a runner was made")

    monkeypatch.setattr(_measure, "make_runner", never)
    monkeypatch.setattr(_memory, "memory_short", lambda: "this process is out of memory (MemoryError, ...)")
    monkeypatch.setattr(_measure, "memory_short", _memory.memory_short)
    row = _measure.measure_stage(lambda x: x, list(range(10)), executor="thread", concurrency=2)
    assert row.status == "skipped" and row.reason == "not measured: this process is out of memory (MemoryError, ...)"


def test_a_thread_start_that_never_returns_is_a_timeout_not_a_hang(monkeypatch):
    """Under ``ulimit -v`` CPython can create a thread that cannot bootstrap, and Thread.start() then
    waits forever: the point's watchdog (SIGALRM) ends it as a timeout, and the next point runs."""
    import signal as _signal

    from stagebench.core import _executors, _measure

    monkeypatch.setattr(_measure, "_WATCHDOG_MARGIN_S", 0.5)
    monkeypatch.setattr(_executors.ThreadRunner, "start", lambda self: threading.Event().wait())
    cfg = MeasureConfig(budget_s=0.2, warmup_s=0.05, timeout_s=1.0)
    # pytest-timeout's own SIGALRM handler would (rightly) keep the watchdog off: a program without one
    suite, left = _signal.signal(_signal.SIGALRM, _signal.SIG_DFL), _signal.getitimer(_signal.ITIMER_REAL)
    try:
        t0 = time.perf_counter()
        row = _measure.measure_stage(lambda x: x, list(range(10)), executor="thread", concurrency=2, config=cfg)
        assert time.perf_counter() - t0 < 10
        assert _signal.getsignal(_signal.SIGALRM) == _signal.SIG_DFL  # left as it was found
    finally:
        _signal.signal(_signal.SIGALRM, suite)
        if left[0]:
            _signal.setitimer(_signal.ITIMER_REAL, *left)
    assert row.status == "timeout" and "measuring it hung" in row.reason and "ulimit -v" in row.reason
    monkeypatch.undo()
    assert _ok(measure_stage(lambda x: x, list(range(10)), executor="thread", concurrency=2, config=cfg)).qps > 0


def test_a_program_with_its_own_sigalrm_handler_keeps_it():
    import signal as _signal

    mine = lambda signum, frame: None
    old = _signal.signal(_signal.SIGALRM, mine)
    try:
        cfg = MeasureConfig(budget_s=0.2, warmup_s=0.05, timeout_s=5.0)
        _ok(measure_stage(lambda x: x, list(range(10)), executor="thread", concurrency=1, config=cfg))
        assert _signal.getsignal(_signal.SIGALRM) is mine
    finally:
        _signal.signal(_signal.SIGALRM, old)


def test_other_runtime_errors_of_the_harness_are_not_called_out_of_memory(monkeypatch):
    from stagebench.core import _measure

    def broken(*args, **kwargs):
        raise RuntimeError("a bug of ours")

    monkeypatch.setattr(_measure, "make_runner", broken)
    with pytest.raises(RuntimeError, match="a bug of ours"):
        _measure.measure_stage(lambda x: x, list(range(10)), executor="thread", concurrency=2)
