"""Diffusion forcing against diffusers: the same take through vidgen and SkyReelsV2DiffusionForcingPipeline.

    python bench/forcing.py                  # a tiny random-weight DF model, 3 paired runs a case

Each case renders the same seeded take both ways in one process (vidgen.render writing its latents;
the pipeline with output_type="latent"), alternating, and prints the largest latents difference and
the median time ratio vidgen / diffusers of the sampling (vidgen's denoise stage against the
pipeline's call, whose text encoding is a tiny model's and negligible). CPU, float32, one thread.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CASES = {   # num_frames, forcing settings
    "one window, synchronous": (33, {}),
    "one window, ar_step 2, blocks of 3": (33, {"ar_step": 2, "causal_block_size": 3}),
    "three windows, ar_step 1, blocks of 2, addnoise 20": (45, {"base_num_frames": 29, "overlap_history": 5,
                                                               "ar_step": 1, "causal_block_size": 2,
                                                               "addnoise_condition": 20}),
}


def main() -> None:
    torch.set_num_threads(1)
    import vidgen
    from diffusers import SkyReelsV2DiffusionForcingPipeline
    from vidgen import forcing
    from vidgen.quiet import quiet_libraries
    from vidgen.resume import read_latents
    from vidgen.tiny import build_tiny_pipeline

    quiet_libraries()
    tmp = Path(tempfile.mkdtemp())
    model = build_tiny_pipeline(tmp / "df", "skyreels-v2-df")
    pipe = SkyReelsV2DiffusionForcingPipeline.from_pretrained(model)
    pipe.set_progress_bar_config(disable=True)
    stand_in = lambda x: torch.sin(torch.arange(x.numel(), dtype=torch.float32) * 0.7).view(x.shape).to(x.dtype)  # noqa: E731
    forcing.condition_noise = lambda like, *_: stand_in(like)       # the same shared-frame noise on both sides
    real_randn_like = torch.randn_like
    for name, (frames, settings) in CASES.items():
        ratios, diff = [], 0.0
        for run in range(3):
            cfg = {"model": {"path": str(model), "device": "cpu"}, "prompt": "a red circle moving right",
                   "negative_prompt": "blurry", "size": "64x64", "num_frames": frames, "fps": 24, "seed": 7,
                   "sampling": {"steps": 8, "guidance_scale": 4.0, "schedule": "diffusers", "checkpoint_every": 0},
                   "output": {"path": str(tmp / f"out{run}.mp4"), "overwrite": True}, "forcing": settings}
            result = vidgen.render(cfg)
            ours = read_latents(result.latents_path)[0]
            torch.randn_like = stand_in
            t0 = time.perf_counter()
            theirs = pipe(prompt=cfg["prompt"], negative_prompt="blurry", height=64, width=64, num_frames=frames,
                          num_inference_steps=8, guidance_scale=4.0, generator=torch.Generator().manual_seed(7),
                          output_type="latent", fps=24, ar_step=settings.get("ar_step", 0),
                          causal_block_size=settings.get("causal_block_size"),
                          overlap_history=settings.get("overlap_history"),
                          base_num_frames=settings.get("base_num_frames", 97),
                          addnoise_condition=settings.get("addnoise_condition", 0)).frames
            theirs_s = time.perf_counter() - t0
            torch.randn_like = real_randn_like
            diff = max(diff, (ours - theirs.float()).abs().max().item())
            ratios.append(result.timings["denoise"] / theirs_s)
        print(f"{name}: max |vidgen - diffusers| = {diff:.3g}; time vidgen/diffusers median "
              f"{statistics.median(ratios):.2f} (runs {', '.join(f'{r:.2f}' for r in ratios)})", flush=True)


if __name__ == "__main__":
    main()
