"""The loaders behind ``conf/loader/*.yaml``: datasets, transforms, and one factory per backend.

A loader config (:mod:`stagebench.sweep._schema`) becomes a :class:`LoaderSpec`:
a map-style dataset built once, and a factory that builds a *fresh* loader
over it for each knob setting the loader sweep asks for (the
``LoaderFactory`` contract of :mod:`stagebench.loader._sweep`).

Why the datasets look like this:

* ``dataset[i]`` is ``(transform(raw), label)`` with ``raw = dataset.raw(i)``
  the I/O-only part (file bytes), exactly like torchvision's ``ImageFolder``;
  ``dataset.transform`` is a :class:`Compose` whose ``.transforms`` list holds
  plain callables (decode, crop, flip, normalise). The loader sweep finds that
  list and measures each transform as a stage; with ``transform = None``
  ``dataset[i]`` gives the first transform's input.
* Transforms use torch ops only (there is no CPU torchvision here): the crop is
  torchvision's RandomResizedCrop sampling and bilinear antialiased resizing
  on the uint8 tensor, so both decoders feed the same augmentation and a
  decoder comparison isolates decoding.
* Randomness comes from torch's generator, which torch's DataLoader seeds per
  worker.

Backends, and how the sweep's knobs map onto each:

``torch``, ``spdl_pytorch``
    ``torch.utils.data.DataLoader`` and ``spdl.dataloader.get_pytorch_dataloader``,
    built by the loader sweep's own factory
    (:func:`stagebench.loader._intercept.make_loader_factory`), which controls
    where epochs end, tags batches with the worker that made them, and
    normalises knobs a backend cannot take (SPDL's loader has no 0 workers and
    no persistent workers; the change is noted in the results).
``spdl_pipeline``
    an SPDL pipeline of thread stages as SPDL's docs build image loaders:
    ``batch indices -> disaggregate -> read -> decode -> augment ->
    aggregate(batch_size) -> collate``. ``num_workers`` is the pipeline's
    thread-pool size and every stage's concurrency (any stage may use every
    thread); 0 runs the same stage functions one after another in the calling
    thread (the in-process baseline, like DataLoader's 0).
    ``prefetch_factor`` x max(1, num_workers) is the sink buffer in batches,
    the same total prefetch a DataLoader holds. ``persistent_workers`` keeps
    one pipeline (its threads) over a continuous source across epochs instead
    of building one per epoch; as with torch's persistent workers, an epoch's
    work starts when the epoch is requested.
"""

from __future__ import annotations

import io
import math
import random
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

__all__ = [
    "BACKENDS",
    "LoaderSpec",
    "build_loader",
    "make_factory",
    "Compose",
    "DecodeImage",
    "RandomResizedCrop",
    "RandomHorizontalFlip",
    "Normalize",
    "DecodeAudio",
    "RandomCrop1d",
    "LogMel",
    "ImageFolderDataset",
    "SyntheticTensorDataset",
    "AudioClipDataset",
    "SpdlPipelineLoader",
    "PipelineLoaderFactory",
]

BACKENDS = ("torch", "spdl_pytorch", "spdl_pipeline")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


# --------------------------------------------------------------------------- transforms


class Compose:
    """Apply ``transforms`` in order; the list is public so each can be measured alone."""

    def __init__(self, transforms: Sequence[Callable[[Any], Any]]) -> None:
        self.transforms = list(transforms)

    def __call__(self, x: Any) -> Any:
        for t in self.transforms:
            x = t(x)
        return x

    def __repr__(self) -> str:
        return f"Compose({', '.join(map(repr, self.transforms))})"


class DecodeImage:
    """JPEG/PNG bytes -> HWC uint8 RGB tensor, with Pillow or spdl.io (FFmpeg)."""

    def __init__(self, decoder: str = "pillow") -> None:
        if decoder not in ("pillow", "spdl"):
            raise ValueError(f"decoder: unknown image decoder {decoder!r}; allowed: pillow, spdl")
        self.decoder = decoder

    def __call__(self, data: bytes) -> torch.Tensor:
        if self.decoder == "spdl":
            import spdl.io

            return spdl.io.to_torch(spdl.io.load_image(data))
        import numpy as np
        from PIL import Image

        with Image.open(io.BytesIO(data)) as im:
            return torch.from_numpy(np.array(im.convert("RGB")))

    def __repr__(self) -> str:
        return f"DecodeImage({self.decoder})"


class RandomResizedCrop:
    """torchvision's RandomResizedCrop on an HWC uint8 tensor -> CHW uint8 ``size`` x ``size``."""

    def __init__(
        self, size: int, scale: tuple[float, float] = (0.08, 1.0), ratio: tuple[float, float] = (3 / 4, 4 / 3)
    ) -> None:
        self.size = int(size)
        self.scale = scale
        self.log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
        self.ratio = ratio

    def params(self, h: int, w: int) -> tuple[int, int, int, int]:
        area = h * w
        for _ in range(10):
            target = area * torch.empty(1).uniform_(*self.scale).item()
            aspect = math.exp(torch.empty(1).uniform_(*self.log_ratio).item())
            cw = int(round(math.sqrt(target * aspect)))
            ch = int(round(math.sqrt(target / aspect)))
            if 0 < cw <= w and 0 < ch <= h:
                top = int(torch.randint(0, h - ch + 1, (1,)).item())
                left = int(torch.randint(0, w - cw + 1, (1,)).item())
                return top, left, ch, cw
        # Fallback (as torchvision): the largest central crop within the ratio range.
        in_ratio = w / h
        if in_ratio < self.ratio[0]:
            cw, ch = w, int(round(w / self.ratio[0]))
        elif in_ratio > self.ratio[1]:
            ch, cw = h, int(round(h * self.ratio[1]))
        else:
            cw, ch = w, h
        return (h - ch) // 2, (w - cw) // 2, ch, cw

    def __call__(self, img: torch.Tensor) -> torch.Tensor:
        h, w = int(img.shape[0]), int(img.shape[1])
        top, left, ch, cw = self.params(h, w)
        crop = img[top : top + ch, left : left + cw].permute(2, 0, 1).unsqueeze(0)
        out = torch.nn.functional.interpolate(
            crop.contiguous(), size=(self.size, self.size), mode="bilinear", antialias=True, align_corners=False
        )
        return out[0]

    def __repr__(self) -> str:
        return f"RandomResizedCrop({self.size})"


class RandomHorizontalFlip:
    def __init__(self, p: float = 0.5) -> None:
        self.p = p

    def __call__(self, img: torch.Tensor) -> torch.Tensor:
        return img.flip(-1) if torch.rand(1).item() < self.p else img

    def __repr__(self) -> str:
        return f"RandomHorizontalFlip({self.p})"


class Normalize:
    """CHW uint8 -> float32 ``(x / 255 - mean) / std``."""

    def __init__(self, mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD) -> None:
        self.mean = torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1) * 255
        self.inv_std = 1.0 / (torch.tensor(std, dtype=torch.float32).view(-1, 1, 1) * 255)

    def __call__(self, img: torch.Tensor) -> torch.Tensor:
        return (img.to(torch.float32) - self.mean).mul_(self.inv_std)

    def __repr__(self) -> str:
        return "Normalize(imagenet)"


class DecodeAudio:
    """Audio file bytes -> mono float32 waveform at ``sample_rate``.

    ``spdl``: ``spdl.io.load_audio`` (FFmpeg demux, decode, resample, downmix);
    ``wav``: ``spdl.io.load_wav`` (header parsing and a zero-copy view; the
    file must already be at ``sample_rate``).
    """

    def __init__(self, decoder: str = "spdl", sample_rate: int = 16000) -> None:
        if decoder not in ("spdl", "wav"):
            raise ValueError(f"decoder: unknown audio decoder {decoder!r}; allowed: spdl, wav")
        self.decoder = decoder
        self.sample_rate = int(sample_rate)

    def __call__(self, data: bytes) -> torch.Tensor:
        import spdl.io

        if self.decoder == "spdl":
            desc = spdl.io.get_audio_filter_desc(sample_rate=self.sample_rate, num_channels=1, sample_fmt="flt")
            return spdl.io.to_torch(spdl.io.load_audio(data, filter_desc=desc))[:, 0]
        import numpy as np

        header = spdl.io.parse_wav(data)
        if header.sample_rate != self.sample_rate:
            raise ValueError(
                f"a WAV file is at {header.sample_rate} Hz but loader.sample_rate is {self.sample_rate}; "
                "use decoder=spdl to resample"
            )
        samples = np.asarray(spdl.io.load_wav(data))
        mono = samples.mean(axis=1) if samples.shape[1] > 1 else samples[:, 0]
        scale = float(np.iinfo(samples.dtype).max) if samples.dtype.kind == "i" else 1.0
        return torch.from_numpy(mono.astype(np.float32) / scale)

    def __repr__(self) -> str:
        return f"DecodeAudio({self.decoder})"


class RandomCrop1d:
    """A random window of ``length`` samples (zero-padded when the clip is shorter)."""

    def __init__(self, length: int) -> None:
        self.length = int(length)

    def __call__(self, wav: torch.Tensor) -> torch.Tensor:
        n = int(wav.shape[0])
        if n <= self.length:
            return torch.nn.functional.pad(wav, (0, self.length - n))
        start = int(torch.randint(0, n - self.length + 1, (1,)).item())
        return wav[start : start + self.length]

    def __repr__(self) -> str:
        return f"RandomCrop1d({self.length})"


def _user_root(root: str) -> Path:
    """The dataset folder the user gave as ``loader.root``; a missing one names the key."""
    path = Path(root).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(f"loader.root: folder {str(path)!r} does not exist")
    return path


def _mel_filterbank(sample_rate: int, n_fft: int, n_mels: int) -> torch.Tensor:
    """Slaney-style triangular mel filters, (n_mels, n_fft // 2 + 1)."""

    def hz_to_mel(f: torch.Tensor) -> torch.Tensor:
        return 2595.0 * torch.log10(1.0 + f / 700.0)

    def mel_to_hz(m: torch.Tensor) -> torch.Tensor:
        return 700.0 * (10 ** (m / 2595.0) - 1.0)

    freqs = torch.linspace(0, sample_rate / 2, n_fft // 2 + 1)
    mels = torch.linspace(
        float(hz_to_mel(torch.tensor(0.0))), float(hz_to_mel(torch.tensor(sample_rate / 2))), n_mels + 2
    )
    hz = mel_to_hz(mels)
    lower, centre, upper = hz[:-2, None], hz[1:-1, None], hz[2:, None]
    up = (freqs[None, :] - lower) / (centre - lower)
    down = (upper - freqs[None, :]) / (upper - centre)
    return torch.clamp(torch.minimum(up, down), min=0.0)


class LogMel:
    """Waveform -> (n_mels, frames) log-mel spectrogram (25 ms window, 10 ms hop at 16 kHz)."""

    def __init__(self, sample_rate: int = 16000, n_mels: int = 80) -> None:
        self.n_fft = int(round(0.025 * sample_rate))
        self.hop = int(round(0.010 * sample_rate))
        self.n_mels = int(n_mels)
        self.window = torch.hann_window(self.n_fft)
        self.fb = _mel_filterbank(sample_rate, self.n_fft, self.n_mels)

    def __call__(self, wav: torch.Tensor) -> torch.Tensor:
        spec = torch.stft(wav, self.n_fft, hop_length=self.hop, window=self.window, return_complex=True)
        power = spec.real.square() + spec.imag.square()
        return torch.log(self.fb @ power + 1e-6)

    def __repr__(self) -> str:
        return f"LogMel({self.n_mels})"


# --------------------------------------------------------------------------- datasets


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


# --------------------------------------------------------------------------- backends


def _collate(batch: list[Any]) -> Any:
    from torch.utils.data import default_collate

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
    number of batches and the loader sweep's :class:`~stagebench.loader._sweep.EpochControl`
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
        collate_fn: Callable[[list[Any]], Any] = _collate,
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
        try:
            self.close()
        except Exception:  # interpreter shutdown: SPDL's own finalizer stops it
            pass


@dataclass(slots=True, kw_only=True)
class PipelineLoaderFactory:
    """``LoaderFactory`` for the spdl_pipeline backend: knobs -> a fresh :class:`SpdlPipelineLoader`."""

    dataset: Any
    batch_size: int
    shuffle: bool = True
    drop_last: bool = True
    seed: int = 0
    collate_fn: Callable[[list[Any]], Any] = _collate
    name: str = "loader"

    def __call__(self, knobs: Any) -> Any:
        from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler

        from stagebench.loader._sweep import BuiltLoader, EpochControl

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


def _worker_context() -> Any:
    """A start method for loader workers when the process default cannot start them.

    Inside joblib's loky workers (``hydra/launcher=joblib``) the default start
    method is ``loky``, with which torch's DataLoader fails to start workers;
    the loaders then use the platform's own default instead. Otherwise None:
    the user's or platform's default stands.
    """
    import multiprocessing as mp

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
            collate_fn=collate_fn or _collate,
            name=name,
        )
    from stagebench.loader._intercept import make_loader_factory

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


# --------------------------------------------------------------------------- from a config


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
    from stagebench.loader._intercept import import_user_module

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
    from stagebench.sweep import _datasets
    from stagebench.sweep._schema import (
        AudioLoaderConfig,
        CustomLoaderConfig,
        ImageNetLoaderConfig,
        SyntheticLoaderConfig,
    )

    log = progress.message if progress is not None else _datasets._stderr
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
