"""Loader settings measured more than once: their readings pooled, and their windows in turns paired up.

Decisions on evidence, not on the larger of two noisy numbers.

**Pooling.** A setting measured twice (the windows in turns, a search phase that lands on a setting
already measured) is one point: all its samples over all its seconds, never the higher reading. Its
interval combines the readings' own (weighted by their spans) with their spread between readings
(a change of the machine between them), whichever is wider, on the log scale (it stays positive).

**Rounds in turns.** The settings a decision hinges on are measured again in turns
(:mod:`stagebench.loader._turns`; why: docs/method.md#rounds-in-turns). Their rows (``search_phase`` ``paired``) are read
back in measurement order; a round ends where a setting comes again (:func:`paired_rounds`), and
:func:`paired_ratio` turns the rounds into the ratio the rule of :mod:`stagebench.model._evidence`
decides on.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import replace

from stagebench._settings import LOADER_TIE_ROUNDS
from stagebench.model._evidence import Ratio, look_confidence
from stagebench.model._knobs import LoaderKnobs
from stagebench.model._loader import STALL_NOT_MEASURED, LoaderRow, with_note

__all__ = ["pool_points", "paired_rounds", "paired_ratio", "Z95"]

Z95 = 1.959964  # the normal 95% quantile: a reading's interval back to its standard error
_MIN_PAIRS = 2


def _finite(xs: Iterable[float]) -> list[float]:
    return [float(x) for x in xs if isinstance(x, (int, float)) and math.isfinite(x)]


def pool_points(raw: list[LoaderRow]) -> list[LoaderRow]:
    """One point per setting (in the order first measured), its readings pooled (module docstring).

    Each point keeps ``measurements`` (how many readings), ``readings`` (their samples/s) and the
    epoch stall of any of its rows (the stall alone, measured at the pick, is a row of its own), or, where
    none measured it, the note of the row that says why not (:attr:`LoaderRow.stall_unmeasured`).
    """
    groups: dict[LoaderKnobs, list[LoaderRow]] = {}
    for r in raw:
        groups.setdefault(r.knobs, []).append(r)
    out = []
    for rows in groups.values():
        ok = [r for r in rows if r.ok]
        base = ok[0] if ok else next((r for r in rows if r.status != "ok"), rows[0])
        if len(ok) > 1:
            base = _pooled(base, ok)
        base = replace(base, measurements=len(ok), readings=tuple(r.samples_per_s for r in ok))
        stalls = _finite(r.epoch_stall_s for r in rows)
        if stalls:
            base = replace(base, epoch_stall_s=sum(stalls) / len(stalls))
        elif base.stall_unmeasured is None:  # the stall row's reason why not, kept with the point
            why = next((w for r in rows if (w := r.stall_unmeasured) is not None), None)
            if why is not None:
                base = replace(base, notes=with_note(base.notes, STALL_NOT_MEASURED + why))
        firsts = _finite(r.time_to_first_batch_s for r in rows)
        if firsts:
            base = replace(base, time_to_first_batch_s=sum(firsts) / len(firsts))
        out.append(base)
    return out


def _pooled(base: LoaderRow, ok: list[LoaderRow]) -> LoaderRow:
    """``base`` with the figures of a setting's readings pooled: all its samples over all its seconds."""
    spans = [r.n_samples / r.samples_per_s if math.isfinite(r.n_samples) else r.window_s for r in ok]
    spans = [s if math.isfinite(s) and s > 0 else 1.0 for s in spans]
    total = sum(spans)
    rate = sum(r.samples_per_s * s for r, s in zip(ok, spans)) / total  # all samples over all seconds
    ses = [(r.samples_per_s_high - r.samples_per_s_low) / (2 * Z95) for r in ok]
    within = (
        math.sqrt(sum((s / total) ** 2 * se**2 for s, se in zip(spans, ses)))
        if all(map(math.isfinite, ses))
        else math.nan
    )
    rates = [r.samples_per_s for r in ok]
    mean = sum(rates) / len(rates)
    between = math.sqrt(sum((x - mean) ** 2 for x in rates) / (len(rates) - 1) / len(rates))
    se = max(x for x in (within, between) if math.isfinite(x))
    half = Z95 * se / rate if rate > 0 else math.nan  # on the log scale: a rate's interval stays positive

    def summed(values: Iterable[float]) -> float:
        vals = _finite(values)
        return sum(vals) if vals else math.nan

    def most(values: Iterable[float]) -> float:  # the most it held
        vals = _finite(values)
        return max(vals) if vals else math.nan

    batches = _finite(r.batches_per_s * s for r, s in zip(ok, spans))
    cores = [(r.cores_used, s) for r, s in zip(ok, spans) if math.isfinite(r.cores_used)]
    pooled = replace(
        base,
        samples_per_s=rate,
        samples_per_s_low=rate * math.exp(-half),
        samples_per_s_high=rate * math.exp(half),
        window_s=sum(_finite(r.window_s for r in ok)),
        elapsed_s=sum(_finite(r.elapsed_s for r in ok)),
        n_batches=summed(r.n_batches for r in ok),
        n_samples=summed(r.n_samples for r in ok),
        batches_per_s=sum(batches) / total if batches else math.nan,
        cores_used=sum(c * s for c, s in cores) / sum(s for _, s in cores) if cores else math.nan,
        mem_pss_mb=most(r.mem_pss_mb for r in ok),
        mem_uss_mb=most(r.mem_uss_mb for r in ok),
        mem_main_mb=most(r.mem_main_mb for r in ok),
        mem_workers_mb=most(r.mem_workers_mb for r in ok),
    )
    # a ranked window's slowest and fastest rank, pooled as its rate
    lows = [(x, s) for r, s in zip(ok, spans) if (x := r.rank_min_samples_per_s) is not None and math.isfinite(x)]
    if lows:
        pooled = replace(pooled, rank_min_samples_per_s=sum(x * s for x, s in lows) / sum(s for _, s in lows))
    highs = [(x, s) for r, s in zip(ok, spans) if (x := r.rank_max_samples_per_s) is not None and math.isfinite(x)]
    if highs:
        pooled = replace(pooled, rank_max_samples_per_s=sum(x * s for x, s in highs) / sum(s for _, s in highs))
    return pooled


def paired_rounds(raw: list[LoaderRow]) -> list[dict[LoaderKnobs, float]]:
    """The windows in turns, as rounds: per round, each setting's rate (measured ok) by its knobs.

    Rows are read in measurement order; each carries its round (``turn``). Rows written before that
    column existed end a round where a setting comes again (A B, B A: the tie-break's order then).
    """
    rounds: list[dict[LoaderKnobs, float]] = []
    seen: set[LoaderKnobs] = set()
    last_turn = None
    for r in raw:
        if r.search_phase != "paired":
            continue
        k = r.knobs
        turn = r.turn
        numbered = isinstance(turn, (int, float)) and math.isfinite(turn)
        if not rounds or (turn != last_turn if numbered else k in seen):
            rounds.append({})
            seen = set()
        last_turn = turn if numbered else None
        seen.add(k)
        if r.ok:
            rounds[-1][k] = float(r.samples_per_s)
    return rounds


def paired_ratio(
    rounds: list[dict[LoaderKnobs, float]], a: LoaderKnobs, b: LoaderKnobs, *, max_rounds: int = LOADER_TIE_ROUNDS
) -> Ratio | None:
    """a's rate over b's, round by round, over the rounds that measured both, at the level of a comparison
    of at most ``max_rounds`` rounds (:func:`look_confidence`)."""
    pairs = [(r[a], r[b]) for r in rounds if a in r and b in r]
    return Ratio.of_pairs(pairs, confidence=look_confidence(max_rounds))
