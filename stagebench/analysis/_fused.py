"""A stage measured fused with the stages before it, counted once.

A stage that consumes its inputs (calling it twice on one input fails: SPDL's ``convert_frames``
takes ownership of the decoded frames) is measured fused with what feeds it: each call runs the
stages before it on fresh inputs, then the stage (:mod:`stagebench.pipeline._stages`, ``run.json``
stage ``fused_chain``). Its rows are the pair's throughput. Counted as they stand, the work of the
stages before it is in the pipeline's bounds and in the replay twice: once as themselves, once
inside this stage.

So its own figures are the fused ones less those of the stages in its chain, per call, where each of
them was measured alone: their call's time (the stage's ``stage_s_per_item``, at its lowest level),
CPU and GIL, scaled from their items to this stage's (``items_per_input``: source items per call).
Every point of its curves loses that time from its lane (concurrency over throughput), its latency
and its CPU. An approximation, said on the stage: the chain's work is taken as it was alone, so
contention between the two inside the fused call stays in this stage's share.
"""

from __future__ import annotations

import functools
from typing import Any

from stagebench._numbers import finite, fmt_ms_each, num
from stagebench.model._meta import RunMeta
from stagebench.model._stage import StageEntry, StageSetting, changed

__all__ = ["unfuse"]

_FLOOR = 0.01  # a stage keeps at least this share of its fused call's time: the subtraction is an estimate


def _per_source_item(e: StageEntry) -> dict[str, float] | None:
    """A chain stage's own time, CPU and GIL per source item (its call alone, at its lowest level)."""
    k = e.items_per_input
    t = num(e.stage_s_per_item)
    if not finite(t) or not t > 0 or not k > 0:
        return None
    base = e.alternative("async" if e.is_async else "thread") or StageSetting()
    cpu = num(base.call_cpu_s)
    if not finite(cpu):
        cpu = max(0.0, num(base.cpu_s_per_item) - num(base.harness_gil_s_per_item))
    gil = num(e.gil_s_per_item)
    return {
        "t": t / k,
        "cpu": min(cpu, t) / k if finite(cpu) else 0.0,
        "gil": gil / k if finite(gil) else 0.0,
    }


def unfuse(stages: list[StageEntry], meta: RunMeta) -> list[str]:
    """Take the chain's work out of every fused stage's figures (``stages``, the summary's entries as
    :func:`stagebench.analysis._stage.analyze_stage` makes them, each such entry replaced by its copy without
    it), by the chains ``meta`` (``run.json``) declares; returns the names of the stages changed."""
    declared = {str(d.get("name")): d for d in meta.stages}
    by_name = {e.name: e for e in stages}
    names = []
    for i, e in enumerate(stages):
        chain = (declared.get(str(e.name)) or {}).get("fused_chain") or []
        if not chain or e.status != "ok":
            continue
        parts = [_per_source_item(by_name[n]) for n in chain if n in by_name]
        if not parts or any(p is None for p in parts):
            continue
        k = e.items_per_input
        t_chain, cpu_chain, gil_chain = (k * sum(p[x] for p in parts if p) for x in ("t", "cpu", "gil"))
        t_f = num(e.stage_s_per_item)
        if not finite(t_f) or not t_f > 0:
            continue
        t_own = max(_FLOOR * t_f, t_f - t_chain)
        gil_own = max(0.0, num(e.gil_s_per_item) - gil_chain) if finite(e.gil_s_per_item) else None
        iv = e.gil_fraction_interval
        if gil_own is not None and iv:
            iv = tuple(min(1.0, max(0.0, x - gil_chain / t_f) * t_f / t_own) for x in iv)
        cpu = num(e.cpu_s_per_item)
        said = (
            f"measured fused with {', '.join(chain)} (it consumes its inputs): their work alone "
            f"({' and '.join(fmt_ms_each(t_chain, cpu_chain))} of CPU per call) is taken out of its figures, so that "
            "the pipeline's bounds and replay count it once"
        )
        # every measured setting loses the chain's time per call and its CPU; the ceiling is the harness's: kept
        fix = functools.partial(_unfused, lane_cut=t_f - t_own, cpu_cut=cpu_chain)
        stages[i] = by_name[e.name] = changed(
            e,
            curves={key: tuple(map(fix, points)) for key, points in e.curves.items()},
            recommended=e.recommended and fix(e.recommended),
            best=e.best and fix(e.best),
            alternatives={ex: fix(alt) for ex, alt in e.alternatives.items()},
            stage_s_per_item=t_own,
            gil_s_per_item=gil_own,
            gil_fraction=e.gil_fraction if gil_own is None else min(1.0, gil_own / t_own),
            gil_fraction_interval=iv,
            cpu_s_per_item=max(0.0, cpu - cpu_chain) if finite(cpu) else e.cpu_s_per_item,
            # what limited the fused call: the pair's, said so
            limit=e.limit and changed(e.limit, text=f"(measured fused with {', '.join(chain)}) {e.limit.text}"),
            fused_chain=tuple(chain),
            evidence=changed(e.evidence, summary=(*e.evidence.summary, said)),
        )
        names.append(e.name)
    return names


def _unfused(was: StageSetting, lane_cut: float, cpu_cut: float) -> StageSetting:
    """A measured setting without the chain's time per call (its lane) and CPU."""

    def rate(q: Any, c: int) -> float | None:
        if not finite(q) or not float(q) > 0:
            return q
        lane = c / float(q)
        return c / max(lane * _FLOOR, lane - lane_cut)

    c = int(was.concurrency or 1)
    new: dict[str, float | None] = {
        k: rate(getattr(was, k), c) for k in ("qps", "qps_low", "qps_high") if k in was.keys
    }
    if finite(was.cpu_s_per_item):
        new["cpu_s_per_item"] = max(0.0, num(was.cpu_s_per_item) - cpu_cut)
    if finite(was.call_cpu_s):
        new["call_cpu_s"] = max(0.0, num(was.call_cpu_s) - cpu_cut)
    if finite(was.latency_p50_ms):
        lat = num(was.latency_p50_ms)
        new["latency_p50_ms"] = max(lat * _FLOOR, lat - lane_cut * 1e3)
    return changed(was, **new)
