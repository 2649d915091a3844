"""One card per stage: its class, GIL share, evidence, fits, recommendation and measured points.

Both pages draw them: a pipeline's stages, and a loader's transforms measured as stages.
Throughputs are in source items/s, the unit of the pipeline's bounds, whatever a stage's call
stands for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pandas as pd

from stagebench._numbers import SourceItems, num_or_none
from stagebench.analysis._pipeline_job import user_setting
from stagebench.model._stage import StageEntry, StageSetting
from stagebench.report import _plots, _stage_plots
from stagebench.report._html import svg_uri
from stagebench.report._page_parts import cell, problem_rows

__all__ = ["stage_cards"]

_STAGE_ROW_ORDER = ("stage", "role", "harness", "executor", "concurrency")
_CLASS_TEXT = {
    "gil-bound": "holding the GIL is most of its call: threads queue for it, processes each have their own",
    "cpu-bound": "computing without the GIL is most of its call (C code): it scales with the cores",
    "io-bound": "waiting (I/O, sleep, await) is most of its call: it scales with concurrency",
    "overhead-bound": "its call is shorter than the harness's cost per item: batch it",
    "ipc-bound": "limited by moving data between processes (a run from before the labels said what a stage is)",
    "unknown": "not classified: how its call spends its time was not measured",
}
# looked up with whatever a summary holds, None included


@dataclass(frozen=True, slots=True)
class _Signal:
    """One signal the GIL share was read from, as the card's evidence table shows it."""

    key: str
    label: str
    value: Any
    low: Any
    high: Any


def _signal_items(signals: Mapping[str, Any]) -> list[_Signal]:
    out = []
    for key, sig in signals.items():
        if not isinstance(sig, Mapping):
            sig = {"value": sig}
        iv = sig.get("interval") or [None, None]
        low, high = (iv[0] if len(iv) > 0 else None), (iv[1] if len(iv) > 1 else None)
        out.append(_Signal(str(key), str(sig.get("label") or key), sig.get("value"), low, high))
    return out


@dataclass(frozen=True, slots=True)
class _Fit:
    """One fitted curve (an executor × harness), as the card's fits table shows it."""

    key: str
    sigma: Any
    kappa: Any
    amdahl: Any
    peak: Any
    r2: Any
    levels: Any
    warning: Any


def _fit_items(fits: Mapping[str, Any]) -> list[_Fit]:
    out = []
    for key, f in sorted((fits or {}).items()):
        f = f or {}
        out.append(
            _Fit(
                key=key,
                sigma=f.get("sigma"),
                kappa=f.get("kappa"),
                amdahl=f.get("amdahl_serial_fraction"),
                peak=f.get("peak_concurrency"),
                r2=f.get("r2"),
                levels=f.get("levels"),
                warning=f.get("warning"),
            )
        )
    return out


@dataclass(frozen=True, slots=True)
class _Point:
    """One measured point of a stage, in source items/s: the numbers behind the card's two figures."""

    executor: Any
    harness: Any
    concurrency: float | None
    qps: Any
    qps_low: Any
    qps_high: Any
    cores: float | None
    p50: float | None
    p99: float | None
    mem: float | None


def _point_rows(rows: pd.DataFrame, src: SourceItems) -> list[_Point]:
    """The stage's measured points, the numbers behind its two figures: throughput in source items/s
    (``src``, the card's unit), cores used, latency and memory."""
    if rows.empty or not {"role", "status", "qps"} <= set(rows.columns):
        return []
    ok = rows[(rows["role"].astype(str) == "stage") & (rows["status"].astype(str) == "ok")]
    # one kind of memory for the whole column, as the figure plots it: PSS where it was read, else peak RSS
    mem = (
        "mem_pss_mb"
        if "mem_pss_mb" in ok and pd.to_numeric(ok["mem_pss_mb"], errors="coerce").notna().any()
        else "mem_peak_mb"
    )
    return [
        _Point(
            executor=cell(r.get("executor")),
            harness=cell(r.get("harness")),
            concurrency=num_or_none(r.get("concurrency")),
            qps=src.rate(r.get("qps")),
            qps_low=src.rate(r.get("qps_low")),
            qps_high=src.rate(r.get("qps_high")),
            cores=num_or_none(r.get("cores_used")),
            p50=num_or_none(r.get("latency_p50_ms")),
            p99=num_or_none(r.get("latency_p99_ms")),
            mem=num_or_none(r.get(mem)),
        )
        for r in ok.to_dict("records")
    ]


def _cpu_text(st: StageEntry, src: SourceItems) -> str | None:
    """The stage's CPU per source item, and the part of it holding the GIL, in one unit (``32.4 µs, of which
    0.167 µs holding the GIL``, not ``0.0324 ms, of which 0.000167 ms``); None where no CPU was read."""
    cpu, gil = num_or_none(st.cpu_s_per_item), num_or_none(st.gil_s_per_item)
    if cpu is None:
        return None
    if gil is None:
        return src.ms(cpu)
    on_cpu, held = src.ms_each(cpu, gil)
    return f"{on_cpu}, of which {held} holding the GIL"


def _in_items(point: StageSetting | None, src: SourceItems) -> StageSetting:
    """A setting with its throughputs in source items/s (an empty setting where there is none)."""
    if point is None:
        return StageSetting()
    return replace(point, qps=src.rate(point.qps), qps_low=src.rate(point.qps_low), qps_high=src.rate(point.qps_high))


def stage_cards(
    rows: pd.DataFrame,
    entries: Sequence[StageEntry],
    declared: Sequence[str],
    cores: float | None,
    anchor: str = "stage",
    resources_plot: bool = True,
) -> list[dict[str, Any]]:
    """One card per stage (pipeline stages, or a loader's transforms measured as stages).

    ``resources_plot=False`` (quick mode) leaves out the cores/latency/memory
    figure: its three panels are about half of a quick report's time, and the
    card's points table has the same numbers.
    """
    # each stage's name as its card and the rows say it ("None" for an entry without one)
    by_name = {str(st.name if "name" in st.keys else None): st for st in entries}
    measured = rows["stage"].astype(str).unique() if "stage" in rows.columns else ()
    names = list(dict.fromkeys([*by_name, *declared, *measured]))
    cards = []
    for i, name in enumerate(names, start=1):
        st = by_name.get(name) or StageEntry()
        sub = rows[rows["stage"].astype(str) == name] if "stage" in rows else rows.iloc[0:0]
        sub = sub.sort_values(list(_STAGE_ROW_ORDER), kind="stable") if len(sub) else sub
        cls = st.classification or "unknown"
        ev = st.evidence
        gi = st.gil_fraction_interval or (None, None)
        src = SourceItems(st.items_per_input)
        points = _point_rows(sub, src)
        cards.append(
            {
                "anchor": f"{anchor}-{i}",
                "name": name,
                "index": i,
                "type": st.type or "",
                "status": st.status if "status" in st.keys else ("ok" if len(sub) else "not measured"),
                "classification": cls,
                "class_text": _CLASS_TEXT.get(cls, cls)
                + (
                    f"; alone at {st.limit.at}, {str(st.limit.text).split(':')[0]}"
                    if st.limit is not None and st.limit.kind
                    else ""
                ),
                "class_color": _plots.CLASS_COLORS.get(cls, _plots.OKABE_ITO["grey"]),
                "gil": st.gil_fraction,
                "gil_at_most": (st.gil_only_bounded or (None, None))[1],
                "gil_unread": st.gil_unread,
                "gil_direct": st.gil_read_directly,
                "gil_low": gi[0],
                "gil_high": gi[1] if len(gi) > 1 else None,
                "evidence": [str(x) for x in ev.summary],
                "signals": _signal_items(ev.signals),
                "fits": _fit_items(st.fit),
                # source items/s, the unit of the bounds and the pipeline lines; calls/s as a side note
                "rec": _in_items(st.recommended, src),
                "yours": user_setting(st),
                "best": _in_items(st.best, src),
                "ceiling": src.rate(st.ceiling_qps),
                # measured at the stage's own best setting, where the pipeline's choice differs
                "alone": _in_items(st.recommended_alone, src) if st.recommended_alone is not None else None,
                "alone_unpaired": st.head_to_head_skipped if st.recommended_alone is not None else None,
                "items_per_call": num_or_none(st.items_per_input) if "items_per_input" in st.keys else None,
                "calls_qps": st.recommended.qps if st.recommended is not None else None,
                # per source item, as the evidence's words say them
                "cpu": _cpu_text(st, src),
                "img_qps": svg_uri(_stage_plots.stage_throughput_svg(sub, st)) if len(sub) else None,
                "img_res": svg_uri(_stage_plots.stage_resources_svg(sub, cores))
                if len(sub) and resources_plot
                else None,
                "res_in_table": bool(points) and not resources_plot,
                "points": points,
                "problems": problem_rows(sub),
            }
        )
    return cards
