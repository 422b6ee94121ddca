"""Stage 5: Wan VAE — latents <-> pixels.

Convention (as diffusers): `decode` takes de-normalised latents (`denormalize(vae, z)`) and
returns video in [-1, 1]; `iter_frames` yields uint8 HWC frames in order for the writer.
"""

from __future__ import annotations

from typing import Iterator

import torch


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


@torch.no_grad()
def decode(vae, latents: torch.Tensor) -> torch.Tensor:
    """De-normalised latents [B, z, T, h, w] -> video [B, 3, 1 + 4(T-1), H, W] in [-1, 1]."""
    param = next(vae.parameters())
    return vae.decode(latents.to(param.device, param.dtype), return_dict=False)[0]


def to_uint8(frames: torch.Tensor) -> torch.Tensor:
    """[..., 3, H, W] in [-1, 1] -> [..., H, W, 3] uint8 (rounded as diffusers' postprocessing does)."""
    x = (frames.float() / 2 + 0.5).clamp(0, 1)
    return (x * 255).round().to(torch.uint8).movedim(-3, -1)


@torch.no_grad()
def iter_frames(vae, latents: torch.Tensor) -> Iterator[torch.Tensor]:
    """Yield the decoded frames of the first clip in order, as uint8 [H, W, 3] CPU tensors."""
    video = decode(vae, latents[:1])[0]                       # [3, F, H, W]
    for i in range(video.shape[1]):
        yield to_uint8(video[:, i]).cpu()
