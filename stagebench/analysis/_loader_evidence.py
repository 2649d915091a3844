"""Loader settings measured more than once: their readings pooled, and the tie-break between two of them.

Decisions on evidence, not on the larger of two noisy numbers. Two rules:

**Pooling.** A setting measured twice (the tie-break below, a search phase that lands on a setting
already measured) is one point: all its samples over all its seconds, never the higher reading. Its
interval combines the readings' own (weighted by their spans) with their spread between readings
(a change of the machine between them), whichever is wider. On the 16-core H200 host one setting
read 3,068 and 2,569 samples/s, and the table showed and the pick used the higher.

**The tie-break.** Where the pick rests on two settings whose intervals overlap while their readings
are more than ``within_best`` apart (the cheaper chosen only because the measurement cannot tell them
apart), both are measured again in turns, cheaper then faster then faster then cheaper per round, as
the pipeline's head-to-head does (:mod:`stagebench.core._paired`): each adjacent pair of windows saw
the same moments of the machine, and their ratio's mean over the pairs has a Student-t interval.
The faster one wins when the whole interval says the cheaper is more than ``within_best`` slower;
the cheaper one when the whole interval says it is within ``within_best``; otherwise it is a tie,
which keeps the user's setting when it is one of the two, else the cheaper. On this VM a JPEG loader
was recommended 2 workers (717 [675, 763] samples/s) over 4 (801 [641, 1,067]); run alone in turns,
4 gave 782 against 682.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

__all__ = ["setting_key", "is_ok", "pool_points", "hinge", "paired_verdict", "Z95"]

Z95 = 1.959964  # the normal 95% quantile: a reading's interval back to its standard error
_KNOBS = ("num_workers", "prefetch_factor", "persistent_workers", "pin_memory")
_MIN_PAIRS = 2


def setting_key(p: dict[str, Any]) -> tuple:
    """The setting of a normalised row: num_workers, prefetch_factor, persistent_workers, pin_memory."""
    return tuple(p[k] if k in ("num_workers", "prefetch_factor") else p[k] is True for k in _KNOBS)


def is_ok(p: dict[str, Any]) -> bool:
    """A normalised row or point measured ok, with a positive rate."""
    s = p["samples_per_s"]
    return p["status"] == "ok" and math.isfinite(s) and s > 0


def _finite(xs: Iterable[float]) -> list[float]:
    return [float(x) for x in xs if isinstance(x, (int, float)) and math.isfinite(x)]


def pool_points(raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One point per setting (in the order first measured), its readings pooled (module docstring).

    Each point keeps ``measurements`` (how many readings), ``readings`` (their samples/s) and the
    epoch stall of any of its rows (the stall alone, measured at the pick, is a row of its own).
    """
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in raw:
        groups.setdefault(setting_key(r), []).append(r)
    out = []
    for rows in groups.values():
        ok = [r for r in rows if is_ok(r)]
        base = dict(ok[0] if ok else next((r for r in rows if r["status"] != "ok"), rows[0]))
        if len(ok) > 1:
            base.update(_pooled(ok))
        base["measurements"] = len(ok)
        base["readings"] = [r["samples_per_s"] for r in ok]
        stalls = _finite(r["epoch_stall_s"] for r in rows)
        if stalls:
            base["epoch_stall_s"] = sum(stalls) / len(stalls)
        firsts = _finite(r["time_to_first_batch_s"] for r in rows)
        if firsts:
            base["time_to_first_batch_s"] = sum(firsts) / len(firsts)
        out.append(base)
    return out


def _pooled(ok: list[dict[str, Any]]) -> dict[str, Any]:
    spans = [r["n_samples"] / r["samples_per_s"] if math.isfinite(r["n_samples"]) else r["window_s"] for r in ok]
    spans = [s if math.isfinite(s) and s > 0 else 1.0 for s in spans]
    total = sum(spans)
    rate = sum(r["samples_per_s"] * s for r, s in zip(ok, spans)) / total  # all samples over all seconds
    ses = [(r["samples_per_s_high"] - r["samples_per_s_low"]) / (2 * Z95) for r in ok]
    within = (
        math.sqrt(sum((s / total) ** 2 * se**2 for s, se in zip(spans, ses)))
        if all(map(math.isfinite, ses))
        else math.nan
    )
    rates = [r["samples_per_s"] for r in ok]
    mean = sum(rates) / len(rates)
    between = math.sqrt(sum((x - mean) ** 2 for x in rates) / (len(rates) - 1) / len(rates))
    se = max(x for x in (within, between) if math.isfinite(x))
    out: dict[str, Any] = {
        "samples_per_s": rate,
        "samples_per_s_low": rate - Z95 * se,
        "samples_per_s_high": rate + Z95 * se,
        "window_s": sum(_finite(r["window_s"] for r in ok)),
        "elapsed_s": sum(_finite(r["elapsed_s"] for r in ok)),
    }
    for key in ("n_batches", "n_samples"):
        vals = _finite(r[key] for r in ok)
        out[key] = sum(vals) if vals else math.nan
    batches = _finite(r["batches_per_s"] * s for r, s in zip(ok, spans))
    out["batches_per_s"] = sum(batches) / total if batches else math.nan
    cores = [(r["cores_used"], s) for r, s in zip(ok, spans) if math.isfinite(r["cores_used"])]
    out["cores_used"] = sum(c * s for c, s in cores) / sum(s for _, s in cores) if cores else math.nan
    for key in ("mem_pss_mb", "mem_uss_mb", "mem_main_mb", "mem_workers_mb"):  # the most it held
        vals = _finite(r[key] for r in ok)
        out[key] = max(vals) if vals else math.nan
    return out


def hinge(
    near_pick: dict[str, Any], best: dict[str, Any], within_best: float
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(cheaper, faster) when the pick rests on the noise between them: (module docstring), else None."""
    if setting_key(near_pick) == setting_key(best):
        return None
    if near_pick["samples_per_s"] >= (1 - within_best) * best["samples_per_s"]:
        return None  # within the rule's own margin by its reading: no tie to break
    return near_pick, best


def paired_verdict(
    raw: list[dict[str, Any]], cheaper: tuple, faster: tuple, within_best: float
) -> dict[str, Any] | None:
    """The tie-break between two settings from their ``paired`` rows, in measurement order (module docstring).

    Returns None without two usable pairs, else ``winner`` (``cheaper``, ``faster`` or ``tie``),
    ``ratio`` (faster / cheaper, mean over the pairs), ``ratio_low`` / ``ratio_high`` and ``pairs``.
    """
    from stagebench.core._stats import mean_interval

    seq = [r for r in raw if r["search_phase"] == "paired" and setting_key(r) in (cheaper, faster)]
    ratios = []
    for a, b in zip(seq[0::2], seq[1::2]):
        by = {setting_key(r): r for r in (a, b)}
        if set(by) != {cheaper, faster} or not all(is_ok(r) for r in (a, b)):
            continue
        ratios.append(by[faster]["samples_per_s"] / by[cheaper]["samples_per_s"])
    if len(ratios) < _MIN_PAIRS:
        return None
    ratio, lo, hi, _ = mean_interval(ratios, 0.95)
    limit = 1 / (1 - within_best)  # the faster this much ahead: the cheaper is no longer within within_best
    winner = "faster" if lo > limit else "cheaper" if hi < limit else "tie"
    return {"winner": winner, "ratio": ratio, "ratio_low": lo, "ratio_high": hi, "pairs": len(ratios)}
