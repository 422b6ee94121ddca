"""The shipped demo model (samples/demo-wan): loads like real weights, renders what the prompt asks.

A fast version of `python -m vidgen.demo.evaluate`: four held-out prompts (never seen in
training) covering four colours, all four motions, both backgrounds and three shapes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from vidgen.demo.data import Combo, split
from vidgen.demo.evaluate import run, table

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "samples" / "demo-wan"

FOUR = [Combo("green", "circle", "left", "gray"), Combo("blue", "triangle", "down", "black"),
        Combo("yellow", "circle", "right", "gray"), Combo("white", "square", "up", "black")]


def test_four_prompts_are_held_out():
    _, held_out = split(seed=0)
    assert all(c in held_out for c in FOUR)
    assert {c.motion for c in FOUR} == {"left", "right", "up", "down"}


def test_demo_folder_loads_through_the_public_loader():
    from vidgen.loading import inspect_model

    info = inspect_model(DEMO)
    assert info.variant == "wan2.1-t2v"
    # No special case: nothing outside vidgen/demo knows the demo folder exists.
    for source in (ROOT / "vidgen").rglob("*.py"):
        if "demo" not in source.parts:
            assert "demo-wan" not in source.read_text(), source


def test_demo_renders_four_held_out_prompts():
    report = run(ROOT / "configs" / "demo.yaml", combos={"held-out": FOUR}, seeds=(0,), progress=False)
    held = report["groups"]["held-out"]
    print(table(report))
    assert held["n"] == 4
    assert held["colour"] >= 0.75 and held["motion"] >= 0.75 and held["background"] == 1.0, table(report)
