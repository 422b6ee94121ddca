"""The Triton backend: the ops of reference.py as Triton kernels (kernels/triton/vae_ops.py).

Imported only when the triton backend is chosen. On CPU tensors the kernels run under Triton's
interpreter (TRITON_INTERPRET=1, set before this module is imported), which is how the tests
check them against the twins.
"""

from __future__ import annotations

import torch

from vidgen._kernels.triton import vae_ops as K

from . import shapes
from .reference import NORM_EPS, norm_scale


def rms_norm_silu_into(x: torch.Tensor, gamma: torch.Tensor, out: torch.Tensor, eps: float = NORM_EPS,
                       silu: bool = True) -> None:
    shapes.rms_norm_silu_into(x, gamma, out)
    K.rms_norm_silu_into(x, gamma, out, eps, norm_scale(x.shape[1]), silu)


def causal_cache_shift(buf: torch.Tensor, cache: torch.Tensor, first: bool) -> None:
    shapes.causal_cache_shift(buf, cache)
    K.causal_cache_shift(buf, cache, first)


def window_gather(src: torch.Tensor, out: torch.Tensor, y0: int, x0: int) -> None:
    shapes.window_gather(src, out)
    K.window_gather(src, out, y0, x0)


def upsample_nearest2x_into(x: torch.Tensor, out: torch.Tensor) -> None:
    shapes.upsample_nearest2x_into(x, out)
    K.upsample_nearest2x_into(x, out)


def dup_up_add(y: torch.Tensor, x: torch.Tensor, factor_t: int, factor_s: int, first: bool) -> None:
    repeats, skip = shapes.dup_up_add(y, x, factor_t, factor_s, first)
    K.dup_up_add(y, x, factor_t, factor_s, repeats, skip)
