"""What happened in this process: whether a diagnosis started, where, and how it ended.

The SPDL hook writes it, ``run_script`` reads it; standard library only.
"""

from __future__ import annotations

import sys

from stagebench._spdl_private import MODE_VAR, TRUTHY

# Not `from typing import ...` (nor pathlib, contextlib): this module loads at interpreter start
# while diagnostic mode is on, where each of those costs milliseconds (bench_startup).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

__all__ = ["State", "say", "MODE_VAR", "TRUTHY", "Terminated", "on_sigterm", "raise_if_signalled"]


class State:
    """What happened in this process (run_script reports on it)."""

    started = False
    finished = False
    code: int | None = None
    run_dir: Path | None = None
    original_mode: str | None = None  # the variable's value before a diagnosis set it to 0
    on_start: list = []  # called once when a pipeline diagnosis starts (run_script sets it)
    in_process = False  # run_script is running the script: it, not the interpreter's exit, ends the diagnosis
    end_parent: int | None = None  # a multiprocessing.Pool worker diagnosed: the pid of the program to end
    claim: str | None = None  # that worker's claim on the diagnosis (a lock file), removed as it ends
    # the interrupt a signal raised during the diagnosis (KeyboardInterrupt or Terminated), kept: one that
    # lands in a finalizer (an event loop's __del__) is printed and dropped by Python, not propagated
    signalled: type | None = None


def say(text: str) -> None:
    print(f"stagebench: {text}", file=sys.stderr, flush=True)


class Terminated(KeyboardInterrupt):
    """SIGTERM during a diagnosis (a scheduler's kill, ``timeout``): handled as Ctrl-C is, exit 143.

    A KeyboardInterrupt, so every place that keeps the rows on Ctrl-C keeps them here too.
    """


class on_sigterm:  # lower case: used as a function, `with on_sigterm():`
    """Turn SIGTERM into :class:`Terminated` while the block runs, and note SIGINT and SIGTERM in
    ``State.signalled`` as they raise (main thread only: signals land there); :func:`raise_if_signalled`
    raises one again that Python dropped in a finalizer. A SIGINT handler of the user's own is left as
    it is.

    A class, not a contextlib generator: contextlib is not loaded at interpreter start.
    """

    def __enter__(self) -> None:
        import signal
        import threading

        self._previous: Any = None
        self._previous_int: Any = None
        State.signalled = None
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._raise)
            if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
                self._previous_int = signal.signal(signal.SIGINT, self._interrupt)

    @staticmethod
    def _raise(signum: int, frame: Any) -> None:
        State.signalled = Terminated
        raise Terminated()

    @staticmethod
    def _interrupt(signum: int, frame: Any) -> None:
        State.signalled = KeyboardInterrupt
        raise KeyboardInterrupt()

    def __exit__(self, *exc: object) -> None:
        import signal

        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
        if self._previous_int is not None:
            signal.signal(signal.SIGINT, self._previous_int)


def raise_if_signalled() -> None:
    """Raise the interrupt a signal raised during the diagnosis, should it have been dropped (in a
    finalizer, where Python prints "Exception ignored" and goes on): the run then ends interrupted, as
    the user asked, and not complete."""
    if State.signalled is not None:
        raise State.signalled()
