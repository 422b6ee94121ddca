"""Plain-PyTorch twins of the VAE decoder's memory-bound ops: the CPU path and the test oracle.

Every op writes into caller-provided memory (no padded or concatenated copies) and accepts any
strides (channels_last_3d, slices of a larger buffer). The Triton and Metal kernels compute the
same values in the same order:

- `rms_norm_silu_into`: per location, the sum of squares over channels accumulated in channel
  order in float32 (product rounded, then sum rounded — no fused multiply-add), correctly rounded
  sqrt and division, then `* sqrt(C)` and `* gamma` in float32, SiLU in float32, one rounding to
  the output dtype. The order is fixed rather than torch.norm's (whose order depends on the
  memory layout), so fp32 results do not depend on layout or device; they stay within 1e-6 of
  diffusers' WanRMS_norm, and half inputs are rounded once instead of after every op.
- the others move data and are bit-exact in every dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

NORM_EPS = 1e-12   # F.normalize's default, which Wan's RMS_norm uses


def norm_scale(channels: int) -> float:
    """sqrt(C) rounded to float32, the value every backend multiplies by."""
    return torch.tensor(channels ** 0.5, dtype=torch.float32).item()


def _norm_silu_f32(x: torch.Tensor, gamma: torch.Tensor, eps: float, silu: bool, out: torch.Tensor | None) -> torch.Tensor:
    """The op on one float32 chunk x [N, C, ...]; writes into `out` when given (float32)."""
    c = x.shape[1]
    ss = x[:, 0] * x[:, 0]                                   # [N, ...]
    for k in range(1, c):
        ss += x[:, k] * x[:, k]
    # torch's vectorised float32 sqrt is not correctly rounded on CPU; the float64 one is, and
    # rounding it to float32 gives the correctly rounded float32 root (what the kernels compute)
    n = ss.double().sqrt_().float().clamp_min_(eps).unsqueeze(1)   # [N, 1, ...]
    y = torch.div(x, n, out=out) if out is not None else x / n
    y.mul_(norm_scale(c))
    y.mul_(gamma.reshape(1, c, *[1] * (x.ndim - 2)).float())
    if silu:
        F.silu(y, inplace=True)
    return y


def rms_norm_silu_into(x: torch.Tensor, gamma: torch.Tensor, out: torch.Tensor, eps: float = NORM_EPS,
                       silu: bool = True) -> None:
    """out = silu(x / max(||x||_2 over C, eps) * sqrt(C) * gamma) (Wan's RMS_norm, then SiLU).

    Args:
        x: [N, C, T, H, W]; gamma: C values (Wan stores [C, 1, 1, 1]); out: like x, any strides
        (typically buf[:, :, 2:] of a causal conv's input buffer).
    """
    if x.dtype == torch.float32 and out.dtype == torch.float32:
        _norm_silu_f32(x, gamma, eps, silu, out)
        return
    for t in range(x.shape[2]):      # frame by frame: the float32 temporary stays one frame large
        out[:, :, t] = _norm_silu_f32(x[:, :, t].float(), gamma, eps, silu, None)


def causal_cache_shift(buf: torch.Tensor, cache: torch.Tensor, first: bool) -> None:
    """Hand a causal conv's last 2 input frames to its next chunk.

    buf [N, C, 2+T, H, W] holds this chunk's frames after 2 head frames; cache [N, C, 2, H, W]
    holds the previous chunk's last 2 frames (ignored when `first`: zeros, Wan's causal padding).
    Afterwards buf's head is the previous frames and cache is the last 2 frames of [head | chunk],
    which for T = 1 include a head frame. Only 2 frames per conv persist between chunks, not the
    whole buffer.
    """
    t = buf.shape[2] - 2
    if first:
        buf[:, :, :2].zero_()
    else:
        buf[:, :, :2].copy_(cache)
    cache.copy_(buf[:, :, t:t + 2])


def window_gather(src: torch.Tensor, out: torch.Tensor, y0: int, x0: int) -> None:
    """out[..., i, j] = src[..., y0 + i, x0 + j], zero where that falls outside src (a tile's halo window).

    Args:
        src: [N, C, T, H, W]; out: [N, C, T, h, w] (any strides, e.g. channels_last_3d).
    """
    H, W = src.shape[-2:]
    h, w = out.shape[-2:]
    ya, yb, xa, xb = max(y0, 0), min(y0 + h, H), max(x0, 0), min(x0 + w, W)
    if (ya, yb, xa, xb) != (y0, y0 + h, x0, x0 + w):
        out.zero_()
    if ya < yb and xa < xb:
        out[..., ya - y0:yb - y0, xa - x0:xb - x0].copy_(src[..., ya:yb, xa:xb])


def upsample_nearest2x_into(x: torch.Tensor, out: torch.Tensor) -> None:
    """out = nearest-exact x2 spatial upsample of x (as F.interpolate), into preallocated memory.

    Args:
        x: [N, C, T, H, W], any strides (e.g. the interleaved view of a time_conv output);
        out: [N, C, T, 2H, 2W].
    """
    for a in (0, 1):
        for b in (0, 1):
            out[..., a::2, b::2].copy_(x)


def dup_up_add(y: torch.Tensor, x: torch.Tensor, factor_t: int, factor_s: int, first: bool) -> None:
    """y += DupUp3D(x) (Wan2.2's parameter-free up-block shortcut: channel repeat + space/time shuffle).

    Args:
        y: [N, Co, T', H*fs, W*fs] with T' = T*ft, or T*ft - (ft-1) on the first chunk;
        x: [N, Ci, T, H, W]; Co * ft * fs * fs must be a multiple of Ci.
    """
    n, ci, t, h, w = x.shape
    co = y.shape[1]
    repeats = co * factor_t * factor_s * factor_s // ci
    r = x.repeat_interleave(repeats, dim=1).view(n, co, factor_t, factor_s, factor_s, t, h, w)
    r = r.permute(0, 1, 5, 2, 6, 3, 7, 4).reshape(n, co, t * factor_t, h * factor_s, w * factor_s)
    y.add_(r[:, :, factor_t - 1:] if first else r)
