"""Stage 5: Wan VAE — latents <-> pixels.

Latents come in two spaces, and nothing in a tensor tells them apart: *model* space, normalised
with the VAE's latents_mean/std (what the transformer samples and what vidgen's latents files
hold), and *vae* space, de-normalised (what diffusers' `vae.decode` takes: `denormalize(vae, z)`).
So `decode` and `decode_frames` take a latents file (`space` read from it), `Latents` (from
`load_latents`), or a tensor with `space=` said, and refuse a bare tensor. `decode` returns video
in [-1, 1]; `decode_frames` yields uint8 HWC frames in order for the writer.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterator, Union

import torch

from ..budgets import parse_budget
from ..errors import ConfigError
from ..ops import op_table
from ..resume import SPACE, read_latents
from .decoder import decode_chunks
from .plan import BudgetTooSmall, choose_plan  # noqa: F401


def _stats(vae, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (1, vae.config.z_dim, 1, 1, 1)
    mean = torch.tensor(vae.config.latents_mean).view(shape).to(like.device, like.dtype)
    std = torch.tensor(vae.config.latents_std).view(shape).to(like.device, like.dtype)
    return mean, std


def denormalize(vae, latents: torch.Tensor) -> torch.Tensor:
    """Model-space latents (what the transformer sees) -> VAE-space latents."""
    mean, std = _stats(vae, latents)
    return latents / (1.0 / std) + mean     # written as diffusers does, for bit-identical results


def normalize(vae, latents: torch.Tensor) -> torch.Tensor:
    """VAE-space latents -> model-space latents."""
    mean, std = _stats(vae, latents)
    return (latents - mean) * (1.0 / std)


@torch.no_grad()
def encode(vae, video: torch.Tensor) -> torch.Tensor:
    """Video [B, 3, F, H, W] in [-1, 1] -> VAE-space latents (the posterior mode, as Wan uses)."""
    param = next(vae.parameters())
    return vae.encode(video.to(param.device, param.dtype)).latent_dist.mode()


SPACES = ("model", "vae")
"""model: normalised, as sampled and as vidgen's latents files hold them; vae: de-normalised (diffusers' vae.decode)."""


@dataclass(frozen=True)
class Latents:
    """A latents tensor [B, z, T, h, w] that says which space it is in (SPACES)."""

    tensor: torch.Tensor
    space: str


def load_latents(path: str | os.PathLike) -> Latents:
    """The latents of a vidgen latents file (`NAME.latents.safetensors`), checked, in the space its
    metadata says (model; InputError for a file that is damaged, not vidgen's, or says another)."""
    tensor, _ = read_latents(path)
    return Latents(tensor, SPACE)


LatentsInput = Union[str, os.PathLike, Latents, torch.Tensor]


def _vae_space(vae, latents: LatentsInput, space: str | None) -> torch.Tensor:
    """`latents` (a file, Latents, or a tensor in `space`) as VAE-space latents on the VAE's device;
    ConfigError when the space is not said or contradicts the file's."""
    if isinstance(latents, (str, os.PathLike)):
        latents = load_latents(latents)
    if isinstance(latents, Latents):
        if space is not None and space != latents.space:
            raise ConfigError(f"space={space!r}, but these latents are {latents.space}-space (as their file says); "
                              "leave space out")
        latents, space = latents.tensor, latents.space
    if not isinstance(latents, torch.Tensor):
        raise ConfigError(f"latents is a {type(latents).__name__}; give a latents file's path, Latents, or a tensor")
    if space is None:
        raise ConfigError("a latents tensor does not say whether it is normalised: pass space='model' (as sampled, and "
                          "as vidgen's latents files hold them) or space='vae' (de-normalised, as diffusers' vae.decode "
                          "takes), or give the latents file itself")
    if space not in SPACES:
        raise ConfigError(f"space={space!r} is not one of {', '.join(SPACES)}")
    _check_latents(vae, latents)
    if space == "model":            # as the render does: float32 on the VAE's device, then de-normalised
        return denormalize(vae, latents.to(next(vae.parameters()).device, torch.float32))
    return latents


def _check_latents(vae, latents: torch.Tensor) -> None:
    if latents.ndim != 5 or latents.shape[1] != vae.config.z_dim:
        raise ValueError(f"latents must be [B, {vae.config.z_dim}, T, h, w], got {tuple(latents.shape)}")


def _frames(t_latent: int) -> int:
    return 1 + 4 * (t_latent - 1)


@torch.no_grad()
def decode(vae, latents: LatentsInput, *, space: str | None = None, memory_budget=None,
           kernels: str = "auto", plan=None) -> torch.Tensor:
    """Latents [B, z, T, h, w] -> video [B, 3, 1 + 4(T-1), H, W] in [-1, 1].

    `latents`: a vidgen latents file's path, `Latents` (load_latents), or a tensor with `space`
    ("model": normalised, as sampled; "vae": de-normalised, diffusers' convention). A tensor
    without `space` is refused: the two differ by the VAE's mean and spread, and nothing tells them apart.

    The same pixels as diffusers' untiled `vae.decode(latents).sample` (see docs/vae.md), with
    peak activation memory on the device kept within `memory_budget` (bytes, "1.5GiB", or
    None/"auto" for a fraction of free memory). The video is assembled on the host (CPU).
    `kernels` picks the backend of the memory-bound ops: auto, torch, triton or metal (vidgen.ops).
    `plan`: the PlanEstimate already chosen for latents of this shape (preflight's), used instead of planning.

    Raises:
        ConfigError: a kernels backend that cannot run on the VAE's device.
        BudgetTooSmall: the budget is below the minimum for this frame size (says the minimum).
        ConfigError / InputError: latents whose space is not said, or a latents file that is not vidgen's.
    """
    latents = _vae_space(vae, latents, space)
    param = next(vae.parameters())
    ops = op_table(kernels, param.device)       # an impossible backend fails before any work
    latents = latents.to(param.device, param.dtype)
    estimate = plan or choose_plan(vae, (1, *latents.shape[1:]), memory_budget=parse_budget(memory_budget),
                                   output_bytes=video_bytes(vae.config, latents.shape, param.dtype))
    b, _, t, h, w = latents.shape
    s = vae.config.scale_factor_spatial
    video = torch.empty(b, 3, _frames(t), h * s, w * s, dtype=param.dtype)
    for i in range(b):
        for frame, tile, pixels, _ in decode_chunks(vae, latents[i:i + 1], estimate.plan, ops):
            video[i, :, frame:frame + pixels.shape[2], tile.y0 * s:tile.y1 * s, tile.x0 * s:tile.x1 * s] = pixels[0].cpu()
    return video


def to_uint8(frames: torch.Tensor) -> torch.Tensor:
    """[..., 3, H, W] in [-1, 1] -> [..., H, W, 3] uint8 (rounded as diffusers' postprocessing does)."""
    x = (frames.float() / 2 + 0.5).clamp(0, 1)
    return (x * 255).round().to(torch.uint8).movedim(-3, -1)


def to_uint16(frames: torch.Tensor) -> torch.Tensor:
    """[..., 3, H, W] in [-1, 1] -> [..., H, W, 3] uint16 0..65535: a master's frames, no 8-bit step
    (vidgen.masters). torch has no uint16 arithmetic on every device, so the codes go through int32."""
    x = (frames.float() / 2 + 0.5).clamp(0, 1)
    return (x * 65535).round().to(torch.int32).to(torch.uint16).movedim(-3, -1)


@torch.no_grad()
def decode_frames(vae, latents: LatentsInput, *, space: str | None = None, memory_budget=None,
                  spill_dir: str | None = None, kernels: str = "auto", plan=None, memo=None,
                  deep: bool = False) -> Iterator[torch.Tensor]:
    """Yield the decoded frames of the first clip in order, as uint8 [H, W, 3] CPU tensors (uint16
    0..65535 with `deep`: a master's frames, the host canvas twice the bytes).

    `latents` and `space` as in `decode` (a bare tensor without `space` is refused).

    Frames are yielded as soon as they are final: with one tile, as each chunk finishes; with
    several, while the last tile runs (the earlier tiles' pixels wait in a host uint8 canvas,
    memory-mapped under `spill_dir` or the temp folder when it would exceed HOST_CANVAS_LIMIT; a CPU
    plan's phase-1 results go to a temporary file there too, where the budget needs it).
    `kernels` as in `decode`. `plan`: a PlanEstimate chosen beforehand for this shape (a render's, chosen
    in preflight), else one is chosen now within `memory_budget`, kept in `memo` (choose_plan).
    """
    latents = _vae_space(vae, latents, space)
    param = next(vae.parameters())
    ops = op_table(kernels, param.device)       # resolved once, before any work
    z = latents[:1].to(param.device, param.dtype)
    estimate = plan or choose_plan(vae, tuple(z.shape), memory_budget=parse_budget(memory_budget), memo=memo,
                                   output_bytes=canvas_bytes(vae.config, z.shape, deep))
    _, _, t, h, w = z.shape
    s = vae.config.scale_factor_spatial
    n_frames, H, W = _frames(t), h * s, w * s
    pixel_codes = to_uint16 if deep else to_uint8
    if estimate.plan.ny * estimate.plan.nx == 1:
        for _, _, pixels, _ in decode_chunks(vae, z, estimate.plan, ops, spill_dir):
            for frame in pixel_codes(pixels[0].movedim(1, 0)).cpu():
                yield frame
        return
    canvas = HostCanvas(n_frames, H, W, spill_dir, deep)
    done = 0
    for frame, tile, pixels, last_tile in decode_chunks(vae, z, estimate.plan, ops, spill_dir):
        canvas.put(frame, tile.y0 * s, tile.x0 * s, pixel_codes(pixels[0].movedim(1, 0)).cpu())
        if last_tile and tile.y1 * s == H and tile.x1 * s == W:   # the last tile's chunk completes frames
            end = frame + pixels.shape[2]
            while done < end:
                yield canvas.frame(done)
                done += 1
    canvas.close()


HOST_CANVAS_LIMIT = 4 * 2**30


def video_bytes(vae_config, latent_shape, dtype: torch.dtype) -> int:
    """Bytes of the video `decode` assembles on the host for latents of `latent_shape`."""
    b, _, t, h, w = latent_shape
    s = vae_config["scale_factor_spatial"]
    return b * 3 * _frames(t) * h * s * w * s * torch.empty(0, dtype=dtype).element_size()


def canvas_bytes(vae_config, latent_shape, deep: bool = False) -> int:
    """Host bytes of decode_frames' uint8 (deep: uint16) canvas for latents of `latent_shape` (what a CPU
    plan counts against its budget; a canvas over HOST_CANVAS_LIMIT lives in a file instead)."""
    _, _, t, h, w = latent_shape
    s = vae_config["scale_factor_spatial"]
    nbytes = _frames(t) * h * s * w * s * 3 * (2 if deep else 1)
    return nbytes if nbytes <= HOST_CANVAS_LIMIT else 0


class HostCanvas:
    """The clip as uint8 (deep: uint16) [F, H, W, 3] on the host; a memory-mapped temp file when very long."""

    def __init__(self, frames: int, height: int, width: int, spill_dir: str | None = None, deep: bool = False):
        import numpy as np

        dtype = np.uint16 if deep else np.uint8
        nbytes = frames * height * width * 3 * np.dtype(dtype).itemsize
        self._file = None
        if nbytes > HOST_CANVAS_LIMIT:
            import tempfile

            self._file = tempfile.NamedTemporaryFile(dir=spill_dir, prefix="vidgen-canvas-", suffix=".raw")
            self.array = np.memmap(self._file.name, dtype=dtype, mode="w+", shape=(frames, height, width, 3))
        else:
            self.array = np.empty((frames, height, width, 3), dtype=dtype)

    def put(self, frame: int, y: int, x: int, pixels: torch.Tensor) -> None:
        t, h, w, _ = pixels.shape
        self.array[frame:frame + t, y:y + h, x:x + w] = pixels.numpy()

    def frame(self, i: int) -> torch.Tensor:
        return torch.from_numpy(self.array[i].copy())

    def close(self) -> None:
        if self._file is not None:
            del self.array
            self._file.close()
