"""Training the demo model in stages, each resumable from its checkpoint (docs/demo.md has the times).

    python -m vidgen.demo.train vae --run runs/demo --crop 32 --lr 1e-3 --minutes 32   # 1a: VAE on 32x32 windows
    python -m vidgen.demo.train vae --run runs/demo --lr 3e-4 --minutes 9              # 1b: VAE on whole frames
    python -m vidgen.demo.train vae-eval --run runs/demo --strip runs/demo/vae-strip.png
    python -m vidgen.demo.train latents --run runs/demo                                # 2: latent cache
    python -m vidgen.demo.train dit --run runs/demo --minutes 45                       # 3a: transformer + text encoder
    python -m vidgen.demo.train dit --run runs/demo --minutes 16 --first-frame-weight 3 # 3b
    python -m vidgen.demo.train export --run runs/demo --out samples/demo-wan          # 4: the pipeline folder
    python -m vidgen.demo.train lora --run runs/demo-lora --minutes 16                 # 5: the outline LoRA
    python -m vidgen.demo.train lora-export --run runs/demo-lora --out samples/demo-outline-lora.safetensors

Stage 1 trains a narrow Wan2.1-layout `AutoencoderKLWan` on whole 17-frame clips (a VAE trained
on 5-frame clips and decoded at 17 collapses after the first temporal chunk) with an
object-weighted L1 + MSE loss on the decoder's unclamped output and a small KL term; stage 2
encodes fresh clips of every training combination; stage 3 trains the transformer and the text
encoder together with Wan's flow matching. Every stage is seeded and saves its state (weights,
optimiser, step, data RNG) atomically every `--save-every` steps and at the end; run the same
command again to continue.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path

import numpy as np
import torch

from .training import _ema, _finish, _load, _log_step, _noised, _publish, _resume, _save, _snapshot
from .data import BACKGROUNDS, make_batch, prompt_for, split
from .models import VAE_CONFIG, build_vae
from .outline_lora import export_lora, train_lora

log = logging.getLogger("vidgen")

def decode_unclamped(vae, z: torch.Tensor) -> torch.Tensor:
    """`vae.decode(z)` before its final clamp to [-1, 1].

    Training must see the unclamped output: the clamp has zero gradient wherever the output lies
    beyond +-1, so a decoder that paints a black (-1) background below -1 everywhere can never
    learn the object painted over it. That was the first run's collapse (53% of the object's
    pixel values sat on the dead side of the clamp). The decoder's own outputs are collected per
    temporal chunk with a forward hook, so the decode is diffusers' own code path.
    """
    chunks: list[torch.Tensor] = []
    hook = vae.decoder.register_forward_hook(lambda _m, _i, out: chunks.append(out))
    try:
        vae.decode(z)
    finally:
        hook.remove()
    return torch.cat(chunks, 2)


def foreground_mask(clips: torch.Tensor, backgrounds: list[str]) -> torch.Tensor:
    """[B, 1, F, H, W] bool: pixels that differ from each clip's background colour."""
    rgb = torch.tensor([BACKGROUNDS[name] for name in backgrounds], dtype=clips.dtype) / 127.5 - 1.0
    return (clips - rgb.view(-1, 3, 1, 1, 1)).abs().amax(1, keepdim=True) > 0.05


def vae_loss(vae, clips: torch.Tensor, backgrounds: list[str], kl_weight: float,
             fg_weight: float = 3.0) -> tuple[torch.Tensor, dict]:
    """Reconstruction (L1 + MSE, object pixels weighted `fg_weight`) of full clips [B, 3, F, H, W]
    in [-1, 1] on the decoder's unclamped output, plus a small KL term.

    The decoder sees the posterior mean. Sampling the posterior from the start drowns the signal:
    at step 150 of a second run the posterior std was 1.1 against a spread of 1.8 in the means,
    and the object had not appeared; the KL weight that would shrink that std is negligible here.
    """
    posterior = vae.encode(clips).latent_dist
    recon = decode_unclamped(vae, posterior.mean)
    fg = foreground_mask(clips, backgrounds)
    weight = (1.0 + (fg_weight - 1.0) * fg.float()).expand_as(clips)
    err = recon - clips
    l1 = (weight * err.abs()).sum() / weight.sum()
    mse = (weight * err**2).sum() / weight.sum()
    kl = posterior.kl().mean() / clips[0].numel()
    loss = l1 + mse + kl_weight * kl
    clamped = (recon.clamp(-1, 1) - clips) ** 2
    fg_mse = clamped[fg.expand_as(clips)].mean()
    return loss, {"l1": l1.item(), "mse": mse.item(), "kl": kl.item(),
                  "psnr": (10 * torch.log10(4 / clamped.mean())).item(),
                  "fg_psnr": (10 * torch.log10(4 / fg_mse)).item()}


def train_vae(run: Path, *, minutes: float, batch: int = 4, lr: float = 4e-4, kl_weight: float = 1e-4,
              fg_weight: float = 3.0, warmup: int = 50, crop: int = 0,
              save_every: int = 50, seed: int = 0, size: int = 64, frames: int = 17,
              config: dict | None = None, max_steps: int | None = None) -> dict:
    """Train (or continue) stage 1 for `minutes` of wall time; returns the last metrics."""
    run.mkdir(parents=True, exist_ok=True)
    ckpt_path = run / "vae.ckpt"
    torch.manual_seed(seed)
    vae = build_vae(config).train()
    opt = torch.optim.AdamW(vae.parameters(), lr=lr, weight_decay=0.0)
    train_combos, _ = split(seed=0)
    modules = {"model": vae}
    step, elapsed, resumed = _resume(ckpt_path, modules, opt, "VAE")
    rng = resumed or np.random.default_rng(seed)

    def snapshot() -> dict:
        return _snapshot(modules, opt, step, elapsed, rng, config=json.dumps(config or VAE_CONFIG))

    start, metrics = time.perf_counter(), {}
    while (time.perf_counter() - start) < minutes * 60 and (max_steps is None or step < max_steps):
        t0 = time.perf_counter()
        picks = [train_combos[i] for i in rng.integers(0, len(train_combos), size=batch)]
        clips, _ = make_batch(picks, rng, size=size, frames=frames)
        if 0 < crop < size:  # the same random window of every clip: 4x cheaper steps at crop = size / 2
            y, x = (int(v) for v in rng.integers(0, size - crop + 1, size=2))
            clips = clips[..., y:y + crop, x:x + crop].contiguous()
        for group in opt.param_groups:
            group["lr"] = lr * min(1.0, (step + 1) / warmup)
        loss, metrics = vae_loss(vae, clips, [c.background for c in picks], kl_weight, fg_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        opt.step()
        step += 1
        elapsed += time.perf_counter() - t0
        if step % 10 == 0:
            log.info("vae step %d  l1 %.4f  psnr %.2f dB  object psnr %.2f dB  kl %.3g  (%.2f s/step)", step,
                     metrics["l1"], metrics["psnr"], metrics["fg_psnr"], metrics["kl"], time.perf_counter() - t0)
        if step % save_every == 0:
            _save(ckpt_path, snapshot())
    return _finish(run / "vae.json", ckpt_path, snapshot(), metrics, step, elapsed)


@torch.no_grad()
def eval_vae(run: Path, *, clips_per_combo: int = 2, seed: int = 1, strip: Path | None = None,
             limit: int | None = None) -> dict:
    """Reconstruct clips of the held-out combinations: PSNR, and the pixel metrics on the reconstructions.

    Decodes with vidgen's exact decoder (the path renders take). Optionally writes a frame strip
    (every 4th frame of the first clips, originals above reconstructions) to `strip`.
    """
    import vidgen.vae as vv

    from .metrics import evaluate, summarize

    vae, step = _load_vae(run)
    _, held_out = split(seed=0)
    held_out = held_out[:limit]
    rng = np.random.default_rng(seed)
    results, psnrs, rows = [], [], []
    for combo in held_out:
        clips, _ = make_batch([combo] * clips_per_combo, rng)
        z = vae.encode(clips).latent_dist.mode()
        for i in range(clips_per_combo):
            recon = vv.decode(vae, z[i:i + 1], space="vae")[0]          # [3, F, H, W]
            psnrs.append((10 * torch.log10(4 / ((recon - clips[i]) ** 2).mean())).item())
            frames = vv.to_uint8(recon.movedim(1, 0)).numpy()          # [F, H, W, 3]
            results.append(evaluate(frames, combo))
            if strip is not None and len(rows) < 8:
                orig = vv.to_uint8(clips[i].movedim(1, 0)).numpy()
                rows += [np.concatenate(list(orig[::4]), 1), np.concatenate(list(frames[::4]), 1)]
    if strip is not None:
        from PIL import Image

        Image.fromarray(np.concatenate(rows, 0)).save(strip)
    out = {"step": step, "psnr_db": float(np.mean(psnrs)), **summarize(results)}
    (run / "vae-eval.json").write_text(json.dumps(out, indent=2))
    return out


def _load_vae(run: Path, *, latents_mean=None, latents_std=None):
    """The trained VAE of `run` (optionally with latent statistics in its config), and its step."""
    state = _load(run / "vae.ckpt")
    if state is None:
        raise SystemExit(f"no VAE checkpoint in {run}: run `python -m vidgen.demo.train vae --run {run}` first")
    config = json.loads(state["config"])
    if latents_mean is not None:
        config.update(latents_mean=[float(v) for v in latents_mean], latents_std=[float(v) for v in latents_std])
    vae = build_vae(config).eval()
    vae.load_state_dict(state["model"])
    return vae, int(state["step"])


@torch.no_grad()
def cache_latents(run: Path, *, clips_per_combo: int = 64, batch: int = 16, seed: int = 2,
                  limit: int | None = None) -> dict:
    """Stage 2: encode fresh clips of every training combination with the trained VAE (posterior mean).

    Writes `latents.safetensors` (latents [N, z, 5, 8, 8], combination index per clip, per-channel
    mean and std). Resumable: combinations already encoded are kept in `latents.partial.safetensors`.
    """
    from safetensors.torch import load_file, save_file

    out, partial = run / "latents.safetensors", run / "latents.partial.safetensors"
    if out.is_file():
        log.info("%s exists; delete it to encode again", out)
        return {"clips": int(load_file(out)["combo"].numel())}
    vae, _ = _load_vae(run)
    train_combos, _ = split(seed=0)
    train_combos = train_combos[:limit]   # a limit is for quick checks: the dit stage then sees those only
    lat, idx = [], []
    if partial.is_file():
        saved = load_file(partial)
        lat, idx = [saved["latents"]], [saved["combo"]]
    done = int(torch.cat(idx).max()) + 1 if idx else 0
    t0 = time.perf_counter()
    for ci in range(done, len(train_combos)):
        # A generator per combination, so a resumed run encodes exactly the same clips.
        rng = np.random.default_rng([seed, ci])
        for start in range(0, clips_per_combo, batch):
            clips, _ = make_batch([train_combos[ci]] * min(batch, clips_per_combo - start), rng)
            lat.append(vae.encode(clips).latent_dist.mode())
            idx.append(torch.full((len(clips),), ci, dtype=torch.int64))
        if (ci + 1) % 16 == 0 and ci + 1 < len(train_combos):
            save_file({"latents": torch.cat(lat), "combo": torch.cat(idx)}, partial)
            log.info("latents: %d of %d combinations (%.0f s)", ci + 1, len(train_combos), time.perf_counter() - t0)
    latents, combo = torch.cat(lat).contiguous(), torch.cat(idx)
    dims = [0, 2, 3, 4]
    mean, std = latents.mean(dims), latents.std(dims)
    tmp = run / ".latents.safetensors.partial"
    save_file({"latents": latents, "combo": combo, "mean": mean, "std": std}, tmp)
    os.replace(tmp, out)
    partial.unlink(missing_ok=True)
    stats = {"clips": int(combo.numel()), "shape": list(latents.shape[1:]), "mean": mean.tolist(), "std": std.tolist(),
             "seconds": time.perf_counter() - t0}
    (run / "latents.json").write_text(json.dumps(stats, indent=2))
    return stats


def train_dit(run: Path, *, minutes: float, batch: int = 32, lr: float = 5e-4, warmup: int = 200,
              ema_decay: float = 0.999, drop_prompt: float = 0.1, shift: float | None = None, seed: int = 0,
              save_every: int = 250, max_steps: int | None = None, transformer_config: dict | None = None,
              text_config: dict | None = None, first_frame_weight: float = 1.0) -> dict:
    """Stage 3: the transformer and the text encoder together, with Wan's flow matching.

    x_t = (1 - s) x_0 + s * noise, the model predicts noise - x_0 at timestep 1000 s, with s drawn
    from the shifted distribution s = shift u / (1 + (shift - 1) u), u ~ U(0, 1) (the same map
    Wan's sampler applies to its grid). Latents are normalised with the cache's per-channel mean and
    std (the VAE config's latents_mean/std in the exported folder). `drop_prompt` of the prompts are
    empty, so classifier-free guidance with the empty negative prompt works. An EMA of both models'
    weights is what gets exported. `first_frame_weight` weighs the first latent frame's loss: it
    encodes the first video frame alone, and its normalised latents spread ~0.6 against ~1.1 for
    the others, so an unweighted loss underrates its errors (they show as a smeared first frame).
    """
    from copy import deepcopy

    from safetensors.torch import load_file

    from vidgen.prompt import embed_prompts

    from .models import FLOW_SHIFT, MAX_SEQUENCE_LENGTH, build_text_encoder, build_tokenizer, build_transformer

    shift = FLOW_SHIFT if shift is None else shift
    cache = load_file(run / "latents.safetensors")
    x0_all = (cache["latents"] - cache["mean"].view(1, -1, 1, 1, 1)) / cache["std"].view(1, -1, 1, 1, 1)
    train_combos, _ = split(seed=0)
    prompts = [prompt_for(*combo) for combo in train_combos]
    combo_of = cache["combo"].tolist()

    torch.manual_seed(seed)
    tokenizer = build_tokenizer(run / "tokenizer")
    text_encoder = build_text_encoder(len(tokenizer), text_config).train()
    transformer = build_transformer(transformer_config).train()
    ema_te, ema_tr = deepcopy(text_encoder).eval(), deepcopy(transformer).eval()
    params = list(transformer.parameters()) + list(text_encoder.parameters())
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    modules = {"transformer": transformer, "text_encoder": text_encoder, "ema_transformer": ema_tr,
               "ema_text_encoder": ema_te}
    ckpt_path = run / "dit.ckpt"
    step, elapsed, resumed = _resume(ckpt_path, modules, opt, "transformer")
    rng = resumed or np.random.default_rng(seed)
    frame_weight = torch.ones(x0_all.shape[2])
    frame_weight[0] = first_frame_weight

    def snapshot() -> dict:
        return _snapshot(modules, opt, step, elapsed, rng, shift=shift,
                         transformer_config=json.dumps(transformer_config or {}),
                         text_config=json.dumps(text_config or {}))

    cpu = torch.device("cpu")
    start, metrics, losses = time.perf_counter(), {}, []
    while (time.perf_counter() - start) < minutes * 60 and (max_steps is None or step < max_steps):
        t0 = time.perf_counter()
        for group in opt.param_groups:
            group["lr"] = lr * min(1.0, (step + 1) / warmup)
        pick = rng.integers(0, len(x0_all), size=batch)
        x0 = x0_all[torch.from_numpy(pick)]
        texts = ["" if rng.random() < drop_prompt else prompts[combo_of[i]] for i in pick]
        xt, timesteps, target = _noised(x0, rng, shift)
        emb = embed_prompts(tokenizer, text_encoder, texts, max_sequence_length=MAX_SEQUENCE_LENGTH, device=cpu,
                            dtype=torch.float32)
        pred = transformer(xt, timesteps, encoder_hidden_states=emb).sample
        loss = (((pred - target) ** 2).mean((0, 1, 3, 4)) * frame_weight).sum() / frame_weight.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        _ema([(ema_tr, transformer), (ema_te, text_encoder)], step, ema_decay)
        step += 1
        elapsed += time.perf_counter() - t0
        metrics = _log_step("dit", step, loss.item(), losses, t0, metrics)
        if step % save_every == 0:
            _save(ckpt_path, snapshot())
    return _finish(run / "dit.json", ckpt_path, snapshot(), metrics, step, elapsed)


def export(run: Path, out: Path, *, shift: float | None = None) -> Path:
    """Write the trained demo model as a diffusers-format Wan pipeline folder (safetensors).

    The EMA weights of the transformer and text encoder, the VAE with the latent statistics of the
    cache as latents_mean/std, the word-level tokenizer and a flow UniPC scheduler: the folder
    layout `WanPipeline.save_pretrained` writes for real Wan2.1 weights. Written to a temporary
    folder beside `out`, then swapped in.
    """
    import shutil

    from diffusers import WanPipeline
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    from .models import build_scheduler, build_text_encoder, build_transformer

    state = _load(run / "dit.ckpt")
    if state is None:
        raise SystemExit(f"no transformer checkpoint in {run}: run the `dit` stage first")
    cache = load_file(run / "latents.safetensors")
    vae, _ = _load_vae(run, latents_mean=cache["mean"].tolist(), latents_std=cache["std"].tolist())
    tokenizer = AutoTokenizer.from_pretrained(run / "tokenizer")
    text_encoder = build_text_encoder(len(tokenizer), json.loads(state["text_config"]) or None).eval()
    text_encoder.load_state_dict(state["ema_text_encoder"])
    transformer = build_transformer(json.loads(state["transformer_config"]) or None).eval()
    transformer.load_state_dict(state["ema_transformer"])
    pipe = WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, transformer=transformer,
                       scheduler=build_scheduler(float(state["shift"]) if shift is None else shift))
    out = Path(out)
    tmp = out.with_name(f".{out.name}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    pipe.save_pretrained(tmp, safe_serialization=True)
    return _publish(tmp, out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m vidgen.demo.train", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="stage", required=True)
    p = sub.add_parser("vae", help="stage 1: the VAE on full 17-frame clips")
    p.add_argument("--run", type=Path, default=Path("runs/demo"))
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--lr", type=float, default=4e-4)
    p.add_argument("--fg-weight", type=float, default=3.0, help="loss weight of the object's pixels")
    p.add_argument("--crop", type=int, default=0, help="train on random CROPxCROP windows of the clips (0 = whole frames)")
    p.add_argument("--save-every", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    e = sub.add_parser("vae-eval", help="reconstruct held-out combinations: PSNR and pixel metrics")
    e.add_argument("--run", type=Path, default=Path("runs/demo"))
    e.add_argument("--strip", type=Path, default=None, help="write a PNG frame strip here")
    c = sub.add_parser("latents", help="stage 2: encode training clips with the trained VAE")
    c.add_argument("--run", type=Path, default=Path("runs/demo"))
    c.add_argument("--clips-per-combo", type=int, default=64)
    d = sub.add_parser("dit", help="stage 3: transformer + text encoder, flow matching")
    d.add_argument("--run", type=Path, default=Path("runs/demo"))
    d.add_argument("--minutes", type=float, default=30.0)
    d.add_argument("--batch", type=int, default=32)
    d.add_argument("--lr", type=float, default=5e-4)
    d.add_argument("--save-every", type=int, default=250)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--first-frame-weight", type=float, default=1.0, help="loss weight of the first latent frame")
    x = sub.add_parser("export", help="write the diffusers-format pipeline folder")
    x.add_argument("--run", type=Path, default=Path("runs/demo"))
    x.add_argument("--out", type=Path, default=Path("samples/demo-wan"))
    lo = sub.add_parser("lora", help="stage 5: the outline LoRA on the exported demo transformer")
    lo.add_argument("--run", type=Path, default=Path("runs/demo-lora"))
    lo.add_argument("--base", type=Path, default=Path("samples/demo-wan"))
    lo.add_argument("--minutes", type=float, default=8.0)
    lo.add_argument("--rank", type=int, default=8)
    lo.add_argument("--batch", type=int, default=16)
    lo.add_argument("--lr", type=float, default=1e-3)
    lo.add_argument("--seed", type=int, default=0)
    le = sub.add_parser("lora-export", help="write the LoRA in the Kijai/ComfyUI key layout")
    le.add_argument("--run", type=Path, default=Path("runs/demo-lora"))
    le.add_argument("--out", type=Path, default=Path("samples/demo-outline-lora.safetensors"))
    le.add_argument("--scale", type=float, default=0.6, help="alpha = scale * rank (the shipped file: 0.6, docs/demo.md)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    if args.stage == "vae-eval":
        print(json.dumps(eval_vae(args.run, strip=args.strip)))
    elif args.stage == "vae":
        print(json.dumps(train_vae(args.run, minutes=args.minutes, batch=args.batch, lr=args.lr,
                                   save_every=args.save_every, seed=args.seed, fg_weight=args.fg_weight, crop=args.crop)))
    elif args.stage == "latents":
        print(json.dumps(cache_latents(args.run, clips_per_combo=args.clips_per_combo)))
    elif args.stage == "dit":
        print(json.dumps(train_dit(args.run, minutes=args.minutes, batch=args.batch, lr=args.lr,
                                   save_every=args.save_every, seed=args.seed,
                                   first_frame_weight=args.first_frame_weight)))
    elif args.stage == "lora":
        print(json.dumps(train_lora(args.run, base=args.base, minutes=args.minutes, rank=args.rank, batch=args.batch,
                                    lr=args.lr, seed=args.seed)))
    elif args.stage == "lora-export":
        print(f"wrote {export_lora(args.run, args.out, args.scale)}")
    else:
        print(f"wrote {export(args.run, args.out)}")


if __name__ == "__main__":
    main()
