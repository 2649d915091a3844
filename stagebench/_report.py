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

import base64
import functools
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ._results import RESULTS, RUN_META, RunDir, read_rows, to_jsonable

__all__ = [
    "write_report",
    "rebuild",
    "summarize_run",
    "render_report",
    "load_run",
    "RunData",
    "json_island",
    "find_run_dirs",
    "sweep_plan",
    "job_label",
    "short_labels",
]

_STAGE_ROW_ORDER = ("stage", "role", "harness", "executor", "concurrency")
TRANSFORMS_CSV = "transforms.csv"  # written by _loader_transforms next to a loader run's results.csv
_CLASS_TEXT = {
    "gil-bound": "holds the GIL: threads cannot add throughput",
    "cpu-bound": "limited by the cores",
    "io-bound": "waiting (I/O or sleep): scales with concurrency",
    "overhead-bound": "at the harness ceiling: per-item overhead dominates; batch it",
    "ipc-bound": "limited by moving data between processes",
    "unknown": "not classified",
}
_BINDING_TEXT = {"stage": "a stage's capacity", "cores": "the cores", "gil": "the GIL"}


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


def is_run_dir(path: Path) -> bool:
    return (path / RUN_META).is_file() or (path / RESULTS).is_file()


def _read_csv_rows(path: Path) -> pd.DataFrame:
    if not (path / RESULTS).is_file() or (path / RESULTS).stat().st_size == 0:
        return pd.DataFrame()
    try:
        return read_rows(path)
    except pd.errors.EmptyDataError:
        return pd.DataFrame()


def summarize_run(run_dir: Path) -> dict[str, Any]:
    """Recompute the run's summary from ``results.csv`` and ``run.json`` (kind decides how)."""
    run_dir = Path(run_dir)
    meta = RunDir(run_dir).read_meta()
    rows = _read_csv_rows(run_dir)
    kind = meta.get("kind") or _guess_kind(rows)
    if kind == "loader":
        from ._loader import summarize_loader

        return summarize_loader(rows, meta)
    if kind == "pipeline":
        from ._analysis import summarize

        return summarize(rows, meta)
    raise ValueError(f"run.json kind: unknown {kind!r}; allowed: pipeline, loader")


def _guess_kind(rows: pd.DataFrame) -> str:
    return "loader" if "samples_per_s" in rows.columns else "pipeline"


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
    rows = _read_csv_rows(run_dir)
    kind = meta.get("kind") or _guess_kind(rows)
    summary: dict[str, Any] = {}
    error = None
    if not recompute and rd.summary_json.is_file():
        summary = json.loads(rd.summary_json.read_text(encoding="utf-8"))
    else:
        try:
            summary = to_jsonable(summarize_run(run_dir))
            rd.write_summary(summary)
        except Exception as e:  # noqa: BLE001 - shown in the report instead of losing it
            if recompute:
                raise
            error = f"{type(e).__name__}: {e}"
    csv_bytes = rd.results_csv.read_bytes() if rd.results_csv.is_file() else b""
    extra: dict[str, Any] = {}
    tpath = run_dir / TRANSFORMS_CSV
    if tpath.is_file() and tpath.stat().st_size > 0:
        # a loader's transforms, measured as pipeline stages (STAGE_COLUMNS rows)
        extra["transform_rows"] = read_rows(tpath)
    return RunData(path=run_dir, meta=meta, rows=rows, summary=summary, summary_error=error,
                   csv_bytes=csv_bytes, kind=kind, extra=extra)


# --------------------------------------------------------------------------- html helpers


@functools.cache
def _env():
    from jinja2 import Environment, PackageLoader, StrictUndefined

    env = Environment(
        loader=PackageLoader("stagebench", "templates"),
        autoescape=True,
        undefined=StrictUndefined,  # a missing context key is a bug in this module, not an empty cell
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["rate"] = _rate
    env.filters["num"] = _num
    env.filters["pct"] = _pct
    env.filters["interval"] = _interval
    return env


def render(template: str, **ctx: Any) -> str:
    return _env().get_template(template).render(**ctx)


def _finite(x: Any) -> bool:
    try:
        return x is not None and math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def _rate(x: Any) -> str:
    from ._plots import fmt_rate

    return fmt_rate(float(x)) if _finite(x) else "n/a"


def _num(x: Any, digits: int = 3) -> str:
    if isinstance(x, bool) or x is None:
        return "—" if x is None else str(x).lower()
    if isinstance(x, int):
        return f"{x:,}"
    if not _finite(x):
        return "—"
    x = float(x)
    if x == 0:
        return "0"
    if abs(x) >= 10 ** digits:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


def _pct(x: Any, signed: bool = False) -> str:
    if not _finite(x):
        return "—"
    return f"{float(x) * 100:+.0f}%" if signed else f"{float(x) * 100:.0f}%"


def _interval(lo: Any, hi: Any) -> str:
    if not (_finite(lo) and _finite(hi)):
        return "no interval"
    return f"{_rate(lo)}–{_rate(hi)}"


def json_island(obj: Any) -> Any:
    """JSON that is safe inside ``<script type="application/json">``.

    Escaping ``<`` ``>`` ``&`` as ``\\u003c`` etc. keeps the JSON identical
    after parsing while making ``</script>`` (or ``<!--``) impossible inside
    the element; U+2028/9 are escaped for old JavaScript parsers.
    """
    from markupsafe import Markup

    text = json.dumps(to_jsonable(obj), ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=str)
    for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"),
                    ("\u2029", "\\u2029")):
        text = text.replace(ch, esc)
    return Markup(text)  # noqa: S704 - escaped above for the script-data context


def svg_uri(svg: str | None) -> str | None:
    if not svg:
        return None
    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode("utf-8")).decode("ascii")


def csv_uri(data: bytes) -> str:
    return "data:text/csv;charset=utf-8;base64," + base64.b64encode(data).decode("ascii")


def rows_records(rows: pd.DataFrame) -> list[dict[str, Any]]:
    return to_jsonable(rows.astype(object).where(rows.notna(), None).to_dict("records"))


def provenance_items(prov: Mapping[str, Any] | None, after: Mapping[str, Any] | None = None) -> list[tuple[str, str]]:
    p = prov or {}
    items: list[tuple[str, str]] = []

    def add(label: str, value: Any) -> None:
        if value not in (None, "", [], {}):
            items.append((label, str(value)))

    add("host", p.get("hostname"))
    add("CPU", p.get("cpu_model"))
    if p.get("cpu_count") is not None:
        add("cores", f"{p.get('usable_cores', p.get('cpu_count'))} usable of {p.get('cpu_count')}")
    if p.get("memory_total_gb") is not None:
        add("memory", f"{p.get('memory_total_gb')} GB total, {p.get('memory_available_gb')} GB available at start")
    py = p.get("python")
    if py:
        add("Python", f"{py} ({p.get('python_implementation', '')}"
                      f"{', free-threaded' if p.get('free_threaded') else ', with the GIL'})")
    add("platform", p.get("platform"))
    la = p.get("load_avg")
    if la:
        txt = "start " + " / ".join(f"{v:.2f}" for v in la)
        if after and after.get("load_avg"):
            txt += ", end " + " / ".join(f"{v:.2f}" for v in after["load_avg"])
        add("load average (1/5/15 min)", txt)
    libs = p.get("libraries") or {}
    add("libraries", ", ".join(f"{k} {v}" for k, v in libs.items() if v))
    env = p.get("env") or {}
    add("environment", ", ".join(f"{k}={v}" for k, v in env.items()))
    add("taken at", p.get("taken_at"))
    return items


def machine_label(prov: Mapping[str, Any] | None) -> str:
    p = prov or {}
    parts = [str(p.get("hostname") or "?")]
    if p.get("cpu_model"):
        parts.append(str(p["cpu_model"]))
    if p.get("usable_cores") or p.get("cpu_count"):
        parts.append(f"{p.get('usable_cores') or p.get('cpu_count')} cores")
    return " · ".join(parts)


# --------------------------------------------------------------------------- snippets


def _identifier(name: str) -> tuple[str, str]:
    """(code, comment): the stage name as code when it is a Python name, else a placeholder."""
    if name.isidentifier():
        return name, ""
    return "fn", f"  # stage {name!r}"


def pipeline_snippet(summary: Mapping[str, Any], meta: Mapping[str, Any]) -> str:
    """The recommended settings as a PipelineBuilder chain to paste."""
    types = {s.get("name"): s for s in meta.get("stages") or []}
    stages = summary.get("stages") or []
    settings = {s.get("stage"): s for s in (summary.get("prediction") or {}).get("settings") or []}
    lines, imports = [], set()
    for st in stages:
        name = str(st.get("name", "?"))
        info = types.get(name, {})
        stype = st.get("type") or info.get("type") or "pipe"
        code, comment = _identifier(name)
        if stype != "pipe":
            lines.append(f"    # .{stype}(...)  stage {name!r}: keep as is")
            continue
        rec = settings.get(name) or st.get("recommended") or {}
        ex, c = rec.get("executor"), rec.get("concurrency")
        if not ex or not c:
            lines.append(f"    .pipe({code}){comment}  # no recommendation: see the stage section")
            continue
        c = int(c)
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
    head = []
    if imports:
        head.append(f"from concurrent.futures import {', '.join(sorted(imports))}")
    head.append("from spdl.pipeline import PipelineBuilder")
    head.append("")
    return "\n".join(head + ["pipeline = (", "    PipelineBuilder()", "    .add_source(source)", *lines,
                             "    .add_sink(buffer_size=...)", "    .build(num_threads=...)", ")"])


KNOB_KEYS = ("num_workers", "prefetch_factor", "persistent_workers", "pin_memory")
#: Keys of a loader point that are measurements or prose, not settings.
_NOT_KNOBS = {"samples_per_s", "samples_per_s_low", "samples_per_s_high", "batches_per_s", "why", "mem_pss_mb",
              "mem_uss_mb", "mem_main_mb", "mem_workers_mb", "cores_used", "time_to_first_batch_s",
              "epoch_stall_s", "cv", "n_batches", "window_s", "status", "reason", "search_phase", "elapsed_s",
              "started_at", "disk_read_mb_s", "loader", "backend"}


def loader_knobs(d: Mapping[str, Any] | None) -> dict[str, Any]:
    """The settings in a loader point (recommended/best), in a stable order; knobs that do not
    apply (``None``, ``"not applicable"``) are left out."""
    d = d or {}
    keys = [k for k in KNOB_KEYS if k in d] + sorted(k for k in d if k not in KNOB_KEYS and k not in _NOT_KNOBS)
    return {k: d[k] for k in keys if d[k] is not None and d[k] != "not applicable"}


def loader_snippet(summary: Mapping[str, Any]) -> str:
    rec = summary.get("recommended") or {}
    if not rec:
        return ""
    info = summary.get("loader") or {}
    backend = str(info.get("backend") or "")
    knobs = loader_knobs(rec)
    if int(knobs.get("num_workers") or 0) == 0 and backend in ("torch", "spdl_pytorch", ""):
        # DataLoader rejects prefetch_factor/persistent_workers without workers.
        knobs.pop("prefetch_factor", None)
        knobs["persistent_workers"] = False
    args = ", ".join(f"{k}={v!r}" for k, v in knobs.items() if v is not None)
    bs = info.get("batch_size")
    bs_arg = f"batch_size={bs}, " if bs else ""
    if backend == "spdl_pytorch":
        return ("from spdl.dataloader import get_pytorch_dataloader\n\n"
                f"loader = get_pytorch_dataloader(\n    dataset, {bs_arg}\n    {args},\n)")
    if backend in ("torch", ""):
        return ("from torch.utils.data import DataLoader\n\n"
                f"loader = DataLoader(\n    dataset, {bs_arg}\n    {args},\n)")
    return f"# {backend} loader: recommended settings\n" + "\n".join(
        f"{k} = {v!r}" for k, v in knobs.items() if v is not None)


# --------------------------------------------------------------------------- context


def _signal_items(evidence: Mapping[str, Any]) -> list[dict[str, Any]]:
    out = []
    for key, sig in (evidence.get("signals") or {}).items():
        if not isinstance(sig, Mapping):
            sig = {"value": sig}
        iv = sig.get("interval") or [None, None]
        out.append({"key": str(key), "label": str(sig.get("label") or key), "value": sig.get("value"),
                    "low": iv[0] if len(iv) > 0 else None, "high": iv[1] if len(iv) > 1 else None})
    return out


def _fit_items(fits: Mapping[str, Any]) -> list[dict[str, Any]]:
    out = []
    for key, f in sorted((fits or {}).items()):
        f = f or {}
        out.append({
            "key": key, "model": f.get("model", "usl"), "sigma": f.get("sigma"), "kappa": f.get("kappa"),
            "sigma_interval": f.get("sigma_interval"), "amdahl": f.get("amdahl_serial_fraction"),
            "amdahl_interval": f.get("amdahl_interval"), "peak": f.get("peak_concurrency"), "r2": f.get("r2"),
            "levels": f.get("levels"), "warning": f.get("warning"),
        })
    return out


def _problem_rows(rows: pd.DataFrame) -> list[dict[str, Any]]:
    if rows.empty or "status" not in rows:
        return []
    bad = rows[rows["status"].astype(str) != "ok"]
    cols = [c for c in ("role", "harness", "executor", "concurrency", "num_workers", "prefetch_factor",
                        "persistent_workers", "status", "reason", "error_example") if c in bad.columns]
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


def _noise(rows: pd.DataFrame, value: str, low: str, high: str) -> float | None:
    """Median relative half-width of the measured intervals (a fact of the rows, not an analysis)."""
    if rows.empty or value not in rows:
        return None
    ok = rows[(rows["status"] == "ok")]
    if "role" in ok:
        ok = ok[ok["role"] == "stage"]
    v, lo, hi = (pd.to_numeric(ok[c], errors="coerce") for c in (value, low, high))
    rel = ((hi - lo) / 2 / v).replace([math.inf, -math.inf], math.nan).dropna()
    return float(rel.median()) if len(rel) else None


def stage_cards(rows: pd.DataFrame, summaries: Sequence[Mapping[str, Any]], meta_stages: Sequence[Mapping[str, Any]],
                cores: float | None, anchor: str = "stage") -> list[dict[str, Any]]:
    """One card per stage (pipeline stages, or a loader's transforms measured as stages)."""
    from . import _plots

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
        sub = rows[rows["stage"].astype(str) == name] if "stage" in rows else rows.iloc[0:0]
        sub = sub.sort_values(list(_STAGE_ROW_ORDER), kind="stable") if len(sub) else sub
        cls = s.get("classification") or "unknown"
        ev = s.get("evidence") or {}
        gi = s.get("gil_fraction_interval") or [None, None]
        cards.append({
            "anchor": f"{anchor}-{i}", "name": name, "index": i, "type": s.get("type") or "",
            "status": s.get("status", "ok" if len(sub) else "not measured"),
            "classification": cls, "class_text": _CLASS_TEXT.get(cls, cls),
            "class_color": _plots.CLASS_COLORS.get(cls, _plots.OKABE_ITO["grey"]),
            "gil": s.get("gil_fraction"), "gil_low": gi[0], "gil_high": gi[1] if len(gi) > 1 else None,
            "evidence": [str(x) for x in ev.get("summary") or []], "signals": _signal_items(ev),
            "fits": _fit_items(s.get("fit") or {}),
            "rec": _keys(s.get("recommended"), _POINT_KEYS), "best": _keys(s.get("best"), _POINT_KEYS),
            "ceiling": s.get("ceiling_qps"), "cpu_ms": _ms(s.get("cpu_s_per_item")),
            "gil_ms": _ms(s.get("gil_s_per_item")),
            "img_qps": svg_uri(_plots.stage_throughput_svg(sub, s)) if len(sub) else None,
            "img_res": svg_uri(_plots.stage_resources_svg(sub, cores)) if len(sub) else None,
            "problems": _problem_rows(sub),
        })
    return cards


def _pipeline_context(run: RunData) -> dict[str, Any]:
    from . import _plots

    rows, meta, summary = run.rows, run.meta, run.summary
    prov = summary.get("provenance") or meta.get("provenance") or {}
    cores = prov.get("usable_cores") or prov.get("cpu_count")
    stages = stage_cards(rows, summary.get("stages") or [], meta.get("stages") or [], cores)
    pred = _keys(summary.get("prediction"), ("qps", "binding", "bottleneck", "explanation", "bounds", "naive_qps",
                                             "method", "bounds_qps"))
    val = _keys(summary.get("validation"), ("qps", "qps_low", "qps_high", "seconds", "error_vs_prediction"))
    tiles = []
    if pred.get("qps") is not None:
        binding = _BINDING_TEXT.get(pred.get("binding"), pred.get("binding") or "?")
        tiles.append({"label": "predicted pipeline throughput", "value": f"{_rate(pred['qps'])} items/s",
                      "sub": (f"replayed with stand-ins (bounds: {_rate(pred['bounds_qps'])}) · "
                              if pred.get("method") == "replay" and _finite(pred.get("bounds_qps")) else "")
                             + f"bound by {binding}" + (f" · bottleneck: {pred['bottleneck']}" if pred.get("bottleneck") else "")})
    if val.get("qps") is not None:
        sub = f"{_interval(val.get('qps_low'), val.get('qps_high'))}"
        if _finite(val["qps"]) and _finite(pred.get("qps")) and float(pred["qps"]) > 0:
            # computed here, not read from error_vs_prediction: the sign convention is then unambiguous
            sub += f" · {_pct(float(val['qps']) / float(pred['qps']) - 1, signed=True)} vs predicted"
        tiles.append({"label": "measured whole pipeline", "value": f"{_rate(val['qps'])} items/s", "sub": sub})
    if pred.get("naive_qps") is not None and pred.get("qps") is not None and _finite(pred.get("naive_qps")):
        tiles.append({"label": "slowest stage alone", "value": f"{_rate(pred['naive_qps'])} items/s",
                      "sub": "the naive min-of-stages estimate"})
    noise = _noise(rows, "qps", "qps_low", "qps_high")
    if noise is not None:
        tiles.append({"label": "measurement noise", "value": f"±{noise * 100:.1f}%",
                      "sub": "median half-width of the 95% intervals"})
    n_bad = sum(len(s["problems"]) for s in stages)
    return {
        "stages": stages,
        "tiles": tiles,
        "stand_ins": _stand_in_rows(summary.get("prediction")),
        "prediction": pred,
        "binding_text": _BINDING_TEXT.get(pred.get("binding"), pred.get("binding") or ""),
        "validation": val,
        "snippet": pipeline_snippet(summary, meta),
        "overview_img": svg_uri(_plots.pipeline_overview_svg(summary)),
        "n_problems": n_bad,
        "not_isolated": [{"name": str(x.get("name", "?")), "reason": str(x.get("reason", ""))}
                         for x in (summary.get("not_isolated") or meta.get("not_isolated") or [])],
    }


def _stand_in_rows(pred: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """What the replay ran in place of each stage, in ms per call (what the predicted number rests on)."""
    replay = (pred or {}).get("replay") or {}
    out = []
    for s in replay.get("stand_ins") or []:
        if not isinstance(s, Mapping):
            continue
        out.append({"name": str(s.get("name", "?")), "executor": str(s.get("executor", "?")),
                    "concurrency": s.get("concurrency"), "gil_ms": _ms(s.get("gil_s")),
                    "free_ms": _ms(s.get("free_s")), "wait_ms": _ms(s.get("wait_s")),
                    "releases": int(s["releases"]) if isinstance(s.get("releases"), (int, float)) else 1,
                    "note": str(s.get("note") or "")})
    return out


_POINT_KEYS = ("executor", "concurrency", "harness", "qps", "qps_low", "qps_high", "why")
_LOADER_KEYS = ("num_workers", "prefetch_factor", "persistent_workers", "pin_memory", "samples_per_s",
                "samples_per_s_low", "samples_per_s_high", "why")


def _keys(d: Mapping[str, Any] | None, keys: Sequence[str]) -> dict[str, Any]:
    """A summary dict with every key the template reads (None when absent), extra keys kept."""
    d = dict(d or {})
    return {**{k: None for k in keys}, **d}


def _ms(x: Any) -> float | None:
    return float(x) * 1e3 if _finite(x) else None


def _loader_context(run: RunData) -> dict[str, Any]:
    from . import _plots

    rows, summary = run.rows, run.summary
    info = summary.get("loader") or run.meta.get("loader") or {}
    rec = _keys(summary.get("recommended"), _LOADER_KEYS) if summary.get("recommended") else {}
    best = _keys(summary.get("best"), _LOADER_KEYS)
    search = summary.get("search") or {}
    target = _keys(summary.get("target"), ("rate", "met", "verdict")) if summary.get("target") else None
    tiles = []
    if rec.get("samples_per_s") is not None:
        tiles.append({"label": "recommended setting", "value": f"{_rate(rec['samples_per_s'])} samples/s",
                      "sub": f"num_workers={rec.get('num_workers')}, prefetch_factor={rec.get('prefetch_factor')}"})
    if best.get("samples_per_s") is not None:
        tiles.append({"label": "best measured", "value": f"{_rate(best['samples_per_s'])} samples/s",
                      "sub": _interval(best.get("samples_per_s_low"), best.get("samples_per_s_high"))})
    if target:
        tiles.append({"label": "trainer needs", "value": f"{_rate(target.get('rate'))} samples/s",
                      "sub": "met" if target.get("met") else "NOT met: data-bound"})
    if search.get("points_measured") is not None:
        sub = f"{search.get('points_measured')} points in {_num(search.get('seconds'))} s"
        if _finite(search.get("time_saved_s")):
            sub += f"; saved {_num(search['time_saved_s'])} s vs the full grid"
        tiles.append({"label": f"search ({search.get('strategy', '?')})", "value": f"{search.get('points_measured')} points",
                      "sub": sub})
    user = summary.get("user_setting") or {}
    if _finite(user.get("samples_per_s")):
        tiles.append({"label": "your current setting", "value": f"{_rate(user['samples_per_s'])} samples/s",
                      "sub": f"num_workers={user.get('num_workers')}, prefetch_factor={user.get('prefetch_factor')}"})
    noise = _noise(rows, "samples_per_s", "samples_per_s_low", "samples_per_s_high")
    if noise is not None:
        tiles.append({"label": "measurement noise", "value": f"±{noise * 100:.1f}%",
                      "sub": "median half-width of the 95% intervals"})
    points = []
    if not rows.empty and "num_workers" in rows:
        ok = rows[rows["status"] == "ok"].copy()
        for c in ("num_workers", "prefetch_factor"):
            ok[c] = pd.to_numeric(ok[c], errors="coerce")
        ok = ok.sort_values(["num_workers", "prefetch_factor"], kind="stable", na_position="first")
        for r in ok.to_dict("records"):
            points.append({
                "nw": _num(int(r["num_workers"])) if _finite(r.get("num_workers")) else "—",
                "pf": _num(int(r["prefetch_factor"])) if _finite(r.get("prefetch_factor")) else "—",
                "pw": _cell(r.get("persistent_workers")), "pin": _cell(r.get("pin_memory")),
                "sps": r.get("samples_per_s"), "lo": r.get("samples_per_s_low"), "hi": r.get("samples_per_s_high"),
                "ttfb": r.get("time_to_first_batch_s"), "stall": r.get("epoch_stall_s"),
                "cores": r.get("cores_used"), "mem": r.get("mem_pss_mb"),
                "rec": _same_knobs(r, rec),
            })
    prov = summary.get("provenance") or run.meta.get("provenance") or {}
    trows = run.extra.get("transform_rows")
    transforms = stage_cards(trows if trows is not None else pd.DataFrame(), summary.get("transforms") or [], [],
                             prov.get("usable_cores") or prov.get("cpu_count"), anchor="transform")
    budget = (summary.get("settings") or {}).get("memory_budget_mb")
    return {
        "info": {str(k): v for k, v in info.items()},
        "rec": rec, "best": best, "search": search, "target": target, "tiles": tiles,
        "snippet": loader_snippet(summary),
        "img_tput": svg_uri(_plots.loader_throughput_svg(rows, summary)) if len(rows) else None,
        "img_heat": svg_uri(_plots.loader_heatmap_svg(rows, summary)) if len(rows) else None,
        "img_startup": svg_uri(_plots.loader_startup_memory_svg(rows, budget if _finite(budget) else None))
        if len(rows) else None,
        "points": points, "problems": _problem_rows(rows), "transforms": transforms,
    }


def _same_knobs(row: Mapping[str, Any], rec: Mapping[str, Any]) -> bool:
    if not rec or rec.get("num_workers") is None:
        return False
    if int(row.get("num_workers") or 0) != int(rec["num_workers"]):
        return False
    pf_r, pf_c = row.get("prefetch_factor"), rec.get("prefetch_factor")
    if _finite(pf_r) and _finite(pf_c) and int(pf_r) != int(pf_c):
        return False
    for k in ("persistent_workers", "pin_memory"):
        if k in rec and str(row.get(k)).lower() != str(rec[k]).lower():
            return False
    return True


def _title(run: RunData) -> str:
    if run.kind == "loader":
        info = run.summary.get("loader") or run.meta.get("loader") or {}
        return f"{info.get('name', 'loader')} ({info.get('backend', '?')})"
    pred = run.summary.get("prediction") or {}
    names = [str(s.get("name")) for s in run.summary.get("stages") or run.meta.get("stages") or []]
    if names:
        return f"pipeline: {' → '.join(names[:6])}" + (" → …" if len(names) > 6 else "")
    return f"pipeline {pred.get('bottleneck', '')}".strip()


def report_context(run: RunData) -> dict[str, Any]:
    summary, meta = run.summary, run.meta
    warnings = [str(w) for w in summary.get("warnings") or []]
    if run.summary_error:
        warnings.insert(0, f"the analysis could not run, so this report shows the raw measurements only "
                           f"({run.summary_error})")
    if run.rows.empty:
        warnings.insert(0, "no measured rows: results.csv is missing or empty")
    settings = summary.get("settings") or meta.get("settings") or {}
    findings = [{"severity": str(f.get("severity", "info")), "title": str(f.get("title", "")),
                 "detail": str(f.get("detail", "")), "stage": f.get("stage")}
                for f in summary.get("findings") or []]
    # Findings arrive ranked: show the important ones, fold the minor tail away.
    split = max(3, sum(1 for f in findings if f["severity"] in ("high", "medium")))
    ctx: dict[str, Any] = {
        "kind": run.kind,
        "title": _title(run),
        "verdict": summary.get("verdict") or ("no verdict: the analysis did not run" if run.summary_error
                                              else "no verdict in summary.json"),
        "warnings": warnings,
        "findings": findings[:split], "more_findings": findings[split:],
        "provenance": provenance_items(summary.get("provenance") or meta.get("provenance"),
                                       meta.get("provenance_after")),
        "run_items": [(k, str(v)) for k, v in (("created", meta.get("created_at")), ("command", _command(meta)),
                                               ("stagebench", summary.get("stagebench_version")),
                                               ("run directory", run.path.name)) if v],
        "settings": [(str(k), json.dumps(to_jsonable(v), ensure_ascii=False, default=str))
                     for k, v in settings.items()],
        "rows_json": json_island(rows_records(run.rows)),
        "summary_json": json_island(summary),
        "csv_uri": csv_uri(run.csv_bytes),
        "n_rows": len(run.rows),
        "columns": list(run.rows.columns),
    }
    trows = run.extra.get("transform_rows")
    ctx["transform_rows_json"] = json_island(rows_records(trows)) if trows is not None else None
    if run.kind == "loader":
        ctx["loader"] = _loader_context(run)
        ctx["pipeline"] = None
    else:
        ctx["pipeline"] = _pipeline_context(run)
        ctx["loader"] = None
    return ctx


def _command(meta: Mapping[str, Any]) -> str | None:
    cmd = meta.get("command")
    if isinstance(cmd, (list, tuple)):
        import shlex

        return shlex.join(str(c) for c in cmd)
    return cmd


def render_report(run: RunData) -> str:
    """The report HTML for a loaded run (pure: same run data, same text)."""
    return render("report.html.j2", **report_context(run))


# --------------------------------------------------------------------------- entry points


def _write_text(path: Path, text: str) -> None:
    import os

    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)  # a browser refreshing mid-write never sees half a page


def write_report(run_dir: Path) -> Path:
    """Write ``report.html`` for a run directory (computing ``summary.json`` if missing)."""
    run = load_run(Path(run_dir))
    out = run.path / "report.html"
    _write_text(out, render_report(run))
    return out


def _natural_key(p: Path) -> tuple:
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p.name))


def _run_dirs_in(d: Path) -> list[Path]:
    """``d`` when it is a run directory, else the run directories one level below it."""
    if is_run_dir(d):
        return [d]
    return sorted((p for p in d.iterdir() if p.is_dir() and is_run_dir(p)), key=_natural_key)


def _n_rows(d: Path) -> int:
    if not (d / RESULTS).is_file():
        return 0
    try:
        return len(read_rows(d))
    except Exception:  # noqa: BLE001 - an unreadable file has no rows to speak of
        return 0


def find_run_dirs(sweep_dir: Path) -> tuple[list[Path], list[dict[str, Any]]]:
    """Run directories under a sweep directory, and the jobs that did not finish.

    Hydra job folders are read through the sweep app's own record
    (:func:`stagebench._hydra_app.collect_jobs`): a job is compared only when its
    ``job_status.json`` says ``ok``. A job stopped mid-sweep (Slurm's scancel or
    time limit: status ``failed``) keeps the rows it measured, but they cover part
    of its grid and could name a wrong winner, so the job is listed as failed with
    its own reason. In a stagebench sweep a job folder without ``job_status.json``
    did not finish (killed hard, or still running). A job that never started
    leaves no folder at all; those come from the sweep's ``multirun.yaml``
    (:func:`sweep_plan`). Other subfolders (and folders one level below them) that
    are run directories are compared as they are: ``stagebench report`` also
    works on a folder of plain runs, or on a user's own Hydra app.
    """
    from ._hydra_app import collect_jobs

    sweep_dir = Path(sweep_dir)
    runs: list[Path] = []
    failed: list[dict[str, Any]] = []
    plan = sweep_plan(sweep_dir)
    jobs = collect_jobs(sweep_dir)
    # Only stagebench's sweep app promises a job_status.json; a user's own Hydra app does not.
    ours = bool(plan and plan["stagebench"]) or any((Path(j["run_dir"]) / JOB_STATUS).is_file() for j in jobs)
    judged: set[Path] = set()
    for j in jobs:
        d = Path(j["run_dir"])
        has_status = (d / JOB_STATUS).is_file()
        if not (has_status or ours):
            continue
        judged.add(d)
        if j.get("status") == "ok":
            inner = _run_dirs_in(d)
            if inner:
                runs.extend(inner)
                continue
            reason = f"{JOB_STATUS} says ok but the folder has no results (run.json, results.csv)"
        elif not has_status:
            reason = f"no {JOB_STATUS}: the job did not finish (killed, or still running)"
        else:
            reason = str(j.get("reason") or "the job failed without saying why")
        n = _n_rows(d)
        reason += (f"; rows it measured before it stopped: {n}, not compared (they cover part of its sweep)"
                   if n else _log_hint(d))
        failed.append({"name": str(j.get("label") or job_label(d)), "path": str(d), "reason": reason,
                       "overrides": job_overrides(d)})
    for d in sorted((p for p in sweep_dir.iterdir() if p.is_dir() and not p.name.startswith(".")),
                    key=_natural_key):
        if d in judged:
            continue
        inner = _run_dirs_in(d)
        if inner:
            runs.extend(inner)
        elif (d / ".hydra").is_dir():
            failed.append({"name": job_label(d), "path": str(d), "reason": (
                "no results: the job failed or was interrupted before measuring" + _log_hint(d))})
    if plan is not None:
        failed.extend(_never_started(plan, [Path(j["run_dir"]) for j in jobs]))
    return runs, failed


MULTIRUN_CONFIG = "multirun.yaml"  # Hydra writes it into the sweep folder before it launches a job


def sweep_plan(sweep_dir: Path) -> dict[str, Any] | None:
    """The jobs a Hydra multirun set out to run, from ``SWEEP_DIR/multirun.yaml``; None without one.

    ``{"jobs": [[override, ...] per job in job-number order] | None, "count": int | None,
    "stagebench": bool}``. The job list is rebuilt the way Hydra's basic sweeper
    builds it (``hydra.sweeper.params`` then ``hydra.overrides.task``, the cartesian
    product of the sweep values), so it matches each job's recorded overrides. For
    another sweeper (Optuna, ...) only ``n_trials``, where it has one, gives the count.
    """
    path = Path(sweep_dir) / MULTIRUN_CONFIG
    if not path.is_file():
        return None
    try:
        import yaml

        cfg = yaml.safe_load(path.read_text(encoding="utf-8"))
    except Exception:  # noqa: BLE001 - an unreadable plan: no never-started jobs to list
        return None
    hydra = (cfg or {}).get("hydra") if isinstance(cfg, dict) else None
    if not isinstance(hydra, dict):
        return None
    callbacks = hydra.get("callbacks") or {}
    ours = any(isinstance(c, dict) and str(c.get("_target_", "")).startswith("stagebench.")
               for c in (callbacks.values() if isinstance(callbacks, dict) else []))
    sweeper = hydra.get("sweeper") or {}
    task = (hydra.get("overrides") or {}).get("task") or []
    plan: dict[str, Any] = {"jobs": None, "count": None, "stagebench": ours}
    if str(sweeper.get("_target_", "")).endswith(".BasicSweeper"):
        params = sweeper.get("params") or {}
        args = [f"{k}={v}" for k, v in params.items()] + [str(t) for t in task]
        try:
            from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
            from hydra.core.override_parser.overrides_parser import OverridesParser

            parsed = OverridesParser.create().parse_overrides(args)
            plan["jobs"] = [list(c) for c in BasicSweeper.split_arguments(parsed, None)[0]]
            plan["count"] = len(plan["jobs"])
        except Exception:  # noqa: BLE001 - syntax that needs the app's config (glob): count unknown
            pass
    elif isinstance(sweeper.get("n_trials"), int):
        plan["count"] = sweeper["n_trials"]
    return plan


def _never_started(plan: Mapping[str, Any], job_dirs: Sequence[Path]) -> list[dict[str, Any]]:
    """The planned jobs that left no folder."""
    found = [job_overrides(d) for d in job_dirs]
    combos = plan.get("jobs")
    why = "never started: no job folder (cancelled before it started, or still queued)"
    if combos is not None and all(found):
        left: dict[tuple[str, ...], int] = {}
        for f in found:
            left[tuple(sorted(f))] = left.get(tuple(sorted(f)), 0) + 1
        keys = [c.split("=", 1)[0] for c in combos[0]] if combos else []
        differ = [i for i, _ in enumerate(keys) if len({c[i] for c in combos if len(c) > i}) > 1]
        out = []
        for num, combo in enumerate(combos):
            k = tuple(sorted(combo))
            if left.get(k, 0) > 0:
                left[k] -= 1
                continue
            name = ", ".join(combo[i] for i in differ if i < len(combo)) or " ".join(combo) or f"job {num}"
            out.append({"name": name, "path": "", "overrides": list(combo), "job_num": num,
                        "reason": f"{why}; job {num}: {' '.join(combo)}"})
        return out
    count = plan.get("count")
    if count is not None and count > len(job_dirs):
        n = count - len(job_dirs)
        return [{"name": f"{n} job{'s' if n != 1 else ''}", "path": "",
                 "reason": f"{why}; the sweep planned {count} jobs and {len(job_dirs)} left a folder"}]
    return []


def _log_hint(job_dir: Path) -> str:
    logs = sorted(job_dir.glob("*.log"))
    for log in logs:
        try:
            lines = [ln.strip() for ln in log.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
        except OSError:
            continue
        errs = [ln for ln in lines if "error" in ln.lower()]
        if errs:
            return f"; last error in {log.name}: {errs[-1][:300]}"
    return f"; see {logs[0].name}" if logs else ""


JOB_STATUS = "job_status.json"  # written by the Hydra sweep app in each job folder


def job_status(job_dir: Path) -> dict[str, Any]:
    """The Hydra job's own record (status, reason, label, overrides), or {}."""
    p = Path(job_dir) / JOB_STATUS
    if not p.is_file():
        return {}
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def job_overrides(run_dir: Path) -> list[str]:
    """Hydra overrides of the job that wrote ``run_dir`` ([] when it was not a Hydra job)."""
    st = job_status(run_dir)
    if isinstance(st.get("overrides"), list):
        return [str(x) for x in st["overrides"]]
    for d in (run_dir, run_dir.parent):
        ov = d / ".hydra" / "overrides.yaml"
        if ov.is_file():
            return _read_overrides(ov)
    return []


def job_label(run_dir: Path, meta: Mapping[str, Any] | None = None) -> str:
    """A name for a run: run.json's ``label``, the job's label, its Hydra overrides, or the folder name."""
    run_dir = Path(run_dir)
    meta = meta or {}
    if meta.get("label"):
        return str(meta["label"])
    st = job_status(run_dir)
    if st.get("label"):
        return str(st["label"])
    items = job_overrides(run_dir)
    return ", ".join(items) if items else run_dir.name


def short_labels(run_dirs: Sequence[Path], metas: Sequence[Mapping[str, Any] | None]) -> list[str]:
    """Labels for runs shown together: explicit labels win; otherwise only the Hydra
    overrides that differ between the runs (``loader.backend=torch``), not the ones they share."""
    overrides = [job_overrides(Path(d)) for d in run_dirs]
    parsed = [dict(o.split("=", 1) if "=" in o else (o, "") for o in ov) for ov in overrides]
    keys: list[str] = []
    for p in parsed:
        keys += [k for k in p if k not in keys]
    differ = [k for k in keys if len({p.get(k) for p in parsed}) > 1]
    out = []
    for d, meta, p in zip(run_dirs, metas, parsed):
        meta = meta or {}
        st = job_status(Path(d))
        if meta.get("label") or st.get("label"):
            out.append(str(meta.get("label") or st.get("label")))
        elif p and differ and len(run_dirs) > 1:
            out.append(", ".join(f"{k}={p[k]}" for k in differ if k in p))
        else:
            out.append(job_label(Path(d), meta))
    return out


def _read_overrides(path: Path) -> list[str]:
    try:
        import yaml

        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        return [str(x) for x in data or []]
    except Exception:  # noqa: BLE001 - a label is a nicety; fall back to the plain list
        return [ln[2:].strip() for ln in path.read_text(encoding="utf-8", errors="replace").splitlines()
                if ln.startswith("- ")]


def rebuild(path: Path) -> Path:
    """Rebuild derived files from saved rows, measuring nothing.

    A run directory: recompute ``summary.json`` from ``results.csv`` + ``run.json``
    and rewrite ``report.html`` (returns its path). A sweep directory: rebuild
    the report of every finished job, then the comparison over them (returns
    ``comparison.html``); jobs that failed, did not finish or never started are
    listed as failed (see :func:`find_run_dirs`).
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(2, "no such directory", str(path))
    if is_run_dir(path):
        run = load_run(path, recompute=True)
        out = path / "report.html"
        _write_text(out, render_report(run))
        return out
    runs, failed = find_run_dirs(path)
    if not runs and not failed:
        from ._cli import StagebenchError

        raise StagebenchError(f"{path} is neither a run directory (run.json, results.csv) "
                              "nor a sweep directory with run directories inside")
    good: list[Path] = []
    for r in runs:
        try:
            run = load_run(r, recompute=True)
            if run.rows.empty:
                raise ValueError("results.csv has no rows")
            _write_text(r / "report.html", render_report(run))
            good.append(r)
        except Exception as e:  # noqa: BLE001 - one broken job must not lose the others
            failed.append({"name": job_label(r, RunDir(r).read_meta()), "path": str(r),
                           "reason": f"{type(e).__name__}: {e}"})
    from ._compare import write_comparison

    return write_comparison(good, path, title=f"sweep {path.name}", failed=failed)
