"""The whole-render memory plan against measurement.

    python bench/memory.py validate                 # CPU: simulated activation peak vs measured RSS growth
    python bench/memory.py fp8-error --steps 8      # CPU: latents error of fp8 storage vs bf16, next to bf16 vs fp32
    python bench/memory.py gpu                      # CUDA: each policy under each memory cap (bench/gpu_memory.sh)
    SMOKE=1 python bench/memory.py gpu              # the same code on a tiny config, on the CPU
    python bench/memory.py host                     # CPU: host RSS loading a 1.3B transformer, diffusers vs vidgen
    python bench/memory.py experts                  # CPU: two streamed 1.3B experts, the idle one in RAM or its files

Transformers are built from the shipped real configs (vidgen/variants) with seeded random weights;
`validate` and `fp8-error` use Wan2.1-1.3B's config at its real width with fewer blocks. Figures go
to docs/memory.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vidgen.families import VARIANTS_DIR  # noqa: E402
from vidgen.footprint import transformer_activations  # noqa: E402


def _config(variant: str, **changes) -> dict:
    conf = json.loads((VARIANTS_DIR / variant / "transformer" / "config.json").read_text())
    conf = {k: v for k, v in conf.items() if not k.startswith("_")}
    return {**conf, **changes}


def _model(conf: dict, dtype: torch.dtype, device: str, seed: int = 0):
    """A transformer of `conf` (its class: families.transformer_class) with seeded random weights on
    `device`: built on meta, then given storage there (diffusers' own init of a 14 B model on a CPU
    takes minutes)."""
    import diffusers

    from vidgen.families import transformer_class

    with torch.device("meta"):
        model = getattr(diffusers, transformer_class(conf)).from_config(conf)
    model = model.to_empty(device=device).to(dtype).eval().requires_grad_(False)
    g = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02, generator=g)
    rope = model.rope          # its tables are computed at construction, not learned: build them for real
    with torch.device(device):
        model.rope = type(rope)(rope.attention_head_dim, rope.patch_size, rope.max_seq_len)
    return model


def _inputs(conf: dict, shape: tuple[int, ...], dtype: torch.dtype, device: str, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    b, _, t, h, w = shape
    x = torch.randn(b, conf["in_channels"], t, h, w, generator=g).to(device, dtype)
    text = (torch.randn(b, 512, conf["text_dim"], generator=g) * 0.1).to(device, dtype)
    return x, text


def _rss_peak() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def _rss_now() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def validate_one(args) -> dict:
    """One case in this process: a real forward's peak RSS growth against the simulated peak."""
    conf = _config("wan2.1-t2v-1.3b", num_layers=args.layers)
    shape = tuple(int(v) for v in args.latent.split("x"))
    shape = (1, 16, *shape)
    model = _model(conf, torch.float32, "cpu")
    x, text = _inputs(conf, shape, torch.float32, "cpu")
    t = torch.tensor([500.0])
    with torch.no_grad():           # warm-up at a small size: first-call allocations are not activations
        model(hidden_states=x[:, :, :1, :8, :8], timestep=t, encoder_hidden_states=text, return_dict=False)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = _rss_now()
    with torch.no_grad():
        model(hidden_states=x, timestep=t, encoder_hidden_states=text, return_dict=False)
    measured = _rss_peak() - base
    from vidgen.vae.memsim import LiveBytes

    live = LiveBytes("cpu")         # the same forward's live tensor bytes: the simulator's own quantity
    with live, torch.no_grad():
        model(hidden_states=x, timestep=t, encoder_hidden_states=text, return_dict=False)
    simulated = transformer_activations(json.dumps(conf, sort_keys=True), torch.float32, shape, 512, False, "cpu")
    tokens = shape[2] * (shape[3] // 2) * (shape[4] // 2)
    return {"latent": args.latent, "tokens": tokens, "layers": args.layers, "measured_mib": round(measured / 2**20, 1),
            "live_tensors_mib": round(live.peak / 2**20, 1), "simulated_mib": round(simulated / 2**20, 1), "ratio": round(measured / simulated, 3)}


def validate(args) -> None:
    import subprocess

    rows = []
    for latent in args.latents.split(","):
        out = subprocess.run([sys.executable, __file__, "validate-one", "--latent", latent, "--layers", str(args.layers)],
                             capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    print("| latent (T x h x w) | tokens | RSS growth MiB | live tensors MiB (real run) | simulated MiB | RSS / simulated |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['latent']} | {r['tokens']} | {r['measured_mib']} | {r['live_tensors_mib']} | {r['simulated_mib']} "
              f"| {r['ratio']} |")


def fp8_error(args) -> None:
    """Euler flow-matching sampling with the same noise and weights stored three ways: fp32, bf16,
    and fp8 storage (layerwise casting) computed in bf16; max and mean abs error of the latents."""
    from vidgen.sampling import schedule

    conf = _config("wan2.1-t2v-1.3b", num_layers=args.layers)
    shape = (1, 16, *(int(v) for v in args.latent.split("x")))
    noise, text = _inputs(conf, shape, torch.float32, "cpu", seed=3)
    sched = schedule("euler", args.steps, 5.0, "wan")
    out = {}
    for name, dtype, fp8 in [("fp32", torch.float32, False), ("bf16", torch.bfloat16, False),
                             ("fp8", torch.bfloat16, True)]:
        model = _model(conf, dtype, "cpu")
        if fp8:
            model.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.bfloat16)
        x = noise.clone()
        t0 = time.perf_counter()
        with torch.no_grad():
            for i, t in enumerate(sched.timesteps):
                v = model(hidden_states=x.to(dtype), timestep=t.reshape(1), encoder_hidden_states=text.to(dtype),
                          return_dict=False)[0].float()
                x = x + (sched.sigmas[i + 1] - sched.sigmas[i]) * v
        out[name] = x
        print(json.dumps({"storage": name, "seconds": round(time.perf_counter() - t0, 1)}), flush=True)
    scale = out["fp32"].abs().mean().item()
    rows = {k: {"max_abs": (out[k] - ref).abs().max().item(), "mean_abs": (out[k] - ref).abs().mean().item()}
            for k, ref in [("bf16", out["fp32"]), ("fp8", out["bf16"])]}
    print(json.dumps({"latent": args.latent, "layers": args.layers, "steps": args.steps,
                      "mean_abs_latent": scale, "bf16_vs_fp32": rows["bf16"], "fp8_vs_bf16": rows["fp8"]}))


def gpu(args) -> None:
    """Each policy (resident bf16, fp8 storage, streamed blocks bf16 / fp8) for each model under each
    memory cap: peak max_memory_allocated, ms per forward, ratio to resident bf16 uncapped."""
    from vidgen.loading import Components
    from vidgen.residency import Residency

    smoke = os.environ.get("SMOKE") == "1"
    device = "cpu" if smoke else "cuda"
    dtype = torch.float32 if smoke else torch.bfloat16
    cases = [("wan2.2-t2v-a14b", [(21, 60, 104)], [24, 12]), ("wan2.2-t2v-a14b", [(21, 90, 160)], [24]),
             ("wan2.2-ti2v-5b", [(31, 44, 80)], [8])]       # 832x480x81 and 1280x720x81; 1280x704x121
    if smoke:
        cases = [("wan2.1-t2v-1.3b", [(2, 8, 8)], [1])]
    policies = [("resident", "bf16"), ("resident", "fp8"), ("stream_blocks", "bf16"), ("stream_blocks", "fp8")]
    for variant, shapes, caps in cases:
        conf = _config(variant, **({"num_layers": 2, "num_attention_heads": 2} if smoke else {}))
        for shape in shapes:
            lat = (1, 48 if "5b" in variant else 16, *shape)
            base = None
            for cap in [None, *caps]:
                for placement, weights in policies:
                    if cap is None and (placement, weights) != ("resident", "bf16"):
                        continue
                    if device == "cuda":        # build uncapped, then cap: the cap is on what the policy holds
                        torch.cuda.set_per_process_memory_fraction(1.0)
                    model = _model(conf, dtype, device)
                    if placement == "stream_blocks":
                        model.to("cpu")
                    comps = Components(info=None, tokenizer=None, text_encoder=None, vae=None, experts=[model],
                                       device=torch.device(device), dtype=dtype)
                    plan = SimpleNamespace(fp8=weights == "fp8", streams=placement == "stream_blocks", swaps=False)
                    row = {"model": variant, "latent": "x".join(map(str, shape)), "cap_gib": cap, "placement": placement,
                           "weights": weights}
                    try:
                        Residency(plan, torch.device(device)).apply(comps)
                        if device == "cuda":
                            torch.cuda.empty_cache()
                            total = torch.cuda.get_device_properties(0).total_memory
                            torch.cuda.set_per_process_memory_fraction(1.0 if cap is None else cap * 2**30 / total)
                        x, text = _inputs(conf, lat, dtype, device)
                        per_token = conf["in_channels"] == 48      # TI2V-5B: a timestep per token, as vidgen runs it
                        tokens = shape[0] * (shape[1] // 2) * (shape[2] // 2)
                        t = torch.full((1, tokens) if per_token else (1,), 500.0, device=device)
                        if device == "cuda":
                            torch.cuda.reset_peak_memory_stats()
                        times = []
                        for _ in range(1 if shape[1] >= 90 else args.steps):
                            if device == "cuda":
                                torch.cuda.synchronize()
                            t0 = time.perf_counter()
                            with torch.no_grad():
                                model(hidden_states=x, timestep=t, encoder_hidden_states=text, return_dict=False)
                            if device == "cuda":
                                torch.cuda.synchronize()
                            times.append(time.perf_counter() - t0)
                        ms = 1000 * min(times)
                        row.update(ms_per_forward=round(ms, 1), peak_gib=round(torch.cuda.max_memory_allocated() / 2**30, 2)
                                   if device == "cuda" else None)
                        if base is None:
                            base = ms
                        row["x_resident"] = round(ms / base, 3)
                    except torch.OutOfMemoryError:
                        row["oom"] = True
                    print(json.dumps(row), flush=True)
                    del model, comps
                    if device == "cuda":
                        torch.cuda.empty_cache()


def make_folder(path: Path, variant: str = "wan2.1-t2v-1.3b") -> None:
    """A transformer folder of `variant`'s real config with seeded random bf16 weights (diffusers'
    save_pretrained, safetensors)."""
    if (path / "config.json").is_file():
        return
    model = _model(_config(variant), torch.bfloat16, "cpu")
    model.save_pretrained(path, safe_serialization=True)


HOWS = ("diffusers", "diffusers+fp8", "files", "files+fp8", "diffusers-single", "single", "single+fp8")


def make_single_file(folder: Path) -> None:
    """The folder's transformer as one safetensors file in Wan's original names (as ComfyUI ships it,
    written by tests/layouts.py), and a config root for diffusers' from_single_file(config=...)."""
    single = folder.parent / (folder.name + "-wan-names.safetensors")
    root = folder.parent / "root" / "transformer"
    if not root.is_dir():
        root.mkdir(parents=True)
        (root / "config.json").write_text((folder / "config.json").read_text())
    if not single.is_file():
        sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
        import layouts

        layouts.write_wan_transformer_file(folder, single)


def _rss_parts() -> tuple[int, int]:
    """(anonymous, file-backed) resident bytes: file pages are the page cache of mapped weights,
    which the kernel can drop; anonymous pages are memory the process really holds."""
    parts = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("RssAnon:", "RssFile:")):
                parts[line.split(":")[0]] = int(line.split()[1]) * 1024
    return parts["RssAnon"], parts["RssFile"]


def host_one(args) -> dict:
    """One way of loading the transformer in this process, then one forward: peak and steady RSS."""
    from diffusers import WanTransformer3DModel

    from vidgen.weights import expert_shell, load_weights, open_weights

    folder = Path(args.folder)
    single = folder.parent / (folder.name + "-wan-names.safetensors")
    base = _rss_now()
    anon0, file0 = _rss_parts()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    if args.how == "diffusers":          # the peer: from_pretrained, then .to(device)
        model = WanTransformer3DModel.from_pretrained(folder, torch_dtype=torch.bfloat16).to("cpu")
    elif args.how == "diffusers+fp8":    # what vidgen's fp8 storage does after a from_pretrained load
        model = WanTransformer3DModel.from_pretrained(folder, torch_dtype=torch.bfloat16).to("cpu")
        model.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.bfloat16)
    elif args.how == "diffusers-single":  # the peer for a single file in Wan's names (ComfyUI, Kijai)
        model = WanTransformer3DModel.from_single_file(str(single), config=str(folder.parent / "root"),
                                                       subfolder="transformer", torch_dtype=torch.bfloat16,
                                                       local_files_only=True).to("cpu")
    else:                                 # vidgen: a shell, then tensor by tensor from the folder or the file
        model = expert_shell(json.loads((folder / "config.json").read_text()), torch.bfloat16)
        if args.how.endswith("+fp8"):
            model.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.bfloat16)
        load_weights(model, open_weights("transformer", single if args.how.startswith("single") else folder),
                     torch.device("cpu"))
    loaded_peak, loaded = _rss_peak() - base, _rss_now() - base
    anon1, file1 = _rss_parts()
    conf = dict(model.config)
    x, text = _inputs(conf, (1, 16, 1, 8, 8), torch.bfloat16, "cpu")
    with torch.no_grad():
        model(hidden_states=x, timestep=torch.tensor([500.0]), encoder_hidden_states=text, return_dict=False)
    anon2, file2 = _rss_parts()
    mib = lambda n: round(n / 2**20)   # noqa: E731
    return {"how": args.how, "load_peak_mib": mib(loaded_peak), "after_load_anon_mib": mib(anon1 - anon0),
            "after_load_file_mib": mib(file1 - file0), "peak_with_a_step_mib": mib(_rss_peak() - base),
            "after_step_anon_mib": mib(anon2 - anon0), "after_step_file_mib": mib(file2 - file0)}


def experts_one(args) -> dict:
    """Two experts streamed (stream_blocks) through vidgen's residency.ExpertSwitch in this process, the idle
    one in host memory or in its files: anonymous RSS sampled every 10 ms through loading, each
    expert's turn (one forward) and the release before the decode."""
    import threading

    from vidgen.weights import expert_shell, load_weights, open_weights, stream_blocks
    from vidgen.residency import ExpertSwitch

    folder, device = Path(args.folder), torch.device("cpu")
    conf = json.loads((folder / "config.json").read_text())
    anon0, _ = _rss_parts()
    peak, phase, peaks, done = [0], ["load"], {}, threading.Event()

    def sample():
        while not done.is_set():
            a = _rss_parts()[0] - anon0
            peak[0] = max(peak[0], a)
            peaks[phase[0]] = max(peaks.get(phase[0], 0), a)
            time.sleep(0.01)

    threading.Thread(target=sample, daemon=True).start()
    weights = [open_weights("transformer", folder) for _ in range(2)]
    models = []
    for w in weights:
        model = expert_shell(conf, torch.bfloat16)
        if args.fp8:
            model.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.bfloat16)
        if args.idle == "host":                 # both experts read now, each streamed from host memory
            load_weights(model, w, device)
            stream_blocks(model, device)
        models.append(model)
    placement = ExpertSwitch(models, device, swap=False, files=weights if args.idle == "file" else None, stream=True)
    x, text = _inputs(conf, (1, 16, 1, 8, 8), torch.bfloat16, "cpu")
    for k in range(2):
        phase[0] = f"expert {k}"
        placement.activate(k)
        with torch.no_grad():
            models[k](hidden_states=x, timestep=torch.tensor([500.0]), encoder_hidden_states=text, return_dict=False)
    phase[0] = "released"
    placement.release()
    time.sleep(0.05)
    done.set()
    mib = lambda n: round(n / 2**20)   # noqa: E731
    return {"idle": args.idle, "weights": "fp8" if args.fp8 else "bf16", "anon_peak_mib": mib(peak[0]),
            **{f"{k}_anon_peak_mib": mib(v) for k, v in peaks.items()},
            "after_release_anon_mib": mib(_rss_parts()[0] - anon0)}


def experts(args) -> None:
    import subprocess

    folder = Path(args.folder)
    make_folder(folder)
    for rep in range(args.reps):
        for fp8 in (False, True):
            for idle in ("host", "file"):
                cmd = [sys.executable, __file__, "experts-one", "--folder", str(folder), "--idle", idle]
                out = subprocess.run(cmd + (["--fp8"] if fp8 else []), capture_output=True, text=True, check=True)
                print(json.dumps({"rep": rep, **json.loads(out.stdout.strip().splitlines()[-1])}), flush=True)


def host(args) -> None:
    import subprocess

    folder = Path(args.folder)
    make_folder(folder)
    make_single_file(folder)
    rows = []
    for rep in range(args.reps):
        for how in HOWS:
            out = subprocess.run([sys.executable, __file__, "host-one", "--folder", str(folder), "--how", how],
                                 capture_output=True, text=True, check=True)
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(json.dumps({"rep": rep, **rows[-1]}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("validate")
    v.add_argument("--latents", default="1x16x16,3x16x24,5x30x52")
    v.add_argument("--layers", type=int, default=2)
    v1 = sub.add_parser("validate-one")
    v1.add_argument("--latent", required=True)
    v1.add_argument("--layers", type=int, default=2)
    f = sub.add_parser("fp8-error")
    f.add_argument("--latent", default="3x16x16")
    f.add_argument("--layers", type=int, default=30)
    f.add_argument("--steps", type=int, default=8)
    h = sub.add_parser("host", help="host RSS of loading a real-config 1.3B transformer: diffusers vs vidgen")
    h.add_argument("--folder", default="/tmp/vidgen-bench-wan1.3b")
    h.add_argument("--reps", type=int, default=2)
    h1 = sub.add_parser("host-one")
    h1.add_argument("--folder", required=True)
    h1.add_argument("--how", required=True, choices=HOWS)
    e = sub.add_parser("experts", help="host RSS of two streamed 1.3B experts, the idle one in RAM or in its files")
    e.add_argument("--folder", default="/tmp/vidgen-bench-wan1.3b")
    e.add_argument("--reps", type=int, default=1)
    e1 = sub.add_parser("experts-one")
    e1.add_argument("--folder", required=True)
    e1.add_argument("--idle", required=True, choices=("host", "file"))
    e1.add_argument("--fp8", action="store_true")
    g = sub.add_parser("gpu")
    g.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    if args.cmd == "validate-one":
        print(json.dumps(validate_one(args)))
    elif args.cmd == "host-one":
        print(json.dumps(host_one(args)))
    elif args.cmd == "experts-one":
        print(json.dumps(experts_one(args)))
    else:
        {"validate": validate, "fp8-error": fp8_error, "gpu": gpu, "host": host, "experts": experts}[args.cmd](args)


if __name__ == "__main__":
    main()
