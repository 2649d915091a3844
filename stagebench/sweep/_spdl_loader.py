"""The ``spdl_pipeline`` backend: an SPDL pipeline of thread stages as SPDL's docs build image loaders.

``batch indices -> disaggregate -> read -> decode -> augment -> aggregate(batch_size) -> collate``.
``num_workers`` is the pipeline's thread-pool size and every stage's concurrency; 0 runs the same
stage functions one after another in the calling thread (the in-process baseline, like
DataLoader's 0). ``prefetch_factor`` x max(1, num_workers) is the sink buffer in batches, the same
total prefetch a DataLoader holds. ``persistent_workers`` keeps one pipeline over a continuous
source across epochs, its epochs started at ``iter()`` as torch's persistent workers' are.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler, default_collate

from stagebench.loader._built import BuiltLoader, EpochControl

__all__ = ["SpdlPipelineLoader", "PipelineLoaderFactory", "collate_batch"]


def collate_batch(batch: list[Any]) -> Any:
    """torch's default collate, by a name of this module's: the factory's default, pickled by reference."""
    return default_collate(batch)


class _EpochGate:
    """The source of a persistent pipeline: an epoch starts only when the consumer asks for it.

    A continuous SPDL source starts its next epoch as soon as one ends, before
    the consumer has decided how long that epoch is (the sweep's epoch control
    sets it between epochs). Gating it gives persistent workers' semantics in
    torch: the threads stay, and an epoch's work starts at ``iter()``.
    """

    def __init__(self, inner: Iterable[Any]) -> None:
        self.inner = inner
        self._go = threading.Event()
        self._stopped = False

    def open(self) -> None:
        self._go.set()

    def stop(self) -> None:
        self._stopped = True
        self._go.set()

    def __iter__(self) -> Iterator[Any]:
        # SPDL iterates a source on a non-daemon thread: never block it for good, or the
        # interpreter could not exit (SPDL stops the pipeline itself at exit).
        while not self._go.wait(0.1):
            if self._stopped or not threading.main_thread().is_alive():
                return
        self._go.clear()
        if not self._stopped:
            yield from self.inner


def _item_error(e: Exception) -> Exception:
    """SPDL's ``PipelineFailure`` says only "pipeline stages failed": surface the item's own error."""
    for sub in getattr(e, "exceptions", ()) or ():
        cause = sub.__cause__
        if cause is not None:
            return RuntimeError(f"{type(cause).__name__}: {cause} ({sub})")
    return e


class SpdlPipelineLoader:
    """An iterable over batches from an SPDL pipeline of thread stages (one pipeline per epoch).

    The source is a batch sampler (lists of indices), so an epoch is a whole
    number of batches and the loader sweep's :class:`~stagebench.loader._built.EpochControl`
    counts batches here as it does for torch: ``source -> disaggregate ->
    stages -> aggregate(batch_size) -> collate -> sink``.
    ``persistent=True`` builds one pipeline over a continuous source and
    iterates one epoch of it per ``iter()``.
    """

    def __init__(
        self,
        dataset: Any,
        *,
        batch_sampler: Iterable[list[int]],
        batch_size: int,
        num_workers: int,
        prefetch_factor: int,
        persistent: bool,
        drop_last: bool,
        collate_fn: Callable[[list[Any]], Any] = collate_batch,
    ) -> None:
        self.dataset = dataset
        self.batch_sampler = batch_sampler
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        self.persistent = persistent and num_workers > 0
        self.drop_last = drop_last
        self.collate_fn = collate_fn
        self._pipeline: Any = None
        self._gate: _EpochGate | None = None

    def __len__(self) -> int:
        return len(self.batch_sampler)  # type: ignore[arg-type]

    def _build(self, source: Iterable[Any], continuous: bool) -> Any:
        # spdl on the first pipeline built: the torch backends never pay for its import
        from spdl.pipeline import PipelineBuilder

        c = max(1, self.num_workers)
        builder: PipelineBuilder[Any, Any] = PipelineBuilder().add_source(source, continuous=continuous).disaggregate()
        for name, fn in self.dataset.pipeline_stages():
            builder.pipe(fn, concurrency=c, name=name)
        builder.aggregate(self.batch_size, drop_last=self.drop_last)
        builder.pipe(self.collate_fn, concurrency=c, name="collate")
        builder.add_sink(self.prefetch_factor * c)
        # max_failures=0: an item that raises fails the loader (SPDL would otherwise drop it).
        return builder.build(num_threads=c, max_failures=0)

    def _serial(self) -> Iterator[Any]:
        stages = [fn for _, fn in self.dataset.pipeline_stages()]
        for indices in self.batch_sampler:
            items = []
            for index in indices:
                item: Any = index
                for fn in stages:
                    item = fn(item)
                items.append(item)
            yield self.collate_fn(items)

    def __iter__(self) -> Iterator[Any]:
        if self.num_workers == 0:
            yield from self._serial()
            return
        try:
            yield from self._iter_pipeline()
        except Exception as e:
            surfaced = _item_error(e)
            if surfaced is e:
                raise
            raise surfaced from e

    def _iter_pipeline(self) -> Iterator[Any]:
        if self.persistent:
            if self._pipeline is None:
                self._gate = _EpochGate(self.batch_sampler)
                self._pipeline = self._build(self._gate, continuous=True)
                self._pipeline.start()
            assert self._gate is not None
            self._gate.open()
            yield from self._pipeline.get_iterator()
            return
        pipeline = self._build(self.batch_sampler, continuous=False)
        with pipeline.auto_stop():
            yield from pipeline.get_iterator()

    def close(self) -> None:
        if self._gate is not None:
            self._gate.stop()
        if self._pipeline is not None:
            pipeline, self._pipeline = self._pipeline, None
            pipeline.stop()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown: SPDL's own finalizer stops it
            self.close()


@dataclass(slots=True, kw_only=True)
class PipelineLoaderFactory:
    """``LoaderFactory`` for the spdl_pipeline backend: knobs -> a fresh :class:`SpdlPipelineLoader`."""

    dataset: Any
    batch_size: int
    shuffle: bool = True
    drop_last: bool = True
    seed: int = 0
    collate_fn: Callable[[list[Any]], Any] = collate_batch
    name: str = "loader"

    def __call__(self, knobs: Any) -> Any:
        items = (
            RandomSampler(self.dataset, generator=torch.Generator().manual_seed(self.seed))
            if self.shuffle
            else SequentialSampler(self.dataset)
        )
        control = EpochControl(BatchSampler(items, self.batch_size, self.drop_last))
        nw = int(knobs.num_workers)
        loader = SpdlPipelineLoader(
            self.dataset,
            batch_sampler=control,
            batch_size=self.batch_size,
            num_workers=nw,
            prefetch_factor=int(knobs.prefetch_factor or 2),
            persistent=bool(knobs.persistent_workers),
            drop_last=self.drop_last,
            collate_fn=self.collate_fn,
        )
        return BuiltLoader(loader=loader, control=control, close=loader.close)

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "backend": "spdl_pipeline",
            "batch_size": self.batch_size,
            "dataset": f"{type(self.dataset).__module__}.{type(self.dataset).__qualname__}",
            "dataset_len": len(self.dataset),
            "stages": [n for n, _ in self.dataset.pipeline_stages()] + ["aggregate", "collate"],
            "knob_mapping": "num_workers: thread-pool size and every stage's concurrency (0: stages run serially "
            "in the calling thread); prefetch_factor x max(1, num_workers): sink buffer in batches; "
            "persistent_workers: one pipeline over a continuous source across epochs",
        }
