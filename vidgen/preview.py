"""Previews of a render in progress, good enough to stop a bad take early and cheap enough to make
every second: a linear latent-to-RGB projection of the sampler's current denoised estimate, then
the first decoded frames once decoding starts.

The projection is a fixed linear map per VAE (RGB = [z, 1] @ M), two of them: one for a clip's
first latent frame (which Wan's causal VAE encodes alone) and one for the rest. A VAE folder may
ship them as `preview.json` beside its config.json (the demo VAEs do: fitted on the demo's own
clips by `bench/preview_fit.py --clips demo --write`); otherwise they are fitted from the loaded VAE
on sample data the first time a pipeline needs them, and kept with the VAE: `SAMPLES` procedural
64x64 clips of 5 frames (smooth colour fields drifting sideways, flat backgrounds with a moving disc
or square, from a fixed seed) are encoded to model-space latents, and each map is the least-squares
fit of those latents to what the frames they encode show, averaged down to latent resolution.
Fitting from the loaded VAE means any VAE of the Wan families (16 or 48 channels, 8x or 16x) gets
maps that match its own weights; it costs one encode of the sample batch (0.5 s for the demo VAE on
2 CPU cores). `bench/preview_fit.py` reports the time and the error.

No previews are made while the output guard is on: it judges the clip before anyone sees it.

A preview is written atomically as a small PNG beside the output (`<output>.preview.png`) by the
queue's worker; nothing here decides how often.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from .io import atomic_write_bytes
from .vae import encode, normalize

SAMPLES = 16            # procedural clips the map is fitted on
SIZE = 64               # their side, px
WIDEST = 256            # a preview's widest side, px (decoded frames are reduced to it)
FRAMES = 4              # latent frames side by side in a sampling preview


def sample_clips(n: int = SAMPLES, size: int = SIZE, frames: int = 5, seed: int = 0) -> torch.Tensor:
    """[n, 3, frames, size, size] in [-1, 1]: procedural clips, half smooth colour fields (a random
    3x3 grid of colours, upsampled bicubically) drifting sideways, half a flat background (black,
    grey or a random colour) with a disc or square of another colour moving across it."""
    g = torch.Generator().manual_seed(seed)
    yy, xx = torch.meshgrid(torch.arange(size) + 0.5, torch.arange(size) + 0.5, indexing="ij")
    clips = []
    for i in range(n):
        if i % 2 == 0:
            field = F.interpolate(torch.rand(1, 3, 3, 4, generator=g) * 2 - 1, size=(size, size + frames * 2),
                                  mode="bicubic", align_corners=True).clamp(-1, 1)[0]
            clips.append(torch.stack([field[:, :, 2 * f:2 * f + size] for f in range(frames)], dim=1))
            continue
        bg = torch.tensor([(-1.0,) * 3, (0.0,) * 3][i % 4 // 2]) if i % 8 < 5 else torch.rand(3, generator=g) * 2 - 1
        fg, r = torch.rand(3, generator=g) * 2 - 1, size * (0.12 + 0.2 * float(torch.rand(1, generator=g)))
        (y0, x0), (vy, vx) = (torch.rand(2, generator=g) * size).tolist(), ((torch.rand(2, generator=g) - 0.5) * 4).tolist()
        disc = bool(torch.rand(1, generator=g) < 0.5)
        frames_ = []
        for f in range(frames):
            dy, dx = yy - (y0 + vy * f), xx - (x0 + vx * f)
            inside = (dy ** 2 + dx ** 2 <= r * r) if disc else (dy.abs() <= r) & (dx.abs() <= r)
            frames_.append(torch.where(inside, fg[:, None, None], bg[:, None, None]))
        clips.append(torch.stack(frames_, dim=1))
    return torch.stack(clips)


def _pooled_targets(clips: torch.Tensor, latent_frames: int, factor: int, stride: int) -> torch.Tensor:
    """[n, 3, T, h, w]: what each latent frame shows, the mean of the video frames it encodes (the first
    frame alone, then `stride` frames each), averaged down to latent resolution."""
    groups = [clips[:, :, :1]] + [clips[:, :, 1 + stride * (k - 1):1 + stride * k] for k in range(1, latent_frames)]
    return torch.stack([F.avg_pool2d(g.mean(2), factor) for g in groups], dim=2)


def _lstsq(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, float]:
    x = torch.cat([x.double(), torch.ones(len(x), 1, dtype=torch.float64)], dim=1)
    m = torch.linalg.lstsq(x, y.double()).solution
    return m.float(), float((x @ m - y.double()).pow(2).mean().sqrt())


@torch.no_grad()
def fit(vae, clips: torch.Tensor | None = None, batch: int = 4) -> tuple[torch.Tensor, float]:
    """The maps [2, z_dim + 1, 3] (float32, CPU) from model-space latents to RGB in [-1, 1], the first
    for a clip's first latent frame (the VAE encodes it alone) and the second for the rest, fitted on
    `clips` [n, 3, 1 + 4k, H, W] (default: `sample_clips()`); and the fit's RMS error in RGB units."""
    clips = sample_clips() if clips is None else clips
    latents = torch.cat([normalize(vae, encode(vae, clips[i:i + batch]).float()).cpu()
                         for i in range(0, len(clips), batch)])                     # [n, z, T, h, w]
    n, z, t = latents.shape[:3]
    target = _pooled_targets(clips.float(), t, clips.shape[-1] // latents.shape[-1], (clips.shape[2] - 1) // max(1, t - 1))
    flat = lambda a: a.permute(0, 2, 3, 1).reshape(-1, a.shape[1])                  # noqa: E731
    first = _lstsq(flat(latents[:, :, 0]), flat(target[:, :, 0]))
    rest = _lstsq(flat(latents[:, :, 1:].transpose(1, 2).reshape(-1, z, *latents.shape[3:])),
                  flat(target[:, :, 1:].transpose(1, 2).reshape(-1, 3, *target.shape[3:])))
    return torch.stack([first[0], rest[0]]), (first[1] ** 2 / t + rest[1] ** 2 * (t - 1) / t) ** 0.5


def project(m: torch.Tensor, latents: torch.Tensor, frames: int = FRAMES) -> np.ndarray:
    """uint8 [h, k * w, 3]: up to `frames` latent frames (evenly spaced, first and last included) of
    model-space latents [1, z, T, h, w] through the maps, side by side."""
    t = latents.shape[2]
    picks = sorted({round(i * (t - 1) / max(1, frames - 1)) for i in range(min(frames, t))})
    out = []
    for k in picks:
        mk = m[0 if k == 0 else 1]
        rgb = torch.einsum("zhw,zc->hwc", latents[0, :, k].float().cpu(), mk[:-1]) + mk[-1]
        out.append(((rgb.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8))
    return torch.cat(out, dim=1).numpy()


def review_frames(vae, latents: torch.Tensor, num_frames: int, height: int, width: int):
    """uint8 [height, width, 3] CPU frames of model-space latents [1, z, T, h, w] through the VAE's preview
    maps in place of its decoder (output.decode: preview): each latent frame stands for the 4 frames it
    encodes (the first for 1), scaled up bilinearly. A take's review copy at a tiny fraction of a decode."""
    m = preview_map(vae)
    per = max(1, (num_frames - 1) // max(1, latents.shape[2] - 1))       # frames a latent frame holds (4 on Wan)
    for k in range(latents.shape[2]):
        mk = m[0 if k == 0 else 1]
        rgb = torch.einsum("zhw,zc->chw", latents[0, :, k].float().cpu(), mk[:-1]) + mk[-1, :, None, None]
        rgb = F.interpolate(rgb[None], size=(height, width), mode="bilinear", align_corners=False)[0]
        frame = ((rgb.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(1, 2, 0).contiguous()
        for _ in range(1 if k == 0 else per):
            yield frame


def reduce(frame: np.ndarray, widest: int = WIDEST) -> np.ndarray:
    """A decoded frame (uint8 [H, W, 3]) taken down to at most `widest` px on its longer side."""
    step = max(1, -(-max(frame.shape[:2]) // widest))
    return np.ascontiguousarray(frame[::step, ::step])


def png(rgb: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG", optimize=True)
    return buf.getvalue()


def write(path: str | Path, rgb: np.ndarray) -> Path:
    """Write a preview PNG atomically (a reader never sees half a file); returns the path."""
    return atomic_write_bytes(path, png(rgb), f"cannot write the preview {path}")


TABLE = "preview.json"      # beside a VAE's config.json: a shipped map, used instead of fitting one


def shipped_map(vae) -> torch.Tensor | None:
    """The map table shipped in the VAE's folder (`preview.json`), if it has one that fits this VAE;
    one warning line when a table is there but unusable (then the map is fitted instead)."""
    import json
    import logging

    folder = dict(vae.config).get("_name_or_path")       # the folder from_pretrained read it from
    path = Path(str(folder)) / TABLE if folder else None
    if path is None or not path.is_file():
        return None
    try:
        maps = torch.tensor(json.loads(path.read_text())["maps"], dtype=torch.float32)
        if maps.shape != (2, vae.config.z_dim + 1, 3) or not bool(torch.isfinite(maps).all()):
            raise ValueError(f"maps of shape {tuple(maps.shape)}, expected (2, {vae.config.z_dim + 1}, 3)")
        return maps
    except (OSError, ValueError, KeyError, TypeError) as e:
        logging.getLogger("vidgen").warning("preview: %s is unusable (%s); fitting the map from the VAE instead", path,
                                            str(e).splitlines()[0] if str(e) else type(e).__name__)
        return None


def write_table(folder: str | Path, maps: torch.Tensor, rms: float, fitted_on: str) -> Path:
    """Ship `maps` (from `fit`) as the VAE folder's preview table."""
    import json

    path = Path(folder) / TABLE
    path.write_text(json.dumps({"maps": [[[round(v, 6) for v in row] for row in m] for m in maps.tolist()],
                                "rms": round(rms, 4), "fitted_on": fitted_on}, indent=1) + "\n")
    return path


def sampling_preview(vae, estimate: Callable[[], torch.Tensor | None]) -> Callable[[], np.ndarray | None]:
    """A zero-argument function giving the current denoised estimate as RGB (None before the first
    step): `estimate` gives it, the newest step report's x0 (sampling.StepReport.denoised) with any
    condition written in. The VAE's map (its folder's shipped table, else fitted on first use) is kept
    on the VAE object (it belongs to its weights)."""
    def make() -> np.ndarray | None:
        x0 = estimate()
        return None if x0 is None else project(preview_map(vae), x0)
    return make


def preview_map(vae) -> torch.Tensor:
    """The VAE's maps: its folder's shipped table, else fitted on first use; kept on the VAE object
    (they belong to its weights)."""
    if getattr(vae, "_vidgen_preview_map", None) is None:
        shipped = shipped_map(vae)
        vae._vidgen_preview_map = shipped if shipped is not None else fit(vae)[0]
    return vae._vidgen_preview_map
