"""The pipeline page: the headline tiles, the stage cards, the prediction and its stand-ins, the
snippet to paste and the overview figure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stagebench._numbers import finite, num
from stagebench.model._pipeline import Prediction
from stagebench.report import _stage_plots
from stagebench.report._html import interval_text, pct_text, rate_text, svg_uri
from stagebench.report._page_parts import job_tile, noise_tile, tile, to_ms
from stagebench.report._run import RunData
from stagebench.report._snippets import pipeline_snippet
from stagebench.report._stage_cards import stage_cards

__all__ = ["pipeline_context"]

# looked up with whatever a summary holds, None included
_BINDING_TEXT: dict[str | None, str] = {"stage": "a stage's capacity", "cores": "the cores", "gil": "the GIL"}


def pipeline_context(run: RunData) -> dict[str, Any]:
    """The pipeline page's part of the report's context.

    Args: the loaded run (a pipeline diagnosis). Returns: what ``report.html.j2`` reads as ``pipeline``:
    the stage cards, the tiles, the prediction with its stand-ins, the validation, the snippet, the
    overview figure and the stages not measured alone.
    """
    rows, meta, sm = run.rows, run.meta, run.summary
    cores = run.provenance.cores
    quick = meta.settings.quick == "on"
    declared = [str(s.get("name")) for s in meta.stages]
    stages = stage_cards(rows, run.stages, declared, cores, resources_plot=not quick)
    pred, val = sm.prediction, sm.validation
    tiles = job_tile(run.job)
    if pred.qps is not None:
        binding = _BINDING_TEXT.get(pred.binding, pred.binding or "?")
        tiles.append(
            tile(
                "predicted pipeline throughput",
                f"{rate_text(pred.qps)} items/s",
                (
                    f"replayed with stand-ins (bounds: {rate_text(pred.bounds_qps)}) · "
                    if pred.method == "replay" and finite(pred.bounds_qps)
                    else ""
                )
                + f"bound by {binding}"
                + (f" · bottleneck: {pred.bottleneck}" if pred.bottleneck else ""),
            )
        )
    if val.qps is not None:
        sub = f"{interval_text(val.qps_low, val.qps_high)}"
        # the rate the prediction is read against (the analysis's), where it is one
        shared = finite(val.qps_with_replay)
        against = val.qps_with_replay if shared else val.qps
        if finite(against) and finite(pred.qps) and num(pred.qps) > 0:
            # computed here, not read from error_vs_prediction: the sign convention is then unambiguous
            sub += f" · {pct_text(num(against) / num(pred.qps) - 1, signed=True)} vs predicted" + (
                f" in the round the replay took part in ({rate_text(against)})" if shared else ""
            )
        tiles.append(tile("measured whole pipeline", f"{rate_text(val.qps)} items/s", sub))
    trainer = sm.trainer
    if finite(trainer.samples_per_s):
        wp = trainer.with_pipeline
        tiles.append(
            tile(
                "your training step (demand)",
                f"{rate_text(trainer.samples_per_s)} items/s",
                f"{interval_text(trainer.samples_per_s_low, trainer.samples_per_s_high)}"
                + (
                    f" · waited for data {pct_text(wp.data_wait_share)} of each step on the real pipeline"
                    if wp is not None and finite(wp.data_wait_share)
                    else ""
                ),
            )
        )
    yours = sm.recommended_vs_yours
    if finite(yours.qps):
        tiles.append(
            tile(
                "your settings, pipeline alone",
                f"{rate_text(yours.qps)} items/s",
                f"{interval_text(yours.qps_low, yours.qps_high)} · in turns with the recommended",
            )
        )
    if pred.naive_qps is not None and pred.qps is not None and finite(pred.naive_qps):
        tiles.append(
            tile("slowest stage alone", f"{rate_text(pred.naive_qps)} items/s", "the naive min-of-stages estimate")
        )
    noise = noise_tile(rows, "qps")
    if noise is not None:
        tiles.append(noise)
    return {
        "stages": stages,
        "tiles": tiles,
        "stand_ins": _stand_in_rows(pred),
        "prediction": pred,
        "validation": val,
        "snippet": pipeline_snippet(sm, meta),
        "overview_img": svg_uri(_stage_plots.pipeline_overview_svg(sm, run.stages)),
        "not_isolated": [
            {"name": str(x.get("name", "?")), "reason": str(x.get("reason", ""))}
            for x in (sm.not_isolated or meta.not_isolated)
        ],
    }


@dataclass(frozen=True, slots=True)
class _StandInRow:
    """What the replay ran in place of a stage, in ms per call."""

    name: Any
    executor: Any
    concurrency: Any
    gil_ms: float | None
    free_ms: float | None
    wait_ms: float | None
    releases: Any
    note: Any


def _stand_in_rows(pred: Prediction) -> list[_StandInRow]:
    """What the replay ran in place of each stage, in ms per call (what the predicted number rests on)."""
    return [
        _StandInRow(
            s.name, s.executor, s.concurrency, to_ms(s.gil_s), to_ms(s.free_s), to_ms(s.wait_s), s.releases, s.note
        )
        for s in pred.stand_ins
    ]
