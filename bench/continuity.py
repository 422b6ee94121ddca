"""Does a shot carry over the cut? workflows/demo-continuity.yaml (the first-frame demo model,
samples/demo-wan-i2v): shot 2 continues from shot 1's last frame. For each seed this renders the
workflow's jobs as a worker would, then measures from the pixels, at the cut:

- the object's centroid in shot 1's last frame against shot 2's first frame (pixels apart);
- the object's colour (median of its core, RGB distance);
- shot 2's motion (the demo metrics' least-squares centroid track).

The baseline is shot 2 rendered from its prompt alone (no image), same seed.

    python bench/continuity.py --seeds 8
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vidgen.demo.metrics import OBJECT_DISTANCE, measure  # noqa: E402
from vidgen.io import read_frames  # noqa: E402


def _object(frame: np.ndarray) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(centroid (x, y), median core colour) of the object in one uint8 frame, or (None, None)."""
    x = frame.astype(np.float64)
    border = np.concatenate([x[:2].reshape(-1, 3), x[-2:].reshape(-1, 3), x[:, :2].reshape(-1, 3),
                             x[:, -2:].reshape(-1, 3)])
    dist = np.linalg.norm(x - np.median(border, axis=0), axis=-1)
    mask = dist > OBJECT_DISTANCE
    if mask.sum() < 4:
        return None, None
    ys, xs = np.nonzero(mask)
    core = mask & (dist >= np.median(dist[mask]))
    return np.array([xs.mean(), ys.mean()]), np.median(x[core], axis=0)


def median_of(rows: list[dict], which: str, key: str) -> float | None:
    """The median of rows[i][which][key] over the seeds that measured it (None: not measured), or None."""
    vals = [r[which][key] for r in rows if r[which][key] is not None]
    return float(np.median(vals)) if vals else None


def _cut(last: np.ndarray, clip: list[np.ndarray]) -> dict:
    (c0, rgb0), (c1, rgb1) = _object(last), _object(clip[0])
    if c0 is None or c1 is None:
        return {"centroid_px": None, "colour": None, "motion": measure(np.stack(clip))["motion"]}
    return {"centroid_px": float(np.linalg.norm(c0 - c1)), "colour": float(np.linalg.norm(rgb0 - rgb1)),
            "motion": measure(np.stack(clip))["motion"]}


def run(seeds: int) -> dict:
    import vidgen
    from vidgen.queue.workflow import load_workflow, plan_jobs

    logging.disable(logging.WARNING)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(ROOT)
        for seed in range(seeds):
            text = (ROOT / "workflows" / "demo-continuity.yaml").read_text()
            (Path(tmp) / "wf.yaml").write_text(text.replace("output_dir: outputs/demo-continuity",
                                                            f"output_dir: {tmp}/s{seed}"))
            wf = load_workflow(Path(tmp) / "wf.yaml", [f"seed={seed}"])
            jobs = [j for j in plan_jobs(wf) if j.kind == "render"]
            for job in jobs:
                vidgen.render(job.payload)
            first, second = wf.shots
            last = np.asarray(Image.open(second.config.image))
            cont = list(read_frames(second.config.output.path))
            free = dict(jobs[1].payload, image=None, output={**jobs[1].payload["output"],
                                                            "path": str(wf.output_dir / "free.mp4"), "keep_frames": []})
            vidgen.render(free)
            rows.append({"seed": seed, "continued": _cut(last, cont),
                         "from_prompt": _cut(last, list(read_frames(wf.output_dir / "free.mp4")))})
            print(json.dumps(rows[-1]), flush=True)

    summary = {which: {"median_centroid_px": median_of(rows, which, "centroid_px"),
                       "median_colour": median_of(rows, which, "colour"),
                       "moving_right": sum(r[which]["motion"] == "right" for r in rows) / len(rows)}
               for which in ("continued", "from_prompt")}
    print(json.dumps({"seeds": seeds, **summary}))
    return summary


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=8)
    run(parser.parse_args().seeds)
