"""The training job: the user's loop run at candidate settings in turns (core/_jobrun), and the verdict (analysis/_job)."""

from __future__ import annotations

import contextlib
import math

import pytest

from stagebench.analysis._job import candidate_figures, contenders, decide_job
from stagebench.analysis._loader import job_candidates, summarize_loader
from stagebench.core._jobrun import MIN_SLICE_STEPS, Candidate, JobRuns, group_steps
from stagebench.core._steps import WARMUP_STEPS


class FakeLoop:
    """A clock and a loop body: each candidate's batches arrive after ``wait[key]`` s, the body takes ``body`` s."""

    def __init__(self, wait: dict[str, float], body: float = 0.01) -> None:
        self.now = 0.0
        self.wait = wait
        self.body = body
        self.opened: list[str] = []

    def clock(self) -> float:
        return self.now

    def opener(self, cand: Candidate):
        @contextlib.contextmanager
        def opened():
            self.opened.append(cand.key)
            if self.wait[cand.key] < 0:
                raise RuntimeError("a worker died")

            def get():
                self.now += self.wait[cand.key]
                return cand.key

            yield get

        return opened()

    def run(self, runs: JobRuns, contenders_fn=lambda rec: [], steps: int | None = None) -> int:
        n = 0
        for _ in runs.run(self.opener, contenders_fn):
            self.now += self.body
            n += 1
            if steps is not None and n >= steps:
                break
        return n


def _cand(key: str, cost: float, origin: str = "feeds", round_steps: int = 1) -> Candidate:
    return Candidate(key=key, label=key, settings={"k": key}, origin=(origin,), cost=(cost,), round_steps=round_steps)


def _runs(cands, loop, **kw) -> JobRuns:
    kw.setdefault("max_slice_s", 5.0)
    kw.setdefault("budget_s", 100.0)
    return JobRuns(cands, items_per_step=10, say=lambda s: None, clock=loop.clock, **kw)


def test_a_slice_warms_up_a_round_of_workers_and_counts_whole_rounds():
    loop = FakeLoop({"w8": 0.0})
    runs = _runs([_cand("w8", 8, round_steps=8)], loop, max_rounds=1)
    loop.run(runs)
    (s,) = runs.record()["slices"]
    assert s["warmup_steps"] == max(WARMUP_STEPS, 8) == 8  # the first round: the workers' start-up burst
    n = len(s["waits"])
    assert n % group_steps(8) == 0 and n >= MIN_SLICE_STEPS  # whole rounds, at least 0.3 s of 10 ms steps
    assert n * 0.01 >= 0.3
    # one worker, no rounds: groups of four steps
    assert group_steps(1) == 4 and group_steps(3) == 6 and group_steps(16) == 16


def test_candidates_take_turns_first_in_priority_order_then_reversed():
    loop = FakeLoop({"yours": 0.0, "feeds": 0.0, "best": 0.0})
    cands = [_cand("yours", 2, "yours"), _cand("feeds", 1), _cand("best", 4, "best")]
    runs = _runs(cands, loop)
    loop.run(runs, contenders_fn=lambda rec: ["yours", "feeds", "best"] if rec["rounds"] < 2 else [])
    assert loop.opened == ["yours", "feeds", "best", "best", "feeds", "yours"]
    assert runs.record()["rounds"] == 2


def test_a_failing_candidate_is_recorded_and_the_others_still_run():
    loop = FakeLoop({"a": 0.0, "b": -1.0, "c": 0.0})
    runs = _runs([_cand("a", 1), _cand("b", 2), _cand("c", 3)], loop, max_rounds=1)
    loop.run(runs)
    status = {s["candidate"]: s["status"] for s in runs.record()["slices"]}
    assert status == {"a": "ok", "b": "failed", "c": "ok"}
    assert "a worker died" in runs.record()["slices"][1]["reason"]


def test_a_loop_that_stops_keeps_what_ran_and_says_where():
    loop = FakeLoop({"a": 0.0, "b": 0.0})
    runs = _runs([_cand("a", 1), _cand("b", 2)], loop)
    with pytest.raises(GeneratorExit):  # what closing the generator raises inside it, re-raised
        gen = runs.run(loop.opener, lambda rec: [])
        for i, _ in enumerate(gen):
            loop.now += 0.05
            if i == 20:
                gen.throw(GeneratorExit)
    rec = runs.record()
    assert rec["stopped"].startswith("your loop stopped after")
    assert rec["slices"][0]["candidate"] == "a" and rec["slices"][0]["status"] == "ok"
    assert rec["slices"][-1]["partial"] is True


def test_the_budget_ends_the_runs_and_is_said():
    loop = FakeLoop({"a": 0.0, "b": 0.0, "c": 0.0})
    runs = _runs([_cand("a", 1), _cand("b", 2), _cand("c", 3)], loop, budget_s=0.5)
    loop.run(runs)
    rec = runs.record()
    assert "budget" in rec["stopped"] and len(rec["slices"]) < 3


# --------------------------------------------------------------------------- the verdict


def _job(**wait_body: tuple[float, float, str, int]) -> dict:
    """A job record where each candidate (key=(wait per step, body per step, origin, cost)) ran two slices of 8 steps."""
    cands, slices = [], []
    for key, (wait, body, origin, cost) in wait_body.items():
        cands.append(
            {
                "key": key,
                "label": key,
                "settings": {"num_workers": cost},
                "origin": [origin],
                "cost": [cost],
                "round_steps": 1,
                "group_steps": 4,
            }
        )
        for rnd, jitter in ((1, 1.0), (2, 1.02)):
            slices.append(
                {
                    "candidate": key,
                    "round": rnd,
                    "status": "ok",
                    "waits": [wait * jitter] * 8,
                    "bodies": [body * jitter] * 8,
                    "startup_s": 0.1,
                }
            )
    return {"items_per_step": 16, "candidates": cands, "slices": slices, "rounds": 2, "stopped": None}


TRAINER = {"samples_per_s": 320.0, "steps_per_s": 20.0}


def test_num_workers_0_starves_the_step_and_the_job_says_so():
    """The trap of issue 30: alone 516 samples/s at 0 workers, but the load adds to every 50 ms step."""
    job = _job(
        zero=(0.031, 0.050, "feeds", 0),  # 81 ms a step: 198 samples/s
        one=(0.001, 0.050, "above", 1),  # 51 ms: 314
        two=(0.001, 0.050, "yours", 2),
    )
    d = decide_job(job, TRAINER)
    assert d["pick"] == "one" and d["advice"] == "cheaper" and d["bound"] == "trainer-bound"
    # yours is quoted with its interval, the evidence for "as fast"
    yours = next(c for c in d["candidates"] if c["key"] == "two")["job"]
    lo, hi = yours["samples_per_s_low"], yours["samples_per_s_high"]
    assert f"as fast as with yours within noise ({yours['samples_per_s']:.0f}, {lo:.0f}-{hi:.0f})" in d["text"]
    figs = candidate_figures(job)
    assert figs["zero"]["samples_per_s"] == pytest.approx(16 / 0.081, rel=0.02)
    assert figs["zero"]["data_wait_share"] == pytest.approx(31 / 81, rel=0.02)
    zero = next(c for c in d["candidates"] if c["key"] == "zero")
    assert zero["as_good"] is False


def test_yours_is_kept_when_nothing_cheaper_is_as_fast_and_nothing_is_faster():
    job = _job(yours=(0.001, 0.050, "yours", 2), best=(0.001, 0.0495, "best", 8), slow=(0.05, 0.05, "feeds", 1))
    d = decide_job(job, TRAINER)
    assert d["pick"] == "yours" and d["advice"] == "keep yours" and d["text"].startswith("keep yours")


def test_a_faster_setting_beyond_noise_is_a_change():
    job = _job(yours=(0.100, 0.050, "yours", 2), more=(0.001, 0.050, "feeds", 4))
    d = decide_job(job, TRAINER)
    assert d["pick"] == "more" and d["advice"] == "change" and "beyond noise" in d["why"]


def test_a_step_slowed_by_the_loader_reads_as_shared_cores():
    job = _job(only=(0.001, 0.080, "yours", 2))  # the body alone took 80 ms next to the loader, 50 ms alone
    assert decide_job(job, TRAINER)["bound"] == "shared cores"


def test_what_did_not_run_is_listed_and_nothing_is_decided_without_a_run():
    job = _job(yours=(0.001, 0.050, "yours", 2))
    job["candidates"].append({**job["candidates"][0], "key": "best", "label": "best", "origin": ["best"]})
    job["stopped"] = "your loop stopped after 30 steps of the job runs"
    d = decide_job(job, TRAINER)
    assert any("best (the fastest alone) was not run with your loop" in u for u in d["unproven"])
    job["slices"] = []
    d = decide_job(job, TRAINER)
    assert d["status"] == "not run" and d["pick"] is None and d["text"].startswith("inconclusive")


def test_contenders_are_what_the_decision_still_hinges_on():
    job = _job(a=(0.001, 0.050, "yours", 2), b=(0.2, 0.05, "feeds", 1))
    for s in job["slices"]:
        s["round"] = 1
    job["slices"] = [s for i, s in enumerate(job["slices"]) if i % 2 == 0]  # one slice each
    # b is far behind a: only a needs its second slice
    assert contenders(job) == ["a"]
    assert contenders({**job, "slices": []}) == ["a", "b"]  # nothing ran yet: everything


# --------------------------------------------------------------------------- the loader's candidates


def _pt(nw, sps, *, pf=2, pin=False, pw=False, mem=300.0):
    return {
        "loader": "x",
        "backend": "torch",
        "num_workers": nw,
        "prefetch_factor": pf if nw else math.nan,
        "persistent_workers": pw,
        "pin_memory": pin,
        "status": "ok",
        "reason": "",
        "samples_per_s": sps,
        "samples_per_s_low": sps * 0.99,
        "samples_per_s_high": sps * 1.01,
        "batches_per_s": sps / 16,
        "mem_pss_mb": mem,
        "elapsed_s": 1.0,
        "search_phase": "num_workers",
    }


def _meta(cuda: bool, **mine):
    return {
        "settings": {"memory_budget_mb": None, "usable_cores": 2, "cuda": cuda},
        "loader": {
            "backend": "torch",
            "batch_size": 16,
            "user_knobs": {"num_workers": 2, "prefetch_factor": 2, "persistent_workers": True, "pin_memory": False}
            | mine,
        },
    }


def test_loader_candidates_are_yours_the_cheapest_that_feeds_a_step_above_and_the_best():
    rows = [_pt(0, 516), _pt(1, 470), _pt(2, 940), _pt(4, 1880)]
    cands = job_candidates(rows, _meta(cuda=False), demand=320.0)
    by_origin = {o: c for c in cands for o in c.origin}
    assert by_origin["yours"].settings["num_workers"] == 2
    assert by_origin["feeds"].settings["num_workers"] == 0  # 516 >= 320 x 1.1: the job run shows the trap
    assert by_origin["above"].settings["num_workers"] == 1
    assert by_origin["best"].settings["num_workers"] == 4
    assert cands[0].origin == ("yours",) and len(cands) <= 4
    # persistent_workers as the user set it (a job slice sees no epoch boundary); none without workers
    assert all(c.settings["persistent_workers"] == (c.settings["num_workers"] > 0) for c in cands)
    assert by_origin["best"].round_steps == 4 and by_origin["feeds"].round_steps == 1


def test_on_a_cuda_host_pin_memory_is_kept_as_yours_and_pinning_is_tried_where_you_do_not_pin():
    rows = [_pt(0, 516, pin=True), _pt(2, 940, pin=False), _pt(2, 930, pin=True), _pt(4, 1880, pin=False)]
    pinned = job_candidates(rows, _meta(cuda=True, pin_memory=True), demand=320.0)
    assert all(c.settings["pin_memory"] is True for c in pinned)  # never switched off by an isolated sweep
    plain = job_candidates(rows, _meta(cuda=True), demand=320.0)
    assert [c.settings["pin_memory"] for c in plain if "pinned" in c.origin] == [True]
    assert all(c.settings["pin_memory"] is False for c in plain if "pinned" not in c.origin)


def test_the_loader_summary_follows_the_job_and_no_finding_contradicts_it():
    rows = [_pt(0, 516), _pt(1, 470), _pt(2, 940), _pt(4, 1880)]
    meta = _meta(cuda=False)
    meta["trainer"] = {"samples_per_s": 320.0, "steps_per_s": 20.0}
    job = _job(zero=(0.031, 0.050, "feeds", 0), one=(0.001, 0.050, "above", 1), two=(0.001, 0.050, "yours", 2))
    for c, nw in zip(job["candidates"], (0, 1, 2)):
        c["settings"] = {"num_workers": nw, "prefetch_factor": 2 if nw else None, "persistent_workers": nw > 0}
        c["settings"]["pin_memory"] = False
    meta["job"] = job
    s = summarize_loader(rows, meta)
    assert s["recommended"]["num_workers"] == 1 and s["recommended"]["persistent_workers"] is True
    assert s["verdict"] == s["job"]["text"] and "run with your training loop" in s["recommended"]["why"]
    assert "loading adds to every step" in s["job"]["zero_workers"]
    titles = [f["title"] for f in s["findings"]]
    assert "num_workers=0 starves your step: loading adds to every step" in titles
    assert "A cheaper setting runs your training job as fast" in titles
    assert not any("leaves loader throughput on the table" in t for t in titles)


def test_the_alone_scope_is_said_only_without_the_loop_and_names_the_users_limits():
    from stagebench.analysis._job import alone_scope

    assert alone_scope("the loader", {"samples_per_s": 100.0}, {}, planned=True) is None
    # the loop runs after the first table: that table must not say it will not
    assert alone_scope("the loader", None, {}, planned=True) is None
    text = alone_scope("the pipeline", None, {"trainer_s": 4.0, "job_s": 30.0}, planned=False)
    assert text.startswith("the pick is for the pipeline alone") and "on the real pipeline" in text
    assert "(at most 4 s)" in text and "(at most 30 s)" in text
    assert "(at most 60 s)" in alone_scope("the loader", None, {}, planned=False)  # the setting's default
