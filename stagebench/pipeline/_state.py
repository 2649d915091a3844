"""What happened in this process: whether a diagnosis started, where, and how it ended.

The SPDL hook and the stand-in write it, ``run_script`` reads it; and what ends with the process: the
lock file a pool worker claims a diagnosis with, what the diagnosis held let go of. Standard library only.
"""

from __future__ import annotations

import gc
import os
import sys

# Not `from typing import ...` (nor pathlib, contextlib): this module loads at interpreter start
# while diagnostic mode is on, where each of those costs milliseconds (bench_startup).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

__all__ = [
    "State",
    "say",
    "LISTENING_VAR",
    "claim_path",
    "release_held",
    "release_at_exit",
    "freeze_for_exit",
]


class State:
    """What happened in this process (run_script reports on it)."""

    started = False
    finished = False
    code: int | None = None
    run_dir: Path | None = None
    original_mode: str | None = None  # the variable's value before a diagnosis set it to 0
    on_start: list = []  # called once when a pipeline diagnosis starts (removes the DataLoader hook)
    loader_hook: object = None  # the DataLoader hook's remover, once this process installed it
    group: Any = None  # the host's ranks (core/_ranks.HostGroup) where a torchrun job runs several
    walk: Any = None  # a follower's walk of its pipeline (pipeline/_follow.Walk), for the job phase
    in_process = False  # run_script is running the script: it, not the interpreter's exit, ends the diagnosis
    # the command itself runs the script (stagebench diagnose), not a test or notebook: the process may end with
    # the diagnosis, as it does in diagnostic mode
    own_process = False
    end_parent: int | None = None  # a multiprocessing.Pool worker diagnosed: the pid of the program to end
    claim: str | None = None  # that worker's claim on the diagnosis (a lock file), removed as it ends
    released = False  # release_held has collected what the diagnosis held: freeze_for_exit need not again


def say(text: str) -> None:
    """``text`` on stderr as one ``stagebench:`` line, flushed: the user's own output is on stdout."""
    print(f"stagebench: {text}", file=sys.stderr, flush=True)


#: Set in this process's environment (so its pool workers inherit it) once it listens for a worker's
#: diagnosis to end it: the worker then signals it rather than terminating it.
LISTENING_VAR = "STAGEBENCH_ENDS_ON_SIGUSR1"


def claim_path(parent: int) -> str:
    """The lock file a pool worker of ``parent`` (a pid) takes to diagnose; it then holds the exit code.
    Returns its path, in the temporary folder."""
    import tempfile  # only where a pool worker diagnoses: this module loads at interpreter start

    return os.path.join(tempfile.gettempdir(), f"stagebench-{os.getuid()}-{parent}.diagnosing")


def release_held() -> None:
    """Let go of what the diagnosis held and free it now, while the interpreter can still free it.

    Runs as the program ends (an ``atexit`` hook: after the ``SystemExit`` that ends a diagnosis has
    left the user's loop, and after the pipelines' threads were joined) and as :func:`run_script`
    returns. A diagnosis keeps real stage outputs (``Plan.sample_outputs``, each stand-in's
    ``_Outputs``, the cached inputs of the points) and builds dozens of SPDL pipelines whose queues
    still hold items when they stop (the job runs' batches). At the end all of it is garbage, but in
    reference cycles: the stopped pipelines (their event loop, tasks and a ``CancelledError``'s
    traceback), and the diagnosis's own frames, kept by an exception a library raised and caught.
    Left to the interpreter's last collection, they are freed while it finalises, where a torch tensor
    view freed does not release the numpy array under its base, and a native library reports the
    buffer leaked on the user's terminal. What a
    class or module of ours still points to (a follower's walk; the SPDL harness's stopped runners,
    with their inputs) is dropped first: the collection cannot free what is reachable.
    """
    State.walk = None
    harness: Any = sys.modules.get("stagebench.core._spdl_harness")
    if harness is not None:
        harness.settle(timeout=0)  # the runners whose pipeline has stopped, and their inputs, go
    gc.collect()
    State.released = True


def freeze_for_exit() -> None:
    """Collect once, then leave what survives out of the interpreter's last collections.

    For a process that is ending, and only there. As it finalises, the interpreter collects again and again,
    walking every object the imports made (matplotlib, pandas, scipy, torch: 0.25-0.3 s of each diagnosis's
    exit here, about 5% of a quick one), where what was garbage is collected here, while the interpreter is
    still whole (:func:`release_held`). What the modules' teardown frees goes by its reference counts as
    before; frozen objects left in cycles are never collected, which Python never promised at exit either
    (``tests/test_clean_exit.py``: no native library reports an instance leaked). Where
    :func:`release_held` has just collected (a diagnosis ran), its collection is the one: a second walk
    of the same objects costs 0.06 s here.
    """
    if not State.released:
        gc.collect()
    gc.freeze()


def release_at_exit() -> None:
    """:func:`release_held`, then :func:`freeze_for_exit`: the ``atexit`` hook of a diagnosis that ends its
    program (diagnostic mode), where :func:`release_held` alone is what an in-process caller gets."""
    release_held()
    freeze_for_exit()
