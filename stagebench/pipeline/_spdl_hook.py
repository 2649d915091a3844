"""The one place that touches SPDL's private diagnostic-mode hook (``spdl.pipeline._profile``).

SPDL's ``build_pipeline`` hands the pipeline config to
``spdl.pipeline._profile._build_pipeline_diagnostic_mode`` when
``SPDL_PIPELINE_DIAGNOSTIC_MODE`` is on. :func:`install` arranges for that
function to be replaced, as soon as the module is imported, by one that returns
a stand-in pipeline; iterating the stand-in runs the diagnosis and exits: the
training loop body never runs.

Imported at interpreter start while the mode is on (from the ``.pth`` file
through :mod:`stagebench._activate`), so its top level imports only the
standard library and :mod:`stagebench._import_hook`.
"""

from __future__ import annotations

import os
import sys

from stagebench._import_hook import PostImportFinder
from stagebench._spdl_private import PROFILE_MODULE, PYTORCH_DATALOADER_MODULE, caller_num_threads
from stagebench.pipeline._state import MODE_VAR, TRUTHY, State, say

# Not `from typing import ...` (nor threading, traceback, contextlib): this module loads at every
# interpreter start while diagnostic mode is on, where each costs milliseconds (bench_startup).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from stagebench.pipeline._run import Session
    from stagebench.pipeline._settings import DiagnoseSettings

__all__ = ["install", "installed", "uninstall", "patch_spdl", "exit_now", "release_held"]


def _patch_spdl(module: Any) -> None:
    patch_spdl(module)


def install() -> None:
    """Arrange for stagebench to replace SPDL's diagnostic mode when spdl is imported.

    The .pth line only checks that the variable exists (the shortest line compiles
    fastest: every interpreter start pays for it); its value is checked here.
    """
    if os.environ.get(MODE_VAR, "0") not in TRUTHY:
        return
    if installed():
        return
    if os.environ.get("STAGEBENCH_NPROC_PER_NODE") and "LOCAL_RANK" not in os.environ:
        _as_ranks()
    if PROFILE_MODULE in sys.modules:  # already imported: patch in place
        _patch_spdl(sys.modules[PROFILE_MODULE])
    sys.meta_path.insert(0, PostImportFinder((PROFILE_MODULE,), _patch_spdl))
    # PyTorch users: the first DataLoader the script iterates is swept (once torch's module is imported)
    loaders = PostImportFinder(LOADER_MODULES, _catch_loaders)
    for name in LOADER_MODULES:
        if name in sys.modules:
            _catch_loaders(sys.modules[name])
    sys.meta_path.insert(0, loaders)


#: The modules whose loaders the DataLoader hook catches (:mod:`stagebench.loader._intercept`).
LOADER_MODULES = ("torch.utils.data.dataloader", PYTORCH_DATALOADER_MODULE)


def _catch_loaders(module: Any) -> None:
    """Install the DataLoader hook (:func:`stagebench.pipeline._loader_hook.install_loader_hook`), now that a
    loader's module is imported: importing it at interpreter start would cost every program torch's time."""
    from stagebench.pipeline._loader_hook import install_loader_hook

    install_loader_hook()
    import atexit

    atexit.unregister(_say_if_nothing_diagnosed)  # once, however many modules ask
    atexit.register(_say_if_nothing_diagnosed)


def _as_ranks() -> None:
    """``STAGEBENCH_NPROC_PER_NODE=N`` with the variable: this program becomes ``stagebench diagnose
    --nproc-per-node N`` on the same script and arguments (torch's launcher starts the ranks), before any
    of the script runs. Only a program started as ``python script.py``; anything else is said and run as
    it is."""
    argv = list(getattr(sys, "orig_argv", ()))
    script = sys.argv[0] if sys.argv else ""
    if "-c" in argv or "--multiprocessing-fork" in argv or not script or not os.path.isfile(script):
        say("STAGEBENCH_NPROC_PER_NODE is set but this program is no script (python script.py): not relaunched")
        return
    n = os.environ.pop("STAGEBENCH_NPROC_PER_NODE")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "stagebench", "diagnose", f"--nproc-per-node={n}", *sys.argv])


def installed() -> bool:
    """Whether :func:`install` put its post-import hook in this process."""
    return any(getattr(f, "on_import", None) is _patch_spdl for f in sys.meta_path)


def uninstall() -> None:
    """Undo :func:`install`: remove the hook and give SPDL its own diagnostic mode back.

    For ``stagebench diagnose`` run inside a longer-lived process (a test, a
    notebook): the hook would otherwise stay in every later import, and a later
    pipeline built with the variable set would be replaced by the stand-in.
    """
    sys.meta_path[:] = [f for f in sys.meta_path if getattr(f, "on_import", None) not in (_patch_spdl, _catch_loaders)]
    profile: Any = sys.modules.get(PROFILE_MODULE)
    current: Any = getattr(profile, "_build_pipeline_diagnostic_mode", None)
    if getattr(current, "_stagebench", False):
        profile._build_pipeline_diagnostic_mode = current._spdl_original
    _stop_listening()
    import atexit

    atexit.unregister(_say_if_nothing_diagnosed)


def patch_spdl(profile_module: Any) -> None:
    """Make SPDL's diagnostic mode build stagebench's stand-in pipeline.

    Called by the post-import hook when ``spdl.pipeline._profile`` is imported.
    Must stay cheap: it runs inside the user's ``import spdl``.
    """
    current = getattr(profile_module, "_build_pipeline_diagnostic_mode", None)
    if getattr(current, "_stagebench", False):
        return

    def _build_pipeline_diagnostic_mode(cfg: Any) -> Any:
        # the user's shared thread pool size: the runs at the user's own settings use it
        return _build_standin(cfg, caller_num_threads())

    _build_pipeline_diagnostic_mode._stagebench = True  # type: ignore[attr-defined]
    _build_pipeline_diagnostic_mode._spdl_original = current  # type: ignore[attr-defined]
    profile_module._build_pipeline_diagnostic_mode = _build_pipeline_diagnostic_mode
    _listen_for_a_worker()
    import atexit

    atexit.unregister(_say_if_nothing_diagnosed)  # once, however often spdl is patched
    atexit.register(_say_if_nothing_diagnosed)


def _say_if_nothing_diagnosed() -> None:
    """At the exit of a program run under the mode that imported spdl and never iterated a pipeline: say so.

    ``stagebench diagnose`` says it (:func:`stagebench.pipeline._script.run_script`); the mode alone
    said nothing: SPDL's ``pipeline_profiling.py``, which calls ``profile_pipeline`` itself, ran its own
    profiler and ended as if stagebench were not there. Only in the program's own process, while the
    mode is still on (a diagnosis turns it off for the processes it starts; ``run_script`` restores
    it), and only where no diagnosis started or ended here (a pool worker's ends the program too).
    """
    if os.environ.get(MODE_VAR, "0") not in TRUTHY or State.started or State.finished or State.in_process:
        return
    import multiprocessing

    if multiprocessing.parent_process() is not None:  # a worker of the program, not the program
        return
    if "torch.distributed.elastic.agent.server.api" in sys.modules:  # torch's launcher, not a rank it started
        return
    intercept: Any = sys.modules.get("stagebench.loader._intercept")
    if intercept is not None and intercept.loader_was_caught():
        return
    say(
        f"{MODE_VAR} is on, but this program iterated no SPDL pipeline (one built by build_pipeline or "
        "PipelineBuilder.build) and no DataLoader: nothing was diagnosed. SPDL's profile_pipeline, called "
        "directly, runs SPDL's own profiler"
    )


#: Set in this process's environment (so its pool workers inherit it) once it listens for a worker's
#: diagnosis to end it: the worker then signals it rather than terminating it.
LISTENING_VAR = "STAGEBENCH_ENDS_ON_SIGUSR1"


def _claim_path(parent: int) -> str:
    """The lock file a pool worker of ``parent`` takes to diagnose; it then holds the exit code."""
    import tempfile

    return os.path.join(tempfile.gettempdir(), f"stagebench-{os.getuid()}-{parent}.diagnosing")


def _listen_for_a_worker() -> None:
    """End this program cleanly when one of its ``multiprocessing.Pool`` workers has diagnosed.

    A worker's diagnosis ends the program (its ``pool.map`` would otherwise wait forever for tasks
    that exited). SIGTERM did that, and showed as a crash: exit 143, and SPDL's native signal handler
    printed a stack trace (``*** Aborted at ... SIGTERM received``). The worker sends SIGUSR1 instead,
    and this handler raises ``SystemExit`` with the worker's exit code in the main thread, so the
    ``with Pool(...)`` block closes the pool and the program ends with the diagnosis's own code. Only
    where nobody else handles SIGUSR1 (Slurm and submitit may): there the worker falls back to SIGTERM.
    """
    import signal

    if not hasattr(signal, "SIGUSR1") or signal.getsignal(signal.SIGUSR1) is not signal.SIG_DFL:
        return
    try:
        signal.signal(signal.SIGUSR1, _a_worker_diagnosed)
    except ValueError:  # not the main thread: no handler can be set, the worker falls back to SIGTERM
        return
    os.environ[LISTENING_VAR] = str(os.getpid())


def _stop_listening() -> None:
    """Undo :func:`_listen_for_a_worker`: SIGUSR1's own action back, and the variable gone."""
    import signal

    if hasattr(signal, "SIGUSR1") and signal.getsignal(signal.SIGUSR1) is _a_worker_diagnosed:
        try:
            signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        except ValueError:  # not the main thread: the handler stays, and ends the process on a stray signal
            pass
    if os.environ.get(LISTENING_VAR) == str(os.getpid()):
        del os.environ[LISTENING_VAR]


def _a_worker_diagnosed(signum: int, frame: Any) -> None:
    import signal

    path = _claim_path(os.getpid())
    try:
        if os.stat(path).st_uid != os.getuid():
            raise OSError("not ours")
        with open(path) as f:
            code = int(f.read().strip() or "0")
        os.unlink(path)
    except (OSError, ValueError):  # not a worker's diagnosis: SIGUSR1's own action (the process ends)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    State.finished, State.code = True, code
    raise SystemExit(code)


def _build_standin(cfg: Any, num_threads: int | None = None) -> Any:
    from stagebench.pipeline._settings import DiagnoseSettings, SettingsError

    try:
        settings = DiagnoseSettings.from_env()
    except SettingsError as e:
        say(f"error: {e}")
        raise SystemExit(2) from None
    standin = _standin_class()(cfg, settings)
    standin._stagebench_num_threads = num_threads
    return standin


_STANDIN: type | None = None


def _standin_class() -> type:
    """A :class:`spdl.pipeline.Pipeline` look-alike (``isinstance`` checks still pass)."""
    global _STANDIN
    if _STANDIN is not None:
        return _STANDIN
    from contextlib import contextmanager

    from spdl.pipeline import Pipeline

    class DiagnosticPipeline(Pipeline):
        """Stands in for the user's pipeline: iterating it runs the diagnosis, then exits."""

        def __init__(self, cfg: Any, settings: DiagnoseSettings) -> None:  # no super(): nothing to start
            self._stagebench_cfg = cfg
            self._stagebench_settings = settings
            self._stagebench_num_threads: int | None = None

        def __str__(self) -> str:
            return f"stagebench diagnostic pipeline for\n{self._stagebench_cfg!r}"

        def start(self, *, timeout: float | None = None, **kwargs: Any) -> None:
            pass

        def stop(self, *, timeout: float | None = None, **kwargs: Any) -> None:
            pass

        @contextmanager
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

    _STANDIN = DiagnosticPipeline
    return _STANDIN


def _job_on_this_host() -> bool:
    """Whether your loop may run: not in a job of several hosts (:func:`stagebench.runs._ranks.no_job_across_hosts`)."""
    from stagebench.runs._ranks import no_job_across_hosts

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
    import threading

    from stagebench.core._executors import exit_may_hang

    State.finished, State.code = True, code
    _end_ranks(code)
    sys.stdout.flush()
    sys.stderr.flush()
    if State.end_parent is not None:  # a pool worker: its parent's pool.map would wait for it forever
        import contextlib
        import signal

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


def release_held() -> None:
    """Let go of what the diagnosis held and free it now, while the interpreter can still free it.

    Runs as the program ends (an ``atexit`` hook: after the ``SystemExit`` that ends a diagnosis has
    left the user's loop, and after the pipelines' threads were joined) and as :func:`run_script`
    returns. A diagnosis keeps real stage outputs (``Plan.sample_outputs``, each stand-in's
    ``_Outputs``, the cached inputs of the points) and builds dozens of SPDL pipelines whose queues
    still hold items when they stop (the job runs' batches). At the end all of it is garbage, but in
    reference cycles: the stopped pipelines (their event loop, tasks and a ``CancelledError``'s
    traceback), and the diagnosis's own frames, kept by an exception that a library raised and caught
    while the report imported matplotlib. Left to the interpreter's last collection, they were freed
    while it finalises, and a torch tensor view freed then does not release the numpy array under its
    base: the ``CPUBuffer`` that spdl.io decoded into stayed alive, and nanobind printed "leaked 1
    instances! ... CPUBuffer" on the user's terminal (issue 60; one run in three of SPDL's
    imagenet_classification.py with ``--trainer``, every run of a script that disables ``gc``). What a
    class or module of ours still points to (a follower's walk; the SPDL harness's stopped runners,
    with their inputs) is dropped first: the collection cannot free what is reachable.
    """
    import gc

    State.walk = None
    harness: Any = sys.modules.get("stagebench.core._spdl_harness")
    if harness is not None:
        harness.settle(timeout=0)  # the runners whose pipeline has stopped, and their inputs, go
    gc.collect()


def _end_ranks(code: int) -> None:
    """Every rank of the host ends with the same code: the leader tells it (and waits until each read it);
    a follower, that has it from the leader, leaves (:class:`stagebench.core._ranks.HostGroup`)."""
    group, State.group = State.group, None
    if group is None:
        return
    if group.leader:
        group.end(code)
    else:
        from stagebench._signals import ignore_sigterm

        ignore_sigterm()  # leaving with the leader's code, whatever torch's launcher does to the last ranks
        group.bye()


def _in_a_pool_worker(settings: DiagnoseSettings) -> DiagnoseSettings:
    """The settings for a pipeline built inside a daemonic process (a ``multiprocessing.Pool`` worker).

    Such a process cannot start processes, so only threads are measured, and it says why. Its
    siblings build the same pipeline: one diagnoses (the first to claim the parent's lock file);
    the others wait, and the parent program is ended when the diagnosis is done
    (:func:`exit_now`): its ``pool.map`` would otherwise wait forever for tasks that exited.
    """
    import multiprocessing
    import time
    from dataclasses import replace

    if not multiprocessing.current_process().daemon:
        return settings
    parent = os.getppid()
    lock = _claim_path(parent)
    try:  # O_EXCL: a file (or a planted link) already there is never followed or reused
        os.close(os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        # A sibling worker diagnoses and ends the parent when it is done; this one leaves then (it
        # would otherwise hold the parent's stdout open, and a caller waiting on it would wait forever).
        # The pool's clean-up terminates it: quietly, not with a native library's crash report.
        import signal

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
    from stagebench.core._ranks import lead, meet
    from stagebench.pipeline._diagnose import DiagnoseError, diagnose_pipeline
    from stagebench.runs._outcome import FAILED, INTERNAL, RANK_LOST, TERMINATED, interrupted_outcome

    group = State.group = meet("pipeline", say)
    settings = _in_a_pool_worker(settings)
    State.started = True
    import atexit

    atexit.unregister(release_held)  # once, however many pipelines this process diagnoses
    atexit.register(release_held)  # the program ends by SystemExit: what the diagnosis held goes first
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
        from stagebench._memory import CAUSE, out_of_memory

        what = out_of_memory(e)
        if what:  # no bug of ours: a stage left this process no memory before the run could say so itself
            where = f"; the rows measured so far are in {State.run_dir}" if State.run_dir else ""
            say(f"error: out of memory ({what}): {CAUSE}{where}")
            exit_now(FAILED.exit_code)
        import traceback  # our bug, not the user's: show where it happened

        traceback.print_exc()
        where = f"; the rows measured so far are in {State.run_dir}" if State.run_dir else ""
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
    from stagebench.runs._outcome import outcome
    from stagebench.runs._results import RunDir, RunFileError

    if State.run_dir is None:
        return 0
    try:
        return outcome(RunDir(State.run_dir).read_meta().get("status")).exit_code
    except (OSError, RunFileError):
        return 0


def _follow(group: Any, cfg: Any, settings: DiagnoseSettings, num_threads: int | None) -> None:
    """A follower's part (:func:`stagebench.pipeline._follow.follow_pipeline`): ends the program with the
    leader's code, or returns as the leader's job phase begins (this rank's walk in ``State.walk``)."""
    from stagebench._errors import RankLost
    from stagebench.pipeline._follow import follow_pipeline
    from stagebench.runs._outcome import RANK_LOST

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
    from stagebench.pipeline._run import Session

    session = Session()
    summary = _diagnose(cfg, settings, num_threads, session)
    from stagebench.core._progress import message
    from stagebench.pipeline._trainer import follower_trainer_phases, run_trainer_phases

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
    from stagebench.job._phase import end_from_close

    State.finished, State.code = True, code
    _end_ranks(code)
    end_from_close(code, in_process=State.in_process)
