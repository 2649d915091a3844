"""A labelled corpus: known-answer stages of every kind, and rows from 16 cores, must get their true labels.

A stage's label says what limits the stage itself (analysis/_pipeline._nature), the same on 2 or 96 cores:
the stages here are diagnosed on this machine, and the demo's rows from a 16-core H200 host
(tests/data/host16) are rebuilt; both must read as their truth. What limits a stage's best setting (IPC,
the cores, the harness) is its ``limit``, a separate fact.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from _rows import analyzed, model_rows
from _stages import AsyncSleep, HashCPU, Sleep, Spin, SpinSleep
from spdl.pipeline import PipelineBuilder

from stagebench.pipeline._diagnose import diagnose_pipeline
from stagebench.pipeline._settings import DiagnoseSettings

ROOT = Path(__file__).resolve().parent
EXAMPLE = ROOT.parent / "reports" / "example"


def tiny(item):
    """A call far shorter than any harness's cost of scheduling an item."""
    return item


#: (name, stage, the truth)
CORPUS = [
    ("wait_2ms", Sleep(2.0), "io-bound"),
    ("python_1ms", Spin(1.0), "gil-bound"),
    ("hash_1ms", HashCPU(1.0), "cpu-bound"),
    ("mostly_waiting", SpinSleep(0.3, 2.0), "io-bound"),
    ("mostly_python", SpinSleep(1.0, 0.25), "gil-bound"),
    ("tiny", tiny, "overhead-bound"),
    ("await_3ms", AsyncSleep(3.0), "io-bound"),
]

#: The demo's stages, on any host (its README): a file read with storage latency, Pillow decode, a
#: pure-Python colour jitter, SPDL's batching step, numpy collate.
DEMO_TRUTH = {
    "read": "io-bound",
    "decode": "cpu-bound",
    "augment": "gil-bound",
    "aggregate(op=collate(16), drop_last=False)": "overhead-bound",
    "collate": "cpu-bound",
}


@pytest.fixture(scope="module")
def corpus_run(tmp_path_factory):
    b = PipelineBuilder().add_source(range(10**6))
    for name, stage, _ in CORPUS:
        b = b.pipe(stage, concurrency=2, name=name)
    cfg = b.add_sink(8).get_config()
    settings = DiagnoseSettings(
        num_items=60,
        budget_s=0.3,
        warmup_s=0.1,
        timeout_s=15,
        concurrency=(1, 2, 4),
        executors=("thread",),
        harnesses=("spdl",),
        validate="off",
        validation_s=0.3,
        cache_dir="off",
        paired_rounds=0,
    )
    out = tmp_path_factory.mktemp("labels") / "run"
    return diagnose_pipeline(cfg, out=out, settings=settings, show_table=False, report=False)


@pytest.mark.parametrize("name, truth", [(n, t) for n, _, t in CORPUS])
def test_a_known_answer_stage_gets_its_true_label_on_this_machine(corpus_run, name, truth):
    st = next(s for s in corpus_run["stages"] if s["name"] == name)
    busy = [n for n in st["gil"]["notes"] if "the machine was busy" in n]
    if busy and st["gil"]["source"] == "curves" and truth in ("cpu-bound", "gil-bound"):
        # Between a GIL-held and a GIL-free computing stage, on 2 cores, only the direct reading decides:
        # when other programs hold a core, threads of either kind get one core and flatten alike (a VM at
        # load average 4-5 read the 1 ms hash as gil-bound). The stage's notes say the reading was not
        # taken; the truth is not measurable then.
        pytest.skip(f"{name}: {busy[0]}")
    assert st["classification"] == truth, st["evidence"]["summary"]
    # the shares beside the label never contradict it: its own share is the largest
    signals = st["evidence"]["signals"]
    if truth != "overhead-bound":
        verdict = [k for k, v in signals.items() if k.startswith("share_") and v.get("role") == "verdict"]
        assert verdict == [f"share_{truth.split('-')[0]}"], signals


def _rebuilt(tmp_path: Path, src: Path) -> dict:
    from stagebench.sweep._rebuild import rebuild

    run = tmp_path / src.name
    shutil.copytree(src, run, ignore=shutil.ignore_patterns("report.html", "screenshot.png"))
    rebuild(run)
    return json.loads((run / "summary.json").read_text())


@pytest.mark.parametrize(
    "where", [ROOT / "data" / "host16" / "demo", EXAMPLE], ids=["16 cores, H200 host", "2 cores, this VM"]
)
def test_the_demos_stages_read_the_same_on_16_cores_as_on_2(tmp_path, where):
    if not (where / "results.csv").is_file():
        pytest.skip(f"no rows in {where}")
    s = _rebuilt(tmp_path, where)
    labels = {st["name"]: st["classification"] for st in s["stages"]}
    assert labels == DEMO_TRUTH
    # what limits the best setting alone is a second fact: never a label
    assert all(st["limit"] is None or "kind" in st["limit"] for st in s["stages"])


# --------------------------------------------------------------------------- ties, decided with their noise
@pytest.mark.parametrize("f", [0.41, 0.45, 0.494, 0.5, 0.506, 0.55, 0.59])
def test_shares_within_their_noise_of_each_other_are_a_mix_and_the_tie_rule_labels_them(f):
    """Issue 36: a 50/50 spin-and-sleep stage read GIL 0.494 against waiting 0.505 and flipped labels."""
    from stagebench.analysis._labels import label_mix, label_of_call

    # a spin-and-sleep stage: half its call on the CPU, all of that holding the GIL; f is the GIL share as read
    label, line, signals = label_of_call(4e-3, 0.5, f, "thread concurrency 1")
    assert label == "gil-bound" and label_mix(signals) == ("gil-bound", "io-bound")
    assert "a mix: holding the GIL and waiting are within the GIL share's noise" in line


@pytest.mark.parametrize(
    ("f", "a", "label"), [(0.2, 0.2, "io-bound"), (0.8, 0.8, "gil-bound"), (0.05, 0.95, "cpu-bound")]
)
def test_shares_apart_beyond_their_noise_are_no_mix(f, a, label):
    from stagebench.analysis._labels import label_mix, label_of_call

    got, line, signals = label_of_call(4e-3, a, f, "thread concurrency 1")
    assert got == label and label_mix(signals) == () and "a mix" not in line


def test_under_a_cpu_quota_threads_the_quota_held_back_are_not_read_as_the_gil():
    """Issue 59: on one CPU's worth of quota, threads computing without the GIL and threads holding it both
    use one core and flatten there; the curves alone read the first as the GIL. What tells them apart is
    what the threads wanted: the quota held the hashing ones back (cores_throttled, as measured: 0.40 at
    2 threads), not the spinning ones. Then the limit is the cores, named with the quota."""
    bound = "1.0 CPU by the container's quota, of 2"
    rows = model_rows("hash", gil_ms=0.0, wait_ms=0.0, free_cpu_ms=0.5, cores=1, levels=(1, 2), executors=("thread",))
    assert analyzed(rows, cores=1.0, cores_bound=bound, n_boot=50)["classification"] == "gil-bound"
    rows["cores_throttled"] = 0.0
    rows.loc[(rows["role"] == "stage") & (rows["concurrency"] == 2), "cores_throttled"] = 0.40
    st = analyzed(rows, cores=1.0, cores_bound=bound, n_boot=50)
    assert st["classification"] == "cpu-bound"
    assert st["limit"]["text"].startswith("limited by the cores: 1.0 CPU by the container's quota, of 2; at thread")
    assert "1.40 cores at concurrency 2 (1.00 used, 0.40 more the CPU quota held back)" in str(st["evidence"])
    spin = model_rows("spin", gil_ms=0.5, wait_ms=0.0, cores=1, levels=(1, 2), executors=("thread",))
    spin["cores_throttled"] = 0.0
    assert analyzed(spin, cores=1.0, cores_bound=bound, n_boot=50)["classification"] == "gil-bound"
