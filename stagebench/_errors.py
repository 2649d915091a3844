"""Errors that end a command with one line and an exit status, not a traceback.

Here, not in the CLI, so that any layer can raise them without importing the
command-line module (nothing imports :mod:`stagebench._cli`).
"""

from __future__ import annotations

__all__ = ["StagebenchError", "RankLost", "Terminated"]


class StagebenchError(Exception):
    """A user error: printed as one line, exit code 2."""


class RankLost(KeyboardInterrupt):
    """A rank of the host's data-parallel job ended, stopped answering, or never arrived: the others end as
    on Ctrl-C (a KeyboardInterrupt, so whatever keeps the rows on Ctrl-C keeps them here too), with this
    line (``str()``), and the run's outcome says so (``runs._outcome.RANK_LOST``)."""


class Terminated(KeyboardInterrupt):
    """SIGTERM during a diagnosis (a scheduler's kill, ``timeout``): handled as Ctrl-C is, exit 143.

    A KeyboardInterrupt, so every place that keeps the rows on Ctrl-C keeps them here too.
    """
