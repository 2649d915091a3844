"""The training job's typed records (model/_job) read a saved summary and run.json and write back what they hold."""

from __future__ import annotations

import json
from pathlib import Path

from stagebench.model._job import JobRecord, JobVerdict, StepAlone

ROOT = Path(__file__).resolve().parents[1]
SUMMARY = ROOT / "tests" / "data" / "golden" / "example" / "summary.json"
RUN = ROOT / "reports" / "example" / "run.json"


def test_the_step_alone_and_the_job_verdict_write_back_what_the_summary_holds():
    s = json.loads(SUMMARY.read_text())
    assert StepAlone.from_json(s["trainer"]).to_json() == s["trainer"]
    v = JobVerdict.from_json(s["job"])
    assert v is not None and v.decided and v.pick == s["job"]["pick"]
    assert v.decision is not None and v.decision.to_json() == s["job"]["decision"]
    for c, raw in zip(v.candidates, s["job"]["candidates"], strict=True):
        assert c.job is not None and c.job.to_json() == raw["job"]
        assert c.to_json() == {"versus_yours": None, **raw}
    picked = v.picked
    assert picked is not None and picked.job is not None and picked.job.rate is not None
    assert picked.job.rate.value == s["job"]["samples_per_s"]


def test_the_job_record_reads_every_slice_of_run_json():
    r = json.loads(RUN.read_text())["job"]
    rec = JobRecord.from_json(r)
    assert [c.key for c in rec.candidates] == [c["key"] for c in r["candidates"]]
    for typed, raw in zip(rec.slices, r["slices"], strict=True):
        assert typed.to_json() == {k: raw.get(k) for k in typed.to_json()}


def test_nothing_measured_reads_as_nothing():
    assert JobVerdict.from_json(None) is None and JobVerdict.from_json({}) is None
    assert StepAlone.from_json(None).rate is None
    assert JobRecord.from_json(None).candidates == ()


def test_a_job_read_above_its_step_alone_within_noise_says_as_fast_not_over_100_percent():
    """ImageNet --dummy: the job read 9.9 samples/s (9.2-10.6) against 9.0 (8.1-9.8) for six steps alone."""
    from stagebench.analysis._job import _bound
    from stagebench.model._job import JobFigures
    from stagebench.model._rate import Rate

    fig = JobFigures.from_json(
        {"samples_per_s": 9.9, "samples_per_s_low": 9.2, "samples_per_s_high": 10.6, "data_wait_share": 0.0}
    )
    bound, text = _bound(fig, Rate(9.0, 8.1, 9.8), "samples/s")
    assert bound == "trainer-bound" and "as fast as your step alone" in text
    # the noise named is the overlap of the two intervals, both shown (not a share over one's point value)
    assert "the job's 9.9 samples/s (9.2-11) reaches into the step's interval" in text and "%" not in text
    # apart beyond both intervals: the host moved between the two measurements, and the words say so
    fig = JobFigures.from_json({"samples_per_s": 12.0, "samples_per_s_low": 11.5, "samples_per_s_high": 12.5})
    assert "faster than the step measured alone" in _bound(fig, Rate(9.0, 8.1, 9.8), "samples/s")[1]
    # a little above, beyond both intervals: a share, not "within noise"
    fig = JobFigures.from_json({"samples_per_s": 10.5, "samples_per_s_low": 10.4, "samples_per_s_high": 10.6})
    text = _bound(fig, Rate(10.0, 9.9, 10.1), "samples/s")[1]
    assert "runs at 105% (104%-106%) of your step alone" in text and "within noise" not in text
