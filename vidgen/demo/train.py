"""Training the demo model in stages, each resumable from its checkpoint.

    python -m vidgen.demo.train vae --run runs/demo --minutes 40     # stage 1: the VAE on full clips
    python -m vidgen.demo.train vae-eval --run runs/demo --strip runs/demo/vae-strip.png

Stage 1 trains a narrow Wan2.1-layout `AutoencoderKLWan` on whole 17-frame clips (a VAE trained
on 5-frame clips and decoded at 17 collapses after the first temporal chunk: DESIGN.md §7), with
an L1 + MSE reconstruction loss and a small KL term. Later stages (latent cache; transformer and
text encoder with flow matching) build on its checkpoint. Every stage is seeded and saves its
state (weights, optimiser, step, data RNG) atomically every `--save-every` steps and at the end;
run the same command again to continue.
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

from .data import make_batch, split

log = logging.getLogger("vidgen")

# The demo VAE: Wan2.1 layout (4 stages, causal 3D convs, mid attention), narrow.
VAE_CONFIG = dict(base_dim=16, z_dim=8, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                  temperal_downsample=[False, True, True], latents_mean=[0.0] * 8, latents_std=[1.0] * 8)


def build_vae(config: dict | None = None):
    from diffusers import AutoencoderKLWan

    return AutoencoderKLWan(**(config or VAE_CONFIG))


def _save(path: Path, state: dict) -> None:
    tmp = path.with_name(f".{path.name}.partial")
    torch.save(state, tmp)
    os.replace(tmp, path)


def _load(path: Path) -> dict | None:
    return torch.load(path, map_location="cpu", weights_only=True) if path.is_file() else None


def vae_loss(vae, clips: torch.Tensor, kl_weight: float) -> tuple[torch.Tensor, dict]:
    """Reconstruction (L1 + MSE) of full clips [B, 3, F, H, W] in [-1, 1], plus a small KL term."""
    posterior = vae.encode(clips).latent_dist
    recon = vae.decode(posterior.sample()).sample
    l1 = (recon - clips).abs().mean()
    mse = ((recon - clips) ** 2).mean()
    kl = posterior.kl().mean() / clips[0].numel()
    loss = l1 + mse + kl_weight * kl
    return loss, {"l1": l1.item(), "mse": mse.item(), "kl": kl.item(), "psnr": (10 * torch.log10(4 / mse)).item()}


def train_vae(run: Path, *, minutes: float, batch: int = 4, lr: float = 3e-4, kl_weight: float = 1e-4,
              save_every: int = 50, seed: int = 0, size: int = 64, frames: int = 17,
              config: dict | None = None, max_steps: int | None = None) -> dict:
    """Train (or continue) stage 1 for `minutes` of wall time; returns the last metrics."""
    run.mkdir(parents=True, exist_ok=True)
    ckpt_path = run / "vae.ckpt"
    torch.manual_seed(seed)
    vae = build_vae(config).train()
    opt = torch.optim.AdamW(vae.parameters(), lr=lr, weight_decay=0.0)
    train_combos, _ = split(seed=0)
    rng = np.random.default_rng(seed)
    step, elapsed = 0, 0.0
    state = _load(ckpt_path)
    if state is not None:
        vae.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        step, elapsed = int(state["step"]), float(state["elapsed"])
        rng = np.random.default_rng(state["rng"].numpy().tolist())
        log.info("resuming the VAE stage at step %d (%.1f min so far)", step, elapsed / 60)

    def snapshot() -> dict:
        seed_now = torch.from_numpy(rng.integers(0, 2**31 - 1, size=4).astype(np.int64))
        return {"model": vae.state_dict(), "optim": opt.state_dict(), "step": step, "elapsed": elapsed,
                "rng": seed_now, "config": json.dumps(config or VAE_CONFIG)}

    start, metrics = time.perf_counter(), {}
    while (time.perf_counter() - start) < minutes * 60 and (max_steps is None or step < max_steps):
        t0 = time.perf_counter()
        picks = [train_combos[i] for i in rng.integers(0, len(train_combos), size=batch)]
        clips, _ = make_batch(picks, rng, size=size, frames=frames)
        loss, metrics = vae_loss(vae, clips, kl_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        opt.step()
        step += 1
        elapsed += time.perf_counter() - t0
        if step % 10 == 0:
            log.info("vae step %d  l1 %.4f  psnr %.2f dB  kl %.3g  (%.2f s/step)", step, metrics["l1"],
                     metrics["psnr"], metrics["kl"], time.perf_counter() - t0)
        if step % save_every == 0:
            _save(ckpt_path, snapshot())
    _save(ckpt_path, snapshot())
    metrics.update(step=step, minutes=elapsed / 60)
    (run / "vae.json").write_text(json.dumps(metrics, indent=2))
    return metrics


@torch.no_grad()
def eval_vae(run: Path, *, clips_per_combo: int = 2, seed: int = 1, strip: Path | None = None,
             limit: int | None = None) -> dict:
    """Reconstruct clips of the held-out combinations: PSNR, and the pixel metrics on the reconstructions.

    Decodes with vidgen's exact decoder (the path renders take). Optionally writes a frame strip
    (every 4th frame of the first clips, originals above reconstructions) to `strip`.
    """
    import vidgen.vae as vv

    from .metrics import evaluate, summarize

    state = _load(run / "vae.ckpt")
    if state is None:
        raise SystemExit(f"no checkpoint in {run}")
    vae = build_vae(json.loads(state["config"])).eval()
    vae.load_state_dict(state["model"])
    _, held_out = split(seed=0)
    held_out = held_out[:limit]
    rng = np.random.default_rng(seed)
    results, psnrs, rows = [], [], []
    for combo in held_out:
        clips, _ = make_batch([combo] * clips_per_combo, rng)
        z = vae.encode(clips).latent_dist.mode()
        for i in range(clips_per_combo):
            recon = vv.decode(vae, z[i:i + 1])[0]                       # [3, F, H, W]
            psnrs.append((10 * torch.log10(4 / ((recon - clips[i]) ** 2).mean())).item())
            frames = vv.to_uint8(recon.movedim(1, 0)).numpy()          # [F, H, W, 3]
            results.append(evaluate(frames, combo))
            if strip is not None and len(rows) < 8:
                orig = vv.to_uint8(clips[i].movedim(1, 0)).numpy()
                rows += [np.concatenate(list(orig[::4]), 1), np.concatenate(list(frames[::4]), 1)]
    if strip is not None:
        from PIL import Image

        Image.fromarray(np.concatenate(rows, 0)).save(strip)
    out = {"step": int(state["step"]), "psnr_db": float(np.mean(psnrs)), **summarize(results)}
    (run / "vae-eval.json").write_text(json.dumps(out, indent=2))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m vidgen.demo.train", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="stage", required=True)
    p = sub.add_parser("vae", help="stage 1: the VAE on full 17-frame clips")
    p.add_argument("--run", type=Path, default=Path("runs/demo"))
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--save-every", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    e = sub.add_parser("vae-eval", help="reconstruct held-out combinations: PSNR and pixel metrics")
    e.add_argument("--run", type=Path, default=Path("runs/demo"))
    e.add_argument("--strip", type=Path, default=None, help="write a PNG frame strip here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    if args.stage == "vae-eval":
        print(json.dumps(eval_vae(args.run, strip=args.strip)))
        return
    metrics = train_vae(args.run, minutes=args.minutes, batch=args.batch, lr=args.lr, save_every=args.save_every,
                        seed=args.seed)
    print(json.dumps(metrics))


if __name__ == "__main__":
    main()
