"""The stages phase of a diagnosis: each stage run once over the previous stage's outputs (cached on
disk by :mod:`._stage_cache`), then swept alone on them.

Thread / process (async: the event loop) x the concurrency grid, through stagebench's workers and
through a one-stage SPDL pipeline, each with its no-op ceiling (thread/async ceilings once per run,
shared by the stages). Process points wait until every stage's thread points are measured
(:mod:`._rule_out` may skip them), then run level by level on one pool. Rows are on disk the moment
they are measured. A stage that consumes its inputs (a second call on one fails) is measured fused
with the stage before it, on fresh outputs of it each call (:class:`_Fresh`).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field, replace
from typing import Any

from stagebench._memory import describe, memory_short, out_of_memory
from stagebench._numbers import finite
from stagebench.core._config import SweepConfig
from stagebench.core._measure import skipped
from stagebench.core._mirror import mirror
from stagebench.core._pickling import pickle_problem
from stagebench.core._spdl_harness import settle
from stagebench.core._speed import cpu_speed_ns
from stagebench.core._stage_draft import StageDraft
from stagebench.core._sweep import StageSweep, plan_points, sweep_process_points
from stagebench.pipeline._calls import Fused, MapThen
from stagebench.pipeline._first_pass import (
    FirstPass,
    compute_outputs,
    consumes_inputs,
    measure_inputs,
    run_passthrough,
    unfinished,
)
from stagebench.pipeline._gilprobe import probe_gil
from stagebench.pipeline._isolate import Passthrough
from stagebench.pipeline._overhead import NOOP_AT, measure_overhead
from stagebench.pipeline._rule_out import paired_needless, rule_out_processes
from stagebench.pipeline._run import Run
from stagebench.pipeline._settings import SAMPLE_OUTPUTS, DiagnoseSettings
from stagebench.pipeline._stage_cache import CachedOutputs, StageCache, callable_key, chain_key, items_key
from stagebench.runs._results import RowWriter
from stagebench.runs._schema import STAGE_COLUMNS

__all__ = ["StagesPhase", "sweep_config", "skipped_rows", "first_pass", "consumes_why", "advance", "Cursor"]


def sweep_config(stage: Any, settings: DiagnoseSettings) -> SweepConfig:
    """The sweep of one ``stage`` (a ``SweepConfig``) at the diagnosis's ``settings``: SPDL runs aggregate and
    disaggregate stages inline, with nothing to choose."""
    measure = settings.measure_config()
    if stage.type in ("aggregate", "disaggregate"):
        return SweepConfig(executors=("thread",), concurrency=(1,), harnesses=settings.harnesses, measure=measure)
    return SweepConfig(
        executors=settings.executors,
        concurrency=settings.concurrency,
        harnesses=settings.harnesses,
        measure=measure,
        process_flat_levels=settings.process_flat_levels,
        process_ceilings=settings.process_ceilings,
        paired_rounds=settings.paired_rounds,
    )


def skipped_rows(
    stage: Any, settings: DiagnoseSettings, reason: str, *, executor: str | None = None, ceilings: bool = False
) -> list[StageDraft]:
    """Points not measured, each with ``reason``: the stage's (and with ``ceilings``, its ceiling's), of
    ``executor`` or all, as ``settings`` plan them."""
    return [
        skipped(stage.name, role, ex, harness, c, reason)
        for role, harness, ex, c in plan_points(stage.fn, sweep_config(stage, settings))
        if (role == "stage" or ceilings) and (executor is None or ex == executor)
    ]


#: Share of its call a stage computes from which its GIL share is worth reading with the probe (~0.35 s a
#: stage); not the analysis's compute-bound threshold (analysis/_labels._COMPUTE_BOUND): a different question.
_PROBE_MIN_COMPUTE = 0.15


def _computes(rows: list[StageDraft]) -> bool:
    """Whether a sync stage's thread points show it computing at least 15% of its call.

    The spdl harness times the calling thread's CPU during the call (``call_cpu_ms``); the direct
    harness adds almost nothing to the stage's own cores used at the lowest level.
    """
    pts = [r for r in rows if r.role == "stage" and r.executor == "thread" and r.status == "ok"]
    c0 = min((r.concurrency for r in pts), default=0)
    for r in pts:
        if r.concurrency != c0:
            continue
        cpu, p50, used = r.call_cpu_ms, r.latency_p50_ms, r.cores_used
        if r.harness == "spdl" and finite(cpu) and finite(p50) and p50 > 0:
            share = cpu / p50
        elif r.harness == "direct" and finite(used):
            share = used / c0
        else:
            continue
        if share >= _PROBE_MIN_COMPUTE:
            return True
    return False


@dataclass(frozen=True)
class _Fresh:
    """What gives the next stage fresh inputs, should it consume them: ``stage`` called on ``inputs``
    (``items_per_input``: what one call stands for), ``aligned`` where its i-th output is its i-th
    input's, ``chain`` the names of the stages that call runs."""

    stage: Any
    inputs: list
    items_per_input: float | None
    aligned: bool
    chain: list[str]


def _fresh_source(
    step: Any, minputs: list, outputs: list, first: FirstPass, per_input: float | None, prev: _Fresh | None
) -> _Fresh | None:
    """After a plain one-to-one pipe: that pipe over its own inputs. After an aggregate whose inputs came
    from such a pipe with nothing dropped (so the i-th output is the i-th input's): the pipe over each
    group's inputs, then the aggregate (decode -> batch -> convert, where convert takes ownership of the
    decoded frames). Anything else: nothing, and a consuming stage after it says its points will fail.
    """
    if step.type == "pipe" and not step.many:
        aligned = len(outputs) == len(minputs) and not first.n_errors and not first.n_dropped
        return _Fresh(step, minputs, per_input, aligned, [step.name])
    if step.type == "aggregate" and prev is not None and prev.aligned and first.groups:
        base = prev.inputs
        if all(b <= len(base) for _, b in first.groups):
            groups = [list(base[a:b]) for a, b in first.groups]
            fused = replace(step, fn=MapThen(prev.stage.fn, step.fn))
            return _Fresh(fused, groups, per_input, False, [*prev.chain, step.name])
    return None


@dataclass
class Cursor:
    """Where the walk down the pipeline stands: the current inputs and where they came from."""

    inputs: list
    key: str
    #: the step whose outputs are the current inputs (None: the source)
    came_from: str | None = None
    #: share of the source items the current inputs derive from
    fraction: float = 1.0
    #: why the stages from here on cannot be measured
    blocked: str | None = None
    prev: _Fresh | None = None


def _no_outputs_why(first: FirstPass, timeout_s: float) -> str:
    if first.out_of_memory:
        return f"it ran out of memory ({first.out_of_memory})"
    if first.crashed:
        return f"a worker process died on its first pass ({first.crashed})"
    if first.n_errors:
        return f"every item raised ({first.error_example})"
    if first.stalled:
        return f"no item finished within {timeout_s:g} s"
    return "every output was None (dropped)"


def first_pass(
    step: Any, cur: Cursor, cache: StageCache, settings: DiagnoseSettings, plan: Any
) -> tuple[Any, str, str | None]:
    """``step`` run once over the cursor's inputs, or its outputs read from ``cache``, with the diagnosis's
    ``settings`` (the outputs' cap, the timeout): (the cached outputs, their chain key, why they are not
    cached between runs or None). A few outputs are kept in ``plan`` for the stage's stand-in in the replay."""
    max_bytes = settings.cache_max_mb * 2**20
    fn_key, unstable = callable_key(step.key_source)
    key = chain_key(FirstPass.__qualname__, step.type, step.drop_last, fn_key, max_bytes, cur.key)
    compute = functools.partial(compute_outputs, step, cur.inputs, max_bytes=max_bytes, stall_s=settings.timeout_s)
    cached = cache.get_or_compute(key, compute, not_kept=unfinished)  # a pass that did not finish runs again
    plan.sample_outputs[step.name] = list(cached.items[:SAMPLE_OUTPUTS])
    return cached, key, unstable


def consumes_why(step: Any, item: Any, first: FirstPass, timeout_s: float) -> str | None:
    """Why ``step`` consumes its inputs (a second call on ``item``, one it has seen, fails within
    ``timeout_s``), None where it does not or cannot tell: only a sync pipe on threads can (a process gets a
    fresh copy of each input), and only after a ``first`` pass without errors."""
    if step.type != "pipe" or step.many or step.is_async or first.n_errors:
        return None
    return consumes_inputs(step.fn, item, timeout_s=timeout_s)


def advance(
    step: Any, cur: Cursor, cached: CachedOutputs, key: str, minputs: list, per_input: float | None, timeout_s: float
) -> None:
    """The cursor moved past ``step``: its ``cached`` outputs (under ``key``) are the next stage's inputs (or
    why the stages after it cannot be measured, ``timeout_s`` in the words), with the share of the source
    they stand for and what can give a consuming stage after it fresh inputs (from ``minputs``, the
    inputs it was measured on, each standing for ``per_input`` source items where known)."""
    first = cached.first
    if first.capped and first.n_inputs:
        cur.fraction *= first.n_run / first.n_inputs
    if step.type == "aggregate" and first.n_run:
        # A remainder that drop_last throws away, or a group the cap stopped, reaches no stage after this
        # one: it is an end of the cached items, not work they did (over an epoch it is at most one batch).
        # Counted, a batch of 32 after 200 cached items would stand for 200 / 6 = 33.3 source items.
        cur.fraction *= sum(b - a for a, b in first.groups or ()) / first.n_run
    if not cached.items:
        why = _no_outputs_why(first, timeout_s)
        cur.blocked = f"not measured: the earlier stage {step.name!r} produced no outputs: {why}"
    cur.prev = _fresh_source(step, minputs, cached.items, first, per_input, cur.prev)
    cur.inputs, cur.key, cur.came_from = cached.items, key, repr(step.name)


@dataclass(eq=False)
class StagesPhase:
    """Measures every stage of the plan alone (module docstring); what it leaves for the phases after it:
    ``blocked`` (why the pipeline delivers nothing), ``items_per_sink_item``, and the CPU speeds the
    stage curves were measured at (``sweep_speeds``; per stage, ``stage_speeds``)."""

    run: Run
    #: thread/async no-op ceilings do not depend on the stage: measured once per run
    shared_ceilings: dict[tuple[str, str, int], StageDraft] = field(default_factory=dict)
    #: stages whose process points wait for the level-by-level pass
    process_sweeps: list[Any] = field(default_factory=list)
    #: the core's speed after every point (see core/_speed): the stage curves were measured at these
    sweep_speeds: list[float] = field(default_factory=list)
    #: per stage, the probes after its thread / async points: what its stand-in's CPU amounts were read at
    stage_speeds: dict[str, list[float]] = field(default_factory=dict)
    blocked: str | None = None
    items_per_sink_item: float | None = None

    def say(self, text: str) -> None:
        self.run.say(text)

    def sweep_all(self, source_items: list) -> None:
        """Every stage in order, then SPDL's overhead and the process points still wanted."""
        settings = self.run.settings
        cache = StageCache(self.run.cache_dir, max_disk_mb=10 * settings.cache_max_mb)
        key, unhashable = items_key(source_items)
        cur = Cursor(inputs=source_items, key=key)
        src_problem = self._announce_source(source_items, unhashable)
        ranked = mirror()  # a ranked diagnosis: every other rank walks its own pipeline step for step
        with self.run.run_dir.writer(STAGE_COLUMNS) as writer:
            for index, step in enumerate(self.run.plan.steps):
                if ranked is not None:
                    ranked.tell("stage", index=index)
                if isinstance(step, Passthrough):
                    self._passthrough(step, cur)
                else:
                    self._stage(step, cur, writer, cache, len(source_items), src_problem)
            # SPDL's no-op pipeline, inside the deferred tear-down too (its own would wait again); before
            # the process points: the bounds that rule them out charge it once per item
            measure_overhead(self.run, source_items)
            if self.process_sweeps:
                rule_out_processes(self.run, self.process_sweeps)
                sweep_process_points(self.process_sweeps, paired_needless=functools.partial(paired_needless, self.run))
                self.process_sweeps.clear()  # their inputs can go
        self.blocked = cur.blocked
        # what one item at the sink stands for, in source items (batches: the batch size)
        self.items_per_sink_item = (len(source_items) * cur.fraction / len(cur.inputs)) if cur.inputs else None
        self.run.meta["items_per_sink_item"] = self.items_per_sink_item

    def _passthrough(self, step: Any, cur: Cursor) -> None:
        """A segment run as a whole (it cannot be isolated): its outputs are the next stage's inputs."""
        cur.prev = None  # its outputs come from a whole segment: nothing to fuse a stage after it with
        if cur.blocked:
            return
        try:
            cur.inputs = run_passthrough(step, cur.inputs, timeout_s=max(60.0, self.run.settings.timeout_s))
        except KeyboardInterrupt:
            raise
        except Exception as e:
            cur.blocked = f"not measured: {', '.join(step.names)} (run as a whole) failed: {describe(e)}"
            self.say(cur.blocked)
            return
        # keyed by content: SPDL may emit them in any order, and the segment itself cannot be
        # fingerprinted (it may hold executors)
        cur.key = items_key(cur.inputs)[0]
        cur.came_from = ", ".join(repr(n) for n in step.names)
        self.say(f"ran {cur.came_from} as a whole: {len(cur.inputs)} outputs")
        if not cur.inputs:
            cur.blocked = f"not measured: {', '.join(step.names)} produced no outputs"

    def _not_measured(self, step: Any, writer: RowWriter, reason: str) -> None:
        self.run.stage_meta(step.name).update(status="not_measured", reason=reason)
        self._skip(step, writer, reason)
        self.run.write_meta()

    def _skip(self, step: Any, writer: RowWriter, reason: str, **which: Any) -> None:
        """The points of ``step`` not measured (``which``: as :func:`skipped_rows` takes), on disk and said."""
        for row in skipped_rows(step, self.run.settings, reason, **which):
            writer.write(row.as_row())
            self.run.progress.point(row)

    def _stage(
        self, step: Any, cur: Cursor, writer: RowWriter, cache: StageCache, n_source: int, src_problem: str | None
    ) -> None:
        """One stage: its first pass (cached), then its sweep, on the current inputs; moves the cursor on."""
        run, settings = self.run, self.run.settings
        smeta = run.stage_meta(step.name)
        if cur.blocked:
            run.meta["not_isolated"].append({"name": step.name, "reason": cur.blocked})
            self._not_measured(step, writer, cur.blocked)
            return
        started = time.perf_counter()
        # a first pass in a process still out of memory would fail for want of it, or hang starting its threads
        short = memory_short()
        if short is None:
            try:
                with run.phase("first_pass"):
                    cached, key, unstable = first_pass(step, cur, cache, settings, run.plan)
            except Exception as e:  # out of memory outside its calls: a thread, a pool that could not start
                what = out_of_memory(e)
                if what is None:
                    raise
                short = f"out of memory on its first pass ({what})"
        if short is not None:
            self.say(f"{step.name!r}: not measured: {short}")
            self._not_measured(step, writer, f"not measured: {short}")
            cur.blocked = f"not measured: the earlier stage {step.name!r} could not run: {short}"
            return
        first = cached.first
        self._report_outputs(step, cur.inputs, cached, unstable, time.perf_counter() - started)
        if first.crashed:
            # It kills the process that runs it: its thread points would run it in this one.
            self._not_measured(
                step,
                writer,
                f"not measured: a worker process died running it on its first pass ({first.crashed}); "
                "on threads it would end this process too",
            )
            cur.blocked = f"not measured: the earlier stage {step.name!r} crashed its worker process"
            return
        minputs = measure_inputs(step, cur.inputs, first)
        self._note_inputs(step, cur, cached, smeta, minputs, n_source)
        measured, sweep_inputs = step, minputs
        if minputs and self._consumes(step, minputs[0], first, smeta, cur.prev):
            assert cur.prev is not None  # _consumes says so only when there is a stage to fuse with
            measured = replace(step, fn=Fused(cur.prev.stage.fn, step.fn))
            sweep_inputs = cur.prev.inputs
            smeta["items_per_input"] = cur.prev.items_per_input
        if minputs:
            self._sweep_stage(measured, sweep_inputs, writer, cur.came_from, src_problem)
        else:
            reason = "no inputs to measure it on" + (
                " (the aggregator emitted nothing)" if step.type == "aggregate" else ""
            )
            smeta.update(status="not_measured", reason=reason)
            self._skip(step, writer, reason)
        advance(step, cur, cached, key, minputs, smeta.get("items_per_input"), settings.timeout_s)

    def _note_inputs(
        self, step: Any, cur: Cursor, cached: CachedOutputs, smeta: dict, minputs: list, n_source: int
    ) -> None:
        """The stage's entry in run.json: what it was measured on, and what one of its calls stands for."""
        settings = self.run.settings
        # Source items one call of this stage stands for (after a batch: the batch size); the analysis turns
        # per-call figures into per-source-item ones with it. From what the stage really received and
        # grouped, never from how many inputs it was measured on: the outputs cap can stop a stage part-way,
        # and its calls do not stand for more items because of that.
        per_input = n_source * cur.fraction / len(cur.inputs) if cur.inputs else 0.0
        per_call = sum(len(g) for g in minputs) / len(minputs) if step.type == "aggregate" and minputs else 1
        cut = (
            f"measured on the first {len(minputs)} of its {len(cur.inputs)} inputs: their outputs reached "
            f"STAGEBENCH_CACHE_MAX_MB ({settings.cache_max_mb:g} MB)"
            if cached.first.capped and step.type != "aggregate"
            else None
        )
        if cut:
            self.say(f"{step.name!r}: {cut}")
        short = (
            f"its {len(cur.inputs)} cached inputs make no whole batch: it and the stages after it are measured on "
            f"that short one, and the whole-pipeline runs (whose batches are whole) count each batch as "
            f"{len(cur.inputs)} inputs; raise SPDL_PIPELINE_DIAGNOSTIC_MODE_NUM_ITEMS past two batches"
            if cached.first.flushed
            else None
        )
        if short:
            self.say(f"{step.name!r}: {short}")
        smeta.update(
            status="measured",
            n_inputs=len(minputs),
            n_outputs=len(cached.items),
            items_per_input=per_input * per_call if minputs else None,
            inputs_cut=cut,
            short_batch=short,
            cache="hit" if cached.hit else ("off" if self.run.cache_dir is None else "computed"),
            caching_errors=cached.first.n_errors,
            caching_error_example=cached.first.error_example,
            outputs_mb=round(cached.first.bytes / 2**20, 3),
        )
        self.run.write_meta()

    def _consumes(self, step: Any, item: Any, first: FirstPass, smeta: dict, prev: _Fresh | None) -> bool:
        """Whether ``step`` consumes its inputs and is to be measured fused with the stage before it.

        Only a sync pipe on threads can tell (a process gets a fresh copy of each input), and only
        after a first pass without errors. Says so, and why, in either case.
        """
        why = consumes_why(step, item, first, self.run.settings.timeout_s)
        if why is None:
            return False
        smeta["consumes_inputs"] = why
        if prev is None or not prev.inputs:
            self.say(
                f"{step.name!r}: calling it again on an input fails ({why}): it consumes its inputs, and no "
                "stage before it can give it fresh ones; its points will fail"
            )
            return False
        smeta["fused_with"] = prev.stage.name
        # every stage the fused call also runs: the analysis takes their work out of this one's (analysis/_fused)
        smeta["fused_chain"] = list(prev.chain)
        self.say(
            f"{step.name!r}: calling it again on an input fails ({why}): it consumes its inputs; measured fused "
            f"with {prev.stage.name!r}, on fresh outputs of it each call (its rows are the pair's throughput)"
        )
        return True

    def _announce_source(self, source_items: list, unhashable: str | None) -> str | None:
        """Say once, before any stage runs, what source items that cannot be pickled rule out; returns why a
        process pool cannot take them (None when it can, or when no process points are planned)."""
        settings = self.run.settings
        problem = pickle_problem(source_items, cloud=True) if "process" in settings.executors else None
        uncached = "; stage outputs are not cached between runs" if unhashable and self.run.cache_dir else ""
        if problem:
            self.say(
                f"source items cannot be pickled ({problem}): process executors are skipped for stages "
                f"that receive them; {self._the_others()}{uncached}"
            )
        elif uncached:
            self.say(f"{unhashable}{uncached}")
        return problem

    def _on_row(self, inputs: list, row: StageDraft) -> None:
        """After each point of a stage's sweep: the CPU's speed, and SPDL's no-op pipeline next to its ceiling."""
        if row.elapsed_s:  # measured, not a skipped or shared point
            self.sweep_speeds.append(round(cpu_speed_ns(), 2))
            if row.role == "stage" and row.executor in ("thread", "async"):
                self.stage_speeds.setdefault(row.stage, []).append(self.sweep_speeds[-1])
        if (
            row.role == "ceiling"
            and (row.harness, row.executor, row.concurrency) == NOOP_AT
            and row.status == "ok"
            and row.elapsed_s  # measured now, not a copy shared with a later stage
        ):
            measure_overhead(self.run, inputs, one_stage=row)

    def _sweep_stage(
        self, step: Any, inputs: list, writer: RowWriter, came_from: str | None, src_problem: str | None
    ) -> None:
        """Sweep one stage; process points are skipped with one reason when its inputs cannot be pickled.

        Only the first input is checked per point when measuring, so inputs that pickle only in part
        would otherwise start a pool, fail, and be recorded as failures of the stage.
        """
        cfg = sweep_config(step, self.run.settings)
        planned = {ex for _, _, ex, _ in plan_points(step.fn, cfg)}
        problem = pickle_problem(inputs, cloud=True) if "process" in planned else None
        if not problem:
            self._sweep_points(step, inputs, writer, cfg)
            return
        if came_from is not None or not src_problem:  # the source's own message covered the first stage
            self.say(
                f"{step.name!r}: its inputs (the outputs of {came_from or 'the source'}) cannot be pickled "
                f"({problem}): process executors are skipped for it; {self._the_others('it is')}"
            )
        kept = tuple(ex for ex in cfg.executors if ex != "process")
        if kept:
            self._sweep_points(step, inputs, writer, replace(cfg, executors=kept))
        else:
            self.run.stage_meta(step.name).update(
                status="not_measured",
                reason=f"inputs cannot be pickled ({problem}) and STAGEBENCH_EXECUTORS allows only process",
            )
        self._skip(
            step, writer, f"inputs cannot be pickled for a process pool: {problem}", executor="process", ceilings=True
        )

    def _sweep_points(self, step: Any, inputs: list, writer: RowWriter, config: SweepConfig) -> None:
        """Threads and the event loop now; process points later, every stage's level by level on one pool
        (core/_sweep.sweep_process_points, after the last stage)."""
        s = StageSweep(
            step.fn,
            inputs,
            name=step.name,
            config=config,
            writer=writer,
            progress=self.run.progress,
            shared_ceilings=self.shared_ceilings,
            on_row=functools.partial(self._on_row, inputs),
            items_per_input=self.run.stage_meta(step.name).get("items_per_input"),
        )
        # the lowest thread level first: the probe needs it (_computes), and what it reads may end the
        # thread curve early (a GIL-free stage whose cores are busy, a stage that holds the GIL) and rule
        # out process points (core/_sweep._threads_cores_bound, _threads_gil_bound, _cores_bind)
        pts = [p for p in s.points if p.executor != "process"]
        first = next((p for p in pts if p.role == "stage" and p.executor == "thread"), None)
        # that point and its harness's ceiling at the same setting
        head = [p for p in pts if first is not None and p._replace(role="stage") == first]
        s.run(head, None)
        with self.run.phase("gil_probes"):
            reading = self._probe_gil(step, inputs, s.rows)
        if reading and finite(reading.get("high")):
            s.gil_high = float(reading["high"])
        if reading and finite(reading.get("low")):
            s.gil_low = float(reading["low"])
        s.run([p for p in pts if p not in head], None)
        if s.process_pending():
            self.process_sweeps.append(s)
        else:  # ruled out by its thread curve: the skipped rows now, and its inputs need not be kept
            s.run(s.remaining("process"), None)

    def _probe_gil(self, step: Any, inputs: list, rows: list[StageDraft]) -> dict[str, Any] | None:
        """Read the stage's GIL share directly (:mod:`._gilprobe`) when it computes enough for it to matter.

        After its first thread point, with SPDL's tear-downs finished: the probe sets the switch
        interval and reads CPU clocks, so nothing else may run. A stage that computes less than 15% of
        its call (waits) holds the GIL at most that share, which the curves bound well; the probe
        (~0.35 s) is for the others.
        """
        settings = self.run.settings
        if settings.gil_probe == "off" or not _computes(rows):
            return None

        settle()  # the thread points' SPDL tear-downs, still finishing in the background
        reading = probe_gil(step.fn, inputs[:32], timeout_s=settings.timeout_s)
        self.run.stage_meta(step.name)["gil_probe"] = reading
        if "error" in reading:
            self.say(f"{step.name!r}: no GIL probe: {reading['error']}")
        self.run.write_meta()
        return reading

    def _the_others(self, what: str = "they are") -> str:
        """What becomes of the points that are not process points."""
        if any(ex != "process" for ex in self.run.settings.executors):
            return "thread/async points are measured"
        return f"STAGEBENCH_EXECUTORS allows only process, so {what} not measured"

    def _report_outputs(
        self, step: Any, inputs: list, cached: CachedOutputs, unstable: str | None, seconds: float
    ) -> None:
        """What a stage's first pass gave: its outputs, the cache, its errors, and where it stopped."""
        settings, first = self.run.settings, cached.first
        n_out, mb = len(cached.items), first.bytes / 2**20
        name = repr(step.name)
        if cached.hit:
            self.say(f"{name}: {n_out} outputs ({mb:.1f} MB) loaded from the cache {self.run.cache_dir}")
        else:
            self.say(f"{name}: ran once over {len(inputs)} inputs in {seconds:.1f} s -> {n_out} outputs ({mb:.1f} MB)")
        if unstable:
            self.say(f"{name}: outputs not cached between runs: {unstable}")
        if cached.note:
            self.say(f"{name}: {cached.note}")
        if first.n_errors:
            rest = "later stages use the outputs of the others" if n_out else "later stages cannot be measured"
            self.say(f"{name}: {first.n_errors} of {first.n_run} inputs raised ({first.error_example}); {rest}")
        if first.capped:
            self.say(
                f"{name}: outputs reached the cache cap STAGEBENCH_CACHE_MAX_MB={settings.cache_max_mb:g}: "
                f"kept {n_out} outputs from the first {first.n_run} of {len(inputs)} inputs; "
                "the rest were dropped (raise the cap to keep more)"
            )
        if first.crashed:
            self.say(f"{name}: a worker process died on its first pass: {first.crashed}")
        if first.process_note:
            self.say(f"{name}: {first.process_note}")
        if first.stalled:
            self.say(
                f"{name}: no item finished within {settings.timeout_s:g} s; kept the {n_out} outputs computed before that"
            )
