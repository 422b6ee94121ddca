"""The fast exact PyTorch backend (`vae.kernels: torch`, what `auto` picks on the CPU).

Vectorised PyTorch over whole tensors: the sum of squares over channels in float32, a band of rows
at a time (`SQUARES_ELEMENTS`: a small temporary, and 5-10x faster on the CPU than
`torch.linalg.vector_norm` over the channel dimension), `F.silu` with the platform's exp, written
into the caller's preallocated conv buffer like every backend. Exact against diffusers'
untiled decode within 1e-5 in float32, as every backend is; it is not bit-identical to
reference.py, whose fixed summation order and spelled-out exp exist so that the Triton and Metal
kernels have an oracle to match bit for bit (`vae.kernels: reference`, for tests). The data-moving
ops are reference.py's: they are plain copies, bit-exact and already vectorised.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .reference import NORM_EPS, causal_cache_shift, dup_up_add, norm_scale, upsample_nearest2x_into, window_gather

__all__ = ["rms_norm_silu_into", "causal_cache_shift", "window_gather", "upsample_nearest2x_into", "dup_up_add"]
SQUARES_ELEMENTS = 1 << 18      # elements of the squared band (1 MiB in float32)


def channel_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """max(||x||_2 over dim 1, eps) of float32 x [N, C, ..., H, W], as float32 [N, 1, ..., H, W]."""
    norm = x.new_empty((x.shape[0], 1, *x.shape[2:]))
    rows = max(1, SQUARES_ELEMENTS // max(1, x.numel() // max(1, x.shape[-2])))
    for y0 in range(0, x.shape[-2], rows):
        band = x[..., y0:y0 + rows, :]
        torch.sum(band * band, dim=1, keepdim=True, out=norm[..., y0:y0 + rows, :])
    return norm.sqrt_().clamp_min_(eps)


def _scale(gamma: torch.Tensor, c: int, ndim: int) -> torch.Tensor:
    """sqrt(C) * gamma in float32, shaped to broadcast over [N, C, ...] (diffusers multiplies by each in turn)."""
    return (gamma.reshape(-1).float() * norm_scale(c)).view(1, c, *[1] * (ndim - 2))


def rms_norm_silu_into(x: torch.Tensor, gamma: torch.Tensor, out: torch.Tensor, eps: float = NORM_EPS,
                       silu: bool = True) -> None:
    """out = silu(x / max(||x||_2 over C, eps) * sqrt(C) * gamma) (Wan's RMS_norm, then SiLU).

    Args:
        x: [N, C, T, H, W]; gamma: C values; out: like x, any strides (typically buf[:, :, 2:] of a
        causal conv's input buffer). Half-precision inputs are computed in float32 a frame at a time
        and rounded once.
    """
    c = x.shape[1]
    if x.dtype == torch.float32 and out.dtype == torch.float32:
        torch.div(x, channel_norm(x, eps), out=out)
        out.mul_(_scale(gamma, c, x.ndim))
        if silu:
            F.silu(out, inplace=True)
        return
    scale = _scale(gamma, c, x.ndim - 1)
    for t in range(x.shape[2]):      # frame by frame: the float32 temporary stays one frame large
        y = x[:, :, t].float()
        y.div_(channel_norm(y, eps)).mul_(scale)
        if silu:
            F.silu(y, inplace=True)
        out[:, :, t] = y
        del y                        # before the next frame's copy exists
