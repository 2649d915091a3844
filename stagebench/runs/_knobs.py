"""Loader settings as the rows record them: the backends' rules for the knobs, and their display.

Shared by the loader sweep that measures them, the analysis that picks one and
the report that shows them; plain data, no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stagebench.model._knobs import KNOBS, NOT_APPLICABLE, LoaderKnobs

__all__ = ["normalize_knobs", "NOT_APPLICABLE", "KNOWN_BACKENDS", "loader_knobs"]


#: Backends with their own knob rules; any other name is accepted and gets the
#: generic rules (no prefetch or persistence without workers).
KNOWN_BACKENDS = ("torch", "spdl_pytorch")


def normalize_knobs(knobs: LoaderKnobs, backend: str, *, cuda: bool) -> tuple[LoaderKnobs, dict[str, Any], list[str]]:
    """The knobs a backend can actually take, how to show them, and what was changed.

    Returns (effective knobs, displayed values for persistent_workers/pin_memory
    -- :data:`NOT_APPLICABLE` where the knob does not exist here --, notes). Never raises for
    a combination the backend would reject: it is normalised and the change noted.
    """
    nw, pf, pw, pin = knobs.num_workers, knobs.prefetch_factor, knobs.persistent_workers, knobs.pin_memory
    notes: list[str] = []
    shown_pw: Any = pw
    shown_pin: Any = pin
    if backend == "spdl_pytorch":
        if nw == 0:
            notes.append("num_workers=0 runs as 1: SPDL's loader always loads in worker processes")
            nw = 1
        if pw:
            notes.append("persistent_workers not applicable: SPDL's loader starts its workers every epoch")
        pw, shown_pw = False, NOT_APPLICABLE
        pf = 2 if pf is None else pf
    else:
        if nw == 0:
            if pf is not None:
                notes.append(f"prefetch_factor={pf} ignored: num_workers=0 loads in the main process")
            if pw:
                notes.append("persistent_workers=True ignored: no workers to keep with num_workers=0")
            pf, pw, shown_pw = None, False, False
        elif pf is None:
            pf = 2  # torch's own default with workers
    if not cuda:
        if pin:
            notes.append("pin_memory not applicable: no CUDA device")
        pin, shown_pin = False, NOT_APPLICABLE
    eff = LoaderKnobs(num_workers=nw, prefetch_factor=pf, persistent_workers=pw, pin_memory=pin)
    return eff, {"persistent_workers": shown_pw, "pin_memory": shown_pin}, notes


#: Keys of a loader point that are measurements or prose, not settings.
_NOT_KNOBS = {
    "samples_per_s",
    "samples_per_s_low",
    "samples_per_s_high",
    "batches_per_s",
    "why",
    "mem_pss_mb",
    "mem_uss_mb",
    "mem_main_mb",
    "mem_workers_mb",
    "cores_used",
    "time_to_first_batch_s",
    "epoch_stall_s",
    "cv",
    "n_batches",
    "window_s",
    "status",
    "reason",
    "search_phase",
    "elapsed_s",
    "started_at",
    "disk_read_mb_s",
    "loader",
    "backend",
    "decision",
    "turn",
}


def loader_knobs(d: Mapping[str, Any] | None) -> dict[str, Any]:
    """The settings in a loader point (recommended/best), in a stable order; knobs that do not
    apply (``None``, ``"not applicable"``) are left out."""
    d = d or {}
    keys = [k for k in KNOBS if k in d] + sorted(k for k in d if k not in KNOBS and k not in _NOT_KNOBS)
    return {k: d[k] for k in keys if d[k] is not None and d[k] != "not applicable"}
