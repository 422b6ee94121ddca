"""Checkpoints and logging shared by the demo's training stages (vidgen.demo.train,
vidgen.demo.outline_lora): atomic saves, `torch.load(weights_only=True)`, resumable state."""

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
