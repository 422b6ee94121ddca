"""The demo model's procedural data and pixel metrics: vocabulary, split, clips, metrics."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from vidgen.demo.data import (BACKGROUNDS, COLOURS, MOTIONS, SHAPES, Combo, all_combos, make_batch,
                              make_clip, parse_prompt, prompt_for, split)
from vidgen.demo.metrics import ATTRIBUTES, evaluate, measure, summarize
from vidgen.errors import InputError


def _object_fraction(clip: np.ndarray, combo: Combo) -> np.ndarray:
    """Per-frame fraction of pixels that differ from the background (edges included). [F]"""
    return (clip != np.asarray(BACKGROUNDS[combo.background], np.uint8)).any(-1).mean(axis=(1, 2))


def _degrade(clip: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A blurry, washed-out, noisy, colour-shifted copy: roughly what a small generator produces."""
    y = clip.astype(np.float32)
    for _ in range(2):                                   # 3x3 box blur, twice
        p = np.pad(y, ((0, 0), (1, 1), (1, 1), (0, 0)), mode="edge")
        y = sum(p[:, i:i + y.shape[1], j:j + y.shape[2]] for i in range(3) for j in range(3)) / 9
    y = 0.85 * y + 0.15 * 128 + rng.normal(0, 8, y.shape) + rng.uniform(-15, 15, 3)
    return np.clip(y, 0, 255).astype(np.uint8)


def test_vocabulary_and_prompt_round_trip():
    combos = all_combos()
    assert len(combos) == 5 * 3 * 4 * 2 == len(set(combos))
    assert prompt_for("red", "circle", "right", "black") == "a red circle moving right on a black background"
    for c in combos:
        assert parse_prompt(prompt_for(*c)) == c
    loose = "  A Yellow   SQUARE moving up on a GRAY background "
    assert parse_prompt(loose) == Combo("yellow", "square", "up", "gray")
    assert parse_prompt("a purple circle moving right on a black background") is None
    assert parse_prompt("a red circle") is None
    with pytest.raises(InputError, match="purple"):
        prompt_for("purple", "circle", "right", "black")


def test_split_sizes_determinism_and_coverage():
    train, held = split(seed=0)
    assert len(train) == 96 and len(held) == 24
    assert set(train) | set(held) == set(all_combos()) and not set(train) & set(held)
    assert split(seed=0) == (train, held)
    assert split(seed=1)[1] != held
    for seed in range(5):
        tr, _ = split(seed=seed)
        for k, vocab in enumerate((COLOURS, SHAPES, MOTIONS, BACKGROUNDS)):
            assert {c[k] for c in tr} == set(vocab)
    with pytest.raises(InputError):
        split(held_out=1.5)


def test_clip_shape_dtype_area_and_determinism():
    rng = np.random.default_rng(0)
    combo = Combo("blue", "triangle", "left", "gray")
    clip = make_clip(combo, rng)
    assert clip.shape == (17, 64, 64, 3) and clip.dtype == np.uint8
    assert np.array_equal(clip, make_clip(combo, np.random.default_rng(0)))
    # The object's own colour is drawn exactly; other values are edge blends with the background.
    assert (clip == np.asarray(COLOURS["blue"], np.uint8)).all(-1).mean() > 0.05
    fractions = []
    for c in all_combos() * 2:
        fractions.append(_object_fraction(make_clip(c, rng), c))
    fractions = np.concatenate(fractions)
    assert fractions.min() >= 0.08 and fractions.max() <= 0.30
    assert 0.12 <= fractions.mean() <= 0.22


def test_object_moves_in_the_named_direction():
    rng = np.random.default_rng(1)
    for c in all_combos():
        clip = make_clip(c, rng)
        obj = (clip != np.asarray(BACKGROUNDS[c.background], np.uint8)).any(-1)     # [F, H, W]
        ys, xs = np.nonzero(obj[0])
        ye, xe = np.nonzero(obj[-1])
        dx, dy = xe.mean() - xs.mean(), ye.mean() - ys.mean()
        ux, uy = MOTIONS[c.motion]
        along, across = (dx * ux + dy * uy), abs(dx * uy) + abs(dy * ux)
        assert along >= 10 and across < 1.0, (c, dx, dy)


def test_make_batch_convention():
    combos = all_combos()[:3]
    x, prompts = make_batch(combos, np.random.default_rng(0))
    assert x.shape == (3, 3, 17, 64, 64) and x.dtype == torch.float32
    assert x.min() >= -1.0 and x.max() <= 1.0
    assert prompts == [prompt_for(*c) for c in combos]
    # A [-1, 1] tensor clip measures the same as its uint8 frames.
    assert evaluate(x[0], combos[0])["measured"]["colour"] == combos[0].colour


def test_clip_generation_is_fast():
    rng = np.random.default_rng(0)
    combos = all_combos()[:40]
    t0 = time.perf_counter()
    for c in combos:
        make_clip(c, rng)
    per_clip = (time.perf_counter() - t0) / len(combos)
    assert per_clip < 0.02, f"{per_clip * 1e3:.1f} ms per clip"


def test_metrics_recover_ground_truth():
    rng = np.random.default_rng(2)
    combos = all_combos() * 2                            # 240 clips, every combination twice
    acc = summarize([evaluate(make_clip(c, rng), c) for c in combos])
    assert acc["n"] == 240
    assert acc["colour"] >= 0.99 and acc["background"] >= 0.99 and acc["motion"] >= 0.99
    assert acc["shape"] >= 0.90


def test_metrics_survive_blur_noise_and_colour_shift():
    rng = np.random.default_rng(3)
    combos = all_combos()
    acc = summarize([evaluate(_degrade(make_clip(c, rng), rng), c) for c in combos])
    assert acc["colour"] >= 0.95 and acc["background"] >= 0.95 and acc["motion"] >= 0.95
    assert acc["shape"] >= 0.80


def test_metrics_are_not_trivially_true():
    rng = np.random.default_rng(4)
    combo = Combo("white", "square", "down", "gray")
    clip = make_clip(combo, rng)
    assert all(evaluate(clip, combo)[a] for a in ATTRIBUTES)
    wrong = evaluate(clip, Combo("yellow", "circle", "up", "black"))
    assert not any(wrong[a] for a in ATTRIBUTES)
    # Same motion, other colours: classified as drawn, not as asked.
    for colour in COLOURS:
        drawn = Combo(colour, "circle", "left", "gray")
        assert measure(make_clip(drawn, rng))["colour"] == colour
    # A static clip has no motion; an empty one has no object at all.
    static = np.repeat(clip[8:9], 17, axis=0)
    assert measure(static)["motion"] == "none"
    empty = np.zeros_like(clip)
    got = measure(empty)
    assert got["motion"] == "none" and got["colour"] is None and got["shape"] is None
    assert got["background"] == "black"
    assert not evaluate(empty, Combo("red", "circle", "left", "black"))["colour"]
    # Reversing time reverses the direction.
    assert measure(clip[::-1])["motion"] == "up"
    assert summarize([])["n"] == 0
