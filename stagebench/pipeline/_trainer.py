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

import contextlib
import time
from collections.abc import Callable, Generator, Iterator
from typing import Any

from stagebench.core._steps import CACHED_BATCHES, TrainerProbe
from stagebench.loader._trainer import trainer_phases

__all__ = ["collect_batches", "run_trainer_phases"]


@contextlib.contextmanager
def _running(plan: Any, source_items: list, choices: dict) -> Iterator[Any]:
    """The user's pipeline at ``choices``, started over the cached source items (cycled); stopped after."""
    from stagebench.core._spdl_harness import quiet_spdl_log
    from stagebench.pipeline._isolate import _real_pipeline, build_validation_config, default_threads

    def cycle():
        while True:
            yield from source_items

    cfg, closers, _ = build_validation_config(plan, choices, cycle())
    pipeline = _real_pipeline(cfg, default_threads(plan))
    with quiet_spdl_log():
        pipeline.start()
        try:
            yield pipeline
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


def collect_batches(plan: Any, source_items: list, choices: dict, n: int, timeout_s: float) -> list:
    """The first ``n`` items the real pipeline delivers at ``choices`` (its sink's batches)."""
    out: list = []
    with _running(plan, source_items, choices) as pipeline:
        deadline = time.perf_counter() + timeout_s
        while len(out) < n and time.perf_counter() < deadline:
            try:
                out.append(pipeline.get_item(timeout=max(0.1, deadline - time.perf_counter())))
            except (TimeoutError, EOFError):
                break
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

    def live() -> Iterator[Any]:
        with _running(plan, items, choices) as pipeline:
            yield from probe.real_phase(lambda: pipeline.get_item(timeout=settings.timeout_s))

    return (
        yield from trainer_phases(
            probe,
            lambda: collect_batches(plan, items, choices, CACHED_BATCHES, settings.timeout_s),
            live,
            session["run_dir"],
            end,
        )
    )
