"""Errors that end a command with one line and an exit status, not a traceback.

Here, not in the CLI, so that any layer can raise them without importing the
command-line module (nothing imports :mod:`stagebench._cli`).
"""

from __future__ import annotations

__all__ = ["StagebenchError"]


class StagebenchError(Exception):
    """A user error: printed as one line, exit code 2."""
