"""Pixel metrics for demo clips: background, object colour, motion direction and shape.

Everything is measured from the frames alone, so the same code scores generated videos and the
procedural ground truth. Generated videos are blurry and slightly off-colour, so the object colour
is classified by hue and chroma (white is the only achromatic object colour) rather than by RGB
distance, and the object mask is soft: each pixel's distance from the background colour relative
to the object's.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from vidgen.demo.data import BACKGROUNDS, COLOURS, Combo
from vidgen.errors import InputError

ATTRIBUTES = ("colour", "shape", "motion", "background")
# A pixel belongs to the object when it is this far (RGB, 0-255) from the background colour.
OBJECT_DISTANCE = 60.0
# Fewer object pixels than this fraction of the frame: the object is missing in that frame.
MIN_OBJECT_FRACTION = 0.01
# Net centroid travel below this fraction of the frame size reads as "none".
MIN_MOTION_FRACTION = 0.08
# Below this chroma (max - min channel, 0-1) an object colour reads as white.
ACHROMATIC_CHROMA = 0.25
# Fill ratio of the bounding box: triangle 0.5, circle pi/4 ~ 0.785, square 1.0 (see measure).
SHAPE_THRESHOLDS = ((0.64, "triangle"), (0.90, "circle"), (float("inf"), "square"))


def to_frames(clip: np.ndarray | torch.Tensor) -> np.ndarray:
    """float32 [F, H, W, 3] in 0..255 from uint8 [F, H, W, 3] or a [-1, 1] clip [3, F, H, W]."""
    if isinstance(clip, torch.Tensor):
        clip = clip.detach().float().cpu().numpy()
    clip = np.asarray(clip)
    if clip.ndim != 4:
        raise InputError(f"expected one clip [F, H, W, 3] or [3, F, H, W], got shape {clip.shape}")
    if clip.dtype == np.uint8:
        if clip.shape[-1] != 3:
            raise InputError(f"uint8 clips must be [F, H, W, 3], got shape {clip.shape}")
        return clip.astype(np.float32)
    if clip.shape[0] != 3:
        raise InputError(f"float clips must be [3, F, H, W] in [-1, 1], got shape {clip.shape}")
    return np.clip((clip.transpose(1, 2, 3, 0) + 1.0) * 127.5, 0.0, 255.0).astype(np.float32)


def _nearest(rgb: np.ndarray, table: dict[str, tuple[int, int, int]]) -> str:
    names = list(table)
    d = np.linalg.norm(np.asarray([table[n] for n in names], np.float32) - rgb, axis=1)
    return names[int(np.argmin(d))]


def _hue_chroma(rgb: np.ndarray) -> tuple[float, float]:
    """(hue in degrees, chroma in 0..1) of one RGB colour in 0..255 (the HSV hexcone)."""
    r, g, b = (np.asarray(rgb, np.float64) / 255.0).tolist()
    mx, mn = max(r, g, b), min(r, g, b)
    c = mx - mn
    if c <= 1e-6:
        return 0.0, 0.0
    if mx == r:
        h = ((g - b) / c) % 6.0
    elif mx == g:
        h = (b - r) / c + 2.0
    else:
        h = (r - g) / c + 4.0
    return 60.0 * h, c


_CHROMATIC = {name: _hue_chroma(rgb)[0] for name, rgb in COLOURS.items()
              if _hue_chroma(rgb)[1] >= ACHROMATIC_CHROMA}
_ACHROMATIC = [name for name in COLOURS if name not in _CHROMATIC]


def classify_colour(rgb: np.ndarray) -> str:
    """Nearest vocabulary colour by hue; achromatic (low chroma) colours read as white."""
    hue, chroma = _hue_chroma(rgb)
    if chroma < ACHROMATIC_CHROMA:
        return _ACHROMATIC[0]
    diffs = {n: abs((hue - h + 180.0) % 360.0 - 180.0) for n, h in _CHROMATIC.items()}
    return min(diffs, key=diffs.get)


def measure(clip: np.ndarray | torch.Tensor) -> dict[str, Any]:
    """Background, object colour, motion and shape of one clip, from its pixels.

    Args:
        clip: uint8 [F, H, W, 3] or float [3, F, H, W] in [-1, 1].
    Returns:
        dict with "background", "colour", "motion" ("none" when the object is static or missing)
        and "shape" (None when there is no object), plus the raw "fill", "displacement" (dx, dy in
        pixels) and "object_fraction" behind them.
    """
    x = to_frames(clip)                                            # [F, H, W, 3]
    f, h, w, _ = x.shape
    border = np.concatenate([x[:, :2].reshape(-1, 3), x[:, -2:].reshape(-1, 3),
                             x[:, :, :2].reshape(-1, 3), x[:, :, -2:].reshape(-1, 3)])
    bg_rgb = np.median(border, axis=0)
    dist = np.linalg.norm(x - bg_rgb, axis=-1)                     # [F, H, W]
    mask = dist > OBJECT_DISTANCE
    counts = mask.sum(axis=(1, 2))                                 # [F]
    present = counts >= MIN_OBJECT_FRACTION * h * w
    out: dict[str, Any] = {"background": _nearest(bg_rgb, BACKGROUNDS), "colour": None,
                           "motion": "none", "shape": None, "fill": None, "hollow": None, "centre": None,
                           "displacement": (0.0, 0.0), "object_fraction": float(counts.mean() / (h * w))}
    if not present.any():
        return out

    # Colour: median of the object's core (the half farthest from the background: no blended edges).
    obj_dist = dist[mask]
    core = mask & (dist >= np.median(obj_dist))
    fg_rgb = np.median(x[core], axis=0)
    out["colour"] = classify_colour(fg_rgb)

    # Motion: least-squares slope of the centroid track over the frames holding the object.
    ys, xs = np.arange(h, dtype=np.float64), np.arange(w, dtype=np.float64)
    t = np.flatnonzero(present)
    m = mask[t].astype(np.float64)
    cx = (m.sum(axis=1) * xs).sum(axis=1) / counts[t]
    cy = (m.sum(axis=2) * ys).sum(axis=1) / counts[t]
    if len(t) >= 2:
        span = float(t[-1] - t[0])
        ddx, ddy = np.polyfit(t, cx, 1)[0] * span, np.polyfit(t, cy, 1)[0] * span
        out["displacement"] = (float(ddx), float(ddy))
        if np.hypot(ddx, ddy) >= MIN_MOTION_FRACTION * min(h, w):
            if abs(ddx) >= abs(ddy):
                out["motion"] = "right" if ddx > 0 else "left"
            else:
                out["motion"] = "down" if ddy > 0 else "up"

    # Shape: area over (tallest column x widest row) of the soft mask, on the largest frame that does
    # not touch the border. That is the bounding-box fill ratio for these convex shapes, but built
    # from sums, so blur and noise (which widen a bounding box) barely move it.
    fg_dist = max(float(np.linalg.norm(fg_rgb - bg_rgb)), 1.0)
    touches = mask[:, 0].any(1) | mask[:, -1].any(1) | mask[:, :, 0].any(1) | mask[:, :, -1].any(1)
    inside = present & ~touches
    pick = np.flatnonzero(inside if inside.any() else present)
    k = int(pick[np.argmax(counts[pick])])
    a = np.clip(dist[k] / fg_dist, 0.0, 1.5) * (dist[k] > OBJECT_DISTANCE / 2)   # [H, W]
    fill = float(a.sum() / max(a.sum(axis=0).max() * a.sum(axis=1).max(), 1e-6))
    out["fill"] = fill
    out["shape"] = next(name for limit, name in SHAPE_THRESHOLDS if fill < limit)

    # Hollow (the demo LoRA's outline style): on that frame, the 3x3 patch at the object's centroid is
    # nearer the background colour than the object's.
    mk = mask[k].astype(np.float64)
    yc, xc = int(round((mk.sum(1) * ys).sum() / mk.sum())), int(round((mk.sum(0) * xs).sum() / mk.sum()))
    patch = dist[k, max(0, yc - 1):yc + 2, max(0, xc - 1):xc + 2]
    out["centre"] = float(patch.mean() / fg_dist)
    out["hollow"] = out["centre"] < 0.5
    return out


def evaluate(clip: np.ndarray | torch.Tensor, combo: Combo) -> dict[str, Any]:
    """Per-attribute correctness of one clip against the combination it was asked for.

    Returns:
        {"colour": bool, "shape": bool, "motion": bool, "background": bool, "measured": measure(clip)}.
    """
    combo = Combo(*combo)
    got = measure(clip)
    result: dict[str, Any] = {a: got[a] == getattr(combo, a) for a in ATTRIBUTES}
    result["measured"] = got
    return result


def summarize(results: list[dict[str, Any]]) -> dict[str, float]:
    """Accuracy of each attribute over evaluate() results, plus "all" (every attribute right) and "n"."""
    n = len(results)
    if n == 0:
        return {**{a: float("nan") for a in ATTRIBUTES}, "all": float("nan"), "n": 0}
    acc = {a: sum(bool(r[a]) for r in results) / n for a in ATTRIBUTES}
    acc["all"] = sum(all(r[a] for a in ATTRIBUTES) for r in results) / n
    acc["n"] = n
    return acc
