"""What happened in this process: whether a diagnosis started, where, and how it ended.

The SPDL hook writes it, ``run_script`` reads it; standard library only.
"""

from __future__ import annotations

import sys

from stagebench._errors import Terminated
from stagebench._signals import Signalled, on_sigterm, raise_if_signalled
from stagebench._spdl_private import MODE_VAR, TRUTHY

# Not `from typing import ...` (nor pathlib, contextlib): this module loads at interpreter start
# while diagnostic mode is on, where each of those costs milliseconds (bench_startup).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

__all__ = ["State", "say", "MODE_VAR", "TRUTHY", "Terminated", "Signalled", "on_sigterm", "raise_if_signalled"]


class State:
    """What happened in this process (run_script reports on it)."""

    started = False
    finished = False
    code: int | None = None
    run_dir: Path | None = None
    original_mode: str | None = None  # the variable's value before a diagnosis set it to 0
    on_start: list = []  # called once when a pipeline diagnosis starts (removes the DataLoader hook)
    loader_hook: object = None  # the DataLoader hook's remover, once this process installed it
    group: Any = None  # the host's ranks (core/_ranks.HostGroup) where a torchrun job runs several
    walk: Any = None  # a follower's walk of its pipeline (pipeline/_follow.Walk), for the job phase
    in_process = False  # run_script is running the script: it, not the interpreter's exit, ends the diagnosis
    end_parent: int | None = None  # a multiprocessing.Pool worker diagnosed: the pid of the program to end
    claim: str | None = None  # that worker's claim on the diagnosis (a lock file), removed as it ends


def say(text: str) -> None:
    print(f"stagebench: {text}", file=sys.stderr, flush=True)
