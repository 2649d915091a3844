"""The recommended settings as code to paste: an SPDL ``PipelineBuilder`` chain or a ``DataLoader`` call.

Only the settings are the advice: everything else in the snippet stays as the user wrote it, and
each changed line says what it was, so the snippet reads as a diff of the user's own code.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from stagebench._numbers import num_or_none
from stagebench.analysis._pipeline_job import user_setting
from stagebench.model._evidence import Ratio
from stagebench.model._loader import LoaderPoint
from stagebench.model._meta import LoaderInfo, RunMeta, UserKnobs
from stagebench.model._stage import StageEntry, StageSetting
from stagebench.model._summary import Summary
from stagebench.runs._knobs import loader_knobs

__all__ = ["pipeline_snippet", "loader_snippet"]


def pipeline_snippet(sm: Summary, m: RunMeta) -> str:
    """The recommended settings as a PipelineBuilder chain to paste, each changed line marked with yours.

    Only the stages' settings are the advice: the source, the sink, the stages' own
    arguments and ``num_threads`` stay as the user wrote them. A first comment says
    what running both found (:func:`stagebench.analysis._verdicts.yours_verdict`).

    Args: the run's summary and its ``run.json``. Returns: the snippet, "" where no stage is a pipe.
    """
    types = {s.get("name"): s for s in m.stages}
    versus = sm.recommended_vs_yours
    verdict = versus.verdict
    stages = sm.stages
    job = sm.job
    decided = job is not None and job.decided
    # the job's pick is on the stages (analysis/_pipeline_job.apply_job_pick); the prediction's
    # settings are the isolated choice the whole-pipeline runs were made at
    settings = {} if decided else {s.stage: s.to_json() for s in sm.prediction.settings}
    lines, imports = [], set()
    for st in stages:
        name = str(st.name if "name" in st.keys else "?")
        info = types.get(name, {})
        stype = st.type or info.get("type") or "pipe"
        # the stage's name as code where it is a Python name, else a placeholder
        code, comment = (name, "") if name.isidentifier() else ("fn", f"  # stage {name!r}")
        if stype != "pipe":
            lines.append(f"    # .{stype}(...)  stage {name!r}: keep as is")
            continue
        rec = StageSetting.from_json(settings.get(name)) or st.recommended or StageSetting()
        ex, c = rec.executor, rec.concurrency
        if not ex or not c:
            lines.append(f"    .pipe({code}){comment}  # no recommendation: see the stage section")
            continue
        c = int(c)
        mine = user_setting(st)
        if mine:
            comment += f"  # yours: {mine}" if mine != f"{ex} x {c}" else "  # as yours"
        if ex in ("process", "thread"):
            pool = "ProcessPoolExecutor" if ex == "process" else "ThreadPoolExecutor"
            imports.add(pool)
            lines.append(f"    .pipe({code}, concurrency={c}, executor={pool}(max_workers={c})){comment}")
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
                "cheaper": f"# run with your training loop: as fast as yours within 5%, with fewer resources: {x}",
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
            "cheaper": [f"# measured in turns: as fast as yours within 5%, with fewer resources: {x}"],
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


def _num_threads(m: RunMeta, stages: Sequence[StageEntry]) -> tuple[int, str]:
    """``build(num_threads=N)`` for the snippet: the user's own where known, else enough for every stage."""
    mine = num_or_none(m.num_threads)
    if mine:
        return int(mine), "  # as yours"
    recs = [st.recommended for st in stages]
    conc = [int(num_or_none(r.concurrency if r is not None else None) or 1) for r in recs]
    return max([4, *conc]), "  # SPDL's shared pool: at least any stage's concurrency"


def _diff_of_your_call(call: Sequence[Mapping[str, Any]], knobs: Mapping[str, Any], mine: UserKnobs | None) -> str:
    """The user's own DataLoader call with only the loader settings changed, each change marked "was".

    A knob of the user's that does not apply on the measuring host (pin_memory without a CUDA
    device) is kept as they wrote it: dropped, pasting the snippet on their GPU host would change it.
    """
    # the dataset by the name the user's code holds it by, where recorded (its first, positional argument)
    named = next((a["code"] for a in call if a["arg"] == "dataset"), "dataset")
    lines = ["from torch.utils.data import DataLoader", "", "loader = DataLoader(", f"    {named},"]
    for a in call:
        if a["arg"] == "dataset":
            continue
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


def _versus_yours(x: Ratio | None) -> str:
    """A ratio to yours in turns, as the verdicts write it, or what is missing of it."""
    return x.detail("yours") if x is not None else "no ratio in turns recorded"


def loader_snippet(sm: Summary) -> str:
    """The recommended loader setting as code to paste: the user's own DataLoader call with the settings
    changed where it was recorded, else a call of the loader's backend.

    Args: the run's summary. Returns: the snippet, "" where nothing was recommended.
    """
    rec = sm.recommended or {}
    if not rec:
        return ""
    info = sm.loader or LoaderInfo()
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
