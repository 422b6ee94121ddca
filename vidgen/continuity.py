"""What joins shots: frames kept losslessly for the next shot to start from, and colour held to a
reference across chained shots and the windows of a long take.

Colour: Wan drifts in colour over repeated continuation (each shot starts from the last frame of
the one before, and small shifts compound). `ColourMatch` moves every frame's per-channel mean and
spread in Oklab (a perceptual space: lightness and two opponent colour axes) to a reference image's,
frame by frame — the statistics transfer of Reinhard et al., in a space where equal steps look equal.
It is written here because it is a few lines of tensor arithmetic over frames already in memory; the
Oklab matrices are Björn Ottosson's published constants.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .io import atomic_write_bytes
from .paths import kept_frame_path

# Oklab (Ottosson 2020): linear sRGB -> LMS, cube root, -> Lab; and the inverses.
_M1 = torch.tensor([[0.4122214708, 0.5363325363, 0.0514459929],
                    [0.2119034982, 0.6806995451, 0.1073969566],
                    [0.0883024619, 0.2817188376, 0.6299787005]], dtype=torch.float64)
_M2 = torch.tensor([[0.2104542553, 0.7936177850, -0.0040720468],
                    [1.9779984951, -2.4285922050, 0.4505937099],
                    [0.0259040371, 0.7827717662, -0.8086757660]], dtype=torch.float64)
_M1_INV, _M2_INV = torch.linalg.inv(_M1), torch.linalg.inv(_M2)


def _to_linear(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x <= 0.04045, x / 12.92, ((x + 0.055) / 1.055) ** 2.4)


def _to_srgb(x: torch.Tensor) -> torch.Tensor:
    x = x.clamp(0, 1)
    return torch.where(x <= 0.0031308, x * 12.92, 1.055 * x ** (1 / 2.4) - 0.055)


_CODES = {torch.uint8: 255.0, torch.uint16: 65535.0}     # a frame's code range (uint16: a master's frames)


def to_oklab(rgb: torch.Tensor) -> torch.Tensor:
    """uint8, uint16 (or 0..1 float) [..., 3] sRGB -> float64 Oklab [..., 3]."""
    x = rgb.to(torch.float64) / _CODES.get(rgb.dtype, 1.0)
    lms = _to_linear(x) @ _M1.T
    return torch.sign(lms) * lms.abs() ** (1 / 3) @ _M2.T


def from_oklab(lab: torch.Tensor, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    """float64 Oklab [..., 3] -> uint8 (or uint16) sRGB [..., 3] (rounded, clipped)."""
    lms = (lab @ _M2_INV.T) ** 3
    return torch.round(_to_srgb(lms @ _M1_INV.T) * _CODES[dtype]).to(torch.int32).to(dtype)


def colour_stats(rgb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and standard deviation of an image in Oklab."""
    lab = to_oklab(rgb).reshape(-1, 3)
    return lab.mean(0), lab.std(0)


class ColourMatch:
    """frame -> the frame with its Oklab mean and spread per channel set to the reference's."""

    def __init__(self, reference: np.ndarray | torch.Tensor):
        self.mean, self.std = colour_stats(torch.from_numpy(np.array(reference)))

    def __call__(self, frame: torch.Tensor) -> torch.Tensor:
        lab = to_oklab(frame)
        flat = lab.reshape(-1, 3)
        mean, std = flat.mean(0), flat.std(0)
        scale = torch.where(std > 1e-6, self.std / std.clamp_min(1e-6), torch.ones_like(std))
        return from_oklab((lab - mean) * scale + self.mean, frame.dtype)


def colour_match(reference) -> ColourMatch | None:
    """The colour match for output.colour_reference (a PIL image, preflight has read it), or None."""
    return None if reference is None else ColourMatch(np.asarray(reference.convert("RGB")))


def save_kept_frames(output: Path, frames: dict[int, np.ndarray], *, overwrite: bool, root) -> list[Path]:
    """Write each kept frame (index -> uint8 [H, W, 3]) as PNG beside `output`, atomically."""
    import io

    from PIL import Image

    written = []
    for index, frame in sorted(frames.items()):
        buf = io.BytesIO()
        Image.fromarray(frame).save(buf, format="PNG")
        written.append(atomic_write_bytes(kept_frame_path(output, index), buf.getvalue(), overwrite=overwrite,
                                          root=root))
    return written
