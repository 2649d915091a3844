"""Built-in datasets: layout, real JPEGs with ImageNet-like sizes, determinism, atomic generation."""

from __future__ import annotations

import json
import threading
import wave
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from stagebench.sweep import _datasets
from stagebench.sweep._datasets import (
    MANIFEST,
    DatasetError,
    generate_audio,
    generate_imagenet,
    read_manifest,
)


def _quiet(msg: str) -> None:
    pass


def _jpegs(root: Path) -> list[Path]:
    return sorted((root / "train").glob("*/*.JPEG"))


@pytest.fixture(scope="module")
def sample_set(tmp_path_factory) -> Path:
    # 4 x 15 = 60 images: enough for the size statistics, about a second to generate.
    return generate_imagenet(tmp_path_factory.mktemp("ds") / "imagenet", classes=4, per_class=15, seed=3, log=_quiet)


def test_imagenet_layout_and_manifest(sample_set):
    classes = sorted(p.name for p in (sample_set / "train").iterdir())
    assert classes == ["n00000000", "n00000001", "n00000002", "n00000003"]
    for c in classes:
        files = sorted((sample_set / "train" / c).iterdir())
        assert len(files) == 15
        assert all(f.name.startswith(f"{c}_") and f.suffix == ".JPEG" for f in files)
    m = read_manifest(sample_set)
    assert m["kind"] == "imagenet" and m["params"] == {"classes": 4, "per_class": 15, "seed": 3}
    assert m["files"] == 60 and m["bytes"] == sum(p.stat().st_size for p in _jpegs(sample_set))
    # Nothing else beside the dataset: no partial folders left behind.
    assert [p.name for p in sample_set.parent.iterdir()] == ["imagenet"]


def test_images_are_real_jpegs_with_imagenet_like_sizes(sample_set):
    sizes, nbytes = [], []
    for path in _jpegs(sample_set):
        with Image.open(path) as im:
            assert im.format == "JPEG" and im.mode == "RGB"
            sizes.append(im.size)
            im.load()  # decodes the whole file: truncated data would raise
        nbytes.append(path.stat().st_size)
    w = np.array([s[0] for s in sizes], float)
    h = np.array([s[1] for s in sizes], float)
    # ImageNet's train images: about 400 x 350 on average, varied aspect ratios.
    assert 340 < w.mean() < 480, w.mean()
    assert 290 < h.mean() < 410, h.mean()
    aspect = w / h
    assert np.std(np.log(aspect)) > 0.12, "aspect ratios should vary"
    assert (aspect < 1).any() and (aspect > 1.3).any(), "portrait and wide images both occur"
    # Content that does not compress to nothing: 50-150 KB per image like ImageNet's.
    assert 50_000 < np.mean(nbytes) < 150_000, np.mean(nbytes)
    assert min(nbytes) > 10_000


def test_generation_is_deterministic_by_seed(tmp_path):
    a = generate_imagenet(tmp_path / "a", classes=1, per_class=3, seed=7, log=_quiet)
    b = generate_imagenet(tmp_path / "b", classes=1, per_class=3, seed=7, log=_quiet)
    c = generate_imagenet(tmp_path / "c", classes=1, per_class=3, seed=8, log=_quiet)
    for pa, pb, pc in zip(_jpegs(a), _jpegs(b), _jpegs(c)):
        assert pa.read_bytes() == pb.read_bytes()
        assert pa.read_bytes() != pc.read_bytes()


def test_existing_dataset_is_reused_not_regenerated(tmp_path, monkeypatch):
    root = generate_imagenet(tmp_path / "d", classes=1, per_class=2, log=_quiet)
    before = {p: p.stat().st_mtime_ns for p in _jpegs(root)}

    def boom(*a, **k):
        raise AssertionError("regenerated a complete dataset")

    monkeypatch.setattr(_datasets, "_render_image", boom)
    assert generate_imagenet(tmp_path / "d", classes=1, per_class=2, log=_quiet) == root
    assert {p: p.stat().st_mtime_ns for p in _jpegs(root)} == before


def test_a_crash_leaves_no_dataset_that_passes_for_complete(tmp_path, monkeypatch):
    real = _datasets._render_image
    calls = []

    def crash_on_third(*a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("disk full")
        return real(*a, **k)

    monkeypatch.setattr(_datasets, "_render_image", crash_on_third)
    with pytest.raises(RuntimeError, match="disk full"):
        generate_imagenet(tmp_path / "e", classes=1, per_class=4, log=_quiet)
    assert not (tmp_path / "e").exists()
    assert list(tmp_path.iterdir()) == [], "the partial folder was removed"
    monkeypatch.setattr(_datasets, "_render_image", real)
    root = generate_imagenet(tmp_path / "e", classes=1, per_class=4, log=_quiet)
    assert len(_jpegs(root)) == 4 and read_manifest(root) is not None


def test_concurrent_generation_of_the_same_dataset(tmp_path):
    out, errors = [], []

    def gen():
        try:
            out.append(generate_imagenet(tmp_path / "f", classes=1, per_class=3, log=_quiet))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=gen) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(out) == 2 and out[0] == out[1]
    assert len(_jpegs(out[0])) == 3
    assert [p.name for p in tmp_path.iterdir()] == ["f"]


def test_refuses_foreign_or_different_folders(tmp_path):
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("my files")
    with pytest.raises(DatasetError, match="not a stagebench dataset"):
        generate_imagenet(foreign, classes=1, per_class=1, log=_quiet)
    assert (foreign / "notes.txt").read_text() == "my files"
    generate_imagenet(tmp_path / "g", classes=1, per_class=1, log=_quiet)
    with pytest.raises(DatasetError, match="different generated dataset"):
        generate_imagenet(tmp_path / "g", classes=2, per_class=1, log=_quiet)
    # An empty folder is fine: it is filled.
    (tmp_path / "empty").mkdir()
    assert len(_jpegs(generate_imagenet(tmp_path / "empty", classes=1, per_class=1, log=_quiet))) == 1


def test_builtin_dataset_lives_in_the_data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("STAGEBENCH_DATA_DIR", str(tmp_path / "cache"))
    root = generate_imagenet(None, classes=1, per_class=2, seed=5, log=_quiet)
    assert root.parent == tmp_path / "cache" and "c1-n2-s5" in root.name
    assert len(_jpegs(root)) == 2


def test_data_command(tmp_path, capsys):
    from stagebench._cli import main

    assert main(["data", "imagenet", "--root", str(tmp_path / "h"), "--classes", "2", "--per-class", "2"]) == 0
    assert f"dataset: {tmp_path / 'h'}" in capsys.readouterr().out
    assert len(_jpegs(tmp_path / "h")) == 4
    # A user error is one line and exit code 2.
    assert main(["data", "imagenet", "--root", str(tmp_path / "h"), "--classes", "3", "--per-class", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "different generated dataset" in err[0]


def test_audio_clips_are_wav_files(tmp_path):
    import spdl.io

    root = generate_audio(tmp_path / "au", clips=3, seconds=0.5, sample_rate=16000, log=_quiet)
    paths = sorted((root / "clips").glob("*.wav"))
    assert [p.name for p in paths] == ["clip_00000.wav", "clip_00001.wav", "clip_00002.wav"]
    with wave.open(str(paths[0])) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()) == (1, 2, 16000, 8000)
    samples = np.asarray(spdl.io.load_wav(paths[0].read_bytes()))
    assert samples.shape == (8000, 1) and samples.dtype == np.int16
    assert 1000 < np.abs(samples).max() <= 32767, "not silence, not clipped beyond int16"
    assert json.loads((root / MANIFEST).read_text())["files"] == 3
