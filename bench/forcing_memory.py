"""Diffusion forcing's memory: one window's forward measured against the memory plan's count.

    python bench/forcing_memory.py                 # CUDA: DF-1.3B-540P, a 97-frame window at 960x544
    SMOKE=1 python bench/forcing_memory.py         # the same code at 64x64x17 on the CPU (nothing measured)

A SkyReels-V2 DF-1.3B transformer at its real width, built from the shipped config with seeded random
weights in bfloat16, runs one window forward with causal blocks of 1 latent frame (synchronous, no
attention mask) and of 5 (asynchronous: a [tokens, tokens] boolean mask, turned into an additive mask
in the query's dtype by SDPA). Printed per block size: the measured peak above the weights
(torch.cuda.max_memory_allocated) and the plan's count for it (footprint.transformer_activations),
with their ratio. bench/gpu_memory.sh runs it; the figures go to docs/benchmarks.md.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vidgen.families import VARIANTS_DIR  # noqa: E402
from vidgen.footprint import transformer_activations  # noqa: E402
from vidgen.memo import Frozen  # noqa: E402

from memory import _model  # noqa: E402  (bench/memory.py: seeded random weights, built on meta)

FOLDER = "skyreels-v2-df-1.3b-540p"


def main() -> None:
    smoke = os.environ.get("SMOKE") == "1" or not torch.cuda.is_available()
    device, dtype = ("cpu", torch.float32) if smoke else ("cuda", torch.bfloat16)
    frames, height, width = (17, 64, 64) if smoke else (97, 544, 960)
    conf = {k: v for k, v in json.loads((VARIANTS_DIR / FOLDER / "transformer" / "config.json").read_text()).items()
            if not k.startswith("_")}
    if smoke:
        conf["num_layers"] = 2
    model = _model(conf, dtype, device)
    shape = (1, conf["in_channels"], (frames - 1) // 4 + 1, height // 8, width // 8)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(shape, generator=g).to(device, dtype)
    text = (torch.randn(1, 512, conf["text_dim"], generator=g) * 0.1).to(device, dtype)
    t = torch.full((1, shape[2]), 500, dtype=torch.int64, device=device)
    for block in (1, 5):
        if shape[2] % block:
            continue
        model.register_to_config(num_frame_per_block=block)
        planned = transformer_activations(Frozen(conf), dtype, shape, 512, False, device, block)
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        t0 = time.perf_counter()
        with torch.no_grad():
            model(hidden_states=x, timestep=t, encoder_hidden_states=text, enable_diffusion_forcing=True, fps=[1],
                  return_dict=False)
        if device == "cuda":
            torch.cuda.synchronize()
            measured = torch.cuda.max_memory_allocated() - base
            print(f"forcing: DF-1.3B {width}x{height}x{frames} window, causal block {block}: measured "
                  f"{measured / 2**30:.2f} GiB above the weights, planned {planned / 2**30:.2f} GiB "
                  f"(ratio {planned / measured:.2f}), {time.perf_counter() - t0:.2f} s a forward", flush=True)
        else:
            print(f"forcing (smoke, CPU): {width}x{height}x{frames}, causal block {block}: planned "
                  f"{planned / 2**20:.1f} MiB; forward ran in {time.perf_counter() - t0:.2f} s", flush=True)


if __name__ == "__main__":
    main()
