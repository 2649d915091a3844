"""A diagnosis ends with no native leak report: what it held is freed before the interpreter finalises.

Issue 60: a diagnosis of SPDL's imagenet_classification.py (its stage decodes JPEGs with spdl.io and
hands the model a permuted torch view of the decoded batch) ended with "nanobind: leaked 1 instances!
... CPUBuffer" on the user's terminal. The diagnosis keeps real stage outputs (``Plan.sample_outputs``,
the replay's stand-ins) and stops dozens of SPDL pipelines with items still in their queues; at the
end all of it is garbage in reference cycles. A tensor view freed while the interpreter finalises
does not release the numpy array under its base, so the ``CPUBuffer`` spdl.io decoded into outlived
the interpreter whenever no full collection ran after the last pipeline stopped (one run in three
of the example with ``--trainer``). The script here turns ``gc`` off, as training scripts do to avoid
collection pauses: then no collection ever runs before the exit, and a leak shows on every run.
Both ways a diagnosis ends its process also freeze what survives their last collection (``freeze_for_exit``:
the interpreter's own collections at exit cost 0.25-0.3 s): whatever that leaves uncollected must hold no
native instance either.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPT = """
import gc
import sys
import time
from pathlib import Path

import spdl.io
from spdl.pipeline import PipelineBuilder

gc.disable()  # no collection pauses in the training loop: nothing is collected before the exit either


def decode(path):
    buffer = spdl.io.load_image(str(path))  # spdl.io's CPUBuffer
    return spdl.io.to_torch(buffer).permute(2, 0, 1)  # a view on it, channels first, as a model wants


def main():
    paths = sorted(Path(sys.argv[1]).glob("*.jpg"))
    pipeline = PipelineBuilder().add_source(paths).pipe(decode, concurrency=2, name="decode").add_sink(4).build(num_threads=2)
    seen = 0
    with pipeline.auto_stop():
        for image in pipeline:
            seen += image.shape[0] > 0
            time.sleep(0.002)  # the step: a loop of microseconds would take the job phase minutes to time
    print("trained on", seen, "images")


if __name__ == "__main__":
    main()
"""

FAST = {
    "STAGEBENCH_BUDGET_S": "0.1",
    "STAGEBENCH_MIN_WINDOW_S": "0.05",
    "STAGEBENCH_WARMUP_S": "0.02",
    "STAGEBENCH_CONCURRENCY": "1,2",
    "STAGEBENCH_EXECUTORS": "thread",
    "STAGEBENCH_VALIDATION_S": "0.2",  # the replay and the real pipeline run: their pipelines stop with items
    "STAGEBENCH_GIL_PROBE": "off",
    "STAGEBENCH_TIMEOUT_S": "30",
    "STAGEBENCH_CACHE_DIR": "off",  # outputs computed here, on CPUBuffers (a cached one is unpickled: no CPUBuffer)
    "SPDL_PIPELINE_DIAGNOSTIC_MODE_NUM_ITEMS": "16",
}
TRAINER = {"STAGEBENCH_TRAINER": "measure", "STAGEBENCH_TRAINER_S": "0.3", "STAGEBENCH_JOB_S": "1"}


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    """A few small JPEGs (Pillow, a dependency), and a check that spdl.io decodes them here."""
    from PIL import Image

    root = tmp_path_factory.mktemp("jpegs")
    rng = np.random.default_rng(0)
    for i in range(8):
        pixels = rng.integers(0, 256, size=(48, 64, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / f"img{i}.jpg", format="JPEG", quality=90)
    try:
        import spdl.io

        spdl.io.load_image(str(root / "img0.jpg"))
    except Exception as e:  # FFmpeg's libraries missing: `make test` installs them as root
        pytest.skip(f"spdl.io cannot decode a JPEG here: {type(e).__name__}: {e}")
    return root


def _run(tmp_path: Path, images: Path, how: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    (tmp_path / "train.py").write_text(SCRIPT)
    e = {k: v for k, v in os.environ.items() if not k.startswith(("STAGEBENCH_", "SPDL_PIPELINE_DIAGNOSTIC"))}
    e.pop("LOCAL_RANK", None)
    e.update(FAST, STAGEBENCH_OUTPUT_DIR=str(tmp_path / "run"), **env)
    if how == "mode":  # SPDL_PIPELINE_DIAGNOSTIC_MODE=1 python train.py: the SystemExit ends the interpreter
        e["SPDL_PIPELINE_DIAGNOSTIC_MODE"] = "1"
        args = ["train.py", str(images)]
    else:  # stagebench diagnose train.py: the script runs in our process, then the command exits
        args = ["-m", "stagebench", "diagnose", "train.py", str(images)]
    return subprocess.run([sys.executable, *args], cwd=tmp_path, env=e, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    ("how", "env"),
    [("mode", {}), ("diagnose", {}), ("diagnose", TRAINER)],
    ids=["mode", "diagnose", "diagnose-trainer"],
)
def test_a_diagnosis_of_a_pipeline_decoding_with_spdl_io_ends_with_no_leak_report(tmp_path, images, how, env):
    r = _run(tmp_path, images, how, env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "leaked" not in r.stderr, r.stderr[-3000:]  # nanobind: leaked N instances! ... CPUBuffer
    assert (tmp_path / "run" / "report.html").is_file()  # the diagnosis ran and ended as it does
    assert "trained on" not in r.stdout  # its own pipeline never ran: every CPUBuffer was ours
    if env:
        assert "job:" in r.stderr  # the loop ran on the job runs' batches, from our pipelines


def test_the_exit_freezes_after_one_collection_not_two(monkeypatch):
    """A diagnosis's release collects what it held; the freeze at the exit then walks nothing again (a full
    collection over a diagnosis's imports is 0.06 s here), while a command that released nothing collects
    before it freezes."""
    import gc

    from stagebench.pipeline import _state

    calls: list[str] = []
    monkeypatch.setattr(gc, "collect", lambda *a: calls.append("collect") or 0)
    monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
    monkeypatch.setattr(_state.State, "released", False)
    monkeypatch.setattr(_state.State, "walk", None)
    _state.freeze_for_exit()  # `stagebench report`, a sweep: nothing released yet
    assert calls == ["collect", "freeze"]
    calls.clear()
    _state.release_held()  # `stagebench diagnose`: run_script released what the diagnosis held ...
    _state.freeze_for_exit()  # ... and the command then ends
    assert calls == ["collect", "freeze"]
    calls.clear()
    _state.release_at_exit()  # diagnostic mode's atexit hook
    assert calls == ["collect", "freeze"]
