"""The sweep: tidy rows, written as measured, with ceilings, and faults that keep it alive."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pandas as pd
import pytest

from stagebench import MeasureConfig, RunDir, SweepConfig, read_rows, sweep_stage
from stagebench._schema import STAGE_COLUMNS

TINY = MeasureConfig(budget_s=0.3, warmup_s=0.05, timeout_s=10)


def sleepy(x):
    time.sleep(0.005)
    return x


def hangs(x):
    time.sleep(3600)


async def async_sleepy(x):
    import asyncio

    await asyncio.sleep(0.005)
    return x


def test_sweep_gives_tidy_rows_with_ceiling_and_writes_each_row_as_measured(tmp_path):
    run = RunDir.create(tmp_path / "run")
    seen_on_disk = []

    def check_disk(row):
        # the row just measured is already in the file when the next one starts
        seen_on_disk.append(len(pd.read_csv(run.results_csv)))

    with run.writer(STAGE_COLUMNS) as w:
        df = sweep_stage(
            sleepy, range(20), name="sleep <5ms>",
            config=SweepConfig(executors=("thread",), concurrency=(1, 2, 4), measure=TINY),
            writer=w, on_row=check_disk,
        )
    assert list(df.columns) == list(STAGE_COLUMNS)
    assert seen_on_disk == [1, 2, 3, 4, 5, 6]
    assert sorted(df["role"].unique()) == ["ceiling", "stage"]
    stage = df[df.role == "stage"].set_index("concurrency")
    ceiling = df[df.role == "ceiling"].set_index("concurrency")
    assert (stage.status == "ok").all()
    assert (ceiling.qps > stage.qps).all()  # an identity stage outruns a 5 ms sleep
    disk = read_rows(run.path)
    assert len(disk) == 6 and set(disk["stage"]) == {"sleep <5ms>"}


def test_async_stage_is_swept_on_the_event_loop_only():
    df = sweep_stage(async_sleepy, range(10), config=SweepConfig(concurrency=(1, 4), measure=TINY, ceiling=False))
    assert set(df["executor"]) == {"async"}
    assert (df.status == "ok").all()


def test_a_timeout_skips_the_remaining_levels_of_that_executor_with_the_reason():
    cfg = SweepConfig(
        executors=("thread",), concurrency=(1, 2, 4), ceiling=False,
        measure=MeasureConfig(budget_s=0.2, warmup_s=0.05, timeout_s=1.0),
    )
    t = time.perf_counter()
    df = sweep_stage(hangs, range(4), config=cfg)
    assert time.perf_counter() - t < 10  # one timeout, not three
    assert list(df["status"]) == ["timeout", "skipped", "skipped"]
    assert "timeout at concurrency 1" in df["reason"].iloc[1]


def test_sweep_config_names_the_bad_key_and_allowed_values():
    with pytest.raises(ValueError, match="executors: unknown executor 'gpu'; allowed: thread, process, async"):
        SweepConfig(executors=("gpu",))
    with pytest.raises(ValueError, match="concurrency must be ascending"):
        SweepConfig(concurrency=(4, 2))
    with pytest.raises(ValueError, match="budget_s must be > 0"):
        MeasureConfig(budget_s=0)


CTRL_C_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from stagebench import MeasureConfig, RunDir, SweepConfig, sweep_stage
    from stagebench._schema import STAGE_COLUMNS

    def sleepy(x):
        time.sleep(0.01)
        return x

    run = RunDir.create(sys.argv[1])
    cfg = SweepConfig(executors=("thread",), concurrency=tuple(range(1, 60)), ceiling=False,
                      measure=MeasureConfig(budget_s=0.3, warmup_s=0.05, timeout_s=10))
    try:
        with run.writer(STAGE_COLUMNS) as w:
            sweep_stage(sleepy, range(50), config=cfg, writer=w)
    except KeyboardInterrupt:
        sys.exit(130)
    """
)


def test_ctrl_c_keeps_measured_rows_and_exits_promptly(tmp_path):
    script = tmp_path / "sweep.py"
    script.write_text(CTRL_C_SCRIPT)
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, str(script), str(out)], stderr=subprocess.PIPE)
    csv = out / "results.csv"
    deadline = time.time() + 60
    while time.time() < deadline:
        if csv.exists() and len(csv.read_text().splitlines()) >= 3:  # header + 2 rows
            break
        time.sleep(0.1)
    else:
        proc.kill()
        pytest.fail("no rows appeared")
    proc.send_signal(signal.SIGINT)
    t = time.time()
    rc = proc.wait(timeout=20)
    assert time.time() - t < 5, "Ctrl-C must stop the sweep promptly"
    assert rc == 130, proc.stderr.read().decode()
    rows = read_rows(out)
    assert len(rows) >= 2 and (rows.status == "ok").all()


def double(x):
    return 2 * x


def test_thread_ceilings_are_measured_once_per_run_and_process_ceilings_per_stage():
    cfg = SweepConfig(executors=("thread", "process"), concurrency=(1, 2), measure=TINY)
    shared: dict = {}
    a = sweep_stage(sleepy, list(range(10)), name="a", config=cfg, shared_ceilings=shared)
    b = sweep_stage(double, [b"x" * 1000] * 10, name="b", config=cfg, shared_ceilings=shared)
    ca, cb = (d[d["role"] == "ceiling"].set_index(["executor", "concurrency"]) for d in (a, b))
    assert (ca["status"] == "ok").all() and (cb["status"] == "ok").all()
    for c in (1, 2):
        copy, orig = cb.loc[("thread", c)], ca.loc[("thread", c)]
        assert copy["elapsed_s"] == 0 and copy["reason"].startswith("shared: measured once")
        assert (copy["qps"], copy["started_at"]) == (orig["qps"], orig["started_at"])
        assert copy["stage"] == "b" and copy["payload_bytes"] > 1000
        # processes ship the stage's own items: measured for each stage
        assert cb.loc[("process", c)]["elapsed_s"] > 0 and not cb.loc[("process", c)]["reason"]
    assert set(shared) == {("direct", "thread", 1), ("direct", "thread", 2)}
