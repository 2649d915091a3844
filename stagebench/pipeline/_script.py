"""``stagebench diagnose script.py ARGS``: run a user's script as ``__main__`` in diagnostic mode."""

from __future__ import annotations

import atexit
import logging
import os
import runpy
import sys
import traceback
from pathlib import Path
from typing import Any

from stagebench._settings import SettingsError, check, local_rank
from stagebench._spdl_private import MODE_VAR
from stagebench.loader._intercept import loader_was_caught
from stagebench.pipeline import _spdl_hook
from stagebench.pipeline._loader_hook import install_loader_hook
from stagebench.pipeline._settings import DiagnoseSettings
from stagebench.pipeline._state import State, release_at_exit, release_held, say
from stagebench.runs._results import RunDir, RunDirInUseError, UnwritableOutputError

__all__ = ["run_script", "launch_ranks", "restore_env"]


def run_script(
    script: str, args: list[str], *, out: str | None, nproc_per_node: int | None = None, own_process: bool = False
) -> int:
    """Run ``script`` with ``args`` as ``__main__`` in diagnostic mode; return the exit code.

    ``nproc_per_node`` (or ``STAGEBENCH_NPROC_PER_NODE``): run it as that many ranks of a data-parallel job
    instead (:func:`launch_ranks`). ``own_process``: the caller is the command itself, whose process may end
    where the user's loop stops early (:func:`stagebench.job._phase.end_from_close`): raised there instead, as
    for a test or a notebook, the end is lost where the loop's generator is closed by the collector."""
    path = Path(script)
    if not path.is_file():
        say(f"error: script not found: {script}")
        return 2
    saved_env = {k: os.environ.get(k) for k in (MODE_VAR, "STAGEBENCH_OUTPUT_DIR")}
    if out is not None:
        os.environ["STAGEBENCH_OUTPUT_DIR"] = out
    try:
        settings = DiagnoseSettings.from_env()
        rank = local_rank()
        nproc = nproc_per_node if nproc_per_node is not None else settings.nproc_per_node
        if nproc is not None:
            check("nproc_per_node", nproc, "--nproc-per-node")
    except SettingsError as e:
        say(f"error: {e}")
        restore_env(saved_env)
        return 2
    if nproc is not None and "LOCAL_RANK" not in os.environ:
        try:
            return launch_ranks(nproc, script, args)
        finally:
            restore_env(saved_env)
    # Under torchrun every rank runs this; only rank 0 writes the run directory (the
    # others leave quietly once their pipeline or loader is built, as SPDL's own mode does).
    if settings.output_dir and rank == 0:
        # Before the script runs: its own start-up may take minutes, and then
        # neither the pipeline nor a caught DataLoader could use this folder.

        try:
            RunDir.create(settings.output_dir, fresh=True)
        except (UnwritableOutputError, RunDirInUseError) as e:
            say(f"error: {e}")
            restore_env(saved_env)
            return 2
    os.environ[MODE_VAR] = "1"
    State.started = State.finished = State.released = False
    State.code = None
    State.on_start, State.loader_hook = [], None
    install_loader_hook(settings)  # before spdl's: a pipeline diagnosed first removes it
    was_installed = _spdl_hook.installed()
    _spdl_hook.install()
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = [str(path), *args]
    sys.path.insert(0, str(path.resolve().parent))
    code: int
    raised: str | None = None
    State.in_process, State.own_process = True, own_process
    try:
        runpy.run_path(str(path), run_name="__main__")
        code = 0
    except SystemExit as e:
        code = _exit_code(e.code)
    except KeyboardInterrupt as e:  # a sweep that was stopped says where what it measured is
        say(f"interrupted; {e}" if str(e) else "interrupted")
        code = 130
    except Exception as e:  # the script's own error: shown as Python shows it, then said
        _print_script_traceback(e, str(path))
        raised, code = f"{type(e).__name__}: {e}", 1
    finally:
        State.in_process = State.own_process = False
        sys.argv, sys.path[:] = saved_argv, saved_path
        restore_env(saved_env)
        if not was_installed:  # in-process callers (tests, notebooks) get their import system back
            _spdl_hook.uninstall()
        if State.started:  # the script's frames are gone: what the diagnosis held is garbage, freed now
            release_held()
            atexit.unregister(release_at_exit)
    for hook in State.on_start:
        hook()
    State.on_start = []
    if State.finished and State.code is not None:
        return State.code
    if loader_was_caught():
        return code
    if not State.started:
        how = f"raised {raised}" if raised else f"finished (exit code {code})"
        say(f"error: {script} {how} without iterating an SPDL pipeline or a DataLoader: nothing was diagnosed")
        return code or 1
    return code


def launch_ranks(nproc: int, script: str, args: list[str]) -> int:
    """``script`` run as ``nproc`` ranks of a data-parallel job on this host, through torch's own launcher
    (``torch.distributed.run --standalone``: what ``torchrun`` runs), each rank under ``stagebench
    diagnose`` (the settings travel in the environment), diagnosed together. Returns the ranks' exit code
    (every rank ends with the same one). The launcher's own failure report is left out: a rank that
    failed has said why, and the run directory holds what was measured."""
    # torch only where ranks are launched: `stagebench diagnose` does not pay for it otherwise
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    os.environ.pop("STAGEBENCH_NPROC_PER_NODE", None)  # the ranks run the script, not the launch
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    say(f"running {script} as {nproc} ranks on this host (torch.distributed.run --standalone), diagnosed together")
    try:
        torchrun(["--standalone", f"--nproc-per-node={nproc}", "-m", "stagebench", "diagnose", script, *args])
    except ChildFailedError as e:
        _, failure = e.get_first_failure()
        return int(failure.exitcode) if failure.exitcode > 0 else 128 - int(failure.exitcode)
    return 0


def _print_script_traceback(exc: BaseException, filename: str) -> None:
    """The traceback of an exception the user's script raised, from the script's own frame on.

    What ``python script.py`` would print: stagebench's and runpy's frames
    above it are how the script was started, not where it went wrong.
    """
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != filename:
        tb = tb.tb_next
    if tb is None and isinstance(exc, SyntaxError):
        # The script did not compile: no frame of it ran. Python shows the line and the caret only.
        print("".join(traceback.format_exception_only(type(exc), exc)), end="", file=sys.stderr)
        return
    traceback.print_exception(type(exc), exc, tb or exc.__traceback__, file=sys.stderr)


def _exit_code(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    print(value, file=sys.stderr)
    return 1


def restore_env(saved: dict[str, str | None]) -> None:
    """Put back the environment variables ``saved`` (name -> value before, None: unset); returns nothing."""
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
