"""The built-in loaders' transforms: image and audio decoding and augmentation in torch ops.

Each is a plain callable with a ``repr`` that says its settings: the loader sweep finds a dataset's
``transform.transforms`` list and measures each item as a stage, named by it. They use torch ops
only, so both image decoders feed the same augmentation and a decoder comparison isolates decoding;
their randomness comes from torch's generator, which torch's DataLoader seeds per worker.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "Compose",
    "DecodeImage",
    "RandomResizedCrop",
    "RandomHorizontalFlip",
    "Normalize",
    "DecodeAudio",
    "RandomCrop1d",
    "LogMel",
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


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
        # the decoder chosen loads in each worker, which never pays for the other's import at its start
        if self.decoder == "spdl":
            import spdl.io

            return spdl.io.to_torch(spdl.io.load_image(data))
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
        import spdl.io  # in the worker that decodes: a worker's start does not pay for it

        if self.decoder == "spdl":
            desc = spdl.io.get_audio_filter_desc(sample_rate=self.sample_rate, num_channels=1, sample_fmt="flt")
            return spdl.io.to_torch(spdl.io.load_audio(data, filter_desc=desc))[:, 0]
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
