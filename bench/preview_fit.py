"""How good the queue's sampling previews are for a VAE: fit vidgen.preview's latent-to-RGB maps on
sample clips and report the time, the fit's RMS error, the error on held-out clips (another seed)
and, for scale, the error of a flat per-clip mean colour. RGB units: [-1, 1].

--clips procedural: vidgen.preview.sample_clips (what a VAE without a shipped table is fitted on);
--clips demo: the demo's own training clips (vidgen.demo.data), what the demo VAEs' tables are made
from. --write ships the fitted maps as the VAE folder's preview.json.

    python bench/preview_fit.py [--vae samples/demo-wan/vae] [--device cpu] [--clips demo] [--write]
"""

from __future__ import annotations

import argparse
import time

import torch

from vidgen.preview import _pooled_targets, fit, sample_clips, write_table
from vidgen.vae import encode, normalize


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vae", default="samples/demo-wan/vae", help="a diffusers AutoencoderKLWan folder")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--clips", choices=("procedural", "demo"), default="procedural")
    ap.add_argument("--write", action="store_true", help="write the maps as the VAE folder's preview.json")
    args = ap.parse_args()
    from diffusers import AutoencoderKLWan

    vae = AutoencoderKLWan.from_pretrained(args.vae).to(args.device).eval()
    clips = (lambda seed: demo_clips(48, seed)) if args.clips == "demo" else (lambda seed: sample_clips(seed=seed))
    fitted_on = clips(0)
    t0 = time.perf_counter()
    maps, rms = fit(vae, fitted_on)
    seconds = time.perf_counter() - t0
    held = clips(1)
    with torch.no_grad():
        z = normalize(vae, encode(vae, held).float()).cpu()
    target = _pooled_targets(held, z.shape[2], held.shape[-1] // z.shape[-1], (held.shape[2] - 1) // max(1, z.shape[2] - 1))
    pred = torch.stack([torch.einsum("nzhw,zc->nchw", z[:, :, k], maps[min(k, 1)][:-1])
                        + maps[min(k, 1)][-1][None, :, None, None] for k in range(z.shape[2])], dim=2)
    held_rms = float((pred.clamp(-1, 1) - target).pow(2).mean().sqrt())
    flat_rms = float((target - target.mean((2, 3, 4), keepdim=True)).pow(2).mean().sqrt())
    print(f"vae {args.vae} (z_dim {vae.config.z_dim}), {args.clips} clips: fit {seconds:.2f} s on {args.device}, "
          f"RMS fit {rms:.3f}, held-out {held_rms:.3f}, flat mean colour {flat_rms:.3f}")
    if args.write:
        what = ("48 demo training clips of 17 frames (vidgen.demo.data, seed 0)" if args.clips == "demo"
                else "vidgen.preview.sample_clips()")
        print("wrote", write_table(args.vae, maps, rms, f"{what}: python bench/preview_fit.py --clips {args.clips} --write"))


def demo_clips(n: int, seed: int) -> torch.Tensor:
    import numpy as np

    from vidgen.demo.data import all_combos, make_batch

    rng = np.random.default_rng(seed)
    combos = all_combos()
    return make_batch([combos[i] for i in rng.choice(len(combos), n)], rng, frames=17)[0]


if __name__ == "__main__":
    main()
