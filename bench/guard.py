"""Guard benchmark: frame classifier throughput per backend, and the guard's share of a render.

    python bench/guard.py classifier                  # open_nsfw frames/s: torch eager vs onnxruntime (CPU)
    python bench/guard.py classifier --device cuda    # + TensorRT where it imports, torch on CUDA
    python bench/guard.py render                      # the demo render with and without the guard
    python bench/guard.py all --json results.json

`classifier`: the same 720p uint8 frames through `vidgen.guard`'s preprocessing and each backend
(chosen explicitly, so a missing one is reported, not skipped silently), batch sizes 1 and 8;
frames/s = frames / median wall time of a batch after a warm-up. `render`: configs/demo.yaml
(17 frames, 64x64) rendered twice per setting in one process, the guard off, then on with every
check (auto backend); the guard's share = (on - off) / on of the median render time. Figures go to
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _time(fn, reps: int, warmup: int = 3) -> float:
    for _ in range(warmup):                                  # session creation, oneDNN primitives
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_classifier(args) -> list[dict]:
    from vidgen.config import GuardConfig
    from vidgen.errors import VidgenError
    from vidgen.guard import load_classifier

    device = torch.device(args.device)
    frames = torch.randint(0, 256, (8, 720, 1280, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    rows = []
    names = ["torch", "onnxruntime"] + (["tensorrt"] if device.type == "cuda" else [])
    for name in names:
        try:      # no `chosen` cache: each backend is loaded afresh
            clf = load_classifier(GuardConfig(enabled=True, backend=name, precision=args.precision), device)
        except VidgenError as e:
            rows.append({"backend": name, "error": str(e)})
            print(f"{name}: not available ({e})")
            continue
        for batch in (1, 8):
            t = _time(lambda: clf.scores(frames[:batch]), args.reps)
            row = {"backend": name, "detail": getattr(clf.backend, "detail", ""), "device": str(device),
                   "batch": batch, "seconds_per_batch": t, "frames_per_s": batch / t, "threads": torch.get_num_threads()}
            rows.append(row)
            print(f"{name:12s} batch {batch}: {batch / t:7.1f} frames/s ({t * 1000:.0f} ms a batch)")
    return rows


def bench_render(args) -> list[dict]:
    from vidgen.pipeline import render

    base = ROOT / "configs" / "demo.yaml"
    rows = []
    settings = {"off": ["guard.enabled=false"], "on": ["guard.enabled=true"]}
    for label, over in settings.items():
        times = []
        for rep in range(args.reps):
            out = Path("/tmp") / f"vidgen-bench-guard-{label}-{rep}.mp4"
            t0 = time.perf_counter()
            render(str(base), overrides=[*over, f"output.path={out}", "output.overwrite=true", "seed=1"])
            times.append(time.perf_counter() - t0)
        rows.append({"guard": label, "render_s": statistics.median(times), "times": times})
        print(f"guard {label}: {statistics.median(times):.2f} s a render (median of {args.reps})")
    on, off = rows[1]["render_s"], rows[0]["render_s"]
    share = (on - off) / on
    rows.append({"guard_share_of_render": share})
    print(f"the guard's share of the render: {share:.1%}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["classifier", "render", "all"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="fp16", choices=["fp16", "fp32"])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    rows = {}
    if args.what in ("classifier", "all"):
        rows["classifier"] = bench_classifier(args)
    if args.what in ("render", "all"):
        rows["render"] = bench_render(args)
    if args.json:
        Path(args.json).write_text(json.dumps({"torch": torch.__version__, **rows}, indent=2))


if __name__ == "__main__":
    main()
