"""Ranked, actionable findings: what to change, how much it should help, and why we think so.

Each finding names a stage (or none, for run-wide ones), a severity, a plain
title, a detail with the numbers, and the evidence those numbers came from.
Ranking: severity first (high, medium, low, info), then the expected gain,
so the change that helps most is read first.

Severity rules, so they mean the same thing in every report:

- ``high``: a change with a measured (or bounded) gain of 1.5x or more on
  the stage that limits the pipeline, a GIL bound that makes the pipeline
  much slower than its slowest stage, a stage that could not be measured;
- ``medium``: a smaller gain, a gain on a stage that does not limit the
  pipeline, a busy or noisy machine, a validation run far from the
  prediction;
- ``low``: noise and fit quality that lower confidence without changing a
  recommendation;
- ``info``: context (what could not be isolated, what is only bounded).

The same engine serves loader sweeps: it reads only stage entries of the
shape :func:`stagebench.analysis._stage.analyze_stage` returns.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from stagebench._numbers import SourceItems, finite, fmt_q, num
from stagebench.analysis._job import job_findings
from stagebench.model._finding import SEVERITIES, Finding
from stagebench.model._job import JobVerdict
from stagebench.model._meta import PageFault
from stagebench.model._pipeline import Prediction, VersusYours, WholeRun
from stagebench.model._stage import StageEntry, StageSetting

__all__ = ["build_findings"]


_WORTH = 1.2  # an estimated gain below this is within the noise of the measurements: no finding


@dataclass(frozen=True, slots=True)
class _Found:
    """A finding and what fixing it could give (``gain``, for ranking only)."""

    finding: Finding
    gain: float = 1.0


def _f(severity: str, title: str, detail: str, stage: str | None, evidence: dict, gain: float = 1.0) -> _Found:
    return _Found(Finding(severity, title, detail, stage, evidence), gain)


def _rate(point: StageSetting, src: SourceItems) -> str:
    """``1,234 items/s`` (source items, ``src``), or why there is none (a setting the job runs chose that the
    sweep did not measure)."""
    return f"{src.q(num(point.qps))} items/s" if finite(point.qps) else "not measured alone at this setting"


def _far_from_binding(e: StageEntry, prediction: Prediction | None) -> bool:
    """The stage alone delivers at least twice what the pipeline is predicted to: fixing it changes little.

    At its own best setting: the pipeline's setting of it may be just enough to keep up.
    """
    pred = None if prediction is None else prediction.qps
    rec = e.recommended_alone or e.recommended
    if pred is None or not finite(pred) or rec is None or not finite(rec.qps):
        return False
    return num(rec.qps) * e.items_per_input >= 2 * pred


def _demote(found: _Found) -> _Found:
    f = found.finding
    return dataclasses.replace(
        found,
        finding=dataclasses.replace(
            f,
            severity={"high": "medium", "medium": "low"}.get(f.severity, f.severity),
            detail=f.detail
            + "; it is far from limiting the pipeline (it alone delivers at least twice the prediction)",
        ),
    )


@dataclass(frozen=True)
class _Stage:
    """What a measured stage's findings read: the stage entry and where it stands in the pipeline."""

    st: StageEntry
    name: str
    cls: str
    #: the pipeline's setting of the stage (or the job's pick)
    rec: StageSetting
    #: the stage's own best alone: the ceiling and the curve's top were measured there
    alone: StageSetting
    is_bn: bool
    #: it alone delivers at least twice the pipeline's prediction, and it is not the bottleneck
    far: bool
    #: SPDL's grouping steps, not the user's code (one far from binding gets no finding: nothing to change there)
    own_step: bool
    limit: str | None
    cores: float
    #: where a quota or an allocation sets the cores, in words (empty: the affinity mask does)
    cores_bound: str = ""

    @property
    def src(self) -> SourceItems:
        """The unit of the findings' rates and times: source items, as the report's (per call x or / k)."""
        return SourceItems(self.st.items_per_input)


def _stage_findings(
    e: StageEntry,
    bottleneck: str | None,
    cores: float,
    prediction: Prediction | None = None,
    page_fault: PageFault | None = None,
    cores_bound: str = "",
) -> list[_Found]:
    """One stage's findings, unranked (:func:`build_findings` ranks them with the run's)."""
    if e.status != "ok":
        return [_unmeasured(e)]
    name = e.name
    rec = e.recommended
    assert rec is not None and e.classification is not None  # a measured stage has both (analyze_stage)
    is_bn = name == bottleneck
    c = _Stage(
        st=e,
        name=name,
        cls=e.classification,
        rec=rec,
        alone=e.recommended_alone or e.recommended_isolated or rec,
        is_bn=is_bn,
        far=_far_from_binding(e, prediction) and not is_bn,
        own_step=e.type in ("aggregate", "disaggregate"),
        limit=e.limit.kind if e.limit is not None else None,
        cores=cores,
        cores_bound=cores_bound,
    )
    # No per-stage "change your setting" finding: a stage's setting is advice only as part of the
    # pipeline's, checked against the user's own by running both (_yours_finding).
    found = [
        _gil_finding(c),
        _harness_ceiling_finding(c),
        _overhead_finding(c),
        _ipc_finding(c),
        _io_finding(c),
        _cores_finding(c),
        _gil_bounded_finding(c),
        _page_fault_finding(e, page_fault, is_bn),
        _gc_finding(e, is_bn),
    ]
    return [x for x in found if x is not None] + [
        _f("low", f"{name}: some points did not measure", p, name, {"problem": p}) for p in e.problems
    ]


def _unmeasured(e: StageEntry) -> _Found:
    """A stage that could not be measured, and why."""
    return _f(
        "high",
        f"{e.name} could not be measured",
        f"{e.status}: {e.reason}",
        e.name,
        {"status": e.status, "reason": e.reason, "problems": list(e.problems)},
    )


def _gil_finding(c: _Stage) -> _Found | None:
    """A stage that holds the GIL: processes against threads, measured or bounded."""
    st = c.st
    f = st.gil_fraction
    if not (c.cls == "gil-bound" or (f is not None and f >= 0.5 and st.gil is not None and st.gil.saturated)):
        return None
    thr = st.alternative("thread") or st.alternative("async")
    proc = st.alternative("process")
    ev = {
        "gil_fraction": f,
        "gil_fraction_interval": list(st.gil_fraction_interval) if st.gil_fraction_interval is not None else None,
        "thread_best": thr.to_json() if thr is not None else None,
        "process_best": proc.to_json() if proc is not None else None,
    }
    if proc and thr:
        return _processes_measured(c, _versus(st, thr, proc, ev), ev)
    return _processes_bounded(c, ev)


@dataclass(frozen=True)
class _Versus:
    """Processes against threads: the two best points and how far apart they are."""

    thr: StageSetting
    proc: StageSetting
    gain: float
    #: processes faster beyond the noise of the two
    beyond: bool
    #: how the two were compared, in the finding's words
    how: str


def _versus(st: StageEntry, thr: StageSetting, proc: StageSetting, ev: dict) -> _Versus:
    """Processes against threads: in turns where that was decisive, else from the two curves' best points.

    Measured in turns, at the same moments of the machine, the comparison outranks the curves'; it
    joins the evidence ``ev``.
    """
    h2h = st.head_to_head
    if h2h is not None and h2h.decisive:
        assert h2h.thread is not None and h2h.process is not None and h2h.ratio is not None  # decisive: measured
        ev["head_to_head"] = h2h.to_json()
        return _Versus(
            thr=dataclasses.replace(thr, concurrency=h2h.thread.concurrency, qps=h2h.thread.qps),
            proc=dataclasses.replace(proc, concurrency=h2h.process.concurrency, qps=h2h.process.qps),
            gain=h2h.ratio,
            beyond=bool(h2h.processes_win),
            how="measured in turns with threads",
        )
    beyond = proc.qps_low is not None and thr.qps_high is not None and proc.qps_low > thr.qps_high
    return _Versus(thr=thr, proc=proc, gain=num(proc.qps) / num(thr.qps), beyond=beyond, how="measured")


def _processes_measured(c: _Stage, v: _Versus, ev: dict) -> _Found:
    """The GIL finding where both executors were measured: use processes, or why not."""
    name, f, src = c.name, num(c.st.gil_fraction), c.src
    thr, proc, gain, how = v.thr, v.proc, v.gain, v.how
    if gain > 1 and v.beyond and c.rec.executor != "process":
        # faster alone, yet the pipeline's settings (chosen together) keep it on threads
        return _f(
            "info",
            f"{name} is faster on processes alone, but the pipeline does not need them",
            f"{src.q(num(proc.qps))} items/s at {proc.concurrency} processes against "
            f"{src.q(num(thr.qps))} on threads ({how}); {c.rec.why or ''}",
            name,
            ev,
        )
    if gain > 1 and v.beyond:
        sev = "high" if (gain >= 1.5 or c.is_bn) else "medium"
        return _f(
            sev,
            f"{name} holds the GIL {f:.0%} of its time: use a process executor",
            f"expected {gain:.1f}x: {src.q(num(thr.qps))} items/s on threads -> {src.q(num(proc.qps))} "
            f"at {proc.concurrency} processes ({how})",
            name,
            ev,
            gain,
        )
    if gain > 1:
        # ahead, but within the noise of the two curves: saying "did not help" would contradict the numbers
        return _f(
            "medium",
            f"{name} holds the GIL {f:.0%} of its time; processes were not clearly faster",
            f"processes reached {src.q(num(proc.qps))} items/s vs {src.q(num(thr.qps))} on threads "
            f"({how}), within the noise of these measurements, so threads are kept (less memory, "
            "no IPC); longer windows (STAGEBENCH_BUDGET_S) would tell them apart. Less Python per "
            "item (vectorise, move work into C code that releases the GIL) helps either way",
            name,
            ev,
        )
    return _f(
        "medium",
        f"{name} holds the GIL {f:.0%} of its time, but processes did not help",
        f"processes reached {src.q(num(proc.qps))} items/s vs {src.q(num(thr.qps))} on threads "
        f"({how}): "
        "moving items between processes, or cores taken by other load, cancels the gain; "
        "less Python per item (vectorise, move work into C code that releases the GIL) "
        "is the way out",
        name,
        ev,
    )


def _processes_bounded(c: _Stage, ev: dict) -> _Found | None:
    """The GIL finding where processes were not measured: the gain they could give, bounded.

    Threads cap at 1/g, processes at cores/cpu: the gain is cores * g / cpu at most.
    """
    st, cores, name = c.st, c.cores, c.name
    f = num(st.gil_fraction)
    g, cpu = st.gil_s_per_item, st.cpu_s_per_item
    est = (
        cores * g / cpu if g is not None and cpu is not None and finite(g) and finite(cpu) and cpu > 0 else float(cores)
    )
    est = min(float(cores), max(1.0, est))
    if not est >= _WORTH:  # a gain within the noise is not a finding
        return None
    return _f(
        "high" if c.is_bn else "medium",
        f"{name} holds the GIL {f:.0%} of its time: try a process executor",
        f"processes were not measured for this stage (quick mode, or STAGEBENCH_EXECUTORS "
        f"without process); the GIL and core shares bound the gain at about {est:.1f}x on "
        f"{cores} cores if its inputs and outputs are cheap to move: a bound, not a measurement",
        name,
        ev,
        est,
    )


def _harness_ceiling_finding(c: _Stage) -> _Found | None:
    """Its own work is larger than the harness's per item, but at its best it reaches the harness's ceiling."""
    if not (c.limit == "harness" and c.cls != "overhead-bound" and not (c.own_step and c.far)):
        return None
    name, cls, alone = c.name, c.cls, c.alone
    cap = num(c.st.ceiling_qps)
    at = f"{alone.executor} x {alone.concurrency}"
    near = f", near the {c.src.q(cap)} items/s the harness can schedule there" if finite(cap) else ""
    found = _f(
        "high" if c.is_bn else "medium",
        f"{name} reaches the harness's per-item ceiling at {at}",
        f"it {'waits' if cls == 'io-bound' else 'computes'} ({cls}), and at {at} it delivers {_rate(alone, c.src)}"
        f"{near}: more concurrency cannot lift it past that; fewer, larger items (batches) can",
        name,
        {"qps": alone.qps, "ceiling_qps": cap, "classification": cls},
        1.2,
    )
    return _demote(found) if c.far else found


def _overhead_shown(c: _Stage) -> bool:
    """Whether the overhead-bound finding applies (not to SPDL's own step far from binding)."""
    return c.cls == "overhead-bound" and not (c.own_step and c.far)


def _overhead_finding(c: _Stage) -> _Found | None:
    """Overhead-bound: the stage's call is shorter than the harness's cost per item; batch its work.

    The verdict rests on a measured ceiling (``ceiling_qps``; without one this raises), measured at the
    stage's own best setting, which the pipeline's choice may not be: the finding reads that setting.
    """
    if not _overhead_shown(c):
        return None
    name, st = c.name, c.st
    ceil, rec = st.ceiling_qps, c.alone
    near = f"it reaches {c.src.q(num(rec.qps))} items/s, near the no-op ceiling of {c.src.q(ceil)} items/s"
    if c.own_step:
        title = f"{name} is overhead-bound: fewer, larger items must reach it"
        detail = (
            f"{near}: SPDL schedules every item through this grouping step one at a time. Its own work "
            "cannot be batched; have the stage before it return lists of items (so fewer items reach "
            "it), or group the items earlier in the pipeline"
        )
    else:
        title = f"{name} is overhead-bound: batch its work"
        detail = (
            f"{near} at {rec.executor} x {rec.concurrency}: the harness cannot schedule items "
            "faster. Handing it batches of k items per call raises that ceiling about k-fold, in items; "
            "what the pipeline then delivers was not run, so no figure is given"
        )
    found = _f(
        "high" if c.is_bn else "medium",
        title,
        detail,
        name,
        {"qps": rec.qps, "ceiling_qps": ceil, "stage_s_per_item": st.stage_s_per_item},
        1.5,
    )
    return _demote(found) if c.far else found


def _ipc_finding(c: _Stage) -> _Found | None:
    """On processes, limited by moving data between them."""
    # where the overhead-bound finding applies, the setting read is the one it reads: the stage's own best alone
    rec = c.alone if _overhead_shown(c) else c.rec
    if not ((c.cls == "ipc-bound" or c.limit == "ipc") and rec.executor == "process"):
        return None
    name, st = c.name, c.st
    payload = st.payload_bytes
    size = f" ({payload / 1024:,.0f} KiB pickled per input item)" if payload is not None and finite(payload) else ""
    return _f(
        "high" if c.is_bn else "medium",
        f"{name} is limited by moving data between processes",
        f"on processes it is capped by inter-process transfer{size}: return smaller outputs "
        "(decode to uint8, crop early), pass file paths instead of bytes, or use shared memory",
        name,
        {"payload_bytes": payload, "recommended": rec.to_json(), "ceiling_qps": st.ceiling_qps},
        1.3,
    )


def _io_finding(c: _Stage) -> _Found | None:
    """A stage that waits: raise its concurrency while it still scales, else say the setting covers it.

    The stage's own best alone is the curve's top; the pipeline's setting may be lower (it keeps up).
    """
    if not (c.cls == "io-bound" and c.limit != "harness"):
        return None
    name, rec, alone = c.name, c.rec, c.alone
    if "still rising" in (alone.why or ""):
        finding = _f(
            "high" if c.is_bn else "medium",
            f"{name} waits: raise its concurrency",
            f"it was still scaling at concurrency {alone.concurrency} ({c.src.q(num(alone.qps))} items/s), the "
            "largest level measured; measure higher levels to find where it stops",
            name,
            {"recommended": rec.to_json(), "recommended_alone": alone.to_json()},
            1.5,
        )
        return _demote(finding) if c.far else finding
    return _f(
        "info",
        f"{name} waits (io-bound)",
        f"concurrency {rec.concurrency} ({rec.executor}) covers the waiting: {_rate(rec, c.src)}",
        name,
        {"recommended": rec.to_json()},
    )


def _cores_finding(c: _Stage) -> _Found | None:
    """A CPU-bound stage limited by the cores: more concurrency will not help."""
    if not (c.cls == "cpu-bound" and c.limit == "cores"):
        return None
    name, rec = c.name, c.rec
    cpu = c.st.cpu_s_per_item
    # a quota's or an allocation's cores are named: more of them is a setting, not a new host
    return _f(
        "info" if not c.is_bn else "medium",
        f"{name} is limited by the cores" + (f": {c.cores_bound}" if c.cores_bound else ""),
        f"{_rate(rec, c.src)} at {rec.executor} x {rec.concurrency}"
        + (f", {c.src.ms(cpu)} CPU per item" if cpu is not None and finite(cpu) else "")
        + (": a larger CPU limit" if c.cores_bound else ": more cores")
        + " or less work per item; more concurrency will not help",
        name,
        {"recommended": rec.to_json(), "cpu_s_per_item": cpu},
    )


def _gil_bounded_finding(c: _Stage) -> _Found | None:
    """A GIL share that the measurements only bound: the prediction uses the middle of the range."""
    st, name = c.st, c.name
    f = st.gil_fraction
    if not (f is not None and not (st.gil.pinned if st.gil is not None else True)):
        return None
    assert st.gil_fraction_interval is not None  # a GIL share comes with its interval (analyze_stage)
    lo, hi = st.gil_fraction_interval
    return _f(
        "info",
        f"{name}: GIL share only bounded ({lo:.2f}-{hi:.2f})",
        "its threads used the cores before any GIL cap showed; more cores would pin the share down. "
        "The pipeline prediction uses the middle of the range",
        name,
        {"gil_fraction": f, "gil_fraction_interval": list(st.gil_fraction_interval)},
    )


_FAULTS_MIN = 256  # minor faults per call: 1 MiB of fresh 4 KiB pages
_FAULTS_SHARE = 0.2  # ... and at least this share of the stage's CPU per call, at this machine's cost per fault
_MALLOC_ENV = "MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=268435456"


def _page_fault_finding(st: StageEntry, page_fault: PageFault | None, is_bn: bool) -> _Found | None:
    """A stage that touches megabytes of fresh memory per item, and pays for it in CPU.

    Why this matters for a data loader: glibc's malloc serves blocks of 128 KiB
    and more (a batch, a float copy of an image) with a fresh mapping, or from
    a heap it trims back to the OS once enough is free at its top, and the
    kernel then maps and zeroes every page again on the next call. The
    thresholds move with what the process freed before, so the same stage
    costs different amounts in different processes (raising both thresholds,
    the environment variables below, removes the cost). This diagnosis's own
    process may be in either state, so the finding names the executor whose
    points showed it.
    """
    cost = None if page_fault is None else page_fault.cost_s
    pf = {ex: d for ex, d in st.page_faults.items() if finite(d.per_item)}
    if not pf or cost is None or not finite(cost):
        return None
    ex, worst = max(pf.items(), key=lambda kv: num(kv[1].per_item))
    n, cpu = num(worst.per_item), num(worst.cpu_s_per_item)
    if n < _FAULTS_MIN or not finite(cpu) or cpu <= 0 or n * cost < _FAULTS_SHARE * cpu:
        return None
    name = st.name
    mib = n * float(page_fault.page_bytes if page_fault is not None else 4096) / 2**20
    share = n * cost / cpu
    part = "most" if share >= 0.5 else f"about {share:.0%}"
    # per call: a point's items are the stage's own inputs (a batch, after an aggregate)
    detail = (
        f"{n:,.0f} minor page faults per call on {ex} ({mib:.1f} MiB of pages the kernel maps and zeroes "
        f"for each call); at the {cost * 1e6:.1f} µs one fault took on this machine, that is {part} of its "
        f"{cpu * 1e3:.3g} ms of CPU per call. The usual cause is glibc's malloc handing large temporaries "
        "(arrays and tensors of 128 KiB and more) back to the OS after each call and taking them again on the "
        f"next. Setting {_MALLOC_ENV} in the training job's environment keeps them, as does preloading "
        "jemalloc or tcmalloc; memory then stays with the process instead of going back to the OS"
    )
    calm = {e: num(d.per_item) for e, d in pf.items() if e != ex and num(d.per_item) < n / 10}
    if calm:
        e, m = next(iter(calm.items()))
        detail += (
            f". Its {e} points took {m:,.0f} per call: whether a process pays this depends on what it freed "
            f"before, so the stage may cost more in your training process than those points say"
        )
    return _f(
        "medium" if is_bn else "low",
        f"{name} spends CPU on fresh memory: {n:,.0f} page faults per call",
        detail,
        name,
        {"page_faults": {e: d.to_json() for e, d in pf.items()}, "fault_cost_s": cost},
    )


_GC_SHARE = 0.1  # the collector's time per item, as a share of the stage's CPU per item, worth a finding


#: Full collections' share of the collector's time above which they, not the young ones, are the cause
_GC_FULL_MOSTLY = 0.5


def _gc_finding(st: StageEntry, is_bn: bool) -> _Found | None:
    """A stage whose allocations make the cyclic garbage collector run a good share of its time.

    Why it is worth saying: a full collection walks every object the process
    holds, with the GIL held, so what a loader stage pays grows with the
    training process around it (torch, the model, the dataset's index), and
    ``gc.freeze()`` after set-up takes those objects out of its walk. Which
    collections the time went to says which remedy applies: full ones (the
    process's size: ``gc.freeze()``), or young ones (the stage's own containers
    per item: ``gc.freeze()`` leaves them). Rows without the split (written
    before it was measured) say both.
    """
    alt = st.alternative("thread") or st.alternative("async") or StageSetting()
    gc_s, cpu = alt.gc_s_per_item, alt.cpu_s_per_item
    if gc_s is None or cpu is None or not finite(gc_s) or not finite(cpu) or cpu <= 0 or gc_s < _GC_SHARE * cpu:
        return None
    name, share, src = st.name, gc_s / cpu, SourceItems(st.items_per_input)
    executor = alt.executor if "executor" in alt.keys else "thread"
    collected, on_cpu = src.ms_each(gc_s, cpu)
    full = alt.gc_full_s_per_item
    full_share = min(1.0, full / gc_s) if full is not None and finite(full) and gc_s > 0 else None
    cause = "the stage leaves container objects (lists, dicts, objects) behind often enough to trigger collections"
    freeze = (
        "Calling gc.freeze() once the model and data are set up (before the training loop) takes what exists "
        "then out of every later collection"
    )
    fewer = "fewer Python containers per item (arrays instead of lists of lists) removes the cause"
    if full_share is None:
        why = (
            f"{cause}, and a full collection walks every object the process holds, so it costs more in a "
            f"bigger process. {freeze}; {fewer}"
        )
    elif full_share >= _GC_FULL_MOSTLY:
        why = (
            f"{cause}; {full_share:.0%} of it went to full collections, each of which walks every object the "
            f"process holds, so it grows with the process around the stage (torch, the model, the dataset's "
            f"index). {freeze}; {fewer}"
        )
    else:
        why = (
            f"{cause}; {1 - full_share:.0%} of it went to young collections, which walk only what is new: the "
            f"stage's own containers per item are the cost, so {fewer}; gc.freeze() would save only the "
            f"{full_share:.0%} in full collections"
        )
    detail = (
        f"the garbage collector ran {collected} per item during its {executor} "
        f"points, {share:.0%} of its {on_cpu} of CPU per item, holding the GIL: {why}"
    )
    gain = 1.0 + share  # for ranking only: what removing it gains depends on what the collector then still does
    evidence = {"gc_s_per_item": gc_s, "cpu_s_per_item": cpu, "executor": alt.executor}
    if full_share is not None:
        evidence["gc_full_s_per_item"] = full
    return _f(
        "medium" if is_bn else "low",
        f"{name} spends {share:.0%} of its CPU in garbage collection",
        detail,
        name,
        evidence,
        gain,
    )


def _yours_finding(v: VersusYours) -> _Found:
    """The one piece of advice on settings: what running the recommended and the user's settings found."""
    changes = "; ".join(f"{c['stage']}: {c['yours']} -> {c['recommended']}" for c in v.changes)
    verdict = v.verdict
    if verdict == "recommended":
        ratio = float(v.ratio or 1.0)
        return _f(
            "high" if ratio >= 1.2 else "medium",
            f"change your settings: the recommended ones were {ratio:.2f}x faster, measured",
            f"{v.text}. The changes: {changes}",
            None,
            {"yours": v},
            ratio,
        )
    if verdict == "cheaper":
        return _f(
            "low",
            "fewer workers run as fast as yours, measured in turns",
            f"{v.text}. The changes: {changes}",
            None,
            {"yours": v},
        )
    title = {
        "could not tell": "keep your settings: the runs could not tell the recommended ones from them",
        "yours": "your settings beat the recommended ones: keep them",
    }.get(verdict or "", "the recommended settings were not checked against yours")
    return _f(
        "info",
        title,
        f"{v.text}" + (f". The untaken changes: {changes}" if changes else ""),
        None,
        {"yours": v},
    )


def build_findings(
    stages: Sequence[StageEntry],
    *,
    prediction: Prediction | None,
    validation: WholeRun | None,
    warnings: list[str],
    not_isolated: list[dict],
    cores: float,
    page_fault: PageFault | None = None,
    yours: VersusYours | None = None,
    job: JobVerdict | None = None,
    cores_bound: str = "",
) -> list[Finding]:
    """All findings for a run, most important first (see the module docstring for the ranking).

    ``page_fault``: what a page fault costs on this machine (``run.json``), for
    the finding on stages that fault in fresh memory per item. ``yours``: the
    recommended settings against the user's own
    (:func:`stagebench.analysis._verdicts.yours_verdict`); ``job``: the training job run with
    the user's loop (:func:`stagebench.analysis._job.decide_job`), which replaces it where decided.
    ``cores_bound``: where a quota or an allocation set ``cores``, in words, for the findings on the cores.
    """
    bottleneck = None if prediction is None else prediction.bottleneck
    out: list[_Found] = []
    for st in stages:
        out.extend(_stage_findings(st, bottleneck, cores, prediction, page_fault, cores_bound))
    out += _settings_findings(yours, job)
    out += [x for x in (_binding_finding(prediction), _validation_finding(validation, prediction)) if x is not None]
    out += [_warning_finding(w) for w in warnings]
    out += [_not_isolated_finding(ni) for ni in not_isolated]
    return _ranked(out)


def _settings_findings(yours: VersusYours | None, jv: JobVerdict | None) -> list[_Found]:
    """The advice on settings: the training job's run with the user's loop where decided, else the
    recommended settings run against the user's own (none where they are the same)."""
    if jv is not None and jv.decided:
        return [_Found(f) for f in job_findings(jv)]
    if yours is not None and yours.verdict not in (None, "same"):
        return [_yours_finding(yours)]
    return []


def _binding_finding(prediction: Prediction | None) -> _Found | None:
    """The GIL or the cores, shared by the stages, make the pipeline slower than its slowest stage alone."""
    p = prediction or Prediction()
    if not (prediction and finite(p.qps)):
        return None
    naive, pred = p.naive_qps, num(p.qps)
    if not (p.binding in ("gil", "cores") and naive and pred < 0.9 * naive):
        return None
    what = "GIL" if p.binding == "gil" else "cores"
    sev = "high" if pred < 0.75 * naive else "medium"
    return _f(
        sev,
        f"the {what} shared by the stages binds the pipeline",
        f"predicted {fmt_q(pred)} items/s together, although the slowest stage alone reaches "
        f"{fmt_q(naive)}. {p.explanation}",
        p.bottleneck,
        {"bounds": p.bounds, "naive_qps": naive, "lift": p.lift},
        naive / pred,
    )


def _validation_finding(validation: WholeRun | None, prediction: Prediction | None) -> _Found | None:
    """The whole-pipeline run against the prediction: confirmed, or how far off and where they part.

    An error against the prediction exists only where there is a prediction (_pipeline._validation).
    """
    v, p = validation or WholeRun(), prediction or Prediction()
    if not (validation and finite(v.error_vs_prediction)):
        return None
    err = num(v.error_vs_prediction)
    seen = _interference_seen(v)
    measured = f"measured {fmt_q(num(v.qps))} items/s"
    if finite(v.qps_with_replay):
        measured += f" ({fmt_q(num(v.qps_with_replay))} in the round the replay took part in, read against it)"
    # the prediction's error in words: a bare "+8%" beside the report's "-7% vs predicted" (the measured
    # over the predicted) read as the opposite
    off = "within 1%" if abs(err) < 0.005 else f"{abs(err):.0%} {'high' if err > 0 else 'low'}"
    versus = f"{measured} vs predicted {fmt_q(num(p.qps))}: the prediction {off}"
    if abs(err) > 0.15:
        return _f(
            "medium",
            "the whole-pipeline run differs from the prediction",
            f"{versus}: "
            + ("the prediction leaves out SPDL's own per-item scheduling (direct harness only); " if p.caveat else "")
            + "stages interfere in ways the bounds do not capture (the GIL held by one stage "
            "while another waits for it, cores taken by GIL-free work, other load)"
            + seen
            + "; trust the measured number",
            None,
            {"validation": validation},
        )
    return _f(
        "info",
        "the whole-pipeline run confirms the prediction",
        versus,
        None,
        {"validation": validation},
    )


def _interference_seen(validation: WholeRun) -> str:
    """Where the stages slowed inside the pipeline: their calls against alone, and against the replay
    (a stage's calls inside the pipeline against its stand-in's inside the replay; they took turns, so
    the machine was the same)."""
    slower = sorted(
        (x for x in validation.interference if finite(x.ratio) and num(x.ratio) >= 1.3),
        key=lambda x: -num(x.ratio),
    )
    apart = sorted(
        (
            x
            for x in validation.interference
            if finite(x.vs_replay) and max(num(x.vs_replay), 1 / num(x.vs_replay)) >= 1.2
        ),
        key=lambda x: -max(num(x.vs_replay), 1 / num(x.vs_replay)),
    )
    seen = ""
    if slower:
        seen += "; in the pipeline " + ", ".join(
            f"{x.stage} took {x.ratio:.1f}x as long per call as alone ({x.in_pipeline_p50_ms:.3g} vs "
            f"{x.alone_p50_ms:.3g} ms median)"
            for x in slower[:3]
        )
    if apart:
        seen += "; against the replay, " + ", ".join(
            f"{x.stage}'s calls took {x.in_pipeline_p50_ms:.3g} ms in the pipeline and its stand-in's "
            f"{x.replay_p50_ms:.3g} ms in the replay ({x.vs_replay:.1f}x)"
            for x in apart[:3]
        )
    return seen


def _warning_finding(w: str) -> _Found:
    """A run's warning as a finding: a busy machine, noisy measurements, SPDL's scheduling left out, a weak fit."""
    busy = "busy" in w or "other load" in w
    noisy = "noisy" in w or "wider than" in w
    if busy or noisy:
        return _f(
            "medium" if busy else "low",
            "the machine was busy: numbers are low and uncertain" if busy else "noisy measurements",
            w
            + (
                ". Verdicts that rest on small differences (threads vs processes within noise, "
                "the 5% rule) are less certain; re-run on a quiet machine to confirm"
                if noisy
                else ""
            ),
            None,
            {"warning": w},
        )
    if "measured without SPDL" in w:
        return _f(
            "medium",
            "the prediction is optimistic: SPDL's own scheduling is not counted",
            w,
            None,
            {"warning": w},
        )
    if "poor fit" in w or "indicative only" in w:
        return _f("low", "curve fit is weak", w, None, {"warning": w})
    return _f("low", "warning", w, None, {"warning": w})


def _not_isolated_finding(ni: dict) -> _Found:
    """A stage that was not measured alone, and why."""
    return _f(
        "info",
        f"{ni.get('name', '?')} was not measured alone",
        str(ni.get("reason", "")),
        ni.get("name"),
        {"not_isolated": ni},
    )


def _ranked(out: list[_Found]) -> list[Finding]:
    """By severity, then the expected gain."""
    rank = {s: i for i, s in enumerate(SEVERITIES)}
    return [x.finding for x in sorted(out, key=lambda x: (rank[x.finding.severity], -x.gain))]
