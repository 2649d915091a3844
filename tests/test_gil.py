"""GIL fraction: known answers on model rows, labelled signals, and on real measured stages."""

from __future__ import annotations

import math
import os
import sys
import time

import pandas as pd
import pytest
from _rows import analyzed, model_rows, row

from stagebench.analysis._gil import SIGNAL_LABELS, estimate_gil
from stagebench.analysis._labels import SHARE_NOISE
from stagebench.core._curves import StageRows


# ------------------------------------------------------------------ model rows
@pytest.mark.parametrize("gil_ms,wait_ms", [(0.0, 4.0), (0.8, 3.2), (2.0, 2.0), (4.0, 0.0)])
def test_known_fraction_from_model_rows(gil_ms, wait_ms):
    truth = gil_ms / (gil_ms + wait_ms)
    r = estimate_gil(StageRows(model_rows("s", gil_ms=gil_ms, wait_ms=wait_ms)), cores=2)
    assert r.fraction == pytest.approx(truth, abs=0.03)
    lo, hi = r.interval
    assert lo <= r.fraction <= hi
    assert r.gil_s_per_item == pytest.approx(gil_ms / 1e3, abs=2e-4)
    assert r.pinned


def test_saturated_gil_curve_is_attributed_to_the_gil():
    r = estimate_gil(StageRows(model_rows("s", gil_ms=2.0, wait_ms=2.0)), cores=2)
    assert r.saturated and r.serializer == "gil"
    assert r.signals["thread_plateau"]["role"] == "estimate"
    assert r.signals["threads_vs_processes"]["value"] > 1.5


def test_gil_free_cpu_gives_an_upper_bound_not_a_guess_presented_as_fact():
    # hashlib-like: 4 ms of CPU without the GIL; on 8 cores threads scale like processes
    r = estimate_gil(StageRows(model_rows("s", gil_ms=0.02, wait_ms=0.0, free_cpu_ms=4.0, cores=8)), cores=8)
    assert r.signals["cpu_share"]["role"] == "upper bound"
    assert not r.pinned
    assert r.interval[0] == 0.0 and r.interval[1] < 0.2
    assert any("only from above" in n for n in r.notes)


def test_a_lock_that_is_not_the_gil_is_not_called_the_gil():
    # threads flat at 1/t with almost no CPU: a lock around waiting; processes scale
    rows = []
    for c in (1, 2, 4, 8):
        rows.append(row("locked", "thread", c, 250.0, cores_used=0.01, cpu_s_per_item=4e-5, latency_ms=4.0 * c))
        rows.append(row("locked", "process", c, 240.0 * c, cores_used=0.05 * c, cpu_s_per_item=2e-4, latency_ms=4.2))
    r = estimate_gil(StageRows(pd.DataFrame(rows)), cores=2)
    assert r.saturated and r.serializer == "other"
    assert r.fraction < 0.1
    st = analyzed(pd.DataFrame(rows), cores=2)
    assert st["classification"] != "gil-bound"


def test_every_signal_is_labelled_and_none_claims_to_measure_the_gil():
    st = analyzed(model_rows("s", gil_ms=2.0, wait_ms=2.0), cores=2)
    gil_signals = {k: v for k, v in st["evidence"]["signals"].items() if k in SIGNAL_LABELS}
    assert {"cpu_share", "thread_plateau", "threads_vs_processes", "serial_fraction"} <= set(gil_signals)
    for sig in gil_signals.values():
        assert sig["label"] and sig["role"] in ("estimate", "upper bound", "check")
        assert "direct measurement" not in sig["label"]
    assert any("not a direct measurement" in line for line in st["evidence"]["summary"])


def test_process_only_stage_has_no_gil_fraction_and_says_why():
    r = estimate_gil(StageRows(model_rows("p", gil_ms=1, wait_ms=1, executors=("process",))), cores=2)
    assert r.fraction is None
    assert "cannot be inferred" in r.notes[0]


def test_async_stage_uses_the_event_loop_curve():
    r = estimate_gil(StageRows(model_rows("a", gil_ms=1.0, wait_ms=3.0, executors=("async",))), cores=2)
    assert r.executor == "async"
    assert r.fraction == pytest.approx(0.25, abs=0.03)


def test_other_load_is_corrected_with_the_no_op_ceilings_share_of_a_core():
    # pure Python on a machine that gives a busy thread only 60% of a core: the
    # stage holds the GIL all the time (descheduled or not), the CPU share reads 0.6
    rows = model_rows("busy", gil_ms=4.0, wait_ms=0.0, executors=("thread",))
    stage = rows["role"] == "stage"
    rows.loc[stage, "cpu_s_per_item"] *= 0.6
    rows.loc[stage, "cores_used"] *= 0.6
    rows.loc[~stage, "cores_used"] = 0.6
    r = estimate_gil(StageRows(rows), cores=2)
    assert r.signals["cpu_share"]["value"] == pytest.approx(0.6, abs=0.05)
    assert r.signals["cpu_share_for_load"]["value"] == pytest.approx(1.0, abs=0.05)
    assert r.fraction >= 0.9  # the plateau and the corrected signals outvote the raw CPU share
    assert any("other load" in n for n in r.notes)


@pytest.mark.parametrize("steal", [0.0, 0.3, 0.68])
def test_time_the_host_took_from_the_vm_is_not_read_as_the_stage_waiting(steal):
    """A fresh clone read a 1 ms hashing stage (GIL-free C code) as 68% waiting: the VM lost its CPUs."""
    from stagebench.analysis._labels import label_of_call

    rows = model_rows("hash", gil_ms=0.0, wait_ms=0.0, free_cpu_ms=1.0, executors=("thread",))
    first = (rows["role"] == "stage") & (rows["concurrency"] == 1)
    rows.loc[first, "cpu_s_per_item"] *= 1 - steal  # the wall clock ran on while the host had the CPU
    rows.loc[first, "steal_share"] = steal
    r = estimate_gil(StageRows(rows), cores=2)
    A = r.signals["cpu_share"]["value"]
    assert A == pytest.approx(1.0, abs=0.05)
    assert label_of_call(1e-3, A, 0.0, "thread concurrency 1")[0] == "cpu-bound"
    assert any("the host took" in n for n in r.notes) is (steal > 0.05)
    # without the host's steal counter the same rows read as waiting: what the clone saw
    rows["steal_share"] = math.nan
    unknown = estimate_gil(StageRows(rows), cores=2).signals["cpu_share"]["value"]
    assert unknown == pytest.approx(1 - steal, abs=0.05)


def test_the_hosts_steal_is_divided_out_once_not_again_through_the_no_op_ceiling():
    """The no-op ceiling that measures other load loses the same steal: read over what the host left too."""
    rows = model_rows("python", gil_ms=1.0, wait_ms=0.0, executors=("thread",))
    first = rows["concurrency"] == 1
    rows.loc[first, "cpu_s_per_item"] *= 0.6
    rows.loc[first & (rows["role"] == "ceiling"), "cores_used"] *= 0.6
    rows.loc[first, "steal_share"] = 0.4
    r = estimate_gil(StageRows(rows), cores=2)
    assert r.signals["cpu_share"]["value"] == pytest.approx(1.0, abs=0.05)
    assert "cpu_share_for_load" not in r.signals and not any("other load" in n for n in r.notes)


def test_a_machine_slower_at_the_first_level_than_on_the_plateau_does_not_lower_the_fraction():
    # Seen on a shared VM: 4 ms of Python took 6.8 ms of CPU at c=1 and less on the
    # plateau; the plateau signal, comparing the two, read 0.6-0.8 for a fraction of 1.
    rows = model_rows("s", gil_ms=4.0, wait_ms=0.0)
    first = (rows["role"] == "stage") & (rows["executor"] == "thread") & (rows["concurrency"] == 1)
    for col in ("qps", "qps_low", "qps_high"):
        rows.loc[first, col] /= 1.7
    rows.loc[first, "cpu_s_per_item"] *= 1.7
    r = estimate_gil(StageRows(rows), cores=2)
    assert r.fraction == pytest.approx(1.0, abs=0.1)
    assert r.saturated
    assert "the machine's speed changed" in r.signals["thread_plateau"]["detail"]


def test_one_level_only_still_estimates_from_the_cpu_share():
    rows = model_rows("one", gil_ms=1.0, wait_ms=3.0, levels=(1,))
    r = estimate_gil(StageRows(rows), cores=2)
    assert r.fraction == pytest.approx(0.25, abs=0.03)
    assert not r.saturated


# ------------------------------------------------------------------ real measurements
def _cpu_availability(seconds: float = 0.2) -> float:
    """Share of a core a busy thread gets right now (schedstat: on-CPU vs run-queue wait)."""
    try:

        def read():
            with open("/proc/thread-self/schedstat") as f:
                on, wait, _ = (int(x) for x in f.read().split())
            return on, wait

        on0, w0 = read()
        t0 = time.perf_counter()
        x = 0
        while time.perf_counter() - t0 < seconds:
            x += 1
        on1, w1 = read()
    except OSError:
        return 1.0
    run = (on1 - on0) + (w1 - w0)
    return (on1 - on0) / run if run > 0 else 1.0


class _OthersCPU:
    """The cores other programs used while the block ran: the host's busy time less this process's
    (its threads and the pool processes it reaped), per second of wall time."""

    def __enter__(self) -> _OthersCPU:
        import psutil

        self._me = psutil.Process()
        self._t0, self._host0, self._mine0 = time.perf_counter(), self._host(), self._mine()
        self.cores = 0.0
        return self

    @staticmethod
    def _host() -> float:
        import psutil

        t = psutil.cpu_times()
        return t.user + t.system + getattr(t, "nice", 0.0) + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)

    def _mine(self) -> float:
        t = self._me.cpu_times()
        return t.user + t.system + t.children_user + t.children_system

    def __exit__(self, *exc: object) -> None:
        wall = time.perf_counter() - self._t0
        others = (self._host() - self._host0) - (self._mine() - self._mine0)
        self.cores = max(0.0, others) / wall if wall > 0 else 0.0


def _wait_for_a_core(min_share: float = 0.7, tries: int = 3) -> float:
    share = 0.0
    for _ in range(tries):
        share = _cpu_availability()
        if share >= min_share:
            return share
        time.sleep(2.0)
    pytest.skip(f"machine too busy for a known-answer timing test: a busy thread got {share:.0%} of a core")


# A busy no-op thread that gets this share of a core around the c=1 window: the machine was quiet
# (the analysis itself corrects for load below 0.95).
_QUIET = 0.95
# Cores other programs used over the whole measurement, below which the machine counts as quiet
_OTHERS = 0.1


def _require_a_quiet_window(rows: pd.DataFrame, min_share: float = 0.8) -> float:
    """Skip when the one-thread no-op ceiling, measured next to c=1, got too little of a core; else the
    share of a core it got."""
    ceil = rows[(rows["role"] == "ceiling") & (rows["executor"] == "thread")]
    got = float(ceil["cores_used"].min()) if len(ceil) else 1.0
    if got < min_share:
        pytest.skip(f"the machine became busy during the measurement: a busy thread got {got:.0%} of a core")
    return got


def _measure(fn, levels=(1, 2, 4, 8, 16), budget=0.25, first=None):
    """Threads and processes over the grid, plus the one-thread no-op ceiling right after c=1.

    ``first`` (same work as ``fn``) runs the lowest thread level instead, e.g. a probed copy.
    """
    from stagebench.core._config import MeasureConfig, SweepConfig
    from stagebench.core._measure import identity, measure_stage
    from stagebench.core._sweep import sweep_stage

    m = MeasureConfig(budget_s=budget, warmup_s=0.05, timeout_s=30)
    inputs = list(range(32))
    rows = [measure_stage(first or fn, inputs, executor="thread", concurrency=levels[0], config=m, name="s")]
    rows.append(
        measure_stage(
            identity,
            inputs,
            executor="thread",
            concurrency=levels[0],
            config=MeasureConfig(budget_s=0.15, warmup_s=0.05, timeout_s=30),
            name="s",
            role="ceiling",
        )
    )
    rest = sweep_stage(
        fn,
        inputs,
        name="s",
        config=SweepConfig(executors=("thread",), concurrency=levels[1:], ceiling=False, measure=m),
    )
    procs = sweep_stage(
        fn, inputs, name="s", config=SweepConfig(executors=("process",), concurrency=levels, ceiling=False, measure=m)
    )
    return pd.concat([pd.DataFrame(rows), rest, procs], ignore_index=True)


@pytest.mark.slow
@pytest.mark.parametrize(
    "spin_ms,sleep_ms",
    [
        (0.0, 4.0),
        (0.8, 3.2),
        (2.0, 2.0),
        # Fraction 1 read ~0.87 at times: the machine's speed changed between the lowest level
        # and the plateau (not state left in the interpreter); _gil._slowdown undoes that now.
        (4.0, 0.0),
    ],
)
def test_known_gil_fraction_of_real_spin_sleep_stages(spin_ms, sleep_ms):
    """A stage that spins g ms of pure Python then sleeps r ms holds the GIL g/(g+r) of its time."""
    from _stages import SpinSleep, SpinSleepProbe

    stage = SpinSleep(spin_ms, sleep_ms)
    _wait_for_a_core()
    # the concurrency-1 point runs a probed copy: what the stage really held, in the same window
    probe = SpinSleepProbe(stage)
    with _OthersCPU() as others:
        rows = _measure(stage, first=probe)
    avail = _require_a_quiet_window(rows)
    # the truth over the calls the c=1 window counted (the last ones the probe saw)
    spin_s, spin_cpu_s, total_s = probe.last(float(rows.iloc[0]["n_items"]))
    if spin_s > 0 and spin_cpu_s < 0.8 * spin_s:
        # The truth is wall time holding the GIL; the curves see CPU time. A core taken away
        # mid-spin (another VM's turn) stretches the first, not the second. One fresh-clone run
        # read a held share of 0.43 against a CPU share of 0.27 (estimate 0.28): that signature.
        pytest.skip(
            f"the spin got {spin_cpu_s / spin_s:.0%} of a core while holding the GIL: "
            "the machine took the core away; the held share is not the stage's"
        )
    held = spin_s / total_s
    st = analyzed(rows, cores=len(os.sched_getaffinity(0)), n_boot=50)
    nominal = stage.gil_fraction
    signals = {
        k: round(v["value"], 3) for k, v in st["evidence"]["signals"].items() if isinstance(v.get("value"), float)
    }
    print(
        f"spin CPU / wall {spin_cpu_s / max(spin_s, 1e-9):.2f}; "
        f"GIL fraction nominal {nominal:.2f}, held (probe) {held:.3f}, estimated {st['gil_fraction']:.3f} "
        f"interval {st['gil_fraction_interval']} signals {signals}"
    )
    print(f"a busy thread got {avail:.2f} of a core at c=1; other programs used {others.cores:.2f} cores")
    if avail >= _QUIET and others.cores < _OTHERS:
        assert st["gil_fraction"] == pytest.approx(held, abs=0.1)
    else:
        # Another program took part of the cores: the curves' plateau and the load-corrected CPU share
        # read high together (a held share of 0.53 read 0.61, its interval 0.52-1.0, beside a test run
        # using 0.6 cores). What the analysis claims then is its interval: the truth must lie in it.
        lo, hi = st["gil_fraction_interval"]
        assert lo - 0.02 <= held <= hi + 0.02  # 0.02: the probe's own reading of what was held
        if avail < _QUIET:  # seen around c=1: said
            assert any("other load" in n for n in st["gil"]["notes"]), st["gil"]["notes"]
    # The label against what the stage held, not its nominal share: its sleep overshoots on a loaded VM
    # (the 50/50 stage held 0.36-0.59 over twenty runs), and one that held 0.36 is io-bound. Within the
    # shares' noise of the tie either label is right (the tie rule then says "a mix").
    if held > 0.5:
        assert st["classification"] == "gil-bound"
    elif held < 0.5 - 2 * SHARE_NOISE:
        assert st["classification"] == "io-bound"
    else:
        assert st["classification"] == "io-bound" or st["mix"] == ["gil-bound", "io-bound"], st["mix"]


def test_known_answer_stages_carry_their_calibration_across_pickling():
    import cloudpickle
    from _stages import HashCPU, Spin, SpinSleep

    s = SpinSleep(0.8, 3.2)
    assert s.gil_fraction == pytest.approx(0.2)
    back = cloudpickle.loads(cloudpickle.dumps(s))
    assert back.loops == s.loops > 0  # workers never recalibrate
    assert Spin(2.0).loops == pytest.approx(2 * Spin(1.0).loops, rel=0.01)
    assert HashCPU(1.0)(7) == 7


# ------------------------------------------------------------------ the direct probe
def test_a_probe_decides_where_the_curves_only_bound_the_share():
    # hashlib-like on 2 cores: threads flatten at the cores, so the curves bound the share only from above
    rows = StageRows(model_rows("s", gil_ms=0.02, wait_ms=0.0, free_cpu_ms=4.0, cores=2))
    assert not estimate_gil(rows, cores=2).pinned
    r = estimate_gil(rows, cores=2, probe={"share": 0.03, "low": 0.01, "high": 0.08, "rounds": 8})
    assert (r.fraction, r.interval, r.pinned, r.source) == (0.03, (0.01, 0.08), True, "probe")
    assert r.signals["gil_probe"]["role"] == "estimate"
    assert not any("only from above (≤" in n and "more cores" in n for n in r.notes)
    assert any("a counter thread next to the stage read 0.03" in n for n in r.notes)
    # the curves' upper bound still holds over a higher reading
    hi = estimate_gil(rows, cores=2).interval[1]
    capped = estimate_gil(rows, cores=2, probe={"share": 0.9, "low": 0.8, "high": 1.0})
    assert capped.fraction == pytest.approx(hi) and "capped at that bound" in capped.notes[-1]


def test_a_probe_below_the_curves_interval_overrides_them_and_one_above_is_only_a_check():
    rows = StageRows(model_rows("s", gil_ms=2.4, wait_ms=1.6))  # the curves pin 0.6
    base = estimate_gil(rows, cores=2)
    assert base.pinned and base.interval[0] > 0.3
    low = estimate_gil(rows, cores=2, probe={"share": 0.05, "low": 0.02, "high": 0.1})
    assert low.fraction == 0.05 and low.source == "probe"
    assert any("limited by something else" in n for n in low.notes)
    # the probe's errors push it up (hand-offs, a busy machine): a higher reading does not move the curves
    high = estimate_gil(rows, cores=2, probe={"share": 0.9, "low": 0.8, "high": 1.0})
    assert high.fraction == base.fraction and high.source == "curves"
    assert high.signals["gil_probe"]["role"] == "check"
    busy = estimate_gil(rows, cores=2, probe={"error": "not probed: the machine was busy (...)", "core_wait": 0.4})
    assert busy.fraction == base.fraction and busy.source == "curves"
    assert busy.notes[-1] == "no direct GIL reading: not probed: the machine was busy (...)"
    st = analyzed(
        model_rows("s", gil_ms=2.4, wait_ms=1.6), cores=2, gil_probe={"share": 0.05, "low": 0.02, "high": 0.1}
    )
    assert st["gil"]["source"] == "probe" and st["gil_fraction"] == 0.05
    assert any("read by a counter thread" in line for line in st["evidence"]["summary"])


def _steal_ticks() -> int | None:
    """Clock ticks the hypervisor took from this VM's CPUs so far (/proc/stat's steal), or None."""
    try:
        with open("/proc/stat") as f:
            return int(f.readline().split()[8])
    except (OSError, ValueError, IndexError):
        return None


def _stolen_share(ticks0: int | None, seconds: float) -> float | None:
    """Share of all the machine's cores' time (what /proc/stat's first line sums) that the hypervisor
    took since ``ticks0``."""
    ticks1 = _steal_ticks()
    if ticks0 is None or ticks1 is None or seconds <= 0:
        return None
    return (ticks1 - ticks0) / os.sysconf("SC_CLK_TCK") / (seconds * os.cpu_count())


def test_the_probe_reads_known_answers_on_real_stages():
    """Pure Python reads high, waiting and SHA-256 read low (tolerances for a loaded 2-core VM:
    its errors push readings up, so the low ones are tight)."""
    from _stages import HashCPU, Sleep, Spin

    from stagebench.pipeline._gilprobe import probe_gil

    steal0 = _steal_ticks()
    t0 = time.monotonic()
    spin, nap, sha = probe_gil(Spin(2.0), [0]), probe_gil(Sleep(2.0), [0]), probe_gil(HashCPU(2.0), [0])
    stolen = _stolen_share(steal0, time.monotonic() - t0)
    print(
        {
            k: (v.get("share"), v.get("spinner_core"), v.get("core_wait"))
            for k, v in (("spin", spin), ("sleep", nap), ("sha256", sha))
        },
        "stolen",
        stolen,
    )
    # A fresh clone read SHA-256 at 0.37 with the spinner waiting for no core (0.1%) and getting 95% of
    # one alone: time taken by the hypervisor mid-round shows in neither. /proc/stat counts it.
    if stolen is not None and stolen > 0.1:  # 2-8% on quiet runs here; 0.37 of one core is ~18% of two
        pytest.skip(f"the hypervisor took {stolen:.0%} of the cores during the probes")
    busy = [r["error"] for r in (spin, nap, sha) if "error" in r]
    if busy:
        assert all("the machine was busy" in e for e in busy), busy
        pytest.skip(busy[0])
    if min(r["spinner_core"] for r in (spin, nap, sha)) < 0.8:
        pytest.skip(
            "the machine took cores away from the probe's spinner (it got "
            f"{min(r['spinner_core'] for r in (spin, nap, sha)):.0%} of one alone)"
        )
    assert spin["share"] > 0.6 and nap["share"] < 0.2 and sha["share"] < 0.3
    assert 3 <= spin["rounds"] <= 8 and spin["low"] <= spin["share"] <= spin["high"]
    assert spin["seconds"] < 3


def test_the_probe_says_the_machine_was_busy_rather_than_read_a_gil_free_stage_high():
    """Busy programs on all cores but one, which the stage and the spinner then share: SHA-256 (GIL-free)
    read 0.92-1.0 (4 tries of 5) before rounds whose spinner waited for a core were dropped. Now it reads
    low or says the machine was busy. (A busy program on every core reads low even so: the spinner's
    share of a core alone, which scales its reading, drops as much.)"""
    import subprocess

    from _stages import HashCPU

    from stagebench.pipeline._gilprobe import probe_gil

    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(max(1, len(os.sched_getaffinity(0)) - 1))
    ]
    try:
        time.sleep(0.3)
        sha = probe_gil(HashCPU(2.0), [0])
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    print(sha)
    if "error" in sha:
        assert "the machine was busy" in sha["error"] and sha["core_wait"] > 0.1
    else:
        assert sha["share"] < 0.3 and (sha["core_wait"] is None or sha["core_wait"] <= 0.1)


def test_the_probe_counts_every_round_where_the_wait_for_a_core_cannot_be_read(monkeypatch):
    from _stages import Sleep

    from stagebench.pipeline import _gilprobe

    monkeypatch.setattr(_gilprobe, "_core_wait_s", lambda tid: None)
    r = _gilprobe.probe_gil(Sleep(2.0), [0])
    assert r["core_wait"] is None and 3 <= r["rounds"] <= 8 and 0 <= r["share"] <= 1


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity (Linux)")
def test_the_spinner_counts_the_time_it_held_the_gil_without_a_core_as_its_own():
    """A busy program pinned to the spinner's core takes it away mid-loop, without the spinner
    blocking: those pauses are counted (`lost`), so CPU time plus lost time covers the wall time.
    Before, the missing half read as GIL the stage held."""
    import subprocess
    import threading

    from stagebench.pipeline import _gilprobe

    if _gilprobe._thread_usage() is None:
        pytest.skip("no per-thread context-switch counts here")
    saved = os.sched_getaffinity(0)
    cpu = min(saved)
    hog = subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"])
    try:
        os.sched_setaffinity(0, {cpu})
        time.sleep(0.3)  # the busy program is spinning on that core
        stop, ready, lost = threading.Event(), threading.Event(), [0.0]
        t = threading.Thread(target=_gilprobe._spin_counter, args=(stop, threading.Event(), ready, lost))
        t.start()
        ready.wait()
        clock = time.pthread_getcpuclockid(t.ident)
        w0, c0, l0 = time.perf_counter(), time.clock_gettime(clock), lost[0]
        time.sleep(0.5)  # this thread sleeps: the spinner holds the GIL throughout
        w, c, gone = time.perf_counter() - w0, time.clock_gettime(clock) - c0, lost[0] - l0
        stop.set()
        t.join()
    finally:
        os.sched_setaffinity(0, saved)
        hog.kill()
        hog.wait()
    print(f"wall {w:.3f} s, spinner CPU {c:.3f} s, lost {gone:.3f} s")
    assert gone > 0.25 * w, "the busy program took about half the core; the spinner must have seen it"
    assert abs(c + gone - w) < 0.15 * w


def test_the_probe_records_a_stage_that_raises_or_hangs_and_restores_the_switch_interval():
    import gc
    import sys
    import threading

    from stagebench.pipeline._gilprobe import probe_gil

    def bad(x):
        raise ValueError("bad record")

    old = sys.getswitchinterval()
    assert probe_gil(bad, [1]) == {"error": "the stage raised during the GIL probe: ValueError: bad record"}
    release = threading.Event()
    calls = []

    def hangs_later(x):  # returns for a while (the probe's spinner is running by then), then hangs
        calls.append(x)
        if len(calls) > 40:
            release.wait()
        time.sleep(0.001)

    t0 = time.perf_counter()
    r = probe_gil(hangs_later, [1], timeout_s=0.5)
    assert r == {"error": "the stage did not return within 0.5 s during the GIL probe"}
    assert time.perf_counter() - t0 < 2
    assert sys.getswitchinterval() == old
    assert gc.isenabled(), "the collector is paused only for the probe's rounds, even when the stage hangs"
    time.sleep(0.2)  # the spinner must not outlive the probe: it would slow everything measured after
    assert not [t for t in threading.enumerate() if t.name == "stagebench-gil-probe" and t.is_alive()]
    release.set()
    slow = probe_gil(lambda x: time.sleep(0.15), [1])
    assert slow["error"].startswith("not probed: a call takes 0.15 s")
    assert probe_gil(bad, []) == {"error": "no inputs to probe with"}
    assert gc.isenabled()


def test_the_probe_pauses_the_cyclic_collector_during_its_rounds_and_leaves_it_as_it_found_it():
    import gc

    from stagebench.pipeline._gilprobe import probe_gil

    seen = []

    def stage(x):
        seen.append(gc.isenabled())
        time.sleep(0.001)

    assert "share" in probe_gil(stage, [1])
    assert seen[0] and not seen[-1], "on for the warm-up call, off in the rounds"
    assert gc.isenabled()
    gc.disable()
    try:
        probe_gil(stage, [1])
        assert not gc.isenabled(), "a program that runs with the collector off keeps it off"
    finally:
        gc.enable()


def test_a_probe_inside_a_wide_curves_interval_decides_and_inside_a_narrow_one_does_not(monkeypatch):
    import stagebench.analysis._gil as G

    rows = StageRows(model_rows("s", gil_ms=2.4, wait_ms=1.6))
    lo, hi = estimate_gil(rows, cores=2).interval
    inside = {"share": (lo + hi) / 2 + 0.01, "low": lo, "high": hi}
    assert hi - lo < G._VAGUE and estimate_gil(rows, cores=2, probe=inside).source == "curves"
    # the same interval counts as wide open once the threshold is below its width (a 0.2 ms
    # pure-Python stage's curves gave 0-1 in a diagnosis; its probe read 0.94)
    monkeypatch.setattr(G, "_VAGUE", (hi - lo) / 2)
    r = estimate_gil(rows, cores=2, probe=inside)
    assert r.source == "probe" and r.fraction == pytest.approx(inside["share"])
    assert any("leave the GIL share anywhere in" in n for n in r.notes)


def test_the_probe_counts_how_often_a_call_lets_the_gil_go():
    """One hash a call against twelve: the stage's waits to retake the GIL, net of its own sleeps and of holding it."""
    from _stages import HashPieces, Sleep, Spin, read_releases

    one, twelve = read_releases(HashPieces(3.0, 1)), read_releases(HashPieces(3.0, 12))
    spin, nap = read_releases(Spin(2.0)), read_releases(Sleep(2.0))
    # here: ~0.8, ~7.5 (a lower bound: see read_releases), ~0-0.5, ~1 (the sleep's one release). A fresh
    # clone once read the spin at 12.2 when each wait counted as a release: about 4 counted as now
    assert one < 2 and spin < 2 and nap < 2
    # twelve releases read as more than a third of them, and as several times one release
    assert 4 < twelve < 24 and twelve > 3 * max(one, 0.5)
