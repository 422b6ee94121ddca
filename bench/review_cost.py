"""What latents-first review saves: a shot of N takes, each sampled, decoded for review through the latent
preview map (output.decode: preview), and only the approved take decoded by the VAE, against every take
decoded in full. Counted (FLOPs at a real size, no GPU) and measured (stage timings of the demo).

    python bench/review_cost.py                                  # A14B 1280x720x81, 40 steps, 4 takes
    python bench/review_cost.py --takes 4 --demo-runs 3          # and the demo's measured stage times

Counted: sampling = steps x 2 forwards (guided, unguided) x transformer_flops (vidgen.footprint); the VAE
decode's FLOPs are counted by torch's FlopCounterMode on a meta-tensor decode of the real latent shape
(convolutions and matmuls; no weights, no memory); the preview map is a z x 3 matrix a latent pixel.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vidgen.families import VARIANTS_DIR  # noqa: E402
from vidgen.footprint import transformer_flops  # noqa: E402


def decode_flops(vae_conf: dict, latent_shape: tuple[int, ...]) -> float:
    """FLOPs of one VAE decode of `latent_shape`, counted on meta tensors."""
    from diffusers import AutoencoderKLWan
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device("meta"):
        vae = AutoencoderKLWan.from_config({k: v for k, v in vae_conf.items() if not k.startswith("_")})
        z = torch.empty(latent_shape)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        vae.decode(z)
    return float(counter.get_total_flops())


def counted(folder: str, size: str, frames: int, steps: int, takes: int) -> dict:
    conf = json.loads((VARIANTS_DIR / folder / "transformer" / "config.json").read_text())
    vae_conf = json.loads((VARIANTS_DIR / folder / "vae" / "config.json").read_text())
    w, h = (int(x) for x in size.split("x"))
    z = vae_conf.get("z_dim", 16)
    t = (frames - 1) // 4 + 1
    shape = (1, z, t, h // 8, w // 8)
    sample = steps * 2 * transformer_flops(conf, shape, 512)
    decode = decode_flops(vae_conf, shape)
    preview = 2 * z * 3 * t * (h // 8) * (w // 8)
    return {"sample": sample, "decode": decode, "preview": preview,
            "all_full": takes * (sample + decode), "latents_first": takes * (sample + preview) + decode}


def measured(runs: int, takes: int) -> dict:
    """The demo's stage times (median of `runs`): denoise, full decode+write, preview decode+write."""
    import vidgen

    times = {"denoise": [], "full": [], "preview": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(runs):
            for decode in ("full", "preview"):
                res = vidgen.render(str(ROOT / "configs" / "demo.yaml"), seed=r, **{
                    "output.path": f"{tmp}/{decode}-{r}.mp4", "output.decode": decode})
                times[decode].append(res.timings["decode_write"])
                times["denoise"].append(res.timings["denoise"])
    med = {k: statistics.median(v) for k, v in times.items()}
    med["all_full"] = takes * (med["denoise"] + med["full"])
    med["latents_first"] = takes * (med["denoise"] + med["preview"]) + med["full"]
    return med


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--folder", default="wan2.2-t2v-a14b")
    ap.add_argument("--size", default="1280x720")
    ap.add_argument("--frames", type=int, default=81)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--takes", type=int, default=4)
    ap.add_argument("--demo-runs", type=int, default=0, help="also time the demo this many times (0: count only)")
    a = ap.parse_args()
    c = counted(a.folder, a.size, a.frames, a.steps, a.takes)
    saved = 1 - c["latents_first"] / c["all_full"]
    print(f"counted, {a.folder} {a.size}x{a.frames}, {a.steps} steps, {a.takes} takes (PFLOP):")
    print(f"  sampling a take {c['sample'] / 1e15:.1f}, VAE decode {c['decode'] / 1e15:.2f}, "
          f"preview map {c['preview'] / 1e15:.2e}")
    print(f"  every take decoded {c['all_full'] / 1e15:.1f}; latents first {c['latents_first'] / 1e15:.1f}; "
          f"saved {saved:.1%} ({(c['all_full'] - c['latents_first']) / 1e15:.2f} PFLOP, "
          f"{(a.takes - 1)} decodes)")
    if a.demo_runs:
        m = measured(a.demo_runs, a.takes)
        saved = 1 - m["latents_first"] / m["all_full"]
        print(f"measured, demo (median of {a.demo_runs}): denoise {m['denoise']:.3f} s, full decode+write "
              f"{m['full']:.3f} s, preview decode+write {m['preview']:.3f} s; {a.takes} takes: every take decoded "
              f"{m['all_full']:.2f} s, latents first {m['latents_first']:.2f} s, saved {saved:.1%}")


if __name__ == "__main__":
    main()
