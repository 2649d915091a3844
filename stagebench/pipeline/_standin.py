"""The stand-in SPDL pipeline, and the diagnosis that iterating it runs.

:mod:`._spdl_hook` makes SPDL's diagnostic mode build a :class:`DiagnosticPipeline` in place of the
user's pipeline. Iterating it runs the diagnosis (:mod:`._diagnose`; on a rank other than the host's
leader, :mod:`._follow`), then the job phase where the user's loop is measured (:mod:`._trainer`), and
ends the program with the run's exit code. This module loads when a pipeline is built, not at
interpreter start: what it imports is paid by a diagnosis only.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import replace
from typing import Any

from spdl.pipeline import Pipeline

from stagebench._errors import RankLost
from stagebench._memory import CAUSE, out_of_memory
from stagebench._settings import SettingsError
from stagebench._signals import ignore_sigterm
from stagebench._spdl_private import MODE_VAR
from stagebench.core._executors import exit_may_hang
from stagebench.core._progress import message
from stagebench.core._ranks import lead, meet
from stagebench.job._phase import end_from_close
from stagebench.pipeline._diagnose import DiagnoseError, diagnose_pipeline
from stagebench.pipeline._follow import follow_pipeline
from stagebench.pipeline._run import Session
from stagebench.pipeline._settings import DiagnoseSettings
from stagebench.pipeline._state import LISTENING_VAR, State, claim_path, release_at_exit, say
from stagebench.pipeline._trainer import follower_trainer_phases, run_trainer_phases
from stagebench.runs._outcome import FAILED, INTERNAL, RANK_LOST, TERMINATED, interrupted_outcome, outcome
from stagebench.runs._ranks import no_job_across_hosts
from stagebench.runs._results import RunDir, RunFileError

__all__ = ["DiagnosticPipeline", "build_standin", "exit_now"]


class DiagnosticPipeline(Pipeline):
    """Stands in for the user's pipeline: iterating it runs the diagnosis, then exits."""

    def __init__(self, cfg: Any, settings: DiagnoseSettings, num_threads: int | None) -> None:  # no super()
        self._stagebench_cfg = cfg
        self._stagebench_settings = settings
        self._stagebench_num_threads = num_threads

    def __str__(self) -> str:
        return f"stagebench diagnostic pipeline for\n{self._stagebench_cfg!r}"

    def start(self, *, timeout: float | None = None, **kwargs: Any) -> None:
        pass

    def stop(self, *, timeout: float | None = None, **kwargs: Any) -> None:
        pass

    @contextlib.contextmanager
    def auto_stop(self, *, timeout: float | None = None):
        yield

    def get_item(self, *, timeout: float | None = None) -> Any:
        _diagnose_and_exit(self._stagebench_cfg, self._stagebench_settings, self._stagebench_num_threads)

    def _get_item_nowait(self) -> Any:
        _diagnose_and_exit(self._stagebench_cfg, self._stagebench_settings, self._stagebench_num_threads)

    def get_iterator(self, *, timeout: float | None = None):
        return self._stagebench_iter()

    def __iter__(self):
        return self._stagebench_iter()

    def _stagebench_iter(self):
        if self._stagebench_settings.trainer == "measure" and _job_on_this_host():
            yield from _diagnose_then_train(
                self._stagebench_cfg, self._stagebench_settings, self._stagebench_num_threads
            )
        _diagnose_and_exit(self._stagebench_cfg, self._stagebench_settings, self._stagebench_num_threads)
        yield  # pragma: no cover - never reached: the diagnosis exits


def build_standin(cfg: Any, num_threads: int | None = None) -> DiagnosticPipeline:
    """The stand-in for the pipeline ``cfg`` (``num_threads``: the user's shared pool's size, where known),
    with the settings read from the environment; a bad setting is said in one line and ends the program."""
    try:
        settings = DiagnoseSettings.from_env()
    except SettingsError as e:
        say(f"error: {e}")
        raise SystemExit(2) from None
    return DiagnosticPipeline(cfg, settings, num_threads)


def _job_on_this_host() -> bool:
    """Whether your loop may run: not in a job of several hosts (:func:`stagebench.runs._ranks.no_job_across_hosts`)."""
    why = no_job_across_hosts()
    if why is not None and os.environ.get("LOCAL_RANK", "0") == "0":  # said once, by the host's leader
        say(why)
    return why is None


def exit_now(code: int) -> None:
    """End the program with ``code``, promptly.

    ``SystemExit`` normally; ``os._exit`` when raising would not end the
    program: the diagnosis ran in a thread other than the main one (SystemExit
    would only end that thread), or a hung stage left a thread that the
    interpreter would wait for at exit (or one stuck starting a thread in a
    process that ran out of memory). Under :func:`run_script` (the
    ``stagebench diagnose`` command, or a test or notebook calling it) a
    leaked thread is its caller's business: ``os._exit`` there would end the
    caller's process too (a test session would stop, silently, with code 0),
    so ``SystemExit`` reaches ``run_script`` and the command exits promptly
    itself (``_cli.console``).
    """
    State.finished, State.code = True, code
    _end_ranks(code)
    sys.stdout.flush()
    sys.stderr.flush()
    if State.end_parent is not None:  # a pool worker: its parent's pool.map would wait for it forever
        if os.environ.get(LISTENING_VAR) == str(State.end_parent):  # it ends itself, with our code
            with contextlib.suppress(OSError), open(State.claim or "", "w") as f:
                f.write(str(code))
            os.kill(State.end_parent, signal.SIGUSR1)
        else:
            with contextlib.suppress(OSError):
                os.unlink(State.claim or "")
            os.kill(State.end_parent, signal.SIGTERM)
        os._exit(code)
    if threading.current_thread() is not threading.main_thread() or (exit_may_hang() and not State.in_process):
        os._exit(code)
    raise SystemExit(code)


def _end_ranks(code: int) -> None:
    """Every rank of the host ends with the same code: the leader tells it (and waits until each read it);
    a follower, that has it from the leader, leaves (:class:`stagebench.core._ranks.HostGroup`)."""
    group, State.group = State.group, None
    if group is None:
        return
    if group.leader:
        group.end(code)
    else:
        ignore_sigterm()  # leaving with the leader's code, whatever torch's launcher does to the last ranks
        group.bye()


def _in_a_pool_worker(settings: DiagnoseSettings) -> DiagnoseSettings:
    """The settings for a pipeline built inside a daemonic process (a ``multiprocessing.Pool`` worker).

    Such a process cannot start processes, so only threads are measured, and it says why. Its
    siblings build the same pipeline: one diagnoses (the first to claim the parent's lock file);
    the others wait, and the parent program is ended when the diagnosis is done
    (:func:`exit_now`): its ``pool.map`` would otherwise wait forever for tasks that exited.
    """
    if not multiprocessing.current_process().daemon:
        return settings
    parent = os.getppid()
    lock = claim_path(parent)
    try:  # O_EXCL: a file (or a planted link) already there is never followed or reused
        os.close(os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        # A sibling worker diagnoses and ends the parent when it is done; this one leaves then (it
        # would otherwise hold the parent's stdout open, and a caller waiting on it would wait forever).
        # The pool's clean-up terminates it: quietly, not with a native library's crash report.

        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
        while os.getppid() == parent:
            time.sleep(0.2)
        os._exit(0)
    State.end_parent, State.claim = parent, lock
    say(
        "this pipeline runs in a daemonic process (a multiprocessing.Pool worker), which cannot start "
        "processes: process executors are not measured; the program ends when the diagnosis is done"
    )
    return replace(settings, executors=tuple(e for e in settings.executors if e != "process") or ("thread",))


def _diagnose(
    cfg: Any, settings: DiagnoseSettings, num_threads: int | None, session: Session | None = None
) -> dict | None:
    """Run the diagnosis and return its summary; on an error, say it and end the program.

    Under torchrun every local rank gets here: local rank 0 diagnoses, each other rank runs what it
    measures at the same time (:mod:`stagebench.pipeline._follow`) and ends with its code, or, where the
    loop is measured, returns None and its walk is in ``State.walk`` for the job phase.
    """
    group = State.group = meet("pipeline", say)
    settings = _in_a_pool_worker(settings)
    State.started = True

    atexit.unregister(release_at_exit)  # once, however many pipelines this process diagnoses
    atexit.register(release_at_exit)  # the program ends by SystemExit: what the diagnosis held goes first
    for hook in State.on_start:
        hook()  # e.g. remove the DataLoader hook: this run diagnoses the pipeline
    State.on_start = []
    State.original_mode = os.environ.get(MODE_VAR)
    # Worker processes inherit the environment; none of them may diagnose.
    os.environ[MODE_VAR] = "0"
    if group is not None and not group.leader:
        _follow(group, cfg, settings, num_threads)
        return None
    try:
        with lead(group):
            summary = diagnose_pipeline(cfg, settings=settings, num_threads=num_threads, session=session)
    except DiagnoseError as e:
        say(f"error: {e}")
        exit_now(e.code)
    except KeyboardInterrupt as e:
        where = f" in {State.run_dir}" if State.run_dir else ""
        end = interrupted_outcome(e)
        how = str(e) if end is RANK_LOST else "terminated (SIGTERM)" if end is TERMINATED else "interrupted"
        report = State.run_dir / "report.html" if State.run_dir else None
        said = f", and a report of them: {report}" if report is not None and report.is_file() else ""
        say(f"{how}; the rows measured so far are on disk{where}{said}")
        exit_now(end.exit_code)
    except Exception as e:
        what = out_of_memory(e)
        where = f"; the rows measured so far are in {State.run_dir}" if State.run_dir else ""
        if what:  # no bug of ours: a stage left this process no memory before the run could say so itself
            say(f"error: out of memory ({what}): {CAUSE}{where}")
            exit_now(FAILED.exit_code)
        traceback.print_exc()  # our bug, not the user's: show where it happened
        say(f"internal error while diagnosing: {type(e).__name__}: {e}{where}")
        exit_now(INTERNAL.exit_code)
    failed = summary.get("validation_failed")
    if failed:  # a pipeline that delivers nothing is not a diagnosed pipeline, whatever was predicted
        say(f"error: validation failed: {failed}; the rows and the stages' reasons are in {State.run_dir}")
        exit_now(FAILED.exit_code)
    code = _exit_code_of_run()
    if code:  # an internal error or a file not written: said by the diagnosis, told by the exit code
        exit_now(code)
    return summary


def _exit_code_of_run() -> int:
    """The exit code of the run's outcome, as its run.json records it (0 where it cannot be read)."""
    if State.run_dir is None:
        return 0
    try:
        return outcome(RunDir(State.run_dir).read_meta().get("status")).exit_code
    except (OSError, RunFileError):
        return 0


def _follow(group: Any, cfg: Any, settings: DiagnoseSettings, num_threads: int | None) -> None:
    """A follower's part (:func:`stagebench.pipeline._follow.follow_pipeline`): ends the program with the
    leader's code, or returns as the leader's job phase begins (this rank's walk in ``State.walk``)."""
    try:
        done, walk = follow_pipeline(group, cfg, settings, num_threads)
    except RankLost as e:
        say(f"local rank {group.rank}: {e}")
        exit_now(RANK_LOST.exit_code)
        return
    if done.code is not None:
        exit_now(done.code)
    State.walk = walk


def _diagnose_and_exit(cfg: Any, settings: DiagnoseSettings, num_threads: int | None = None) -> None:
    _diagnose(cfg, settings, num_threads)
    exit_now(0)


def _diagnose_then_train(cfg: Any, settings: DiagnoseSettings, num_threads: int | None):
    """The diagnosis, then the user's loop measured on cached and real batches (:mod:`._trainer`), then exit."""
    session = Session()
    summary = _diagnose(cfg, settings, num_threads, session)

    if summary is None:  # a follower: its loop runs the steps the leader's does, on its own pipeline
        walk = State.walk
        yield from follower_trainer_phases(
            State.group, walk.plan, walk.source_items, settings.timeout_s, say, _end_from_close
        )
        return
    message("that was the pipeline alone; your training loop runs next, and the advice is for your job")

    code = yield from run_trainer_phases(session, settings, message, _end_from_close, State.group)
    exit_now(code)


def _end_from_close(code: int) -> None:
    """End the program from the user's loop stopping early (:func:`stagebench.job._phase.end_from_close`)."""
    State.finished, State.code = True, code
    _end_ranks(code)
    end_from_close(code, in_process=State.in_process and not State.own_process)
