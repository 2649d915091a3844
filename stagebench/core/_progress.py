"""Live progress: a tqdm bar on a terminal, one plain line per point otherwise.

Long sweeps must show what they are doing (SPDL's built-in profiler is silent
unless logging was configured). Output goes to stderr so stdout stays clean for
the final table.
"""

from __future__ import annotations

import math
import sys

from stagebench.core._stage_draft import StageDraft

__all__ = ["Progress", "message"]


class Progress:
    def __init__(self, total: int | None = None, desc: str = "stagebench", enabled: bool = True) -> None:
        self.enabled = enabled
        self.tty = enabled and sys.stderr.isatty()
        self._bar = None
        if self.tty:
            # only a terminal draws a bar: other outputs never load tqdm
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, unit="pt", file=sys.stderr, leave=False, dynamic_ncols=True)

    def set_total(self, total: int) -> None:
        if self._bar is not None:
            self._bar.total = total
            self._bar.refresh()

    def start(self, label: str) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(label, refresh=True)

    def point(self, row: StageDraft) -> None:
        """A stage point finished: its coordinates, and its rate in calls per second or why it has none.

        A stage row's ``qps`` counts the stage's calls: after a batch of 16, one call stands for 16 source
        items, which the table and the report count ("45.6 calls/s x 16 items").
        """
        label = f"{row.stage} | {row.role} {row.harness}/{row.executor} c={row.concurrency}"
        self.done(label, row.status, row.qps, row.reason, "calls/s")

    def done(self, label: str, status: str, rate: float, reason: str, unit: str) -> None:
        """One point finished: ``label`` names it; its ``rate`` in ``unit`` where ``status`` is ok, else the
        status and ``reason``."""
        if status == "ok" and math.isfinite(rate):
            what = f"{rate:,.1f} {unit}" if abs(rate) >= 10 else f"{rate:.3g} {unit}"  # 0.18 s, not 0.2 s
        else:
            what = f"{status}: {reason}"[:100] if reason else status
        if self._bar is not None:
            self._bar.set_postfix_str(f"{label}: {what}", refresh=False)
            self._bar.update(1)
        elif self.enabled:
            print(f"[stagebench] {label}: {what}", file=sys.stderr, flush=True)

    def message(self, text: str) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.write(f"[stagebench] {text}", file=sys.stderr)
        else:
            message(text)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def message(text: str) -> None:
    """One progress line on stderr, as a diagnosis writes them, where no progress bar is held."""
    print(f"[stagebench] {text}", file=sys.stderr, flush=True)
