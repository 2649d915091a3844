"""SPDL's own cost per item of a pipeline, measured once per diagnosis: no-op pipelines of one and of
three identity stages, into ``run.json["pipeline_overhead"]``.

A one-stage ceiling includes the source, the sink and the consumer thread, which a k-stage pipeline
pays once; half the difference between the two no-op pipelines is what each further stage adds (two
stages apart, not one: the increment is small next to the noise of one point). The prediction charges
the first once and the second per stage.
"""

from __future__ import annotations

from stagebench._numbers import finite
from stagebench.core._measure import identity, measure_stage
from stagebench.core._spdl_harness import deferred_teardown
from stagebench.core._stage_draft import StageDraft
from stagebench.model._overhead import NOOP_KEYS, NoopPipeline, PipelineOverhead
from stagebench.pipeline._run import Run

__all__ = ["NOOP_AT", "measure_overhead"]

# Where SPDL's no-op pipelines are measured (harness, executor, concurrency): 4 threads, SPDL's
# smallest default pool (what a rebuilt pipeline gets). With one thread every hop queues behind the
# previous one, which is not what a pipeline running stages at concurrency 4-16 pays.
NOOP_AT = ("spdl", "thread", 4)


def measure_overhead(run: Run, items: list, one_stage: StageDraft | None = None) -> None:
    """SPDL's per-item cost of a pipeline, once (with two stages or more, and the spdl harness).

    Right after the thread no-op ceiling at thread x 4 (``one_stage``): that ceiling is the one-stage
    no-op pipeline, so only the three-stage one is measured, next to it in time (their difference is
    the per-stage cost, and host phases apart would enter it). Otherwise (a grid without 4, a thread
    curve that ended before it) both, after the thread points and before any process point.
    """
    if "pipeline_overhead" in run.meta or "spdl" not in run.settings.harnesses or len(run.plan.stages) < 2:
        return
    with run.phase("pipeline_overhead"):
        run.meta["pipeline_overhead"] = _pipeline_overhead(run, items, one_stage).to_json()
    run.write_meta()


def _noop(row: StageDraft, source: str | None = None) -> NoopPipeline:
    """The point of a no-op pipeline (a NaN figure: not measured, None), ``source`` where it was measured."""
    status, qps, cpu, low, high, reason = (
        v if not isinstance(v, float) or finite(v) else None for v in (getattr(row, k) for k in NOOP_KEYS)
    )
    extra = {"from": source} if source is not None else {}
    return NoopPipeline(status, qps, cpu, low, high, reason, extra=extra, keys=NOOP_KEYS + tuple(extra))


def _pipeline_overhead(run: Run, items: list, one_stage: StageDraft | None) -> PipelineOverhead:
    """SPDL's no-op cost with one and with three pipes (thread x 4, the same statistics); ``one_stage``, the
    thread no-op ceiling at x 4 just measured (the same pipeline, in the ceiling's shorter window), is
    then not measured again."""
    cfg = run.settings.measure_config()
    cfg = cfg.for_noop(cfg.budget_s)  # a no-op, steady at once; the whole budget: a difference is read
    harness, executor, c = NOOP_AT
    out: dict[str, NoopPipeline] = {}
    if one_stage is not None:
        out["one_stage"] = _noop(one_stage, f"the {executor} no-op ceiling at x {c}")
    with deferred_teardown():
        for key, extra in (("one_stage", 0), ("three_stage", 2)):
            if key in out:
                continue
            out[key] = _noop(
                measure_stage(
                    identity,
                    items,
                    executor=executor,
                    concurrency=c,
                    config=cfg,
                    name="(pipeline)",
                    role="ceiling",
                    harness=harness,
                    spdl_extra_pipes=extra,
                )
            )
    said = [f"{k.replace('_', ' ')} {p.qps:,.0f} items/s" for k, p in out.items() if finite(p.qps)]
    run.say("SPDL no-op pipeline: " + ", ".join(said))
    return PipelineOverhead(harness, executor, c, out["one_stage"], out["three_stage"])
