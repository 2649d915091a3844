"""The loaders behind ``conf/loader/*.yaml``: datasets, transforms, and one factory per backend.

A loader config (:mod:`stagebench.sweep._schema`) becomes a :class:`LoaderSpec`:
a map-style dataset built once, and a factory that builds a *fresh* loader
over it for each knob setting the loader sweep asks for (the
``LoaderFactory`` contract of :mod:`stagebench.loader._sweep`).

Why the datasets look like this:

* ``dataset[i]`` is ``(transform(raw), label)`` with ``raw = dataset.raw(i)``
  the I/O-only part (file bytes), exactly like torchvision's ``ImageFolder``;
  ``dataset.transform`` is a :class:`~stagebench.sweep._transforms.Compose` whose
  ``.transforms`` list holds plain callables (decode, crop, flip, normalise). The
  loader sweep finds that list and measures each transform as a stage; with
  ``transform = None`` ``dataset[i]`` gives the first transform's input.

Backends: ``torch`` and ``spdl_pytorch`` (``torch.utils.data.DataLoader`` and
``spdl.dataloader.get_pytorch_dataloader``) are built by the loader sweep's own factory
(:func:`stagebench.loader._intercept.make_loader_factory`), which controls where epochs end,
tags batches with the worker that made them, and normalises knobs a backend cannot take (SPDL's
loader has no 0 workers and no persistent workers; the change is noted in the results).
``spdl_pipeline`` is an SPDL pipeline of thread stages (:mod:`stagebench.sweep._spdl_loader`).
"""

from __future__ import annotations

import multiprocessing as mp
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from stagebench.core._progress import message
from stagebench.loader._intercept import import_user_module, make_loader_factory
from stagebench.runs._knobs import KNOWN_BACKENDS
from stagebench.sweep import _datasets
from stagebench.sweep._schema import AudioLoaderConfig, CustomLoaderConfig, ImageNetLoaderConfig, SyntheticLoaderConfig
from stagebench.sweep._spdl_loader import PipelineLoaderFactory, collate_batch
from stagebench.sweep._transforms import (
    Compose,
    DecodeAudio,
    DecodeImage,
    LogMel,
    Normalize,
    RandomCrop1d,
    RandomHorizontalFlip,
    RandomResizedCrop,
)

__all__ = [
    "BACKENDS",
    "LoaderSpec",
    "build_loader",
    "make_factory",
    "ImageFolderDataset",
    "SyntheticTensorDataset",
    "AudioClipDataset",
]

BACKENDS = (*KNOWN_BACKENDS, "spdl_pipeline")


class _FileDataset(Dataset):
    """Files read as bytes (the I/O stage), then ``transform``; ``(sample, label)`` items."""

    def __init__(self, files: Sequence[tuple[str, int]], transform: Compose | None) -> None:
        self.files = list(files)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.files)

    def raw(self, index: int) -> tuple[bytes, int]:
        path, label = self.files[index]
        with open(path, "rb") as f:
            return f.read(), label

    def __getitem__(self, index: int) -> tuple[Any, int]:
        data, label = self.raw(index)
        return (self.transform(data) if self.transform is not None else data), label

    def pipeline_stages(self) -> list[tuple[str, Callable[[Any], Any]]]:
        """Thread stages for the spdl_pipeline backend, over ``(sample, label)`` items."""
        stages: list[tuple[str, Callable[[Any], Any]]] = [("read", self.raw)]
        ts = self.transform.transforms if self.transform is not None else []
        if ts:
            stages.append(("decode", _OnSample(ts[0])))
        if len(ts) > 1:
            stages.append((self._augment_name, _OnSample(Compose(ts[1:]))))
        return stages

    _augment_name = "augment"


class ImageFolderDataset(_FileDataset):
    """``root/<split>/<class>/*`` images, labels by sorted class folder (as ImageFolder)."""

    EXTENSIONS = (".jpeg", ".jpg", ".png", ".bmp", ".webp")

    @classmethod
    def from_root(cls, root: str | Path, transform: Compose | None, *, split: str = "train") -> "ImageFolderDataset":
        base = Path(root)
        folder = base / split if (base / split).is_dir() else base
        classes = sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []
        files = [
            (str(p), label)
            for label, c in enumerate(classes)
            for p in sorted((folder / c).iterdir())
            if p.suffix.lower() in cls.EXTENSIONS
        ]
        if not files:
            raise FileNotFoundError(
                f"loader.root: no images in {folder}/<class>/ (expected the ImageNet layout "
                f"{base}/{split}/<class>/*.JPEG)"
            )
        return cls(files, transform)


class AudioClipDataset(_FileDataset):
    """Audio files under ``root/clips/`` (or ``root``); the label is the file's index."""

    EXTENSIONS = (".wav", ".flac", ".mp3", ".ogg", ".opus", ".m4a")
    _augment_name = "features"

    @classmethod
    def from_root(cls, root: str | Path, transform: Compose | None) -> "AudioClipDataset":
        base = Path(root)
        folder = base / "clips" if (base / "clips").is_dir() else base
        paths = sorted(p for p in folder.iterdir() if p.suffix.lower() in cls.EXTENSIONS) if folder.is_dir() else []
        if not paths:
            raise FileNotFoundError(f"loader.root: no audio files in {folder} (expected {base}/clips/*.wav)")
        return cls([(str(p), i) for i, p in enumerate(paths)], transform)


class SyntheticTensorDataset(Dataset):
    """``num_items`` items served from ``distinct`` tensors held in memory; no work per item."""

    def __init__(
        self, *, num_items: int, sample_shape: Sequence[int], dtype: str = "float32", distinct: int = 64, seed: int = 0
    ) -> None:
        g = torch.Generator().manual_seed(seed)
        shape = tuple(int(d) for d in sample_shape)
        n = min(int(distinct), int(num_items))
        if dtype == "uint8":
            self.tensors = [torch.randint(0, 256, shape, dtype=torch.uint8, generator=g) for _ in range(n)]
        else:
            self.tensors = [torch.randn(shape, generator=g) for _ in range(n)]
        self.num_items = int(num_items)
        self.transform = None

    def __len__(self) -> int:
        return self.num_items

    def raw(self, index: int) -> tuple[torch.Tensor, int]:
        return self.tensors[index % len(self.tensors)], index

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.raw(index)

    def pipeline_stages(self) -> list[tuple[str, Callable[[Any], Any]]]:
        return [("fetch", self.raw)]


class _OnSample:
    """Apply ``fn`` to the sample of a ``(sample, label)`` item."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn

    def __call__(self, item: tuple[Any, int]) -> tuple[Any, int]:
        return self.fn(item[0]), item[1]

    def __repr__(self) -> str:
        return repr(self.fn)


class _Subset(Dataset):
    """The first ``n`` items of ``dataset`` after one seeded shuffle (keeps ``transform`` visible)."""

    def __init__(self, dataset: Any, n: int, seed: int) -> None:
        order = list(range(len(dataset)))
        random.Random(seed).shuffle(order)
        self.dataset = dataset
        self.indices = order[:n]

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int) -> Any:
        return self.dataset[self.indices[index]]

    def raw(self, index: int) -> Any:
        return self.dataset.raw(self.indices[index])

    @property
    def transform(self) -> Any:
        return self.dataset.transform

    @transform.setter
    def transform(self, value: Any) -> None:
        self.dataset.transform = value

    def pipeline_stages(self) -> list[tuple[str, Callable[[Any], Any]]]:
        stages = self.dataset.pipeline_stages()
        name, first = stages[0]
        return [(name, lambda i: first(self.indices[i])), *stages[1:]]


def _user_root(root: str) -> Path:
    """The dataset folder the user gave as ``loader.root``; a missing one names the key."""
    path = Path(root).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(f"loader.root: folder {str(path)!r} does not exist")
    return path


def _worker_context() -> Any:
    """A start method for loader workers when the process default cannot start them.

    Inside joblib's loky workers (``hydra/launcher=joblib``) the default start
    method is ``loky``, with which torch's DataLoader fails to start workers;
    the loaders then use the platform's own default instead. Otherwise None:
    the user's or platform's default stands.
    """
    method = mp.get_start_method(allow_none=True)
    if method is None or method in ("fork", "spawn", "forkserver"):
        return None
    return mp.get_context(mp.get_all_start_methods()[0])


def make_factory(
    dataset: Any,
    *,
    backend: str,
    batch_size: int,
    shuffle: bool = True,
    drop_last: bool = True,
    seed: int = 0,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    name: str = "loader",
) -> Callable[[Any], Any]:
    """A ``LoaderFactory`` (knobs -> a fresh loader) for ``dataset`` on ``backend``.

    torch and spdl_pytorch use the loader sweep's own factory
    (:func:`stagebench.loader._intercept.make_loader_factory`: epoch control and
    worker tags); spdl_pipeline uses :class:`PipelineLoaderFactory`.
    """
    if backend not in BACKENDS:
        raise ValueError(f"loader.backend: unknown backend {backend!r}; allowed: {', '.join(BACKENDS)}")
    if backend == "spdl_pipeline":
        return PipelineLoaderFactory(
            dataset=dataset,
            batch_size=batch_size,
            shuffle=shuffle,
            drop_last=drop_last,
            seed=seed,
            collate_fn=collate_fn or collate_batch,
            name=name,
        )
    kwargs: dict[str, Any] = dict(
        batch_size=batch_size, shuffle=shuffle, drop_last=drop_last, generator=torch.Generator().manual_seed(seed)
    )
    ctx = _worker_context()
    if ctx is not None:
        kwargs["multiprocessing_context"] = ctx
    if collate_fn is not None:
        kwargs["collate_fn"] = collate_fn
    factory = make_loader_factory(dataset, backend=backend, **kwargs)
    factory.name = name
    return factory


@dataclass(frozen=True, slots=True, kw_only=True)
class LoaderSpec:
    """A dataset built once, and the factory that builds loaders over it."""

    name: str
    backend: str
    batch_size: int
    dataset: Any
    factory: Callable[[Any], Iterable[Any]]
    info: dict[str, Any] = field(default_factory=dict)
    """What the data is (root, files, generated or not): goes into run.json."""


def _import_path(spec: str, key: str) -> Callable[..., Any]:
    mod_name, _, attr = spec.partition(":")
    try:
        obj: Any = import_user_module(mod_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"{key}: cannot import {spec!r}: {e}") from None
    if not callable(obj):
        raise ValueError(f"{key}: {spec!r} is not callable")
    return obj


def build_loader(cfg: Any, *, progress: Any = None) -> LoaderSpec:
    """A :class:`LoaderSpec` from a validated loader config (generates built-in data on first use)."""
    log = progress.message if progress is not None else message
    info: dict[str, Any] = {"kind": cfg.kind}
    collate = None
    if isinstance(cfg, ImageNetLoaderConfig):
        if cfg.root is None:
            root = _datasets.generate_imagenet(
                None, classes=cfg.classes, per_class=cfg.per_class, seed=cfg.seed, log=log
            )
            info["generated"] = _datasets.read_manifest(root)
        else:
            root = _user_root(cfg.root)
        transform = Compose(
            [
                DecodeImage(cfg.decoder.name),
                RandomResizedCrop(cfg.image_size),
                RandomHorizontalFlip(),
                Normalize(),
            ]
        )
        dataset: Any = ImageFolderDataset.from_root(root, transform)
        info.update(root=str(root), decoder=cfg.decoder.name, image_size=cfg.image_size)
    elif isinstance(cfg, AudioLoaderConfig):
        if cfg.root is None:
            root = _datasets.generate_audio(
                None, clips=cfg.clips, seconds=cfg.clip_seconds, sample_rate=cfg.sample_rate, seed=cfg.seed, log=log
            )
            info["generated"] = _datasets.read_manifest(root)
        else:
            root = _user_root(cfg.root)
        transform = Compose(
            [
                DecodeAudio(cfg.decoder.name, cfg.sample_rate),
                RandomCrop1d(int(round(cfg.crop_seconds * cfg.sample_rate))),
                LogMel(cfg.sample_rate, cfg.n_mels),
            ]
        )
        dataset = AudioClipDataset.from_root(root, transform)
        info.update(root=str(root), decoder=cfg.decoder.name, sample_rate=cfg.sample_rate)
    elif isinstance(cfg, SyntheticLoaderConfig):
        dataset = SyntheticTensorDataset(
            num_items=int(cfg.num_items),  # type: ignore[arg-type]  # never None: SyntheticLoaderConfig checks it
            sample_shape=list(cfg.sample_shape),
            dtype=cfg.dtype.name,
            distinct=cfg.distinct,
            seed=cfg.seed,
        )
        info.update(sample_shape=list(cfg.sample_shape), dtype=cfg.dtype.name, distinct=cfg.distinct)
    elif isinstance(cfg, CustomLoaderConfig):
        dataset = _import_path(cfg.dataset, "loader.dataset")()
        if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
            raise ValueError(
                f"loader.dataset: {cfg.dataset!r} did not return a map-style dataset (__getitem__ and __len__)"
            )
        if cfg.collate is not None:
            collate = _import_path(cfg.collate, "loader.collate")
        if cfg.backend.name == "spdl_pipeline" and not hasattr(dataset, "pipeline_stages"):
            dataset = _WholeItem(dataset)
        info.update(dataset=cfg.dataset, collate=cfg.collate)
    else:
        raise TypeError(f"no loader for config type {type(cfg).__name__}")

    if cfg.num_items is not None and not isinstance(cfg, SyntheticLoaderConfig):
        if cfg.num_items > len(dataset):
            raise ValueError(f"loader.num_items: {cfg.num_items} exceeds the dataset ({len(dataset)} items)")
        dataset = _Subset(dataset, cfg.num_items, cfg.seed)
    if len(dataset) < cfg.batch_size and cfg.drop_last:
        raise ValueError(
            f"loader.batch_size: {cfg.batch_size} is larger than the dataset ({len(dataset)} items) with drop_last"
        )
    info["items"] = len(dataset)
    factory = make_factory(
        dataset,
        backend=cfg.backend.name,
        batch_size=cfg.batch_size,
        shuffle=cfg.shuffle,
        drop_last=cfg.drop_last,
        seed=cfg.seed,
        collate_fn=collate,
        name=cfg.name,
    )
    return LoaderSpec(
        name=cfg.name, backend=cfg.backend.name, batch_size=cfg.batch_size, dataset=dataset, factory=factory, info=info
    )


class _WholeItem(Dataset):
    """A user's dataset as one pipeline stage (``dataset[i]``) for the spdl_pipeline backend."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]

    @property
    def transform(self) -> Any:
        return getattr(self.dataset, "transform", None)

    def pipeline_stages(self) -> list[tuple[str, Callable[[Any], Any]]]:
        return [("getitem", self.dataset.__getitem__)]
