"""The pipeline's settings chosen together (stagebench.analysis._joint), on stage entries with known answers."""

from __future__ import annotations

from stagebench.analysis._joint import recommend_jointly
from stagebench.model._stage import StageEntry


def _curve(points, *, cpu_ms, executor):
    return [
        {
            "concurrency": c,
            "qps": q,
            "qps_low": q * 0.97,
            "qps_high": q * 1.03,
            "cpu_s_per_item": cpu_ms / 1e3,
        }
        for c, q in points
    ]


def _stage(
    name,
    *,
    gil_ms,
    cpu_ms,
    thread=None,
    process=None,
    own=None,
    harness_ms=0.0,
    items_per_input=1.0,
    label="unknown",
    yours=None,
):
    """A stage entry as analyze_stage writes it; ``own``: its own recommendation (executor, level); ``label``
    its classification; ``yours``: the user's own (executor, concurrency) in the config."""
    curves, alts = {}, {}
    for ex, pts in (("thread", thread), ("process", process)):
        if pts:
            curves[f"spdl/{ex}"] = _curve(pts, cpu_ms=cpu_ms, executor=ex)
            c, q = max(pts, key=lambda p: p[1])
            alts[ex] = {"executor": ex, "concurrency": c, "qps": q, "harness": "spdl"}
            alts[ex]["harness_gil_s_per_item"] = harness_ms / 1e3 if ex == "thread" else 0.0
    ex, c = own
    q = dict((thread if ex == "thread" else process) or [])[c]
    entry = {
        "name": name,
        "status": "ok",
        "harness": "spdl",
        "items_per_input": items_per_input,
        "recommended": {
            "executor": ex,
            "concurrency": c,
            "qps": q,
            "qps_low": q * 0.97,
            "qps_high": q * 1.03,
            "harness": "spdl",
            "why": "its own",
        },
        "cpu_s_per_item": cpu_ms / 1e3,
        "gil_s_per_item": gil_ms / 1e3,
        "harness_gil_s_per_item": harness_ms / 1e3,
        "alternatives": alts,
        "curves": curves,
        "head_to_head": None,
        "ceiling_qps": None,
        "evidence": {"summary": [], "signals": {}},
        "classification": label,
    }
    if yours is not None:
        entry |= {"type": "pipe", "user_executor": yours[0], "user_concurrency": yours[1]}
    return StageEntry.from_json(entry)


def _setting(st):
    return st.recommended.executor, st.recommended.concurrency


def _jointly(*stages, **kw):
    """recommend_jointly on ``stages`` (2 cores, a GIL): its Joint, and the entries as it leaves them."""
    out = list(stages)
    return recommend_jointly(out, cores=2, free_threaded=False, **kw), out


def test_a_stage_that_outruns_the_bottleneck_gets_only_the_threads_that_keep_up():
    """A 4 ms wait scales with its threads (250 items/s each); a 2 ms GIL-holding spin caps the pipeline at 500.

    Alone the wait takes 8 threads (2,000 items/s); the pipeline needs 500 x 1.5 = 750, which 4 threads give.
    """
    wait = _stage(
        "wait", gil_ms=0.02, cpu_ms=0.05, thread=[(1, 250), (2, 500), (4, 1000), (8, 2000)], own=("thread", 8)
    )
    spin = _stage("spin", gil_ms=2.0, cpu_ms=2.0, thread=[(1, 500), (2, 490)], own=("thread", 1))
    joint, (wait, spin) = _jointly(wait, spin)
    assert _setting(wait) == ("thread", 4) and wait.recommended_alone.concurrency == 8
    assert "keeps up with the pipeline's pace of" in wait.recommended.why
    assert _setting(spin) == ("thread", 1) and spin.recommended_alone is None
    assert joint.changed == ("wait",) and joint.exhaustive
    # the pace: the spin alone (500) or the GIL (1 / 2.02 ms = 495), whichever is lower
    assert 490 <= joint.pace <= 500


def _wait_and_spin(*, label="io-bound", yours=("thread", 6)):
    """The wait and spin of the test above, the wait labelled ``label`` and set at ``yours`` in the config."""
    wait = _stage(
        "wait",
        gil_ms=0.02,
        cpu_ms=0.05,
        thread=[(1, 250), (2, 500), (4, 1000), (6, 1500), (8, 2000)],
        own=("thread", 8),
        label=label,
        yours=yours,
    )
    spin = _stage("spin", gil_ms=2.0, cpu_ms=2.0, thread=[(1, 500), (2, 490)], own=("thread", 1))
    return _jointly(wait, spin)


def test_a_waiting_stage_that_keeps_up_at_your_level_keeps_it():
    """The 4 ms wait is set to 6 threads in the config: 1,500 items/s, above the 750 the pipeline needs. Cutting
    it to 4 frees no core and no GIL time (its threads wait): yours is kept, and the text says why."""
    joint, (wait, _) = _wait_and_spin()
    assert _setting(wait) == ("thread", 6) and wait.recommended_alone.concurrency == 8
    assert "your thread x 6" in wait.recommended.why and "mostly wait" in wait.recommended.why
    assert "keep up at your own level keep it: wait" in joint.text


def test_a_waiting_stage_is_cut_where_your_level_does_not_keep_up_or_it_is_not_waiting():
    """Yours kept only for a waiting stage on threads above the cut that keeps up with the margin: at 2 threads
    (500, under 750) it is raised to 4; labelled GIL-bound, or set on processes, it is cut to 4 as before."""
    for label, yours, want in (
        ("io-bound", ("thread", 2), 4),  # yours does not keep up: the fewest that do
        ("gil-bound", ("thread", 6), 4),  # its threads hold the GIL: each one competes with the spin
        ("io-bound", ("process", 6), 4),  # a level on another executor is not a level of this one
        ("io-bound", None, 4),  # no setting of the user's known
    ):
        _, (wait, _) = _wait_and_spin(label=label, yours=yours)
        assert _setting(wait) == ("thread", want), (label, yours)
        assert "your thread" not in wait.recommended.why


def test_processes_that_win_alone_are_not_used_where_the_pipeline_does_not_need_them():
    """A 1 ms spin that reaches 1,800 items/s on 2 processes, next to a 10 ms wait on one thread (100 items/s):
    the pipeline runs at 100 either way, so the spin stays on one thread (no processes to start and feed)."""
    spin = _stage(
        "spin", gil_ms=1.0, cpu_ms=1.0, thread=[(1, 1000), (2, 980)], process=[(1, 950), (2, 1800)], own=("process", 2)
    )
    wait = _stage("wait", gil_ms=0.01, cpu_ms=0.02, thread=[(1, 100)], own=("thread", 1))
    joint, (spin, wait) = _jointly(spin, wait)
    assert _setting(spin) == ("thread", 1)
    assert spin.recommended_alone.executor == "process"
    assert "thread rather than process" in spin.recommended.why
    assert joint.assignments == 2


def test_a_stage_goes_to_processes_where_the_shared_gil_needs_it_though_threads_tie_alone():
    """Two 2 ms GIL-holding stages: alone each does 500 items/s on threads, and one of them about the same on
    processes (threads preferred alone). Together on threads they share one GIL: 250 items/s. With the first on
    processes the GIL carries only the second: the pipeline can reach about 480."""
    a = _stage(
        "a", gil_ms=2.0, cpu_ms=2.0, thread=[(1, 500), (2, 495)], process=[(1, 480), (2, 470)], own=("thread", 1)
    )
    b = _stage("b", gil_ms=2.0, cpu_ms=2.0, thread=[(1, 500), (2, 495)], own=("thread", 1))
    joint, (a, b) = _jointly(a, b)
    assert _setting(a) == ("process", 1) and _setting(b) == ("thread", 1)
    assert 470 <= joint.pace <= 490 and joint.qps >= 470
    assert "250" in a.recommended.why  # what every stage on its own executor would give


def test_one_stage_keeps_its_own_recommendation():
    st = _stage("only", gil_ms=0.0, cpu_ms=0.1, thread=[(1, 250), (2, 500), (4, 990), (8, 1000)], own=("thread", 4))
    joint, (st,) = _jointly(st)
    assert _setting(st) == ("thread", 4) and joint.changed == () and st.recommended_alone is None


def test_a_stage_after_a_batch_is_compared_in_source_items():
    """A collate after batches of 16 does 100 calls/s on one thread: 1,600 source items/s, plenty for a
    pipeline whose other stage does 500: one thread, though alone it would take 4 (400 calls/s)."""
    src = _stage("decode", gil_ms=2.0, cpu_ms=2.0, thread=[(1, 500)], own=("thread", 1))
    col = _stage(
        "collate",
        gil_ms=0.0,
        cpu_ms=0.1,
        thread=[(1, 100), (2, 200), (4, 400)],
        own=("thread", 4),
        items_per_input=16.0,
    )
    _, (src, col) = _jointly(src, col)
    assert _setting(col) == ("thread", 1)


def test_stages_without_measurements_are_left_alone():
    st = _stage("ok", gil_ms=0.0, cpu_ms=0.1, thread=[(1, 250), (2, 500)], own=("thread", 2))
    failed = StageEntry.from_json({"name": "broken", "status": "failed", "recommended": None})
    assert _jointly(failed)[0] is None
    joint, (st, failed) = _jointly(st, failed)
    assert joint is not None and failed.recommended is None


def test_many_stages_are_searched_one_switch_at_a_time():
    """Thirteen stages with two executors each (8,192 assignments): the search switches one stage at a time."""
    stages = [
        _stage(f"s{i}", gil_ms=0.5, cpu_ms=0.5, thread=[(1, 2000)], process=[(1, 1900)], own=("thread", 1))
        for i in range(13)
    ]
    joint, _ = _jointly(*stages)
    assert not joint.exhaustive and joint.assignments < 200
    # 13 x 0.5 ms of GIL on threads: 154 items/s; moving stages to processes lifts the GIL bound until the
    # cores (13 x 0.5 ms of CPU on 2 cores: 308 items/s) bind
    assert joint.pace > 154 * 1.5


def test_a_stated_demand_below_the_pace_gets_the_cheapest_settings_that_feed_it():
    """The trainer needs 200 items/s; the pipeline could do 500. 200 x 1.1 x 1.5 = 330: the wait needs
    2 threads (500), not 4, and the spin keeps its one thread."""
    wait = _stage(
        "wait", gil_ms=0.02, cpu_ms=0.05, thread=[(1, 250), (2, 500), (4, 1000), (8, 2000)], own=("thread", 8)
    )
    spin = _stage("spin", gil_ms=2.0, cpu_ms=2.0, thread=[(1, 500), (2, 490)], own=("thread", 1))
    joint, (wait, spin) = _jointly(wait, spin, demand=200.0)
    assert _setting(wait) == ("thread", 2) and joint.for_demand == 200.0
    assert "the trainer needs 200 items/s" in wait.recommended.why
    # a demand above the pace changes nothing: the pipeline cannot be cut below what it can do
    wait2 = _stage(
        "wait", gil_ms=0.02, cpu_ms=0.05, thread=[(1, 250), (2, 500), (4, 1000), (8, 2000)], own=("thread", 8)
    )
    spin2 = _stage("spin", gil_ms=2.0, cpu_ms=2.0, thread=[(1, 500), (2, 490)], own=("thread", 1))
    joint, (wait2, spin2) = _jointly(wait2, spin2, demand=900.0)
    assert joint.for_demand is None and _setting(wait2) == ("thread", 4)


def test_processes_are_measured_only_for_stages_whose_processes_could_raise_the_pipelines_bounds():
    """cpu_free: a 1 ms wait and 0.2 ms of GIL-holding Python beside sha256 that binds at 700 items/s on 2 cores:
    even at their best imaginable, processes for the first two leave the pipeline where it is. A 2 ms GIL-holding
    stage beside another (they share one GIL) is a different matter: on processes it frees the GIL for the other."""
    from stagebench.analysis._joint import process_headroom

    levels = [1, 2, 4, 8, 16]
    read = _stage(
        "read", gil_ms=0.04, cpu_ms=0.05, thread=[(1, 750), (2, 1400), (4, 2800), (8, 3000)], own=("thread", 8)
    )
    checksum = _stage("checksum", gil_ms=0.0, cpu_ms=2.4, thread=[(1, 420), (2, 700), (4, 690)], own=("thread", 2))
    label = _stage("label", gil_ms=0.19, cpu_ms=0.2, thread=[(1, 2000), (2, 2050)], own=("thread", 1))
    head = process_headroom([read, checksum, label], {"read": levels, "label": levels}, cores=2, free_threaded=False)
    assert set(head) == {"read", "label"}
    for h in head.values():
        assert h["gain"] <= 1.02 and h["best"] <= 1.02 * h["on_threads"]
        assert h["binding"] in ("checksum's capacity", "the cores")
    # held on threads, read and label leave checksum or the cores to bind: at most 2 cores / 2.65 ms
    assert max(h["on_threads"] for h in head.values()) <= 2 / 2.65e-3

    a = _stage("a", gil_ms=2.0, cpu_ms=2.0, thread=[(1, 500), (2, 495)], own=("thread", 1))
    b = _stage("b", gil_ms=2.0, cpu_ms=2.0, thread=[(1, 500), (2, 495)], own=("thread", 1))
    head = process_headroom([a, b], {"a": [1, 2], "b": [1, 2]}, cores=2, free_threaded=False)
    # on threads both share one GIL (250 items/s); with one on processes the other has it alone (~500)
    assert head["a"]["gain"] > 1.5 and head["b"]["gain"] > 1.5 and head["a"]["binding"] == "the GIL"
    # a stage the pipeline never waits on, next to one that binds at 100 items/s whatever it runs on
    wait = _stage("wait", gil_ms=0.01, cpu_ms=0.02, thread=[(1, 100)], own=("thread", 1))
    spin = _stage("spin", gil_ms=1.0, cpu_ms=1.0, thread=[(1, 1000), (2, 980)], own=("thread", 1))
    assert process_headroom([spin, wait], {"spin": [1, 2]}, cores=2, free_threaded=False)["spin"]["gain"] == 1.0


def _near_tie():
    """A 1.2 ms GIL-holding spin (830 items/s on one thread, 1,500 on two processes) beside a wait that does 1,000
    on 8 threads: on threads the GIL binds at 1 / 1.22 ms = 820 items/s, on processes the wait at 1,000. 820 is
    within TRUSTED (80%) of 1,000, so the bounds alone pick the cheaper threads; it is 18% under, more than the
    5% the bounds cannot tell apart, so the processes are the runner-up, for the replays to settle."""
    spin = _stage(
        "spin", gil_ms=1.2, cpu_ms=1.2, thread=[(1, 830), (2, 820)], process=[(1, 800), (2, 1500)], own=("process", 2)
    )
    wait = _stage("wait", gil_ms=0.02, cpu_ms=0.05, thread=[(1, 125), (2, 250), (4, 500), (8, 1000)], own=("thread", 8))
    return spin, wait


def _replays(pick, runner_up, chosen):
    from stagebench.model._pipeline import JointReplays, WholeRun

    rate = lambda q: WholeRun(qps=q, qps_low=q * 0.97, qps_high=q * 1.03)
    return JointReplays(
        executors={"spin": "process", "wait": "thread"}, pick=rate(pick), runner_up=rate(runner_up), chosen=chosen
    )


def test_a_cheaper_pick_the_bounds_put_over_5_percent_under_their_best_leaves_a_runner_up_for_the_replays():
    joint, (spin, _) = _jointly(*_near_tie())
    assert _setting(spin) == ("thread", 1)  # the cheaper, within TRUSTED
    assert joint.runner_up == {"spin": "process", "wait": "thread"} and joint.runner_up_pace == 1000
    assert "was not replayed against the cheaper one" in joint.text
    # where the best is the pick, or the pick within 5% of it, there is nothing to replay
    joint, _ = _jointly(*_tie())
    assert joint.runner_up is None and joint.runner_up_pace is None
    assert "runner_up" not in joint.to_json()  # written only where there is one


def _tie():
    """A 0.5 ms spin as fast on a thread as on a process beside a wait: the pick is the bounds' best."""
    a = _stage("a", gil_ms=0.5, cpu_ms=0.5, thread=[(1, 1000)], process=[(1, 990)], own=("thread", 1))
    b = _stage("b", gil_ms=0.02, cpu_ms=0.05, thread=[(1, 125), (2, 250), (4, 500)], own=("thread", 4))
    return a, b


def test_the_replays_take_the_runner_up_only_where_it_ran_faster_beyond_noise():
    from stagebench.model._pipeline import KEPT, RUNNER_UP, JointReplays

    faster = _replays(600, 900, None)
    assert JointReplays.choose(faster.pick, faster.runner_up) == RUNNER_UP
    faster = _replays(600, 900, RUNNER_UP)
    joint, (spin, wait) = _jointly(*_near_tie(), replays=faster)
    assert _setting(spin) == ("process", 2) and spin.recommended_alone is None  # as alone: processes
    assert joint.pace == 1000 and "replayed at 900 items/s (873-927)" in joint.text
    assert "faster beyond noise: its executors are taken" in joint.text
    # intervals that overlap (600 against 615, 3% each way): the cheaper pick stays
    tie = _replays(600, 615, None)
    assert JointReplays.choose(tie.pick, tie.runner_up) == KEPT
    joint, (spin, _) = _jointly(*_near_tie(), replays=_replays(600, 615, KEPT))
    assert _setting(spin) == ("thread", 1) and "the cheaper one is kept" in joint.text
    # a replay that failed keeps the pick
    from stagebench.model._pipeline import WholeRun

    assert JointReplays.choose(WholeRun(qps=None, error="x"), WholeRun(qps=900, qps_low=870, qps_high=930)) == KEPT
