"""Typed schemas of the ``stagebench sweep`` configs, registered in Hydra's ConfigStore.

Why structured configs: the YAML files under ``conf/`` only say *what* a user
picked; these dataclasses say what is *allowed*. Each ``conf/loader/*.yaml``
extends one schema (``defaults: [/schema/loader/<kind>@_here_]``), so OmegaConf
rejects an unknown key (``loader.num_wrkers=3``), a value of the wrong type,
or an option outside an enum (``loader.backend=tf``) while Hydra composes the
config, before any work starts. Ranges and cross-field rules that a type
cannot express are checked in ``__post_init__``, which runs when the composed
config is turned into objects (:func:`to_settings`).

The schemas are not frozen: Hydra merges command-line overrides into them, and
OmegaConf makes the node of a frozen dataclass read-only. The job works on the
objects :func:`to_settings` returns and never mutates them.

Schemas live in their own group (``schema/loader``) so that ``loader=`` offers
only runnable configurations.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf, open_dict

from stagebench._settings import LOADER_WINDOW_S, check

__all__ = [
    "Backend",
    "ImageDecoder",
    "AudioDecoder",
    "SampleDtype",
    "Strategy",
    "LoaderConfig",
    "ImageNetLoaderConfig",
    "SyntheticLoaderConfig",
    "AudioLoaderConfig",
    "CustomLoaderConfig",
    "SweepSettings",
    "StagebenchSweepConfig",
    "LOADER_SCHEMAS",
    "register_configs",
    "to_settings",
    "unknown_keys",
]


# Enum member names are what users type; OmegaConf lists them in its error
# message ("expected one of [torch, spdl_pytorch, spdl_pipeline]").
class Backend(Enum):
    """Which loader implementation runs the dataset."""

    torch = "torch"
    spdl_pytorch = "spdl_pytorch"
    spdl_pipeline = "spdl_pipeline"


class ImageDecoder(Enum):
    pillow = "pillow"
    spdl = "spdl"


class AudioDecoder(Enum):
    spdl = "spdl"  # spdl.io.load_audio: FFmpeg demux + decode (any container/codec)
    wav = "wav"  # spdl.io.load_wav: zero-copy WAV parsing, no FFmpeg


class SampleDtype(Enum):
    float32 = "float32"
    uint8 = "uint8"


class Strategy(Enum):
    adaptive = "adaptive"
    grid = "grid"


def _check(cond: bool, key: str, msg: str) -> None:
    if not cond:
        raise ValueError(f"{key}: {msg}")


def _check_min(key: str, value: float, low: float, *, strict: bool = False, or_null: bool = False) -> None:
    """``value`` must be at least ``low`` (above it, with ``strict``); ``or_null``: the message says
    that null is allowed too (the caller checks only a value that is set)."""
    ok, op = (value > low, ">") if strict else (value >= low, ">=")
    _check(ok, key, f"must be {op} {low}{' or null' if or_null else ''}, got {value}")


def _check_ints(key: str, values: list[int], low: int) -> None:
    """A list that may be null, set: it must hold integers, each at least ``low``, and not be empty."""
    _check(
        len(values) > 0 and all(int(n) >= low for n in values),
        key,
        f"must be a non-empty list of integers >= {low} or null, got {list(values)}",
    )


@dataclass(slots=True, kw_only=True)
class LoaderConfig:
    """Keys every loader has."""

    name: str = MISSING
    """Label of this configuration in reports and comparisons."""

    backend: Backend = Backend.torch
    """torch (torch.utils.data.DataLoader), spdl_pytorch (spdl.dataloader.get_pytorch_dataloader)
    or spdl_pipeline (an SPDL pipeline of thread stages)."""

    batch_size: int = 32

    num_items: Optional[int] = None
    """Items in one epoch: the first N of the (shuffled-once) dataset; null: all."""

    shuffle: bool = True
    drop_last: bool = True
    seed: int = 0
    """Seeds the generated data and the sampler."""

    def __post_init__(self) -> None:
        _check_min("loader.batch_size", self.batch_size, 1)
        if self.num_items is not None:
            _check_min("loader.num_items", self.num_items, 1, or_null=True)
            _check(
                self.num_items >= self.batch_size or not self.drop_last,
                "loader.num_items",
                f"{self.num_items} is less than loader.batch_size ({self.batch_size}) with "
                "drop_last: an epoch would have no batch",
            )

    @property
    def kind(self) -> str:
        return _KIND_OF[type(self)]


@dataclass(slots=True, kw_only=True)
class ImageNetLoaderConfig(LoaderConfig):
    """JPEGs in ImageNet layout: decode, random-resized-crop, flip, normalise."""

    root: Optional[str] = None
    """Dataset folder holding train/<class>/*.JPEG; null: generate one (once) into the cache."""

    decoder: ImageDecoder = ImageDecoder.pillow
    image_size: int = 224
    classes: int = 10
    """Generated data only (root: null): number of classes."""
    per_class: int = 50
    """Generated data only (root: null): images per class."""

    def __post_init__(self) -> None:
        LoaderConfig.__post_init__(self)
        _check_min("loader.image_size", self.image_size, 8)
        _check_min("loader.classes", self.classes, 1)
        _check_min("loader.per_class", self.per_class, 1)


@dataclass(slots=True, kw_only=True)
class SyntheticLoaderConfig(LoaderConfig):
    """In-memory tensors, no work per item: what the loader machinery alone costs."""

    num_items: Optional[int] = 4096
    sample_shape: list[int] = field(default_factory=lambda: [3, 224, 224])
    dtype: SampleDtype = SampleDtype.float32
    distinct: int = 64
    """Distinct tensors kept in memory; item i returns tensor i % distinct."""

    def __post_init__(self) -> None:
        LoaderConfig.__post_init__(self)
        _check(self.num_items is not None, "loader.num_items", "must be set for the synthetic loader")
        _check(
            len(self.sample_shape) >= 1 and all(int(d) >= 1 for d in self.sample_shape),
            "loader.sample_shape",
            f"must be a non-empty list of positive sizes, got {list(self.sample_shape)}",
        )
        _check_min("loader.distinct", self.distinct, 1)


@dataclass(slots=True, kw_only=True)
class AudioLoaderConfig(LoaderConfig):
    """WAV clips: decode, random crop, log-mel spectrogram."""

    root: Optional[str] = None
    """Folder holding clips/*.wav; null: generate one (once) into the cache."""

    decoder: AudioDecoder = AudioDecoder.spdl
    crop_seconds: float = 2.0
    n_mels: int = 80
    sample_rate: int = 16000
    """Sample rate the features assume; generated clips use it too."""
    clips: int = 256
    """Generated data only (root: null): number of clips."""
    clip_seconds: float = 6.0
    """Generated data only (root: null): length of each clip."""

    def __post_init__(self) -> None:
        LoaderConfig.__post_init__(self)
        _check_min("loader.crop_seconds", self.crop_seconds, 0, strict=True)
        _check_min("loader.n_mels", self.n_mels, 1)
        _check_min("loader.sample_rate", self.sample_rate, 1000)
        _check_min("loader.clips", self.clips, 1)
        _check_min("loader.clip_seconds", self.clip_seconds, 0, strict=True)


@dataclass(slots=True, kw_only=True)
class CustomLoaderConfig(LoaderConfig):
    """Your own map-style dataset, built by ``module:function`` (imported, never unpickled)."""

    dataset: str = MISSING
    """'package.module:function' returning a map-style torch Dataset (called with no arguments)."""

    collate: Optional[str] = None
    """'package.module:function' used as collate_fn; null: torch's default_collate."""

    def __post_init__(self) -> None:
        LoaderConfig.__post_init__(self)
        for key, val in (("loader.dataset", self.dataset), ("loader.collate", self.collate)):
            if val is None and key == "loader.collate":
                continue
            mod, sep, fn = str(val).partition(":")
            _check(bool(sep and mod and fn), key, f"must look like 'package.module:function', got {val!r}")


@dataclass(slots=True, kw_only=True)
class SweepSettings:
    """How one job sweeps its loader's knobs (mapped onto the loader sweep's
    ``LoaderSweepConfig``, which checks them again with its own rules)."""

    strategy: Strategy = Strategy.adaptive
    """adaptive: num_workers 0, 1, 2, 4, ... until throughput stops improving (the tie-break in
    turns where the pick rests on noise, the epoch stall at the pick); grid: every combination."""

    num_workers: Optional[list[int]] = None
    """Values to try; null: 0, 1, 2, 4, ... up to sweep.max_workers."""

    max_workers: Optional[int] = None
    """Highest num_workers when num_workers is null; null: twice the usable cores."""

    prefetch_factor: Optional[list[int]] = None
    """Values to try (adaptive: at the best num_workers); null: 2 for the adaptive search (alone, a loader
    drained as fast as it delivers has no burst to smooth), 1, 2, 4 for the grid."""

    persistent_workers: Optional[list[bool]] = None
    """Values to try; null: the loader sweep's default (false, true)."""

    budget_s: float = LOADER_WINDOW_S
    """Longest steady-state window per point, seconds (it closes once its interval is within +-5%)."""

    timeout_s: float = 60.0
    """Hard deadline per point (a hang is recorded as timeout)."""

    target_rate: Optional[float] = None
    """Samples/s your trainer consumes: recommend the cheapest setting that meets it."""

    memory_budget_mb: Optional[float] = None
    """Memory (PSS of main process + workers) a recommendation may use; null: half the available RAM."""

    epoch_stall: bool = True
    """Measure the stall at an epoch boundary."""

    transforms: bool = True
    """Also measure each transform of the dataset as a stage."""

    def __post_init__(self) -> None:
        check("budget_s", self.budget_s, "sweep.budget_s")
        _check(
            self.timeout_s > self.budget_s,
            "sweep.timeout_s",
            f"({self.timeout_s}) must be larger than sweep.budget_s ({self.budget_s})",
        )
        if self.num_workers is not None:
            _check_ints("sweep.num_workers", self.num_workers, 0)
        if self.max_workers is not None:
            _check_min("sweep.max_workers", self.max_workers, 1, or_null=True)
        if self.prefetch_factor is not None:
            _check_ints("sweep.prefetch_factor", self.prefetch_factor, 1)
        if self.persistent_workers is not None:
            _check(
                len(self.persistent_workers) > 0,
                "sweep.persistent_workers",
                "must be a non-empty list of booleans or null",
            )
        if self.target_rate is not None:
            _check_min("sweep.target_rate", self.target_rate, 0, strict=True, or_null=True)
        if self.memory_budget_mb is not None:
            _check_min("sweep.memory_budget_mb", self.memory_budget_mb, 0, strict=True, or_null=True)


@dataclass(slots=True, kw_only=True)
class StagebenchSweepConfig:
    """The primary config (``conf/config.yaml``)."""

    loader: Any = MISSING
    """One of the loader schemas above, picked with ``loader=<name>``."""

    sweep: SweepSettings = field(default_factory=SweepSettings)

    progress: bool = True
    """Show progress over jobs and points on stderr."""


#: group option name -> schema class (``schema/loader/<name>``).
LOADER_SCHEMAS: dict[str, type[LoaderConfig]] = {
    "imagenet": ImageNetLoaderConfig,
    "synthetic": SyntheticLoaderConfig,
    "audio": AudioLoaderConfig,
    "custom": CustomLoaderConfig,
}
_KIND_OF = {cls: name for name, cls in LOADER_SCHEMAS.items()}


def register_configs() -> None:
    """Put the schemas in Hydra's ConfigStore (idempotent)."""
    cs = ConfigStore.instance()
    cs.store(name="stagebench_schema", node=StagebenchSweepConfig)
    for name, cls in LOADER_SCHEMAS.items():
        cs.store(group="schema/loader", name=name, node=cls)


def unknown_keys(cfg: DictConfig) -> list[tuple[str, list[str]]]:
    """Keys added with ``+key=value`` that the schemas do not define.

    OmegaConf lets ``+`` add keys even to a typed node; they would then fail
    obscurely when the node becomes an object. Returns ``(full_key, allowed)`` pairs.
    """
    bad: list[tuple[str, list[str]]] = []
    for node_key in ("loader", "sweep"):
        node = cfg.get(node_key)
        if not isinstance(node, DictConfig):
            continue
        cls = OmegaConf.get_type(node)
        if not dataclasses.is_dataclass(cls):
            continue
        allowed = [f.name for f in dataclasses.fields(cls)]
        for k in node.keys():
            if k not in allowed:
                bad.append((f"{node_key}.{k!s}", allowed))
    for k in cfg.keys():
        if k not in ("loader", "sweep", "progress", "hydra"):
            bad.append((str(k), ["loader", "sweep", "progress"]))
    return bad


def to_settings(cfg: DictConfig) -> StagebenchSweepConfig:
    """The composed config as validated objects (runs every ``__post_init__``).

    Raises ``ValueError`` with a one-line message that names the key.
    """
    bad = unknown_keys(cfg)
    if bad:
        key, allowed = bad[0]
        where = key.rpartition(".")[0] or "the config"
        raise ValueError(f"unknown key {key!r}; allowed keys in {where}: {', '.join(allowed)}")
    if "hydra" in cfg:  # a config composed for validation carries Hydra's own node
        cfg = cfg.copy()
        with open_dict(cfg):
            del cfg["hydra"]
    obj = OmegaConf.to_object(cfg)
    if not isinstance(obj, StagebenchSweepConfig):
        raise ValueError("the primary config must extend stagebench_schema (defaults: [stagebench_schema, ...])")
    if not isinstance(obj.loader, LoaderConfig):
        raise ValueError(
            "loader: a loader config must extend one of the schemas "
            f"({', '.join('/schema/loader/' + n for n in LOADER_SCHEMAS)}); "
            "add e.g. 'defaults: [/schema/loader/imagenet@_here_, _self_]' to its YAML"
        )
    return obj
