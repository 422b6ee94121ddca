"""Sampler checkpoints: save the denoising state every N steps, resume an interrupted render.

A checkpoint (`NAME.resume.safetensors`, beside the output) holds the sampler state (latents,
the solver's multistep history, the next step) and, in its metadata, the resolved config (seed and
output path filled in). The solvers draw no random numbers after the initial noise, so continuing
from the saved state gives the same latents, bit for bit, as an uninterrupted render.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .config import RenderConfig, to_dict
from .errors import ConfigError, InputError, OutputError
from .sampling import SamplerState

FORMAT = "vidgen-resume-1"

# The settings that decide the sampled latents: a checkpoint only continues a render that agrees on all.
IDENTITY = ("model.path", "model.variant", "model.dtype", "model.max_sequence_length", "prompt", "negative_prompt",
            "image", "image_fit", "size", "num_frames", "seed", "sampling.solver", "sampling.schedule",
            "sampling.steps", "sampling.shift", "sampling.guidance_scale", "sampling.guidance_scale_2",
            "sampling.boundary")


def resume_path(output: Path) -> Path:
    return output.with_name(output.stem + ".resume.safetensors")


def write_safetensors(path: Path, tensors: dict, metadata: dict[str, str], failure: str) -> None:
    """Write `tensors` (moved to contiguous CPU memory) atomically (io.atomic_write_bytes).

    An OSError becomes an OutputError `{failure}: {reason}`, and no partial file is left behind.
    Serialised in memory and written with open(), so the file gets the user's umask like the video
    next to it (safetensors' save_file creates files readable by the owner only).
    """
    from safetensors.torch import save

    from .io import atomic_write_bytes

    tensors = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    atomic_write_bytes(path, save(tensors, metadata=metadata), failure)


def read_safetensors(path: str | Path, fmt: str, what: str, not_ours: str) -> tuple[dict, dict[str, str]]:
    """(tensors, metadata) of a vidgen safetensors file whose metadata `format` is `fmt`.

    A missing file, one safetensors cannot read, or one of another format is an InputError naming
    it as `what` (e.g. "checkpoint"); `not_ours` is the message for the wrong format.
    """
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise InputError(f"{what} {str(path)!r} does not exist")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # safetensors has its own error types for damaged files
        raise InputError(f"cannot read {str(path)!r} as a {what} ({e.__class__.__name__})") from None
    if meta.get("format") != fmt:
        raise InputError(f"{str(path)!r} {not_ours}")
    return tensors, meta


def save(path: Path, state: SamplerState, cfg: RenderConfig) -> None:
    """Write the state atomically (temporary name, then rename)."""
    tensors, meta = state.to_tensors()
    write_safetensors(path, tensors, {"format": FORMAT, "state": json.dumps(meta), "config": json.dumps(to_dict(cfg))},
                      f"cannot write the checkpoint {path}")


def load(path: str | Path, device=None) -> tuple[SamplerState, dict]:
    """(sampler state, the resolved config it was saved with, as a dict)."""
    tensors, meta = read_safetensors(path, FORMAT, "checkpoint", "is not a vidgen checkpoint")
    return SamplerState.from_tensors(tensors, meta["state"], device=device), json.loads(meta["config"])


def _get(d: dict, key: str):
    for part in key.split("."):
        d = d.get(part) if isinstance(d, dict) else None
    return d


def reconcile(cfg: RenderConfig, saved: dict, source: Path) -> dict:
    """Overrides that make `cfg` continue the saved render; refuse a checkpoint from other settings.

    The seed (when `cfg` leaves it random) and an output path with placeholders come from the
    checkpoint; every other identity setting must agree.
    """
    current = to_dict(cfg)
    fixed = {}
    if cfg.seed is None:
        fixed["seed"] = saved.get("seed")
    if "{" in cfg.output.path:
        fixed["output.path"] = _get(saved, "output.path")
    diffs = [f"{k} is {_get(saved, k)!r} there, {fixed.get(k, _get(current, k))!r} here" for k in IDENTITY
             if fixed.get(k, _get(current, k)) != _get(saved, k)]
    if diffs:
        raise ConfigError(f"checkpoint {source} was made with different settings ({'; '.join(diffs)}); "
                          f"resume with the same config, or start a new render", None)
    return fixed


def resume_from(cfg: RenderConfig, source: str | Path) -> tuple[RenderConfig, SamplerState]:
    """(`cfg` made to continue the checkpoint at `source`, its sampler state); ConfigError if the
    checkpoint was made with other settings (see `reconcile`)."""
    from .config import load_config

    state, saved = load(source)
    return load_config(cfg, reconcile(cfg, saved, Path(source))), state


def find(output_template: str) -> Path:
    """The newest checkpoint in the output folder (for `--resume` without a path)."""
    folder = Path(output_template).expanduser().parent
    if "{" in str(folder):
        raise InputError("output.path has placeholders in its folder; give the checkpoint: --resume PATH")
    found = sorted(folder.glob("*.resume.safetensors"), key=lambda p: p.stat().st_mtime) if folder.is_dir() else []
    if not found:
        raise InputError(f"no checkpoint (*.resume.safetensors) in {str(folder)!r} to resume; give one: --resume PATH")
    return found[-1]
