"""From the user's own loader objects to a loader factory, and the zero-code hook.

Two ways in, one result (a :class:`DatasetLoaderFactory`: knobs -> a fresh loader):

* given objects: a dataset (or a ``"module:factory"`` path) and DataLoader
  arguments (:func:`make_loader_factory`);
* caught objects: the first ``torch.utils.data.DataLoader`` or SPDL
  ``PyTorchDataLoader`` that an unmodified script iterates
  (:func:`install_dataloader_hook`, :func:`diagnose_first_loader`). The script's
  dataset, sampler, collate_fn and worker_init_fn are reused as they are; the
  loop body never runs.

Every loader the factory builds wraps the resolved (batch) sampler and the collate function
(:mod:`stagebench.loader._built`: the measurement controls where epochs end and sees which worker
made each batch).

The hook patches ``__iter__`` rather than ``__init__`` because a script may
build several loaders (train, val) and only iterating one commits to it; it is
installed by a post-import hook, so a script that never imports torch never
pays for importing it.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import sys
import types
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from stagebench._errors import RankLost
from stagebench._import_hook import PostImportFinder
from stagebench._settings import read_env, setting
from stagebench._signals import ignore_sigterm, on_sigterm
from stagebench._spdl_private import MODE_VAR, PYTORCH_DATALOADER_MODULE, pytorch_get_items
from stagebench.core._progress import message
from stagebench.core._ranks import HostGroup, lead, meet
from stagebench.job._phase import end_from_close
from stagebench.loader._built import BuiltLoader, EpochControl, TaggedCollate, TimedInit, context_name
from stagebench.loader._follow import follow_loaders
from stagebench.loader._sweep import LoaderSweepConfig, run_loader_sweep
from stagebench.loader._trainer import follower_trainer_phases, loader_trainer_phases
from stagebench.model._knobs import KNOBS, LoaderKnobs
from stagebench.runs._knobs import KNOWN_BACKENDS, loader_knobs
from stagebench.runs._outcome import (
    BAD_INPUT,
    FAILED,
    INTERNAL,
    PARTIAL,
    RANK_LOST,
    TERMINATED,
    interrupted_outcome,
)
from stagebench.runs._ranks import no_job_across_hosts, per_host
from stagebench.runs._results import RunDirInUseError, UnwritableOutputError, default_run_dir

__all__ = [
    "DatasetLoaderFactory",
    "make_loader_factory",
    "resolve_dataset",
    "import_user_module",
    "factory_from_loader",
    "install_dataloader_hook",
    "diagnose_first_loader",
]

#: DataLoader arguments the factory accepts (besides the knobs).
LOADER_ARGS = (
    "batch_size",
    "shuffle",
    "sampler",
    "batch_sampler",
    "collate_fn",
    "drop_last",
    "generator",
    "worker_init_fn",
    "multiprocessing_context",
    "in_order",
    "worker_init_concurrency",
)


def import_user_module(name: str) -> Any:
    """``importlib.import_module``, also looking in the working directory.

    ``python -m stagebench`` has the working directory on ``sys.path``; the
    ``stagebench`` script does not, so ``stagebench sweep loader=custom
    loader.dataset=mydata:make`` run next to ``mydata.py`` would not find it.
    The directory is appended (installed packages keep precedence) and stays:
    worker processes unpickle references to the module's objects by name.
    """
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)
    return importlib.import_module(name)


def resolve_dataset(spec: str) -> Any:
    """``"module:attr"`` -> the dataset: attr itself, or attr() when it is a factory or a class."""
    if not isinstance(spec, str) or ":" not in spec:
        raise ValueError(f"dataset path must look like 'module:factory', got {spec!r}")
    mod_name, _, attr = spec.partition(":")
    try:
        mod = import_user_module(mod_name)
    except ImportError as e:
        raise ValueError(f"dataset path {spec!r}: cannot import module {mod_name!r} ({e})") from None
    obj: Any = mod
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"dataset path {spec!r}: module {mod_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if isinstance(obj, type) or (callable(obj) and not hasattr(obj, "__getitem__")):
        return obj()  # a dataset class or a factory function
    if hasattr(obj, "__getitem__") or hasattr(obj, "__iter__"):
        return obj
    raise ValueError(f"dataset path {spec!r} names neither a dataset nor a callable that returns one")


@dataclass(slots=True, kw_only=True)
class DatasetLoaderFactory:
    """Builds a fresh torch or SPDL loader per knob setting from the user's objects."""

    dataset: Any
    backend: str
    index_sampler: Any  # what the loader iterates per batch (batch sampler) or per item
    auto_collation: bool  # True: index_sampler yields lists of indices
    collate_fn: Callable
    batch_size: int  # samples per batch (nominal)
    iterable: bool = False  # an IterableDataset: no sampler to control
    drop_last: bool = False
    worker_init_fn: Callable | None = None
    generator: Any = None
    multiprocessing_context: Any = None
    in_order: bool = True
    worker_init_concurrency: int | None = None
    user_knobs: LoaderKnobs | None = None
    name: str = "loader"
    notes: tuple[str, ...] = ()
    call: tuple[tuple[str, str, str], ...] = ()
    """The user's other DataLoader arguments, as (name, code, comment): what a snippet keeps."""

    def __call__(self, knobs: LoaderKnobs) -> BuiltLoader:
        control = None if self.iterable else EpochControl(self.index_sampler)
        collate = TaggedCollate(self.collate_fn, self.auto_collation)
        if self.backend == "spdl_pytorch":
            return self._spdl(knobs, control, collate)
        from torch.utils.data import DataLoader  # start-up cost: torch, only where a loader is built

        kw: dict[str, Any] = dict(
            num_workers=knobs.num_workers,
            collate_fn=collate,
            pin_memory=knobs.pin_memory,
            # the user's own, timed where it runs (the start-up split): TimedInit calls it as torch would
            worker_init_fn=TimedInit(self.worker_init_fn) if knobs.num_workers > 0 else self.worker_init_fn,
            generator=self.generator,
            multiprocessing_context=self.multiprocessing_context if knobs.num_workers > 0 else None,
            persistent_workers=knobs.persistent_workers if knobs.num_workers > 0 else False,
            prefetch_factor=knobs.prefetch_factor if knobs.num_workers > 0 else None,
        )
        if _accepts_in_order():
            kw["in_order"] = self.in_order
        if self.iterable:
            kw.update(batch_size=self.batch_size if self.auto_collation else None, drop_last=self.drop_last)
        elif self.auto_collation:
            kw["batch_sampler"] = control
        else:
            kw.update(sampler=control, batch_size=None)
        loader = DataLoader(self.dataset, **kw)
        return BuiltLoader(loader=loader, control=control)

    def _spdl(self, knobs: LoaderKnobs, control: EpochControl | None, collate: TaggedCollate) -> BuiltLoader:
        from spdl.dataloader import get_pytorch_dataloader  # start-up cost: SPDL, only where its loader is built

        if self.iterable:
            raise ValueError("backend 'spdl_pytorch' does not support an IterableDataset; use backend 'torch'")
        kw: dict[str, Any] = dict(
            batch_size=None,
            collate_fn=collate,
            num_workers=max(1, knobs.num_workers),
            pin_memory=knobs.pin_memory,
            prefetch_factor=knobs.prefetch_factor or 2,
            multiprocessing_context=self.multiprocessing_context,
            in_order=self.in_order,
            worker_init_concurrency=self.worker_init_concurrency,
        )
        if self.auto_collation:
            kw["batch_sampler"] = control
        else:
            kw["sampler"] = control
        loader = get_pytorch_dataloader(self.dataset, **kw)

        def close() -> None:
            # SPDL leaves the dataset's shared-memory copy to the resource tracker
            # at exit; a sweep builds one per point, so release each now.
            shm = getattr(loader, "_shmem", None)
            if shm is not None:
                with suppress(OSError):
                    shm.close()
                    shm.unlink()

        return BuiltLoader(loader=loader, control=control, close=close)

    def describe(self) -> dict[str, Any]:
        """What run.json records about the loader under test."""
        d: dict[str, Any] = {
            "name": self.name,
            "backend": self.backend,
            "batch_size": self.batch_size,
            "dataset": f"{type(self.dataset).__module__}.{type(self.dataset).__qualname__}",
            "dataset_len": _safe_len(self.dataset),
            "epoch_batches": None if self.iterable else _safe_len(self.index_sampler),
            "sampler": type(self.index_sampler).__name__ if self.index_sampler is not None else None,
            "collate_fn": getattr(self.collate_fn, "__qualname__", type(self.collate_fn).__name__),
            "worker_init_fn": None
            if self.worker_init_fn is None
            else getattr(self.worker_init_fn, "__qualname__", type(self.worker_init_fn).__name__),
            "multiprocessing_context": context_name(self.multiprocessing_context),
            "in_order": self.in_order,
            "notes": list(self.notes),
            "call": [{"arg": a, "code": c, "comment": m} for a, c, m in self.call],
        }
        if self.user_knobs is not None:
            d["user_knobs"] = asdict(self.user_knobs)
        return d


def _safe_len(x: Any) -> int | None:
    try:
        return len(x)
    except Exception:
        return None


@functools.cache
def _accepts_in_order() -> bool:
    from torch.utils.data import DataLoader  # start-up cost: torch, only where a loader is built

    return "in_order" in inspect.signature(DataLoader.__init__).parameters


def make_loader_factory(dataset: Any, *, backend: str = "torch", **kwargs: Any) -> DatasetLoaderFactory:
    """A loader factory for ``dataset`` with DataLoader arguments ``kwargs``.

    Sampler, batching and collation are resolved once, the way torch's DataLoader
    resolves them (a loader built with num_workers=0 starts nothing), so torch
    and SPDL loaders get the same batches. Knob arguments (num_workers, ...) are
    kept as the user's own setting. Unknown arguments raise a one-line error.
    """
    if backend not in KNOWN_BACKENDS:
        raise ValueError(f"backend: unknown {backend!r}; allowed: {', '.join(KNOWN_BACKENDS)}")
    unknown = sorted(set(kwargs) - set(LOADER_ARGS) - set(KNOBS))
    if unknown:
        raise ValueError(f"unknown loader argument(s) {', '.join(unknown)}; allowed: {', '.join(LOADER_ARGS + KNOBS)}")
    import torch.utils.data as tud  # start-up cost: torch, only where a loader is built

    knob_kw = {k: kwargs.pop(k) for k in KNOBS if k in kwargs}
    user_knobs = None
    if knob_kw:
        try:
            user_knobs = LoaderKnobs(**knob_kw)
        except ValueError as e:
            raise ValueError(f"loader knobs: {e}") from None
    extra = {
        k: kwargs.pop(k)
        for k in ("multiprocessing_context", "in_order", "worker_init_concurrency", "worker_init_fn")
        if k in kwargs
    }
    try:
        template = tud.DataLoader(dataset, num_workers=0, **kwargs)
    except (ValueError, TypeError) as e:
        raise ValueError(f"loader arguments: {e}") from None
    notes: list[str] = []
    if backend == "spdl_pytorch" and extra.get("worker_init_fn") is not None:
        notes.append("worker_init_fn not applied: SPDL's loader does not support it")
        extra["worker_init_fn"] = None
    return _from_template(template, backend=backend, user_knobs=user_knobs, notes=notes, **extra)


def _from_template(
    template: Any, *, backend: str, user_knobs: LoaderKnobs | None, notes: list[str], **extra: Any
) -> DatasetLoaderFactory:
    import torch.utils.data as tud  # start-up cost: torch, only where a loader is built

    ds = template.dataset
    iterable = isinstance(ds, tud.IterableDataset)
    auto = bool(template._auto_collation)
    index_sampler = None if iterable else (template.batch_sampler if auto else template.sampler)
    bs = template.batch_size
    if bs is None:
        bs = _probe_batch_size(index_sampler) if auto else 1
    return DatasetLoaderFactory(
        dataset=ds,
        backend=backend,
        index_sampler=index_sampler,
        auto_collation=auto,
        collate_fn=template.collate_fn,
        batch_size=int(bs or 1),
        iterable=iterable,
        drop_last=bool(template.drop_last),
        generator=template.generator,
        worker_init_fn=extra.get("worker_init_fn", getattr(template, "worker_init_fn", None)),
        multiprocessing_context=extra.get(
            "multiprocessing_context", getattr(template, "multiprocessing_context", None)
        ),
        in_order=bool(extra.get("in_order", getattr(template, "in_order", True))),
        worker_init_concurrency=extra.get("worker_init_concurrency"),
        user_knobs=user_knobs,
        name=type(ds).__name__,
        notes=tuple(notes),
        call=_call_of(template),
    )


#: calling frames outside stagebench and torch searched for the name of the user's own dataset, sampler or collate_fn
_USER_FRAMES = 8


def _call_of(loader: Any) -> tuple[tuple[str, str, str], ...]:
    """The arguments a torch DataLoader was built with, other than the four knobs, as code to paste.

    Read back from the loader (diagnostic mode catches it built): ``batch_size=None``
    stays None, a ``RandomSampler`` it made itself is ``shuffle=True``, a sampler,
    batch sampler or collate function of the user's own is kept (by the name it has or the
    user's code holds it by, :func:`_yours`), ``drop_last`` when set.
    """
    # start-up cost: torch, only where a loader is built
    import torch.utils.data as tud
    from torch.utils.data._utils.collate import default_collate, default_convert

    out: list[tuple[str, str, str]] = []
    name, _ = _yours("dataset", loader.dataset)
    if name != "dataset":  # the snippet's first argument, where the user's code names it otherwise
        out.append(("dataset", name, ""))
    sampler, bsampler = getattr(loader, "sampler", None), getattr(loader, "batch_sampler", None)
    own_batches = bsampler is not None and type(bsampler) is not tud.BatchSampler
    if own_batches:
        out.append(("batch_sampler", *_yours("batch_sampler", bsampler)))
    else:
        out.append(("batch_size", repr(loader.batch_size), ""))
    if type(sampler) is tud.RandomSampler and not own_batches:
        out.append(("shuffle", "True", ""))
    elif sampler is not None and type(sampler) not in (tud.SequentialSampler, tud.RandomSampler) and not own_batches:
        out.append(("sampler", *_yours("sampler", sampler)))
    fn = getattr(loader, "collate_fn", None)
    if fn is not None and fn not in (default_collate, default_convert):
        name = getattr(fn, "__qualname__", "")
        out.append(("collate_fn", name, "") if name.isidentifier() else ("collate_fn", *_yours("collate_fn", fn)))
    if getattr(loader, "drop_last", False) and not own_batches:
        out.append(("drop_last", "True", ""))
    return tuple(out)


def _yours(arg: str, obj: Any) -> tuple[str, str]:
    """(code, comment) for an object of the user's own in the snippet: the name their code holds it by, found
    in the calling frames outside stagebench and torch, else the argument's own name, said to be a guess.

    Why a name and never ``...``: a snippet pasted with ``sampler=...`` runs, and hands DataLoader an
    Ellipsis; a DistributedSampler under DDP is the commonest case.
    """
    kind = type(obj).__name__
    frame: types.FrameType | None = sys._getframe(1)
    looked = 0
    while frame is not None and looked < _USER_FRAMES:
        module = str(frame.f_globals.get("__name__", ""))
        if not module.startswith(("stagebench", "torch")):
            looked += 1
            for scope in (frame.f_locals, frame.f_globals):
                name = next((k for k, v in scope.items() if v is obj and k.isidentifier() and k != "_"), None)
                if name is not None:
                    return name, f"yours: {kind}"
        frame = frame.f_back
    return arg, f"yours: {kind}; the name is a guess: use the one your script gives it"


def _probe_batch_size(batch_sampler: Any) -> int:
    """Samples per batch of a user batch sampler (its first batch)."""
    try:
        return max(1, len(next(iter(batch_sampler))))
    except Exception:
        return 1


def factory_from_loader(loader: Any) -> tuple[DatasetLoaderFactory, str]:
    """A factory that rebuilds a caught loader with other knobs, and its backend name."""
    from torch.utils.data import DataLoader  # start-up cost: torch, only where a loader is built

    if isinstance(loader, DataLoader):
        knobs = LoaderKnobs(
            num_workers=int(loader.num_workers),
            prefetch_factor=loader.prefetch_factor if loader.num_workers > 0 else None,
            persistent_workers=bool(loader.persistent_workers),
            pin_memory=bool(loader.pin_memory),
        )
        return _from_template(loader, backend="torch", user_knobs=knobs, notes=[]), "torch"
    from spdl.dataloader import PyTorchDataLoader  # start-up cost: SPDL, only where its loader is built

    if isinstance(loader, PyTorchDataLoader):
        nw = int(loader._num_workers)
        knobs = LoaderKnobs(
            num_workers=nw,
            prefetch_factor=max(1, int(loader._buffer_size) // max(1, nw)),
            pin_memory=loader._transfer_fn is not None,
        )
        auto = loader._fetch_fn is pytorch_get_items()
        sampler = loader._sampler
        bs = _probe_batch_size(sampler) if auto else 1
        factory = DatasetLoaderFactory(
            dataset=loader.dataset,
            backend="spdl_pytorch",
            index_sampler=sampler,
            auto_collation=auto,
            collate_fn=loader._collate_fn,
            batch_size=bs,
            multiprocessing_context=loader._mp_ctx,
            in_order=loader._output_order == "input",
            worker_init_concurrency=loader._worker_init_concurrency,
            user_knobs=knobs,
            name=type(loader.dataset).__name__,
        )
        return factory, "spdl_pytorch"
    raise TypeError(f"not a torch DataLoader or SPDL PyTorchDataLoader: {type(loader).__name__}")


# ------------------------------------------------------------------------- hook
_TARGETS = {
    "torch.utils.data.dataloader": "DataLoader",
    PYTORCH_DATALOADER_MODULE: "PyTorchDataLoader",
}


class _Hook:
    """Patched ``__iter__`` methods, the callback, and the post-import finder."""

    def __init__(self, on_loader: Callable[[Any], Any]) -> None:
        self.on_loader = on_loader
        self.patched: list[tuple[type, Any]] = []
        self.captured = False
        self.finder: PostImportFinder | None = None

    def patch(self, module: Any) -> None:
        cls = getattr(module, _TARGETS.get(module.__name__, ""), None)
        if self.captured or cls is None or any(c is cls for c, _ in self.patched):
            return
        original = cls.__dict__["__iter__"]
        hook = self

        def __iter__(loader):
            if not hook.captured:
                hook.captured = True
                hook.uninstall()  # the sweep's own loaders must iterate normally
                instead = hook.on_loader(loader)
                if instead is not None:  # the user's loop iterates this instead (STAGEBENCH_TRAINER=measure)
                    return instead
            return original(loader)

        __iter__.__wrapped__ = original  # type: ignore[attr-defined]
        cls.__iter__ = __iter__
        self.patched.append((cls, original))

    def uninstall(self) -> None:
        for cls, original in self.patched:
            cls.__iter__ = original  # type: ignore[attr-defined]  # putting back the method patch() replaced
        self.patched.clear()
        if self.finder is not None and self.finder in sys.meta_path:
            sys.meta_path.remove(self.finder)
        self.finder = None


def install_dataloader_hook(on_loader: Callable[[Any], Any]) -> Callable[[], None]:
    """Call ``on_loader(loader)`` when the first torch/SPDL loader is iterated.

    Where it returns an iterator, the loop iterates that instead of the loader.

    Only the first loader is caught; the patches are removed before the callback
    runs. Returns a function that removes the hook if nothing was caught.
    """
    hook = _Hook(on_loader)
    for name in _TARGETS:
        if name in sys.modules:
            hook.patch(sys.modules[name])
    hook.finder = PostImportFinder(_TARGETS, hook.patch)
    sys.meta_path.insert(0, hook.finder)
    return hook.uninstall


class _Caught:
    """Whether diagnose_first_loader caught a loader in this process (run_script asks)."""

    loader = False


def loader_was_caught() -> bool:
    return _Caught.loader


def diagnose_first_loader(
    out: Path | str | None = None,
    *,
    config: Any = None,
    target_rate: float | None = None,
    progress: Any = None,
) -> Callable[[], None]:
    """Install the hook; on capture, sweep the loader, print a table, and exit 0.

    The loop body of the script never runs: ``SystemExit(0)`` is raised from the
    ``for`` statement that iterates the loader. ``out``: the run directory
    (default: ``$STAGEBENCH_OUTPUT_DIR`` or ``./reports``, a new ``loader-...`` folder).
    Returns a function that removes the hook (an SPDL diagnosis that starts first
    calls it: a pipeline whose source is a DataLoader is diagnosed as a pipeline).
    """

    given: dict[str, str | None] = {}  # the variables' values as the user set them, before the sweep's

    def on_loader(loader: Any) -> Any:
        _Caught.loader = True
        # This run diagnoses the loader. SPDL's PyTorch-style loader builds an SPDL pipeline each time it
        # is iterated; with the mode still on, that pipeline would be the stand-in and start a pipeline
        # diagnosis of its own into the same folder. The run's provenance records the user's value.
        given[MODE_VAR] = os.environ.get(MODE_VAR)
        os.environ[MODE_VAR] = "0"
        group = meet("loader", message)  # torchrun: the host's ranks, measured together
        factory, backend = factory_from_loader(loader)
        if group is not None and not group.leader:
            return _follow(group, factory)
        with _ending(group):
            return _lead(type(loader).__name__, factory, backend, group)

    def _lead(kind: str, factory: DatasetLoaderFactory, backend: str, group: HostGroup | None) -> Any:
        ranks = "" if group is None else f", on each of the host's {group.size} ranks at once"
        message(
            f"caught {kind} over {factory.name} "
            f"(batch size {factory.batch_size}); sweeping its knobs{ranks} instead of running the loop"
        )
        trainer = _trainer_setting()
        if trainer is not None and (why := no_job_across_hosts()) is not None:
            message(why)
            trainer = None
        cfg = config or LoaderSweepConfig()
        try:
            with on_sigterm(), lead(group):
                run_dir, summary = _sweep_factory(
                    factory,
                    backend,
                    name=None,
                    run_dir=out,
                    config=cfg,
                    target_rate=target_rate,
                    progress=progress,
                    trainer_planned=trainer is not None,
                    env_as_given=given,
                )
        except (UnwritableOutputError, RunDirInUseError) as e:  # refused before anything ran: one line, as a pipeline's
            where = " (STAGEBENCH_OUTPUT_DIR)" if out is not None and os.environ.get("STAGEBENCH_OUTPUT_DIR") else ""
            print(f"stagebench: error: {e}{where}", file=sys.stderr, flush=True)
            raise SystemExit(BAD_INPUT.exit_code) from None
        except KeyboardInterrupt as e:  # Ctrl-C, SIGTERM, a rank lost: the rows are kept; said, and its code
            end = interrupted_outcome(e)
            how = {RANK_LOST: "stopped", TERMINATED: "terminated (SIGTERM)"}.get(end, "interrupted")
            print(f"stagebench: {how}; {e}" if str(e) else f"stagebench: {how}", file=sys.stderr, flush=True)
            raise SystemExit(end.exit_code) from None
        from stagebench.report._terminal import format_loader_table  # start-up cost: pandas, only at the end

        print(format_loader_table(summary))
        report = run_dir / "report.html"
        print(f"report: {report if report.exists() else run_dir}")
        if summary.get("unwritten"):  # measured, but a file could not be written (a full disk)
            message(f"error: {summary['unwritten']}; the rows are in {run_dir}")
            raise SystemExit(PARTIAL.exit_code)
        if not summary.get("recommended"):  # nothing could be measured: not a diagnosed loader
            message(f"error: {summary.get('verdict')}; the rows and their reasons are in {run_dir}")
            raise SystemExit(FAILED.exit_code)
        if trainer is None:
            raise SystemExit(0)
        message("that was the loader alone; your training loop runs next, and the advice is for your job")
        return _then_exit(factory, summary, run_dir, *trainer, group)

    return install_dataloader_hook(on_loader)


@contextmanager
def _ending(group: HostGroup | None) -> Iterator[None]:
    """The leader's way out: whatever ends its part (an exit code, an interrupt, a rank lost, our own
    error), every rank of the host ends with the same code (:meth:`HostGroup.end`). A block that returns
    (the job phase's generator) leaves the group to it."""
    try:
        yield
    except BaseException as exc:
        if group is not None:
            if isinstance(exc, SystemExit):
                code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
            elif isinstance(exc, KeyboardInterrupt):
                code = interrupted_outcome(exc).exit_code
            else:
                code = INTERNAL.exit_code
            group.end(code)
        raise


def _follow(group: HostGroup, factory: DatasetLoaderFactory) -> Any:
    """A follower's part: the leader's loaders mirrored here (:mod:`stagebench.loader._follow`), then its
    job phase in step with the leader's, or the leader's exit code."""
    try:
        done = follow_loaders(group, factory)
    except RankLost as e:
        message(f"local rank {group.rank}: {e}")
        raise SystemExit(RANK_LOST.exit_code) from None
    if done.cmd is not None:  # the leader's job phase begins
        return follower_trainer_phases(group, factory, message)
    ignore_sigterm()  # leaving with the leader's code, whatever torch's launcher does to the last ranks
    group.bye()
    raise SystemExit(done.code)


def _trainer_setting() -> tuple[float, float | None] | None:
    """(``STAGEBENCH_TRAINER_S``, ``STAGEBENCH_JOB_S`` or None: from the step) when ``STAGEBENCH_TRAINER=measure``
    (read and checked by the settings table)."""
    given = read_env(os.environ)
    if given.get("trainer") != "measure":
        return None
    job_s = given.get("job_s", setting("job_s").default)
    return float(given.get("trainer_s", setting("trainer_s").default)), None if job_s is None else float(job_s)


def _then_exit(
    factory: Any, summary: dict, run_dir: Path, seconds: float, job_s: float | None, group: HostGroup | None
):
    """The user's loop on cached batches, then at the candidate settings (:mod:`stagebench.loader._trainer`), then
    exit (every rank of the host with the same code)."""
    knobs = LoaderKnobs(**loader_knobs(summary["recommended"]))
    if (summary.get("settings") or {}).get("cuda") and factory.user_knobs is not None:
        # the step is measured on batches as the loop will receive them: pinned when the user pins
        knobs = replace(knobs, pin_memory=factory.user_knobs.pin_memory)

    def end(code: int) -> None:  # the loop stopped early
        if group is not None:
            group.end(code)
        end_from_close(code)

    with _ending(group), on_sigterm():
        code = yield from loader_trainer_phases(
            factory, Path(run_dir), cached_knobs=knobs, seconds=seconds, job_s=job_s, say=message, end=end, group=group
        )
        raise SystemExit(code)


def sweep_dataset(
    dataset: Any,
    *,
    backend: str = "torch",
    name: str | None = None,
    run_dir: Path | str | None = None,
    config: LoaderSweepConfig | None = None,
    target_rate: float | None = None,
    progress: Any = None,
    **loader_kwargs: Any,
) -> dict[str, Any]:
    """Sweep a dataset given directly: an object, or a ``"module:factory"`` path.

    ``loader_kwargs`` are DataLoader arguments (batch_size, shuffle, sampler,
    batch_sampler, collate_fn, drop_last, generator, worker_init_fn, ...). Knob
    arguments given here (num_workers, prefetch_factor, ...) are the user's own
    setting: it is measured too, after the search, so the report compares it.
    """
    ds = resolve_dataset(dataset) if isinstance(dataset, str) else dataset
    factory = make_loader_factory(ds, backend=backend, **loader_kwargs)
    return _sweep_factory(
        factory, backend, name=name, run_dir=run_dir, config=config, target_rate=target_rate, progress=progress
    )[1]


def _sweep_factory(
    factory: DatasetLoaderFactory,
    backend: str,
    *,
    name: str | None,
    run_dir: Path | str | None,
    config: LoaderSweepConfig | None,
    target_rate: float | None,
    progress: Any,
    trainer_planned: bool = False,
    env_as_given: Mapping[str, str | None] | None = None,
) -> tuple[Path, dict[str, Any]]:
    """Sweep a user's loader, their own setting included (measured after the search, so the report
    compares it); the run directory defaults to a new folder under $STAGEBENCH_OUTPUT_DIR or ./reports.
    ``trainer_planned``: the user's loop runs after the sweep (run.json says so, for the summary)."""
    cfg = config or LoaderSweepConfig()
    if factory.user_knobs is not None:
        cfg = replace(cfg, yours=factory.user_knobs)
    out = (
        Path(run_dir)
        if run_dir is not None
        else default_run_dir(per_host("loader"), base=os.environ.get("STAGEBENCH_OUTPUT_DIR", "reports"))
    )
    summary = run_loader_sweep(
        factory,  # type: ignore[arg-type]  # LoaderFactory leaves out the BuiltLoader it accepts (loader/_sweep.py)
        name=name or factory.name,
        backend=backend,
        batch_size=factory.batch_size,
        run_dir=out,
        config=cfg,
        target_rate=target_rate,
        extra_meta={"loader": factory.describe(), "trainer_planned": trainer_planned},
        progress=progress,
        env_as_given=env_as_given,
    )
    return out, summary
