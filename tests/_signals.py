"""Children that get Ctrl-C as a user's terminal would deliver it.

A shell running a job in the background without job control (``cmd &`` in a
script, ``nohup``, some CI runners) starts it with SIGINT *ignored*, every
child inherits that, and Python keeps an ignored SIGINT ignored: the Ctrl-C
tests then saw a sweep that never stopped (a fresh-clone run under ``nohup``
failed this way twice, while the same test passed 45 times in the
foreground). Tests that send SIGINT start their child with the default
disposition restored, which is what a terminal gives a user's script.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

__all__ = ["default_sigint", "start_interruptible", "wait_for_rows"]


def default_sigint() -> None:
    """``preexec_fn`` for :class:`subprocess.Popen`: SIGINT back to its default in the child."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_interruptible(
    argv: list[str], *, cwd: Path, env: dict[str, str], stdout: int = subprocess.PIPE
) -> subprocess.Popen:
    """``argv`` started as a user's terminal starts it (SIGINT at its default), its stderr piped as text."""
    return subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=stdout, stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint
    )


def wait_for_rows(csv: Path, rows: int, timeout: float = 120.0) -> None:
    """Until ``csv`` holds ``rows`` rows beyond its header (0: until it exists), or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not (csv.exists() and len(csv.read_text().splitlines()) - 1 >= rows):
        time.sleep(0.05)
