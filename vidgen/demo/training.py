"""What the demo's training stages share (vidgen.demo.train, vidgen.demo.outline_lora): atomic
checkpoints read with `torch.load(weights_only=True)`, resumable state, step logging, and the
flow-matching sample of a training step."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import numpy as np
import torch

log = logging.getLogger("vidgen")


def _save(path: Path, state: dict) -> None:
    tmp = path.with_name(f".{path.name}.partial")
    torch.save(state, tmp)
    os.replace(tmp, path)


def _publish(tmp: Path, out: Path) -> Path:
    """Move an exported folder written at `tmp` into place at `out` (an earlier export there replaced)."""
    import shutil

    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out


@torch.no_grad()
def _ema(pairs, step: int, ema_decay: float) -> None:
    """Move each (ema copy, model) pair's copy towards the model, with the warm-up decay
    min(ema_decay, (1 + step) / (10 + step))."""
    decay = min(ema_decay, (1 + step) / (10 + step))
    for ema, model in pairs:
        for pe, pm in zip(ema.parameters(), model.parameters()):
            pe.lerp_(pm, 1 - decay)


def _load(path: Path) -> dict | None:
    return torch.load(path, map_location="cpu", weights_only=True) if path.is_file() else None


def _resume(path: Path, modules: dict, opt, stage: str) -> tuple[int, float, np.random.Generator | None]:
    """Load a stage's checkpoint into `modules` (state-dict key -> module) and `opt`, if there is one.

    Returns:
        (step, elapsed seconds, data generator to continue with, or None when starting afresh).
    """
    state = _load(path)
    if state is None:
        return 0, 0.0, None
    for key, module in modules.items():
        module.load_state_dict(state[key])
    opt.load_state_dict(state["optim"])
    step, elapsed = int(state["step"]), float(state["elapsed"])
    log.info("resuming the %s stage at step %d (%.1f min so far)", stage, step, elapsed / 60)
    return step, elapsed, np.random.default_rng(state["rng"].numpy().tolist())


def _snapshot(modules: dict, opt, step: int, elapsed: float, rng: np.random.Generator, **extra) -> dict:
    """A stage's checkpoint: weights, optimiser, progress, and a seed to continue the data generator."""
    seed_now = torch.from_numpy(rng.integers(0, 2**31 - 1, size=4).astype(np.int64))
    return {**{key: module.state_dict() for key, module in modules.items()}, "optim": opt.state_dict(),
            "step": step, "elapsed": elapsed, "rng": seed_now, **extra}


def _finish(report: Path, ckpt_path: Path, state: dict, metrics: dict, step: int, elapsed: float) -> dict:
    """End a stage's run: the last checkpoint, and its metrics (with step and minutes) as JSON."""
    _save(ckpt_path, state)
    metrics.update(step=step, minutes=elapsed / 60)
    report.write_text(json.dumps(metrics, indent=2))
    return metrics


def _log_step(stage: str, step: int, loss: float, losses: list[float], t0: float, metrics: dict) -> dict:
    """Keep `loss`; every 50 steps log the mean since the last report and return it as the metrics."""
    losses.append(loss)
    if step % 50:
        return metrics
    metrics = {"loss": float(np.mean(losses)), "step": step}
    losses.clear()
    log.info("%s step %d  loss %.4f  (%.2f s/step)", stage, step, metrics["loss"], time.perf_counter() - t0)
    return metrics


def _noised(x0: torch.Tensor, rng: np.random.Generator, shift: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A flow-matching training sample as Wan's: (x_t = (1 - s) x_0 + s noise, the timesteps 1000 s,
    the target noise - x_0), s drawn from the shifted map of U(0, 1) and the noise from a seed drawn
    from `rng` (in that order, so a resumed run draws the same)."""
    from vidgen.sampling import flow_shift

    sigma = flow_shift(torch.from_numpy(rng.random(len(x0))).float(), shift)
    noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(int(rng.integers(0, 2**31 - 1))))
    s = sigma.view(-1, *([1] * (x0.dim() - 1)))
    return (1 - s) * x0 + s * noise, sigma * 1000, noise - x0
