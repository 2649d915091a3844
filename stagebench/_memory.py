"""Out of memory: one test for it wherever it surfaces, and what a run keeps to end after it.

Why one module: under a memory limit (``ulimit -v``, a container) a stage that keeps what it
allocates leaves the whole process without memory, and the failure then surfaces far from the
stage, in many shapes: a ``MemoryError`` in the stage's call or in our own code, ``OSError``
ENOMEM from the semaphore a process pool creates, ``RuntimeError: can't start new thread``, an
``ImportError`` for a shared library that cannot be mapped, pandas' C parser saying "out of memory",
an SPDL ``PipelineFailure`` holding one of these. Every place that records an error asks
:func:`out_of_memory` (or writes it with :func:`describe`), so each of them is named as memory:
never as the stage's bug, an object that cannot be pickled, a damaged file or an internal error.

A process that ran out once may have its memory back (a point that allocated a lot at 16 workers
frees it when it ends) or not (a stage that keeps what it allocates). :func:`memory_short` tells
which, cheaply, before more work starts in it; a process that never ran out pays nothing.
:class:`MemoryReserve` keeps address space aside for the end of a run: its summary and report
need memory (the report imports its plotting library then), and a run that ran out must still
leave them.
"""

from __future__ import annotations

import errno
import logging
import mmap
import sys
import threading
from typing import Any

__all__ = [
    "CAUSE",
    "out_of_memory",
    "describe",
    "said_out_of_memory",
    "ran_out_of_memory",
    "memory_short",
    "forget",
    "MemoryReserve",
    "quiet_after_out_of_memory",
    "end_quiet",
    "quieted",
]

#: What a process that runs out of memory says of why, beside what ran out: the two causes seen.
CAUSE = "a stage that keeps what it allocates, or a memory limit (ulimit -v, a container's) too small for it"

#: Messages of failed allocations that come without a MemoryError or an errno: CPython's thread
#: start (a thread's stack is memory), the dynamic loader (a library mapped at import), strerror's
#: ENOMEM inside another error's text, pandas' C parser, PyTorch's device allocator.
_SAYS_MEMORY = (
    "can't start new thread",
    "failed to map segment from shared object",
    "cannot allocate memory",
    "out of memory",
)

#: How far into causes, contexts and an exception group's members a failure is followed.
_MAX_LINKS = 20


class _Seen:
    """Whether this process ran out of memory, and the first failure that said so."""

    first: str | None = None


def _one_line(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _says_memory(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError):
        return True
    if isinstance(exc, OSError) and exc.errno == errno.ENOMEM:
        return True
    if isinstance(exc, SystemError) and _Seen.first is not None and _cannot_map():
        # CPython's "error return without exception set": C code whose allocation failed lost its
        # MemoryError on the way out; where this process never ran out, or has its memory back, it is a bug
        return True
    text = str(exc).lower()
    return isinstance(exc, (OSError, RuntimeError, ImportError, ValueError)) and any(s in text for s in _SAYS_MEMORY)


def out_of_memory(exc: BaseException) -> str | None:
    """The failure that says the process ran out of memory, in one line (``"MemoryError"``, ``"OSError:
    [Errno 12] Cannot allocate memory"``), where ``exc`` is one or came from one (its cause, the
    exception it was raised while handling, a member of an exception group); None otherwise.

    Recognising one notes that this process ran out (:func:`ran_out_of_memory`). A worker process's
    failure reaches this process as text, not as an exception, and notes nothing here.
    """
    todo: list[BaseException] = [exc]
    seen: set[int] = set()
    while todo and len(seen) < _MAX_LINKS:
        e = todo.pop(0)
        if id(e) in seen:
            continue
        seen.add(id(e))
        if _says_memory(e):
            what = _one_line(e)
            _Seen.first = _Seen.first or what
            return what
        todo.extend(getattr(e, "exceptions", None) or ())  # ExceptionGroup, SPDL's PipelineFailure
        if e.__cause__ is not None:
            todo.append(e.__cause__)
        if e.__context__ is not None and not e.__suppress_context__:
            todo.append(e.__context__)
    return None


_SAID = "out of memory: "


def describe(exc: BaseException) -> str:
    """An error in one line as rows and messages record it: ``"ValueError: bad record"``, or, where the
    process ran out of memory, ``"out of memory: MemoryError"``."""
    what = out_of_memory(exc)
    return f"{_SAID}{what}" if what else _one_line(exc)


def said_out_of_memory(line: str) -> str | None:
    """What ran out of memory, where ``line`` is one :func:`describe` wrote for it (a worker process's
    failure reaches the driver as that line); None otherwise."""
    return line[len(_SAID) :] if line.startswith(_SAID) else None


def ran_out_of_memory() -> str | None:
    """The first out-of-memory failure recognised in this process, or None."""
    return _Seen.first


#: A point or a phase needs at least this much address space: its threads' stacks alone are 8 MB each.
_PROBE_BYTES = 64 * 2**20


def memory_short() -> str | None:
    """Why no more work should start in this process (it ran out of memory and still cannot map 64 MB),
    or None: it never ran out, or its memory is back.

    Work started in a process with no memory left fails in ways that hide the cause, or hangs: under
    ``ulimit -v`` a thread can be created that cannot start, and ``Thread.start()`` then waits for
    it forever. The probe maps address space and touches none of it: it costs no memory.
    """
    if _Seen.first is None or not _cannot_map():
        return None
    return f"this process is out of memory ({_Seen.first}, and {_PROBE_BYTES >> 20} MB cannot be mapped now)"


def _cannot_map() -> bool:
    try:
        probe = mmap.mmap(-1, _PROBE_BYTES)
    except (OSError, MemoryError):
        return True
    probe.close()
    return False


def forget() -> None:
    """Forget that this process ran out of memory (tests that provoke it call this after)."""
    _Seen.first = None


class MemoryReserve:
    """Address space kept aside while a run measures, given back for its end (:meth:`release`).

    Mapped and never touched: it holds no memory a container counts, only room under ``ulimit -v``;
    128 MB is above what the end of a diagnosis (its summary, its report's plotting library) takes.
    """

    SIZE = 128 * 2**20

    def __init__(self) -> None:
        try:
            self._block: mmap.mmap | None = mmap.mmap(-1, self.SIZE)
        except (OSError, MemoryError):  # nothing to keep aside: the run goes on without a reserve
            self._block = None

    def release(self) -> None:
        """Give the reserve back (again: nothing)."""
        block, self._block = self._block, None
        if block is not None:
            block.close()


class _Quiet:
    """What :func:`quiet_after_out_of_memory` kept off the terminal: how many, and the first."""

    previous: object = None
    previous_thread: object = None
    raise_logging: bool | None = None
    count = 0
    first: str | None = None


def _kept_quiet(exc: BaseException | None, *, says_memory: bool) -> bool:
    """Count ``exc`` instead of printing it, where this process ran out of memory or it says so itself."""
    try:
        if _Seen.first is not None or says_memory:
            _Quiet.count += 1
            _Quiet.first = _Quiet.first or (_one_line(exc) if exc is not None else "?")
            return True
    except BaseException:  # nothing left to say it with: this process is out of memory
        return True
    return False


def _unraisable(args: Any) -> None:
    exc = getattr(args, "exc_value", None)
    if not _kept_quiet(exc, says_memory=isinstance(exc, MemoryError)):
        previous = _Quiet.previous
        if callable(previous):
            previous(args)


def _thread_failed(args: Any) -> None:
    """A thread's uncaught exception: a pipeline's own thread that could not start one of its own ("can't
    start new thread", when its event loop closes) prints threading's traceback otherwise."""
    exc = getattr(args, "exc_value", None)
    if not _kept_quiet(exc, says_memory=exc is not None and out_of_memory(exc) is not None):
        previous = _Quiet.previous_thread
        if callable(previous):
            previous(args)


def quiet_after_out_of_memory() -> None:
    """In a process that ran out of memory, what Python would print of a finalizer, a thread start or a
    thread that failed ("Exception ignored in ...", a traceback of threading's internals, or that line cut short where
    formatting it needed memory there was none of) is counted here, not printed: it is a consequence of
    the memory already named, and it would break the one line that names it. Before that, and for any
    other process, Python's hooks print as ever what does not itself say memory. Installed once; the count
    is :func:`quieted`."""
    if sys.unraisablehook is not _unraisable:
        _Quiet.previous = sys.unraisablehook
        sys.unraisablehook = _unraisable
    if threading.excepthook is not _thread_failed:
        _Quiet.previous_thread = threading.excepthook
        threading.excepthook = _thread_failed
    if _Quiet.raise_logging is None:
        # a logging call that fails for want of memory (asyncio's "Exception in default exception handler"
        # in an event loop's thread) prints "--- Logging error ---" and a traceback; the standard library's
        # switch for that is this flag, which a diagnosis (it does not train) sets for its length
        _Quiet.raise_logging, logging.raiseExceptions = logging.raiseExceptions, False


def end_quiet() -> None:
    """Put Python's hook back where :func:`quiet_after_out_of_memory` installed its own, unless this process
    ran out of memory: then what its last finalizers would print (at its exit, after the line naming the
    memory) stays counted, not printed."""
    if _Seen.first is not None:
        return
    if sys.unraisablehook is _unraisable and _Quiet.previous is not None:
        sys.unraisablehook = _Quiet.previous  # type: ignore[assignment]
        _Quiet.previous = None
    if threading.excepthook is _thread_failed and _Quiet.previous_thread is not None:
        threading.excepthook = _Quiet.previous_thread  # type: ignore[assignment]
        _Quiet.previous_thread = None
    if _Quiet.raise_logging is not None:
        logging.raiseExceptions, _Quiet.raise_logging = _Quiet.raise_logging, None


def quieted() -> tuple[int, str | None]:
    """How many failures :func:`quiet_after_out_of_memory` kept off the terminal, and the first of them."""
    return _Quiet.count, _Quiet.first
