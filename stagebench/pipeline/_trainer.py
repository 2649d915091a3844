"""The training step's demand, measured by running the user's own loop (``STAGEBENCH_TRAINER=measure``).

stagebench says how fast the pipeline can go; what a user brings is whether that
is fast enough for the training step. With ``STAGEBENCH_TRAINER=measure`` the
diagnosis does not exit after the report: the stand-in pipeline the user's loop
iterates hands it batches, in two phases of ``STAGEBENCH_TRAINER_S`` seconds:

1. **The trainer alone**: cached real batches (the pipeline's own output at the
   recommended settings, collected once: :func:`collect_batches`), handed at once,
   cycled. The time from handing a batch to the loop's next ``next()`` is the loop
   body's step: the trainer's demand T (steps/s; source items/s through the items
   per batch), with an interval from batch means over the steps. The first
   :data:`WARMUP_STEPS` steps are not counted (a compile, the first CUDA step).
2. **The trainer on the real pipeline**, at the recommended settings: the share of
   each step spent waiting for the next batch (data wait) is measured, as is the
   throughput the two reach together. On a CPU-only machine the loop and the
   pipeline share the cores: this phase is the check.

Then the run directory gets ``run.json["trainer"]``, the summary and report are
written again (the demand verdict now uses the measured T), and the program
exits as a diagnosis does. A loop that stops early (``break``, an exception)
ends the phase it is in: what was measured is kept.

Opt-in, because the loop body then runs: it may write checkpoints or logs, or
step an optimiser on repeated batches. Everything here runs in the user's main
thread, between their ``next()`` calls.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

__all__ = ["WARMUP_STEPS", "TrainerProbe", "collect_batches", "run_trainer_phases"]

WARMUP_STEPS = 3  # steps of each phase not counted: a compile, the first CUDA step, the first batches arriving
_MIN_STEPS = 2  # counted steps below this give no figure
_CACHED_BATCHES = 16  # real batches kept for the first phase (cycled)
_CHUNKS = 5  # batch means for the interval


def collect_batches(plan: Any, source_items: list, choices: dict, n: int, timeout_s: float) -> list:
    """The first ``n`` items the real pipeline delivers at ``choices`` (its sink's batches)."""
    from stagebench.core._spdl_harness import quiet_spdl_log
    from stagebench.pipeline._isolate import _real_pipeline, build_validation_config, default_threads

    def cycle():
        while True:
            yield from source_items

    cfg, closers, _ = build_validation_config(plan, choices, cycle())
    pipeline = _real_pipeline(cfg, default_threads(plan))
    out: list = []
    with quiet_spdl_log():
        pipeline.start()
        try:
            deadline = time.perf_counter() + timeout_s
            while len(out) < n and time.perf_counter() < deadline:
                try:
                    out.append(pipeline.get_item(timeout=max(0.1, deadline - time.perf_counter())))
                except TimeoutError:
                    break
                except EOFError:
                    break
        finally:
            try:
                pipeline.stop(timeout=10)
            except Exception:
                pass
            for close in closers:
                try:
                    close()
                except Exception:
                    pass
    return out


def _rate(durations: list[float]) -> tuple[float | None, float | None, float | None]:
    """Steps per second over ``durations`` (seconds per step), with a 95% interval from chunk means."""
    import numpy as np

    from stagebench.core._stats import interval_about

    if len(durations) < _MIN_STEPS or sum(durations) <= 0:
        return None, None, None
    rate = len(durations) / sum(durations)
    chunks = [c for c in np.array_split(np.asarray(durations), min(_CHUNKS, len(durations))) if c.sum() > 0]
    lo, hi, _ = interval_about(rate, [len(c) / c.sum() for c in chunks], 0.95)
    return rate, (lo if np.isfinite(lo) else None), (hi if np.isfinite(hi) else None)


class TrainerProbe:
    """Hands the user's loop batches and times its steps; one instance per diagnosis."""

    def __init__(
        self,
        *,
        seconds: float,
        items_per_batch: float,
        say: Callable[[str], None],
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.seconds = seconds
        self.items_per_batch = items_per_batch
        self.say = say
        self.clock = clock
        self.alone: list[float] = []  # step durations of the loop body on cached batches
        self.bodies: list[float] = []  # on the real pipeline: the loop body's part of each step
        self.waits: list[float] = []  # and the wait for the batch
        self.stopped_early: str | None = None
        self.error: str | None = None

    # ------------------------------------------------------------------ phase 1
    def alone_phase(self, batches: list) -> Iterator[Any]:
        """Yield cached batches until ``seconds`` of counted steps; time each step of the loop body."""
        if not batches:
            self.error = "no batch reached the sink to hand the loop"
            return
        self.say(
            f"trainer: your loop runs on {len(batches)} cached batches for {self.seconds:g} s "
            f"(the first {WARMUP_STEPS} steps not counted)"
        )
        i, counted = 0, 0.0
        while counted < self.seconds:
            t = self.clock()
            yield batches[i % len(batches)]
            dt = self.clock() - t
            if i >= WARMUP_STEPS:
                self.alone.append(dt)
                counted += dt
            i += 1

    # ------------------------------------------------------------------ phase 2
    def real_phase(self, get_item: Callable[[], Any]) -> Iterator[Any]:
        """Yield the real pipeline's batches; time the wait for each and the loop body after it."""
        self.say(f"trainer: your loop runs on the real pipeline at the recommended settings for {self.seconds:g} s")
        i, t_begin = 0, None
        while True:
            t0 = self.clock()
            try:
                item = get_item()
            except EOFError:
                self.stopped_early = "the pipeline ended"
                return
            t1 = self.clock()
            yield item
            t2 = self.clock()
            if i >= WARMUP_STEPS:
                t_begin = t0 if t_begin is None else t_begin
                self.waits.append(t1 - t0)
                self.bodies.append(t2 - t1)
                if t2 - t_begin >= self.seconds:
                    return
            i += 1

    # ------------------------------------------------------------------ result
    def result(self) -> dict[str, Any]:
        """``run.json["trainer"]``: the demand (alone) and the data wait (on the real pipeline)."""
        steps, lo, hi = _rate(self.alone)
        k = self.items_per_batch
        out: dict[str, Any] = {
            "steps_per_s": steps,
            "steps_per_s_low": lo,
            "steps_per_s_high": hi,
            "items_per_step": k,
            "samples_per_s": steps * k if steps is not None else None,
            "samples_per_s_low": lo * k if lo is not None else None,
            "samples_per_s_high": hi * k if hi is not None else None,
            "steps": len(self.alone),
            "seconds": sum(self.alone),
            "warmup_steps": WARMUP_STEPS,
            "error": self.error,
            "stopped_early": self.stopped_early,
        }
        total = sum(self.waits) + sum(self.bodies)
        if len(self.waits) >= _MIN_STEPS and total > 0:
            out["with_pipeline"] = {
                "steps": len(self.waits),
                "seconds": total,
                "data_wait_share": sum(self.waits) / total,
                "samples_per_s": len(self.waits) / total * k,
            }
        else:
            out["with_pipeline"] = None
        if out["samples_per_s"] is None and not out["error"]:
            out["error"] = f"fewer than {_MIN_STEPS} counted steps (the loop stopped after {len(self.alone)})"
        return out


def run_trainer_phases(
    session: dict[str, Any], settings: Any, say: Callable[[str], None], end: Callable[[int], None]
) -> Generator[Any, None, int]:
    """Both phases, as a generator the stand-in pipeline's iterator delegates to; returns the exit code.

    ``session``: what :func:`stagebench.pipeline._diagnose.diagnose_pipeline` left for this
    (the plan, the cached source items, the recommended choices, the run directory).
    ``end``: how to end the program when the user's loop stops early (the generator is
    then being closed, where an exception raised would be ignored).
    """
    probe = TrainerProbe(seconds=settings.trainer_s, items_per_batch=session["items_per_sink_item"], say=say)
    plan, items, choices = session["plan"], session["source_items"], session["choices"]
    try:
        batches = collect_batches(plan, items, choices, _CACHED_BATCHES, settings.timeout_s)
        yield from probe.alone_phase(batches)
        if probe.error is None:
            _write(session["run_dir"], probe)  # kept, should the loop fail on the real pipeline
            yield from _on_the_real_pipeline(probe, plan, items, choices, settings.timeout_s)
    except GeneratorExit:
        probe.stopped_early = "your loop stopped"
        _finish(session["run_dir"], probe, say)
        end(0)
        return 0
    return _finish(session["run_dir"], probe, say)


def _on_the_real_pipeline(probe: TrainerProbe, plan: Any, items: list, choices: dict, timeout_s: float):
    from stagebench.core._spdl_harness import quiet_spdl_log
    from stagebench.pipeline._isolate import _real_pipeline, build_validation_config, default_threads

    def cycle():
        while True:
            yield from items

    cfg, closers, _ = build_validation_config(plan, choices, cycle())
    pipeline = _real_pipeline(cfg, default_threads(plan))
    with quiet_spdl_log():
        pipeline.start()
        try:
            yield from probe.real_phase(lambda: pipeline.get_item(timeout=timeout_s))
        finally:
            try:
                pipeline.stop(timeout=10)
            except Exception:
                pass
            for close in closers:
                try:
                    close()
                except Exception:
                    pass


def _write(run_dir: Any, probe: TrainerProbe) -> None:
    from stagebench.runs._results import RunDir

    rd = RunDir(run_dir)
    meta = rd.read_meta()
    meta["trainer"] = probe.result()
    rd.write_meta(meta)


def _finish(run_dir: Any, probe: TrainerProbe, say: Callable[[str], None]) -> int:
    """Write the trainer's figures, the summary and the report again; say the answer."""
    from stagebench.analysis._summary import summarize_run
    from stagebench.report._render import write_report
    from stagebench.runs._results import RunDir

    _write(run_dir, probe)
    summary = summarize_run(run_dir)
    RunDir(run_dir).write_summary(summary)
    write_report(run_dir)
    res = probe.result()
    if res["samples_per_s"] is None:
        say(f"trainer: no demand measured ({res['error']})")
    else:
        say(
            f"trainer: your step takes {1e3 / res['steps_per_s']:.3g} ms: {res['samples_per_s']:,.1f} items/s "
            f"on cached batches ({res['steps']} steps)"
        )
    wp = res.get("with_pipeline")
    if wp:
        say(
            f"trainer on the real pipeline: {wp['samples_per_s']:,.1f} items/s, {wp['data_wait_share']:.0%} of "
            "each step waiting for data"
        )
    demand = summary.get("demand") or {}
    if demand.get("text"):
        say(f"trainer: {demand['text']}")
    say(f"report: {Path(run_dir) / 'report.html'}")
    return 0
