"""VAE decode benchmark: vidgen's exact budgeted decoder vs diffusers untiled vs diffusers tiled.

Every measured case runs in a fresh process (peak RSS is per process). Real-width Wan VAEs with
seeded random weights; latents seeded. Outputs are saved and compared with the untiled one.

    python bench/vae.py run --vae 2.1 --latent 5x32x32 --impl ours --budget 0.25x   # one case, JSON
    python bench/vae.py suite --quick                                             # measured table
    python bench/vae.py suite --cases 2.1:32:3x16x16,2.2:full:3x16x16 --reps 3      # chosen cases, alternating
    python bench/vae.py simulate --vae 2.2 --latent 31x44x80 --dtype bfloat16        # full-size peaks
    python bench/vae.py validate                                                  # simulator vs RSS
    python bench/vae.py silu-exp --reps 4        # what the twin's spelled-out exp costs a decode

Figures go to docs/benchmarks.md. On 2 CPU cores a real-width case takes minutes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}


def build_vae(version: str, dtype: torch.dtype, device: str = "cpu", base_dim: int | None = None):
    """A Wan VAE with seeded random weights (diffusers' default init): real width, or every stage's
    width scaled to `base_dim` (Wan2.2: its decoder's base width too)."""
    from diffusers import AutoencoderKLWan

    from vidgen.vae.convert import wan_vae_config
    from vidgen.vae.memsim import default_dtype

    config = wan_vae_config(version)
    if base_dim:
        config.update(base_dim=base_dim, **({"decoder_base_dim": base_dim} if version == "2.2" else {}))
    torch.manual_seed(0)
    with default_dtype(torch.float32 if dtype == torch.float64 else dtype):    # float64: the same weights, widened
        vae = AutoencoderKLWan(**config).eval().requires_grad_(False).to(dtype)
    return vae if device == "cpu" else vae.to(device=device)


def latents_for(version: str, shape: str, dtype: torch.dtype, device: str = "cpu") -> torch.Tensor:
    t, h, w = (int(v) for v in shape.split("x"))
    z = 16 if version == "2.1" else 48
    g = torch.Generator().manual_seed(1)
    return torch.randn(1, z, t, h, w, generator=g).to(device=device, dtype=dtype)


def _rss_now() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _reset_peak_rss() -> None:
    with open("/proc/self/clear_refs", "w") as f:   # resets VmHWM to the current RSS (Linux)
        f.write("5")


def _peak_rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


def _parse_budget(text: str | None, reference_mib: float | None):
    if text is None:
        return None
    if text.endswith("x"):   # a fraction of diffusers' measured untiled peak
        return int(float(text[:-1]) * reference_mib * 2**20)
    return text


def run_case(args) -> dict:
    """One decode in this process; returns timing, peak memory and (optionally) saves the output."""
    import vidgen.vae as vv
    from vidgen.budgets import parse_budget

    dtype = DTYPES[args.dtype]
    device = args.device
    vae = build_vae(args.vae, dtype, device, args.base_dim)
    z = latents_for(args.vae, args.latent, dtype, device)
    budget = _parse_budget(args.budget, args.reference_mib)
    info = {"vae": args.vae, "base_dim": args.base_dim or "full", "latent": args.latent, "dtype": args.dtype,
            "impl": args.impl, "kernels": args.kernels if args.impl == "ours" else "", "device": device,
            "threads": torch.get_num_threads()}
    if args.impl == "ours" and args.plan:       # a forced plan, for measuring the planner's choices
        import vidgen.vae.plan as vp
        from vidgen.vae.decoder import DecodePlan

        grid, f, *k = args.plan.split(":")
        ny, nx = (int(v) for v in grid.split("x"))
        plan = DecodePlan(ny, nx, int(f), device != "cpu", tile_from=int(k[0]) if k else 0,
                          mid_in_file=k[1:] == ["file"],
                          subpixel=vp.takes_subpixel(torch.device(device).type, dtype))
        peak = vp.simulate_plan_peak(vae, tuple(z.shape), dtype, plan, torch.device(device).type)
        vp.choose_plan = lambda *a, **k: vp.PlanEstimate(plan, peak, 0.0)
        vv.choose_plan = vp.choose_plan
        budget = None
    if args.impl == "ours":
        t0 = time.perf_counter()
        est = vv.choose_plan(vae, tuple(z.shape), memory_budget=budget,
                             output_bytes=vv.video_bytes(vae.config, z.shape, z.dtype))
        info["planning_s"] = round(time.perf_counter() - t0, 2)     # timed apart; decode() finds it memoised
        info.update(plan=est.plan.describe(),
                    simulated_peak_mib=round(est.peak_bytes / 2**20, 1),
                    budget_mib=None if budget is None else round(parse_budget(budget) / 2**20, 1))
    elif args.impl == "diffusers-tiled":
        vae.enable_tiling()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        _reset_peak_rss()
        base = _rss_now()
    t0 = time.perf_counter()
    with torch.no_grad():
        if args.impl == "ours":
            out = vv.decode(vae, z, space="vae", memory_budget=budget, kernels=args.kernels)
        else:
            out = vae.decode(z).sample
            out = out.cpu()
    if device == "cuda":
        torch.cuda.synchronize()
    info["time_s"] = round(time.perf_counter() - t0, 2)
    if device == "cuda":
        info["peak_allocated_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
        info["weights_mib"] = round(base / 2**20, 1)
    else:
        info["peak_rss_above_model_mib"] = round((_peak_rss() - base) / 2**20, 1)
    if args.save:
        torch.save(out if out.dtype == torch.float64 else out.float(), args.save)
    info["frames"] = out.shape[2]
    return info


def _spawn(case: list[str], save: str | None = None) -> dict:
    cmd = [sys.executable, __file__, "run", *case] + (["--save", save] if save else [])
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"case failed: {' '.join(cmd)}\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def _median(values: list[float]) -> float:
    values = sorted(values)
    return values[len(values) // 2] if len(values) % 2 else (values[len(values) // 2 - 1] + values[len(values) // 2]) / 2


def suite(args) -> None:
    """Measured cases, each run in a fresh process, the decoders alternating for `--reps` rounds:
    diffusers untiled, (diffusers tiled,) ours at the default budget and at 0.25x diffusers' peak.
    Rows give medians; ratios are against diffusers untiled of the same rounds."""
    if args.cases:
        cases = [tuple(c.split(":")) for c in args.cases.split(",")]
    elif args.quick:
        cases = [("2.1", "full", "2x16x16"), ("2.2", "full", "2x8x8")]
    else:
        cases = [("2.1", "full", "5x32x32"), ("2.1", "full", "3x40x40"), ("2.2", "full", "3x16x16")]
    impls = [("diffusers", [])] + ([("diffusers-tiled", [])] if args.tiled else []) + [("ours", [])]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for version, width, latent in cases:
            base = ["--vae", version, "--latent", latent, "--dtype", args.dtype] + \
                   ([] if width == "full" else ["--base-dim", width]) + ["--kernels", args.kernels]
            runs: dict[str, list[dict]] = {}
            ref = exact = None
            if args.fp64:      # the float64 decode: how far each float32 decoder is from the exact result
                path = f"{tmp}/out64.pt"
                info = _spawn([*base[:base.index("--dtype")], "--dtype", "float64", *base[base.index("--dtype") + 2:],
                               "--impl", "diffusers"], path)
                exact = torch.load(path, weights_only=True)
                print(json.dumps({"fp64_reference": info}), flush=True)
            # The 0.25x budget, for every round: a quarter of the larger of diffusers' peaks in a run of
            # its own and in the first round. One fresh process's peak RSS can come out low (221 against
            # 364 MiB for Wan2.1 at width 32, 3x16x16), which would set a 0.15x budget.
            budget_ref = _spawn(base + ["--impl", "diffusers"])["peak_rss_above_model_mib"]
            for rep in range(args.reps):
                for impl, extra in impls + [("ours-0.25x", None)]:
                    if extra is None:
                        ref_mib = max(budget_ref, runs["diffusers"][0]["peak_rss_above_model_mib"])
                        extra = ["--budget", "0.25x", "--reference-mib", str(ref_mib)]
                    path = f"{tmp}/out.pt"
                    info = _spawn(base + ["--impl", impl.removesuffix("-0.25x"), *extra], path)
                    out = torch.load(path, weights_only=True)
                    if ref is None:
                        ref = out
                    info["max_abs_diff"] = float((out - ref).abs().max())
                    if exact is not None:
                        info["max_abs_diff_fp64"] = float((out.double() - exact).abs().max())
                    runs.setdefault(impl, []).append(info)
                    print(json.dumps({"rep": rep, **info}), flush=True)
            ref_t = _median([r["time_s"] for r in runs["diffusers"]])
            ref_m = _median([r["peak_rss_above_model_mib"] for r in runs["diffusers"]])
            for impl, infos in runs.items():
                row = dict(infos[-1])
                row["impl"] = impl
                row["time_s"] = round(_median([r["time_s"] for r in infos]), 2)
                row["peak_rss_above_model_mib"] = round(_median([r["peak_rss_above_model_mib"] for r in infos]), 1)
                row["time_ratio"] = round(row["time_s"] / ref_t, 3)
                row["peak_ratio"] = round(row["peak_rss_above_model_mib"] / ref_m, 3)
                row["max_abs_diff"] = max(r["max_abs_diff"] for r in infos)
                if exact is not None:
                    row["max_abs_diff_fp64"] = max(r["max_abs_diff_fp64"] for r in infos)
                row["times"] = [r["time_s"] for r in infos]
                rows.append(row)
                print(json.dumps({"summary": row}), flush=True)
    print(markdown(rows))


def markdown(rows: list[dict]) -> str:
    head = ("| VAE | width | latent | impl | budget | plan | time s | x untiled | peak RSS MiB | x untiled | simulated MiB "
            "| max abs diff |\n|---|---|---|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        lines.append(f"| Wan{r['vae']} | {r.get('base_dim', 'full')} | {r['latent']} | {r['impl']} | {r.get('budget_mib') or ''} "
                     f"| {r.get('plan', '')} "
                     f"| {r['time_s']} | {r['time_ratio']} | {r['peak_rss_above_model_mib']} | {r['peak_ratio']} "
                     f"| {r.get('simulated_peak_mib', '')} | {r['max_abs_diff']:.2e} |")
    return "\n".join(lines)


def simulate(args) -> dict:
    """Full-size peaks on fake tensors: diffusers untiled vs ours (auto plan for a budget)."""
    from vidgen.vae.memsim import LiveBytes, fake_mode
    from vidgen.vae.plan import choose_plan, simulate_plan_peak

    dtype = DTYPES[args.dtype]
    t, h, w = (int(v) for v in args.latent.split("x"))
    with fake_mode():
        fvae = build_vae(args.vae, dtype, "cpu")
        weights = sum(p.numel() * p.element_size() for n, p in fvae.named_parameters()
                      if n.startswith(("decoder.", "post_quant_conv.")))
        z = torch.empty(1, fvae.config.z_dim, t, h, w, dtype=dtype)
        tracker = LiveBytes(args.device_type)
        with tracker, torch.no_grad():
            fvae.decode(z)
        diffusers_peak = tracker.peak
        budget = _parse_budget(args.budget, None)
        est = choose_plan(fvae, (1, fvae.config.z_dim, t, h, w), memory_budget=budget or 2**40,
                          device=torch.device(args.device_type), dtype=dtype)
        # Our own peak: with mid results on the host on GPU, as a GPU decode runs.
        plan = dataclasses.replace(est.plan, mid_on_host=args.device_type != "cpu")
        ours = simulate_plan_peak(fvae, (1, fvae.config.z_dim, t, h, w), dtype, plan, args.device_type)
    out = {"vae": args.vae, "latent": args.latent, "dtype": args.dtype, "device": args.device_type,
           "decoder_weights_mib": round(weights / 2**20, 1),
           "diffusers_untiled_activation_mib": round(diffusers_peak / 2**20, 1),
           "diffusers_untiled_total_gib": round((diffusers_peak + weights) / 2**30, 2),
           "ours_plan": plan.describe(),
           "ours_activation_mib": round(ours / 2**20, 1), "ours_total_gib": round((ours + weights) / 2**30, 2)}
    print(json.dumps(out))
    return out


def validate(args) -> None:
    """Simulated vs measured peak (RSS above model) at small real-width sizes, both decoders."""
    from vidgen.vae.decoder import DecodePlan
    from vidgen.vae.memsim import LiveBytes, fake_mode
    from vidgen.vae.plan import choose_plan, simulate_plan_peak

    for version, latent in [("2.1", "3x16x16"), ("2.1", "2x24x24"), ("2.2", "2x8x8")]:
        for impl in ("diffusers", "ours"):
            meas = _spawn(["--vae", version, "--latent", latent, "--dtype", "float32", "--impl", impl])
            t, h, w = (int(v) for v in latent.split("x"))
            with fake_mode():
                fvae = build_vae(version, torch.float32, "cpu")
                shape = (1, fvae.config.z_dim, t, h, w)
                if impl == "diffusers":
                    tracker = LiveBytes("cpu")
                    with tracker, torch.no_grad():
                        fvae.decode(torch.empty(shape))
                    sim = tracker.peak
                else:
                    est = choose_plan(fvae, shape, device=torch.device("cpu"), dtype=torch.float32)
                    sim = simulate_plan_peak(fvae, shape, torch.float32, est.plan, "cpu")
            m = meas["peak_rss_above_model_mib"]
            print(json.dumps({"vae": version, "latent": latent, "impl": impl, "measured_mib": m,
                              "simulated_mib": round(sim / 2**20, 1), "sim_over_measured": round(sim / 2**20 / m, 3)}),
                  flush=True)


def gpu(args) -> None:
    """The lent-GPU benchmark: one process, each decoder timed after a warm-up, peaks via the allocator."""
    import vidgen.vae as vv
    from vidgen.vae.decoder import DecodePlan
    from vidgen.budgets import parse_budget
    from vidgen.vae.plan import choose_plan

    smoke = args.smoke          # the same code on the CPU at tiny widths and sizes (checks the script)
    assert smoke or torch.cuda.is_available(), "needs a CUDA device (or --smoke)"
    dev = "cpu" if smoke else "cuda"
    cuda = torch.cuda if not smoke else None
    width = 16 if smoke else None
    small21, budgets = ("2x8x8", ("auto", "60MiB", "45MiB")) if smoke else ("3x16x16", ("auto", "900MiB", "512MiB"))
    print(f"device: {'cpu (smoke)' if smoke else torch.cuda.get_device_name(0)}, torch {torch.__version__}", flush=True)
    rows = []

    def timed(name, fn, ref=None, **extra):
        if cuda:
            cuda.synchronize()
            cuda.empty_cache()
            cuda.reset_peak_memory_stats()
        base = cuda.memory_allocated() if cuda else 0
        t0 = time.perf_counter()
        with torch.no_grad():
            out = fn()
        if cuda:
            cuda.synchronize()
        row = {"case": name, "time_s": round(time.perf_counter() - t0, 2),
               "peak_total_gib": round(cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
               "weights_gib": round(base / 2**30, 2), **extra}
        if ref is not None:
            row["max_abs_diff_vs_diffusers"] = float((out.float() - ref.float()).abs().max())
        rows.append(row)
        print(json.dumps(row), flush=True)
        return out

    # 1. Exactness on the GPU, fp32, real width Wan2.1 (small latent); TF32 off, else both decoders
    # round convolutions to TF32 (torch's default for cuDNN) in different orders.
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    vae = build_vae("2.1", torch.float32, dev, width)
    z = latents_for("2.1", small21, torch.float32, dev)
    ref = timed(f"wan2.1 fp32 {small21} diffusers", lambda: vae.decode(z).sample.cpu())
    for cl in (False, True):
        plan = DecodePlan(2, 2, 1, True, cl)
        timed(f"wan2.1 fp32 {small21} ours 2x2 tiles cl={cl}", lambda: _decode_with(vae, z, plan), ref)
    del vae, z, ref

    # 2. Wan2.2 TI2V-5B 1280x704x121 in bf16: the headline case.
    if smoke:
        vae = build_vae("2.2", torch.bfloat16, dev, width)
    else:
        with torch.device("cuda"):
            torch.manual_seed(0)
            from diffusers import AutoencoderKLWan

            from vidgen.vae.convert import wan_vae_config

            vae = AutoencoderKLWan(**wan_vae_config("2.2")).eval().requires_grad_(False).to(torch.bfloat16)
    z = latents_for("2.2", args.latent, torch.bfloat16, dev)
    small = latents_for("2.2", "2x8x8", torch.bfloat16, dev)
    with torch.no_grad():      # warm-up: cuDNN picks its algorithms, kernels load
        vae.decode(small)
        _decode_with(vae, small, DecodePlan(1, 1, 4, True, True))
    ref32 = None
    if args.fp32_reference:     # bf16 error of both decoders against the fp32 decode of the same weights
        vae32 = vae.float()
        ref32 = timed(f"wan2.2 fp32 {args.latent} diffusers untiled (reference)",
                      lambda: vae32.decode(z.float()).sample.cpu())
        vae = vae32.to(torch.bfloat16)
        del vae32
    ref = timed(f"wan2.2 bf16 {args.latent} diffusers untiled", lambda: vae.decode(z).sample.cpu())
    if ref32 is not None:
        rows[-1]["max_abs_err_vs_fp32"] = float((ref.float() - ref32).abs().max())
        rows[-1]["mean_abs_err_vs_fp32"] = float((ref.float() - ref32).abs().mean())
    for budget in budgets:
        est = choose_plan(vae, tuple(z.shape), memory_budget=parse_budget(budget))
        p = est.plan
        out = timed(f"wan2.2 bf16 {args.latent} ours budget={budget}", lambda: vv.decode(vae, z, space="vae", memory_budget=budget),
                    ref, plan=f"{p.ny}x{p.nx}:{p.frames_per_step}:{p.tile_from} cl={p.channels_last}",
                    simulated_gib=round(est.peak_bytes / 2**30, 2))
        if ref32 is not None:
            rows[-1]["max_abs_err_vs_fp32"] = float((out.float() - ref32).abs().max())
            rows[-1]["mean_abs_err_vs_fp32"] = float((out.float() - ref32).abs().mean())
        del out
    vae.enable_tiling()
    tiled = timed(f"wan2.2 bf16 {args.latent} diffusers enable_tiling()", lambda: vae.decode(z).sample.cpu(), ref)
    if ref32 is not None:
        rows[-1]["max_abs_err_vs_fp32"] = float((tiled.float() - ref32).abs().max())
    vae.disable_tiling()
    del tiled
    p = choose_plan(vae, tuple(z.shape), memory_budget=parse_budget(budgets[1])).plan
    alt = DecodePlan(p.ny, p.nx, p.frames_per_step, True, not p.channels_last, p.tile_from)
    timed(f"wan2.2 bf16 {args.latent} ours {budgets[1]} plan, cl={alt.channels_last}", lambda: _decode_with(vae, z, alt),
          ref)
    # The CPU's four-2x2-conv upsample (DecodePlan.subpixel), tried on the GPU: whether cuDNN gains too
    sub = dataclasses.replace(p, subpixel=True)
    out = timed(f"wan2.2 bf16 {args.latent} ours {budgets[1]} plan, subpixel upsample", lambda: _decode_with(vae, z, sub),
                ref)
    if ref32 is not None:
        rows[-1]["max_abs_err_vs_fp32"] = float((out.float() - ref32).abs().max())
        rows[-1]["mean_abs_err_vs_fp32"] = float((out.float() - ref32).abs().mean())
    del out
    print("\n| case | time s | peak GiB (weights incl.) | plan | max abs diff vs diffusers | max / mean abs err vs fp32 |"
          "\n|---|---|---|---|---|---|")
    for r in rows:
        err = f"{r['max_abs_err_vs_fp32']:.4f} / {r.get('mean_abs_err_vs_fp32', float('nan')):.5f}" \
            if "max_abs_err_vs_fp32" in r else ""
        diff = r.get("max_abs_diff_vs_diffusers")
        print(f"| {r['case']} | {r['time_s']} | {r['peak_total_gib']} | {r.get('plan', '')} "
              f"| {'' if diff is None else f'{diff:.2e}'} | {err} |")


def _decode_with(vae, z, plan):
    """Decode with a fixed plan (bypassing the planner), assembled on the host like vidgen.vae.decode."""
    from vidgen.vae.decoder import decode_chunks

    s = vae.config.scale_factor_spatial
    _, _, t, h, w = z.shape
    out = torch.empty(1, 3, 1 + 4 * (t - 1), h * s, w * s, dtype=z.dtype)
    for frame, tile, px, _ in decode_chunks(vae, z, plan):
        out[0, :, frame:frame + px.shape[2], tile.y0 * s:tile.y1 * s, tile.x0 * s:tile.x1 * s] = px[0].cpu()
    return out


def silu_exp(args) -> None:
    """Whole decode on the torch backend with SiLU's exp spelled out (reference.exp_f32, what every
    backend computes) vs torch's F.silu, in one process, alternating; medians and the difference."""
    import torch.nn.functional as F

    from vidgen.ops import reference
    from vidgen.vae import decode

    vae = build_vae(args.vae, torch.float32)
    t, h, w = (int(v) for v in args.latent.split("x"))
    z = torch.randn(1, vae.config.z_dim, t, h, w, generator=torch.Generator().manual_seed(0))
    variants = {"exp_f32": reference.silu_f32_, "F.silu": lambda y: F.silu(y, inplace=True)}
    times, outs = {k: [] for k in variants}, {}
    try:
        for _ in range(args.reps):
            for name, fn in variants.items():
                reference.silu_f32_ = fn            # the twin looks it up at each call
                t0 = time.perf_counter()
                with torch.no_grad():
                    outs[name] = decode(vae, z, space="vae", kernels="torch")
                times[name].append(time.perf_counter() - t0)
    finally:
        reference.silu_f32_ = variants["exp_f32"]
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    print(json.dumps({"vae": args.vae, "latent": args.latent, "reps": args.reps,
                      "times_s": {k: [round(x, 3) for x in v] for k, v in times.items()},
                      "median_s": {k: round(v, 3) for k, v in med.items()},
                      "ratio": round(med["exp_f32"] / med["F.silu"], 3),
                      "max_abs_diff": float((outs["exp_f32"] - outs["F.silu"]).abs().max())}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--vae", default="2.1", choices=["2.1", "2.2"])
    r.add_argument("--latent", default="5x32x32")
    r.add_argument("--impl", default="ours", choices=["ours", "diffusers", "diffusers-tiled"])
    r.add_argument("--dtype", default="float32", choices=list(DTYPES))
    r.add_argument("--device", default="cpu")
    r.add_argument("--budget")
    r.add_argument("--plan", help="force a plan NYxNX:FRAMES[:TILE_FROM[:file]], e.g. 1x2:1:2 (ours only; file: phase-1 "
                   "results in a temporary file)")
    r.add_argument("--reference-mib", type=float)
    r.add_argument("--save")
    r.add_argument("--base-dim", type=int, help="scale the VAE to this base width (default: the real width)")
    r.add_argument("--kernels", default="auto", help="vae.kernels for ours (auto, torch, reference, ...)")
    s = sub.add_parser("suite")
    s.add_argument("--quick", action="store_true")
    s.add_argument("--dtype", default="float32", choices=list(DTYPES))
    s.add_argument("--cases", help="VERSION:WIDTH:LATENT,... with WIDTH a base_dim or 'full', e.g. 2.1:32:3x16x16")
    s.add_argument("--reps", type=int, default=1, help="rounds, each decoder once per round, alternating")
    s.add_argument("--tiled", action="store_true", help="also diffusers' enable_tiling()")
    s.add_argument("--kernels", default="auto")
    s.add_argument("--fp64", action="store_true",
                   help="also decode once in float64 (diffusers) and give each decoder's max abs diff from it")
    m = sub.add_parser("simulate")
    m.add_argument("--vae", default="2.2", choices=["2.1", "2.2"])
    m.add_argument("--latent", default="31x44x80")
    m.add_argument("--dtype", default="bfloat16", choices=list(DTYPES))
    m.add_argument("--device-type", default="cuda")
    m.add_argument("--budget")
    sub.add_parser("validate")
    g = sub.add_parser("gpu")
    g.add_argument("--latent", default="31x44x80")
    g.add_argument("--fp32-reference", action="store_true", help="also decode in fp32 to measure bf16 error")
    g.add_argument("--smoke", action="store_true", help="the same code on the CPU, tiny widths (checks the script)")
    e = sub.add_parser("silu-exp")
    e.add_argument("--vae", default="2.1", choices=["2.1", "2.2"])
    e.add_argument("--latent", default="3x16x24")
    e.add_argument("--reps", type=int, default=4)
    args = p.parse_args()
    if args.cmd == "silu-exp":
        silu_exp(args)
    elif args.cmd == "run":
        print(json.dumps(run_case(args)))
    elif args.cmd == "suite":
        suite(args)
    elif args.cmd == "simulate":
        simulate(args)
    elif args.cmd == "gpu":
        gpu(args)
    else:
        validate(args)


if __name__ == "__main__":
    main()
