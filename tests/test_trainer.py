"""STAGEBENCH_TRAINER=measure: the training step's demand from the user's own loop, against the pipeline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from stagebench.core._steps import WARMUP_STEPS, TrainerProbe

# A training script: batches of 32 from an SPDL pipeline, a loop body that takes 40 ms a step (800 items/s).
SCRIPT = textwrap.dedent(
    """
    import sys, time
    from spdl.pipeline import PipelineBuilder

    def stage(x):
        time.sleep(float(sys.argv[1]))
        return x

    p = (PipelineBuilder().add_source(range(10**6)).pipe(stage, concurrency=2).aggregate(32)
         .add_sink(4).build(num_threads=4))
    with p.auto_stop():
        for step, batch in enumerate(p):
            assert len(batch) == 32
            time.sleep(0.040)  # the training step
    """
)

ENV = {
    "STAGEBENCH_BUDGET_S": "0.3",
    "STAGEBENCH_WARMUP_S": "0.1",
    "STAGEBENCH_TIMEOUT_S": "15",
    "STAGEBENCH_VALIDATION_S": "1",
    "STAGEBENCH_EXECUTORS": "thread",
    "STAGEBENCH_HARNESSES": "spdl",
    "STAGEBENCH_CACHE_DIR": "off",
    "STAGEBENCH_PAIRED_ROUNDS": "0",
    "STAGEBENCH_GIL_PROBE": "off",
    "SPDL_PIPELINE_DIAGNOSTIC_MODE_NUM_ITEMS": "128",
    "STAGEBENCH_TRAINER": "measure",
    "STAGEBENCH_TRAINER_S": "2",
}


def _run(tmp_path: Path, stage_s: float, grid: str) -> tuple[subprocess.CompletedProcess, dict]:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STAGEBENCH_", "SPDL_PIPELINE_DIAGNOSTIC"))}
    env.update(ENV, STAGEBENCH_CONCURRENCY=grid, SPDL_PIPELINE_DIAGNOSTIC_MODE="1")
    env["STAGEBENCH_OUTPUT_DIR"] = str(tmp_path / "run")
    r = subprocess.run(
        [sys.executable, str(script), str(stage_s)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return r, json.loads((tmp_path / "run" / "summary.json").read_text())


@pytest.mark.parametrize(
    "stage_s, grid, verdict",
    [
        (0.0005, "1,2,4,8", "trainer-bound"),  # a 0.5 ms stage on up to 8 threads: thousands of items/s
        (0.020, "1", "data-bound"),  # a 20 ms stage on one thread: 50 items/s against 800
    ],
)
def test_the_loops_own_step_is_the_demand_and_the_verdict_is_right_on_both_sides(tmp_path, stage_s, grid, verdict):
    r, s = _run(tmp_path, stage_s, grid)
    t = s["trainer"]
    # 40 ms a step, 32 items a batch: 800 items/s (sleeps overshoot a little on a loaded machine)
    assert t["samples_per_s"] == pytest.approx(800, rel=0.05), t
    assert t["samples_per_s_low"] <= t["samples_per_s"] <= t["samples_per_s_high"]
    assert t["items_per_step"] == pytest.approx(32) and t["steps"] >= 20
    d = s["demand"]
    assert d["verdict"] == verdict and d["demand_source"] == "measured", d["text"]
    assert "your training step, measured" in d["text"]
    wp = t["with_pipeline"]
    assert wp is not None and wp["steps"] >= 2
    if verdict == "data-bound":
        # 50 items/s of data against a step of 40 ms per 32 items: the loop waits most of each step
        assert wp["data_wait_share"] > 0.6 and wp["samples_per_s"] < 120
    else:
        assert wp["data_wait_share"] < 0.3
    assert "trainer:" in r.stderr and "waiting for data" in r.stderr
    assert "your training step, measured" in (tmp_path / "run" / "report.html").read_text()


def test_the_probe_times_the_loop_body_and_skips_the_warm_up_steps():
    """A fake clock: the loop takes 5 s on its first step (a compile), then 10 ms a step."""
    now = [0.0]
    probe = TrainerProbe(seconds=0.1, items_per_batch=4, say=lambda s: None, clock=lambda: now[0])
    steps = 0
    for batch in probe.alone_phase(["b0", "b1"]):
        assert batch in ("b0", "b1")
        now[0] += 5.0 if steps == 0 else 0.010
        steps += 1
    r = probe.result()
    assert r["steps"] == steps - WARMUP_STEPS and r["steps_per_s"] == pytest.approx(100)
    assert r["samples_per_s"] == pytest.approx(400) and r["with_pipeline"] is None


def test_a_loop_that_stops_at_once_gives_no_demand():
    probe = TrainerProbe(seconds=1.0, items_per_batch=1, say=lambda s: None)
    for _ in probe.alone_phase(["b"]):
        break
    r = probe.result()
    assert r["samples_per_s"] is None and "fewer than" in r["error"]


def test_quick_mode_applies_its_preset_under_the_users_own_settings():
    from stagebench._settings import QUICK, STAGE_WINDOW_S
    from stagebench.pipeline._settings import DiagnoseSettings

    s = DiagnoseSettings.from_env({"STAGEBENCH_QUICK": "on", "STAGEBENCH_BUDGET_S": "0.5"})
    assert s.budget_s == 0.5  # the user's own setting wins
    assert s.concurrency == QUICK["concurrency"] and s.min_window_s == QUICK["min_window_s"] and s.paired_rounds == 0
    assert DiagnoseSettings.from_env({"STAGEBENCH_QUICK": "on", "STAGEBENCH_MAX_CONCURRENCY": "8"}).concurrency == (
        1,
        2,
        4,
        8,
    )
    assert DiagnoseSettings.from_env({}).budget_s == STAGE_WINDOW_S and DiagnoseSettings.from_env({}).quick == "off"
    # threads only, unless the user asks for processes
    assert s.executors == ("thread",) and s.precision == QUICK["precision"]
    both = DiagnoseSettings.from_env({"STAGEBENCH_QUICK": "on", "STAGEBENCH_EXECUTORS": "thread,process"})
    assert both.executors == ("thread", "process")
    assert DiagnoseSettings.from_env({}).executors == ("thread", "process")
    with pytest.raises(ValueError, match="STAGEBENCH_QUICK must be one of off, on"):
        DiagnoseSettings.from_env({"STAGEBENCH_QUICK": "yes"})


LOADER_SCRIPT = textwrap.dedent(
    """
    import sys, time
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Slow(Dataset):
        def __len__(self):
            return 256

        def __getitem__(self, i):
            time.sleep(float(sys.argv[1]))
            return torch.full((4,), float(i))

    loader = DataLoader(Slow(), batch_size=32, shuffle=True, num_workers=2)
    for epoch in range(100):
        for batch in loader:
            assert batch.shape == (32, 4)
            time.sleep(0.040)  # the training step: 800 samples/s
    """
)


@pytest.mark.parametrize(
    "item_s, met",
    [
        (0.0, True),  # in-memory items: thousands of samples/s, so the cheapest setting (no workers) feeds it
        (0.01, False),  # 10 ms an item: under 400 samples/s on two cores, against 800
    ],
)
def test_a_dataloader_scripts_own_step_is_the_demand(tmp_path, item_s, met):
    script = tmp_path / "train.py"
    script.write_text(LOADER_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STAGEBENCH_", "SPDL_PIPELINE_DIAGNOSTIC"))}
    env.update(STAGEBENCH_TRAINER="measure", STAGEBENCH_TRAINER_S="2")
    run = tmp_path / "run"
    r = subprocess.run(
        [sys.executable, "-m", "stagebench", "diagnose", "--out", str(run), str(script), str(item_s)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads((run / "summary.json").read_text())
    t = s["trainer"]
    assert t["samples_per_s"] == pytest.approx(800, rel=0.05), t
    assert s["target"]["source"] == "measured" and s["target"]["met"] is met, s["target"]
    wp = t["with_pipeline"]
    assert wp is not None and (wp["data_wait_share"] < 0.3 if met else wp["data_wait_share"] > 0.4), wp
    if met:  # the cheapest measured setting that feeds the step, not the fastest
        assert s["recommended"]["num_workers"] == 0 and "cheapest setting" in s["recommended"]["why"]
    assert "trainer on the live loader" in r.stderr
