"""The fused VAE ops inside a whole decode: time and peak memory per backend, and which conv kernels run.

    python bench/gpu_kernels.py decode --latent 7x44x80 --kernels torch,triton --budgets auto,900MiB
    python bench/gpu_kernels.py profile --latent 2x44x80 --kernels torch,triton
    python bench/gpu_kernels.py decode --smoke        # CPU, narrow Wan2.2, kernels=torch: end to end in seconds
    python bench/gpu_kernels.py profile --smoke

`decode`: Wan2.2 TI2V-5B VAE at real width (bench/vae.py's builder, seeded random weights, built on the
device) at 1280x704, `vidgen.vae.decode(vae, z, memory_budget=..., kernels=...)` per backend and
budget: a warm-up decode of 2 latent frames (Triton compiles, cuDNN picks algorithms), then timed
repeats; peak = torch.cuda.max_memory_allocated (weights included). Outputs are compared with the
torch backend's and with diffusers' untiled decode. `profile`: one decode under torch.profiler per
backend; the top CUDA kernels by time, GPU time by kind (cuDNN conv, fallback conv, our Triton
kernels, layout transposes, ...) and whether every convolution went to cuDNN (aten::cudnn_convolution
vs aten::slow_conv*). Run by bench/gpu_kernels.sh; figures go to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from vae import DTYPES, build_vae, latents_for  # noqa: E402  (bench/vae.py)


def setup(args):
    """(vae, z, device): the real-width Wan2.2 VAE on CUDA, or with --smoke a narrow one on the CPU."""
    if args.smoke:
        from diffusers import AutoencoderKLWan

        from vidgen.vae.convert import wan_vae_config

        torch.manual_seed(0)
        vae = AutoencoderKLWan(**dict(wan_vae_config("2.2"), base_dim=8, decoder_base_dim=8))
        vae = vae.eval().requires_grad_(False).to(DTYPES[args.dtype])
        device = "cpu"
    else:
        if not torch.cuda.is_available():
            raise SystemExit("needs a CUDA device (or --smoke for a CPU run with a narrow VAE)")
        device = "cuda"
        with torch.device(device):       # parameters are created on the GPU: seconds, not a CPU init
            vae = build_vae("2.2", DTYPES[args.dtype], device)
    z = latents_for("2.2", args.latent, DTYPES[args.dtype], device)
    return vae, z, device


def describe(device: str) -> str:
    text = f"torch {torch.__version__}"
    if device == "cuda":
        text = f"{torch.cuda.get_device_name(0)}, {text}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}"
    try:
        import triton
        text += f", triton {triton.__version__}"
    except Exception:
        text += ", no triton"
    return text


# --------------------------------------------------------------------------------------------
# decode: time and peak memory per backend


def decode_timed(fn, device: str) -> tuple[torch.Tensor, dict]:
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    with torch.no_grad():
        out = fn()
    if device == "cuda":
        torch.cuda.synchronize()
    info = {"time_s": round(time.perf_counter() - t0, 3)}
    if device == "cuda":
        info["peak_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
        info["peak_reserved_gib"] = round(torch.cuda.max_memory_reserved() / 2**30, 3)
    return out, info


def cmd_decode(args) -> dict:
    import vidgen.vae as vv
    from vidgen.budgets import parse_budget
    from vidgen.vae.plan import choose_plan

    vae, z, device = setup(args)
    print(f"device: {describe(device)}; latent {args.latent} {args.dtype}", flush=True)
    weights = torch.cuda.memory_allocated() / 2**30 if device == "cuda" else None
    warm = z[:, :, :2]
    rows, refs = [], {}
    if args.diffusers:
        with torch.no_grad():
            vae.decode(warm)                                   # warm-up
        ref, info = decode_timed(lambda: vae.decode(z).sample.cpu(), device)
        refs["diffusers"] = ref
        rows.append({"kernels": "diffusers untiled", "budget": "", "plan": "", **info})
        print(json.dumps(rows[-1]), flush=True)
    for budget in args.budgets.split(","):
        torch_out = None
        for kernels in args.kernels.split(","):
            row = {"kernels": kernels, "budget": budget}
            try:
                p = choose_plan(vae, tuple(z.shape), memory_budget=parse_budget(budget)).plan
                row["plan"] = f"{p.ny}x{p.nx} tiles, {p.frames_per_step} f/step, cl={p.channels_last}"
                vv.decode(vae, warm, space="vae", memory_budget=budget, kernels=kernels)
                times = []
                for _ in range(args.reps):
                    out, info = decode_timed(lambda: vv.decode(vae, z, space="vae", memory_budget=budget, kernels=kernels), device)
                    times.append(info.pop("time_s"))
                    row.update(info)
                row["time_s"] = min(times)
                row["times_s"] = times
                if kernels == "torch":
                    torch_out = out
                elif torch_out is not None:
                    row["max_abs_diff_vs_torch"] = float((out.float() - torch_out.float()).abs().max())
                    row["mean_abs_diff_vs_torch"] = float((out.float() - torch_out.float()).abs().mean())
                if "diffusers" in refs:
                    row["max_abs_diff_vs_diffusers"] = float((out.float() - refs["diffusers"].float()).abs().max())
                row["frames"] = out.shape[2]
                del out
            except Exception as e:           # one failing backend must not hide the others' figures
                row["error"] = f"{type(e).__name__}: {e}"
                traceback.print_exc()
            rows.append(row)
            print(json.dumps(row), flush=True)
    by_budget = {}
    for r in rows:
        if r["kernels"] in ("torch", "triton") and "time_s" in r:
            by_budget.setdefault(r["budget"], {})[r["kernels"]] = r
    for pair in by_budget.values():
        if len(pair) == 2:
            pair["triton"]["time_vs_torch"] = round(pair["triton"]["time_s"] / pair["torch"]["time_s"], 3)
            if "peak_allocated_gib" in pair["torch"]:
                pair["triton"]["peak_vs_torch"] = round(pair["triton"]["peak_allocated_gib"]
                                                        / pair["torch"]["peak_allocated_gib"], 3)
    result = {"device": describe(device), "latent": args.latent, "dtype": args.dtype, "reps": args.reps,
              "weights_gib": weights and round(weights, 3), "rows": rows}
    print("\n" + decode_table(result))
    return result


def decode_table(result: dict) -> str:
    lines = [f"Wan2.2 VAE decode, latent {result['latent']}, {result['dtype']}, weights {result['weights_gib']} GiB "
             f"({result['device']})", "",
             f"| kernels | budget | plan | time s (best of {result['reps']}) | x torch | peak GiB | x torch "
             "| max abs diff vs torch | vs diffusers |", "|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"| {r['kernels']} | {r['budget']} | {r.get('plan', '')} | FAILED: {r['error'][:150]} |||||")
            continue
        fmt = lambda k: f"{r[k]:.2e}" if k in r else ""  # noqa: E731
        lines.append(f"| {r['kernels']} | {r['budget']} | {r['plan']} | {r['time_s']} | {r.get('time_vs_torch', '')} "
                     f"| {r.get('peak_allocated_gib', '')} | {r.get('peak_vs_torch', '')} "
                     f"| {fmt('max_abs_diff_vs_torch')} | {fmt('max_abs_diff_vs_diffusers')} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# profile: which kernels run, and are the convolutions cuDNN's


OUR_KERNELS = re.compile(r"rms_norm_silu|cache_shift|window_gather|upsample2x|dup_up_add", re.I)
KINDS = [   # (kind, pattern), first match wins
    ("layout transpose", re.compile(r"nchwToNhwc|nhwcToNchw|nchw.?to.?nhwc|nhwc.?to.?nchw", re.I)),
    ("conv fallback (not cuDNN)", re.compile(r"vol2col|col2vol|im2col|col2im|slow_conv|naive_conv|conv_depthwise", re.I)),
    ("conv (cuDNN)", re.compile(r"cudnn|fprop|implicit_gemm|implicit_convolve|convolve_|conv2d|conv3d|nhwckrsc|"
                                r"xmma_.*conv|cutlass.*conv", re.I)),
    ("vidgen triton", OUR_KERNELS),
    ("gemm / attention", re.compile(r"gemm|matmul|cublas|flash|fmha|attention|softmax", re.I)),
    ("elementwise / copy", re.compile(r"elementwise|vectorized|CatArray|copy|fill|reduce|norm|upsample|index|pad|"
                                      r"memcpy|memset|distribution", re.I)),
]
CONV_OPS = re.compile(r"^aten::(cudnn_convolution|miopen_convolution|mkldnn_convolution|slow_conv\w*|_slow_conv\w*|"
                      r"_nnpack_spatial_convolution|thnn_conv\w*|convolution_overrideable|_conv_depthwise\w*|conv_depthwise\w*)$")


def kind_of(name: str) -> str:
    for kind, pattern in KINDS:
        if pattern.search(name):
            return kind
    return "other"


def _device_us(evt) -> float:
    for attr in ("self_device_time_total", "self_cuda_time_total", "device_time_total", "cuda_time_total"):
        if hasattr(evt, attr):
            return float(getattr(evt, attr))
    return 0.0


def profile_one(vae, z, kernels: str, budget: str, device: str, top: int) -> dict:
    import vidgen.vae as vv
    from torch.profiler import ProfilerActivity, profile

    vv.decode(vae, z, space="vae", memory_budget=budget, kernels=kernels)  # warm-up outside the profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        vv.decode(vae, z, space="vae", memory_budget=budget, kernels=kernels)
        if device == "cuda":
            torch.cuda.synchronize()
    averages = prof.key_averages()
    conv_ops = {e.key: e.count for e in averages if CONV_OPS.match(e.key)}
    kernels_us: dict[str, list] = {}
    for e in averages:
        if device == "cuda" and e.device_type == torch.autograd.DeviceType.CUDA:
            kernels_us[e.key] = [e.count, _device_us(e)]
    if device == "cuda" and not kernels_us:      # older layouts: kernels as keys with device time only
        kernels_us = {e.key: [e.count, _device_us(e)] for e in averages
                      if _device_us(e) > 0 and not e.key.startswith(("aten::", "cuda", "Memcpy", "Memset"))}
    if device != "cuda":                          # CPU smoke: the top aten ops by self CPU time instead
        kernels_us = {e.key: [e.count, float(e.self_cpu_time_total)] for e in averages if e.key.startswith("aten::")}
    total = sum(us for _, us in kernels_us.values()) or 1.0
    by_kind: dict[str, float] = {}
    for name, (_, us) in kernels_us.items():
        by_kind[kind_of(name)] = by_kind.get(kind_of(name), 0.0) + us
    ranked = sorted(kernels_us.items(), key=lambda kv: -kv[1][1])[:top]
    cudnn = conv_ops.get("aten::cudnn_convolution", 0)
    fallback = {k: v for k, v in conv_ops.items() if k != "aten::cudnn_convolution"}
    conv_kernel_us = by_kind.get("conv (cuDNN)", 0.0)
    verdict = (device == "cuda" and cudnn > 0 and not fallback)
    return {"kernels": kernels, "budget": budget, "total_ms": round(total / 1e3, 2),
            "conv_ops": conv_ops, "all_convs_cudnn": verdict,
            "time_by_kind_pct": {k: round(100 * v / total, 1) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
            "conv_cudnn_kernel_ms": round(conv_kernel_us / 1e3, 2),
            "top": [{"name": n, "count": c, "ms": round(us / 1e3, 3), "pct": round(100 * us / total, 1), "kind": kind_of(n)}
                    for n, (c, us) in ranked]}


def cmd_profile(args) -> dict:
    vae, z, device = setup(args)
    print(f"device: {describe(device)}; latent {args.latent} {args.dtype}; cudnn enabled "
          f"{torch.backends.cudnn.enabled}", flush=True)
    results = []
    for kernels in args.kernels.split(","):
        try:
            r = profile_one(vae, z, kernels, args.budget, device, args.top)
        except Exception as e:
            traceback.print_exc()
            r = {"kernels": kernels, "error": f"{type(e).__name__}: {e}"}
        results.append(r)
    result = {"device": describe(device), "device_type": device, "latent": args.latent, "dtype": args.dtype,
              "results": results}
    print(profile_text(result, args.top))
    return result


def profile_text(result: dict, top: int) -> str:
    lines = [f"profile: Wan2.2 VAE decode, latent {result['latent']}, {result['dtype']} ({result['device']})"]
    for r in result["results"]:
        if "error" in r:
            lines.append(f"kernels={r['kernels']}: FAILED {r['error']}")
            continue
        unit = "GPU" if result["device_type"] == "cuda" else "CPU (self time of aten ops)"
        lines += ["", f"kernels={r['kernels']}, budget {r['budget']}: {r['total_ms']} ms of {unit} time; conv ops "
                  f"{r['conv_ops']}; every conv on cuDNN: {'yes' if r['all_convs_cudnn'] else 'NO'}",
                  "time by kind: " + ", ".join(f"{k} {v}%" for k, v in r["time_by_kind_pct"].items()),
                  "| kernel | calls | ms | % | kind |", "|---|---|---|---|---|"]
        for k in r["top"][:top]:
            name = k["name"] if len(k["name"]) <= 100 else k["name"][:97] + "..."
            lines.append(f"| `{name}` | {k['count']} | {k['ms']} | {k['pct']} | {k['kind']} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("decode", "profile"):
        s = sub.add_parser(name)
        s.add_argument("--smoke", action="store_true", help="CPU, narrow Wan2.2 VAE, kernels=torch, tiny latent")
        s.add_argument("--latent", help="TxHxW (default: 7x44x80 decode, 2x44x80 profile; smoke 2x4x6)")
        s.add_argument("--dtype", choices=list(DTYPES), help="default bfloat16 (smoke: float32)")
        s.add_argument("--kernels", help="comma list (default: torch,triton; smoke: torch)")
        s.add_argument("--json")
    d = sub.choices["decode"]
    d.add_argument("--budgets", help="comma list of memory budgets (default: auto,900MiB; smoke: auto,40MiB)")
    d.add_argument("--reps", type=int, default=2)
    d.add_argument("--no-diffusers", dest="diffusers", action="store_false",
                   help="skip diffusers' untiled decode (the reference the outputs are compared with)")
    pr = sub.choices["profile"]
    pr.add_argument("--budget", default="auto")
    pr.add_argument("--top", type=int, default=15)
    sm = sub.add_parser("summarize", help="print the tables of earlier --json outputs (decode and profile)")
    sm.add_argument("paths", nargs="+")
    sm.add_argument("--top", type=int, default=6)
    args = p.parse_args()
    if args.cmd == "summarize":
        for path in args.paths:
            result = json.loads(Path(path).read_text())
            print((decode_table(result) if "rows" in result else profile_text(result, args.top)) + "\n")
        return 0
    args.latent = args.latent or ("2x4x6" if args.smoke else "7x44x80" if args.cmd == "decode" else "2x44x80")
    args.dtype = args.dtype or ("float32" if args.smoke else "bfloat16")
    args.kernels = args.kernels or ("torch" if args.smoke else "torch,triton")
    if args.cmd == "decode":
        args.budgets = args.budgets or ("auto,40MiB" if args.smoke else "auto,900MiB")
    t0 = time.perf_counter()
    result = cmd_decode(args) if args.cmd == "decode" else cmd_profile(args)
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    print(f"wall {result['wall_s']} s")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    rows = result.get("rows") or result.get("results")
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
