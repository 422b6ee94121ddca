"""Do a long take's joins hold? A 5-window take of "a red circle moving right" with the first-frame demo
model (samples/demo-wan-i2v, TI2V-style: clean latent frames) or the control demo (--model control,
samples/demo-wan-control: VACE keeps the frames as given), its windows sharing K = 1 frame or K = 5,
rendered as a worker would for several seeds and measured from the film's
pixels (the stitch: every frame once):

- the stutter: the object's centroid step across each join (the first generated frame of a window
  against the frame before it) over the median step inside the windows;
- the colour drift: the object's core colour (RGB distance, 0-441) in the take's last frame against
  its first frame.

    python bench/long_take.py --seeds 8 [--model control] [--fuse]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.continuity import _object, median_of  # noqa: E402
from vidgen.io import read_frames  # noqa: E402

WINDOW = 17         # the demo's clip


MODELS = {"first-frame": "config: configs/demo.yaml, model.path: samples/demo-wan-i2v",
          "control": "config: configs/demo-control.yaml, control.video: null"}   # VACE: the kept frames as given


def _take(tmp: Path, seed: int, overlap: int, model: str = "first-frame",
          fuse: str = "none") -> tuple[list[np.ndarray], list[int]]:
    """(the stitched take's frames, the film index of each window's first generated frame)."""
    import vidgen
    from vidgen.queue.steps import run_stitch
    from vidgen.queue.workflow import load_workflow, plan_jobs

    total = WINDOW + 4 * (WINDOW - overlap)             # 5 windows
    path = tmp / f"take-{seed}-{overlap}.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: take
        output_dir: {tmp}/{model}-{fuse}-s{seed}-k{overlap}
        defaults: {{{MODELS[model]}, seed: {seed}, output.codec: png}}
        shots:
          - {{name: take, prompt: a red circle moving right on a black background, num_frames: {total},
             continuity: {{window_frames: {WINDOW}, overlap_frames: {overlap}, fuse: {fuse}}}}}
        steps:
          stitch: {{output: film}}
        """))
    wf = load_workflow(path)
    for job in plan_jobs(wf):
        vidgen.render(job.payload) if job.kind == "render" else run_stitch(job.payload)
    joins = [WINDOW + k * (WINDOW - overlap) for k in range(4)]
    return list(read_frames(wf.output_dir / "film")), joins


def measure(frames: list[np.ndarray], joins: list[int]) -> dict:
    objects = [_object(f) for f in frames]
    steps = [float(np.linalg.norm(b[0] - a[0])) if a[0] is not None and b[0] is not None else None
             for a, b in zip(objects, objects[1:])]            # steps[i]: frame i -> i + 1
    across = [steps[j - 1] for j in joins if steps[j - 1] is not None]
    inside = [s for i, s in enumerate(steps) if s is not None and i + 1 not in joins]
    first, last = objects[0][1], objects[-1][1]
    return {"join_step": float(np.median(across)) if across else None, "inside_step": float(np.median(inside)),
            "stutter": float(np.median(across) / np.median(inside)) if across else None,
            "drift": float(np.linalg.norm(last - first)) if first is not None and last is not None else None}


def run(seeds: int, model: str = "first-frame", fuse: bool = False) -> dict:
    logging.disable(logging.WARNING)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(ROOT)
        for seed in range(seeds):
            row = {"seed": seed}
            for k in (1, 5):
                row[f"k{k}"] = measure(*_take(Path(tmp), seed, k, model))
            if fuse:        # the same K = 5 take, its shared frames blended in the stitch
                row["k5_linear"] = measure(*_take(Path(tmp), seed, 5, model, "linear"))
            rows.append(row)
            print(json.dumps(row), flush=True)

    summary = {k: {m: median_of(rows, k, m) for m in ("join_step", "inside_step", "stutter", "drift")}
               for k in ("k1", "k5") + (("k5_linear",) if fuse else ())}
    summary["k5_smoother_seeds"] = sum((r["k5"]["stutter"] or 1e9) < (r["k1"]["stutter"] or 1e9) for r in rows)
    print(json.dumps({"seeds": seeds, **summary}))
    return summary


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--model", choices=list(MODELS), default="first-frame",
                        help="the first-frame demo (TI2V-style) or the control demo (VACE: windows keep the frames as given)")
    parser.add_argument("--fuse", action="store_true", help="also K = 5 with continuity.fuse: linear")
    args = parser.parse_args()
    run(args.seeds, args.model, args.fuse)
