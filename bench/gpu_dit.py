"""Sampling speed at real size: one transformer forward of the real-config Wan transformers (random
weights, bf16, built on the device), per attention backend vidgen offers, with and without regional
compile, with fp8 matmuls, against the plain diffusers call on the same weights.

For each case: ms per forward (median of --repeats after a warm-up), MFU = counted FLOPs
(vidgen.footprint.transformer_flops: every linear, self- and cross-attention) / time / the device's
dense bf16 peak (stated), and against the first case's output (SDPA auto) the max and mean abs error
and whether the output is finite. vidgen's call is `WanDenoiser` (what every render runs: condition,
dtype, expert choice, then the transformer); diffusers' is `transformer(hidden_states=...,
timestep=..., encoder_hidden_states=...)` as `WanPipeline.__call__` makes it. Both run in this
process on the same weights, alternating.

    python bench/gpu_dit.py [--models ti2v-5b,a14b-480p,a14b-720p] [--repeats 3] [--json OUT]
    python bench/gpu_dit.py --smoke          # tiny shapes on the CPU: checks this script
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

from vidgen.footprint import transformer_flops  # noqa: E402

VARIANTS = ROOT / "vidgen" / "variants"
# name -> (shipped transformer config, latent [1, z, T, h, w] of the clip)
MODELS = {
    "ti2v-5b": ("wan2.2-ti2v-5b", (1, 48, 31, 44, 80)),          # 1280x704, 121 frames: 27,280 tokens
    "a14b-480p": ("wan2.2-t2v-a14b", (1, 16, 21, 60, 104)),      # 832x480, 81 frames: 32,760 tokens
    "a14b-720p": ("wan2.2-t2v-a14b", (1, 16, 21, 90, 160)),      # 1280x720, 81 frames: 75,600 tokens
}
TEXT_LEN = 512
# Dense (no sparsity) bf16 tensor-core peaks, TFLOP/s, from the vendors' data sheets.
PEAKS = {"H200": 989.4, "H100": 989.4, "A100": 312.0, "L40S": 362.05, "RTX 4090": 165.2}


def peak_tflops(device: torch.device) -> tuple[float | None, str]:
    if device.type != "cuda":
        return None, "cpu (no peak stated)"
    name = torch.cuda.get_device_name(device)
    for key, value in PEAKS.items():
        if key in name:
            return value, f"{name}: dense bf16 peak {value} TFLOP/s"
    return None, f"{name}: peak unknown"


def build(conf: dict, device: torch.device, dtype: torch.dtype):
    from diffusers import WanTransformer3DModel

    with torch.device(device):
        model = WanTransformer3DModel.from_config(conf)
    # As from_pretrained(torch_dtype=...) loads it: the modules diffusers keeps in float32 stay there.
    keep = tuple(getattr(model, "_keep_in_fp32_modules", None) or ())
    for name, param in model.named_parameters():
        if not any(k in name.split(".") for k in keep):
            param.data = param.data.to(dtype)
    return model.eval().requires_grad_(False)


def timed(fn, repeats: int, device: torch.device) -> tuple[float, torch.Tensor]:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    out = fn()                                  # warm-up (and compile, when compiled)
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def backends(device: torch.device) -> list[str]:
    from vidgen.config import ATTENTION_BACKENDS

    if device.type != "cuda":
        return ["auto", "sdpa_math"]
    return [b for b in ATTENTION_BACKENDS if b != "sdpa_math"]       # math: far off the pace at 30k+ tokens


def run_model(name: str, conf: dict, shape: tuple, device: torch.device, dtype: torch.dtype, repeats: int,
              fp8: bool, compile_: bool) -> list[dict]:
    from types import SimpleNamespace

    from vidgen.config import SpeedConfig
    from vidgen.denoiser import Expert, WanDenoiser
    from vidgen.speed import apply_speed, unsupported

    torch.manual_seed(0)
    model = build(conf, device, dtype)
    g = torch.Generator(device="cpu").manual_seed(1)
    x = torch.randn(shape, generator=g).to(device)
    text = (torch.randn(1, TEXT_LEN, conf["text_dim"], generator=g) * 0.1).to(device, dtype)
    t = torch.tensor([700.0], device=device)
    flops = transformer_flops(conf, shape, TEXT_LEN)
    peak, _ = peak_tflops(device)
    rows, reference = [], None

    def record(case: str, seconds: float, out: torch.Tensor) -> None:
        nonlocal reference
        out = out.float()
        finite = bool(torch.isfinite(out).all())
        if reference is None:
            reference = out
        err = (out - reference).abs()
        rows.append({"model": name, "case": case, "ms": seconds * 1000, "tflops": flops / seconds / 1e12,
                     "mfu": flops / seconds / 1e12 / peak if peak else None, "finite": finite,
                     "max_err": float(err.max()) if finite else float("nan"),
                     "mean_err": float(err.mean()) if finite else float("nan")})
        print(f"  {name:10s} {case:28s} {seconds * 1000:9.1f} ms  {flops / seconds / 1e12:7.1f} TFLOP/s"
              + (f"  MFU {100 * flops / seconds / 1e12 / peak:5.1f}%" if peak else "")
              + f"  max err {rows[-1]['max_err']:.3g} mean {rows[-1]['mean_err']:.3g}" + ("" if finite else "  NON-FINITE"),
              flush=True)

    def diffusers_call():
        return model(hidden_states=x.to(dtype), timestep=t, encoder_hidden_states=text, return_dict=False)[0]

    denoiser = WanDenoiser([Expert(model, 1.0)], boundary_t=None, cond=text, uncond=None)
    seconds, out = timed(diffusers_call, repeats, device)
    record("diffusers call, sdpa auto", seconds, out)
    seconds, out = timed(lambda: denoiser(x, t, 0), repeats, device)
    record("vidgen denoiser, sdpa auto", seconds, out)
    components = SimpleNamespace(experts=[model], device=device, dtype=dtype)
    for backend in backends(device)[1:]:
        speed = SpeedConfig(attention_backend=backend)
        if problems := unsupported(speed, device, dtype):
            print(f"  {name:10s} {backend:28s} refused: {problems[0]}", flush=True)
            continue
        apply_speed(components, speed)          # on the same weights: the knob wraps the call
        seconds, out = timed(lambda: denoiser(x, t, 0), repeats, device)
        record(f"vidgen, {backend}", seconds, out)
        _undo_attention(model, backend)
    if compile_:
        speed = SpeedConfig(compile="blocks")
        t0 = time.perf_counter()
        apply_speed(components, speed)
        seconds, out = timed(lambda: denoiser(x, t, 0), repeats, device)
        print(f"  {name:10s} compile=blocks cold start (first call incl.) {time.perf_counter() - t0:.1f} s", flush=True)
        record("vidgen, sdpa auto, compile=blocks", seconds, out)
    if fp8:
        speed = SpeedConfig(fp8_matmul=True)
        if problems := unsupported(speed, device, dtype):
            print(f"  {name:10s} {'fp8 matmul':28s} refused: {problems[0]}", flush=True)
        else:
            apply_speed(components, speed)
            seconds, out = timed(lambda: denoiser(x, t, 0), repeats, device)
            record("vidgen, fp8 matmul (torchao)" + (" + compile" if compile_ else ""), seconds, out)
    del model, denoiser
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows


def _undo_attention(model, backend: str) -> None:
    """Take the attention knob back off (vidgen.speed wraps forward; set_attention_backend for sage)."""
    if "forward" in model.__dict__:
        del model.forward
    if backend == "sage":
        model.reset_attention_backend()


def smoke_conf() -> dict:
    conf = json.loads((VARIANTS / "wan2.2-ti2v-5b" / "transformer" / "config.json").read_text())
    return {**conf, "num_layers": 2, "num_attention_heads": 2, "attention_head_dim": 16, "ffn_dim": 64, "text_dim": 32,
            "freq_dim": 32, "rope_max_seq_len": 32}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="ti2v-5b,a14b-480p,a14b-720p")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--no-fp8", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (float32)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    device = torch.device("cpu" if args.smoke or not torch.cuda.is_available() else "cuda")
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    _, stated = peak_tflops(device)
    print(f"device: {stated}; torch {torch.__version__}; text {TEXT_LEN} tokens", flush=True)
    rows = []
    if args.smoke:
        rows += run_model("smoke", smoke_conf(), (1, 48, 3, 8, 8), device, dtype, 1, not args.no_fp8, False)
    else:
        for name in args.models.split(","):
            variant, shape = MODELS[name]
            conf = json.loads((VARIANTS / variant / "transformer" / "config.json").read_text())
            conf = {k: v for k, v in conf.items() if not k.startswith("_")}
            one = name == "a14b-720p"        # one step's forward at 720p: the longest
            rows += run_model(name, conf, shape, device, dtype, 1 if one else args.repeats, not args.no_fp8 and not one,
                              not args.no_compile and not one)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"device": stated, "rows": rows}, indent=1))
    base = {r["model"]: r["ms"] for r in rows if r["case"] == "diffusers call, sdpa auto"}
    print("\nmodel       case                           ms/forward   vs diffusers   MFU")
    for r in rows:
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] else "-"
        print(f"{r['model']:11s} {r['case']:30s} {r['ms']:10.1f}   {base[r['model']] / r['ms']:6.2f}x      {mfu}")


if __name__ == "__main__":
    main()
