"""Procedural clips for the demo model: one shape moving across a plain background.

The vocabulary is fixed so prompts are predictable, and 20% of the colour x shape x motion x
background combinations are held out of training (`split`) to measure generalisation. Clips are
drawn from a signed distance per pixel, all frames at once, so a 17x64x64 clip takes a few ms.
Edges are antialiased by area coverage; inside the object the colour is exactly the vocabulary's.
"""

from __future__ import annotations

import itertools
import re
from typing import NamedTuple

import numpy as np
import torch

from vidgen.errors import InputError

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (230, 30, 30),
    "green": (30, 200, 40),
    "blue": (40, 70, 230),
    "yellow": (240, 220, 30),
    "white": (245, 245, 245),
}
SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
MOTIONS: dict[str, tuple[int, int]] = {  # unit step (dx, dy) in image coordinates (y down)
    "left": (-1, 0),
    "right": (1, 0),
    "up": (0, -1),
    "down": (0, 1),
}
BACKGROUNDS: dict[str, tuple[int, int, int]] = {
    "black": (0, 0, 0),
    "gray": (128, 128, 128),
}

# Object area as a fraction of the frame, drawn per clip (roughly 10-25%).
AREA_RANGE = (0.12, 0.20)
# How far (fraction of its extent along the motion) the object may leave the frame at either end.
OVERHANG = 0.15
# Shortest travel over the clip, as a fraction of the frame size: clearly visible motion.
MIN_TRAVEL = 0.22


class Combo(NamedTuple):
    """One point of the vocabulary: what a prompt asks for."""

    colour: str
    shape: str
    motion: str
    background: str


def prompt_for(colour: str, shape: str, motion: str, background: str) -> str:
    """The demo's prompt template: 'a red circle moving right on a black background'."""
    combo = Combo(colour, shape, motion, background)
    _check_combo(combo)
    return f"a {colour} {shape} moving {motion} on a {background} background"


_PROMPT_RE = re.compile(r"^an? (\w+) (\w+) moving (\w+) on an? (\w+) background\.?$")


def parse_prompt(text: str) -> Combo | None:
    """Inverse of prompt_for, tolerant of case and extra spaces; None if it is not in the vocabulary."""
    m = _PROMPT_RE.match(" ".join(text.lower().split()))
    if m is None:
        return None
    combo = Combo(*m.groups())
    if (combo.colour not in COLOURS or combo.shape not in SHAPES or combo.motion not in MOTIONS
            or combo.background not in BACKGROUNDS):
        return None
    return combo


def all_combos() -> list[Combo]:
    """Every combination of the vocabulary (5 * 3 * 4 * 2 = 120), in a fixed order."""
    return [Combo(*c) for c in itertools.product(COLOURS, SHAPES, MOTIONS, BACKGROUNDS)]


def split(seed: int = 0, held_out: float = 0.2) -> tuple[list[Combo], list[Combo]]:
    """Deterministic (train, held_out) split of all_combos().

    Every colour, shape, motion and background value keeps at least one training combination, and
    the held-out set is spread over the values as evenly as a random draw allows: candidates are
    redrawn (from the same seeded generator) until both hold.
    """
    if not 0.0 < held_out < 1.0:
        raise InputError(f"held_out must be in (0, 1), got {held_out}")
    combos = all_combos()
    n_out = round(len(combos) * held_out)
    rng = np.random.default_rng(seed)
    for _ in range(10_000):
        order = rng.permutation(len(combos))
        out = sorted(order[:n_out].tolist())
        held = set(out)
        train = [c for i, c in enumerate(combos) if i not in held]
        if _covers(train) and _balanced([combos[i] for i in out], n_out):
            return train, [combos[i] for i in out]
    raise InputError(f"no split with held_out={held_out} keeps every vocabulary value in training")


def _covers(combos: list[Combo]) -> bool:
    vocab = (COLOURS, SHAPES, MOTIONS, BACKGROUNDS)
    return all({c[k] for c in combos} == set(vocab[k]) for k in range(4))


def _balanced(held: list[Combo], n_out: int) -> bool:
    # Each value may be held out at most ~1.5x its fair share, so no value is mostly unseen.
    vocab = (COLOURS, SHAPES, MOTIONS, BACKGROUNDS)
    for k in range(4):
        cap = int(np.ceil(1.5 * n_out / len(vocab[k])))
        counts = [sum(c[k] == v for c in held) for v in vocab[k]]
        if max(counts) > cap:
            return False
    return True


def _check_combo(combo: Combo) -> None:
    problems = []
    for name, value, allowed in zip(Combo._fields, combo, (COLOURS, SHAPES, MOTIONS, BACKGROUNDS)):
        if value not in allowed:
            problems.append(f"{name}={value!r} (allowed: {', '.join(allowed)})")
    if problems:
        raise InputError("not in the demo vocabulary: " + "; ".join(problems))


def _extent(shape: str, area: float) -> tuple[float, float]:
    """(width, height) in pixels of a shape of the given area."""
    if shape == "circle":
        d = 2.0 * np.sqrt(area / np.pi)
        return d, d
    if shape == "square":
        s = np.sqrt(area)
        return s, s
    b = np.sqrt(2.0 * area)  # isosceles triangle with base == height, pointing up
    return b, b


def _sdf(shape: str, dx: np.ndarray, dy: np.ndarray, w: float) -> np.ndarray:
    """Signed distance (negative inside, roughly Euclidean near the edge) of a centred shape."""
    if shape == "circle":
        return np.sqrt(dx * dx + dy * dy) - w / 2
    if shape == "square":
        return np.maximum(np.abs(dx), np.abs(dy)) - w / 2
    h = w  # base b == height h == w; apex at (0, -h/2), base at y = +h/2
    norm = np.sqrt(h * h + (w / 2) ** 2)
    side = (np.abs(dx) * h - (dy + h / 2) * (w / 2)) / norm
    return np.maximum(side, dy - h / 2)


def make_clip(combo: Combo, rng: np.random.Generator, size: int = 64, frames: int = 17,
              outline: float = 0.0) -> np.ndarray:
    """One clip of `combo`, with a random object size, start position and speed.

    Args:
        combo: what to draw (see Combo).
        rng: the generator every random choice is drawn from (seeded by the caller).
        size: frame height and width in pixels.
        frames: number of frames.
        outline: > 0 draws only the shape's outline, this many pixels wide, inside its edge (the
            demo LoRA's style); 0 = filled.
    Returns:
        uint8 array [F, H, W, 3].
    """
    combo = Combo(*combo)
    _check_combo(combo)
    if size < 16 or frames < 2:
        raise InputError(f"make_clip needs size >= 16 and frames >= 2, got size={size}, frames={frames}")
    area = rng.uniform(*AREA_RANGE) * size * size
    w, h = _extent(combo.shape, area)
    mdx, mdy = MOTIONS[combo.motion]
    along, across = (w, h) if mdx else (h, w)
    # Centre range along the motion, letting OVERHANG of the object leave the frame at the ends.
    lo, hi = along / 2 - OVERHANG * along, size - along / 2 + OVERHANG * along
    travel = rng.uniform(max(MIN_TRAVEL * size, 0.5 * (hi - lo)), hi - lo)
    start = rng.uniform(lo, hi - travel)
    pos = start + travel * np.linspace(0.0, 1.0, frames)         # [F]
    if mdx < 0 or mdy < 0:
        pos = lo + hi - pos
    perp = np.full(frames, rng.uniform(across / 2, size - across / 2))
    cx, cy = (pos, perp) if mdx else (perp, pos)

    coords = np.arange(size, dtype=np.float32) + 0.5              # pixel centres
    dx = coords[None, None, :] - cx[:, None, None].astype(np.float32)  # [F, 1, W]
    dy = coords[None, :, None] - cy[:, None, None].astype(np.float32)  # [F, H, 1]
    sdf = _sdf(combo.shape, dx, dy, w)
    if outline > 0:         # a band `outline` px wide just inside the edge
        sdf = np.abs(sdf + outline / 2) - outline / 2
    alpha = np.clip(0.5 - sdf, 0.0, 1.0)[..., None]  # [F, H, W, 1]
    bg = np.asarray(BACKGROUNDS[combo.background], np.float32)
    fg = np.asarray(COLOURS[combo.colour], np.float32)
    clip = bg + alpha * (fg - bg)
    return np.rint(clip).astype(np.uint8)


def make_batch(combos: list[Combo], rng: np.random.Generator, size: int = 64,
               frames: int = 17, outline: float = 0.0) -> tuple[torch.Tensor, list[str]]:
    """Clips for `combos` in the VAE's convention, and their prompts.

    Returns:
        (clips, prompts): float32 tensor [B, 3, F, H, W] in [-1, 1], and B prompt strings.
    """
    clips = np.stack([make_clip(c, rng, size, frames, outline) for c in combos])   # [B, F, H, W, 3]
    x = torch.from_numpy(clips).permute(0, 4, 1, 2, 3).float() / 127.5 - 1.0
    return x.contiguous(), [prompt_for(*c) for c in combos]
