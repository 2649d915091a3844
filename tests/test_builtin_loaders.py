"""The loaders behind conf/loader/*.yaml: transforms (known answers), datasets, and every backend."""

from __future__ import annotations

import io
import math
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from stagebench.loader._built import BatchTag, BuiltLoader
from stagebench.model._knobs import LoaderKnobs
from stagebench.sweep._builtin_loaders import (
    AudioClipDataset,
    ImageFolderDataset,
    SyntheticTensorDataset,
    build_loader,
    make_factory,
)
from stagebench.sweep._datasets import generate_audio, generate_imagenet
from stagebench.sweep._schema import (
    AudioDecoder,
    AudioLoaderConfig,
    Backend,
    CustomLoaderConfig,
    ImageDecoder,
    ImageNetLoaderConfig,
    SyntheticLoaderConfig,
)
from stagebench.sweep._transforms import (
    DecodeAudio,
    DecodeImage,
    LogMel,
    Normalize,
    RandomCrop1d,
    RandomHorizontalFlip,
    RandomResizedCrop,
)


def _quiet(msg: str) -> None:
    pass


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    return generate_imagenet(tmp_path_factory.mktemp("img") / "ds", classes=2, per_class=6, log=_quiet)


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> Path:
    return generate_audio(tmp_path_factory.mktemp("aud") / "ds", clips=8, seconds=1.0, log=_quiet)


def _epoch(built: BuiltLoader) -> list:
    """One epoch of batches (the user's batches, without the sweep's worker tags)."""
    out = [b.batch if isinstance(b, BatchTag) else b for b in built.loader]
    if built.close is not None:
        built.close()
    return out


# --------------------------------------------------------------------------- transforms


def test_random_resized_crop_samples_like_torchvision():
    torch.manual_seed(0)
    rrc = RandomResizedCrop(32)
    h, w = 300, 400
    fractions, ratios = [], []
    for _ in range(300):
        top, left, ch, cw = rrc.params(h, w)
        assert 0 <= top and top + ch <= h and 0 <= left and left + cw <= w
        fractions.append(ch * cw / (h * w))
        ratios.append(cw / ch)
    # Scale 0.08-1 of the area and ratio 3/4-4/3 (rounding to whole pixels aside).
    assert min(fractions) >= 0.075 and max(fractions) <= 1.0
    assert min(ratios) > 0.74 and max(ratios) < 1.35
    assert np.std(fractions) > 0.15, "the crop area is random"
    out = rrc(torch.zeros(h, w, 3, dtype=torch.uint8))
    assert out.shape == (3, 32, 32) and out.dtype == torch.uint8


def test_random_resized_crop_falls_back_to_a_central_crop():
    # A 1000x10 strip: no crop with ratio <= 4/3 fits 10 tries' worth of draws.
    top, left, ch, cw = RandomResizedCrop(8).params(10, 1000)
    assert (ch, cw) == (10, 13) and left == (1000 - 13) // 2 and top == 0


def test_flip_and_normalize_known_answers():
    img = torch.arange(2 * 3 * 4, dtype=torch.uint8).view(2, 3, 4)
    assert torch.equal(RandomHorizontalFlip(1.0)(img), img.flip(-1))
    assert torch.equal(RandomHorizontalFlip(0.0)(img), img)
    const = torch.full((3, 2, 2), 200, dtype=torch.uint8)
    out = Normalize()(const)
    expected = [(200 / 255 - m) / s for m, s in zip((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))]
    assert out.dtype == torch.float32
    for c in range(3):
        assert torch.allclose(out[c], torch.full((2, 2), expected[c]), atol=1e-5)


def test_pillow_and_spdl_decode_the_same_image(images):
    # Known answer: a smooth gradient survives JPEG at quality 90 within a level or two.
    arr = np.zeros((120, 160, 3), np.uint8)
    arr[..., 0] = np.linspace(0, 255, 160)[None, :]
    arr[..., 1] = 128
    arr[..., 2] = np.linspace(255, 0, 120)[:, None]
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "JPEG", quality=90)
    for decoder in ("pillow", "spdl"):
        out = DecodeImage(decoder)(buf.getvalue())
        assert out.shape == (120, 160, 3) and out.dtype == torch.uint8
        assert (out.float() - torch.from_numpy(arr).float()).abs().mean() < 2, decoder
    # On a generated image (noisy chroma) the decoders differ by chroma upsampling, without bias.
    data = next((images / "train" / "n00000000").iterdir()).read_bytes()
    a, b = DecodeImage("pillow")(data).float(), DecodeImage("spdl")(data).float()
    with Image.open(io.BytesIO(data)) as im:
        w, h = im.size
    assert a.shape == b.shape == (h, w, 3)
    assert (a - b).mean(dim=(0, 1)).abs().max() < 1
    with pytest.raises(ValueError, match="allowed: pillow, spdl"):
        DecodeImage("cv2")


def test_log_mel_of_a_tone_peaks_at_its_frequency():
    sr = 16000
    t = torch.arange(sr) / sr
    low = LogMel(sr, 80)(torch.sin(2 * math.pi * 300 * t))
    high = LogMel(sr, 80)(torch.sin(2 * math.pi * 3000 * t))
    assert low.shape == (80, 101)
    # Mel bands ascend with frequency: the 3 kHz tone peaks in a higher band.
    peak_low = int(low.mean(dim=1).argmax())
    peak_high = int(high.mean(dim=1).argmax())
    assert peak_high > peak_low + 20, (peak_low, peak_high)


def test_audio_decoders_agree(clips):
    data = next((clips / "clips").iterdir()).read_bytes()
    a = DecodeAudio("spdl", 16000)(data)
    b = DecodeAudio("wav", 16000)(data)
    assert a.shape == b.shape == (16000,) and a.dtype == b.dtype == torch.float32
    assert (a - b).abs().max() < 1e-3
    with pytest.raises(ValueError, match="use decoder=spdl to resample"):
        DecodeAudio("wav", 8000)(data)
    assert RandomCrop1d(100)(a).shape == (100,)
    assert RandomCrop1d(20000)(a).shape == (20000,), "shorter clips are padded"


# --------------------------------------------------------------------------- datasets


def test_image_folder_dataset_items_and_transform_contract(images):
    spec = build_loader(ImageNetLoaderConfig(name="img", root=str(images), image_size=32, batch_size=4))
    ds = spec.dataset
    assert isinstance(ds, ImageFolderDataset) and len(ds) == 12
    x, y = ds[0]
    assert x.shape == (3, 32, 32) and x.dtype == torch.float32 and y == 0
    assert ds[11][1] == 1, "labels follow the sorted class folders"
    # The loader sweep's transform isolation finds each step of the composition.
    from stagebench.loader._transforms import find_transforms

    holder, steps = find_transforms(ds)
    assert [type(s).__name__ for s in steps] == [
        "DecodeImage",
        "RandomResizedCrop",
        "RandomHorizontalFlip",
        "Normalize",
    ]
    ds.transform = None
    raw, label = ds[0]
    assert isinstance(raw, bytes) and raw[:2] == b"\xff\xd8", "without the transform: the JPEG bytes"


def test_num_items_takes_a_seeded_subset(images):
    cfg = ImageNetLoaderConfig(name="img", root=str(images), image_size=16, batch_size=2, num_items=5)
    a = build_loader(cfg).dataset
    b = build_loader(cfg).dataset
    assert len(a) == 5 and a.indices == b.indices
    assert a.transform is not None and a.raw(0)[0][:2] == b"\xff\xd8"
    with pytest.raises(ValueError, match="exceeds the dataset"):
        build_loader(ImageNetLoaderConfig(name="img", root=str(images), num_items=13, batch_size=2))


def test_missing_root_and_empty_root(tmp_path):
    with pytest.raises(FileNotFoundError, match="loader.root"):
        build_loader(ImageNetLoaderConfig(name="img", root=str(tmp_path / "nope")))
    with pytest.raises(FileNotFoundError, match="ImageNet layout"):
        build_loader(ImageNetLoaderConfig(name="img", root=str(tmp_path)))


def test_synthetic_items_are_in_memory_tensors():
    ds = SyntheticTensorDataset(num_items=10, sample_shape=[2, 3], distinct=4, dtype="uint8")
    assert len(ds) == 10 and ds[5][0] is ds[1][0] and ds[5][0].dtype == torch.uint8


# --------------------------------------------------------------------------- backends


@pytest.mark.parametrize("backend", ["torch", "spdl_pytorch", "spdl_pipeline"])
def test_every_backend_yields_whole_epochs(images, backend):
    cfg = ImageNetLoaderConfig(
        name="img",
        root=str(images),
        image_size=16,
        batch_size=4,
        backend=Backend[backend],
        decoder=ImageDecoder.spdl if backend == "spdl_pipeline" else ImageDecoder.pillow,
    )
    spec = build_loader(cfg)
    for knobs in (LoaderKnobs(num_workers=0), LoaderKnobs(num_workers=1, prefetch_factor=2)):
        built = spec.factory(knobs)
        assert isinstance(built, BuiltLoader) and built.control is not None
        batches = _epoch(built)
        assert len(batches) == 3, (backend, knobs)  # 12 images / 4, drop_last
        x, y = batches[0]
        assert x.shape == (4, 3, 16, 16) and x.dtype == torch.float32 and y.shape == (4,)
        labels = torch.cat([b[1] for b in batches])
        assert sorted(labels.tolist()) == [0] * 6 + [1] * 6, "every item exactly once per epoch"


def test_spdl_pipeline_knobs_epoch_control_and_persistence(images):
    spec = build_loader(
        ImageNetLoaderConfig(name="img", root=str(images), image_size=16, batch_size=2, backend=Backend.spdl_pipeline)
    )
    built = spec.factory(LoaderKnobs(num_workers=2, prefetch_factor=3, persistent_workers=True))
    loader = built.loader
    assert loader.num_workers == 2 and loader.prefetch_factor == 3 and loader.persistent
    assert len(_epoch_keep(loader)) == 6 and len(_epoch_keep(loader)) == 6, "two epochs, one pipeline"
    first = loader._pipeline
    assert first is not None
    built.control.limit(2)
    assert len(_epoch_keep(loader)) == 2, "the sweep's epoch control counts batches"
    assert loader._pipeline is first
    built.close()
    assert loader._pipeline is None
    assert [n for n, _ in spec.dataset.pipeline_stages()] == ["read", "decode", "augment"]
    assert spec.factory.describe()["stages"] == ["read", "decode", "augment", "aggregate", "collate"]


def _epoch_keep(loader) -> list:
    return list(loader)


def test_spdl_pipeline_surfaces_a_failing_item(tmp_path, images):
    bad = tmp_path / "bad" / "train" / "n0"
    bad.mkdir(parents=True)
    for i in range(3):
        (bad / f"ok_{i}.JPEG").write_bytes(next((images / "train" / "n00000000").iterdir()).read_bytes())
    (bad / "broken.JPEG").write_bytes(b"not a jpeg at all")
    spec = build_loader(
        ImageNetLoaderConfig(
            name="bad",
            root=str(tmp_path / "bad"),
            image_size=16,
            batch_size=2,
            shuffle=False,
            backend=Backend.spdl_pipeline,
        )
    )
    # SPDL drops failing items by default; here the loader must fail, as torch's does, with the
    # item's own error (SPDL's PipelineFailure says only "pipeline stages failed").
    for nw in (0, 2):
        with pytest.raises(Exception, match="cannot identify image file"):
            _epoch(spec.factory(LoaderKnobs(num_workers=nw)))


def test_audio_and_synthetic_loaders(clips):
    spec = build_loader(
        AudioLoaderConfig(
            name="aud",
            root=str(clips),
            batch_size=4,
            crop_seconds=0.5,
            decoder=AudioDecoder.wav,
            backend=Backend.spdl_pipeline,
        )
    )
    (x, y), _ = _epoch(spec.factory(LoaderKnobs(num_workers=2)))
    assert x.shape == (4, 80, 51) and x.dtype == torch.float32
    assert [n for n, _ in spec.dataset.pipeline_stages()] == ["read", "decode", "features"]
    assert isinstance(spec.dataset, AudioClipDataset)
    syn = build_loader(SyntheticLoaderConfig(name="syn", num_items=64, sample_shape=[3, 8, 8], batch_size=16))
    batches = _epoch(syn.factory(LoaderKnobs(num_workers=0)))
    assert len(batches) == 4 and batches[0][0].shape == (16, 3, 8, 8)


def test_custom_dataset_by_import_path(tmp_path, monkeypatch):
    (tmp_path / "my_data.py").write_text(
        textwrap.dedent("""
        import torch

        class Squares(torch.utils.data.Dataset):
            def __len__(self):
                return 10
            def __getitem__(self, i):
                return torch.tensor([float(i * i)])

        def make():
            return Squares()

        def stack(items):
            return torch.stack(items) * 0 + 7
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for backend in ("torch", "spdl_pipeline"):
        cfg = CustomLoaderConfig(
            name="sq", dataset="my_data:make", batch_size=5, shuffle=False, backend=Backend[backend]
        )
        batches = _epoch(build_loader(cfg).factory(LoaderKnobs(num_workers=0)))
        values = sorted(torch.cat(batches).flatten().tolist())
        assert values == [float(i * i) for i in range(10)], backend
    spec = build_loader(CustomLoaderConfig(name="sq", dataset="my_data:make", collate="my_data:stack", batch_size=5))
    assert all(bool((b == 7).all()) for b in _epoch(spec.factory(LoaderKnobs(num_workers=0))))
    with pytest.raises(ValueError, match="loader.dataset: cannot import"):
        build_loader(CustomLoaderConfig(name="x", dataset="my_data:nope"))
    sys.modules.pop("my_data", None)


def test_make_factory_rejects_unknown_backend():
    with pytest.raises(ValueError, match="allowed: torch, spdl_pytorch, spdl_pipeline"):
        make_factory([], backend="tf", batch_size=1)
