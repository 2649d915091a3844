"""``STAGEBENCH_TRAINER=measure`` for DataLoaders, and what both kinds of run write when it ends.

After the loader sweep, the user's own loop gets batches from the loader at the recommended
setting (:class:`stagebench.core._steps.TrainerProbe`): first a few cached ones (its step, the
demand), then the live loader (the data wait). The loader summary then picks the cheapest measured
setting that feeds that demand with 10% to spare, as it does for a stated ``target_rate``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

from stagebench.core._steps import CACHED_BATCHES, TrainerProbe

__all__ = ["finish_trainer", "write_trainer", "trainer_phases", "loader_trainer_phases", "end_from_close"]


def write_trainer(run_dir: Any, probe: TrainerProbe) -> None:
    from stagebench.runs._results import RunDir

    rd = RunDir(run_dir)
    meta = rd.read_meta()
    meta["trainer"] = probe.result()
    rd.write_meta(meta)


def finish_trainer(run_dir: Any, probe: TrainerProbe, say: Callable[[str], None]) -> int:
    """Write the trainer's figures, the summary and the report again; say the answer."""
    from stagebench.analysis._summary import summarize_run
    from stagebench.report._render import write_report
    from stagebench.runs._results import RunDir

    write_trainer(run_dir, probe)
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
            f"trainer on {probe.live}: {wp['samples_per_s']:,.1f} items/s, {wp['data_wait_share']:.0%} of "
            "each step waiting for data"
        )
    verdict = (summary.get("demand") or {}).get("text") or (summary.get("target") or {}).get("verdict")
    if verdict:
        say(f"trainer: {verdict}")
    say(f"report: {Path(run_dir) / 'report.html'}")
    return 0


def end_from_close(code: int, *, in_process: bool = False) -> None:
    """End the program from a generator being closed (the user's loop stopped early).

    An exception raised there is ignored when the close comes from the generator being
    collected, and the program would go on to train for real. ``in_process``: under
    ``run_script``, whose caller's process must not end: ``SystemExit`` then.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    if in_process:
        raise SystemExit(code)
    os._exit(code)


def trainer_phases(
    probe: TrainerProbe,
    cached: Callable[[], list],
    live: Callable[[], Iterator[Any]],
    run_dir: Any,
    end: Callable[[int], None],
) -> Generator[Any, None, int]:
    """Both phases, as a generator the user's loop iterates; returns the exit code.

    ``cached()``: the batches of the first phase; ``live()``: the second phase, yielding the real
    loader's or pipeline's batches through ``probe.real_phase``. What was measured is written after
    the first phase (should the loop fail on the live batches) and at the end; a loop that stops
    early ends the program through ``end`` once it is written.
    """
    try:
        yield from probe.alone_phase(cached())
        if probe.error is None:
            write_trainer(run_dir, probe)
            yield from live()
    except GeneratorExit:
        probe.stopped_early = "your loop stopped"
        finish_trainer(run_dir, probe, probe.say)
        end(0)
        return 0
    return finish_trainer(run_dir, probe, probe.say)


def loader_trainer_phases(
    factory: Any, knobs: Any, run_dir: Path, seconds: float, say: Callable[[str], None], end: Callable[[int], None]
) -> Generator[Any, None, int]:
    """Both phases on a DataLoader rebuilt at ``knobs`` (the recommended setting); returns the exit code."""
    probe = TrainerProbe(seconds=seconds, items_per_batch=float(factory.batch_size), say=say, live="the live loader")

    def cached() -> list:
        batches = []
        built = factory(knobs)
        try:
            for tag in built.loader:
                batches.append(tag[0])  # the user's own batch, out of the sweep's tag
                if len(batches) >= CACHED_BATCHES:
                    break
        finally:
            if built.close is not None:
                built.close()
        return batches

    return (yield from trainer_phases(probe, cached, lambda: _live(probe, factory, knobs), run_dir, end))


def _live(probe: TrainerProbe, factory: Any, knobs: Any):
    built = factory(knobs)
    state = {"it": iter(built.loader)}

    def get() -> Any:
        try:
            return next(state["it"])[0]
        except StopIteration:  # a new epoch, with what that costs (worker start-up without persistence)
            state["it"] = iter(built.loader)
            return next(state["it"])[0]

    try:
        yield from probe.real_phase(get)
    finally:
        if built.close is not None:
            built.close()
