"""Compare run directories: who wins, by how much, and whether the difference is real.

Used by ``stagebench compare RUN_A RUN_B ...`` and by the Hydra multirun
callback (one run directory per job). Writes ``comparison.csv`` (one row per
run, for spreadsheets and scripts) and ``comparison.html`` (self-contained, like
the run report).

Significance: every throughput carries a batch-means Student-t interval
(``mean ± t(n−1)·s/√n`` over ``n`` batches, see ``_stats.mean_interval``), so
its standard error is recoverable as ``half-width / t(n−1)``. Two runs are
compared with Welch's t-test on those standard errors (unequal variances,
Welch–Satterthwaite degrees of freedom). Where the batch count is unknown (a
whole-pipeline validation run, an old summary) the comparison falls back to
whether the two 95% intervals overlap, and says so; with no interval at all it
says the difference is untested.

Runs from different *kinds* of machine get a warning: their difference is the
machines' as much as the settings'. The kind is what sets a loader's speed:
CPU model, usable cores, memory (within a few percent: identical nodes report
slightly different totals), Python version and build (free-threaded or not),
and the torch and spdl versions. The hostname is not part of it: a sweep spread
over identical cluster nodes runs on many hosts of one kind, and warning on
every such sweep would teach users to ignore the warning. Hostnames still
appear in the runs table and in ``comparison.csv``.
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd

from stagebench._errors import StagebenchError
from stagebench._numbers import num
from stagebench.model._loader import LoaderPoint
from stagebench.model._meta import Provenance
from stagebench.model._stage import StageEntry
from stagebench.report._compare_plots import Bar, Curve, compare_best_svg, compare_curves_svg
from stagebench.report._html import (
    csv_uri,
    finite,
    json_island,
    machine_label,
    rate_text,
    render,
    svg_uri,
    write_text,
)
from stagebench.report._render import RunData, load_run
from stagebench.report._run import FailedJob
from stagebench.runs._jobs import job_label, job_overrides, short_labels
from stagebench.runs._knobs import loader_knobs
from stagebench.runs._results import RunDir, RunFileError, csv_cell, default_run_dir, is_run_dir, read_rows_or_empty

__all__ = [
    "compare_runs",
    "write_comparison",
    "Estimate",
    "difference",
    "Difference",
    "COMPARISON_COLUMNS",
    "machine_kind",
    "machine_kind_differences",
    "MEMORY_TOLERANCE",
]

COMPARISON_COLUMNS = (
    "label",
    "kind",
    "status",
    "reason",
    "unit",
    "best",
    "best_low",
    "best_high",
    "best_setting",
    "recommended",
    "recommended_low",
    "recommended_high",
    "recommended_setting",
    "vs_winner_pct",
    "p_value_vs_winner",
    "significant_vs_winner",
    "test",
    "verdict",
    "hostname",
    "cpu_model",
    "cpu_count",
    "usable_cores",
    "run_dir",
    "memory_total_gb",
    "python",
    "free_threaded",
    "torch",
    "spdl",
)
#: Libraries whose version changes a loader's speed (their own code does the work).
_KIND_LIBRARIES = ("torch", "spdl")
#: Relative spread of memory_total_gb still counted as one kind of machine: the same
#: node type reports totals a little apart (firmware and kernel reservations).
MEMORY_TOLERANCE = 0.03


@dataclass(frozen=True, slots=True, kw_only=True)
class Estimate:
    """A throughput with its interval and the number of batches behind it (None: unknown)."""

    value: float
    low: float | None = None
    high: float | None = None
    n: int | None = None
    confidence: float = 0.95

    def __post_init__(self) -> None:
        if not 0.5 < self.confidence < 1:
            raise ValueError(f"confidence must be in (0.5, 1), got {self.confidence}")

    @property
    def has_interval(self) -> bool:
        return finite(self.low) and finite(self.high)

    def stderr(self) -> float | None:
        if not self.has_interval or self.n is None or self.n < 2:
            return None
        from scipy import stats  # a comparison's tests only: `stagebench report RUN` of one run never loads scipy

        assert self.low is not None and self.high is not None  # has_interval
        t = float(stats.t.ppf(0.5 + self.confidence / 2, self.n - 1))
        return (self.high - self.low) / 2 / t


@dataclass(frozen=True, slots=True)
class Difference:
    """How much one throughput exceeds another (``pct`` = a/b − 1), and how sure that is: ``p`` the
    two-sided Welch p-value (None where the test could not run), ``significant`` at 5% or by
    non-overlapping intervals (None where there is nothing to test with), ``test`` which of them."""

    ratio: float
    pct: float
    p: float | None = None
    significant: bool | None = None
    test: str = "no interval: untested"


def difference(a: Estimate, b: Estimate) -> Difference:
    """How much ``a`` exceeds ``b``, and how sure we are.

    Args: the two estimates. Returns: their :class:`Difference`.
    """
    ratio = a.value / b.value if b.value else math.inf
    out = Difference(ratio=ratio, pct=ratio - 1)
    se_a, se_b = a.stderr(), b.stderr()
    if se_a is not None and se_b is not None:
        from scipy import stats  # as in Estimate.stderr: only where two runs are tested

        var = se_a**2 + se_b**2
        if var == 0:
            return replace(
                out,
                p=0.0 if a.value != b.value else 1.0,
                significant=a.value != b.value,
                test="Welch's t on batch means",
            )
        t = (a.value - b.value) / math.sqrt(var)
        assert a.n is not None and b.n is not None  # stderr() needs them
        df = var**2 / (se_a**4 / (a.n - 1) + se_b**4 / (b.n - 1))
        p = float(2 * stats.t.sf(abs(t), df))
        return replace(out, p=p, significant=p < 0.05, test="Welch's t on batch means")
    if a.has_interval and b.has_interval:
        apart = num(a.low) > num(b.high) or num(b.low) > num(a.high)
        return replace(out, significant=apart, test="95% intervals " + ("do not overlap" if apart else "overlap"))
    return out


# --------------------------------------------------------------------------- per-run figures of merit


@dataclass(frozen=True, slots=True)
class _Figure:
    """A figure of the comparison page: its title, its image as a data URI, its caption."""

    title: str
    img: Any
    caption: str


@dataclass(slots=True)
class _Entry:
    label: str
    run: RunData
    unit: str
    best: Estimate | None
    best_setting: str
    best_note: str
    rec: Estimate | None
    rec_setting: str
    verdict: str


def _n_batches(rows: pd.DataFrame, **match: Any) -> int | None:
    if rows.empty or "n_batches" not in rows:
        return None
    sel = rows
    for k, v in match.items():
        if k not in sel or v is None:
            continue
        col = sel[k]
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            sel = sel[pd.to_numeric(col, errors="coerce") == v]
        else:
            sel = sel[col.astype(str).str.lower() == str(v).lower()]
    n = pd.to_numeric(sel["n_batches"], errors="coerce").dropna()
    return int(n.iloc[0]) if len(n) else None


def _confidence(run: RunData) -> float:
    c = run.settings.confidence
    return num(c) if 0.5 < num(c) < 1 else 0.95


def _loader_estimate(run: RunData, p: LoaderPoint) -> Estimate | None:
    rate = p.samples_per_s
    if rate is None:
        return None
    n = _n_batches(
        run.rows,
        status="ok",
        num_workers=p.num_workers,
        prefetch_factor=p.prefetch_factor if p.num_workers else None,
        persistent_workers=p.persistent_workers,
        pin_memory=p.pin_memory,
    )
    return Estimate(value=rate.value, low=rate.low, high=rate.high, n=n, confidence=_confidence(run))


def _knobs(d: Mapping[str, Any] | None) -> str:
    return ", ".join(f"{k}={v}" for k, v in loader_knobs(d).items())


def _stage_estimate(run: RunData, stage: StageEntry, name: str) -> Estimate | None:
    """The stage ``name``'s recommended rate, with the batches it rests on."""
    d = stage.recommended
    if d is None or not finite(d.qps):
        return None
    n = _n_batches(
        run.rows,
        stage=name,
        role="stage",
        status="ok",
        executor=d.executor,
        harness=d.harness,
        concurrency=d.concurrency,
    )
    return Estimate(value=num(d.qps), low=d.qps_low, high=d.qps_high, n=n, confidence=_confidence(run))


def _entry(run: RunData, label: str) -> _Entry:
    sm = run.summary
    if run.kind == "loader":
        return _Entry(
            label=label,
            run=run,
            unit="samples/s",
            best=_loader_estimate(run, LoaderPoint.from_json(sm.best)),
            best_setting=_knobs(sm.best),
            best_note="best measured loader setting",
            rec=_loader_estimate(run, LoaderPoint.from_json(sm.recommended)),
            rec_setting=_knobs(sm.recommended),
            verdict=str(sm.verdict or ""),
        )
    pred, val = sm.prediction, sm.validation
    settings = "; ".join(f"{x.stage}: {x.executor} × {x.concurrency}" for x in pred.settings)
    if val.qps is not None and finite(val.qps):
        best = Estimate(value=float(val.qps), low=val.qps_low, high=val.qps_high, n=None)
        note = "whole pipeline, measured at the recommended settings"
    elif pred.qps is not None and finite(pred.qps):
        best = Estimate(value=float(pred.qps))
        note = "whole pipeline, predicted (no validation run)"
    else:
        best, note = None, "no pipeline throughput in the summary"
    return _Entry(
        label=label,
        run=run,
        unit="items/s",
        best=best,
        best_setting=settings,
        best_note=note,
        rec=best,
        rec_setting=settings,
        verdict=str(sm.verdict or ""),
    )


def _unique_labels(labels: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for lab in labels:
        seen[lab] = seen.get(lab, 0) + 1
        out.append(lab if seen[lab] == 1 else f"{lab} ({seen[lab]})")
    return out


def machine_kind(p: Provenance) -> dict[str, Any]:
    """What makes a machine the kind it is for timings (None: not recorded). No hostname.

    Args: the run's provenance. Returns: each key's value, None where the run did not record it.
    """
    return {
        "cpu_model": p.cpu_model,
        "usable_cores": p.cores,
        "memory_total_gb": p.memory_total_gb,
        "python": " ".join(str(x) for x in (p.python_implementation, p.python) if x) or None,
        "free_threaded": p.free_threaded,
        **{lib: p.libraries.get(lib) for lib in _KIND_LIBRARIES},
    }


def machine_kind_differences(provs: Sequence[Provenance]) -> list[str]:
    """The keys of :func:`machine_kind` on which the runs differ.

    A key a run did not record is left out for that run (an older run directory
    is not a different machine); memory counts as different beyond
    :data:`MEMORY_TOLERANCE` relative spread.
    """
    kinds = [machine_kind(p) for p in provs]
    differ = []
    for key in kinds[0] if kinds else ():
        known = [k[key] for k in kinds if k[key] is not None]
        if key == "memory_total_gb":
            gb = [float(v) for v in known if finite(v)]
            if gb and min(gb) > 0 and max(gb) / min(gb) - 1 > MEMORY_TOLERANCE:
                differ.append(key)
        elif len({str(v) for v in known}) > 1:
            differ.append(key)
    return differ


def machine_text(prov: Provenance) -> str:
    """Host and kind of machine in one line, for the runs table and the warning."""
    kind = machine_kind(prov)
    parts = [machine_label(prov)]
    if finite(kind["memory_total_gb"]):
        parts.append(f"{float(kind['memory_total_gb']):.1f} GB")
    if kind["python"]:
        parts.append(str(kind["python"]) + (" free-threaded" if kind["free_threaded"] else ""))
    parts += [f"{lib} {kind[lib]}" for lib in _KIND_LIBRARIES if kind[lib]]
    return " · ".join(parts)


def _machine_warning(entries: Sequence[_Entry]) -> str | None:
    provs = [(e.label, e.run.provenance) for e in entries]
    differ = machine_kind_differences([p for _, p in provs])
    if not differ:
        return None
    detail = "; ".join(f"{lab}: {machine_text(p)}" for lab, p in provs)
    return (
        f"these runs come from different kinds of machine ({', '.join(differ)} differ): a difference may be "
        f"the machines', not the settings' ({detail})"
    )


# --------------------------------------------------------------------------- context


def _group_context(entries: list[_Entry], kind: str) -> dict[str, Any]:
    bests = {id(e): e.best for e in entries if e.best is not None}
    ranked = sorted([e for e in entries if id(e) in bests], key=lambda e: -bests[id(e)].value)
    rows = []
    winner = ranked[0] if ranked else None
    for e in entries:
        diff = difference(bests[id(e)], bests[id(winner)]) if winner and id(e) in bests and e is not winner else None
        rows.append({"e": e, "diff": diff, "is_winner": e is winner})
    headline = ""
    if winner and len(ranked) >= 2:
        runner = ranked[1]
        diff_w = difference(bests[id(winner)], bests[id(runner)])
        p = f", p = {diff_w.p:.2g})" if diff_w.p is not None else ")"
        how = {True: "significant (", False: "NOT significant: within noise (", None: ""}[diff_w.significant]
        how = f"{how}{diff_w.test}{p}" if how else diff_w.test
        headline = (
            f"{winner.label} wins: {rate_text(bests[id(winner)].value)} {winner.unit} vs "
            f"{rate_text(bests[id(runner)].value)} "
            f"for {runner.label} ({diff_w.pct * 100:+.0f}%); {how}"
        )
    elif winner:
        headline = (
            f"only one {kind} run with results: {winner.label}, {rate_text(bests[id(winner)].value)} {winner.unit}"
        )
    unit = entries[0].unit if entries else ""
    best_img = svg_uri(
        compare_best_svg(
            [Bar(e.label, bests[id(e)].value, bests[id(e)].low, bests[id(e)].high) for e in ranked],
            unit=unit,
        )
    )
    curves = _loader_curves(entries) if kind == "loader" else _stage_curves(entries)
    return {
        "kind": kind,
        "unit": unit,
        "headline": headline,
        "rows": rows,
        "best_img": best_img,
        "curves": curves,
        "stage_tables": _stage_tables(entries) if kind == "pipeline" else [],
    }


def _curve(label: str, points: pd.DataFrame, x: str, y: str, rec: tuple[Any, Any]) -> Curve:
    """One run's series for :func:`~stagebench.report._compare_plots.compare_curves_svg`: ``y`` with its interval
    (the ``_low`` and ``_high`` columns) against ``x``, and the recommendation's point (``rec``: its x and y)."""
    return Curve(
        label,
        points[x].tolist(),
        points[y].tolist(),
        points[f"{y}_low"].tolist(),
        points[f"{y}_high"].tolist(),
        rec_x=rec[0],
        rec_y=rec[1],
    )


#: the captions of the curves' figures: a loader's, and each stage's
_LOADER_CAPTION = (
    "Each run's best measured throughput at each num_workers (bands: 95% intervals); ★ its recommendation."
)
_STAGE_CAPTION = (
    "Each run's curve on the executor it recommends for this stage (bands: 95% intervals); ★ the recommendation."
)


def _loader_curves(entries: Sequence[_Entry]) -> list[_Figure]:
    series = []
    for e in entries:
        r = e.run.rows
        if r.empty or "num_workers" not in r:
            continue
        ok = r[r["status"] == "ok"].copy()
        for c in ("num_workers", "samples_per_s", "samples_per_s_low", "samples_per_s_high"):
            ok[c] = pd.to_numeric(ok[c], errors="coerce")
        ok = ok.dropna(subset=["num_workers", "samples_per_s"])
        if ok.empty:
            continue
        top = ok.loc[ok.groupby("num_workers")["samples_per_s"].idxmax()].sort_values("num_workers")
        top = top.astype({"num_workers": int})
        rec = e.run.summary.recommended or {}
        series.append(
            _curve(e.label, top, "num_workers", "samples_per_s", (rec.get("num_workers"), rec.get("samples_per_s")))
        )
    img = compare_curves_svg(
        series, xlabel="num_workers (best prefetch_factor at each)", ylabel="throughput (samples/s)", log2_x=False
    )
    return [_Figure("samples/s against num_workers", svg_uri(img), _LOADER_CAPTION)] if img else []


def _stage_names(entries: Sequence[_Entry]) -> list[str]:
    """The runs' stages in the order first seen: a run's entries, else the stages its rows name."""
    names: dict[str, None] = {}
    for e in entries:
        stages = [s.name for s in e.run.stages]
        if not stages and "stage" in e.run.rows:
            stages = list(e.run.rows["stage"].astype(str).unique())
        names.update(dict.fromkeys(stages))
    return list(names)


def _stage_summary(e: _Entry, name: str) -> StageEntry | None:
    return next((s for s in e.run.stages if s.name == name), None)


def _stage_curves(entries: Sequence[_Entry]) -> list[_Figure]:
    """Per stage, each run's curve on the executor/harness it recommends (else its best)."""
    out = []
    for name in _stage_names(entries):
        series = []
        for e in entries:
            r = e.run.rows
            if r.empty or "stage" not in r:
                continue
            sub = r[(r["stage"].astype(str) == name) & (r["role"] == "stage") & (r["status"] == "ok")].copy()
            for c in ("concurrency", "qps", "qps_low", "qps_high"):
                sub[c] = pd.to_numeric(sub[c], errors="coerce")
            if sub.empty:
                continue
            st = _stage_summary(e, name)
            rec = st.recommended if st is not None else None
            ex, h = (rec.executor, rec.harness) if rec is not None else (None, None)
            if not ex:
                top = sub.loc[sub["qps"].idxmax()]
                ex, h = top["executor"], top["harness"]
            g = sub[(sub["executor"] == ex) & ((sub["harness"] == h) if h else True)].sort_values("concurrency")
            point = (rec.concurrency, rec.qps) if rec is not None else (None, None)
            series.append(_curve(f"{e.label} · {ex}", g, "concurrency", "qps", point))
        img = compare_curves_svg(
            series, xlabel="concurrency (log₂ scale)", ylabel="throughput (items/s)", log2_x=True, title=f"stage {name}"
        )
        if img:
            out.append(_Figure(f"stage {name}", svg_uri(img), _STAGE_CAPTION))
    return out


def _stage_tables(entries: Sequence[_Entry]) -> list[dict[str, Any]]:
    tables = []
    for name in _stage_names(entries):
        cells: list[dict[str, Any]] = []
        for e in entries:
            st = _stage_summary(e, name)
            est = _stage_estimate(e.run, st, name) if st is not None and st.keys else None
            rec = st.recommended if st is not None else None
            cells.append(
                {
                    "label": e.label,
                    "classification": (st.classification if st is not None else None) or "—",
                    "est": est,
                    "setting": f"{rec.executor} × {rec.concurrency}" if rec is not None and rec.executor else "—",
                }
            )
        ests: dict[int, Estimate] = {id(c): c["est"] for c in cells if isinstance(c["est"], Estimate)}
        top = max((c for c in cells if id(c) in ests), key=lambda c: ests[id(c)].value, default=None)
        for c in cells:
            c["diff"] = difference(ests[id(c)], ests[id(top)]) if top and id(c) in ests and c is not top else None
            c["is_top"] = c is top
        tables.append({"name": name, "cells": cells})
    return tables


def _csv_rows(groups: Sequence[dict[str, Any]], failed: Sequence[FailedJob]) -> list[dict[str, Any]]:
    out = []
    for g in groups:
        for row in g["rows"]:
            e: _Entry = row["e"]
            d: Difference | None = row["diff"]
            prov = e.run.provenance
            kind = machine_kind(prov)
            out.append(
                {
                    "label": e.label,
                    "kind": e.run.kind,
                    "status": "ok",
                    "reason": e.run.summary_error or "",
                    "unit": e.unit,
                    "best": e.best.value if e.best else None,
                    "best_low": e.best.low if e.best else None,
                    "best_high": e.best.high if e.best else None,
                    "best_setting": e.best_setting,
                    "recommended": e.rec.value if e.rec else None,
                    "recommended_low": e.rec.low if e.rec else None,
                    "recommended_high": e.rec.high if e.rec else None,
                    "recommended_setting": e.rec_setting,
                    "vs_winner_pct": 0.0 if row["is_winner"] else (num(d.pct) * 100 if d is not None else None),
                    "p_value_vs_winner": d.p if d is not None else None,
                    "significant_vs_winner": d.significant if d is not None else None,
                    "test": d.test if d is not None else ("winner" if row["is_winner"] else ""),
                    "verdict": e.verdict,
                    "hostname": prov.hostname,
                    "cpu_model": prov.cpu_model,
                    "cpu_count": prov.cpu_count,
                    "usable_cores": prov.usable_cores,
                    "run_dir": str(e.run.path),
                    **{k: kind[k] for k in ("memory_total_gb", "free_threaded", *_KIND_LIBRARIES)},
                    "python": prov.python,
                }
            )
    out += [{"label": f.name, "status": "failed", "reason": f.reason, "run_dir": f.path} for f in failed]
    return out


def _csv_text(rows: Sequence[Mapping[str, Any]]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COMPARISON_COLUMNS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: _csv_value(r.get(k)) for k in COMPARISON_COLUMNS})
    return buf.getvalue()


def _csv_value(v: Any) -> Any:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    return csv_cell(v)  # labels come from users' overrides: no cell may become a formula


# --------------------------------------------------------------------------- entry points


def write_comparison(run_dirs: Sequence[Path], out_dir: Path, *, title: str, failed: Sequence[FailedJob] = ()) -> Path:
    """Write ``out_dir/comparison.csv`` and ``out_dir/comparison.html``; return the HTML path.

    Args: the run directories to compare, the folder to write into, the page's title, and the jobs that
    produced no usable run directory (listed, not dropped; a run whose files cannot be read joins them).
    Returns: the path of ``comparison.html``.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    failed = list(failed)
    runs: list[RunData] = []
    for d in run_dirs:
        try:
            runs.append(load_run(Path(d)))
        except Exception as err:  # one unreadable run must not lose the others
            why = str(err) if isinstance(err, StagebenchError) else f"{type(err).__name__}: {err}"
            failed.append(FailedJob(job_label(Path(d)), why, str(d)))
    labels = _unique_labels(short_labels([r.path for r in runs], [r.meta.label for r in runs]))
    if failed and runs:
        # name failed Hydra jobs by the same differing overrides as the runs beside them
        paths = [r.path for r in runs] + [Path(f.path) for f in failed if f.path]
        short = short_labels(paths, [r.meta.label for r in runs] + [None] * (len(paths) - len(runs)))[len(runs) :]
        it = iter(short)
        for i, f in enumerate(failed):
            if f.path and job_overrides(Path(f.path)):
                failed[i] = replace(f, name=next(it))
            elif f.path:
                next(it)
    entries = [_entry(r, lab) for r, lab in zip(runs, labels)]
    groups = [
        _group_context([e for e in entries if e.run.kind == kind], kind)
        for kind in ("loader", "pipeline")
        if any(e.run.kind == kind for e in entries)
    ]
    warnings = []
    mw = _machine_warning(entries)
    if mw:
        warnings.append(mw)
    if len(groups) > 1:
        warnings.append("the runs mix loader and pipeline measurements; each kind is compared on its own")
    for e in entries:
        if e.run.summary_error:
            warnings.append(f"{e.label}: the analysis could not run ({e.run.summary_error})")
    if failed:
        warnings.append(f"{len(failed)} job(s) produced no results; they are listed below")
    csv_rows = _csv_rows(groups, failed)
    csv_text = _csv_text(csv_rows)
    write_text(out_dir / "comparison.csv", csv_text)
    runs_ctx = []
    for e in entries:
        rep = e.run.path / "report.html"
        runs_ctx.append(
            {
                "label": e.label,
                "kind": e.run.kind,
                "verdict": e.verdict,
                "machine": machine_text(e.run.provenance),
                "report": os.path.relpath(rep, out_dir) if rep.is_file() else None,
                "path": os.path.relpath(e.run.path, out_dir),
            }
        )
    html = render(
        "comparison.html.j2",
        title=title,
        groups=groups,
        warnings=warnings,
        failed=failed,
        runs=runs_ctx,
        n_runs=len(entries),
        csv_uri=csv_uri(csv_text.encode("utf-8")),
        rows_json=json_island(csv_rows),
    )
    out = out_dir / "comparison.html"
    write_text(out, html)
    return out


def compare_runs(run_dirs: list[Path], out: Path | None = None) -> Path:
    """``stagebench compare``: check the run directories, then write the comparison into ``out``.

    A damaged ``run.json`` or ``results.csv`` stops it with one line naming the file
    (:class:`~stagebench.runs._results.RunFileError`), before anything is written.
    """
    dirs = [Path(p) for p in run_dirs]
    missing = [str(p) for p in dirs if not (p.is_dir() and is_run_dir(p))]
    if missing:
        raise StagebenchError(f"not a run directory (no run.json or results.csv): {', '.join(missing)}")
    for p in dirs:
        damaged = read_rows_or_empty(p).attrs.get("damaged")
        if damaged:  # a comparison of figures some rows are missing from would name a wrong winner
            raise RunFileError(
                f"{p / 'results.csv'}: damaged: {'; '.join(damaged[:3])}"
                + (f" (and {len(damaged) - 3} more)" if len(damaged) > 3 else "")
                + f"; `stagebench report {p}` rebuilds it from the rows that can be read"
            )
    if out is None:
        out = default_run_dir(prefix="compare")
    labels = short_labels(dirs, [RunDir(p).read_meta().get("label") for p in dirs])
    title = "comparison: " + " vs ".join(labels[:4]) + (" …" if len(labels) > 4 else "")
    return write_comparison(dirs, Path(out), title=title)
