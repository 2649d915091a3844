"""Out of memory (stagebench/_memory): recognised in every shape it surfaces in, and what a process that ran
out does next (issue 59)."""

from __future__ import annotations

import errno
import mmap

import pytest

from stagebench import _memory
from stagebench._memory import MemoryReserve, describe, memory_short, out_of_memory, ran_out_of_memory


class _Group(Exception):
    """An exception group as SPDL's ``PipelineFailure`` is one on every Python: its members in ``exceptions``."""

    def __init__(self, message: str, exceptions: list[BaseException]) -> None:
        super().__init__(message)
        self.exceptions = tuple(exceptions)


def _raised_from(cause: BaseException, exc: BaseException) -> BaseException:
    try:
        try:
            raise cause
        except BaseException as c:
            raise exc from c
    except BaseException as e:
        return e


def _raised_while_handling(first: BaseException, then: BaseException) -> BaseException:
    try:
        try:
            raise first
        except BaseException:
            raise then
    except BaseException as e:
        return e


@pytest.mark.parametrize(
    ("exc", "what"),
    [
        (MemoryError(), "MemoryError"),
        (OSError(errno.ENOMEM, "Cannot allocate memory"), "OSError: [Errno 12] Cannot allocate memory"),
        (RuntimeError("can't start new thread"), "RuntimeError: can't start new thread"),
        (
            ImportError("libtiff-20b7e810.so.6.3.0: failed to map segment from shared object"),
            "ImportError: libtiff-20b7e810.so.6.3.0: failed to map segment from shared object",
        ),
        (
            ValueError("Error tokenizing data. C error: out of memory"),
            "ValueError: Error tokenizing data. C error: out of memory",
        ),
        # SPDL's PipelineFailure holds its stages' errors
        (_Group("pipeline stages failed", [ValueError("bad record"), MemoryError()]), "MemoryError"),
        (_raised_from(MemoryError(), RuntimeError("the point failed")), "MemoryError"),
        (
            _raised_while_handling(RuntimeError("can't start new thread"), RuntimeError("cannot join thread")),
            "RuntimeError: can't start new thread",
        ),
    ],
)
def test_each_shape_of_running_out_is_named_as_memory(exc, what):
    assert out_of_memory(exc) == what
    assert describe(exc) == f"out of memory: {what}"
    assert ran_out_of_memory() is not None


@pytest.mark.parametrize(
    "exc",
    [
        ValueError("bad record 3"),
        OSError(errno.ENOENT, "No such file or directory"),
        RuntimeError("cannot join thread before it is started"),
        KeyError("out of memory"),  # a key named so: text alone counts only in the errors that carry it
        _Group("pipeline stages failed", [ValueError("bad record")]),
    ],
)
def test_other_errors_are_not_memory_and_note_nothing(exc):
    assert out_of_memory(exc) is None
    assert describe(exc) == (f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
    assert ran_out_of_memory() is None


def test_a_context_that_was_suppressed_is_not_followed():
    """``raise X from None`` says the earlier error is not the cause: it is not read as one."""
    try:
        try:
            raise MemoryError()
        except MemoryError:
            raise ValueError("a value") from None
    except ValueError as e:
        assert out_of_memory(e) is None


def test_a_cycle_of_contexts_ends():
    a, b = ValueError("a"), ValueError("b")
    a.__context__, b.__context__ = b, a
    assert out_of_memory(a) is None


def test_a_process_that_never_ran_out_maps_nothing(monkeypatch):
    def no_map(*args, **kwargs):
        raise AssertionError("mapped")

    monkeypatch.setattr(mmap, "mmap", no_map)
    assert memory_short() is None


def test_a_process_that_ran_out_is_short_until_it_can_map_again(monkeypatch):
    out_of_memory(MemoryError())
    assert memory_short() is None  # its memory is back (a point that allocated a lot has ended)

    def enomem(*args, **kwargs):
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    monkeypatch.setattr(mmap, "mmap", enomem)
    short = memory_short()
    assert short is not None and "this process is out of memory (MemoryError" in short and "64 MB" in short
    _memory.forget()
    assert memory_short() is None and ran_out_of_memory() is None


def test_a_system_error_is_memory_only_in_a_process_that_ran_out_and_still_cannot_map(monkeypatch):
    """CPython's "error return without exception set" surfaced under ``ulimit -v`` from C code whose failed
    allocation lost its MemoryError (a test run of the leaking stage ended "internal error" so): memory where
    this process ran out and cannot map 64 MB now; a bug of ours, said as one, anywhere else."""
    lost = SystemError("error return without exception set")
    assert out_of_memory(lost) is None  # never ran out: a bug

    def enomem(*args, **kwargs):
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    out_of_memory(MemoryError())
    assert out_of_memory(lost) is None  # ran out, but its memory is back: a bug
    monkeypatch.setattr(mmap, "mmap", enomem)
    assert describe(lost) == "out of memory: SystemError: error return without exception set"


def test_the_first_failure_is_the_one_kept():
    out_of_memory(RuntimeError("can't start new thread"))
    out_of_memory(MemoryError())
    assert ran_out_of_memory() == "RuntimeError: can't start new thread"


def test_the_reserve_is_address_space_given_back_once(monkeypatch):
    reserve = MemoryReserve()
    assert reserve._block is not None and len(reserve._block) == MemoryReserve.SIZE
    reserve.release()
    reserve.release()  # again: nothing
    assert reserve._block is None

    def enomem(*args, **kwargs):
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    monkeypatch.setattr(mmap, "mmap", enomem)
    none = MemoryReserve()  # no room for one: the run goes on without it
    none.release()
    assert none._block is None


def test_after_out_of_memory_what_python_would_print_of_a_finalizer_is_counted_not_printed(monkeypatch):
    """CI, issue 59's ulimit test: in a process that had run out, a thread that could not start printed a
    traceback of threading's internals ("Exception ignored in thread started by"), or Python's own line cut
    short ("Exception ignored in sys.unraisablehook") where the one line naming the memory should be last.
    Before running out, Python's hook prints as ever."""
    import sys
    from types import SimpleNamespace

    printed: list[BaseException] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda args: printed.append(args.exc_value))
    monkeypatch.setattr(_memory._Quiet, "count", 0)
    monkeypatch.setattr(_memory._Quiet, "first", None)
    _memory.forget()
    _memory.quiet_after_out_of_memory()
    _memory.quiet_after_out_of_memory()  # once: a second call does not wrap the hook in itself
    try:
        sys.unraisablehook(SimpleNamespace(exc_value=KeyError(1)))
        assert len(printed) == 1 and _memory.quieted() == (0, None)
        sys.unraisablehook(SimpleNamespace(exc_value=MemoryError()))  # the failure itself: no memory to print it
        assert out_of_memory(MemoryError()) == "MemoryError"
        sys.unraisablehook(SimpleNamespace(exc_value=KeyError(2)))  # threading's internals, after it
        assert len(printed) == 1 and _memory.quieted() == (2, "MemoryError")
        _memory.end_quiet()  # a process that ran out keeps it to its exit
        assert sys.unraisablehook is _memory._unraisable
    finally:
        _memory.forget()
    _memory.end_quiet()  # one that did not (or has forgotten) gets Python's hook back
    assert sys.unraisablehook is not _memory._unraisable
    sys.unraisablehook(SimpleNamespace(exc_value=KeyError(3)))
    assert len(printed) == 2


def test_a_thread_that_fails_for_memory_is_counted_not_printed(monkeypatch):
    """A fresh clone's ulimit test: SPDL's event-loop thread, closing its loop, could not start the thread
    that shuts its executor down ("RuntimeError: can't start new thread"), and threading printed its
    traceback before the one line naming the memory. A thread's failure that says memory is counted, even
    before anything else said so; any other prints as ever."""
    import threading

    printed: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: printed.append(args.exc_value))
    monkeypatch.setattr(_memory._Quiet, "count", 0)
    monkeypatch.setattr(_memory._Quiet, "first", None)
    _memory.forget()

    def fails(exc: BaseException) -> None:
        def run() -> None:
            raise exc

        t = threading.Thread(target=run)
        t.start()
        t.join()

    _memory.quiet_after_out_of_memory()
    try:
        fails(KeyError(1))
        assert len(printed) == 1 and _memory.quieted() == (0, None)
        fails(RuntimeError("can't start new thread"))
        assert len(printed) == 1 and _memory.quieted() == (1, "RuntimeError: can't start new thread")
    finally:
        _memory.forget()
    _memory.end_quiet()
    assert threading.excepthook is not _memory._thread_failed
    fails(KeyError(2))
    assert len(printed) == 2


def test_a_diagnosis_keeps_a_logging_call_that_fails_off_the_terminal_and_gives_the_switch_back():
    """The same run, once more: asyncio's "Exception in default exception handler", logged in SPDL's event-loop
    thread as it ran out, printed "--- Logging error ---" and a traceback. The standard library's switch for
    that is logging.raiseExceptions: off for a diagnosis, as it was after it."""
    import logging

    before = logging.raiseExceptions
    _memory.forget()
    _memory.quiet_after_out_of_memory()
    try:
        assert logging.raiseExceptions is False
    finally:
        _memory.end_quiet()
    assert logging.raiseExceptions is before
