"""How good the queue's sampling previews are for a VAE: fit vidgen.preview's latent-to-RGB maps on
the procedural sample clips and report the time, the fit's RMS error, the error on held-out clips
(another seed) and, for scale, the error of a flat per-clip mean colour. RGB units: [-1, 1].

    python bench/preview_fit.py [--vae samples/demo-wan/vae] [--device cpu]
"""

from __future__ import annotations

import argparse
import time

import torch

from vidgen.preview import _pooled_targets, fit, sample_clips
from vidgen.vae import encode, normalize


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vae", default="samples/demo-wan/vae", help="a diffusers AutoencoderKLWan folder")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    from diffusers import AutoencoderKLWan

    vae = AutoencoderKLWan.from_pretrained(args.vae).to(args.device).eval()
    t0 = time.perf_counter()
    maps, rms = fit(vae)
    seconds = time.perf_counter() - t0
    held = sample_clips(seed=1)
    with torch.no_grad():
        z = normalize(vae, encode(vae, held).float()).cpu()
    target = _pooled_targets(held, z.shape[2], held.shape[-1] // z.shape[-1], (held.shape[2] - 1) // max(1, z.shape[2] - 1))
    pred = torch.stack([torch.einsum("nzhw,zc->nchw", z[:, :, k], maps[min(k, 1)][:-1])
                        + maps[min(k, 1)][-1][None, :, None, None] for k in range(z.shape[2])], dim=2)
    held_rms = float((pred.clamp(-1, 1) - target).pow(2).mean().sqrt())
    flat_rms = float((target - target.mean((2, 3, 4), keepdim=True)).pow(2).mean().sqrt())
    print(f"vae {args.vae} (z_dim {vae.config.z_dim}): fit {seconds:.2f} s on {args.device}, "
          f"RMS fit {rms:.3f}, held-out {held_rms:.3f}, flat mean colour {flat_rms:.3f}")


if __name__ == "__main__":
    main()
