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

import atexit
import os
import sys

from stagebench._import_hook import PostImportFinder
from stagebench._signals import signals
from stagebench._spdl_private import MODE_VAR, PROFILE_MODULE, PYTORCH_DATALOADER_MODULE, TRUTHY, caller_num_threads
from stagebench.pipeline._state import LISTENING_VAR, State, claim_path, say

# Not `from typing import ...` (nor threading, traceback, contextlib): this module loads at every
# interpreter start while diagnostic mode is on, where each costs milliseconds (bench_startup).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


__all__ = ["install", "installed", "uninstall", "patch_spdl"]


def _patch_spdl(module: Any) -> None:
    patch_spdl(module)


def install() -> None:
    """Arrange for stagebench to replace SPDL's diagnostic mode when spdl is imported.

    The .pth line only checks that the variable exists (the shortest line compiles
    fastest: every interpreter start pays for it); its value is checked here.
    """
    if os.environ.get(MODE_VAR, "0") not in TRUTHY or installed():
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
    from stagebench.pipeline._loader_hook import install_loader_hook  # loader code: not at interpreter start

    install_loader_hook()
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
        # the diagnosis's modules load when a pipeline is built, not inside the user's `import spdl`
        from stagebench.pipeline._standin import build_standin

        return build_standin(cfg, caller_num_threads())

    _build_pipeline_diagnostic_mode._stagebench = True  # type: ignore[attr-defined]
    _build_pipeline_diagnostic_mode._spdl_original = current  # type: ignore[attr-defined]
    profile_module._build_pipeline_diagnostic_mode = _build_pipeline_diagnostic_mode
    _listen_for_a_worker()
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
    import multiprocessing  # at the program's exit only: it costs every interpreter start otherwise

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


def _listen_for_a_worker() -> None:
    """End this program cleanly when one of its ``multiprocessing.Pool`` workers has diagnosed.

    A worker's diagnosis ends the program (its ``pool.map`` would otherwise wait forever for tasks
    that exited). SIGTERM would show as a crash (exit 143, SPDL's native handler's stack trace), so the
    worker sends SIGUSR1, and this handler raises ``SystemExit`` with the worker's exit code in the main
    thread: the ``with Pool(...)`` block closes the pool and the program ends with the diagnosis's own
    code. Only where nobody else handles SIGUSR1 (Slurm and submitit may): there the worker falls back
    to SIGTERM.
    """
    signal = signals()
    if not hasattr(signal, "SIGUSR1") or signal.getsignal(signal.SIGUSR1) is not signal.SIG_DFL:
        return
    try:
        signal.signal(signal.SIGUSR1, _a_worker_diagnosed)
    except ValueError:  # not the main thread: no handler can be set, the worker falls back to SIGTERM
        return
    os.environ[LISTENING_VAR] = str(os.getpid())


def _stop_listening() -> None:
    """Undo :func:`_listen_for_a_worker`: SIGUSR1's own action back, and the variable gone."""
    signal = signals()
    if hasattr(signal, "SIGUSR1") and signal.getsignal(signal.SIGUSR1) is _a_worker_diagnosed:
        try:
            signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        except ValueError:  # not the main thread: the handler stays, and ends the process on a stray signal
            pass
    if os.environ.get(LISTENING_VAR) == str(os.getpid()):
        del os.environ[LISTENING_VAR]


def _a_worker_diagnosed(signum: int, frame: Any) -> None:
    signal = signals()
    path = claim_path(os.getpid())
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
