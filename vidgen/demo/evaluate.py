"""Render prompts with the demo model and score the videos from their pixels.

    python -m vidgen.demo.evaluate                          # every held-out combination + 24 seen ones
    python -m vidgen.demo.evaluate --seeds 2 --json runs/demo/eval.json sampling.steps=20
    python -m vidgen.demo.evaluate --lora samples/demo-outline-lora.safetensors   # the LoRA at 0 and 1

Every held-out combination of the split (20% of colour x shape x motion x background, never seen
in training) and a sample of seen ones is rendered through the public API (`vidgen.Pipeline`,
loaded once, writing the configured mp4), the file is read back with PyAV, and the metrics of
`vidgen.demo.metrics` read the object's colour, its motion direction, the background and the
shape from the pixels. Prints a table per group and writes the per-clip results as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from .data import Combo, prompt_for, split
from .metrics import ATTRIBUTES, evaluate, summarize

TARGETS = {"colour": 0.90, "motion": 0.90, "background": 0.95}


def groups(seen: int = 24, sample_seed: int = 0) -> dict[str, list[Combo]]:
    """The held-out combinations and `seen` training combinations drawn with a fixed seed."""
    train, held_out = split(seed=0)
    rng = np.random.default_rng(sample_seed)
    picks = sorted(rng.choice(len(train), size=min(seen, len(train)), replace=False).tolist())
    return {"held-out": held_out, "seen": [train[i] for i in picks]}


def run(config: str | Path = "configs/demo.yaml", overrides: list[str] | None = None, *, seen: int = 24,
        seeds: tuple[int, ...] = (0,), combos: dict[str, list[Combo]] | None = None,
        progress: bool = True, strip_rows: int = 0) -> dict:
    """Render and score; returns {"groups": {name: summary}, "clips": [per-clip results], ...}.

    With `strip_rows`, the report's "strip" holds (label, frames) of that many clips of the first
    seed, spread evenly over the groups' combinations.
    """
    import vidgen
    from vidgen.io import read_frames

    combos = groups(seen) if combos is None else combos
    clips, strip, t_start = [], [], time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="vidgen-eval-") as tmp:
        pipe = vidgen.Pipeline.from_config(config, overrides=list(overrides or []) + [f"output.path={tmp}/x.mp4"])
        total = sum(len(c) for c in combos.values()) * len(seeds)
        for group, items in combos.items():
            for combo in items:
                for seed in seeds:
                    prompt = prompt_for(*combo)
                    out = Path(tmp) / f"{len(clips)}.mp4"
                    t0 = time.perf_counter()
                    result = pipe.generate(overrides=[f"prompt={prompt}", f"seed={seed}", f"output.path={out}",
                                                      "output.save_latents=false", "sampling.checkpoint_every=0"])
                    frames = np.stack(list(read_frames(result.path)))
                    scores = evaluate(frames, combo)
                    if strip_rows and seed == seeds[0]:
                        strip.append((f"{prompt} ({group})", frames))
                    clips.append({"group": group, "prompt": prompt, "seed": seed,
                                  "seconds": round(time.perf_counter() - t0, 2), **scores})
                    if progress:
                        wrong = [a for a in ATTRIBUTES if not scores[a]]
                        print(f"[{len(clips)}/{total}] {prompt} (seed {seed}): "
                              f"{'ok' if not wrong else 'wrong ' + ', '.join(wrong)}", file=sys.stderr)
    if strip_rows and len(strip) > strip_rows:
        strip = [strip[int(i)] for i in np.linspace(0, len(strip) - 1, strip_rows).round()]
    summary = {name: summarize([c for c in clips if c["group"] == name]) for name in combos}
    return {"config": str(config), "overrides": list(overrides or []), "seeds": list(seeds), "groups": summary,
            "minutes": round((time.perf_counter() - t_start) / 60, 2), "clips": clips, "strip": strip}


def save_strip(rows: list[tuple[str, np.ndarray]], path: Path, every: int = 4, scale: int = 2) -> None:
    """A PNG: one row per clip (every `every`-th frame, upscaled `scale`x) under its prompt."""
    from PIL import Image, ImageDraw

    label = 14
    tiles = []
    for prompt, frames in rows:
        row = np.concatenate(list(frames[::every]), 1).repeat(scale, 0).repeat(scale, 1)
        canvas = Image.new("RGB", (row.shape[1], row.shape[0] + label), (255, 255, 255))
        canvas.paste(Image.fromarray(row), (0, label))
        ImageDraw.Draw(canvas).text((2, 1), prompt, fill=(0, 0, 0))
        tiles.append(np.asarray(canvas))
    Image.fromarray(np.concatenate(tiles, 0)).save(path)


def table(report: dict) -> str:
    """A markdown table: one row per group, accuracy per attribute."""
    lines = ["| group | clips | colour | motion | background | shape |", "|---|---|---|---|---|---|"]
    for name, s in report["groups"].items():
        if not s["n"]:
            continue
        lines.append(f"| {name} | {s['n']} | " + " | ".join(f"{100 * s[a]:.0f}%" for a in
                                                            ("colour", "motion", "background", "shape")) + " |")
    return "\n".join(lines)


def meets_targets(report: dict) -> bool:
    held = report["groups"]["held-out"]
    return all(held[a] >= t for a, t in TARGETS.items())


def lora_table(reports: dict[float, dict]) -> str:
    """A markdown table of the demo LoRA's effect: per strength, how many clips draw hollow shapes
    (vidgen.demo.metrics: the object's centre nearer the background than the object colour) and the
    attribute accuracy, over every group rendered."""
    lines = ["| LoRA strength | clips | hollow (outline style) | colour | motion | background |",
             "|---|---|---|---|---|---|"]
    for strength, report in reports.items():
        clips = report["clips"]
        hollow = sum(bool(c["measured"]["hollow"]) for c in clips) / max(len(clips), 1)
        acc = {a: sum(bool(c[a]) for c in clips) / max(len(clips), 1) for a in ("colour", "motion", "background")}
        lines.append(f"| {strength:g} | {len(clips)} | {100 * hollow:.0f}% | " +
                     " | ".join(f"{100 * acc[a]:.0f}%" for a in ("colour", "motion", "background")) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m vidgen.demo.evaluate", description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", help="config overrides, key=value")
    parser.add_argument("--config", default="configs/demo.yaml")
    parser.add_argument("--seen", type=int, default=24, help="how many training combinations to render too")
    parser.add_argument("--seeds", type=int, default=1, help="seeds per combination (0, 1, ...)")
    parser.add_argument("--json", type=Path, default=None, help="write the full report here")
    parser.add_argument("--strip", type=Path, default=None, help="write a PNG frame strip here (first-seed clips spread over the groups)")
    parser.add_argument("--strip-rows", type=int, default=8)
    parser.add_argument("--lora", default=None, help="a LoRA file: render with it at each --lora-strengths and "
                                                     "print its effect (the demo's outline LoRA)")
    parser.add_argument("--lora-strengths", default="0,1")
    args = parser.parse_args(argv)
    if args.lora:
        reports = {}
        for strength in (float(v) for v in args.lora_strengths.split(",")):
            over = args.overrides + [f"loras=[{{path: {args.lora}, strength: {strength}}}]"]
            reports[strength] = run(args.config, over, seen=args.seen, seeds=tuple(range(args.seeds)),
                                    strip_rows=args.strip_rows if args.strip else 0)
            if args.strip:
                save_strip(reports[strength].pop("strip"), args.strip.with_name(
                    f"{args.strip.stem}-{strength:g}{args.strip.suffix}"))
            else:
                reports[strength].pop("strip")
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps({str(k): v for k, v in reports.items()}, indent=2))
        print(lora_table(reports))
        return
    report = run(args.config, args.overrides, seen=args.seen, seeds=tuple(range(args.seeds)),
                 strip_rows=args.strip_rows if args.strip else 0)
    strip = report.pop("strip")
    if args.strip:
        save_strip(strip, args.strip)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    print(table(report))
    targets = ", ".join(f"{a} >= {100 * t:.0f}%" for a, t in TARGETS.items())
    print(f"\n{len(report['clips'])} clips in {report['minutes']} min; held-out targets ({targets}): "
          f"{'met' if meets_targets(report) else 'NOT met'}")


if __name__ == "__main__":
    main()
