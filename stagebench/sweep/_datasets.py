"""Built-in datasets, generated locally (no download): ImageNet-style JPEGs and WAV clips.

Why generate rather than ship or download: a loader sweep needs files whose
decode cost resembles real data, on a machine that may have no network.
The images are real JPEGs in ImageNet's train layout
(``root/train/<class>/<class>_<n>.JPEG``), with ImageNet-like sizes (about
400x350 on average, varied aspect ratios), quality 90, and content that does
not compress to nothing: smooth random colour fields, hard-edged shapes and
per-pixel grain, which give 50-150 KB per file like ImageNet's. The audio
clips are mono 16-bit WAV files of tones and noise.

Generation is deterministic (every file from its own seeded generator, so
the same seed gives byte-identical files) and atomic: files are written into a
hidden temporary folder that is renamed into place only after a manifest
(``stagebench-dataset.json``) is written, so a crash never leaves a half
dataset that passes for complete, and two processes generating the same
dataset at once both end up with the one that won the rename.
"""

from __future__ import annotations

import datetime as _dt
import io
import json
import os
import shutil
import time
import uuid
import wave
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from stagebench._errors import StagebenchError
from stagebench.core._progress import message

__all__ = [
    "MANIFEST",
    "DatasetError",
    "data_dir",
    "read_manifest",
    "generate_imagenet",
    "generate_audio",
]

#: Written last into a complete dataset; its presence is what "complete" means.
MANIFEST = "stagebench-dataset.json"
#: Bump when the generator's output changes, so cached datasets are regenerated.
GENERATOR_VERSION = 1

# ImageNet train statistics this generator imitates: mean size about 400x350
# (area ~ 140k pixels) with a long tail, mostly landscape aspect ratios.
_AREA_MEDIAN = 135_000
_AREA_SIGMA = 0.35
_ASPECT_MEDIAN = 1.2
_ASPECT_SIGMA = 0.25
_JPEG_QUALITY = 90
_GRAIN = 30.0  # per-pixel noise std (of 255): sets the file size (~90 KB mean at quality 90)


class DatasetError(StagebenchError):
    """The requested dataset folder cannot be used (a user error: one line, exit code 2)."""


def data_dir() -> Path:
    """Where built-in datasets are cached: ``$STAGEBENCH_DATA_DIR`` or ``~/.cache/stagebench``."""
    env = os.environ.get("STAGEBENCH_DATA_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "stagebench"


def read_manifest(root: str | os.PathLike) -> dict[str, Any] | None:
    """The manifest of a complete generated dataset, or None."""
    path = Path(root) / MANIFEST
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _materialize(
    root: Path,
    kind: str,
    params: dict[str, Any],
    build: Callable[[Path], dict[str, Any]],
    *,
    log: Callable[[str], None] | None,
) -> Path:
    """Return ``root`` holding the dataset ``(kind, params)``, generating it atomically if absent."""
    root = Path(root).expanduser().absolute()
    want = {"kind": kind, "generator_version": GENERATOR_VERSION, "params": params}

    def matches(m: dict[str, Any] | None) -> bool:
        return m is not None and all(m.get(k) == v for k, v in want.items())

    existing = read_manifest(root)
    if matches(existing):
        return root
    if existing is not None:
        raise DatasetError(
            f"{root} holds a different generated dataset ({existing.get('kind')}, "
            f"{existing.get('params')}); choose another folder or delete it"
        )
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise DatasetError(f"{root} exists and is not a stagebench dataset; refusing to write into it")

    try:
        root.parent.mkdir(parents=True, exist_ok=True)
        tmp = root.parent / f".{root.name}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
    except OSError as e:
        raise DatasetError(f"cannot create the dataset folder {root}: {e.strerror or e}") from None
    if log is not None:
        log(f"generating the {kind} dataset {params} into {root} (once; cached afterwards)")
    t0 = time.perf_counter()
    try:
        stats = build(tmp)
        manifest = {
            **want,
            "created_at": _dt.datetime.now().isoformat(timespec="seconds"),
            "seconds": round(time.perf_counter() - t0, 2),
            **stats,
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        try:
            # rename() replaces an empty directory atomically; a non-empty one
            # means another process finished first.
            os.rename(tmp, root)
        except OSError:
            if matches(read_manifest(root)):
                shutil.rmtree(tmp, ignore_errors=True)
                return root
            raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if log is not None:
        log(
            f"dataset ready: {stats.get('files')} files, {stats.get('bytes', 0) / 1e6:.1f} MB "
            f"in {time.perf_counter() - t0:.1f} s"
        )
    return root


# --------------------------------------------------------------------------- images


def _image_size(rng: np.random.Generator) -> tuple[int, int]:
    area = _AREA_MEDIAN * float(np.exp(np.clip(rng.normal(0, _AREA_SIGMA), -1.6, 1.6)))
    aspect = _ASPECT_MEDIAN * float(np.exp(np.clip(rng.normal(0, _ASPECT_SIGMA), -0.9, 0.9)))
    w = int(round(np.sqrt(area * aspect)))
    h = int(round(np.sqrt(area / aspect)))
    return max(w, 32), max(h, 32)


def _upsample(field: np.ndarray, w: int, h: int) -> np.ndarray:
    return np.stack(
        [np.asarray(Image.fromarray(field[..., c]).resize((w, h), Image.Resampling.BICUBIC)) for c in range(3)],
        axis=-1,
    )


def _render_image(rng: np.random.Generator, w: int, h: int) -> bytes:
    """One JPEG: a random-field pyramid (coarse colours to fine blotches), shapes, grain."""
    field = rng.standard_normal((3, 3, 3), dtype=np.float32) * 60
    for cells, amp in ((12, 30.0), (48, 18.0)):
        cw = max(2, int(round(cells * w / h)))
        field = _upsample(field, cw, cells) + rng.standard_normal((cells, cw, 3), dtype=np.float32) * amp
    full = _upsample(field, w, h) + 128.0
    im = Image.fromarray(np.clip(full, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(im)
    for _ in range(int(rng.integers(3, 9))):
        x0, y0 = int(rng.integers(0, w)), int(rng.integers(0, h))
        x1 = x0 + int(rng.integers(20, w // 2 + 21))
        y1 = y0 + int(rng.integers(20, h // 2 + 21))
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)((x0, y0, x1, y1), fill=colour)
    arr = np.asarray(im, dtype=np.float32) + rng.standard_normal((h, w, 3), dtype=np.float32) * _GRAIN
    buf = io.BytesIO()
    Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=_JPEG_QUALITY)
    return buf.getvalue()


def _class_name(c: int) -> str:
    return f"n{c:08d}"  # WordNet-id style, like ImageNet's n01440764


def generate_imagenet(
    root: str | os.PathLike | None,
    *,
    classes: int,
    per_class: int,
    seed: int = 0,
    log: Callable[[str], None] | None = message,
) -> Path:
    """JPEGs in ImageNet train layout under ``root/train/<class>/``; returns ``root`` (``None``: the
    cache's folder for these parameters, generated on first use).

    Does nothing when ``root`` already holds this dataset. Raises
    :class:`DatasetError` when ``root`` holds something else.
    """
    if classes < 1 or per_class < 1:
        raise DatasetError(f"classes and per_class must be >= 1, got classes={classes}, per_class={per_class}")
    params = {"classes": int(classes), "per_class": int(per_class), "seed": int(seed)}

    def build(tmp: Path) -> dict[str, Any]:
        total = 0
        widths, heights = [], []
        for c in range(classes):
            cdir = tmp / "train" / _class_name(c)
            cdir.mkdir(parents=True)
            for i in range(per_class):
                rng = np.random.default_rng([seed, c, i])
                w, h = _image_size(rng)
                data = _render_image(rng, w, h)
                (cdir / f"{_class_name(c)}_{i}.JPEG").write_bytes(data)
                total += len(data)
                widths.append(w)
                heights.append(h)
        return {
            "files": classes * per_class,
            "bytes": total,
            "mean_width": round(float(np.mean(widths)), 1),
            "mean_height": round(float(np.mean(heights)), 1),
            "layout": "train/<class>/<class>_<n>.JPEG",
        }

    if root is None:
        root = data_dir() / f"imagenet-c{classes}-n{per_class}-s{seed}-v{GENERATOR_VERSION}"
    return _materialize(Path(root), "imagenet", params, build, log=log)


# --------------------------------------------------------------------------- audio


def _render_clip(rng: np.random.Generator, n: int, sample_rate: int) -> np.ndarray:
    """Tones with vibrato under a syllable-like envelope, plus noise: int16 mono."""
    t = np.arange(n, dtype=np.float32) / sample_rate
    sig = np.zeros(n, dtype=np.float32)
    for _ in range(int(rng.integers(2, 6))):
        f0 = float(rng.uniform(80, 2000))
        vib = float(rng.uniform(0, 8)) * np.sin(2 * np.pi * float(rng.uniform(2, 7)) * t)
        sig += float(rng.uniform(0.05, 0.3)) * np.sin(2 * np.pi * f0 * t + vib, dtype=np.float32)
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * float(rng.uniform(1, 4)) * t + float(rng.uniform(0, 6.3)))
    sig = sig * envelope + rng.standard_normal(n, dtype=np.float32) * 0.02
    sig /= max(1.0, float(np.abs(sig).max()) / 0.9)
    return (sig * 32767).astype("<i2")


def generate_audio(
    root: str | os.PathLike | None,
    *,
    clips: int,
    seconds: float,
    sample_rate: int = 16000,
    seed: int = 0,
    log: Callable[[str], None] | None = message,
) -> Path:
    """Mono 16-bit WAV clips under ``root/clips/``; returns ``root`` (``None``: the cache's folder for
    these parameters, generated on first use)."""
    if clips < 1 or seconds <= 0 or sample_rate < 1000:
        raise DatasetError(
            f"clips must be >= 1, seconds > 0 and sample_rate >= 1000; got {clips}, {seconds}, {sample_rate}"
        )
    params = {"clips": int(clips), "seconds": float(seconds), "sample_rate": int(sample_rate), "seed": int(seed)}

    def build(tmp: Path) -> dict[str, Any]:
        cdir = tmp / "clips"
        cdir.mkdir()
        n = int(round(seconds * sample_rate))
        total = 0
        for i in range(clips):
            samples = _render_clip(np.random.default_rng([seed, i]), n, sample_rate)
            path = cdir / f"clip_{i:05d}.wav"
            with wave.open(str(path), "wb") as w:
                w.setnchannels(1)
                w.setsampwidth(2)
                w.setframerate(sample_rate)
                w.writeframes(samples.tobytes())
            total += path.stat().st_size
        return {"files": clips, "bytes": total, "layout": "clips/clip_<n>.wav"}

    if root is None:
        root = data_dir() / f"audio-c{clips}-{seconds:g}s-{sample_rate}hz-s{seed}-v{GENERATOR_VERSION}"
    return _materialize(Path(root), "audio", params, build, log=log)
