"""Plain-PyTorch twins of the VAE decoder's memory-bound ops: the CPU path and the test oracle.

Every op writes into caller-provided memory (no padded or concatenated copies) and accepts any
strides (channels_last_3d, slices of a larger buffer). The Triton and Metal kernels compute the
same values in the same order:

- `rms_norm_silu_into`: per location, the sum of squares over channels accumulated in channel
  order in float32 (product rounded, then sum rounded — no fused multiply-add), correctly rounded
  sqrt and division, then `* sqrt(C)` and `* gamma` in float32, SiLU in float32, one rounding to
  the output dtype. The order is fixed rather than torch.norm's (whose order depends on the
  memory layout), so fp32 results do not depend on layout or device; they stay within 1e-6 of
  diffusers' WanRMS_norm, and half inputs are rounded once instead of after every op. SiLU's exp
  is `exp_f32` below, spelled out in float32 steps, not the platform's exp (torch's, CUDA's,
  Metal's and numpy's differ by an ulp here and there), so every backend gives the same bits.
- the others move data and are bit-exact in every dtype.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

NORM_EPS = 1e-12   # F.normalize's default, which Wan's RMS_norm uses


@functools.cache
def norm_scale(channels: int) -> float:
    """sqrt(C) rounded to float32, the value every backend multiplies by."""
    return torch.tensor(channels ** 0.5, dtype=torch.float32).item()


# exp(x) in float32 by fixed steps, the same in reference.py, kernels/triton/vae_ops.py and
# kernels/metal/vae_ops.metal: clamp to [-87, 88] (so 2^k stays a normal float), k = floor(x log2e
# + 1/2), Cody-Waite reduction r = x - k ln2 (ln2 split in two, k * LN2_HI exact), a degree-7
# Taylor polynomial in r by Horner (|r| <= 0.35: truncation under 0.1 ulp), times 2^k built from
# its bits. Every constant is exactly a float32; each step rounds once (no fused multiply-add).
# Within 1 ulp of the correctly rounded exp on [-87, 88] (tested); NaN gives NaN.
EXP_LO, EXP_HI = -87.0, 88.0
LOG2E = 1.4426950216293335
LN2_HI = 0.693359375
LN2_LO = -0.00021219444170128554
EXP_POLY = (0.00019841270113829523, 0.0013888889225199819, 0.008333333767950535,   # 1/7! ... 1/3!,
            0.0416666679084301, 0.1666666716337204, 0.5, 1.0, 1.0)                    # 1/2!, 1/1!, 1/0!
SILU_ELEMENTS = 1 << 20   # the twin applies SiLU to groups of channels of about this many elements,
SILU_MIN_GROUP = 8        # and at least this many channels: few small ops on small tiles, and a
                          # float32 scratch of 4 groups (16 MiB, or 32 channels of a large frame)


def exp_f32(x: torch.Tensor) -> torch.Tensor:
    """exp of a float32 tensor by the steps above (a new tensor)."""
    return _exp_f32_(x.clone())


def _exp_f32_(t: torch.Tensor) -> torch.Tensor:
    """exp_f32, using t as scratch (its values are lost); at most 3 more temporaries of its size."""
    t.clamp_(EXP_LO, EXP_HI)                    # NaN stays NaN
    k = t * LOG2E
    k.add_(0.5).floor_()
    k.nan_to_num_(nan=0.0)                      # t is finite or NaN, so only NaN changes
    t.sub_(k * LN2_HI)
    t.sub_(k * LN2_LO)                          # t is now r
    p = t * EXP_POLY[0]
    for c in EXP_POLY[1:-1]:
        p.add_(c)
        p.mul_(t)
    p.add_(EXP_POLY[-1])
    del t
    scale = k.to(torch.int32).add_(127).bitwise_left_shift_(23).view(torch.float32)
    return p.mul_(scale)


def silu_group(channels: int, per_channel: int) -> int:
    """Channels per step of silu_f32_ for a tensor of `channels` x `per_channel` elements."""
    return min(channels, max(SILU_MIN_GROUP, SILU_ELEMENTS // max(per_channel, 1)))


def silu_f32_(y: torch.Tensor) -> torch.Tensor:
    """y = y / (1 + exp_f32(-y)) in place, for float32 y [N, C, ...], a group of channels at a time
    (`silu_group`; the grouping changes no bit, only the scratch size)."""
    step = silu_group(y.shape[1], y.numel() // max(y.shape[1], 1))
    for c0 in range(0, y.shape[1], step):
        g = y[:, c0:c0 + step]
        g.div_(_exp_f32_(g.neg()).add_(1.0))
    return y


def _norm_silu_f32(x: torch.Tensor, gamma: torch.Tensor, eps: float, silu: bool, out: torch.Tensor | None) -> torch.Tensor:
    """The op on one float32 chunk x [N, C, ...] with float32 gamma [C]; writes into `out` when given."""
    c = x.shape[1]
    ss = x[:, 0] * x[:, 0]                                   # [N, ...]
    for k in range(1, c):
        ss += x[:, k] * x[:, k]
    # torch's vectorised float32 sqrt is not correctly rounded on CPU; the float64 one is, and
    # rounding it to float32 gives the correctly rounded float32 root (what the kernels compute)
    n = ss.double().sqrt_().float().clamp_min_(eps).unsqueeze(1)   # [N, 1, ...]
    y = torch.div(x, n, out=out) if out is not None else x / n
    y.mul_(norm_scale(c))
    y.mul_(gamma.view(1, c, *[1] * (x.ndim - 2)))
    if silu:
        silu_f32_(y)
    return y


def rms_norm_silu_into(x: torch.Tensor, gamma: torch.Tensor, out: torch.Tensor, eps: float = NORM_EPS,
                       silu: bool = True) -> None:
    """out = silu(x / max(||x||_2 over C, eps) * sqrt(C) * gamma) (Wan's RMS_norm, then SiLU).

    Args:
        x: [N, C, T, H, W]; gamma: C values (Wan stores [C, 1, 1, 1]); out: like x, any strides
        (typically buf[:, :, 2:] of a causal conv's input buffer).
    """
    gamma = gamma.reshape(-1).float()
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
