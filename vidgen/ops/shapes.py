"""Argument checks shared by the kernel backends (a kernel writing past a wrong shape fails silently)."""

from __future__ import annotations

import torch


def _same(what: str, *tensors: torch.Tensor) -> None:
    devices = {t.device for t in tensors}
    if len(devices) > 1:
        raise ValueError(f"{what}: tensors on different devices {sorted(map(str, devices))}")


def rms_norm_silu_into(x, gamma, out) -> None:
    _same("rms_norm_silu_into", x, gamma, out)
    if x.ndim != 5 or out.shape != x.shape:
        raise ValueError(f"rms_norm_silu_into: x and out must be the same [N, C, T, H, W], got {tuple(x.shape)} "
                         f"and {tuple(out.shape)}")
    if gamma.numel() != x.shape[1] or not gamma.is_contiguous():
        raise ValueError(f"rms_norm_silu_into: gamma must hold C={x.shape[1]} contiguous values, got {tuple(gamma.shape)}")


def causal_cache_shift(buf, cache) -> None:
    _same("causal_cache_shift", buf, cache)
    n, c, t2, h, w = buf.shape
    if t2 < 3 or tuple(cache.shape) != (n, c, 2, h, w) or cache.dtype != buf.dtype:
        raise ValueError(f"causal_cache_shift: buf [N, C, 2+T, H, W] (T >= 1) and cache [N, C, 2, H, W] of one "
                         f"dtype, got {tuple(buf.shape)} {buf.dtype} and {tuple(cache.shape)} {cache.dtype}")


def window_gather(src, out) -> None:
    _same("window_gather", src, out)
    if src.ndim != 5 or out.ndim != 5 or src.shape[:3] != out.shape[:3] or src.dtype != out.dtype:
        raise ValueError(f"window_gather: src and out must share N, C, T and dtype, got {tuple(src.shape)} "
                         f"{src.dtype} and {tuple(out.shape)} {out.dtype}")


def upsample_nearest2x_into(x, out) -> None:
    _same("upsample_nearest2x_into", x, out)
    n, c, t, h, w = x.shape
    if tuple(out.shape) != (n, c, t, 2 * h, 2 * w) or out.dtype != x.dtype:
        raise ValueError(f"upsample_nearest2x_into: out must be {(n, c, t, 2 * h, 2 * w)} {x.dtype}, "
                         f"got {tuple(out.shape)} {out.dtype}")


def dup_up_add(y, x, factor_t: int, factor_s: int, first: bool) -> tuple[int, int]:
    """Checks y += DupUp3D(x); returns (repeats, frames skipped at the start)."""
    if factor_t < 1 or factor_s < 1:
        raise ValueError(f"dup_up_add: factor_t and factor_s must be >= 1, got {factor_t} and {factor_s}")
    _same("dup_up_add", y, x)
    n, ci, t, h, w = x.shape
    co = y.shape[1]
    total = co * factor_t * factor_s * factor_s
    skip = factor_t - 1 if first else 0
    want = (n, co, t * factor_t - skip, h * factor_s, w * factor_s)
    if total % ci or tuple(y.shape) != want:
        raise ValueError(f"dup_up_add: y must be {want} with Co*ft*fs*fs a multiple of Ci={ci}, got {tuple(y.shape)}")
    return total // ci, skip
