"""LoRA cost: transformer step time with a fused LoRA, with PEFT adapters, and without; the time to
switch LoRAs in a warm pipeline against loading the model again.

    python bench/lora.py step --width 512 --layers 8 --tokens 1024 --rank 32 --reps 5
    python bench/lora.py switch --config configs/demo.yaml --reps 3

`step`: one WanTransformer3DModel (seeded random weights) in one process; the three variants run
in turn each round (none, fused, adapter), so they share the machine's state; prints each one's
median forward time and its ratio to none. `switch`: a warm Pipeline of the config's model switches
between two LoRAs (fuse: weights read back from the model files; adapter: unload and load), against
Pipeline.from_config (a fresh load of every component). Prints JSON lines.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _lora_file(path: Path, shapes: dict, rank: int, seed: int) -> Path:
    """A Kijai-layout LoRA of rank `rank` on every attention and FFN linear of the blocks."""
    import re

    from safetensors.torch import save_file

    from vidgen.demo.outline_lora import LORA_TARGETS
    from vidgen.families import wan_name

    g = torch.Generator().manual_seed(seed)
    sd = {}
    for name, shape in shapes.items():
        module = name.rsplit(".", 1)[0]
        if name.endswith(".weight") and len(shape) == 2 and re.fullmatch(LORA_TARGETS, module):
            wan = "diffusion_model." + wan_name("transformer", module)
            sd[f"{wan}.lora_down.weight"] = torch.randn(rank, shape[1], generator=g) * 0.02
            sd[f"{wan}.lora_up.weight"] = torch.randn(shape[0], rank, generator=g) * 0.02
            sd[f"{wan}.alpha"] = torch.tensor(float(rank))
    save_file(sd, str(path))
    return path


def step(args) -> None:
    from diffusers import WanTransformer3DModel

    from vidgen import lora, lora_deltas

    torch.manual_seed(0)
    heads = args.width // 64
    model = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=heads, attention_head_dim=64,
                                  in_channels=16, out_channels=16, text_dim=256, freq_dim=64, ffn_dim=args.width * 4,
                                  num_layers=args.layers, cross_attn_norm=True, qk_norm="rms_norm_across_heads").eval()
    side = int((args.tokens // 4) ** 0.5) * 2               # 4 latent frames of side x side, patch 2x2
    x = torch.randn(1, 16, 4, side, side)
    text = torch.randn(1, 64, 256)
    t = torch.tensor([500])
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    with tempfile.TemporaryDirectory() as tmp:
        path = _lora_file(Path(tmp) / "l.safetensors", shapes, args.rank, 1)
        (plan,) = lora.plan_lora(path, 1.0, "both", [shapes])
        fused = WanTransformer3DModel.from_config(model.config).eval()
        fused.load_state_dict(model.state_dict())
        lora_deltas.fuse(fused, [plan])
        adapter = WanTransformer3DModel.from_config(model.config).eval()
        adapter.load_state_dict(model.state_dict())
        lora_deltas.attach(adapter, [plan], ["bench"])
    times: dict[str, list[float]] = {"none": [], "fused": [], "adapter": []}
    models = {"none": model, "fused": fused, "adapter": adapter}
    with torch.no_grad():
        for m in models.values():
            m(x, t, encoder_hidden_states=text)            # warm-up
        for _ in range(args.reps):
            for name, m in models.items():
                t0 = time.perf_counter()
                m(x, t, encoder_hidden_states=text)
                times[name].append(time.perf_counter() - t0)
    base = statistics.median(times["none"])
    for name, ts in times.items():
        print(json.dumps({"bench": "lora-step", "variant": name, "width": args.width, "layers": args.layers,
                          "tokens": 4 * (side // 2) ** 2, "rank": args.rank, "threads": torch.get_num_threads(),
                          "median_s": round(statistics.median(ts), 4), "runs": [round(v, 4) for v in ts],
                          "x_none": round(statistics.median(ts) / base, 3)}))


def switch(args) -> None:
    import vidgen
    from vidgen.lora import folder_shapes
    from vidgen.presets import load_config
    from vidgen.preflight import preflight

    cfg = load_config(args.config, ["prompt=a red circle moving right on a black background"])
    model = Path(cfg.model.path)
    shapes = folder_shapes(model / "transformer")
    with tempfile.TemporaryDirectory() as tmp:
        files = [_lora_file(Path(tmp) / f"{i}.safetensors", shapes, args.rank, i) for i in range(2)]
        out = f"output.path={tmp}/x.mp4"
        for mode in ("fuse", "adapter"):
            pipe = vidgen.Pipeline.from_config(args.config, overrides=[out, f"lora_mode={mode}"])
            plans = [preflight(load_config(args.config, [out, f"lora_mode={mode}",
                                                        f"loras=[{{path: {f}}}]", "prompt=x"])) for f in files]
            ts = []
            for r in range(args.reps):
                for p in plans:
                    t0 = time.perf_counter()
                    pipe.set_loras(p, mode)
                    ts.append(time.perf_counter() - t0)
            print(json.dumps({"bench": "lora-switch", "mode": mode, "model": str(model), "rank": args.rank,
                              "median_s": round(statistics.median(ts), 4), "runs": [round(v, 4) for v in ts]}))
        ts = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            vidgen.Pipeline.from_config(args.config, overrides=[out])
            ts.append(time.perf_counter() - t0)
        print(json.dumps({"bench": "lora-switch", "mode": "reload the model", "model": str(model),
                          "median_s": round(statistics.median(ts), 4), "runs": [round(v, 4) for v in ts]}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    s = sub.add_parser("step")
    s.add_argument("--width", type=int, default=512)
    s.add_argument("--layers", type=int, default=8)
    s.add_argument("--tokens", type=int, default=1024)
    s.add_argument("--rank", type=int, default=32)
    s.add_argument("--reps", type=int, default=5)
    w = sub.add_parser("switch")
    w.add_argument("--config", default="configs/demo.yaml")
    w.add_argument("--rank", type=int, default=8)
    w.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    step(args) if args.what == "step" else switch(args)


if __name__ == "__main__":
    main()
