"""Does the control decide where the object goes? samples/demo-wan-control with the sample control
(samples/control-path: a grey circle going round most of a circle) against the same model, prompt
and seed without control. Measured from the pixels, per seed:

- path error: the median over frames of the object centroid's distance (px) to the control
  silhouette's centroid in the same frame (a frame with no object counts 64 px);
- colour: the demo metrics' classification of the object's core colour against the prompt's;
- moves right: whether the demo metrics read the prompt's motion (the no-control render should).

Seed i asks for the i-th colour of the vocabulary (a circle moving right on black: the prompt's
motion is a straight line, the control a curve). Renders through diffusers' WanVACEPipeline on the
exported folder (`--via diffusers`), vidgen's own path on configs/demo-control.yaml (`--via vidgen`),
or both; the table gives the medians over seeds.

    python bench/demo_control.py --seeds 8 --via both
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vidgen.demo.control import centroids, path_error, read_control  # noqa: E402
from vidgen.demo.data import COLOURS, prompt_for  # noqa: E402
from vidgen.demo.metrics import measure  # noqa: E402

MODEL, CONFIG, CONTROL = ROOT / "samples/demo-wan-control", ROOT / "configs/demo-control.yaml", ROOT / "samples/control-path"
STEPS, GUIDANCE, LENGTH = 20, 5.0, 16       # configs/demo.yaml's sampling and max_sequence_length


def _diffusers(model: Path):
    """render(prompt, seed, control frames or None) -> uint8 [F, H, W, 3], via WanVACEPipeline."""
    import torch
    from diffusers import WanVACEPipeline
    from PIL import Image

    pipe = WanVACEPipeline.from_pretrained(model)
    pipe.set_progress_bar_config(disable=True)

    def render(prompt: str, seed: int, control: np.ndarray | None) -> np.ndarray:
        video = None if control is None else [Image.fromarray(f) for f in control]
        out = pipe(prompt=prompt, negative_prompt="", video=video, height=64, width=64, num_frames=len(CONTROL_FRAMES),
                   num_inference_steps=STEPS, guidance_scale=GUIDANCE, max_sequence_length=LENGTH,
                   generator=torch.Generator().manual_seed(seed), output_type="np").frames[0]
        return np.rint(np.clip(out, 0, 1) * 255).astype(np.uint8)
    return render


def _vidgen(tmp: Path):
    """render(prompt, seed, control frames or None) -> uint8 [F, H, W, 3], via vidgen.render."""
    import vidgen
    from vidgen.io import read_frames

    def render(prompt: str, seed: int, control: np.ndarray | None) -> np.ndarray:
        out = tmp / f"{seed}-{control is not None}.mp4"
        over = {"prompt": prompt, "seed": seed, "output.path": str(out), "output.overwrite": True}
        if control is None:
            over["control.video"] = None
        vidgen.render(str(CONFIG), **over)
        return np.stack(list(read_frames(out)))
    return render


def _row(render, seed: int) -> dict:
    colour = list(COLOURS)[seed % len(COLOURS)]
    prompt = prompt_for(colour, "circle", "right", "black")
    row = {"seed": seed, "prompt": prompt}
    for name, control in (("control", CONTROL_FRAMES), ("none", None)):
        clip = render(prompt, seed, control)
        got = measure(clip)
        row[name] = {"path_px": path_error(clip, PATH), "colour_ok": got["colour"] == colour,
                     "moves_right": got["motion"] == "right"}
    return row


def run(seeds: int, via: str) -> dict:
    logging.disable(logging.WARNING)
    table = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in (["diffusers", "vidgen"] if via == "both" else [via]):
            try:
                render = _diffusers(MODEL) if name == "diffusers" else _vidgen(Path(tmp))
                rows = [_row(render, s) for s in range(seeds)]
            except Exception as exc:   # report a path that does not work, and go on with the other
                table[name] = {"error": f"{type(exc).__name__}: {exc}"}
                print(json.dumps({name: table[name]}), flush=True)
                continue
            for r in rows:
                print(json.dumps({"via": name, **r}), flush=True)
            table[name] = {k: {"median_path_px": float(np.median([r[k]["path_px"] for r in rows])),
                               "colour_accuracy": sum(r[k]["colour_ok"] for r in rows) / len(rows),
                               "moves_right": sum(r[k]["moves_right"] for r in rows) / len(rows)}
                           for k in ("control", "none")}
    print(f"\n{'renderer':<10} {'control':<8} {'median path error (px)':>23} {'colour accuracy':>16} {'moves right':>12}")
    for name, res in table.items():
        if "error" in res:
            print(f"{name:<10} {'-':<8} {res['error'][:60]}")
            continue
        for k in ("control", "none"):
            print(f"{name:<10} {k:<8} {res[k]['median_path_px']:>23.1f} {res[k]['colour_accuracy']:>16.2f} {res[k]['moves_right']:>12.2f}")
    print(json.dumps({"seeds": seeds, **table}))
    return table


CONTROL_FRAMES = read_control(CONTROL)
PATH = centroids(CONTROL_FRAMES)

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--via", choices=("diffusers", "vidgen", "both"), default="both")
    args = parser.parse_args()
    run(args.seeds, args.via)
