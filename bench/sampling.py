"""Sampling benchmark: vidgen's denoising loop vs diffusers' WanPipeline, compile cold start, speed knobs.

A small-but-not-trivial random-weight Wan2.1-style model (transformer dim 256, 4 layers; tiny text
encoder and VAE from vidgen.tiny) at a 5x24x24 latent (17 frames, 192x192), so one step (two model
calls: cond + uncond) takes well over 50 ms on CPU. Only the denoising loop is timed: both sides
report a timestamp after every step (vidgen: the Progress callback; diffusers: callback_on_step_end)
and per-step time = (t_last - t_first) / (steps - 1); the median over repeats, after a warm-up.
vidgen runs with sampling.schedule=diffusers, so both walk the same sigmas with the same solver.

    python bench/sampling.py loop                      # ours vs diffusers, per-step ratio
    python bench/sampling.py compile                   # cold start + steady step, compile none/blocks/full
    python bench/sampling.py knobs                     # attention backends and step caches, per step
    python bench/sampling.py all --json results.jsonl
    python bench/sampling.py all --device cuda          # bfloat16 on the GPU

Each compile case runs in a fresh process with an empty inductor cache dir (a true cold start).
Figures go to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SIZE, FRAMES, GUIDANCE, SEED = 192, 17, 4.0, 7
DEVICE = {"name": "cpu", "dtype": "float32"}        # set from --device / --dtype
PROMPT, NEGATIVE = "a red circle moving right on a black background", "blurry low quality"


def build_model(path: Path, *, dim: int = 256, layers: int = 4) -> Path:
    """vidgen's tiny Wan2.1 pipeline with a wider, deeper transformer (head dim 64, as Wan's)."""
    from diffusers import WanTransformer3DModel

    from vidgen.tiny import build_tiny_pipeline

    if (path / "model_index.json").exists():
        return path
    build_tiny_pipeline(path, "wan2.1-t2v", seed=0)
    torch.manual_seed(1)
    WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=dim // 64, attention_head_dim=64,
                          in_channels=16, out_channels=16, text_dim=32, freq_dim=256, ffn_dim=4 * dim,
                          num_layers=layers, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
                          ).eval().save_pretrained(path / "transformer", safe_serialization=True)
    return path


def render_config(model: Path, out: Path, steps: int, **speed) -> dict:
    return {"model": {"path": str(model), "device": DEVICE["name"], "dtype": DEVICE["dtype"]},
            "prompt": PROMPT, "negative_prompt": NEGATIVE, "size": f"{SIZE}x{SIZE}", "num_frames": FRAMES, "fps": 8, "seed": SEED,
            "sampling": {"steps": steps, "guidance_scale": GUIDANCE, "schedule": "diffusers", "checkpoint_every": 0},
            "output": {"path": str(out / "clip.mp4"), "overwrite": True}, "speed": speed}


def now() -> float:
    if DEVICE["name"] == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


def per_step(stamps: list[float]) -> float:
    return (stamps[-1] - stamps[0]) / (len(stamps) - 1)


def ours(pipe) -> tuple[list[float], float, torch.Tensor]:
    """One render: (timestamps after each step, whole denoise stage in s, final latents)."""
    from vidgen.resume import read_latents

    stamps, start = [], []

    def progress(p):
        if p.stage == "denoise":
            (stamps if p.step else start).append(now())

    result = pipe.generate(callback=progress)
    return stamps, stamps[-1] - start[0], read_latents(result.latents_path)[0]


# ------------------------------------------------------------------------------------------- loop

def loop(args, model: Path, out: Path) -> list[dict]:
    """vidgen's loop vs diffusers' WanPipeline(output_type="latent"), alternating, median per step."""
    from diffusers import WanPipeline

    import vidgen

    pipe = vidgen.Pipeline.from_config(render_config(model, out, args.steps))
    ref = WanPipeline.from_pretrained(model, dtype=getattr(torch, DEVICE["dtype"])).to(DEVICE["name"])
    ref.set_progress_bar_config(disable=True)

    def theirs():
        stamps = []

        def on_step(_pipe, i, t, kwargs):
            stamps.append(now())
            return {}
        latents = ref(prompt=PROMPT, negative_prompt=NEGATIVE, height=SIZE, width=SIZE, num_frames=FRAMES,
                      num_inference_steps=args.steps, guidance_scale=GUIDANCE, output_type="latent",
                      generator=torch.Generator().manual_seed(SEED), callback_on_step_end=on_step).frames
        return stamps, latents

    times = {"ours": [], "diffusers": []}
    for rep in range(args.repeats + 1):             # repeat 0 is the warm-up; the order alternates
        if rep % 2:
            b, lb = theirs()
            a, _, la = ours(pipe)
        else:
            a, _, la = ours(pipe)
            b, lb = theirs()
        if rep:
            times["ours"].append(per_step(a))
            times["diffusers"].append(per_step(b))
    o, d = statistics.median(times["ours"]), statistics.median(times["diffusers"])
    return [{"bench": "loop", "steps": args.steps, "repeats": args.repeats, "ours_ms": round(o * 1e3, 1),
             "diffusers_ms": round(d * 1e3, 1), "ratio": round(o / d, 3),
             "ratio_of_pairs": round(statistics.median(a / b for a, b in zip(times["ours"], times["diffusers"])), 3),
             "ratio_of_minima": round(min(times["ours"]) / min(times["diffusers"]), 3),
             "ours_all_ms": [round(x * 1e3, 1) for x in times["ours"]],
             "diffusers_all_ms": [round(x * 1e3, 1) for x in times["diffusers"]],
             "max_abs_diff_latents": float((la.float().cpu() - lb.float().cpu()).abs().max())}]


# ---------------------------------------------------------------------------------------- compile

def compile_case(args, model: Path, out: Path) -> dict:
    """One fresh process: load, first render (compiles), then steady renders."""
    import vidgen

    t0 = time.perf_counter()
    pipe = vidgen.Pipeline.from_config(render_config(model, out, args.steps, compile=args.mode))
    load = time.perf_counter() - t0
    _, first, _ = ours(pipe)
    steady = statistics.median(per_step(ours(pipe)[0]) for _ in range(args.repeats))
    return {"bench": "compile", "mode": args.mode, "steps": args.steps, "load_s": round(load, 2),
            "first_denoise_s": round(first, 2), "steady_step_ms": round(steady * 1e3, 1),
            "compile_overhead_s": round(first - args.steps * steady, 2)}


def compile_all(args, model: Path, out: Path) -> list[dict]:
    rows = []
    for mode in ("none", "blocks", "full"):
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "TRITON_CACHE_DIR": cache}
            cmd = [sys.executable, __file__, "compile-case", "--mode", mode, "--model", str(model),
                   "--steps", str(args.steps), "--repeats", str(args.repeats), "--device", DEVICE["name"],
                   "--dtype", DEVICE["dtype"]]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return rows


# ------------------------------------------------------------------------------------------ knobs

KNOBS = [{"attention_backend": "sdpa_math"}, {"attention_backend": "sdpa_flash"},
         {"attention_backend": "sdpa_efficient"}, {"attention_backend": "sdpa_cudnn"},
         {"step_cache": "first_block", "cache_threshold": 0.05}, {"step_cache": "first_block", "cache_threshold": 0.2},
         {"step_cache": "sea", "cache_threshold": 0.05}, {"step_cache": "sea", "cache_threshold": 0.25}]


def knobs(args, model: Path, out: Path) -> list[dict]:
    """Per-step time of each knob against the plain pipeline, renders alternating (the 2-core machines
    are shared, so only paired ratios are steady); compile: see `compile`."""
    import logging

    import vidgen

    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda r: records.append(r.getMessage())
    logging.getLogger("vidgen").addHandler(handler)
    rows = []
    base = vidgen.Pipeline.from_config(render_config(model, out, args.steps))
    base_latents = ours(base)[2]
    for speed in KNOBS:
        records.clear()
        pipe = vidgen.Pipeline.from_config(render_config(model, out, args.steps, **speed))
        calls = [0]
        pipe.components.experts[0].blocks[-1].ffn.register_forward_hook(
            lambda *_: calls.__setitem__(0, calls[0] + 1))
        ours(pipe)                                   # warm-up
        calls[0] = 0
        pairs = [(per_step(ours(base)[0]), ours(pipe)) for _ in range(args.repeats)]
        knob = [per_step(r[0]) for _, r in pairs]
        rows.append({"bench": "knob", "speed": speed, "step_ms": round(statistics.median(knob) * 1e3, 1),
                     "baseline_step_ms": round(statistics.median(b for b, _ in pairs) * 1e3, 1),
                     "ratio_to_baseline": round(statistics.median(k / b for k, (b, _) in zip(knob, pairs)), 3),
                     "full_passes": f"{calls[0] // args.repeats}/{2 * args.steps}",
                     "max_abs_diff_vs_baseline": float((pairs[-1][1][2] - base_latents).abs().max()),
                     "latents_max_abs": float(base_latents.abs().max()),
                     "note": next((m for m in records if "not available" in m), "")})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["loop", "compile", "knobs", "all", "compile-case"])
    p.add_argument("--model", type=Path, default=None, help="model folder (built on first use)")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--mode", default="none", help="compile-case only")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default=None, help="float32 (cpu default) or bfloat16 (cuda default)")
    p.add_argument("--json", type=Path, default=None, help="append result rows (JSON lines) here")
    args = p.parse_args()
    DEVICE.update(name=args.device, dtype=args.dtype or ("float32" if args.device == "cpu" else "bfloat16"))
    torch.set_num_threads(min(torch.get_num_threads(), os.cpu_count() or 1))
    from vidgen.quiet import quiet_libraries

    quiet_libraries()
    model = build_model(args.model or Path(tempfile.gettempdir()) / "vidgen-bench-sampling-d256l4")
    with tempfile.TemporaryDirectory() as out:
        out = Path(out)
        if args.what == "compile-case":
            print(json.dumps(compile_case(args, model, out)))
            return
        rows = []
        for name, fn in (("loop", loop), ("compile", compile_all), ("knobs", knobs)):
            if args.what in (name, "all"):
                rows += fn(args, model, out)
    meta = {"device": DEVICE["name"], "dtype": DEVICE["dtype"], "torch": torch.__version__,
            "threads": torch.get_num_threads(), "cpus": os.cpu_count()}
    if DEVICE["name"] == "cuda":
        meta["gpu"] = torch.cuda.get_device_name()
    for row in rows:
        print(json.dumps({**row, **meta}))
    if args.json:
        with open(args.json, "a") as f:
            f.writelines(json.dumps({**row, **meta}) + "\n" for row in rows)


if __name__ == "__main__":
    main()
