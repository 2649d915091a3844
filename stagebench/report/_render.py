"""The per-run HTML report: one self-contained file, rebuilt from saved rows.

Why it is built this way:

* A pure function of the run directory. ``results.csv`` and ``run.json`` are
  the source of truth; ``summary.json`` is derived from them (``rebuild``
  recomputes it) and the HTML is derived from all three. Nothing in the page
  depends on the clock, the host or hash seeds, so the same rows give the same
  bytes and a report can be diffed, cached and committed.
* Self-contained and offline: figures are SVG embedded as ``data:`` images
  (an image cannot run script, and separate documents cannot clash on ids),
  the CSV download is a ``data:`` link, and there is no JavaScript at all, so
  there is nothing to fail in a browser console and nothing to fetch.
* Every user-given string (stage names, reasons, labels) reaches the page only
  through jinja2 with autoescape, or through :func:`json_island`, which escapes
  ``<``, ``>`` and ``&`` so that no string can close the ``<script>`` element
  that carries the machine-readable rows.
* Analysis lives elsewhere (``_analysis.summarize`` for pipelines,
  ``_loader.summarize_loader`` for loaders); this module only presents it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from stagebench._numbers import finite, num, num_or_none
from stagebench.analysis._loader import pooled_frame
from stagebench.analysis._pipeline_job import user_setting
from stagebench.analysis._summary import guess_kind, summarize_run
from stagebench.model._evidence import Ratio
from stagebench.model._job import JobFigures, JobVerdict, StepAlone
from stagebench.model._loader import LoaderPoint, WorkerCosts
from stagebench.model._meta import LoaderInfo, Provenance, RunMeta, RunSettings, UserKnobs
from stagebench.model._pipeline import Prediction
from stagebench.model._stage import StageEntry, StageSetting
from stagebench.model._summary import Summary
from stagebench.report._html import (
    csv_uri,
    interval_text,
    json_island,
    num_text,
    pct_text,
    provenance_items,
    rate_text,
    render,
    rows_records,
    svg_uri,
    write_text,
)
from stagebench.runs._knobs import loader_knobs
from stagebench.runs._results import TRANSFORMS_CSV, RunDir, is_run_dir, read_rows, read_rows_or_empty, to_jsonable
from stagebench.runs._schema import SUMMARY_SCHEMA_VERSION

__all__ = [
    "write_report",
    "summarize_run",
    "render_report",
    "load_run",
    "RunData",
    "json_island",
]

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
_BINDING_TEXT: dict[str | None, str] = {"stage": "a stage's capacity", "cores": "the cores", "gil": "the GIL"}


# --------------------------------------------------------------------------- loading


@dataclass(slots=True)
class RunData:
    """Everything a report needs from one run directory."""

    path: Path
    meta: dict[str, Any]
    rows: pd.DataFrame
    summary: dict[str, Any]
    summary_error: str | None = None
    csv_bytes: bytes = b""
    kind: str = "pipeline"
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def run_meta(self) -> RunMeta:
        """run.json, typed."""
        return RunMeta.from_json(self.meta)

    @property
    def provenance(self) -> Provenance:
        """The machine the run was measured on: the summary's copy, else run.json's (empty where neither has it)."""
        copy = self.summary.get("provenance")
        return Provenance.from_json(copy) if copy else self.run_meta.provenance or Provenance()

    @property
    def settings(self) -> RunSettings:
        """The run's settings: the summary's copy, else run.json's."""
        copy = self.summary.get("settings")
        return RunSettings.from_json(copy) if copy else self.run_meta.settings

    @property
    def loader(self) -> LoaderInfo:
        """The loader under test (loader runs): the summary's copy, else run.json's."""
        copy = self.summary.get("loader")
        return LoaderInfo.from_json(copy) if copy else self.run_meta.loader


def _stored_summary(path: Path) -> dict[str, Any]:
    """summary.json as saved; {} (so it is computed again from the rows) when it is damaged or was
    written with another summary schema: it is derived, and the rows are the source of truth."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("schema_version", SUMMARY_SCHEMA_VERSION) != SUMMARY_SCHEMA_VERSION:
        return {}
    return data


def load_run(run_dir: Path, *, recompute: bool = False) -> RunData:
    """Read a run directory; compute the summary when it is missing (or when asked).

    A summary that cannot be computed does not stop the report: the page shows
    the rows and plots, and the error, rather than nothing at all.
    """
    run_dir = Path(run_dir)
    if not is_run_dir(run_dir):
        raise FileNotFoundError(2, "not a run directory (no run.json or results.csv)", str(run_dir))
    rd = RunDir(run_dir)
    meta = rd.read_meta()
    rows = read_rows_or_empty(run_dir)
    kind = RunMeta.from_json(meta).kind or guess_kind(rows)
    summary: dict[str, Any] = {}
    error = None
    if not recompute and rd.summary_json.is_file():
        summary = _stored_summary(rd.summary_json)
    if not summary:
        try:
            summary = to_jsonable(summarize_run(run_dir))
            rd.write_summary(summary)
        except Exception as e:
            if recompute:
                raise
            error = f"{type(e).__name__}: {e}"
    csv_bytes = rd.results_csv.read_bytes() if rd.results_csv.is_file() else b""
    extra: dict[str, Any] = {}
    tpath = run_dir / TRANSFORMS_CSV
    if tpath.is_file() and tpath.stat().st_size > 0:
        # a loader's transforms, measured as pipeline stages (STAGE_COLUMNS rows)
        extra["transform_rows"] = read_rows(tpath)
    return RunData(
        path=run_dir,
        meta=meta,
        rows=rows,
        summary=summary,
        summary_error=error,
        csv_bytes=csv_bytes,
        kind=kind,
        extra=extra,
    )


# --------------------------------------------------------------------------- html helpers


# --------------------------------------------------------------------------- snippets


def _identifier(name: str) -> tuple[str, str]:
    """(code, comment): the stage name as code when it is a Python name, else a placeholder."""
    if name.isidentifier():
        return name, ""
    return "fn", f"  # stage {name!r}"


def pipeline_snippet(summary: Mapping[str, Any], meta: Mapping[str, Any] | RunMeta) -> str:
    """The recommended settings as a PipelineBuilder chain to paste, each changed line marked with yours.

    Only the stages' settings are the advice: the source, the sink, the stages' own
    arguments and ``num_threads`` stay as the user wrote them. A first comment says
    what running both found (:func:`stagebench.analysis._verdicts.yours_verdict`).
    """
    m = meta if isinstance(meta, RunMeta) else RunMeta.from_json(meta)
    types = {s.get("name"): s for s in m.stages}
    sm = Summary.from_json(summary)
    versus = sm.recommended_vs_yours
    verdict = versus.verdict
    stages = sm.stages
    job = JobVerdict.from_json(sm.job)
    decided = job is not None and job.decided
    # the job's pick is on the stages (analysis/_pipeline_job.apply_job_pick); the prediction's
    # settings are the isolated choice the whole-pipeline runs were made at
    settings = {} if decided else {s.stage: s.to_json() for s in sm.prediction.settings}
    lines, imports = [], set()
    for raw in stages:
        st = StageEntry.from_json(raw)
        name = str(st.name if "name" in st.keys else "?")
        info = types.get(name, {})
        stype = st.type or info.get("type") or "pipe"
        code, comment = _identifier(name)
        if stype != "pipe":
            lines.append(f"    # .{stype}(...)  stage {name!r}: keep as is")
            continue
        rec = StageSetting.from_json(settings.get(name)) or st.recommended or StageSetting()
        ex, c = rec.executor, rec.concurrency
        if not ex or not c:
            lines.append(f"    .pipe({code}){comment}  # no recommendation: see the stage section")
            continue
        c = int(c)
        mine = user_setting(raw)
        if mine:
            comment += f"  # yours: {mine}" if mine != f"{ex} x {c}" else "  # as yours"
        if ex == "process":
            imports.add("ProcessPoolExecutor")
            lines.append(f"    .pipe({code}, concurrency={c}, executor=ProcessPoolExecutor(max_workers={c})){comment}")
        elif ex == "thread":
            imports.add("ThreadPoolExecutor")
            lines.append(f"    .pipe({code}, concurrency={c}, executor=ThreadPoolExecutor(max_workers={c})){comment}")
        else:  # async: coroutines on the event loop, concurrency is tasks in flight
            lines.append(f"    .pipe({code}, concurrency={c}){comment}")
    if not lines:
        return ""
    threads, threads_note = _num_threads(m, stages)
    if decided:
        x = _versus_yours(job.decision.versus_yours if job is not None and job.decision is not None else None)
        head = [
            {
                "keep yours": "# run with your training loop: no setting run was shown faster than yours, nor "
                "cheaper and within 5%; keep them",
                "cheaper": f"# run with your training loop: as fast as yours within 5%, with fewer workers: {x}",
                "change": f"# run with your training loop: faster than yours, beyond noise: {x}",
                "use": "# run with your training loop: the cheapest setting shown within 5% of the fastest run",
            }.get((job.advice if job is not None else None) or "", "# run with your training loop")
        ]
    else:
        x = _versus_yours(versus.versus_yours)
        head = {
            "could not tell": [
                "# measured in turns: the runs could not tell these from your settings; keep yours (the rule: a "
                "change must show faster, or cheaper and within 5%)"
            ],
            "cheaper": [f"# measured in turns: as fast as yours within 5%, with fewer workers: {x}"],
            "recommended": [f"# measured in turns: faster than yours, beyond noise: {x}"],
            "yours": ["# measured in turns: your settings are faster than these; keep yours"],
            "inconclusive": ["# not checked against your settings: one of the two runs gave no number"],
            "not run": [
                "# not checked against your settings: the real pipeline was not run (quick mode or validate off)"
            ],
        }.get(verdict or "", [])
    if imports:
        head.append(f"from concurrent.futures import {', '.join(sorted(imports))}")
    head.append("from spdl.pipeline import PipelineBuilder")
    head.append("")
    return "\n".join(
        head
        + [
            "pipeline = (",
            "    PipelineBuilder()",
            "    .add_source(source)",
            *lines,
            f"    .add_sink({int(num_or_none(m.sink_buffer) or 3)})"
            + ("  # as yours" if num_or_none(m.sink_buffer) else "  # SPDL's default: keep yours"),
            f"    .build(num_threads={threads}){threads_note}",
            ")",
        ]
    )


def _num_threads(m: RunMeta, stages: list) -> tuple[int, str]:
    """``build(num_threads=N)`` for the snippet: the user's own where known, else enough for every stage."""
    mine = num_or_none(m.num_threads)
    if mine:
        return int(mine), "  # as yours"
    recs = [StageEntry.from_json(st).recommended for st in stages]
    conc = [int(num_or_none(r.concurrency if r is not None else None) or 1) for r in recs]
    return max([4, *conc]), "  # SPDL's shared pool: at least any stage's concurrency"


def _diff_of_your_call(call: Sequence[Mapping[str, Any]], knobs: Mapping[str, Any], mine: UserKnobs | None) -> str:
    """The user's own DataLoader call with only the loader settings changed, each change marked "was".

    A knob of the user's that does not apply on the measuring host (pin_memory without a CUDA
    device) is kept as they wrote it: dropped, pasting the snippet on their GPU host would change it.
    """
    lines = ["from torch.utils.data import DataLoader", "", "loader = DataLoader(", "    dataset,"]
    for a in call:
        comment = f"  # {a['comment']}" if a.get("comment") else ""
        lines.append(f"    {a['arg']}={a['code']},{comment}")
    for k, v in knobs.items():
        if v is None:
            continue
        if mine is None:
            lines.append(f"    {k}={v!r},")
            continue
        was = getattr(mine, k) if mine.gave(k) else "default"
        lines.append(f"    {k}={v!r}," + (f"  # was {was!r}" if was != v else "  # as yours"))
    if mine is not None and mine.pin_memory and "pin_memory" not in knobs:
        lines.append(f"    pin_memory={mine.pin_memory!r},  # as yours (not measured: no CUDA device where this ran)")
    lines.append(")")
    return "\n".join(lines)


def _versus_yours(d: Ratio | Mapping[str, Any] | None) -> str:
    """A ratio to yours in turns, as the verdicts write it, or what is missing of it."""
    x = d if isinstance(d, Ratio) else Ratio.from_json(d)
    return x.detail("yours") if x is not None else "no ratio in turns recorded"


def loader_snippet(summary: Mapping[str, Any]) -> str:
    rec = summary.get("recommended") or {}
    if not rec:
        return ""
    info = LoaderInfo.from_json(summary.get("loader"))
    backend = str(info.backend or "")
    knobs = loader_knobs(rec)
    if not LoaderPoint.from_json(rec).num_workers and backend in ("torch", "spdl_pytorch", ""):
        # DataLoader rejects prefetch_factor/persistent_workers without workers.
        knobs.pop("prefetch_factor", None)
        knobs["persistent_workers"] = False
    if info.call and backend in ("torch", ""):
        return _diff_of_your_call(info.call, knobs, info.user_knobs)
    args = ", ".join(f"{k}={v!r}" for k, v in knobs.items() if v is not None)
    bs = info.batch_size
    bs_arg = f"batch_size={bs}, " if bs else ""
    if backend == "spdl_pytorch":
        return (
            "from spdl.dataloader import get_pytorch_dataloader\n\n"
            f"loader = get_pytorch_dataloader(\n    dataset, {bs_arg}\n    {args},\n)"
        )
    if backend in ("torch", ""):
        return f"from torch.utils.data import DataLoader\n\nloader = DataLoader(\n    dataset, {bs_arg}\n    {args},\n)"
    return f"# {backend} loader: recommended settings\n" + "\n".join(
        f"{k} = {v!r}" for k, v in knobs.items() if v is not None
    )


# --------------------------------------------------------------------------- context


def _signal_items(signals: Mapping[str, Any]) -> list[dict[str, Any]]:
    out = []
    for key, sig in signals.items():
        if not isinstance(sig, Mapping):
            sig = {"value": sig}
        iv = sig.get("interval") or [None, None]
        out.append(
            {
                "key": str(key),
                "label": str(sig.get("label") or key),
                "value": sig.get("value"),
                "low": iv[0] if len(iv) > 0 else None,
                "high": iv[1] if len(iv) > 1 else None,
            }
        )
    return out


def _fit_items(fits: Mapping[str, Any]) -> list[dict[str, Any]]:
    out = []
    for key, f in sorted((fits or {}).items()):
        f = f or {}
        out.append(
            {
                "key": key,
                "model": f.get("model", "usl"),
                "sigma": f.get("sigma"),
                "kappa": f.get("kappa"),
                "sigma_interval": f.get("sigma_interval"),
                "amdahl": f.get("amdahl_serial_fraction"),
                "amdahl_interval": f.get("amdahl_interval"),
                "peak": f.get("peak_concurrency"),
                "r2": f.get("r2"),
                "levels": f.get("levels"),
                "warning": f.get("warning"),
            }
        )
    return out


def _point_rows(rows: pd.DataFrame, stage: StageEntry) -> list[dict[str, Any]]:
    """The stage's measured points, the numbers behind its two figures: throughput in source items/s
    (the card's unit), cores used, latency and memory."""
    if rows.empty or not {"role", "status", "qps"} <= set(rows.columns):
        return []
    ok = rows[(rows["role"].astype(str) == "stage") & (rows["status"].astype(str) == "ok")]
    # one kind of memory for the whole column, as the figure plots it: PSS where it was read, else peak RSS
    mem = (
        "mem_pss_mb"
        if "mem_pss_mb" in ok and pd.to_numeric(ok["mem_pss_mb"], errors="coerce").notna().any()
        else "mem_peak_mb"
    )
    out = []
    for r in ok.to_dict("records"):
        q = _in_items(r, stage)
        out.append(
            {
                "executor": _cell(r.get("executor")),
                "harness": _cell(r.get("harness")),
                "concurrency": num_or_none(r.get("concurrency")),
                "qps": q.get("qps"),
                "qps_low": q.get("qps_low"),
                "qps_high": q.get("qps_high"),
                "cores": num_or_none(r.get("cores_used")),
                "p50": num_or_none(r.get("latency_p50_ms")),
                "p99": num_or_none(r.get("latency_p99_ms")),
                "mem": num_or_none(r.get(mem)),
            }
        )
    return out


def _problem_rows(rows: pd.DataFrame) -> list[dict[str, Any]]:
    if rows.empty or "status" not in rows:
        return []
    bad = rows[rows["status"].astype(str) != "ok"]
    cols = [
        c
        for c in (
            "role",
            "harness",
            "executor",
            "concurrency",
            "num_workers",
            "prefetch_factor",
            "persistent_workers",
            "status",
            "reason",
            "error_example",
        )
        if c in bad.columns
    ]
    return [{k: _cell(v) for k, v in r.items()} for r in bad[cols].to_dict("records")]


def _cell(v: Any) -> Any:
    """A table cell: blanks for missing values, integral floats as integers (CSV reads 2 as 2.0)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, (bool,)) or str(v) in ("True", "False"):
        return "yes" if str(v) == "True" else "no"
    if v == "not applicable":
        return "n/a"
    return v


def _noise_tile(rows: pd.DataFrame, value: str) -> dict[str, str] | None:
    """The median relative half-width of the intervals measured for ``value`` (its ``_low`` and
    ``_high`` columns), as a tile: a fact of the rows, not an analysis. None without intervals."""
    if rows.empty or value not in rows:
        return None
    ok = rows[(rows["status"] == "ok")]
    if "role" in ok:
        ok = ok[ok["role"] == "stage"]
    v, lo, hi = (pd.to_numeric(ok[c], errors="coerce") for c in (value, f"{value}_low", f"{value}_high"))
    rel = ((hi - lo) / 2 / v).replace([math.inf, -math.inf], math.nan).dropna()
    if not len(rel):
        return None
    return {
        "label": "measurement noise",
        "value": f"±{float(rel.median()) * 100:.1f}%",
        "sub": "median half-width of the 95% intervals",
    }


def stage_cards(
    rows: pd.DataFrame,
    summaries: Sequence[Mapping[str, Any]],
    meta_stages: Sequence[Mapping[str, Any]],
    cores: float | None,
    anchor: str = "stage",
    resources_plot: bool = True,
) -> list[dict[str, Any]]:
    """One card per stage (pipeline stages, or a loader's transforms measured as stages).

    ``resources_plot=False`` (quick mode) leaves out the cores/latency/memory
    figure: its three panels were 0.17 s a stage, half of a quick report's
    time; the card's points table has the same numbers.
    """
    from stagebench.report import _plots

    by_name = {str(s.get("name")): s for s in summaries}
    names: list[str] = []
    for src in (summaries, meta_stages):
        for s in src:
            if str(s.get("name")) not in names:
                names.append(str(s.get("name")))
    if "stage" in rows.columns:
        names += [n for n in rows["stage"].astype(str).unique() if n not in names]
    cards = []
    for i, name in enumerate(names, start=1):
        s = by_name.get(name, {})
        st = StageEntry.from_json(s)
        sub = rows[rows["stage"].astype(str) == name] if "stage" in rows else rows.iloc[0:0]
        sub = sub.sort_values(list(_STAGE_ROW_ORDER), kind="stable") if len(sub) else sub
        cls = st.classification or "unknown"
        ev = st.evidence
        gi = st.gil_fraction_interval or (None, None)
        points = _point_rows(sub, st)
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
                "gil_low": gi[0],
                "gil_high": gi[1] if len(gi) > 1 else None,
                "evidence": [str(x) for x in ev.summary],
                "signals": _signal_items(ev.signals),
                "fits": _fit_items(st.fit),
                # source items/s, the unit of the bounds and the pipeline lines; calls/s as a side note
                "rec": _in_items(_json(st.recommended), st),
                "yours": user_setting(s),
                "best": _in_items(_json(st.best), st),
                "ceiling": _in_items({"qps": st.ceiling_qps}, st)["qps"],
                # measured at the stage's own best setting, where the pipeline's choice differs
                "alone": _in_items(_json(st.recommended_alone), st) if st.recommended_alone is not None else None,
                "alone_unpaired": st.head_to_head_skipped if st.recommended_alone is not None else None,
                "items_per_call": num_or_none(st.items_per_input) if "items_per_input" in st.keys else None,
                "calls_qps": st.recommended.qps if st.recommended is not None else None,
                "cpu_ms": _to_ms(st.cpu_s_per_item),
                "gil_ms": _to_ms(st.gil_s_per_item),
                "img_qps": svg_uri(_plots.stage_throughput_svg(sub, st)) if len(sub) else None,
                "img_res": svg_uri(_plots.stage_resources_svg(sub, cores)) if len(sub) and resources_plot else None,
                "res_in_table": bool(points) and not resources_plot,
                "points": points,
                "problems": _problem_rows(sub),
            }
        )
    return cards


def _pipeline_context(run: RunData) -> dict[str, Any]:
    from stagebench.report import _plots

    rows, meta, summary = run.rows, run.run_meta, run.summary
    cores = run.provenance.cores
    quick = meta.settings.quick == "on"
    sm = Summary.from_json(summary)
    stages = stage_cards(rows, sm.stages, meta.stages, cores, resources_plot=not quick)
    pred, val = sm.prediction, sm.validation
    tiles = _job_tile(summary)
    if pred.qps is not None:
        binding = _BINDING_TEXT.get(pred.binding, pred.binding or "?")
        tiles.append(
            {
                "label": "predicted pipeline throughput",
                "value": f"{rate_text(pred.qps)} items/s",
                "sub": (
                    f"replayed with stand-ins (bounds: {rate_text(pred.bounds_qps)}) · "
                    if pred.method == "replay" and finite(pred.bounds_qps)
                    else ""
                )
                + f"bound by {binding}"
                + (f" · bottleneck: {pred.bottleneck}" if pred.bottleneck else ""),
            }
        )
    if val.qps is not None:
        sub = f"{interval_text(val.qps_low, val.qps_high)}"
        if finite(val.qps) and finite(pred.qps) and num(pred.qps) > 0:
            # computed here, not read from error_vs_prediction: the sign convention is then unambiguous
            sub += f" · {pct_text(num(val.qps) / num(pred.qps) - 1, signed=True)} vs predicted"
        tiles.append({"label": "measured whole pipeline", "value": f"{rate_text(val.qps)} items/s", "sub": sub})
    trainer = StepAlone.from_json(sm.trainer)
    if finite(trainer.samples_per_s):
        wp = trainer.with_pipeline
        tiles.append(
            {
                "label": "your training step (demand)",
                "value": f"{rate_text(trainer.samples_per_s)} items/s",
                "sub": f"{interval_text(trainer.samples_per_s_low, trainer.samples_per_s_high)}"
                + (
                    f" · waited for data {pct_text(wp.data_wait_share)} of each step on the real pipeline"
                    if wp is not None and finite(wp.data_wait_share)
                    else ""
                ),
            }
        )
    yours = sm.recommended_vs_yours
    if finite(yours.qps):
        tiles.append(
            {
                "label": "your settings, pipeline alone",
                "value": f"{rate_text(yours.qps)} items/s",
                "sub": f"{interval_text(yours.qps_low, yours.qps_high)} · in turns with the recommended",
            }
        )
    if pred.naive_qps is not None and pred.qps is not None and finite(pred.naive_qps):
        tiles.append(
            {
                "label": "slowest stage alone",
                "value": f"{rate_text(pred.naive_qps)} items/s",
                "sub": "the naive min-of-stages estimate",
            }
        )
    noise = _noise_tile(rows, "qps")
    if noise is not None:
        tiles.append(noise)
    n_bad = sum(len(s["problems"]) for s in stages)
    return {
        "stages": stages,
        "tiles": tiles,
        "stand_ins": _stand_in_rows(pred),
        "prediction": pred,
        "binding_text": _BINDING_TEXT.get(pred.binding, pred.binding or ""),
        "validation": val,
        "snippet": pipeline_snippet(summary, meta),
        "overview_img": svg_uri(_plots.pipeline_overview_svg(summary)),
        "n_problems": n_bad,
        "not_isolated": [
            {"name": str(x.get("name", "?")), "reason": str(x.get("reason", ""))}
            for x in (sm.not_isolated or meta.not_isolated)
        ],
    }


def _stand_in_rows(pred: Prediction) -> list[dict[str, Any]]:
    """What the replay ran in place of each stage, in ms per call (what the predicted number rests on)."""
    return [
        {
            "name": s.name,
            "executor": s.executor,
            "concurrency": s.concurrency,
            "gil_ms": _to_ms(s.gil_s),
            "free_ms": _to_ms(s.free_s),
            "wait_ms": _to_ms(s.wait_s),
            "releases": s.releases,
            "note": s.note,
        }
        for s in pred.stand_ins
    ]


_POINT_KEYS = ("executor", "concurrency", "harness", "qps", "qps_low", "qps_high", "why")
_LOADER_KEYS = (
    "num_workers",
    "prefetch_factor",
    "persistent_workers",
    "pin_memory",
    "samples_per_s",
    "samples_per_s_low",
    "samples_per_s_high",
    "why",
)


def _keys(d: Mapping[str, Any] | None, keys: Sequence[str]) -> dict[str, Any]:
    """A summary dict with every key the template reads (None when absent), extra keys kept."""
    d = dict(d or {})
    return {**{k: None for k in keys}, **d}


def _json(point: StageSetting | None) -> dict[str, Any] | None:
    """A setting as the summary holds it."""
    return point.to_json() if point is not None else None


def _in_items(point: Mapping[str, Any] | None, stage: StageEntry) -> dict[str, Any]:
    """A point's throughputs in source items/s: per call times the source items one call stands for."""
    k = num_or_none(stage.items_per_input) or 1.0
    out = _keys(point, _POINT_KEYS)
    for key in ("qps", "qps_low", "qps_high"):
        v = num_or_none(out.get(key))
        out[key] = v * k if v is not None else out.get(key)
    return out


def _to_ms(x: Any) -> float | None:
    """Seconds as milliseconds, for a table cell."""
    return float(x) * 1e3 if finite(x) else None


def _loader_context(run: RunData) -> dict[str, Any]:
    from stagebench.report import _plots

    rows, summary = run.rows, run.summary
    info = run.loader
    sm = Summary.from_json(summary)
    rec = _keys(sm.recommended, _LOADER_KEYS) if sm.recommended else {}
    best = _keys(sm.best, _LOADER_KEYS)
    # the same points, read: the tiles' figures and the table's mark of the recommended
    rec_pt = LoaderPoint.from_json(rec) if rec else None
    best_rate, user = LoaderPoint.from_json(best).samples_per_s, LoaderPoint.from_json(sm.user_setting)
    search = sm.search
    target = _keys(summary.get("target"), ("rate", "met", "verdict")) if summary.get("target") else None
    tiles = _job_tile(summary)
    if rec_pt is not None and rec_pt.samples_per_s is not None:
        tiles.append(
            {
                "label": "recommended setting, loader alone",
                "value": f"{rate_text(rec_pt.samples_per_s.value)} samples/s",
                "sub": _knobs_text(rec_pt),
            }
        )
    if best_rate is not None:
        tiles.append(
            {
                "label": "best measured",
                "value": f"{rate_text(best_rate.value)} samples/s",
                "sub": interval_text(best_rate.low, best_rate.high),
            }
        )
    if target:
        tiles.append(
            {
                "label": "trainer needs",
                "value": f"{rate_text(target.get('rate'))} samples/s",
                "sub": "the loader alone meets it" if target.get("met") else "NOT met even by the loader alone",
            }
        )
    if search is not None and search.points_measured is not None:
        sub = f"{search.points_measured} points in {num_text(search.seconds)} s"
        if finite(search.time_saved_s):
            sub += f"; saved {num_text(search.time_saved_s)} s vs the full grid"
        tiles.append(
            {
                "label": f"search ({'?' if search.strategy is None else search.strategy})",
                "value": f"{search.points_measured} points",
                "sub": sub,
            }
        )
    if user.samples_per_s is not None:
        tiles.append(
            {
                "label": "your setting, loader alone",
                "value": f"{rate_text(user.samples_per_s.value)} samples/s",
                "sub": _knobs_text(user),
            }
        )
    noise = _noise_tile(rows, "samples_per_s")
    if noise is not None:
        tiles.append(noise)
    points = []
    if not rows.empty and "num_workers" in rows:
        # one point per setting, repeated readings pooled (a setting measured twice is never shown at its higher)
        rows = pooled_frame(rows)
        ok = rows[(rows["status"] == "ok") & rows["samples_per_s"].notna()].copy()
        for c in ("num_workers", "prefetch_factor"):
            ok[c] = pd.to_numeric(ok[c], errors="coerce")
        ok = ok.sort_values(["num_workers", "prefetch_factor"], kind="stable", na_position="first")
        for pt in map(LoaderPoint.from_json, ok.to_dict("records")):
            r = pt.samples_per_s
            points.append(
                {
                    "nw": num_text(pt.num_workers) if pt.num_workers is not None else "—",
                    "pf": num_text(pt.prefetch_factor) if pt.prefetch_factor is not None else "—",
                    "pw": _cell(pt.persistent_workers),
                    "pin": _cell(pt.pin_memory),
                    "sps": None if r is None else r.value,
                    "lo": None if r is None else r.low,
                    "hi": None if r is None else r.high,
                    "ttfb": pt.time_to_first_batch_s,
                    "stall": pt.epoch_stall_s,
                    "cores": pt.cores_used,
                    "mem": pt.mem_pss_mb,
                    "runs": pt.measurements or 1,
                    "rec": _same_knobs(pt, rec_pt),
                }
            )
    trows = run.extra.get("transform_rows")
    transforms = stage_cards(
        trows if trows is not None else pd.DataFrame(),
        summary.get("transforms") or [],
        [],
        run.provenance.cores,
        anchor="transform",
    )
    budget = RunSettings.from_json(summary.get("settings")).memory_budget_mb
    return {
        "info": {str(k): v for k, v in info.to_json().items()},
        "rec": rec,
        "best": best,
        "search": search,
        "target": target,
        "tiles": tiles,
        "snippet": loader_snippet(summary),
        "img_tput": svg_uri(_plots.loader_throughput_svg(rows, summary)) if len(rows) else None,
        "img_heat": svg_uri(_plots.loader_heatmap_svg(rows, summary)) if len(rows) else None,
        "img_startup": svg_uri(_plots.loader_startup_memory_svg(rows, budget if finite(budget) else None))
        if len(rows)
        else None,
        "points": points,
        "problems": _problem_rows(rows),
        "transforms": transforms,
        "costs": _worker_costs_context(sm.worker_costs),
    }


def _worker_costs_context(recorded: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """What each worker costs (summary["worker_costs"]): the start-up split and the memory over the pass."""
    from stagebench.report import _plots

    if not recorded:
        return None
    costs = WorkerCosts.from_json(recorded)
    return {
        "img_startup": svg_uri(_plots.worker_startup_svg(costs)),
        "img_memory": svg_uri(_plots.worker_memory_svg(costs)),
        "startup": [r.to_json() for r in costs.startup],
        "ship": costs.shipping.to_json() if costs.shipping is not None else {},
        "mem": costs.memory.to_json(samples=False) if costs.memory is not None else {},
        "available_mb": costs.available_mb,
        "shm": costs.shm.to_json() if costs.shm is not None else {},
        "seconds": costs.seconds,
    }


def _knobs_text(point: LoaderPoint) -> str:
    """``num_workers=4, prefetch_factor=2`` (prefetch only with workers)."""
    nw, pf = point.num_workers, point.prefetch_factor
    return f"num_workers={nw}" + (f", prefetch_factor={pf}" if nw and pf is not None else "")


def _job_tile(summary: Mapping[str, Any]) -> list[dict[str, str]]:
    """The first tile where the job ran: what your loop did at the recommended setting."""
    job = JobVerdict.from_json(summary.get("job"))
    if job is None or not job.decided or not finite(job.samples_per_s):
        return []
    return [
        {
            "label": "your training job, recommended",
            "value": f"{rate_text(job.samples_per_s)} {job.unit or 'samples/s'}",
            "sub": f"{interval_text(job.samples_per_s_low, job.samples_per_s_high)} · "
            f"{pct_text(job.data_wait_share)} of each step waiting for data",
        }
    ]


def _job_context(summary: Mapping[str, Any]) -> dict[str, Any] | None:
    """The training job's section: your loop on the real loader or pipeline at each candidate (summary["job"])."""
    from stagebench.analysis._job import ORIGIN_WORDS
    from stagebench.report import _plots

    job = JobVerdict.from_json(summary.get("job"))
    if job is None:
        return None
    rows = []
    for c in job.candidates:
        f = c.job or JobFigures()
        rows.append(
            {
                "label": str(c.name),
                "why": ", ".join(ORIGIN_WORDS.get(o, str(o)) for o in c.origin),
                "rate": f.samples_per_s,
                "low": f.samples_per_s_low,
                "high": f.samples_per_s_high,
                "wait": f.data_wait_share,
                "alone": c.alone.value if c.alone is not None else None,
                "slices": f.slices,
                "steps": f.steps,
                "startup": f.startup_s,
                "pick": c.key == job.pick,
                "as_good": c.as_good,
                "versus": "yours"
                if c.key == job.yours
                else (c.versus_yours.detail() if c.versus_yours is not None else "—"),
            }
        )
    return {
        "text": str(job.text or ""),
        "why": str(job.why or ""),
        "unit": str(job.unit or "samples/s"),
        "img": svg_uri(_plots.job_svg(job)),
        "rows": rows,
        "zero_workers": job.zero_workers,
        "unproven": [str(u) for u in job.unproven],
        "rounds": job.rounds,
        "seconds": job.seconds,
        "demand": job.demand,
    }


def _same_knobs(row: LoaderPoint, rec: LoaderPoint | None) -> bool:
    """Whether a table's point is the recommended setting (a prefetch_factor either leaves out matches any)."""
    if rec is None or rec.num_workers is None:
        return False
    if (row.num_workers or 0) != rec.num_workers:
        return False
    pf_r, pf_c = row.prefetch_factor, rec.prefetch_factor
    if pf_r is not None and pf_c is not None and pf_r != pf_c:
        return False
    flags = ((row.persistent_workers, rec.persistent_workers), (row.pin_memory, rec.pin_memory))
    return all(str(a).lower() == str(b).lower() for a, b in flags)


def _title(run: RunData) -> str:
    if run.kind == "loader":
        info = run.loader
        return f"{'loader' if info.name is None else info.name} ({'?' if info.backend is None else info.backend})"
    sm = Summary.from_json(run.summary)
    names = [str(s.get("name")) for s in sm.stages or run.run_meta.stages]
    if names:
        return f"pipeline: {' → '.join(names[:6])}" + (" → …" if len(names) > 6 else "")
    return f"pipeline {sm.prediction.bottleneck or ''}".strip()


#: Per-stage summary entries left out of the page's JSON copy: each is drawn or listed above it, or
#: derived from the rows of the CSV download; ``summary.json`` beside the report keeps them all.
_NOT_IN_PAGE = ("curves", "fit", "evidence")


def page_summary(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The summary as the page embeds it: without what the page shows or the CSV holds (_NOT_IN_PAGE).

    The rows are embedded once, as the CSV download: a JSON copy of them too was a tenth of a report.
    """
    out = dict(summary)
    if isinstance(out.get("stages"), list):
        out["stages"] = [
            {k: v for k, v in st.items() if k not in _NOT_IN_PAGE} if isinstance(st, Mapping) else st
            for st in out["stages"]
        ]
    return out


def _phases_text(phases: Any) -> str | None:
    """Where the diagnosis spent its time, largest first: ``stage points 120 s (61%), ...``."""
    if not isinstance(phases, Mapping) or not finite(phases.get("total")) or not float(phases["total"]) > 0:
        return None
    total = float(phases["total"])
    parts = sorted(
        ((k, float(v)) for k, v in phases.items() if k != "total" and finite(v) and v > 0), key=lambda x: -x[1]
    )
    return f"{total:.0f} s: " + ", ".join(f"{k.replace('_', ' ')} {v:.0f} s ({v / total:.0%})" for k, v in parts)


def report_context(run: RunData) -> dict[str, Any]:
    summary, meta = run.summary, run.run_meta
    sm = Summary.from_json(summary)
    warnings = list(sm.warnings)
    if run.summary_error:
        warnings.insert(
            0, f"the analysis could not run, so this report shows the raw measurements only ({run.summary_error})"
        )
    if run.rows.empty:
        warnings.insert(0, "no measured rows: results.csv is missing or empty")
    settings = run.settings.to_json()
    findings = [
        {
            "severity": str(f.get("severity", "info")),
            "title": str(f.get("title", "")),
            "detail": str(f.get("detail", "")),
            "stage": f.get("stage"),
        }
        for f in sm.findings
    ]
    # Findings arrive ranked: show the important ones, fold the minor tail away.
    split = max(3, sum(1 for f in findings if f["severity"] in ("high", "medium")))
    ctx: dict[str, Any] = {
        "kind": run.kind,
        "title": _title(run),
        "verdict": sm.verdict
        or ("no verdict: the analysis did not run" if run.summary_error else "no verdict in summary.json"),
        "demand": sm.demand.text,
        "scope": sm.scope,
        # with the job run, the comparison with yours is the job's (its section); the pipeline alone's
        # "keep them" next to a job pick that changes them would be two recommendations
        "yours": None
        if (jv := JobVerdict.from_json(sm.job)) is not None and jv.decided
        else sm.recommended_vs_yours.text,
        "warnings": warnings,
        "findings": findings[:split],
        "more_findings": findings[split:],
        "provenance": provenance_items(run.provenance, meta.provenance_after),
        "run_items": [
            (k, str(v))
            for k, v in (
                ("created", meta.created_at),
                ("command", _command(meta)),
                ("stagebench", sm.stagebench_version),
                ("run directory", run.path.name),
                ("time spent", _phases_text(meta.phases_s)),
            )
            if v
        ],
        "settings": [
            (str(k), json.dumps(to_jsonable(v), ensure_ascii=False, default=str)) for k, v in settings.items()
        ],
        "summary_json": json_island(page_summary(summary)),
        "csv_uri": csv_uri(run.csv_bytes),
        "n_rows": len(run.rows),
        "columns": list(run.rows.columns),
    }
    ctx["job"] = _job_context(summary)
    trows = run.extra.get("transform_rows")
    ctx["transform_rows_json"] = json_island(rows_records(trows)) if trows is not None else None
    if run.kind == "loader":
        ctx["loader"] = _loader_context(run)
        ctx["pipeline"] = None
    else:
        ctx["pipeline"] = _pipeline_context(run)
        ctx["loader"] = None
    return ctx


def _command(m: RunMeta) -> str | None:
    cmd = m.command
    if isinstance(cmd, (list, tuple)):
        import shlex

        return shlex.join(str(c) for c in cmd)
    return cmd


def render_report(run: RunData) -> str:
    """The report HTML for a loaded run (pure: same run data, same text)."""
    return render("report.html.j2", **report_context(run))


# --------------------------------------------------------------------------- entry points


def write_report(run_dir: Path) -> Path:
    """Write ``report.html`` for a run directory (computing ``summary.json`` if missing)."""
    run = load_run(Path(run_dir))
    out = run.path / "report.html"
    write_text(out, render_report(run))
    return out
