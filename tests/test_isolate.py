"""Isolating SPDL stages: what each stage sees and emits matches what SPDL would do."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest
from spdl.pipeline import PipelineBuilder
from spdl.pipeline.defs import (
    Aggregate,
    Aggregator,
    Merge,
    PathVariants,
    Pipe,
    PipelineConfig,
    SinkConfig,
    SourceConfig,
)

from stagebench.pipeline._first_pass import (
    FirstPass,
    SourceError,
    compute_outputs,
    items_to_read,
    measure_inputs,
    read_source,
    run_passthrough,
    unfinished,
)
from stagebench.pipeline._isolate import Passthrough, PlanError, build_validation_config, plan_pipeline


def double(x):
    return 2 * x


async def add_one(x):
    await asyncio.sleep(0)
    return x + 1


def odd_only(x):
    return x if x % 2 else None  # None: SPDL drops the item


def twice(x):
    yield x
    yield x


async def atwice(x):
    yield x
    yield -x


def cfg_of(builder):
    return builder.add_sink(4).get_config()


def real_outputs(cfg, num_threads=4):
    from spdl.pipeline import build_pipeline

    p = build_pipeline(cfg, num_threads=num_threads)
    with p.auto_stop():
        return list(p)


def chain(plan, items):
    """Compute every stage's outputs in turn, as a diagnosis does."""
    for step in plan.steps:
        if isinstance(step, Passthrough):
            items = run_passthrough(step, items)
        else:
            items, _ = compute_outputs(step, items, max_bytes=1e12)
    return items


def test_plan_names_types_and_user_settings():
    pool = ThreadPoolExecutor(3)
    cfg = cfg_of(
        PipelineBuilder()
        .add_source(range(10))
        .pipe(double, concurrency=4)
        .pipe(add_one, concurrency=8, name="add one: async")
        .pipe(double, executor=pool, concurrency=3, output_order="input")
        .aggregate(3)
        .disaggregate()
    )
    plan = plan_pipeline(cfg)
    meta = [s.as_meta() for s in plan.stages]
    assert [m["name"] for m in meta] == [
        "double",
        "add one: async",
        "double (2)",
        "aggregate(op=collate(3), drop_last=False)",
        "disaggregate",
    ]
    assert [m["type"] for m in meta] == ["pipe", "pipe", "pipe", "aggregate", "disaggregate"]
    assert [m["user_executor"] for m in meta] == ["default", "async", "thread", "default", "default"]
    assert [m["user_concurrency"] for m in meta] == [4, 8, 3, 1, 1]
    assert [m["is_async"] for m in meta] == [False, True, False, False, False]
    assert meta[2]["ordered"] and not meta[0]["ordered"]
    assert plan.not_isolated == []
    pool.shutdown()


def test_process_executor_is_recognised():
    from concurrent.futures import ProcessPoolExecutor

    ex = ProcessPoolExecutor(1)
    plan = plan_pipeline(cfg_of(PipelineBuilder().add_source(range(3)).pipe(double, executor=ex)))
    assert plan.stages[0].user_executor == "process"
    ex.shutdown()


def test_cached_outputs_equal_what_spdl_delivers():
    """None drops, generators emit each element, async generators too, batches and unbatches."""
    builder = lambda: (
        PipelineBuilder()
        .add_source(range(20))
        .pipe(double, concurrency=2)
        .pipe(add_one, concurrency=4)
        .pipe(odd_only)
        .pipe(twice)
        .pipe(atwice)
        .aggregate(8)  # 80 items: whole batches (a short last one is flushed only where no whole one formed)
        .pipe(lambda b: [x * 10 for x in b])
        .disaggregate()
    )
    expected = real_outputs(cfg_of(builder()))
    plan = plan_pipeline(cfg_of(builder()))
    got = chain(plan, read_source(plan, 100).items)
    assert sorted(got) == sorted(expected)
    assert len(got) == 20 * 2 * 2  # every (2x+1) is odd; two generators double twice


def test_aggregate_groups_and_drop_last():
    # The short last group SPDL flushes where the source ends is where the cache ends, not an epoch: it is
    # kept only where no full group formed (a cache smaller than a batch), and with drop_last never.
    cases = (
        (10, False, ((0, 3), (3, 6), (6, 9))),
        (10, True, ((0, 3), (3, 6), (6, 9))),
        (2, False, ((0, 2),)),
        (2, True, ()),
    )
    for n, drop_last, groups in cases:
        plan = plan_pipeline(cfg_of(PipelineBuilder().add_source(range(n)).aggregate(3, drop_last=drop_last)))
        st = plan.stages[0]
        items = list(range(n))
        out, meta = compute_outputs(st, items, max_bytes=1e12)
        assert meta.groups == groups and meta.flushed == (n < 3 and not drop_last)
        measured = measure_inputs(st, items, meta)
        assert measured == [items[a:b] for a, b in groups]
        # the measured callable turns each group into exactly the output SPDL emits
        assert [st.fn(g) for g in measured] == out


class ReadsItsItems(Aggregator):
    """A custom aggregator that groups by the items' own sizes: placeholders tell nothing of its batches."""

    def accumulate(self, item):
        return len(item)

    def flush(self):
        return None


def test_unset_num_items_reads_two_whole_batches_of_each_batching_step():
    """200 items, unless the batching needs more for two whole batches (at most 4,096); what the user set
    stands; a batching whose size placeholders do not show leaves 200."""
    plan = lambda b: plan_pipeline(cfg_of(b))
    src = PipelineBuilder().add_source(range(10))
    assert items_to_read(plan(src.pipe(double)), None) == (200, None)
    assert items_to_read(plan(PipelineBuilder().add_source(range(10)).aggregate(64)), None) == (200, None)
    n, why = items_to_read(plan(PipelineBuilder().add_source(range(10)).aggregate(256)), None)
    assert n == 512 and "two whole batches of 'aggregate(op=collate(256), drop_last=False)'" in why
    assert items_to_read(plan(PipelineBuilder().add_source(range(10)).aggregate(256)), 20) == (20, None)
    nested = PipelineBuilder().add_source(range(10)).aggregate(16).aggregate(16)
    assert items_to_read(plan(nested), None)[0] == 512  # 2 batches of 16 batches of 16
    n, why = items_to_read(plan(PipelineBuilder().add_source(range(10)).aggregate(3000)), None)
    assert n == 4096 and "as many as read unasked" in why
    every_third = PipelineConfig(src=SourceConfig(range(8)), pipes=[Aggregate(EveryThird())], sink=SinkConfig(2))
    assert items_to_read(plan_pipeline(every_third), None) == (200, None)  # 6 <= 200
    own = PipelineConfig(src=SourceConfig(range(8)), pipes=[Aggregate(ReadsItsItems())], sink=SinkConfig(2))
    assert items_to_read(plan_pipeline(own), None) == (200, None)


class EveryThird(Aggregator):
    """A custom aggregator: emits the sum of every three items."""

    def __init__(self):
        self.buf = []

    def accumulate(self, item):
        self.buf.append(item)
        if len(self.buf) == 3:
            out, self.buf = sum(self.buf), []
            return out
        return None

    def flush(self):
        out, self.buf = (sum(self.buf) if self.buf else None), []
        return out


def test_custom_aggregator_runs_on_fresh_copies():
    cfg = PipelineConfig(src=SourceConfig(range(8)), pipes=[Aggregate(EveryThird())], sink=SinkConfig(2))
    st = plan_pipeline(cfg).stages[0]
    # 6 + 7, flushed where the 8 cached items end, is no batch of an epoch; where no whole one forms it is kept
    short, meta = compute_outputs(st, [6, 7], max_bytes=1e12)
    assert short == [13] and [st.fn(g) for g in measure_inputs(st, [6, 7], meta)] == short
    out, meta = compute_outputs(st, list(range(8)), max_bytes=1e12)
    assert out == [3, 12]
    groups = measure_inputs(st, list(range(8)), meta)
    assert [st.fn(g) for g in groups] == out
    # concurrent calls must not share state
    with ThreadPoolExecutor(4) as ex:
        assert list(ex.map(st.fn, groups * 20)) == out * 20
    # the user's aggregator was not consumed: the validation run can still use it
    assert cfg.pipes[0].op.buf == []


def test_errors_are_counted_and_the_other_items_go_on():
    def flaky(x):
        if x % 4 == 0:
            raise ValueError(f"bad record {x}")
        return x

    st = plan_pipeline(cfg_of(PipelineBuilder().add_source(range(3)).pipe(flaky, concurrency=3))).stages[0]
    out, meta = compute_outputs(st, list(range(12)), max_bytes=1e12)
    assert sorted(out) == [1, 2, 3, 5, 6, 7, 9, 10, 11]
    assert out == sorted(out)  # inputs order is kept
    assert meta.n_errors == 3 and meta.error_example.startswith("ValueError: bad record")


def test_calls_that_run_out_of_memory_are_named_and_the_pass_is_not_kept():
    """A call that raises MemoryError is no error of its input: the process had none left. The pass says so, and
    its outputs are not kept for the next run (issue 59)."""

    def leaks(x):
        if x >= 6:
            raise MemoryError()
        return x

    st = plan_pipeline(cfg_of(PipelineBuilder().add_source(range(3)).pipe(leaks))).stages[0]
    out, meta = compute_outputs(st, list(range(10)), max_bytes=1e12, workers=1)
    assert out == [0, 1, 2, 3, 4, 5] and meta.n_errors == 4
    assert meta.error_example == "out of memory: MemoryError" and meta.out_of_memory == "MemoryError"
    assert unfinished(meta) == "it ran out of memory (MemoryError)"


def test_a_pass_that_failed_or_stopped_is_not_kept_and_errors_on_some_inputs_are():
    whole = FirstPass(n_inputs=10, n_run=10)
    assert unfinished(whole) is None
    assert unfinished(replace(whole, capped=True, n_run=4)) is None  # the cap is the user's setting
    assert unfinished(replace(whole, n_errors=3, error_example="ValueError: bad record")) is None
    assert (
        unfinished(replace(whole, n_errors=10, error_example="ValueError: x")) == "every input raised (ValueError: x)"
    )
    assert unfinished(replace(whole, stalled=True, n_run=0)).startswith("it timed out")
    assert unfinished(replace(whole, crashed="a worker process died (exit codes {-11})")).startswith(
        "a worker process died"
    )
    assert unfinished(replace(whole, process_error="out of memory: OSError")).startswith("its process pool failed")


def test_byte_cap_keeps_a_prefix_and_says_so():
    st = plan_pipeline(cfg_of(PipelineBuilder().add_source(range(3)).pipe(lambda x: b"x" * 1000))).stages[0]
    out, meta = compute_outputs(st, list(range(50)), max_bytes=10_500)
    assert len(out) == 10 and meta.capped and meta.bytes == 10_000
    assert len(measure_inputs(st, list(range(50)), meta)) == meta.n_run < 50


def test_a_hanging_stage_stops_computing_after_the_stall_limit():
    def hang_after_3(x):
        if x >= 3:
            time.sleep(30)
        return x

    st = plan_pipeline(cfg_of(PipelineBuilder().add_source(range(3)).pipe(hang_after_3))).stages[0]
    t0 = time.perf_counter()
    out, meta = compute_outputs(st, list(range(10)), max_bytes=1e12, stall_s=0.5, workers=2)
    assert time.perf_counter() - t0 < 5
    assert out == [0, 1, 2] and meta.stalled


def test_read_source_short_raising_async_and_merged():
    plan = plan_pipeline(cfg_of(PipelineBuilder().add_source(range(5)).pipe(double)))
    r = read_source(plan, 10)
    assert r.items == [0, 1, 2, 3, 4] and "fewer than the 10 asked" in r.note

    def broken():
        yield 1
        raise OSError("shard 2 is missing")

    plan = plan_pipeline(cfg_of(PipelineBuilder().add_source(broken()).pipe(double)))
    with pytest.raises(SourceError, match="OSError: shard 2 is missing.*after 1 item"):
        read_source(plan, 10)
    with pytest.raises(SourceError, match="no items"):
        read_source(plan_pipeline(cfg_of(PipelineBuilder().add_source([]).pipe(double))), 10)

    async def agen():
        for i in range(4):
            yield i

    plan = plan_pipeline(cfg_of(PipelineBuilder().add_source(agen()).pipe(double)))
    assert read_source(plan, 3).items == [0, 1, 2]

    sub = [
        PipelineConfig(
            src=SourceConfig(range(k * 10, k * 10 + 5)), pipes=[Pipe(double, name="pre")], sink=SinkConfig(2)
        )
        for k in range(2)
    ]
    plan = plan_pipeline(PipelineConfig(src=Merge(sub), pipes=[Pipe(double)], sink=SinkConfig(2)))
    got = read_source(plan, 100).items
    assert sorted(got) == sorted(2 * x for k in range(2) for x in range(k * 10, k * 10 + 5))
    assert [d["name"] for d in plan.not_isolated] == ["pre", "pre"]


@pytest.mark.filterwarnings("ignore:Fusing subprocess pipeline stages:RuntimeWarning")
def test_not_isolatable_segments_run_as_a_whole_and_are_listed():
    from spdl.pipeline.defs import MAIN_PROCESS, PlacementConfig, ProcessPoolExecutorConfig

    cfg = PipelineConfig(
        src=SourceConfig(range(10)),
        pipes=[
            Pipe(double),
            PathVariants(
                lambda x: x % 2,
                [[Pipe(lambda x: x + 1000, name="even")], [Pipe(lambda x: x + 2000, name="odd")]],
                name="route",
            ),
            PlacementConfig(ProcessPoolExecutorConfig(max_workers=1)),
            Pipe(double, name="in region"),
            PlacementConfig(MAIN_PROCESS),
            Pipe(add_one, name="after"),
        ],
        sink=SinkConfig(2),
    )
    plan = plan_pipeline(cfg)
    assert [s.name for s in plan.stages] == ["double", "after"]
    reasons = {d["name"]: d["reason"] for d in plan.not_isolated}
    assert set(reasons) == {"route", "in region"}
    assert "path variants" in reasons["route"] and ".to(ProcessPoolExecutorConfig)" in reasons["in region"]
    assert sorted(chain(plan, list(range(10)))) == sorted(real_outputs(cfg))


def test_nothing_to_diagnose():
    with pytest.raises(PlanError, match="no stages"):
        plan_pipeline(cfg_of(PipelineBuilder().add_source(range(3))))
    only_variants = PipelineConfig(
        src=SourceConfig(range(3)), sink=SinkConfig(2), pipes=[PathVariants(lambda x: 0, [[Pipe(double)]], name="v")]
    )
    with pytest.raises(PlanError, match="no stage of the pipeline can run alone"):
        plan_pipeline(only_variants)


@pytest.mark.parametrize("executor", ["thread", "process", "async"])
def test_validation_pipeline_delivers_the_same_items(executor):
    """The rebuilt pipeline (recommended settings) computes what the user's does."""

    def source():
        yield from range(30)

    cfg = cfg_of(
        PipelineBuilder()
        .add_source(range(30))
        .pipe(lambda x: x * 3, name="triple", concurrency=2)  # a lambda: process pools must take it
        .pipe(twice, name="gen")
        .pipe(add_one, name="async one", concurrency=4)
        .aggregate(7)
        .disaggregate()
    )
    plan = plan_pipeline(cfg)
    choice = (executor, 3) if executor != "async" else ("thread", 2)
    vcfg, closers, used = build_validation_config(plan, {"triple": choice, "gen": choice}, source())
    try:
        got = real_outputs(vcfg)
    finally:
        for close in closers:
            close()
    assert sorted(got) == sorted(3 * x + 1 for x in range(30) for _ in range(2))
    by_stage = {u["stage"]: (u["executor"], u["concurrency"]) for u in used}
    assert by_stage["triple"] == choice and by_stage["async one"] == ("async", 4)
