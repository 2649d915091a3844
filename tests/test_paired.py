"""The threads-vs-processes head-to-head: when it runs, how it is read, and a known answer."""

from __future__ import annotations

import pandas as pd
import pytest
from _rows import analyzed, row
from _stages import Sleep

from stagebench import MeasureConfig, SweepConfig
from stagebench.core._curves import StageRows
from stagebench.core._paired import MAX_RATIO, paired_result, plan, threads_led_every_pair
from stagebench.core._stage_draft import StageDraft
from stagebench.core._sweep import StageSweep
from stagebench.model._stage import StageEntry


def _found(found) -> list[dict]:
    """A stage's findings as the summary writes them."""
    return [x.finding.to_json() for x in found]


def _curves(thread_qps: float, process_qps: float, noise: float = 0.02) -> list[dict]:
    """Thread and process curves over 1, 2, 4 whose bests are the given throughputs (at 2 and 4)."""
    rows = [
        row("s", "thread", c, q, noise=noise) for c, q in ((1, thread_qps / 2), (2, thread_qps), (4, 0.97 * thread_qps))
    ]
    rows += [
        row("s", "process", c, q, noise=noise)
        for c, q in ((1, process_qps / 3), (2, 0.8 * process_qps), (4, process_qps))
    ]
    return rows


def _paired(ratios: list[float], thread_qps: float = 400.0, status: dict[int, str] | None = None) -> list[dict]:
    """Head-to-head windows T P P T ..., one pair per ratio (process / thread), threads at 2, processes at 4."""
    out = []
    for i, r in enumerate(ratios):
        t = row("s", "thread", 2, thread_qps, role="paired")
        p = row("s", "process", 4, thread_qps * r, role="paired")
        if status and i in status:
            p = row("s", "process", 4, 0.0, role="paired", status=status[i], reason="worker died")
        out += [t, p] if i % 2 == 0 else [p, t]
    return out


@pytest.mark.parametrize(
    ("thread_qps", "process_qps", "planned"),
    [
        (400.0, 520.0, (2, 4)),  # processes 1.3x ahead, beyond noise: measure in turns
        (400.0, MAX_RATIO * 400.0 + 1, None),  # far enough ahead: the curves decide
        (400.0, 410.0, None),  # within noise: threads anyway
        (520.0, 400.0, None),  # threads ahead
    ],
)
def test_a_head_to_head_is_planned_only_when_the_curves_would_pick_processes_by_a_small_margin(
    thread_qps, process_qps, planned
):
    assert plan(StageRows(pd.DataFrame(_curves(thread_qps, process_qps))), "direct") == planned


def test_a_head_to_head_that_threads_win_overturns_the_curves():
    st = analyzed(pd.DataFrame(_curves(400.0, 520.0) + _paired([0.86, 0.9, 0.84, 0.88])), cores=2)
    h = st["head_to_head"]
    assert h["pairs"] == 4 and h["decisive"] and not h["processes_win"]
    # the geometric mean of the pairs' ratios (0.8698), its interval on the log scale
    assert h["ratio"] == pytest.approx(0.87, rel=1e-3) and h["ratio_low"] < h["ratio"] < h["ratio_high"] < 1
    assert (h["thread"]["concurrency"], h["process"]["concurrency"]) == (2, 4)
    assert st["recommended"]["executor"] == "thread" and st["recommended"]["concurrency"] == 2
    assert "head-to-head" in st["recommended"]["why"] and "0.87x" in st["recommended"]["why"]
    assert st["best"]["executor"] == "process"  # the best measured point stays what it was


def test_a_head_to_head_interval_stays_positive_where_two_pairs_disagree():
    """A fresh clone's diagnosis read ratio_low -0.14 from two pairs (a linear interval over the ratios)."""
    st = analyzed(pd.DataFrame(_curves(400.0, 520.0) + _paired([0.5, 1.6])), cores=2)
    h = st["head_to_head"]
    assert h["pairs"] == 2 and 0 < h["ratio_low"] < h["ratio"] < h["ratio_high"]
    assert not h["processes_win"] and st["recommended"]["executor"] == "thread"


def test_processes_are_recommended_when_they_win_the_head_to_head_beyond_noise():
    st = analyzed(pd.DataFrame(_curves(400.0, 520.0) + _paired([1.2, 1.25, 1.22, 1.18])), cores=2)
    assert st["head_to_head"]["processes_win"]
    assert st["recommended"]["executor"] == "process" and "processes win beyond noise" in st["recommended"]["why"]


def test_a_head_to_head_within_noise_keeps_threads():
    # processes ahead on average, but the pairs disagree: not beyond noise
    st = analyzed(pd.DataFrame(_curves(400.0, 520.0) + _paired([1.3, 0.8, 1.25, 0.85])), cores=2)
    assert not st["head_to_head"]["processes_win"] and st["recommended"]["executor"] == "thread"


def test_windows_that_did_not_measure_leave_their_pair_out_and_too_few_pairs_leave_it_to_the_curves():
    rows = _paired([1.2, 1.2, 1.2, 1.2], status={1: "crashed", 2: "crashed", 3: "crashed"})
    h = paired_result(StageRows(pd.DataFrame(rows)), "direct")
    assert h is not None and (h.pairs, h.windows, h.decisive) == (1, 8, False)
    st = analyzed(pd.DataFrame(_curves(400.0, 520.0) + rows), cores=2)
    assert st["recommended"]["executor"] == "process"  # the curves' answer, and it says why
    assert "only 1 usable pair" in st["recommended"]["why"]


def test_paired_rows_are_not_part_of_any_curve():
    st = analyzed(pd.DataFrame(_curves(400.0, 520.0) + _paired([9.0, 9.0])), cores=2)
    assert st["levels_measured"]["direct/process"] == [1, 2, 4]
    assert max(p["qps"] for p in st["curves"]["direct/process"]) == pytest.approx(520.0)


def test_known_answer_a_sleep_stage_that_the_curves_say_runs_faster_on_processes_does_not(tmp_path):
    """A sleep cannot run faster on processes than on threads at the same level (IPC only adds to
    each call), so whatever the curves claimed, the head-to-head must not find processes ahead."""
    cfg = SweepConfig(concurrency=(2,), measure=MeasureConfig(budget_s=0.4, warmup_s=0.1))
    sw = StageSweep(Sleep(3.0), list(range(32)), name="s", config=cfg)
    # a fake lead of processes on the curves
    sw.rows = [StageDraft(**row("s", ex, 2, q, noise=0.01)) for ex, q in (("thread", 500.0), ("process", 640.0))]
    sw.run_paired(None)
    paired = [r for r in sw.rows if r.role == "paired"]
    # one round when threads led both of its pairs (the second cannot turn it), else two
    rounds = 1 if threads_led_every_pair(paired[:4]) else 2
    assert [r.executor for r in paired] == ["thread", "process", "process", "thread"] * rounds
    assert {r.concurrency for r in paired} == {2} and all(r.status == "ok" for r in paired)
    st = analyzed(sw.frame(), cores=2)
    assert st["head_to_head"]["decisive"] and not st["head_to_head"]["processes_win"]
    assert st["recommended"]["executor"] == "thread"


def test_the_head_to_head_ends_a_round_early_only_when_threads_led_every_pair():
    def windows(pairs):  # (thread, process) per pair, in the T P, P T order the sweep measures
        out = []
        for i, (t, p) in enumerate(pairs):
            a = StageDraft("s", "paired", "thread", "direct", 2, qps=t)
            b = StageDraft("s", "paired", "process", "direct", 2, qps=p)
            out += [a, b] if i % 2 == 0 else [b, a]
        return out

    assert threads_led_every_pair(windows([(500, 480), (510, 505)]))
    assert not threads_led_every_pair(windows([(500, 480), (510, 515)]))  # processes led one pair
    assert not threads_led_every_pair(windows([(500, 480)]))  # one pair says too little
    crashed = windows([(500, 480), (510, 505)])
    crashed[1].status = "crashed"
    assert not threads_led_every_pair(crashed)


@pytest.mark.parametrize("first", [(0.99, 0.99), (0.7, 0.95), (0.5, 0.5)])
def test_after_a_round_threads_led_in_full_no_second_round_makes_processes_win(first):
    """What ending the head-to-head early rests on: two pairs under 1, then any two more, never win."""
    for a in (1.0, 1.1, 1.3, 1.6, 2.0, 3.0, 5.0, 10.0):
        for b in (a, a * 1.05, a * 1.5, a * 3):
            h = paired_result(StageRows(pd.DataFrame(_paired([*first, a, b]))), "direct")
            assert h is not None and h.pairs == 4 and not h.processes_win, (first, a, b)


def test_no_head_to_head_when_switched_off():
    cfg = SweepConfig(concurrency=(2,), paired_rounds=0)
    sw = StageSweep(Sleep(3.0), list(range(8)), name="s", config=cfg)
    sw.rows = [StageDraft(**row("s", ex, 2, q, noise=0.01)) for ex, q in (("thread", 500.0), ("process", 640.0))]
    sw.run_paired(None)
    assert len(sw.rows) == 2


def test_the_gil_finding_follows_the_head_to_head():
    from _rows import model_rows

    from stagebench.analysis._findings import _stage_findings

    base = model_rows("s", gil_ms=2.0, wait_ms=0.0)  # gil-bound: the curves put processes ahead
    for ratios, says in (
        ([0.9, 0.92, 0.88, 0.91], "but processes did not help"),
        ([1.4, 1.45, 1.38, 1.42], "use a process executor"),
    ):
        st = analyzed(pd.concat([base, pd.DataFrame(_paired(ratios))]), cores=2)
        assert st["classification"] == "gil-bound"
        f = next(x for x in _found(_stage_findings(StageEntry.from_json(st), "s", 2)) if "holds the GIL" in x["title"])
        assert says in f["title"] and "measured in turns with threads" in f["detail"]
        assert f["evidence"]["head_to_head"]["pairs"] == 4


def test_the_gil_finding_does_not_say_processes_did_not_help_when_they_were_ahead_within_noise():
    """A demo run read augment 1,053 items/s on processes vs 893 on threads, within noise, and the
    finding said 'processes did not help ... cancels the gain': the numbers said otherwise."""
    from _rows import model_rows

    from stagebench.analysis._findings import _stage_findings

    df = model_rows("s", gil_ms=2.0, wait_ms=0.0, noise=0.25)  # intervals +-25%
    proc = (df["executor"] == "process") & (df["role"] == "stage")
    df.loc[proc, ["qps", "qps_low", "qps_high"]] *= 0.62  # processes' best 564 vs threads' 499: ahead, within noise
    st = analyzed(df, cores=2)
    assert st["classification"] == "gil-bound" and st["recommended"]["executor"] == "thread"
    f = next(x for x in _found(_stage_findings(StageEntry.from_json(st), "s", 2)) if "holds the GIL" in x["title"])
    assert "processes were not clearly faster" in f["title"] and "did not help" not in f["title"]
    assert "564 items/s vs 499 on threads" in f["detail"] and "cancels the gain" not in f["detail"]


def test_a_head_to_head_is_skipped_only_where_its_result_could_not_change_the_pipelines_settings():
    """``s`` has processes 1.3x ahead on its curves. Beside ``w``, a 10 ms wait that binds the pipeline at
    ~100 items/s on any executor, whatever the head-to-head found would change nothing the user sets. On
    its own (``w`` fast) the pipeline is ``s``: then its executor is the advice, and the head-to-head runs."""
    from stagebench.analysis._pipeline import paired_needless_of_run, summarize

    meta = {"stages": [{"name": "s"}, {"name": "w"}], "provenance": {"cores": 2}}
    planned = {"s": ("direct", 2, 4)}
    w = [row("w", "thread", c, 100.0 * min(c, 1), noise=0.01, cpu_s_per_item=1e-5) for c in (1, 2, 4)]
    rows = pd.DataFrame(_curves(400.0, 520.0) + w)
    why = paired_needless_of_run(rows, meta, planned)["s"]
    assert why.startswith("no head-to-head: whatever it found (processes at 0.93x to 1.82x threads")
    # the reason reaches the stage's recommendation, which the curves alone decide
    st = summarize(rows, {**meta, "stages": [{"name": "s", "head_to_head_skipped": why}, {"name": "w"}]})["stages"][0]
    assert st["recommended_alone" if "recommended_alone" in st else "recommended"]["why"].endswith(why)

    fast = [row("w", "thread", c, 5000.0 * c, noise=0.01, cpu_s_per_item=1e-5) for c in (1, 2, 4)]
    assert paired_needless_of_run(pd.DataFrame(_curves(400.0, 520.0) + fast), meta, planned) == {}
