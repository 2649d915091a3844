"""``stagebench demo``: diagnostic mode on a bundled, unmodified training script.

The demo is the headline use case end to end, with nothing to set up: the
script (``stagebench/examples/demo_train.py``) generates a small image set on
first use and builds an SPDL pipeline with an I/O stage, a decode, a pure-
Python augmentation, a batch and a collate; its loop is a stand-in model (a
100 ms step), so the demo also measures the training step's demand
(``STAGEBENCH_TRAINER=measure``) and says whether the pipeline keeps up; :func:`run_demo` runs it through
``stagebench diagnose`` at stagebench's defaults (about a minute on two
cores; ``quick``: under half a minute). Settings the user already put in
the environment win over the demo's defaults.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from stagebench.pipeline._script import restore_env, run_script
from stagebench.runs._results import default_run_dir

__all__ = ["run_demo", "DEMO_SCRIPT", "demo_settings"]

DEMO_SCRIPT = Path(__file__).resolve().parent.parent / "examples" / "demo_train.py"


def demo_settings(quick: bool) -> dict[str, str]:
    """Environment defaults of the demo (each used only where the user set nothing)."""
    if quick:  # the quick preset every diagnosis can use (STAGEBENCH_QUICK), on fewer images
        return {
            "STAGEBENCH_QUICK": "on",
            "SPDL_PIPELINE_DIAGNOSTIC_MODE_NUM_ITEMS": "120",
            "STAGEBENCH_TRAINER": "measure",
            "STAGEBENCH_TRAINER_S": "2",
        }
    return {  # stagebench's own defaults: the demo shows what a user gets
        "SPDL_PIPELINE_DIAGNOSTIC_MODE_NUM_ITEMS": "200",
        # the example's loop is a stand-in model (a 100 ms step): safe to run, and it shows the
        # pipeline's capacity against the training step's demand
        "STAGEBENCH_TRAINER": "measure",
        "STAGEBENCH_TRAINER_S": "4",
    }


def run_demo(out: str | None, quick: bool) -> int:
    """Diagnose the bundled example pipeline; return the exit code."""
    run_dir = Path(out) if out else Path(os.environ.get("STAGEBENCH_OUTPUT_DIR") or default_run_dir("demo"))
    data = run_dir.resolve().parent / ".stagebench-demo-data"
    applied = {k: v for k, v in demo_settings(quick).items() if not os.environ.get(k)}
    saved = {k: os.environ.get(k) for k in applied}
    os.environ.update(applied)
    print(
        f"stagebench demo: diagnosing the example training script {DEMO_SCRIPT}\n"
        f"  (images generated once under {data}; {'quick: under half a minute' if quick else 'about a minute'} "
        "on 2 cores; the training loop will not run)",
        file=sys.stderr,
        flush=True,
    )
    try:
        return run_script(str(DEMO_SCRIPT), ["--data", str(data)], out=str(run_dir))
    finally:
        restore_env(saved)
