"""Decisions on evidence for loader settings: readings pooled, the tie-break in turns (analysis/_loader_evidence)."""

from __future__ import annotations

import math

import pytest

from stagebench.analysis._loader import normalize_row, recommend, summarize_loader
from stagebench.analysis._loader_evidence import hinge, paired_verdict, pool_points, setting_key


def _row(nw, sps, *, half=0.02, phase="num_workers", pf=2, n=None, window=1.0, stall=math.nan, status="ok"):
    return normalize_row(
        {
            "loader": "x",
            "backend": "torch",
            "num_workers": nw,
            "prefetch_factor": pf if nw else math.nan,
            "persistent_workers": False,
            "pin_memory": "not applicable",
            "status": status,
            "samples_per_s": sps,
            "samples_per_s_low": sps * (1 - half),
            "samples_per_s_high": sps * (1 + half),
            "batches_per_s": sps / 16,
            "n_samples": sps * window if n is None else n,
            "window_s": window,
            "mem_pss_mb": 300.0 + nw,
            "cores_used": 1.0,
            "epoch_stall_s": stall,
            "elapsed_s": 2.0,
            "search_phase": phase,
        }
    )


def test_a_setting_measured_twice_is_pooled_never_maxed():
    """16 workers at prefetch 1 read 3,068 and 2,569 on the H200 host: the table showed the higher."""
    pts = pool_points([_row(16, 3068.0, window=2.0), _row(16, 2569.0, window=2.0, phase="pin_memory")])
    (p,) = pts
    assert p["measurements"] == 2 and p["readings"] == [3068.0, 2569.0]
    assert p["samples_per_s"] == pytest.approx((3068 + 2569) / 2)  # equal spans: the plain mean
    # the spread between the readings is wider than either's own interval: it sets the pooled one
    assert p["samples_per_s_low"] < 2569 < 3068 < p["samples_per_s_high"]
    # unequal spans weigh by seconds: all samples over all seconds
    (q,) = pool_points([_row(2, 100.0, window=3.0), _row(2, 200.0, window=1.0)])
    assert q["samples_per_s"] == pytest.approx((300 + 200) / (3 + 1))


def test_the_stall_measured_alone_joins_its_setting():
    pts = pool_points([_row(4, 1800.0), _row(4, math.nan, phase="epoch_stall", stall=1.06)])
    (p,) = pts
    assert p["samples_per_s"] == 1800.0 and p["epoch_stall_s"] == pytest.approx(1.06) and p["measurements"] == 1


def test_a_pick_that_rests_on_overlapping_intervals_hinges_on_the_two():
    """2 workers 717 [675, 763] against 4 at 801 [641, 1,067]: 10% apart, inside the noise (issue 32)."""
    two = _row(2, 717.0, half=0.064)
    four = _row(4, 801.0, half=0.33)
    assert hinge(two, four, 0.05) == (two, four)
    assert hinge(_row(2, 790.0), four, 0.05) is None  # within 5% by its reading: the rule's own margin
    assert hinge(four, four, 0.05) is None


def _paired(pairs: list[tuple[float, float]]) -> list[dict]:
    """Rows of a tie-break between 2 and 4 workers: per round cheaper, faster, faster, cheaper."""
    out = []
    for i, (a, b) in enumerate(pairs):
        first, second = (_row(2, a, phase="paired"), _row(4, b, phase="paired"))
        out += [first, second] if i % 2 == 0 else [second, first]
    return out


def test_the_tie_break_names_a_winner_only_beyond_the_margin():
    cheaper, faster = setting_key(_row(2, 1.0)), setting_key(_row(4, 1.0))
    # 4 workers 15% ahead in every pair: the cheaper is not within 5%
    v = paired_verdict(_paired([(682, 782), (690, 790), (675, 780), (680, 785)]), cheaper, faster, 0.05)
    assert v["winner"] == "faster" and v["pairs"] == 4 and v["ratio_low"] > 1 / 0.95
    # level in every pair: the cheaper is within 5%
    v = paired_verdict(_paired([(780, 782), (790, 785), (775, 780), (781, 779)]), cheaper, faster, 0.05)
    assert v["winner"] == "cheaper"
    # all over the place: a tie
    v = paired_verdict(_paired([(700, 800), (800, 700)]), cheaper, faster, 0.05)
    assert v["winner"] == "tie"
    assert paired_verdict(_paired([(700, 800)]), cheaper, faster, 0.05) is None  # one pair says nothing


def test_the_recommendation_follows_the_tie_break():
    search = [_row(0, 470.0), _row(1, 410.0), _row(2, 717.0, half=0.064), _row(4, 801.0, half=0.33)]
    before = recommend(search, budget_mb=None)
    assert before["num_workers"] == 2 and "not measured again in turns" in before["why"]
    ahead = search + _paired([(682, 782), (690, 790), (675, 780), (680, 785)])
    after = recommend(ahead, budget_mb=None)
    assert after["num_workers"] == 4 and "measured again in turns" in after["why"]
    # the pooled point carries every reading of its setting
    four = next(p for p in pool_points([normalize_row(r) for r in ahead]) if p["num_workers"] == 4)
    assert four["measurements"] == 5
    level = search + _paired([(780, 782), (790, 785), (775, 780), (781, 779)])
    assert recommend(level, budget_mb=None)["num_workers"] == 2


def test_a_tie_keeps_the_users_setting_when_it_is_one_of_the_two():
    search = [_row(2, 717.0, half=0.064), _row(4, 801.0, half=0.33)]
    tie = search + _paired([(700, 800), (800, 700)])
    assert recommend(tie, budget_mb=None)["num_workers"] == 2  # the cheaper, without a setting of yours
    meta = {
        "settings": {"memory_budget_mb": None, "usable_cores": 2},
        "loader": {"backend": "torch", "user_knobs": {"num_workers": 4, "prefetch_factor": 2, "pin_memory": False}},
    }
    s = summarize_loader(tie, meta)
    assert s["recommended"]["num_workers"] == 4 and "a tie, which keeps your setting" in s["recommended"]["why"]
    # in the same words as the job's and the pipeline's verdicts
    assert s["verdict"].startswith("keep yours (num_workers=4, prefetch_factor=2):"), s["verdict"]
    mine2 = {**meta, "loader": {**meta["loader"], "user_knobs": {"num_workers": 1, "prefetch_factor": 2}}}
    assert summarize_loader(tie, mine2)["verdict"].startswith("use num_workers=2")


def test_the_tie_break_is_run_in_turns_by_the_search(tmp_path, monkeypatch):
    """The search measures the two the pick hinges on again, cheaper-faster-faster-cheaper, and stops once told apart."""
    import stagebench.loader._sweep as sweep_mod
    from stagebench.loader._sweep import LoaderSweepConfig, run_loader_sweep

    truth = {0: 470.0, 1: 410.0, 2: 717.0, 4: 801.0}
    halves = {0: 0.02, 1: 0.02, 2: 0.064, 4: 0.33}
    calls: list[tuple[int, str]] = []

    def fake_point(factory, knobs, *, name, backend, batch_size, config, phase, cuda, **how):
        calls.append((knobs.num_workers, phase))
        nw = knobs.num_workers
        sps = math.nan if not how.get("throughput", True) else truth[nw] * (0.95 if nw == 2 else 1.0)
        half = 0.02 if phase == "paired" else halves[nw]
        row = _row(nw, sps, half=half, phase=phase, stall=0.5 if not how.get("throughput", True) else math.nan)
        return {**row, "loader": name, "backend": backend, "persistent_workers": False, "pin_memory": "not applicable"}

    monkeypatch.setattr(sweep_mod, "measure_loader_point", fake_point)
    monkeypatch.setattr(sweep_mod, "_cuda_available", lambda: False)
    s = run_loader_sweep(
        lambda knobs: [],
        name="x",
        backend="torch",
        batch_size=16,
        run_dir=tmp_path / "run",
        config=LoaderSweepConfig(transforms=False, num_workers=(0, 1, 2, 4), memory_budget_mb=1e6),
    )
    paired = [nw for nw, phase in calls if phase == "paired"]
    assert paired[:4] == [2, 4, 4, 2]  # in turns: the same moments of the machine for both
    assert len(paired) == 4  # told apart after one round: 4 workers 5% x ... beyond the margin
    assert s["recommended"]["num_workers"] == 4 and "measured again in turns" in s["recommended"]["why"]
    assert calls[-1] == (4, "epoch_stall")  # the stall alone, at the pick
