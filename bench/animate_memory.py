"""Wan2.2-Animate's memory: one segment's forward measured against the memory plan's count, and the plan.

    python bench/animate_memory.py                 # CUDA: Animate-14B, a 77-frame segment at 1280x720
    SMOKE=1 python bench/animate_memory.py         # the same code at 64x64, 5 frames, narrow, on the CPU

A WanAnimateTransformer3DModel built from the shipped config (vidgen/variants/wan2.2-animate-14b) with
seeded random weights in bfloat16, all 40 blocks and 8 face adapters where the card holds them (else 10
blocks and 2 adapters: activations do not depend on the number of blocks), runs one segment's forward as
vidgen.animate does: latents [1, 36, 1 + T, h, w], pose latents [1, 16, T, h, w], 77 face crops at 512 x 512
through the motion encoder (8 at a time) and 257 CLIP tokens. Printed: the measured peak above the weights
and inputs (torch.cuda.max_memory_allocated) against footprint.animate_activations, the plan's count (a
one-block copy on meta tensors), with their ratio; then the whole plan (vidgen.memory.plan_render, from
the shipped JSON) of a 1280x720 render on a 24 and a 48 GiB card. On the CPU (SMOKE) the forward's live
tensor bytes (vidgen.vae.memsim.LiveBytes) stand for the measurement. bench/gpu_memory.sh runs it; the
figures go to docs/benchmarks.md and docs/memory.md.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vidgen.families import VARIANTS_DIR  # noqa: E402
from vidgen.footprint import animate_activations  # noqa: E402
from vidgen.memo import Frozen  # noqa: E402

FOLDER = "wan2.2-animate-14b"


def _model(conf: dict, dtype: torch.dtype, device: str):
    """The transformer of `conf` with seeded random weights, given storage on `device` in its load dtypes
    (built on meta first: no float32 copy of 17 B parameters), the rotary tables built for real."""
    from vidgen.weights import meta_transformer

    model = meta_transformer(conf, dtype).to_empty(device=device)
    g = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02, generator=g)
    rope = model.rope
    with torch.device(device):
        model.rope = type(rope)(rope.attention_head_dim, rope.patch_size, rope.max_seq_len)
    return model


def forward(smoke: bool) -> None:
    device, dtype = ("cpu", torch.float32) if smoke else ("cuda", torch.bfloat16)
    conf = {k: v for k, v in json.loads((VARIANTS_DIR / FOLDER / "transformer" / "config.json").read_text()).items()
            if not k.startswith("_")}
    frames, height, width = (5, 64, 64) if smoke else (77, 720, 1280)
    if smoke:       # narrow (2 heads), two blocks with a face adapter after each; the real motion encoder
        conf.update(num_layers=2, inject_face_latents_blocks=1, num_attention_heads=2, ffn_dim=512, added_kv_proj_dim=256)
    elif torch.cuda.get_device_properties(0).total_memory < 60 * 2**30:
        conf.update(num_layers=10)          # 10 blocks, 2 face adapters: what a smaller card holds
    t0 = time.perf_counter()
    model = _model(conf, dtype, device)
    built = time.perf_counter() - t0
    t = (frames - 1) // 4 + 1
    h, w, face = height // 8, width // 8, conf["motion_encoder_size"]
    g = torch.Generator().manual_seed(1)

    def inputs(frames: int, t: int, h: int, w: int) -> dict:
        rand = lambda *shape: torch.randn(*shape, generator=g).to(device, dtype)  # noqa: E731
        return dict(hidden_states=rand(1, conf["in_channels"], 1 + t, h, w), timestep=torch.tensor([500.0], device=device),
                    encoder_hidden_states=rand(1, 512, conf["text_dim"]) * 0.1,
                    encoder_hidden_states_image=rand(1, 257, conf["image_dim"]), pose_hidden_states=rand(1, 16, t, h, w),
                    face_pixel_values=rand(1, 3, frames, face, face).clamp(-1, 1), return_dict=False)

    with torch.no_grad():       # warm-up at a small size: first-call allocations (cuBLAS workspaces) are not activations
        model(**inputs(5, 2, 8, 8))
    x = inputs(frames, t, h, w)
    planned = animate_activations(Frozen(conf), dtype, (1, 16, 1 + t, h, w), 512, (257, conf["image_dim"]), frames,
                                  device)
    name = f"{conf['num_layers']} blocks, {len(model.face_adapter)} face adapters"
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        t0 = time.perf_counter()
        with torch.no_grad():
            model(**x)
        torch.cuda.synchronize()
        measured = torch.cuda.max_memory_allocated() - base
        print(f"animate: Animate-14B ({name}) {width}x{height}, a {frames}-frame segment: measured "
              f"{measured / 2**30:.2f} GiB above the weights, planned {planned / 2**30:.2f} GiB (ratio "
              f"{planned / measured:.2f}); {time.perf_counter() - t0:.2f} s a forward, built in {built:.1f} s",
              flush=True)
    else:
        from vidgen.vae.memsim import LiveBytes

        live = LiveBytes("cpu")
        t0 = time.perf_counter()
        with live, torch.no_grad():
            model(**x)
        print(f"animate (smoke, CPU, {name}): {width}x{height}x{frames}: live tensors {live.peak / 2**20:.1f} MiB, "
              f"planned {planned / 2**20:.1f} MiB (ratio {planned / live.peak:.3f}); "
              f"forward ran in {time.perf_counter() - t0:.2f} s", flush=True)


def plans() -> None:
    """The plan of a 1280x720 render, 77-frame segments, bf16, on a 24 and a 48 GiB card (as docs/memory.md)."""
    from vidgen.memo import Memo
    from vidgen.memory import plan_render
    from vidgen.presets import load_config

    memo = Memo()
    for budget in ("24GiB", "48GiB"):
        cfg = load_config(ROOT / "configs/wan-base.yaml", [
            "prompt=x", "model.variant=wan2.2-animate-14b", "model.path=/nowhere", "model.device=cuda",
            "size=1280x720", "num_frames=77", "sampling.guidance_scale=1.0", f"memory.device_budget={budget}",
            "memory.host_budget=96GiB"])
        for frames in (77, 1003):       # the pose video's length (preflight sets num_frames to it)
            plan = plan_render(replace(cfg, num_frames=frames), memo=memo).chosen
            peaks = ", ".join(f"{s.name} {s.device_total / 2**30:.2f}" for s in plan.stages)
            print(f"animate plan: 1280x720, {frames} frames, {budget}: {plan.placement}/{plan.weights}, text encoder "
                  f"on the {plan.text_encoder}; device peak {plan.device_peak_bytes / 2**30:.2f} GiB ({peaks}); "
                  f"host peak {plan.host_peak_bytes / 2**30:.2f} GiB", flush=True)


def main() -> None:
    smoke = os.environ.get("SMOKE") == "1" or not torch.cuda.is_available()
    forward(smoke)
    plans()


if __name__ == "__main__":
    main()
