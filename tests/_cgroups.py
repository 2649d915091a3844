"""Child cgroups made by a test, and a process started inside them (cgroup v1, as root).

Read from ``/proc/self/cgroup`` and ``/proc/self/mountinfo`` here, not through the reader under test
(stagebench.runs._limits): the test sets the known answer with the kernel's own files. Each group is made
under this process's own group of its hierarchy, so the limits above it still hold (a memory group made at
the root would leave the test's own). :func:`cannot_write` says why a test skips.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = ["cannot_write", "child_group", "in_groups", "read_int"]

#: Starts ``argv`` after writing its own pid to each ``cgroup.procs`` named before ``--``: the process is in
#: its groups before it runs a line of its own, so every page it touches is charged there.
_ENTER = (
    "import os, sys\n"
    "i = sys.argv.index('--')\n"
    "for p in sys.argv[1:i]:\n"
    "    with open(p, 'w') as f:\n"
    "        f.write(str(os.getpid()))\n"
    "os.execv(sys.argv[i + 1], sys.argv[i + 1:])\n"
)


def _own(controller: str) -> Path | None:
    """This process's group of ``controller``'s v1 hierarchy, as a directory; None where it is not mounted."""
    path = None
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, ctls, p = line.split(":", 2)
        if controller in ctls.split(","):
            path = p
    if path is None:
        return None
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if tail and tail[0] == "cgroup" and controller in tail[2].split(",") and fields[3] == "/":
            return Path(fields[4]) / path.lstrip("/")
    return None


def cannot_write(*controllers: str) -> str | None:
    """Why child groups of ``controllers`` cannot be made here (None where they can)."""
    if os.geteuid() != 0:
        return "not root: cgroups cannot be written"
    for c in controllers:
        own = _own(c)
        if own is None or not own.is_dir():
            return f"no cgroup v1 {c} hierarchy mounted"
        probe = own / f"stagebench-probe-{os.getpid()}"
        try:
            probe.mkdir()
            probe.rmdir()
        except OSError as e:
            return f"cannot make a child {c} group under {own}: {e}"
    return None


def read_int(path: Path) -> int:
    return int(path.read_text().split()[0])


@contextlib.contextmanager
def child_group(controller: str, name: str, files: dict[str, str] | None = None) -> Iterator[Path]:
    """A child group of this process's own ``controller`` group with ``files`` written, removed afterwards
    (a process still in it goes back to the parent first: a group with tasks cannot be removed)."""
    own = _own(controller)
    assert own is not None, cannot_write(controller)
    group = own / f"stagebench-test-{name}-{os.getpid()}"
    group.mkdir()
    try:
        for f, text in (files or {}).items():
            (group / f).write_text(text)
        yield group
    finally:
        for _ in range(100):
            for pid in (group / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):  # gone in between
                    (own / "cgroup.procs").write_text(pid)
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.05)


def in_groups(groups: list[Path], argv: list[str]) -> list[str]:
    """``argv`` (a program and its arguments) started inside ``groups``: the command line to run."""
    return [sys.executable, "-c", _ENTER, *(str(g / "cgroup.procs") for g in groups), "--", *argv]
