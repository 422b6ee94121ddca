"""The editing verbs on the control demo model: workflows/demo-edit.yaml (samples/demo-wan-control)
rendered for several seeds as a worker would, measured from the pixels of the written videos:

- extend: the extension's first N frames (its H.264 file) against the source's last N (the source's
  frames as kept, PNG): the codec's error, as the frames are kept bit for bit before it; the object's centroid step
  across the join against the source's median frame-to-frame step, for N = 5 (the workflow's) and
  N = 1 (a one-frame overlap, as image-to-video chaining gives), same seed;
- repaint: the kept (left) half of its H.264 file against the source's frames (mean absolute
  difference, 0-255: the codec's error); the repainted (right) half's object colour (prompt: blue)
  against the source's there (red).

    python bench/demo_edit.py --seeds 8
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

from bench.continuity import median_of  # noqa: E402
from vidgen.demo.metrics import OBJECT_DISTANCE, classify_colour  # noqa: E402
from vidgen.io import read_frames  # noqa: E402
from vidgen.paths import kept_frame_path  # noqa: E402


def _centroid(frame: np.ndarray) -> np.ndarray | None:
    x = frame.astype(np.float64)
    dist = np.linalg.norm(x - np.median(np.concatenate([x[:2].reshape(-1, 3), x[-2:].reshape(-1, 3)]), axis=0), axis=-1)
    mask = dist > OBJECT_DISTANCE
    if mask.sum() < 4:
        return None
    ys, xs = np.nonzero(mask)
    return np.array([xs.mean(), ys.mean()])


def _steps(frames: list[np.ndarray]) -> list[float | None]:
    c = [_centroid(f) for f in frames]
    return [float(np.linalg.norm(b - a)) if a is not None and b is not None else None for a, b in zip(c, c[1:])]


def _half_colour(frames: list[np.ndarray]) -> str:
    """The object's colour class in the right half (the repainted one), over the frames."""
    right = np.stack(frames)[:, :, 32:].reshape(-1, 3).astype(np.float64)
    core = right[np.linalg.norm(right, axis=-1) > OBJECT_DISTANCE]
    return classify_colour(np.median(core, axis=0)) if len(core) else "none"


def run(seeds: int) -> dict:
    import vidgen
    from vidgen.queue.workflow import load_workflow, plan_jobs

    logging.disable(logging.WARNING)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(ROOT)
        text = (ROOT / "workflows" / "demo-edit.yaml").read_text()
        for seed in range(seeds):
            row: dict = {"seed": seed}
            for keep in (5, 1):
                (Path(tmp) / "wf.yaml").write_text(text.replace("output_dir: outputs/demo-edit",
                                                                f"output_dir: {tmp}/s{seed}-{keep}")
                                                   .replace("frames: 5}", f"frames: {keep}}}"))
                wf = load_workflow(Path(tmp) / "wf.yaml", [f"seed={seed}"])
                for job in plan_jobs(wf):
                    if job.kind == "render" and (keep == 5 or "repaint" not in job.name):
                        vidgen.render(job.payload)
                source, extension, repaint = wf.shots
                src = [np.asarray(Image.open(kept_frame_path(Path(source.config.output.path), k)))   # lossless
                       for k in range(source.config.num_frames)]
                ext = list(read_frames(extension.config.output.path))
                inside = [s for s in _steps(src) if s is not None]
                join = _steps(ext[keep - 1:keep + 1])[0]
                row[f"extend{keep}"] = {"kept_codec_diff": float(np.abs(np.stack(ext[:keep]).astype(int)
                                                                       - np.stack(src[-keep:])).mean()),
                                        "join_step_px": join, "source_median_step_px": float(np.median(inside))}
                if keep == 5:
                    rep = list(read_frames(repaint.config.output.path))
                    kept = np.abs(np.stack(rep)[:, :, :24].astype(int) - np.stack(src)[:, :, :24]).mean()
                    row["repaint"] = {"kept_half_diff": float(kept), "repainted_colour": _half_colour(rep),
                                      "source_right_colour": _half_colour(src)}
            rows.append(row)
            print(json.dumps(row), flush=True)

    summary = {f"{k}.{m}": median_of(rows, k, m) for k in ("extend5", "extend1")
               for m in ("kept_codec_diff", "join_step_px", "source_median_step_px")}
    summary["repaint.kept_half_diff"] = median_of(rows, "repaint", "kept_half_diff")
    summary["repaint.blue"] = sum(r["repaint"]["repainted_colour"] == "blue" for r in rows) / len(rows)
    summary["source.right_red"] = sum(r["repaint"]["source_right_colour"] == "red" for r in rows) / len(rows)
    print(json.dumps({"seeds": seeds, **summary}))
    return summary


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=8)
    run(parser.parse_args().seeds)
