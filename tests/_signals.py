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

__all__ = ["default_sigint"]


def default_sigint() -> None:
    """``preexec_fn`` for :class:`subprocess.Popen`: SIGINT back to its default in the child."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
