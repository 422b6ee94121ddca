"""Frame-rate conversion for delivery (output.fps other than the rendered fps): output.retime.method.

The rendered clip of n frames at S fps lasts n / S seconds; the delivered one keeps that duration at T fps,
round(n * T / S) frames, output frame j standing at time j / T, which is rendered position p = j * S / T:
  duplicate  the rendered frame at or before p (no new pixels; 16 -> 24 fps repeats every other frame,
             a 2:1 cadence like a film pulldown)
  blend      frames floor(p) and floor(p) + 1 mixed by the distance (smooth cadence; fast motion ghosts)
Positions past the last rendered frame hold it. Frames stream through: two are held at most.
A learned interpolator (method interpolate) is refused by the config checks until vidgen carries one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from fractions import Fraction

import numpy as np


def retimed_count(frames: int, fps: int, to_fps: int) -> int:
    """Frames of a `frames`-long clip at `fps` delivered at `to_fps` (the duration kept, rounded)."""
    return max(1, round(Fraction(frames * to_fps, fps))) if frames else 0


def positions(frames: int, fps: int, to_fps: int) -> list[Fraction]:
    """Each delivered frame's position on the rendered clip (exact fractions, the last frame held)."""
    return [min(Fraction(j * fps, to_fps), Fraction(frames - 1)) for j in range(retimed_count(frames, fps, to_fps))]


def retime(frames: Iterable[np.ndarray], total: int, fps: int, to_fps: int, method: str) -> Iterator[np.ndarray]:
    """The delivered frames of a clip of `total` rendered frames (uint8 or uint16 [H, W, 3], in order)."""
    if method not in ("duplicate", "blend"):
        raise ValueError(f"retime method {method!r}: duplicate or blend")
    if to_fps == fps:
        yield from frames
        return
    source = iter(frames)
    index, here, after = -1, None, None     # rendered frames `index` and `index + 1`

    def advance() -> None:
        nonlocal index, here, after
        here, after = (after, None) if after is not None else (next(source), None)
        index += 1

    for p in positions(total, fps, to_fps):
        i = math.floor(p)
        while index < i:
            advance()
        a = p - i
        if method == "duplicate" or a == 0 or i + 1 >= total:
            yield here
            continue
        if after is None:
            after = next(source)
        mixed = (1 - float(a)) * here.astype(np.float32) + float(a) * after.astype(np.float32)
        yield np.rint(mixed).astype(here.dtype)
