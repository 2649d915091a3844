"""A stage entry read into its type gives back the same dict, and a missing key reads as its readers took it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stagebench.model._stage import GilEstimate, StageEntry, StageSetting

GOLDEN = Path(__file__).resolve().parent / "data" / "golden"


@pytest.mark.parametrize("summary", sorted(GOLDEN.glob("*/summary.json")), ids=lambda p: p.parent.name)
def test_every_saved_stage_entry_reads_and_writes_back_the_same(summary):
    for st in json.loads(summary.read_text()).get("stages") or []:
        e = StageEntry.from_json(st)
        # the same keys in the same order: summary.json is written as read
        assert json.dumps(e.to_json()) == json.dumps(st)
        assert e.name == st["name"] and e.ok == (st["status"] == "ok")
        if st.get("recommended"):
            assert e.recommended is not None and e.recommended.qps == st["recommended"]["qps"]


def test_missing_keys_read_as_the_readers_took_them():
    e = StageEntry.from_json({"name": "decode"})
    assert e.ok and e.items_per_input == 1.0 and e.recommended is None and e.gil is None
    assert e.alternative("thread") is None and e.curve("spdl/thread") == ()
    assert not StageEntry.from_json({"status": None}).ok  # a status that is there and not "ok"
    assert StageEntry.from_json({"items_per_input": None}).items_per_input == 1.0
    assert StageSetting.from_json({}) is None  # an empty setting is no setting
    g = GilEstimate.from_json({"fraction": 0.3, "interval": [0.2, 0.4], "signals": {"cpu_share": {"value": 0.5}}})
    assert g is not None and g.interval == (0.2, 0.4) and not g.pinned
    assert g.signal_value("cpu_share") == 0.5 and g.signal_value("gil_probe") is None
