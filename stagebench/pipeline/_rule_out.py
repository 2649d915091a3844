"""The process points and head-to-heads a diagnosis need not run: those whose result could not change
the pipeline's settings, decided on every stage's thread curves before any process point runs.

Stages the user runs on processes keep theirs (it is their setting that they check), and
``STAGEBENCH_PROCESS_FLAT_LEVELS=0`` measures everything. An analysis bug here costs no measurement:
the points are then all run, and the traceback goes to ``error.log``.
"""

from __future__ import annotations

from typing import Any

from stagebench.core._paired import WITHIN_BEST
from stagebench.pipeline._run import Run

__all__ = ["rule_out_processes", "paired_needless"]


def _user_process_stages(run: Run) -> set[str]:
    """The stages the user's own script runs on processes: their process points check that setting."""
    return {st.name for st in run.plan.stages if st.user_executor == "process"}


def rule_out_processes(run: Run, process_sweeps: list[Any]) -> None:
    """Skip the process points of stages whose processes could not change the pipeline's settings, and
    take those stages out of ``process_sweeps``.

    The bounds the joint recommendation maximises, with each such stage's processes at their most
    optimistic (:func:`stagebench.analysis._joint.process_headroom`): a stage whose processes could
    raise them by no more than the 5% within which settings count as equal is not measured on
    processes, since another stage, the cores or the GIL binds the pipeline whatever this one runs on.
    """
    # pandas with it: loaded when the rows are analysed, not in the process while it measures
    from stagebench.analysis._pipeline import process_headroom_of_run

    mine = _user_process_stages(run)
    sweeps = [s for s in process_sweeps if s.cfg.process_flat_levels and s.name not in mine]
    if not sweeps or len(run.plan.stages) < 2:
        return
    pending = {s.name: sorted({p.concurrency for p in s.remaining("process")}) for s in sweeps}
    with run.phase("process_headroom"):
        try:
            head = process_headroom_of_run(run.rows(), run.meta, pending, stage_cache=run.analysis_cache)
        except Exception as e:  # an analysis bug must not cost the measurements: measure them all
            run.log_error("process headroom", e)
            return
    for s in sweeps:
        h = head.get(s.name)
        if h is None or not h["gain"] * WITHIN_BEST <= 1.0:
            continue
        why = (
            f"not measured: on processes this stage could not change the pipeline's settings: even at "
            f"their best (each worker as fast as one thread alone, no IPC, its GIL time out of the main "
            f"process) the bounds give the pipeline {h['best']:,.0f} items/s against {h['on_threads']:,.0f} "
            f"with it on threads (set by {h['binding']}); "
            "process_flat_levels=0 or STAGEBENCH_PROCESS_FLAT_LEVELS=0 measures them"
        )
        for harness in dict.fromkeys(p.harness for p in s.remaining("process")):
            s.stopped[("stage", harness, "process")] = s.stopped[("ceiling", harness, "process")] = why
        s.run(s.remaining("process"), None)  # their skipped rows, with the reason
        process_sweeps.remove(s)


def paired_needless(run: Run, sweeps: Any) -> dict[str, str]:
    """The planned head-to-heads whose result could not change the pipeline's settings, and why.

    Called with every stage's curves measured, before any head-to-head
    (:func:`stagebench.analysis._pipeline.paired_needless_of_run`). ``gil_mix``'s ``mixed`` (processes
    1.26x threads on its curves, 8 windows, ~2.3 s): at 0.9x or 1.76x the cores would bind the pipeline
    either way.
    """
    # pandas with it: loaded when the rows are analysed, not in the process while it measures
    from stagebench.analysis._pipeline import paired_needless_of_run

    mine = _user_process_stages(run)
    planned = {
        s.name: p
        for s in sweeps
        if s.name not in mine and s.cfg.process_flat_levels  # 0: measure everything
        for p in [s.paired_plan()]
        if p
    }
    if not planned or len(run.plan.stages) < 2:
        return {}
    with run.phase("head_to_head_needed"):
        try:
            needless = paired_needless_of_run(run.rows(), run.meta, planned, stage_cache=run.analysis_cache)
        except Exception as e:  # an analysis bug must not cost the head-to-heads: run them
            run.log_error("head-to-head needed", e)
            return {}
    for name, why in needless.items():
        run.stage_meta(name)["head_to_head_skipped"] = why
        run.say(f"{name!r}: {why}")
    if needless:
        run.write_meta()
    return needless
