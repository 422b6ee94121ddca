"""Training the demo model in stages, each resumable from its checkpoint.

    python -m vidgen.demo.train vae --run runs/demo --minutes 40     # stage 1: the VAE on full clips

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
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    metrics = train_vae(args.run, minutes=args.minutes, batch=args.batch, lr=args.lr, save_every=args.save_every,
                        seed=args.seed)
    print(json.dumps(metrics))


if __name__ == "__main__":
    main()
