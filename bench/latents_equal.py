"""Fixed-seed latents of this tree against another commit's, for every tiny test config: torch.equal or not.

A refactor must leave sampling bit for bit as it was. This script builds one tiny random-weight model
per variant (with this tree's vidgen.tiny, once, so both sides read the same files), renders each case
with this tree and with the other commit's tree (a `git worktree` of it, its package first on
PYTHONPATH), and compares the saved latents with torch.equal.

    python bench/latents_equal.py --base HEAD~3               # this working tree against HEAD~3
    python bench/latents_equal.py --base 89e6108 --json eq.json

Cases: every variant (both experts, I2V with an image, TI2V-5B with and without one, FLF2V with a
last frame) x the three solvers, and the memory plan's placements and fp8 storage on two of them,
with classifier-free guidance, on the CPU in float32 with one torch thread (thread counts change
the order of full reductions). Exit code 1 if any case differs or
fails on either side. Real widths are not needed: the code paths are the same at any width.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (name, variant, first_last, extra config): the solvers on every variant, images where they apply
SOLVERS = ("unipc", "dpmpp", "euler")
VARIANTS = (("t2v", "wan2.1-t2v", False, {}), ("i2v", "wan2.1-i2v", False, {"image": "IMAGE"}),
            ("flf2v", "wan2.1-i2v", True, {"image": "IMAGE", "last_image": "IMAGE"}),
            ("a14b", "wan2.2-t2v-a14b", False, {}), ("i2v-a14b", "wan2.2-i2v-a14b", False, {"image": "IMAGE"}),
            ("ti2v", "wan2.2-ti2v-5b", False, {}), ("ti2v-image", "wan2.2-ti2v-5b", False, {"image": "IMAGE"}))
# The memory plan's ways of holding the weights (UniPC): each changes where weights live, never the numbers
# (fp8 storage does change them: both sides must store the same tensors in float8).
MEMORY = (("a14b", {"placement": "swap_experts"}), ("a14b", {"placement": "stream_blocks"}),
          ("a14b", {"weights": "fp8"}), ("a14b", {"placement": "stream_blocks", "weights": "fp8"}),
          ("ti2v-image", {"weights": "fp8"}))

RENDER = r"""
import json, sys, hashlib
import torch
torch.set_num_threads(1)
from safetensors.torch import load_file
import vidgen
cases = json.loads(sys.argv[1])
out = {}
for name, case in cases.items():
    try:
        result = vidgen.render(case["config"])
        latents = load_file(str(result.latents_path))["latents"]
        torch.save(latents, case["save"])
        out[name] = hashlib.sha256(latents.numpy().tobytes()).hexdigest()[:16]
    except Exception as e:  # reported per case: the other cases still run
        out[name] = f"error: {type(e).__name__}: {str(e)[:200]}"
print("RESULT " + json.dumps(out))
"""


def cases(models: dict[tuple[str, bool], Path], image: Path, out: Path) -> dict[str, dict]:
    found = {}
    for name, variant, first_last, extra in VARIANTS:
        for solver in SOLVERS:
            cfg = {"model": {"path": str(models[variant, first_last]), "device": "cpu", "dtype": "float32"},
                   "prompt": "a red circle moving right on a black background", "negative_prompt": "blurry",
                   "size": "64x64", "num_frames": 9, "fps": 8, "seed": 7,
                   "sampling": {"steps": 4, "guidance_scale": 4.0, "solver": solver},
                   "output": {"path": str(out / f"{name}-{solver}" / "clip.mp4")}}
            cfg.update({k: str(image) if v == "IMAGE" else v for k, v in extra.items()})
            found[f"{name}-{solver}"] = cfg
    for name, memory in MEMORY:
        cfg = json.loads(json.dumps(found[f"{name}-unipc"]))
        tag = "-".join(f"{v}" for v in memory.values())
        cfg["memory"] = memory
        cfg["output"]["path"] = str(out / f"{name}-{tag}" / "clip.mp4")
        found[f"{name}-{tag}"] = cfg
    return found


def run(tree: Path, todo: dict[str, dict], save: Path) -> dict[str, str]:
    """Render `todo` with the vidgen of `tree` (first on PYTHONPATH) in a fresh process."""
    save.mkdir(parents=True, exist_ok=True)
    todo = {n: {"config": c, "save": str(save / f"{n}.pt")} for n, c in todo.items()}
    # Only the package goes on the path (a folder holding a link to it): an older tree's root may hold
    # a kernels/__init__.py, which would shadow Hugging Face's `kernels` that transformers imports.
    path = save.parent / f"path-{save.name}"
    path.mkdir(exist_ok=True)
    (path / "vidgen").symlink_to(tree / "vidgen", target_is_directory=True)
    env = {**os.environ, "PYTHONPATH": str(path), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", RENDER, json.dumps(todo)], capture_output=True, text=True, env=env,
                          cwd=save, timeout=1800)
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(f"{tree}: the renders did not finish (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(line.removeprefix("RESULT "))


def main() -> int:
    import torch
    from PIL import Image

    sys.path.insert(0, str(ROOT))
    from vidgen.tiny import build_tiny_pipeline

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the commit to compare with (anything git rev-parse takes)")
    ap.add_argument("--json", help="write the per-case results here")
    args = ap.parse_args()
    rev = subprocess.run(["git", "rev-parse", "--verify", args.base + "^{commit}"], capture_output=True, text=True,
                         cwd=ROOT)
    if rev.returncode:
        raise SystemExit(f"--base {args.base}: not a commit here")
    with tempfile.TemporaryDirectory(prefix="vidgen-latents-equal-") as tmp:
        tmp = Path(tmp)
        base = tmp / "base"
        subprocess.run(["git", "worktree", "add", "--detach", "--quiet", str(base), rev.stdout.strip()], cwd=ROOT,
                       check=True)
        try:
            models = {(v, fl): build_tiny_pipeline(tmp / "models" / f"{v}{'-flf' if fl else ''}", v, seed=0, first_last=fl)
                      for _, v, fl, _ in VARIANTS}
            image = tmp / "first.png"
            Image.new("RGB", (80, 64), (200, 40, 40)).save(image)
            results = {}
            for side, tree in (("this", ROOT), ("base", base)):
                results[side] = run(tree, cases(models, image, tmp / "out" / side), tmp / "latents" / side)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, check=False)
        rows, bad = [], 0
        for name in results["this"]:
            a, b = results["this"][name], results["base"].get(name, "missing")
            if a.startswith("error") or b.startswith("error"):
                same = "error"
            else:
                same = "equal" if torch.equal(torch.load(tmp / "latents" / "this" / f"{name}.pt", weights_only=True),
                                              torch.load(tmp / "latents" / "base" / f"{name}.pt", weights_only=True)) \
                    else "DIFFERENT"
            bad += same != "equal"
            rows.append({"case": name, "this": a, "base": b, "result": same})
            print(f"{name:22s} {same:9s} this {a[:60]}  base {b[:60]}")
    print(f"{len(rows) - bad} of {len(rows)} cases torch.equal to {args.base}")
    if args.json:
        Path(args.json).write_text(json.dumps({"base": args.base, "cases": rows}, indent=2))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
