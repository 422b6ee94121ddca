"""Running out of device memory while sampling: the newest step kept, and the next cheaper plan named.

The memory plan (vidgen.memory) is made before any weight loads, so an out-of-memory while sampling
means the device had less than the plan counted on (another process, fragmentation). The render keeps
its newest step for --resume and names the next cheaper plan; the queue retries the job with it.
"""

from __future__ import annotations

from pathlib import Path

import torch

from . import resume
from .config import RenderConfig
from .errors import VidgenError
from .memory import MemoryPlan, Placement, WeightDtype, next_cheaper


class SamplingOutOfMemory(VidgenError, torch.OutOfMemoryError):
    """The device ran out of memory while sampling: the newest step is kept for --resume, and the
    message names the next cheaper plan. Still a torch.OutOfMemoryError, so the queue retries it,
    with `cheaper`: (placement, weights) of the next cheaper plan (None: none is cheaper)."""

    cheaper: tuple[Placement, WeightDtype] | None = None


def out_of_memory(cfg: RenderConfig, memory: MemoryPlan | None, resume_file: Path, last: list,
                  error: Exception) -> SamplingOutOfMemory:
    """The one-line error for an out-of-memory during sampling, after saving the newest step."""
    kept = ""
    if last and last[0].step < last[0].steps:
        try:
            resume.save(resume_file, last[0], cfg)
            kept = f"; step {last[0].step} of {last[0].steps} is kept: add --resume to continue"
        except (OSError, RuntimeError):        # no memory left even for the copy: the last periodic checkpoint stands
            kept = "; the last checkpoint (sampling.checkpoint_every) is kept: add --resume to continue"
    try:
        cheaper = next_cheaper(cfg, memory)
    except VidgenError:
        cheaper = None
    hint = (f"set memory.placement={cheaper[0]} memory.weights={cheaper[1]}" if cheaper else
            "use a smaller size or fewer frames")
    plan = f" under the memory plan {memory.placement}, {memory.storage} weights" if memory is not None else ""
    first = str(error).strip().splitlines()[0] if str(error).strip() else "CUDA out of memory"
    err = SamplingOutOfMemory(f"out of memory while sampling{plan} ({first}){kept}; to fit, {hint}, or set "
                              "memory.device_budget lower so the plan leaves more headroom")
    err.cheaper = cheaper
    return err
