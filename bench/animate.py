"""Wan2.2-Animate against diffusers: the same performance through a vidgen render and WanAnimatePipeline.

    python bench/animate.py                  # a tiny random-weight Animate model, 3 paired runs a case

Each case renders the same seeded clip both ways in one process, alternating: vidgen.render (its
preflight, the segment loop, vidgen's exact decoder, a PNG folder) and the pipeline's call
(output_type="np"). It prints the largest pixel difference (8-bit levels: vidgen's PNG frames against
diffusers' float frames x 255) and the median time ratio vidgen / diffusers, where vidgen's time is its
encode and denoise stages (the segments' encodes, sampling and decodes; not the PNG writing) and the
pipeline's is its whole call (whose text and CLIP encoders are a tiny model's). CPU, float32, one thread.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SIZE = 64
CASES = {   # driving frames, mode, segment frames, frames carried over
    "animate, 17 frames in two segments of 9 (1 carried)": (17, "animate", 9, 1),
    "replace, 17 frames in two segments of 13 (5 carried)": (17, "replace", 13, 5),
}


def _inputs(folder: Path, frames: int, face: int) -> tuple[dict, dict]:
    """(PIL frames, their PNG folders): a reference, pose, face, background and a moving binary mask."""
    from PIL import Image

    rng = np.random.default_rng(0)
    pil = {"image": Image.fromarray(rng.integers(0, 256, (48, 72, 3), dtype=np.uint8))}
    for name, size in (("pose", SIZE), ("face", face), ("background", SIZE)):
        pil[name] = [Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)) for _ in range(frames)]
    masks = []
    for i in range(frames):
        m = np.zeros((SIZE, SIZE, 3), np.uint8)
        m[16:48, 4 + 2 * i:36 + 2 * i] = 255
        masks.append(Image.fromarray(m))
    pil["mask"] = masks
    folder.mkdir(parents=True, exist_ok=True)
    files = {"image": str(folder / "ref.png")}
    pil["image"].save(files["image"])
    for name in ("pose", "face", "background", "mask"):
        (folder / name).mkdir(parents=True, exist_ok=True)
        for i, im in enumerate(pil[name]):
            im.save(folder / name / f"{i:04d}.png")
        files[name] = str(folder / name)
    return pil, files


def main() -> None:
    torch.set_num_threads(1)
    import vidgen
    from diffusers import WanAnimatePipeline
    from vidgen.io import read_frames
    from vidgen.quiet import quiet_libraries
    from vidgen.tiny import TINY_FACE, build_tiny_pipeline

    quiet_libraries()
    tmp = Path(tempfile.mkdtemp())
    model = build_tiny_pipeline(tmp / "animate", "wan2.2-animate-14b")
    pipe = WanAnimatePipeline.from_pretrained(model)
    pipe.set_progress_bar_config(disable=True)
    for name, (frames, mode, segment, carried) in CASES.items():
        pil, files = _inputs(tmp / name.split(",")[0], frames, TINY_FACE)
        ratios, diff = [], 0.0
        for run in range(3):
            animate = {"mode": mode, "pose_video": files["pose"], "face_video": files["face"],
                       "segment_frames": segment, "overlap_frames": carried}
            if mode == "replace":
                animate.update(background_video=files["background"], mask_video=files["mask"])
            cfg = {"model": {"path": str(model), "device": "cpu"}, "prompt": "a fox dancing", "negative_prompt": "",
                   "image": files["image"], "size": f"{SIZE}x{SIZE}", "fps": 16, "seed": 7, "animate": animate,
                   "sampling": {"steps": 8, "guidance_scale": 1.0, "schedule": "diffusers", "checkpoint_every": 0},
                   "output": {"path": str(tmp / f"out{run}/"), "overwrite": True, "save_latents": False}}
            result = vidgen.render(cfg)
            ours = np.stack([np.asarray(f) for f in read_frames(result.path)]).astype(np.float64)
            t0 = time.perf_counter()
            theirs = pipe(image=pil["image"], pose_video=pil["pose"], face_video=pil["face"],
                          background_video=pil["background"] if mode == "replace" else None,
                          mask_video=[m.convert("L") for m in pil["mask"]] if mode == "replace" else None,
                          prompt="a fox dancing", negative_prompt="", height=SIZE, width=SIZE,
                          segment_frame_length=segment, prev_segment_conditioning_frames=carried,
                          num_inference_steps=8, guidance_scale=1.0, mode=mode,
                          generator=torch.Generator().manual_seed(7), output_type="np").frames[0]
            theirs_s = time.perf_counter() - t0
            diff = max(diff, float(np.abs(ours - theirs * 255).max()))
            ratios.append((result.timings["encode"] + result.timings["denoise"]) / theirs_s)
        print(f"{name}: max |vidgen - diffusers| = {diff:.3f} levels of 255; time vidgen/diffusers median "
              f"{statistics.median(ratios):.2f} (runs {', '.join(f'{r:.2f}' for r in ratios)})", flush=True)


if __name__ == "__main__":
    main()
