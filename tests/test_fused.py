"""A stage measured fused with the stages before it is counted once (analysis/_fused)."""

from __future__ import annotations

import pytest
from _stages import HashCPU, Spin
from spdl.pipeline import PipelineBuilder

from stagebench.analysis._fused import unfuse
from stagebench.model._meta import RunMeta
from stagebench.model._stage import StageEntry
from stagebench.pipeline._diagnose import diagnose_pipeline
from stagebench.pipeline._settings import DiagnoseSettings


def _entry(name, *, t, cpu, gil, k=1.0, qps=None, curve=(1, 2)):
    qps = qps or 1.0 / t
    entry = {
        "name": name,
        "status": "ok",
        "type": "pipe",
        "items_per_input": k,
        "stage_s_per_item": t,
        "gil_s_per_item": gil,
        "gil_fraction": gil / t,
        "gil_fraction_interval": [gil / t, gil / t],
        "cpu_s_per_item": cpu,
        "alternatives": {"thread": {"concurrency": 1, "qps": qps, "call_cpu_s": cpu, "cpu_s_per_item": cpu}},
        "curves": {"spdl/thread": [{"concurrency": c, "qps": qps * c, "cpu_s_per_item": cpu} for c in curve]},
        "recommended": {"executor": "thread", "concurrency": 1, "qps": qps},
        "best": {"executor": "thread", "concurrency": 2, "qps": 2 * qps},
        "evidence": {"summary": [], "signals": {}},
    }
    return StageEntry.from_json(entry)


def test_the_chains_work_per_call_is_taken_out_of_the_fused_stage():
    # decode: 1 ms a frame; aggregate: a batch of 8; convert: 0.3 ms a batch, measured with 8 decodes in each call
    decode = _entry("decode", t=1e-3, cpu=1e-3, gil=0.05e-3)
    agg = _entry("agg", t=2e-6, cpu=2e-6, gil=2e-6, k=8.0)  # one call groups 8 items
    fused_t = 8 * 1e-3 + 2e-6 + 0.3e-3
    convert = _entry("convert", t=fused_t, cpu=fused_t, gil=8 * 0.05e-3 + 2e-6 + 0.1e-3, k=8.0)
    meta = {"stages": [{"name": "decode"}, {"name": "agg"}, {"name": "convert", "fused_chain": ["decode", "agg"]}]}
    stages = [decode, agg, convert]
    assert unfuse(stages, RunMeta.from_json(meta)) == ["convert"]
    assert stages[:2] == [decode, agg]  # nothing else changes
    convert = stages[2]
    assert convert.stage_s_per_item == pytest.approx(0.3e-3, rel=1e-6)
    assert convert.cpu_s_per_item == pytest.approx(0.3e-3, rel=1e-6)
    assert convert.gil_s_per_item == pytest.approx(0.1e-3, rel=1e-6)
    # a point's lane (concurrency / throughput) loses the chain's time per call: at 1 thread, 1 / 0.3 ms
    assert convert.recommended.qps == pytest.approx(1 / 0.3e-3, rel=1e-6)
    assert convert.curve("spdl/thread")[1].qps == pytest.approx(2 / 0.3e-3, rel=1e-6)
    assert "measured fused with decode, agg" in convert.evidence.summary[-1]
    assert unfuse([decode], RunMeta.from_json({"stages": [{"name": "decode"}]})) == []


class Frame:
    def __init__(self, x):
        self.x = x
        self.taken = False


_decode_cpu = HashCPU(1.0)
_convert_py = Spin(0.3)


def decode(i):
    _decode_cpu(i)  # 1 ms of GIL-free CPU, as an image decode
    return Frame(i)


def convert(frames):
    """Takes ownership of its frames, as spdl.io.convert_frames does: a second call on them fails."""
    for f in frames:
        if f.taken:
            raise RuntimeError("frame already converted")
        f.taken = True
    _convert_py(0)
    return [f.x for f in frames]


def test_the_multi_thread_preprocessing_shape_is_counted_once(tmp_path):
    """decode -> batch -> convert (SPDL's multi_thread_preprocessing.py): predicted 295 items/s against 477
    measured when convert's fused rows counted decode twice, the bounds (413) under the measured pipeline."""
    cfg = (
        PipelineBuilder()
        .add_source(range(10**6))
        .pipe(decode, concurrency=2, name="decode")
        .aggregate(8)
        .pipe(convert, name="convert")
        .add_sink(4)
        .get_config()
    )
    settings = DiagnoseSettings(
        num_items=120,
        budget_s=0.3,
        warmup_s=0.1,
        timeout_s=15,
        concurrency=(1, 2, 4),
        executors=("thread",),
        harnesses=("spdl",),
        validation_s=1.5,
        cache_dir="off",
        paired_rounds=0,
    )
    s = diagnose_pipeline(cfg, out=tmp_path / "run", settings=settings, show_table=False, report=False)
    conv = next(st for st in s["stages"] if st["name"] == "convert")
    assert conv["fused_chain"] == ["decode", "aggregate(op=collate(8), drop_last=False)"]
    assert any("measured fused with" in line for line in conv["evidence"]["summary"])
    measured, pred = s["validation"]["qps"], s["prediction"]
    dec = next(st for st in s["stages"] if st["name"] == "decode")
    if any("the machine was busy" in n for n in dec["gil"]["notes"]):
        # Decode's GIL share was not read directly: the probe found the machine busy, and on 2 loaded cores
        # the curves read a GIL-free hash as GIL-held (0.8-1.0: its threads cannot use the second core).
        # The GIL bound and the prediction then rest on that reading, which is not this test's subject: the
        # chain counted once is, in convert's own bound.
        assert dec["gil"]["source"] == "curves"
        assert pred["bounds"]["stages"] >= 0.85 * measured, pred["explanation"]
        return
    # the bounds bound: no longer under the pipeline they bound (beyond a loaded machine's noise)
    assert pred["bounds_qps"] >= 0.85 * measured, pred["explanation"]
    # and the prediction is not under it as the chain counted twice put it (0.62x): one-sided, because on a
    # loaded 2-core host the replay also read 1.32x once (1,200 against 906), noise this test is not about;
    # its accuracy both ways is bench_diagnosis's (15%, on a quiet machine)
    assert pred["qps"] >= 0.7 * measured, pred["explanation"]
