"""Memory-bound ops around the VAE decoder's convolutions, in plain PyTorch.

These are the reference twins: the CPU path and the test oracle for fused kernels. Each writes
into a caller-provided buffer so the decoder never materialises padded or concatenated copies.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

NORM_EPS = 1e-12   # F.normalize's default, which Wan's RMS_norm uses


def rms_norm_silu_into(x: torch.Tensor, gamma: torch.Tensor, out: torch.Tensor, *, silu: bool = True) -> torch.Tensor:
    """out = silu(x / max(||x||_2 over C, eps) * sqrt(C) * gamma), written into `out`.

    Bit-identical to diffusers' WanRMS_norm followed by SiLU: the same division (not a reciprocal
    multiply), the same operation order; for half inputs the normalisation runs in float32 and is
    rounded once, frame by frame so the float32 temporary stays one frame large.

    Args:
        x: [N, C, T, H, W]; gamma: [C, 1, 1, 1]; out: same shape as x (may be a slice of a buffer).
    """
    scale = x.shape[1] ** 0.5
    if x.dtype in (torch.float16, torch.bfloat16):
        for t in range(x.shape[2]):
            xt = x[:, :, t].float()
            out[:, :, t] = xt / xt.norm(2, dim=1, keepdim=True).clamp_min(NORM_EPS)
    else:
        torch.div(x, x.norm(2, dim=1, keepdim=True).clamp_min(NORM_EPS), out=out)
    out.mul_(scale)
    out.mul_(gamma)
    if silu:
        F.silu(out, inplace=True)
    return out
