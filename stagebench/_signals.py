"""Signals during a diagnosis: SIGTERM handled as Ctrl-C is, an interrupt Python dropped raised again.

Standard library only: diagnostic mode loads it at interpreter start while spdl is being imported.
"""

from __future__ import annotations

from stagebench._errors import Terminated

# Not `from typing import ...` (nor contextlib): this module loads at interpreter start while diagnostic
# mode is on, where each of those costs milliseconds (bench_startup).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any

__all__ = ["Signalled", "on_sigterm", "raise_if_signalled", "ignore_sigterm", "ending", "signals"]


def signals() -> ModuleType:
    """The ``signal`` module, imported where a signal is handled: it imports enum (~10 ms), and this module
    and the SPDL hook load at interpreter start."""
    import signal

    return signal


def _main_thread() -> bool:
    """Whether this is the main thread, the one signals land on (threading loads here, not at start)."""
    import threading

    return threading.current_thread() is threading.main_thread()


class Signalled:
    """The interrupt a signal raised during the diagnosis (KeyboardInterrupt or Terminated), kept: one that
    lands in a finalizer (an event loop's __del__) is printed and dropped by Python, not propagated."""

    kind: type | None = None


class on_sigterm:  # lower case: used as a function, `with on_sigterm():`
    """Turn SIGTERM into :class:`Terminated` while the block runs, and note SIGINT and SIGTERM in
    ``Signalled.kind`` as they raise (main thread only: signals land there); :func:`raise_if_signalled`
    raises one again that Python dropped in a finalizer. A SIGINT handler of the user's own is left as
    it is.

    A class, not a contextlib generator: contextlib is not loaded at interpreter start.
    """

    def __enter__(self) -> None:
        signal = signals()
        self._previous: Any = None
        self._previous_int: Any = None
        Signalled.kind = None
        if _main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._raise)
            if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
                self._previous_int = signal.signal(signal.SIGINT, self._interrupt)

    @staticmethod
    def _raise(signum: int, frame: Any) -> None:
        Signalled.kind = Terminated
        ignore_sigterm()  # the run is ending: a second SIGTERM may not cut its saving short
        raise Terminated()

    @staticmethod
    def _interrupt(signum: int, frame: Any) -> None:
        Signalled.kind = KeyboardInterrupt
        raise KeyboardInterrupt()

    def __exit__(self, *exc: object) -> None:
        signal = signals()
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
        if self._previous_int is not None:
            signal.signal(signal.SIGINT, self._previous_int)


def raise_if_signalled() -> None:
    """Raise the interrupt a signal raised during the diagnosis, should it have been dropped (in a
    finalizer, where Python prints "Exception ignored" and goes on): the run then ends interrupted, as
    the user asked, and not complete."""
    if Signalled.kind is not None:
        raise Signalled.kind()


def ignore_sigterm() -> None:
    """From here on SIGTERM does nothing (main thread only): a rank that knows its exit code is leaving, and
    torch's launcher, seeing another rank end first with a code other than 0, terminates the rest; each
    still ends with the code every rank shares."""
    if _main_thread():
        signal = signals()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def ending() -> None:
    """The run is ending by an interrupt (Ctrl-C, SIGTERM, a rank lost) and writes what it measured: from
    here on SIGTERM does nothing, so a second one cannot cut that short. Under torch's launcher it comes as a
    matter of course: a rank that sees another rank gone ends by :class:`RankLost`, and the launcher, seeing
    that rank's exit, terminates the rest a moment later. A second Ctrl-C still stops the process.

    Only inside :class:`on_sigterm`, whose exit puts the handler before it back: a library call that ends
    by Ctrl-C leaves the caller's SIGTERM as it was."""
    signal = signals()
    if signal.getsignal(signal.SIGTERM) is on_sigterm._raise:
        ignore_sigterm()
