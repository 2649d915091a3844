"""Nothing a measurement starts outlives it in the process.

The instrument's known-answer GIL tests read wrong after other measurements ran
in the same interpreter: anything they leave behind that wakes up (a thread that
polls, a signal handler, a hook on every import, a child process) competes with
the next stage for the GIL or a core, or changes how the next one runs. Each
test here runs one public entry point in-process with tiny budgets and then
compares the process state with a snapshot taken before it: Python threads
(with a grace period for threads that are already shutting down), native
threads, child processes, ``sys.meta_path``, signal handlers, the functions
stagebench patches, logging handlers and levels, the switch interval, the
environment, CPU affinity, torch's thread counts, gc settings and hooks.

Reading /proc here (psutil children, /proc/self/task) is fine: no stage runs.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

sys.path.insert(0, str(Path(__file__).parent / "scripts"))

_SIGNALS = tuple(s for s in ("SIGCHLD", "SIGINT", "SIGTERM") if hasattr(signal, s))
_LOGGERS = ("", "spdl", "stagebench", "torch", "loky", "concurrent.futures", "asyncio")
_GRACE_S = 5.0


def _patched_attributes() -> dict[str, object]:
    """The functions and methods stagebench replaces while it works (diagnostic mode, loader hook)."""
    out: dict[str, object] = {}
    for mod, owner, attr in (
        ("spdl.pipeline._profile", None, "_build_pipeline_diagnostic_mode"),
        ("torch.utils.data.dataloader", "DataLoader", "__iter__"),
        ("spdl.dataloader._pytorch_dataloader", "PyTorchDataLoader", "__iter__"),
    ):
        m = sys.modules.get(mod)
        if m is None:
            continue
        obj = getattr(m, owner) if owner else m
        out[f"{mod}.{owner + '.' if owner else ''}{attr}"] = obj.__dict__.get(attr)
    return out


def _torch_threads() -> tuple[int, int] | None:
    torch = sys.modules.get("torch")
    return (torch.get_num_threads(), torch.get_num_interop_threads()) if torch is not None else None


def _native_threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def _children() -> dict[int, str]:
    out = {}
    for c in psutil.Process().children(recursive=True):
        try:
            if c.status() == psutil.STATUS_ZOMBIE:
                out[c.pid] = "zombie"
            else:
                out[c.pid] = " ".join(c.cmdline())[:120]
        except psutil.Error:
            continue
    return out


def _is_resource_tracker(cmdline: str) -> bool:
    """multiprocessing's and loky's resource tracker: one per flavour per interpreter, by design.

    Started on first use, it sleeps in read() on a pipe (no CPU, no GIL of ours)
    and exits with the interpreter; stopping it would only make the next pool
    start another. More than one of a flavour would be a leak (checked below).
    """
    return "resource_tracker import main" in cmdline


def _trackers() -> dict[str, int]:
    kinds: dict[str, int] = {}
    for what in _children().values():
        if _is_resource_tracker(what):
            kind = what.split(" import main")[0].rsplit(" ", 1)[-1]
            kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


def _snapshot() -> dict[str, object]:
    return {
        "meta_path": list(sys.meta_path),
        "signals": {s: signal.getsignal(getattr(signal, s)) for s in _SIGNALS},
        "patched": _patched_attributes(),
        # pytest's own capture handlers come and go between test phases
        "handlers": {
            n: [h for h in logging.getLogger(n).handlers if not type(h).__module__.startswith("_pytest")]
            for n in _LOGGERS
        },
        "levels": {n: logging.getLogger(n).level for n in _LOGGERS},
        "switch_interval": sys.getswitchinterval(),
        "env": {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"},
        "affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "torch_threads": _torch_threads(),
        "gc": (gc.isenabled(), gc.get_threshold(), len(gc.callbacks)),
        "hooks": (sys.excepthook, threading.excepthook, sys.unraisablehook),
        "profile": (sys.getprofile(), sys.gettrace(), threading.gettrace() if hasattr(threading, "gettrace") else None),
    }


class _State:
    """What the process holds before a block; ``leaks()`` says what is new after it."""

    def __init__(self) -> None:
        self.threads = set(threading.enumerate())
        self.native = _native_threads()
        self.children = _children()
        self.state = _snapshot()

    def new_threads(self) -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t not in self.threads and t.is_alive()]

    def new_children(self) -> dict[int, str]:
        return {
            pid: what
            for pid, what in _children().items()
            if pid not in self.children and not _is_resource_tracker(what)
        }

    def leaks(self, grace_s: float = _GRACE_S) -> list[str]:
        deadline = time.monotonic() + grace_s
        # native threads too: a pool's thread that has left Python is still in /proc/self/task while the OS
        # tears it down (a fresh clone once read 5 -> 6 with no Python thread left); one that stays is a leak
        while (
            self.new_threads() or self.new_children() or _native_threads() > self.native
        ) and time.monotonic() < deadline:
            time.sleep(0.1)
        out = [f"thread {t.name!r} (daemon={t.daemon}) still alive" for t in self.new_threads()]
        out += [f"child process {pid} still there: {what}" for pid, what in self.new_children().items()]
        after = _snapshot()
        for key, before in self.state.items():
            now = after[key]
            if now == before:
                continue
            if isinstance(before, dict) and isinstance(now, dict):
                diff = {
                    k: (before.get(k), now.get(k)) for k in before.keys() | now.keys() if before.get(k) != now.get(k)
                }
                out.append(f"{key} changed (before, after): {diff!r}")
            else:
                out.append(f"{key} changed: {before!r} -> {now!r}")
        many = {k: n for k, n in _trackers().items() if n > 1}
        if many:
            out.append(f"more than one resource tracker of a kind: {many}")
        native = _native_threads()
        if native > self.native:
            out.append(
                f"native threads: {self.native} -> {native} "
                f"(Python threads {len(self.threads)} -> {threading.active_count()})"
            )
        return out


def _imports() -> None:
    """Import what the entry points import, so module-level set-up is not counted as a leak."""
    import joblib  # noqa: F401 - sets KMP_INIT_AT_FORK on import; the stage cache imports it lazily
    import loky  # noqa: F401
    import scipy.stats  # noqa: F401 - its OpenBLAS starts a native thread on import
    import spdl.dataloader
    import spdl.pipeline  # noqa: F401
    import torch.utils.data  # noqa: F401

    import stagebench.loader._sweep
    import stagebench.pipeline._diagnose
    import stagebench.report._render  # noqa: F401


def spin(x):
    y = 0
    for i in range(2000):
        y += i
    return x


def sleepy(x):
    time.sleep(0.001)
    return x


async def async_sleepy(x):
    await asyncio.sleep(0.001)
    return x


@pytest.fixture(autouse=True)
def _imported():
    # The snapshot itself is taken in the test body: pytest swaps its log handlers between phases.
    _imports()


def test_sweep_stage_leaves_nothing_behind():
    state = _State()
    from stagebench import sweep_stage
    from stagebench.core._config import MeasureConfig, SweepConfig

    m = MeasureConfig(budget_s=0.15, warmup_s=0.05, timeout_s=10)
    for fn in (spin, async_sleepy):
        for harness in ("direct", "spdl"):
            df = sweep_stage(
                fn,
                list(range(16)),
                config=SweepConfig(
                    executors=("thread", "process", "async"),
                    concurrency=(1, 2),
                    harnesses=(harness,),
                    ceiling=False,
                    measure=m,
                    # every process point, whatever the threads did: on a loaded machine a spin's c=1
                    # point can read half its c=2 one, "threads scale linearly", and processes were skipped
                    process_flat_levels=0,
                ),
            )
            assert (df["status"] == "ok").all(), df[["executor", "harness", "status", "reason"]]
    leaks = state.leaks()
    assert not leaks, "\n".join(leaks)


def test_loader_sweep_leaves_nothing_behind(tmp_path):
    state = _State()
    from loader_datasets import SleepDataset

    from stagebench import run_loader_sweep
    from stagebench.loader._intercept import make_loader_factory
    from stagebench.loader._sweep import LoaderSweepConfig

    cfg = LoaderSweepConfig(
        strategy="grid",
        num_workers=(0, 1),
        prefetch_factors=(2,),
        persistent_workers=(False,),
        pin_memory=(False,),
        budget_s=0.3,
        warmup_s=0.05,
        timeout_s=15,
        transforms=False,
    )
    for backend in ("torch", "spdl_pytorch"):
        factory = make_loader_factory(SleepDataset(n=32, d=0.002), batch_size=4, backend=backend)
        s = run_loader_sweep(
            factory, name="tiny", backend=backend, batch_size=4, run_dir=tmp_path / backend, config=cfg
        )
        assert s["points"] and all(p["status"] == "ok" for p in s["points"]), s["points"]
    leaks = state.leaks()
    assert not leaks, "\n".join(leaks)


def test_diagnose_pipeline_leaves_nothing_behind(tmp_path):
    state = _State()
    from spdl.pipeline import PipelineBuilder

    from stagebench.pipeline._diagnose import diagnose_pipeline
    from stagebench.pipeline._settings import DiagnoseSettings

    cfg = (
        PipelineBuilder()
        .add_source(range(100))
        .pipe(sleepy, concurrency=2)
        .pipe(async_sleepy, concurrency=2)
        .add_sink(2)
        .get_config()
    )
    settings = DiagnoseSettings(
        num_items=16,
        budget_s=0.15,
        warmup_s=0.05,
        timeout_s=5.0,
        concurrency=(1, 2),
        executors=("thread", "process"),
        harnesses=("direct", "spdl"),
        validation_s=0.3,
        cache_dir="off",
    )
    summary = diagnose_pipeline(
        cfg, out=tmp_path / "run", settings=settings, command=["t.py"], show_table=False, report=False
    )
    assert [s["name"] for s in summary["stages"]] == ["sleepy", "async_sleepy"]
    leaks = state.leaks()
    assert not leaks, "\n".join(leaks)


def test_the_check_sees_each_kind_of_leak():
    """The snapshot is not blind: a thread, a handler, a hook, a logging handler and a child all show."""
    import subprocess

    state = _State()
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, name="left-behind", daemon=True)
    t.start()
    previous = signal.signal(signal.SIGTERM, lambda *a: None)
    finder = type("Finder", (), {"find_spec": staticmethod(lambda *a: None)})()
    sys.meta_path.insert(0, finder)
    handler = logging.NullHandler()
    logging.getLogger("spdl").addHandler(handler)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        leaks = "\n".join(state.leaks(grace_s=0.2))
    finally:
        stop.set()
        signal.signal(signal.SIGTERM, previous)
        sys.meta_path.remove(finder)
        logging.getLogger("spdl").removeHandler(handler)
        child.kill()
        child.wait()
        t.join()
    for what in ("'left-behind'", "SIGTERM", "meta_path", "NullHandler", f"child process {child.pid}"):
        assert what in leaks, what
    assert state.leaks(grace_s=0.2) == []


_SCRIPT = """
import time
from spdl.pipeline import PipelineBuilder

def wait(x):
    time.sleep(0.001)
    return x

pipeline = PipelineBuilder().add_source(range(100)).pipe(wait, concurrency=2).add_sink(2).build(num_threads=2)
with pipeline.auto_stop():
    for item in pipeline:
        pass
"""


def test_stagebench_diagnose_in_process_leaves_nothing_behind(tmp_path, monkeypatch):
    """`stagebench diagnose script.py` run in-process (as `_cli.main` would): the hooks go with it."""
    from stagebench.pipeline._script import run_script

    for var, value in {
        "STAGEBENCH_BUDGET_S": "0.15",
        "STAGEBENCH_WARMUP_S": "0.05",
        "STAGEBENCH_TIMEOUT_S": "5",
        "STAGEBENCH_VALIDATION_S": "0",
        "STAGEBENCH_CONCURRENCY": "1,2",
        "STAGEBENCH_EXECUTORS": "thread,process",
        "STAGEBENCH_HARNESSES": "direct",
        "STAGEBENCH_CACHE_DIR": "off",
        "SPDL_PIPELINE_DIAGNOSTIC_MODE_NUM_ITEMS": "16",
    }.items():
        monkeypatch.setenv(var, value)
    monkeypatch.delenv("SPDL_PIPELINE_DIAGNOSTIC_MODE", raising=False)
    script = tmp_path / "train.py"
    script.write_text(_SCRIPT)
    state = _State()
    assert run_script(str(script), [], out=str(tmp_path / "out")) == 0
    assert (tmp_path / "out" / "summary.json").is_file()
    leaks = state.leaks()
    assert not leaks, "\n".join(leaks)


_FLAVOUR = """
import sys

import loky
import joblib  # after loky: joblib's vendored loky re-registers the process-wide "loky" context

from stagebench import sweep_stage
from stagebench.core._config import MeasureConfig, SweepConfig


class Flavour:
    def __init__(self, path):
        self.path = path

    def __call__(self, x):
        with open(self.path, "w") as f:
            f.write("joblib" if any(m.startswith("joblib.externals.loky") for m in sys.modules) else "loky")
        return x


df = sweep_stage(Flavour(sys.argv[1]), [1, 2], config=SweepConfig(
    executors=("process",), concurrency=(1,), ceiling=False,
    measure=MeasureConfig(budget_s=0.1, warmup_s=0.0, timeout_s=20)))
assert df["status"].tolist() == ["ok"], df["reason"].tolist()
"""


def test_process_pools_stay_on_loky_after_joblib_is_imported(tmp_path):
    """A diagnosis imports joblib (the stage cache); later pools in the process must not change backend.

    In a fresh interpreter, so the import order is the one under test.
    """
    import subprocess

    marker = tmp_path / "flavour"
    r = subprocess.run([sys.executable, "-c", _FLAVOUR, str(marker)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert marker.read_text() == "loky"
