"""The loader alone's pick: the rule over the settings it hinges on, in words, and the knobs a window cannot judge.

The recommendation is the cheapest setting (fewest workers, then the smallest prefetch) within a few
percent of the best throughput and inside the memory budget, because every worker costs memory and
cores that the trainer could use, and a difference within the measurement's noise buys nothing.
Readings measured apart decide nothing: the rule of :mod:`stagebench.model._evidence` reads the
windows in turns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from stagebench._numbers import finite, num
from stagebench._settings import DEMAND_HEADROOM, LOADER_TIE_ROUNDS
from stagebench.analysis._loader_evidence import paired_ratio, paired_rounds
from stagebench.analysis._loader_rows import (
    _cheapest_first,
    _knob_text,
    _mine,
    _over_budget,
    _raw,
    _rows,
    _same_knobs_but,
    _stall_gain,
    near_fastest,
)
from stagebench.model._evidence import Decision, Option, decide, more_rounds_text
from stagebench.model._loader import LoaderRow
from stagebench.model._meta import RunMeta, UserKnobs
from stagebench.runs._knobs import NOT_APPLICABLE

__all__ = ["recommend", "loader_decision", "turns_to_run"]

#: "Workers restart at every epoch": the stall is over this share of an epoch (or, with the epoch's length
#: unknown, persistent workers were measured to save more than half of it and over 0.1 s); high over STALL_HIGH.
STALL_SHARE = 0.05


STALL_HIGH = 0.20


#: Why num_workers=0 is not advised for a training job without a job run that says so (T4 of the
#: DataLoader-knob guide: the main process then loads serially, between the steps).
SERIAL_WORDS = (
    "without workers the main process loads each batch between your training steps, so loading adds to "
    "every step; only a run with your loop can show what that costs (STAGEBENCH_TRAINER=measure)"
)


def recommend(
    rows: Any,
    *,
    budget_mb: float | None,
    within_best: float = 0.05,
    target_rate: float | None = None,
    headroom: float = DEMAND_HEADROOM,
    user: LoaderRow | None = None,
    serial_ok: bool = True,
    max_workers: int | None = None,
    max_rounds: int = LOADER_TIE_ROUNDS,
) -> LoaderRow | None:
    """The recommended row (with a ``why`` and the rule's ``decision``), or None when nothing was measured ok.

    Without a target: the rule of :mod:`stagebench.model._evidence` over the settings the pick hinges
    on (yours, the fastest, the settings whose readings come near it (:func:`_near`), and any measured
    in turns): a setting other than yours only where the windows in turns show it faster beyond noise,
    or cheaper and within ``within_best``; without a setting of yours, the cheapest shown within
    ``within_best`` of the fastest, else the fastest. Readings measured apart, even within 5% or inside
    each other's intervals, decide nothing. Inside the memory budget where any setting fits. With a
    target: the cheapest that delivers target x (1 + headroom); when none does, the same as without.
    ``serial_ok=False`` (a trainer is waiting on this loader, and no job run has said otherwise): a
    setting with workers is preferred over ``num_workers=0``, whose loading adds to every training step
    (a loader alone cannot show that). ``max_workers``: the most workers a cgroup's memory limit holds over
    an epoch (:func:`_memory_cap`): a setting with more is never advised where one with fewer was measured.
    ``max_rounds``: the sweep's ``tie_rounds``, which its intervals' level is fitted to.
    """
    pts = _rows(rows)
    ok = [p for p in pts if p.ok]
    if not ok:
        return None
    fits = [p for p in ok if not _over_budget(p, budget_mb, max_workers)]
    pool = fits or ok
    budget_note = "" if fits else "; no setting fits the memory budget: the least memory-hungry near the best"
    if target_rate is not None:
        need = target_rate * (1 + headroom)
        meeting = [p for p in pool if p.samples_per_s >= need]
        serial_note = ""
        if not serial_ok and any(p.num_workers > 0 for p in meeting) and any(p.num_workers == 0 for p in meeting):
            meeting = [p for p in meeting if p.num_workers > 0]
            serial_note = f"; num_workers=0 left out: {SERIAL_WORDS}"
        if meeting:
            # the cheapest; persistent_workers and pin_memory are set afterwards, one rule each (_kept_knobs)
            return replace(
                min(meeting, key=_cheapest_first),
                why=f"cheapest setting that delivers the target {target_rate:,.1f} samples/s with "
                f"{headroom:.0%} headroom ({need:,.1f}){serial_note}",
            )
    d, by_key = loader_decision(rows, pool, within_best=within_best, user=user, max_rounds=max_rounds)
    assert d.pick is not None  # pool holds measured points
    why = _decision_words(d, by_key, within_best, _turn_seconds(_raw(rows))) + budget_note
    if budget_mb is not None and fits:
        why += f"; inside the memory budget ({budget_mb:,.0f} MB)"
    if max_workers is not None and fits and any(p.num_workers > max_workers for p in ok):
        why += f"; at most {max_workers} workers fit the container's memory limit over an epoch"
    return replace(by_key[d.pick], why=why, decision=d)


def _near(pool: list[LoaderRow]) -> list[LoaderRow]:
    """Settings whose readings come within :data:`CANNOT_MATTER` of the fastest, or overlap it, cheapest
    first: those a comparison in turns could show as good, or as the fastest. Readings seconds apart
    show nothing closer: the host's phases move two windows of one setting by more than the margin."""
    top = max(pool, key=lambda p: p.samples_per_s)
    return sorted((p for p in pool if near_fastest(p, top)), key=_cheapest_first)


def loader_decision(
    rows: Any, pool: list[LoaderRow], *, within_best: float, user: LoaderRow | None, max_rounds: int = LOADER_TIE_ROUNDS
) -> tuple[Decision, dict[str, LoaderRow]]:
    """The rule over the loader settings the pick hinges on: (:class:`~stagebench.model._evidence.Decision`,
    the points by the decision's keys).

    Considered: yours (where measured), the fastest, every setting measured in turns, and the
    cheapest setting near the fastest (:func:`_near`) that the turns have not ruled out; once none
    cheaper than the pick is left, the cheapest costlier near setting the pick has not been compared
    with (the rule keeps it open until the rounds give their ratio an interval).
    """
    raw = _raw(rows)
    rounds = paired_rounds(raw)
    in_turns = {k for r in rounds for k in r}
    top = max(pool, key=lambda p: p.samples_per_s)
    mine = _mine(pool, user)

    considered: dict[str, LoaderRow] = {}
    for p in [mine, top] + [q for q in pool if q.knobs in in_turns]:
        if p is not None:
            considered.setdefault(_knob_text(p), p)
    near = _near(pool)

    def ratio(a: str, b: str) -> Any:
        return paired_ratio(rounds, by_key[a].knobs, by_key[b].knobs, max_rounds=max_rounds)

    while True:
        by_key = dict(considered)
        options = [Option(k, _cheapest_first(p), p.rate, in_step=p.knobs.num_workers == 0) for k, p in by_key.items()]
        options.sort(key=lambda o: o.cost)
        d = decide(options, yours=_knob_text(mine) if mine else None, ratio=ratio, margin=1 - within_best)
        # the cheapest near setting the turns have not ruled out joins: what the next turns would measure
        for p in near:
            k = _knob_text(p)
            if k in d.open:
                return d, by_key
            if k not in by_key:
                considered[k] = p
                break
        else:
            return d, by_key


def _turn_seconds(pts: list[LoaderRow]) -> tuple[float, float] | None:
    """(seconds the windows in turns took, seconds a round took on average), from the ``paired`` rows; None
    without any."""
    by_turn: dict[float, float] = {}
    for p in pts:
        if p.search_phase == "paired" and finite(p.elapsed_s):
            by_turn[p.turn] = by_turn.get(p.turn, 0.0) + float(p.elapsed_s)
    if not by_turn:
        return None
    spent = sum(by_turn.values())
    return spent, spent / len(by_turn)


def _decision_words(
    d: Any, by_key: dict[str, LoaderRow], within_best: float, seconds: tuple[float, float] | None = None
) -> str:
    """The rule's decision, in the words of ``why``. ``seconds``: what the rounds in turns took, in all and
    a round (:func:`_turn_seconds`): a comparison the rounds could not settle says how long they ran and
    what more would cost."""
    best = by_key.get(d.best) if d.best is not None else None
    x = d.versus_yours
    if d.advice == "cheaper":
        return f"{x.text('yours')}: within {within_best:.0%} of yours, with fewer resources"
    if d.advice == "change":
        return f"{x.text('yours')}: faster beyond noise"
    if d.rival is not None:
        # the rival is cheaper than the fastest, or costlier than a pick that is the fastest by its readings,
        # or the fastest itself, over a cheaper pick the rounds put within the margin of it
        tie = d.rival == d.best and d.pick != d.best
        whose = "yours" if d.advice == "keep yours" else "it" if d.pick == d.best or tie else "the fastest"
        within = f" within {seconds[0]:.0f} s" if seconds is not None and x is not None else ""
        tell = f"the runs could not tell {d.rival} from {whose}{within}" + (
            f": {x.text(whose if whose == 'yours' else 'it')}"
            if x is not None
            else " (they were not measured in turns)"
        )
        more = ""
        if x is not None:
            n_more = d.rounds_more(x.rounds)
            more = f"; {more_rounds_text(n_more)}"
            if n_more is not None and seconds is not None:
                more = (
                    f"; about {n_more} more round{'' if n_more == 1 else 's'} in turns (~{n_more * seconds[1]:.0f} s) "
                    "would settle it at the spread seen"
                )
        # the other settings still open, each with its ratio: a faster reading left open is said, not dropped
        nor = "".join(
            f"; nor {k} from {whose}"
            + (f": {r.text(whose if whose == 'yours' else 'it')}" if r is not None else " (not measured in turns)")
            for k, r in d.others.items()
        )
        head = (
            "your setting, kept"
            if d.advice == "keep yours"
            else f"the cheaper of two settings the runs could not tell apart (their rounds' mean within {within_best:.0%})"
            if tie
            else "the fastest measured"
        )
        return f"{head}: {tell}{more}{nor}"
    if d.advice == "keep yours":
        if d.pick == d.best:
            return "your setting, the fastest measured, and no cheaper setting was shown within " + f"{within_best:.0%}"
        return (
            f"your setting, kept: no setting was shown faster beyond noise in turns (the fastest read {d.best}), "
            f"nor cheaper and within {within_best:.0%}"
        )
    if d.pick == d.best:
        return f"the best throughput measured, and no cheaper setting was shown within {within_best:.0%} of it"
    said = f", {best.samples_per_s:,.1f} samples/s" if best is not None else ""
    return f"cheapest setting shown within {within_best:.0%} of the best ({d.best}{said}) in turns"


def turns_to_run(
    rows: Any,
    *,
    budget_mb: float | None,
    within_best: float,
    user: LoaderRow | None,
    max_rounds: int | None = None,
) -> list[LoaderRow]:
    """The settings to measure (again) in turns: yours, the fastest, those still open and the near settings
    the rule would take up after them (at most three a round); [] once the rule is settled (the sweep's last
    step, :mod:`stagebench.loader._turns`), or once the spread seen says it would take more than
    ``max_rounds`` rounds in all to settle (:meth:`Decision.worth_more_rounds`)."""
    pts = _rows(rows)
    ok = [p for p in pts if p.ok]
    if not ok:
        return []
    pool = [p for p in ok if not _over_budget(p, budget_mb)] or ok
    cap = LOADER_TIE_ROUNDS if max_rounds is None else max_rounds
    d, by_key = loader_decision(rows, pool, within_best=within_best, user=user, max_rounds=cap)
    if d.settled or (max_rounds is not None and not d.worth_more_rounds(max_rounds)):
        return []
    keys = [k for k in (d.yours, d.best, d.pick) if k is not None and k in by_key] + list(d.open)
    # the near settings the rule would take up next, once the open ones are ruled out, join the same rounds
    # where a round has room: each needs three rounds for an interval, so one at a time cost three rounds
    # each (the slow-start bench: num_workers=0 at 0.82x of the fastest, then 2 workers: 7 rounds, 28.5 s,
    # where the searches without 0 near took 3 rounds and 16 s)
    later = {_knob_text(p): p for p in _near(pool) if _knob_text(p) not in by_key}
    return [{**by_key, **later}[k] for k in dict.fromkeys([*keys, *later])][:3]


@dataclass(frozen=True)
class _Stall:
    """The epoch-boundary stall at a setting without persistent workers (s), the epoch's length (s and
    batches), the stall's share of it, the stall with persistent workers, and whether it matters."""

    matters: bool
    stall_s: float
    epoch_s: float
    epoch_batches: float
    share: float
    persistent_stall_s: float


def _stall(rec: LoaderRow, ok: list[LoaderRow], m: RunMeta) -> _Stall | None:
    """The epoch-boundary stall at the recommendation's knobs without persistent workers, and whether it matters."""
    if rec.num_workers == 0 or rec.persistent_workers == NOT_APPLICABLE:
        return None
    p = _same_knobs_but(ok, rec, persistent_workers=False)
    if p is None or not math.isfinite(p.epoch_stall_s):
        return None
    q = _same_knobs_but(ok, rec, persistent_workers=True)
    stall = p.epoch_stall_s
    epoch_batches = num(m.loader.epoch_batches)
    epoch_s = epoch_batches / p.batches_per_s if math.isfinite(epoch_batches) and p.batches_per_s > 0 else math.nan
    share = stall / (epoch_s + stall) if math.isfinite(epoch_s) else math.nan
    gain = _stall_gain(p, q) if q is not None else math.nan
    matters = (math.isfinite(share) and share > STALL_SHARE) or (
        not math.isfinite(share) and math.isfinite(gain) and gain > max(0.1, 0.5 * stall)
    )
    return _Stall(
        matters=bool(matters),
        stall_s=stall,
        epoch_s=epoch_s,
        epoch_batches=epoch_batches,
        share=share,
        persistent_stall_s=q.epoch_stall_s if q is not None else math.nan,
    )


def _kept_knobs(rec: LoaderRow | None, ok: list[LoaderRow], m: RunMeta, *, with_loop: bool = False) -> LoaderRow | None:
    """:func:`_knobs_kept` on the recommendation, its ``decision`` carried over to the twin point it may become."""
    out = _knobs_kept(rec, ok, m, with_loop=with_loop)
    decision = rec.decision if rec is not None else None
    if out is not None and decision is not None:
        out = replace(out, decision=decision)
    return out


def _knobs_kept(rec: LoaderRow | None, ok: list[LoaderRow], m: RunMeta, *, with_loop: bool = False) -> LoaderRow | None:
    """The knobs a throughput window cannot judge, set by one rule each (the findings follow the same rules).

    ``pin_memory`` on a host with a CUDA device: as the user set it. Its benefit appears only with
    the copy to the device, which a loader measured alone never makes, so an isolated sweep can only
    see its cost; a job run with the user's loop judges it: ``with_loop`` (``rec`` is the job runs'
    pick), its ``pin_memory`` stands.
    ``persistent_workers``: the user's own where given (it acts only at epoch boundaries, which neither
    a throughput window nor a job slice reaches), else True where the stall matters (:func:`_stall`).
    """
    if rec is None:
        return rec
    mine = m.loader.user_knobs or UserKnobs()
    cuda = m.settings.cuda
    out = rec
    if cuda and not with_loop and mine.gave("pin_memory") and rec.pin_memory != NOT_APPLICABLE:
        if (rec.pin_memory is True) != bool(mine.pin_memory):
            twin = _same_knobs_but(ok, rec, pin_memory=bool(mine.pin_memory))
            out = replace(
                twin or rec,
                pin_memory=bool(mine.pin_memory),
                why=(rec.why or "")
                + "; pin_memory kept as yours: its benefit shows only with the copy to the device, which the "
                "loader measured alone does not make",
            )
    if out.num_workers == 0 or out.persistent_workers == NOT_APPLICABLE:
        return out
    stall = _stall(out, ok, m)
    matters = stall is not None and stall.matters
    if mine.gave("persistent_workers") and bool(mine.persistent_workers) != (out.persistent_workers is True):
        if mine.persistent_workers or not matters:
            why = out.why or ""
            return replace(
                _same_knobs_but(ok, out, persistent_workers=bool(mine.persistent_workers)) or out,
                persistent_workers=bool(mine.persistent_workers),
                why=why + "; persistent_workers kept as yours: it acts only at epoch boundaries, which the "
                "throughput windows do not see",
            )
    if matters and out.persistent_workers is not True:
        why = out.why or ""
        out = replace(
            _same_knobs_but(ok, out, persistent_workers=True) or out,
            persistent_workers=True,
            why=why + "; persistent_workers=True: workers restart at every epoch otherwise",
        )
    return out
